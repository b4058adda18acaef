"""An elastic cluster for ``Admin`` (a mixin: ``Admin`` inherits these methods): grow a
topic, decommission and recommission brokers, move a partition by hand, list the moves in
progress.

Every change goes to any broker, which answers once the change is on its disk; gossip then
carries it to the others, and each partition's leader carries it out (adds a learner,
promotes it once caught up, removes the old replica: ``mesh.cluster.balance``). So a
change returns at once; ``list_moves`` and ``metadata`` show its progress. Errors raise
``MeshError`` with the broker's message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from mesh.cluster.liveness import row_is_up
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.topic_config import normalize_config
from mesh.wire.messages import (BROKER_ACTIVE, BROKER_DRAINING, AlterTopicRequest, BrokerStateRequest,
                                ErrorResponse, ListMovesRequest, MetadataRequest, ReassignRequest)

__all__ = ["ElasticAdmin", "Moves"]


@dataclass(frozen=True, slots=True)
class Moves:
    """``moves``: one dict per partition with a move in progress (``ListMovesResponse``'s
    rows), by topic and partition. ``unanswered``: {broker id: why} for every live broker
    that did not answer (its partitions' moves are missing from ``moves``)."""
    moves: list = field(default_factory=list)
    unanswered: dict = field(default_factory=dict)


def _check(resp):
    """A response with a nonzero ``error`` as MeshError (the broker's code and message)."""
    if getattr(resp, "error", 0):
        raise MeshError(resp.error, getattr(resp, "message", "") or "")
    return resp


class ElasticAdmin:
    """Topic growth, broker decommission, manual reassignment and the moves in progress."""

    def alter_topic(self, name: str, partitions: int = 0, replication_factor: int = 0,
                    wait_s: float = 10.0, config: dict | None = None) -> None:
        """Grow topic ``name`` to ``partitions`` (0: unchanged; partitions can only be
        added, as in Kafka: a keyed record may then land in another partition) and/or set
        its ``replication_factor`` (0: unchanged; the partitions' leaders then add or remove
        replicas one at a time). With ``wait_s``, returns once every live broker knows the
        new shape (and a leader for every new partition). ``config``: topic configs to set
        (e.g. ``{"cleanup.policy": "compact"}``), the others unchanged."""
        _check(self._call(AlterTopicRequest(name, partitions, replication_factor, dict(config or {}))))

        want = {k: v for k, v in normalize_config(config).items() if k in config} if config else {}

        def ok(topics: dict) -> bool:
            t = topics.get(name)
            return t is not None and len(t["partitions"]) >= partitions and all(
                p.get("leader") for p in t["partitions"]) and (
                not replication_factor or t.get("replication_factor") == replication_factor) and (
                not config or all(t["config"].get(k) == v for k, v in want.items()))
        if wait_s > 0:
            self._wait_everywhere(ok, wait_s, name)

    def decommission(self, node_id: str, wait_s: float = 10.0) -> None:
        """Mark broker ``node_id`` draining: every replica moves off it, leaderships first;
        ``metadata`` then lists it as draining, and with 0 replicas it is drained and can be
        stopped for good. With ``wait_s``, returns once every live broker knows the state."""
        self._set_broker_state(node_id, BROKER_DRAINING, wait_s)

    def recommission(self, node_id: str, wait_s: float = 10.0) -> None:
        """Undo ``decommission``: ``node_id`` is active again and takes replicas as balancing
        needs them."""
        self._set_broker_state(node_id, BROKER_ACTIVE, wait_s)

    def _set_broker_state(self, node_id: str, state: str, wait_s: float) -> None:
        _check(self._call(BrokerStateRequest(node_id, state)))
        want = {BROKER_DRAINING: ("draining", "drained"), BROKER_ACTIVE: ("active",)}[state]

        def ok(resp) -> bool:   # a broker that reports no state (an older one) is not waited for
            return all(b.get("state", want[0]) in want for b in resp.brokers if b.get("id") == node_id)
        if wait_s > 0:
            self._wait_security(MetadataRequest([]), ok, wait_s)

    def reassign(self, topic: str, partition: int, replicas: Iterable[str]) -> None:
        """Move partition ``partition`` of ``topic`` to ``replicas`` (preferred leader
        first); the partition's leader carries it out one replica at a time. ``[]`` cancels
        a reassignment that has not finished."""
        _check(self._call(ReassignRequest(topic, partition, list(replicas))))

    def list_moves(self, topics: list[str] | None = None, timeout_ms: int | None = None) -> Moves:
        """The moves in progress, from every live (alive or suspect) broker, each reporting
        the partitions it leads, asked all at once; a broker that does not answer is listed
        in ``unanswered``, not an error."""
        md = self.metadata(topics)
        leaders = {(t["name"], p["partition"]): p.get("leader")
                   for t in md.topics if not t.get("error") for p in t.get("partitions", [])}
        brokers = {b["address"]: b["id"] for b in md.brokers
                   if row_is_up(b) and b.get("address")}
        rids = {self.transport.send(addr, ListMovesRequest(topics)): addr for addr in sorted(brokers)}
        got = self.transport.gather(list(rids), timeout_ms or self.timeout_ms)
        unanswered: dict[str, str] = {}
        found: dict[tuple[str, int], dict] = {}
        for rid, addr in rids.items():
            node = brokers[addr]
            if rid not in got:
                unanswered[node] = f"no answer from {addr}"
                self.transport.forget(addr)
                continue
            _, resp, _ = got[rid]
            if isinstance(resp, ErrorResponse) or getattr(resp, "error", 0):
                unanswered[node] = f"{_code_name(resp.error)}: {resp.message}"
                continue
            for mv in resp.moves:
                if not isinstance(mv, dict):
                    continue
                key = (mv.get("topic"), mv.get("partition"))
                # two brokers may both report a partition whose leadership just moved:
                # the one the metadata names as leader wins
                if key not in found or leaders.get(key) == node:
                    found[key] = mv
        moves = [found[k] for k in sorted(found, key=lambda k: (str(k[0]), k[1] if isinstance(k[1], int) else -1))]
        return Moves(moves, unanswered)


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
