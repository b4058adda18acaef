"""Node-level simulation: the real node shell pieces on every broker, one seed, one thread.

    python -m tests.sim.node_sim --seed 7 --steps 1500 [--brokers 3 --partitions 3 --rf 3]
    python -m tests.sim.node_sim --seed 0 --seeds 200

Theory of operation
-------------------
Each simulated broker runs the node's own parts, wired by the node's own ``wire_data``
(``mesh.node.wiring``), and the node's own turn (``mesh.node.turn.BrokerTurn``), minus the
sockets and the gossip core: a ``storage.memory.MemoryStore`` (``SimStore``: the same
store, whose group commit can be made to fail), the real ``ProducerStates``,
``ReplicaHost`` (the raft core in its shell), ``Catalog`` (fed a fixed topic table through
a stand-in for gossip's ``cluster_items``) and ``DataPath`` (produce, fetch, acks=all).
Both shells get a clock the simulation owns (``now_ms``; each incarnation of a broker has
its own monotonic offset). A broker *turn*: drain the inbox (peer messages to
``ReplicaHost.step``, client requests to ``DataPath.on_produce`` / ``on_fetch``, a
``MeshError`` answered as ``ErrorResponse``), then ``BrokerTurn.drained`` and
``BrokerTurn.run`` with the tasks a simulated broker has (handovers when stopping, the end
of lost state); faults at the commit come in through its ``before_commit`` hook, and a
task's exception is raised (a failure of the seed), not swallowed.

``SimNet`` (mesh.testing.simnet) owns time (milliseconds) and the network; every frame,
peer or client, is built with ``mesh.wire.codec.pack`` and read with ``unpack``. Faults,
all drawn from strings-seeded ``random.Random``s: loss, duplication (not of a client's
requests: a request travels once over its TCP connection, and the producer's rules rely
on "refused" meaning "not stored by this attempt"; two seeds, 1281 and 5335, stored a
batch twice only through a request delivered twice), delay and reordering,
partitions and one-way cuts (clients land on random sides), pauses (SIGSTOP: the network
holds the broker's messages, then a burst), crashes at a turn boundary or in the middle of
a turn before its commit (``MemoryStore.crash``: what was not committed is lost; the broker
restarts from its store), and failed group commits (the disk refuses one turn's commit).

Clients: producers drive the real sans-I/O ``Sequencer`` (mesh.client.sequencer) with
acks=all and a producer id, so retries after timeouts, lost answers and leader changes are
the idempotent producer's; one consumer per partition long-polls whoever it thinks leads.

Checkers
--------
- the shell contract, on every peer message as it leaves (``_check_send``): it leaves only
  after a successful commit in the same turn (so after a failed commit nothing of the turn
  is sent), and what it claims is durable: its term is the persisted term (pre-votes
  aside), a vote grant or request matches the persisted vote, an append ack does not pass
  the durable log end, and the batches of an append are the durable ones, byte for byte.
  A row of an older term than the persisted one is past checking: the turn also moved the
  replica to a newer term for good (two grants in one turn, the second in a newer term).
  One exception: a leader's appends may leave before the turn's commit
  (``_check_early_append``: from the durable leader of a durable term and epoch marker,
  carrying the batches the broker holds, staged or durable; counted in ``early_appends``);
- after a failed commit: the host rebuilt its core and the core is what the store holds
  (term, vote, log end);
- election safety from the leaderships the hosts publish: one leader per (partition, epoch);
- a produce answered with success is durably on a quorum of replicas when the answer
  leaves, at the offset it names, with the bytes the producer sent;
- fetches: contiguous, never past the high watermark, and a committed offset always holds
  the same batch (whoever serves it);
- final phase (heal, restart, resume; clients write once more per partition): every
  partition converges (one leader, every replica's log identical and committed), every
  acknowledged batch is in it and was read by the consumer, no batch of a producer is
  there twice (idempotent retries), and each producer's batches are in send order.

A failing run raises ``SimFailure`` naming its seed and the command that replays it.

What it leaves out: the gossip core and the group host (the topic table is fixed, leaders
are learned from answers, not from gossip), retention, and corrupted bytes on disk; the
replication simulator (replication_sim.py) covers retention and log resets at the core.

Files: node_sim.py (this: ``NodeSim``, the brokers' turns, faults, the final phase, the
command line), node_parts.py (config, ``SimStore``, broker and client state),
node_clients.py (producers and consumers), node_checks.py (the checkers).
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import random
import sys
from functools import partial

from mesh.cluster.catalog import Catalog, Topic, cluster_pid, topic_registers
from mesh.node.turn import BrokerTurn, Task
from mesh.node.wiring import wire_data
from mesh.testing.seeds import run_seeds
from mesh.testing.simnet import DELIVER, SimNet
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, PROTOCOL_PEER, pack, unpack
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.topic_config import normalize_config
from tests.sim.node_checks import NodeChecks
from tests.sim.node_clients import NodeClients
from tests.sim.node_parts import (
    CLIENT_EVERY_MS, MAX_INBOX_PER_TURN, TOPIC, Broker, Consumer, NodeSimConfig, Producer, Registry,
    SimStore,
)
from tests.sim.replication_store import SimFailure

__all__ = ["NodeSimConfig", "NodeSim", "SimStore", "SimFailure", "run", "main"]


def _catch_up_ticks(host) -> None:
    """The shell's tick cadence before ``ReplicaHost.tick_due`` ran one tick per turn:
    every tick due at once, at most 10 (regression seeds found with it replay with it)."""
    n = (host.now_ms() - host._last_tick_ms) // host.tick_ms
    if n > 0:
        host._last_tick_ms += n * host.tick_ms
        for _ in range(min(n, 10)):
            host.apply(host.core.tick())


def _address_of(node_id: str) -> str:
    return node_id   # in the simulation a broker's address is its node id


class NodeSim(NodeClients, NodeChecks):
    """One seeded run: the brokers, their turns, the faults and the final phase (the clients
    and the checkers are the mixins')."""

    def __init__(self, cfg: NodeSimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"node-sim/{cfg.seed}")
        self.net = SimNet(f"node-sim/{cfg.seed}/net", loss=cfg.loss, dup=cfg.dup, delay=cfg.delay_ms,
                          slow_p=cfg.slow_p, slow=cfg.slow_ms)
        self.trace = hashlib.blake2b(digest_size=16)
        self.turns = 0
        self.broker_ids = [f"n{i}" for i in range(cfg.brokers)]
        rf = min(cfg.rf, cfg.brokers)
        self.quorum = rf // 2 + 1
        uuid = hashlib.blake2b(f"node-sim/{cfg.seed}/topic".encode(), digest_size=16).hexdigest()
        replicas = [[self.broker_ids[(p + k) % cfg.brokers] for k in range(rf)] for p in range(cfg.partitions)]
        self.registry = Registry(topic_registers(Topic(
            name=TOPIC, uuid=uuid, partitions=cfg.partitions, replication_factor=rf,
            config=normalize_config({}), replicas=tuple(tuple(r) for r in replicas))))
        self.pid_of = {p: cluster_pid(uuid, p) for p in range(cfg.partitions)}
        self.replicas = {p: replicas[p] for p in range(cfg.partitions)}
        self.brokers = {nid: Broker(nid, sorted(self.pid_of[p] for p in range(cfg.partitions)
                                                if nid in replicas[p])) for nid in self.broker_ids}
        self.producers = {f"c{i}": Producer(f"c{i}", i, random.Random(f"node-sim/{cfg.seed}/c{i}"),
                                                     cfg.follow_hints)
                          for i in range(cfg.producers)}
        self.consumers = {f"k{p}": Consumer(f"k{p}", p) for p in range(cfg.partitions)}
        self.faults_on, self.clients_on = cfg.faults, True
        self.leader_of_epoch: dict[tuple[int, int], str] = {}
        self.canon: dict[int, dict[int, bytes]] = {p: {} for p in range(cfg.partitions)}
        self.requests: dict[tuple[str, int], tuple[int, bytes, str]] = {}  # (client, rid) -> (p, batch, label)
        self.counts = {k: 0 for k in ("crash", "mid_turn_crash", "failed_commit", "pause", "partition",
                                      "produced", "acked", "fetched", "retries", "peer_sent", "wipe",
                                      "early_appends", "stop", "handed_over")}
        for b in self.brokers.values():
            self._boot(b)
            self.net.call_after(self.rng.randrange(cfg.tick_ms), "tick", b.id)
        self.net.call_after(1, "clients")
        self.net.call_after(self._gap(cfg.produce_gap_ms), "produce")
        if self.faults_on:
            self.net.call_after(self._gap(cfg.fault_gap_ms), "fault")

    # -- plumbing ------------------------------------------------------------------------------
    def _gap(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.cfg.seed}, t={self.net.now / 1000:.3f}s, turn {self.turns}: {what}\n"
                         f"reproduce with: python -m tests.sim.node_sim {self.cfg.argv()}")

    def _want_turn(self, b: Broker, delay_ms: int = 0) -> None:
        at = self.net.now + delay_ms
        if b.turn_at is None or b.turn_at > at:
            b.turn_at = at
            self.net.call_at(at, "turn", b.id)

    def _boot(self, b: Broker) -> None:
        """Start (or restart) a broker from its store: its parts wired by the node's own
        ``wire_data``, its turn the node's ``BrokerTurn`` (mesh.node.wiring, mesh.node.turn)."""
        b.incarnation += 1
        rng = random.Random(f"node-sim/{self.cfg.seed}/{b.id}/{b.incarnation}")
        b.skew_ms = rng.randrange(1, 10**9)       # each process has its own monotonic clock
        b.now_ms = lambda b=b: self.net.now + b.skew_ms
        store = b.store
        b.catalog = Catalog(b.id, self.registry, store)
        parts = wire_data(b.id, store, b.catalog, rng, send=partial(self._peer_send, b),
                          publish=partial(self._published, b), reply=partial(self._reply, b),
                          leader_of=partial(self._leader_hint, b), address_of=_address_of, now_ms=b.now_ms,
                          store_id=f"{b.id}/{b.wipes}", replication=self.cfg.replication, tick_ms=self.cfg.tick_ms,
                          early_appends=self.cfg.early_appends, early_acks=self.cfg.early_acks)
        b.host, b.data = parts.replicas, parts.data
        if b.lost:   # the node's identity check found an empty or older store (mesh.node.lifecycle.identity)
            b.host.declare_lost_state()
        b.turn = self._broker_turn(b)
        added, _ = b.catalog.reconcile()
        for pid in sorted(added):
            b.host.add(pid, b.catalog.replicas_of(pid))
        self.net.restart(b.id)
        b.up, b.paused, b.inbox, b.turn_at = True, False, [], None
        b.crash_in_turn = b.fail_commit = False
        self._want_turn(b)

    def _broker_turn(self, b: Broker) -> BrokerTurn:
        """The node's turn with the tasks a simulated broker has (no gossip, no group host):
        a stopping broker's handovers, and the end of lost state once every replica refilled."""
        tasks = [Task("hand over", partial(self._hand_over, b), when=lambda: b.stop_until is not None),
                 Task("identity", partial(self._refilled, b))]
        if self.cfg.catch_up_ticks:
            tasks.append(Task("replication tick", partial(_catch_up_ticks, b.host)))
        return BrokerTurn(b.data, b.host, b.now_ms, tasks, before_commit=partial(self._before_commit, b),
                          on_commit=partial(self._committed, b), raise_errors=True)

    def _leader_hint(self, b: Broker, t, partition: int) -> str | None:
        pid = t.pids[partition]
        if pid is not None and b.host.hosts(pid):
            return b.host.leader(pid)[0]
        return None

    # -- events ---------------------------------------------------------------------------------
    def run_steps(self, steps: int) -> None:
        while self.turns < steps and self.net.next_time() is not None:
            self._event()

    def run_until(self, done, limit_ms: int, what: str) -> None:
        deadline, next_check = self.net.now + limit_ms, self.net.now
        while True:
            if self.net.now >= next_check:
                if done():
                    return
                next_check = self.net.now + 100
            if self.net.now > deadline or self.net.next_time() is None:
                self.fail(f"liveness: {what} not reached within {limit_ms / 1000:.0f}s of simulated time")
            self._event()

    def _event(self) -> None:
        ev = self.net.pop()
        if ev is None:
            return
        kind, a, dest, frames = ev
        self.trace.update(f"{self.net.now}:{kind}:{a}:{dest if kind is DELIVER else ''};".encode())
        if kind is DELIVER:
            if dest in self.brokers:
                b = self.brokers[dest]
                if b.up:
                    b.inbox.append((a, frames))
                    self._want_turn(b)
            elif dest in self.producers:
                self._producer_reply(self.producers[dest], frames)
            else:
                self._consumer_reply(self.consumers[dest], frames)
        elif kind == "turn":
            b = self.brokers[a]
            if b.turn_at == self.net.now:
                b.turn_at = None
                self._turn(b)
        elif kind == "tick":
            self.net.call_after(self.cfg.tick_ms, "tick", a)
            self._want_turn(self.brokers[a])
        elif kind == "clients":
            self.net.call_after(CLIENT_EVERY_MS, "clients")
            for c in self.producers.values():
                self._pump_producer(c)
            for k in self.consumers.values():
                self._pump_consumer(k)
        elif kind == "produce":
            if self.clients_on:
                self._new_batch(self.producers[self.rng.choice(sorted(self.producers))],
                                self.rng.randrange(self.cfg.partitions))
                self.net.call_after(self._gap(self.cfg.produce_gap_ms), "produce")
        elif kind == "fault":
            if self.faults_on:
                self._fault()
                self.net.call_after(self._gap(self.cfg.fault_gap_ms), "fault")
        elif kind == "restart":
            if not self.brokers[a].up:
                self._boot(self.brokers[a])
        elif kind == "resume":
            b = self.brokers[a]
            if b.up and b.paused:
                b.paused = False
                self.net.resume(b.id)
                self._want_turn(b)
        else:
            raise AssertionError(kind)

    # -- a broker's turn: the drain, then the node's own BrokerTurn (mesh.node.turn) -----------
    def _turn(self, b: Broker) -> None:
        if not b.up or b.paused:
            return
        self.turns += 1
        b.in_turn = True
        b.turn_commits = (b.store.commits_ok, b.store.commits_failed)
        inbox, b.inbox = b.inbox[:MAX_INBOX_PER_TURN], b.inbox[MAX_INBOX_PER_TURN:]
        if b.inbox:
            self._want_turn(b, 1)
        for src, frames in inbox:
            if src in self.brokers:
                self._peer_in(b, src, frames)
            else:
                self._client_in(b, src, frames)
            if b.host.commit_moved:   # as the node's drain: answered before the next message
                b.turn.early_acks()
        b.turn.drained()   # acks=all answers and fetch wake-ups, the leaders' early appends
        b.stopped = False
        ok = b.turn.run()   # the node's turn: ticks, held produces, handovers, commit, wake-ups
        if not b.up:
            return          # crashed in the turn, before its commit: its writes and sends vanished
        b.in_turn = False
        if b.stopped and ok:
            self._crash(b, mid_turn=False, stop=True)   # the loop ends after this turn (mesh.node.lifecycle.shutdown)
            return
        deadline = b.data.next_deadline_ms()
        if deadline is not None:
            self._want_turn(b, max(1, deadline - b.now_ms() + 1))

    def _before_commit(self, b: Broker) -> bool:
        """Faults at the turn's commit: a crash before it (False: the turn ends there), or a
        commit the disk refuses."""
        if b.crash_in_turn:
            self._crash(b, mid_turn=True)
            return False
        b.old_core = b.host.core
        if b.fail_commit:
            b.fail_commit = False
            b.store.armed = True
            self.counts["failed_commit"] += 1
        return True

    def _committed(self, b: Broker, ok: bool) -> None:
        if not ok:
            self._check_rebuilt(b, b.old_core)

    def _refilled(self, b: Broker) -> None:
        if b.lost and b.turn.last_commit_ok and not any(b.host.recovering(pid) for pid in b.store.pids):
            b.lost = False   # every replica refilled (the node then clears its identity's flag)

    def _hand_over(self, b: Broker) -> None:
        """A graceful stop's turn: start handovers of what ``b`` leads (to brokers that are
        up; gossip would say which); ``b.stopped`` once it may stop."""
        down = {o.id for o in self.brokers.values() if not o.up}
        busy = b.host.hand_over_all(down, b.handovers)
        self._want_turn(b, self.cfg.tick_ms)
        b.stopped = not busy or self.net.now >= b.stop_until

    def _peer_in(self, b: Broker, src: str, frames: list) -> None:
        try:
            protocol, _, msg, payload = unpack(frames)
            if protocol != PROTOCOL_PEER:
                raise MeshError(ErrorCode.INVALID_REQUEST, "not a peer frame")
            b.host.step(src, msg, payload)
        except MeshError as exc:  # the node logs and drops a bad peer message
            self.fail(f"{b.id}: a peer message from {src} was refused: {exc}")

    def _client_in(self, b: Broker, src: str, frames: list) -> None:
        ident = src.encode()
        _, rid, msg, payload = unpack(frames)
        handler = {m.ProduceRequest: b.data.on_produce, m.FetchRequest: b.data.on_fetch}[type(msg)]
        try:
            handler(ident, rid, msg, payload)
        except MeshError as exc:  # what Node._handle does
            self._reply(b, ident, rid, m.ErrorResponse(int(exc.code), exc.message, exc.leader))

    def _reply(self, b: Broker, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        self._check_ack(b, ident.decode(), rid, msg)
        self.net.send(b.id, ident.decode(), pack(PROTOCOL_CLIENT, rid, msg, payload))

    def _peer_send(self, b: Broker, dest: str, msg, payload: bytes | None) -> None:
        self._check_send(b, dest, msg, payload)
        self.counts["peer_sent"] += 1
        self.net.send(b.id, dest, pack(PROTOCOL_PEER, 0, msg, payload or None))

    def send_now(self, node_id: str, sends) -> None:
        """Send raft ``Send`` effects from ``node_id`` at once (for tests planting a bug)."""
        b = self.brokers[node_id]
        for e in sends:
            self._peer_send(b, e.dest, e.msg, e.payload)

    # -- faults -----------------------------------------------------------------------------------
    def _fault(self) -> None:
        r = self.rng.random()
        nodes = self.broker_ids
        b = self.brokers[self.rng.choice(nodes)]
        if r < 0.15:
            side = self.rng.sample(nodes, self.rng.randint(1, max(1, len(nodes) - 1)))
            other = [n for n in nodes if n not in side]
            for cid in sorted(self.producers) + sorted(self.consumers):
                (side if self.rng.random() < 0.5 else other).append(cid)
            self.net.heal()
            self.net.partition(sorted(side), sorted(other))
            self.counts["partition"] += 1
        elif r < 0.22 and len(nodes) > 1:
            x, y = self.rng.sample(nodes, 2)
            self.net.cut(x, y)
            self.counts["partition"] += 1
        elif r < 0.40:
            self.net.heal()
        elif r < 0.52:
            if b.up:
                if self.cfg.stops and b.stop_until is None and self.rng.random() < 1 / 3:
                    b.stop_until = self.net.now + self.rng.randint(200, 5000)   # shutdown_handover_ms
                    self.counts["stop"] += 1
                    self._want_turn(b)
                elif self.rng.random() < 0.5:
                    b.crash_in_turn = True
                    self._want_turn(b)
                else:
                    self._crash(b, mid_turn=False)
        elif r < 0.70:
            if b.up:
                b.fail_commit = True
                self._want_turn(b)
        elif r < 0.74 and self.cfg.wipes:
            if b.up and not any(o.lost for o in self.brokers.values()):   # one lost disk at a time
                self._crash(b, mid_turn=False, wipe=True)
        elif r < 0.80:
            if b.up and not b.paused:
                b.paused = True
                self.counts["pause"] += 1
                pause_ms = self.rng.randint(200, 3000)
                self.net.stall(b.id, self.net.now + pause_ms)
                self.net.call_after(pause_ms, "resume", b.id)
        # else: a quiet spell

    def _crash(self, b: Broker, mid_turn: bool, wipe: bool = False, stop: bool = False) -> None:
        if stop:
            self.counts["handed_over"] += sum(1 for pid in b.handovers if not b.host.is_leader(pid))
        else:
            self.counts["wipe" if wipe else "mid_turn_crash" if mid_turn else "crash"] += 1
        b.stop_until, b.handovers = None, {}
        if wipe:   # the disk is gone: the broker comes back empty and must refill from its peers
            b.lost_stores.append(b.store)
            b.store, b.lost = SimStore(b.store.pids), True
            b.wipes += 1
        else:
            b.store = b.store.crash()
        self.net.crash(b.id)
        b.up = b.paused = b.in_turn = b.crash_in_turn = b.fail_commit = False
        b.host = b.data = b.catalog = b.turn = None
        b.inbox = []
        self.net.call_after(self.rng.randint(100, 3000), "restart", b.id)

    # -- the final phase ---------------------------------------------------------------------------
    def heal(self) -> None:
        self.faults_on = self.clients_on = False
        self.net.heal()
        self.net.loss = self.net.dup = 0.0
        for b in self.brokers.values():
            b.crash_in_turn = b.fail_commit = False
            b.stop_until, b.handovers = None, {}   # a stop in progress is called off
            if not b.up:
                self._boot(b)
            if b.paused:
                b.paused = False
                self.net.resume(b.id)
            self._want_turn(b)

    def _leader(self, p: int) -> Broker | None:
        pid = self.pid_of[p]
        for nid in self.replicas[p]:
            b = self.brokers[nid]
            if b.up and b.host.is_leader(pid):
                return b
        return None

    def converged(self) -> bool:
        for p in range(self.cfg.partitions):
            lead, pid = self._leader(p), self.pid_of[p]
            if lead is None:
                return False
            end = lead.store.durable_end[pid]
            for nid in self.replicas[p]:
                h = self.brokers[nid].host
                if h.leader(pid)[0] != lead.id or h.commit_offset(pid) != end \
                        or self.brokers[nid].store.durable_end[pid] != end:
                    return False
        return True

    def clients_done(self) -> bool:
        return (not any(c.seq.busy() for c in self.producers.values())
                and all(k.offset >= self._leader_end(k.partition) for k in self.consumers.values()))

    def _leader_end(self, p: int) -> int:
        lead = self._leader(p)
        return lead.store.durable_end[self.pid_of[p]] if lead is not None else 1 << 62

    def finish(self) -> None:
        self.heal()
        self.run_until(self.converged, self.cfg.converge_ms, "one leader per partition, every replica caught up")
        marks = {}   # write liveness: one more batch per partition, from every producer
        for c in self.producers.values():
            for p in range(self.cfg.partitions):
                self._new_batch(c, p)
                marks[(c.id, p)] = f"{c.id}/p{p}/n{c.appended[p] - 1}"
        self.run_until(lambda: self.clients_done() and self.converged(), self.cfg.converge_ms,
                       "every batch answered, every replica and consumer caught up")
        acked = {b.label for c in self.producers.values() for _, b, _ in c.acked}
        missing = [label for label in marks.values() if label not in acked]
        if missing:
            self.fail(f"liveness: batches written after the heal were not acknowledged: {missing}")
        self._check_final_logs()

    def summary(self) -> str:
        c = self.counts
        failed = sum(len(p.failed) for p in self.producers.values())
        return (f"seed {self.cfg.seed}: {self.turns} turns, {self.net.now / 1000:.1f}s simulated, "
                f"{c['acked']}/{c['produced']} batches acked ({failed} failed, {c['retries']} retries), "
                f"{c['fetched']} fetched, {c['crash']}+{c['mid_turn_crash']} crashes, "
                + (f"{c['stop']} graceful stops ({c['handed_over']} leaderships handed over), " if c['stop'] else "")
                + f"{c['failed_commit']} failed commits, {c['wipe']} wiped disks, {c['pause']} pauses, "
                f"{c['partition']} partitions, "
                f"{len(self.leader_of_epoch)} leaderships, trace {self.trace.hexdigest()[:12]}")


def run(cfg: NodeSimConfig, sim: NodeSim | None = None) -> NodeSim:
    """One seeded run: faults for ``cfg.steps`` broker turns, then heal and check."""
    sim = sim or NodeSim(cfg)
    try:
        sim.run_steps(cfg.steps)
        sim.finish()
    except SimFailure:
        raise
    except Exception as exc:  # an assertion in a shell or core is a failure of this seed too
        raise SimFailure(f"seed {cfg.seed}, t={sim.net.now / 1000:.3f}s, turn {sim.turns}: "
                         f"{type(exc).__name__}: {exc}\n"
                         f"reproduce with: python -m tests.sim.node_sim {cfg.argv()}") from exc
    return sim


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.node_sim",
                                description="Deterministic simulation of the node shell (raft host, data path).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    p.add_argument("--steps", type=int, default=1500, help="broker turns with faults before the heal")
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--wipes", action="store_true", help="also lose whole disks (lost state, refill)")
    p.add_argument("--no-early-appends", action="store_true",
                   help="leaders send appends only after their sync (the contract before issue 15)")
    p.add_argument("--no-early-acks", action="store_true",
                   help="acks=all answers only after the turn's sync (the shell before issue 15, part 2)")
    p.add_argument("--no-follow-hints", action="store_true",
                   help="producers back off after every NOT_LEADER (the client before issue 15, round 5)")
    p.add_argument("--catch-up-ticks", action="store_true",
                   help="the old shell cadence: every tick due in one turn (up to 10)")
    p.add_argument("--stops", action="store_true",
                   help="a third of the crashes are graceful stops: leaderships handed over first")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true", help="show the shells' log (failed commits ...)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)
    return run_seeds(args.seed, args.seeds, lambda seed: run(NodeSimConfig(
        seed=seed, steps=args.steps, brokers=args.brokers, partitions=args.partitions, rf=args.rf,
        producers=args.producers, faults=not args.no_faults, wipes=args.wipes,
        early_appends=not args.no_early_appends, early_acks=not args.no_early_acks,
        follow_hints=not args.no_follow_hints, stops=args.stops, catch_up_ticks=args.catch_up_ticks)),
        failure=SimFailure, quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
