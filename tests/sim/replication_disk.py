"""One simulated broker's disk: the real in-memory store, real record batches, and an index.

The replication simulator stores every partition log in ``storage.memory.MemoryStore`` (the
in-memory twin of the LMDB store: staging, group commit, crash = lose what was staged) in
the real record-batch format (``mesh.wire.records``), applying the core's log effects as
the node's raft host does: ``Append`` -> ``stage_replica_append``, ``Truncate`` ->
``stage_truncate``, ``ResetLog`` -> ``stage_reset``, ``PersistState`` -> a row of the
``repl`` database, retention -> ``stage_retention``; ``sync()`` is the turn's ``commit()``. With ``reads_staged`` False the
core reads through the node's own ``StoreReader`` (committed batches only).

Beside the store it keeps, per partition, the checkers' index of the same log (``live``
and ``durable`` ``PartLog``: whole batches as (base, end, epoch, raw)), updated with every
effect, and compares both after every sync and every crash: offsets, log start and the
persisted state must agree, so the twin checks the store as much as the store serves it.

Disk faults (issue 17), applied while the broker is down: ``wipe`` (an empty store with a
new store id), ``rollback`` (the store as it was at an earlier sync: log and persisted
state, same store id; ``snapshot`` takes one); corrupt batches need nothing here: the sim
shell reports the damaged offset to the core at start (``report_corrupt``), as the store's
recovery check would, and the core cuts the log there.
"""
from __future__ import annotations

from mesh.node.replication.raft_host import StoreReader, pack_state, unpack_state
from mesh.raft import PersistState
from mesh.wire.records import encode_batch, iter_batches, patch_batch
from storage.memory import MemoryStore
from tests.sim.replication_store import PartLog, SimFailure

__all__ = ["SimDisk", "batches_of"]


def batches_of(payload: bytes) -> list[tuple[int, int, int, bytes]]:
    """(base, end, epoch, raw) for each record batch in a payload (CRCs checked)."""
    return [(h.base_offset, h.next_offset, h.leader_epoch, bytes(mv)) for h, mv in iter_batches(payload)]


def _state_key(pid: int) -> bytes:
    return pid.to_bytes(8, "big")


class SimDisk:
    """A ``MemoryStore`` plus the checkers' index of it; also the core's ``LogReader``."""

    def __init__(self, pids: list[int], reads_staged: bool = True, store_id: str = "") -> None:
        self.pids = pids
        self.store_id = store_id
        self.reads_staged = reads_staged  # False: like an LMDB reader outside the write txn
        self.mem = MemoryStore()
        self.durable = {pid: PartLog() for pid in pids}
        self.durable_state: dict[int, PersistState | None] = {pid: None for pid in pids}
        self.live = {pid: PartLog() for pid in pids}
        self.live_state: dict[int, PersistState | None] = dict(self.durable_state)
        self.dirty: set[int] = set()

    # -- the core's LogReader -----------------------------------------------------------
    def read(self, pid: int, from_offset: int, to_offset: int, max_bytes: int) -> tuple[bytes, int]:
        if self.reads_staged:
            return self.live[pid].read(from_offset, to_offset, max_bytes)
        return StoreReader(self.mem).read(pid, from_offset, to_offset, max_bytes)

    def start_offset(self, pid: int) -> int:
        return self.mem.log_start(pid)

    def clean_cut(self, pid: int) -> tuple[int, int]:
        return self.mem.clean_target(pid)

    # -- staging (one turn) -----------------------------------------------------------------
    def stage_produce(self, pid: int, values: list[bytes], epoch: int, now_ms: int) -> tuple[int, int, bytes]:
        """A leader's append of a client batch: (base, end, stored bytes)."""
        batch = encode_batch(values, timestamps_ms=now_ms)
        base, end = self.mem.stage_append(pid, batch, epoch, len(values))
        raw = patch_batch(batch, base, epoch)
        self.live[pid].append([(base, end, epoch, raw)])
        self.dirty.add(pid)
        return base, end, raw

    def stage_append(self, pid: int, payload: bytes, batches: list) -> None:
        """A follower's append (``batches`` = ``batches_of(payload)``, checked by the caller)."""
        end = self.mem.stage_replica_append(pid, payload)
        self.live[pid].append(batches)
        self.dirty.add(pid)
        if end != self.live[pid].end:
            raise SimFailure(f"p{pid}: store end {end} after an append, index end {self.live[pid].end}")

    def stage_truncate(self, pid: int, to_offset: int) -> None:
        self.mem.stage_truncate(pid, to_offset)
        self.live[pid].truncate(to_offset)
        self.dirty.add(pid)

    def stage_reset(self, pid: int, start_offset: int) -> None:
        self.mem.stage_reset(pid, start_offset)
        self.live[pid].reset(start_offset)
        self.dirty.add(pid)

    def stage_state(self, st: PersistState) -> None:
        self.mem.put("repl", _state_key(st.pid), pack_state(st))
        self.live_state[st.pid] = st
        self.dirty.add(st.pid)

    def host(self, pid: int) -> None:
        """A replica of ``pid`` starts here (a learner joining): an empty log."""
        if pid not in self.live:
            self.pids.append(pid)
            self.durable[pid], self.live[pid] = PartLog(), PartLog()
            self.durable_state[pid] = self.live_state[pid] = None

    def drop(self, pid: int) -> None:
        """The replica of ``pid`` left (removed from its config): its data goes, staged."""
        self.mem.stage_reset(pid, 0)
        self.mem.delete("repl", _state_key(pid))
        self.live[pid] = PartLog()
        self.live_state[pid] = None
        self.dirty.add(pid)

    # -- group commit, crash, retention ------------------------------------------------------
    def sync(self) -> None:
        """The turn's one commit: everything staged becomes durable."""
        self.mem.commit()
        for pid in sorted(self.dirty):
            self.durable[pid] = self.live[pid].copy()
            self.durable_state[pid] = self.live_state[pid]
            self._agree(pid)
        self.dirty.clear()

    def crash(self) -> None:
        """Lose what was staged: the store is what ``MemoryStore.crash`` recovers."""
        self.mem = self.mem.crash()
        for pid in sorted(self.dirty):
            self.live[pid] = self.durable[pid].copy()
            self.live_state[pid] = self.durable_state[pid]
        self.dirty.clear()
        for pid in self.pids:
            self._agree(pid)
            if self._stored_state(pid) != self.durable_state[pid]:
                raise SimFailure(f"p{pid}: recovered state {self._stored_state(pid)}, "
                                 f"committed {self.durable_state[pid]}")

    def retain_from(self, pid: int, new_start: int) -> None:
        """Retention, staged like the node's housekeeping: delete the batches below
        ``new_start``; durable with the next sync."""
        got = self.mem.stage_retention(pid, 0, None, 0, keep_from=new_start)
        self.live[pid].trim_head(new_start)
        self.dirty.add(pid)
        if got != new_start:
            raise SimFailure(f"p{pid}: retention to {new_start} left the log starting at {got}")
        self._agree(pid)

    def stage_cut_head(self, pid: int, offset: int) -> int:
        """A follower follows its leader's log start (``CutHead``), up to the commit on disk."""
        saved = self.durable_state.get(pid)
        limit = min(offset, saved.commit if saved is not None else 0)
        got = self.mem.stage_cut_head(pid, limit)
        if got > self.live[pid].start:
            self.live[pid].trim_head(got)
            self.dirty.add(pid)
            self._agree(pid)
        return got

    # -- disk faults (the broker is down: nothing is staged) ---------------------------------
    def snapshot(self) -> tuple:
        """What the disk holds now (durable), to roll back to later."""
        assert not self.dirty
        return ({db: dict(kv) for db, kv in self.mem._durable.items()},
                {pid: log.copy() for pid, log in self.durable.items()}, dict(self.durable_state))

    def rollback(self, snap: tuple) -> None:
        """The disk as it was at ``snap`` (a restored copy of the data directory)."""
        durable, logs, states = snap
        old = MemoryStore()
        old._durable = {db: dict(kv) for db, kv in durable.items()}
        self._replace(old.crash(), logs, states)

    def wipe(self, store_id: str) -> None:
        """An empty data directory: a new store with a new id."""
        self.store_id = store_id
        self._replace(MemoryStore(), {pid: PartLog() for pid in self.pids}, {pid: None for pid in self.pids})

    def _replace(self, mem: MemoryStore, logs: dict, states: dict) -> None:
        self.mem = mem
        self.durable = {pid: log.copy() for pid, log in logs.items()}
        self.live = {pid: log.copy() for pid, log in logs.items()}
        self.durable_state = dict(states)
        self.live_state = dict(states)
        self.dirty.clear()
        for pid in self.pids:
            self._agree(pid)
            if self._stored_state(pid) != self.durable_state[pid]:
                raise SimFailure(f"p{pid}: restored state {self._stored_state(pid)}, expected {self.durable_state[pid]}")

    def _stored_state(self, pid: int) -> PersistState | None:
        raw = self.mem.get("repl", _state_key(pid))
        if raw is None:
            return None
        return unpack_state(pid, raw)

    def _agree(self, pid: int) -> None:
        log, mem = self.live[pid], self.mem
        if (mem.log_start(pid), mem.log_end(pid)) != (log.start, log.end):
            raise SimFailure(f"p{pid}: the store holds {mem.log_start(pid)}..{mem.log_end(pid)}, "
                             f"the index {log.start}..{log.end}")
