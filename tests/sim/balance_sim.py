"""A deterministic simulator of the self-balancing cluster (mesh.cluster.balance*).

Time is rounds of one second (the shell's balancing cadence). The world holds every
partition's true config (voters, learners, leader), its size, and how far each learner has
copied. Each round:

1. scheduled events happen (add a broker, decommission, kill, bring back, pin);
2. config changes proposed earlier take effect once their delay is over (and only if the
   proposer still leads: a deposed leader's uncommitted change is lost);
3. leadership: a dead leader is replaced by the first live voter; a live preferred leader
   (voters[0]) takes leadership back (the shell's preferred-leader election);
4. learners copy: each leader broker has a byte budget per round shared by its learners
   (``--move-rate-bytes``); partitions grow a little (producers keep writing);
5. every live broker builds a ``Balancer`` on ITS view, the world as of a seeded number of
   rounds ago (gossip lag), and proposes the steps for the partitions it leads that have
   no change pending; a step takes effect after a seeded delay.

Checked along the way: a step never removes the leader, never leaves fewer than
min(rf, len(target)) voters, is a single-server change; concurrent moves per broker (as a
learner destination, and as a leader sending) against the limit; flapping: a move A -> B
of a partition (B promoted, then A removed) followed by a move B -> A of the same
partition with no membership event in between (an event counts for the rounds its news
takes to reach every view). Re-adding a node a partition left, without an event in between,
is counted too (``re-adds``: not always a move undone, but wasted copying). After each settle phase:
every partition has no learners and matches the target of the true view, is at its RF on
eligible brokers, replica counts and preferred-leader counts are within 1.

A failing run's report ends with its seed; ``run_scenario(name, seed=...)`` replays it.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from mesh.cluster.balance import BalanceSettings, BrokerInfo, PartitionInfo, target
from mesh.cluster.balance_steps import (AddLearner, Balancer, Led, Promote, RemoveLearner,
                                        RemoveVoter, Step, Transfer, apply_step)
from mesh.cluster.placement import place_replicas

ROUND_MS = 1_000
ROUNDS_PER_MOVE = 12     # lag + apply delay for 3 steps, plus copying; measured: 6-8
SLACK_ROUNDS = 40


@dataclass
class Part:
    pid: int
    rf: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    leader: str | None = None
    size: int = 0
    copied: dict[str, int] = field(default_factory=dict)
    pinned: tuple[str, ...] | None = None
    pending: tuple[int, str, Step] | None = None     # (apply round, proposer, step)
    version: int = 0
    arrived: list[str] = field(default_factory=list)   # promoted, not yet paired with a removal


@dataclass
class Broker:
    alive: bool = True
    draining: bool = False
    died: int = 0            # round it died


@dataclass
class Report:
    scenario: str
    seed: int
    violations: list[str] = field(default_factory=list)
    metrics: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def render(self) -> str:
        lines = [f"scenario {self.scenario} seed {self.seed}"]
        lines += [f"  {k}: {v}" for k, v in self.metrics.items()]
        lines += [f"  VIOLATION {v}" for v in self.violations[:20]]
        lines.append(f"reproduce with: run_scenario({self.scenario!r}, seed={self.seed})")
        return "\n".join(lines)


class World:
    def __init__(self, seed: int, brokers: int, topics: list[tuple[int, int]],
                 settings: BalanceSettings, size_bytes: tuple[int, int] = (1 << 20, 20 << 20),
                 rate_bytes: int = 16 << 20, max_lag_rounds: int = 3,
                 max_apply_rounds: int = 2):
        self.rng = random.Random(seed)
        self.settings = settings
        self.rate_bytes = rate_bytes
        self.max_lag_rounds = max_lag_rounds
        self.max_apply_rounds = max_apply_rounds
        self.now = 0
        self.brokers = {f"n{i}": Broker() for i in range(1, brokers + 1)}
        self.parts: dict[int, Part] = {}
        pid = 0
        for count, rf in topics:
            for reps in place_replicas(count, rf, sorted(self.brokers)):
                size = self.rng.randint(*size_bytes)
                self.parts[pid] = Part(pid, rf, tuple(reps), leader=reps[0], size=size)
                pid += 1
        self.snapshots: list[tuple[list[BrokerInfo], list[PartitionInfo]]] = []
        self.plans: dict[int, Balancer] = {}
        self.events: list[int] = [0]                   # rounds of membership events
        self.removed: dict[tuple[int, str], int] = {}  # (pid, node) -> round removed
        self.moved: dict[int, list[tuple[str, str, int]]] = {}   # pid -> (from, to, round)
        self.into: Counter[str] = Counter()            # moves into each broker, this phase
        self.readds = 0
        self.violations: list[str] = []
        self.max_in = 0
        self.max_out = 0
        self.adds = 0
        self.cancelled = 0
        self.lost = 0
        self.pins_done = 0
        self.snapshot()

    # ---- the view -------------------------------------------------------------------
    def broker_infos(self) -> list[BrokerInfo]:
        return [BrokerInfo(n, b.alive, b.draining,
                           0 if b.alive else (self.now - b.died) * ROUND_MS)
                for n, b in sorted(self.brokers.items())]

    def part_info(self, p: Part) -> PartitionInfo:
        return PartitionInfo(p.pid, "t", p.pid, p.rf, p.voters, p.learners, p.pinned,
                             p.size, p.leader, p.version)

    def snapshot(self) -> None:
        self.snapshots.append((self.broker_infos(),
                               [self.part_info(p) for _, p in sorted(self.parts.items())]))

    def plan_as_of(self, rnd: int) -> Balancer:
        if rnd not in self.plans:          # deterministic: one plan per view serves everyone
            self.plans[rnd] = Balancer(*self.snapshots[rnd], self.settings)
            self.plans.pop(rnd - 4 * (self.max_lag_rounds + 2), None)
        return self.plans[rnd]

    def eligible(self) -> list[str]:
        return sorted(n for n, b in self.brokers.items() if b.alive and not b.draining)

    # ---- events ---------------------------------------------------------------------
    def event(self) -> None:
        self.events.append(self.now)

    def add_broker(self, node: str) -> None:
        self.brokers[node] = Broker()
        self.event()

    def drain(self, node: str, on: bool = True) -> None:
        self.brokers[node].draining = on
        self.event()

    def kill(self, node: str) -> None:
        b = self.brokers[node]
        b.alive, b.died = False, self.now
        self.event()
        rounds = -(-self.settings.replace_dead_after_ms // ROUND_MS)
        self.events.append(self.now + rounds)          # it becomes replaceable then

    def revive(self, node: str) -> None:
        self.brokers[node] = Broker()
        for p in self.parts.values():    # its stale data: whatever it still hosts catches up
            p.copied.pop(node, None)
        self.event()

    def pin(self, pid: int, replicas: tuple[str, ...]) -> None:
        self.parts[pid].pinned = replicas
        self.event()

    # ---- one round ------------------------------------------------------------------
    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.step_round()

    def step_round(self) -> None:
        self.now += 1
        self.apply_pending()
        self.leaders()
        self.copy()
        self.decide()
        self.snapshot()
        self.measure()

    def apply_pending(self) -> None:
        for p in self.parts.values():
            if p.pending is None or p.pending[0] > self.now:
                continue
            _, proposer, step = p.pending
            p.pending = None
            if p.leader != proposer or not self.brokers[proposer].alive:
                continue
            if isinstance(step, Transfer):
                if self.brokers[step.node].alive and step.node in p.voters:
                    p.leader = step.node
                continue
            voters, learners = apply_step(p.voters, p.learners, step)
            for gone in (set(p.voters) | set(p.learners)) - (set(voters) | set(learners)):
                self.removed[(p.pid, gone)] = self.now
                p.copied.pop(gone, None)
            if isinstance(step, RemoveLearner):
                self.cancelled += 1
            if isinstance(step, Promote):
                p.arrived.append(step.node)
            if isinstance(step, RemoveVoter) and p.arrived:
                self.record_move(p.pid, step.node, p.arrived.pop(0))
            p.voters, p.learners = voters, learners
            p.version += 1
            if p.pinned is not None and p.voters == p.pinned and not p.learners:
                p.pinned = None                      # the leader removes a finished pin
                self.pins_done += 1
                self.event()

    def quiet(self, since: int) -> bool:
        """No membership event since round ``since`` (allowing for gossip lag)."""
        window = self.max_lag_rounds + self.max_apply_rounds + 2
        return not any(since - window <= e <= self.now for e in self.events)

    def record_move(self, pid: int, src: str, dst: str) -> None:
        history = self.moved.setdefault(pid, [])
        for a, b, rnd in history:
            if (a, b) == (dst, src) and self.quiet(rnd):
                self.violations.append(f"r{self.now} p{pid}: flap, moved {src} -> {dst}, "
                                       f"undoing {a} -> {b} of r{rnd}")
        history.append((src, dst, self.now))
        self.into[dst] += 1

    def leaders(self) -> None:
        for p in self.parts.values():
            if p.leader is None or not self.brokers[p.leader].alive or p.leader not in p.voters:
                p.leader = next((v for v in p.voters if self.brokers[v].alive), None)
                p.pending = None
            elif (p.pending is None and p.voters[0] != p.leader
                  and self.brokers[p.voters[0]].alive):
                p.leader = p.voters[0]

    def copy(self) -> None:
        sending: dict[str, list[tuple[Part, str]]] = {}
        for p in self.parts.values():
            p.size += self.rng.randint(0, 20_000)
            if p.leader is None:
                continue
            for n in p.learners:
                if self.brokers[n].alive:
                    sending.setdefault(p.leader, []).append((p, n))
        for jobs in sending.values():
            share = self.rate_bytes // len(jobs)
            for p, n in jobs:
                p.copied[n] = min(p.size, p.copied.get(n, 0) + share)

    def match(self, p: Part) -> dict[str, int]:
        out = {}
        for v in p.voters:
            if v != p.leader:
                out[v] = p.size if self.brokers[v].alive else p.size // 2
        for n in p.learners:
            out[n] = p.copied.get(n, 0)
        return out

    def decide(self) -> None:
        led: dict[str, list[Led]] = {}
        for pid, p in sorted(self.parts.items()):
            if p.leader is not None and p.pending is None:
                led.setdefault(p.leader, []).append(Led(self.part_info(p), self.match(p), p.size))
        for node in sorted(led):
            lag = self.rng.randint(0, self.max_lag_rounds)
            plan = self.plan_as_of(max(0, len(self.snapshots) - 1 - lag))
            for pid, step in plan.steps(node, led[node]):
                self.check_step(self.parts[pid], step, plan.targets[pid])
                delay = self.rng.randint(1, self.max_apply_rounds)
                self.parts[pid].pending = (self.now + delay, node, step)

    def check_step(self, p: Part, step: Step, tgt: tuple[str, ...]) -> None:
        voters, learners = apply_step(p.voters, p.learners, step)
        if isinstance(step, RemoveVoter):
            if step.node == p.leader:
                self.violations.append(f"r{self.now} p{p.pid}: removes its leader {step.node}")
            if len(voters) < min(p.rf, len(tgt)):
                self.violations.append(f"r{self.now} p{p.pid}: {voters} under min(rf, target)")
        changed = len(set(voters) ^ set(p.voters)) + len(set(learners) ^ set(p.learners))
        if changed > 2 or (changed == 2 and not (set(voters) - set(p.voters))):
            self.violations.append(f"r{self.now} p{p.pid}: not a single-server change {step}")
        if isinstance(step, AddLearner):
            self.adds += 1
            left = self.removed.get((p.pid, step.node))
            if left is not None and self.quiet(left):
                self.readds += 1

    def measure(self) -> None:
        incoming = Counter(n for p in self.parts.values() for n in p.learners)
        outgoing = Counter(p.leader for p in self.parts.values() if p.learners and p.leader)
        self.max_in = max([self.max_in, *incoming.values()])
        self.max_out = max([self.max_out, *outgoing.values()])

    # ---- settling -------------------------------------------------------------------
    def truth_targets(self) -> dict[int, tuple[str, ...]]:
        return target(*self.snapshots[-1], self.settings)

    def settled(self) -> bool:
        tg = self.truth_targets()
        return all(not p.learners and p.pending is None and p.voters == tg[p.pid]
                   and p.leader == p.voters[0] for p in self.parts.values()
                   if any(self.brokers[v].alive for v in p.voters))

    def settle(self, max_rounds: int, start: int) -> int:
        """Step until settled; the bound: ``ROUNDS_PER_MOVE`` rounds per batch of
        ``max_moves_per_broker`` moves into the busiest destination, plus ``SLACK_ROUNDS``."""
        while self.now - start < max_rounds:
            # settled needs the newest view to have reached every broker: lag rounds quiet
            if self.settled() and all(self.now - e > self.max_lag_rounds for e in self.events):
                break
            self.step_round()
        else:
            self.violations.append(f"r{self.now}: not settled after {max_rounds} rounds")
        took = self.now - start
        busiest = max(self.into.values(), default=0)
        bound = ROUNDS_PER_MOVE * -(-busiest // self.settings.max_moves_per_broker) + SLACK_ROUNDS
        if took > bound:
            self.violations.append(f"r{self.now}: settling took {took} rounds, over the bound "
                                   f"{bound} ({busiest} moves into the busiest broker)")
        self.into.clear()
        return took

    def check_balanced(self, label: str) -> None:
        elig = self.eligible()
        es = set(elig)
        counts = Counter({n: 0 for n in elig})
        leads = Counter({n: 0 for n in elig})
        for p in self.parts.values():
            counts.update(v for v in p.voters if v in es)
            if p.voters and p.voters[0] in es:
                leads[p.voters[0]] += 1
            if p.pinned is None and not any(self.brokers[v].alive for v in p.voters):
                self.lost += 1                        # its only replicas are dead: stuck
            elif p.pinned is None:
                want = min(p.rf, len(elig))
                if len(p.voters) != want or not set(p.voters) <= es:
                    self.violations.append(f"{label}: p{p.pid} voters {p.voters} not {want} "
                                           f"eligible replicas")
        for what, c in (("replica", counts), ("preferred-leader", leads)):
            if c and max(c.values()) - min(c.values()) > 1:
                self.violations.append(f"{label}: {what} counts spread {dict(sorted(c.items()))}")
        if self.truth_targets() != target(self.broker_infos(),
                                          [self.part_info(p) for p in self.parts.values()],
                                          self.settings):
            self.violations.append(f"{label}: target not a fixed point")


def run_scenario(name: str, seed: int = 7, settle_rounds: int = 300, **kw) -> Report:
    """Run one named scenario (see SCENARIOS); the report's metrics include, per phase,
    the rounds it took to settle."""
    settings = BalanceSettings(replace_dead_after_ms=kw.pop("replace_dead_after_ms", 10_000),
                               max_moves_per_broker=kw.pop("max_moves", 2),
                               catch_up_lag=100_000)
    brokers, topics, plan = SCENARIOS[name]
    w = World(seed, brokers, topics, settings, **kw)
    report = Report(name, seed)
    rounds: dict[str, int] = {"initial": w.settle(settle_rounds, w.now)}
    w.check_balanced("initial")
    for label, action in plan:
        start = w.now
        action(w)
        rounds[label] = w.settle(settle_rounds, start)
        w.check_balanced(label)
    report.violations = w.violations
    report.metrics = {"rounds to settle": rounds, "learners added": w.adds,
                      "learners cancelled": w.cancelled,
                      "moves": sum(len(m) for m in w.moved.values()),
                      "pins completed": w.pins_done,
                      "re-adds without an event": w.readds,
                      "partitions with no live replica": w.lost,
                      "max concurrent moves into one broker": w.max_in,
                      "max concurrent moves out of one leader": w.max_out,
                      "limit": settings.max_moves_per_broker}
    return report


def _kill_and_wait(node: str):
    def act(w: World) -> None:
        w.kill(node)
    return act


SCENARIOS = {
    "add": (3, [(40, 3), (20, 2)], [
        ("add n4", lambda w: w.add_broker("n4")),
        ("add n5 n6", lambda w: (w.add_broker("n5"), w.add_broker("n6"))),
    ]),
    "drain": (5, [(40, 3), (20, 2)], [
        ("drain n2", lambda w: w.drain("n2")),
        ("recommission n2", lambda w: w.drain("n2", False)),
    ]),
    "kill": (5, [(40, 3), (20, 2)], [
        ("kill n3", _kill_and_wait("n3")),
        ("n3 back", lambda w: w.revive("n3")),
    ]),
    "pin": (4, [(30, 2)], [
        ("pin p0 (n1,n3) to n2,n4", lambda w: w.pin(0, ("n2", "n4"))),
        ("pin p1 (n2,n4) to n4,n3 and p2 (n3,n4) to n1,n2",
         lambda w: (w.pin(1, ("n4", "n3")), w.pin(2, ("n1", "n2")))),
    ]),
    "kill-mid-move": (3, [(30, 3), (12, 2)], [
        ("add n4, kill n1 10 rounds in", lambda w: (w.add_broker("n4"), w.run(10), w.kill("n1"))),
        ("n1 back", lambda w: w.revive("n1")),
    ]),
    "mixed": (4, [(60, 3), (30, 2), (10, 2)], [
        ("add n5", lambda w: w.add_broker("n5")),
        ("drain n1", lambda w: w.drain("n1")),
        ("kill n2", _kill_and_wait("n2")),
        ("add n6, n2 back", lambda w: (w.add_broker("n6"), w.revive("n2"))),
        ("recommission n1", lambda w: w.drain("n1", False)),
    ]),
}
