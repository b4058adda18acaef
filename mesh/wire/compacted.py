"""Compacted batches: a batch the broker rewrote, keeping some of its records.

Compaction (``storage.compaction``) keeps the newest record of each key and drops the
rest, with offsets unchanged. A rewritten batch keeps its header's base offset, epoch,
``record_count`` (the offsets it spans: the next batch still starts at base + count, so
the log has no gap *between* batches), first and max timestamps and producer fields; it
sets ``ATTR_COMPACTED`` and its payload is a 5-array::

    [values, keys, timestamp_deltas, headers, offset_deltas]

the first four as in ``mesh.wire.records`` but one entry per *kept* record (maybe none),
the fifth the kept records' offsets minus the base offset, strictly increasing and below
``record_count``. Offsets inside a batch then have gaps, as in Kafka after its cleaner ran;
readers step over them (``records.records_from``, the Kafka conversion, the Spark source).
Only brokers write such batches: ``records.validate_batch`` refuses any attribute from a
client. The CRC is computed over the rewritten bytes, so every check of a stored batch
(CRC, header base against its key, no gap to the batch before, epochs) holds unchanged.
"""
from __future__ import annotations

import struct
import zlib

import msgpack

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["ATTR_COMPACTED", "encode_compacted", "decode_compacted", "compacted_columns"]

ATTR_COMPACTED = 0x02
_HEADER = struct.Struct(">QII BBH I QQ qi I")
_HEADER_SIZE = 56


def _bad(reason: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_RECORD, reason)


def encode_compacted(header, kept: list[tuple[int, bytes | None, bytes | None, int, list | tuple]]) -> bytes:
    """A batch with ``header``'s fixed fields holding only ``kept``: ``(offset delta, value,
    key, timestamp ms, headers)`` per record, in offset order. The CRC is computed anew."""
    values = [k[1] for k in kept]
    keys = [k[2] for k in kept]
    first = header.first_timestamp_ms
    deltas = [k[3] - first for k in kept]
    hdrs = [list(map(list, k[4])) if k[4] else None for k in kept]
    if all(k is None for k in keys):
        keys = None
    if not any(d for d in deltas):
        deltas = None
    if not any(hdrs):
        hdrs = None
    payload = msgpack.packb([values, keys, deltas, hdrs, [k[0] for k in kept]], use_bin_type=True)
    tail = struct.pack(">BBH I QQ qi I", header.magic, header.attributes | ATTR_COMPACTED, 0,
                       header.record_count, first, header.max_timestamp_ms, header.producer_id,
                       header.base_sequence, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return b"".join((struct.pack(">QII", header.base_offset, header.leader_epoch, crc), tail, payload))


def decode_compacted(payload, record_count: int) -> tuple[list, list | None, list | None, list | None, list]:
    """(values, keys, timestamp deltas, headers, offset deltas) of a compacted batch's
    payload, types and counts checked; MeshError(INVALID_RECORD) otherwise."""
    try:
        cols = msgpack.unpackb(payload, raw=False, max_map_len=0, max_ext_len=0)
    except Exception as exc:
        raise _bad(f"compacted batch columns are not valid msgpack ({type(exc).__name__})") from None
    if type(cols) is not list or len(cols) != 5:
        raise _bad("compacted batch payload is not [values, keys, deltas, headers, offsets]")
    values, keys, deltas, headers, offsets = cols
    if type(values) is not list or type(offsets) is not list:
        raise _bad("compacted batch: values and offsets must be arrays")
    n = len(values)
    if len(offsets) != n or any(type(o) is not int for o in offsets):
        raise _bad("compacted batch: one int offset per value")
    if n and (offsets[0] < 0 or offsets[-1] >= record_count
              or any(a >= b for a, b in zip(offsets, offsets[1:]))):
        raise _bad("compacted batch: offsets not increasing inside the batch's span")
    if any(v is not None and type(v) is not bytes for v in values):
        raise _bad("compacted batch: values must be bytes or nil")
    for col, name in ((keys, "keys"), (deltas, "timestamp deltas"), (headers, "headers")):
        if col is not None and (type(col) is not list or len(col) != n):
            raise _bad(f"compacted batch: the {name} column is neither nil nor one entry per value")
    if keys is not None and any(k is not None and type(k) is not bytes for k in keys):
        raise _bad("compacted batch: keys must be bytes or nil")
    if deltas is not None and any(type(d) is not int for d in deltas):
        raise _bad("compacted batch: timestamp deltas must be ints")
    if headers is not None:
        for x in headers:
            if x is not None and (type(x) is not list or any(
                    type(p) is not list or len(p) != 2 or type(p[0]) is not str
                    or (p[1] is not None and type(p[1]) is not bytes) for p in x)):
                raise _bad("compacted batch: headers must be [str, bytes or nil] pairs")
    return values, keys, deltas, headers, offsets


def compacted_columns(batch, header) -> tuple[list, list | None, list | None, list | None, list]:
    """``decode_compacted`` of a whole stored batch (``header``: its parsed header)."""
    return decode_compacted(memoryview(batch)[_HEADER_SIZE:], header.record_count)
