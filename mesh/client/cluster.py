"""The client's view of the cluster: brokers, topics, partition leaders.

Filled from a MetadataRequest to any known broker (bootstrap first) and refreshed when a
broker says NOT_LEADER / UNKNOWN_TOPIC or stops answering.

``list_offsets`` is the one ListOffsets of the client (consumer, group admin, Spark
source): each partition's leader is asked (it is the authority; gossip-fed metadata may
lag); partitions with no leader known, a leader that does not answer or a retriable error
are asked again after a short backoff and a metadata refresh, until the deadline.
"""
from __future__ import annotations

import random
import time
from typing import Iterable, NamedTuple

from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.client.transport import parse_address
from mesh.wire.messages import ListOffsetsRequest, MetadataRequest, MetadataResponse
from mesh.wire.types import TopicPartition

__all__ = ["ClusterView", "TopicPartition", "PartitionInfo", "LIST_OFFSETS_BACKOFF_S"]

LIST_OFFSETS_BACKOFF_S = 0.05  # between rounds of list_offsets (a leader election in progress)


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
        self._clock = time.monotonic  # the I/O shell's clock and sleep; tests replace them
        self._sleep = time.sleep

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

    def list_offsets(self, tps: Iterable[tuple[str, int]], spec: int, timeout_ms: int,
                     request_timeout_ms: int = 1_000, partial: bool = False) -> dict[TopicPartition, int]:
        """{(topic, partition): offset} for ``spec`` (EARLIEST: log start, LATEST: high
        watermark) asked of each partition's leader, retried (backoff, metadata refresh)
        until ``timeout_ms``. A non-retriable error raises MeshError at once; so does the
        deadline, naming what did not answer, unless ``partial`` (then what answered is
        returned)."""
        out: dict[TopicPartition, int] = {}
        skipped: set[TopicPartition] = set()   # partial: a non-retriable error
        pending = [TopicPartition(t, p) for t, p in tps]
        deadline = self._clock() + timeout_ms / 1000
        last: MeshError | None = None
        while pending:
            by_addr: dict[str, list] = {}
            for tp in pending:
                try:
                    addr = self.leader_address(tp.topic, tp.partition)
                except MeshError as exc:
                    if not exc.retriable or exc.code == ErrorCode.UNKNOWN_TOPIC:
                        raise
                    addr, last = None, exc
                if addr is not None:
                    by_addr.setdefault(addr, []).append([tp.topic, tp.partition, spec])
            hints: dict[TopicPartition, str] = {}
            for addr, parts in by_addr.items():
                try:
                    resp, _ = self.transport.call(addr, ListOffsetsRequest(parts), timeout_ms=request_timeout_ms)
                except MeshError as exc:
                    if not exc.retriable:
                        raise
                    last = exc
                    self.transport.forget(addr)  # reconnect fresh next round
                    continue
                for topic, partition, err, off, leader in resp.parts:
                    if not err:
                        out[TopicPartition(topic, partition)] = off
                        continue
                    last = MeshError(err, f"list offsets of {topic}/{partition}", leader=leader)
                    if not retriable(err):
                        if not partial:
                            raise last
                        skipped.add(TopicPartition(topic, partition))
                    elif leader:
                        hints[TopicPartition(topic, partition)] = leader
            pending = [tp for tp in pending if tp not in out and tp not in skipped]
            if pending:
                if self._clock() > deadline:
                    if partial:
                        return out
                    raise MeshError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader answered for {pending[:3]}"
                                    f"{'...' if len(pending) > 3 else ''} within {timeout_ms} ms: {last}")
                self._sleep(LIST_OFFSETS_BACKOFF_S)
                try:
                    self.refresh(sorted({tp.topic for tp in pending}))
                except MeshError as exc:
                    last = exc  # no broker answered: try again until the deadline
                for tp, leader in hints.items():  # a NOT_LEADER hint is fresher than gossip
                    self.set_leader(tp.topic, tp.partition, leader)
        return out
