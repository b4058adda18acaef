"""Bounds of issue 13 without a broker: body decoding limits, topic config ranges, the
rate-limited log, the outbox (backlogs, quotas, gone clients), the data path's fetch
bounds and parked-fetch index, idempotent-producer expiry, and the `mesh node` options."""
from __future__ import annotations

import dataclasses
import errno
import logging
import time

import msgpack
import pytest
import zmq

from mesh.node.data.datapath import DataLimits, DataPath
from mesh.node.replication.outbox import ByteRateQuota, Outbox
from mesh.node.data.producer_state import ProducerStates
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.wire import messages as m
from mesh.wire.codec import NO_LIMITS, PROTOCOL_CLIENT, PROTOCOL_PEER, DecodeLimits, decode_body, pack, unpack
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import encode_batch, parse_header, patch_batch
from mesh.wire.topic_config import normalize_config
from storage.memory import MemoryStore


def code_of(fn) -> ErrorCode:
    with pytest.raises(MeshError) as info:
        fn()
    return info.value.code


# -- codec ----------------------------------------------------------------------------
def test_a_large_body_of_empty_maps_is_refused_before_decoding():
    body = b"\xdd" + (15_000_000).to_bytes(4, "big") + b"\x80" * 15_000_000
    t0 = time.perf_counter()
    assert code_of(lambda: decode_body(b"FETCH", body, DecodeLimits())) == ErrorCode.MESSAGE_TOO_LARGE
    assert time.perf_counter() - t0 < 0.05


def test_container_and_string_limits_are_enforced():
    lim = DecodeLimits(max_body_bytes=1 << 20, max_array_len=10, max_map_len=2, max_str_len=8)
    assert code_of(lambda: decode_body(b"FETCH", msgpack.packb([list(range(11))]), lim)) == ErrorCode.INVALID_REQUEST
    assert code_of(lambda: decode_body(b"CREATE_TOPIC", msgpack.packb(["t", 1, 1, {"a": 1, "b": 2, "c": 3}]),
                                       lim)) == ErrorCode.INVALID_REQUEST
    assert code_of(lambda: decode_body(b"DELETE_TOPIC", msgpack.packb(["x" * 9]), lim)) == ErrorCode.INVALID_REQUEST
    assert decode_body(b"DELETE_TOPIC", msgpack.packb(["x" * 8]), lim) == m.DeleteTopicRequest("x" * 8)


def test_clients_decode_responses_without_limits_and_peers_with_their_own():
    big = m.MetadataResponse(0, topics=[{"name": "t%d" % i} for i in range(200_000)])
    frames = pack(PROTOCOL_CLIENT, 1, big)
    assert unpack(frames)[2] == big
    assert unpack(frames, NO_LIMITS)[2] == big
    small = DecodeLimits(max_body_bytes=100)
    assert code_of(lambda: unpack(frames, small)) == ErrorCode.MESSAGE_TOO_LARGE
    peer = pack(PROTOCOL_PEER, 1, m.DeleteTopicRequest("x" * 200))
    assert unpack(peer, limits=small)[2].name == "x" * 200          # client limits do not apply to peers
    assert code_of(lambda: unpack(peer, peer_limits=small)) == ErrorCode.MESSAGE_TOO_LARGE


# -- topic config ---------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    {"retention.ms": "99999999999999999999999"}, {"retention.ms": -2}, {"retention.bytes": 2 ** 63},
    {"max.message.bytes": 100}, {"max.message.bytes": 1 << 30}, {"retention.ms": True}, {"retention.ms": 1.5},
    {"retention.ms": "9" * 5000},
])
def test_topic_config_values_out_of_range_are_invalid_config(config):
    assert code_of(lambda: normalize_config(config)) == ErrorCode.INVALID_CONFIG


def test_topic_config_in_range_is_kept():
    assert normalize_config({"retention.ms": "-1", "max.message.bytes": 8 << 20})["max.message.bytes"] == 8 << 20


# -- rate-limited log -----------------------------------------------------------------
def test_rate_limited_log_once_per_key_per_window(caplog):
    now = [0]
    rl = RateLimitedLog(logging.getLogger("t.rl"), window_ms=60_000, max_keys=3, now_ms=lambda: now[0])
    assert rl.once("a") and not rl.once("a")
    now[0] = 60_000
    assert rl.once("a")
    for k in ("b", "c", "d", "e"):   # the table stays bounded
        rl.once(k)
    assert len(rl._last) <= 3


def test_one_traceback_per_exception_site_per_minute(caplog):
    rl = RateLimitedLog(logging.getLogger("t.exc"))

    def fail(i):
        try:
            raise ValueError(f"bad {i}")
        except ValueError as exc:
            rl.exception(("client", i % 2), exc, "request failed")

    with caplog.at_level(logging.ERROR, logger="t.exc"):
        for i in range(100):
            fail(i)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1
    assert len(caplog.records) == 2   # then one line for the other key, nothing more


# -- outbox ---------------------------------------------------------------------------
class FakeRouter:
    def __init__(self):
        self.sent, self.full, self.gone = [], set(), set()

    def send_multipart(self, frames, flags=0, copy=True):
        ident = frames[0]
        if ident in self.gone:
            raise zmq.ZMQError(errno.EHOSTUNREACH)
        if ident in self.full:
            raise zmq.Again()
        self.sent.append(frames)

    def recv_multipart(self, flags=0):
        raise zmq.Again()


def test_outbox_backlogs_a_full_pipe_in_order_and_drops_past_its_cap():
    r, now = FakeRouter(), [0]
    ob = Outbox(r, lambda: now[0], max_backlog_bytes=100)
    r.full.add(b"c")
    for i in range(5):
        ob.send(b"c", [b"c", bytes([i]) * 30])
    assert r.sent == [] and ob.dropped == 2 and ob.backlog_bytes() == 93
    r.full.clear()
    ob.flush()
    assert [f[1][0] for f in r.sent] == [0, 1, 2]
    assert ob.backlog_bytes() == 0 and ob.next_due_ms() is None


def test_outbox_gone_client_calls_on_gone():
    r = FakeRouter()
    ob = Outbox(r, lambda: 0)
    gone = []
    ob.on_gone = gone.append
    r.gone.add(b"x")
    ob.send(b"x", [b"x", b"hi"])
    assert gone == [b"x"]


def test_quota_delays_answers_in_order_and_never_drops_them():
    r, now = FakeRouter(), [0]
    ob = Outbox(r, lambda: now[0], produce_bytes_per_s=1000)
    delays = [ob.charge("produce", b"c", 1000) for _ in range(3)]
    assert delays == [0, 1000, 2000]          # a one-second burst, then the rate
    ob.send(b"c", [b"c", b"1"], delays[1])
    ob.send(b"c", [b"c", b"2"])               # queued behind the held one
    ob.flush()
    assert r.sent == []
    now[0] = 1000
    ob.flush()
    assert [f[1] for f in r.sent] == [b"1", b"2"]
    assert ob.charge("fetch", b"c", 10 ** 9) == 0   # fetch quota off


def test_answers_held_by_a_quota_are_bounded_in_bytes_per_client():
    r, now = FakeRouter(), [0]
    ob = Outbox(r, lambda: now[0], max_backlog_bytes=100, fetch_bytes_per_s=1000)
    ob.charge("fetch", b"c", 1000)                       # the burst is used up
    for i in range(5):                                   # a throttled client keeps fetching
        ob.send(b"c", [b"c", bytes([i]) * 40], ob.charge("fetch", b"c", 40))
    assert ob.dropped == 3                               # held: 2 answers of 41 bytes; a third is over 100
    now[0] = 10_000
    ob.flush()
    assert [f[1][0] for f in r.sent] == [0, 1]
    ob.send(b"c", [b"c", b"late"], 5)                    # the bound frees as answers leave
    assert ob.dropped == 3


def test_byte_rate_quota_recovers_when_idle():
    q = ByteRateQuota(1000)
    assert q.charge(b"c", 5000, 0) == 4000
    assert q.charge(b"c", 100, 10_000) == 0


# -- data path: fetch bounds ----------------------------------------------------------
class FakeTopic:
    def __init__(self, name, pids):
        self.name, self.pids, self.partitions = name, pids, len(pids)


class FakeCatalog:
    def __init__(self):
        self.topics = {"t": FakeTopic("t", [0, 1])}

    def partition(self, name, p):
        t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, name)
        if not 0 <= p < t.partitions:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION, name)
        return t, t.pids[p]


class FakeReplicas:
    def __init__(self):
        self.hw = {0: 0, 1: 0}

    def is_leader(self, pid):
        return True

    def commit_offset(self, pid):
        return self.hw[pid]

    def expire(self):
        pass


class FakeStore:
    def __init__(self, replicas):
        self.replicas = replicas

    def log_start(self, pid):
        return 0

    def log_end(self, pid):
        return self.replicas.hw[pid]

    def read(self, pid, offset, max_bytes, limit):
        return [b"x" * max_bytes]   # what was asked for: shows the caps


def datapath(**limits):
    replicas = FakeReplicas()
    replies, now = [], [0]
    dp = DataPath(FakeStore(replicas), FakeCatalog(), replicas, None,
                  lambda ident, rid, msg, payload=None: replies.append((ident, rid, msg, payload)),
                  lambda t, p: None, now_ms=lambda: now[0], limits=DataLimits(**limits))
    return dp, replicas, replies, now


def test_fetch_caps_bytes_per_request_and_partition():
    dp, replicas, replies, _ = datapath(fetch_max_bytes=1000, partition_fetch_max_bytes=600)
    replicas.hw = {0: 10, 1: 10}
    dp.on_fetch(b"c", 1, m.FetchRequest([["t", 0, 0, 2 ** 40], ["t", 1, 0, 2 ** 40]], 0, 1, 2 ** 40), None)
    (_, _, resp, payload), = replies
    assert [p[5] for p in resp.parts] == [600, 400]
    assert len(payload) == 1000


def test_a_partition_listed_twice_is_invalid():
    dp, *_ = datapath()
    req = m.FetchRequest([["t", 0, 0, 100]] * 100, 0, 1, 2 ** 40)
    assert code_of(lambda: dp.on_fetch(b"c", 1, req, None)) == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("part", [["t", 0, 0, -1], ["t", 0, "0", 1], [1, 0, 0, 1], ["t", True, 0, 1], ["t", 0, 0]])
def test_malformed_fetch_parts_are_invalid(part):
    dp, *_ = datapath()
    assert code_of(lambda: dp.on_fetch(b"c", 1, m.FetchRequest([part], 0), None)) == ErrorCode.INVALID_REQUEST


def test_parked_fetches_are_bounded_capped_and_dropped_with_their_client():
    dp, replicas, replies, now = datapath(max_parked_fetches=5, max_parked_per_client=3, fetch_max_wait_ms=1000)
    for i in range(4):
        dp.on_fetch(b"a", i, m.FetchRequest([["t", 0, 0, 100]], 10 ** 12), None)
    assert dp.parked == 3 and len(replies) == 1            # the fourth answered at once
    for i in range(4):
        dp.on_fetch(b"b", 10 + i, m.FetchRequest([["t", 1, 0, 100]], 10 ** 12), None)
    assert dp.parked == 5 and len(replies) == 3            # total bound
    assert dp.next_deadline_ms() == 1000                   # max_wait_ms capped
    dp.drop_client(b"a")
    assert dp.parked == 2 and len(replies) == 3            # gone: forgotten, not answered
    replicas.hw[0] = 5
    dp._grown.add(0)
    dp.after_turn()                                         # partition 0 woke nobody
    assert len(replies) == 3
    replicas.hw[1] = 5
    dp._grown.add(1)
    dp.after_turn()
    assert dp.parked == 0 and len(replies) == 5
    now[0] = 2000
    dp.after_turn()
    assert len(replies) == 5 and dp.next_deadline_ms() is None


def test_doomed_turn_is_rolled_back_at_commit():
    class Store:
        rolled = committed = 0

        def rollback(self):
            Store.rolled += 1

        def commit(self, now_ms=None):
            Store.committed += 1

        def has_writes(self):
            return False

    class Replicas:
        ok = None

        def before_commit(self, w):
            pass

        def after_commit(self, ok):
            Replicas.ok = ok
            return set()

    class Producers:
        def rollback(self):
            pass

        def committed(self):
            pass

    dp = DataPath(Store(), None, Replicas(), Producers(), lambda *a: None, lambda t, p: None)
    dp.doom("a bug")
    assert dp.commit_turn() is False and Store.rolled == 1 and Store.committed == 0 and Replicas.ok is False
    assert dp.commit_turn() is True and Store.committed == 1


# -- producer state expiry ------------------------------------------------------------
def _header(producer_id):
    return parse_header(patch_batch(encode_batch([b"v"], producer_id=producer_id, base_sequence=0), 0, 1))


def test_producer_state_expires_when_idle_and_is_bounded_in_count_and_memory():
    store, now = MemoryStore(), [0]
    ps = ProducerStates(store, now_ms=lambda: now[0], expiration_ms=1000, max_ids=50, max_cached=20)
    for i in range(100):
        now[0] = i
        ps.stage(1, _header(i), i)
        store.commit()
        ps.committed()
    assert len(ps._cache) <= 20
    assert len(store.items("producers")) == 100
    assert ps.expire(now_ms=500) == 50             # count bound: the longest idle go
    store.commit()
    assert len(store.items("producers")) == 50
    assert ps.check(1, _header(10)) is None        # expired: new again
    assert ps.check(1, _header(60)) == 60          # kept: still a duplicate
    assert ps.expire(now_ms=2000) == 50            # idle past expiration_ms
    store.commit()
    assert store.items("producers") == [] and not any(ps._cache.values())


def test_old_format_producer_state_is_read_and_stamped():
    store = MemoryStore()
    import struct
    store.put("producers", struct.pack(">Qq", 1, 5), msgpack.packb([[0, 0, 7]]))
    store.commit()
    ps = ProducerStates(store, now_ms=lambda: 10, expiration_ms=1000)
    assert ps.check(1, _header(5)) == 7
    assert ps.expire(now_ms=10) == 0
    store.commit()
    assert ps.expire(now_ms=5000) == 1


# -- options --------------------------------------------------------------------------
def test_node_option_defaults_are_node_config_defaults():
    from mesh.node.loop import NodeConfig
    from tools.node_options import BOUND_OPTIONS
    defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
    for name, minimum, default, _ in BOUND_OPTIONS:
        assert defaults[name] == default, name
        assert default >= minimum


def test_int_fields_must_be_signed_64_bit():
    for v in (2 ** 64 - 1, 2 ** 63):
        body = msgpack.packb(["t", v, 1])
        assert code_of(lambda: decode_body(b"PRODUCE", body)) == ErrorCode.INVALID_REQUEST
    assert decode_body(b"PRODUCE", msgpack.packb(["t", 2 ** 63 - 1, 1])).partition == 2 ** 63 - 1


# -- dispatcher: contained failures ---------------------------------------------------
def test_an_exception_in_a_handler_dooms_the_turn_answers_and_logs_once(caplog):
    from mesh.gossip import GossipSyn
    from mesh.node.requests.dispatch import Dispatcher
    from mesh.node.peers.peers import PEER_PREFIX

    class Handlers:
        def handler_for(self, msg):
            def boom(ident, rid, msg, payload):
                raise KeyError("half-updated")
            return boom

    class Gossip:
        def receive(self, src, msg, now):
            raise RuntimeError("gossip bug")

    class Clock:
        def now_ms(self):
            return 0

        def wall_ms(self):
            return 0

    r, dooms = FakeRouter(), []
    d = Dispatcher(r, Handlers(), None, Gossip(), None, None, lambda effects: None, Clock())
    d.on_doom = dooms.append
    with caplog.at_level(logging.WARNING, logger="mesh.node.requests.dispatch"):
        for i in range(50):
            d.handle([b"client"] + pack(PROTOCOL_CLIENT, i, m.CreateTopicRequest("t")))
        d.handle([b"client"] + pack(PROTOCOL_CLIENT, 99, m.MetadataRequest()))   # a read: nothing to undo
    assert len(dooms) == 50 and len(r.sent) == 51
    r.sent.pop()
    assert all(unpack(f[1:])[2].error == ErrorCode.INVALID_REQUEST for f in r.sent)
    assert len([rec for rec in caplog.records if rec.exc_info]) == 1
    assert len(caplog.records) <= 2
    d.handle([PEER_PREFIX + b"127.0.0.1:1"] + pack(PROTOCOL_PEER, 0, GossipSyn("n2", [], [], 0)))
    assert d.gossip_suspect and len(dooms) == 51


def test_a_turn_drains_for_at_most_max_drain_ms_then_goes_on():
    """A flood of costly messages (a large topic's elections: 4,096-row replication messages
    of 25-140 ms each) must not keep a turn draining for a second: its ticks and pings wait."""
    from types import SimpleNamespace
    from mesh.node.loop import Node, NodeConfig

    clock_ms = [0]
    handled = []

    def recv(flags):
        return [b"peer", b"msg"]                 # never empty: the socket always has more

    def handle(frames):
        handled.append(frames)
        clock_ms[0] += 30                        # each message costs 30 ms

    cfg = NodeConfig(node_id="n1")
    fake = SimpleNamespace(cfg=cfg, dispatch=SimpleNamespace(recv=recv, handle=handle),
                           clock=SimpleNamespace(now_ms=lambda: clock_ms[0]),
                           replicas=SimpleNamespace(commit_moved=False), turn=None)
    Node._drain(fake)
    assert len(handled) == 4 and clock_ms[0] == 120     # 100 ms budget: stopped after the message that crossed it
    handled.clear()
    clock_ms[0] = 0
    fake.dispatch.handle = handled.append            # cheap messages: the count bound applies
    Node._drain(fake)
    assert len(handled) == cfg.max_requests_per_turn


def test_the_debt_before_a_batch_is_what_its_refusal_is_judged_by():
    """A batch larger than the burst (an idle client) is not refused for its own size."""
    q = ByteRateQuota(1000)
    assert q.debt_ms(b"c", 0) == 0
    assert q.charge(b"c", 3000, 0) == 2000    # taken: its answer waits 2 s
    assert q.debt_ms(b"c", 0) == 2000 and q.debt_ms(b"c", 2000) == 0


def test_each_peer_link_has_a_routing_id_nobody_could_hold_ahead_of_it():
    """Without ROUTER_HANDOVER (secured mode), libzmq keeps a second connection that claims
    a routing id in use but never delivers its messages, even after the first one left: a
    user that took ``peer:<address>`` while that broker was down cut it off for good. Each
    link carries the address and a fresh random nonce."""
    import zmq
    from mesh.node.peers.peers import PeerLinks, sender_address
    ctx = zmq.Context()
    try:
        ids = set()
        for _ in range(2):   # two lives of the broker at 127.0.0.1:7101
            links = PeerLinks(ctx, "127.0.0.1:7101")
            ident = links._sock("127.0.0.1:7102").getsockopt(zmq.ROUTING_ID)
            assert sender_address(ident) == "127.0.0.1:7101"
            ids.add(ident)
            links.flush_and_close()
        assert len(ids) == 2 and b"peer:127.0.0.1:7101" not in ids
    finally:
        ctx.term()


def test_links_to_addresses_no_member_has_are_closed():
    from mesh.gossip import GossipSyn
    import zmq
    from mesh.node.peers.peers import PeerLinks
    ctx = zmq.Context()
    try:
        links = PeerLinks(ctx, "127.0.0.1:7101")
        for port in range(20000, 20010):   # addresses a gossip row named once
            links.send(f"127.0.0.1:{port}", GossipSyn("n1", [], [], 0))
        assert links.prune({"127.0.0.1:20003"}, idle_rounds=2) == 0   # just used
        for _ in range(2):
            links.send("127.0.0.1:20005", GossipSyn("n1", [], [], 0))     # a dead member still probed
            closed = links.prune({"127.0.0.1:20003"}, idle_rounds=2)
        assert closed == 8 and sorted(links._socks) == ["127.0.0.1:20003", "127.0.0.1:20005"]
    finally:
        links.flush_and_close()
        ctx.term()
