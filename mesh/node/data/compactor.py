"""Compaction of the partitions of ``cleanup.policy=compact`` topics a broker hosts.

Theory of operation (the rule itself: ``storage.compaction``; why: docs/decisions/40-compaction.md).

- **The leader decides a cut** (``plan``, every ``compaction_check_ms``): for each partition
  it leads, ``clean_end`` = the lowest of its commit offset on disk and every follower's
  match offset (every replica then holds the records the cut covers, as the leader sent
  them), lowered to the first batch younger than ``min.compaction.lag.ms``; ``horizon_ms``
  = its clock minus ``delete.retention.ms``, and only while its clock agrees with its
  peers' (else the horizon stays where it was: superseded records are still dropped,
  tombstones are not). A cut is taken when the dirty share of the partition's bytes
  reaches ``min.cleanable.dirty.ratio``, when its oldest dirty record passed
  ``max.compaction.lag.ms``, or when a kept tombstone is past the horizon. The cut is
  stored (``clean:<pid>`` in ``meta``) and rides on every append and heartbeat row of the
  partition (``clean_end``, ``clean_horizon``), as the log start does; both only grow.
- **Every replica applies the cut it knows** (``step``, each turn), the leader too, to its
  own committed records below ``clean_end`` (never above its commit on disk), a slice at
  a time within ``compaction_bytes_per_s`` and at most ``_SLICE_BYTES`` a turn: a scan of
  the keys, then a rewrite of the batches in offset order, each rewritten batch staged in
  the turn's write transaction. A crash or a failed commit in the middle leaves a prefix
  rewritten; the job starts again and ends with the same records (the rule on a prefix
  already applied gives the same result). Then ``cleaned:<pid>`` records the cut applied.

Replicas serve the same records: the same deterministic rule applied to the same
committed records gives the same result, and the leader never cuts above what a follower
holds. Batch boundaries are never moved, so log matching, the read checks and retention
see the log as before.

Keyless records on a compacted topic are refused at produce (``refuse_keyless``:
INVALID_RECORD, as Kafka).
"""
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Callable

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.record_check import decode_columns
from mesh.wire.records import HEADER_SIZE, parse_header
from mesh.wire.topic_config import compacted, topic_setting
from storage.base import CorruptBatch, LogError
from storage.compaction import rewrite_batch_stats, scan_batch
from storage.timestamps import StillIndexing

__all__ = ["Compactor", "refuse_keyless"]

log = logging.getLogger("mesh.node.compactor")
_SLICE_BYTES = 256 << 10    # read per turn at most (bounds the loop's time: ~5 ms at ~55 MB/s)
_READ_BYTES = 64 << 10      # per store read


def refuse_keyless(payload) -> None:
    """INVALID_RECORD unless every record of the (validated) batch has a key."""
    keys = decode_columns(memoryview(payload)[HEADER_SIZE:])[1]
    if keys is None or None in keys:
        raise MeshError(ErrorCode.INVALID_RECORD,
                        "a compacted topic (cleanup.policy=compact) takes keyed records only: a record has no key")


@dataclass
class _Job:
    pid: int
    clean_end: int
    horizon_ms: int
    phase: str = "scan"     # scan, then rewrite
    cursor: int = -1
    newest: dict = field(default_factory=dict)
    clean_bytes: int = 0
    tomb_min_ms: int | None = None
    started_ms: int = 0
    read_bytes: int = 0


class Compactor:
    def __init__(self, store, catalog, replicas, bytes_per_s: int = 8 << 20,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.store, self.catalog, self.replicas = store, catalog, replicas
        self.bytes_per_s = max(1, bytes_per_s)
        self._now = now_ms
        self._tokens = 0.0
        self._last_ms: int | None = None
        self._jobs: dict[int, _Job] = {}
        self._clean_bytes: dict[int, int] = {}   # pid -> bytes below the applied cut after it
        self._tomb_min: dict[int, int] = {}      # pid -> oldest kept tombstone below the cut
        self.cleaned_bytes = 0                   # bytes removed, running total (metrics)
        self.read_bytes = 0                      # bytes scanned or rewritten (throughput)
        self.cuts_decided = 0
        self.jobs_done = 0
        self.job_stats: dict[int, list[int]] = {}   # pid -> [jobs done, bytes read, ms from start to end]
        store.on_rollback.append(self._jobs.clear)   # a rewrite rolled back: start again

    # -- what the partitions of compacted topics are ------------------------------------
    def _compacted_pids(self):
        for t in self.catalog.topics.values():
            if compacted(t.config):
                for p, pid in enumerate(t.pids):
                    if pid is not None and self.replicas.hosts(pid):
                        yield t, p, pid

    def hosted_compacted(self) -> list:
        """``(topic, partition, pid)`` of every hosted partition of a compacted topic."""
        return list(self._compacted_pids())

    def dirty_ratio(self, pid: int) -> float:
        size = self.store.size_bytes(pid)
        if size <= 0:
            return 0.0
        clean = self._clean_bytes.get(pid)
        if clean is None:   # since a restart: as the applied mark recorded it
            clean = self.store.clean_bytes(pid) or 0
        return max(0.0, min(1.0, (size - clean) / size))

    def lag(self, pid: int) -> int:
        """Offsets between the cut this replica knows and the one it applied."""
        return max(0, self.store.clean_target(pid)[0] - self.store.clean_applied(pid)[0])

    # -- the leader's decision -----------------------------------------------------------
    def plan(self, now_ms: int, clock_trusted: bool) -> None:
        replicas = self.replicas
        for t, _p, pid in self._compacted_pids():
            try:
                if replicas.is_leader(pid) and pid not in self._jobs:
                    self._plan_one(t.config, pid, now_ms, clock_trusted)
            except (LogError, StillIndexing) as exc:
                log.debug("partition %d: no compaction cut this time: %s", pid, exc)

    def _plan_one(self, c: dict, pid: int, now_ms: int, trusted: bool) -> None:
        store, replicas = self.store, self.replicas
        te, th = store.clean_target(pid)
        if store.clean_applied(pid) != (te, th) and te:
            return   # our own copy has not applied the last cut yet
        end = min([replicas.persisted_commit(pid), *replicas.followers(pid).values()])
        lag_ms = topic_setting(c, "min.compaction.lag.ms")
        if lag_ms > 0:
            if not trusted:
                return
            found = store.offset_for_time(pid, now_ms - lag_ms, end)
            if found is not None:
                first = store.read(pid, found[0], 1, end)
                if first:
                    end = min(end, parse_header(first[0]).base_offset)
        horizon = max(th, now_ms - topic_setting(c, "delete.retention.ms")) if trusted else th
        due = False
        if end > te and end > store.log_start(pid):
            if self.dirty_ratio(pid) * 1000 >= topic_setting(c, "min.cleanable.dirty.ratio"):
                due = True
            max_lag = topic_setting(c, "max.compaction.lag.ms")
            if not due and max_lag >= 0 and trusted:
                first = store.read(pid, max(te, store.log_start(pid)), 1, end)
                due = bool(first) and struct.unpack_from(">Q", first[0], 24)[0] < now_ms - max_lag
        tomb = self._tomb_min.get(pid)
        if not due and tomb is not None and tomb < horizon and te:
            due, end = True, max(end, te)
        if not due:
            return
        end = max(end, te)
        store.stage_clean_target(pid, end, horizon)
        self.cuts_decided += 1
        replicas.log_start_moved(pid)   # tick again: the rows carry the new cut
        log.debug("partition %d: compaction cut to %d, tombstones before %d", pid, end, horizon)

    def next_in_ms(self) -> int | None:
        """While a job runs: how soon the budget allows the next slice (the loop's wait)."""
        if not self._jobs:
            return None
        want = min(_SLICE_BYTES, self.bytes_per_s) / 4
        return max(1, int((want - self._tokens) * 1000 / self.bytes_per_s)) if self._tokens < want else 1

    # -- every replica: apply the cut it knows ---------------------------------------------
    def step(self, now_ms: int) -> None:
        """Run compaction jobs within the byte budget (one turn's slice)."""
        if self._last_ms is None:
            self._last_ms = now_ms
        # the bucket holds a tenth of a second of budget (one slice at least): the work is
        # spread evenly instead of in bursts after an idle time
        cap = max(float(_SLICE_BYTES), self.bytes_per_s / 10)
        self._tokens = min(cap, self._tokens + (now_ms - self._last_ms) * self.bytes_per_s / 1000)
        self._last_ms = now_ms
        if self._tokens <= 0:
            return
        if not self._jobs:
            self._start_jobs()
        budget = min(self._tokens, _SLICE_BYTES)
        for pid in sorted(self._jobs):
            if budget <= 0:
                break
            used = self._run(self._jobs[pid], int(budget))
            budget -= used
            self._tokens -= used

    def _start_jobs(self) -> None:
        store = self.store
        for _t, _p, pid in self._compacted_pids():
            target = store.clean_target(pid)
            if not target[0] or store.clean_applied(pid) == target:
                continue
            if self.replicas.persisted_commit(pid) < target[0] or store.log_end(pid) < target[0]:
                continue   # not all committed here yet: the next turns
            self._jobs[pid] = _Job(pid, *target, started_ms=self._last_ms or 0)

    def _run(self, job: _Job, budget: int) -> int:
        store, pid = self.store, job.pid
        if not self.replicas.hosts(pid) or store.log_end(pid) < job.clean_end \
                or store.clean_target(pid) != (job.clean_end, job.horizon_ms):
            del self._jobs[pid]   # dropped, truncated or reset, or a newer cut: start again
            return 0
        used = 0
        start = store.log_start(pid)
        if job.cursor < start:
            job.cursor = start
        while used < budget:
            if job.cursor >= job.clean_end:
                if job.phase == "scan":
                    job.phase, job.cursor = "rewrite", start
                    continue
                self._finish(job)
                break
            try:
                batches = store.read(pid, job.cursor, min(_READ_BYTES, budget - used), job.clean_end)
            except CorruptBatch:
                del self._jobs[pid]   # reported by the store; repaired from the peers, then again
                return used
            if not batches:
                job.cursor = job.clean_end
                continue
            for b in batches:
                h = parse_header(b)
                if h.base_offset + h.record_count > job.clean_end:
                    job.cursor = job.clean_end
                    break
                if job.phase == "scan":
                    scan_batch(b, job.newest)
                else:
                    nb, tomb = rewrite_batch_stats(b, job.newest, job.horizon_ms)
                    if nb is not None:
                        store.stage_rewrite(pid, h.base_offset, len(b), nb)
                        self.cleaned_bytes += len(b) - len(nb)
                    job.clean_bytes += len(b if nb is None else nb)
                    if tomb is not None and (job.tomb_min_ms is None or tomb < job.tomb_min_ms):
                        job.tomb_min_ms = tomb
                used += len(b)
                job.cursor = h.base_offset + h.record_count
        self.read_bytes += used
        job.read_bytes += used
        return used

    def _finish(self, job: _Job) -> None:
        store, pid = self.store, job.pid
        store.stage_clean_applied(pid, job.clean_end, job.horizon_ms, job.clean_bytes)
        self._clean_bytes[pid] = job.clean_bytes
        if job.tomb_min_ms is None:
            self._tomb_min.pop(pid, None)
        else:
            self._tomb_min[pid] = job.tomb_min_ms
        self.jobs_done += 1
        st = self.job_stats.setdefault(pid, [0, 0, 0])
        st[0] += 1
        st[1] += job.read_bytes
        st[2] += max(0, (self._last_ms or 0) - job.started_ms)
        del self._jobs[pid]
        log.debug("partition %d: compacted below %d", pid, job.clean_end)
