"""Deterministic simulation of consumer groups: one coordinator, members that come and go.

The real ``GroupCoordinator`` and ``GroupMemberState`` run on the shared simulated network
(``mesh.testing.simnet``), which loses, duplicates, delays and reorders messages and can cut
a member off. Members join, leave, crash, change subscriptions, are slow to revoke; the
coordinator crashes or moves (a fresh, empty instance takes over and loads offsets from the
"gossiped" store); topics grow. After every 10 ms step:

* no partition is held by two members at once (held = what the members believe);
* the coordinator's own ownership invariants hold;
* (checked when it happens) an accepted commit comes from the only member that believes it
  holds those partitions, if any does: a member that lost a partition cannot overwrite
  its new owner's progress;
* (checked when it happens) a commit with an epoch older than one its member has since
  received is refused.

Then the network heals and the faults stop: within a bound every partition of every
subscribed topic must be held by exactly one live member subscribed to it, and stay so.
A failure says ``reproduce with seed=N``: ``GROUPS_SIM_SEED=N pytest tests/sim/test_groups_sim.py``
runs that one run again; ``GROUPS_SIM_SEEDS=1000`` runs more seeds.
"""
from __future__ import annotations

import os
import random

import pytest

from mesh.testing.simnet import SimNet
from mesh.wire.errors import ErrorCode
from mesh.groups import (
    GroupCommit, GroupConfig, GroupCoordinator, GroupMemberState, PersistOffsets, error_response,
)

pytestmark = pytest.mark.sim

GROUP = "sim"
STEP_MS = 10
CHAOS_MS = 12_000
SETTLE_MAX_MS = 12_000
STABLE_FOR_MS = 1_000
MAX_MEMBERS = 6
MAX_SESSION_MS = 1_500
COMMIT_TIMEOUT_MS = 200
STRAGGLER_MS = 2 * MAX_SESSION_MS
ASSIGNORS = ["cooperative-sticky", "range", "round-robin"]
COORD = "coordinator"


class SimFailure(AssertionError):
    pass


class Member:
    def __init__(self, sim: "Sim", name: str, topics: list[str]):
        rng = sim.rng
        self.sim, self.name = sim, name
        session_ms = rng.randint(900, MAX_SESSION_MS)
        self.state = GroupMemberState(
            GROUP, topics, assignor=rng.choice([sim.assignor] * 4 + ASSIGNORS),
            session_timeout_ms=session_ms, rebalance_timeout_ms=rng.randint(500, 1_500),
            request_timeout_ms=rng.randint(100, 300), retry_backoff_ms=50)
        self.positions: dict[tuple[str, int], int] = {}
        self.revoke_at: dict[tuple[str, int], int] = {}   # partition -> when processing ends
        self.revoke_commit: tuple[int, tuple] | None = None   # (sent_ms, partitions)
        self.commit_inflight_ms: int | None = None
        self.next_commit_ms = 0
        self.slow = False
        self.epochs_seen: list[tuple[str, int]] = []

    # -- driving ---------------------------------------------------------------------------

    def step(self, now: int) -> None:
        sim, rng = self.sim, self.sim.rng
        self.apply(self.state.poll(now), now)
        for tp in sorted(self.positions):
            self.positions[tp] += rng.randint(0, 3)
        # revocations: finish processing, commit, then release
        ready = sorted(tp for tp, at in self.revoke_at.items() if at <= now)
        if ready and self.revoke_commit is None:
            offsets = [(t, p, self.positions[(t, p)], "") for t, p in ready]
            self.revoke_commit = (now, tuple(ready))
            self.send_commit(now, self.state.commit(offsets))
        if self.revoke_commit and now - self.revoke_commit[0] >= COMMIT_TIMEOUT_MS:
            self.finish_revoke(now)
        # periodic commits of what is held and not being revoked
        keep = sorted(tp for tp in self.positions if tp not in self.revoke_at)
        if keep and now >= self.next_commit_ms and self.commit_inflight_ms is None:
            self.commit_inflight_ms = now
            self.next_commit_ms = now + rng.randint(100, 500)
            self.send_commit(now, self.state.commit([(t, p, self.positions[(t, p)], "") for t, p in keep]))
        if self.commit_inflight_ms is not None and now - self.commit_inflight_ms >= COMMIT_TIMEOUT_MS:
            self.commit_inflight_ms = None
        # now and then, a commit with an epoch older than one this member has since received
        if rng.random() < 0.01:
            self.stale_probe(now)
        if self.state.heartbeat_due(now):
            sim.net.send(self.name, COORD, ("hb", self.name, now, self.state.heartbeat(now)))

    def send_commit(self, now: int, req: GroupCommit, probe: bool = False) -> None:
        self.sim.net.send(self.name, COORD, ("commit", self.name, now, req, probe))

    def stale_probe(self, now: int) -> None:
        older = [(mid, e) for mid, e in self.epochs_seen
                 if any(m2 == mid and e2 > e for m2, e2 in self.epochs_seen)]
        if not older:
            return
        member_id, epoch = self.sim.rng.choice(older)
        tp = min(self.state.owned, default=("t0", 0))
        self.send_commit(now, GroupCommit(GROUP, member_id, epoch, [[tp[0], tp[1], 0, "stale"]]), probe=True)
        self.sim.stats["probes_sent"] += 1

    def finish_revoke(self, now: int) -> None:
        _, parts = self.revoke_commit
        self.revoke_commit = None
        for tp in parts:
            self.revoke_at.pop(tp, None)
            self.positions.pop(tp, None)
        self.state.revoked(parts)

    # -- inputs ----------------------------------------------------------------------------

    def apply(self, changes, now: int) -> None:
        sim = self.sim
        for tp in changes.lost:
            self.positions.pop(tp, None)
            self.revoke_at.pop(tp, None)
        if changes.lost and self.revoke_commit is not None:
            self.revoke_commit = None
        for tp in changes.assigned:
            self.positions[tp] = sim.durable.get(tp, (0, ""))[0]
        for tp in changes.revoke:
            delay = sim.rng.randint(2_000, 3_000) if self.slow else sim.rng.randint(0, 300)
            self.revoke_at[tp] = now + delay
        for req in changes.send:
            sim.net.send(self.name, COORD, ("hb", self.name, now, req))
        if changes.lost:
            sim.stats["lost_events"] += 1

    def deliver(self, body: tuple, now: int) -> None:
        kind = body[0]
        if kind == "hb_r":
            _, sent_ms, resp = body
            if resp.error in (ErrorCode.UNKNOWN_MEMBER, ErrorCode.FENCED_EPOCH) \
                    and resp.member_id == self.state.member_id and resp.member_id:
                self.sim.stats["fenced_heartbeats"] += 1
            joining = self.state.member_id == ""
            self.apply(self.state.on_heartbeat_response(resp, sent_ms, now), now)
            if joining and self.state.member_id and self.epochs_seen:
                self.sim.stats["rejoins"] += 1
            if self.state.member_id and resp.member_id == self.state.member_id and resp.error == 0 \
                    and resp.member_epoch == self.state.member_epoch:
                seen = (self.state.member_id, self.state.member_epoch)
                if seen not in self.epochs_seen:
                    self.epochs_seen.append(seen)
                    del self.epochs_seen[:-20]
        elif kind == "commit_r":
            _, sent_ms, req, probe, resp = body
            if probe:
                self.sim.stats["probes_answered"] += 1
                if resp.error == ErrorCode.NONE:
                    self.sim.fail(f"stale-epoch commit accepted: {req}")
                return
            if self.revoke_commit is not None and self.revoke_commit[0] == sent_ms:
                self.finish_revoke(now)
            elif self.commit_inflight_ms == sent_ms:
                self.commit_inflight_ms = None


class Sim:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = SimNet(f"groups-sim/{seed}/net", delay=(1, 5))   # owns the clock (ms) and the network
        self.assignor = ASSIGNORS[seed % len(ASSIGNORS)]
        self.config = GroupConfig(heartbeat_interval_ms=100, max_session_timeout_ms=MAX_SESSION_MS,
                                  max_rebalance_timeout_ms=5_000, default_assignor=self.assignor)
        self.topics = {f"t{i}": self.rng.randint(1, 5) for i in range(self.rng.randint(1, 3))}
        self.durable: dict[tuple[str, int], tuple[int, str]] = {}   # the gossiped offsets
        self.members: dict[str, Member] = {}
        self.next_name = 0
        self.incarnation = 0
        self.coord: GroupCoordinator | None = None
        self.coord_down_until = 0
        self.coord_moving_until = 0
        self.stats = {k: 0 for k in ("probes_sent", "probes_answered", "fenced_heartbeats",
                                     "lost_events", "failovers", "rebalance_fences", "commits_ok", "rejoins")}
        self.now = 0
        self.start_coordinator()

    def fail(self, what: str) -> None:
        raise SimFailure(f"{what} at t={self.now}ms; reproduce with seed={self.seed}")

    # -- the coordinator and its shell --------------------------------------------------------

    def start_coordinator(self) -> None:
        self.incarnation += 1
        self.coord = GroupCoordinator(self.config, random.Random(self.seed * 1_000 + self.incarnation),
                                      now_ms=self.now)
        for topic, n in sorted(self.topics.items()):
            self.coord.set_topic_partitions(topic, n)
        self.coord.load_offsets(GROUP, [(t, p, o, m) for (t, p), (o, m) in sorted(self.durable.items())])

    def coordinator_receive(self, body: tuple) -> None:
        kind, src, sent_ms, req = body[:4]
        if self.coord is None:
            return   # down: the request is lost
        if self.now < self.coord_moving_until:
            resp, effects = error_response(req, ErrorCode.COORDINATOR_MOVED, coordinator="elsewhere"), []
        else:
            resp, effects = self.coord.handle(req, self.now)
        for effect in effects:   # persist first, then answer
            assert isinstance(effect, PersistOffsets)
            for t, p, offset, meta in effect.offsets:
                self.durable[(t, p)] = (offset, meta)
        if kind == "commit":
            if resp.error == ErrorCode.NONE:
                self.stats["commits_ok"] += 1
                self.check_commit_owner(src, req)
            self.net.send(COORD, src, ("commit_r", sent_ms, req, body[4], resp))
        else:
            self.net.send(COORD, src, ("hb_r", sent_ms, resp))

    def check_commit_owner(self, src: str, req: GroupCommit) -> None:
        for t, p, _, _ in req.offsets:
            believers = [n for n, m in self.members.items() if (t, p) in m.state.owned]
            if believers and believers != [src]:
                self.fail(f"commit of {t}/{p} by {src} accepted while {believers} hold it")

    # -- faults ----------------------------------------------------------------------------

    def add_member(self) -> None:
        self.next_name += 1
        names = sorted(self.topics)
        topics = names if self.rng.random() < 0.5 else self.rng.sample(names, self.rng.randint(1, len(names)))
        self.members[f"m{self.next_name}"] = Member(self, f"m{self.next_name}", topics)

    def chaos(self) -> None:
        rng, now = self.rng, self.now
        r = rng.random()
        if r < 0.004 and len(self.members) < MAX_MEMBERS:
            self.add_member()
        elif r < 0.006 and self.members:                      # graceful leave
            name = rng.choice(sorted(self.members))
            m = self.members.pop(name)
            held = sorted(m.positions)
            if held and m.state.member_id:
                m.send_commit(now, m.state.commit([(t, p, m.positions[(t, p)], "") for t, p in held]))
            req, _ = m.state.leave()
            if req is not None:
                self.net.send(name, COORD, ("hb", name, now, req))
        elif r < 0.008 and self.members:                      # crash: beliefs die with it
            self.members.pop(rng.choice(sorted(self.members)))
        elif r < 0.011 and self.members:                      # cut off from the network
            name = rng.choice(sorted(self.members))
            self.net.isolate(name, until=now + rng.randint(100, 3_000))
        elif r < 0.012 and self.members:
            m = self.members[rng.choice(sorted(self.members))]
            names = sorted(self.topics)
            m.state.subscribe(rng.sample(names, rng.randint(1, len(names))))
        elif r < 0.013 and self.members:
            m = self.members[rng.choice(sorted(self.members))]
            m.slow = not m.slow
        elif r < 0.0137 and self.coord is not None and now >= self.coord_moving_until:
            self.stats["failovers"] += 1
            if rng.random() < 0.5:                             # crash, restart empty later
                self.coord = None
                self.coord_down_until = now + rng.randint(100, 1_500)
            else:                                              # moved: old one redirects first
                self.coord_moving_until = now + rng.randint(50, 800)
        elif r < 0.0145:
            topic = rng.choice(sorted(self.topics))
            if self.topics[topic] < 8:
                self.topics[topic] += 1
                if self.coord is not None:
                    self.coord.set_topic_partitions(topic, self.topics[topic])

    # -- the loop ----------------------------------------------------------------------------

    def step(self, chaos: bool) -> None:
        self.now += STEP_MS
        if self.coord is None and self.now >= self.coord_down_until:
            self.start_coordinator()
        if self.coord_moving_until and self.now >= self.coord_moving_until:
            self.coord_moving_until = 0
            self.start_coordinator()                           # the new coordinator starts empty
        for _, _, dest, body in self.net.due(self.now):
            if dest == COORD:
                self.coordinator_receive(body)
            elif dest in self.members:
                self.members[dest].deliver(body, self.now)
        if self.coord is not None:
            for effect in self.coord.tick(self.now):
                if effect.reason.startswith("fenced:"):
                    self.stats["rebalance_fences"] += 1
        if chaos:
            self.chaos()
        for name in sorted(self.members):
            self.members[name].step(self.now)
        self.check_safety()

    def check_safety(self) -> None:
        holders: dict[tuple[str, int], str] = {}
        for name in sorted(self.members):
            for tp in self.members[name].state.owned:
                if tp in holders:
                    self.fail(f"{tp} held by both {holders[tp]} and {name}")
                holders[tp] = name
        if self.coord is not None:
            try:
                self.coord.check_invariants()
            except AssertionError as exc:
                self.fail(f"coordinator invariant: {exc}")

    def converged(self) -> bool:
        if self.coord is None or self.coord_moving_until:
            return False
        expected = {(t, p) for t, n in self.topics.items()
                    if any(t in m.state.topics for m in self.members.values()) for p in range(n)}
        held: dict[tuple[str, int], str] = {}
        for name, m in self.members.items():
            if not m.state.member_id or m.state.revoking:
                return False
            for tp in m.state.owned:
                if tp[0] not in m.state.topics:
                    return False
                held[tp] = name
        desc = self.coord.describe(GROUP)
        coordinator_view = {d["member_id"]: {tuple(tp) for tp in d["assigned"]} for d in desc.members}
        members_view = {m.state.member_id: set(m.state.owned) for m in self.members.values()}
        return set(held) == expected and desc.state == "stable" and coordinator_view == members_view

    def run(self) -> dict:
        self.net.loss = self.rng.choice([0.0, 0.02, 0.05, 0.15])
        self.net.dup = self.rng.choice([0.0, 0.05, 0.1])
        max_delay_ms = self.rng.choice([1, 5, 20, 80])
        self.net.delay = (1, max_delay_ms)
        self.net.slow = (max_delay_ms, STRAGGLER_MS)    # a straggler: a retransmit, much later
        self.net.slow_p = self.rng.choice([0.01, 0.05, 0.1])
        for _ in range(self.rng.randint(1, 4)):
            self.add_member()
        while self.now < CHAOS_MS:
            self.step(chaos=True)
        # heal: no loss, short delays, nobody cut off or slow, at least two members
        self.net.loss = self.net.dup = self.net.slow_p = 0.0
        self.net.delay = (1, 5)
        self.net.heal()
        for m in self.members.values():
            m.slow = False
        while len(self.members) < 2:
            self.add_member()
        settle_start, stable_since = self.now, None
        while True:
            self.step(chaos=False)
            if self.converged():
                stable_since = self.now if stable_since is None else stable_since
                if self.now - stable_since >= STABLE_FOR_MS:
                    return self.stats
            elif stable_since is not None:
                # Right after healing, a member cut off during the chaos may still fence
                # itself, and a straggler may still arrive; after that, nothing may change.
                if self.now - settle_start > STRAGGLER_MS + MAX_SESSION_MS:
                    self.fail("converged, then changed again with no fault")
                stable_since = None
            if self.now - settle_start > SETTLE_MAX_MS:
                owned = {n: sorted(m.state.owned) for n, m in sorted(self.members.items())}
                self.fail(f"did not converge after healing: held {owned}, "
                          f"topics {self.topics}, group {self.coord and self.coord.describe(GROUP)}")


def test_groups_simulation():
    if "GROUPS_SIM_SEED" in os.environ:   # reproduce one run
        seeds = [int(os.environ["GROUPS_SIM_SEED"])]
    else:
        seeds = range(int(os.environ.get("GROUPS_SIM_SEEDS", "80")))
    totals: dict[str, int] = {}
    for seed in seeds:
        for k, v in Sim(seed).run().items():
            totals[k] = totals.get(k, 0) + v
    if len(seeds) == 1:
        return
    # the faults the checks are about did happen
    assert totals["failovers"] > 0 and totals["fenced_heartbeats"] > 0 and totals["rejoins"] > 0, totals
    assert totals["lost_events"] > 0 and totals["rebalance_fences"] > 0, totals
    assert totals["probes_answered"] > 0 and totals["commits_ok"] > 0, totals


def test_simulation_is_deterministic():
    runs = []
    for _ in range(2):
        sim = Sim(7)
        stats = sim.run()
        runs.append((stats, sim.now, sorted(sim.durable.items()),
                     sorted((n, sorted(m.state.owned)) for n, m in sim.members.items())))
    assert runs[0] == runs[1]
