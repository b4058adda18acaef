"""Name ownership: which broker coordinates a consumer group and owns a topic's name.

Theory of operation
-------------------
Rendezvous (highest-random-weight) hashing over the *coordination set*, the brokers gossip
holds up (``mesh.cluster.liveness.is_up``: ALIVE or SUSPECT). Every broker scores every
(node, name) pair with a stable hash and the highest score wins.
Any broker computes the same answer from the same set of live node ids, with no
coordination, and when a node dies only the groups it coordinated move (each to the node
that scored second for it); nothing else is reshuffled.

The hash is BLAKE2b over the UTF-8 bytes of the node id and the group id, separated by a
NUL byte so ("a", "bc") and ("ab", "c") cannot collide. Python's ``hash()`` is salted per
process and must never be used here. Ties (astronomically unlikely) go to the smaller node
id, so the result does not depend on the order of ``live_node_ids``.

A group is coordinated by ``coordinator_for(group_id, ...)``; a topic is created, altered
and deleted by ``topic_owner`` (its name prefixed ``topic:``, so a topic and a group of one
name may have different owners), which serializes its writes (``mesh.node.requests.handlers``).
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

from mesh.cluster.liveness import up_ids

__all__ = ["coordinator_for", "ranked_nodes", "score", "coordination_set", "coordinator_among", "topic_owner"]


def score(group_id: str, node_id: str) -> int:
    """The weight of ``node_id`` for ``group_id``: a stable 64-bit integer."""
    digest = hashlib.blake2b(node_id.encode() + b"\x00" + group_id.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def ranked_nodes(group_id: str, live_node_ids: Iterable[str]) -> list[str]:
    """Live nodes best first: the coordinator, then who takes over if it fails, and so on."""
    nodes = set(live_node_ids)
    return sorted(nodes, key=lambda n: (-score(group_id, n), n))


def coordinator_for(group_id: str, live_node_ids: Iterable[str]) -> str:
    """The node that coordinates ``group_id``; ValueError when no node is live."""
    best: tuple[int, str] | None = None
    for node in live_node_ids:
        key = (-score(group_id, node), node)
        if best is None or key < best:
            best = key
    if best is None:
        raise ValueError(f"no live node to coordinate group {group_id!r}")
    return best[1]


def coordination_set(members: Iterable[Any]) -> frozenset[str]:
    """The node ids of gossip members that may coordinate groups and own names (up)."""
    return up_ids(members)


def coordinator_among(group_id: str, nodes: Iterable[str]) -> str | None:
    """``coordinator_for``, or None when no node may coordinate."""
    try:
        return coordinator_for(group_id, nodes)
    except ValueError:
        return None


def topic_owner(name: str, members: Iterable[Any]) -> str | None:
    """The broker that creates, alters and deletes topic ``name``, over gossip ``members``."""
    return coordinator_among("topic:" + name, coordination_set(members))
