"""Arrays <-> bytes without pickle: ``MAGIC | u32 header length | JSON header | array bytes``, where
the header lists ``[name, dtype, shape, codec, nbytes]`` an array of a numeric dtype, so decoding
never builds objects or runs code (the codecs: docs/api.rst). Decoded arrays are writable and share
no memory with the record."""

import json
import math
import struct
import zlib

import numpy as np

from .errors import RecordError

MAGIC = b"TVR1"
COMPRESS_MIN_BYTES = 4096  # uint8 arrays (frames) this big go through zlib if it saves a quarter
MAX_BYTES = 2**30  # a record's arrays, all told: a tiny record must not declare huge zeros or zlib
_LEN = struct.Struct("<I")
_KINDS = set("biufc")  # bool, signed, unsigned, float, complex: nothing that holds objects
_ERRORS = (ValueError, TypeError, KeyError, struct.error, zlib.error, RecursionError, OverflowError)
_HEADERS: dict[bytes, tuple] = {}  # header bytes -> what _header found (headers of at most 16 KiB)


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """A record of a flat ``{name: array}`` dict of numeric arrays."""
    header = []  # [name, dtype, shape, codec, nbytes] an array
    chunks = []  # their bytes
    for name, value in arrays.items():
        a = np.asarray(value)  # not ascontiguousarray: it turns 0-d arrays into 1-d
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"cannot store array {name!r} of dtype {a.dtype}: use a numeric dtype")
        raw, codec = (b"", "zeros") if a.nbytes >= 1024 and not a.any() else (a.tobytes(), "raw")
        if codec == "raw" and a.dtype == np.uint8 and a.nbytes >= COMPRESS_MIN_BYTES:
            if len(packed := zlib.compress(raw, 1)) <= 0.75 * len(raw):
                raw, codec = packed, "zlib"
        header.append([name, a.dtype.str, list(a.shape), codec, len(raw)])
        chunks.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *chunks])


def layout(arrays: dict[str, np.ndarray]) -> list:
    """``[[name, dtype, shape], ...]`` of a record: what sessions of one experiment share."""
    return [[k, np.asarray(v).dtype.str, list(np.shape(v))] for k, v in arrays.items()]


def differences(expected: list, stored: list, wants: str = "wants") -> list[str]:
    """What differs between two layouts, sorted: ``missing a``, ``unexpected b``, ``c: stored
    int64[2], wants int64[3]`` (``wants``: the word for what ``expected`` holds)."""
    want = {n: f"{np.dtype(d).name}{list(s)}" for n, d, s in expected}
    have = {n: f"{np.dtype(d).name}{list(s)}" for n, d, s in stored}
    found = [f"missing {n}" for n in want.keys() - have.keys()]
    found += [f"unexpected {n}" for n in have.keys() - want.keys()]
    changed = [n for n in want.keys() & have.keys() if have[n] != want[n]]
    found += [f"{n}: stored {have[n]}, {wants} {want[n]}" for n in changed]
    return sorted(found)


def decode(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a record made by :func:`encode`; RecordError for anything else."""
    out, _, errors = decode_batch([data])
    if errors:
        raise RecordError(errors[0][1])
    return {k: v[0, ...] for k, v in out.items()}  # [0, ...]: 0-d arrays stay arrays


def decode_batch(blobs: list[bytes], expected: list | None = None) -> tuple[dict, list, list]:
    """Records stacked: ``({name: (k, *shape)}, kept, errors)``, each raw array in one copy a
    header shared.

    ``kept``: the indices of the k records, in order; ``errors``: ``(index, reason)`` of corrupt or
    foreign ones. Records whose :func:`layout` differs from ``expected`` (default: the first good
    record's) are in neither.
    """
    groups = {}  # header bytes -> (spec, the indices of its records)
    specs = {}  # index -> spec
    errors = []
    last = None  # the last header read: a batch's records share one, most times
    for i, data in enumerate(blobs):
        try:
            if last is None or data[: len(last[0])] != last[0]:
                last = _header(data)
            head, found, specs[i], end = last
            if end != len(data):
                raise ValueError("truncated record" if end > len(data) else "trailing bytes")
            expected = found if expected is None else expected
            if head in groups or found == expected:  # a header met before: its layout compared
                groups.setdefault(head, (specs[i], []))[1].append(i)
        except _ERRORS as e:
            errors.append((i, f"corrupt or foreign record ({e})"))
    if not groups:
        return {}, [], errors
    kept = sorted(i for _, idx in groups.values() for i in idx)
    out = {name: np.zeros((len(kept), *shape), dtype) for name, dtype, shape in expected}
    for spec, idx in groups.values():
        rows = slice(None) if len(groups) == 1 else np.searchsorted(kept, idx)  # one: the usual
        joined = np.frombuffer(b"".join(blobs[i] for i in idx), np.uint8)
        joined = joined.reshape(len(idx), -1)  # a record a row
        for name, dt, shape, codec, start, end in spec:
            if codec == "raw" and end > start:  # each array is a band of columns
                out[name][rows] = joined[:, start:end].view(dt).reshape(len(idx), *shape)
    failed = []  # rows whose zlib data does not inflate to their arrays, inflated into place
    zipped = any(codec == "zlib" for spec, _ in groups.values() for _, _, _, codec, _, _ in spec)
    for row, i in enumerate(kept if zipped else []):
        try:
            for name, _, _, codec, start, end in specs[i]:
                if codec == "zlib":
                    _inflate(blobs[i][start:end], out[name][row, ...])
        except (ValueError, zlib.error) as e:
            errors.append((i, f"corrupt or foreign record ({e})"))
            failed.append(row)
    if failed:  # rare: the batch is copied without them
        rows = np.setdiff1d(np.arange(len(kept)), failed)
        out = {k: v[rows] for k, v in out.items()}
        kept = [kept[j] for j in rows]
    return out, kept, sorted(errors)


def check_layout(value) -> None:
    """ValueError unless ``value`` is a layout records can have, as :func:`layout` makes them."""
    head = json.dumps([[*entry, "zeros", 0] for entry in value]).encode()
    if _header(MAGIC + _LEN.pack(len(head)) + head)[1] != value:
        raise ValueError(f"not a layout: {value!r:.80}")


def _header(data: bytes) -> tuple[bytes, list, list, int]:
    """A record's header bytes, layout, spec (an array's bytes are data[start:end]) and length,
    cached by header; ValueError unless numeric arrays of at most 16 dimensions fit their bytes and
    the budget."""
    if data[:4] != MAGIC or (n := _LEN.unpack_from(data, 4)[0]) > 2**20:
        raise ValueError("not a tinyverse record, or its header is over 1 MiB")
    head = bytes(memoryview(data)[: 8 + n])  # with magic and length: a cut header is another key
    if head in _HEADERS:
        return _HEADERS[head]
    spec = []  # (name, dtype, shape, codec, start, end) an array
    names = set()
    start = 8 + n  # of the next array's bytes
    budget = MAX_BYTES
    for name, dtype, shape, codec, size in json.loads(head[8:]):
        dt = np.dtype(dtype) if isinstance(dtype, str) else None  # np.dtype([...]) is structured
        if type(name) is not str or dt is None or dt.kind not in _KINDS or dt.fields is not None:
            raise ValueError(f"forbidden dtype {dtype!r:.40} or name {name!r:.40}")
        if not isinstance(shape, list) or len(shape) > 16 or not all(type(d) is int for d in shape):
            raise ValueError(f"bad shape {shape!r:.60}")
        nbytes = math.prod(shape) * dt.itemsize
        counted = math.prod(max(d, 1) for d in shape) * dt.itemsize  # so that no shape overflows
        if min(shape, default=0) < 0 or counted > budget or name in names or type(size) is not int:
            raise ValueError(f"array {name!r:.40} of shape {shape!r:.40} over budget, or repeated")
        fits = {"raw": size == nbytes, "zeros": not size, "zlib": True}
        if codec not in fits:
            raise ValueError(f"unknown codec {codec!r:.20}")
        if not fits[codec]:
            raise ValueError(f"{codec} array {name!r} of {nbytes} bytes cannot take {size} bytes")
        spec.append((name, dt, tuple(shape), codec, start, start + size))
        names.add(name)
        start += size
        budget -= counted
    found = head, [[name, dt.str, list(shape)] for name, dt, shape, *_ in spec], spec, start
    if len(_HEADERS) < 1024 and n <= 16384:
        _HEADERS[head] = found
    return found


def _inflate(raw: bytes, into: np.ndarray) -> None:
    """zlib data of exactly ``into``'s bytes, inflated into it 4 KiB (at most 4 MiB out) at a
    time: a tiny record cannot fill memory, nor a big one take twice its size."""
    view = memoryview(into.reshape(-1).view(np.uint8))
    z = zlib.decompressobj()
    at = 0  # bytes inflated
    for start in range(0, len(raw), 4096):
        if at + len(chunk := z.decompress(raw[start : start + 4096])) > len(view):
            break
        view[at : at + len(chunk)] = chunk
        at += len(chunk)
    if at != len(view) or not z.eof or z.unused_data:
        raise ValueError("compressed data does not fit the shape")
