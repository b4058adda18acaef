"""The operator's record of membership: who gossip moved between alive, suspect, dead and left.

Called by the loop whenever the gossip state moved, with the core's events since the last
call: each is logged (INFO, ``member n2: alive -> suspect``; at most ``MAX_LOGGED`` per
call, then a count), and suspicions and deaths are counted for /metrics
(``mesh_gossip_suspicions_total``, ``mesh_gossip_deaths_total``). A false suspicion on a
loaded host shows here as a suspect followed by alive a round later.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

from mesh.wire.types import DEAD, SUSPECT

__all__ = ["log_membership_events", "MAX_LOGGED"]

log = logging.getLogger("mesh.node.membership")

MAX_LOGGED = 20     # per call: a mass death is a count, not a screenful


def log_membership_events(events: Iterable[Any], self_id: str, metrics: Any = None) -> None:
    """``events``: ``MembershipEvent``s (``node_id``, ``old``, ``new``); ``metrics``: a
    ``NodeMetrics`` or None."""
    events = list(events)
    for ev in events[:MAX_LOGGED]:
        if ev.node_id != self_id:
            log.info("member %s: %s -> %s", ev.node_id, ev.old, ev.new)
    if len(events) > MAX_LOGGED:
        log.info("... and %d more membership changes", len(events) - MAX_LOGGED)
    if metrics is not None:
        metrics.suspicions += sum(1 for ev in events if ev.new == SUSPECT)
        metrics.deaths += sum(1 for ev in events if ev.new == DEAD)
