"""Finding a record by timestamp inside one stored batch (``StoreBase.offset_for_time``).

A batch header holds its first and max timestamps; the records' own timestamps are the
first plus the delta column (nil when they are all the first). So most answers need no
decoding at all: a batch whose first timestamp already reaches the target answers with its
first record, and so does a batch with no delta column. Only a batch whose records'
timestamps differ and whose first is below the target has its delta column decoded (the
whole payload, one C call: msgpack cannot skip to the third column)."""
from __future__ import annotations

import struct

import msgpack

from mesh.wire.records import HEADER_SIZE

__all__ = ["records_at_time"]

_TS = struct.Struct(">QQ")   # first, max timestamp at byte 24
_COUNT = struct.Struct(">I")  # record count at byte 20


def records_at_time(batch, timestamp_ms: int, from_offset: int, limit_offset: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of ``batch`` in [from_offset, limit_offset)
    whose timestamp is >= ``timestamp_ms``, or None."""
    base = struct.unpack_from(">Q", batch, 0)[0]
    n = _COUNT.unpack_from(batch, 20)[0]
    first, mx = _TS.unpack_from(batch, 24)
    lo, hi = max(0, from_offset - base), min(n, limit_offset - base)
    if lo >= hi or mx < timestamp_ms:
        return None
    if first == mx or (lo == 0 and first >= timestamp_ms):
        if first == mx:   # every record has this timestamp (no delta column)
            return base + lo, first
        return base, first
    try:
        deltas = msgpack.unpackb(memoryview(batch)[HEADER_SIZE:], raw=False)[2]
    except Exception:   # an older broker stored it unchecked: no answer from it
        return None
    if not isinstance(deltas, list) or len(deltas) != n:
        return None
    try:
        for i in range(lo, hi):
            ts = first + deltas[i]
            if ts >= timestamp_ms:
                return base + i, ts
    except TypeError:   # (as above: not an int)
        pass
    return None
