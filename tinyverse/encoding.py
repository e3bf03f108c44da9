"""Arrays <-> bytes without pickle: ``MAGIC | u32 header length | JSON header | array bytes``, where the header
lists ``[name, dtype, shape, codec, nbytes]`` an array of a numeric dtype, so decoding never builds objects or runs
code (the codecs: docs/api.rst). Decoded arrays are writable and share no memory with the record."""

import json
import math
import struct
import zlib

import numpy as np

from .errors import RecordError

MAGIC = b"TVR1"
COMPRESS_MIN_BYTES = 4096  # uint8 arrays (image frames) this big are stored with zlib when it saves a quarter
MAX_BYTES = 2**30  # a tiny foreign record must not declare a huge array of zeros or of zlib data
_LEN = struct.Struct("<I")
_KINDS = set("biufc")  # bool, signed, unsigned, float, complex: nothing that holds objects
_ERRORS = (ValueError, TypeError, KeyError, struct.error, zlib.error, RecursionError, OverflowError)
_HEADERS: dict[bytes, tuple] = {}  # header bytes -> what _header found


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """A record of a flat ``{name: array}`` dict of numeric arrays."""
    header, chunks = [], []
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
    """What differs between two layouts, sorted: ``missing a``, ``unexpected b``, ``c: stored int64[2], wants
    int64[3]`` (``wants``: the word for what ``expected`` holds)."""
    want = {n: f"{np.dtype(d).name}{list(s)}" for n, d, s in expected}
    have = {n: f"{np.dtype(d).name}{list(s)}" for n, d, s in stored}
    found = [f"missing {n}" for n in want.keys() - have.keys()] + [f"unexpected {n}" for n in have.keys() - want]
    found += [f"{n}: stored {have[n]}, {wants} {want[n]}" for n in want.keys() & have.keys() if have[n] != want[n]]
    return sorted(found)


def decode(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a record made by :func:`encode`; RecordError for anything else."""
    out, _, errors = decode_batch([data])
    if errors:
        raise RecordError(errors[0][1])
    return {k: v[0, ...] for k, v in out.items()}  # [0, ...]: 0-d arrays stay arrays


def decode_batch(blobs: list[bytes], expected: list | None = None) -> tuple[dict, list[int], list[tuple[int, str]]]:
    """Records stacked: ``({name: (k, *shape)}, kept, errors)``, each raw array in one copy a header shared.

    ``kept``: the indices of the k records, in order; ``errors``: ``(index, reason)`` of corrupt or foreign ones.
    Records whose :func:`layout` differs from ``expected`` (default: the first good record's) are in neither.
    """
    groups, inflated, errors = {}, {}, []  # header bytes -> (spec, indices of its records); index -> zlib arrays
    for i, data in enumerate(blobs):
        try:
            head, found, spec, end = _header(data)
            if end != len(data):
                raise ValueError("truncated record" if end > len(data) else "trailing bytes")
            expected = found if expected is None else expected
            if found == expected:
                inflated[i] = [(s[0], _inflate(data[s[4] : s[5]], s[1], s[2])) for s in spec if s[3] == "zlib"]
                groups.setdefault(head, (spec, []))[1].append(i)
        except _ERRORS as e:
            errors.append((i, f"corrupt or foreign record ({e})"))
    if not groups:
        return {}, [], errors
    kept = sorted(inflated)
    out = {name: np.zeros((len(kept), *shape), dtype) for name, dtype, shape in expected}
    for spec, idx in groups.values():
        rows = slice(None) if len(groups) == 1 else np.searchsorted(kept, idx)  # one header: the common case
        joined = np.frombuffer(b"".join(blobs[i] for i in idx), np.uint8).reshape(len(idx), -1)  # a record a row
        for name, dt, shape, codec, start, end in spec:
            if codec == "raw" and end > start:  # each array is a band of columns
                out[name][rows] = joined[:, start:end].view(dt).reshape(len(idx), *shape)
    for row, i in enumerate(kept):
        for name, array in inflated[i]:
            out[name][row] = array
    return out, kept, errors


def _header(data: bytes) -> tuple[bytes, list, list, int]:
    """A record's header bytes, layout, spec (an array's bytes are data[start:end]) and length, cached by header;
    ValueError for anything but numeric arrays that fit their bytes."""
    if data[:4] != MAGIC:
        raise ValueError("not a tinyverse record")
    (n,) = _LEN.unpack_from(data, 4)
    head = bytes(memoryview(data)[: 8 + n])  # with the magic and length: a cut header is another key
    if head in _HEADERS:
        return _HEADERS[head]
    spec, start = [], 8 + n
    for name, dtype, shape, codec, size in json.loads(head[8:]):
        dt = np.dtype(dtype)
        if dt.kind not in _KINDS or dt.fields is not None:
            raise ValueError(f"forbidden dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in [*shape, size]):
            raise ValueError(f"bad shape {shape!r} or size {size!r}")
        nbytes = math.prod(shape) * dt.itemsize
        fits = {"raw": size == nbytes, "zeros": not size and nbytes <= MAX_BYTES, "zlib": nbytes <= MAX_BYTES}
        if codec not in fits:
            raise ValueError(f"unknown codec {codec!r}")
        if not fits[codec]:
            raise ValueError(f"{codec} array {name!r} of {nbytes} bytes cannot take {size} bytes")
        spec.append((str(name), dt, tuple(shape), codec, start, start + size))
        start += size
    found = head, [[name, dt.str, list(shape)] for name, dt, shape, *_ in spec], spec, start
    if len(_HEADERS) < 1024:
        _HEADERS[head] = found
    return found


def _inflate(raw: bytes, dt: np.dtype, shape: tuple) -> np.ndarray:
    """zlib data of exactly the array's bytes: never inflate more, so a tiny record cannot fill memory."""
    nbytes = math.prod(shape) * dt.itemsize
    z = zlib.decompressobj()
    out = z.decompress(raw, max(nbytes, 1))  # 0 would mean no limit
    if len(out) != nbytes or not z.eof or z.unconsumed_tail:
        raise ValueError("compressed data does not fit the shape")
    return np.frombuffer(out, dt).reshape(shape)
