"""Kafka v2 record batches <-> mesh record batches (``mesh.wire.records``).

Both directions run in the listener's process, in C where it counts: aiokafka's compiled
record module parses Kafka batches (CRC32C checked, gzip, snappy, lz4 and zstd through
cramjam) and builds them; msgpack (``encode_batch``, ``decode_batch``) does the mesh's
columns. Python touches each record once, to move its fields from one to the other.

- ``to_mesh``: one Kafka batch (Produce v3+ carries exactly one per partition) becomes one
  mesh batch of the same records, in order, with keys, values (None stays None: a
  tombstone), timestamps (a timestamp below 0, "none", becomes the arrival time) and headers.
  The Kafka producer id, epoch and base sequence map onto the mesh's idempotent batch header
  (``mesh_producer_id``): one mesh producer id per (Kafka producer id, epoch), so a retry of
  a batch through any listener, to any leader, is the same batch to the mesh's dedup, and an
  epoch bump (KIP-360) starts a new sequence space, as in Kafka. Control and transactional
  batches are refused (no transactions here).
- ``to_kafka``: mesh batches become Kafka batches with the same offsets (base offset
  patched into the built batch, outside its CRC), uncompressed, no producer id (the
  consumer does not use it outside transactions).
"""
from __future__ import annotations

import operator
import struct
import time
from itertools import repeat

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c
from aiokafka.record.memory_records import MemoryRecords

from mesh.wire.compacted import ATTR_COMPACTED, compacted_columns
from mesh.wire.records import decode_batch, encode_batch, iter_batches

__all__ = ["ConvertError", "to_mesh", "to_kafka", "mesh_producer_id", "MAX_KAFKA_PRODUCER_ID", "KafkaBatchInfo"]

MAX_KAFKA_PRODUCER_ID = (1 << 47) - 1   # (id << 16 | epoch) stays a positive int64
_BIG = 1 << 30
_VALUE, _KEY, _TIMESTAMP, _HEADERS = (operator.attrgetter(a) for a in ("value", "key", "timestamp", "headers"))
_NO_HEADERS: list = []


class ConvertError(Exception):
    """A batch that cannot be stored; ``code`` is the Kafka error name for the answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def mesh_producer_id(producer_id: int, epoch: int) -> int:
    return (producer_id << 16) | (epoch & 0xFFFF)


class KafkaBatchInfo:
    __slots__ = ("count", "producer_id", "epoch", "base_sequence")

    def __init__(self, count: int, producer_id: int, epoch: int, base_sequence: int) -> None:
        self.count, self.producer_id, self.epoch, self.base_sequence = count, producer_id, epoch, base_sequence


def to_mesh(records: bytes) -> tuple[bytes, KafkaBatchInfo]:
    """(mesh batch, what the Kafka batch said) of a Produce request's records."""
    if not records:
        raise ConvertError("invalid_request", "no records")
    try:
        records = bytes(records)
        mr = MemoryRecords(records)
        batch = mr.next_batch()
        if batch is None:
            raise ConvertError("corrupt_message", "no complete record batch")
        if batch.magic != 2:
            raise ConvertError("unsupported_for_message_format", f"record batch magic {batch.magic}: only v2")
        if mr.has_next():
            raise ConvertError("invalid_request", "one record batch per partition (Produce v3+)")
        end = 12 + int.from_bytes(records[8:12], "big")   # the CRC covers attributes .. the batch's end
        if end > len(records) or crc32c(memoryview(records)[21:end]) != batch.crc:   # (hardware CRC32C)
            raise ConvertError("corrupt_message", "record batch CRC32C mismatch")
        if batch.is_control_batch or batch.is_transactional:
            raise ConvertError("invalid_request", "transactional and control batches are not supported")
        recs = list(batch)   # (decompressed and parsed in C)
        n = len(recs)
        if n and (recs[-1].offset - batch.base_offset != n - 1 or batch.last_offset_delta != n - 1):
            raise ConvertError("invalid_request", "record offset deltas must be 0, 1, 2, ...")
        values = list(map(_VALUE, recs))   # (map with attrgetter: no Python frame per record)
        keys = list(map(_KEY, recs))
        timestamps = list(map(_TIMESTAMP, recs))
        if n and (min(timestamps) < 0):   # "no timestamp": the arrival time
            now_ms = int(time.time() * 1000)
            timestamps = [now_ms if t < 0 else t for t in timestamps]
        headers = list(map(_HEADERS, recs))
        if not any(headers):
            headers = None
    except ConvertError:
        raise
    except Exception as exc:   # aiokafka's errors for truncated or malformed batches
        raise ConvertError("corrupt_message", f"record batch does not parse: {type(exc).__name__}: {exc}") from None
    if not values:
        raise ConvertError("invalid_request", "a record batch without records")
    pid, epoch, seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
    info = KafkaBatchInfo(len(values), pid, epoch, seq)
    if pid >= 0:
        if pid > MAX_KAFKA_PRODUCER_ID or epoch < 0 or seq < 0:
            raise ConvertError("unknown_producer_id", f"producer id {pid} / epoch {epoch} / sequence {seq}")
        mesh_pid, mesh_seq = mesh_producer_id(pid, epoch), seq
    else:
        mesh_pid, mesh_seq = -1, -1
    if keys.count(None) == len(keys):
        keys = None   # (encode_batch would look at each key in Python)
    return encode_batch(values, keys, timestamps, headers, producer_id=mesh_pid, base_sequence=mesh_seq), info


_EMPTY_TAIL = struct.Struct(">hiqqqhii")   # attributes .. record count (the part the CRC covers)


def _empty_kafka_batch(h) -> bytes:
    """A Kafka v2 batch of no records spanning ``h``'s offsets (clients move past it)."""
    tail = _EMPTY_TAIL.pack(0, h.record_count - 1, h.first_timestamp_ms, h.max_timestamp_ms, -1, -1, -1, 0)
    head = struct.pack(">qiib", h.base_offset, 4 + 1 + 4 + len(tail), 0, 2)
    return head + struct.pack(">I", crc32c(tail)) + tail


def to_kafka(payload, first_offset: int = 0) -> tuple[bytes, int]:
    """(Kafka batches, records) of a native fetch's payload: every mesh batch as one Kafka
    batch, offsets unchanged. Batches wholly below ``first_offset`` are left out; a batch
    that holds it is sent whole (clients skip what is below their position)."""
    out = []
    count = 0
    for h, raw in iter_batches(payload, verify_crc=False):   # the native consumer's rule: the node checked
        if h.next_offset <= first_offset:
            continue
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=_BIG)
        ts0 = h.first_timestamp_ms
        if h.attributes & ATTR_COMPACTED:   # offsets with gaps (compaction kept some records)
            values, keys, deltas, headers, offs = compacted_columns(raw, h)
            n = len(values)
            if not n:   # nothing left: an empty batch spanning its offsets, as Kafka's cleaner leaves
                out.append(_empty_kafka_batch(h))
                continue
        else:
            _, values, keys, deltas, headers = decode_batch(raw, h)
            n = h.record_count
            offs = range(n)
        # one C call per record through map (no Python frame per record)
        tss = [ts0 + d for d in deltas] if deltas else repeat(ts0, n)
        hs = [[(k, v) for k, v in x] if x else _NO_HEADERS for x in headers] if headers else repeat(_NO_HEADERS, n)
        for _ in map(b.append, offs, tss, keys if keys else repeat(None, n), values, hs):
            pass
        buf = b.build()
        buf[0:8] = h.base_offset.to_bytes(8, "big")
        if h.attributes & ATTR_COMPACTED and offs[-1] != h.record_count - 1:
            # the batch spans its offsets as stored (lastOffsetDelta), so clients step over the gap
            buf[23:27] = (h.record_count - 1).to_bytes(4, "big")
            buf[17:21] = crc32c(memoryview(buf)[21:]).to_bytes(4, "big")
        out.append(bytes(buf))
        count += n
    return b"".join(out), count
