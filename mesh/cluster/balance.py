"""Self-balancing, part 1: the deterministic *target* replica list of every partition.

Pure: no clock, no I/O, no randomness. Every broker runs ``target`` on its gossiped view
about once a second; the same view gives the same targets on every broker (everything is
sorted, ties are broken by ``stable_rank``, a blake2b hash of (pid, node), never by
Python's per-process ``hash()``). Each partition's leader then drives its own partition
toward its target one single-server step at a time (``mesh.cluster.balance_steps``).

Theory of operation (one pass, partitions in pid order, brokers in id order):

- *Eligible* brokers (may receive replicas, may be preferred leader): alive and not
  draining. *Keepable* members: eligible ones, and dead ones judged dead for less than
  ``replace_dead_after_ms`` (they keep their replicas, may come back). Draining brokers,
  brokers dead longer than that, and brokers absent from the view are out of every target,
  except that a current voter is put back (last) when a partition cannot otherwise reach
  its replication factor: going under RF loses redundancy and gains nothing.
- A pinned partition (manual reassignment) gets its pin, as it is; its brokers count
  toward the loads, it is never rebalanced or reordered.
- Keep: a partition's members are its keepable voters (in order) then its eligible
  learners, so a move in progress counts as done (no second move is started for it).
- Surplus (a move in progress, or a lowered RF): drop the member on the most loaded
  broker (ineligible members first, except one only *away*: down or stopped for at most
  ``leader_grace_ms``, as in a restart; then load; then, at equal load, the away one
  before an eligible one; then voter before learner; then highest id: the same choice the
  rebalance below makes, so a half-done move keeps its source). An away broker is not
  dropped ahead of load: it comes back within seconds with the load it had, and dropping
  it for another move's surplus made the next rebalance move a replica back to it. One
  down longer is dropped first, as before: keeping it would leave the partition a live
  replica short until it is replaced (``replace_dead_after_ms``, 10 minutes by default).
- Fill: up to RF with the least loaded eligible brokers (ties by stable rank).
- Rebalance replica counts: move one replica from the most loaded eligible broker A to the
  least loaded B while ``load(A) - load(B) >= 2``; the partition moved is the first of A's
  (in stable-rank order) that B does not hold. Each move strictly lowers the sum of
  squared loads, so the loop ends with counts within 1 (unless no partition can move,
  e.g. B already holds all of A's); a new member is appended at the end of the list.
  While moves are in progress a broker either gives or receives, never both: a broker
  that is a learner somewhere is no source, one dropped from a partition (surplus) is no
  destination. Views lag, so a stale one may start moves a fresher one no longer wants
  (overshoot); without this rule the next view could send a replica straight back.
- Preferred leaders (target[0]): first an eligible member goes first where the first one
  is not eligible (least preferred-leader count), unless the first one is only away: down
  or stopped (not draining) for at most ``leader_grace_ms``, as in a restart or a rolling
  restart. It stays first, so the Raft layer's preferred-leader election hands it its
  leaderships back once it has caught up (Kafka keeps the replica order through restarts
  the same way); after the grace it loses them as before. Then counts are evened out the same way
  (within 1) by moving a member to the front: directly from A to B where a partition A
  leads holds B, else along a path A -> X -> ... -> B (a breadth-first search, bounded by
  ``leader_path_budget`` per pass). Reordering moves no data.

Fixed point: applying every target and computing again gives the same targets (nothing is
surplus, nothing short, loads within 1, leaders within 1). No flapping: within one view
every replica move and every leader move strictly lowers a sum of squares, so a later one
never undoes it; across views that lag, moves in progress count as done and a broker
either gives or receives (above), so a replica is not sent back unless membership changed
(a broker added, drained, dead long enough, back). tests/sim/test_balance_sim.py checks it.

Measure: replica *counts* (every replica weighs 1); ``size_bytes`` and ``disk_bytes`` are
carried for reporting and a future bytes-weighted measure, not used for the decision.
"""
from __future__ import annotations

import bisect
import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Iterable

__all__ = ["BalanceSettings", "BrokerInfo", "PartitionInfo", "eligible_brokers", "stable_rank",
           "target"]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: str
    alive: bool = True
    draining: bool = False
    dead_ms: int = 0            # how long gossip has judged it dead (0 while alive)
    disk_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    pid: int
    topic: str
    partition: int
    rf: int                              # the topic's replication factor: the target size
    voters: tuple[str, ...]              # current config, preferred leader first
    learners: tuple[str, ...] = ()
    pinned: tuple[str, ...] | None = None  # a manual reassignment target
    size_bytes: int = 0
    leader: str | None = None            # who leads it, as far as the view knows
    version: int = 0                     # config version (every config change raises it)


@dataclass(frozen=True, slots=True)
class BalanceSettings:
    replace_dead_after_ms: int = 600_000
    max_moves_per_broker: int = 2        # learners being filled per destination / per leader
    catch_up_lag: int = 1_000            # offsets: a learner this close to the end is caught up
    max_learners_per_partition: int = 1
    leader_path_budget: int = 64         # breadth-first searches per target pass
    leader_grace_ms: int = 60_000        # a preferred leader down this long or less stays preferred


def stable_rank(pid: int, node: str) -> int:
    """A process-independent pseudo-random rank of (pid, node), for tie-breaks."""
    digest = hashlib.blake2b(f"{pid}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def eligible_brokers(brokers: Iterable[BrokerInfo]) -> list[str]:
    return sorted(b.node_id for b in brokers if b.alive and not b.draining)


def target(brokers: Iterable[BrokerInfo], partitions: Iterable[PartitionInfo],
           settings: BalanceSettings = BalanceSettings()) -> dict[int, tuple[str, ...]]:
    """pid -> target voters (preferred leader first) for every partition of the view."""
    return _Pass(brokers, partitions, settings).run()


class _Pass:
    """One target computation. ``members[pid]`` is the target being built, ``load`` the
    replica count of every broker over all targets, ``lead`` the preferred-leader count."""

    def __init__(self, brokers: Iterable[BrokerInfo], partitions: Iterable[PartitionInfo],
                 settings: BalanceSettings):
        self.settings = settings
        self.info = {b.node_id: b for b in sorted(brokers, key=lambda b: b.node_id)}
        self.eligible = [n for n, b in self.info.items() if b.alive and not b.draining]
        self.is_eligible = set(self.eligible)
        self.parts = sorted(partitions, key=lambda p: p.pid)
        self.members: dict[int, list[str]] = {}
        self.pinned: set[int] = set()
        self.load: dict[str, int] = {}
        self.giving: set[str] = set()       # brokers a move in progress takes a replica from
        self.receiving: set[str] = set()    # brokers a move in progress copies a replica to

    def keepable(self, node: str) -> bool:
        b = self.info.get(node)
        return (b is not None and not b.draining
                and (b.alive or b.dead_ms < self.settings.replace_dead_after_ms))

    def run(self) -> dict[int, tuple[str, ...]]:
        self.keep()
        self.drop_surplus()
        self.fill()
        self.rebalance()
        self.lead_eligible_first()
        self.balance_leaders()
        return {pid: tuple(m) for pid, m in self.members.items()}

    def add_load(self, node: str, delta: int) -> None:
        self.load[node] = self.load.get(node, 0) + delta

    def keep(self) -> None:
        for p in self.parts:
            if p.pinned is not None:
                m = list(dict.fromkeys(p.pinned))
                self.pinned.add(p.pid)
            else:
                m = list(dict.fromkeys([v for v in p.voters if self.keepable(v)]
                                       + [x for x in p.learners if x in self.is_eligible]))
                self.receiving.update(x for x in p.learners if x in self.is_eligible)
            self.members[p.pid] = m
            for n in m:
                self.add_load(n, 1)

    def drop_surplus(self) -> None:
        for p in self.parts:
            m = self.members[p.pid]
            if p.pid in self.pinned:
                continue
            while len(m) > max(p.rf, 0):
                voters = set(p.voters)
                victim = max(m, key=lambda n: (n not in self.is_eligible and not self.away(n),
                                               self.load.get(n, 0), n not in self.is_eligible, n in voters, n))
                m.remove(victim)
                self.add_load(victim, -1)
                self.giving.add(victim)

    def fill(self) -> None:
        for p in self.parts:
            m = self.members[p.pid]
            if p.pid in self.pinned or len(m) >= p.rf:
                continue
            have = set(m)
            free = [n for n in self.eligible if n not in have]
            free.sort(key=lambda n: (self.load.get(n, 0), stable_rank(p.pid, n)))
            for n in free[:p.rf - len(m)]:
                m.append(n)
                self.add_load(n, 1)
            for v in p.voters:   # nowhere to go: an ineligible current voter stays (last)
                if len(m) >= p.rf:
                    break
                if v not in m:
                    m.append(v)
                    self.add_load(v, 1)

    def spread(self, counts: dict[str, int]) -> int:
        return (max(counts.get(n, 0) for n in self.eligible)
                - min(counts.get(n, 0) for n in self.eligible))

    def rebalance(self) -> None:
        if len(self.eligible) < 2 or self.spread(self.load) < 2:
            return
        owned: dict[str, list[tuple[int, int]]] = {n: [] for n in self.eligible}
        for pid, m in self.members.items():
            if pid not in self.pinned:
                for n in m:
                    if n in owned:
                        owned[n].append((stable_rank(pid, n), pid))
        for lst in owned.values():
            lst.sort()
        load = self.load
        while True:
            order = sorted(self.eligible, key=lambda n: (load.get(n, 0), n))
            if load.get(order[-1], 0) - load.get(order[0], 0) < 2:
                return
            if not self.move_one(order, owned):
                return

    def move_one(self, order: list[str], owned: dict[str, list[tuple[int, int]]]) -> bool:
        load = self.load
        for a in reversed(order):
            if load.get(a, 0) - load.get(order[0], 0) < 2:
                return False
            if a in self.receiving:
                continue
            for b in order:
                if load.get(a, 0) - load.get(b, 0) < 2:
                    break
                if b in self.giving:
                    continue
                lst = owned[a]
                for i, (_, pid) in enumerate(lst):
                    m = self.members[pid]
                    if b not in m:
                        del lst[i]
                        m.remove(a)
                        m.append(b)
                        self.add_load(a, -1)
                        self.add_load(b, 1)
                        bisect.insort(owned[b], (stable_rank(pid, b), pid))
                        return True
        return False

    def lead_eligible_first(self) -> None:
        self.lead = {n: 0 for n in self.eligible}
        for m in self.members.values():
            if m and m[0] in self.lead:
                self.lead[m[0]] += 1
        for pid, m in self.members.items():
            if pid in self.pinned or not m or m[0] in self.is_eligible or self.away(m[0]):
                continue
            cands = [n for n in m if n in self.is_eligible]
            if cands:
                best = min(cands, key=lambda n: (self.lead[n], stable_rank(pid, n)))
                m.remove(best)
                m.insert(0, best)
                self.lead[best] += 1

    def away(self, node: str) -> bool:
        """Down or stopped for at most ``leader_grace_ms``, and not leaving for good."""
        b = self.info.get(node)
        return (b is not None and not b.alive and not b.draining
                and b.dead_ms <= self.settings.leader_grace_ms)

    def balance_leaders(self) -> None:
        if len(self.eligible) < 2 or self.spread(self.lead) < 2:
            return
        led: dict[str, list[tuple[int, int]]] = {n: [] for n in self.eligible}
        for pid, m in self.members.items():
            if pid not in self.pinned and m and m[0] in led:
                led[m[0]].append((stable_rank(pid, "lead:" + m[0]), pid))
        for lst in led.values():
            lst.sort()
        budget = self.settings.leader_path_budget
        lead = self.lead
        while True:
            order = sorted(self.eligible, key=lambda n: (lead[n], n))
            low = lead[order[0]]
            moved = False
            for a in reversed(order):
                if lead[a] - low < 2:
                    break
                if self.lead_direct(a, led):
                    moved = True
                    break
                if budget > 0:
                    budget -= 1
                    if self.lead_path(a, led):
                        moved = True
                        break
            if not moved:
                return

    def set_leader(self, pid: int, new: str, led: dict[str, list[tuple[int, int]]]) -> None:
        m = self.members[pid]
        old = m[0]
        lst = led[old]
        lst.remove((stable_rank(pid, "lead:" + old), pid))
        m.remove(new)
        m.insert(0, new)
        bisect.insort(led[new], (stable_rank(pid, "lead:" + new), pid))
        self.lead[old] -= 1
        self.lead[new] += 1

    def lead_direct(self, a: str, led: dict[str, list[tuple[int, int]]]) -> bool:
        """Give one of ``a``'s preferred leaderships to its least-leading co-member."""
        low = min(self.lead.values())
        best: tuple[int, int, str] | None = None
        for _, pid in led[a]:
            for n in self.members[pid][1:]:
                if n in self.is_eligible and (best is None or self.lead[n] < best[0]):
                    best = (self.lead[n], pid, n)
            if best is not None and best[0] == low:
                break                   # nobody leads fewer: the first such one is it
        if best is None or self.lead[a] - best[0] < 2:
            return False
        self.set_leader(best[1], best[2], led)
        return True

    def lead_path(self, a: str, led: dict[str, list[tuple[int, int]]]) -> bool:
        """Shift one leadership along a chain a -> x -> ... -> b with lead(b) <= lead(a) - 2."""
        via: dict[str, tuple[str, int]] = {}
        queue = deque([a])
        seen = {a}
        while queue:
            x = queue.popleft()
            for _, pid in led[x]:
                for n in self.members[pid][1:]:
                    if n in seen or n not in self.is_eligible:
                        continue
                    seen.add(n)
                    via[n] = (x, pid)
                    if self.lead[n] <= self.lead[a] - 2:
                        chain = []
                        while n != a:
                            x2, pid2 = via[n]
                            chain.append((pid2, n))
                            n = x2
                        for pid2, n2 in chain:      # from the far end: counts stay valid
                            self.set_leader(pid2, n2, led)
                        return True
                    queue.append(n)
        return False
