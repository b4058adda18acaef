"""Stable identities a Kafka client sees: broker node ids and topic ids (pure).

- A broker's Kafka node id is an int32 that must stay the same across restarts (clients
  cache it) and differ between brokers. ``derive_node_id`` makes it from the mesh node id
  alone, so nothing has to be persisted: the trailing number of the id ("n1" -> 1,
  "broker-12" -> 12), else a CRC32 of the id in [1000, 2**31). ``mesh node --kafka-node-id``
  overrides it. The node gossips the id it uses (``mesh.cluster.keys.KAFKA_KEY``).
- Collisions (two ids "a1" and "b1", or two CRCs that meet) are settled the same way by
  every listener from gossip alone (``resolve_collisions``): the broker with the smallest
  mesh id keeps the id, each other one gets a CRC of its id with a salt, and a warning
  names them (give them ``--kafka-node-id``).
- A topic id is a UUID derived from the topic's name and its mesh uuid (which changes when
  a topic is deleted and created again), never the zero UUID.
"""
from __future__ import annotations

import hashlib
import re
import uuid
import zlib

__all__ = ["derive_node_id", "resolve_collisions", "topic_id", "MAX_NODE_ID"]

MAX_NODE_ID = 2 ** 31 - 1
_TRAILING = re.compile(r"([0-9]{1,10})$")


def _crc_id(text: str) -> int:
    return 1000 + zlib.crc32(text.encode()) % (MAX_NODE_ID - 1000)


def derive_node_id(mesh_id: str) -> int:
    m = _TRAILING.search(mesh_id)
    if m is not None and int(m.group(1)) <= MAX_NODE_ID:
        return int(m.group(1))
    return _crc_id(mesh_id)


def resolve_collisions(ids: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """{mesh id: Kafka id} with every id distinct, and the mesh ids that had to move."""
    out: dict[str, int] = {}
    taken: set[int] = set()
    moved: list[str] = []
    for mesh_id in sorted(ids):
        kid = ids[mesh_id]
        salt = 0
        while kid in taken:
            salt += 1
            kid = _crc_id(f"{mesh_id}#{salt}")
        if salt:
            moved.append(mesh_id)
        taken.add(kid)
        out[mesh_id] = kid
    return out, moved


def topic_id(name: str, mesh_uuid: str | None) -> uuid.UUID:
    digest = hashlib.sha256(f"mesh-topic:{name}:{mesh_uuid or ''}".encode()).digest()
    u = uuid.UUID(bytes=digest[:16], version=4)
    return u if u.int else uuid.UUID(int=1)
