"""The node's view of topics, partitions and brokers, derived from gossip.

Topics are cluster-wide last-writer-wins gossip registers ``topic/<name>`` holding
``{name, uuid, partitions, replication_factor, config, replicas}``; ``replicas[p]`` lists
the brokers of partition p, preferred leader first. The uuid tells a topic from an older
one of the same name: local data is keyed by ``<name>#<uuid>``, so a node that missed a
delete and a re-create still drops the old data.

``reconcile`` runs whenever the gossip state moved: it rebuilds the topic table (``Topic``
rows, see ``topics_from_registers``), registers a local partition id for every partition
this node replicates, and forgets local partitions that no topic wants any more (deleted
topics, or a re-created name).
"""
from __future__ import annotations

import logging
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Mapping

from mesh.wire.errors import ErrorCode, MeshError
from mesh.cluster.keys import TOPIC_PREFIX, topic_key
from mesh.cluster.placement import place_replicas
from mesh.wire.topic_config import MAX_PARTITIONS, normalize_config, validate_topic_name

__all__ = ["Catalog", "Topic", "TOPIC_PREFIX", "cluster_pid", "topics_from_registers"]

log = logging.getLogger("mesh.cluster.catalog")


def cluster_pid(topic_uuid: str, partition: int) -> int:
    """The cluster-wide id of a partition: 48 bits of the topic's uuid, 14 of the partition
    number. Replication messages name partitions by it, and each broker stores the
    partition's log under it."""
    return (int(topic_uuid[:12], 16) << 14) | partition


@dataclass(frozen=True, slots=True)
class Topic:
    """One row of the topic table: the ``topic/<name>`` register, plus this node's view.

    ``replicas[p]``: the brokers of partition p, preferred leader first. ``pids[p]``: the
    partition's cluster id if *this* node holds a replica, else None. ``config`` is the
    normalized topic config (read-only by convention)."""
    name: str
    uuid: str
    partitions: int
    replication_factor: int
    config: dict[str, Any]
    replicas: tuple[tuple[str, ...], ...]
    pids: tuple[int | None, ...] = ()

    @property
    def store_key(self) -> str:
        """``<name>#<uuid>``: the name under which this node stores the topic's partitions."""
        return f"{self.name}#{self.uuid}"

    @classmethod
    def from_register(cls, value: Mapping[str, Any], node_id: str) -> "Topic":
        """A row from a ``topic/<name>`` register value, seen from ``node_id``."""
        replicas = tuple(tuple(reps) for reps in value["replicas"])
        return cls(name=value["name"], uuid=value["uuid"], partitions=value["partitions"],
                   replication_factor=value["replication_factor"], config=value["config"],
                   replicas=replicas,
                   pids=tuple(cluster_pid(value["uuid"], p) if node_id in reps else None
                              for p, reps in enumerate(replicas)))

    def to_register(self) -> dict[str, Any]:
        """The register value: exactly the msgpack shape every broker reads."""
        return {"name": self.name, "uuid": self.uuid, "partitions": self.partitions,
                "replication_factor": self.replication_factor, "config": self.config,
                "replicas": [list(reps) for reps in self.replicas]}


def topics_from_registers(registers: Mapping[str, Any], node_id: str) -> dict[str, Topic]:
    """The topic table from the ``topic/`` registers (key -> value), as ``node_id`` sees it.
    Values that are not topic rows are skipped."""
    topics: dict[str, Topic] = {}
    for key, value in sorted(registers.items()):
        if not isinstance(value, dict) or "replicas" not in value:
            continue
        try:
            t = Topic.from_register(value, node_id)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring malformed topic register %s: %s", key[:80], exc)
            continue
        topics[t.name] = t
    return topics


class Catalog:
    def __init__(self, node_id: str, gossip, store):
        self.node_id = node_id
        self.gossip = gossip
        self.store = store
        self.topics: dict[str, Topic] = {}
        self.local: dict[int, tuple[str, int]] = {}   # pid -> (topic name, partition)

    def replicas_of(self, pid: int) -> list[str]:
        name, p = self.local[pid]
        return list(self.topics[name].replicas[p])

    # -- topics -------------------------------------------------------------------------
    def reconcile(self) -> tuple[set[int], set[int]]:
        """Rebuild from gossip; returns (pids added, pids removed) on this node."""
        topics = topics_from_registers(self.gossip.cluster_items(TOPIC_PREFIX), self.node_id)
        wanted: dict[tuple[str, int], tuple[str, int]] = {}
        for t in topics.values():
            for p, pid in enumerate(t.pids):
                if pid is not None:
                    wanted[(t.store_key, p)] = (t.name, p)
        before = set(self.local)
        for tkey, p, pid in self.store.partitions():
            if (tkey, p) not in wanted:
                log.info("dropping local partition %s/%d (topic deleted or replaced)", tkey, p)
                self.store.forget_partition(tkey, p)
        self.store.commit()
        local: dict[int, tuple[str, int]] = {}
        for (tkey, p), (name, _) in wanted.items():
            pid = self.store.partition_id(tkey, p, pid=topics[name].pids[p])
            local[pid] = (name, p)
        self.topics = topics
        self.local = local
        now = set(local)
        return now - before, before - now

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name!r}")
        return t

    def partition(self, name: str, partition: int) -> tuple[Topic, int | None]:
        """(topic, local pid or None if this node holds no replica)."""
        t = self.topic(name)
        if not isinstance(partition, int) or not 0 <= partition < t.partitions:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION,
                            f"topic {name!r} has partitions 0..{t.partitions - 1}, not {partition!r}")
        return t, t.pids[partition]

    def create(self, name: str, partitions: int, replication_factor: int, config: dict,
               live_nodes: list[str]) -> Topic:
        validate_topic_name(name)
        if name in self.topics:
            raise MeshError(ErrorCode.TOPIC_EXISTS, f"topic {name!r} already exists")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"partitions must be 1..{MAX_PARTITIONS}")
        cfg = normalize_config(config)
        try:
            replicas = place_replicas(partitions, replication_factor, live_nodes, self.leader_load())
        except ValueError as exc:
            raise MeshError(ErrorCode.INVALID_CONFIG, str(exc))
        t = Topic(name=name, uuid=uuidlib.uuid4().hex[:16], partitions=partitions,
                  replication_factor=replication_factor, config=cfg,
                  replicas=tuple(tuple(reps) for reps in replicas))
        self.gossip.put_cluster(topic_key(name), t.to_register())
        return t

    def delete(self, name: str) -> Topic:
        t = self.topic(name)
        self.gossip.delete_cluster(topic_key(name))
        return t

    def leader_load(self) -> dict[str, int]:
        """Partitions per broker as preferred leader (placement evens them out)."""
        load: dict[str, int] = {}
        for t in self.topics.values():
            for reps in t.replicas:
                load[reps[0]] = load.get(reps[0], 0) + 1
        return load
