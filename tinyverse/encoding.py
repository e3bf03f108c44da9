"""Arrays <-> bytes without pickle.

A record is ``MAGIC | u32 header length | JSON header | raw array bytes``. The
header lists ``[name, dtype, shape, codec, nbytes]`` for each array; only plain
numeric dtypes are accepted, so decoding can never build objects or run code.
Large uint8 arrays (image frames) are zlib-compressed when that saves at least
a quarter of their size.
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


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """Encode a flat ``{name: array}`` dict into bytes."""
    header, chunks = [], []
    for name, value in arrays.items():
        a = np.asarray(value)  # not ascontiguousarray: it turns 0-d arrays into 1-d
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"cannot store array {name!r} of dtype {a.dtype}: use a numeric dtype")
        raw, codec = a.tobytes(), "raw"
        if a.dtype == np.uint8 and a.nbytes >= COMPRESS_MIN_BYTES:
            packed = zlib.compress(raw, 1)
            if len(packed) <= 0.75 * len(raw):
                raw, codec = packed, "zlib"
        header.append([name, a.dtype.str, list(a.shape), codec, len(raw)])
        chunks.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *chunks])


def decode(data: bytes) -> dict[str, np.ndarray]:
    """Decode bytes made by :func:`encode`; raise RecordError on anything else."""
    try:
        if data[:4] != MAGIC:
            raise ValueError("not a tinyverse record")
        (n,) = _LEN.unpack_from(data, 4)
        header = json.loads(data[8 : 8 + n])
        out, pos = {}, 8 + n
        for name, dtype, shape, codec, size in header:
            dt = np.dtype(dtype)
            if dt.kind not in _KINDS or dt.fields is not None:
                raise ValueError(f"forbidden dtype {dtype!r}")
            raw = data[pos : pos + size]
            if len(raw) != size:
                raise ValueError("truncated record")
            pos += size
            if codec == "zlib":  # inflate no more than the shape holds: a tiny record must not fill memory
                want, z = math.prod(shape) * dt.itemsize, zlib.decompressobj()
                raw = z.decompress(raw, max(want, 1))  # 0 would mean no limit
                if len(raw) != want or not z.eof or z.unconsumed_tail:
                    raise ValueError("compressed data does not fit the shape")
            elif codec != "raw":
                raise ValueError(f"unknown codec {codec!r}")
            out[str(name)] = np.frombuffer(raw, dtype=dt).reshape(shape)
        if pos != len(data):
            raise ValueError("trailing bytes")
        return out
    except (ValueError, TypeError, KeyError, struct.error, zlib.error, RecursionError, OverflowError) as e:
        raise RecordError(f"corrupt or foreign record ({e})") from None
