"""Partition replication: Raft per partition, coalesced per broker pair (MultiRaft).

Theory of operation
===================

Every partition's replicas (a list of node ids, the first one preferred as leader) form
their own Raft group; terms are Kafka's leader epochs. ``ReplicaManager`` hosts all the
partition replicas of one broker (``mesh.raft.partition.Partition`` each) and is
sans-I/O: time is ``tick()``, randomness an injected ``random.Random``, storage a
``LogReader`` for reads and effects for writes, the network rows in and ``Send`` effects
out. Modules of ``mesh.raft``: ``messages`` (the peer protocol's rows and messages),
``log`` (epoch cache, storage effects, the ``Ready``, the reader protocol), ``config``
(``ReplicationConfig``), ``partition`` (one partition's state machine), ``progress`` (the
leader's view of each follower: probe / replicate, the inflight window), ``quorum``
(majorities, the commit offset, vote tallies), ``membership`` (configs, their history in
the log, the allowed single-server steps), ``outbox`` (coalescing), and this one (the
public API, the ``Ready``). The package exports the public API: ``from mesh.raft import ...``.

- **Membership** (``mesh.raft.membership``). The replica set is a ``Config`` (voters, the
  first preferred, and learners) recorded as zero-width markers in the log; a replica uses
  the latest one in its log. Quorums, commit, the ISR, check-quorum and elections count
  the latest config's voters only; learners get the log (within ``learner_bytes_per_tick``)
  and never vote. ``propose_config``: one single-server step at a time (see ``configuring``).

- **Log and log matching.** The core never reads records. A log is an end offset and a
  leader-epoch cache ``[(epoch, start_offset), ...]``; record batches travel as opaque
  bytes. Appends carry ``(prev_offset, prev_epoch)``; a follower that disagrees answers
  with a hint from its epoch cache (Kafka's OffsetsForLeaderEpoch), so the leader finds
  the point of agreement in about one round trip and the follower truncates there
  (never below its commit offset).
- **Elections.** Pre-vote, then vote. A replica persists (term, vote) before its grant
  leaves (same ``Ready``; the shell persists first). A candidate needs a log at least as
  up to date: (last epoch, end offset) compared as a pair. Voters that heard from a leader
  within an election timeout ignore (pre-)votes (leader lease), unless the candidate was
  told to campaign by a leadership transfer.
- **Commit after an election: the epoch marker.** Instead of appending a no-op batch (the
  core cannot build batches: they are opaque), a new leader records
  ``(epoch, its end offset)`` in its epoch cache: a zero-width entry, persisted with its
  term. A follower records the same marker once its log agrees with the leader's up to
  that offset, truncating anything after it (which can only be from older epochs). The
  marker counts as the last entry in vote comparisons, exactly like a no-op entry would,
  and the leader counts a replica toward commit only once it holds the marker (its acked
  offset is at or past ``epoch_start``). So commit can advance right after an election,
  with no batch written, and Raft 5.4.2's rule holds: entries of older epochs become
  committed only by a quorum holding the current epoch.
- **Commit = high watermark.** The largest offset a quorum holds *durably*: followers
  count with what they acked (acks leave after the follower persisted), the leader with
  what the shell reported synced (``synced()``), not merely staged. Consumers read below
  it. Commit never decreases.
- **Pipelined push.** A follower is probed (one message in flight) until the leader knows
  where they agree, then batches stream with up to ``max_inflight_msgs`` messages and
  ``max_inflight_bytes`` bytes in flight. A loss shows as a rejected append (gap) or an
  ack that does not come within ``retransmit_ticks``: the leader probes again from the
  last acked offset.
- **Coalescing** (``mesh.raft.outbox``). What a call produces for one peer goes out as one
  message per kind. Leaders heartbeat on a node-wide beat (every ``heartbeat_ticks``), so
  an idle broker sends one heartbeat and one response per peer per beat, however many
  partitions they share: 1,000 partitions x RF 3 on 3 brokers (defaults) is 40 messages/s
  per broker, not about 13,300/s (``tests.sim.replication_sim.idle_messages_per_sec``).
- **Fencing.** Every row carries the sender's term. A row from an older term is dropped and
  an older leader's append or heartbeat is answered with FENCED_EPOCH and the newer term,
  which makes it step down. A leader that has not heard from a quorum for an election
  timeout steps down (check-quorum): a leader that was SIGSTOPped and resumes stops taking
  writes at the latest one election timeout later, and its writes never commit meanwhile
  because its followers moved to a newer term. ``append_position`` also refuses writes
  (NOT_ENOUGH_REPLICAS, retriable) when a quorum has not answered within three heartbeats.
- **Quiescence** (CockroachDB's; rule 10 of ``mesh.raft.partition``). An idle partition
  whose live followers are caught up goes quiet: its replicas are not ticked and its
  leader sends no heartbeat rows, so idle partitions cost nothing per tick (before, 3,000
  idle partitions x RF 3 on three brokers kept 1.6 of two shared cores busy). What stands in for their
  heartbeats is node-level: on every beat a node pings (an empty ``REPL_HEARTBEAT``, unless
  something else goes there anyway) each peer it shares a partition with, and any message
  from a peer is heard (``mesh.raft.peer_lives``). A quiet follower keeps its leader's lease
  while the leader's node is heard; once it has been silent for an election timeout the
  manager wakes the follower with its election timer where it would stand had it been
  ticking, so a dead leader's quiet partitions elect a successor in the usual time. A peer
  heard for the first time or from a new life (restart) wakes the quiet followers it led
  (it leads nothing now: their leases run out as if they had kept ticking) and the quiet
  leaders it follows (it may lag). A follower's node silent for an election timeout wakes
  the quiet leaders it follows once, so check-quorum runs (a leader cut off from its
  quorum steps down as when ticking), and again when it is heard after that silence. A
  woken leader counts each follower as last heard when its node was. Safety never depends
  on quiescence: quiet replicas only skip timers.
- **Preferred leader.** A leader that is not its partition's preferred replica hands over
  (TimeoutNow) once it has led for ``rebalance_delay_ticks`` and the preferred replica is
  answering and holds its whole log. The preferred replica also draws its election timeout
  from the lower half of the range, so it usually wins elections in the first place; the
  other voters, once they know a leader, split the upper half in placement order, so the
  successors of a dead preferred leader do not campaign together and split the vote
  (``Partition._rank_timeout``).

Lost state (disks forget)
=========================

Raft assumes a disk keeps what it synced; a real one may come back empty (wiped), older
(restored from a copy) or damaged. A replica that forgot what it acknowledged must never
be counted for it, nor vote as if it remembered. The rules (issue 17):

1. **Identity on the wire.** Every peer message carries the sender's ``store`` id (made
   with its data directory) and ``life`` (drawn from the rng when its core starts: one per
   process start, and per rebuild after a failed commit). The manager remembers each
   peer's (store, life); when it changes, every partition this node leads with that peer
   voids what it knew of it (``Progress.forget``: ``match`` back to 0, so it counts toward
   neither commit nor the in-sync set until it acks again). Another store is probed from
   scratch (our log end; the rejection hints walk down, to the log start and its reset row
   if need be); a new life of the same store is probed at the old ``match``, which a
   follower that kept its disk acks at once, while a rolled-back one rejects. Late
   messages from an identity the peer left behind are dropped (the last 16 per peer).
   Lives are not ordered: a late message from a life we never heard looks like a new
   one, retiring the live one. So a retired identity that is heard while the one that
   replaced it has been silent for an election timeout is taken back (a restart again).
2. **The leader believes a follower's reports.** A rejection whose hint places the point
   of agreement below the follower's ``match`` lowers ``match`` at once
   (``Progress.lower``). A stale rejection (a reordered old answer) lowers it too: that
   only costs a re-probe; lowering is always safe, counting what a follower forgot is not.
   Followers take a heartbeat's commit offset only up to where an append of this term
   showed their log equal to the leader's (``agreed``), so a rolled-back follower never
   marks data it does not hold as committed.
3. **Unconfirmed.** A node starts ``confirmed=False`` (production) until gossip tells it
   whether the cluster remembers a newer identity for it (``confirm_identity`` /
   ``declare_lost_state``). Meanwhile replicas of multi-replica partitions grant no
   (pre-)votes, never campaign and ignore TimeoutNow; they follow and ack. RF 1: no
   restriction (there is no one to ask, nothing to refill from). RF 2: they do grant
   votes, whatever their log says (never campaign): the candidate is then the only other
   voter, which holds every committed entry (a commit needs both) and knows every term
   we could have voted in; otherwise its partition could never elect a leader again.
4. **Recovering.** After ``declare_lost_state`` every replica (and every one added later
   in this life) is *recovering*: no votes, no campaigns; its append and heartbeat
   responses say ``recovering``, and a leader counts it neither toward commit nor the ISR
   nor as a transfer target (``append_position`` does not count it either), and answers
   its heartbeat responses with a probe, so it finishes even in an idle partition. It
   leaves once an append of the current leader shows its log equal to the leader's up to
   ``recover_to``: where that leader's epoch starts in its log (``epoch_start``), which
   holds every entry committed before its term. (Not the leader's commit offset: a new
   leader learns that entries of older terms were committed only by committing one of its
   own, so its commit can lag what the replica acknowledged before it forgot. Disk-fault
   simulator seed 40325 lost three acknowledged batches that way.) And not before the
   other voters confirm that term is still the newest (``mesh.raft.recovery.confirm_term``): it
   may have voted for or led a newer term before it forgot, and a leader of an older term
   that never heard of it (paused, cut off) would otherwise refill it and then win its
   vote for a term it already voted in (disk-fault seed 71204: two leaders in one
   term). It sends a pre-vote at its own term to the other voters (the answer carries the
   voter's term) and leaves once ``n - q + 1`` of the ``n - 1`` others, its leader
   included, are at its term: any quorum of a newer term would include one of them. One at
   a newer term moves it there, still recovering. So a replica that forgot refills, and
   votes again, only while that many others answer. On leaving it
   records a vote for that leader in that term (unless it already voted in it), so it
   can never vote twice in a term it forgot. The flag is persisted (``PersistState``), so
   a restart in the middle of a refill stays recovering.
5. **Corruption.** ``report_corrupt(pid, offset)``: a follower cuts its log at ``offset``
   (a ``Truncate`` that may go below its commit offset, which drops with it: the only
   case) and is recovering until refilled past its old commit. A leader first sends
   TimeoutNow to its most caught-up, answering, non-recovering follower, steps down, then
   cuts and refills the same way. If that follower held everything the leader counted
   committed (``match >= max(commit, epoch_start)``), the leader, recovering, still grants
   it its vote in the next term (``Partition.vouch``): a follower refilling from the leader
   after a wipe is what reads old batches, and so finds old damage, and with it and the
   leader both recovering the successor could never win. The promise is persisted with
   the partition's state (a restart keeps it) and dropped once recovered, or when the
   node finds it lost state (``declare_lost_state``: rule 4 then holds without exception). Damage at or past the log end
   changes nothing, so repeated reports are harmless. RF 1: recorded in ``status`` only
   (nothing to refill from).
6. Hence: never two leaders in one epoch; the cluster's commit offset never decreases;
   no committed entry is lost while at most one replica's disk is faulted at a time and it
   is back in the in-sync set before the next (the simulator's disk faults check this).

A replica that forgot can only learn from the replicas that answer: rule 4's
confirmation is why it waits for enough of them (Kafka asks its controller's
eligible-replica set instead). A learner skips it: it has no vote to give twice.

Shell contract
==============

One loop turn of the node (single-threaded), for this core:

1. Feed inputs: ``step(src, msg, payload)`` for each replication message received (a
   malformed one raises ``MeshError(INVALID_REQUEST)`` and changes nothing), and
   ``tick()`` once per elapsed ``tick_ms`` (after a stall, several - capped).
2. Produce requests: ``base, epoch = append_position(pid)`` (raises NOT_LEADER with a
   leader hint, NOT_ENOUGH_REPLICAS, UNKNOWN_PARTITION); stage the batch at ``base`` with
   leader epoch ``epoch`` in the turn's write transaction; call
   ``leader_append(pid, end_offset, epoch)``. Never stage for a partition without asking
   ``append_position`` in the same turn.
3. Every call but ``leader_append`` returns a ``Ready``. Apply its storage effects
   *immediately*, in order, to the turn's write transaction, before calling the core
   again: ``log_ops`` (``Append``: store the payload's batches as they are at
   ``base_offset``, which is the log end; all carry epoch ``epoch``. ``Truncate``: delete
   batches at/after ``to_offset``. ``ResetLog``: delete all batches; log start = end =
   ``start_offset``. ``CutHead``: delete the whole batches ending at or before ``offset``,
   at most up to the commit offset on disk: a follower following its leader's log start),
   then ``persist`` (``PersistState``: one record per partition -
   term, vote, commit, epoch cache, config history). Hold its ``messages``,
   ``committed``, ``leadership`` and ``configs`` for step 6.
4. Commit the write transaction with one fsync (group commit). Then call
   ``synced(pid, end_offset)`` for every partition that got ``leader_append`` data this
   turn. Its Ready can only advance commit; its ``persist`` (the new commit offset) may
   wait for the next turn's transaction.
5. Call ``flush()`` once: it sends new data to followers, coalesced per peer, reading it
   through the ``LogReader``; its Ready holds messages only. (Calling it before step 4 is
   also correct; data the reader cannot see yet then goes out on the next flush.)
   The one exception to "persist first, then send": the shell may also ``flush()`` before
   the fsync (after the drain, before it), with a reader serving what it staged as leader, and
   send the held ``ReplAppend`` messages at once (the leader syncs while its followers
   do), unless a partition they name had a ``persist`` other than a commit-only change, or
   a log op, this turn. Nothing else leaves early. Safe: the leader's own data counts
   only after ``synced()``, so a commit still rests on a synced quorum (maybe the
   followers alone); a failed fsync rebuilds the core as a follower (step 7, as a crash
   would); the followers' extra entries are repaired by log matching.
6. Only now, after the fsync: send the held ``messages`` (``Send(dest=node id, msg,
   payload)``, peer protocol), then act on ``committed`` (``{pid: commit offset}``:
   answer acks=all produce requests whose batch ends at or below it, wake long-poll
   fetches; fetches are served below it only) and ``leadership`` (``{pid: (leader or
   None, epoch)}``: gossip it; if this node lost leadership, answer that partition's
   waiting produce requests NOT_LEADER - they may still commit; idempotent retries make
   that safe) and ``configs`` (``{pid: (latest Config, committed)}``: the leader gossips
   it). A ``Truncate``/``ResetLog`` below a waiting request's end fails it too.
7. If the turn fails before the fsync completes (crash, disk full), nothing of it may be
   sent: the core is then ahead of the disk, so rebuild the ``ReplicaManager`` from
   storage (below) instead of using it further.

Why this is safe: acks and votes leave only after the state they claim is durable; the
leader's own data counts only once ``synced()`` says so (so its appends may go first).

The production ``LogReader`` is a thin view of ``storage``: ``read`` maps to
``store.read(pid, from_offset, max_bytes, to_offset)`` (whole batches; ``to_offset`` is
always a batch boundary), joined, with the end taken from the last batch's header
(``b"", from_offset`` when it returns nothing); ``start_offset`` to ``store.log_start``.

Restart: for each hosted partition, ``add_partition(pid, replicas, state, end_offset)``
with the persisted ``PersistState`` (None for a new partition) and the durable log end;
its config history wins over ``replicas`` (a state with none: the initial config).
Retention may delete batches only below the persisted commit offset; the core reads the
log start through ``LogReader.start_offset`` (a follower behind the leader's log start is
reset to it).

Idempotent producers: the dedup table is derived from batch headers (the core never parses
them): the shell updates it when it stages a batch, as leader or follower (``Append``), in
the same transaction, and drops entries at or past a ``Truncate``/``ResetLog`` cut. So a new
leader has it when ``leadership`` names it.

Known limits: replica sets change by single-server steps only (no joint consensus); a
joining replica (a config, no state) refills as recovering: it may have had a life here
whose votes it forgot. Followers do not serve reads; the epoch cache is bounded by the
epochs present in the retained log, not by a constant.
"""
from __future__ import annotations

import bisect
import random

from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft.config import ReplicationConfig
from mesh.raft.log import EpochCache, LogOp, LogReader, PersistState, Ready
from mesh.raft.membership import Config, History, initial_config
from mesh.raft.outbox import split_payload
from mesh.raft.partition import Partition, Role
from mesh.raft.peer_lives import SAME, STALE, PeerLives
from mesh.raft.pending import Pending
from mesh.raft.quiet_index import QuietIndex
from mesh.raft.messages import MAX_STORE_ID, PeerRow, ReplAppend, parse_rows

__all__ = ["ReplicaManager", "Ready", "NOT_HOSTED"]

NOT_HOSTED = "is not hosted here (usual for a moment while it is created, moved here or deleted)"


class ReplicaManager:
    """All partition replicas hosted by one broker."""

    def __init__(self, node_id: str, rng: random.Random, config: ReplicationConfig | None = None,
                 reader: LogReader | None = None, store_id: str = "", confirmed: bool = True) -> None:
        """``store_id``: this broker's store identity (created with its data directory).
        ``confirmed=False``: the node does not know yet whether it lost state (it has not
        heard from a peer since it started); replicas of multi-replica partitions then
        neither vote nor campaign until ``confirm_identity`` or ``declare_lost_state``."""
        if reader is None:
            raise MeshError(ErrorCode.INVALID_CONFIG, "a LogReader is required")
        if len(store_id) > MAX_STORE_ID:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"a store id has at most {MAX_STORE_ID} characters")
        self.node_id = node_id
        self.rng = rng
        self.store_id = store_id
        self.life = rng.getrandbits(62) + 1           # this incarnation of the core, on the wire
        self.confirmed = confirmed
        self.lost = False                             # declare_lost_state() was called in this life
        self._lives = PeerLives()                     # each peer's (store, life), when heard
        self.peer_stores = self._lives.stores         # peer -> store id, as last heard
        self.cfg = config or ReplicationConfig()
        self.reader = reader
        self.now_tick = 0                             # ticks since start
        self._parts: dict[int, Partition] = {}
        self._pids: list[int] = []                    # sorted: deterministic iteration
        self._awake: list[int] = []                   # sorted: the partitions ticked (not quiet)
        self._quiet = QuietIndex()                    # quiet partitions by the peers they depend on
        self._members: list[str] = []                 # peers sharing a partition with us: pinged every beat
        self._members_dirty = False
        self._pending = Pending()                     # outputs for the next Ready
        self.learner_budget = self.cfg.learner_bytes_per_tick or -1  # learner bytes: a token bucket, -1 = unlimited
        self._starved: set[int] = set()               # leaders whose learners wait for the next tick's budget
        self._flush: set[int] = set()
        self.unknown_rows = 0                         # rows for partitions not hosted here
        self.refused_rows = 0                         # rows refused by a partition (its rule 8)
        self._refusals: dict[str, str] = {}           # peer -> why its last row was refused (bounded)

    # -- partitions ----------------------------------------------------------------------
    def add_partition(self, pid: int, replicas: list[str] | tuple[str, ...] | Config,
                      state: PersistState | None = None, end_offset: int = 0) -> None:
        """Host a replica of ``pid``. ``replicas``: a ``Config``, or a list meaning the
        initial ``Config(0, 0, replicas, ())``; the history in ``state`` (the last persisted
        ``PersistState``, None for a new partition) wins over it. ``end_offset``: the
        durable log end. This node must be a voter or learner of the config."""
        if pid in self._parts:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"partition {pid} is already hosted")
        if len(self._parts) >= self.cfg.max_partitions:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"at most {self.cfg.max_partitions} partitions per broker")
        if state is not None and state.configs:
            history = History(state.configs)
            history.truncate_after(end_offset)
        else:
            history = History([(0, replicas if isinstance(replicas, Config) else initial_config(replicas))])
        members = history.latest().members
        if (self.node_id not in members or len(set(members)) != len(members)
                or not 1 <= len(members) <= self.cfg.max_replicas or not history.latest().voters):
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"partition {pid}: replicas {list(members)} must be distinct, include "
                            f"{self.node_id} and number 1..{self.cfg.max_replicas}")
        if state is None:
            term, vote, commit, cache, recovering = 0, None, 0, EpochCache(), False
        else:
            term, vote, commit, recovering = state.term, state.vote, state.commit, state.recovering
            cache = EpochCache(state.epoch_cache)
            cache.truncate_from(end_offset + 1)  # the log lost a tail the state still named
        joining = state is None and history.latest().version > 0  # see "Known limits"
        p = Partition(self, pid, history, term, vote, commit, cache, end_offset, recovering or self.lost or joining)
        if state is not None and state.vouch is not None and recovering:
            p.vouch = state.vouch   # promised before a restart: still ours to give (report_corrupt)
        self._parts[pid] = p
        self._pending.cfg_dirty.add(pid)
        if p.recovering and not recovering:
            self._pending.persist.add(pid)  # (a learner joining persists its config at once)
        bisect.insort(self._pids, pid)
        bisect.insort(self._awake, pid)
        self._members_dirty = True

    def remove_partition(self, pid: int) -> None:
        p = self._parts.get(pid)
        if p is None:
            return
        p.wake()   # out of the quiet indexes (back in _awake, removed below)
        del self._parts[pid]
        del self._pids[bisect.bisect_left(self._pids, pid)]
        del self._awake[bisect.bisect_left(self._awake, pid)]
        self._members_dirty = True
        self._flush.discard(pid)
        self._starved.discard(pid)
        self._pending.forget(pid)

    def partitions(self) -> list[int]:
        return list(self._pids)

    # -- inputs --------------------------------------------------------------------------
    def tick(self) -> Ready:
        """One tick of time for every partition that is not quiet; heartbeats on the
        node-wide beat, and pings to the peers quiet partitions are shared with."""
        self.now_tick += 1
        per = self.cfg.learner_bytes_per_tick   # a batch over the bucket is debt, repaid by later ticks
        self.learner_budget = min(self.learner_budget + per, per) if per else -1
        if self._starved:
            self._flush |= self._starved
            self._starved = set()
        beat = self.now_tick % self.cfg.heartbeat_ticks == 0
        housekeeping = self.now_tick % self.cfg.housekeeping_ticks == 0
        parts = self._parts
        for pid in list(self._awake):
            p = parts[pid]
            if p.quiesced:
                continue   # went quiet in this loop (woken ones join from the next tick)
            p.tick()
            if beat:
                if p.role is Role.LEADER:
                    p.heartbeat()
                elif p.stepdown_beats or p.recovering:
                    p.follower_beat()
        if housekeeping:
            for pid in self._pids:
                parts[pid].trim_cache()
        if self._quiet:
            self._quiet.check_silences(self.now_tick, self.cfg.election_ticks, self.heard_tick, self._wake)
        if beat and self.cfg.quiesce_after_beats:
            for peer in self._ping_targets():
                self._pending.out.ping(peer)
        self._send_data()
        return self._ready()

    def _ping_targets(self) -> list[str]:
        """Every peer we share a partition with (its latest config), not only quiet ones:
        a broker that restarted with nothing to say (recovering followers do not campaign)
        must still be heard by the quiet leaders it follows, which then refill it."""
        if self._members_dirty:
            self._members_dirty = False
            peers: set[str] = set()
            for p in self._parts.values():
                peers.update(p.history.latest().members)
            peers.discard(self.node_id)
            self._members = sorted(peers)
        return self._members

    def _wake(self, pid: int) -> None:
        self._parts[pid].wake()

    def step(self, src: str, msg: object, payload: bytes | None = None, rows: list[PeerRow] | None = None,
             chunks: list[bytes] | None = None) -> Ready:
        """Feed one replication message from peer ``src``. ``rows`` (and for an append
        ``chunks``): what ``parse_rows(msg)`` and ``split_payload(rows, payload)`` returned,
        when the caller ran them already (the shell does, to check an append's batches)."""
        if rows is None:
            rows = parse_rows(msg, self.cfg.max_replicas)
        if chunks is None and type(msg) is ReplAppend:
            chunks = split_payload(rows, payload or b"")
        if not self._check_identity(src, msg.store, msg.life):
            return self._ready()
        for i, row in enumerate(rows):
            p = self._parts.get(row.pid)
            if p is None:
                self.unknown_rows += 1
                self.refuse(src, f"partition {row.pid} {NOT_HOSTED}")
                continue
            p.step(src, row, chunks[i] if chunks is not None else b"")
        return self._ready()

    def _check_identity(self, src: str, store: str, life: int) -> bool:
        """Track each peer's (store, life); False for a message from one it left behind."""
        seen, last = self._lives.heard(src, store, life, self.now_tick, self.cfg.election_ticks)
        if seen is STALE:
            return False
        if seen is SAME and src not in self._quiet.silent:
            return True
        self._quiet.silent.discard(src)
        for pid in self._quiet.following(src):   # first heard, a new life, back after a silence: it may lag
            self._parts[pid].wake()
        if last is None:
            return True
        for pid in self._pids:
            p = self._parts[pid]
            if src in p.progress:   # (a quiet one was woken above: it must probe the restarted follower)
                p.peer_restarted(src, store, new_store=store != last[0])
        for pid in self._quiet.led_by(src):
            self._parts[pid].wake()   # it restarted, so it leads nothing now: the lease runs out
        return True

    # -- identity and damage -------------------------------------------------------------
    def confirm_identity(self) -> Ready:
        """The cluster remembers no newer identity for us: replicas may vote and campaign."""
        self.confirmed = True
        return self._ready()

    def declare_lost_state(self) -> Ready:
        """The cluster remembers a newer generation or another store for us: we forgot
        acknowledged state. Every replica (and every one added later in this life) is
        recovering: no votes, no campaigns, not counted, until refilled (see "Lost state")."""
        self.confirmed = True
        self.lost = True
        for pid in self._pids:
            p = self._parts[pid]
            p.drop_vouch()   # made by a state we may since have lost part of: no exception to rule 4
            p.become_recovering()
        return self._ready()

    def forgot_replica(self, pid: int) -> Ready:
        """This node dropped its replica of ``pid`` (log and state) and hosts it again: it is
        recovering, as after a wiped disk (not voting, not counted toward commit or the
        ISR) until refilled; its old acknowledgements are gone with the data."""
        p = self._parts.get(pid)
        if p is not None:
            p.become_recovering()
        return self._ready()

    def report_corrupt(self, pid: int, offset: int) -> Ready:
        """A stored batch of ``pid`` at ``offset`` failed its CRC check: cut the log there and
        refill it (a leader hands over first). Repeated reports are harmless."""
        p = self._parts.get(pid)
        if p is not None:
            p.report_corrupt(offset)
        return self._ready()

    def recovering(self, pid: int) -> bool:
        return self._part(pid).recovering

    def leader_silence_ticks(self, pid: int) -> int:
        """Ticks since a leader's append or heartbeat last reached this replica (0 while it
        leads; since start if none ever did)."""
        p = self._part(pid)
        return 0 if p.role is Role.LEADER else self.now_tick - max(p.leader_tick, 0)

    def log_start_moved(self, pid: int) -> None:
        """Retention moved this leader's log start: tick again, so the heartbeats carry it
        to the followers (rule 11 of ``mesh.raft.partition``)."""
        p = self._parts.get(pid)
        if p is not None and p.role is Role.LEADER:
            p.wake()

    def wake_quiet_follower(self, pid: int) -> bool:
        """Wake ``pid``'s replica if it is a quiet follower (True then). A quiet follower
        hears no heartbeat rows by design, so its ``leader_silence_ticks`` grows while its
        leader's node is heard (it would have been woken otherwise): that silence is no
        evidence of anything, and a forged config register made every replica of an idle
        partition drop its data on it. Woken, with its leader taken as heard now, it hears
        its leader again if it is still a member (its election timer leads to a pre-vote,
        which wakes the leader), and goes silent if it was really removed."""
        p = self._part(pid)
        if not p.quiesced or p.role is Role.LEADER:
            return False
        p.leader_tick = self.now_tick
        p.wake()
        return True

    def peer_identity(self, peer: str) -> tuple[str, int] | None:
        """``(store, life)`` of ``peer`` as last heard (None before its first message)."""
        return self._lives.life.get(peer)

    def append_position(self, pid: int) -> tuple[int, int]:
        """``(base_offset, epoch)`` for a produce batch, or MeshError NOT_LEADER (with the
        leader hint) / NOT_ENOUGH_REPLICAS / UNKNOWN_PARTITION."""
        return self._part(pid).append_position()

    def leader_append(self, pid: int, end_offset: int, epoch: int) -> None:
        """The shell staged batches up to ``end_offset`` with leader epoch ``epoch``."""
        self._part(pid).leader_append(end_offset, epoch)

    def synced(self, pid: int, end_offset: int) -> Ready:
        """The shell's fsync made this partition's log durable up to ``end_offset``."""
        p = self._parts.get(pid)
        if p is not None:
            p.mark_synced(end_offset)
        return self._ready()

    def flush(self) -> Ready:
        """Send pending data to followers (call once per loop turn, after the appends)."""
        self._send_data()
        return self._ready()

    def transfer_leadership(self, pid: int, target: str) -> Ready:
        """Hand leadership of ``pid`` to ``target`` (admin; automatic for the preferred replica)."""
        self._part(pid).transfer_leadership(target)
        return self._ready()

    def hand_over(self, pid: int, exclude: frozenset[str] | set[str] = frozenset()) -> Ready:
        """Controlled shutdown: hand leadership of ``pid`` to a caught-up, answering voter
        not in ``exclude`` (``LeaderState.hand_over``), one whose current life we have known
        for an election timeout first (a broker that just restarted may not vote or campaign
        yet: its identity is confirmed by gossip); ``transferring(pid)`` says whether it
        started."""
        new = self._lives.new_lives(self.now_tick, self.cfg.election_ticks)
        self._part(pid).hand_over(exclude, new)
        return self._ready()

    def propose_config(self, pid: int, voters: list[str] | tuple[str, ...],
                       learners: list[str] | tuple[str, ...] = ()) -> Ready:
        """Record the next config (one single-server step) at the leader's log end; raises
        NOT_LEADER, or INVALID_REQUEST naming why the step is not allowed or must wait."""
        self._part(pid).membership.propose_config(tuple(voters), tuple(learners))
        return self._ready()

    def campaign(self, pid: int) -> Ready:
        """Start an election for ``pid`` now (admin and tests); a no-op on the leader."""
        self._part(pid).campaign()
        return self._ready()

    # -- queries -------------------------------------------------------------------------
    def _part(self, pid: int) -> Partition:
        p = self._parts.get(pid)
        if p is None:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"partition {pid} is not hosted on {self.node_id}")
        return p

    def role(self, pid: int) -> Role:
        return self._part(pid).role

    def transferring(self, pid: int) -> bool:
        """Leader of ``pid`` and handing the leadership over (appends are refused meanwhile),
        or stepped down for the handover's target and no leader known yet."""
        p = self._parts.get(pid)
        return p is not None and (p.transfer_to is not None if p.role == Role.LEADER
                                  else p.handed_to is not None and p.leader is None)

    def leader(self, pid: int) -> tuple[str | None, int]:
        p = self._part(pid)
        return p.leader, p.term

    def commit_offset(self, pid: int) -> int:
        return self._part(pid).commit

    def commit_known(self, pid: int) -> bool:   # a new leader's commit may lag its predecessor's (KIP-207)
        return (p := self._part(pid)).role is Role.LEADER and p.commit >= p.epoch_start

    def end_offset(self, pid: int) -> int:
        return self._part(pid).end

    def config(self, pid: int) -> Config:
        """The latest config in this replica's log (committed or not)."""
        return self._part(pid).history.latest()

    def committed_config(self, pid: int) -> Config:
        return self._part(pid).membership.committed_config()

    def config_pending(self, pid: int) -> bool:  # the latest config is not known to be committed
        return not self._part(pid).membership.config_committed()

    def followers(self, pid: int) -> dict[str, int]:
        """Leader only ({} elsewhere): each follower's and learner's durable match offset."""
        p = self._part(pid)
        return {n: pr.match for n, pr in sorted(p.progress.items())} if p.role is Role.LEADER else {}

    def follower_silence(self, pid: int) -> dict[str, int]:
        """Leader only ({} elsewhere): ticks since each follower and learner was last heard
        (``Partition.follower_silence``), for the balancer (``balance_steps.live_for_removal``)."""
        return self._part(pid).follower_silence()

    def epoch_cache(self, pid: int) -> tuple[tuple[int, int], ...]:
        return self._part(pid).cache.entries()

    def state(self, pid: int) -> PersistState:
        """The replication state as it stands (what the last ``persist`` of it said)."""
        p = self._part(pid)
        return PersistState(pid, p.term, p.vote, p.commit, p.cache.entries(), p.recovering, p.history.markers(),
                            p.vouch)

    def isr(self, pid: int) -> list[str]:
        """Replicas caught up within ``isr_lag_ticks`` (the leader's view; [] elsewhere)."""
        return self._part(pid).isr()

    def status(self, pid: int) -> dict:
        """What ``topic describe`` shows, msgpack-friendly (``store`` id, identity ``confirmed``)."""
        d = self._part(pid).describe()
        d["store"] = self.store_id
        d["confirmed"] = self.confirmed
        return d

    def leaders(self) -> list[int]:
        return [pid for pid in self._pids if self._parts[pid].role is Role.LEADER]

    # -- the host interface used by Partition (mesh.raft.partition.PartitionHost) ---------
    def send(self, dest: str, row: PeerRow, payload: bytes = b"") -> None:
        self._pending.out.add(dest, row, payload)

    def refuse(self, src: str, reason: str) -> None:
        self.refused_rows += 1
        if src in self._refusals or len(self._refusals) < 1024:
            self._refusals[src] = reason

    def take_refusals(self) -> dict[str, str]:
        """Peer -> why a row of it was refused, since the last call (the shell logs them)."""
        out, self._refusals = self._refusals, {}
        return out

    def log_op(self, op: LogOp) -> None:
        self._pending.log_ops.append(op)

    def state_changed(self, p: Partition) -> None:
        self._pending.persist.add(p.pid)

    def commit_changed(self, p: Partition) -> None:
        self._pending.committed.add(p.pid)

    def leader_changed(self, p: Partition) -> None:
        self._pending.leader_dirty.add(p.pid)
        if p.role is Role.LEADER:  # a new leader announces its config (it writes the gossip register)
            self._pending.cfg_announced.pop(p.pid, None)
            self._pending.cfg_dirty.add(p.pid)

    def want_flush(self, p: Partition) -> None:
        self._flush.add(p.pid)

    def config_changed(self, p: Partition) -> None:
        self._pending.cfg_dirty.add(p.pid)
        self._members_dirty = True

    def starved(self, p: Partition) -> None:
        self._starved.add(p.pid)

    def quiesced(self, p: Partition) -> None:
        del self._awake[bisect.bisect_left(self._awake, p.pid)]
        self._quiet.add(p)

    def unquiesced(self, p: Partition) -> None:
        bisect.insort(self._awake, p.pid)
        self._quiet.remove(p)

    def heard_tick(self, peer: str) -> int:
        return self._lives.heard_tick(peer)

    def quiet(self) -> int:
        """How many hosted partitions are quiet (not ticked)."""
        return len(self._pids) - len(self._awake)

    # -- output --------------------------------------------------------------------------
    def _send_data(self) -> None:
        if self._flush:
            pids, self._flush = sorted(self._flush), set()
            for pid in pids:
                p = self._parts.get(pid)
                if p is not None:
                    p.send_appends()

    def _ready(self) -> Ready:
        return self._pending.take(self._parts, self.state, self.store_id, self.life, self.cfg.max_rows_per_message,
                                  self.cfg.max_message_bytes)
