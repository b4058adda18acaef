"""Produce (API 0, v3-9) and InitProducerId (API 22, v0-4).

Produce: each partition's Kafka batch is converted (``convert.to_mesh``) and sent to the
partition's mesh leader as a native ProduceRequest with the same acks (0: nothing is
answered, 1: the leader stored it, -1: a quorum did, as the mesh means them), all
partitions at once, then the answers gathered within the request's timeout. A leader that
moved is followed once at once (its NOT_LEADER names the new one); otherwise the client
gets NOT_LEADER_OR_FOLLOWER or REQUEST_TIMED_OUT and retries, which the idempotent
producer makes harmless. ``max.message.bytes`` (the topic's, the Kafka batch as sent)
is MESSAGE_TOO_LARGE.

Idempotence: InitProducerId hands out a random producer id below 2**47 with epoch 0 (no
state: any listener may answer; a collision of two random 47-bit ids is as unlikely as
Kafka's id blocks going wrong); a request naming its current id and epoch (KIP-360, v3+)
gets the epoch bumped. The mesh dedups by (partition, producer id) with sequences
(``mesh.node.data.producer_state``): ``convert.mesh_producer_id`` makes one mesh producer per
(Kafka id, epoch), so Kafka's rules follow: a retried batch the leader remembers is
answered with its original offset; an older one DUPLICATE_SEQUENCE_NUMBER; a gap
OUT_OF_ORDER_SEQUENCE_NUMBER; a sequence other than 0 from a producer the leader keeps no
state of UNKNOWN_PRODUCER_ID. No transactions: a transactional id is refused.
"""
from __future__ import annotations

import logging
import random
import time

from kio.schema.errors import ErrorCode as K

from mesh.kafka.build import make, ms
from mesh.kafka.codec import response_class
from mesh.kafka.context import Deferred
from mesh.kafka.convert import MAX_KAFKA_PRODUCER_ID, ConvertError, to_mesh
from mesh.kafka.meta import kafka_error
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import ACKS_WIRE, Acks, ErrorResponse, ProduceRequest, ProduceResponse
from mesh.wire.topic_config import TOPIC_DEFAULTS

__all__ = ["ProduceApi"]

log = logging.getLogger("mesh.kafka.produce")
_rng = random.SystemRandom()
_BACKOFF_S = 0.05   # before asking again for a leader (an election takes about a second)


class ProduceApi:
    def __init__(self, max_message_bytes: int | None = None) -> None:
        self.default_max_message_bytes = max_message_bytes or TOPIC_DEFAULTS["max.message.bytes"]

    # -- InitProducerId ---------------------------------------------------------------------
    def on_init_producer_id(self, ctx, req):
        out = {"throttle_time": 0, "error_code": K.none, "producer_id": -1, "producer_epoch": -1}
        if req.transactional_id is not None:
            out["error_code"] = K.transactional_id_authorization_failed   # no transactions here
        elif not ctx.authorizer.allowed(ctx.principal, "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster"):
            out["error_code"] = K.cluster_authorization_failed
        else:
            pid, epoch = getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
            if 0 <= pid <= MAX_KAFKA_PRODUCER_ID and 0 <= epoch < 32766:
                out.update(producer_id=pid, producer_epoch=epoch + 1)
            else:
                out.update(producer_id=_rng.randrange(1, MAX_KAFKA_PRODUCER_ID), producer_epoch=0)
        return make(response_class(22, ctx.api_version), out)

    # -- Produce ----------------------------------------------------------------------------
    def on_produce(self, ctx, req):
        acks = req.acks
        timeout_ms = max(1, min(ms(req.timeout), 300_000))
        results: dict[tuple[str, int], dict] = {}
        sends = []   # (topic, partition, mesh batch)
        order = []
        cache = ctx.cluster.fresh()
        refreshed = False
        for t in req.topic_data:
            for p in t.partition_data:
                key = (t.name, p.index)
                order.append(key)
                res = results[key] = {"index": p.index, "error_code": K.none, "base_offset": -1,
                                      "log_start_offset": -1, "error_message": None}
                if acks not in ACKS_WIRE:
                    res["error_code"] = K.invalid_required_acks
                    continue
                if req.transactional_id is not None:
                    res["error_code"] = K.transactional_id_authorization_failed
                    continue
                if not ctx.authorizer.allowed(ctx.principal, "WRITE", "TOPIC", t.name):
                    res["error_code"] = K.topic_authorization_failed
                    continue
                topic = cache.topic(t.name)
                if topic is None and not refreshed:   # created a moment ago? (once per request)
                    cache.refresh()
                    refreshed = True
                    topic = cache.topic(t.name)
                if topic is None or not 0 <= p.index < len(topic.get("partitions") or []):
                    res["error_code"] = K.unknown_topic_or_partition
                    continue
                limit = (topic.get("config") or {}).get("max.message.bytes", self.default_max_message_bytes)
                records = p.records or b""
                if len(records) > limit:
                    res.update(error_code=K.message_too_large,
                               error_message=f"batch of {len(records)} bytes, max.message.bytes={limit}")
                    continue
                try:
                    batch, _info = to_mesh(records)
                except ConvertError as exc:
                    res.update(error_code=getattr(K, exc.code), error_message=str(exc)[:300])
                    continue
                sends.append((t.name, p.index, batch))
        flight = _Flight(ctx.mesh, acks, timeout_ms, results)
        for topic, partition, batch in sends:
            flight.send(topic, partition, batch)
        if acks == Acks.NONE:
            return None
        by_topic: dict[str, list] = {}
        for name, index in order:
            by_topic.setdefault(name, []).append(results[(name, index)])
        cls = response_class(0, ctx.api_version)

        def finish():
            flight.wait()
            return make(cls, {"responses": [{"name": n, "partition_responses": ps} for n, ps in by_topic.items()],
                              "throttle_time": 0})
        return Deferred(finish)


class _Flight:
    """One Produce request's batches on their way to the mesh leaders, until ``timeout_ms``
    (less a margin, so the client hears before it gives up). Several flights of one
    connection may be out at once (the server pipelines produce requests); each takes its
    own answers from the link's inbox. A leader that moved (NOT_LEADER naming the new one:
    at once; without a name, or none elected yet: after ``_BACKOFF_S`` and a metadata
    refresh) or whose connection dropped (killed, paused) gets the same batch again: with a
    producer id the mesh stores it once whichever leader had it (``producer_state``)."""

    def __init__(self, link, acks: int, timeout_ms: int, results: dict) -> None:
        self.link, self.acks, self.timeout_ms, self.results = link, acks, timeout_ms, results
        self.deadline = time.monotonic() + timeout_ms * 0.9 / 1000
        self.inflight: dict[int, tuple] = {}   # rid -> (topic, partition, batch, address, sent at)
        self.waiting: list[tuple] = []         # (not before, topic, partition, batch)

    def send(self, topic: str, partition: int, batch: bytes) -> None:
        view, transport = self.link.cluster, self.link.transport
        res = self.results[(topic, partition)]
        try:
            addr = view.leader_address(topic, partition)
        except MeshError as exc:
            res["error_code"] = kafka_error(exc.code)
            if exc.retriable:
                self.waiting.append((time.monotonic() + _BACKOFF_S, topic, partition, batch))
            return
        if addr is None or transport.is_down(addr):
            res["error_code"] = K.leader_not_available
            self.waiting.append((time.monotonic() + _BACKOFF_S, topic, partition, batch))
            return
        rid = transport.send(addr, ProduceRequest(topic, partition, self.acks, self.timeout_ms), batch)
        if self.acks != Acks.NONE:
            self.inflight[rid] = (topic, partition, batch, addr, time.monotonic())

    def wait(self) -> None:
        link, view = self.link, self.link.cluster
        inflight, waiting = self.inflight, self.waiting
        refreshed_at = 0.0
        while (inflight or waiting) and time.monotonic() < self.deadline:
            mine = [rid for rid in inflight if rid in link.inbox]
            if not mine:
                if inflight:
                    link.collect(50)
                elif waiting:
                    pause = min(w[0] for w in waiting) - time.monotonic()
                    if pause > 0:
                        time.sleep(min(pause, max(0.0, self.deadline - time.monotonic())))
            for rid in mine:
                _a, resp, _p = link.inbox.pop(rid)
                self._answer(inflight.pop(rid), resp)
            for rid, (topic, partition, batch, addr, sent) in list(inflight.items()):
                if link.down_at.get(addr, 0.0) > sent:   # its connection dropped: never answered
                    del inflight[rid]
                    link.transport.abandon([rid])
                    self.results[(topic, partition)]["error_code"] = K.not_leader_or_follower
                    waiting.append((time.monotonic() + _BACKOFF_S, topic, partition, batch))
            now = time.monotonic()
            due = [w for w in waiting if w[0] <= now]
            if due:
                waiting[:] = [w for w in waiting if w[0] > now]
                if now - refreshed_at > _BACKOFF_S:
                    refreshed_at = now
                    try:
                        view.refresh(sorted({w[1] for w in due}))
                    except MeshError:
                        pass
                for _t, topic, partition, batch in due:
                    self.send(topic, partition, batch)
        for rid, (topic, partition, _b, _a, _s) in inflight.items():
            self.results[(topic, partition)]["error_code"] = K.request_timed_out
            link.inbox.pop(rid, None)
        if inflight:
            link.transport.abandon(list(inflight))
            inflight.clear()

    def _answer(self, item: tuple, resp) -> None:
        topic, partition, batch, addr, _sent = item
        res = self.results[(topic, partition)]
        if isinstance(resp, ProduceResponse) and not resp.error:
            res.update(error_code=K.none, base_offset=resp.base_offset, log_start_offset=resp.log_start,
                       error_message=None)
            return
        code = getattr(resp, "error", ErrorCode.UNKNOWN)
        leader = getattr(resp, "leader", None)
        res["error_code"] = kafka_error(code)
        msg = getattr(resp, "message", "") if isinstance(resp, (ProduceResponse, ErrorResponse)) else ""
        res["error_message"] = msg[:300] or None
        if code == ErrorCode.OUT_OF_ORDER_SEQUENCE and "is new here" in msg:
            # the leader keeps no state of this producer (expired, or the topic was made again):
            # Kafka's UNKNOWN_PRODUCER_ID, which its clients answer with an epoch bump (KIP-360);
            # the words are mesh.node.data.producer_state's
            res["error_code"] = K.unknown_producer_id
        if code in (ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.BROKER_UNAVAILABLE):
            if leader and leader != addr:
                self.link.cluster.set_leader(topic, partition, leader)
                self.send(topic, partition, batch)
            else:
                self.waiting.append((time.monotonic() + _BACKOFF_S, topic, partition, batch))
