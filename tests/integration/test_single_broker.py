"""One real broker process: the foundation's promises, end to end."""
import collections
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from mesh.wire import messages as m
from mesh.client import Admin, Consumer, ErrorCode, MeshError, Producer
from mesh.client.transport import Transport
from mesh.wire.records import encode_batch
from mesh.wire.codec import PROTOCOL_CLIENT, pack, unpack
from mesh.testing.launcher import ROOT, BrokerProcess, wait_until

pytestmark = pytest.mark.integration


def consume_all(addr, topic, expected, timeout_s=30):
    out = collections.defaultdict(list)
    with Consumer(topic, bootstrap=addr, auto_offset_reset="earliest") as c:
        deadline = time.monotonic() + timeout_s
        n = 0
        while n < expected:
            assert time.monotonic() < deadline, f"consumed {n} of {expected}"
            for recs in c.poll_batches(500):
                for r in recs:
                    out[r.partition].append(r)
                n += sum(map(len, [recs]))
    return out


def test_produce_100k_and_consume_in_order(broker):
    with Admin(broker.address) as a:
        a.create_topic("hundredk", partitions=6)
    sent = collections.defaultdict(list)
    futures = []
    with Producer(broker.address, acks=1) as p:
        for i in range(100_000):
            key = b"k%d" % (i % 97) if i % 2 else None
            value = b"v%06d" % i
            futures.append((value, p.send("hundredk", value, key=key)))
    for value, f in futures:
        md = f.get(10)
        sent[md.partition].append((md.offset, value))
    got = consume_all(broker.address, "hundredk", 100_000)
    assert sum(map(len, got.values())) == 100_000
    for part, recs in got.items():
        offsets = [r.offset for r in recs]
        assert offsets == list(range(len(recs))), f"partition {part} offsets not contiguous"
        assert [r.value for r in recs] == [v for _, v in sorted(sent[part])]
        # send order per partition == offset order
        assert [v for _, v in sent[part]] == [r.value for r in recs]


def test_a_group_consumer_that_takes_little_per_poll_reads_ahead_a_bounded_amount(broker):
    """A group consumer received every fetch answer and sent the next at each poll: taking
    10 records per poll from a 4 MB topic, its buffer grew to the whole topic (the text
    gateway runs such consumers inside the broker). Now it reads ahead at most about
    fetch_max_bytes plus one fetch in flight."""
    with Admin(broker.address) as a:
        a.create_topic("readahead", partitions=2)
    value = b"x" * 1000
    with Producer(broker.address, acks=1) as p:
        for part in (0, 1):
            for _ in range(20):
                p.send_batch("readahead", [value] * 100, partition=part).result(10)   # 2 MB a partition
    cap = 64 << 10
    with Consumer("readahead", bootstrap=broker.address, group_id="readahead-g", auto_offset_reset="earliest",
                  fetch_max_bytes=cap, max_partition_fetch_bytes=cap) as c:
        got, most = 0, 0
        for _ in range(100):
            got += sum(len(recs) for recs in c.poll_batches(2000, max_records=10))
            c._receive(20)   # a caller busy between polls: what is in flight lands meanwhile
            buffered = sum(len(item[2]) for item in c._buffer if not isinstance(item, list))
            most = max(most, buffered)
        assert got == 1_000 and most <= 3 * cap, f"{most} bytes read ahead of the caller"


def test_send_batch_refuses_values_and_keys_that_are_not_bytes(broker):
    """A str value was stored as a str (the broker never decodes records), and a text
    client's CONS failed on it; send() always refused it."""
    with Admin(broker.address) as a:
        a.create_topic("typed", partitions=1)
    with Producer(broker.address, acks=1) as p:
        with pytest.raises(TypeError, match="values must be bytes or None, not .'str'."):
            p.send_batch("typed", [b"ok", "text"])
        with pytest.raises(TypeError, match="keys must be bytes or None, not .'int'."):
            p.send_batch("typed", [b"a", b"b"], keys=[b"k", 7])
        assert p.send_batch("typed", [b"a", bytearray(b"b")], keys=[None, b"k"]).result(10) == 0


def test_a_batch_that_cannot_be_decoded_is_refused_and_nothing_around_it_is_lost(broker):
    """A client can send columns that do not decode with a good CRC. The broker used to
    store them (it checked only the outer shape), and consumers then stopped on them; now
    it refuses them (INVALID_RECORD, mesh.wire.record_check) and the records around it are
    read as usual. (A consumer's handling of such a batch stored by an older broker:
    tests/unit/test_consumer_fetch.py.)"""
    import zlib
    from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC

    def raw_batch(payload: bytes, n: int) -> bytes:
        tail = _TAIL.pack(MAGIC, 0, 0, n, 0, 0, -1, -1, len(payload))
        return b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload))

    with Admin(broker.address) as a:
        a.create_topic("undecodable", partitions=1)
    t = Transport()
    try:
        def produce(batch):
            try:
                resp, _ = t.call(broker.address, m.ProduceRequest("undecodable", 0, -1), batch)
                return resp.error
            except MeshError as exc:
                return exc.code
        wait_until(lambda: produce(encode_batch([b"r0", b"r1", b"r2"])) == 0, 10, "a leader")
        assert produce(raw_batch(b"\x94\x91\xa1\xff\xc0\xc0\xc0", 1)) == ErrorCode.INVALID_RECORD  # not UTF-8
        assert produce(encode_batch([b"r4", b"r5"])) == 0
    finally:
        t.close()
    with Consumer(bootstrap=broker.address, auto_offset_reset="earliest") as c:
        c.assign([("undecodable", 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < deadline, got
            got += [(r.offset, r.value) for recs in c.poll_batches(500) for r in recs]
        assert got == [(0, b"r0"), (1, b"r1"), (2, b"r2"), (3, b"r4"), (4, b"r5")]


def test_keys_land_where_kafka_puts_them(broker):
    from mesh.wire.partitioner import partition_for_key
    with Admin(broker.address) as a:
        a.create_topic("keyed", partitions=5)
    with Producer(broker.address) as p:
        mds = [p.send("keyed", b"x", key=b"key-%d" % i).get(10) for i in range(50)]
    assert [md.partition for md in mds] == [partition_for_key(b"key-%d" % i, 5) for i in range(50)]


def test_headers_timestamps_and_bulk_send(broker):
    now_ms = int(time.time() * 1000) - 5000
    with Admin(broker.address) as a:
        a.create_topic("hdrs", partitions=1)
    with Producer(broker.address) as p:
        p.send("hdrs", b"one", key=b"k", headers=[("trace", b"abc")], timestamp_ms=now_ms).get(10)
        assert p.send_batch("hdrs", [b"b1", b"b2", b"b3"], partition=0).result(10) == 1
    recs = consume_all(broker.address, "hdrs", 4)[0]
    assert recs[0].headers == (("trace", b"abc"),) and recs[0].timestamp == now_ms and recs[0].key == b"k"
    assert [r.value for r in recs[1:]] == [b"b1", b"b2", b"b3"] and [r.offset for r in recs] == [0, 1, 2, 3]


def test_long_poll_fetch_is_answered_when_data_arrives(broker):
    with Admin(broker.address) as a:
        a.create_topic("longpoll", partitions=1)
    t = Transport()
    rid = t.send(broker.address, m.FetchRequest([["longpoll", 0, 0, 1 << 20]], max_wait_ms=20_000))
    assert t.poll(200) == []  # parked, not answered
    with Producer(broker.address) as p:
        p.send("longpoll", b"wake").get(10)
    answers = wait_until(lambda: t.poll(100), 10, "the parked fetch to be answered")
    (_, r, resp, payload), = answers
    assert r == rid and resp.parts[0][2] == 0 and resp.parts[0][5] > 0 and b"wake" in payload
    t.close()


def test_fetch_out_of_range_says_where_the_log_is(broker):
    with Admin(broker.address) as a:
        a.create_topic("range", partitions=1)
    with Producer(broker.address) as p:
        p.send("range", b"a").get(10)
    t = Transport()
    for offset in (5, -1):
        resp, _ = t.call(broker.address, m.FetchRequest([["range", 0, offset, 1024]], max_wait_ms=0))
        topic, part, err, hw, start, n, _ = resp.parts[0]
        assert (err, hw, start, n) == (ErrorCode.OFFSET_OUT_OF_RANGE, 1, 0, 0)
    t.close()


def test_unknown_topic_and_partition(broker):
    t = Transport()
    with pytest.raises(MeshError) as e:
        t.call(broker.address, m.ProduceRequest("nope", 0, 1), encode_batch([b"x"]))
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC
    with Admin(broker.address) as a:
        a.create_topic("twoparts", partitions=2)
    with pytest.raises(MeshError) as e:
        t.call(broker.address, m.ProduceRequest("twoparts", 2, 1), encode_batch([b"x"]))
    assert e.value.code == ErrorCode.UNKNOWN_PARTITION
    with pytest.raises(MeshError) as e:
        Producer(broker.address).send("nope", b"x")
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC
    t.close()


def test_producer_connects_up_front(broker):
    with Admin(broker.address) as a:
        a.create_topic("warm", partitions=2)
    with Producer(broker.address) as p:
        with pytest.raises(MeshError) as e:
            p.connect(["warm", "nope"], timeout=10)
        assert e.value.code == ErrorCode.UNKNOWN_TOPIC
        p.connect("warm", timeout=10)   # metadata and the leader's socket, before any send
        assert p.send("warm", b"x", partition=1).get(10).offset == 0


def test_unkeyed_records_stick_to_a_partition_for_batch_size_bytes(broker):
    """Kafka's uniform sticky partitioner: a blocking send leaves at once (its partition is
    idle), yet the next records stay on that partition until batch_size bytes went there."""
    with Admin(broker.address) as a:
        a.create_topic("sticky", partitions=4)
    with Producer(broker.address, batch_size=1000) as p:
        parts = [p.send("sticky", b"v" * 92).get(10).partition for _ in range(60)]   # 100 B each
    runs = [len(list(g)) for _, g in itertools.groupby(parts)]
    assert len(set(parts)) > 1 and all(r == 10 for r in runs[:-1]), runs


def test_oversized_records_are_refused_with_a_clear_error(broker):
    with Admin(broker.address) as a:
        a.create_topic("small", partitions=1, config={"max.message.bytes": 2048})
        with pytest.raises(MeshError) as e:
            a.create_topic("badcfg", config={"no.such.thing": 1})
        assert e.value.code == ErrorCode.INVALID_CONFIG
    with Producer(broker.address) as p:
        with pytest.raises(MeshError) as e:
            p.send("small", b"x" * (1 << 20 + 1))
        assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE
        f = p.send("small", b"y" * 4000)  # fits the client's limit, not the topic's
        with pytest.raises(MeshError) as e:
            f.get(10)
        assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE and "max.message.bytes" in e.value.message
        assert p.send("small", b"fine").get(10).offset == 0


def raw_request(sock, frames, timeout_ms=5000):
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "broker did not answer a bad request"
    return sock.recv_multipart()


@pytest.fixture(scope="module")
def raw(broker):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{broker.address}")
    yield s
    s.close()


def test_malformed_requests_get_errors_and_the_broker_keeps_serving(broker, raw):
    with Admin(broker.address) as a:
        a.create_topic("victim", partitions=1)
    with Producer(broker.address) as p:
        p.send("victim", b"before").get(10)
    rid = (1).to_bytes(8, "big")
    cases = [
        [b"garbage"],
        [b"mesh/1", rid, b"PRODUCE"],
        [b"mesh/9", rid, b"PRODUCE", b"\x90"],
        [b"mesh/1", rid, b"NOPE", b"\x90"],
        [b"mesh/1", rid, b"PRODUCE", b"\xc1\xc1"],
        [b"mesh/1", rid, b"PRODUCE", msgpack.packb(["victim", "zero", 1])],
        [b"mesh/1", rid, b"PRODUCE", msgpack.packb(["victim", 0, 7]), encode_batch([b"x"])],
        [b"mesh/1", rid, b"PRODUCE", msgpack.packb(["victim", 0, 1])],  # no batch frame
        [b"mesh/1", rid, b"PRODUCE", msgpack.packb(["victim", 0, 1]), b"\x00" * 80],
        [b"mesh/1", rid, b"PRODUCE", msgpack.packb(["victim", 0, 1]), encode_batch([b"x"])[:-3]],
        [b"mesh/1", rid, b"FETCH", msgpack.packb([[["victim", 0]]])],
        [b"mesh/1", rid, b"FETCH", msgpack.packb([[]])],
        [b"mesh/1", rid, b"CREATE_TOPIC", msgpack.packb(["bad name!", 1])],
        [b"mesh/1", rid, b"CREATE_TOPIC", msgpack.packb(["huge", 10**9])],
        [b"mesh/1", rid, b"PRODUCE_R", msgpack.packb([0])],
    ]
    for frames in cases:
        reply = raw_request(raw, frames)
        _, _, resp, _ = unpack(reply)
        assert isinstance(resp, m.ErrorResponse), (frames, resp)
        assert resp.error in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION,
                              ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_CONFIG), resp
        assert resp.message
    got = consume_all(broker.address, "victim", 1)
    assert [r.value for r in got[0]] == [b"before"]
    assert broker.alive()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(st.binary(max_size=200), min_size=1, max_size=6),
       op=st.sampled_from([b"PRODUCE", b"FETCH", b"METADATA", b"CREATE_TOPIC", b"DELETE_TOPIC", b"LIST_OFFSETS"]),
       body=st.recursive(st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.text(max_size=10), st.binary(max_size=10)),
                         lambda c: st.lists(c, max_size=5), max_leaves=10))
def test_fuzzed_requests_never_hurt_the_broker(broker, raw, frames, op, body):
    raw.send_multipart(frames)
    raw.send_multipart([b"mesh/1", (2).to_bytes(8, "big"), op, msgpack.packb(body)] + frames[:1])
    # drain whatever came back; then the broker must still answer a real request
    while raw.poll(50):
        raw.recv_multipart()
    assert broker.alive()
    raw.send_multipart(pack(PROTOCOL_CLIENT, 3, m.MetadataRequest([])))
    # late answers to the fuzzed frames may still come first: wait for ours
    wait_until(lambda: raw.poll(100) and unpack(raw.recv_multipart())[1] == 3, 10,
               "the broker to answer a real request after the fuzz")


def test_retention_deletes_from_the_head(broker):
    with Admin(broker.address) as a:
        a.create_topic("retained", partitions=1, config={"retention.bytes": 3000})
    with Producer(broker.address) as p:
        for i in range(20):
            p.send_batch("retained", [b"r" * 100] * 5, partition=0).result(10)
    t = Transport()

    def start():
        resp, _ = t.call(broker.address, m.ListOffsetsRequest([["retained", 0, m.EARLIEST]]))
        return resp.parts[0][3]
    wait_until(lambda: start() > 0, 10, "retention to delete old batches")
    resp, _ = t.call(broker.address, m.FetchRequest([["retained", 0, 0, 1024]], max_wait_ms=0))
    assert resp.parts[0][2] == ErrorCode.OFFSET_OUT_OF_RANGE and resp.parts[0][4] == start() > 0
    t.close()


def test_delete_topic_removes_data_and_name(broker):
    with Admin(broker.address) as a:
        a.create_topic("doomed", partitions=2)
        with Producer(broker.address) as p:
            p.send("doomed", b"x", partition=1).get(10)
        a.delete_topic("doomed")
        assert "doomed" not in a.list_topics()
        a.create_topic("doomed", partitions=2)  # a new topic of the same name starts empty
        assert all(pt["log_end"] == 0 for pt in a.describe_topic("doomed")["partitions"])


def test_a_producer_carries_on_after_its_topic_is_deleted_and_created_again(broker):
    """The new topic has no state of the producer's id: the broker refuses its batch
    (OUT_OF_ORDER_SEQUENCE, the oldest unfinished one) and the producer starts that partition
    again under a fresh id (sequencer rule 8).
    Before, its next send waited out the delivery timeout (60 s by default) and failed."""
    with Admin(broker.address) as a, Producer(broker.address) as p:
        a.create_topic("reborn", partitions=1)
        for i in range(5):
            p.send("reborn", b"old-%d" % i).get(10)
        a.delete_topic("reborn")
        a.create_topic("reborn", partitions=1)
        assert [p.send("reborn", b"new-%d" % i).get(10).offset for i in range(3)] == [0, 1, 2]
    got = consume_all(broker.address, "reborn", 3)
    assert [r.value for r in got[0]] == [b"new-0", b"new-1", b"new-2"]


def test_kill9_loses_nothing_acknowledged(tmp_path):
    b = BrokerProcess("k1", str(tmp_path / "k1")).start()
    with Admin(b.address) as a:
        a.create_topic("durable", partitions=3)
    acked = []
    stop = threading.Event()

    def produce():
        with Producer(b.address, acks=1, delivery_timeout_ms=3000, request_timeout_ms=1000, retries=2) as p:
            i = 0
            pending = collections.deque()
            while not stop.is_set():
                v = b"d%07d" % i
                pending.append((v, p.send("durable", v)))
                i += 1
                while pending and (pending[0][1].done() or len(pending) > 5000):
                    v, f = pending.popleft()
                    try:
                        acked.append((v, f.get(5)))
                    except Exception:
                        pass
            try:
                p.flush(10)
            except MeshError:
                pass
            for v, f in pending:
                if f.done() and f.exception() is None:
                    acked.append((v, f.get()))

    th = threading.Thread(target=produce)
    th.start()
    wait_until(lambda: len(acked) > 20_000, 30, "20,000 acknowledged records")
    b.kill()
    stop.set()
    th.join(30)
    n_acked = len(acked)
    b.start()
    got = consume_all(b.address, "durable", n_acked)
    stored = {(r.partition, r.offset): r.value for recs in got.values() for r in recs}
    for v, md in acked:
        assert stored.get((md.partition, md.offset)) == v, f"acknowledged record {v} lost"
    b.stop()


def test_sigterm_stops_cleanly_and_restart_recovers(tmp_path):
    b = BrokerProcess("s1", str(tmp_path / "s1")).start()
    with Admin(b.address) as a:
        a.create_topic("clean", partitions=1)
    with Producer(b.address) as p:
        p.send_batch("clean", [b"c"] * 10, partition=0).result(10)
    assert b.stop() == 0
    b.start()
    assert [r.offset for r in consume_all(b.address, "clean", 10)[0]] == list(range(10))
    b.stop()


def test_full_disk_refuses_writes_and_keeps_serving_reads(tmp_path):
    b = BrokerProcess("f1", str(tmp_path / "f1"), extra=["--max-storage-bytes", str(2 << 20)]).start()
    with Admin(b.address) as a:
        a.create_topic("full", partitions=1)
    with Producer(b.address, retries=0, delivery_timeout_ms=5000) as p:
        first = p.send_batch("full", [b"keep"] * 10, partition=0).result(10)
        with pytest.raises(MeshError) as e:
            for _ in range(200):
                p.send_batch("full", [b"z" * 1000] * 100, partition=0).result(10)
    assert e.value.code == ErrorCode.STORAGE_ERROR
    # the broker keeps serving through the turns that follow (timers, deferred state
    # writes once a second): it must answer throughout, not die on the full store
    until = time.monotonic() + 1.5
    with Admin(b.address, request_timeout_ms=2000) as a:
        while time.monotonic() < until:
            assert b.alive(), b.log()
            a.metadata([])
    got = consume_all(b.address, "full", 10)
    assert [r.value for r in got[0][:10]] == [b"keep"] * 10 and first == 0
    b.stop()


def test_a_batch_too_big_for_a_full_store_is_refused_alone_and_reads_go_on(tmp_path):
    """A put that does not fit fails the whole turn (LMDB), and a failed turn rebuilds the
    replication core: every leadership dropped, reads included. The batch is checked
    against the room first and refused alone."""
    b = BrokerProcess("f2", str(tmp_path / "f2"), extra=["--max-storage-bytes", str(4 << 20)]).start()
    t = Transport()
    try:
        with Admin(b.address) as a:
            a.create_topic("full", partitions=1)
        with Producer(b.address, retries=0, delivery_timeout_ms=5000) as p:
            with pytest.raises(MeshError) as e:
                for _ in range(400):
                    p.send_batch("full", [b"z" * 1000] * 10, partition=0).result(10)
        assert e.value.code == ErrorCode.STORAGE_ERROR
        big = encode_batch([b"B" * 900_000], timestamps_ms=int(time.time() * 1000))
        for _ in range(3):
            with pytest.raises(MeshError) as e:   # answered after its turn's commit
                t.call(b.address, m.ProduceRequest("full", 0, 1), big)
            assert e.value.code == ErrorCode.STORAGE_ERROR, e.value
            r, _ = t.call(b.address, m.FetchRequest([["full", 0, 0, 100]], max_wait_ms=0))
            assert r.parts[0][2] == 0, r   # still the leader: served
        assert "rebuilding the replication core" not in b.log(tail_chars=1 << 20)
    finally:
        t.close()
        b.kill()


def test_cli_tour(broker):
    env = dict(os.environ, MESH_BOOTSTRAP=broker.address)
    mesh = [sys.executable, "-m", "tools.cli"]

    def run(*args, input=None, ok=True):
        r = subprocess.run(mesh + list(args), input=input, capture_output=True, env=env, cwd=ROOT, timeout=60)
        assert (r.returncode == 0) == ok, r.stderr.decode()
        return r.stdout.decode(), r.stderr.decode()

    run("topic", "create", "tour", "--partitions", "6")
    assert "tour" in run("topic", "list")[0].split()
    out, _ = run("topic", "describe", "tour")
    assert "Partitions: 6" in out
    run("produce", "tour", "--key-separator", ":", input=b"k1:hello\nk2:world\n")
    out, _ = run("consume", "tour", "--from-beginning", "--count", "2", "--format", "{partition} {offset} {key} {value}")
    assert sorted(l.split()[2:] for l in out.split("\n")[:2]) == [["k1", "hello"], ["k2", "world"]]
    out, _ = run("topic", "describe", "tour", "--json")
    assert json.loads(out)["name"] == "tour"
    _, err = run("topic", "describe", "missing", ok=False)
    assert "UNKNOWN_TOPIC" in err
    run("topic", "delete", "tour")
    assert "tour" not in run("topic", "list")[0].split()
