"""SWIM probes: direct pings, indirect pings through k peers, news piggybacked (sans-I/O).

Theory of operation
-------------------
With ``GossipConfig.probes``, every round a node pings one random member (a suspect it
has not probed itself since it learned of the suspicion first: its own, independent
evidence; else one still unconfirmed, learned second-hand, half the time if there is any). An answer within
``probe_timeout_ms`` (times the local health factor, below) ends the probe. Without one,
the node asks ``indirect_probes`` random members to ping the target for it (a ping
*request*); an answer relayed by any of them within three timeouts of the start ends the
probe. Otherwise the probe failed and the node suspects the target
(``mesh.gossip.suspicion``). Each member is probed by someone in a round with probability
about 1 - 1/e, whatever N: a dead node is found, and confirmed by independent peers, in a
few rounds at any size (SWIM, Das et al. 2002).

News rides on every ping and answer: suspicions, and rows worth spreading (refutations:
a suspect's newer heartbeat), each sent ``retransmit_limit`` times by every node that
learns it. A ping to a target always carries the suspicion about it, so a live suspect
learns it at once and answers with its refuting row. A suspect refutes by bumping its
heartbeat (rows only the owner writes, R2) and tells its suspecters directly.

Local health (Lifeguard's LHM): a failed probe of ours, or a suspicion of ourselves,
raises ``health`` (at most ``_MAX_HEALTH``); an answered probe lowers it. Probe timeouts
are multiplied by ``1 + health``: a node that is itself slow (CPU starved, not stalled
enough to notice) waits longer before it blames others. A node that finds its own loop
stalled drops its probes in flight (their silence is not evidence) and restarts its
suspicion timers (S3).

Bounds: ``_MAX_IN_FLIGHT`` probes and ``_MAX_RELAYS`` relayed pings at once, ``MAX_NEWS``
rows and suspicions per message; pings from a node we do not know at that address are
ignored (a ping request makes us ping a member only, never an address from the wire).
"""
from __future__ import annotations

import random
from typing import Any

from mesh.gossip.config import GossipConfig
from mesh.gossip.membership import Membership
from mesh.gossip.messages import GossipPing, GossipPingAck
from mesh.gossip.parsing import Malformed, parse_rows
from mesh.gossip.rows import ALIVE, DEAD, MAX_COUNTER, MAX_NAME_CHARS, SUSPECT
from mesh.gossip.suspicion import FIRST_BEAT, MAX_NEWS, MAX_SUSPECTERS, Suspicions, parse_suspects
from mesh.wire.effects import Send

__all__ = ["Probes"]

_MAX_IN_FLIGHT = 4
_MAX_RELAYS = 256
_MAX_HEALTH = 8
_INDIRECT_SPAN = 3            # a probe fails this many timeouts after it started


class _Probe:
    __slots__ = ("target", "generation", "start_ms", "indirect")

    def __init__(self, target: str, generation: int, start_ms: int) -> None:
        self.target = target
        self.generation = generation    # a probe of one life says nothing of the next (a restart)
        self.start_ms = start_ms
        self.indirect = False


class Probes:
    """One node's probes, relays and piggybacked news."""

    def __init__(self, members: Membership, suspicions: Suspicions, rng: random.Random,
                 config: GossipConfig, stats: dict[str, int]) -> None:
        self._m = members
        self._sus = suspicions
        self._rng = rng
        self._config = config
        self._stats = stats
        self._seq = rng.randrange(1 << 30)
        self.in_flight: dict[int, _Probe] = {}
        self.relays: dict[int, tuple[str, int, str, int]] = {}   # our seq -> (requester, its seq, target, until)
        self.spread: dict[str, int] = {}     # rows to piggyback: origin -> sends left
        self.health = 0
        self._tell: list[str] = []           # our suspecters, told of a refutation at once
        self._own_hb = 0

    # ------------------------------------------------------------- time ----------------

    def timeout_ms(self) -> int:
        return self._config.effective_probe_timeout_ms * (1 + self.health)

    def next_deadline_ms(self) -> int | None:
        if not self.in_flight:
            return None
        t = self.timeout_ms()
        return min(p.start_ms + (_INDIRECT_SPAN * t if p.indirect else t) for p in self.in_flight.values())

    def on_stall(self, now_ms: int) -> None:
        self.in_flight.clear()
        self.relays.clear()
        self._sus.restart(now_ms)

    def round(self, now_ms: int) -> list[Send]:
        """Once a round: spread refutations found, start a probe."""
        m = self._m
        for o in self._sus.sweep(now_ms):
            self.spread[o] = self._sus.limit()
        hb = m.rows[m.node_id].heartbeat
        if hb != self._own_hb:       # our heartbeat moved (our first beat): news
            self._own_hb = hb
            self.spread[m.node_id] = self._sus.limit()
        out: list[Send] = []
        if len(self.in_flight) < _MAX_IN_FLIGHT and m.others() > 0:
            target = self._pick()
            if target is not None:
                out.append(self._ping(target, now_ms))
        if m.status and self._rng.random() < self._config.unreachable_probe_prob:
            dead = [o for o, (st, _) in m.status.items() if st == DEAD]
            if dead:   # alive after all (a healed partition), it refutes its suspicion and is back
                out.append(self._ping(self._rng.choice(dead), now_ms))
        return out

    def tick(self, now_ms: int) -> list[Send]:
        """Probes past their deadlines: go indirect, or fail."""
        if not self.in_flight and not self.relays:
            return []
        out: list[Send] = []
        t = self.timeout_ms()
        for seq, p in list(self.in_flight.items()):
            age = now_ms - p.start_ms
            if age >= _INDIRECT_SPAN * t:
                del self.in_flight[seq]
                self._stats["probes_failed"] += 1
                r = self._m.rows.get(p.target)
                if r is not None and r.generation == p.generation and self._sus.suspect(p.target, now_ms):
                    self.health = min(_MAX_HEALTH, self.health + 1)
            elif age >= t and not p.indirect:
                p.indirect = True
                out += self._ask_helpers(seq, p.target)
        for seq, (_, _, _, until) in list(self.relays.items()):
            if now_ms > until:
                del self.relays[seq]
        return out

    # ------------------------------------------------------------- sending -------------

    def _pick(self) -> str | None:
        m = self._m
        rng = self._rng
        probing = {p.target for p in self.in_flight.values()}
        me = m.node_id
        for o, rec in self._sus.records.items():   # a suspicion we have not confirmed: our own probe
            if me not in rec.by and o not in probing and m.status_of(o) == SUSPECT:
                return o
        if m.status and rng.random() < 0.5:
            records = self._sus.records
            fresh = [o for o, (st, _) in m.status.items() if st == SUSPECT and o not in records]
            if fresh:
                return rng.choice(fresh)
        targets = m.targets
        if len(targets) < 2:
            return None
        p = me
        while p == me:
            p = targets[int(rng.random() * len(targets))]
        return p

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) % MAX_COUNTER
        return self._seq

    def _ping(self, target: str, now_ms: int) -> Send:
        seq = self._next_seq()
        self.in_flight[seq] = _Probe(target, self._m.rows[target].generation, now_ms)
        self._stats["probes_sent"] += 1
        return Send(self._m.rows[target].address, GossipPing(self._m.node_id, seq, "", self._rows_news(),
                                                             self._sus.news(target)))

    def _ask_helpers(self, seq: int, target: str) -> list[Send]:
        m = self._m
        k = self._config.indirect_probes
        pool = [o for o in m.targets if o != m.node_id and o != target and m.status_of(o) == ALIVE]
        if not pool or k <= 0:
            return []
        helpers = self._rng.sample(pool, min(k, len(pool)))
        self._stats["indirect_probes_sent"] += len(helpers)
        return [Send(m.rows[h].address, GossipPing(m.node_id, seq, target, self._rows_news(), self._sus.news()))
                for h in helpers]

    def _rows_news(self, extra: list[str] = ()) -> list:
        m = self._m
        out = []
        for o in extra:
            r = m.rows.get(o)
            if r is not None and r not in out:
                out.append(r)
        for o, left in list(self.spread.items()):
            if len(out) >= MAX_NEWS:
                break
            r = m.rows.get(o)
            if r is None or left <= 0:
                del self.spread[o]
                continue
            self.spread[o] = left - 1
            if r not in out:
                out.append(r)
        if any(r.node_id == m.node_id for r in out):
            m.sending_own_row()
        return out

    # ------------------------------------------------------------- receiving -----------

    def _news(self, msg: Any, now_ms: int) -> tuple[list[str], bool]:
        """Parse and apply a ping's news (rows first: a refutation ends a suspicion)."""
        try:
            suspects = parse_suspects(msg.suspects)
        except ValueError as exc:
            raise Malformed(str(exc)) from exc
        rows = parse_rows(msg.rows, MAX_NEWS)
        m = self._m
        if rows:
            known = {o: r for o, r in rows.items() if o in m.rows}   # news of members only
            if known:
                before = [(o, m.rows[o].heartbeat) for o in known]
                m.merge_rows(known, now_ms)
                limit = self._sus.limit()
                for o, hb in before:      # a newer beat past the first one is a refutation: pass it on
                    r = m.rows.get(o)
                    if r is not None and r.heartbeat > max(hb, FIRST_BEAT) and o != m.node_id:
                        self.spread[o] = limit
        answer, refute = self._sus.merge(suspects, now_ms) if suspects else ([], False)
        if refute:
            self._refute(suspects, now_ms)
        return answer, refute

    def _refute(self, suspects: list, now_ms: int) -> None:
        """We are suspected at our current row: a newer heartbeat says otherwise (R2)."""
        m = self._m
        m.beat()
        while m.rows[m.node_id].heartbeat <= FIRST_BEAT:
            m.beat()
        self._stats["refutations"] += 1
        self.health = min(_MAX_HEALTH, self.health + 1)
        self.spread[m.node_id] = self._sus.limit()
        self._tell = [s for o, _, _, by in suspects if o == m.node_id for s in by][:MAX_SUSPECTERS]

    def _check_header(self, msg: Any) -> None:
        if (type(msg.node_id) is not str or not 1 <= len(msg.node_id) <= MAX_NAME_CHARS
                or type(msg.seq) is not int or not 0 <= msg.seq <= MAX_COUNTER):
            raise Malformed("ping header")

    def on_ping(self, src: str, msg: GossipPing, now_ms: int) -> list[Send]:
        self._check_header(msg)
        if type(msg.target) is not str or len(msg.target) > MAX_NAME_CHARS:
            raise Malformed("ping target")
        m = self._m
        sender = m.rows.get(msg.node_id)
        if sender is None or sender.address != src or msg.node_id == m.node_id:
            self._stats["pings_ignored"] += 1     # a stranger (or not at its address): no answer
            return []
        self._tell = []
        answer, _ = self._news(msg, now_ms)
        if m.status_of(msg.node_id) == SUSPECT and msg.node_id not in self._sus.records:
            m.heard_from(msg.node_id, sender, now_ms)      # it pinged us itself: not unconfirmed
        out = self._told()
        if not msg.target or msg.target == m.node_id:
            out.append(Send(src, GossipPingAck(m.node_id, msg.seq, self._rows_news(answer), self._sus.news())))
            return out
        t = m.rows.get(msg.target)
        if t is None or msg.target == msg.node_id or t.address == src:
            return out
        seq = self._next_seq()
        if len(self.relays) >= _MAX_RELAYS:
            del self.relays[next(iter(self.relays))]
        self.relays[seq] = (src, msg.seq, msg.target, now_ms + _INDIRECT_SPAN * self.timeout_ms())
        self._stats["relayed_pings"] += 1
        out.append(Send(t.address, GossipPing(m.node_id, seq, "", self._rows_news(answer),
                                              self._sus.news(msg.target))))
        return out

    def on_ack(self, src: str, msg: GossipPingAck, now_ms: int) -> list[Send]:
        self._check_header(msg)
        m = self._m
        if msg.node_id not in m.rows:
            return []
        self._tell = []
        answer, _ = self._news(msg, now_ms)
        for o in answer:                # we cannot answer an answer: spread the refuting row
            self.spread[o] = self._sus.limit()
        out = self._told()
        relay = self.relays.pop(msg.seq, None)
        if relay is not None:
            requester, their_seq, target, _ = relay
            if target == msg.node_id and m.rows[target].address == src:
                out.append(Send(requester, GossipPingAck(target, their_seq, self._rows_news(), self._sus.news())))
            return out
        p = self.in_flight.get(msg.seq)
        if p is not None and p.target == msg.node_id:
            del self.in_flight[msg.seq]
            self.health = max(0, self.health - 1)
            if m.status_of(p.target) == SUSPECT and p.target not in self._sus.records:
                m.detector.report(p.target, now_ms)          # unconfirmed until it answered
                m.set_status(p.target, ALIVE, now_ms)
        return out

    def _told(self) -> list[Send]:
        """After a refutation: our newer row straight to our suspecters."""
        tell, self._tell = self._tell, []
        m = self._m
        out = []
        for s in tell:
            r = m.rows.get(s)
            if r is not None and s != m.node_id:
                out.append(Send(r.address, GossipPingAck(m.node_id, 0, self._rows_news([m.node_id]), [])))
        return out
