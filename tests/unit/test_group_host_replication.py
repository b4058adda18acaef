"""The group host's offsets replication over the fakes of ``test_group_host``: a commit is
answered only once a majority of its group's replicas synced it; a coordinator that dies
right after answering (its gossip never sent) loses nothing it acknowledged; replicas
check what they are sent; a new coordinator pulls what the replicas hold; a coordinator
whose clock is ahead (its gossip refused) is still believed by its successor."""
from __future__ import annotations

import pytest

from mesh.groups import GroupCommit, GroupFetchOffsets, coordinator_for, ranked_nodes
from mesh.groups.messages import GroupReplicate
from mesh.wire.errors import ErrorCode, MeshError
from tests.unit.test_group_host import CONFIG, Broker, World, join, past_grace

NODES = ["a", "b", "c"]


@pytest.fixture
def world():
    return World()


def cluster(world, nodes=NODES):
    brokers = {n: Broker(world, n) for n in nodes}
    for b in brokers.values():
        b.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    return brokers


def kill(world, brokers, node, gossiped=False):
    """``node`` dies; unless ``gossiped``, nothing of its namespace reached anyone (it was
    killed before its next gossip round); the others learn it is dead."""
    world.down.add(node)
    world.status[node] = "dead"
    if not gossiped:
        world.ns[node] = {}
    for n, b in brokers.items():
        if n != node:
            b.groups.on_cluster_change(world.now_ms)


def offsets(broker, group):
    return {p: o for _, p, o, _ in broker.ask(GroupFetchOffsets(group, None)).offsets}


def test_a_commit_is_answered_once_a_majority_synced_it_not_before(world):
    brokers = cluster(world)
    g = "g1"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    c.replies.clear()
    c.groups.handle(b"client", 7, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 42, ""]]))
    c.data.commit_turn()                 # synced on the coordinator: 1 of 3
    assert c.replies == []
    assert sorted(dest for _, dest, _ in world.wire) == sorted([second, third])
    world.down.add(third)                # one replica never answers: 2 of 3 still do
    world.deliver()
    assert [x.error for x in c.replies] == [0]
    assert brokers[second].store.items("offsets") and not brokers[third].store.items("offsets")
    # the replica holds it as its own: durable, in its view and in its gossip namespace
    assert brokers[second].groups.committed(g)[("t", 0)][0] == 42
    assert brokers[second].gossip.node_items(second, "off/")


def test_the_coordinator_killed_right_after_answering_loses_nothing_it_acknowledged(world):
    """Before: synced on the coordinator alone, answered, then gossiped; killed before its
    gossip round, the successor resumed from the commit before."""
    brokers = cluster(world)
    g = "g2"
    coord, second, _ = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    for offset in (10, 20, 30):
        assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, offset, ""], ["t", 1, offset, ""]])).error == 0
    kill(world, brokers, coord)
    assert coordinator_for(g, [n for n in NODES if n != coord]) == second
    for n, b in brokers.items():
        if n != coord:
            assert offsets(b, g) == {0: 30, 1: 30}, n


def test_without_a_majority_a_commit_is_refused_with_a_retriable_error(world):
    brokers = cluster(world)
    g = "g3"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    world.down.update({second, third})   # alive in gossip, but answering nothing
    c.replies.clear()
    c.groups.handle(b"client", 1, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, ""]]))
    c.data.commit_turn()
    world.deliver()
    assert c.replies == []
    world.now_ms += CONFIG.commit_timeout_ms
    c.groups.tick(world.now_ms)
    assert [x.error for x in c.replies] == [ErrorCode.COORDINATOR_NOT_AVAILABLE]
    assert c.groups.replication.quorum.waiting == 0


def test_a_replica_checks_the_rows_it_is_sent_and_never_lets_an_older_one_overwrite(world):
    brokers = cluster(world)
    b = brokers["b"]
    for bad in ([["g", "t", 0, "x", "", 1]], [["", "t", 0, 1, "", 1]], "junk"):
        with pytest.raises(MeshError):
            b.groups.handle_peer("a", GroupReplicate(1, bad))
    with pytest.raises(MeshError):
        b.groups.handle_peer("a", GroupReplicate("1", []))
    b.data.commit_turn()
    assert b.store.items("offsets") == [] and world.wire == []
    b.groups.handle_peer("a", GroupReplicate(2, [["g", "t", 0, 50, "", 2_000]]))
    b.data.commit_turn()
    b.groups.handle_peer("a", GroupReplicate(3, [["g", "t", 0, 40, "", 1_000]]))   # older, late
    b.data.commit_turn()
    assert [(dest, type(m).__name__, m.seq) for _, dest, m in world.wire] == \
        [("a", "GroupReplicateAck", 2), ("a", "GroupReplicateAck", 3)]
    assert b.groups.committed("g") == {("t", 0): (50, "", 2_000)}
    assert len(b.store.items("offsets")) == 1


def test_a_failed_turn_on_a_replica_answers_nothing(world):
    brokers = cluster(world)
    b = brokers["b"]
    b.data.ok = False
    b.groups.handle_peer("a", GroupReplicate(1, [["g", "t", 0, 50, "", 2_000]]))
    b.data.commit_turn()
    assert world.wire == [] and b.groups.committed("g") == {}


def test_a_successor_that_missed_the_commit_pulls_it_from_the_replica_that_has_it(world):
    nodes = ["a", "b", "c", "d", "e"]
    brokers = cluster(world, nodes)
    g = "g4"
    coord, second, third, *_ = ranked_nodes(g, nodes)
    c = brokers[coord]
    r = join(c, g)
    world.down.add(second)               # the successor misses it: acknowledged by coord + third
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 77, ""]])).error == 0
    assert not brokers[second].groups.committed(g)
    world.down.discard(second)
    world.ns[third] = {}                 # nor did gossip bring it (third's round not due yet)
    kill(world, brokers, coord)
    s = brokers[second]
    assert not s.groups.book.knows(g)
    s.replies.clear()
    s.groups.handle(b"client", 1, GroupFetchOffsets(g, None))   # the first request claims it and pulls
    assert s.replies[-1].error == ErrorCode.COORDINATOR_NOT_AVAILABLE and "loading" in s.replies[-1].message
    world.deliver()
    assert offsets(s, g) == {0: 77}
    assert s.store.items("offsets")      # adopted: durable on the new coordinator


def test_a_coordinator_whose_clock_is_ahead_is_still_believed_by_its_successor(world):
    """Its peers refuse the offsets it gossips (stamps two hours ahead of their clocks), but
    the replicas took the rows: the successor resumes from its last acknowledged commit."""
    brokers = cluster(world)
    g = "g5"
    coord, second, _ = ranked_nodes(g, NODES)
    c = brokers[coord]

    class Ahead:
        def now_ms(self):
            return world.now_ms + 7_200_000

        def wall_ms(self):
            return world.now_ms + 7_200_000
    r = join(c, g)
    c.groups._clock = Ahead()
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 920, ""]])).error == 0
    assert not c.gossip.node_items(coord, "off/")   # its own gossip refused it (validate_entry)
    kill(world, brokers, coord, gossiped=True)
    assert offsets(brokers[second], g) == {0: 920}
    for n, b in brokers.items():   # the replicas hold it (durable), whatever gossip refused
        if n != coord:
            assert b.groups.committed(g)[("t", 0)][0] == 920 and b.store.items("offsets")


def to_replicas(world, brokers):
    """Deliver the messages in flight (to the replicas), not the answers they cause."""
    sent, world.wire = world.wire, []
    for src, dest, msg in sent:
        brokers[dest].groups.handle_peer(src, msg)
        brokers[dest].data.commit_turn()


def test_rows_go_to_the_replicas_before_the_coordinators_own_sync_which_still_counts(world):
    brokers = cluster(world)
    g = "g6"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    c.replies.clear()
    world.events.clear()
    c.groups.handle(b"client", 1, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 8, ""]]))
    c.groups.tick(world.now_ms)          # the turn's steps: the rows leave before its sync
    assert sorted(dest for _, dest, _ in world.wire) == sorted([second, third])
    to_replicas(world, brokers)          # both replicas sync it while the coordinator has not yet
    assert [type(m).__name__ for _, dest, m in world.wire] == ["GroupReplicateAck"] * 2
    c.data.commit_turn()                 # its own sync, before it reads their answers
    assert c.replies == []
    world.deliver()
    assert [x.error for x in c.replies] == [0]
    # a turn rolled back after its rows left: refused (the replicas may still hold it)
    c.replies.clear()
    c.groups.handle(b"client", 2, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 9, ""]]))
    c.groups.tick(world.now_ms)
    to_replicas(world, brokers)
    c.data.ok = False
    c.data.commit_turn()
    assert [x.error for x in c.replies] == [ErrorCode.STORAGE_ERROR]
    assert c.groups.replication.quorum.waiting == 0 and not c.groups.replication._answers


def test_replication_messages_are_peer_only():
    """A client cannot send them: the client path answers only GROUP_* requests."""
    from mesh.groups.messages import GroupOffsetsPull, GroupOffsetsRows, GroupReplicateAck
    w = World()
    b = Broker(w, "a")
    for msg in (GroupReplicate(1, []), GroupReplicateAck(1), GroupOffsetsPull([]), GroupOffsetsRows([])):
        assert b.groups.handles_peer(msg) and not b.groups.handles(msg)
    assert not b.groups.handles_peer(GroupFetchOffsets("g", None))


def test_a_new_coordinator_copies_what_it_took_over_to_its_replicas_before_the_next_failure(world):
    """Acknowledged by the coordinator and the next in line only; the coordinator dies:
    the commit is on one live broker. The successor copies it to its own replicas, so the
    successor's death (a second failure, one at a time) does not lose it either."""
    nodes = ["a", "b", "c", "d", "e"]
    brokers = cluster(world, nodes)
    g = "g7"
    coord, second, third, fourth, _ = ranked_nodes(g, nodes)
    c = brokers[coord]
    r = join(c, g)
    world.down.add(third)
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 1, 55, ""]])).error == 0
    world.down.discard(third)
    kill(world, brokers, coord)
    s = brokers[second]
    s.groups.tick(world.now_ms)
    world.deliver()
    for n in (third, fourth):           # the successor's other replicas now hold it, durably
        assert brokers[n].store.items("offsets"), n
    world.ns[second] = {}
    kill(world, brokers, second)
    assert offsets(brokers[third], g) == {1: 55}


def test_a_pull_is_answered_in_bounded_messages_each_naming_the_groups_it_completes(world, monkeypatch):
    import mesh.node.groups.offset_replication as shell
    from mesh.groups.messages import GroupOffsetsPull
    monkeypatch.setattr(shell, "MAX_ROWS_PER_MESSAGE", 2)
    brokers = cluster(world)
    b = brokers["b"]
    b.groups.handle_peer("a", GroupReplicate(1, [["g1", "t", p, 5, "", 100] for p in range(3)] +
                                            [["g2", "t", 0, 7, "", 100]]))
    b.data.commit_turn()
    world.wire.clear()
    b.groups.handle_peer("a", GroupOffsetsPull(["g2", "g1", "none"]))
    answers = [m for _, dest, m in world.wire]
    assert [(len(m.rows), m.groups) for m in answers] == [(2, []), (2, ["g1", "g2", "none"])]


def test_a_partition_twice_in_one_message_keeps_the_newest(world):
    brokers = cluster(world)
    b = brokers["b"]
    b.groups.handle_peer("a", GroupReplicate(1, [["g", "t", 0, 9, "", 300], ["g", "t", 0, 4, "", 200]]))
    b.data.commit_turn()
    assert b.groups.committed("g") == {("t", 0): (9, "", 300)}
    again = Broker(world, "b2", store=b.store.crash())   # what the store holds is the newest too
    assert again.groups.book.committed("g") == {("t", 0): (9, "", 300)}


def test_after_a_coordinator_whose_clock_was_ahead_every_commit_still_wins(world):
    """Its rows are stamped two hours ahead; its clock is set right (or its successor's is
    right). The next commits were stamped at most 30 s ahead of the clock, so below those
    rows: the replicas kept the older row (newer by stamp) and answered anyway, and after
    the next failure the successor resumed from the two-hour-ahead commit (found by review)."""
    brokers = cluster(world)
    g = "g5b"
    coord, second, _ = ranked_nodes(g, NODES)
    c = brokers[coord]

    class Ahead:
        def now_ms(self):
            return world.now_ms + 7_200_000

        def wall_ms(self):
            return world.now_ms + 7_200_000
    r = join(c, g)
    right = c.groups._clock
    c.groups._clock = Ahead()
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 920, ""]])).error == 0
    c.groups._clock = right                   # its clock is set right
    world.now_ms += 1_000
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 950, ""]])).error == 0
    kill(world, brokers, coord, gossiped=True)
    assert offsets(brokers[second], g) == {0: 950}
    for n, b in brokers.items():
        if n != coord:
            assert b.groups.committed(g)[("t", 0)][0] == 950


def test_a_new_coordinator_loads_until_the_replica_holding_the_commit_answered_however_long(world):
    """The successor missed the commit; the one replica that holds it did not answer its
    pull within the second of "loading" (paused, or the question was dropped): the successor
    then answered the offsets it had, older than an acknowledged commit (found by review)."""
    brokers = cluster(world)
    g = "g4b"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    world.down.add(second)               # the successor misses it: acknowledged by coord + third
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 77, ""]])).error == 0
    world.down.discard(second)
    world.ns[third] = {}                 # nor did gossip bring it
    kill(world, brokers, coord)
    s = brokers[second]
    world.down.add(third)                # paused: the pull is lost
    for _ in range(3):
        s.replies.clear()
        s.groups.handle(b"client", 1, GroupFetchOffsets(g, None))
        s.data.commit_turn()
        world.deliver()
        assert s.replies[-1].error == ErrorCode.COORDINATOR_NOT_AVAILABLE and "loading" in s.replies[-1].message
        world.now_ms += 1_500
        s.groups.tick(world.now_ms)      # asked again
        world.deliver()
    world.down.discard(third)            # back: asked again, it answers
    world.now_ms += 1_500
    s.groups.tick(world.now_ms)
    world.deliver()
    assert offsets(s, g) == {0: 77}


def test_a_replica_that_left_the_coordination_set_is_not_waited_for(world):
    brokers = cluster(world)
    g = "g4c"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    r = join(c, g)
    assert c.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, ""]])).error == 0
    kill(world, brokers, coord)
    s = brokers[second]
    world.down.add(third)
    s.groups.handle(b"client", 1, GroupFetchOffsets(g, None))
    world.deliver()
    world.now_ms += 1_500
    s.groups.tick(world.now_ms)
    assert s.groups.replication.loading(g, world.now_ms)
    kill(world, brokers, third)          # convicted: a majority of the replicas is gone, the wait ends
    s.groups.tick(world.now_ms)
    assert not s.groups.replication.loading(g, world.now_ms)
    assert offsets(s, g) == {0: 5}       # (second held it: it was one of the majority)


def test_on_two_brokers_a_commit_is_refused_retriably_while_the_other_is_down_and_taken_once_convicted(world):
    """A group of a 2-broker cluster needs both: while the other is dead but not convicted,
    each commit is answered a retriable error within ``commit_timeout_ms`` (never success),
    and once it is convicted the next commit is taken at once."""
    from mesh.wire.errors import retriable
    from tests.unit.test_group_host import group_on
    nodes = ["a", "b"]
    brokers = cluster(world, nodes)
    g = group_on("a", nodes)
    c = brokers["a"]
    assert c.ask(GroupCommit(g, "", -1, [["t", 0, 2, ""]])).error == 0   # on both
    world.down.add("b")                  # killed; gossip still says alive
    c.replies.clear()
    c.groups.handle(b"client", 1, GroupCommit(g, "", -1, [["t", 0, 3, ""]]))
    c.data.commit_turn()
    world.deliver()
    world.now_ms += 2_990
    c.groups.tick(world.now_ms)
    assert c.replies == []
    world.now_ms += 30                   # (past commit_timeout_ms: 3 s)
    c.groups.tick(world.now_ms)
    assert [x.error for x in c.replies] == [ErrorCode.COORDINATOR_NOT_AVAILABLE]
    assert retriable(c.replies[0].error)
    kill(world, brokers, "b")            # convicted
    assert c.ask(GroupCommit(g, "", -1, [["t", 0, 4, ""]])).error == 0


def test_an_answer_to_a_message_of_the_coordinators_earlier_life_does_not_count(world):
    """Message numbers started at 1 in every life: an answer a replica's link held while the
    coordinator restarted counted for the new life's message of the same number, and a
    commit was acknowledged before that replica had it (found by review)."""
    from tests.unit.test_group_host import Broker
    brokers = cluster(world)
    g = "g7"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    assert c.ask(GroupCommit(g, "", -1, [["t", 0, 1, ""]])).error == 0
    old = []
    for offset in range(2, 7):           # five messages to each replica, not delivered yet
        c.groups.handle(b"client", 1, GroupCommit(g, "", -1, [["t", 0, offset, ""]]))
        c.data.commit_turn()
        old += world.wire
        world.wire = []
    c = brokers[coord] = Broker(world, coord, store=c.store.crash())   # restarted before the answers
    world.deliver()                      # its pull and its copy of what it took over are answered
    c.replies.clear()
    c.groups.handle(b"client", 2, GroupCommit(g, "", -1, [["t", 0, 9, ""]]))
    c.data.commit_turn()
    assert {dest for _, dest, m in world.wire if isinstance(m, GroupReplicate)} == {second, third}
    world.wire = []                      # the replicas never get this life's rows
    for src, dest, m in old:             # the earlier life's messages reach them now
        brokers[dest].groups.handle_peer(src, m)
        brokers[dest].data.commit_turn()
    world.deliver()                      # their answers reach the new life
    assert c.replies == []               # not acknowledged: neither replica has offset 9


def test_a_coordinator_cut_off_from_the_others_acknowledges_nothing_alone(world):
    """A network partition isolates the coordinator of a 3-broker cluster: it convicts the
    other two, is then the group's only replica in its own view, and acknowledged every
    commit on its disk alone, while the others took the group over (found by review). A
    majority is counted over the brokers gossip knows (not those that left), not over the
    live ones (but on 2 brokers the survivor of one failure goes on alone)."""
    brokers = cluster(world)
    g = "g8"
    coord, second, third = ranked_nodes(g, NODES)
    c = brokers[coord]
    assert c.ask(GroupCommit(g, "", -1, [["t", 0, 1, ""]])).error == 0
    world.down.update([second, third])   # cut off: from its side the others are dead
    world.status[second] = world.status[third] = "dead"
    c.groups.on_cluster_change(world.now_ms)
    c.replies.clear()
    c.groups.handle(b"client", 1, GroupCommit(g, "", -1, [["t", 0, 2, ""]]))
    c.data.commit_turn()
    world.deliver()
    world.now_ms += 3_100
    c.groups.tick(world.now_ms)
    assert [r.error for r in c.replies] == [ErrorCode.COORDINATOR_NOT_AVAILABLE]
    world.down.discard(third)            # one of them is back in view: a majority again
    world.status[third] = "alive"
    c.groups.on_cluster_change(world.now_ms)
    assert c.ask(GroupCommit(g, "", -1, [["t", 0, 3, ""]])).error == 0
