"""Arrays <-> bytes without pickle.

A record is ``MAGIC | u32 header length | JSON header | array bytes``. The
header lists ``[name, dtype, shape, codec, nbytes]`` for each array; only plain
numeric dtypes are accepted, so decoding can never build objects or run code.
Codecs: ``raw``; ``zeros`` (nothing stored: e.g. ``final_observations`` of a
session where no episode ended); ``zlib`` for uint8 arrays of 4 KiB or more
(image frames) when that saves at least a quarter of their size.

Sessions of one experiment share one header, so a parsed and validated header
is cached by its bytes, and raw arrays are views into the record (no copies).
"""

import json
import math
import struct
import zlib

import numpy as np

from .errors import RecordError

MAGIC = b"TVR1"
_LEN = struct.Struct("<I")
_KINDS = set("biufc")  # bool, signed, unsigned, float, complex: nothing that holds objects
COMPRESS_MIN_BYTES = 4096
MAX_ZEROS_BYTES = 2**30  # a tiny foreign record must not declare a huge array of zeros
_HEADERS: dict[bytes, list] = {}  # header bytes -> validated [(name, dtype, shape, codec, size, nbytes)]


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """Encode a flat ``{name: array}`` dict into bytes."""
    header, chunks = [], []
    for name, value in arrays.items():
        a = np.asarray(value)  # not ascontiguousarray: it turns 0-d arrays into 1-d
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"cannot store array {name!r} of dtype {a.dtype}: use a numeric dtype")
        if a.nbytes >= 1024 and not a.any():
            raw, codec = b"", "zeros"
        else:
            raw, codec = a.tobytes(), "raw"
        if codec == "raw" and a.dtype == np.uint8 and a.nbytes >= COMPRESS_MIN_BYTES:
            packed = zlib.compress(raw, 1)
            if len(packed) <= 0.75 * len(raw):
                raw, codec = packed, "zlib"
        header.append([name, a.dtype.str, list(a.shape), codec, len(raw)])
        chunks.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *chunks])


def _parse(head: bytes) -> list:
    """Validate a header once; raise ValueError on anything but numeric arrays."""
    spec = _HEADERS.get(head)
    if spec is not None:
        return spec
    spec = []
    for name, dtype, shape, codec, size in json.loads(head):
        dt = np.dtype(dtype)
        if dt.kind not in _KINDS or dt.fields is not None:
            raise ValueError(f"forbidden dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"bad shape {shape!r}")
        shape = tuple(shape)
        if type(size) is not int or size < 0:
            raise ValueError(f"bad size {size!r}")
        nbytes = math.prod(shape) * dt.itemsize
        if codec not in ("raw", "zeros", "zlib"):
            raise ValueError(f"unknown codec {codec!r}")
        if (codec == "raw" and size != nbytes) or (codec == "zeros" and (size or nbytes > MAX_ZEROS_BYTES)):
            raise ValueError(f"{codec} array {name!r} of {nbytes} bytes cannot take {size} bytes")
        spec.append((str(name), dt, shape, codec, size, nbytes))
    if len(_HEADERS) < 1024:
        _HEADERS[bytes(head)] = spec
    return spec


def decode(data: bytes) -> dict[str, np.ndarray]:
    """Decode bytes made by :func:`encode`; raise RecordError on anything else."""
    try:
        if data[:4] != MAGIC:
            raise ValueError("not a tinyverse record")
        (n,) = _LEN.unpack_from(data, 4)
        view, pos, out = memoryview(data), 8 + n, {}
        for name, dt, shape, codec, size, nbytes in _parse(bytes(view[8:pos])):
            raw = view[pos : pos + size]
            if len(raw) != size:
                raise ValueError("truncated record")
            pos += size
            if codec == "zeros":
                out[name] = np.zeros(shape, dt)
                continue
            if codec == "zlib":  # inflate no more than the shape holds: a tiny record must not fill memory
                z = zlib.decompressobj()
                raw = z.decompress(raw, max(nbytes, 1))  # 0 would mean no limit
                if len(raw) != nbytes or not z.eof or z.unconsumed_tail:
                    raise ValueError("compressed data does not fit the shape")
            out[name] = np.frombuffer(raw, dtype=dt).reshape(shape)
        if pos != len(data):
            raise ValueError("trailing bytes")
        return out
    except (ValueError, TypeError, KeyError, struct.error, zlib.error, RecursionError, OverflowError) as e:
        raise RecordError(f"corrupt or foreign record ({e})") from None
