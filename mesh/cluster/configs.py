"""Each partition's current replica set, as this broker knows it from gossip (pure).

A topic's replica table (``tparts/`` registers) is the *initial* config of every partition
(version 0). When a partition's membership changes (Raft's own single-server changes,
``mesh.raft.membership``), its leader writes the new config to the cluster register
``pconf/<topic>/<uuid>/<p>`` = ``{"v", "t", "voters", "learners", "committed"}``. Gossip is
never the arbiter of safety (the Raft log is); this view decides only *where replicas are
hosted* and what metadata says, with these rules:

1. The effective config of a partition is its ``pconf/`` register when one exists for the
   topic's uuid, else the topic's table entry (version 0, committed). Its voters replace
   ``Topic.replicas[p]`` (preferred leader first), so metadata, leader hints and placement
   loads all see the current set; ``Topic.learners[p]`` lists the learners.
2. A broker hosts a replica when it is a voter or a learner of the effective config
   (a new learner starts refilling as soon as its leader announced it).
3. A broker drops a replica that the topic still has only with evidence from both sides
   (``keep_local``, asked about once a second by ``mesh.node.ops.elastic`` for each local
   replica the effective config does not name; ``Catalog.reconcile`` itself only drops
   replicas of deleted topics): no leader's append or heartbeat has reached it for
   ``quiet_ms`` (a member hears its leader all the time, whatever gossip says; a leader is
   never dropped), and either its own log says it is not a voter (a learner, or removed),
   or the effective config is *committed*, at least as new as its own log's, and does not
   name it. So a stale, uncommitted or forged register alone never costs a voter its
   data, and an orphan learner (its leader died before the learner was committed) goes.
   A deleted topic (or a re-created name: another uuid) drops everything, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from mesh.cluster.keys import PCONF_PREFIX, parse_partition_key

__all__ = ["PartitionConfig", "configs_by_topic", "overlay", "keep_local"]


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """One partition's config as gossip carries it (``pconf/`` value, or the table's v0)."""
    version: int
    term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    committed: bool = True

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @classmethod
    def from_value(cls, v: Mapping[str, Any]) -> "PartitionConfig":
        return cls(v["v"], v["t"], tuple(v["voters"]), tuple(v["learners"]), bool(v["committed"]))

    def value(self) -> dict[str, Any]:
        """The ``pconf/`` register value (the exact shape ``schema`` checks)."""
        return {"v": self.version, "t": self.term, "voters": list(self.voters),
                "learners": list(self.learners), "committed": self.committed}


def configs_by_topic(registers: Mapping[str, Any]) -> dict[tuple[str, str], dict[int, PartitionConfig]]:
    """``pconf/`` registers (key -> value) grouped as (topic, uuid) -> {partition: config};
    malformed keys are skipped (values were checked by the schema on arrival)."""
    out: dict[tuple[str, str], dict[int, PartitionConfig]] = {}
    for key, value in registers.items():
        parsed = parse_partition_key(key, PCONF_PREFIX)
        if parsed is None or not isinstance(value, dict):
            continue
        name, uuid, p = parsed
        try:
            out.setdefault((name, uuid), {})[p] = PartitionConfig.from_value(value)
        except (KeyError, TypeError):
            continue
    return out


def overlay(topic, configs: Mapping[int, PartitionConfig] | None, node_id: str, cluster_pid):
    """``topic`` (a ``catalog.Topic``) with the partitions' effective configs (rule 1) and
    ``pids`` for the partitions ``node_id`` hosts (rule 2). ``configs``: partition ->
    config from ``configs_by_topic`` (None or empty: the table as it is)."""
    if not configs:
        return topic
    replicas = list(topic.replicas)
    learners = [()] * topic.partitions
    versions = [0] * topic.partitions
    committed = [True] * topic.partitions
    for p, c in configs.items():
        if 0 <= p < topic.partitions:
            replicas[p], learners[p], versions[p], committed[p] = c.voters, c.learners, c.version, c.committed
    pids = tuple(cluster_pid(topic.uuid, p) if node_id in replicas[p] or node_id in learners[p] else None
                 for p in range(topic.partitions))
    return replace(topic, replicas=tuple(replicas), learners=tuple(learners), versions=tuple(versions),
                   committed=tuple(committed), pids=pids)


def keep_local(node_id: str, effective: PartitionConfig,
               local: tuple[int, tuple[str, ...], tuple[str, ...]] | None,
               leader_silence_ms: int, quiet_ms: int) -> bool:
    """Rule 3: whether a replica this node hosts stays. ``local``: (version, voters,
    learners) of the latest config in the replica's own log (None: not loaded yet);
    ``leader_silence_ms``: since a leader last reached it (0 while it leads)."""
    if node_id in effective.members or local is None or leader_silence_ms < quiet_ms:
        return True
    version, voters, _ = local
    if node_id not in voters:
        return False                            # a learner or removed: never needed for a quorum
    return not (effective.committed and effective.version >= version)
