"""Which brokers count: one home for "is this broker up?" (pure, no I/O).

Theory of operation
-------------------
Gossip judges every member ALIVE, SUSPECT, DEAD or LEFT (``mesh.wire.types``, rule R4):
SUSPECT is a broker that missed heartbeats but is not convicted, DEAD one convicted, LEFT
one that said goodbye (final). Every caller that picks brokers asks one of two questions,
both answered here so that no caller spells the statuses out:

* ``is_up(status)``: ALIVE or SUSPECT. The broker still counts: it coordinates groups and
  owns topic names (``mesh.cluster.ownership``), takes new replicas when too few brokers
  are ALIVE (placement prefers them) and counts for a Kafka topic's default replication
  factor, its leadership claims count (``mesh.node.lifecycle.directory``), it keeps its
  links, its place in the balancer's view and in a client's coordinator cache. A
  suspicion is a question, not a verdict: on a loaded host a live broker misses a probe
  (one slow turn) and refutes it a round later, and counting SUSPECT keeps that from
  refusing creates, hiding leaders or bouncing groups.
* ``is_up(status, strict=True)``: ALIVE only, heard from lately. For work handed to a
  broker now or waited for (a shutdown's handover target, the brokers an admin call waits
  for, a client's first addresses to try): a suspect one would only make the caller wait.

``is_member(status)``: not LEFT, the brokers a majority is counted over (a DEAD broker may
come back; a LEFT one said it will not). ``row_is_up`` reads a metadata answer's broker row
(``{"status": ...}``; a row without one, from an older broker, counts as ALIVE).
``draining_ids`` reads the operator's ``broker/<id>`` registers (``mesh.cluster.keys``): a
draining broker is up but takes no new replicas.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from mesh.cluster.keys import BROKER_PREFIX
from mesh.wire.messages import BROKER_DRAINING
from mesh.wire.types import ALIVE, LEFT, SUSPECT

__all__ = ["UP_STATUSES", "is_up", "is_member", "row_is_up", "up_ids", "draining_ids"]

UP_STATUSES = frozenset({ALIVE, SUSPECT})


def is_up(status: Any, *, strict: bool = False) -> bool:
    """ALIVE or SUSPECT (module doc); ``strict``: ALIVE only."""
    return status == ALIVE if strict else status in UP_STATUSES


def is_member(status: Any) -> bool:
    """Counted in the cluster's size: every status but LEFT."""
    return status != LEFT


def row_is_up(row: Mapping[str, Any], *, strict: bool = False) -> bool:
    """``is_up`` of a metadata answer's broker row (no ``status``: ALIVE)."""
    return is_up(row.get("status", ALIVE), strict=strict)


def up_ids(members: Iterable[Any]) -> frozenset[str]:
    """The node ids of the gossip members (``.node_id``, ``.status``) that are up."""
    return frozenset(m.node_id for m in members if m.status in UP_STATUSES)


def draining_ids(registers: Mapping[str, Any]) -> set[str]:
    """The brokers whose ``broker/<id>`` register (of ``registers``, key -> value) says draining."""
    return {key[len(BROKER_PREFIX):] for key, v in registers.items()
            if key.startswith(BROKER_PREFIX) and isinstance(v, dict) and v.get("state") == BROKER_DRAINING}
