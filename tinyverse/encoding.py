"""Arrays <-> bytes without pickle: a record is ``MAGIC | u32 header length | JSON header | array bytes``.

The header lists ``[name, dtype, shape, codec, nbytes]`` an array, of numeric dtypes only: decoding never builds
objects or runs code. Codecs: ``raw``; ``zeros`` (nothing stored: ``final_observations`` where no episode ended);
``zlib`` for uint8 arrays of ``COMPRESS_MIN_BYTES`` or more (image frames) when it saves a quarter of their size.
Decoded arrays are writable and share no memory with the record.
"""

import json
import math
import struct
import zlib

import numpy as np

from .errors import RecordError

MAGIC = b"TVR1"
COMPRESS_MIN_BYTES = 4096
MAX_BYTES = 2**30  # a tiny foreign record must not declare a huge array of zeros or of zlib data
_LEN = struct.Struct("<I")
_KINDS = set("biufc")  # bool, signed, unsigned, float, complex: nothing that holds objects
_ERRORS = (ValueError, TypeError, KeyError, struct.error, zlib.error, RecursionError, OverflowError)
_HEADERS: dict[bytes, tuple[list, list]] = {}  # header bytes -> (layout, [(name, dtype, shape, codec, size, nbytes)])


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """A record of a flat ``{name: array}`` dict of numeric arrays."""
    header, chunks = [], []
    for name, value in arrays.items():
        a = np.asarray(value)  # not ascontiguousarray: it turns 0-d arrays into 1-d
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"cannot store array {name!r} of dtype {a.dtype}: use a numeric dtype")
        raw, codec = (b"", "zeros") if a.nbytes >= 1024 and not a.any() else (a.tobytes(), "raw")
        if codec == "raw" and a.dtype == np.uint8 and a.nbytes >= COMPRESS_MIN_BYTES:
            packed = zlib.compress(raw, 1)
            if len(packed) <= 0.75 * len(raw):
                raw, codec = packed, "zlib"
        header.append([name, a.dtype.str, list(a.shape), codec, len(raw)])
        chunks.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *chunks])


def layout(arrays: dict[str, np.ndarray]) -> list:
    """``[[name, dtype, shape], ...]`` of a record: what sessions of one experiment share."""
    return [[k, np.asarray(v).dtype.str, list(np.shape(v))] for k, v in arrays.items()]


def decode(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a record made by :func:`encode`; RecordError for anything else."""
    out, _, errors = decode_batch([data])
    if errors:
        raise RecordError(errors[0][1])
    return {k: v[0, ...] for k, v in out.items()}  # [0, ...]: 0-d arrays stay arrays


def decode_batch(blobs: list[bytes], expected: list | None = None) -> tuple[dict, list[int], list[tuple[int, str]]]:
    """Records stacked: ``({name: (k, *shape)}, kept, errors)``, each array in one copy a header shared.

    ``kept``: the indices of the k records, in order; ``errors``: ``(index, reason)`` of corrupt or foreign ones.
    Records whose :func:`layout` differs from ``expected`` (default: the first good record's) are in neither.
    """
    groups, errors = {}, []  # header bytes -> (spec, indices of its records)
    for i, data in enumerate(blobs):
        try:
            head, found, spec = _split(data)
        except _ERRORS as e:
            errors.append((i, f"corrupt or foreign record ({e})"))
            continue
        expected = found if expected is None else expected
        if found == expected:
            groups.setdefault(head, (spec, []))[1].append(i)
    if not groups:
        return {}, [], errors
    kept = sorted(i for _, idx in groups.values() for i in idx)
    row = {i: r for r, i in enumerate(kept)}
    out = {name: np.zeros((len(kept), *shape), dtype) for name, dtype, shape in expected}
    for head, (spec, idx) in groups.items():
        rows = slice(None) if len(groups) == 1 else [row[i] for i in idx]
        joined = np.frombuffer(b"".join(blobs[i] for i in idx), np.uint8).reshape(len(idx), -1)  # a record a row
        pos = 8 + len(head)
        for name, dt, shape, codec, size, nbytes in spec:
            if codec == "raw" and size:  # each array is a band of columns
                out[name][rows] = joined[:, pos : pos + size].view(dt).reshape(len(idx), *shape)
            elif codec == "zlib":
                for j, i in enumerate(idx):
                    try:
                        raw = _inflate(joined[j, pos : pos + size], nbytes)
                        out[name][row[i]] = np.frombuffer(raw, dt).reshape(shape)
                    except _ERRORS as e:
                        errors.append((i, f"corrupt or foreign record ({e})"))
            pos += size
    if failed := {i for i, _ in errors if i in row}:  # zlib data that did not inflate to its shape
        kept = [i for i in kept if i not in failed]
        out = {name: a[[row[i] for i in kept]] for name, a in out.items()}
    return out, kept, errors


def _split(data: bytes) -> tuple[bytes, list, list]:
    """The header bytes, layout and validated spec of a record whose length matches its header."""
    if data[:4] != MAGIC:
        raise ValueError("not a tinyverse record")
    (n,) = _LEN.unpack_from(data, 4)
    head = bytes(memoryview(data)[8 : 8 + n])
    if len(head) != n:
        raise ValueError("truncated record")
    found, spec = _HEADERS.get(head) or _parse(head)
    end = 8 + n + sum(s[4] for s in spec)
    if end != len(data):
        raise ValueError("truncated record" if end > len(data) else "trailing bytes")
    return head, found, spec


def _parse(head: bytes) -> tuple[list, list]:
    """The layout and spec of a header, cached; ValueError for anything but numeric arrays that fit their bytes."""
    spec = []
    for name, dtype, shape, codec, size in json.loads(head):
        dt = np.dtype(dtype)
        if dt.kind not in _KINDS or dt.fields is not None:
            raise ValueError(f"forbidden dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in [*shape, size]):
            raise ValueError(f"bad shape {shape!r} or size {size!r}")
        if codec not in ("raw", "zeros", "zlib"):
            raise ValueError(f"unknown codec {codec!r}")
        nbytes = math.prod(shape) * dt.itemsize
        fits = size == nbytes if codec == "raw" else (codec == "zlib" or not size) and nbytes <= MAX_BYTES
        if not fits:
            raise ValueError(f"{codec} array {name!r} of {nbytes} bytes cannot take {size} bytes")
        spec.append((str(name), dt, tuple(shape), codec, size, nbytes))
    parsed = [[name, dt.str, list(shape)] for name, dt, shape, *_ in spec], spec
    if len(_HEADERS) < 1024:
        _HEADERS[head] = parsed
    return parsed


def _inflate(raw, nbytes: int) -> bytes:
    """zlib data of exactly ``nbytes``: never inflate more, so a tiny record cannot fill memory."""
    z = zlib.decompressobj()
    out = z.decompress(raw, max(nbytes, 1))  # 0 would mean no limit
    if len(out) != nbytes or not z.eof or z.unconsumed_tail:
        raise ValueError("compressed data does not fit the shape")
    return out
