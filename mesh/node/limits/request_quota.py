"""Per-principal request-time quota (Kafka's ``request_percentage``).

Bytes quotas (``mesh.node.replication.outbox``) do not bound what a request costs the node loop: a
small body can be expensive to decode or handle. ``RequestTimeQuota`` charges each
request's measured handling time (decode, authorization, handler) to its principal
(open mode: its connection, as the byte quotas do) in a leaky bucket that drains at
``percentage`` % of wall time, with a burst of ``BURST_MS`` of wall time's worth. A
principal in debt has its requests refused (THROTTLED, "send again in N ms") before they
are decoded: a refusal costs a dict lookup, so one principal can take at most about
``percentage`` % of the loop however it shapes its requests. Kafka throttles by delaying
answers and muting the channel; refusing is what the node already does to producers
that do not wait for held answers (``mesh.node.requests.dispatch``), and clients retry THROTTLED.
Off (None) when the percentage is 0, Kafka's default (no quota).
"""
from __future__ import annotations

from typing import Hashable

__all__ = ["RequestTimeQuota", "BURST_MS"]

BURST_MS = 1_000
_MAX_KEYS = 100_000


class RequestTimeQuota:
    def __init__(self, percentage: float):
        if percentage <= 0:
            raise ValueError("request_percentage must be positive")
        self.scale = 100.0 / percentage      # wall ms of debt per ms of loop time used
        self._ready: dict[Hashable, float] = {}   # when each principal's debt is paid (ms)
        self.refused = 0

    def debt_ms(self, key: Hashable, now_ms: int) -> int:
        """How long ``key``'s requests are refused from now (0: it may send)."""
        ready = self._ready.get(key)
        if ready is None:
            return 0
        return max(0, int(ready - now_ms - BURST_MS))

    def charge(self, key: Hashable, used_ms: float, now_ms: int) -> None:
        ready = max(self._ready.get(key, 0.0), now_ms) + used_ms * self.scale
        if len(self._ready) >= _MAX_KEYS and key not in self._ready:
            self._ready = {k: t for k, t in self._ready.items() if t > now_ms}
            if len(self._ready) >= _MAX_KEYS:
                self._ready = {}
        self._ready[key] = ready
