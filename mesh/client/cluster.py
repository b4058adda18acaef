"""The client's view of the cluster: brokers, topics, partition leaders.

Filled from a MetadataRequest to any known broker (bootstrap first) and refreshed when a
broker says NOT_LEADER / UNKNOWN_TOPIC or stops answering.
"""
from __future__ import annotations

import random
from typing import NamedTuple

from mesh.wire.errors import ErrorCode, MeshError
from mesh.client.transport import parse_address
from mesh.wire.messages import MetadataRequest, MetadataResponse

__all__ = ["ClusterView", "TopicPartition", "PartitionInfo"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class PartitionInfo(NamedTuple):
    partition: int
    leader: str | None
    leader_address: str | None
    epoch: int
    replicas: list
    isr: list
    log_start: int
    log_end: int
    high_watermark: int


class ClusterView:
    def __init__(self, transport, bootstrap: str | list[str], timeout_ms: int = 5_000):
        self.transport = transport
        boots = bootstrap if isinstance(bootstrap, list) else [b.strip() for b in bootstrap.split(",")]
        self.bootstrap = [b for b in boots if b]
        if not self.bootstrap:
            raise ValueError("no bootstrap address given")
        self.timeout_ms = timeout_ms
        self.brokers: dict[str, dict] = {}
        self.topics: dict[str, dict] = {}
        self._rng = random.Random()

    def addresses(self) -> list[str]:
        alive = [b["address"] for b in self.brokers.values() if b.get("status", "alive") == "alive"]
        rest = [a for a in self.bootstrap if a not in alive]
        self._rng.shuffle(alive)
        return alive + rest

    def refresh(self, topics: list[str] | None = None) -> MetadataResponse:
        """Ask up to three brokers at once; the first answer wins, so a dead broker that
        gossip has not convicted yet costs nothing."""
        addrs = self.addresses()
        last: Exception | None = None
        for i in range(0, len(addrs), 3):
            try:
                resp, _ = self.transport.call_first(addrs[i:i + 3], MetadataRequest(topics),
                                                    timeout_ms=min(self.timeout_ms, 2_000))
            except MeshError as exc:
                last = exc
                continue
            self.brokers = {b["id"]: b for b in resp.brokers}
            for t in resp.topics:
                if t.get("error"):
                    self.topics.pop(t["name"], None)
                else:
                    self.topics[t["name"]] = t
            return resp
        raise MeshError(ErrorCode.BROKER_UNAVAILABLE, f"no broker answered ({', '.join(addrs)}): {last}")

    def topic(self, name: str, refresh: bool = True) -> dict:
        t = self.topics.get(name)
        if t is None and refresh:
            self.refresh([name])
            t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name!r}")
        return t

    def partitions(self, name: str) -> int:
        return len(self.topic(name)["partitions"])

    def leader_address(self, topic: str, partition: int) -> str | None:
        t = self.topic(topic)
        parts = t["partitions"]
        if not 0 <= partition < len(parts):
            raise MeshError(ErrorCode.UNKNOWN_PARTITION,
                            f"topic {topic!r} has partitions 0..{len(parts) - 1}, not {partition}")
        return parts[partition].get("leader_address")

    def set_leader(self, topic: str, partition: int, address: str) -> None:
        """Follow a NOT_LEADER hint; a hint that is not HOST:PORT is ignored (the next
        metadata refresh will say)."""
        try:
            parse_address(address)
        except (ValueError, AttributeError):
            return
        t = self.topics.get(topic)
        if t and 0 <= partition < len(t["partitions"]):
            t["partitions"][partition]["leader_address"] = address
