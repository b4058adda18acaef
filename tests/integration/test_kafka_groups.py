"""Classic Kafka consumer groups on real brokers (``mesh.kafka.groups``), driven through the
handlers with kio request dataclasses, as the Kafka listener calls them: members of one
group get disjoint shares of a topic, a member that leaves (or stops heartbeating) is
replaced, commits round-trip with their metadata and share one namespace with the native
client and ``mesh group describe``.

The brokers run with a 3 s maximum session timeout (also their takeover grace).
"""
from __future__ import annotations

import datetime
import os
import time

import pytest
from kio.schema.errors import ErrorCode as K
from kio.static.primitive import i32Timedelta

from mesh.client import Admin, Consumer, Producer
from mesh.client.group_admin import GroupAdmin
from mesh.kafka.context import KafkaBroker, RequestContext
from mesh.kafka.group_codec import decode_assignment, encode_subscription
from mesh.kafka.groups import ClassicGroups
from mesh.testing.launcher import Cluster, wait_until

pytestmark = pytest.mark.integration

SESSION_MS = 3000


def _td(ms: int):
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


class FakeCluster:
    """What the listener would know of its cluster: each mesh node's Kafka address."""

    def __init__(self, ids):
        self.brokers = [KafkaBroker(i + 1, "127.0.0.1", 19092 + i, mid) for i, mid in enumerate(ids)]

    def kafka_brokers(self):
        return list(self.brokers)

    def kafka_broker_of(self, mesh_id):
        return next((b for b in self.brokers if b.mesh_id == mesh_id), None)

    def self_broker(self):
        return self.brokers[0]


class Allow:
    def __init__(self, deny=()):
        self.deny = set(deny)

    def allowed(self, principal, operation, resource_type, name):
        return (resource_type, name) not in self.deny


def ctx(api_key, version, authorizer=None, cluster=None):
    return RequestContext(api_key, version, 1, "test-client", None, "127.0.0.1",
                          cluster or FakeCluster(["n1", "n2", "n3"]), authorizer or Allow())


def req(api: str, version: int, name: str, **kw):
    import importlib
    mod = importlib.import_module(f"kio.schema.{api}.v{version}.request")
    return getattr(mod, name)(**kw)


class ClassicMember:
    """The client side of the classic protocol, as an eager consumer runs it: join (v7,
    MEMBER_ID_REQUIRED first), sync, heartbeat; rejoin on REBALANCE_IN_PROGRESS."""

    def __init__(self, groups: ClassicGroups, group: str, topics, protocol="range", session_ms=SESSION_MS,
                 cooperative=False):
        self.g, self.group, self.topics, self.protocol = groups, group, list(topics), protocol
        self.session_ms, self.cooperative = session_ms, cooperative
        self.member_id, self.generation, self.assignment = "", -1, frozenset()
        self.rejoins = 0

    def _join_request(self):
        from kio.schema.join_group.v7.request import JoinGroupRequestProtocol
        owned = self.assignment if self.cooperative else ()
        meta = encode_subscription(self.topics, owned, version=1)
        return req("join_group", 7, "JoinGroupRequest", group_id=self.group, session_timeout=_td(self.session_ms),
                   rebalance_timeout=_td(30_000), member_id=self.member_id, group_instance_id=None,
                   protocol_type="consumer",
                   protocols=(JoinGroupRequestProtocol(name=self.protocol, metadata=meta),))

    def join(self):
        resp = self.g.join_group(ctx(11, 7), self._join_request())
        if resp.error_code == K.member_id_required:
            self.member_id = resp.member_id
            resp = self.g.join_group(ctx(11, 7), self._join_request())
        assert resp.error_code == K.none, resp
        assert resp.leader == "" and resp.members == ()
        assert resp.protocol_name == self.protocol
        self.generation = resp.generation_id
        sync = self.g.sync_group(ctx(14, 5), req(
            "sync_group", 5, "SyncGroupRequest", group_id=self.group, generation_id=self.generation,
            member_id=self.member_id, group_instance_id=None, protocol_type="consumer",
            protocol_name=self.protocol, assignments=()))
        assert sync.error_code == K.none, sync
        self.assignment = decode_assignment(sync.assignment)
        return self

    def beat(self) -> K:
        resp = self.g.heartbeat(ctx(12, 4), req("heartbeat", 4, "HeartbeatRequest", group_id=self.group,
                                                 generation_id=self.generation, member_id=self.member_id,
                                                 group_instance_id=None))
        if resp.error_code == K.rebalance_in_progress:
            self.rejoins += 1
            self.join()
        return resp.error_code

    def leave(self):
        from kio.schema.leave_group.v4.request import MemberIdentity
        resp = self.g.leave_group(ctx(13, 4), req("leave_group", 4, "LeaveGroupRequest", group_id=self.group,
                                                   members=(MemberIdentity(member_id=self.member_id,
                                                                           group_instance_id=None),)))
        assert resp.error_code == K.none and resp.members[0].error_code == K.none, resp

    def commit(self, offsets: dict, version=8, generation=None):
        from importlib import import_module
        mod = import_module(f"kio.schema.offset_commit.v{version}.request")
        topics = {}
        for (t, p), (off, meta) in offsets.items():
            part = dict(partition_index=p, committed_offset=off, committed_metadata=meta)
            if version >= 6:
                part["committed_leader_epoch"] = -1
            topics.setdefault(t, []).append(mod.OffsetCommitRequestPartition(**part))
        kw = dict(group_id=self.group, member_id=self.member_id,
                  generation_id_or_member_epoch=self.generation if generation is None else generation,
                  topics=tuple(mod.OffsetCommitRequestTopic(name=t, partitions=tuple(ps)) for t, ps in topics.items()))
        if version >= 7:
            kw["group_instance_id"] = None
        if version < 5:
            kw["retention_time"] = datetime.timedelta(milliseconds=-1)
        resp = self.g.offset_commit(ctx(8, version), mod.OffsetCommitRequest(**kw))
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch_offsets(groups, group, topic, partitions, version=8):
    if version >= 8:
        from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
        r = req("offset_fetch", 8, "OffsetFetchRequest", require_stable=False, groups=(OffsetFetchRequestGroup(
            group_id=group, topics=(OffsetFetchRequestTopics(name=topic, partition_indexes=tuple(partitions)),)),))
        resp = groups.offset_fetch(ctx(9, 8), r)
        (g,) = resp.groups
        assert g.error_code == K.none
        topics = g.topics
    else:
        from kio.schema.offset_fetch.v1.request import OffsetFetchRequestTopic
        r = req("offset_fetch", 1, "OffsetFetchRequest", group_id=group,
                topics=(OffsetFetchRequestTopic(name=topic, partition_indexes=tuple(partitions)),))
        topics = groups.offset_fetch(ctx(9, 1), r).topics
    return {(t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
            for t in topics for p in t.partitions}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    old = os.environ.get("MESH_GROUP_MAX_SESSION_MS")
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(SESSION_MS)
    try:
        c = Cluster(tmp_path_factory.mktemp("kafka-groups"), 3).start()
    finally:
        if old is None:
            del os.environ["MESH_GROUP_MAX_SESSION_MS"]
        else:
            os.environ["MESH_GROUP_MAX_SESSION_MS"] = old
    yield c
    for b in c.brokers:
        b.kill()


@pytest.fixture
def groups(cluster):
    g = ClassicGroups(None, cluster.bootstrap, native_session_ms=SESSION_MS)
    yield g
    g.close()


def make_topic(cluster, name, partitions):
    from mesh.wire.errors import ErrorCode, MeshError
    with Admin(cluster.bootstrap) as a:
        try:
            a.create_topic(name, partitions, replication_factor=3)
        except MeshError as exc:
            if exc.code != ErrorCode.TOPIC_EXISTS:
                raise
        wait_until(lambda: len(a.metadata([name]).topics[0].get("partitions", [])) == partitions, 20, "topic")


def beat_until(members, cond, timeout_s=40, what="condition"):
    def step():
        for m in members:
            m.beat()
        for i, m in enumerate(members):   # no partition is ever given to two members at once
            for other in members[i + 1:]:
                assert not (m.assignment & other.assignment), (m.assignment, other.assignment)
        return cond()
    wait_until(step, timeout_s, what, interval_s=0.1)


def test_two_members_share_then_one_takes_everything(cluster, groups):
    make_topic(cluster, "kg-share", 6)
    every = {("kg-share", p) for p in range(6)}
    a = ClassicMember(groups, "kg1", ["kg-share"]).join()
    beat_until([a], lambda: a.assignment == every, what="the only member to get all 6 partitions")
    b = ClassicMember(groups, "kg1", ["kg-share"]).join()
    beat_until([a, b], lambda: a.assignment and b.assignment and not (a.assignment & b.assignment)
               and a.assignment | b.assignment == every, what="two disjoint shares")
    assert len(a.assignment) == len(b.assignment) == 3     # range over 6 partitions
    assert a.rejoins >= 1                                  # told to give half up
    # the mesh sees the same group: two members, one namespace
    with GroupAdmin(cluster.bootstrap, request_timeout_ms=2000) as ga:
        d = ga.describe("kg1")
    assert len(d["members"]) == 2 and d["assignor"] == "range"
    b.leave()
    beat_until([a], lambda: a.assignment == every, what="the remaining member to get everything")


def test_a_member_that_stops_heartbeating_is_replaced(cluster, groups):
    make_topic(cluster, "kg-quiet", 4)
    every = {("kg-quiet", p) for p in range(4)}
    a = ClassicMember(groups, "kg2", ["kg-quiet"], session_ms=2000).join()
    b = ClassicMember(groups, "kg2", ["kg-quiet"], session_ms=2000).join()
    beat_until([a, b], lambda: a.assignment | b.assignment == every and a.assignment and b.assignment,
               what="two shares")
    started = time.monotonic()
    beat_until([a], lambda: a.assignment == every, what="the survivor to take over after b's session timeout")
    assert time.monotonic() - started >= 1.5     # not before b's Kafka session (2 s) ended
    assert b.beat() == K.unknown_member_id


def test_commit_fetch_roundtrip_and_one_namespace(cluster, groups):
    make_topic(cluster, "kg-off", 2)
    with Producer(cluster.bootstrap) as p:
        for i in range(10):
            p.send("kg-off", b"%d" % i, partition=i % 2)
        p.flush()
    a = ClassicMember(groups, "kg3", ["kg-off"]).join()
    beat_until([a], lambda: len(a.assignment) == 2, what="both partitions")
    errors = a.commit({("kg-off", 0): (3, "meta-zero"), ("kg-off", 1): (5, "")})
    assert set(errors.values()) == {K.none}, errors
    for version in (8, 1):
        got = fetch_offsets(groups, "kg3", "kg-off", [0, 1], version)
        assert got == {("kg-off", 0): (3, "meta-zero", K.none), ("kg-off", 1): (5, "", K.none)}, got
    # a stale generation and an unknown member are refused, as Kafka does
    assert set(a.commit({("kg-off", 0): (4, "")}, generation=a.generation + 7).values()) == {K.illegal_generation}
    # older OffsetCommit versions round-trip too
    assert set(a.commit({("kg-off", 0): (4, "v2")}, version=2).values()) == {K.none}
    assert fetch_offsets(groups, "kg3", "kg-off", [0])[("kg-off", 0)] == (4, "v2", K.none)
    with GroupAdmin(cluster.bootstrap, request_timeout_ms=2000) as ga:   # `mesh group describe`
        assert {(t, p): (o, m) for t, p, o, m in ga.describe("kg3")["offsets"]} == {
            ("kg-off", 0): (4, "v2"), ("kg-off", 1): (5, "")}
    a.leave()
    # the reverse: a native member commits; the Kafka side reads it back
    c = Consumer(bootstrap=cluster.bootstrap, group_id="kg3", auto_offset_reset="earliest",
                 session_timeout_ms=SESSION_MS, enable_auto_commit=False)
    c.subscribe(["kg-off"])
    wait_until(lambda: c.poll(50) is not None and len(c.assignment()) == 2, 30, "the native member's assignment")
    from mesh.client.cluster import TopicPartition
    c.commit({TopicPartition("kg-off", 1): (9, "native")})
    c.close()
    assert fetch_offsets(groups, "kg3", "kg-off", [1])[("kg-off", 1)] == (9, "native", K.none)


def test_simple_commit_and_fetch_everything(cluster, groups):
    make_topic(cluster, "kg-simple", 3)
    solo = ClassicMember(groups, "kg4", ["kg-simple"])
    errors = solo.commit({("kg-simple", 2): (7, "assign-mode")}, generation=-1)
    assert set(errors.values()) == {K.none}, errors
    r = req("offset_fetch", 7, "OffsetFetchRequest", group_id="kg4", topics=None, require_stable=False)
    resp = groups.offset_fetch(ctx(9, 7), r)
    assert resp.error_code == K.none
    assert [(t.name, p.partition_index, p.committed_offset, p.metadata) for t in resp.topics for p in t.partitions] \
        == [("kg-simple", 2, 7, "assign-mode")]
    # a principal without READ on the topic is refused per partition; without READ on the group, everything
    deny_topic = groups.offset_commit(ctx(8, 8, Allow({("TOPIC", "kg-simple")})), _commit_req("kg4", "kg-simple"))
    assert deny_topic.topics[0].partitions[0].error_code == K.topic_authorization_failed
    deny_group = groups.offset_commit(ctx(8, 8, Allow({("GROUP", "kg4")})), _commit_req("kg4", "kg-simple"))
    assert deny_group.topics[0].partitions[0].error_code == K.group_authorization_failed
    assert fetch_offsets(groups, "kg4", "kg-simple", [2])[("kg-simple", 2)] == (7, "assign-mode", K.none)


def _commit_req(group, topic):
    from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic
    return req("offset_commit", 8, "OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=-1,
               member_id="", group_instance_id=None, topics=(OffsetCommitRequestTopic(name=topic, partitions=(
                   OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                                                committed_metadata=""),)),))


def test_find_list_describe(cluster, groups):
    make_topic(cluster, "kg-desc", 2)
    a = ClassicMember(groups, "kg5", ["kg-desc"], protocol="roundrobin").join()
    resp = groups.find_coordinator(ctx(10, 4), req("find_coordinator", 4, "FindCoordinatorRequest", key_type=0,
                                                    coordinator_keys=("kg5",)))
    (coord,) = resp.coordinators
    from mesh.cluster.ownership import coordinator_for
    assert coord.error_code == K.none
    assert coord.node_id == int(coordinator_for("kg5", ["n1", "n2", "n3"])[1:])
    old = groups.find_coordinator(ctx(10, 0), req("find_coordinator", 0, "FindCoordinatorRequest", key="kg5"))
    assert (old.error_code, old.node_id) == (K.none, coord.node_id)
    # a listener that knows no other broker's Kafka address yet does not name itself (that
    # split kafkajs members over two listeners: it asks again on every rejoin)
    alone = FakeCluster(["n1", "n2", "n3"])
    alone.brokers = [b for b in alone.brokers if b.node_id != coord.node_id][:1]
    blind = groups.find_coordinator(ctx(10, 0, cluster=alone), req("find_coordinator", 0, "FindCoordinatorRequest",
                                                                   key="kg5"))
    assert blind.error_code == K.coordinator_not_available
    learning = FakeCluster(["n1", "n2", "n3"])
    everyone, learning.brokers = learning.brokers, learning.brokers[:0] + [
        b for b in learning.brokers if b.node_id != coord.node_id][:1]
    learning.refresh = lambda: setattr(learning, "brokers", everyone)   # a listener's cache, refreshed on demand
    found = groups.find_coordinator(ctx(10, 0, cluster=learning), req("find_coordinator", 0,
                                                                      "FindCoordinatorRequest", key="kg5"))
    assert (found.error_code, found.node_id) == (K.none, coord.node_id)
    d = groups.describe_groups(ctx(15, 5), req("describe_groups", 5, "DescribeGroupsRequest", groups=("kg5",),
                                                include_authorized_operations=False))
    (g,) = d.groups
    assert g.error_code == K.none and g.protocol_type == "consumer" and g.protocol_data == "roundrobin"
    assert [m.member_id for m in g.members] == [a.member_id]
    # a listener lists the groups its own node coordinates
    own = cluster.brokers[coord.node_id - 1].address
    local = ClassicGroups(None, [own] + [b.address for b in cluster.brokers if b.address != own])
    try:
        listed = local.list_groups(ctx(16, 4, cluster=_cluster_as(coord.node_id)),
                                   req("list_groups", 4, "ListGroupsRequest", states_filter=()))
        assert listed.error_code == K.none
        assert "kg5" in [x.group_id for x in listed.groups]
        other = groups.list_groups(ctx(16, 0, cluster=_cluster_as(coord.node_id % 3 + 1)),
                                   req("list_groups", 0, "ListGroupsRequest"))
        assert "kg5" not in [x.group_id for x in other.groups]
    finally:
        local.close()
    a.leave()


def _cluster_as(node_id: int) -> FakeCluster:
    c = FakeCluster(["n1", "n2", "n3"])
    c.brokers = [b for b in c.brokers if b.node_id == node_id] + [b for b in c.brokers if b.node_id != node_id]
    return c


def test_cooperative_members_never_hold_one_partition_twice(cluster, groups):
    make_topic(cluster, "kg-coop", 4)
    every = {("kg-coop", p) for p in range(4)}
    a = ClassicMember(groups, "kg6", ["kg-coop"], protocol="cooperative-sticky", cooperative=True).join()
    beat_until([a], lambda: a.assignment == every, what="all 4 partitions")
    first = a.assignment
    b = ClassicMember(groups, "kg6", ["kg-coop"], protocol="cooperative-sticky", cooperative=True).join()

    def settled():
        assert not (a.assignment & b.assignment), (a.assignment, b.assignment)   # at every step
        return a.assignment | b.assignment == every and len(a.assignment) == len(b.assignment) == 2
    beat_until([a, b], settled, what="two shares of two")
    assert a.assignment <= first
    a.leave()
    b.leave()


def test_join_edge_cases(cluster, groups):
    from kio.schema.join_group.v0.request import JoinGroupRequestProtocol as P0
    from kio.schema.join_group.v7.request import JoinGroupRequestProtocol as P7
    make_topic(cluster, "kg-edge", 1)
    meta = encode_subscription(["kg-edge"], version=0)

    def join(version, member_id="", protocols=None, protocol_type="consumer", session_ms=SESSION_MS):
        kw = dict(group_id="kg7", session_timeout=_td(session_ms), member_id=member_id,
                  protocol_type=protocol_type,
                  protocols=protocols or ((P0 if version == 0 else P7)(name="range", metadata=meta),))
        if version >= 1:
            kw["rebalance_timeout"] = _td(10_000)
        if version >= 5:
            kw["group_instance_id"] = None
        return groups.join_group(ctx(11, version), req("join_group", version, "JoinGroupRequest", **kw))
    v0 = join(0)                      # before v4 a member id is made up at once
    assert v0.error_code == K.none and v0.member_id and v0.leader == ""
    made_up = join(7, member_id="made-up")      # an id this listener does not know: a new member (Kafka 4)
    assert (made_up.error_code, made_up.member_id) == (K.none, "made-up")
    custom = join(0, protocols=(P0(name="custom", metadata=meta),))   # served by the default assignor
    assert (custom.error_code, custom.protocol_name) == (K.none, "custom")
    assert join(7, protocols=(P7(name="range", metadata=b"\x00\x00\x7f"),)).error_code == K.inconsistent_group_protocol
    assert join(7, protocol_type="connect").error_code == K.inconsistent_group_protocol
    assert join(7, session_ms=10).error_code == K.invalid_session_timeout
    other = groups.heartbeat(ctx(12, 0), req("heartbeat", 0, "HeartbeatRequest", group_id="kg-other",
                                              generation_id=v0.generation_id, member_id=v0.member_id))
    assert other.error_code == K.unknown_member_id      # member ids belong to their group
    stale = groups.heartbeat(ctx(12, 0), req("heartbeat", 0, "HeartbeatRequest", group_id="kg7",
                                              generation_id=v0.generation_id + 3, member_id=v0.member_id))
    assert stale.error_code == K.illegal_generation
    denied = groups.heartbeat(ctx(12, 0, Allow({("GROUP", "kg7")})), req(
        "heartbeat", 0, "HeartbeatRequest", group_id="kg7", generation_id=v0.generation_id, member_id=v0.member_id))
    assert denied.error_code == K.group_authorization_failed
    left = groups.leave_group(ctx(13, 0), req("leave_group", 0, "LeaveGroupRequest", group_id="kg7",
                                               member_id=v0.member_id))
    assert left.error_code == K.none
    assert groups.leave_group(ctx(13, 0), req("leave_group", 0, "LeaveGroupRequest", group_id="kg7",
                                               member_id=v0.member_id)).error_code == K.unknown_member_id


def test_native_sessions_fit_the_brokers_bounds(cluster):
    """A listener that asks for 10 s native sessions from brokers that allow 3 s learns
    their bound from the refusal and joins within it (before: INVALID_SESSION_TIMEOUT for
    every Kafka client of such a cluster)."""
    make_topic(cluster, "kg-bounds", 1)
    wide = ClassicGroups(None, cluster.bootstrap)    # native_session_ms: 10 s
    try:
        a = ClassicMember(wide, "kg8", ["kg-bounds"], session_ms=45_000).join()   # librdkafka's default
        beat_until([a], lambda: a.assignment == {("kg-bounds", 0)}, what="the partition")
        with GroupAdmin(cluster.bootstrap, request_timeout_ms=2000) as ga:
            (m,) = ga.describe("kg8")["members"]
        assert m["session_timeout_ms"] == SESSION_MS
        b = ClassicMember(wide, "kg8", ["kg-bounds"]).join()   # later sessions start within the bound
        assert wide.link.session_cap_ms == SESSION_MS
        b.leave()
        a.leave()
    finally:
        wide.close()


def test_members_rejoin_when_the_coordinator_dies(tmp_path):
    """SIGKILL of the group's coordinator: the native sessions end (the new coordinator does
    not know them), the classic members are told UNKNOWN_MEMBER_ID, rejoin under new ids and
    share the partitions again; a commit after that goes to the new coordinator."""
    from mesh.cluster.ownership import coordinator_for
    old = os.environ.get("MESH_GROUP_MAX_SESSION_MS")
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(SESSION_MS)
    try:
        c = Cluster(tmp_path, 3).start()
    finally:
        if old is None:
            del os.environ["MESH_GROUP_MAX_SESSION_MS"]
        else:
            os.environ["MESH_GROUP_MAX_SESSION_MS"] = old
    try:
        make_topic(c, "kg-fail", 4)
        every = {("kg-fail", p) for p in range(4)}
        doomed = next(b for b in c.brokers if b.node_id == coordinator_for("kg9", ["n1", "n2", "n3"]))
        g = ClassicGroups(None, [b.address for b in c.brokers if b is not doomed], native_session_ms=SESSION_MS)
        try:
            a, b = (ClassicMember(g, "kg9", ["kg-fail"]).join() for _ in range(2))
            beat_until([a, b], lambda: disjoint_cover(a, b, every), what="two shares")
            ids = {a.member_id, b.member_id}
            doomed.kill()

            def step():
                for m in (a, b):
                    if m.beat() == K.unknown_member_id:
                        m.member_id = ""
                        m.assignment = frozenset()
                        m.join()
                return disjoint_cover(a, b, every) and not ids & {a.member_id, b.member_id}
            wait_until(step, 60, "the members to rejoin at the new coordinator", interval_s=0.1)
            tp = sorted(a.assignment)[0]
            assert set(a.commit({tp: (1, "after")}).values()) == {K.none}
            assert fetch_offsets(g, "kg9", "kg-fail", [tp[1]])[tp] == (1, "after", K.none)
        finally:
            g.close()
    finally:
        c.stop()


def disjoint_cover(a, b, every) -> bool:
    return bool(a.assignment) and bool(b.assignment) and not (a.assignment & b.assignment) \
        and a.assignment | b.assignment == every


def _request(api: str, version: int, cls: str, **values):
    """A request of any version from the values its schema has (nested ones built the same)."""
    import importlib
    from mesh.kafka.group_codec import build
    mod = importlib.import_module(f"kio.schema.{api}.v{version}.request")
    return build(getattr(mod, cls), **values), mod


def _encodes(api_key: int, version: int, response) -> None:
    from mesh.kafka.codec import encode_response, response_class
    assert type(response) is response_class(api_key, version)
    encode_response(api_key, version, 7, response)   # what the listener sends: every field encodable


@pytest.mark.parametrize("join_version", range(8))
def test_every_version_of_the_member_apis(cluster, groups, join_version):
    """Join (0-7), then Sync, Heartbeat and Leave of the matching versions: each answer is of
    its request's version and encodes."""
    from mesh.kafka.group_codec import build
    make_topic(cluster, "kg-all", 1)
    group, meta = f"kg-all-{join_version}", encode_subscription(["kg-all"], version=min(join_version, 3))
    req0, mod = _request("join_group", join_version, "JoinGroupRequest")
    proto = build(mod.JoinGroupRequestProtocol, name="range", metadata=meta)

    def join(member_id):
        r, _ = _request("join_group", join_version, "JoinGroupRequest", group_id=group, session_timeout=_td(SESSION_MS),
                        rebalance_timeout=_td(10_000), member_id=member_id, group_instance_id=None,
                        protocol_type="consumer", protocols=(proto,))
        resp = groups.join_group(ctx(11, join_version), r)
        _encodes(11, join_version, resp)
        return resp
    resp = join("")
    if join_version >= 4:
        assert resp.error_code == K.member_id_required
        resp = join(resp.member_id)
    assert resp.error_code == K.none, resp
    member, generation = resp.member_id, resp.generation_id
    v = min(join_version, 5)
    sync, _ = _request("sync_group", v, "SyncGroupRequest", group_id=group, generation_id=generation, member_id=member,
                       group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=())
    resp = groups.sync_group(ctx(14, v), sync)
    _encodes(14, v, resp)
    assert resp.error_code == K.none
    v = min(join_version, 4)
    beat, _ = _request("heartbeat", v, "HeartbeatRequest", group_id=group, generation_id=generation, member_id=member,
                       group_instance_id=None)
    resp = groups.heartbeat(ctx(12, v), beat)
    _encodes(12, v, resp)
    assert resp.error_code in (K.none, K.rebalance_in_progress)
    leave, mod = _request("leave_group", v, "LeaveGroupRequest", group_id=group, member_id=member)
    if v >= 3:
        leave, _ = _request("leave_group", v, "LeaveGroupRequest", group_id=group,
                            members=(build(mod.MemberIdentity, member_id=member, group_instance_id=None),))
    resp = groups.leave_group(ctx(13, v), leave)
    _encodes(13, v, resp)
    assert resp.error_code == K.none


def test_every_version_of_the_offset_and_listing_apis(cluster, groups):
    from mesh.kafka.group_codec import build
    make_topic(cluster, "kg-every", 1)
    for v in range(2, 9):
        r, mod = _request("offset_commit", v, "OffsetCommitRequest")
        part = build(mod.OffsetCommitRequestPartition, partition_index=0, committed_offset=10 + v,
                     committed_leader_epoch=-1, committed_metadata=f"v{v}")
        r, _ = _request("offset_commit", v, "OffsetCommitRequest", group_id="kg-every", generation_id_or_member_epoch=-1,
                        member_id="", group_instance_id=None, retention_time=datetime.timedelta(milliseconds=-1),
                        topics=(build(mod.OffsetCommitRequestTopic, name="kg-every", partitions=(part,)),))
        resp = groups.offset_commit(ctx(8, v), r)
        _encodes(8, v, resp)
        assert resp.topics[0].partitions[0].error_code == K.none
    for v in range(1, 9):
        if v < 8:
            r, mod = _request("offset_fetch", v, "OffsetFetchRequest")
            r, _ = _request("offset_fetch", v, "OffsetFetchRequest", group_id="kg-every", require_stable=False,
                            topics=(build(mod.OffsetFetchRequestTopic, name="kg-every", partition_indexes=(0,)),))
        else:
            r, mod = _request("offset_fetch", 8, "OffsetFetchRequest")
            r, _ = _request("offset_fetch", 8, "OffsetFetchRequest", require_stable=False, groups=(build(
                mod.OffsetFetchRequestGroup, group_id="kg-every", topics=(build(
                    mod.OffsetFetchRequestTopics, name="kg-every", partition_indexes=(0,)),)),))
        resp = groups.offset_fetch(ctx(9, v), r)
        _encodes(9, v, resp)
        topics = resp.groups[0].topics if v >= 8 else resp.topics
        assert (topics[0].partitions[0].committed_offset, topics[0].partitions[0].metadata) == (18, "v8")
    for v in range(5):
        r, _ = _request("find_coordinator", v, "FindCoordinatorRequest", key="kg-every", key_type=0,
                        coordinator_keys=("kg-every",))
        resp = groups.find_coordinator(ctx(10, v), r)
        _encodes(10, v, resp)
        assert (resp.coordinators[0] if v >= 4 else resp).error_code == K.none
        r, _ = _request("list_groups", v, "ListGroupsRequest", states_filter=())
        resp = groups.list_groups(ctx(16, v), r)
        _encodes(16, v, resp)
        assert resp.error_code == K.none
    for v in range(6):
        r, _ = _request("describe_groups", v, "DescribeGroupsRequest", groups=("kg-every",),
                        include_authorized_operations=False)
        resp = groups.describe_groups(ctx(15, v), r)
        _encodes(15, v, resp)
        assert resp.groups[0].error_code == K.none and resp.groups[0].group_state == "Empty"
