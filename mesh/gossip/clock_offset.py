"""This node's clock offset from its peers' clocks, estimated from their wall-clock stamps
(sans-I/O: every reading comes in as an argument).

Theory of operation
===================
- **Samples.** Every gossip SYN and ACK carries its sender's wall clock when it left
  (``wall_ms``). The shell hands each one to ``observe(peer, their_wall_ms, my_wall_ms,
  mono_ms, rtt_ms)``: the sample is ``their + rtt / 2 - mine`` (how far the peer's clock is
  ahead of ours; ``rtt_ms`` is the round trip when the message answers one of ours, an ACK
  to our SYN, else 0: an error of one transit, milliseconds against a bound of seconds).
  Only the newest sample of each peer is kept, at most ``max_peers`` peers.
- **Estimate.** The median of the samples younger than ``max_age_ms`` (monotonic
  ``mono_ms``) and of our own clock (0): the cluster's clocks, ours among them. With three
  brokers and one of them two hours ahead, it says -2 h there and 0 on the other two (a
  median of the peers alone said 1 h on those, each seeing one right and one wrong peer);
  with two brokers whose clocks disagree, both are off by half the gap, beyond the bound,
  so neither deletes by time (which one is wrong cannot be told). The estimate is the
  *cluster's time minus ours*: ``wall + estimate`` is the peer-agreed time.
- **States** (``state``): ``alone`` (no other live node to compare with: our clock is all
  there is), ``unknown`` (peers, but no fresh sample yet: a node that just started),
  ``agrees`` (the estimate within ``bound_ms``), ``off`` (beyond it). Only ``alone`` and
  ``agrees`` are *trusted*: a node takes a time-based destructive action (retention by
  time, producer-id and group expiry) only then.
- **Correction** (``correction_ms``): the estimate while ``off``, else 0. Checks that refuse
  what peers sent because of time (gossip stamps, record timestamps) add it to the local
  clock, so a node with a wrong clock judges by its peers' time; within the bound nothing
  changes.
- **Transitions** (``update``): the state change since the last call, or None; the shell
  logs each change once.
"""
from __future__ import annotations

__all__ = ["ClockOffsets", "ALONE", "UNKNOWN", "AGREES", "OFF", "MAX_WALL_MS"]

ALONE, UNKNOWN, AGREES, OFF = "alone", "unknown", "agrees", "off"
MAX_WALL_MS = 1 << 53      # a stamp at or beyond this is no wall clock (year 287,000)
_MAX_RTT_MS = 10_000       # a round trip longer than this says nothing about transit


class ClockOffsets:
    __slots__ = ("bound_ms", "max_age_ms", "max_peers", "_samples", "_state", "_memo")

    def __init__(self, bound_ms: int = 30_000, max_age_ms: int = 60_000, max_peers: int = 1024) -> None:
        if bound_ms < 0 or max_age_ms <= 0 or max_peers <= 0:
            raise ValueError("bound_ms >= 0, max_age_ms > 0 and max_peers > 0")
        self.bound_ms = bound_ms
        self.max_age_ms = max_age_ms
        self.max_peers = max_peers
        self._samples: dict[str, tuple[int, int]] = {}   # peer -> (offset ms, mono ms when taken)
        self._state: str | None = None
        # (mono ms, valid, estimate) of the last ``estimate_ms``: it is asked per produced batch
        # (the idempotent producer's stamps, through ``correction_ms``), within one millisecond
        # many times; every change of ``_samples`` clears it
        self._memo: tuple = (None, None, None)

    def observe(self, peer: str, their_wall_ms: object, my_wall_ms: int, mono_ms: int, rtt_ms: int = 0) -> bool:
        """Take one stamp of ``peer``; False (ignored) if it is no wall clock reading."""
        if type(their_wall_ms) is not int or not 0 < their_wall_ms < MAX_WALL_MS:
            return False
        if not 0 <= rtt_ms <= _MAX_RTT_MS:
            rtt_ms = 0
        if peer not in self._samples and len(self._samples) >= self.max_peers:
            self._drop_oldest()
        self._samples[peer] = (their_wall_ms + rtt_ms // 2 - my_wall_ms, mono_ms)
        self._memo = (None, None, None)
        return True

    def forget(self, peer: str) -> None:
        self._samples.pop(peer, None)
        self._memo = (None, None, None)

    def _drop_oldest(self) -> None:
        oldest = min(self._samples, key=lambda p: (self._samples[p][1], p))
        del self._samples[oldest]
        self._memo = (None, None, None)

    def _fresh(self, mono_ms: int) -> list[int]:
        horizon = mono_ms - self.max_age_ms
        return sorted(off for off, at in self._samples.values() if at >= horizon)

    def sample_ms(self, peer: str, mono_ms: int) -> int | None:
        """``peer``'s fresh sample (its clock minus ours), None if none."""
        got = self._samples.get(peer)
        return got[0] if got is not None and got[1] >= mono_ms - self.max_age_ms else None

    def peers(self, mono_ms: int) -> int:
        """How many peers the estimate rests on."""
        return len(self._fresh(mono_ms))

    def estimate_ms(self, mono_ms: int) -> int | None:
        """Median of the fresh samples (peers' clock minus ours) and our own 0; None without
        a fresh sample."""
        memo = self._memo
        if memo[0] == mono_ms and memo[1] is not None:
            return memo[2]
        s = self._fresh(mono_ms)
        if not s:
            est = None
        else:
            s = sorted(s + [0])
            mid = len(s) // 2
            est = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
        self._memo = (mono_ms, True, est)   # the same millisecond, no new sample: the same answer
        return est

    def state(self, mono_ms: int, alone: bool) -> str:
        est = self.estimate_ms(mono_ms)
        if est is None:
            return ALONE if alone else UNKNOWN
        return AGREES if abs(est) <= self.bound_ms else OFF

    def trusted(self, mono_ms: int, alone: bool) -> bool:
        return self.state(mono_ms, alone) in (ALONE, AGREES)

    def correction_ms(self, mono_ms: int) -> int:
        est = self.estimate_ms(mono_ms)
        return est if est is not None and abs(est) > self.bound_ms else 0

    def update(self, mono_ms: int, alone: bool) -> tuple[str | None, str] | None:
        """``(old state, new state)`` if the state changed since the last call, else None."""
        new = self.state(mono_ms, alone)
        if new == self._state:
            return None
        old, self._state = self._state, new
        return old, new
