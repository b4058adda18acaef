"""Fetch (API 1, v4-12) and ListOffsets (API 2, v1-7).

Fetch: the partitions asked are grouped by their mesh leader and each group is one native
FetchRequest with the client's ``max.wait.ms``, ``min.bytes``, ``fetch.max.bytes`` and
per-partition ``max.partition.fetch.bytes`` (the node long-polls and bounds them; its own
caps apply too), all sent at once and gathered within the wait plus a margin. Each
partition's mesh batches become Kafka batches with the same offsets (``convert.to_kafka``):
a fetch offset inside a batch gets that whole batch, as Kafka does, and the client skips
what is below its position. High watermark and log start offset come from the leader;
an offset outside the log is OFFSET_OUT_OF_RANGE. Incremental fetch sessions (KIP-227)
are not kept: every answer has session id 0, which tells the client to send full fetches.

ListOffsets: -2 earliest, -1 latest (the high watermark) through the native
``ClusterView.list_offsets``; a timestamp >= 0 through ``ClusterView.offsets_for_times``
where the native client has it (else UNSUPPORTED_FOR_MESSAGE_FORMAT for that partition,
which clients do not retry); -3 (the record with the largest timestamp, v7) likewise.
"""
from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode as K

from mesh.kafka.build import make, ms
from mesh.kafka.codec import response_class
from mesh.kafka.convert import to_kafka
from mesh.kafka.meta import kafka_error
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import EARLIEST, LATEST, FetchRequest, FetchResponse
from mesh.wire.types import TopicPartition

__all__ = ["FetchApi"]

log = logging.getLogger("mesh.kafka.fetch")

MAX_WAIT_MS = 30_000
_MARGIN_S = 2.0


class FetchApi:
    # -- Fetch ------------------------------------------------------------------------------
    def on_fetch(self, ctx, req):
        link = ctx.mesh
        view, transport = link.cluster, link.transport
        max_wait_ms = max(0, min(ms(req.max_wait), MAX_WAIT_MS))
        max_bytes = getattr(req, "max_bytes", 2 ** 31 - 1)
        results: dict[tuple[str, int], dict] = {}
        order: list[tuple[str, int]] = []
        by_addr: dict[str, list] = {}
        for t in req.topics:
            allowed = ctx.authorizer.allowed(ctx.principal, "READ", "TOPIC", t.topic)
            for p in t.partitions:
                key = (t.topic, p.partition)
                if key in results:
                    continue
                order.append(key)
                res = results[key] = {"partition_index": p.partition, "error_code": K.none, "high_watermark": -1,
                                      "last_stable_offset": -1, "log_start_offset": -1, "records": None,
                                      "aborted_transactions": None}
                if not allowed:
                    res["error_code"] = K.topic_authorization_failed
                    continue
                try:
                    addr = view.leader_address(t.topic, p.partition)
                except MeshError as exc:
                    res["error_code"] = kafka_error(exc.code)
                    continue
                if addr is None:
                    res["error_code"] = K.leader_not_available
                    continue
                by_addr.setdefault(addr, []).append([t.topic, p.partition, p.fetch_offset, p.partition_max_bytes])
        rids = {transport.send(addr, FetchRequest(parts, max_wait_ms, req.min_bytes, max_bytes)): parts
                for addr, parts in by_addr.items()}
        got = transport.gather(list(rids), max_wait_ms + int(_MARGIN_S * 1000)) if rids else {}
        stale: set[str] = set()
        for rid, parts in rids.items():
            offsets = {(tp[0], tp[1]): tp[2] for tp in parts}
            if rid not in got:
                for topic, partition, _o, _m in parts:
                    results[(topic, partition)]["error_code"] = K.request_timed_out
                continue
            _a, resp, payload = got[rid]
            if not isinstance(resp, FetchResponse) or resp.error:
                code = kafka_error(getattr(resp, "error", ErrorCode.UNKNOWN))
                for topic, partition, _o, _m in parts:
                    results[(topic, partition)]["error_code"] = code
                    stale.add(topic)
                continue
            pos = 0
            mv = memoryview(payload or b"")
            for topic, partition, err, hw, log_start, nbytes, _leader in resp.parts:
                res = results.get((topic, partition))
                chunk = mv[pos:pos + nbytes] if nbytes else b""
                pos += nbytes
                if res is None:
                    continue
                res.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=log_start)
                if err:
                    res["error_code"] = kafka_error(err)
                    if err in (ErrorCode.NOT_LEADER, ErrorCode.UNKNOWN_TOPIC, ErrorCode.UNKNOWN_PARTITION):
                        stale.add(topic)
                    continue
                if chunk:
                    try:
                        res["records"], _n = to_kafka(chunk, offsets.get((topic, partition), 0))
                    except MeshError as exc:
                        res["error_code"] = kafka_error(exc.code)
                else:
                    res["records"] = b""
        if stale:
            try:
                view.refresh(sorted(stale))
            except MeshError:
                pass
        by_topic: dict[str, list] = {}
        for topic, partition in order:
            by_topic.setdefault(topic, []).append(results[(topic, partition)])
        return make(response_class(1, ctx.api_version), {
            "throttle_time": 0, "error_code": K.none, "session_id": 0,
            "responses": [{"topic": n, "partitions": ps} for n, ps in by_topic.items()]})

    # -- ListOffsets --------------------------------------------------------------------
    def on_list_offsets(self, ctx, req):
        view = ctx.mesh.cluster
        results: dict[tuple[str, int], dict] = {}
        order: list[tuple[str, int]] = []
        wanted: dict[int, list[TopicPartition]] = {}
        by_time: dict[TopicPartition, int] = {}
        for t in req.topics:
            allowed = ctx.authorizer.allowed(ctx.principal, "DESCRIBE", "TOPIC", t.name)
            for p in t.partitions:
                key = (t.name, p.partition_index)
                order.append(key)
                res = results[key] = {"partition_index": p.partition_index, "error_code": K.none,
                                      "timestamp": -1, "offset": -1, "leader_epoch": -1}
                if not allowed:
                    res["error_code"] = K.topic_authorization_failed
                elif p.timestamp in (EARLIEST, LATEST):
                    wanted.setdefault(p.timestamp, []).append(TopicPartition(*key))
                elif p.timestamp >= 0 and hasattr(view, "offsets_for_times"):
                    by_time[TopicPartition(*key)] = p.timestamp
                else:   # (not retriable: what Kafka answered where its log could not say)
                    res["error_code"] = K.unsupported_for_message_format
        for spec, tps in wanted.items():
            try:
                got = view.list_offsets(tps, spec, timeout_ms=5_000, partial=True)
            except MeshError as exc:
                for tp in tps:
                    results[tuple(tp)]["error_code"] = kafka_error(exc.code)
                continue
            for tp in tps:
                if tp in got:
                    results[tuple(tp)]["offset"] = got[tp]
                else:
                    results[tuple(tp)]["error_code"] = K.unknown_topic_or_partition
        if by_time:
            try:
                found = view.offsets_for_times(by_time, 5_000)
            except MeshError as exc:
                found = None
                for tp in by_time:
                    results[tuple(tp)]["error_code"] = kafka_error(exc.code)
            for tp in by_time if found is not None else ():
                hit = found.get(tp)
                if hit is None:   # no record at or after the time: Kafka answers -1, -1
                    continue
                results[tuple(tp)].update(offset=hit[0], timestamp=hit[1])
        by_topic: dict[str, list] = {}
        for name, index in order:
            by_topic.setdefault(name, []).append(results[(name, index)])
        return make(response_class(2, ctx.api_version), {
            "throttle_time": 0, "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]})
