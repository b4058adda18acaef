"""Metadata (API 3, v1-12) from the mesh's native metadata.

Every broker's gossip holds the whole cluster, so any listener answers for every broker
and partition: brokers are those with a Kafka listener (``MetaCache.kafka_brokers``); a
partition's leader is its mesh leader's Kafka node id (LEADER_NOT_AVAILABLE while it has
none), replicas and ISR likewise. A leader without a Kafka listener (a broker started
without ``--kafka-port``) is stood in for by this listener: its Produce and Fetch go to
the mesh leader through the native client anyway, so it serves any partition. The
controller is the broker asked: the mesh has none, and any broker serves CreateTopics.
Topic ids are derived from the mesh topic (``mesh.kafka.ids.topic_id``). A topic unknown
to the mesh is created (``auto_create``: ``num_partitions``, replication factor
``min(default_replication_factor, live brokers)``) when the request allows it, as Kafka's
``auto.create.topics.enable``; a name Kafka would refuse is INVALID_TOPIC_EXCEPTION.
"""
from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode as K

from mesh.cluster.liveness import row_is_up
from mesh.kafka.build import make
from mesh.kafka.codec import response_class
from mesh.kafka.ids import topic_id
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["MetadataApi", "TopicDefaults", "kafka_error", "topic_uuid", "VALID_TOPIC", "CLUSTER_ID"]

log = logging.getLogger("mesh.kafka.meta")

VALID_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
CLUSTER_ID = "mesh"

# mesh ErrorCode -> Kafka error code (the ones a Kafka client acts on)
_KAFKA = {
    ErrorCode.NONE: K.none, ErrorCode.UNKNOWN_TOPIC: K.unknown_topic_or_partition,
    ErrorCode.UNKNOWN_PARTITION: K.unknown_topic_or_partition, ErrorCode.TOPIC_EXISTS: K.topic_already_exists,
    ErrorCode.OFFSET_OUT_OF_RANGE: K.offset_out_of_range, ErrorCode.MESSAGE_TOO_LARGE: K.message_too_large,
    ErrorCode.CORRUPT_MESSAGE: K.corrupt_message, ErrorCode.NOT_LEADER: K.not_leader_or_follower,
    ErrorCode.LEADER_NOT_AVAILABLE: K.leader_not_available, ErrorCode.NOT_ENOUGH_REPLICAS: K.not_enough_replicas,
    ErrorCode.TIMEOUT: K.request_timed_out, ErrorCode.FENCED_EPOCH: K.fenced_leader_epoch,
    ErrorCode.UNAUTHORIZED: K.topic_authorization_failed, ErrorCode.COORDINATOR_MOVED: K.not_coordinator,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: K.coordinator_not_available,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: K.out_of_order_sequence_number,
    ErrorCode.DUPLICATE_SEQUENCE: K.duplicate_sequence_number, ErrorCode.STORAGE_ERROR: K.kafka_storage_error,
    ErrorCode.BROKER_UNAVAILABLE: K.not_leader_or_follower, ErrorCode.INVALID_CONFIG: K.invalid_config,
    ErrorCode.THROTTLED: K.request_timed_out, ErrorCode.INVALID_REQUEST: K.invalid_request,
    ErrorCode.INVALID_RECORD: K.invalid_record,
}


def kafka_error(code: int) -> K:
    try:
        return _KAFKA.get(ErrorCode(code), K.unknown_server_error)
    except ValueError:
        return K.unknown_server_error


def topic_uuid(name: str, entry: dict | None) -> uuid.UUID:
    return topic_id(name, entry.get("topic_id") if entry else None)


@dataclass(frozen=True)
class TopicDefaults:
    auto_create: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 3


class MetadataApi:
    def __init__(self, defaults: TopicDefaults = TopicDefaults()) -> None:
        self.defaults = defaults

    def on_metadata(self, ctx, req):
        cache = ctx.cluster.fresh()
        v = ctx.api_version
        if req.topics is None:
            names, by_id = sorted(cache.topics), {}
        else:
            names, by_id = [], {}
            ids = {topic_uuid(n, t): n for n, t in cache.topics.items()} if any(
                getattr(t, "topic_id", None) and t.topic_id.int for t in req.topics) else {}
            for t in req.topics:
                name = getattr(t, "name", None)
                tid = getattr(t, "topic_id", None)
                if name is None and tid is not None and tid.int:
                    name = ids.get(tid)
                    if name is None:
                        by_id[tid] = None
                        continue
                if name is not None and name not in names:
                    names.append(name)
        if any(n not in cache.topics for n in names):
            cache.refresh()   # created a moment ago, through another broker?
        allow = getattr(req, "allow_auto_topic_creation", True) if v >= 4 else True
        if allow and self.defaults.auto_create:
            missing = [n for n in names if n not in cache.topics and VALID_TOPIC.fullmatch(n)]
            if missing and self._create(ctx, missing):
                cache.refresh()
        topics = [self._topic(ctx, cache, n) for n in names]
        topics += [{"error_code": K.unknown_topic_id, "name": None, "topic_id": tid, "partitions": []}
                   for tid in by_id]
        brokers = [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": None}
                   for b in cache.kafka_brokers()]
        return make(response_class(3, v), {
            "throttle_time": 0, "brokers": brokers, "cluster_id": CLUSTER_ID,
            "controller_id": cache.self_broker().node_id, "topics": topics})

    def _create(self, ctx, names: list[str]) -> bool:
        from mesh.kafka.topics import native_admin
        live = sum(1 for b in ctx.cluster.brokers_raw.values() if row_is_up(b)) or 1   # suspects count (liveness.is_up)
        rf = max(1, min(self.defaults.default_replication_factor, live))
        made = False
        for name in names:
            if not ctx.authorizer.allowed(ctx.principal, "CREATE", "TOPIC", name):
                continue
            try:
                native_admin(ctx).create_topic(name, self.defaults.num_partitions, rf, wait_s=5.0)
                made = True
                log.info("auto-created topic %s (%d partitions, replication factor %d) for a Kafka client",
                         name, self.defaults.num_partitions, rf)
            except MeshError as exc:
                made = made or exc.code == ErrorCode.TOPIC_EXISTS
                if exc.code != ErrorCode.TOPIC_EXISTS:
                    log.warning("auto-create of topic %s failed: %s", name, exc)
        return made

    def _topic(self, ctx, cache, name: str) -> dict:
        t = cache.topics.get(name)
        if not ctx.authorizer.allowed(ctx.principal, "DESCRIBE", "TOPIC", name):
            return {"error_code": K.topic_authorization_failed, "name": name, "topic_id": uuid.UUID(int=0),
                    "partitions": []}
        if t is None:
            code = K.unknown_topic_or_partition if VALID_TOPIC.fullmatch(name) else K.invalid_topic_exception
            return {"error_code": code, "name": name, "topic_id": uuid.UUID(int=0), "partitions": []}
        parts = []
        for i, p in enumerate(t.get("partitions") or []):
            leader = (cache.kafka_broker_of(p["leader"]) or cache.self_broker()) if p.get("leader") else None
            replicas = [kb.node_id for kb in map(cache.kafka_broker_of, p.get("replicas") or []) if kb]
            isr = [kb.node_id for kb in map(cache.kafka_broker_of, p.get("isr") or []) if kb]
            epoch = p.get("epoch") if isinstance(p.get("epoch"), int) else -1
            parts.append({"error_code": K.none if leader else K.leader_not_available, "partition_index": i,
                          "leader_id": leader.node_id if leader else -1, "leader_epoch": min(epoch, 2**31 - 1),
                          "replica_nodes": replicas, "isr_nodes": isr or replicas, "offline_replicas": []})
        return {"error_code": K.none, "name": name, "topic_id": topic_uuid(name, t), "is_internal": False,
                "partitions": parts}
