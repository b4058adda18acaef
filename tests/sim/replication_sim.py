"""Deterministic simulator for mesh.raft.manager: N brokers x P partitions, one seed.

    python -m tests.sim.replication_sim --seed 7 --steps 3000 [--brokers 3 --partitions 8]
    python -m tests.sim.replication_sim --seed 0 --seeds 1000 --steps 2000
    python -m tests.sim.replication_sim --idle-rate --partitions 1000

How it works
------------
The real ``ReplicaManager`` runs on every simulated broker; the simulator plays the node
shell and owns time, the network and the disks. One event heap ordered by (simulated
microseconds, sequence number), one ``random.Random`` for the world and one per broker
incarnation, seeded from strings: a run is a pure function of its arguments.

- A broker *turn* is the shell's loop turn: feed every message that has arrived, the ticks
  that elapsed, the produce requests; apply each ``Ready``'s storage effects to the staged
  view at once; ``flush()``; then group commit (the staged view becomes durable), then
  ``synced()``, then send the messages and answer produce requests whose batch committed.
  A broker may crash between staging and the sync: the turn's writes and messages vanish.
- Storage twin (``Store``): per partition a list of batches, durable and staged, plus the
  persisted ``PersistState``. Batches are self-describing byte strings (base, count,
  epoch, data), so the twin checks every ``Append`` the core asks for.
- Network: every message is encoded with ``mesh.wire.codec`` and decoded on delivery; loss,
  duplication, delay, slow messages (reordering), partitions (splits, isolation, one-way
  links), crashes (at a turn boundary or mid-turn), restarts from the durable twin, pauses
  (SIGSTOP: no ticks, messages queue, then a burst of ticks) and retention (the head of a
  log deleted below its persisted commit).
- Clients produce batches to whoever some broker believes leads; a batch is acknowledged
  when the leader's ``committed`` covers it after the turn's sync (acks=all).

Checkers, after every Ready and turn:
- election safety: at most one leader per (partition, epoch), ever;
- leader completeness: a new leader of epoch E holds every batch committed before E;
- committed batches never change or disappear: every replica's log, up to its commit
  offset, equals the canonical committed log; truncations never cut below commit;
- the core's state matches what it asked to persist, and its epoch cache matches the
  epochs stored in the batches;
- final phase: heal everything, restart and resume every broker; within a bound every
  partition must have one leader known to all replicas, identical logs and commit = end;
  a new batch per partition must commit; every acknowledged batch must be present; then
  leadership must move back to each partition's preferred replica.

A failure prints ``reproduce with: python -m tests.sim.replication_sim --seed N ...``.
"""
from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import random
import struct
import sys
import time
from dataclasses import dataclass

from mesh.wire.errors import MeshError
from mesh.raft.manager import (
    Append, PersistState, ReplicaManager, ReplicationConfig, ResetLog, Role, Truncate,
)
from mesh.wire.codec import decode_body, encode_body, op_of

__all__ = [
    "SimConfig", "Sim", "SimFailure", "Store", "PartLog", "run", "main", "encode_batch",
    "idle_messages_per_sec", "expected_idle_messages_per_sec",
]

_BATCH = struct.Struct(">qiiI")  # base offset, record count, epoch, data length
_US = 1000                       # microseconds per millisecond
_MAX_TICKS_PER_TURN = 40         # the shell caps the ticks it feeds after a stall
_MAX_INBOX_PER_TURN = 256        # and the messages it drains per turn


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


# -- configuration --------------------------------------------------------------------------

SIM_REPLICATION = ReplicationConfig(
    heartbeat_ticks=2, election_ticks=10, retransmit_ticks=6, rebalance_delay_ticks=40,
    isr_lag_ticks=40, housekeeping_ticks=20, max_inflight_msgs=4, max_inflight_bytes=4096,
    max_append_bytes=700, max_message_bytes=2048, max_rows_per_message=64,
)


@dataclass
class SimConfig:
    seed: int = 0
    steps: int = 2000              # broker turns in the fault phase
    brokers: int = 3
    partitions: int = 8
    rf: int = 3
    tick_ms: int = 50
    faults: bool = True
    clients: bool = True
    loss: float = 0.03
    dup: float = 0.02
    delay_ms: tuple[int, int] = (1, 12)
    slow_p: float = 0.03           # a message takes a slow path: reordering
    slow_ms: tuple[int, int] = (40, 700)
    fault_gap_ms: tuple[int, int] = (100, 1200)
    produce_gap_ms: tuple[int, int] = (3, 40)
    converge_ms: int = 30_000      # liveness bound after the heal
    rebalance_ms: int = 30_000     # preferred leaders back within this after convergence
    check_replicas: bool = True    # compare every replica's state with its disk after each turn
    replication: ReplicationConfig = SIM_REPLICATION

    def argv(self) -> str:
        return (f"--seed {self.seed} --steps {self.steps} --brokers {self.brokers} "
                f"--partitions {self.partitions}" + ("" if self.rf == 3 else f" --rf {self.rf}"))


# -- the simulated broker -----------------------------------------------------------------------

class Node:
    def __init__(self, nid: str, pids: list[int], tick_us: int, reads_staged: bool) -> None:
        self.id = nid
        self.pids = pids
        self.store = Store(pids, reads_staged)
        self.core: ReplicaManager | None = None
        self.up = False
        self.paused = False
        self.incarnation = 0
        self.tick_us = tick_us
        self.last_tick_us = 0
        self.inbox: list[tuple] = []
        self.produce_q: list[tuple] = []
        self.pending: dict[int, list[tuple]] = {pid: [] for pid in pids}  # (base, end, raw, key)
        self.commit_seen: dict[int, int] = {pid: 0 for pid in pids}
        self.turn_at_us: int | None = None
        self.crash_in_turn = False


class _Turn:
    """What a turn collected from the core's Readies, acted on after the sync."""
    __slots__ = ("messages", "committed", "leadership", "touched", "busy")

    def __init__(self) -> None:
        self.busy = False   # any input or output beyond empty ticks
        self.messages: list = []
        self.committed: dict[int, int] = {}
        self.leadership: dict[int, tuple] = {}
        self.touched: set[int] = set()


class Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"replication-sim/{cfg.seed}")
        self.now_us = 0
        self._events: list = []
        self._seq = 0
        self.steps_done = 0
        self.trace = hashlib.blake2b(digest_size=16)
        rf = min(cfg.rf, cfg.brokers)
        self.node_ids = [f"n{i}" for i in range(cfg.brokers)]
        self.pids = list(range(1, cfg.partitions + 1))
        self.replicas = {pid: [self.node_ids[(pid + k) % cfg.brokers] for k in range(rf)] for pid in self.pids}
        # two shells the contract allows: flush() before or after the group commit, with a
        # reader that does or does not see the turn's staged writes
        self.flush_before_sync = self.rng.random() < 0.5
        reads_staged = self.rng.random() < 0.5
        self.nodes: dict[str, Node] = {}
        for nid in self.node_ids:
            hosted = [pid for pid in self.pids if nid in self.replicas[pid]]
            tick_us = int(cfg.tick_ms * _US * self.rng.uniform(0.95, 1.05))  # clocks drift
            self.nodes[nid] = Node(nid, hosted, tick_us, reads_staged)
        self.cut: set[tuple[str, str]] = set()      # directed links that drop everything
        self.loss, self.dup, self.slow_p = cfg.loss, cfg.dup, cfg.slow_p
        self.faults_on, self.clients_on = cfg.faults, cfg.clients
        # checkers' memory
        self.leader_of_epoch: dict[tuple[int, int], str] = {}
        self.canon: dict[int, PartLog] = {pid: PartLog() for pid in self.pids}
        self.canon_term: dict[int, list[int]] = {pid: [] for pid in self.pids}
        self.acked: dict[str, tuple] = {}
        self.produced = 0
        self.refused = 0
        self.sent_messages: dict[str, int] = {nid: 0 for nid in self.node_ids}
        self.sent_rows: dict[str, int] = {nid: 0 for nid in self.node_ids}
        self.counts = {"crash": 0, "mid_turn_crash": 0, "pause": 0, "partition": 0, "retention": 0,
                       "resets": 0, "truncates": 0, "elections": 0}
        for nid in self.node_ids:
            self._start(self.nodes[nid])
            self._at(self.rng.randrange(self.nodes[nid].tick_us), "tick", nid)
        if self.faults_on:
            self._at(self._ms(*cfg.fault_gap_ms), "fault", None)
        if self.clients_on:
            self._at(self._ms(*cfg.produce_gap_ms), "produce", None)

    # -- plumbing ------------------------------------------------------------------------
    def _ms(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo * _US, hi * _US)

    def _at(self, delay_us: int, kind: str, arg) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now_us + delay_us, self._seq, kind, arg))

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.cfg.seed}, t={self.now_us / 1e6:.3f}s, step {self.steps_done}: {what}\n"
                         f"reproduce with: python -m tests.sim.replication_sim {self.cfg.argv()}")

    def _want_turn(self, node: Node, delay_us: int = 0) -> None:
        at = self.now_us + delay_us
        if node.turn_at_us is None or node.turn_at_us > at:
            node.turn_at_us = at
            self._at(delay_us, "turn", node.id)

    def _start(self, node: Node) -> None:
        node.incarnation += 1
        rng = random.Random(f"replication-sim/{self.cfg.seed}/{node.id}/{node.incarnation}")
        core = ReplicaManager(node.id, rng, self.cfg.replication, node.store)
        for pid in node.pids:
            log = node.store.live[pid]
            core.add_partition(pid, self.replicas[pid], node.store.live_state[pid], log.end)
            node.commit_seen[pid] = core.commit_offset(pid)
            self._check_committed(node, pid, node.commit_seen[pid])
        node.core, node.up, node.paused = core, True, False
        node.last_tick_us = self.now_us
        node.inbox, node.produce_q, node.turn_at_us = [], [], None
        node.pending = {pid: [] for pid in node.pids}

    # -- the event loop --------------------------------------------------------------------
    def run_steps(self, steps: int) -> None:
        while self.steps_done < steps and self._events:
            self._event()

    def run_until(self, done, limit_us: int, what: str, check_every_us: int = 100 * _US) -> None:
        deadline = self.now_us + limit_us
        next_check = self.now_us
        while True:
            if self.now_us >= next_check:
                if done():
                    return
                next_check = self.now_us + check_every_us
            if self.now_us > deadline or not self._events:
                self.fail(f"liveness: {what} not reached within {limit_us / 1e6:.0f}s of simulated time")
            self._event()

    def _event(self) -> None:
        t, _, kind, arg = heapq.heappop(self._events)
        self.now_us = t
        self.trace.update(f"{t}:{kind}:{arg if isinstance(arg, str) else ''};".encode())
        if kind == "turn":
            node = self.nodes[arg]
            if node.turn_at_us == t:
                node.turn_at_us = None
                self._turn(node)
        elif kind == "tick":
            node = self.nodes[arg]
            self._at(node.tick_us, "tick", arg)
            self._want_turn(node)
        elif kind == "arrive":
            dest, src, op, body, payload = arg
            node = self.nodes[dest]
            if node.up and (src, dest) not in self.cut:
                node.inbox.append((src, op, body, payload))
                self._want_turn(node)
        elif kind == "produce":
            self._produce()
            self._at(self._ms(*self.cfg.produce_gap_ms), "produce", None)
        elif kind == "fault":
            if self.faults_on:
                self._fault()
                self._at(self._ms(*self.cfg.fault_gap_ms), "fault", None)
        elif kind == "restart":
            node = self.nodes[arg]
            if not node.up:
                self._start(node)
                self._want_turn(node)
        elif kind == "resume":
            node = self.nodes[arg]
            if node.up and node.paused:
                node.paused = False
                self._want_turn(node)
        else:
            raise AssertionError(kind)

    # -- a broker's loop turn --------------------------------------------------------------
    def _turn(self, node: Node) -> None:
        if not node.up or node.paused:
            return
        self.steps_done += 1
        core, turn = node.core, _Turn()
        inbox, node.inbox = node.inbox[:_MAX_INBOX_PER_TURN], node.inbox[_MAX_INBOX_PER_TURN:]
        turn.busy = bool(inbox or node.produce_q)
        if node.inbox:
            self._want_turn(node, 1)
        for src, op, body, payload in inbox:
            self._apply(node, turn, core.step(src, decode_body(op, body), payload))
        ticks = (self.now_us - node.last_tick_us) // node.tick_us
        node.last_tick_us += ticks * node.tick_us
        for _ in range(min(ticks, _MAX_TICKS_PER_TURN)):
            self._apply(node, turn, core.tick())
        staged = self._stage_produce(node, turn)
        if self.flush_before_sync:
            self._apply(node, turn, core.flush())
        if node.crash_in_turn:
            self._crash(node, mid_turn=True)
            return
        node.store.sync()
        for pid in sorted(staged):
            self._apply(node, turn, core.synced(pid, node.store.live[pid].end))
        if not self.flush_before_sync:
            self._apply(node, turn, core.flush())
        for send in turn.messages:
            self._send(node.id, send)
        self._after_turn(node, turn)

    def _stage_produce(self, node: Node, turn: _Turn) -> set[int]:
        staged: set[int] = set()
        queue, node.produce_q = node.produce_q, []
        for pid, key, count, data in queue:
            if pid not in node.store.live:
                self.refused += 1
                continue
            try:
                base, epoch = node.core.append_position(pid)
            except MeshError:
                self.refused += 1
                continue
            log = node.store.live[pid]
            if base != log.end:
                self.fail(f"{node.id} p{pid}: append_position {base} but the log ends at {log.end}")
            raw = encode_batch(base, count, epoch, data)
            log.append([(base, base + count, epoch, raw)])
            node.store.dirty.add(pid)
            node.core.leader_append(pid, base + count, epoch)
            node.pending[pid].append((base, base + count, raw, key))
            staged.add(pid)
            turn.touched.add(pid)
        return staged

    def _apply(self, node: Node, turn: _Turn, rd) -> None:
        """Carry out one Ready: storage effects now (staged), the rest after the sync."""
        if not rd:
            return
        turn.busy = True
        store = node.store
        for op in rd.log_ops:
            pid = op.pid
            log = store.live[pid]
            store.dirty.add(pid)
            turn.touched.add(pid)
            if type(op) is Append:
                if op.base_offset != log.end:
                    self.fail(f"{node.id} p{pid}: Append at {op.base_offset} but the log ends at {log.end}")
                batches = list(iter_batches(op.payload))
                if log.batches and log.batches[-1][2] > op.epoch:
                    self.fail(f"{node.id} p{pid}: Append of epoch {op.epoch} after a batch of epoch "
                              f"{log.batches[-1][2]}")
                at = op.base_offset
                for base, end, epoch, _ in batches:
                    if base != at or epoch != op.epoch:
                        self.fail(f"{node.id} p{pid}: Append {op} holds batch {base}..{end} epoch {epoch}")
                    at = end
                if at != op.end_offset:
                    self.fail(f"{node.id} p{pid}: Append says end {op.end_offset}, batches end at {at}")
                log.append(batches)
            elif type(op) is Truncate:
                self.counts["truncates"] += 1
                if op.to_offset < node.commit_seen[pid] or not log.is_boundary(op.to_offset):
                    self.fail(f"{node.id} p{pid}: Truncate to {op.to_offset}: commit {node.commit_seen[pid]}, "
                              f"log {log.start}..{log.end}")
                log.truncate(op.to_offset)
                node.pending[pid] = [p for p in node.pending[pid] if p[1] <= op.to_offset]
            elif type(op) is ResetLog:
                self.counts["resets"] += 1
                if op.start_offset <= node.commit_seen[pid] or op.start_offset > self.canon[pid].end:
                    self.fail(f"{node.id} p{pid}: ResetLog to {op.start_offset}: commit "
                              f"{node.commit_seen[pid]}, committed log ends {self.canon[pid].end}")
                log.reset(op.start_offset)
                node.pending[pid] = []
            else:
                self.fail(f"unknown log op {op!r}")
        for st in rd.persist:
            store.live_state[st.pid] = st
            store.dirty.add(st.pid)
            turn.touched.add(st.pid)
        turn.messages.extend(rd.messages)
        turn.committed.update(rd.committed)
        for pid, (leader, epoch) in rd.leadership.items():
            turn.leadership[pid] = (leader, epoch)
            if leader == node.id:
                self.counts["elections"] += 1
                other = self.leader_of_epoch.setdefault((pid, epoch), node.id)
                if other != node.id:
                    self.fail(f"election safety: p{pid} epoch {epoch} has leaders {other} and {node.id}")
                self._check_leader_completeness(node, pid, epoch)

    def _after_turn(self, node: Node, turn: _Turn) -> None:
        core = node.core
        for pid, (leader, _) in turn.leadership.items():
            if leader != node.id:
                node.pending[pid] = []  # the shell answers NOT_LEADER
        for pid, commit in sorted(turn.committed.items()):
            if commit < node.commit_seen[pid]:
                self.fail(f"{node.id} p{pid}: commit went back from {node.commit_seen[pid]} to {commit}")
            node.commit_seen[pid] = commit
            self._check_committed(node, pid, commit, term=core.leader(pid)[1])
            if core.role(pid) is Role.LEADER:
                keep = []
                log = node.store.live[pid]
                for base, end, raw, key in node.pending[pid]:
                    if end > commit:
                        keep.append((base, end, raw, key))
                        continue
                    i = bisect.bisect_left(log.bases, base)
                    if i == len(log.bases) or log.batches[i][3] != raw:
                        self.fail(f"{node.id} p{pid}: acked batch {key} at {base} is not in the leader's log")
                    self.acked[key] = (pid, base, end, raw)
                node.pending[pid] = keep
        if turn.busy and self.cfg.check_replicas:
            for pid in node.pids:
                self._check_replica(node, pid, deep=pid in turn.touched)

    # -- checkers ------------------------------------------------------------------------------
    def _check_committed(self, node: Node, pid: int, commit: int, term: int = 0) -> None:
        """The node's log below ``commit`` must equal the canonical committed log; what it
        has beyond the canonical end becomes canonical."""
        log, canon = node.store.live[pid], self.canon[pid]
        if commit > log.end:
            self.fail(f"{node.id} p{pid}: commit {commit} beyond its log end {log.end}")
        if commit <= log.start:
            return
        if not log.is_boundary(commit):
            self.fail(f"{node.id} p{pid}: commit {commit} is not a batch boundary")
        mine = log.upto(commit)
        ci = bisect.bisect_left(canon.bases, log.start)
        if log.start > canon.end or (log.start < canon.end and canon.bases[ci] != log.start):
            self.fail(f"{node.id} p{pid}: log start {log.start} does not line up with the committed log "
                      f"(ends {canon.end})")
        k = min(len(mine), len(canon.batches) - ci)
        if mine[:k] != canon.batches[ci:ci + k]:
            bad = next(i for i in range(k) if mine[i] != canon.batches[ci + i])
            self.fail(f"{node.id} p{pid}: committed batch at {mine[bad][0]} differs from the committed "
                      f"log: {mine[bad][:3]} vs {canon.batches[ci + bad][:3]}")
        if len(mine) > k:
            canon.append(mine[k:])
            self.canon_term[pid].extend([term] * (len(mine) - k))

    def _check_leader_completeness(self, node: Node, pid: int, epoch: int) -> None:
        log, canon, terms = node.store.live[pid], self.canon[pid], self.canon_term[pid]
        n = next((i for i, t in enumerate(terms) if t >= epoch), len(terms))
        upto = canon.batches[n - 1][1] if n else 0
        if upto <= log.start:
            return
        if log.end < upto or log.upto(upto) != canon.batches[bisect.bisect_left(canon.bases, log.start):n]:
            self.fail(f"leader completeness: {node.id} leads p{pid} in epoch {epoch} without the batches "
                      f"committed before it (committed up to {upto}, its log {log.start}..{log.end})")

    def _check_replica(self, node: Node, pid: int, deep: bool) -> None:
        """The core's state is what it asked to persist; with ``deep``, its epoch cache also
        matches the epochs of the stored batches."""
        core, log = node.core, node.store.live[pid]
        now = core.state(pid)
        end = core.end_offset(pid)
        if end != log.end or now.commit > end:
            self.fail(f"{node.id} p{pid}: core end {end} commit {now.commit}, log ends {log.end}")
        saved = node.store.live_state[pid]
        if saved != now and not (saved is None and now == PersistState(pid, 0, None, 0, ())):
            self.fail(f"{node.id} p{pid}: persisted {saved} but the core holds {now}")
        cache = now.epoch_cache
        if cache and cache[-1][0] > now.term:
            self.fail(f"{node.id} p{pid}: epoch cache {cache} ahead of term {now.term}")
        if not deep:
            return
        # every stored batch carries the epoch the cache says (batch epochs never decrease
        # along a log - checked at append - so the first and last batch of each range suffice)
        if log.batches and not cache:
            self.fail(f"{node.id} p{pid}: batches but an empty epoch cache")
        for i, (epoch, start) in enumerate(cache):
            lo = bisect.bisect_left(log.bases, start) if i else 0
            hi = bisect.bisect_left(log.bases, cache[i + 1][1]) if i + 1 < len(cache) else len(log.bases)
            for j in (lo, hi - 1) if lo < hi else ():
                if log.batches[j][2] != epoch:
                    self.fail(f"{node.id} p{pid}: batch at {log.bases[j]} has epoch {log.batches[j][2]}, "
                              f"epoch cache {cache}")

    # -- clients -----------------------------------------------------------------------------
    def _produce(self) -> None:
        if not self.clients_on:
            return
        pid = self.rng.choice(self.pids)
        target = None
        if self.rng.random() < 0.85:
            seer = self.nodes[self.rng.choice(self.replicas[pid])]
            if seer.up:
                target = seer.core.leader(pid)[0]
        if target is None:
            target = self.rng.choice(self.replicas[pid])
        self.produce_to(target, pid)

    def produce_to(self, target: str, pid: int) -> str:
        self.produced += 1
        key = f"p{pid}/b{self.produced}"
        count = self.rng.randint(1, 4)
        data = (key.encode() + b"|") * self.rng.randint(1, 12)
        node = self.nodes[target]
        if node.up:
            node.produce_q.append((pid, key, count, data))
            self._want_turn(node, self._ms(*self.cfg.delay_ms))
        return key

    # -- network -----------------------------------------------------------------------------
    def _send(self, src: str, send) -> None:
        dest = send.dest
        body = encode_body(send.msg)
        op = op_of(send.msg)
        self.sent_messages[src] += 1
        self.sent_rows[src] += len(send.msg.rows)
        if (src, dest) in self.cut or self.rng.random() < self.loss:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            if self.rng.random() < self.slow_p:
                delay = self._ms(*self.cfg.slow_ms)
            else:
                delay = self._ms(*self.cfg.delay_ms)
            self._at(delay, "arrive", (dest, src, op, body, send.payload))

    # -- faults -----------------------------------------------------------------------------
    def _fault(self) -> None:
        r = self.rng.random()
        nodes = self.node_ids
        if r < 0.15:
            self.cut = set()
            side = set(self.rng.sample(nodes, self.rng.randint(1, max(1, len(nodes) - 1))))
            self.cut = {(a, b) for a in nodes for b in nodes if (a in side) != (b in side)}
            self.counts["partition"] += 1
        elif r < 0.22:
            a, b = self.rng.sample(nodes, 2) if len(nodes) > 1 else (nodes[0], nodes[0])
            self.cut.add((a, b))  # one-way
            self.counts["partition"] += 1
        elif r < 0.40:
            self.cut = set()
        elif r < 0.55:
            node = self.nodes[self.rng.choice(nodes)]
            if node.up:
                if self.rng.random() < 0.5:
                    node.crash_in_turn = True
                    self._want_turn(node)
                else:
                    self._crash(node, mid_turn=False)
        elif r < 0.65:
            node = self.nodes[self.rng.choice(nodes)]
            if node.up and not node.paused:
                node.paused = True
                self.counts["pause"] += 1
                self._at(self._ms(200, 3000), "resume", node.id)
        elif r < 0.80:
            self._retention()
        # else: a quiet spell

    def _crash(self, node: Node, mid_turn: bool) -> None:
        self.counts["mid_turn_crash" if mid_turn else "crash"] += 1
        node.store.crash()
        node.up, node.core, node.crash_in_turn, node.paused = False, None, False, False
        node.inbox, node.produce_q = [], []
        node.pending = {pid: [] for pid in node.pids}
        self._at(self._ms(100, 3000), "restart", node.id)

    def _retention(self) -> None:
        """Time-based retention on every live replica of a partition: each deletes head
        batches below its persisted commit (to its newest committed batch, half the time)."""
        pid = self.rng.choice(self.pids)
        newest = self.rng.random() < 0.5
        for nid in self.replicas[pid]:
            node = self.nodes[nid]
            saved = node.store.durable_state[pid]
            if not node.up or saved is None or pid in node.store.dirty:
                continue
            log = node.store.live[pid]
            limit = min(saved.commit, node.commit_seen[pid])
            cands = [b[0] for b in log.batches if log.start < b[0] <= limit]
            if not cands:
                continue
            new_start = cands[-1] if newest else self.rng.choice(cands)
            log.trim_head(new_start)
            node.store.durable[pid].trim_head(new_start)
            self.counts["retention"] += 1

    # -- the final phase: heal, converge, check ---------------------------------------------------
    def heal(self) -> None:
        self.faults_on = self.clients_on = False
        self.cut = set()
        self.loss = self.dup = 0.0
        for nid in self.node_ids:
            node = self.nodes[nid]
            node.crash_in_turn = False
            if not node.up:
                self._start(node)
            node.paused = False
            self._want_turn(node)

    def converged(self) -> bool:
        for pid in self.pids:
            reps = [self.nodes[r] for r in self.replicas[pid]]
            if not all(n.up for n in reps):
                return False
            leaders = [n for n in reps if n.core.role(pid) is Role.LEADER]
            if len(leaders) != 1:
                return False
            lead = leaders[0]
            view = lead.core.leader(pid)
            end = lead.core.end_offset(pid)
            for n in reps:
                if n.core.leader(pid) != view or n.core.end_offset(pid) != end or n.core.commit_offset(pid) != end:
                    return False
        return True

    def balanced(self) -> bool:
        return all(self.nodes[self.replicas[pid][0]].core.role(pid) is Role.LEADER for pid in self.pids)

    def finish(self) -> None:
        cfg = self.cfg
        self.heal()
        self.run_until(self.converged, cfg.converge_ms * _US, "one leader per partition, all replicas caught up")
        # write liveness: a new batch per partition commits (the client retries every 200 ms,
        # as a refused request - NOT_LEADER during a leadership transfer - is retriable)
        keys: dict[int, list[str]] = {pid: [] for pid in self.pids}

        def written() -> bool:
            missing = [pid for pid in self.pids if not any(k in self.acked for k in keys[pid])]
            for pid in missing:
                lead = next((r for r in self.replicas[pid] if self.nodes[r].core.role(pid) is Role.LEADER),
                            self.replicas[pid][0])
                keys[pid].append(self.produce_to(lead, pid))
            return not missing

        self.run_until(written, 10_000 * _US, "every partition acknowledging a new batch",
                       check_every_us=200 * _US)
        self.run_until(self.converged, cfg.converge_ms * _US, "convergence after the last writes")
        self._check_final_logs()
        self.run_until(self.balanced, cfg.rebalance_ms * _US, "leadership back on the preferred replicas")

    def _check_final_logs(self) -> None:
        for pid in self.pids:
            canon = self.canon[pid]
            for r in self.replicas[pid]:
                node = self.nodes[r]
                self._check_committed(node, pid, node.core.commit_offset(pid))
                log = node.store.live[pid]
                if log.end != canon.end:
                    self.fail(f"{r} p{pid}: log ends at {log.end}, the committed log at {canon.end}")
        for key, (pid, base, end, raw) in sorted(self.acked.items()):
            canon = self.canon[pid]
            i = bisect.bisect_left(canon.bases, base)
            if i == len(canon.bases) or canon.batches[i][3] != raw:
                self.fail(f"acknowledged batch {key} (p{pid} at {base}) is not in the committed log")
            for r in self.replicas[pid]:
                log = self.nodes[r].store.live[pid]
                if base >= log.start:
                    j = bisect.bisect_left(log.bases, base)
                    if j == len(log.bases) or log.batches[j][3] != raw:
                        self.fail(f"acknowledged batch {key} (p{pid} at {base}) is missing on {r}")

    def summary(self) -> str:
        c = self.counts
        return (f"seed {self.cfg.seed}: {self.steps_done} turns, {self.now_us / 1e6:.1f}s simulated, "
                f"{len(self.acked)}/{self.produced} batches acked ({self.refused} refused), "
                f"{c['elections']} leaderships, {c['crash']}+{c['mid_turn_crash']} crashes, "
                f"{c['pause']} pauses, {c['partition']} partitions, {c['truncates']} truncations, "
                f"{c['retention']} retention cuts, {c['resets']} log resets, trace {self.trace.hexdigest()[:12]}")


def run(cfg: SimConfig) -> Sim:
    """One seeded run: faults for ``cfg.steps`` broker turns, then heal and check."""
    sim = Sim(cfg)
    try:
        sim.run_steps(cfg.steps)
        sim.finish()
    except SimFailure:
        raise
    except Exception as exc:  # an assertion inside the core is a failure of this seed too
        raise SimFailure(f"seed {cfg.seed}, t={sim.now_us / 1e6:.3f}s, step {sim.steps_done}: "
                         f"{type(exc).__name__}: {exc}\n"
                         f"reproduce with: python -m tests.sim.replication_sim {cfg.argv()}") from exc
    return sim


# -- idle message rate (MultiRaft coalescing) -----------------------------------------------------

def expected_idle_messages_per_sec(brokers: int, partitions: int, rf: int, tick_ms: int = 50,
                                   heartbeat_ticks: int = 2) -> dict:
    """Messages per second an idle cluster sends, with leaders on the preferred replicas
    (placement as in this simulator): per beat each broker sends one heartbeat to every
    peer following one of its partitions and one response to every peer leading one of its
    partitions. ``uncoalesced`` is what one message per partition would cost."""
    beats = 1000 / (tick_ms * heartbeat_ticks)
    nodes = [f"n{i}" for i in range(brokers)]
    rf = min(rf, brokers)
    pairs: set[tuple[str, str]] = set()
    rows = 0
    for pid in range(1, partitions + 1):
        reps = [nodes[(pid + k) % brokers] for k in range(rf)]
        for f in reps[1:]:
            pairs.add((reps[0], f))
            rows += 1
    per_broker = {n: beats * (sum(1 for a, _ in pairs if a == n) + sum(1 for _, b in pairs if b == n))
                  for n in nodes}
    return {"per_broker": max(per_broker.values()), "cluster": sum(per_broker.values()),
            "uncoalesced_per_broker": beats * 2 * rows / brokers, "uncoalesced_cluster": beats * 2 * rows}


def idle_messages_per_sec(brokers: int = 3, partitions: int = 1000, rf: int = 3, seconds: float = 10.0,
                          seed: int = 0, config: ReplicationConfig | None = None) -> dict:
    """Measure it: elect and balance leaders with no faults and no clients, then count the
    messages sent during ``seconds`` of idle simulated time."""
    rcfg = config or ReplicationConfig()
    cfg = SimConfig(seed=seed, brokers=brokers, partitions=partitions, rf=rf, faults=False, clients=False,
                    loss=0.0, dup=0.0, slow_p=0.0, replication=rcfg, check_replicas=False)
    sim = Sim(cfg)
    sim.run_until(lambda: sim.converged() and sim.balanced(), 120_000 * _US, "idle cluster balanced")
    start = sim.now_us
    before_m, before_r = dict(sim.sent_messages), dict(sim.sent_rows)
    end = start + int(seconds * 1e6)
    while sim._events and sim._events[0][0] <= end:
        sim._event()
    msgs = {n: (sim.sent_messages[n] - before_m[n]) / seconds for n in sim.node_ids}
    rows = {n: (sim.sent_rows[n] - before_r[n]) / seconds for n in sim.node_ids}
    return {"per_broker": max(msgs.values()), "cluster": sum(msgs.values()),
            "rows_per_broker": max(rows.values()), "rows_cluster": sum(rows.values())}


# -- command line -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.replication_sim",
                                description="Deterministic simulation of mesh.raft.manager.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    p.add_argument("--steps", type=int, default=2000, help="broker turns with faults before the heal")
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=None, help="default 8 (1,000 with --idle-rate)")
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--idle-rate", action="store_true",
                   help="measure idle messages/s per broker (defaults: 1,000 partitions, production config)")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.idle_rate:
        parts = args.partitions or 1000
        t0 = time.perf_counter()
        got = idle_messages_per_sec(args.brokers, parts, args.rf, seed=args.seed)
        exp = expected_idle_messages_per_sec(args.brokers, parts, args.rf)
        print(f"{parts} partitions x RF{args.rf} on {args.brokers} brokers, tick 50 ms, heartbeat every 2 ticks:")
        print(f"  measured: {got['per_broker']:.0f} messages/s per broker ({got['cluster']:.0f}/s cluster), "
              f"carrying {got['rows_per_broker']:.0f} partition rows/s per broker")
        print(f"  expected: {exp['per_broker']:.0f} messages/s per broker ({exp['cluster']:.0f}/s cluster); "
              f"one message per partition would be {exp['uncoalesced_per_broker']:.0f}/s per broker")
        print(f"  ({time.perf_counter() - t0:.1f}s wall)")
        return 0
    failures = 0
    t0 = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        cfg = SimConfig(seed=seed, steps=args.steps, brokers=args.brokers, partitions=args.partitions or 8,
                        rf=args.rf, faults=not args.no_faults)
        try:
            sim = run(cfg)
        except SimFailure as exc:
            failures += 1
            print(f"FAIL {exc}", file=sys.stderr)
            continue
        if not args.quiet:
            print(sim.summary())
    print(f"{args.seeds - failures}/{args.seeds} seeds passed in {time.perf_counter() - t0:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
