"""Phi-accrual failure detection on heartbeat inter-arrival times (sans-I/O).

Theory of operation
-------------------
A node learns, through gossip, that a peer's heartbeat counter moved. Each time it moves
the detector records an *arrival* for that peer. It keeps one number per peer, the mean
time between arrivals (an exponentially weighted mean over about ``window_size``
samples, starting from the expected interval), and the time of the last arrival.

Gossip delivers heartbeats at irregular, roughly exponentially distributed intervals
(each round some random peer happens to carry a newer counter), so the suspicion level
is the exponential-distribution phi of Hayashibara et al. as Cassandra uses it::

    phi(now) = log10(e) * (now - last_arrival) / mean

phi = 8 means "the chance that a live peer stayed silent this long is 1e-8". The mean is
never taken below ``min_mean_ms`` (the heartbeat interval), so a small, very chatty
cluster does not become hair-trigger, and a single sample is clamped to
``max_sample_ms`` so one long silence (a healed partition) does not blind the detector
for the next hour.

Rules:
1. Only ``report`` creates or updates a peer's record; a peer never reported has phi 0.
   Deciding what an unknown peer's state is belongs to the caller (gossip treats a peer
   learned second-hand as unconfirmed until its heartbeat moves).
2. ``suspend(now)`` restarts every peer's clock at ``now`` without taking a sample. The
   caller uses it when it finds that its *own* loop stalled: silence it could not observe
   is not evidence against anyone.
3. Time never runs backwards here: a ``now`` earlier than the last arrival counts as zero
   elapsed time.

The module has no clock, no randomness and no I/O; all times are integer milliseconds
passed in by the caller.
"""
from __future__ import annotations

import math
from typing import Iterator

__all__ = ["FailureDetector", "LOG10_E"]

LOG10_E = math.log10(math.e)


class _Arrivals:
    __slots__ = ("last_ms", "mean_ms", "samples", "deadline_ms")

    def __init__(self, last_ms: int, mean_ms: float) -> None:
        self.last_ms = last_ms
        self.mean_ms = mean_ms
        self.samples = 0
        self.deadline_ms = 0  # when phi crosses the threshold (kept current by the detector)


class FailureDetector:
    """Phi-accrual suspicion for many peers, fed by heartbeat arrivals.

    ``threshold`` is the phi above which ``expired`` reports a peer. Every method is
    O(1) except ``suspend`` and ``expired``, which are O(number of peers).
    """

    def __init__(self, *, expected_interval_ms: int, threshold: float = 8.0,
                 window_size: int = 100, min_mean_ms: int | None = None,
                 max_sample_ms: int | None = None) -> None:
        if expected_interval_ms <= 0:
            raise ValueError("expected_interval_ms must be positive")
        if threshold <= 0:
            raise ValueError("threshold must be positive")
        if window_size < 1:
            raise ValueError("window_size must be at least 1")
        self.expected_interval_ms = expected_interval_ms
        self.threshold = float(threshold)
        self.window_size = window_size
        self.min_mean_ms = float(min_mean_ms if min_mean_ms is not None else expected_interval_ms)
        self.max_sample_ms = int(max_sample_ms if max_sample_ms is not None else 20 * expected_interval_ms)
        self._alpha = 2.0 / (window_size + 1)
        # elapsed time (ms) at which phi reaches the threshold, per unit of mean
        self._span_per_mean = self.threshold / LOG10_E
        self._peers: dict[str, _Arrivals] = {}

    # -- feeding -------------------------------------------------------------------------

    def report(self, node_id: str, now_ms: int) -> None:
        """The heartbeat of ``node_id`` moved at ``now_ms``."""
        rec = self._peers.get(node_id)
        if rec is None:
            rec = _Arrivals(now_ms, float(self.expected_interval_ms))
            self._peers[node_id] = rec
        else:
            sample = now_ms - rec.last_ms
            if sample < 0:
                sample = 0
            elif sample > self.max_sample_ms:
                sample = self.max_sample_ms
            rec.mean_ms += self._alpha * (sample - rec.mean_ms)
            rec.samples += 1
            if now_ms > rec.last_ms:
                rec.last_ms = now_ms
        mean = rec.mean_ms if rec.mean_ms > self.min_mean_ms else self.min_mean_ms
        rec.deadline_ms = rec.last_ms + int(self._span_per_mean * mean)

    def suspend(self, now_ms: int) -> None:
        """Restart every clock at ``now_ms`` (after a local stall); no samples are taken."""
        for rec in self._peers.values():
            if now_ms > rec.last_ms:
                rec.last_ms = now_ms
            rec.deadline_ms = rec.last_ms + self._span(rec)

    def forget(self, node_id: str) -> None:
        self._peers.pop(node_id, None)

    # -- judging -------------------------------------------------------------------------

    def phi(self, node_id: str, now_ms: int) -> float:
        """Suspicion level of ``node_id``; 0.0 for a peer never reported."""
        rec = self._peers.get(node_id)
        if rec is None:
            return 0.0
        elapsed = now_ms - rec.last_ms
        if elapsed <= 0:
            return 0.0
        return LOG10_E * elapsed / max(rec.mean_ms, self.min_mean_ms)

    def expired(self, now_ms: int) -> Iterator[str]:
        """Peers whose phi is above the threshold at ``now_ms``, in report order."""
        for node_id, rec in self._peers.items():
            if now_ms > rec.deadline_ms:
                yield node_id

    def last_ms(self, node_id: str) -> int | None:
        rec = self._peers.get(node_id)
        return None if rec is None else rec.last_ms

    def mean_ms(self, node_id: str) -> float | None:
        rec = self._peers.get(node_id)
        return None if rec is None else max(rec.mean_ms, self.min_mean_ms)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def _span(self, rec: _Arrivals) -> int:
        return int(self._span_per_mean * max(rec.mean_ms, self.min_mean_ms))
