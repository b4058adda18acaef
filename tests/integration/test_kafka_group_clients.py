"""Real Kafka clients in consumer groups through the Kafka listeners of a 3-broker cluster:
two ``kcat -G`` share a topic and the survivor of a SIGKILL takes over and sees every
record; confluent-kafka groups with ``range`` and ``cooperative-sticky``; a kafka-python
group of two; aiokafka joins and leaves; a kafkajs group of two. Every test checks what was
read (every record, disjoint shares), not only exit codes.

Skipped until the listener (``mesh.kafka.server``) serves the group APIs (this branch
brings the handlers; the listener comes with its own branch).
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from mesh.client import Admin, Producer
from mesh.client.group_admin import GroupAdmin
from mesh.testing.launcher import Cluster, wait_until
from tests.tooling import kafkajs_modules, need

pytestmark = pytest.mark.integration

SESSION_MS = 3000          # the brokers' maximum native session (also their takeover grace)
KAFKA_SESSION_MS = 6000    # what the Kafka clients ask for
_names = iter(range(1, 1_000_000))


def _serves_groups(address: str) -> bool:
    """ApiVersions v0 over a raw socket: does the listener advertise JoinGroup?"""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        body = struct.pack(">hhih", 18, 0, 1, 1) + b"t"
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(size, socket.MSG_WAITALL)
    _, error, count = struct.unpack_from(">ihi", data, 0)
    keys = {struct.unpack_from(">hhh", data, 10 + 6 * i)[0] for i in range(count)}
    return error == 0 and 11 in keys


@pytest.fixture(scope="module")
def gcluster(tmp_path_factory):
    if "kafka" not in inspect.signature(Cluster).parameters:
        pytest.skip("no Kafka listener in this tree yet")
    old = os.environ.get("MESH_GROUP_MAX_SESSION_MS")
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(SESSION_MS)
    try:
        c = Cluster(tmp_path_factory.mktemp("kafka-group-clients"), 3, kafka=True).start(60)
    finally:
        if old is None:
            del os.environ["MESH_GROUP_MAX_SESSION_MS"]
        else:
            os.environ["MESH_GROUP_MAX_SESSION_MS"] = old
    try:
        if not _serves_groups(c.brokers[0].kafka_address):
            pytest.skip("the Kafka listener does not serve the group APIs yet")
        yield c
    finally:
        c.stop()


def topic_with_records(cluster, prefix: str, partitions: int, n: int, start: int = 0) -> tuple[str, set[bytes]]:
    name = f"{prefix}-{next(_names)}"
    with Admin(cluster.bootstrap) as a:
        a.create_topic(name, partitions, 3)
        wait_until(lambda: len(a.metadata([name]).topics[0].get("partitions", [])) == partitions, 20, "topic")
    return name, produce(cluster, name, partitions, n, start)


def produce(cluster, topic: str, partitions: int, n: int, start: int) -> set[bytes]:
    values = {b"v-%d" % i for i in range(start, start + n)}
    with Producer(cluster.bootstrap) as p:
        for i in range(start, start + n):
            p.send(topic, b"v-%d" % i, partition=i % partitions)
        p.flush()
    return values


def disjoint_cover(shares: list[set], every: set) -> bool:
    if any(not s for s in shares) or set().union(*shares) != every:
        return False
    return sum(len(s) for s in shares) == len(every)


# -- kcat -------------------------------------------------------------------------------

class Kcat:
    """A ``kcat -G`` balanced consumer: records on stdout, its assignments on stderr."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self.proc = subprocess.Popen(
            ["kcat", "-b", bootstrap, "-G", group, "-u", "-f", "%s\\n",
             "-X", f"session.timeout.ms={KAFKA_SESSION_MS}", "-X", "heartbeat.interval.ms=500",
             "-X", "auto.offset.reset=earliest", "-X", "auto.commit.interval.ms=200", topic],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.values: set[bytes] = set()
        self.assigned: set[tuple[str, int]] = set()
        self.log: list[str] = []
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self):
        for line in self.proc.stdout:
            self.values.add(line.rstrip(b"\n"))

    def _err(self):
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.log.append(line)
            if "assigned:" in line:
                self.assigned = {(t, int(p)) for t, p in re.findall(r"(\S+) \[(\d+)\]", line.split("assigned:")[1])}
            elif "revoked:" in line:
                self.assigned = set()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def test_kcat_consumers_share_and_the_survivor_takes_over(gcluster):
    need("kcat")
    topic, sent = topic_with_records(gcluster, "kgc-kcat", 4, 200)
    every = {(topic, p) for p in range(4)}
    a, b = Kcat(gcluster.kafka_bootstrap, "kcat-g", topic), Kcat(gcluster.kafka_bootstrap, "kcat-g", topic)
    try:
        wait_until(lambda: disjoint_cover([a.assigned, b.assigned], every), 60,
                   "two kcat members with disjoint shares")
        wait_until(lambda: a.values | b.values >= sent, 60, "every record read by the two")
        time.sleep(0.5)   # (one auto-commit interval, so the survivor does not start from zero)
        a.kill()
        killed = time.monotonic()
        sent |= produce(gcluster, topic, 4, 200, 200)
        wait_until(lambda: b.assigned == every, 60, "the survivor to hold every partition")
        print(f"kcat: the survivor held every partition {time.monotonic() - killed:.1f} s after the SIGKILL "
              f"(session.timeout.ms {KAFKA_SESSION_MS})")
        wait_until(lambda: a.values | b.values >= sent, 60, "every record, the killed member's too")
    finally:
        a.stop()
        b.stop()


# -- confluent-kafka --------------------------------------------------------------------

class Member(threading.Thread):
    """One client polling in its own thread; ``held`` follows its rebalance callbacks."""

    def __init__(self, make, subscribe, poll, close):
        super().__init__(daemon=True)
        self.make, self._subscribe, self._poll, self._close = make, subscribe, poll, close
        self.values: set[bytes] = set()
        self.held: set[tuple[str, int]] = set()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            client = self.make()
            self._subscribe(client, self)
            while not self.stopping.is_set():
                self.values.update(self._poll(client, self))
            self._close(client)
        except BaseException as exc:   # reported by the test
            self.error = exc

    def stop(self):
        self.stopping.set()
        self.join(30)
        assert self.error is None, self.error


def confluent_member(bootstrap, group, topic, strategy) -> Member:
    from confluent_kafka import Consumer

    def make():
        return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "session.timeout.ms": KAFKA_SESSION_MS, "heartbeat.interval.ms": 500,
                         "partition.assignment.strategy": strategy, "auto.commit.interval.ms": 200})

    def subscribe(c, m):
        def assigned(_, parts):
            m.held |= {(p.topic, p.partition) for p in parts}

        def revoked(_, parts):
            m.held -= {(p.topic, p.partition) for p in parts}
        c.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(c, m):
        msg = c.poll(0.2)
        return [msg.value()] if msg is not None and not msg.error() else []
    return Member(make, subscribe, poll, lambda c: c.close())


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_confluent_kafka_group(gcluster, strategy):
    topic, sent = topic_with_records(gcluster, f"kgc-ck-{strategy}", 4, 100)
    every = {(topic, p) for p in range(4)}
    group = f"ck-{strategy}"
    a = confluent_member(gcluster.kafka_bootstrap, group, topic, strategy)
    b = confluent_member(gcluster.kafka_bootstrap, group, topic, strategy)
    a.start()
    b.start()
    try:
        wait_until(lambda: disjoint_cover([a.held, b.held], every), 60, f"two {strategy} members sharing")
        wait_until(lambda: a.values | b.values >= sent, 60, "every record")
        with GroupAdmin(gcluster.bootstrap, request_timeout_ms=2000) as ga:
            d = ga.describe(group)
        assert len(d["members"]) == 2 and d["assignor"] == strategy
        from confluent_kafka.admin import AdminClient   # ListGroups and DescribeGroups, as Kafka tools see them
        admin = AdminClient({"bootstrap.servers": gcluster.kafka_bootstrap})
        assert group in [g.group_id for g in admin.list_consumer_groups().result(30).valid]
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert described.partition_assignor == strategy and len(described.members) == 2
        assert sorted((p.topic, p.partition) for m in described.members
                      for p in m.assignment.topic_partitions) == sorted(every)
        b.stop()    # close: commit, leave
        wait_until(lambda: a.held == every, 60, "the remaining member to hold everything")
    finally:
        a.stop()
        b.stopping.set()


# -- kafka-python -----------------------------------------------------------------------

def kafka_python_member(bootstrap, group, topic) -> Member:
    from kafka import KafkaConsumer

    def make():
        return KafkaConsumer(bootstrap_servers=bootstrap.split(","), group_id=group, auto_offset_reset="earliest",
                             session_timeout_ms=KAFKA_SESSION_MS, heartbeat_interval_ms=500,
                             auto_commit_interval_ms=200)

    def poll(c, m):
        got = c.poll(timeout_ms=200)
        m.held = {(tp.topic, tp.partition) for tp in c.assignment()}
        return [r.value for rs in got.values() for r in rs]
    return Member(make, lambda c, m: c.subscribe([topic]), poll, lambda c: c.close())


def test_kafka_python_group_of_two(gcluster):
    topic, sent = topic_with_records(gcluster, "kgc-kp", 4, 100)
    every = {(topic, p) for p in range(4)}
    a = kafka_python_member(gcluster.kafka_bootstrap, "kp-g", topic)
    b = kafka_python_member(gcluster.kafka_bootstrap, "kp-g", topic)
    a.start()
    b.start()
    try:
        wait_until(lambda: disjoint_cover([a.held, b.held], every), 60, "two kafka-python members sharing")
        wait_until(lambda: a.values | b.values >= sent, 60, "every record")
    finally:
        a.stop()
        b.stop()


# -- aiokafka ---------------------------------------------------------------------------

def test_aiokafka_join_commit_leave(gcluster):
    from aiokafka import AIOKafkaConsumer
    topic, sent = topic_with_records(gcluster, "kgc-aio", 2, 50)

    async def run():
        c = AIOKafkaConsumer(topic, bootstrap_servers=gcluster.kafka_bootstrap, group_id="aio-g",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=KAFKA_SESSION_MS, heartbeat_interval_ms=500)
        await c.start()
        got = set()
        try:
            deadline = time.monotonic() + 60
            while got < sent and time.monotonic() < deadline:
                for records in (await c.getmany(timeout_ms=500)).values():
                    got.update(r.value for r in records)
            await c.commit()
            return got, {(tp.topic, tp.partition) for tp in c.assignment()}
        finally:
            await c.stop()   # leaves the group
    got, held = asyncio.run(run())
    assert got >= sent and held == {(topic, 0), (topic, 1)}
    with GroupAdmin(gcluster.bootstrap, request_timeout_ms=2000) as ga:
        wait_until(lambda: not ga.describe("aio-g")["members"], 20, "the member to have left")
        assert sorted(ga.committed("aio-g").values()) == [25, 25]   # one namespace


# -- kafkajs ----------------------------------------------------------------------------

_KJS_SCRIPT = r"""
const { Kafka, logLevel } = require('kafkajs')
const [brokers, topic, group, want] = process.argv.slice(2)
// kafkajs's own errors and warnings go to stderr (shown if the test fails)
const logCreator = () => ({ namespace, level, label, log }) =>
  console.error(`${new Date().toISOString()} ${label} [${namespace}] ${log.message} ${JSON.stringify(log)}`)
// one Kafka instance per member, as two processes would have: kafkajs 2.2 keeps committed
// offsets per group in a map shared by every consumer of one instance, and a member whose new
// assignment is empty (the server-side assignor's first answer to a newcomer, while the other
// member still holds what will move) clears the other's entries, whose next commit then
// fails with "Cannot read properties of undefined (reading '0')" (offsetManager
// uncommittedOffsets) and crashes it
const kafka = () => new Kafka({ clientId: 'kjs', brokers: brokers.split(','), logLevel: logLevel.WARN, logCreator })
const seen = new Set(); const held = [new Set(), new Set()]
const members = [0, 1].map(() => kafka().consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 500 }))
// done once both hold a share and the shares split the partitions: a member whose session
// lapsed on a busy host still shows its last assignment until it rejoins
const split = () => held[0].size > 0 && held[1].size > 0 && ![...held[0]].some(p => held[1].has(p))
const done = () => seen.size >= Number(want) && split()
async function main() {
  for (const [i, c] of members.entries()) {
    c.on(c.events.CRASH, e => console.error(`member ${i} crashed: ${e.payload.error} (restart: ${e.payload.restart})\n${(e.payload.error.cause || e.payload.error).stack}`))
    c.on(c.events.GROUP_JOIN, e => {
      held[i] = new Set(Object.entries(e.payload.memberAssignment).flatMap(([t, ps]) => ps.map(p => `${t}/${p}`)))
    })
    await c.connect(); await c.subscribe({ topic, fromBeginning: true })
    await c.run({ eachMessage: async ({ message }) => { seen.add(message.value.toString()) } })
  }
  const start = Date.now()
  while (!done() && Date.now() - start < 90000) await new Promise(r => setTimeout(r, 200))
  console.log(JSON.stringify({ seen: [...seen], held: held.map(h => [...h]) }))
  for (const c of members) await c.disconnect()
}
main().catch(e => { console.error(e); process.exit(1) })
"""


def test_kafkajs_group_of_two(gcluster, tmp_path):
    modules = kafkajs_modules()
    topic, sent = topic_with_records(gcluster, "kgc-kjs", 4, 100)
    script = tmp_path / "group.js"
    script.write_text(_KJS_SCRIPT)
    out = subprocess.run(["node", str(script), gcluster.kafka_bootstrap, topic, "kjs-g", str(len(sent))],
                         capture_output=True, timeout=150, env=dict(os.environ, NODE_PATH=modules))
    (tmp_path / "kafkajs.stderr").write_bytes(out.stderr)
    print(out.stderr.decode())   # kafkajs's own account, whole ("Captured stdout" if this test fails)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    result = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert {v.encode() for v in result["seen"]} >= sent, out.stderr.decode()[-4000:]
    shares = [set(h) for h in result["held"]]
    assert all(shares) and not (shares[0] & shares[1]) and len(shares[0] | shares[1]) == 4, \
        (shares, out.stderr.decode()[-4000:])


def test_one_offsets_namespace_with_metadata(gcluster):
    """confluent-kafka commits with metadata, `mesh group describe` shows them; a native member
    commits, confluent-kafka's committed() reads it back with its metadata."""
    from confluent_kafka import Consumer, TopicPartition as KTP
    from mesh.client import Consumer as MeshConsumer
    from mesh.client.cluster import TopicPartition
    topic, _ = topic_with_records(gcluster, "kgc-ns", 2, 20)
    conf = {"bootstrap.servers": gcluster.kafka_bootstrap, "group.id": "ns-g", "enable.auto.commit": False,
            "session.timeout.ms": KAFKA_SESSION_MS}
    c = Consumer(conf)
    try:
        c.commit(offsets=[KTP(topic, 0, 7, metadata="from-kafka"), KTP(topic, 1, 3)], asynchronous=False)
    finally:
        c.close()
    with GroupAdmin(gcluster.bootstrap, request_timeout_ms=2000) as ga:
        # (librdkafka sends the metadata string with its C terminator; Kafka stores what is sent)
        assert sorted((t, p, o, m.rstrip("\x00")) for t, p, o, m in ga.describe("ns-g")["offsets"]) == \
            [(topic, 0, 7, "from-kafka"), (topic, 1, 3, "")]
    native = MeshConsumer(bootstrap=gcluster.bootstrap, group_id="ns-g", auto_offset_reset="earliest",
                          session_timeout_ms=SESSION_MS, enable_auto_commit=False)
    native.subscribe([topic])
    wait_until(lambda: native.poll(50) is not None and len(native.assignment()) == 2, 30, "the native member")
    native.commit({TopicPartition(topic, 1): (11, "from-mesh")})
    native.close()
    c = Consumer(conf)
    try:
        got = wait_until(lambda: c.committed([KTP(topic, 0), KTP(topic, 1)], timeout=10), 20, "committed offsets")
        assert [(p.partition, p.offset, (p.metadata or "").rstrip("\x00")) for p in got] == \
            [(0, 7, "from-kafka"), (1, 11, "from-mesh")]
    finally:
        c.close()


def test_confluent_group_survives_its_coordinators_death(tmp_path):
    """SIGKILL of the group's coordinator (and so of the listener holding the members'
    sessions): the members find the new coordinator, rejoin, and read what comes next."""
    if "kafka" not in inspect.signature(Cluster).parameters:
        pytest.skip("no Kafka listener in this tree yet")
    from mesh.cluster.ownership import coordinator_for
    old = os.environ.get("MESH_GROUP_MAX_SESSION_MS")
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(SESSION_MS)
    try:
        c = Cluster(tmp_path, 3, kafka=True).start(60)
    finally:
        if old is None:
            del os.environ["MESH_GROUP_MAX_SESSION_MS"]
        else:
            os.environ["MESH_GROUP_MAX_SESSION_MS"] = old
    try:
        if not _serves_groups(c.brokers[0].kafka_address):
            pytest.skip("the Kafka listener does not serve the group APIs yet")
        topic, sent = topic_with_records(c, "kgc-coord", 4, 100)
        every = {(topic, p) for p in range(4)}
        group = "ck-coord"
        doomed = next(b for b in c.brokers if b.node_id == coordinator_for(group, ["n1", "n2", "n3"]))
        survivors = ",".join(b.kafka_address for b in c.brokers if b is not doomed)
        members = [confluent_member(survivors, group, topic, "cooperative-sticky") for _ in range(2)]
        for m in members:
            m.start()
        wait_until(lambda: disjoint_cover([m.held for m in members], every), 60, "two members sharing")
        wait_until(lambda: members[0].values | members[1].values >= sent, 60, "every record")
        doomed.kill()
        killed = time.monotonic()
        more = produce(c, topic, 4, 100, 100)
        wait_until(lambda: members[0].values | members[1].values >= more, 90, "the records after the kill")
        print(f"coordinator SIGKILL: reading again {time.monotonic() - killed:.1f} s later")
        alive = ",".join(b.address for b in c.brokers if b is not doomed)

        def regrouped():   # both members rejoined at the new coordinator, sharing everything
            with GroupAdmin(alive, request_timeout_ms=2000) as ga:
                d = ga.describe(group)
            return len(d["members"]) == 2 and sorted(tuple(tp) for m in d["members"] for tp in m["assigned"]) \
                == sorted(every)
        wait_until(regrouped, 90, "the group at its new coordinator")
        print(f"coordinator SIGKILL: the group re-formed {time.monotonic() - killed:.1f} s later")
        wait_until(lambda: disjoint_cover([m.held for m in members], every), 60, "two members sharing again")
        for m in members:
            m.stop()
    finally:
        c.stop()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_confluent_churn_never_two_owners(gcluster, strategy):
    """Members join and leave while records flow: from the clients' own rebalance callbacks,
    no partition is ever held by two members at once; every record is read; the committed
    offsets end at the log end."""
    from confluent_kafka import Consumer
    topic, _ = topic_with_records(gcluster, f"kgc-churn-{strategy}", 6, 0)
    group = f"churn-{strategy}"
    events, seen, lock = [], set(), threading.Lock()

    def member(k, stop):
        c = Consumer({"bootstrap.servers": gcluster.kafka_bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "session.timeout.ms": KAFKA_SESSION_MS,
                      "heartbeat.interval.ms": 300, "partition.assignment.strategy": strategy,
                      "auto.commit.interval.ms": 200})

        def change(sign):
            def callback(_, parts):
                with lock:
                    events.extend((time.monotonic(), k, sign, (p.topic, p.partition)) for p in parts)
            return callback
        c.subscribe([topic], on_assign=change("+"), on_revoke=change("-"), on_lost=change("-"))
        while not stop.is_set():
            m = c.poll(0.1)
            if m is not None and not m.error():
                with lock:
                    seen.add(m.value())
        c.close()
    sent: set[bytes] = set()
    feeding = threading.Event()

    def feed():
        i = 0
        with Producer(gcluster.bootstrap) as p:
            while not feeding.is_set():
                for _ in range(10):
                    p.send(topic, b"%d" % i, partition=i % 6)
                    sent.add(b"%d" % i)
                    i += 1
                feeding.wait(0.1)   # (pacing the feed, not waiting for a condition)
            p.flush()
    feeder = threading.Thread(target=feed)
    feeder.start()
    stops, threads = {}, {}

    def start(k):
        stops[k] = threading.Event()
        threads[k] = threading.Thread(target=member, args=(k, stops[k]), daemon=True)
        threads[k].start()

    def stop(k):
        stops[k].set()
        threads[k].join(30)

    def holders() -> dict:
        owner: dict = {}
        with lock:
            for _, k, sign, tp in sorted(events, key=lambda e: e[0]):
                if sign == "+":
                    assert owner.get(tp, k) == k, f"{tp} given to {k} while {owner[tp]} holds it"
                    owner[tp] = k
                elif owner.get(tp) == k:
                    del owner[tp]
        return owner

    def all_held_by(ks) -> bool:
        return set(holders().values()) == set(ks) and len(holders()) == 6
    try:
        start(0)
        wait_until(lambda: all_held_by({0}), 60, "the first member to hold everything")
        start(1)
        wait_until(lambda: all_held_by({0, 1}), 60, "two members sharing")
        start(2)
        wait_until(lambda: all_held_by({0, 1, 2}), 60, "three members sharing")
        stop(1)
        wait_until(lambda: all_held_by({0, 2}), 60, "two members after a leave")
        stop(0)
        wait_until(lambda: all_held_by({2}), 60, "the last member holding everything")
    finally:
        feeding.set()
        feeder.join()
    wait_until(lambda: sent <= seen, 60, "every record read")
    stop(2)
    holders()   # (checks the whole history once more)
    with GroupAdmin(gcluster.bootstrap, request_timeout_ms=2000) as ga:
        wait_until(lambda: sum(ga.committed(group).values()) == len(sent), 20, "offsets committed to the log end")
