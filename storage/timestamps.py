"""Finding the first record at or after a timestamp (``StoreBase.offset_for_time``, Kafka's
ListOffsets by timestamp).

Kafka's answer is the first record in offset order whose timestamp is >= the target
(timestamps need not grow along a log: producers choose them). Each batch header holds its
first and max timestamps, and the broker checked them against the records
(``mesh.wire.record_check``), so a batch whose max is below the target is skipped unread.

``TimeIndex`` keeps, per partition, the max timestamp of each run of ``RUN_BATCHES``
consecutive batches, built lazily from the batch headers (12 bytes read from each stored
value, zero-copy) the first time a partition is asked and extended by what was committed
since on the next ask; it covers only what is below the high watermark, which Raft never
takes back. A lookup walks the runs (one Python step per run, not per batch) to the first
whose max reaches the target, then that run's headers (at most ``RUN_BATCHES``), then
reads that one batch (CRC checked) and, only if its records' timestamps differ and its
first is below the target, decodes its delta column. The first run may be partly deleted
by retention (its max may be a deleted batch's): a run that does not hold the answer is
simply passed. The lookups of one request share a budget of ``MAX_WALK_BATCHES`` header
reads (a batch read counts ``READ_COST``); a lookup the budget does not cover raises
``StillIndexing`` (the node answers TIMEOUT, retriable, and the client asks again), so
indexing a long partition, or a request for thousands of partitions, is spread over
several requests instead of holding the node loop. Truncation cuts the runs at the cut (again at the commit: a lookup in the
same turn saw the batches still there); a reset, a deleted partition or a rolled-back
turn drops a partition's runs. Memory: two ints per run, only for partitions asked by
time (100,000 batches: about 400 runs). Kafka keeps a time index per segment on disk.
"""
from __future__ import annotations

import bisect
import struct

import msgpack

from mesh.wire.records import HEADER_SIZE

__all__ = ["TimeIndex", "StillIndexing", "records_at_time", "RUN_BATCHES", "MAX_WALK_BATCHES", "READ_COST"]

RUN_BATCHES = 256
MAX_WALK_BATCHES = 20_000   # header reads one request may make (~60 ms): the loop is not held
READ_COST = 64              # a batch read (and maybe a delta column decoded), in header reads


class StillIndexing(Exception):
    """The answer is not in the part of the partition indexed so far; the next lookup goes
    on from there (the node answers a retriable error: the client asks again)."""
_TS = struct.Struct(">QQ")   # first, max timestamp at byte 24
_COUNT = struct.Struct(">I")  # record count at byte 20


class _Runs:
    __slots__ = ("starts", "maxes", "sizes", "walked")

    def __init__(self) -> None:
        self.starts: list[int] = []   # first base offset of each run
        self.maxes: list[int] = []    # max timestamp of each run's batches
        self.sizes: list[int] = []    # batches in each run (the last one grows)
        self.walked = 0               # offset after the last batch walked


class TimeIndex:
    def __init__(self) -> None:
        self._parts: dict[int, _Runs] = {}
        self._cuts: list[tuple[int, int]] = []   # this turn's truncations (``committed``)

    def find(self, store, pid: int, timestamp_ms: int, log_start: int, limit_offset: int,
             budget: list[int] | None = None) -> tuple[int, int] | None:
        """See the module docstring. ``budget``: [header reads left], shared by the lookups
        of one request (a batch read counts as ``READ_COST``); when it runs out, the lookup
        raises StillIndexing unless what the index holds already answers it."""
        if budget is None:
            budget = [MAX_WALK_BATCHES]
        runs = self._parts.get(pid)
        if runs is None:
            runs = self._parts[pid] = _Runs()
        complete = self._extend(store, pid, runs, max(runs.walked, log_start), limit_offset, budget)
        self._prune(runs, log_start)
        starts, maxes, n = runs.starts, runs.maxes, len(runs.starts)
        for i in range(n):
            if maxes[i] < timestamp_ms:
                continue
            end = min(starts[i + 1] if i + 1 < n else runs.walked, limit_offset)
            for base, _count, mx in store._walk_headers(pid, max(starts[i], log_start), end):
                budget[0] -= 1
                if mx < timestamp_ms:
                    continue
                budget[0] -= READ_COST
                got = store.read(pid, max(base, log_start), 1, limit_offset)
                found = records_at_time(got[0], timestamp_ms, max(base, log_start), limit_offset) if got else None
                if found is not None:
                    return found
            if budget[0] <= 0:
                raise StillIndexing(f"partition {pid}: this request's lookups are done for now")
        if not complete:   # (what is indexed comes first in offset order: an answer there is final)
            raise StillIndexing(f"partition {pid}: indexing timestamps, {runs.walked} of {limit_offset} offsets")
        return None

    @staticmethod
    def _extend(store, pid: int, runs: _Runs, from_offset: int, limit_offset: int, budget: list[int]) -> bool:
        """Index more batches while the budget lasts; whether the index reaches the limit."""
        starts, maxes, sizes = runs.starts, runs.maxes, runs.sizes
        for base, count, mx in store._walk_headers(pid, from_offset, limit_offset):
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            if sizes and sizes[-1] < RUN_BATCHES:
                sizes[-1] += 1
                if mx > maxes[-1]:
                    maxes[-1] = mx
            else:
                starts.append(base)
                maxes.append(mx)
                sizes.append(1)
            runs.walked = base + count
        return True

    @staticmethod
    def _prune(runs: _Runs, log_start: int) -> None:
        """Drop runs wholly below the log start (retention)."""
        k = 0
        while k + 1 < len(runs.starts) and runs.starts[k + 1] <= log_start:
            k += 1
        if k:
            del runs.starts[:k], runs.maxes[:k], runs.sizes[:k]

    def cut(self, pid: int, offset: int) -> None:
        """Batches at or after ``offset`` are being truncated: forget every run reaching it."""
        self._cut(pid, offset)
        self._cuts.append((pid, offset))

    def _cut(self, pid: int, offset: int) -> None:
        runs = self._parts.get(pid)
        if runs is None or runs.walked <= offset:
            return
        # run j holds [starts[j], starts[j + 1]): the one holding the cut goes, and all after it
        k = max(0, bisect.bisect_right(runs.starts, offset) - 1)
        if k < len(runs.starts):
            runs.walked = runs.starts[k]
        del runs.starts[k:], runs.maxes[k:], runs.sizes[k:]
        if not runs.starts:
            runs.walked = 0

    def committed(self) -> None:
        for pid, offset in self._cuts:
            self._cut(pid, offset)
        self._cuts.clear()

    def drop(self, pid: int) -> None:
        self._parts.pop(pid, None)

    def clear(self) -> None:
        self._parts.clear()
        self._cuts.clear()


def records_at_time(batch, timestamp_ms: int, from_offset: int, limit_offset: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of ``batch`` in [from_offset, limit_offset)
    whose timestamp is >= ``timestamp_ms``, or None. A batch with no delta column, or whose
    first timestamp already reaches the target, answers from its header alone."""
    base = struct.unpack_from(">Q", batch, 0)[0]
    n = _COUNT.unpack_from(batch, 20)[0]
    first, mx = _TS.unpack_from(batch, 24)
    lo, hi = max(0, from_offset - base), min(n, limit_offset - base)
    if lo >= hi or mx < timestamp_ms:
        return None
    compacted = batch[17] & 0x02   # (mesh.wire.compacted: offsets with gaps, decoded below)
    if first == mx and not compacted:   # every record has this timestamp (no delta column)
        return base + lo, first
    if lo == 0 and first >= timestamp_ms and not compacted:
        return base, first
    try:
        cols = msgpack.unpackb(memoryview(batch)[HEADER_SIZE:], raw=False)
        deltas = cols[2]
    except Exception:   # an older broker stored it unchecked: no answer from it
        return None
    if len(cols) == 5:   # compacted (mesh.wire.compacted): the kept records at their offsets
        try:
            for od, d in zip(cols[4], deltas or [0] * len(cols[4])):
                if lo <= od < hi and first + d >= timestamp_ms:
                    return base + od, first + d
        except TypeError:
            pass
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
