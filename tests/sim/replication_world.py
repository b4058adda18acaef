"""The replication simulator's world: brokers, clients, faults, on the shared simulated network.

See tests/sim/replication_sim.py for the theory of operation. ``Sim`` plays the node shell
for the real ``ReplicaManager`` of every broker; ``SimNet`` (mesh.testing.simnet) owns time
(microseconds) and the network; ``SimDisk`` (replication_disk) is each broker's disk;
``Checkers`` (replication_checks) the invariants.
"""
from __future__ import annotations

import bisect
import hashlib
import random
from dataclasses import dataclass

from mesh.raft import Append, CutHead, ReplicaManager, ReplicationConfig, ResetLog, Role, Truncate
from mesh.testing.simnet import DELIVER, SimNet
from mesh.wire.codec import decode_body, encode_body, op_of
from mesh.wire.errors import MeshError
from tests.sim.replication_checks import Checkers
from tests.sim.replication_disk import SimDisk, batches_of
from tests.sim.replication_store import PartLog, SimFailure

__all__ = ["SIM_REPLICATION", "SimConfig", "Node", "Sim", "US"]

US = 1000                        # microseconds per millisecond: the clock counts microseconds
_MAX_TICKS_PER_TURN = 40         # the shell caps the ticks it feeds after a stall
_MAX_INBOX_PER_TURN = 256        # and the messages it drains per turn


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
    disk_faults: bool = False      # wipe / roll back / corrupt one broker's disk at a time
    identity_ms: tuple[int, int] = (20, 400)  # a restarted broker learns from gossip whether it lost state
    replication: ReplicationConfig = SIM_REPLICATION

    def argv(self) -> str:
        return (f"--seed {self.seed} --steps {self.steps} --brokers {self.brokers} "
                f"--partitions {self.partitions}" + ("" if self.rf == 3 else f" --rf {self.rf}")
                + (" --disk-faults" if self.disk_faults else ""))


# -- the simulated broker -----------------------------------------------------------------------

class Node:
    def __init__(self, nid: str, pids: list[int], tick_us: int, reads_staged: bool, store_id: str) -> None:
        self.id = nid
        self.pids = pids
        self.store = SimDisk(pids, reads_staged, store_id)
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
        # disk faults (issue 17)
        self.snaps: list[tuple] = []           # rollback points (durable disk at some syncs)
        self.disk_fault: str | None = None     # applied at the next restart
        self.lost_state = False                # the disk forgot: gossip will say so
        self.identity_due = False              # gossip's answer arrives at the next turn
        self.corrupt: tuple[int, int] | None = None  # (pid, offset) found at recovery
        self.lost: dict[int, int] = {}         # pid -> offset it must hold again before it may lead
        self.cut: set[int] = set()             # pids it cut for corruption (in this life)


class _Turn:
    """What a turn collected from the core's Readies, acted on after the sync."""
    __slots__ = ("messages", "committed", "leadership", "touched", "busy", "configs", "declared_lost")

    def __init__(self) -> None:
        self.busy = False   # any input or output beyond empty ticks
        self.messages: list = []
        self.committed: dict[int, int] = {}
        self.leadership: dict[int, tuple] = {}
        self.touched: set[int] = set()
        self.configs: dict[int, tuple] = {}
        self.declared_lost = False


class Sim(Checkers):
    MODULE = "tests.sim.replication_sim"  # the command line that replays a seed
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"replication-sim/{cfg.seed}")
        self.net = SimNet(f"replication-sim/{cfg.seed}/net", loss=cfg.loss, dup=cfg.dup,
                          delay=(cfg.delay_ms[0] * US, cfg.delay_ms[1] * US), slow_p=cfg.slow_p,
                          slow=(cfg.slow_ms[0] * US, cfg.slow_ms[1] * US))
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
            tick_us = int(cfg.tick_ms * US * self.rng.uniform(0.95, 1.05))  # clocks drift
            self.nodes[nid] = Node(nid, hosted, tick_us, reads_staged, self._new_store_id())
        self.faults_on, self.clients_on = cfg.faults, cfg.clients
        # checkers' memory
        self.leader_of_epoch: dict[tuple[int, int], str] = {}
        self.canon: dict[int, PartLog] = {pid: PartLog() for pid in self.pids}
        self.canon_term: dict[int, list[int]] = {pid: [] for pid in self.pids}
        self.acked: dict[str, tuple] = {}
        self.acked_end: dict[int, int] = {}   # pid -> the end of its last acknowledged batch
        self.produced = 0
        self.refused = 0
        self.sent_messages: dict[str, int] = {nid: 0 for nid in self.node_ids}
        self.sent_rows: dict[str, int] = {nid: 0 for nid in self.node_ids}
        self.counts = {"crash": 0, "mid_turn_crash": 0, "pause": 0, "partition": 0, "retention": 0,
                       "resets": 0, "truncates": 0, "cuts": 0, "elections": 0, "wipe": 0, "rollback": 0, "corrupt": 0,
                       "stale_hw": 0}
        self.disk_faulted: str | None = None  # at most one broker's disk at a time
        for nid in self.node_ids:
            self._start(self.nodes[nid])
            self._at(self.rng.randrange(self.nodes[nid].tick_us), "tick", nid)
        if self.faults_on:
            self._at(self._ms(*cfg.fault_gap_ms), "fault", None)
        if self.clients_on:
            self._at(self._ms(*cfg.produce_gap_ms), "produce", None)

    # -- plumbing ------------------------------------------------------------------------
    def _ms(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo * US, hi * US)

    @property
    def now_us(self) -> int:
        return self.net.now

    def _at(self, delay_us: int, kind: str, arg) -> None:
        self.net.call_after(delay_us, kind, arg)

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.cfg.seed}, t={self.now_us / 1e6:.3f}s, step {self.steps_done}: {what}\n"
                         f"reproduce with: python -m {self.MODULE} {self.cfg.argv()}")

    def _want_turn(self, node: Node, delay_us: int = 0) -> None:
        at = self.now_us + delay_us
        if node.turn_at_us is None or node.turn_at_us > at:
            node.turn_at_us = at
            self._at(delay_us, "turn", node.id)

    def _new_store_id(self) -> str:
        return "%016x" % self.rng.getrandbits(64)

    def _start(self, node: Node) -> None:
        node.incarnation += 1
        rng = random.Random(f"replication-sim/{self.cfg.seed}/{node.id}/{node.incarnation}")
        # unconfirmed until gossip answers (the "identity" event, a little later)
        core = ReplicaManager(node.id, rng, self.cfg.replication, node.store, store_id=node.store.store_id,
                              confirmed=False)
        for pid in node.pids:
            log = node.store.live[pid]
            core.add_partition(pid, self.initial_config(node, pid), node.store.live_state[pid], log.end)
            node.commit_seen[pid] = core.commit_offset(pid)
            self._check_committed(node, pid, node.commit_seen[pid])
        self.net.restart(node.id)
        node.core, node.up, node.paused = core, True, False
        node.last_tick_us = self.now_us
        node.inbox, node.produce_q, node.turn_at_us = [], [], None
        node.pending = {pid: [] for pid in node.pids}
        node.identity_due = False
        node.cut = set()
        self._at(self._ms(*self.cfg.identity_ms), "identity", (node.id, node.incarnation))

    # -- the event loop --------------------------------------------------------------------
    def run_steps(self, steps: int) -> None:
        while self.steps_done < steps and self.net.next_time() is not None:
            self._event()

    def run_until(self, done, limit_us: int, what: str, check_every_us: int = 100 * US) -> None:
        deadline = self.now_us + limit_us
        next_check = self.now_us
        while True:
            if self.now_us >= next_check:
                if done():
                    return
                next_check = self.now_us + check_every_us
            if self.now_us > deadline or self.net.next_time() is None:
                self.fail(f"liveness: {what} not reached within {limit_us / 1e6:.0f}s of simulated time")
            self._event()

    def _event(self) -> None:
        ev = self.net.pop()
        if ev is None:
            return
        kind, arg, _, payload = ev
        t = self.now_us
        if kind is DELIVER:
            kind, arg = "arrive", (ev[2], arg) + payload   # (dest, src, op, body, payload)
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
            if node.up:
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
                if node.disk_fault is not None:
                    self._damage_disk(node)
                self._start(node)
                self._want_turn(node)
        elif kind == "identity":
            node = self.nodes[arg[0]]
            if node.up and node.incarnation == arg[1]:
                node.identity_due = True
                self._want_turn(node)
        elif kind == "resume":
            node = self.nodes[arg]
            if node.up and node.paused:
                node.paused = False
                self.net.resume(node.id)
                self._want_turn(node)
        else:
            self.on_event(kind, arg)

    def on_event(self, kind: str, arg) -> None:
        """An event kind a subclass scheduled (the base has none)."""
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
        if node.corrupt is not None:  # found by the store's recovery check
            self._report_corrupt(node, turn, *node.corrupt)
            node.corrupt = None
        if node.identity_due:  # gossip: our identity is the newest, or the cluster remembers more
            node.identity_due = False
            self._apply(node, turn, core.declare_lost_state() if node.lost_state else core.confirm_identity())
            turn.declared_lost = node.lost_state
            turn.busy = True
        self.shell_turn(node, turn)
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
        if turn.declared_lost:
            # durable now (the shell writes its identity file, recovering, before it speaks):
            # a later plain restart finds its own generation the newest. A crash before this
            # sync leaves it lost: the next life declares it again (storage.datadir).
            node.lost_state = False
        if self.cfg.disk_faults and self.rng.random() < 0.03:
            node.snaps = node.snaps[-3:] + [node.store.snapshot()]
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
        for pid, key, values in queue:
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
            at, end, raw = node.store.stage_produce(pid, values, epoch, self.now_us // US)
            if at != base:
                self.fail(f"{node.id} p{pid}: the store appended at {at}, the core expected {base}")
            node.core.leader_append(pid, end, epoch)
            node.pending[pid].append((base, end, raw, key))
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
                batches = batches_of(op.payload)
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
                store.stage_append(pid, op.payload, batches)
            elif type(op) is Truncate:
                self.counts["truncates"] += 1
                below_ok = node.corrupt is not None and node.corrupt[0] == pid  # a corrupt range: the one case
                if (op.to_offset < node.commit_seen[pid] and not below_ok) or not log.is_boundary(op.to_offset):
                    self.fail(f"{node.id} p{pid}: Truncate to {op.to_offset}: commit {node.commit_seen[pid]}, "
                              f"log {log.start}..{log.end}")
                store.stage_truncate(pid, op.to_offset)
                node.pending[pid] = [p for p in node.pending[pid] if p[1] <= op.to_offset]
            elif type(op) is ResetLog:
                self.counts["resets"] += 1
                if op.start_offset <= node.commit_seen[pid] or op.start_offset > self.canon[pid].end:
                    self.fail(f"{node.id} p{pid}: ResetLog to {op.start_offset}: commit "
                              f"{node.commit_seen[pid]}, committed log ends {self.canon[pid].end}")
                store.stage_reset(pid, op.start_offset)
                node.pending[pid] = []
            elif type(op) is CutHead:
                self.counts["cuts"] += 1
                commit = max(node.commit_seen[pid], rd.committed.get(pid, 0), turn.committed.get(pid, 0))
                if op.offset > commit or op.offset > self.canon[pid].end:
                    self.fail(f"{node.id} p{pid}: CutHead to {op.offset} above its commit {commit}")
                store.stage_cut_head(pid, op.offset)
            else:
                self.fail(f"unknown log op {op!r}")
        for st in rd.persist:
            store.stage_state(st)
            turn.touched.add(st.pid)
        turn.messages.extend(rd.messages)
        turn.committed.update(rd.committed)
        turn.configs.update(rd.configs)
        for pid, (leader, epoch) in rd.leadership.items():
            turn.leadership[pid] = (leader, epoch)
            if leader == node.id:
                self.counts["elections"] += 1
                other = self.leader_of_epoch.setdefault((pid, epoch), node.id)
                if other != node.id:
                    self.fail(f"election safety: p{pid} epoch {epoch} has leaders {other} and {node.id}")
                self._check_not_lost(node, pid, "elected")
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
                self._check_counted(node, pid)
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
                    self.acked_end[pid] = max(self.acked_end.get(pid, 0), end)
                node.pending[pid] = keep
        for pid in node.pids:   # a leader's "end" (ListOffsets) never hides an acknowledged batch
            if core.role(pid) is Role.LEADER and core.commit_offset(pid) < self.acked_end.get(pid, 0):
                if core.commit_known(pid):
                    self.fail(f"{node.id} p{pid}: its high watermark {core.commit_offset(pid)} counts as known, "
                              f"but batches up to {self.acked_end[pid]} were acknowledged")
                self.counts["stale_hw"] += 1   # just elected: ListOffsets answers LEADER_NOT_AVAILABLE
        if turn.configs:
            self.configs_durable(node, turn.configs)
        if turn.busy and self.cfg.check_replicas:
            for pid in node.pids:
                self._check_replica(node, pid, deep=pid in turn.touched)

    # -- hooks (tests/sim/replication_reconfig.py moves replicas) -------------------------------
    def initial_config(self, node: Node, pid: int):
        """What the shell hands ``add_partition`` (the persisted history wins over it)."""
        return self.replicas[pid]

    def shell_turn(self, node: Node, turn: _Turn) -> None:
        """The start of a turn, before the inbox: the shell's own decisions."""

    def configs_durable(self, node: Node, configs: dict) -> None:
        """``Ready.configs`` of a turn, after its sync."""

    # -- checkers ------------------------------------------------------------------------------
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
        values = [(key.encode() + b"|") * self.rng.randint(1, 3) for _ in range(count)]
        node = self.nodes[target]
        if node.up:
            node.produce_q.append((pid, key, values))
            self._want_turn(node, self._ms(*self.cfg.delay_ms))
        return key

    # -- network -----------------------------------------------------------------------------
    def _send(self, src: str, send) -> None:
        dest = send.dest
        body = encode_body(send.msg)
        op = op_of(send.msg)
        self.sent_messages[src] += 1
        self.sent_rows[src] += len(send.msg.rows)
        self.net.send(src, dest, (op, body, send.payload))

    # -- faults -----------------------------------------------------------------------------
    def _fault(self) -> None:
        r = self.rng.random()
        nodes = self.node_ids
        if r < 0.15:
            side = self.rng.sample(nodes, self.rng.randint(1, max(1, len(nodes) - 1)))
            self.net.heal()
            self.net.partition(sorted(side))      # the others form the other side
            self.counts["partition"] += 1
        elif r < 0.22:
            a, b = self.rng.sample(nodes, 2) if len(nodes) > 1 else (nodes[0], nodes[0])
            self.net.cut(a, b)  # one-way
            self.counts["partition"] += 1
        elif r < 0.40:
            self.net.heal()
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
                node.paused = True          # SIGSTOP: no turns; the network holds its messages
                self.counts["pause"] += 1
                pause_us = self._ms(200, 3000)
                self.net.stall(node.id, self.now_us + pause_us)
                self._at(pause_us, "resume", node.id)
        elif r < 0.80:
            self._retention()
        elif self.cfg.disk_faults and r < 0.97:
            self._disk_fault()
        # else: a quiet spell

    # -- disk faults (issue 17) ---------------------------------------------------------------
    def _disk_fault(self) -> None:
        """Crash one broker and damage its disk before it restarts: at most one at a time, and
        only once the previous one is back in the in-sync set of all its partitions."""
        if self.disk_faulted is not None:
            if not self._back_in_sync(self.nodes[self.disk_faulted]):
                return
            self.disk_faulted = None
        node = self.nodes[self.rng.choice(self.node_ids)]
        if not node.up or node.paused or any(len(self.replicas[pid]) < 2 for pid in node.pids):
            return  # RF 1: the only copy; nothing can bring it back
        kind = self.rng.choice(("wipe", "rollback", "corrupt", "corrupt_live"))
        if kind == "rollback" and not node.snaps:
            kind = "wipe"
        if kind == "corrupt_live":  # found while it runs (reading for a follower or a consumer)
            led = [pid for pid in node.pids if node.core.role(pid) is Role.LEADER] or node.pids
            pid = self.rng.choice(led)
            bases = [b[0] for b in node.store.durable[pid].batches]
            if bases:
                self.counts["corrupt"] += 1
                node.corrupt = (pid, self.rng.choice(bases))
                self.disk_faulted = node.id
                self._want_turn(node)
            return
        self._crash(node, mid_turn=False)
        node.disk_fault = kind
        self.disk_faulted = node.id

    def _back_in_sync(self, node: Node) -> bool:
        """Refilled (not recovering, gossip has spoken) and in every leader's in-sync set."""
        if not node.up or node.lost_state or node.corrupt is not None:
            return False
        for pid in node.pids:
            if node.core.recovering(pid):
                return False
            lead = next((self.nodes[r] for r in self.replicas[pid]
                         if self.nodes[r].up and self.nodes[r].core.role(pid) is Role.LEADER), None)
            if lead is None or node.id not in lead.core.isr(pid):
                return False
        return True

    def _damage_disk(self, node: Node) -> None:
        kind, node.disk_fault = node.disk_fault, None
        store = node.store
        if kind == "corrupt":
            cands = [(pid, b[0]) for pid in node.pids for b in store.durable[pid].batches]
            if cands:
                self.counts["corrupt"] += 1
                node.corrupt = self.rng.choice(cands)
                return
            kind = "wipe"
        self.counts[kind] += 1
        # what this replica may have acknowledged: it may not lead before it holds it again
        for pid in node.pids:
            others = [self.nodes[r] for r in self.replicas[pid] if r != node.id]
            marks = [o.commit_seen[pid] if o.up else (o.store.durable_state[pid].commit
                                                         if o.store.durable_state[pid] else 0) for o in others]
            if marks:
                node.lost[pid] = max(node.lost.get(pid, 0), min(marks))
        if kind == "wipe":
            store.wipe(self._new_store_id())
            node.snaps = []
        else:
            i = self.rng.randrange(len(node.snaps))
            store.rollback(node.snaps[i])
            node.snaps = node.snaps[:i + 1]
        node.lost_state = True
        node.commit_seen = {pid: 0 for pid in node.pids}

    def _report_corrupt(self, node: Node, turn: _Turn, pid: int, offset: int) -> None:
        node.lost[pid] = max(node.lost.get(pid, 0), node.commit_seen[pid])
        node.cut.add(pid)
        rd = node.core.report_corrupt(pid, offset)
        self._apply(node, turn, rd)
        rd2 = node.core.report_corrupt(pid, offset)  # a repeated report changes nothing
        if rd2.log_ops or rd2.messages:
            self.fail(f"{node.id} p{pid}: a repeated corruption report acted again: {rd2}")
        node.commit_seen[pid] = node.core.commit_offset(pid)
        turn.busy = True

    def _crash(self, node: Node, mid_turn: bool) -> None:
        self.counts["mid_turn_crash" if mid_turn else "crash"] += 1
        node.store.crash()
        self.net.crash(node.id)
        node.up, node.core, node.crash_in_turn, node.paused = False, None, False, False
        node.inbox, node.produce_q = [], []
        node.pending = {pid: [] for pid in node.pids}
        self._at(self._ms(100, 3000), "restart", node.id)

    def _retention(self) -> None:
        """Retention on the leader of a partition (the node's rule: followers follow its log
        start, ``CutHead``): it deletes head batches below its persisted commit (to its
        newest committed batch, half the time)."""
        pid = self.rng.choice(self.pids)
        newest = self.rng.random() < 0.5
        for nid in self.replicas[pid]:
            node = self.nodes[nid]
            if not node.up or node.core is None or node.core.role(pid) is not Role.LEADER:
                continue
            saved = node.store.durable_state[pid]
            if saved is None or pid in node.store.dirty:
                continue
            log = node.store.live[pid]
            limit = min(saved.commit, node.commit_seen[pid])
            cands = [b[0] for b in log.batches if log.start < b[0] <= limit]
            if not cands:
                continue
            new_start = cands[-1] if newest else self.rng.choice(cands)
            node.store.retain_from(pid, new_start)
            node.core.log_start_moved(pid)
            self.counts["retention"] += 1

    # -- the final phase: heal, converge, check ---------------------------------------------------
    def heal(self) -> None:
        self.faults_on = self.clients_on = False
        self.net.heal()
        self.net.loss = self.net.dup = 0.0
        for nid in self.node_ids:
            node = self.nodes[nid]
            node.crash_in_turn = False
            if not node.up:
                self._start(node)
            node.paused = False
            self.net.resume(node.id)
            self._want_turn(node)

    def finish(self) -> None:
        cfg = self.cfg
        self.heal()
        self.run_until(self.converged, cfg.converge_ms * US, "one leader per partition, all replicas caught up")
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

        self.run_until(written, 10_000 * US, "every partition acknowledging a new batch",
                       check_every_us=200 * US)
        self.run_until(self.converged, cfg.converge_ms * US, "convergence after the last writes")
        self._check_final_logs()
        self.run_until(self.balanced, cfg.rebalance_ms * US, "leadership back on the preferred replicas")


    def summary(self) -> str:
        c = self.counts
        return (f"seed {self.cfg.seed}: {self.steps_done} turns, {self.now_us / 1e6:.1f}s simulated, "
                f"{len(self.acked)}/{self.produced} batches acked ({self.refused} refused), "
                f"{c['elections']} leaderships, {c['crash']}+{c['mid_turn_crash']} crashes, "
                f"{c['pause']} pauses, {c['partition']} partitions, {c['truncates']} truncations, "
                f"{c['retention']} retention cuts, {c['resets']} log resets, "
                f"disk: {c['wipe']} wiped, {c['rollback']} rolled back, {c['corrupt']} corrupt, "
                f"trace {self.trace.hexdigest()[:12]}")
