"""The Kafka listener's pure parts: ids, the answer builder, the codec, record conversion,
the gossip schema of the ``kafka`` key and the status column."""
from __future__ import annotations

import uuid

import pytest

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mesh.cluster import keys
from mesh.cluster.schema import validate_entry
from mesh.kafka.build import make
from mesh.kafka.codec import BadRequest, decode_request, encode_response, peek_header, response_class
from mesh.kafka.convert import ConvertError, mesh_producer_id, to_kafka, to_mesh
from mesh.kafka.ids import derive_node_id, resolve_collisions, topic_id
from mesh.wire import messages as m
from mesh.wire.records import parse_header, patch_batch, records_from
from tools.elastic_cli import status_rows, status_table


def test_node_ids_are_stable_and_collisions_settled_the_same_everywhere():
    assert derive_node_id("n1") == 1 and derive_node_id("broker-12") == 12
    assert derive_node_id("alpha") == derive_node_id("alpha") >= 1000
    ids, moved = resolve_collisions({"b1": 1, "a1": 1, "c": 7})
    assert ids["a1"] == 1 and ids["b1"] != 1 and len(set(ids.values())) == 3 and moved == ["b1"]
    assert resolve_collisions({"a1": 1, "b1": 1, "c": 7}) == (ids, moved)


def test_topic_ids_follow_the_topic_incarnation():
    a, b = topic_id("t", "00aa00aa00aa00aa"), topic_id("t", "11bb11bb11bb11bb")
    assert a == topic_id("t", "00aa00aa00aa00aa") and a != b and a.int and isinstance(a, uuid.UUID)


def test_kafka_gossip_key_is_checked():
    assert validate_entry(keys.KAFKA_KEY, {"host": "127.0.0.1", "port": 9092, "id": 1}, 0) is None
    for bad in ({"host": "h", "port": 0, "id": 1}, {"host": "h", "port": 9092, "id": -1},
                {"host": "h", "port": 9092}, {"host": "", "port": 9092, "id": 1}, {"host": "h", "port": 9092, "id": 2**31}):
        assert validate_entry(keys.KAFKA_KEY, bad, 0) is not None


def test_status_shows_the_kafka_listener():
    md = m.MetadataResponse(0, [{"id": "n1", "address": "a:1", "kafka": {"host": "127.0.0.1", "port": 9092, "id": 1}},
                                {"id": "n2", "address": "a:2"}], [])
    rows = status_rows(md)
    assert [r["kafka"] for r in rows] == ["1@127.0.0.1:9092", "-"]
    assert "1@127.0.0.1:9092" in "\n".join(status_table(rows))


def test_make_fits_the_version_and_codec_round_trips():
    for v in (0, 3):
        resp = make(response_class(18, v), {"error_code": 0, "throttle_time": 5,
                                            "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}]})
        frame = encode_response(18, v, 42, resp)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert int.from_bytes(frame[4:8], "big") == 42
        assert frame[8:10] == b"\0\0"   # header v0 even for v3: error code follows the correlation id
    with pytest.raises(BadRequest):
        peek_header(b"\0\1")
    with pytest.raises(BadRequest):
        decode_request(b"\0\3\0\x09\0\0\0\1\0\1x", 3, 9)   # Metadata v9 cut short


def _kafka_batch(values, keys=None, producer_id=-1, epoch=-1, seq=-1, codec=0):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=producer_id,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i, v in enumerate(values):
        b.append(i, 1000 + i, keys[i] if keys else None, v, [("h", b"%d" % i)])
    return bytes(b.build())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_records_convert_both_ways_with_offsets_kept(codec):
    values = [b"a", None, b"", b"d" * 1000]
    mesh, info = to_mesh(_kafka_batch(values, [b"k0", None, b"k2", b"k3"], producer_id=5, epoch=2, seq=10,
                                      codec=codec))
    h = parse_header(mesh)
    assert (info.count, h.record_count, h.producer_id, h.base_sequence) == (4, 4, mesh_producer_id(5, 2), 10)
    stored = patch_batch(mesh, 100, 1)
    recs = records_from("t", 0, stored)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in recs] == [
        (100, b"k0", b"a", 1000), (101, None, None, 1001), (102, b"k2", b"", 1002), (103, b"k3", b"d" * 1000, 1003)]
    out, n = to_kafka(stored, first_offset=102)   # an offset inside the batch: the whole batch
    assert n == 4
    from aiokafka.record.memory_records import MemoryRecords
    batch = MemoryRecords(out).next_batch()
    assert batch.validate_crc()
    assert [(r.offset, r.key, r.value, r.headers) for r in batch] == [
        (100 + i, k, v, [("h", b"%d" % i)]) for i, (k, v) in enumerate(zip([b"k0", None, b"k2", b"k3"], values))]
    assert to_kafka(stored, first_offset=104) == (b"", 0)


def test_bad_batches_are_refused_with_a_code():
    good = _kafka_batch([b"x"])
    bad_crc = good[:-1] + bytes([good[-1] ^ 1])
    for raw, code in ((b"", "invalid_request"), (bad_crc, "corrupt_message"), (good + good, "invalid_request"),
                      (good[:30], "corrupt_message")):
        with pytest.raises(ConvertError) as exc:
            to_mesh(raw)
        assert exc.value.code == code


def test_meta_cache_lists_live_listeners_with_distinct_ids():
    from mesh.kafka.link import MetaCache
    cache = MetaCache(links=None, mesh_id="n1", host="127.0.0.1", port=9092, kafka_id=1)
    cache._apply({"n1": {"status": "alive", "kafka": {"host": "127.0.0.1", "port": 9092, "id": 1}},
                  "x1": {"status": "alive", "kafka": {"host": "127.0.0.1", "port": 9093, "id": 1}},
                  "n3": {"status": "dead", "kafka": {"host": "127.0.0.1", "port": 9094, "id": 3}},
                  "n4": {"status": "alive", "kafka": None}}, {})
    brokers = cache.kafka_brokers()
    assert [(b.mesh_id, b.port) for b in brokers] == [("n1", 9092), ("x1", 9093)]   # n3 dead, n4 has none
    assert len({b.node_id for b in brokers}) == 2 and cache.self_broker().node_id == 1
    assert cache.kafka_broker_of("n3").node_id == 3 and cache.kafka_broker_of("n4") is None


def test_listener_process_tunes_the_collector_for_its_per_record_objects():
    # in a child: the collector's settings are the whole process's
    import subprocess
    import sys
    code = ("import gc; from mesh.kafka.process import GC_GEN0_THRESHOLD, tune_gc; tune_gc(); "
            "print(gc.get_threshold()[0] == GC_GEN0_THRESHOLD >= 10_000, gc.get_freeze_count() > 1000, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-2000:]
