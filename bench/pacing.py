"""Open-loop rate pacing for the producer workers, as the OpenMessaging Benchmark does it.

Theory of operation
-------------------
With a target rate R (records/s) the k-th record (k = 0, 1, ...) is *due* at
``t0 + k / R``, whatever happened to the records before it: the schedule never waits for
an acknowledgement, so a slow broker makes records late instead of making the producer
send fewer of them. Every record carries its due time (the "intended" time) and its
latency is measured from that time, not from the moment the client got round to
``send()``: time a record spent queued behind a late predecessor counts (no coordinated
omission). Past saturation the schedule runs ahead of what the system absorbs and the
measured latency grows with the run, which is the knee of a rate sweep.

Pure arithmetic on integer nanoseconds: no clock is read here; callers pass ``now_ns``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RateSchedule"]

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class RateSchedule:
    """Records due at ``t0_ns + k * 1e9 / rate_per_s``; at most ``total`` of them (0 = no
    limit) and none due at or after ``end_ns`` (None = no end)."""

    t0_ns: int
    rate_per_s: float
    total: int = 0
    end_ns: int | None = None

    def __post_init__(self):
        assert self.rate_per_s > 0, "a schedule needs a positive rate"

    def due_ns(self, k: int) -> int:
        """When record ``k`` is due (its intended send time)."""
        return self.t0_ns + int(k * NS_PER_S / self.rate_per_s)

    def due_by(self, now_ns: int) -> int:
        """How many records are due by ``now_ns`` (records 0 .. n-1), within the limits."""
        if now_ns < self.t0_ns:
            return 0
        n = int((now_ns - self.t0_ns) * self.rate_per_s / NS_PER_S) + 1
        if self.total:
            n = min(n, self.total)
        if self.end_ns is not None:
            n = min(n, self.count_before_end())
        return n

    def count_before_end(self) -> int:
        """Records due before ``end_ns`` (all of ``total`` when there is no end)."""
        if self.end_ns is None:
            return self.total
        n = max(0, int((self.end_ns - self.t0_ns) * self.rate_per_s / NS_PER_S) - 1)
        while self.due_ns(n) < self.end_ns:  # the first record due at or after the end
            n += 1
        return min(n, self.total) if self.total else n

    def done(self, sent: int) -> bool:
        """True when ``sent`` records are all the schedule has."""
        limit = self.count_before_end() if self.end_ns is not None else self.total
        return bool(limit) and sent >= limit

    def wait_s(self, k: int, now_ns: int) -> float:
        """Seconds until record ``k`` is due (0 when it is due or late)."""
        return max(0.0, (self.due_ns(k) - now_ns) / NS_PER_S)
