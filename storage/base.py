"""What every store shares: per-partition offsets, staging, group commit, retention.

A partition is named by an integer id (``pid``, chosen by the cluster), registered once per
(topic, partition) in the ``meta`` database. For each pid the store keeps in memory
``[log_start, log_end, size_bytes]`` (rebuilt from the keys on recovery). Between turns
everything in memory is durable; within a turn ``log_end`` includes what is staged.

Group commit: ``stage_append`` assigns offsets and stages writes in the turn's transaction;
``commit()`` makes the whole turn durable with one sync. If the commit fails (disk full,
I/O error) every staged change is rolled back in memory too, so the store stays exactly as
it was before the turn, and the caller fails the requests of that turn.

Write caching (issue 41, ``docs/decisions/41-durability.md``): a partition in ``cached``
(pid -> its ``flush.ms``) may have its log and producer rows committed without a sync. A
turn's commit syncs unless every write it staged is such a row (or a ``put_soft`` row: a
commit offset, volatile in Raft); ``flush.ms`` after the first commit it did not sync
(``unsynced_due_ms``: the node wakes for it) ``commit(now_ms)`` starts a sync of them all,
with or without writes of its own (the LMDB store off the loop thread: ``storage.flusher``). ``commit()`` without a clock always syncs. Anything
else (Raft term and vote, group offsets, metadata, deletes) makes the turn sync. With no
partition cached, every commit syncs, as before.

Writers that batch their puts per turn (``mesh.node.data.producer_state``) register a callable
in ``pre_commit`` (run at the start of every ``commit``, inside the transaction, so what
they write is committed with it or not at all) and in ``on_rollback`` (run after every
rollback).
"""
from __future__ import annotations

import logging
import struct
import zlib

from mesh.wire.records import HEADER_SIZE, patch_batch
from storage.timestamps import TimeIndex

__all__ = ["StoreBase", "LogError", "StorageFull", "CorruptBatch", "batch_problem", "key_of", "unkey"]

_KEY = struct.Struct(">QQ")
_PID = struct.Struct(">Q")   # the partition id leading a log or producer key
_log = logging.getLogger("storage")


def key_of(pid: int, offset: int) -> bytes:
    return _KEY.pack(pid, offset)


def unkey(key: bytes) -> tuple[int, int]:
    return _KEY.unpack(key)


class LogError(Exception):
    """The store could not do what was asked (I/O error, cannot open)."""


class StorageFull(LogError):
    """No space left for this write; nothing of the turn was stored."""


class CorruptBatch(LogError):
    """A stored batch failed its CRC check, or its header's base offset is not its key's."""

    def __init__(self, message: str, pid: int = -1, offset: int = -1) -> None:
        super().__init__(message)
        self.pid = pid
        self.offset = offset


def batch_problem(base: int, batch) -> str | None:
    """Why the stored ``batch`` under key offset ``base`` cannot be served, or None."""
    if len(batch) < HEADER_SIZE:
        return f"stored batch at offset {base} is {len(batch)} bytes, shorter than a header"
    if zlib.crc32(memoryview(batch)[16:]) != struct.unpack_from(">I", batch, 12)[0]:
        return f"stored batch at offset {base} fails its CRC check"
    header_base = struct.unpack_from(">Q", batch, 0)[0]
    if header_base != base:
        return f"stored batch at offset {base} says it starts at {header_base}"
    return None


class StoreBase:
    """Shared logic. Subclasses provide the raw primitives (``_put_batch`` ...)."""

    def __init__(self) -> None:
        self._parts: dict[int, list[int]] = {}   # pid -> [start, end, size_bytes]
        self._undo: dict[int, list[int]] | None = None
        self._pid_cache: dict[tuple[str, int], int] = {}
        # corrupt batches found (pid -> offsets), each logged and reported once; drained by
        # the node (``take_corrupt``) into ``ReplicaManager.report_corrupt``
        self.corrupt: dict[int, set[int]] = {}
        self._corrupt_new: list[tuple[int, int]] = []
        self.retention_deleted_batches = 0   # staged by retention, running total (node metrics)
        self.pre_commit: list = []    # callables run at the start of every commit (module doc)
        self.post_commit: list = []   # callables run after every commit that succeeded
        self.on_rollback: list = []   # callables run after every rollback
        self.time_index = TimeIndex()   # per partition, max timestamps of runs of batches (in memory)
        # compaction (``storage.compaction``, ``mesh.node.data.compactor``): per pid the cut
        # decided by its leader (``clean:<pid>``) and the one applied here (``cleaned:<pid>``),
        # each ``(clean_end, horizon_ms)``; cached from ``meta``, the cache dropped on rollback
        self._clean_cache: dict[tuple[bytes, int], tuple[int, int]] = {}
        self.compacted_bytes = 0   # bytes removed by rewritten batches, running total (metrics)
        # write caching (module doc)
        self.cached: dict[int, int] = {}   # pid -> flush.ms: its log and producer rows need no sync
        self.unsynced_due_ms: int | None = None   # a commit not synced yet: synced by then
        self.syncs = 0             # commits (or flushes) that synced
        self.unsynced_commits = 0  # commits that did not
        self._must_sync = False    # this turn staged a write that needs a sync
        self._turn_flush_ms: int | None = None   # the smallest flush.ms of this turn's cached rows

    # -- write caching ------------------------------------------------------------------
    def set_cached(self, pid: int, flush_ms: int | None) -> None:
        """``pid``'s rows commit without a sync, synced within ``flush_ms`` (None: synced
        with every commit again; what it left unsynced is synced by the next commit)."""
        if flush_ms is not None:
            self.cached[pid] = max(0, int(flush_ms))
        elif self.cached.pop(pid, None) is not None and self.unsynced_due_ms is not None:
            self.unsynced_due_ms = 0

    def _wrote(self, pid: int) -> None:
        """A log or producer row of ``pid`` was staged."""
        f = self.cached.get(pid)
        if f is None:
            self._must_sync = True
        elif self._turn_flush_ms is None or f < self._turn_flush_ms:
            self._turn_flush_ms = f

    def sync_due(self, now_ms: int) -> bool:
        return self.unsynced_due_ms is not None and now_ms >= self.unsynced_due_ms

    def _wants_sync(self, now_ms: int | None) -> bool:
        return now_ms is None or self._must_sync or not self.cached

    def _flush_behind(self) -> None:
        """Sync every commit made so far, off the loop if the store can (``storage.flusher``)."""
        self.sync_now()

    def _end_turn(self) -> None:
        self._must_sync, self._turn_flush_ms = False, None

    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Stage a row (a producer row of a cached partition needs no sync; any other does)."""
        if db == "producers" and len(key) >= 8:
            self._wrote(_PID.unpack_from(key)[0])
        else:
            self._must_sync = True
        self._put_row(db, key, value)

    def put_soft(self, db: str, key: bytes, value: bytes) -> None:
        """Stage a row whose loss to a power cut is harmless (a Raft commit offset): it
        makes no turn sync."""
        self._put_row(db, key, value)

    def delete(self, db: str, key: bytes) -> None:
        self._must_sync = True
        self._delete_row(db, key)

    # -- partition registry -----------------------------------------------------------
    def partition_id(self, topic: str, partition: int, create: bool = True,
                     pid: int | None = None) -> int | None:
        """The id under which (topic, partition) is stored: ``pid`` if given (the cluster
        assigns ids), else the next free local one. Registered on first use."""
        name = (topic, partition)
        cached = self._pid_cache.get(name)
        if cached is not None:
            return cached
        key = b"pid:" + topic.encode() + b"\x00" + str(partition).encode()
        raw = self.get("meta", key)
        if raw is None:
            if not create:
                return None
            if pid is None:
                raw_next = self.get("meta", b"next_pid")
                pid = int(raw_next) if raw_next else 1
                self.put("meta", b"next_pid", str(pid + 1).encode())
            self.put("meta", key, str(pid).encode())
            self.commit()
        else:
            pid = int(raw)
        self._pid_cache[name] = pid
        return pid

    def register_partitions(self, items: list[tuple[str, int, int]]) -> None:
        """Register (topic key, partition, pid) rows the cluster assigned, staged in the
        turn's transaction without a commit: a topic of 10,000 partitions is one synced
        write (the caller commits). A rollback forgets them (``_pid_cache`` is cleared)."""
        for topic, partition, pid in items:
            name = (topic, partition)
            if self._pid_cache.get(name) == pid:
                continue
            key = b"pid:" + topic.encode() + b"\x00" + str(partition).encode()
            raw = self.get("meta", key)
            if raw is None or int(raw) != pid:
                self.put("meta", key, str(pid).encode())
            self._pid_cache[name] = pid

    def partitions(self) -> list[tuple[str, int, int]]:
        """Every registered (topic key, partition, pid)."""
        out = []
        for k, v in self.items("meta", b"pid:"):
            name, _, part = k[4:].rpartition(b"\x00")
            out.append((name.decode(), int(part), int(v)))
        return out

    def forget_partition(self, topic: str, partition: int) -> None:
        """Delete a partition's batches and its id (topic deletion)."""
        pid = self.partition_id(topic, partition, create=False)
        if pid is None:
            return
        self._save_undo(pid)
        self.time_index.drop(pid)
        for base in self._bases_from(pid, 0):
            self._del_batch(pid, base)
        self.delete("meta", b"pid:" + topic.encode() + b"\x00" + str(partition).encode())
        self._try_delete_meta(b"logstart:%d" % pid)
        self._try_delete_meta(b"clean:%d" % pid)
        self._try_delete_meta(b"cleaned:%d" % pid)
        self._clean_cache.clear()
        for k, _ in self.items("producers", struct.pack(">Q", pid)):
            self.delete("producers", k)
        self._parts.pop(pid, None)
        self._pid_cache.pop((topic, partition), None)

    def _try_delete_meta(self, key: bytes) -> None:
        if self.get("meta", key) is not None:
            self.delete("meta", key)

    # -- offsets ------------------------------------------------------------------------
    def log_start(self, pid: int) -> int:
        st = self._parts.get(pid)
        return st[0] if st else 0

    def log_end(self, pid: int) -> int:
        st = self._parts.get(pid)
        return st[1] if st else 0

    def size_bytes(self, pid: int) -> int:
        st = self._parts.get(pid)
        return st[2] if st else 0

    # -- staging ------------------------------------------------------------------------
    def room_for(self, nbytes: int, sizes=None) -> bool:
        """Would ``nbytes`` more fit in this turn, with room left for its other writes? (A
        write that does not fit fails the whole turn.) The memory twin has no limit."""
        return True

    def _save_undo(self, pid: int) -> None:
        if self._undo is None:
            self._undo = {}
        if pid not in self._undo:
            st = self._parts.get(pid)
            self._undo[pid] = list(st) if st else None

    def stage_append(self, pid: int, batch: bytes, leader_epoch: int,
                     record_count: int) -> tuple[int, int]:
        """Stage a validated batch at the log end; returns (base offset, next offset)."""
        return self.stage_batch(pid, batch, leader_epoch, record_count)[:2]

    def stage_batch(self, pid: int, batch: bytes, leader_epoch: int,
                    record_count: int) -> tuple[int, int, bytes]:
        """``stage_append``, also returning the batch as stored (base offset and epoch set)."""
        undo = self._undo
        if undo is None or pid not in undo:
            self._save_undo(pid)
        st = self._parts.get(pid)
        if st is None:
            self._parts[pid] = st = [0, 0, 0]
        base = st[1]
        stored = patch_batch(batch, base, leader_epoch)
        self._wrote(pid)
        self._put_batch(pid, base, stored)
        st[1] = end = base + record_count
        st[2] += len(stored)
        return base, end, stored

    def stage_replica_append(self, pid: int, batches: bytes, verified: bool = False) -> int:
        """Stage batches that already carry their offsets (a follower's append); returns the
        new end. The batches must start at the current end. ``verified``: the caller already
        checked every batch's CRC, so it is not computed again."""
        from mesh.wire.records import iter_batches
        return self.stage_replica_batches(pid, [(h, bytes(mv)) for h, mv in
                                                iter_batches(batches, verify_crc=not verified)])

    def stage_replica_batches(self, pid: int, batches: list) -> int:
        """``stage_replica_append`` of batches walked and checked already (CRC included):
        ``[(header, batch bytes), ...]`` (``mesh.node.replication.raft_store.check_append_payload``)."""
        undo = self._undo
        if undo is None or pid not in undo:
            self._save_undo(pid)
        st = self._parts.get(pid)
        if st is None:
            st = self._parts[pid] = [0, 0, 0]
        put = self._put_batch
        self._wrote(pid)
        for h, raw in batches:
            base = h.base_offset
            if base != st[1]:
                raise LogError(f"replica append at {base} but log end is {st[1]}")
            put(pid, base, raw)
            st[1] = base + h.record_count
            st[2] += len(raw)
        return st[1]

    def stage_truncate(self, pid: int, offset: int) -> None:
        """Drop batches at or after ``offset`` (a batch boundary): a diverged suffix."""
        self._save_undo(pid)
        self.time_index.cut(pid, offset)
        st = self._parts.setdefault(pid, [0, 0, 0])
        for base in self._bases_from(pid, offset):
            self._del_batch_sized(pid, base, st)
        self._repaired(pid, offset)
        st[1] = min(st[1], offset)
        if st[0] > st[1]:
            st[0] = st[1]

    def stage_reset(self, pid: int, start_offset: int) -> None:
        """Drop every batch; the log now starts and ends at ``start_offset`` (a replica
        that fell behind the leader's log start)."""
        self._save_undo(pid)
        self.time_index.drop(pid)
        for base in self._bases_from(pid, 0):
            self._del_batch(pid, base)
        self._parts[pid] = [start_offset, start_offset, 0]
        self._repaired(pid, 0)
        self.put("meta", b"logstart:%d" % pid, str(start_offset).encode())
        self._try_delete_meta(b"cleaned:%d" % pid)   # what the leader sends next is compacted as it holds it
        self._clean_cache.pop((b"cleaned", pid), None)
        self._clean_cache.pop((b"bytes", pid), None)

    def _del_batch_sized(self, pid: int, base: int, st: list[int]) -> None:
        raw = self._get_batch(pid, base)
        if raw is not None:
            st[2] -= len(raw)
        self._del_batch(pid, base)

    def commit(self, now_ms: int | None = None) -> None:
        """Make the turn durable with one sync (or, when write caching allows it, commit it
        without one: module doc), or roll everything back and raise."""
        try:
            for fn in self.pre_commit:
                fn()
            wrote = self.has_writes()
            sync = self._wants_sync(now_ms)
            synced = self._commit_txn(sync)
        except Exception:
            self.rollback()
            raise
        flush_ms = self._turn_flush_ms
        self._end_turn()
        if synced:
            self.syncs += 1
            self.unsynced_due_ms = None
        elif wrote and not sync:
            self.unsynced_commits += 1
            due = now_ms + (flush_ms if flush_ms is not None else 1000)   # (soft rows only: within a second)
            if self.unsynced_due_ms is None or due < self.unsynced_due_ms:
                self.unsynced_due_ms = due
        if self.unsynced_due_ms is not None and now_ms is not None and now_ms >= self.unsynced_due_ms:
            self.syncs += 1
            self.unsynced_due_ms = None
            self._flush_behind()   # flush.ms since the first unsynced commit: a sync starts now
        self._undo = None
        self.time_index.committed()   # cuts of this turn again: a lookup meanwhile saw the old batches
        for fn in self.post_commit:   # (any commit: one made in the middle of a turn too)
            fn()

    def rollback(self) -> None:
        self._end_turn()
        self._abort_txn()
        self.time_index.clear()   # (rebuilt when asked: cheaper than knowing what a turn undid)
        if self._undo:
            for pid, st in self._undo.items():
                if st is None:
                    self._parts.pop(pid, None)
                else:
                    self._parts[pid] = st
        self._undo = None
        self._pid_cache.clear()
        self._clean_cache.clear()
        for fn in self.on_rollback:
            fn()

    # -- reads --------------------------------------------------------------------------
    def read(self, pid: int, offset: int, max_bytes: int, limit_offset: int) -> list[bytes]:
        """Committed batches holding offsets in [offset, limit_offset), at least one batch
        if any, up to about max_bytes. Each batch's CRC and header base offset (against its
        key) are checked, and the batches must follow each other with no gap (the first one
        holding ``offset``, unless it is below the log start) and with epochs that never go
        down: a flipped bit in a batch or in a key is found, not served (O(1) per batch).
        The batches before a bad one are returned; a bad first batch raises
        ``CorruptBatch`` (and is recorded once, see ``note_corrupt``)."""
        out: list[bytes] = []
        expect = -1            # where the next batch must start (-1: the first batch)
        prev_epoch = prev_base = -1
        for base, c in self._read_raw(pid, offset, max_bytes, limit_offset):
            why = batch_problem(base, c)
            at = base
            if why is None:
                epoch = struct.unpack_from(">I", c, 8)[0]
                if expect < 0:
                    if base > offset >= self.log_start(pid):
                        why = f"offset {offset} is missing: the next stored batch starts at {base}"
                        at = self._gap_start(pid, offset)
                elif base != expect:
                    why, at = f"stored batch at offset {base} follows a batch ending at {expect}", expect
                elif epoch < prev_epoch:   # one of the two is damaged: cut before both
                    why, at = (f"stored batches at offsets {prev_base} and {base} have epochs "
                               f"{prev_epoch} then {epoch}"), prev_base
                    out.pop()
            if why is not None:
                self.note_corrupt(pid, at, why)
                if out:
                    return out
                raise CorruptBatch(f"partition {pid}: {why}", pid, at)
            out.append(c)
            expect = base + struct.unpack_from(">I", c, 20)[0]
            prev_epoch, prev_base = epoch, base
        if not out and self.log_start(pid) <= offset < min(limit_offset, self._committed_end(pid)):
            why = f"offset {offset} is missing: no stored batch holds it (log end {self._committed_end(pid)})"
            at = self._gap_start(pid, offset)
            self.note_corrupt(pid, at, why)
            raise CorruptBatch(f"partition {pid}: {why}", pid, at)
        return out

    def offset_for_time(self, pid: int, timestamp_ms: int, limit_offset: int,
                        budget: list[int] | None = None) -> tuple[int, int] | None:
        """(offset, timestamp) of the first committed record of ``pid`` below ``limit_offset``
        (the high watermark) whose timestamp is >= ``timestamp_ms``, or None (Kafka's
        ListOffsets by timestamp): see ``storage.timestamps.TimeIndex`` (``budget``, and
        ``StillIndexing`` when it runs out). Raises ``CorruptBatch`` as ``read`` does."""
        return self.time_index.find(self, pid, timestamp_ms, self.log_start(pid), limit_offset, budget)

    def _gap_start(self, pid: int, offset: int) -> int:
        """Where the committed batches stop holding every offset before the missing
        ``offset``: the end of the last batch below it (a batch boundary, so a repair that
        cuts there refills cleanly), else the log start. Only on damage: one seek."""
        before = self._batch_before(pid, offset)
        if before is None:
            return self.log_start(pid)
        base, count = before
        return base + count if base + count <= offset else base

    def _committed_end(self, pid: int) -> int:
        """The log end as of the last commit (reads see only committed batches)."""
        if self._undo is not None and pid in self._undo:
            st = self._undo[pid]
            return st[1] if st else 0
        return self.log_end(pid)

    def note_corrupt(self, pid: int, offset: int, why: str) -> None:
        """Record a corrupt batch; logged and queued for the replication core once per
        (pid, offset) until a truncation or reset below it repairs it."""
        seen = self.corrupt.setdefault(pid, set())
        if offset in seen:
            return
        seen.add(offset)
        self._corrupt_new.append((pid, offset))
        _log.error("partition %d: %s: not served; the replica will be repaired from its peers", pid, why)

    def take_corrupt(self) -> list[tuple[int, int]]:
        """(pid, offset) of corrupt batches found since the last call."""
        out, self._corrupt_new = self._corrupt_new, []
        return out

    def _repaired(self, pid: int, cut: int) -> None:
        seen = self.corrupt.get(pid)
        if seen:
            seen.difference_update([o for o in seen if o >= cut])
            if not seen:
                del self.corrupt[pid]

    # -- compaction ---------------------------------------------------------------------
    def _cut_of(self, kind: bytes, pid: int) -> tuple[int, int]:
        key = (kind, pid)
        got = self._clean_cache.get(key)
        if got is None:
            raw = self.get("meta", kind + b":%d" % pid)
            got = (0, 0)
            if raw:
                try:
                    end, horizon, *rest = raw.split(b" ")
                    got = (int(end), int(horizon))
                    if rest:   # (cleaned: the bytes below the cut once applied)
                        self._clean_cache[(b"bytes", pid)] = (int(rest[0]), 0)
                except ValueError:
                    _log.error("partition %d: unreadable %s mark %r: taken as none", pid, kind.decode(), raw[:40])
            self._clean_cache[key] = got
        return got

    def clean_target(self, pid: int) -> tuple[int, int]:
        """``(clean_end, horizon_ms)`` of the latest cut its leader decided ((0, 0): none)."""
        return self._cut_of(b"clean", pid)

    def clean_applied(self, pid: int) -> tuple[int, int]:
        """``(clean_end, horizon_ms)`` of the latest cut applied to this replica's log."""
        return self._cut_of(b"cleaned", pid)

    def stage_clean_target(self, pid: int, clean_end: int, horizon_ms: int) -> None:
        self.put("meta", b"clean:%d" % pid, b"%d %d" % (clean_end, horizon_ms))
        self._clean_cache[(b"clean", pid)] = (clean_end, horizon_ms)

    def stage_clean_applied(self, pid: int, clean_end: int, horizon_ms: int, clean_bytes: int = 0) -> None:
        self.put("meta", b"cleaned:%d" % pid, b"%d %d %d" % (clean_end, horizon_ms, clean_bytes))
        self._clean_cache[(b"cleaned", pid)] = (clean_end, horizon_ms)
        self._clean_cache[(b"bytes", pid)] = (clean_bytes, 0)

    def clean_bytes(self, pid: int) -> int | None:
        """Bytes below the applied cut once it was applied (None: not known)."""
        self.clean_applied(pid)
        got = self._clean_cache.get((b"bytes", pid))
        return None if got is None else got[0]

    def stage_rewrite(self, pid: int, base: int, old_size: int, batch: bytes) -> None:
        """Replace the committed batch at ``base`` (``old_size`` bytes) by ``batch``, its
        compacted form: same base offset and span (``mesh.wire.compacted``)."""
        self._save_undo(pid)
        self._put_batch(pid, base, batch)
        st = self._parts[pid]
        st[2] += len(batch) - old_size
        self.compacted_bytes += old_size - len(batch)
        self.time_index.drop(pid)

    # -- retention ----------------------------------------------------------------------
    def stage_cut_head(self, pid: int, offset: int, max_batches: int = 1000) -> int:
        """Delete the whole batches from the head that end at or before ``offset`` (never
        the last batch): a follower following its leader's log start. Returns the new log
        start."""
        st = self._parts.get(pid)
        if st is None or st[2] == 0 or offset <= st[0]:
            return self.log_start(pid)
        return self.stage_retention(pid, 0, None, None, keep_from=offset, max_batches=max_batches, cut_all=True)

    def stage_retention(self, pid: int, now_ms: int, retention_ms: int | None,
                        retention_bytes: int | None, keep_from: int | None = None,
                        max_batches: int = 1000, cut_all: bool = False) -> int:
        """Delete whole batches from the head that are older than retention_ms or beyond
        retention_bytes (``cut_all``: every one); never the last batch, never at or beyond
        ``keep_from``. Returns the new log start."""
        st = self._parts.get(pid)
        if st is None or st[2] == 0:
            return self.log_start(pid)
        self._save_undo(pid)
        new_start = st[0]
        doomed = []
        for base, v in self._head_batches(pid, max_batches):  # stops at the first batch kept
            count = struct.unpack_from(">I", v, 20)[0]
            max_ts = struct.unpack_from(">Q", v, 32)[0]
            end = base + count
            if end >= st[1] or (keep_from is not None and end > keep_from):
                break
            too_old = retention_ms is not None and retention_ms >= 0 and max_ts < now_ms - retention_ms
            too_big = (retention_bytes is not None and retention_bytes >= 0
                       and st[2] - sum(n for _, n in doomed) > retention_bytes)
            if not (too_old or too_big or cut_all):
                break
            doomed.append((base, len(v)))
            new_start = end
        self.retention_deleted_batches += len(doomed)
        for base, n in doomed:
            self._del_batch(pid, base)
            st[2] -= n
        if new_start != st[0]:
            st[0] = new_start
            self.put("meta", b"logstart:%d" % pid, str(new_start).encode())
        return st[0]
