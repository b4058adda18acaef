"""The node side of the elastic mesh, on a real in-process node (LMDB, no peers): the admin
handlers' checks, the registers they write, and the leader's own config publishing."""
from __future__ import annotations

import socket

import pytest

from mesh.cluster import keys
from mesh.node.ops.elastic import ElasticSettings
from mesh.node.loop import Node, NodeConfig
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node(tmp_path):
    n = Node(NodeConfig(node_id="n1", bind=f"127.0.0.1:{_port()}", data_dir=str(tmp_path), sync=False))
    answers = []
    n.dispatch.reply = lambda ident, rid, msg, payload=None: answers.append(msg)
    n.answers = answers
    yield n
    n.close()


def call(node, req):
    handler = node.handlers.handler_for(req)
    handler(b"c", 1, req, None)
    return node.answers[-1]


def test_decommission_writes_the_broker_register_and_checks_the_broker(node):
    assert call(node, m.BrokerStateRequest("n1", m.BROKER_DRAINING)).error == 0
    key = keys.broker_key("n1")
    assert node.gossip.cluster_items(key)[key] == {"state": "draining"}
    for bad, why in ((m.BrokerStateRequest("n9", m.BROKER_DRAINING), "no broker"),
                     (m.BrokerStateRequest("n1", "gone"), "a broker state is")):
        with pytest.raises(MeshError, match=why) as exc:
            call(node, bad)
        assert exc.value.code == ErrorCode.INVALID_REQUEST
    assert call(node, m.BrokerStateRequest("n1", m.BROKER_ACTIVE)).error == 0
    assert node.gossip.cluster_items(key)[key] == {"state": "active"}


def test_reassign_checks_then_writes_and_cancels(node):
    call(node, m.CreateTopicRequest("t", 2, 1))
    t = node.catalog.topics["t"]
    key = keys.reassign_key("t", t.uuid, 1)
    assert call(node, m.ReassignRequest("t", 1, ["n1"])).error == 0
    assert node.gossip.cluster_items(key)[key] == {"replicas": ["n1"]}
    for bad, code in ((m.ReassignRequest("t", 1, ["n1", "n1"]), ErrorCode.INVALID_REQUEST),
                      (m.ReassignRequest("t", 1, ["n7"]), ErrorCode.INVALID_REQUEST),
                      (m.ReassignRequest("t", 5, ["n1"]), ErrorCode.UNKNOWN_PARTITION),
                      (m.ReassignRequest("nope", 0, ["n1"]), ErrorCode.UNKNOWN_TOPIC)):
        with pytest.raises(MeshError) as exc:
            call(node, bad)
        assert exc.value.code == code, bad
    call(node, m.BrokerStateRequest("n1", m.BROKER_DRAINING))
    with pytest.raises(MeshError, match="decommissioned"):
        call(node, m.ReassignRequest("t", 0, ["n1"]))
    assert call(node, m.ReassignRequest("t", 1, [])).error == 0
    assert key not in node.gossip.cluster_items(key)


def test_the_leader_publishes_its_config_and_metadata_shows_state_and_learners(node):
    call(node, m.CreateTopicRequest("t", 1, 1))
    for _ in range(40):                 # a single broker elects itself; one more turn publishes
        node._after_turn()
        if node.replicas.leaders():
            break
    (pid,) = node.replicas.leaders()
    node.elastic.settings = ElasticSettings(enabled=False)   # no balancing: it would drop the learner
    node.replicas.propose_config(pid, ("n1",), ("n2",))      # a learner (its broker need not exist)
    for _ in range(3):
        node._after_turn()
    t = node.catalog.topics["t"]
    key = keys.pconf_key("t", t.uuid, 0)
    reg = node.gossip.cluster_items(key)[key]
    assert reg["v"] == 1 and reg["voters"] == ["n1"] and reg["learners"] == ["n2"] and reg["committed"]
    node.elastic._next_ms = 0
    node._after_turn()                  # the next round publishes this broker's load
    md = call(node, m.MetadataRequest(["t"]))
    me = next(b for b in md.brokers if b["id"] == "n1")
    assert me["state"] == "active" and me["replicas"] == 1 and me["leaders"] == 1
    assert md.topics[0]["partitions"][0]["learners"] == ["n2"]
    (move,) = call(node, m.ListMovesRequest()).moves
    assert move["partition"] == 0 and move["adding"] == ["n2"] and move["leader"] == "n1"
    assert call(node, m.ListMovesRequest(["t"] + [f"x{i}" for i in range(50_000)])).moves == [move]
    assert call(node, m.ListMovesRequest(["other"])).moves == []


def test_a_costly_balancing_round_spaces_out_the_next_ones(node, monkeypatch):
    """At 10,000 partitions a round took 150-430 ms of a busy broker, once a second: the next
    round waits ten times the last one's cost (and at least the interval)."""
    e = node.elastic
    clock = [1_000_000]
    e.wall_ms = lambda: clock[0]
    cost = [300]
    rounds = []

    def costly(now_ms):
        rounds.append(now_ms)
        clock[0] += cost[0]

    monkeypatch.setattr(e, "_balance", costly)
    e._next_ms = 0
    start = clock[0]
    e.tick(start)
    for now in range(start + 1_000, start + 3_000, 250):
        e.tick(now)
    assert rounds == [start]                     # not after the interval (1 s): after 10 x 300 ms
    cost[0] = 5                                  # cheap again: back to the interval
    e.tick(start + 3_000)
    assert rounds == [start, start + 3_000]
    e.tick(start + 3_999)
    e.tick(start + 4_000)
    assert rounds == [start, start + 3_000, start + 4_000]


def test_a_metadata_request_answers_each_topic_once_and_names_a_bounded_number(node):
    """A topic named 200 times was built 200 times (2.3 s of the loop at 1,000 partitions; a
    600 KB request naming a 10,000-partition topic 100,000 times would exhaust memory)."""
    call(node, m.CreateTopicRequest("t", 3, 1))
    md = call(node, m.MetadataRequest(["t"] * 1_000 + ["nope", "t"]))
    assert [t["name"] for t in md.topics] == ["t", "nope"] and len(md.topics[0]["partitions"]) == 3
    with pytest.raises(MeshError, match="at most 10000 topics") as exc:
        call(node, m.MetadataRequest([f"x{i}" for i in range(10_001)]))
    assert exc.value.code == ErrorCode.INVALID_REQUEST


def test_the_gossip_snapshot_is_staged_at_most_once_per_ten_times_its_cost(node, monkeypatch):
    """The snapshot is the whole gossip state packed again (8.7 MB and ~65 ms with 100,000
    committed offsets in gossip), and it was staged on every turn gossip moved."""
    from types import SimpleNamespace
    clock = [1_000]
    node.clock = SimpleNamespace(now_ms=lambda: clock[0], wall_ms=node.clock.wall_ms)
    staged = []

    def costly():
        staged.append(clock[0])
        clock[0] += 50                           # each costs 50 ms: the next not before 500 ms later

    monkeypatch.setattr(node, "_persist_snapshot", costly)
    monkeypatch.setattr(node.store, "has_writes", lambda: True)   # turns that sync anyway
    for i in range(10):                          # gossip moves on every turn
        node.gossip.set_local(keys.LOAD_KEY, {"bytes": i, "replicas": 0, "leaders": 0})
        node._after_turn()
        clock[0] += 10
    assert staged == [1_000]
    clock[0] = 1_500
    node._after_turn()                           # gossip still; the change waiting is staged now
    node._after_turn()
    assert staged == [1_000, 1_500]


def test_the_gossip_snapshot_rides_a_turn_that_syncs_anyway_or_waits_a_second(node, monkeypatch):
    """Staged alone, the snapshot cost a sync of its own right after each commit's, on every
    broker that gossips the commit's offsets, and the quorum's answers waited behind it."""
    from types import SimpleNamespace
    clock = [1_000]
    node.clock = SimpleNamespace(now_ms=lambda: clock[0], wall_ms=node.clock.wall_ms)
    staged, writes = [], [False]
    monkeypatch.setattr(node, "_persist_snapshot", lambda: staged.append(clock[0]))
    monkeypatch.setattr(node.store, "has_writes", lambda: writes[0])
    node.gossip.set_local(keys.LOAD_KEY, {"bytes": 1, "replicas": 0, "leaders": 0})
    for _ in range(5):                           # turns with nothing else to write: no sync for it
        node._after_turn()
        clock[0] += 100
    assert staged == []
    writes[0] = True                             # a turn that syncs anyway: it rides along
    node._after_turn()
    assert staged == [1_500]
    writes[0] = False
    node.gossip.set_local(keys.LOAD_KEY, {"bytes": 2, "replicas": 0, "leaders": 0})
    clock[0] = 2_000
    node._after_turn()                           # due from now; alone it waits at most a second
    clock[0] = 2_999
    node._after_turn()
    assert staged == [1_500]
    clock[0] = 3_000
    node._after_turn()
    assert staged == [1_500, 3_000]


def test_list_offsets_names_earliest_or_latest_and_well_formed_parts(node):
    """Any mode but earliest meant latest, and a malformed part was logged as a bug (a spec
    >= 0 is a timestamp: ListOffsets by time)."""
    call(node, m.CreateTopicRequest("t", 1, 1))
    for parts in ([["t", 0, -7]], [["t", 0]], [["t", 0, -1, "x"]], "t"):
        with pytest.raises(MeshError, match="must be") as exc:
            call(node, m.ListOffsetsRequest(parts))
        assert exc.value.code == ErrorCode.INVALID_REQUEST, parts
    (row,) = call(node, m.ListOffsetsRequest([["t", 0, m.EARLIEST]])).parts
    assert (row.topic, row.partition, row.error) == ("t", 0, 0)


def test_a_topic_owner_still_learning_the_cluster_refuses_topic_changes_with_a_retriable_error(node):
    """Its view may lack the topic: a create there would replace it (and drop its records)."""
    node._relearning = True
    with pytest.raises(MeshError) as info:
        call(node, m.CreateTopicRequest("t", 1, 1))
    assert info.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and "still learning" in info.value.message
    node._relearning = False
    assert call(node, m.CreateTopicRequest("t", 1, 1)).error == 0


def test_lost_state_raises_the_generation_at_most_three_times_a_minute(node, caplog):
    """Two live processes with one --id took each other's rows for proof of lost state and
    pushed the generation up about three times a second, without end."""
    start = node.generation
    for _ in range(6):
        node._lost_identity(node.generation + 1)
    assert node.generation == start + 2 * 3   # each bump goes one past the conflict; then it waits
    assert "another live broker may be running with --id n1" in caplog.text
