"""The client's view of the cluster: brokers, topics, partition leaders.

Filled from MetadataRequests to three known brokers at once (``refresh``: answers merged,
the highest leader epoch per partition wins, so one broker whose gossip lags cannot send
clients back to a dead or deposed leader) and refreshed when a broker says NOT_LEADER /
UNKNOWN_TOPIC or stops answering; a NOT_LEADER hint (an address) is followed at once.
Leader addresses are cached per partition (``leader_of``, called per produce request)
until the next refresh or hint.

``list_offsets`` is the one ListOffsets of the client (consumer, group admin, Spark
source): each partition's leader is asked (it is the authority; gossip-fed metadata may
lag); partitions with no leader known, a leader that does not answer or a retriable error
are asked again after a short backoff and a metadata refresh, until the deadline.
``offsets_for_times`` asks the same way by timestamp (Kafka's ``offsets_for_times``).
"""
from __future__ import annotations

import random
import time
from typing import Iterable, NamedTuple

from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.client.transport import parse_address
from mesh.cluster.liveness import row_is_up
from mesh.wire.messages import (ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
                                OffsetsPart)
from mesh.wire.types import TopicPartition

__all__ = ["ClusterView", "TopicPartition", "PartitionInfo", "LIST_OFFSETS_BACKOFF_S", "merge_topics"]

LIST_OFFSETS_BACKOFF_S = 0.05  # between rounds of list_offsets (a leader election in progress)
REFRESH_GRACE_MS = 50          # how long a refresh waits for more answers after the first


def _rank(entry: dict) -> tuple[int, int]:
    epoch = entry.get("epoch")
    return (epoch if isinstance(epoch, int) else -1, 1 if entry.get("leader_address") else 0)


def merge_topics(answers: list) -> dict[str, dict | None]:
    """{topic: entry, or None if the topic is unknown} from several MetadataResponses: the
    first answer's entry for each topic, with each partition taken from the answer that
    gives it the highest leader epoch (on equal epochs, one that names a leader; then the
    earlier answer). A topic is unknown only if no answer knows it."""
    out: dict[str, dict | None] = {}
    for resp in answers:
        for t in resp.topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                continue
            name = t["name"]
            if t.get("error") or not isinstance(t.get("partitions"), list):
                out.setdefault(name, None)
                continue
            have = out.get(name)
            if have is None:
                out[name] = dict(t, partitions=list(t["partitions"]))
                continue
            parts = have["partitions"]
            if len(parts) != len(t["partitions"]):
                continue  # different views of the topic (recreated?): keep the first
            for i, entry in enumerate(t["partitions"]):
                if isinstance(entry, dict) and _rank(entry) > _rank(parts[i]):
                    parts[i] = entry
    return out


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
        self._leaders: dict[tuple, str | None] = {}   # (topic, partition) -> leader address; cleared on change
        self._rng = random.Random()
        self._clock = time.monotonic  # the I/O shell's clock and sleep; tests replace them
        self._sleep = time.sleep

    def addresses(self) -> list[str]:
        """Brokers to ask: those alive in the last answer (shuffled), then the bootstrap
        addresses; any whose connection the transport knows is down go last."""
        alive = [b["address"] for b in self.brokers.values() if row_is_up(b, strict=True)]
        rest = [a for a in self.bootstrap if a not in alive]
        self._rng.shuffle(alive)
        out = alive + rest
        is_down = getattr(self.transport, "is_down", None)
        if is_down is not None:
            out.sort(key=is_down)  # stable: the order above within each group
        return out

    def refresh(self, topics: list[str] | None = None, fanout: int = 3, grace_ms: int = REFRESH_GRACE_MS) -> MetadataResponse:
        """Ask ``fanout`` brokers at once and merge their answers (``merge_topics``): the
        first answer, and those that come within ``grace_ms`` after it; per partition the
        highest leader epoch wins, so a broker whose gossip still names a deposed or dead
        leader is outvoted by one that knows its successor, and a dead broker that gossip
        has not convicted yet costs nothing. Answers to other requests on the transport
        are kept for their owner. Raises BROKER_UNAVAILABLE if no broker answers."""
        addrs = self.addresses()
        last: Exception | None = None
        for i in range(0, len(addrs), fanout):
            chunk = addrs[i:i + fanout]
            rids = [self.transport.send(a, MetadataRequest(topics)) for a in chunk]
            got = self.transport.gather(rids, min(self.timeout_ms, 2_000), grace_ms=grace_ms)
            answers = []
            for rid in rids:  # in the order asked: the merge is the same whatever the arrival order
                if rid not in got:
                    continue
                _, resp, _ = got[rid]
                if isinstance(resp, MetadataResponse) and not resp.error:
                    answers.append(resp)
                else:
                    last = MeshError(getattr(resp, "error", ErrorCode.UNKNOWN), getattr(resp, "message", ""))
            if not answers:
                if isinstance(last, MeshError) and last.code == ErrorCode.UNAUTHORIZED:
                    raise last   # an ACL said no: another broker would say the same
                last = last or MeshError(ErrorCode.TIMEOUT, f"no answer from {', '.join(chunk)}")
                continue
            first = answers[0]
            self._leaders.clear()
            self.brokers = {b["id"]: b for b in first.brokers if isinstance(b, dict) and "id" in b}
            for name, t in merge_topics(answers).items():
                if t is None:
                    self.topics.pop(name, None)
                else:
                    self.topics[name] = t
            return first
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

    def leader_of(self, tp: tuple) -> str | None:
        """``leader_address(*tp)``, cached until the metadata changes (a dict lookup)."""
        try:
            return self._leaders[tp]
        except KeyError:
            addr = self._leaders[tp] = self.leader_address(tp[0], tp[1])
            return addr

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
            self._leaders.pop((topic, partition), None)

    def list_offsets(self, tps: Iterable[tuple[str, int]], spec: int, timeout_ms: int,
                     request_timeout_ms: int = 1_000, partial: bool = False) -> dict[TopicPartition, int]:
        """{(topic, partition): offset} for ``spec`` (EARLIEST: log start, LATEST: high
        watermark) asked of each partition's leader, retried (backoff, metadata refresh)
        until ``timeout_ms``. A non-retriable error raises MeshError at once; so does the
        deadline, naming what did not answer, unless ``partial`` (then what answered is
        returned)."""
        got = self._ask_offsets({TopicPartition(t, p): spec for t, p in tps}, timeout_ms, request_timeout_ms, partial)
        return {tp: part[3] for tp, part in got.items()}

    def offsets_for_times(self, query: dict[TopicPartition, int], timeout_ms: int,
                          request_timeout_ms: int = 1_000) -> dict[TopicPartition, tuple[int, int] | None]:
        """{(topic, partition): (offset, timestamp) of the first record whose timestamp is
        >= the partition's timestamp in ``query`` (ms), or None when no record below the high
        watermark reaches it} (Kafka's ListOffsets by timestamp), asked of each leader and
        retried as ``list_offsets``."""
        specs = {}
        for tp, ts in query.items():
            if type(ts) is not int or not 0 <= ts < 1 << 63:
                raise ValueError(f"{tp}: a timestamp in ms is an int >= 0, not {ts!r}")
            specs[TopicPartition(*tp)] = ts
        got = self._ask_offsets(specs, timeout_ms, request_timeout_ms, False)
        out: dict[TopicPartition, tuple[int, int] | None] = {}
        for tp, part in got.items():
            ts = part.timestamp if part.timestamp is not None else -1
            out[tp] = (part.offset, ts) if part.offset >= 0 else None
        return out

    def _ask_offsets(self, specs: dict[TopicPartition, int], timeout_ms: int, request_timeout_ms: int,
                     partial: bool) -> dict[TopicPartition, OffsetsPart]:
        """{tp: the leader's answer part} for {tp: spec} (see ``list_offsets``)."""
        out: dict[TopicPartition, OffsetsPart] = {}
        skipped: set[TopicPartition] = set()   # partial: a non-retriable error
        pending = list(specs)
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
                    by_addr.setdefault(addr, []).append([tp.topic, tp.partition, specs[tp]])
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
                if not isinstance(resp, ListOffsetsResponse):   # an ErrorResponse: the whole request refused
                    exc = MeshError(getattr(resp, "error", ErrorCode.UNKNOWN), getattr(resp, "message", ""))
                    if not exc.retriable:
                        raise exc
                    last = exc
                    continue
                for part in resp.parts:
                    tp = TopicPartition(part.topic, part.partition)
                    if tp not in specs:
                        continue
                    if not part.error:
                        out[tp] = part
                        continue
                    leader = part.leader
                    last = MeshError(part.error, f"list offsets of {tp.topic}/{tp.partition}", leader=leader)
                    if not retriable(part.error):
                        if not partial:
                            raise last
                        skipped.add(tp)
                    elif leader:
                        hints[tp] = leader
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
