"""One simulated network and clock for every deterministic simulation.

Theory of operation
-------------------
A simulation is one thread stepping one event heap. ``SimNet`` owns that heap and with it
simulated time: entries are ordered by (time, sequence number), the sequence number being
the order in which they were scheduled, so ties never depend on hashing or identity and a
run is a pure function of its seed. Time is an integer in the unit the simulation picks
(the gossip and groups simulations count milliseconds, the replication one microseconds so
that drifting tick lengths stay exact); every delay and deadline given here is in that unit.

The heap holds two kinds of entries:

- *timers* the simulation schedules with ``call_at(t, kind, a, b)``; ``pop()`` hands them
  back as ``(kind, a, b, None)``, untouched;
- *messages* sent with ``send(src, dest, payload)``; ``pop()`` hands a delivered one back as
  ``(DELIVER, src, dest, payload)``. Payloads are opaque (encode them first for wire mode).

Faults, all drawn from one ``random.Random`` seeded from a string (stable across
processes; anything iterated here is sorted or insertion-ordered):

- loss: each send is dropped with probability ``loss``;
- duplication: a kept send is delivered twice with probability ``dup``;
- delay and jitter: each copy takes ``delay`` = (lo, hi), uniform, or with probability
  ``slow_p`` the slow path ``slow`` = (lo, hi); copies overtake each other, so slow
  messages reorder;
- partitions: ``partition(*groups)`` splits nodes into sides (unlisted nodes form one more
  side), ``cut(a, b)`` drops the one-way link a -> b, ``isolate(node, until)`` cuts a node
  off both ways (until a time, or until ``heal``). A link is checked when a message is sent
  *and* when it arrives: a cut also drops what was in flight. ``heal()`` restores every link;
- stalls (a SIGSTOPped process): ``stall(node, until)`` holds every message that arrives
  for the node; at ``until`` (or ``resume(node)``) they are released at once, in arrival
  order: a burst. The node sends nothing meanwhile because the simulation does not step it
  (``stalled(node)`` says so);
- crash: ``crash(node)`` drops everything in flight to or from the node and everything that
  arrives while it is down; ``restart(node)`` brings it back as a new incarnation, so
  messages addressed to or sent by the old one still in flight never arrive.

Counters in ``stats``: sent, lost, duplicated, cut, undeliverable (crashed), held (stalled),
delivered. Everything is bounded by what the simulation sends; nothing here spawns events
on its own except one wake-up per stall.
"""
from __future__ import annotations

import heapq
import random
from typing import Any, Hashable, Iterable

__all__ = ["SimNet", "DELIVER"]

DELIVER = "simnet.deliver"     # the kind ``pop()`` gives a delivered message
_MSG = object()                # internal heap kinds: a message in flight,
_WAKE = object()               # and a stall that may have ended


class SimNet:
    """The seeded event heap, clock and network of one simulation run (see module doc)."""

    def __init__(self, seed: str, *, loss: float = 0.0, dup: float = 0.0,
                 delay: tuple[int, int] = (1, 10), slow_p: float = 0.0,
                 slow: tuple[int, int] = (40, 700)) -> None:
        assert isinstance(seed, str), "seed from a string: stable across processes"
        self.rng = random.Random(seed)
        self.loss, self.dup, self.slow_p = loss, dup, slow_p
        self.delay, self.slow = delay, slow
        self.now = 0
        self._heap: list[tuple] = []
        self._seq = 0
        self._side: dict[Hashable, int] | None = None        # node -> side of a partition
        self._cut: set[tuple[Hashable, Hashable]] = set()     # one-way links that drop everything
        self._isolated: dict[Hashable, float] = {}            # node -> until (inf: until heal)
        self._stalled: dict[Hashable, int] = {}               # node -> until
        self._held: dict[Hashable, list[tuple]] = {}          # node -> messages held by a stall
        self._down: set[Hashable] = set()
        self._faulty_links = False                             # any partition, cut or isolation
        self._incarnation: dict[Hashable, int] = {}
        self.stats = {"sent": 0, "lost": 0, "duplicated": 0, "cut": 0, "undeliverable": 0,
                      "held": 0, "delivered": 0}

    # -- the clock ------------------------------------------------------------------------

    def call_at(self, t: int, kind: Hashable, a: Any = None, b: Any = None) -> None:
        """Schedule a timer: ``pop()`` returns ``(kind, a, b, None)`` at time ``t``."""
        assert t >= self.now, f"timer in the past: {t} < {self.now}"
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b, None))

    def call_after(self, delay: int, kind: Hashable, a: Any = None, b: Any = None) -> None:
        self.call_at(self.now + delay, kind, a, b)

    def next_time(self) -> int | None:
        """When the next entry is due (None: the heap is empty)."""
        return self._heap[0][0] if self._heap else None

    def pop(self, until: int | None = None) -> tuple | None:
        """Advance the clock to the next event and return it; None if the heap is empty or
        the next entry is after ``until``. Dropped and held messages are consumed silently."""
        heap = self._heap
        while heap:
            if until is not None and heap[0][0] > until:
                return None
            t, _, kind, a, b, c = heapq.heappop(heap)
            self.now = t
            if kind is _MSG:
                payload, src_inc, dest_inc = c
                if self._arrive(a, b, src_inc, dest_inc, c):
                    return (DELIVER, a, b, payload)
            elif kind is _WAKE:
                if self._stalled.get(a, -1) == t:
                    self.resume(a)
            else:
                return (kind, a, b, None)
        return None

    def advance(self, t: int) -> None:
        """Move the clock to ``t`` (nothing may be due before it)."""
        assert not self._heap or self._heap[0][0] >= t, "events are due before t"
        self.now = max(self.now, t)

    def due(self, t: int) -> list[tuple]:
        """Every event due up to ``t``, in order, then the clock at ``t`` (for simulations
        that step in fixed increments and handle what arrived since the last step)."""
        out = []
        ev = self.pop(t)
        while ev is not None:
            out.append(ev)
            ev = self.pop(t)
        self.advance(t)
        return out

    # -- messages ---------------------------------------------------------------------------

    def send(self, src: Hashable, dest: Hashable, payload: Any, once: bool = False) -> int:
        """Send one message; returns how many copies are on their way (0, 1 or 2).
        ``once``: never duplicated (a request over one TCP connection: ZeroMQ delivers it
        at most once), though still lost, delayed and reordered like any other."""
        stats, rng = self.stats, self.rng
        stats["sent"] += 1
        if self._faulty_links and self._blocked(src, dest):
            stats["cut"] += 1
            return 0
        if src in self._down:
            stats["undeliverable"] += 1
            return 0
        if self.loss and rng.random() < self.loss:
            stats["lost"] += 1
            return 0
        copies = 2 if self.dup and rng.random() < self.dup and not once else 1
        if copies == 2:
            stats["duplicated"] += 1
        inc = self._incarnation          # empty until the first crash (the common case)
        c = (payload, inc.get(src, 0), inc.get(dest, 0)) if inc else (payload, 0, 0)
        for _ in range(copies):
            lo, hi = self.slow if self.slow_p and rng.random() < self.slow_p else self.delay
            self._seq += 1      # uniform in [lo, hi]; random() is cheaper than randint()
            delay = lo + int(rng.random() * (hi - lo + 1))
            heapq.heappush(self._heap, (self.now + delay, self._seq, _MSG, src, dest, c))
        return copies

    def _arrive(self, src: Hashable, dest: Hashable, src_inc: int, dest_inc: int, c: tuple) -> bool:
        stats, inc = self.stats, self._incarnation
        if inc and (dest in self._down or inc.get(dest, 0) != dest_inc or inc.get(src, 0) != src_inc):
            stats["undeliverable"] += 1
            return False
        if self._faulty_links and self._blocked(src, dest):
            stats["cut"] += 1
            return False
        if self._stalled and dest in self._stalled:
            stats["held"] += 1
            self._held.setdefault(dest, []).append((src, dest, c))
            return False
        stats["delivered"] += 1
        return True

    def _blocked(self, src: Hashable, dest: Hashable) -> bool:
        side = self._side
        if side is not None and side.get(src, -1) != side.get(dest, -1):
            return True
        if self._cut and (src, dest) in self._cut:
            return True
        if self._isolated:
            now = self.now
            if self._isolated.get(src, -1) > now or self._isolated.get(dest, -1) > now:
                return True
        return False

    # -- faults -----------------------------------------------------------------------------

    def partition(self, *groups: Iterable[Hashable]) -> None:
        """Split the network into sides; nodes not listed form one more side together."""
        self._side = {}
        self._faulty_links = True
        for i, group in enumerate(groups):
            for node in group:
                self._side[node] = i

    def cut(self, src: Hashable, dest: Hashable) -> None:
        """Drop everything from ``src`` to ``dest`` (one way) until ``heal``."""
        self._cut.add((src, dest))
        self._faulty_links = True

    def isolate(self, node: Hashable, until: int | None = None) -> None:
        """Cut ``node`` off both ways until ``until`` (or until ``heal``)."""
        self._isolated[node] = float("inf") if until is None else until
        self._faulty_links = True

    def heal(self) -> None:
        """Every link works again. Stalled and crashed nodes stay so (``resume``, ``restart``)."""
        self._side = None
        self._cut.clear()
        self._isolated.clear()
        self._faulty_links = False

    def stall(self, node: Hashable, until: int) -> None:
        """Hold every message for ``node`` until ``until`` (extends a running stall)."""
        if until <= self.now:
            return
        if self._stalled.get(node, -1) < until:
            self._stalled[node] = until
            self.call_at(until, _WAKE, node)

    def stalled(self, node: Hashable) -> bool:
        return node in self._stalled

    def stalled_until(self, node: Hashable) -> int:
        return self._stalled.get(node, 0)

    def resume(self, node: Hashable) -> None:
        """End a stall now: the held messages arrive at once, in the order they came."""
        self._stalled.pop(node, None)
        for src, dest, c in self._held.pop(node, ()):
            self._seq += 1
            heapq.heappush(self._heap, (self.now, self._seq, _MSG, src, dest, c))

    def crash(self, node: Hashable) -> None:
        """The node is down: in-flight messages to and from it are lost, and so is its stall."""
        self._down.add(node)
        self._incarnation[node] = self._incarnation.get(node, 0) + 1
        self._stalled.pop(node, None)
        held = self._held.pop(node, ())
        self.stats["undeliverable"] += len(held)

    def restart(self, node: Hashable) -> None:
        """A new incarnation of the node is up; nothing sent to or by the old one arrives."""
        self._down.discard(node)
        self._incarnation[node] = self._incarnation.get(node, 0) + 1

    def is_down(self, node: Hashable) -> bool:
        return node in self._down
