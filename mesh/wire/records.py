"""Record batches: the unit that travels, is stored and is served.

A producer encodes a batch once. The leader patches two fixed-position header fields
(base offset, leader epoch) and stores the bytes; followers store the same bytes; consumers
receive them. No broker decodes records: it reads the 56-byte header and checks the CRC.

Layout (big-endian)::

    0   u64  base_offset        patched by the leader
    8   u32  leader_epoch       patched by the leader
    12  u32  crc32              of bytes 16..end (header tail + payload)
    16  u8   magic (=1)
    17  u8   attributes         bit 0: control batch (no user records)
    18  u16  reserved
    20  u32  record_count
    24  u64  first_timestamp_ms
    32  u64  max_timestamp_ms
    40  i64  producer_id        -1 when not idempotent
    48  i32  base_sequence      -1 when not idempotent
    52  u32  payload_length
    56  ...  payload

The payload is one msgpack array ``[values, keys, timestamp_deltas, headers]``: columns,
so the common shapes encode and decode in C (msgpack) with no Python loop per record.
``keys``, ``timestamp_deltas`` and ``headers`` are None when every record has none / the
same timestamp. A value is bytes or nil: nil is a null value (a tombstone, Kafka's null),
distinct from an empty value (``b""``); a header value may be nil too.

The broker's check (``validate_batch``): header fields, length and CRC in O(1) Python
steps, then the columns' types in C (``mesh.wire.record_check``: one msgpack unpack of the
payload with the columns' types as its schema, as Kafka's LogValidator checks records before it appends):
a batch that would hand a consumer an int for a key, or trailing bytes, is not stored.
"""
from __future__ import annotations

import operator
import struct
import threading
import zlib
from itertools import repeat
from typing import Iterator, NamedTuple, Sequence

import msgpack

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.compacted import ATTR_COMPACTED, compacted_columns
from mesh.wire.record_check import check_columns, decode_columns

__all__ = [
    "HEADER_SIZE", "BatchHeader", "Record", "encode_batch", "decode_batch", "parse_header",
    "iter_batches", "patch_batch", "records_from", "validate_batch", "ATTR_COMPACTED", "batch_records",
]

MAGIC = 1
ATTR_CONTROL = 0x01
_HEADER = struct.Struct(">QII BBH I QQ qi I")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 56
_PREFIX = struct.Struct(">QI")  # base_offset, leader_epoch
_PREFIX_CRC = struct.Struct(">QII")  # base_offset, leader_epoch, crc32
_TAIL = struct.Struct(">BBH I QQ qi I")   # the header from magic on (inside the CRC)
assert _PREFIX_CRC.size + _TAIL.size == HEADER_SIZE
_local = threading.local()
_COUNT_AT = 20
_PAYLOAD_LEN_AT = 52
_VALUES_AT = HEADER_SIZE + 1   # the values array's header, after a one-byte [4-array] header
_COPY_CRC_MAX = 4096


class BatchHeader(NamedTuple):
    base_offset: int
    leader_epoch: int
    crc: int
    magic: int
    attributes: int
    reserved: int
    record_count: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    base_sequence: int
    payload_length: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.payload_length


_tuple_new = tuple.__new__
_NO_HEADERS: tuple = ()


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None   # None: a null value (tombstone), distinct from b""
    headers: list


def encode_batch(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
                 timestamps_ms: Sequence[int] | int = 0, headers: Sequence | None = None,
                 producer_id: int = -1, base_sequence: int = -1, attributes: int = 0) -> bytes:
    """Encode a batch. ``timestamps_ms`` is one int for all records, or one per record. A
    value None is a null value (nil in the values column), kept apart from ``b""``."""
    n = len(values)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    if isinstance(timestamps_ms, int):
        first_ts = max_ts = timestamps_ms
        deltas = None
    else:
        first_ts = timestamps_ms[0]
        max_ts = max(timestamps_ms)
        if max_ts == first_ts and min(timestamps_ms) == first_ts:
            deltas = None   # one millisecond for the whole batch (the common case): no column
        else:   # (map in C: no Python frame per record)
            deltas = list(map(operator.sub, timestamps_ms, repeat(first_ts)))
    if keys is not None and all(k is None for k in keys):
        keys = None
    if headers is not None and not any(headers):
        headers = None
    try:
        packer = _local.packer
    except AttributeError:   # one reusable Packer per thread (msgpack.packb builds one per call)
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        payload = packer.pack([values, keys, deltas, headers])
    except BaseException:
        packer.reset()   # a failed pack may leave bytes behind in the packer's buffer
        raise
    tail = _TAIL.pack(MAGIC, attributes, 0, n, first_ts, max_ts, producer_id, base_sequence, len(payload))
    # the payload is copied once (by the join); the CRC runs over the tail, then the payload
    return b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload))


def parse_header(buf, pos: int = 0) -> BatchHeader:
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def validate_batch(buf: bytes, max_bytes: int) -> BatchHeader:
    """Check one batch as a produce request carries it. O(1) in the number of records
    except for the CRC (C speed). Raises MeshError with a reason."""
    n = len(buf)
    if n > max_bytes:
        raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                        f"batch of {n} bytes exceeds the topic's max.message.bytes={max_bytes}")
    if n < HEADER_SIZE:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"batch of {n} bytes is shorter than its {HEADER_SIZE}-byte header")
    h = _tuple_new(BatchHeader, _HEADER.unpack_from(buf))   # parse_header without its Python frames
    if h.magic != MAGIC:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"unknown batch magic {h.magic}")
    if h.payload_length != n - HEADER_SIZE:
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"batch header says {h.payload_length} payload bytes, frame has {n - HEADER_SIZE}")
    count = h.record_count
    if count < 1:
        raise MeshError(ErrorCode.INVALID_REQUEST, "batch has no records")
    if count > h.payload_length:   # every record takes a byte at least (its value): offsets are not free
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"batch claims {count} records in {h.payload_length} payload bytes")
    # a small batch is cheaper to copy than to view (a memoryview and its slice are two objects)
    if zlib.crc32(buf[16:] if n <= _COPY_CRC_MAX else memoryview(buf)[16:]) != h.crc:
        raise MeshError(ErrorCode.CORRUPT_MESSAGE, "batch CRC32 mismatch")
    # the common case inline (a fixarray of 4, then a fixarray of values); _array_len otherwise
    if not (n > _VALUES_AT and buf[HEADER_SIZE] == 0x94 and 0x90 <= buf[_VALUES_AT] <= 0x9F
            and buf[_VALUES_AT] & 0x0F == count) \
            and (_array_len(buf, HEADER_SIZE) != 4 or _array_len(buf, _VALUES_AT) != count):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        "batch payload is not [values, keys, deltas, headers] with record_count values")
    if h.attributes or h.reserved:   # a control batch is the broker's to write, never a client's
        raise MeshError(ErrorCode.INVALID_RECORD, f"batch attributes {h.attributes:#x} / reserved {h.reserved:#x}: "
                                                  "a client batch has no flags (unknown or control)")
    cols = decode_columns(buf[HEADER_SIZE:] if n <= _COPY_CRC_MAX else memoryview(buf)[HEADER_SIZE:])
    check_columns(cols, count, h.first_timestamp_ms, h.max_timestamp_ms)
    return h


def _array_len(buf, pos: int) -> int:
    """Length of the msgpack array starting at ``pos``; -1 if there is none."""
    if pos >= len(buf):
        return -1
    b = buf[pos]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC and pos + 3 <= len(buf):
        return int.from_bytes(buf[pos + 1:pos + 3], "big")
    if b == 0xDD and pos + 5 <= len(buf):
        return int.from_bytes(buf[pos + 1:pos + 5], "big")
    return -1


def patch_batch(buf: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """The leader's only edit: set base offset and epoch (outside the CRC)."""
    return b"".join((_PREFIX.pack(base_offset, leader_epoch), memoryview(buf)[12:]))  # one copy


def iter_batches(buf, verify_crc: bool = True) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Walk concatenated batches: (header, whole batch bytes)."""
    mv = memoryview(buf)
    pos, end = 0, len(mv)
    while pos + HEADER_SIZE <= end:
        h = parse_header(mv, pos)
        stop = pos + HEADER_SIZE + h.payload_length
        if stop > end:
            raise MeshError(ErrorCode.CORRUPT_MESSAGE, f"truncated batch at offset {h.base_offset}")
        if verify_crc and zlib.crc32(mv[pos + 16:stop]) != h.crc:
            raise MeshError(ErrorCode.CORRUPT_MESSAGE, f"CRC mismatch in batch at offset {h.base_offset}")
        yield h, mv[pos:stop]
        pos = stop
    if pos != end:
        raise MeshError(ErrorCode.CORRUPT_MESSAGE, "trailing bytes after the last batch")


def decode_batch(batch, header: BatchHeader | None = None) -> tuple[BatchHeader, list, list | None,
                                                                     list | None, list | None]:
    """(header, values, keys, timestamp deltas, headers) of one batch. ``header``: its header
    as ``iter_batches`` gave it (that walk checked length and CRC), not parsed again.
    Raises MeshError(INVALID_RECORD) for columns that are not records."""
    h = parse_header(batch) if header is None else header
    # the columns' types are checked as they are decoded (in C): a batch stored by a broker
    # that did not check them must not hand an int for a key to the application
    cols = decode_columns(batch[HEADER_SIZE:])
    check_columns(cols, h.record_count)
    values, keys, deltas, headers = cols
    return h, values, keys, deltas, headers


def records_from(topic: str, partition: int, batch, min_offset: int = 0,
                 header: BatchHeader | None = None) -> list[Record]:
    """Turn one batch into Records, skipping offsets below ``min_offset`` (``header``: see
    ``decode_batch``)."""
    h = parse_header(batch) if header is None else header
    if h.attributes & ATTR_COMPACTED:
        return _compacted_records(topic, partition, batch, h, min_offset)
    h, values, keys, deltas, headers = decode_batch(batch, h)
    n = h.record_count
    base = h.base_offset
    skip = max(0, min_offset - base)
    if skip >= n:
        return []
    offsets = range(base + skip, base + n)
    ts = h.first_timestamp_ms
    tss = [ts + d for d in deltas[skip:]] if deltas else repeat(ts, n - skip)
    ks = keys[skip:] if keys else repeat(None, n - skip)
    hs = [tuple(map(tuple, x)) if x else _NO_HEADERS for x in headers[skip:]] if headers else repeat(_NO_HEADERS, n - skip)
    vs = values[skip:] if skip else values
    m = n - skip
    # tuple.__new__ straight from C: no Python frame per record
    return list(map(_tuple_new, repeat(Record, m), zip(repeat(topic, m), repeat(partition, m),
                                                         offsets, tss, ks, vs, hs)))


def _compacted_records(topic: str, partition: int, batch, h: BatchHeader, min_offset: int) -> list[Record]:
    """``records_from`` of a batch compaction rewrote (``mesh.wire.compacted``): the kept
    records at their own offsets, gaps stepped over."""
    values, keys, deltas, headers, offs = compacted_columns(batch, h)
    base, ts = h.base_offset, h.first_timestamp_ms
    out = []
    for i, od in enumerate(offs):
        off = base + od
        if off < min_offset:
            continue
        hs = tuple(map(tuple, headers[i])) if headers and headers[i] else _NO_HEADERS
        out.append(_tuple_new(Record, (topic, partition, off, ts + (deltas[i] if deltas else 0),
                                       keys[i] if keys else None, values[i], hs)))
    return out


def batch_records(batch, header: BatchHeader | None = None) -> tuple[BatchHeader, list[tuple]]:
    """(header, [(offset delta, value, key, timestamp ms, headers), ...]) of any stored
    batch, compacted or not: what compaction and the converters walk."""
    h = parse_header(batch) if header is None else header
    if h.attributes & ATTR_COMPACTED:
        values, keys, deltas, headers, offs = compacted_columns(batch, h)
    else:
        _, values, keys, deltas, headers = decode_batch(batch, h)
        offs = range(h.record_count)
    n = len(values)
    ts = h.first_timestamp_ms
    return h, list(zip(offs, values, keys if keys else repeat(None, n),
                       [ts + d for d in deltas] if deltas else repeat(ts, n),
                       headers if headers else repeat(None, n)))
