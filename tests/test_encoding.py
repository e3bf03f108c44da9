"""The pickle-free record format: exact round trips, and nothing else ever decodes."""

import json
import pickle
import random
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tinyverse import encoding
from tinyverse.encoding import (
    COMPRESS_MIN_BYTES,
    MAGIC,
    check_layout,
    decode,
    decode_batch,
    differences,
    encode,
    layout,
)
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


# each foreign record with the reason it is refused for (None: any, e.g. the JSON parser's own words)
FOREIGN = [
    (b"", "not a tinyverse record"),
    (b"garbage that is not a record at all", "not a tinyverse record"),
    (b"TVR1", None),
    (b"XXXX" + GOOD[4:], "not a tinyverse record"),
    (b"TVR0" + GOOD[4:], "not a tinyverse record"),
    (GOOD + b"\0", "trailing bytes"),
    (GOOD + GOOD, "trailing bytes"),
    (record(b"not json"), None),
    (record(b"\xff\xfe\xfd"), None),
    (record(b'{"a": 1}'), None),
    (record(b"5"), None),
    (record(b"null"), None),
    (record(b"[" * 100_000), None),  # nesting deep enough to exhaust the JSON parser's recursion
    (record([["a", "<i4", [2], "raw"]], b"\0" * 8), None),  # a field missing
    (record([["a", "<i4", [3], "raw", 8]], b"\0" * 8), "raw array 'a' of 12 bytes cannot take 8"),  # shape vs bytes
    (record([["a", "<i4", [1], "raw", 3]], b"\0" * 3), "raw array 'a' of 4 bytes cannot take 3"),  # bytes vs dtype
    (record([["a", "<i4", [2], "raw", 8]], b"\0" * 4), "truncated record"),  # size larger than what follows
    (record([["a", "not a dtype", [1], "raw", 4]], b"\0" * 4), "not a dtype"),
    (record([["a", "<i4", [1], "lz4", 4]], b"\0" * 4), "unknown codec 'lz4'"),
    (record([["a", "<i4", [1], "zlib", 4]], b"\0" * 4), None),  # not zlib data: zlib's own words
    (record([["a", "<i4", [1], "zlib", len(ZEROS8)]], ZEROS8), "compressed data does not fit the shape"),
    (record([["a", "<i4", [1], "raw", 4]], b"\0" * 4)[:-1], "truncated record"),
    (None, None),
    ("TVR1 a str, not bytes", None),
    (12345, None),
]


@pytest.mark.parametrize(("data", "reason"), FOREIGN, ids=range(len(FOREIGN)))
def test_decode_of_anything_foreign_raises_record_error(data, reason):
    with pytest.raises(RecordError, match=r"^corrupt or foreign record \(.+\)$") as info:
        decode(data)
    if reason is not None:
        assert reason in str(info.value)


@pytest.mark.parametrize(
    "dtype",
    [
        "|O",
        "O",
        "object",
        "i4,f8",  # a structured dtype in its string form
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
    with pytest.raises(RecordError, match=r"\(forbidden dtype "):
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
    assert [i for i, _ in errors] == [1, 2, 5, 7]  # in record order
    assert all("corrupt or foreign record" in why for _, why in errors)
    assert batch["x"][:, 0].tolist() == [0, 2, 3] and batch["f"][:, 0].tolist() == [0, 2, 3]
    assert decode_batch([]) == ({}, [], []) and decode_batch([b"junk"])[0] == {}


def mixed(i: int) -> dict:
    """Every codec at once: raw, zlib (compressible uint8 frames) and zeros."""
    frames = np.zeros((4, 64, 64), np.uint8)
    frames[:, 10:20, 10:20] = i + 1
    return {
        "obs": np.full((6, 3), i, np.float32),
        "frames": frames,
        "final": np.zeros((4, 64, 64), np.uint8),
        "step": np.array(i, np.int64),
    }


def test_mixed_records_use_every_codec():
    assert [h[3] for h in header_of(encode(mixed(0)))] == ["raw", "zlib", "zeros", "raw"]


@pytest.mark.parametrize("how", ["decode", "decode_batch"])
def test_decoded_arrays_are_writable_and_share_nothing_with_the_record(how):
    blobs = [bytearray(encode(mixed(i))) for i in range(3)]  # a buffer the caller may reuse
    if how == "decode":
        outs = [decode(b) for b in blobs]
    else:
        batch, kept, errors = decode_batch(blobs)
        assert kept == [0, 1, 2] and errors == []
        outs = [{k: v[j, ...] for k, v in batch.items()} for j in range(3)]  # [j, ...]: 0-d arrays stay arrays
    for blob, out in zip(blobs, outs, strict=True):
        raw = np.frombuffer(blob, np.uint8)
        for name, a in out.items():
            assert a.flags.writeable, name
            assert not np.shares_memory(a, raw), name
        blob[8:] = bytes(len(blob) - 8)  # the caller overwrites its buffer
    for i, out in enumerate(outs):
        assert_same(out, mixed(i))
    for a in outs[0].values():
        a[...] = 7  # a trainer may normalize in place: that changes no other session
    assert all((a == 7).all() for a in outs[0].values())
    assert_same(outs[1], mixed(1))
    assert_same(outs[2], mixed(2))
    assert_same(decode(encode(mixed(0))), mixed(0))


def test_layout_names_dtypes_and_shapes_in_order():
    assert layout(mixed(0)) == [
        ["obs", "<f4", [6, 3]],
        ["frames", "|u1", [4, 64, 64]],
        ["final", "|u1", [4, 64, 64]],
        ["step", "<i8", []],
    ]
    assert layout({"b": np.zeros(2, ">i4"), "a": [1.0, 2.0], "s": 3}) == [
        ["b", ">i4", [2]],
        ["a", "<f8", [2]],
        ["s", np.asarray(3).dtype.str, []],
    ]
    assert layout({}) == []
    assert json.loads(json.dumps(layout(mixed(0)))) == layout(mixed(0))  # stored as JSON, compared as is
    assert layout(decode(encode(mixed(5)))) == layout(mixed(5))
    assert layout(mixed(0)) != layout({**mixed(0), "obs": np.zeros((6, 4), np.float32)})
    assert layout(mixed(0)) != layout({**mixed(0), "obs": np.zeros((6, 3), np.float64)})


def test_decode_batch_keeps_only_the_expected_layout():
    other = {"obs": np.zeros((6, 4), np.float32)}  # another experiment's sessions
    blobs = [encode(other), encode(mixed(0)), b"junk", encode(other), encode(mixed(1)), encode(mixed(2))[:-1]]
    batch, kept, errors = decode_batch(blobs, layout(mixed(0)))
    assert kept == [1, 4]
    assert [i for i, _ in errors] == [2, 5]  # corrupt ones are reported whatever the layout
    assert batch["step"].tolist() == [0, 1] and batch["obs"].shape == (2, 6, 3)
    assert batch["frames"].shape == (2, 4, 64, 64) and (batch["frames"][1, :, 15, 15] == 2).all()

    batch, kept, errors = decode_batch(blobs, layout(other))
    assert kept == [0, 3] and [i for i, _ in errors] == [2, 5] and set(batch) == {"obs"}
    assert decode_batch(blobs, json.loads(json.dumps(layout(other))))[1] == [0, 3]  # as read back from JSON

    batch, kept, errors = decode_batch(blobs)  # no layout: the first good record's
    assert kept == [0, 3] and set(batch) == {"obs"}

    batch, kept, errors = decode_batch(blobs, [["obs", "<f4", [7, 3]]])  # nothing of that layout
    assert (batch, kept) == ({}, []) and [i for i, _ in errors] == [2, 5]


def test_differences_name_every_array_that_differs_and_nothing_else():
    a = {"obs": np.zeros((8, 4), np.float32), "r": np.zeros(8, np.float32), "same": np.zeros(3, np.int64)}
    b = {"obs": np.zeros((8, 6), np.float32), "a": np.zeros(8, np.int64), "same": np.zeros(3, np.int64)}
    assert differences(layout(a), layout(b), "model wants") == [
        "missing r",
        "obs: stored float32[8, 6], model wants float32[8, 4]",
        "unexpected a",
    ]
    assert differences(layout(a), layout(dict(reversed(list(a.items()))))) == [], "order is not a difference"


# -- the record budget, and property-based tests: any bytes decode to arrays or to RecordError ------------------------
def peak_of(fn) -> int:
    """The most memory ``fn()`` held at once (numpy's arrays included), in bytes."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def refused(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode(data)


def test_the_budget_is_per_record_and_checked_before_anything_is_inflated():
    """Five 256 MiB zlib arrays in a 1.3 MB record: each under the 1 GiB budget, together over it."""
    quarter = zlib.compress(bytes(2**28), 9)
    data = record([[f"a{i}", "|u1", [2**28], "zlib", len(quarter)] for i in range(5)], quarter * 5)
    assert len(data) < 2**21 and peak_of(lambda: refused(data)) < 2**20
    zeros = record([[f"a{i}", "<f8", [2**27], "zeros", 0] for i in range(2)])  # zeros count as much
    assert peak_of(lambda: refused(zeros)) < 2**20


def test_empty_dimensions_count_as_one_so_no_shape_overflows():
    for shape in ([0, 2**62, 2**62], [2**40, 0], [0] * 16 + [1], [3] * 17):
        refused(record([["a", "<f8", shape, "zeros", 0]]))
    assert decode(record([["a", "<f8", [0, 2**20], "zeros", 0]]))["a"].shape == (0, 2**20)


def test_a_record_as_big_as_the_budget_decodes_in_one_copy(monkeypatch):
    """zlib arrays inflate into the batch a MiB at a time: not first into copies of their own."""
    monkeypatch.setattr(encoding, "MAX_BYTES", 4 * 2**20)
    rng = np.random.default_rng(5)
    arrays = {f"f{i}": rng.integers(0, 4, 2**20, dtype=np.uint8) for i in range(4)}
    data = encode(arrays)
    assert [h[3] for h in header_of(data)] == ["zlib"] * 4
    out = {}
    assert peak_of(lambda: out.update(decode(data))) < 5.5 * 2**20  # each array once, and a MiB of zlib output
    assert_same(out, arrays)
    assert peak_of(lambda: refused(data[:-10] + data[-9:])) < 5.5 * 2**20
    refused(encode({**arrays, "one more byte": np.zeros(1, np.uint8)}))


def test_names_are_text_and_unique():
    refused(record([["a", "<f8", [1], "zeros", 0], ["a", "<f4", [1], "zeros", 0]]))
    refused(record([[7, "<f8", [1], "zeros", 0]]))


def test_a_layout_is_checked_as_its_records_would_be():
    check_layout(layout({"x": np.zeros((2, 3), np.float32), "y": np.array(1)}))
    for junk in (
        [["a", "|O", [1]]],
        [["a", "<f8", [-1]]],
        [["a", "<f8"]],
        [["a", "=f8", [1]]],
        5,
        "x",
        [["a", "<f8", [2**40]]],
    ):
        with pytest.raises((ValueError, TypeError)):
            check_layout(junk)


NAMES = st.text(max_size=8)
DTYPES = st.sampled_from([*NUMERIC[:-3], "<f2", ">u2", "|O", "<U2", "V4", "i4,f8", "<M8[s]", "?", "nope"])
DIMS = st.lists(st.one_of(st.integers(0, 64), st.integers(-2, 2**70)), max_size=4)
CODECS = st.sampled_from(["raw", "zeros", "zlib", "lz4"])
ENTRY = st.tuples(NAMES, DTYPES | st.integers(), DIMS | st.integers(), CODECS, st.integers(0, 600) | st.integers())


@st.composite
def records(draw) -> bytes:
    """Records near the format: a header of arbitrary entries, some payload, often a good record's bytes changed."""
    kind = draw(st.sampled_from(["bytes", "header", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=600))
    if kind == "header":
        head = json.dumps([list(e) for e in draw(st.lists(ENTRY, max_size=4))]).encode()
        return MAGIC + struct.pack("<I", len(head)) + head + draw(st.binary(max_size=600))
    data = bytearray(draw(st.sampled_from([GOOD, FRAMES])))
    for at, byte in draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), max_size=4)):
        data[at] = byte
    return bytes(data[: draw(st.integers(0, len(data)))]) if draw(st.booleans()) else bytes(data)


FRAMES = encode({"f": np.zeros((2, 8, 84), np.uint8) + np.arange(84, dtype=np.uint8), "x": np.arange(3.0)})
BUDGET = 2**20  # the record budget while the properties are checked: what a record may make decode allocate


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4))
def test_any_bytes_decode_to_arrays_or_record_error_within_the_budget(blobs):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoding, "MAX_BYTES", BUDGET)
        patch.setattr(encoding, "_HEADERS", {})  # headers found under the real budget are looked at afresh
        for data in blobs:
            try:
                peak = peak_of(lambda data=data: decode(data))
            except RecordError:
                continue
            assert peak <= BUDGET + 5 * 2**20 + 4 * len(data)  # the arrays, 4 KiB of zlib data inflated, copies
        batch, kept, errors = decode_batch(blobs)
        assert sorted(kept + [i for i, _ in errors]) == sorted(set(kept + [i for i, _ in errors]))
        assert all(isinstance(v, np.ndarray) and v.shape[0] == len(kept) for v in batch.values())
        assert all(isinstance(reason, str) and reason.startswith("corrupt or foreign record") for _, reason in errors)


ARRAYS = st.dictionaries(
    NAMES,
    hnp.arrays(
        st.sampled_from(NUMERIC),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
        elements={"allow_nan": True, "allow_subnormal": True},
    )
    | hnp.arrays(np.uint8, st.sampled_from([(4096,), (2, 4096)]), elements=st.integers(0, 3)),  # zlib, or zeros
    max_size=5,
)


@settings(max_examples=120, deadline=None)
@given(ARRAYS, st.integers(1, 3))
def test_any_dict_of_numeric_arrays_round_trips(arrays, copies):
    assert_same(decode(encode(arrays)), arrays)
    batch, kept, errors = decode_batch([encode(arrays)] * copies)
    assert kept == list(range(copies)) and not errors
    for name, a in arrays.items():
        assert batch[name].shape == (copies, *a.shape)
        np.testing.assert_array_equal(batch[name][-1], a)
