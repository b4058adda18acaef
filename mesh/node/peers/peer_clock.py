"""The node's clock checked against its peers' (the shell of ``mesh.gossip.clock_offset``).

A ``PeerClock`` wraps the node's ``Clock``: ``now_ms`` and ``wall_ms`` are the local clock's,
unchanged; gossip SYNs and ACKs leave stamped with ``wall_ms`` (``stamp``) and every stamp
received is a sample (``observe``; an ACK answering our SYN also knows its round trip).
From them: ``offset_ms()`` (the peers' clock minus ours: the gauge
``mesh_clock_offset_seconds``), ``trusted()`` (False while no peer was heard yet, or
beyond ``bound_ms``: the node then takes no time-based destructive action: retention by
time, producer-id expiry, group expiry) and ``agreed_wall_ms()`` (the local clock, or the
peers' time while ours is off: what checks that would refuse a peer's data because of time
judge by; ``agreed`` is a ``Clock`` on that time). ``check()`` (every loop turn) logs each
change of state once: an error when the clock leaves the bound (again if, still off, the
estimate moves by more than the bound: the first peer heard alone gives half the gap), a
warning when it comes back.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from mesh.gossip import GossipAck, GossipSyn
from mesh.gossip.clock_offset import AGREES, ALONE, OFF, UNKNOWN, ClockOffsets
from mesh.clock import SYSTEM_CLOCK, Clock

__all__ = ["PeerClock"]

log = logging.getLogger("mesh.node.clock")

_SYN_MEMORY = 1024         # peers whose last SYN send time we remember (for round trips)


class PeerClock:
    def __init__(self, clock: Clock = SYSTEM_CLOCK, bound_ms: int = 30_000,
                 alone: Callable[[], bool] = lambda: True) -> None:
        self.base = clock
        self.offsets = ClockOffsets(bound_ms=bound_ms)
        self.alone = alone          # the node sets it: no other live node to compare with
        self._syn_sent: dict[str, int] = {}   # address -> mono ms our last SYN to it left
        self._logged_ms: int | None = None    # the estimate last logged while off

    # -- the Clock protocol: the local clock, unchanged ----------------------------------
    def now_ms(self) -> int:
        return self.base.now_ms()

    def wall_ms(self) -> int:
        return self.base.wall_ms()

    # -- what the peers say ---------------------------------------------------------------
    def offset_ms(self) -> int | None:
        return self.offsets.estimate_ms(self.base.now_ms())

    def sample_ms(self, peer: str) -> int | None:
        """``peer``'s clock minus ours by its last fresh stamp (None: none)."""
        return self.offsets.sample_ms(peer, self.base.now_ms())

    def state(self) -> str:
        return self.offsets.state(self.base.now_ms(), self.alone())

    def trusted(self) -> bool:
        return self.offsets.trusted(self.base.now_ms(), self.alone())

    def correction_ms(self) -> int:
        return self.offsets.correction_ms(self.base.now_ms())

    def agreed_wall_ms(self) -> int:
        return self.base.wall_ms() + self.offsets.correction_ms(self.base.now_ms())

    @property
    def agreed(self) -> "_Agreed":
        """A ``Clock`` whose wall clock is ``agreed_wall_ms``: for stamps that peers judge
        (committed offsets, idempotent-producer state), so a wrong clock writes none they
        would refuse, nor one that expires at once when the clock is fixed."""
        return _Agreed(self)

    def stamp(self, dest: str, msg):
        """``msg`` as it leaves for ``dest``: gossip SYN and ACK carry our wall clock."""
        kind = type(msg)
        if kind is GossipSyn or kind is GossipAck:
            if kind is GossipSyn:
                if len(self._syn_sent) >= _SYN_MEMORY and dest not in self._syn_sent:
                    self._syn_sent.clear()
                self._syn_sent[dest] = self.base.now_ms()
            return dataclasses.replace(msg, wall_ms=self.base.wall_ms())
        return msg

    def observe(self, src: str, msg) -> None:
        """A gossip message arrived from ``src``: take its stamp (if any) as a sample."""
        stamp = getattr(msg, "wall_ms", 0)
        if not stamp:
            return
        mono = self.base.now_ms()
        rtt = 0
        if type(msg) is GossipAck:
            sent = self._syn_sent.pop(src, None)
            rtt = mono - sent if sent is not None else 0
        self.offsets.observe(src, stamp, self.base.wall_ms(), mono, rtt)

    def check(self) -> str | None:
        """Log a change of state once; returns the new state when it changed."""
        mono = self.base.now_ms()
        change = self.offsets.update(mono, self.alone())
        est = self.offsets.estimate_ms(mono)
        if change is None:
            # still off, but the estimate moved by more than the bound (the first peer heard
            # alone makes half the gap with our own 0; the next ones the whole): say it again
            if self._logged_ms is not None and est is not None and abs(est - self._logged_ms) > self.offsets.bound_ms:
                self._logged_ms = est
                log.error("clock offset now %+.3f s from %d peer(s): still beyond the %.0f s bound",
                          est / 1000, self.offsets.peers(mono), self.offsets.bound_ms / 1000)
            return None
        old, new = change
        self._logged_ms = est if new == OFF else None
        n = self.offsets.peers(mono)
        bound_s = self.offsets.bound_ms / 1000
        if new == OFF:
            log.error("clock offset %+.3f s from %d peer(s), beyond the %.0f s bound: this broker's clock is "
                      "wrong; no retention by time, producer-id or group expiry until it agrees again "
                      "(stamps judged by the peers' time)", est / 1000, n, bound_s)
        elif new == AGREES and old in (OFF, UNKNOWN):
            (log.warning if old == OFF else log.info)(
                "clock offset %+.3f s from %d peer(s), within the %.0f s bound: the clock agrees%s",
                est / 1000, n, bound_s, " again" if old == OFF else "")
        elif new == UNKNOWN and old is not None:
            log.warning("clock offset unknown (no peer stamp in %d s): no time-based deletion until one is heard",
                        self.offsets.max_age_ms // 1000)
        elif new == ALONE and old == OFF:
            log.warning("clock: no peer to compare with any more; going by the local clock")
        return new


class _Agreed:
    __slots__ = ("_pc",)

    def __init__(self, pc: PeerClock) -> None:
        self._pc = pc

    def now_ms(self) -> int:
        return self._pc.base.now_ms()

    def wall_ms(self) -> int:
        return self._pc.agreed_wall_ms()
