"""The pickle-free record format: exact round trips, and nothing else ever decodes."""

import json
import pickle
import random
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from tinyverse.encoding import COMPRESS_MIN_BYTES, MAGIC, decode, decode_batch, encode
from tinyverse.errors import RecordError

NUMERIC = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "longdouble",
    "complex64",
    "complex128",
    ">i4",  # big-endian stays big-endian
    ">f8",
]
SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3, 4), (1, 1, 1, 1, 7)]


def header_of(record: bytes) -> list:
    (n,) = struct.unpack_from("<I", record, 4)
    return json.loads(record[8 : 8 + n])


def record(header, payload: bytes = b"") -> bytes:
    """A hand-made record: the format's framing around any header and payload."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, v in want.items():
        v = np.asarray(v)
        assert got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_numeric_dtype_and_shape(dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    assert_same(decode(encode({"a": a})), {"a": a})


def test_round_trip_many_arrays_keeps_names_and_order():
    arrays = {
        "observations": np.arange(26 * 4, dtype=np.float32).reshape(26, 4),
        "actions": np.arange(25, dtype=np.int64),
        "terminated": np.arange(25) % 7 == 0,
        "memory.h": np.zeros((0, 3), dtype=np.float32),
        "version": np.array(12, dtype=np.int64),
        "naïve name ☃": np.array([1.5]),
    }
    assert_same(decode(encode(arrays)), arrays)
    assert_same(decode(encode({})), {})


def test_extremes_survive_bit_for_bit():
    a = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(np.float64).tiny, np.finfo(np.float64).max])
    b = decode(encode({"a": a}))["a"]
    assert a.tobytes() == b.tobytes()
    for t in (np.int64, np.uint64, np.int8):
        info = np.iinfo(t)
        x = np.array([info.min, info.max], dtype=t)
        assert_same(decode(encode({"x": x})), {"x": x})


def test_non_contiguous_inputs_round_trip():
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    for a in (base.T, base[::2, ::3], base[:, 5], np.asfortranarray(base)):
        assert_same(decode(encode({"a": a})), {"a": a})


def test_large_uint8_frames_are_compressed_and_exact():
    frames = np.zeros((25, 4, 84, 84), dtype=np.uint8)
    frames[:, :, 20:60, 30:50] = np.arange(25, dtype=np.uint8)[:, None, None, None]
    blob = encode({"frames": frames})
    assert header_of(blob)[0][3] == "zlib"
    assert len(blob) < frames.nbytes / 4
    out = decode(blob)["frames"]
    assert out.dtype == np.uint8 and out.shape == frames.shape
    np.testing.assert_array_equal(out, frames)


def test_incompressible_and_small_uint8_stay_raw():
    noise = np.random.default_rng(1).integers(0, 256, 100_000, dtype=np.uint8)
    small = np.ones(COMPRESS_MIN_BYTES - 1, dtype=np.uint8)
    blob = encode({"noise": noise, "small": small})
    assert [h[3] for h in header_of(blob)] == ["raw", "raw"]
    assert_same(decode(blob), {"noise": noise, "small": small})


@pytest.mark.parametrize(
    "value",
    [
        np.array([{"a": 1}, None], dtype=object),
        np.array(["text"]),
        np.array([b"bytes"]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
    ],
    ids=["object", "str", "bytes", "datetime", "structured"],
)
def test_encode_refuses_non_numeric_dtypes(value):
    with pytest.raises(TypeError, match="'bad'.*numeric dtype"):
        encode({"ok": np.zeros(3), "bad": value})


ZEROS8 = zlib.compress(b"\0" * 8)
GOOD = encode({"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.ones(2)})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage that is not a record at all",
        b"TVR1",
        b"XXXX" + GOOD[4:],
        b"TVR0" + GOOD[4:],
        GOOD + b"\0",
        GOOD + GOOD,
        record(b"not json"),
        record(b"\xff\xfe\xfd"),
        record(b'{"a": 1}'),
        record(b"5"),
        record(b"null"),
        record(b"[" * 100_000),  # nesting deep enough to exhaust the JSON parser's recursion
        record([["a", "<i4", [2], "raw"]], b"\0" * 8),  # a field missing
        record([["a", "<i4", [3], "raw", 8]], b"\0" * 8),  # shape does not fit the bytes
        record([["a", "<i4", [1], "raw", 3]], b"\0" * 3),  # bytes do not fit the dtype
        record([["a", "<i4", [2], "raw", 8]], b"\0" * 4),  # size larger than what follows
        record([["a", "not a dtype", [1], "raw", 4]], b"\0" * 4),
        record([["a", "<i4", [1], "lz4", 4]], b"\0" * 4),  # unknown codec
        record([["a", "<i4", [1], "zlib", 4]], b"\0" * 4),  # not zlib data
        record([["a", "<i4", [1], "zlib", len(ZEROS8)]], ZEROS8),  # inflates to more than the shape holds
        record([["a", "<i4", [1], "raw", 4]], b"\0" * 4)[:-1],
        None,
        "TVR1 a str, not bytes",
        12345,
    ],
)
def test_decode_of_anything_foreign_raises_record_error(data):
    with pytest.raises(RecordError, match="corrupt or foreign record"):
        decode(data)


@pytest.mark.parametrize(
    "dtype",
    [
        "|O",
        "O",
        "object",
        [["a", "<i4"]],
        "V8",
        "|V4",
        "<U4",
        "|S4",
        "<M8[s]",
        "<m8[s]",
        {"names": ["a"], "formats": ["<i4"]},
    ],
    ids=str,
)
def test_decode_refuses_forbidden_dtypes_in_the_header(dtype):
    with pytest.raises(RecordError, match="forbidden dtype|corrupt"):
        decode(record([["a", dtype, [1], "raw", 8]], b"\0" * 8))


def test_every_truncation_of_a_good_record_raises_record_error():
    for cut in range(len(GOOD)):
        with pytest.raises(RecordError):
            decode(GOOD[:cut])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # a mutated dtype may be a deprecated alias
def test_random_corruption_never_escapes_as_another_error():
    rng = random.Random(1234)
    frames = encode({"f": np.zeros((8, 84, 84), np.uint8), "x": np.arange(10.0)})
    for blob in (GOOD, frames):
        for _ in range(1500):
            data = bytearray(blob)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            try:
                out = decode(bytes(data))
            except RecordError:
                continue
            assert all(isinstance(v, np.ndarray) and v.dtype.kind in "biufc" for v in out.values())


class _Payload:
    """Unpickling this creates a file: the classic pickle exploit."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_payload_is_never_executed(tmp_path):
    target = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(target))
    disguised = [
        payload,
        MAGIC + payload,
        record([["a", "|O", [1], "raw", len(payload)]], payload),
        record([["a", "<i4", [1], "raw", len(payload)]], payload),
        record([["a", "|u1", [len(payload)], "raw", len(payload)]], payload)[:-1],
    ]
    for data in disguised:
        with pytest.raises(RecordError):
            decode(data)
    assert not target.exists()

    # the payload is live: a plain unpickle does create the file
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control))).close()
    assert control.exists()


def test_a_pickled_numpy_object_array_is_not_decoded(tmp_path):
    target = tmp_path / "pwned"
    evil = np.array([_Payload(target)], dtype=object)
    for data in (pickle.dumps(evil), pickle.dumps({"a": evil})):
        with pytest.raises(RecordError):
            decode(data)
    assert not target.exists()


def test_a_zlib_bomb_is_refused_before_it_inflates():
    """200 MB of zeros squeezed into ~200 KB, declared as one int32: decoding must not allocate the 200 MB."""
    bomb = zlib.compress(bytes(200 * 2**20), 9)
    data = record([["a", "<i4", [1], "zlib", len(bomb)]], bomb)
    tracemalloc.start()
    try:
        with pytest.raises(RecordError):
            decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"decoding allocated {peak / 2**20:.0f} MiB"


def test_zlib_data_must_fill_exactly_the_declared_shape():
    short = zlib.compress(b"\1" * 8)
    with pytest.raises(RecordError):
        decode(record([["a", "<i4", [4], "zlib", len(short)]], short))
    unfinished = zlib.compress(bytes(4096))[:-6]
    with pytest.raises(RecordError):
        decode(record([["a", "|u1", [4096], "zlib", len(unfinished)]], unfinished))
    ok = zlib.compress(np.arange(4, dtype="<i4").tobytes())
    assert_same(decode(record([["a", "<i4", [4], "zlib", len(ok)]], ok)), {"a": np.arange(4, dtype="<i4")})
    for shape in ([-1], [2**40, 2**40], [2**70], 4, ["4"], [4.0]):
        with pytest.raises(RecordError):
            decode(record([["a", "<i4", shape, "zlib", len(ok)]], ok))
    for shape in ([2**40, 2**40], [2**70], ["4"], [4.0]):
        with pytest.raises(RecordError):
            decode(record([["a", "<i4", shape, "raw", 16]], np.arange(4, dtype="<i4").tobytes()))


def test_all_zero_arrays_take_no_bytes_and_come_back():
    frames = np.zeros((25, 84, 84), np.uint8)  # final_observations of a session where no episode ended
    blob = encode({"final": frames, "tiny": np.zeros(3, np.float32)})
    assert [h[3] for h in header_of(blob)] == ["zeros", "raw"]  # tiny arrays are not worth a codec
    assert len(blob) < 200
    out = decode(blob)
    np.testing.assert_array_equal(out["final"], frames)
    assert out["final"].dtype == np.uint8 and out["final"].flags.writeable


@pytest.mark.parametrize(
    "entry",
    [
        ["a", "<f4", [2**40], "zeros", 0],  # a huge array from a tiny record
        ["a", "<f4", [4], "zeros", 16],  # zeros that claim bytes
        ["a", "<f4", [-1], "raw", 4],
        ["a", "<f4", [4], "raw", 15],
    ],
)
def test_impossible_zeros_and_raw_headers_are_refused(entry):
    head = json.dumps([entry]).encode()
    blob = b"TVR1" + struct.pack("<I", len(head)) + head + b"\0" * entry[4]
    with pytest.raises(RecordError):
        decode(blob)


def test_decode_batch_stacks_exactly_what_decode_returns():
    rng = np.random.default_rng(7)
    records = []
    for i in range(12):
        final = np.zeros((5, 84, 84), np.uint8)  # zeros codec, or compressed when an episode ended
        if i % 3 == 0:
            final[2] = 40
        records.append(
            {
                "obs": rng.normal(size=(6, 3)).astype(np.float32),
                "final": final,
                "noise": rng.integers(0, 256, (4096,), dtype=np.uint8),  # incompressible: raw
                "done": rng.random(5) < 0.5,
                "version": np.int64(i),
            }
        )
    blobs = [encode(r) for r in records]
    assert len({header_of(b).__repr__() for b in blobs}) == 2  # two headers, one layout
    batch, kept, errors = decode_batch(blobs)
    assert kept == list(range(12)) and errors == []
    for name in records[0]:
        want = np.stack([decode(b)[name] for b in blobs])
        assert batch[name].dtype == want.dtype and batch[name].shape == want.shape
        np.testing.assert_array_equal(batch[name], want, err_msg=name)
        assert batch[name].flags.writeable and batch[name].flags.c_contiguous


def test_decode_batch_leaves_out_corrupt_and_other_shaped_records():
    good = [encode({"x": np.full(4, i, np.int32), "f": np.full(4096, i, np.uint8)}) for i in range(6)]
    bad_zlib = bytearray(good[4])
    bad_zlib[-3] ^= 0xFF  # the compressed frame no longer inflates to its shape
    blobs = [
        good[0],
        b"junk",
        good[1][:-1],
        encode({"x": np.zeros(5, np.int32), "f": np.full(4096, 9, np.uint8)}),  # another shape
        good[2],
        bytes(bad_zlib),
        good[3],
        12345,
    ]
    batch, kept, errors = decode_batch(blobs)
    assert kept == [0, 4, 6]
    assert [i for i, _ in errors] == [1, 2, 7, 5]
    assert all("corrupt or foreign record" in why for _, why in errors)
    assert batch["x"][:, 0].tolist() == [0, 2, 3] and batch["f"][:, 0].tolist() == [0, 2, 3]
    assert decode_batch([]) == ({}, [], []) and decode_batch([b"junk"])[0] == {}
