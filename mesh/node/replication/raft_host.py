"""The shell side of partition replication: runs ``mesh.raft.manager.ReplicaManager`` inside
the node loop, following its shell contract (see that module's docstring).

Per loop turn:
- every ``Ready`` the core returns is applied at once to the turn's write transaction
  (log appends/truncations/resets, producer-state updates, the persisted Raft state), and
  its messages, commit advances and leadership changes are *held*;
- right after the drain (``send_early_appends``, when it staged leader appends) and again
  right before the turn's sync (``before_commit``): ``flush()``, and the leader's appends
  leave at once (``early_appends``, on by default): followers store and sync the batches
  while the leader syncs its own copy. The reader serves the batches staged this turn as
  leader from memory (``StoreReader.tail``). Only ``ReplAppend`` messages leave early,
  and only if no partition they name wrote its term, vote or epoch cache this turn (a
  new leader's term is durable before it speaks in it); everything else (votes and their
  answers, append and heartbeat answers, heartbeats) stays held. Safe because the leader
  counts its own copy toward commit only after ``synced()`` (a commit still needs a
  synced quorum, which may be the followers alone), and an append claims nothing durable
  of the leader: if its sync fails the core is rebuilt from disk as a follower, exactly
  as after a crash, and the followers' extra entries are of its old term (Raft's log
  matching repairs them). Then the acks=all waiters that the turn's commit advances
  already cover are answered (``answer_committed``; the node also calls it right after
  the drain, ``early_acks``): a commit advance is made of durable matches only, so it
  does not wait for this turn's sync;
- after the turn's single sync (``after_commit(True)``): ``synced()`` for the partitions
  this node appended to as leader, ``flush()`` to stream new data to followers, then the
  held messages go out, acks=all produce requests whose batch is now committed are
  answered, and leadership changes are published;
- if the turn's commit failed (``after_commit(False)``), nothing held is sent and the core
  is rebuilt from storage: it had run ahead of the disk.

Membership (``mesh.raft.configuring``): ``add`` takes a replica list (the initial config)
or a ``Config``; the persisted state's config history wins over it (a state written before
membership changes existed has none: the initial config). ``propose_config`` applies its
Ready like any other call. Config changes the core reports (``Ready.configs``) are held
like messages: ``take_config_changes`` returns them only once the turn's sync made the
history that holds them durable (the node then writes the leader's to gossip).

acks=all waiters (``mesh.node.data.ack_waiters``) are answered when the commit offset passes
their batch's end, failed with NOT_LEADER or TIMEOUT otherwise.

Input checks (defense in depth, before the core sees a message): the core checks rows
(``mesh.raft.messages``: bounds; ``mesh.raft.partition`` rule 8: against its state) but
never reads the opaque batches, so an append's payload is checked here, where the store
would otherwise fail half-way through a turn the core already advanced: each row's bytes
must be whole batches (CRC included) running exactly from its ``prev_offset`` to its
``end_offset``, all of the row's ``batch_epoch``. A message that fails is dropped whole
(``MeshError``: the dispatcher logs it once per peer); rows the core refused are logged
once per peer and reason (``ReplicaManager.take_refusals``), and counted there.
"""
from __future__ import annotations

import logging
import random
import re
from typing import Callable

from mesh.wire.effects import Send
from mesh.wire.errors import ErrorCode
from mesh.wire.records import iter_batches, patch_batch
from mesh.raft import (
    PEER_MESSAGES, Append, CleanTo, CutHead, PersistState, Ready, ReplAppend, ReplicaManager, ReplicationConfig, ResetLog,
    Truncate,
)
from mesh.raft.log import NO_READY
from mesh.raft.manager import NOT_HOSTED
from mesh.raft.membership import Config
from mesh.raft.messages import parse_rows
from mesh.raft.outbox import split_payload
from mesh.clock import now_ms as _monotonic_ms
from mesh.node.data.ack_waiters import AckWaiter, AckWaiters
from mesh.node.data.producer_state import ProducerStates
from mesh.node.replication.raft_store import StateRows, StoreReader, check_append_payload, pack_state, unpack_state
from storage.base import LogError, StoreBase

__all__ = ["ReplicaHost", "StoreReader", "REPLICATION_MESSAGES", "pack_state", "unpack_state",
           "check_append_payload"]

log = logging.getLogger("mesh.node.replication.raft_host")
_DROPPED = b"dropped:%d"   # meta: this pid's replica was dropped here (its raft state with it)


REPLICATION_MESSAGES: tuple[type, ...] = PEER_MESSAGES  # what the node loop routes to ``step``


TICK_DEBT = 2   # ticks a slow turn may still owe (tick_due)
# acks=all requests waiting for one partition's commit; beyond, answered TIMEOUT at once (the
# write may be made all the same: the client's retry is deduplicated). Each waits at most its
# timeout, but a client resending an uncommitted batch (a partition without a quorum) added
# one on every resend, and every turn scans them.
MAX_ACK_WAITERS_PER_PARTITION = 10_000


class ReplicaHost:
    def __init__(self, node_id: str, store: StoreBase, producers: ProducerStates, rng: random.Random,
                 send: Callable[[str, object, bytes | None], None],
                 publish: Callable[[int, str | None, int], None],
                 config: ReplicationConfig | None = None, tick_ms: int = 50,
                 now_ms: Callable[[], int] = _monotonic_ms, store_id: str = "",
                 confirmed: bool = True, early_appends: bool = True, early_acks: bool = True) -> None:
        """``send(dest node id, msg, payload)`` delivers to a peer; ``publish(pid, leader,
        epoch)`` is told about leadership changes (the node gossips them); ``now_ms``: the
        node's monotonic clock (ticks, ack deadlines, lazy state writes); ``store_id`` and
        ``confirmed``: see ``ReplicaManager`` (the node passes confirmed=False until gossip
        tells it whether it lost state); ``early_appends``: the leader's appends leave
        before the turn's sync (see the module doc); ``early_acks``: acks=all answers (and
        fetch wake-ups) a commit advance of the drain allows leave before the turn's sync
        (``answer_committed``), not after it."""
        self.now_ms = now_ms
        self.early_appends = early_appends
        self.early_acks = early_acks
        self.node_id = node_id
        self.store = store
        self.producers = producers
        self.rng = rng
        self.cfg = config or ReplicationConfig()
        self.tick_ms = tick_ms
        self._send = send
        self._publish = publish
        self.store_id = store_id
        self.reader = StoreReader(store)
        self.core = ReplicaManager(node_id, rng, self.cfg, self.reader, store_id=store_id,
                                   confirmed=confirmed)
        self._hard: set[int] = set()   # partitions whose term, vote or epoch cache this turn wrote
        self._replicas: dict[int, tuple[str, ...] | Config] = {}   # what add() was given
        self._cfg_turn: dict[int, tuple[Config, bool]] = {}   # config changes of this turn (not durable yet)
        self._cfg_done: dict[int, tuple[Config, bool]] = {}   # durable: for take_config_changes
        self._held: list[Send] = []
        self._committed: dict[int, int] = {}
        self._leadership: dict[int, tuple[str | None, int]] = {}
        self._appended: dict[int, int] = {}
        self._truncated: dict[int, int] = {}
        self._waiters = AckWaiters()
        self._last_tick_ms = now_ms()
        self._rows = StateRows(store)   # the partitions' persisted Raft state
        self._logged: set[tuple[str, str]] = set()  # (peer, reason shape) refusals logged once
        self._refused_seen = 0   # the core's refused_rows when its refusals were last taken
        self.full_drops = 0      # appends dropped because the store had no room for them
        self._walked: dict | None = None   # within step: id(chunk) -> (chunk, its checked batches)
        self.reply: Callable[[bytes, int, object], None] | None = None  # set by the node: reply(ident, rid, msg)
        self.address_of: Callable[[str], str | None] = lambda node_id: None  # set by the node: leader hints

    # -- partitions ---------------------------------------------------------------------
    def _load_state(self, pid: int) -> PersistState | None:
        return self._rows.load(pid)

    def add(self, pid: int, replicas: list[str] | tuple[str, ...] | Config) -> None:
        """Host a replica of ``pid``: ``replicas`` is the initial replica list or a
        ``Config`` (a learner joining); a persisted config history wins over it."""
        state = self._load_state(pid)
        if state is not None:
            self._rows.persisted[pid] = state
        if not isinstance(replicas, Config):
            replicas = tuple(replicas)
        self.core.add_partition(pid, replicas, state, self.store.log_end(pid))
        self._replicas[pid] = replicas
        if self.store.get("meta", _DROPPED % pid) is not None:
            self.store.delete("meta", _DROPPED % pid)
            if state is None:
                log.warning("partition %d: its replica here was dropped before (log and raft state): "
                            "recovering, not voting or counted in sync until refilled from the leader", pid)
                self.apply(self.core.forgot_replica(pid))
        if self.core.config(pid).voters[0] == self.node_id:
            # the preferred replica campaigns at once (pre-vote: a healthy leader's
            # followers ignore it), so a new or restarted partition has a leader in one round trip
            self.apply(self.core.campaign(pid))

    def remove(self, pid: int) -> None:
        self.core.remove_partition(pid)
        self._replicas.pop(pid, None)
        self._cfg_turn.pop(pid, None)
        self._cfg_done.pop(pid, None)
        self._waiters.fail(pid, ErrorCode.UNKNOWN_TOPIC, "the partition was deleted", self.reply)
        if self._rows.drop(pid):
            # hosted here again later (the metadata changed back): recovering, as after a
            # wiped disk; its acknowledgements went with the data
            self.store.put("meta", _DROPPED % pid, b"1")

    def hosts(self, pid: int) -> bool:
        return pid in self._replicas

    # -- identity and damage (see mesh.raft.manager, "Lost state") ----------------------
    def confirm_identity(self) -> None:
        """Gossip says our store and generation are the newest the cluster remembers."""
        self.apply(self.core.confirm_identity())

    def declare_lost_state(self) -> None:
        """Gossip says the cluster remembers a newer generation or another store for us."""
        self.apply(self.core.declare_lost_state())

    def report_corrupt(self, pid: int, offset: int) -> None:
        """A stored batch of ``pid`` at ``offset`` failed its check (the core is idempotent)."""
        if pid in self._replicas:
            self.apply(self.core.report_corrupt(pid, offset))

    def recovering(self, pid: int) -> bool:
        return self.core.recovering(pid)

    # -- membership ---------------------------------------------------------------------
    def propose_config(self, pid: int, voters: list[str] | tuple[str, ...],
                       learners: list[str] | tuple[str, ...] = ()) -> None:
        """One single-server step (``ReplicaManager.propose_config``): MeshError NOT_LEADER,
        or INVALID_REQUEST with the reason the step is refused or must wait."""
        self.apply(self.core.propose_config(pid, voters, learners))

    def config(self, pid: int) -> Config:
        return self.core.config(pid)

    def committed_config(self, pid: int) -> Config:
        return self.core.committed_config(pid)

    def config_pending(self, pid: int) -> bool:
        return self.core.config_pending(pid)

    def followers(self, pid: int) -> dict[str, int]:
        """Leader only: each follower's and learner's durable match offset ({} elsewhere)."""
        return self.core.followers(pid)

    @property
    def now_tick(self) -> int:
        return self.core.now_tick

    def follower_silence(self, pid: int) -> dict[str, int]:
        """Leader only: ticks since each follower and learner was last heard."""
        return self.core.follower_silence(pid)

    def transfer_leadership(self, pid: int, target: str) -> None:
        """Hand leadership of ``pid`` to ``target`` (a voter; a no-op when not leading)."""
        self.apply(self.core.transfer_leadership(pid, target))

    def hand_over(self, pid: int) -> None:
        """Start handing ``pid``'s leadership to a caught-up voter, if it is led here and
        one answers (``ReplicaManager.hand_over``)."""
        if self.is_leader(pid) and not self.core.transferring(pid):
            self.apply(self.core.hand_over(pid))

    def hand_over_all(self, exclude: frozenset[str] | set[str], started: dict[int, int], tries: int = 3) -> bool:
        """Controlled shutdown, once per turn: start handing over every partition led here to
        a caught-up replica not in ``exclude`` (``ReplicaManager.hand_over``), at most
        ``tries`` times per partition (counted in ``started``: an abandoned handover is tried
        again); True while one is in progress."""
        busy = False
        for pid in self.core.leaders():
            if self.core.transferring(pid):
                busy = True
            elif started.get(pid, 0) < tries:
                self.apply(self.core.hand_over(pid, exclude))
                if self.core.transferring(pid):
                    started[pid] = started.get(pid, 0) + 1
                    busy = True
        return busy

    def quiet(self) -> int:
        """Replicas hosted here that are quiet (idle partitions: not ticked, no heartbeats)."""
        return self.core.quiet()

    def leaders(self) -> list[int]:
        """The partitions this node leads, ascending."""
        return self.core.leaders()

    def local_config(self, pid: int) -> tuple[int, tuple[str, ...], tuple[str, ...]] | None:
        """(version, voters, learners) of the latest config in this replica's log; None if
        not hosted (``mesh.cluster.configs`` rule 3)."""
        if pid not in self._replicas:
            return None
        c = self.core.config(pid)
        return c.version, tuple(c.voters), tuple(c.learners)

    def leader_silence_ms(self, pid: int) -> int:
        """How long no leader's append or heartbeat reached this replica (0 while it leads)."""
        if pid not in self._replicas:
            return 0
        return self.core.leader_silence_ticks(pid) * self.tick_ms

    def wake_quiet_follower(self, pid: int) -> bool:
        """``ReplicaManager.wake_quiet_follower`` (False if not hosted)."""
        return pid in self._replicas and self.core.wake_quiet_follower(pid)

    def take_config_changes(self) -> dict[int, tuple[Config, bool]]:
        """``{pid: (latest config, committed)}`` changed since the last call, durable."""
        if not self._cfg_done:
            return {}
        out, self._cfg_done = self._cfg_done, {}
        return {pid: v for pid, v in out.items() if pid in self._replicas}

    def status(self, pid: int) -> dict:
        return self.core.status(pid)

    # -- inputs -------------------------------------------------------------------------
    def apply(self, ready: Ready) -> None:
        """Carry out a Ready's storage effects in the turn's transaction; hold the rest."""
        if ready is NO_READY or not (ready.log_ops or ready.persist or ready.messages or ready.committed
                                     or ready.leadership or ready.configs):
            return   # most calls (a flush, a tick with nothing due): nothing to do
        cuts = None
        for op in ready.log_ops:
            if type(op) is CutHead:
                cuts = cuts or []
                cuts.append(op)
                continue
            if type(op) is CleanTo:   # the leader's compaction cut: the compactor applies it
                self.store.stage_clean_target(op.pid, op.clean_end, op.horizon_ms)
                continue
            self.reader.tail.pop(op.pid, None)   # (a leader's log ops: none; never serve around one)
            self._hard.add(op.pid)
            if isinstance(op, Append):   # its batches as step walked and checked them
                w = self._walked.get(id(op.payload)) if self._walked else None
                batches = w[1] if w is not None and w[0] is op.payload else [
                    (h, bytes(mv)) for h, mv in iter_batches(op.payload, verify_crc=False)]
                end = self.store.stage_replica_batches(op.pid, batches)
                assert end == op.end_offset, (op.pid, end, op.end_offset)
                self.producers.stage_replicated_batches(op.pid, batches)
            elif isinstance(op, Truncate):
                self.store.stage_truncate(op.pid, op.to_offset)
                self.producers.truncate(op.pid, op.to_offset)
                self._truncated[op.pid] = min(op.to_offset, self._truncated.get(op.pid, op.to_offset))
            elif isinstance(op, ResetLog):
                self.store.stage_reset(op.pid, op.start_offset)
                self.producers.truncate(op.pid, 0)
                self._truncated[op.pid] = min(op.start_offset, self._truncated.get(op.pid, op.start_offset))
        for st in ready.persist:
            last = self._rows.persisted.get(st.pid)
            if last is not None and last.recovering != st.recovering:
                if st.recovering:
                    log.warning("partition %d: recovering (lost or damaged state): refilling from the leader, "
                                "not voting or counted until caught up", st.pid)
                else:
                    log.info("partition %d: refilled to the leader's commit offset: voting and counted again", st.pid)
            if self._rows.offer(st):   # (only the commit offset moved: written within a second)
                self._hard.add(st.pid)
        for op in cuts or ():
            self._cut_head(op)
        if ready.messages:
            self._held.extend(ready.messages)
        if ready.committed:
            self._committed.update(ready.committed)
        if ready.leadership:
            self._leadership.update(ready.leadership)
        if ready.configs:
            self._cfg_turn.update(ready.configs)

    def _cut_head(self, op: CutHead) -> None:
        """Follow the leader's log start (``CutHead``), up to the commit offset on disk (a
        commit written lazily is written now: the log start never passes it on disk)."""
        lazy = self._rows.lazy.get(op.pid)
        if lazy is not None:
            self._rows.write(lazy)
            self._hard.add(op.pid)
        before = self.store.log_start(op.pid)
        after = self.store.stage_cut_head(op.pid, min(op.offset, self.persisted_commit(op.pid)))
        if after > before:
            self._hard.add(op.pid)
            log.debug("partition %d: log start %d -> %d, as its leader's", op.pid, before, after)

    def before_commit(self, store_has_writes: bool) -> set[int]:
        """Right before the turn's sync: write deferred commit offsets once a second (not
        with every turn that syncs: another database's pages in each commit cost ~10% of
        it), send the early appends, and answer the acks=all waiters the turn's commit
        advances already cover (``answer_committed``). Returns the partitions whose commit
        offset moved (their parked fetches may wake now)."""
        if self._rows.lazy:
            self._rows.flush_lazy(self.now_ms())
        if self.early_appends:
            try:
                self._flush_early("before the sync")
            except LogError:
                self.store.rollback()
                raise
        return self.answer_committed() if self.early_acks else set()

    def send_early_appends(self) -> None:
        """Right after the drain (the turn's other steps and its sync still to come): the
        appends of what the drain staged as leader leave now, under the same rule as in
        ``before_commit`` (a LogError dooms the turn: the node rolls it back at its commit)."""
        if self.early_appends and self._appended:
            self._flush_early("after the drain")

    def _flush_early(self, when: str) -> None:
        """``flush()`` into the turn, then send the held appends that may leave early."""
        try:
            self.apply(self.core.flush())
        except Exception as exc:   # the core may be half-updated: fail the turn (rebuilt from disk)
            raise LogError(f"replication flush {when} failed: {exc!r}") from exc
        self._send_early()

    def answer_committed(self) -> set[int]:
        """Answer the acks=all waiters whose batch the commit offset now passes; returns the
        partitions whose commit offset moved since the last call.

        Safe before the turn's sync: a commit advance is made of durable matches only (a
        follower acks after its sync; the leader counts its own copy after ``synced()``,
        which runs after a sync), so what it covers is durably on a quorum whatever this
        turn's sync does. For the same reason every offset below it is already in the
        store's committed data (the batches staged this turn leave only in this call's
        turn and cannot be acknowledged before it ends), so a parked fetch may read it."""
        if not self._committed:
            return set()
        committed, self._committed = self._committed, {}
        if self._waiters:
            for pid, commit in committed.items():
                self._waiters.answer(pid, commit, self.store.log_start, self.reply)
        return set(committed)

    @property
    def commit_moved(self) -> bool:
        """A commit offset moved since the last ``answer_committed``."""
        return bool(self._committed)

    def _send_early(self) -> None:
        """Send the held leader appends that may leave before the sync (module doc)."""
        if not self._held:
            return
        held, keep = self._held, []
        hard = self._hard
        for e in held:
            if type(e.msg) is ReplAppend and (not hard or not any(r.pid in hard for r in e.msg.rows)):
                self._send(e.dest, e.msg, e.payload)
            else:
                keep.append(e)
        self._held = keep

    def persisted_commit(self, pid: int) -> int:
        """The commit offset on disk: retention may delete only below it."""
        return self._rows.commit_on_disk(pid)

    def step(self, src_node: str, msg: object, payload: bytes | None) -> None:
        """One replication message from peer ``src_node``; MeshError (nothing applied) if it
        is malformed. Rows the core refused are logged once per peer and reason."""
        rows = parse_rows(msg, self.cfg.max_replicas)   # once: the core takes them as they are
        chunks = None
        if type(msg) is ReplAppend:
            walked = check_append_payload(msg, payload, self.cfg.max_replicas, rows) if payload else ()
            if payload and not self.store.room_for(len(payload), lambda: [len(b) for w in walked for _, b in w]):
                # a put that does not fit fails the whole turn, and its rollback rebuilds the
                # core (every leadership here dropped); unanswered, the leader sends it again
                self.full_drops += 1
                if self.full_drops & (self.full_drops - 1) == 0:   # the 1st, 2nd, 4th, 8th...
                    log.warning("the store is full: %d appends from leaders dropped so far (this one "
                                "%d bytes from %s)", self.full_drops, len(payload), src_node)
                return
            chunks = split_payload(rows, payload or b"")
            self._walked = {id(c): (c, w) for c, w in zip(chunks, walked) if w}
        try:
            self.apply(self.core.step(src_node, msg, payload, rows, chunks))
        finally:
            self._walked = None
        if self.core.refused_rows == self._refused_seen:
            return
        self._refused_seen = self.core.refused_rows
        for peer, why in self.core.take_refusals().items():
            key = (peer, re.sub(r"\d+", "#", why)[:80])
            if key not in self._logged and len(self._logged) < 10_000:
                self._logged.add(key)
                log.log(logging.INFO if NOT_HOSTED in why else logging.WARNING,
                        "replication rows from %s refused: %s", peer, why)

    def tick_due(self) -> None:
        """At most one replication tick per loop turn. A broker whose turns take longer than
        a tick (thousands of partitions electing at once, a starved CPU) lets its timers
        slow down with it: firing election timeouts faster than it can carry the votes
        turns every election into a failed one (10,000 new partitions on three brokers
        never got their leaders that way). A debt of up to ``TICK_DEBT`` ticks is kept and
        paid by the next turns, which then poll without waiting (``next_tick_in_ms``), so
        a late wake-up costs no tick; a stall beyond that is forgotten, not replayed."""
        now = self.now_ms()
        if now - self._last_tick_ms < self.tick_ms:
            return
        self._last_tick_ms = max(self._last_tick_ms + self.tick_ms, now - TICK_DEBT * self.tick_ms)
        self.apply(self.core.tick())

    def next_tick_in_ms(self) -> int:
        """Milliseconds until a tick is due (0: one is due now)."""
        return max(0, self._last_tick_ms + self.tick_ms - self.now_ms())

    def append_position(self, pid: int) -> tuple[int, int]:
        return self.core.append_position(pid)

    def transferring(self, pid: int) -> bool:
        """This node leads ``pid`` and is handing the leadership over (appends refused), or
        it stepped down for the handover's target and knows no leader yet."""
        return self.core.transferring(pid)

    def leader_append(self, pid: int, end_offset: int, epoch: int, base: int = -1, batch: bytes | None = None,
                      patched: bool = False) -> None:
        """The data path staged ``batch`` (as the client sent it, or as stored if ``patched``)
        at ``base`` with ``epoch``; kept in the reader's tail until the sync, so followers get
        it before that."""
        self.core.leader_append(pid, end_offset, epoch)
        self._appended[pid] = end_offset
        if self.early_appends and batch is not None:
            tail = self.reader.tail.get(pid)
            if tail is None:
                tail = self.reader.tail[pid] = []
            if not tail or tail[-1][1] == base:
                tail.append((base, end_offset, batch if patched else patch_batch(batch, base, epoch)))
            else:   # not contiguous (cannot happen): nothing of this partition leaves early
                self.reader.tail.pop(pid)
                self._hard.add(pid)

    def park_ack(self, pid: int, ident: bytes, rid: int, base: int, end: int, timeout_ms: int) -> None:
        """An acks=all produce request staged this turn: answer when committed."""
        self._waiters.park(pid, AckWaiter(ident, rid, base, end, self.now_ms() + max(0, timeout_ms)),
                           MAX_ACK_WAITERS_PER_PARTITION, self.reply)

    # -- after the turn's sync ----------------------------------------------------------
    def after_commit(self, ok: bool) -> set[int]:
        """Returns the partitions whose commit offset moved, or whose leadership went to
        another node (to wake fetches: these learn NOT_LEADER with the new leader)."""
        if self.reader.tail:
            self.reader.tail.clear()
        if self._hard:
            self._hard.clear()
        if not ok:
            self._cfg_turn = {}
            self._rebuild()
            return set()
        if self._cfg_turn:
            self._cfg_done.update(self._cfg_turn)   # durable now; later Readies belong to the next turn
            self._cfg_turn = {}
        if self._appended:
            appended, self._appended = self._appended, {}
            for pid, end in appended.items():
                if pid in self._replicas:
                    self.apply(self.core.synced(pid, end))
        self.apply(self.core.flush())
        if self._held:
            held, self._held = self._held, []
            for e in held:
                self._send(e.dest, e.msg, e.payload)
        if self._truncated:
            truncated, self._truncated = self._truncated, {}
            for pid, cut in truncated.items():
                self._waiters.fail(pid, ErrorCode.NOT_LEADER, "the batch was truncated before it committed",
                                   self.reply, lambda w, cut=cut: w.end > cut)
        if not self._leadership:
            return self.answer_committed()
        leadership, self._leadership = self._leadership, {}
        moved_away: set[int] = set()
        for pid, (leader, epoch) in leadership.items():
            self._publish(pid, leader, epoch)
            if leader != self.node_id:  # tell waiting clients at once, with the new leader's address if known
                self._waiters.fail(pid, ErrorCode.NOT_LEADER, f"leadership moved to {leader}", self.reply,
                                   leader=self.address_of(leader) if leader else None)
                if leader is not None:
                    moved_away.add(pid)   # its parked fetches: NOT_LEADER naming the new leader, now
        return self.answer_committed() | moved_away

    def expire(self) -> None:
        if self._waiters:
            self._waiters.expire(self.now_ms(), self.reply)

    def _rebuild(self) -> None:
        """The turn's commit failed after the core saw it: start the core again from disk."""
        log.warning("rebuilding the replication core from storage after a failed commit")
        self._held, self._committed, self._leadership, self._appended, self._truncated = [], {}, {}, {}, {}
        self._rows.reload(self._replicas)
        for pid in list(self._waiters):
            self._waiters.fail(pid, ErrorCode.STORAGE_ERROR, "the write could not be made durable", self.reply)
        old, self._refused_seen = self.core, 0
        self.reader = StoreReader(self.store)
        self.core = ReplicaManager(self.node_id, self.rng, self.cfg, self.reader,
                                   store_id=self.store_id, confirmed=old.confirmed)
        if old.lost and (not self._replicas or any(old.recovering(pid) for pid in self._replicas)):
            # still refilling: stay lost (the flags persisted so far may lag the old core's);
            # once every replica refilled, declaring again would make them all refill anew
            self.core.declare_lost_state()
        for pid, reps in sorted(self._replicas.items()):
            self.core.add_partition(pid, reps, self._load_state(pid), self.store.log_end(pid))

    def log_start_moved(self, pid: int) -> None:
        """Retention moved this leader's log start: its heartbeats carry it to the followers."""
        self.core.log_start_moved(pid)

    # -- queries ------------------------------------------------------------------------
    def leader(self, pid: int) -> tuple[str | None, int]:
        return self.core.leader(pid)

    def commit_offset(self, pid: int) -> int:
        return self.core.commit_offset(pid)

    def commit_known(self, pid: int) -> bool:
        """Leader: a quorum holds its epoch marker, so its commit is at least every earlier
        leader's (right after an election it may still lag what they acknowledged)."""
        return self.core.commit_known(pid)

    def isr(self, pid: int) -> list[str]:
        return self.core.isr(pid)

    def is_leader(self, pid: int) -> bool:
        return pid in self._replicas and self.core.leader(pid)[0] == self.node_id
