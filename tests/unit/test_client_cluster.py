"""The client's cluster view over a scripted fake transport: metadata cache, leader lookup,
refresh decisions and the one ListOffsets with retries. No sockets, no sleeping: the view's
clock and sleep are replaced by a fake clock."""
import pytest

from mesh.client.cluster import ClusterView, TopicPartition, merge_topics
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import (EARLIEST, LATEST, ListOffsetsRequest, ListOffsetsResponse, MetadataResponse,
                                OffsetsPart)

NL, LNA = ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE


def topic(name, leaders):
    return {"name": name, "config": {}, "partitions": [
        {"partition": i, "leader": a and f"n-{a}", "leader_address": a, "epoch": 1, "replicas": [], "isr": [],
         "log_start": 0, "log_end": 0, "high_watermark": 0} for i, a in enumerate(leaders)]}


class FakeTransport:
    """Metadata comes from ``self.metadata`` (None: no broker answers); ListOffsets answers
    from ``self.answers[addr]``: a list of callables (request -> response or exception),
    one per call."""

    def __init__(self):
        self.metadata = None
        self.by_address = None
        self.metadata_calls = []
        self.sent = []
        self.answers = {}
        self.calls = []
        self.forgotten = []

    def send(self, addr, msg, payload=None):
        self.sent.append((addr, msg))
        return len(self.sent) - 1

    def gather(self, rids, timeout_ms, grace_ms=None):
        """A refresh: one answer from the first address asked (``self.metadata``), or one
        per address asked that ``self.by_address`` has."""
        asked = [self.sent[r][0] for r in rids]
        self.metadata_calls.append((asked, self.sent[rids[0]][1].topics))
        if self.by_address is not None:
            return {r: (a, self.by_address[a], None) for r, a in zip(rids, asked) if a in self.by_address}
        md = self.metadata.pop(0) if isinstance(self.metadata, list) and len(self.metadata) > 1 else (
            self.metadata[0] if isinstance(self.metadata, list) else self.metadata)
        if md is None:
            return {}
        return {rids[0]: (asked[0], md, None)}

    def call(self, addr, msg, payload=None, timeout_ms=10_000):
        assert isinstance(msg, ListOffsetsRequest)
        self.calls.append((addr, [tuple(p) for p in msg.parts]))
        script = self.answers.get(addr) or [lambda m: MeshError(ErrorCode.TIMEOUT, f"{addr} silent")]
        out = script.pop(0)(msg) if len(script) > 1 else script[0](msg)
        if isinstance(out, MeshError):
            raise out
        return out, None

    def forget(self, addr, linger_ms=0):
        self.forgotten.append(addr)


def offsets(table):
    """An answer: offset per (topic, partition) from ``table``, or an error code per entry."""
    def answer(msg):
        parts = []
        for t, p, _ in msg.parts:
            v = table[(t, p)]
            if isinstance(v, tuple):  # (error, leader hint)
                parts.append(OffsetsPart(t, p, v[0], -1, v[1]))
            else:
                parts.append(OffsetsPart(t, p, 0, v, None))
        return ListOffsetsResponse(parts)
    return answer


@pytest.fixture
def view():
    tr = FakeTransport()
    v = ClusterView(tr, "a:1, b:2,")
    clock = [100.0]
    v._clock = lambda: clock[0]
    v._sleep = lambda s: clock.__setitem__(0, clock[0] + s)
    v.clock = clock
    tr.metadata = MetadataResponse(0, [{"id": "n-a:1", "address": "a:1", "status": "alive"},
                                       {"id": "n-c:3", "address": "c:3", "status": "dead"}],
                                   [topic("t", ["a:1", "b:2", None])])
    return v


def test_bootstrap_is_parsed_and_dead_brokers_come_last(view):
    assert view.bootstrap == ["a:1", "b:2"]
    with pytest.raises(ValueError):
        ClusterView(FakeTransport(), " , ")
    view.refresh()
    assert view.addresses() == ["a:1", "b:2"]   # alive first (c:3 is dead), then bootstrap


def test_metadata_is_cached_and_a_topic_error_drops_it(view):
    assert view.partitions("t") == 3                      # unknown: one refresh
    assert view.leader_address("t", 1) == "b:2"
    assert view.leader_address("t", 2) is None            # no leader right now
    assert len(view.transport.metadata_calls) == 1        # served from the cache
    with pytest.raises(MeshError) as ei:
        view.leader_address("t", 3)
    assert ei.value.code == ErrorCode.UNKNOWN_PARTITION
    view.transport.metadata = MetadataResponse(0, [], [{"name": "t", "error": ErrorCode.UNKNOWN_TOPIC}])
    view.refresh(["t"])
    with pytest.raises(MeshError) as ei:
        view.topic("t", refresh=False)
    assert ei.value.code == ErrorCode.UNKNOWN_TOPIC


def test_a_not_leader_hint_is_followed_only_if_it_is_an_address(view):
    view.refresh()
    view.set_leader("t", 0, "z:9")
    assert view.leader_address("t", 0) == "z:9"
    view.set_leader("t", 0, "node-7")                     # not HOST:PORT: ignored
    view.set_leader("t", 9, "y:1")                        # no such partition: ignored
    assert view.leader_address("t", 0) == "z:9"


def test_leader_of_is_cached_until_a_refresh_or_a_hint(view):
    assert view.leader_of(("t", 0)) == "a:1" and view.leader_of(("t", 2)) is None
    view.topics["t"]["partitions"][0]["leader_address"] = "q:7"   # behind the view's back: not seen
    assert view.leader_of(("t", 0)) == "a:1"
    assert len(view.transport.metadata_calls) == 1                # served from the cache
    view.set_leader("t", 0, "z:9")                                # a NOT_LEADER hint: seen at once
    assert view.leader_of(("t", 0)) == "z:9"
    view.transport.metadata = MetadataResponse(0, [], [topic("t", ["b:2", "b:2", "a:1"])])
    view.refresh()                                                # a refresh: every partition again
    assert [view.leader_of(("t", i)) for i in range(3)] == ["b:2", "b:2", "a:1"]
    with pytest.raises(MeshError) as ei:
        view.leader_of(("t", 3))
    assert ei.value.code == ErrorCode.UNKNOWN_PARTITION


def test_no_broker_answering_metadata_is_broker_unavailable(view):
    view.transport.metadata = None
    with pytest.raises(MeshError) as ei:
        view.refresh()
    assert ei.value.code == ErrorCode.BROKER_UNAVAILABLE


def test_list_offsets_asks_each_leader_once_for_all_its_partitions(view):
    view.transport.metadata = MetadataResponse(0, [], [topic("t", ["a:1", "b:2", "a:1"])])
    view.transport.answers = {"a:1": [offsets({("t", 0): 5, ("t", 2): 7})], "b:2": [offsets({("t", 1): 6})]}
    got = view.list_offsets([("t", 0), ("t", 1), ("t", 2)], EARLIEST, timeout_ms=1000)
    assert got == {TopicPartition("t", 0): 5, TopicPartition("t", 1): 6, TopicPartition("t", 2): 7}
    assert sorted(view.transport.calls) == [("a:1", [("t", 0, EARLIEST), ("t", 2, EARLIEST)]),
                                            ("b:2", [("t", 1, EARLIEST)])]


def test_list_offsets_retries_a_leader_election_then_follows_the_new_leader(view):
    view.transport.metadata = [MetadataResponse(0, [], [topic("t", ["a:1", None])]),   # t/1: electing
                               MetadataResponse(0, [], [topic("t", ["a:1", "b:2"])])]  # gossip lags on t/0
    view.transport.answers = {"a:1": [offsets({("t", 0): (NL, "b:2")}), offsets({("t", 0): 9})],
                              "b:2": [offsets({("t", 0): 10, ("t", 1): 11})]}
    got = view.list_offsets([("t", 0), ("t", 1)], LATEST, timeout_ms=1000)
    assert got == {("t", 0): 10, ("t", 1): 11}
    assert [a for a, _ in view.transport.calls] == ["a:1", "b:2"]   # the hint beat the stale metadata
    assert view.transport.calls[1] == ("b:2", [("t", 0, LATEST), ("t", 1, LATEST)])
    assert view.clock[0] == pytest.approx(100.05)                    # one backoff
    assert len(view.transport.metadata_calls) == 2                   # first lookup, one refresh


def test_list_offsets_forgets_a_silent_leader_and_gives_up_at_the_deadline(view):
    view.transport.answers = {"a:1": [lambda m: MeshError(ErrorCode.TIMEOUT, "silent")]}
    with pytest.raises(MeshError) as ei:
        view.list_offsets([("t", 0)], LATEST, timeout_ms=200)
    assert ei.value.code == LNA and "within 200 ms" in ei.value.message and "silent" in ei.value.message
    assert set(view.transport.forgotten) == {"a:1"} and len(view.transport.forgotten) >= 4
    assert 100.2 < view.clock[0] < 100.3


def test_list_offsets_raises_a_non_retriable_error_at_once_or_skips_it_when_partial(view):
    view.transport.metadata = MetadataResponse(0, [], [topic("t", ["a:1", "a:1"])])
    view.transport.answers = {"a:1": [offsets({("t", 0): (ErrorCode.UNAUTHORIZED, None), ("t", 1): 3})]}
    with pytest.raises(MeshError) as ei:
        view.list_offsets([("t", 0), ("t", 1)], LATEST, timeout_ms=1000)
    assert ei.value.code == ErrorCode.UNAUTHORIZED and view.clock[0] == 100.0
    got = view.list_offsets([("t", 0), ("t", 1)], LATEST, timeout_ms=1000, partial=True)
    assert got == {("t", 1): 3}


def test_list_offsets_partial_returns_what_answered_by_the_deadline(view):
    view.transport.answers = {"a:1": [offsets({("t", 0): 1})], "b:2": [lambda m: MeshError(LNA, "electing")]}
    got = view.list_offsets([("t", 0), ("t", 1), ("t", 2)], LATEST, timeout_ms=300, partial=True)
    assert got == {("t", 0): 1}
    assert view.clock[0] > 100.3


def test_list_offsets_of_an_unknown_topic_raises(view):
    with pytest.raises(MeshError) as ei:
        view.list_offsets([("nope", 0)], LATEST, timeout_ms=1000)
    assert ei.value.code == ErrorCode.UNKNOWN_TOPIC


def entry(p, leader, epoch):
    return {"partition": p, "leader": leader and f"n-{leader}", "leader_address": leader, "epoch": epoch,
            "replicas": [], "isr": [], "log_start": 0, "log_end": 0, "high_watermark": 0}


def test_merge_takes_the_highest_leader_epoch_per_partition():
    stale = MetadataResponse(0, [], [{"name": "t", "error": 0, "partitions": [entry(0, "a:1", 4), entry(1, "b:2", 2)]},
                                     {"name": "gone", "error": ErrorCode.UNKNOWN_TOPIC}])
    fresh = MetadataResponse(0, [], [{"name": "t", "error": 0, "partitions": [entry(0, "c:3", 5), entry(1, None, 2)]},
                                     {"name": "gone", "error": ErrorCode.UNKNOWN_TOPIC},
                                     {"name": "new", "error": 0, "partitions": [entry(0, "a:1", 1)]}])
    for answers in ([stale, fresh], [fresh, stale]):   # whatever the order of the answers
        got = merge_topics(answers)
        assert [(e["leader_address"], e["epoch"]) for e in got["t"]["partitions"]] == [("c:3", 5), ("b:2", 2)]
        assert got["gone"] is None and got["new"]["partitions"][0]["leader_address"] == "a:1"


def test_refresh_asks_three_brokers_and_a_lagging_one_does_not_win(view):
    view.transport.by_address = {
        "a:1": MetadataResponse(0, [{"id": "n-a", "address": "a:1", "status": "alive"},
                                    {"id": "n-b", "address": "b:2", "status": "alive"},
                                    {"id": "n-c", "address": "c:3", "status": "alive"},
                                    {"id": "n-d", "address": "d:4", "status": "alive"}],
                                [{"name": "t", "error": 0, "partitions": [entry(0, "d:4", 7)]}]),
        "b:2": MetadataResponse(0, [], [{"name": "t", "error": 0, "partitions": [entry(0, "b:2", 8)]}]),
    }
    view.refresh()
    assert view.leader_address("t", 0) == "b:2"
    view.refresh()                                     # now four brokers known: three asked at once
    (asked, _), = view.transport.metadata_calls[-1:]
    assert len(asked) == 3
    assert view.leader_address("t", 0) in ("b:2", "d:4")
    if "b:2" in asked:
        assert view.leader_address("t", 0) == "b:2"


def test_offsets_for_times_asks_again_while_the_leader_is_indexing(view):
    """A leader still indexing answers a part TIMEOUT (retriable); the view asks again.
    Answers by time carry the record's timestamp (a sixth element); -1 means none."""
    def indexing(msg):
        return ListOffsetsResponse([OffsetsPart(t, p, int(ErrorCode.TIMEOUT), -1, None, -1) for t, p, _ in msg.parts])

    def found(msg):
        return ListOffsetsResponse([OffsetsPart(t, p, 0, 3, None, 1500) if p == 0 else OffsetsPart(t, p, 0, -1, None, -1)
                                    for t, p, _ in msg.parts])
    view.transport.metadata = MetadataResponse(0, [], [topic("t", ["a:1", "a:1"])])
    view.transport.answers = {"a:1": [indexing, found]}
    got = view.offsets_for_times({TopicPartition("t", 0): 1000, TopicPartition("t", 1): 99}, timeout_ms=1000)
    assert got == {TopicPartition("t", 0): (3, 1500), TopicPartition("t", 1): None}
    assert view.transport.calls == [("a:1", [("t", 0, 1000), ("t", 1, 99)])] * 2
    with pytest.raises(ValueError):
        view.offsets_for_times({TopicPartition("t", 0): -5}, timeout_ms=1000)
