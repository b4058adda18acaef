"""Issue 39 finding 4 without a broker: a dense body (a million tiny containers in 1 MB)
is refused as soon as the bound is passed, cluster requests are authorized before their
body is decoded, and the request-time quota (request_percentage) refuses a principal over
its share before decoding."""
from __future__ import annotations

import time
from types import SimpleNamespace

import msgpack
import pytest

from mesh.node.requests.dispatch import Dispatcher
from mesh.node.limits.request_quota import BURST_MS, RequestTimeQuota
from mesh.wire import messages as m
from mesh.wire.codec import NO_LIMITS, PROTOCOL_CLIENT, DecodeLimits, decode_body, pack, unpack
from mesh.wire.errors import ErrorCode, MeshError
from tests.unit.test_acl_authorizer import allow, make


def dense_fetch_body(containers: int = 990_000) -> bytes:
    """A FetchRequest whose parts are ten lists of 99,000 empty lists (each 1 byte): ~1 MB."""
    per = containers // 10
    return msgpack.packb([[[[]] * per for _ in range(10)], 0, 1, 1 << 20])


def test_a_body_of_a_million_empty_lists_is_refused_early_with_a_reason():
    body = dense_fetch_body()
    assert len(body) < 1 << 20   # passes max_body_bytes
    with pytest.raises(MeshError) as info:
        decode_body(b"FETCH", body, DecodeLimits())
    assert info.value.code == ErrorCode.INVALID_REQUEST and "max_body_containers" in info.value.message

    def best(fn) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            try:
                fn()
            except MeshError:
                pass
            times.append(time.perf_counter() - t0)
        return min(times)

    bounded = best(lambda: decode_body(b"FETCH", body, DecodeLimits()))
    whole = best(lambda: decode_body(b"FETCH", body, NO_LIMITS))
    assert bounded < whole / 4, (bounded, whole)   # stops at 5% of the containers


def test_ordinary_bodies_decode_as_before():
    lim = DecodeLimits()
    parts = [["t", p, 0, 1 << 20] for p in range(20_000)]   # a fetch of 20,000 partitions
    assert decode_body(b"FETCH", msgpack.packb([parts, 0, 1, 1 << 20]), lim).parts == parts
    assert decode_body(b"CREATE_TOPIC", msgpack.packb(["t", 1, 1, {"a": "b"}]), lim).config == {"a": "b"}
    tight = DecodeLimits(max_body_containers=100)
    with pytest.raises(MeshError):
        decode_body(b"FETCH", msgpack.packb([parts[:200], 0, 1, 1 << 20]), tight)
    assert decode_body(b"FETCH", msgpack.packb([parts[:200], 0, 1, 1 << 20]),
                       DecodeLimits(max_body_containers=0)).parts == parts[:200]


def test_cluster_requests_are_refused_before_their_body_is_decoded():
    a = make([allow("write", "topic", "orders")])
    with pytest.raises(MeshError) as e:
        a.preauthorize("alice", b"ACL_ADD")
    assert e.value.code == ErrorCode.UNAUTHORIZED and e.value.message == "alice may not alter cluster"
    with pytest.raises(MeshError) as e:
        a.preauthorize("mallory", b"FETCH")
    assert "not a user" in e.value.message
    a.preauthorize("alice", b"PRODUCE")     # topic rights depend on the body: decided after decoding
    a.preauthorize("root", b"ACL_ADD")      # superusers
    a.preauthorize("alice", b"NO_SUCH_OP")  # the decoder says it is unknown


class _Router:
    def __init__(self):
        self.sent = []


def dispatcher(quota: RequestTimeQuota | None, now: list) -> tuple[Dispatcher, list]:
    answers: list = []

    def handler(ident, rid, msg, payload):
        time.sleep(0.02)   # 20 ms of the loop
        answers.append(msg)

    handlers = SimpleNamespace(handler_for=lambda msg: handler)
    d = Dispatcher(_Router(), handlers, groups=None, gossip=None, replicas=None, directory=None,
                   send=lambda effects: None, clock=SimpleNamespace(now_ms=lambda: now[0]))
    d.limits = DecodeLimits()
    d.request_quota = quota
    d.reply = lambda ident, rid, msg, payload=None: answers.append(msg)
    return d, answers


def test_a_principal_over_its_request_percentage_is_refused_before_decoding():
    now = [1_000_000]
    quota = RequestTimeQuota(10)    # 10 %: 20 ms of handling buys 200 ms of debt
    d, answers = dispatcher(quota, now)
    frames = [b"attacker", *pack(PROTOCOL_CLIENT, 1, m.MetadataRequest([]))]
    for _ in range(80):             # 1.6 s of handling at 10 %: 16 s of debt, a 1 s burst
        d.handle(frames)
    served = sum(1 for a in answers if not isinstance(a, m.ErrorResponse))
    throttled = [a for a in answers if isinstance(a, m.ErrorResponse) and a.error == ErrorCode.THROTTLED]
    assert 1 <= served <= 10 and len(throttled) == 80 - served, (served, len(throttled))
    assert "request_percentage" in throttled[0].message
    answers.clear()
    d.handle([b"victim", *frames[1:]])   # another client is not held to the attacker's debt
    assert not isinstance(answers[-1], m.ErrorResponse)
    now[0] += 60_000                     # debts are paid with time
    d.handle(frames)
    assert not isinstance(answers[-1], m.ErrorResponse)


def test_request_time_quota_bucket():
    q = RequestTimeQuota(50)
    q.charge("a", 400, 0)            # 800 ms of debt: within the 1 s burst
    assert q.debt_ms("a", 0) == 0
    q.charge("a", 400, 0)            # 1,600 ms
    assert q.debt_ms("a", 0) == 1_600 - BURST_MS
    assert q.debt_ms("a", 600) == 0 and q.debt_ms("b", 0) == 0
    with pytest.raises(ValueError):
        RequestTimeQuota(0)


def test_refusals_of_cycling_connections_log_a_line_per_code_a_second(caplog):
    """Issue 39 finding 10: a client cycling connections (a new identity each) with one
    refused request each logged a line per request (28 KB/s)."""
    import logging
    d, answers = dispatcher(None, [0])
    with caplog.at_level(logging.WARNING, logger="mesh.node.requests.dispatch"):
        for i in range(500):
            d.handle([b"conn-%d" % i, PROTOCOL_CLIENT, (1).to_bytes(8, "big"), b"NOPE", msgpack.packb([])])
    assert len(answers) == 500 and all(a.error == ErrorCode.INVALID_REQUEST for a in answers)
    assert 1 <= len([r for r in caplog.records if "NOPE" in r.getMessage()]) <= 3
