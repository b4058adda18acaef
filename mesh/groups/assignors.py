"""Server-side partition assignors: range, round-robin and cooperative-sticky.

Theory of operation
-------------------
An assignor is a pure function::

    assign(subscriptions, topic_partitions, current) -> {member_id: frozenset((topic, partition))}

* ``subscriptions``: member id -> the topics it subscribes to;
* ``topic_partitions``: topic -> partition count (topics missing here, or with 0
  partitions, are not assignable yet);
* ``current``: member id -> the partitions the group's previous *target* gave it. Only the
  sticky assignor looks at it.

Every result has an entry for every member (possibly empty), and every partition of every
topic that at least one member subscribes to goes to exactly one member subscribed to that
topic. Results are deterministic: members and partitions are always visited in sorted
order, never in set or dict order.

Assignors only compute a *target*. Moving from the old target to the new one safely
(revoke first, hand over only once released) is the coordinator's job (``mesh.groups.coordinator``),
so the "eager" shapes below (range, round-robin) are exactly as safe as the sticky one;
they just move more partitions on every change.

* ``range``: per topic, the subscribed members (sorted by id) each get a contiguous range;
  the first ``n % m`` members get one extra. Same shape as Kafka's RangeAssignor.
* ``round-robin``: all partitions sorted by (topic, partition) are dealt to the sorted
  members in turn, skipping members not subscribed to the partition's topic. Same shape
  as Kafka's RoundRobinAssignor.
* ``cooperative-sticky``: keeps every partition with its current owner when that is still
  valid, gives unowned partitions to the least-loaded eligible member, then moves
  partitions from the most-loaded member to the least-loaded one until no single move
  narrows the gap.
  With identical subscriptions every member ends within one partition of every other;
  with different subscriptions the result is balanced as far as single moves allow.
"""
from __future__ import annotations

import collections
import heapq
from typing import Callable, Mapping

from mesh.wire.types import TopicPartition

__all__ = ["Assignment", "ASSIGNORS", "DEFAULT_ASSIGNOR", "assign",
           "range_assign", "round_robin_assign", "cooperative_sticky_assign"]

Assignment = dict[str, frozenset[TopicPartition]]
Assignor = Callable[[Mapping[str, frozenset[str]], Mapping[str, int],
                     Mapping[str, frozenset[TopicPartition]]], Assignment]


def _subscribers(subscriptions: Mapping[str, frozenset[str]],
                 topic_partitions: Mapping[str, int]) -> dict[str, list[str]]:
    """topic -> sorted member ids subscribed to it, for assignable topics only."""
    out: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in sorted(subscriptions[member]):
            if topic_partitions.get(topic, 0) > 0:
                out.setdefault(topic, []).append(member)
    return out


def range_assign(subscriptions: Mapping[str, frozenset[str]], topic_partitions: Mapping[str, int],
                 current: Mapping[str, frozenset[TopicPartition]] | None = None) -> Assignment:
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic, members in sorted(_subscribers(subscriptions, topic_partitions).items()):
        n = topic_partitions[topic]
        per_member, extra = divmod(n, len(members))
        start = 0
        for i, member in enumerate(members):
            length = per_member + (1 if i < extra else 0)
            result[member].update((topic, p) for p in range(start, start + length))
            start += length
        assert start == n
    return {m: frozenset(parts) for m, parts in result.items()}


def round_robin_assign(subscriptions: Mapping[str, frozenset[str]],
                       topic_partitions: Mapping[str, int],
                       current: Mapping[str, frozenset[TopicPartition]] | None = None) -> Assignment:
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    members = sorted(subscriptions)
    i = 0
    for topic in sorted(_subscribers(subscriptions, topic_partitions)):
        for p in range(topic_partitions[topic]):
            # At least one member subscribes to `topic`, so this finds one within a lap.
            while topic not in subscriptions[members[i % len(members)]]:
                i += 1
            result[members[i % len(members)]].add((topic, p))
            i += 1
    return {m: frozenset(parts) for m, parts in result.items()}


class _LeastLoaded:
    """Per topic, the least-loaded member subscribed to it (lazy heaps: entries whose load
    is out of date are refreshed when they reach the top)."""

    def __init__(self, subscribers: dict[str, list[str]], load: dict[str, int]):
        self.load = load
        self._members_at = collections.Counter(load.values())   # load -> how many members
        self.floor = min(load.values(), default=0)               # the lowest load
        self._topics_of: dict[str, list[str]] = {}
        self._heaps: dict[str, list[tuple[int, str]]] = {}
        for topic, members in subscribers.items():
            heap = [(load[m], m) for m in members]
            heapq.heapify(heap)
            self._heaps[topic] = heap
            for m in members:
                self._topics_of.setdefault(m, []).append(topic)

    def least(self, topic: str, exclude: str | None = None) -> str | None:
        heap = self._heaps[topic]
        parked = []
        found = None
        while heap:
            load, member = heap[0]
            if load != self.load[member]:
                heapq.heapreplace(heap, (self.load[member], member))
            elif member == exclude:
                parked.append(heapq.heappop(heap))
            else:
                found = member
                break
        for entry in parked:
            heapq.heappush(heap, entry)
        return found

    def add(self, member: str, delta: int) -> None:
        self._members_at[self.load[member]] -= 1
        self.load[member] += delta
        self._members_at[self.load[member]] += 1
        self.floor = min(self.floor, self.load[member])
        while not self._members_at[self.floor]:
            self.floor += 1
        if delta < 0:  # an entry that is now too high may be buried: push a fresh one
            for topic in self._topics_of.get(member, ()):
                heapq.heappush(self._heaps[topic], (self.load[member], member))


def cooperative_sticky_assign(subscriptions: Mapping[str, frozenset[str]],
                              topic_partitions: Mapping[str, int],
                              current: Mapping[str, frozenset[TopicPartition]] | None = None
                              ) -> Assignment:
    current = current or {}
    subscribers = _subscribers(subscriptions, topic_partitions)
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    owner: dict[TopicPartition, str] = {}
    # 1. Keep what is still valid: the member still subscribes, the partition still exists,
    #    and no member earlier in id order already kept it.
    for member in sorted(subscriptions):
        for tp in sorted(current.get(member, ())):
            topic, p = tp
            if (topic in subscriptions[member] and 0 <= p < topic_partitions.get(topic, 0)
                    and tp not in owner):
                owner[tp] = member
                result[member].add(tp)
    loads = _LeastLoaded(subscribers, {m: len(parts) for m, parts in result.items()})
    # 2. Unowned partitions to the least-loaded eligible member; partitions with the fewest
    #    candidates first, so they are not squeezed out by ones that could go anywhere.
    unowned = [(len(members), topic, p) for topic, members in subscribers.items()
               for p in range(topic_partitions[topic]) if (topic, p) not in owner]
    for _, topic, p in sorted(unowned):
        member = loads.least(topic)
        assert member is not None
        owner[(topic, p)] = member
        result[member].add((topic, p))
        loads.add(member, 1)
    # 3. Rebalance: the most-loaded member gives partitions, one at a time, to the
    #    least-loaded member that may take each, while the gap is at least two and it is
    #    still the most loaded. Each move lowers the sum of squared loads by at least 2,
    #    so this ends. A member with nothing to give sits out ("stuck") until something
    #    moves. Candidates come from a lazy max-heap: entries whose load is out of date
    #    are dropped, and a fresh entry is pushed whenever a load changes.
    load = loads.load

    def key(m: str) -> tuple[int, str]:
        return -load[m], m

    heap = [key(m) for m in result]
    heapq.heapify(heap)
    stuck: set[str] = set()

    def top(donor: str | None) -> str | None:
        while heap:
            neg_load, m = heap[0]
            if m in stuck or m == donor or -neg_load != load[m]:
                heapq.heappop(heap)
            else:
                return m
        return None

    while (donor := top(None)) is not None:
        heapq.heappop(heap)
        if load[donor] < loads.floor + 2:
            break                            # the most loaded is within one of everyone
        rival = top(donor)
        moved = False
        for tp in sorted(result[donor], reverse=True):
            if rival is not None and key(rival) < key(donor):
                break
            taker = loads.least(tp[0], exclude=donor)
            if taker is None or load[donor] - load[taker] < 2:
                continue
            result[donor].discard(tp)
            result[taker].add(tp)
            loads.add(donor, -1)
            loads.add(taker, 1)
            moved = True
            heapq.heappush(heap, key(taker))
            rival = top(donor)
        if moved:
            for m in stuck:
                heapq.heappush(heap, key(m))
            stuck.clear()
            heapq.heappush(heap, key(donor))
        else:
            stuck.add(donor)
    return {m: frozenset(parts) for m, parts in result.items()}


ASSIGNORS: dict[str, Assignor] = {
    "range": range_assign,
    "round-robin": round_robin_assign,
    "cooperative-sticky": cooperative_sticky_assign,
}
DEFAULT_ASSIGNOR = "cooperative-sticky"


def assign(name: str, subscriptions: Mapping[str, frozenset[str]],
           topic_partitions: Mapping[str, int],
           current: Mapping[str, frozenset[TopicPartition]] | None = None) -> Assignment:
    """Run assignor ``name`` (KeyError if unknown) and check the result's invariants."""
    result = ASSIGNORS[name](subscriptions, topic_partitions, current or {})
    assert result.keys() == subscriptions.keys(), "every member gets an entry"
    total = 0
    for member, parts in result.items():
        assert {t for t, _ in parts} <= subscriptions[member], f"{member} got a topic it does not subscribe to"
        total += len(parts)
    subscribed = set().union(*subscriptions.values()) if subscriptions else set()
    expected = sum(n for t, n in topic_partitions.items() if t in subscribed)
    assert total == expected == len(set().union(*result.values()) if result else ()), \
        "every partition of a subscribed topic is assigned exactly once"
    return result
