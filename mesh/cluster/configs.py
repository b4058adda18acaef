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
3. A broker drops a replica that the topic still has only on positive evidence
   (``keep_local``): the effective config is *committed*, at least as new as the config in
   its own replica's log, and does not name it. An uncommitted config, an older one, or a
   register that has not arrived yet never costs a replica its data. A deleted topic
   (or a re-created name: another uuid) drops everything, as before.
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


def keep_local(node_id: str, effective: PartitionConfig, local: tuple[int, tuple[str, ...]] | None) -> bool:
    """Rule 3: whether a replica this node hosts, which the effective config does not name,
    stays. ``local``: (version, members) of the config in the replica's own log, None if
    the replica is not loaded."""
    if node_id in effective.members:
        return True
    if local is None:
        return not effective.committed
    version, members = local
    if node_id not in members:
        return not effective.committed          # our own log says we are out: go once it is committed
    return not (effective.committed and effective.version >= version)
