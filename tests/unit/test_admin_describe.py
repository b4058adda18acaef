"""``Admin.describe_topic`` asks each other leader for its offsets first hand; whatever a
leader answers, or fails to, describe returns the first broker's view rather than raising."""
from __future__ import annotations

import copy
from types import SimpleNamespace as NS

import pytest

from mesh.client import Admin
from mesh.wire.errors import ErrorCode, MeshError


def part(p, leader, addr, end, isr=("n1", "n2", "n3")):
    return {"partition": p, "leader": leader, "leader_address": addr, "epoch": 1, "replicas": ["n1", "n2", "n3"],
            "isr": list(isr), "log_start": 0, "log_end": end, "high_watermark": end}


FIRST = NS(node_id="n1", topics=[{"name": "t", "partitions": [part(0, "n1", "127.0.0.1:7101", 10),
                                                              part(1, "n2", "127.0.0.1:7102", 3)]}])


def admin(monkeypatch, first, answer):
    a = Admin("127.0.0.1:7101")
    monkeypatch.setattr(a, "metadata", lambda topics=None: copy.deepcopy(first))
    seen = {"calls": [], "forgot": []}

    def call(addr, msg, timeout_ms):
        seen["calls"].append(addr)
        if isinstance(answer, Exception):
            raise answer
        return answer, None
    monkeypatch.setattr(a.transport, "call", call)
    monkeypatch.setattr(a.transport, "forget", lambda addr, linger_ms=0: seen["forgot"].append(addr))
    return a, seen


def test_a_leader_gives_its_own_offsets():
    good = NS(node_id="n2", topics=[{"name": "t", "partitions": [part(0, "n1", "x:1", 0), part(1, "n2", "", 7)]}])
    with pytest.MonkeyPatch.context() as mp:
        a, seen = admin(mp, FIRST, good)
        t = a.describe_topic("t")
        a.close()
    assert seen["calls"] == ["127.0.0.1:7102"]
    assert [(p["log_end"], p["high_watermark"]) for p in t["partitions"]] == [(10, 10), (7, 7)]


@pytest.mark.parametrize("answer", [
    NS(node_id="n2", topics=[{"name": "other", "partitions": [part(1, "n2", "", 7)]}]),
    NS(node_id="n2", topics=[{"name": "t", "partitions": [{**part(1, "n2", "", 7), "isr": None}]}]),
    NS(node_id="n2", topics=[{"name": "t", "partitions": [{**part(1, "n2", "", 7), "log_start": "x"}]}]),
    NS(node_id="n2", topics=[{"name": "t", "partitions": [part(1, "n3", "", 7)]}]),     # not its own
    NS(node_id="n2", topics=[{"name": "t", "partitions": "many"}]),
    NS(node_id="n2", topics=None),
    NS(error=int(ErrorCode.INVALID_REQUEST)),
    MeshError(ErrorCode.TIMEOUT, "no answer"),
])
def test_an_answer_not_shaped_as_asked_leaves_the_first_view(answer):
    with pytest.MonkeyPatch.context() as mp:
        a, seen = admin(mp, FIRST, answer)
        t = a.describe_topic("t")
        a.close()
    assert t == FIRST.topics[0]
    assert seen["forgot"] == (["127.0.0.1:7102"] if isinstance(answer, MeshError) else [])


@pytest.mark.parametrize("addr", ["n2", 7102, ["127.0.0.1:7102"]])
def test_a_bad_leader_address_asks_no_one(addr):
    first = copy.deepcopy(FIRST)
    first.topics[0]["partitions"][1]["leader_address"] = addr
    with pytest.MonkeyPatch.context() as mp:
        a, seen = admin(mp, first, None)
        t = a.describe_topic("t")
        a.close()
    assert seen["calls"] == [] and t == first.topics[0]


def test_a_bad_address_for_one_leader_does_not_stop_the_others():
    first = copy.deepcopy(FIRST)
    first.topics[0]["partitions"].append(part(2, "n3", "n3", 4))
    good = NS(node_id="n2", topics=[{"name": "t", "partitions": [part(1, "n2", "", 7)]}])
    with pytest.MonkeyPatch.context() as mp:
        a, seen = admin(mp, first, good)
        t = a.describe_topic("t")
        a.close()
    assert seen["calls"] == ["127.0.0.1:7102"]
    assert [p["log_end"] for p in t["partitions"]] == [10, 7, 4]


def test_a_topic_change_goes_on_to_the_owner_and_a_busy_owner_is_asked_again(monkeypatch):
    """A broker that does not own a topic answers COORDINATOR_MOVED naming the owner; an
    owner still learning the cluster answers COORDINATOR_NOT_AVAILABLE (retriable)."""
    from mesh.wire.messages import CreateTopicRequest
    a = Admin("127.0.0.1:7101")
    calls, answers = [], [MeshError(ErrorCode.COORDINATOR_MOVED, "ask n2", leader="127.0.0.1:7102"),
                          MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "still learning"),
                          MeshError(ErrorCode.COORDINATOR_MOVED, "ask n2", leader="127.0.0.1:7102"),
                          NS(error=0)]

    def call(addr, msg, timeout_ms):
        calls.append(addr)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer, None
    monkeypatch.setattr(a.transport, "call", call)
    monkeypatch.setattr("mesh.client.admin.time.sleep", lambda s: None)
    assert a._call(CreateTopicRequest("t", 1, 1)).error == 0
    assert calls == ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7101", "127.0.0.1:7102"]
    answers[:] = [MeshError(ErrorCode.COORDINATOR_MOVED, "ask there", leader="not an address")]
    with pytest.raises(MeshError) as info:   # a hostile broker cannot make the client dial anything
        a._call(CreateTopicRequest("t", 1, 1))
    assert info.value.code == ErrorCode.INVALID_REQUEST
    a.close()
