"""CreateTopics (API 19, v2-5), DeleteTopics (API 20, v1-4) and CreatePartitions (API 37,
v0-3) through the native Admin.

The mesh has no controller: the native Admin sends each change to the topic's owner and
waits until every live broker knows it, so a client's next Metadata, wherever it asks,
sees the topic. A partition count or replication factor of -1 takes the listener's
defaults (``meta.TopicDefaults``); explicit replica assignments are not supported
(INVALID_REQUEST); ``validate_only`` checks the name and numbers and creates nothing.
Topic configs go to the mesh as they are (it refuses keys and values it does not know:
INVALID_CONFIG with its message). CreatePartitions grows a topic (``Admin.alter_topic``:
the mesh places the new partitions; a count not above the current one is
INVALID_PARTITIONS, as in Kafka; explicit assignments INVALID_REQUEST; ALTER on the topic).
"""
from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode as K

from mesh.client.admin import Admin
from mesh.cluster.liveness import row_is_up
from mesh.kafka.build import make, ms
from mesh.kafka.codec import response_class
from mesh.kafka.meta import VALID_TOPIC, TopicDefaults, kafka_error
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["TopicsApi", "native_admin"]

log = logging.getLogger("mesh.kafka.topics")


def native_admin(ctx) -> Admin:
    """An ``Admin`` on the calling thread's native link (made once per link)."""
    link = ctx.mesh
    adm = getattr(link, "_admin", None)
    if adm is None:
        adm = Admin.__new__(Admin)   # ClientBase's parts, sharing the link's transport and view
        adm.transport, adm.cluster, adm.timeout_ms = link.transport, link.cluster, 10_000
        link._admin = adm
    return adm


class TopicsApi:
    def __init__(self, defaults: TopicDefaults = TopicDefaults()) -> None:
        self.defaults = defaults

    def on_create_topics(self, ctx, req):
        out = []
        live = sum(1 for b in ctx.cluster.fresh().brokers_raw.values() if row_is_up(b)) or 1
        seen: set[str] = set()
        for t in req.topics:
            res = {"name": t.name, "error_code": K.none, "error_message": None}
            if ctx.api_version >= 5:   # (v5 answers each topic's configs; none listed here)
                res["configs"] = []
            parts = self.defaults.num_partitions if t.num_partitions == -1 else t.num_partitions
            rf = min(self.defaults.default_replication_factor, live) if t.replication_factor == -1 \
                else t.replication_factor
            if t.name in seen:
                res.update(error_code=K.invalid_request, error_message="topic named twice")
            elif not VALID_TOPIC.fullmatch(t.name or ""):
                res.update(error_code=K.invalid_topic_exception, error_message=f"bad topic name {t.name!r}")
            elif not ctx.authorizer.allowed(ctx.principal, "CREATE", "TOPIC", t.name):
                res.update(error_code=K.topic_authorization_failed, error_message=None)
            elif t.assignments:
                res.update(error_code=K.invalid_request, error_message="replica assignments are not supported: "
                                                                        "the mesh places replicas itself")
            elif parts < 1:
                res.update(error_code=K.invalid_partitions, error_message=f"{parts} partitions")
            elif rf < 1 or rf > live:
                res.update(error_code=K.invalid_replication_factor,
                           error_message=f"replication factor {rf} with {live} live brokers")
            elif not req.validate_only:
                configs = {c.name: c.value for c in t.configs if c.value is not None}
                try:
                    native_admin(ctx).create_topic(t.name, parts, rf, configs, wait_s=max(1.0, ms(req.timeout) / 1000))
                except MeshError as exc:
                    res.update(error_code=kafka_error(exc.code), error_message=exc.message[:500])
                    if exc.code == ErrorCode.INVALID_CONFIG:
                        res["error_code"] = K.invalid_config
            seen.add(t.name)
            if res["error_code"] == K.none:
                res.update(num_partitions=parts, replication_factor=rf)
            out.append(res)
        if any(r["error_code"] == K.none for r in out) and not req.validate_only:
            ctx.cluster.refresh()
        return make(response_class(19, ctx.api_version), {"throttle_time": 0, "topics": out})

    def on_delete_topics(self, ctx, req):
        names = list(getattr(req, "topic_names", ()) or ())
        out = []
        cache = ctx.cluster.fresh()
        for name in names:
            res = {"name": name, "error_code": K.none}
            if not ctx.authorizer.allowed(ctx.principal, "DELETE", "TOPIC", name):
                res["error_code"] = K.topic_authorization_failed
            else:
                try:
                    native_admin(ctx).delete_topic(name, wait_s=max(1.0, ms(req.timeout) / 1000))
                except MeshError as exc:
                    res["error_code"] = kafka_error(exc.code)
            out.append(res)
        cache.refresh()
        return make(response_class(20, ctx.api_version), {"throttle_time": 0, "responses": out})

    def on_create_partitions(self, ctx, req):
        out = []
        cache = ctx.cluster.fresh()
        cache.refresh()   # the current counts (a topic grown a moment ago through another broker)
        seen: set[str] = set()
        changed = False
        for t in req.topics:
            res = {"name": t.name, "error_code": K.none, "error_message": None}
            topic = cache.topic(t.name)
            have = len(topic.get("partitions") or []) if topic else 0
            if t.name in seen:
                res.update(error_code=K.invalid_request, error_message="topic named twice")
            elif not ctx.authorizer.allowed(ctx.principal, "ALTER", "TOPIC", t.name):
                res["error_code"] = K.topic_authorization_failed
            elif topic is None:
                res.update(error_code=K.unknown_topic_or_partition, error_message=f"no topic {t.name!r}")
            elif t.assignments:
                res.update(error_code=K.invalid_request, error_message="replica assignments are not supported: "
                                                                        "the mesh places replicas itself")
            elif t.count <= have:
                res.update(error_code=K.invalid_partitions,
                           error_message=f"topic {t.name} has {have} partitions: ask for more (they are only added)")
            elif not req.validate_only:
                try:
                    native_admin(ctx).alter_topic(t.name, partitions=t.count,
                                                  wait_s=max(1.0, ms(req.timeout) / 1000))
                    changed = True
                except MeshError as exc:
                    res.update(error_code=kafka_error(exc.code), error_message=exc.message[:500])
            seen.add(t.name)
            out.append(res)
        if changed:
            cache.refresh()
        return make(response_class(37, ctx.api_version), {"throttle_time": 0, "results": out})
