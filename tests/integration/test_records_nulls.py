"""Records end to end against a real broker: null values (tombstones) kept apart from empty
values on every path (client, CLI, text gateway), ListOffsets by timestamp
(``offsets_for_times``, ``mesh consume --from-time``), and poison batches refused by the
broker with nothing stored (issue 39, finding 8)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import zlib

import msgpack
import pytest

from mesh.client import Admin, Consumer, ErrorCode, MeshError, Producer, TopicPartition
from mesh.client.transport import Transport
from mesh.testing.launcher import ROOT, BrokerProcess, free_port, wait_until
from mesh.wire import messages as m
from mesh.wire.codec import encode_body
from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC, encode_batch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    port = free_port()
    b = BrokerProcess("n1", str(tmp_path_factory.mktemp("records") / "n1"), extra=["--text-port", str(port)]).start()
    b.text_port = port
    yield b
    b.stop()


def create(broker, name: str, partitions: int = 1, config: dict | None = None) -> str:
    with Admin(broker.address) as a:
        a.create_topic(name, partitions=partitions, config=config)
    return name


def read_all(addr: str, topic: str, n: int, timeout_s: float = 60) -> list:
    got: list = []
    with Consumer(bootstrap=addr, auto_offset_reset="earliest") as c:
        c.assign([(topic, p) for p in range(c.cluster.partitions(topic))])
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            assert time.monotonic() < deadline, got
            got += [r for rs in c.poll_batches(300) for r in rs]
    return sorted(got, key=lambda r: (r.partition, r.offset))


def test_a_null_value_stays_null_and_an_empty_one_stays_empty(broker):
    t = create(broker, "nulls")
    with Producer(broker.address) as p:
        p.send(t, None, key=b"gone", partition=0)                 # a tombstone
        p.send(t, b"", key=b"empty", partition=0)
        p.send(t, b"v", key=b"hdr", partition=0, headers=[("h", None), ("g", b"1")])
        p.flush()
        p.send_batch(t, [None, b"", b"x"], partition=0).result(10)
    recs = read_all(broker.address, t, 6)
    assert [(r.key, r.value) for r in recs[:2]] == [(b"gone", None), (b"empty", b"")]
    assert recs[2].headers == (("h", None), ("g", b"1"))
    assert [r.value for r in recs[3:]] == [None, b"", b"x"]


def cli(broker, *args, input: bytes | None = None) -> str:
    env = dict(os.environ, MESH_BOOTSTRAP=broker.address)
    r = subprocess.run([sys.executable, "-m", "tools.cli", *args], input=input, capture_output=True, env=env,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


def test_the_cli_produces_and_prints_null_values(broker):
    t = create(broker, "cli-nulls")
    cli(broker, "produce", t, "-K", ":", "--null-value", "NULL", input=b"a:NULL\nb:\nc:text\n")
    cli(broker, "produce", t, "-K", ":", "-Z", input=b"d:\n")
    recs = read_all(broker.address, t, 4)
    assert [(r.key, r.value) for r in recs] == [(b"a", None), (b"b", b""), (b"c", b"text"), (b"d", None)]
    out = cli(broker, "consume", t, "--from-beginning", "--count", "4", "--format", "{key}={value}",
              "--null-text", "<null>")
    assert out.splitlines() == ["a=<null>", "b=", "c=text", "d=<null>"]


def test_the_text_gateway_keeps_null_values(broker):
    t = create(broker, "text-nulls")
    with socket.create_connection(("127.0.0.1", broker.text_port), timeout=60) as s:
        f = s.makefile("rwb")

        def cmd(line: str) -> str:
            f.write(line.encode() + b"\n")
            f.flush()
            return f.readline().decode().rstrip("\n")
        assert cmd(f'PUBS {t} {{"Key": "k1", "Body": null}}').startswith("OK")
        assert cmd(f'PUBS {t} {{"Key": "k2", "Body": ""}}').startswith("OK")
        recs = read_all(broker.address, t, 2)
        assert [(r.key, r.value) for r in recs] == [(b"k1", None), (b"k2", b"")]
        sub = cmd(f"SUBS {t} g-nulls").split()[1]
        import json
        bodies = {}

        def got_both():
            f.write(f"CONS {t} {sub}\n".encode())
            f.flush()
            while (line := f.readline().decode().rstrip("\n")) != "END":
                assert not line.startswith("ERR"), line
                obj = json.loads(line.split(" ", 2)[2])
                bodies[obj["Key"]] = obj["Body"]
            return len(bodies) == 2
        wait_until(got_both, 60, "both records from CONS")
        assert bodies == {"k1": None, "k2": ""}


def test_offsets_for_times_finds_the_first_record_at_or_after_a_time(broker):
    # stamped in 1970: under the default retention.ms (7 days by record time, as Kafka's) the
    # pass every 5 s would delete each partition's batches but its last
    t = create(broker, "times", partitions=2, config={"retention.ms": -1})
    with Producer(broker.address) as p:
        for i, ts in enumerate([1000, 2000, 2000, 3000]):
            p.send(t, b"r%d" % i, partition=0, timestamp_ms=ts).get(10)   # one batch each
        p.send_batch(t, [b"x", b"y"], partition=1, timestamp_ms=5000).result(10)
    tp0, tp1 = TopicPartition(t, 0), TopicPartition(t, 1)
    with Consumer(bootstrap=broker.address) as c:
        got = c.offsets_for_times({tp0: 1500, tp1: 100})
        assert got[tp0] == (1, 2000) and got[tp0].offset == 1 and got[tp0].timestamp == 2000
        assert got[tp1] == (0, 5000)
        assert c.offsets_for_times({tp0: 3000, tp1: 5001}) == {tp0: (3, 3000), tp1: None}
        assert c.offsets_for_times({tp0: 0})[tp0] == (0, 1000)
        # the ClusterView call the Kafka listener uses, by name
        assert c.cluster.offsets_for_times({tp0: 2001}, timeout_ms=5000) == {tp0: (3, 3000)}
        # EARLIEST/LATEST answers keep their five elements (older clients unpack five)
        tr = Transport()
        try:
            resp, _ = tr.call(broker.address, m.ListOffsetsRequest([[t, 0, m.LATEST], [t, 0, 2500]]))
        finally:
            tr.close()
        assert resp.parts == [m.OffsetsPart(t, 0, 0, 4, None), m.OffsetsPart(t, 0, 0, 3, None, 3000)]
        assert msgpack.unpackb(encode_body(resp))[0] == [[t, 0, 0, 4, None], [t, 0, 0, 3, None, 3000]]
    out = cli(broker, "consume", t, "--partition", "0", "--from-time", "1970-01-01T00:00:01.5Z", "--count", "3",
              "--format", "{offset}")
    assert out.split() == ["1", "2", "3"]
    out = cli(broker, "consume", t, "--partition", "0", "--from-time", "2999", "--count", "1", "--format", "{offset}")
    assert out.split() == ["3"]


def raw_batch(payload: bytes, n: int, first_ts: int = 0, max_ts: int = 0, attributes: int = 0) -> bytes:
    tail = _TAIL.pack(MAGIC, attributes, 0, n, first_ts, max_ts, -1, -1, len(payload))
    return b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload))


def cols(*c) -> bytes:
    return msgpack.packb(list(c), use_bin_type=True)


def test_poison_batches_are_refused_and_nothing_is_stored(broker):
    """The audit's poison: int keys, str deltas, headers that are not pairs, map values,
    trailing bytes, a control flag. Each is refused with INVALID_RECORD and a reason; the
    log end does not move; a consumer reads the good records around them."""
    t = create(broker, "poison")
    poison = [raw_batch(cols([b"a", b"b"], [b"k", 7], None, None), 2),
              raw_batch(cols([b"a", b"b"], None, [0, "5"], None), 2, 0, 5),
              raw_batch(cols([b"a"], None, None, [[[b"not", b"a", b"pair"]]]), 1),
              raw_batch(cols([{"x": 1}], None, None, None), 1),
              raw_batch(cols([b"a"], None, None, None) + b"\xc0", 1),
              raw_batch(cols([b"a"], None, None, None), 1, attributes=1)]
    tr = Transport()
    try:
        def produce(batch) -> tuple[int, str]:
            try:
                resp, _ = tr.call(broker.address, m.ProduceRequest(t, 0, -1), batch)
                return resp.error, ""
            except MeshError as exc:   # (an ErrorResponse)
                return exc.code, exc.message
        wait_until(lambda: produce(encode_batch([b"good0"]))[0] == 0, 30, "a leader")
        for batch in poison:
            code, why = produce(batch)
            assert code == ErrorCode.INVALID_RECORD and why, (code, why)
        assert produce(encode_batch([b"good1"]))[0] == 0
        resp, _ = tr.call(broker.address, m.ListOffsetsRequest([[t, 0, m.LATEST]]))
        assert resp.parts[0][3] == 2   # only the two good records were stored
    finally:
        tr.close()
    assert [r.value for r in read_all(broker.address, t, 2)] == [b"good0", b"good1"]
