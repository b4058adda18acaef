"""Hostile peer traffic against a real 3-broker open cluster on loopback (issues 12, 13).

A plain ZeroMQ DEALER poses as peers (routing id ``peer:<address>``, real brokers'
addresses included) and sends what hypothesis makes of the gossip and replication
messages: wrong types, unknown keys, huge stamps and generations, non-hex uuids, deletes
of the real topic, appends, votes and transfers with wild terms and offsets. Afterwards no
broker has exited, the brokers converge on the same topics, the real topic still holds
its records, and an acks=all produce and a consume of it work. Then the issue's specific
attacks, one test each, and a full restart: each is refused, and nothing of it survives.

What open mode cannot refuse is not sent: a *plausible* forgery (a delete stamped now, a
heartbeat of a real node just above its own, an append at the real term and offset from
the leader's routing id) is indistinguishable from a real peer's message; only
authenticated brokers (``--secrets``, tests/integration/test_security.py) close that.
"""
from __future__ import annotations

import os
import time

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh.client import Admin, Consumer, Producer
from mesh.client.consumer import TopicPartition
from mesh.client.group_admin import GroupAdmin
from mesh.cluster.catalog import cluster_pid
from mesh.gossip import GossipAck, GossipAck2, GossipSyn
from mesh.raft import ReplAppend, ReplAppendResp, ReplHeartbeat, ReplTimeoutNow, ReplVote, ReplVoteResp
from mesh.raft.messages import AppendRow, TimeoutNowRow, VoteRow
from mesh.testing.launcher import BrokerProcess, Cluster, free_port, wait_until
from mesh.wire.codec import PROTOCOL_PEER, pack, unpack
from mesh.wire.records import encode_batch, patch_batch

pytestmark = pytest.mark.integration

TOPIC = "real"
FAR_FUTURE = 2 ** 62


class Peer:
    """DEALERs posing as peers: one per (claimed address, broker)."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.socks: dict[tuple[str, str], zmq.Socket] = {}

    def send(self, claimed: str, dest: str, msg, payload: bytes | None = None) -> None:
        try:
            frames = pack(PROTOCOL_PEER, 0, msg, payload)
        except Exception:          # not encodable (hypothesis made it so): nothing to send
            return
        s = self.socks.get((claimed, dest))
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.ROUTING_ID, b"peer:" + claimed.encode())
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 100_000)
            s.connect(f"tcp://{dest}")
            self.socks[(claimed, dest)] = s
        try:
            s.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        for s in self.socks.values():
            s.close(0)
        self.socks.clear()


class Stranger:
    """A ROUTER that joins by gossip as an unknown node: once it said hello, every broker
    connects to it, so it stays open until the brokers are gone (a peer that vanishes with
    unread data resets those links, which can abort a broker inside libzmq 4.3.5:
    zeromq/libzmq#4841, ``stream_engine_base.cpp:310 !_io_error``)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.address = f"127.0.0.1:{free_port()}"
        self.inbox = self.ctx.socket(zmq.ROUTER)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.bind(f"tcp://{self.address}")

    def close(self) -> None:
        self.inbox.close(0)
        self.ctx.term()


@pytest.fixture(scope="module")
def stranger():
    s = Stranger()
    yield s
    s.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, stranger):
    c = Cluster(tmp_path_factory.mktemp("fuzz"), 3).start()
    with Admin(c.bootstrap) as a:
        a.create_topic(TOPIC, partitions=2, replication_factor=3)
    produce(c, 10)
    yield c
    c.kill()


@pytest.fixture
def peer():
    ctx = zmq.Context()
    p = Peer(ctx)
    yield p
    p.close()
    ctx.term()


def produce(c: Cluster, n: int, tag: str = "r") -> None:
    with Producer(c.bootstrap, acks="all", delivery_timeout_ms=20_000) as p:
        futs = [p.send(TOPIC, f"{tag}{i}".encode(), partition=i % 2) for i in range(n)]
        for f in futs:
            f.get(20)


def consume_all(c: Cluster, want: int) -> list[bytes]:
    got: list[bytes] = []
    with Consumer(bootstrap=c.bootstrap, auto_offset_reset="earliest") as con:
        con.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        wait_until(lambda: got.extend(r.value for rs in con.poll_batches(200) for r in rs) or len(got) >= want,
                   20, f"{want} records of {TOPIC}")
    return got


def healthy(c: Cluster, records: int) -> None:
    """No broker exited, all converge on the same topics (the real one among them), and an
    acks=all produce and a consume of every record so far work."""
    for b in c.brokers:
        b.check_running()
    c.wait_converged(20)

    def same_topics():
        views = []
        for b in c.brokers:
            with Admin(b.address, request_timeout_ms=1000) as a:
                views.append(sorted(t["name"] for t in a.metadata(None).topics))
        return views[0] == views[1] == views[2] and TOPIC in views[0]
    wait_until(same_topics, 20, "every broker to list the same topics")
    tag = f"h{records}-{time.monotonic_ns()}-"
    produce(c, 4, tag=tag)
    got = consume_all(c, records + 4)
    assert all(v.startswith((b"r", b"h")) for v in got), [v for v in got if not v.startswith((b"r", b"h"))][:5]
    wait_until(lambda: got.extend(consume_all(c, records + 4)) or
               {f"{tag}{i}".encode() for i in range(4)} <= set(got), 20, "the new records")


def records_so_far(c: Cluster) -> int:
    with Consumer(bootstrap=c.bootstrap) as con:
        ends = con.end_offsets([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    return sum(ends.values())


def topic_uuid(c: Cluster, s: Stranger) -> str:
    """Join as a stranger (open mode lets anyone): a SYN carrying our own row is answered
    with an ACK holding the cluster registers, among them the topic's header."""
    me = s.address
    out = s.ctx.socket(zmq.DEALER)
    out.setsockopt(zmq.ROUTING_ID, b"peer:" + me.encode())
    out.setsockopt(zmq.LINGER, 0)
    out.connect(f"tcp://{c.brokers[0].address}")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out.send_multipart(pack(PROTOCOL_PEER, 0, GossipSyn("stranger", [["stranger", 1, 0, 0, 0, me, False, 0]],
                                                                 [], 0)))
            while s.inbox.poll(500):
                frames = s.inbox.recv_multipart()
                _, _, msg, _ = unpack(frames[1:])
                if isinstance(msg, GossipAck):
                    ents = msg.cluster_entries
                    for i in range(0, len(ents), 5):
                        if ents[i] == f"topic/{TOPIC}" and isinstance(ents[i + 3], dict):
                            return ents[i + 3]["uuid"]
        raise AssertionError("no ACK with the topic's header came back")
    finally:
        out.close(0)


def leader_of(c: Cluster, partition: int) -> tuple[str, str, int]:
    with Admin(c.bootstrap) as a:
        p = a.describe_topic(TOPIC)["partitions"][partition]
    return p["leader"], p["leader_address"], p["epoch"]


def broker(c: Cluster, node_id: str):
    return next(b for b in c.brokers if b.node_id == node_id)


def logged(c: Cluster, text: str) -> bool:
    return any(text in b.log(400_000) for b in c.brokers)


# -- hypothesis: hostile peer messages -----------------------------------------------------------

WILD = st.one_of(st.sampled_from([0, 1, 2, 3, -1, 2 ** 31, 2 ** 40, 2 ** 48, 2 ** 53 - 1, 2 ** 53, 2 ** 62,
                                  2 ** 63 - 1, 2 ** 64 - 1]),
                 st.integers(-(2 ** 63), 2 ** 64 - 1))
BIG = st.one_of(st.sampled_from([2 ** 48, 2 ** 53, 2 ** 62, 2 ** 63 - 1, 2 ** 64 - 1]),
                st.integers(2 ** 48, 2 ** 64 - 1))
JUNK = st.recursive(st.one_of(st.none(), st.booleans(), WILD, st.text(max_size=20), st.binary(max_size=20),
                              st.floats(allow_nan=False)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)
FAKE_IDS = st.one_of(st.sampled_from(["ghost", "x", "", "n1/../n2", "z" * 300]), st.text(max_size=12))
KEYS = st.one_of(st.sampled_from(["topic/ghost", "topic/", "tparts/real/0123456789abcdef/0", "member",
                                  "lead/real/0", "stats/real/0", "recovering/real/0", "off/g/real/0",
                                  "user/mallory", "acl/0123456789abcdef", "unknown", ""]),
                 st.text(max_size=30))
TOPIC_VALUES = st.one_of(JUNK, st.fixed_dictionaries({
    "name": st.sampled_from(["ghost", TOPIC]), "uuid": st.sampled_from(["not-hex-at-all!!", "xyz", "0" * 16]),
    "partitions": WILD, "replication_factor": WILD, "config": JUNK, "chunks": WILD}))


def rows(ids, addrs):
    """Membership rows: fake nodes with anything but a real broker's address, real nodes
    only refusable (huge numbers, or generation 0, which is below every real life); any life."""
    fake = st.tuples(FAKE_IDS, WILD, WILD, WILD, WILD, st.text(max_size=20), st.booleans(), WILD).map(list)
    real = st.one_of(
        st.tuples(ids, BIG, WILD, WILD, WILD, addrs, st.booleans(), WILD),
        st.tuples(ids, st.just(1), BIG, WILD, WILD, addrs, st.booleans(), WILD),
        st.tuples(ids, st.just(0), WILD, WILD, WILD, addrs, st.booleans(), WILD)).map(list)
    return st.lists(st.one_of(fake, real, JUNK), max_size=5)


def deltas(ids):
    ents = st.lists(st.tuples(KEYS, WILD, JUNK, st.booleans()), max_size=4).map(lambda es: [x for e in es for x in e])
    fake = st.tuples(FAKE_IDS, WILD, WILD, WILD, WILD, st.booleans(), ents).map(list)
    real = st.one_of(st.tuples(ids, BIG, WILD, WILD, WILD, st.booleans(), ents),
                     st.tuples(ids, st.just(0), WILD, WILD, WILD, st.booleans(), ents)).map(list)
    return st.lists(st.one_of(fake, real, JUNK), max_size=3)


def registers():
    """Cluster entries; the real topic only with stamps that must lose or be refused."""
    ghost = st.tuples(KEYS, WILD, FAKE_IDS, st.one_of(JUNK, TOPIC_VALUES), st.booleans())
    real = st.tuples(st.just(f"topic/{TOPIC}"), st.one_of(BIG, st.integers(0, 1000)), FAKE_IDS,
                     st.one_of(st.none(), TOPIC_VALUES), st.booleans())
    flat = st.lists(st.one_of(ghost, real), max_size=4).map(lambda es: [x for e in es for x in e])
    return st.one_of(flat, JUNK)


def gossip(ids, addrs):
    return st.one_of(
        st.builds(GossipSyn, st.one_of(ids, FAKE_IDS), rows(ids, addrs), st.one_of(st.just([]), JUNK), WILD),
        st.builds(GossipAck, st.one_of(ids, FAKE_IDS), rows(ids, addrs), deltas(ids),
                  st.one_of(st.just([]), st.lists(WILD, min_size=16, max_size=16), JUNK), registers(), WILD),
        st.builds(GossipAck2, st.one_of(ids, FAKE_IDS), deltas(ids), registers()))


def replication(pids):
    """Wild terms (beyond any jump bound) and offsets; the real partitions among the ids."""
    pid = st.one_of(pids, WILD)
    term = st.one_of(BIG, st.integers(1_000, 2 ** 40 - 1), st.integers(-5, 0))
    batch = st.builds(lambda base, epoch: patch_batch(encode_batch([b"forged"]), base, epoch),
                      st.integers(0, 2 ** 40), st.integers(0, 2 ** 31))
    append_row = st.tuples(pid, term, WILD, WILD, WILD, WILD, WILD, WILD, WILD, st.sampled_from([0, 1, 2]))
    ident = st.one_of(st.just(""), st.text(max_size=70))
    life = WILD
    return st.one_of(
        st.tuples(st.builds(ReplAppend, st.lists(st.one_of(append_row.map(list), JUNK), max_size=3), ident, life),
                  st.one_of(st.none(), batch, st.binary(max_size=200))),
        st.tuples(st.builds(ReplVote, st.lists(st.tuples(pid, term, WILD, WILD, st.sampled_from([0, 1]),
                                                        st.sampled_from([0, 1, 1, 5])).map(list), max_size=3),
                            ident, life), st.none()),
        st.tuples(st.builds(ReplHeartbeat, st.lists(st.tuples(pid, term, WILD).map(list), max_size=3), ident, life),
                  st.none()),
        st.tuples(st.builds(ReplTimeoutNow, st.lists(st.tuples(pid, term).map(list), max_size=3), ident, life),
                  st.none()),
        st.tuples(st.builds(ReplVoteResp, st.lists(st.tuples(pid, term, WILD, WILD, WILD).map(list), max_size=3),
                            ident, life), st.none()),
        st.tuples(st.builds(ReplAppendResp, st.lists(st.lists(WILD, min_size=8, max_size=8), max_size=3),
                            ident, life), st.none()))


def test_hostile_peer_traffic_changes_nothing_and_the_cluster_keeps_serving(cluster, peer, stranger):
    c = cluster
    uuid = topic_uuid(c, stranger)
    real_pids = st.sampled_from([cluster_pid(uuid, 0), cluster_pid(uuid, 1)])
    ids = st.sampled_from([b.node_id for b in c.brokers])
    addrs = st.one_of(st.sampled_from([b.address for b in c.brokers] + ["127.0.0.1:9"]), st.text(max_size=20))
    claimed = st.sampled_from([b.address for b in c.brokers] + ["127.0.0.1:9", "10.255.0.1:1"])
    dests = st.sampled_from([b.address for b in c.brokers])
    message = st.one_of(gossip(ids, addrs).map(lambda m: (m, None)), replication(real_pids))
    sent = [0]
    stop_at = time.monotonic() + 25

    # a fixed example set (CI stays reproducible); MESH_FUZZ_RANDOM=1 draws new ones each run
    @settings(max_examples=400, deadline=None, database=None,
              derandomize=os.environ.get("MESH_FUZZ_RANDOM") != "1",
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(st.lists(st.tuples(claimed, dests, message), min_size=1, max_size=6))
    def hostile(batch):
        if time.monotonic() > stop_at:
            return
        for who, dest, (msg, payload) in batch:
            peer.send(who, dest, msg, payload)
            sent[0] += 1

    hostile()
    peer.close()
    assert sent[0] >= 200
    for b in c.brokers:
        b.check_running()
    assert logged(c, "refused")                # the brokers said why they dropped things
    healthy(c, records_so_far(c))


# -- the attacks, one at a time ----------------------------------------------------------

def test_an_ack2_deleting_the_topic_with_stamp_2_62_is_refused(cluster, peer):
    for b in cluster.brokers:
        peer.send("127.0.0.11:9", b.address,
                  GossipAck2("ghost", [], [f"topic/{TOPIC}", FAR_FUTURE, "ghost", None, True]))
    wait_until(lambda: logged(cluster, "stamped 4611686018427387904"), 10, "the refusal to be logged")
    healthy(cluster, records_so_far(cluster))


def test_rows_for_real_brokers_at_generation_2_62_are_refused(cluster, peer):
    forged = [[b.node_id, FAR_FUTURE, 1, 0, 0, "127.0.0.1:9", False, 0] for b in cluster.brokers[1:]]
    for b in cluster.brokers:
        peer.send("127.0.0.12:9", b.address, GossipAck("ghost", forged, [], [], [], 0))
    wait_until(lambda: logged(cluster, "a generation, heartbeat, version or life out of range"), 10, "the refusal")
    healthy(cluster, records_so_far(cluster))


def test_offsets_stamped_2_62_are_refused_and_real_commits_win(cluster, peer):
    value = {"g": "billing", "t": TOPIC, "o": {"0": [999_999, "", FAR_FUTURE]}}
    for b in cluster.brokers:
        peer.send("127.0.0.13:9", b.address, GossipAck2("ghost", [["ghost", 1, 0, 1, 0, False,
                                                                  ["off/billing/real/0", 1, value, False]]], []))
        peer.send("127.0.0.14:9", b.address, GossipAck2("ghost", [["ghost", 1, 0, FAR_FUTURE, 0, False,
                                                                  ["off/billing/real/0", FAR_FUTURE, value,
                                                                   False]]], []))
    wait_until(lambda: logged(cluster, "off/billing/real/0"), 10, "the refusal of the offsets")
    tp = TopicPartition(TOPIC, 0)
    with GroupAdmin(cluster.bootstrap) as ga:
        assert ga.committed("billing").get(tp) is None
    with Consumer(TOPIC, bootstrap=cluster.bootstrap, group_id="billing", auto_offset_reset="earliest") as con:
        wait_until(lambda: con.poll_batches(100) is not None and tp in con.assignment(), 20, "an assignment")
        con.commit({tp: 3})
        assert con.committed(tp) == 3
    with GroupAdmin(cluster.bootstrap) as ga:        # (closing the consumer commits its position)
        assert 3 <= ga.committed("billing").get(tp) <= records_so_far(cluster)
    healthy(cluster, records_so_far(cluster))


_lives = iter(range(1, 1 << 30))


def fresh_life() -> tuple[str, int]:
    """A (store, life) no broker has seen. A forgery must claim one: a broker drops, unlogged,
    a message from a life it saw replaced less than an election timeout ago (a late message
    from before a restart), and the fuzz above often claims ("", 1) for a real broker's
    address, which the real broker's next message then replaces."""
    return f"forger-{os.getpid()}", next(_lives)


def test_an_append_at_epoch_plus_1000_from_a_forged_leader_is_refused(cluster, peer, stranger):
    uuid = topic_uuid(cluster, stranger)
    leader, address, epoch = leader_of(cluster, 0)
    before = consume_all(cluster, records_so_far(cluster))
    with Consumer(bootstrap=cluster.bootstrap) as con:
        end = con.end_offsets([TopicPartition(TOPIC, 0)])[TopicPartition(TOPIC, 0)]
    forged = patch_batch(encode_batch([b"FORGED"]), end, epoch + 1000)
    row = AppendRow(cluster_pid(uuid, 0), epoch + 1000, end, epoch, end + 1, epoch + 1000, end, end + 1,
                    len(forged), 0)
    for b in cluster.brokers:
        if b.node_id != leader:
            peer.send(address, b.address, ReplAppend([row], *fresh_life()), forged)
    # (refusals are logged once per peer and reason: the fuzz may have said it already)
    wait_until(lambda: logged(cluster, "ahead of ours"), 10, "a term-jump refusal in the logs")
    healthy(cluster, len(before))
    assert b"FORGED" not in consume_all(cluster, records_so_far(cluster))


def test_a_vote_request_with_term_2_63_and_transfer_is_refused(cluster, peer, stranger):
    uuid = topic_uuid(cluster, stranger)
    leader, _, epoch = leader_of(cluster, 1)
    follower = next(b for b in cluster.brokers if b.node_id != leader)
    life = fresh_life()
    peer.send(follower.address, broker(cluster, leader).address,
              ReplVote([VoteRow(cluster_pid(uuid, 1), 2 ** 63 - 1, 2 ** 63 - 1, 2 ** 62, 0, 1)], *life))
    peer.send(follower.address, broker(cluster, leader).address,
              ReplTimeoutNow([TimeoutNowRow(cluster_pid(uuid, 1), epoch + 1)], *life))
    healthy(cluster, records_so_far(cluster))
    wait_until(lambda: logged(cluster, "TimeoutNow not from the leader of our term"), 10, "the TimeoutNow refused")
    # Neither forgery took effect: the epoch did not jump toward 2**63. (The leader itself may
    # change: in open mode a forger's DEALER takes over a real peer's routing id at a ROUTER,
    # ROUTER_HANDOVER, and the link flaps until they settle, so an ordinary election may follow.)
    assert leader_of(cluster, 1)[2] < epoch + 100


def test_after_a_full_restart_nothing_forged_came_back(cluster):
    n = records_so_far(cluster)
    cluster.stop()
    cluster.start()
    healthy(cluster, n)
    with Admin(cluster.bootstrap) as a:
        assert TOPIC in [t["name"] for t in a.metadata(None).topics]
        assert {b["id"] for b in a.brokers() if b["status"] == "alive"} >= {"n1", "n2", "n3"}


# -- connections that share a peer routing id ----------------------------------------------------
# libzmq 4.3.5 aborts (stream_engine_base.cpp:310 !_io_error, zeromq/libzmq#4841) on a ROUTER
# with both ROUTER_HANDOVER and ZMTP heartbeats when connections sharing a routing id come and
# go; the node's ROUTER therefore has no heartbeats of its own (mesh.node.limits.bounds.router_options).

def test_connections_sharing_a_peer_routing_id_do_not_abort_the_broker(tmp_path):
    b = BrokerProcess("n1", str(tmp_path / "n1")).start()
    ctx = zmq.Context()
    try:
        for _ in range(6):
            socks = []
            for i in range(20):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.ROUTING_ID, b"peer:127.0.0.1:%d" % (9 + i % 3))
                s.connect(f"tcp://{b.address}")
                s.send_multipart(pack(PROTOCOL_PEER, 0, GossipAck2("x", [], [])), zmq.NOBLOCK)
                socks.append(s)
            deadline = time.monotonic() + 1.3      # the connections outlive one ZMTP heartbeat (1 s)
            while time.monotonic() < deadline and b.alive():
                time.sleep(0.1)   # the attack is the timing: hold the connections
            for s in socks:
                s.close(0)
            b.check_running()
        b.wait_ready(5)
    finally:
        ctx.term()
        b.kill()
