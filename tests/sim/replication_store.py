"""Logs as lists of whole batches: ``PartLog``, and a small self-describing storage twin.

``PartLog`` is one partition's log as (base, end, epoch, raw) batches with binary search by
base offset: the replication simulator's checkers keep the canonical committed log and
their index of every replica's log in it (the disk itself is ``SimDisk``, a real
``MemoryStore``: replication_disk.py).

``Store`` with ``encode_batch``/``iter_batches`` is the older twin (durable and staged
``PartLog``s plus the persisted ``PersistState``; batches are ``(base, count, epoch, data
length)`` + data): the core unit tests (tests/unit/test_replication.py) still drive it.
"""
from __future__ import annotations

import bisect
import struct

from mesh.raft import PersistState

__all__ = ["SimFailure", "encode_batch", "iter_batches", "PartLog", "Store"]

_BATCH = struct.Struct(">qiiI")  # base offset, record count, epoch, data length


class SimFailure(AssertionError):
    """An invariant broke; the message ends with the command that reproduces it."""


def encode_batch(base: int, count: int, epoch: int, data: bytes) -> bytes:
    return _BATCH.pack(base, count, epoch, len(data)) + data


def iter_batches(payload: bytes):
    """Yield (base, end, epoch, raw) for each batch in a payload."""
    at, n = 0, len(payload)
    while at < n:
        base, count, epoch, size = _BATCH.unpack_from(payload, at)
        raw = payload[at:at + _BATCH.size + size]
        at += _BATCH.size + size
        yield base, base + count, epoch, raw
    if at != n:
        raise ValueError("payload ends inside a batch")


# -- storage twin ------------------------------------------------------------------------

class PartLog:
    """One partition's log on one broker: whole batches (base, end, epoch, raw)."""
    __slots__ = ("start", "bases", "batches")

    def __init__(self, start: int = 0, bases: list | None = None, batches: list | None = None) -> None:
        self.start = start
        self.bases = bases if bases is not None else []
        self.batches = batches if batches is not None else []

    @property
    def end(self) -> int:
        return self.batches[-1][1] if self.batches else self.start

    def copy(self) -> "PartLog":
        return PartLog(self.start, list(self.bases), list(self.batches))

    def is_boundary(self, offset: int) -> bool:
        if offset == self.end or offset == self.start:
            return True
        i = bisect.bisect_left(self.bases, offset)
        return i < len(self.bases) and self.bases[i] == offset

    def append(self, batches: list) -> None:
        for b in batches:
            assert b[0] == self.end
            self.bases.append(b[0])
            self.batches.append(b)

    def truncate(self, to: int) -> None:
        i = bisect.bisect_left(self.bases, to)
        del self.bases[i:], self.batches[i:]

    def reset(self, start: int) -> None:
        self.start, self.bases, self.batches = start, [], []

    def trim_head(self, new_start: int) -> None:
        i = bisect.bisect_left(self.bases, new_start)
        del self.bases[:i], self.batches[:i]
        self.start = new_start

    def upto(self, offset: int) -> list:
        """The batches below ``offset``."""
        return self.batches[:bisect.bisect_left(self.bases, offset)]

    def read(self, frm: int, to: int, max_bytes: int) -> tuple[bytes, int]:
        i = bisect.bisect_left(self.bases, frm)
        if i == len(self.bases) or self.bases[i] != frm:
            raise SimFailure(f"core read from {frm}, not a batch boundary (log {self.start}..{self.end})")
        parts, size, end = [], 0, frm
        while i < len(self.batches):
            base, b_end, _, raw = self.batches[i]
            if b_end > to or (parts and size + len(raw) > max_bytes):
                break
            parts.append(raw)
            size += len(raw)
            end = b_end
            i += 1
        if not parts:
            raise SimFailure(f"core read [{frm}, {to}) which holds no whole batch")
        return b"".join(parts), end


class Store:
    """One broker's disk: a durable and a staged view of every partition log and of the
    persisted replication state. Also the core's ``LogReader`` (reads the staged view, as
    the production reader reads through the open write transaction)."""

    def __init__(self, pids: list[int], reads_staged: bool = True) -> None:
        self.reads_staged = reads_staged  # False: like an LMDB reader outside the write txn
        self.durable = {pid: PartLog() for pid in pids}
        self.durable_state: dict[int, PersistState | None] = {pid: None for pid in pids}
        self.live = {pid: PartLog() for pid in pids}
        self.live_state: dict[int, PersistState | None] = dict(self.durable_state)
        self.dirty: set[int] = set()

    def read(self, pid: int, from_offset: int, to_offset: int, max_bytes: int) -> tuple[bytes, int]:
        if self.reads_staged:
            return self.live[pid].read(from_offset, to_offset, max_bytes)
        log = self.durable[pid]
        if from_offset >= log.end:
            return b"", from_offset
        return log.read(from_offset, min(to_offset, log.end), max_bytes)

    def start_offset(self, pid: int) -> int:
        return self.live[pid].start

    def sync(self) -> None:
        for pid in sorted(self.dirty):
            self.durable[pid] = self.live[pid].copy()
            self.durable_state[pid] = self.live_state[pid]
        self.dirty.clear()

    def crash(self) -> None:
        for pid in sorted(self.dirty):
            self.live[pid] = self.durable[pid].copy()
            self.live_state[pid] = self.durable_state[pid]
        self.dirty.clear()
