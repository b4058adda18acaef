"""The node's view of topics, partitions and brokers, derived from gossip.

Topics are cluster-wide last-writer-wins gossip registers ``topic/<name>`` holding
``{name, uuid, partitions, replication_factor, config, replicas}``; ``replicas[p]`` lists
the brokers of partition p, preferred leader first. The uuid tells a topic from an older
one of the same name: local data is keyed by ``<name>#<uuid>``, so a node that missed a
delete and a re-create still drops the old data.

``reconcile`` runs whenever the gossip state moved: it rebuilds the topic table, registers
a local partition id for every partition this node replicates, and forgets local
partitions that no topic wants any more (deleted topics, or a re-created name).
"""
from __future__ import annotations

import logging
import uuid as uuidlib

from mesh.wire.errors import ErrorCode, MeshError
from mesh.cluster.placement import place_replicas
from mesh.wire.topic_config import MAX_PARTITIONS, normalize_config, validate_topic_name

__all__ = ["Catalog", "TOPIC_PREFIX", "cluster_pid"]

log = logging.getLogger("mesh.cluster.catalog")
TOPIC_PREFIX = "topic/"


def cluster_pid(topic_uuid: str, partition: int) -> int:
    """The cluster-wide id of a partition: 48 bits of the topic's uuid, 14 of the partition
    number. Replication messages name partitions by it, and each broker stores the
    partition's log under it."""
    return (int(topic_uuid[:12], 16) << 14) | partition


class Catalog:
    def __init__(self, node_id: str, gossip, store):
        self.node_id = node_id
        self.gossip = gossip
        self.store = store
        self.topics: dict[str, dict] = {}
        self.local: dict[int, tuple[str, int]] = {}   # pid -> (topic name, partition)

    def replicas_of(self, pid: int) -> list[str]:
        name, p = self.local[pid]
        return self.topics[name]["replicas"][p]

    # -- topics -------------------------------------------------------------------------
    def reconcile(self) -> tuple[set[int], set[int]]:
        """Rebuild from gossip; returns (pids added, pids removed) on this node."""
        topics = {}
        wanted: dict[tuple[str, int], tuple[str, int]] = {}
        for key, t in sorted(self.gossip.cluster_items(TOPIC_PREFIX).items()):
            if not isinstance(t, dict) or "replicas" not in t:
                continue
            t = dict(t)
            t["key"] = f"{t['name']}#{t['uuid']}"
            # pids[p]: the partition's id if this node holds a replica, else None
            t["pids"] = [cluster_pid(t["uuid"], p) if self.node_id in reps else None
                         for p, reps in enumerate(t["replicas"])]
            for p, pid in enumerate(t["pids"]):
                if pid is not None:
                    wanted[(t["key"], p)] = (t["name"], p)
            topics[t["name"]] = t
        before = set(self.local)
        for tkey, p, pid in self.store.partitions():
            if (tkey, p) not in wanted:
                log.info("dropping local partition %s/%d (topic deleted or replaced)", tkey, p)
                self.store.forget_partition(tkey, p)
        self.store.commit()
        local: dict[int, tuple[str, int]] = {}
        for (tkey, p), (name, _) in wanted.items():
            pid = self.store.partition_id(tkey, p, pid=topics[name]["pids"][p])
            local[pid] = (name, p)
        self.topics = topics
        self.local = local
        now = set(local)
        return now - before, before - now

    def topic(self, name: str) -> dict:
        t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name!r}")
        return t

    def partition(self, name: str, partition: int) -> tuple[dict, int | None]:
        """(topic, local pid or None if this node holds no replica)."""
        t = self.topic(name)
        if not isinstance(partition, int) or not 0 <= partition < t["partitions"]:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION,
                            f"topic {name!r} has partitions 0..{t['partitions'] - 1}, not {partition!r}")
        return t, t["pids"][partition]

    def create(self, name: str, partitions: int, replication_factor: int, config: dict,
               live_nodes: list[str]) -> dict:
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
        t = {"name": name, "uuid": uuidlib.uuid4().hex[:16], "partitions": partitions,
             "replication_factor": replication_factor, "config": cfg, "replicas": replicas}
        self.gossip.put_cluster(TOPIC_PREFIX + name, t)
        return t

    def delete(self, name: str) -> dict:
        t = self.topic(name)
        self.gossip.delete_cluster(TOPIC_PREFIX + name)
        return t

    def leader_load(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for t in self.topics.values():
            for reps in t["replicas"]:
                load[reps[0]] = load.get(reps[0], 0) + 1
        return load
