"""Lifeguard suspicion: a failed probe raises a suspicion, independent peers confirm it,
the suspect refutes it, and a suspicion nobody refuted in time convicts (sans-I/O).

Theory of operation
-------------------
With ``GossipConfig.probes`` liveness is judged by SWIM probes (``mesh.gossip.probes``),
not by heartbeat news. When a node's probe of B fails (no answer, direct or through
``indirect_probes`` peers), it *suspects* B at B's row as it holds it: ``(generation,
heartbeat)``. The suspicion is news: it rides on pings and their answers
(``retransmit_mult * log10(n + 1)`` times from every node that learns it), each holder
marks B SUSPECT and starts its own timer when it learns it, and every peer whose own probe
of B fails too adds itself to the suspicion's *suspecters*. The timer shortens with the
number of independent confirmations (Lifeguard, Dadgar et al. 2018)::

    timeout = max(min, max - (max - min) * log(C + 1) / log(K + 1))

with C the suspecters beyond the first, K = ``SUSPICION_K`` (fewer in a tiny cluster) and
(min, max) = ``GossipConfig.effective_suspicion_ms``. So a killed node, probed by a few
peers within a few rounds whatever the cluster's size, is convicted in about ``min`` after
the news reaches a node, ``min`` and ``max`` scaled by log10(N) (memberlist's rule: a
live suspect's refutation needs O(log N) rounds to reach everyone who holds the suspicion). A suspect that hears of its suspicion *refutes* it: it bumps its
heartbeat (rows only the owner writes, R2), and the newer row spreads the same way; any
holder of a row with a higher heartbeat than the suspicion's drops the suspicion and
answers the suspicion's senders with that row.

Rules (R4 in the package docstring, for the probing mode):
S1 Only a failed probe of our own raises or confirms a suspicion; a suspicion learned
   from a peer is counted, never confirmed by us on its word. Suspecters count only if
   they are known members (a forged list cannot shorten the timer past them).
S2 A suspicion is about one row: (generation, heartbeat). A row of a higher generation,
   a higher heartbeat or the left flag ends it (LEFT stays LEFT: final for its generation).
S3 A node that finds its own loop stalled convicts nobody for ``min`` more (``restart``):
   silence it could not observe is not evidence, and a refutation waiting in its inbox is
   heard first.
S4 Bounded: records only for known rows, at most ``MAX_SUSPECTERS`` suspecters each, at
   most ``MAX_NEWS`` entries per message.

No clock, no randomness, no I/O: times are ``now_ms`` arguments.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mesh.gossip.rows import ALIVE, DEAD, LEFT, MAX_GENERATION, MAX_HEARTBEAT, MAX_NAME_CHARS, SUSPECT

if TYPE_CHECKING:
    from mesh.gossip.config import GossipConfig
    from mesh.gossip.membership import Membership

__all__ = ["Suspicion", "Suspicions", "SUSPICION_K", "MAX_SUSPECTERS", "MAX_NEWS", "parse_suspects",
           "retransmit_limit", "FIRST_BEAT"]

FIRST_BEAT = 1               # a life's first beat (0 -> 1) refutes nothing: views of it may lag
SUSPICION_K = 3              # independent confirmations that bring the timeout down to its min
MAX_SUSPECTERS = SUSPICION_K + 1
MAX_NEWS = 8                 # suspicions (and rows) piggybacked on one message, at most


def retransmit_limit(config: "GossipConfig", nodes: int) -> int:
    """How many messages carry one piece of news from one node (memberlist's rule)."""
    return config.retransmit_mult * max(1, math.ceil(math.log10(nodes + 1)))


class Suspicion:
    __slots__ = ("generation", "heartbeat", "by", "start_ms", "sends")

    def __init__(self, generation: int, heartbeat: int, by: list[str], start_ms: int, sends: int) -> None:
        self.generation = generation
        self.heartbeat = heartbeat
        self.by = by                # suspecters, the first one first (S1)
        self.start_ms = start_ms    # when this node learned it (its timer)
        self.sends = sends          # piggybacks left

    def wire(self, origin: str) -> list:
        return [origin, self.generation, self.heartbeat, list(self.by)]


def parse_suspects(entries: Any, limit: int = MAX_NEWS) -> list[tuple[str, int, int, list[str]]]:
    """Suspicions from the wire; ValueError unless each is [id, generation, heartbeat, [ids]]."""
    if not isinstance(entries, (list, tuple)) or len(entries) > limit:
        raise ValueError("suspects: a list of at most %d" % limit)
    out = []
    for e in entries:
        if not isinstance(e, (list, tuple)) or len(e) != 4:
            raise ValueError("suspect shape")
        o, gen, hb, by = e
        if (type(o) is not str or not 1 <= len(o) <= MAX_NAME_CHARS or type(gen) is not int
                or type(hb) is not int or not 0 <= gen < MAX_GENERATION or not 0 <= hb < MAX_HEARTBEAT
                or not isinstance(by, (list, tuple)) or not 1 <= len(by) <= MAX_SUSPECTERS
                or any(type(s) is not str or not 1 <= len(s) <= MAX_NAME_CHARS for s in by)):
            raise ValueError("suspect fields")
        out.append((o, gen, hb, list(by)))
    return out


class Suspicions:
    """One node's suspicion records (S1-S4) and their timers."""

    def __init__(self, members: "Membership", config: "GossipConfig", stats: dict[str, int]) -> None:
        self._m = members
        self.records: dict[str, Suspicion] = {}
        members.suspected = self.records
        self._config = config
        self._stats = stats
        self.lo_ms, self.hi_ms = config.effective_suspicion_ms
        self.hold_until_ms = 0       # after a local stall: nobody convicted before this (S3)

    def limit(self) -> int:
        return retransmit_limit(self._config, len(self._m.rows))

    def _holds(self, o: str, rec: Suspicion) -> bool:
        """The record still speaks of the row we hold for ``o`` (S2)."""
        r = self._m.rows.get(o)
        return (r is not None and not r.left and r.generation == rec.generation
                and r.heartbeat <= max(rec.heartbeat, FIRST_BEAT))

    def timeout_ms(self, rec: Suspicion) -> int:
        # (min, max) grow with log10(n), as news (the suspicion, then its refutation) needs
        # O(log n) rounds to reach everyone: a suspect must be able to refute in time
        scale = max(1.0, math.log10(max(1, len(self._m.rows))))
        lo, hi = self.lo_ms * scale, self.hi_ms * scale
        k = min(SUSPICION_K, max(0, self._m.others() - 1))    # peers that could confirm
        c = len(rec.by) - 1
        if k <= 0 or c >= k:
            return int(lo)
        frac = math.log(c + 1) / math.log(k + 1)
        return int(max(lo, hi - (hi - lo) * frac))

    def expired(self, o: str, now_ms: int) -> bool:
        """``o`` (SUSPECT here) is to be convicted now: its suspicion outlived its timeout."""
        rec = self.records.get(o)
        return (rec is not None and now_ms >= self.hold_until_ms and self._holds(o, rec)
                and now_ms - rec.start_ms >= self.timeout_ms(rec))

    def suspect(self, o: str, now_ms: int) -> bool:
        """Our own probe of ``o`` failed: raise or confirm its suspicion (S1). True if that
        changed anything."""
        m = self._m
        r = m.rows.get(o)
        if r is None or r.left or o == m.node_id:
            return False
        rec = self.records.get(o)
        me = m.node_id
        if rec is not None and rec.generation == r.generation and max(rec.heartbeat, FIRST_BEAT) >= r.heartbeat:
            if me in rec.by or len(rec.by) >= MAX_SUSPECTERS:
                return False
            rec.by.append(me)
            rec.sends = self.limit()
            return True
        if m.status_of(o) == DEAD:
            return False            # convicted already (a probe of a dead node, to heal partitions)
        self.records[o] = Suspicion(r.generation, max(r.heartbeat, FIRST_BEAT), [me], now_ms, self.limit())
        self._stats["suspicions_raised"] += 1
        if m.status_of(o) == ALIVE:
            m.set_status(o, SUSPECT, now_ms)
        return True

    def merge(self, entries: list[tuple[str, int, int, list[str]]], now_ms: int) -> tuple[list[str], bool]:
        """Suspicions a peer sent. Returns (origins whose newer row the peer should see:
        it spreads a suspicion we can refute, and whether this node itself is suspected
        at its current row: it must refute)."""
        m = self._m
        me = m.node_id
        rows = m.rows
        answer: list[str] = []
        refute = False
        for o, gen, hb, by in entries:
            r = rows.get(o)
            if r is None:
                continue
            hb = max(hb, FIRST_BEAT)
            if o == me:
                if gen == r.generation and hb >= r.heartbeat and not m.left:
                    refute = True
                elif gen <= r.generation:
                    answer.append(o)
                continue
            if r.left or r.generation != gen or r.heartbeat > hb:
                if not r.left and (r.generation > gen or r.heartbeat > hb) and o not in answer:
                    answer.append(o)
                continue
            rec = self.records.get(o)
            known = [s for s in by if s in rows and s != o]
            if rec is None or rec.generation != gen or rec.heartbeat < hb:
                if not known or (rec is None and m.status_of(o) == DEAD):
                    continue
                seen: dict[str, None] = dict.fromkeys(known[:MAX_SUSPECTERS])
                self.records[o] = Suspicion(gen, hb, list(seen), now_ms, self.limit())
                if m.status_of(o) == ALIVE:
                    m.set_status(o, SUSPECT, now_ms)
            elif rec.heartbeat == hb:
                grew = False
                for s in known:
                    if s not in rec.by and len(rec.by) < MAX_SUSPECTERS:
                        rec.by.append(s)
                        grew = True
                if grew:
                    rec.sends = self.limit()
        return answer, refute

    def sweep(self, now_ms: int) -> list[str]:
        """Drop records a newer row ended (S2), and bring their origins back; returns the
        origins whose rows refuted one (news: the refutation spreads). A convicted node's
        record stays until the node is collected: only a refutation revives it (R5)."""
        out = []
        m = self._m
        for o, rec in list(self.records.items()):
            if not self._holds(o, rec):
                del self.records[o]
                r = m.rows.get(o)
                if r is not None:
                    out.append(o)
                    if r.generation == rec.generation and not r.left and m.status_of(o) in (SUSPECT, DEAD):
                        m.set_status(o, ALIVE, now_ms)
        return out

    def restart(self, now_ms: int) -> None:
        """Our own loop stalled: nobody is convicted before ``min`` has passed again, so what
        waited for us meanwhile (a refutation in our inbox) is heard first (S3)."""
        self.hold_until_ms = max(self.hold_until_ms, now_ms + self.lo_ms)

    def news(self, about: str | None = None) -> list:
        """Suspicions for one outgoing message: the one about ``about`` first (the target
        of a ping learns it is suspected, and refutes), then those with piggybacks left."""
        out = []
        m = self._m
        if about is not None and m.status_of(about) not in (ALIVE, LEFT):
            rec = self.records.get(about)
            r = m.rows.get(about)
            if rec is not None:
                out.append(rec.wire(about))
            elif r is not None:     # convicted, its record spent: it still learns why, and refutes
                out.append([about, r.generation, r.heartbeat, [m.node_id]])
        for o, rec in self.records.items():
            if len(out) >= MAX_NEWS:
                break
            if rec.sends > 0 and o != about:
                rec.sends -= 1
                out.append(rec.wire(o))
        return out
