"""Fetch and Produce details through raw Kafka requests: long poll, a whole batch for an
offset inside it, OFFSET_OUT_OF_RANGE, high watermark and log start, MESSAGE_TOO_LARGE,
acks=0 answered with nothing."""
from __future__ import annotations

import datetime
import time

import pytest

from kio.schema.errors import ErrorCode as K
from kio.schema.fetch.v12 import request as fr
from kio.schema.list_offsets.v7 import request as lr
from kio.schema.produce.v9 import request as pr
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from mesh.client.admin import Admin
from mesh.client.producer import Producer
from mesh.kafka.convert import to_kafka  # noqa: F401 (the module under test is the listener)
from tests.integration.kafka_support import connect, kcluster, kio_call, new_topic  # noqa: F401

pytestmark = pytest.mark.integration


def _fetch(topic: str, offset: int, wait_ms: int, min_bytes: int = 1, part_max: int = 1 << 20):
    return fr.FetchRequest(max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=wait_ms)),
                           min_bytes=i32(min_bytes), max_bytes=i32(8 << 20), isolation_level=i8(0),
                           topics=(fr.FetchTopic(topic=topic, partitions=(fr.FetchPartition(
                               partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(part_max)),)),),
                           forgotten_topics_data=())


def _leader_listener(kcluster, topic: str):
    with Admin(kcluster.bootstrap) as a:
        leader = a.metadata([topic]).topics[0]["partitions"][0]["leader"]
    return next(b for b in kcluster.brokers if b.node_id == leader).kafka_address


def test_fetch_long_polls_and_returns_whole_batches(kcluster):
    topic = new_topic(kcluster, "lp")
    with connect(_leader_listener(kcluster, topic)) as s:
        t0 = time.monotonic()
        resp = kio_call(s, _fetch(topic, 0, 1200))
        waited = time.monotonic() - t0
        part = resp.responses[0].partitions[0]
        assert part.error_code == K.none and part.high_watermark == 0 and not part.records
        assert waited >= 1.0   # nothing to read: the listener waited max.wait.ms
        p = Producer(kcluster.bootstrap)
        p.send_batch(topic, [b"a", b"b", b"c", b"d"], partition=0).result(10)   # one batch, offsets 0-3
        p.close()
        resp = kio_call(s, _fetch(topic, 2, 5000), correlation_id=2)   # inside the first batch
        part = resp.responses[0].partitions[0]
        assert part.error_code == K.none and part.high_watermark == 4 and part.log_start_offset == 0
        from aiokafka.record.memory_records import MemoryRecords
        mr = MemoryRecords(bytes(part.records))
        offsets = []
        while (b := mr.next_batch()) is not None:
            offsets += [r.offset for r in b]
        assert offsets == [0, 1, 2, 3]   # the whole batch that holds offset 2
        resp = kio_call(s, _fetch(topic, 99, 100), correlation_id=3)
        assert resp.responses[0].partitions[0].error_code == K.offset_out_of_range
        lo = lr.ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(0), topics=(lr.ListOffsetsTopic(
            name=topic, partitions=(lr.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(-1)),)),))
        resp = kio_call(s, lo, correlation_id=4)
        assert resp.topics[0].partitions[0].offset == 4


def _produce(topic: str, records: bytes, acks: int = -1):
    return pr.ProduceRequest(acks=i16(acks), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
                             topic_data=(pr.TopicProduceData(name=topic, partition_data=(
                                 pr.PartitionProduceData(index=i32(0), records=records),)),))


def _batch(values, producer_id=-1, epoch=-1, seq=-1):
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=producer_id,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 24)
    for i, v in enumerate(values):
        b.append(i, int(time.time() * 1000), None, v, [])
    return bytes(b.build())


def test_produce_limits_acks0_and_sequences(kcluster):
    topic = "big-" + str(int(time.time() * 1000) % 100000)
    with Admin(kcluster.bootstrap) as a:
        a.create_topic(topic, 1, 3, {"max.message.bytes": 4096})
    with connect(_leader_listener(kcluster, topic)) as s:
        resp = kio_call(s, _produce(topic, _batch([b"x" * 10_000])))
        assert resp.responses[0].partition_responses[0].error_code == K.message_too_large
        # acks=0: no answer at all; the next request's answer is the next frame
        kio_call_no_answer = _produce(topic, _batch([b"zero"]), acks=0)
        import io, struct
        from kio.serial import entity_writer
        from kio.static.primitive import i16 as _i16
        h = kio_call_no_answer.__header_schema__
        buf = io.BytesIO()
        entity_writer(h)(buf, h(request_api_key=_i16(0), request_api_version=_i16(9), correlation_id=i32(50),
                                client_id="t"))
        entity_writer(type(kio_call_no_answer))(buf, kio_call_no_answer)
        s.sendall(struct.pack(">i", len(buf.getvalue())) + buf.getvalue())
        # an idempotent producer's batches: new, a retry (same offset), a gap, an old one
        pid = 1234567
        r1 = kio_call(s, _produce(topic, _batch([b"a", b"b"], pid, 0, 0)), correlation_id=51)
        p1 = r1.responses[0].partition_responses[0]
        assert p1.error_code == K.none
        r2 = kio_call(s, _produce(topic, _batch([b"a", b"b"], pid, 0, 0)), correlation_id=52)
        assert r2.responses[0].partition_responses[0].error_code == K.none
        assert r2.responses[0].partition_responses[0].base_offset == p1.base_offset   # stored once
        r3 = kio_call(s, _produce(topic, _batch([b"c"], pid, 0, 5)), correlation_id=53)
        assert r3.responses[0].partition_responses[0].error_code == K.out_of_order_sequence_number
        r5 = kio_call(s, _produce(topic, _batch([b"c"], pid + 1, 0, 3)), correlation_id=56)   # no state, seq 3
        assert r5.responses[0].partition_responses[0].error_code == K.unknown_producer_id
        r4 = kio_call(s, _produce(topic, _batch([b"c"], pid, 1, 0)), correlation_id=54)   # epoch bumped: seq 0
        assert r4.responses[0].partition_responses[0].error_code == K.none
        assert r4.responses[0].partition_responses[0].base_offset == p1.base_offset + 2
        resp = kio_call(s, _fetch(topic, 0, 100), correlation_id=55)
        from aiokafka.record.memory_records import MemoryRecords
        mr = MemoryRecords(bytes(resp.responses[0].partitions[0].records))
        values = []
        while (b := mr.next_batch()) is not None:
            values += [r.value for r in b]
        assert values == [b"zero", b"a", b"b", b"c"]
