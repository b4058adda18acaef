"""The group coordinator, the member-side state, and rendezvous hashing."""
from __future__ import annotations

import random

import pytest

from mesh.wire.errors import ErrorCode
from mesh.groups import (
    GroupCommit, GroupConfig, GroupCoordinator, GroupDelete, GroupDescribe, GroupFetchOffsets,
    GroupFindCoordinator, GroupHeartbeat, GroupHeartbeatResponse, GroupList, GroupMemberState,
    GroupResetOffsets, MemberRemoved, PersistOffsets, coordinator_for, error_response, ranked_nodes,
)
from mesh.wire.codec import decode_body, encode_body

G = "g"
SESSION_MS = 1_000


def new_coordinator(grace_ms=0, now_ms=0, **kw):
    coord = GroupCoordinator(GroupConfig(takeover_grace_ms=grace_ms, heartbeat_interval_ms=100, **kw),
                             random.Random(1), now_ms=now_ms)
    coord.set_topic_partitions("t", 4)
    return coord


def hb(coord, now_ms, member_id="", epoch=0, owned=(), topics=("t",), assignor="cooperative-sticky",
       rebalance_timeout_ms=5_000):
    resp, effects = coord.handle(GroupHeartbeat(G, member_id, epoch, list(topics),
                                                [list(tp) for tp in owned], assignor, SESSION_MS,
                                                rebalance_timeout_ms), now_ms)
    assert effects == []
    coord.check_invariants()
    return resp


def parts(resp):
    return {(t, p) for t, p in resp.assignment}


def ok(resp):
    assert resp.error == ErrorCode.NONE, resp
    return resp


# -- joining, cooperative hand-over ------------------------------------------------------

def test_first_member_gets_everything():
    coord = new_coordinator()
    r = ok(hb(coord, 0))
    assert r.member_id and r.member_epoch == 2 and r.heartbeat_interval_ms == 100
    assert parts(r) == {("t", p) for p in range(4)}
    assert coord.describe(G).state == "stable"


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range", "round-robin"])
def test_partitions_move_only_after_release(assignor):
    coord = new_coordinator()
    a = ok(hb(coord, 0, assignor=assignor))
    owned_a = parts(a)
    b = ok(hb(coord, 10, assignor=assignor))
    assert parts(b) == set() and b.member_epoch == 1         # nothing free yet
    a2 = ok(hb(coord, 20, a.member_id, a.member_epoch, owned_a, assignor=assignor))
    keep = parts(a2)
    assert len(keep) == 2 and keep < owned_a and a2.member_epoch == a.member_epoch  # revoke, no bump
    assert coord.describe(G).state == "reconciling"
    b2 = ok(hb(coord, 30, b.member_id, b.member_epoch, assignor=assignor))
    assert parts(b2) == set()                                  # a has not released yet
    # a releases; only then b gets the partitions, with a new epoch
    ok(hb(coord, 40, a.member_id, a.member_epoch, keep, assignor=assignor))
    b3 = ok(hb(coord, 50, b.member_id, b.member_epoch, assignor=assignor))
    assert parts(b3) == owned_a - keep and b3.member_epoch == b.member_epoch + 1
    ok(hb(coord, 60, b.member_id, b3.member_epoch, parts(b3), assignor=assignor))
    assert coord.describe(G).state == "stable"


def test_stale_heartbeat_cannot_release():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    old_epoch = a.member_epoch
    b = ok(hb(coord, 10))
    a2 = ok(hb(coord, 20, a.member_id, old_epoch, parts(a)))
    revoking = parts(a) - parts(a2)
    # bump a's epoch: give it a new partition (grow the topic)
    coord.set_topic_partitions("t", 6)
    ok(hb(coord, 30, a.member_id, old_epoch, parts(a2)))      # releases, then new ones
    a3 = ok(hb(coord, 40, a.member_id, old_epoch, parts(a2)))
    assert a3.member_epoch > old_epoch
    # a late heartbeat from before a took its new partitions, claiming it holds nothing
    late = ok(hb(coord, 50, a.member_id, old_epoch, ()))
    assert parts(late) == parts(a3)
    desc = {m["member_id"]: m for m in coord.describe(G).members}
    assert {tuple(x) for x in desc[a.member_id]["assigned"]} == parts(a3)
    assert revoking and b.member_id in desc


def test_untrusted_heartbeat_does_not_change_subscription():
    coord = new_coordinator()
    coord.set_topic_partitions("u", 2)
    a = ok(hb(coord, 0, topics=("t", "u")))
    epoch = coord.describe(G).group_epoch
    ok(hb(coord, 10, a.member_id, a.member_epoch - 1, (), topics=("u",)))
    assert coord.describe(G).group_epoch == epoch
    ok(hb(coord, 20, a.member_id, a.member_epoch, parts(a), topics=("u",)))
    assert coord.describe(G).group_epoch == epoch + 1


def test_claiming_partitions_never_given_is_fenced():
    coord = new_coordinator()
    a = ok(hb(coord, 0, topics=()))
    r = hb(coord, 10, a.member_id, a.member_epoch, [("t", 0)], topics=())
    assert r.error == ErrorCode.FENCED_EPOCH
    assert hb(coord, 20, a.member_id, a.member_epoch).error == ErrorCode.FENCED_EPOCH


def test_future_epoch_is_fenced():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    assert hb(coord, 10, a.member_id, a.member_epoch + 1, parts(a)).error == ErrorCode.FENCED_EPOCH


# -- leaving, timeouts --------------------------------------------------------------------

def test_leave_frees_partitions_at_once():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    b = ok(hb(coord, 10))
    r = ok(hb(coord, 20, a.member_id, -1))
    assert r.member_epoch == -1
    assert parts(ok(hb(coord, 30, b.member_id, b.member_epoch))) == {("t", p) for p in range(4)}
    ok(hb(coord, 40, a.member_id, -1))                        # leaving twice is fine


def test_session_timeout_removes_and_later_heartbeat_is_unknown():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    b = ok(hb(coord, 10))
    assert coord.tick(SESSION_MS) == []
    ok(hb(coord, 500, b.member_id, b.member_epoch))
    effects = coord.tick(SESSION_MS + 1)
    assert effects == [MemberRemoved(G, a.member_id, "session timeout")]
    assert parts(ok(hb(coord, SESSION_MS + 2, b.member_id, b.member_epoch))) == {("t", p) for p in range(4)}
    late = hb(coord, SESSION_MS + 3, a.member_id, a.member_epoch, parts(a))
    assert late.error == ErrorCode.UNKNOWN_MEMBER and late.member_id == a.member_id


def test_expired_member_is_unknown_even_before_tick():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    assert hb(coord, SESSION_MS + 1, a.member_id, a.member_epoch, parts(a)).error == ErrorCode.UNKNOWN_MEMBER


def test_rebalance_timeout_fences_but_holds_partitions_until_session_end():
    coord = new_coordinator()
    a = ok(hb(coord, 0, rebalance_timeout_ms=200))
    b = ok(hb(coord, 10))
    ok(hb(coord, 20, a.member_id, a.member_epoch, parts(a), rebalance_timeout_ms=200))  # told to revoke
    ok(hb(coord, 200, a.member_id, a.member_epoch, parts(a), rebalance_timeout_ms=200))  # still holds
    assert coord.tick(221) == [MemberRemoved(G, a.member_id, "fenced: rebalance timeout")]
    assert hb(coord, 230, a.member_id, a.member_epoch, parts(a)).error == ErrorCode.FENCED_EPOCH
    # b is now the only member of the target, but a may still think it owns its partitions
    assert parts(ok(hb(coord, 240, b.member_id, b.member_epoch))) == set()
    desc = coord.describe(G)
    assert [m["fenced"] for m in desc.members if m["member_id"] == a.member_id] == [True]
    # a's session (last heartbeat at 200) ends after 1200
    assert coord.tick(1200) == []
    assert coord.tick(1201) == [MemberRemoved(G, a.member_id, "fenced member's session ended")]
    assert parts(ok(hb(coord, 1210, b.member_id, b.member_epoch))) == {("t", p) for p in range(4)}


def test_fenced_member_leave_frees_at_once():
    coord = new_coordinator()
    a = ok(hb(coord, 0, rebalance_timeout_ms=100))
    b = ok(hb(coord, 10))
    ok(hb(coord, 20, a.member_id, a.member_epoch, parts(a), rebalance_timeout_ms=100))
    coord.tick(200)
    ok(hb(coord, 210, a.member_id, -1))
    assert len(parts(ok(hb(coord, 220, b.member_id, b.member_epoch)))) == 4


# -- takeover -------------------------------------------------------------------------------

def test_new_coordinator_holds_assignments_during_takeover_grace():
    coord = new_coordinator(grace_ms=2_000, now_ms=1_000)
    coord.load_offsets(G, [("t", 0, 42, "m")])
    a = ok(hb(coord, 1_500))
    assert parts(a) == set()
    a = ok(hb(coord, 2_200, a.member_id, a.member_epoch))
    a = ok(hb(coord, 2_999, a.member_id, a.member_epoch))
    assert parts(a) == set()
    a = ok(hb(coord, 3_000, a.member_id, a.member_epoch))
    assert len(parts(a)) == 4
    resp, _ = coord.handle(GroupFetchOffsets(G, [["t", 0], ["t", 1]]), 3_000)
    assert resp.offsets == [["t", 0, 42, "m"], ["t", 1, -1, ""]]


def test_begin_takeover_holds_only_groups_that_start_in_the_window():
    coord = new_coordinator(grace_ms=500, now_ms=-1_000)
    a = ok(hb(coord, 0))
    coord.begin_takeover(100)
    coord2_member = coord.handle(GroupHeartbeat("other", "", 0, ["t"], [], "", SESSION_MS, 5_000), 150)[0]
    assert coord2_member.assignment == []
    ok(hb(coord, 200, a.member_id, a.member_epoch, parts(a)))
    b = ok(hb(coord, 210))
    a2 = ok(hb(coord, 220, a.member_id, a.member_epoch, parts(a)))   # a is told to give up two
    ok(hb(coord, 225, a.member_id, a.member_epoch, parts(a2)))        # and does
    assert len(parts(ok(hb(coord, 230, b.member_id, b.member_epoch)))) == 2   # existing group: no hold


def test_load_offsets_fills_only_what_is_missing():
    coord = new_coordinator()
    commit(coord, "", -1, [("t", 0, 50, "mine")])
    coord.load_offsets(G, [("t", 0, 40, "gossip"), ("t", 1, 7, "gossip")])
    assert coord.committed(G) == {("t", 0): (50, "mine"), ("t", 1): (7, "gossip")}


def test_drop_group_forgets_members():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    coord.drop_group(G)
    assert coord.describe(G).state == "dead"
    assert hb(coord, 10, a.member_id, a.member_epoch, parts(a)).error == ErrorCode.UNKNOWN_MEMBER


# -- topics ---------------------------------------------------------------------------------

def test_partition_count_changes_bump_subscribed_groups():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    epoch = coord.describe(G).group_epoch
    coord.set_topic_partitions("other", 3)
    assert coord.describe(G).group_epoch == epoch
    coord.set_topic_partitions("t", 6)
    assert coord.describe(G).group_epoch == epoch + 1
    a2 = ok(hb(coord, 10, a.member_id, a.member_epoch, parts(a)))
    assert len(parts(a2)) == 6 and a2.member_epoch == a.member_epoch + 1
    coord.set_topic_partitions("t", 0)   # deleted: everything is revoked
    a3 = ok(hb(coord, 20, a.member_id, a2.member_epoch, parts(a2)))
    assert parts(a3) == set()


# -- offsets -------------------------------------------------------------------------------

def commit(coord, member_id, epoch, offsets, now_ms=0):
    return coord.handle(GroupCommit(G, member_id, epoch, [list(o) for o in offsets]), now_ms)


def test_commit_rules():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    resp, effects = commit(coord, a.member_id, a.member_epoch, [("t", 0, 10, "x"), ("t", 1, 5, "")])
    assert resp.error == ErrorCode.NONE
    assert effects == [PersistOffsets(G, (("t", 0, 10, "x"), ("t", 1, 5, "")))]
    resp, effects = commit(coord, a.member_id, a.member_epoch - 1, [("t", 0, 11, "")])
    assert resp.error == ErrorCode.ILLEGAL_GENERATION and effects == []
    resp, _ = commit(coord, a.member_id, a.member_epoch + 1, [("t", 0, 11, "")])
    assert resp.error == ErrorCode.FENCED_EPOCH
    resp, _ = commit(coord, "nobody", 3, [("t", 0, 11, "")])
    assert resp.error == ErrorCode.UNKNOWN_MEMBER
    # while revoking, the member may still commit what it is giving up
    b = ok(hb(coord, 10))
    a2 = ok(hb(coord, 20, a.member_id, a.member_epoch, parts(a)))
    giving_up = sorted(parts(a) - parts(a2))
    resp, _ = commit(coord, a.member_id, a.member_epoch, [(t, p, 20, "") for t, p in giving_up])
    assert resp.error == ErrorCode.NONE
    ok(hb(coord, 30, a.member_id, a.member_epoch, parts(a2)))   # released
    resp, _ = commit(coord, a.member_id, a.member_epoch, [(t, p, 21, "") for t, p in giving_up])
    assert resp.error == ErrorCode.ILLEGAL_GENERATION           # not held any more
    resp, _ = commit(coord, "", -1, [("t", 0, 99, "")])
    assert resp.error == ErrorCode.UNKNOWN_MEMBER                # group has members
    assert coord.committed(G)[giving_up[0]] == (20, "")
    assert b.member_id


def test_simple_consumer_commit_fetch_and_reset():
    coord = new_coordinator()
    resp, effects = commit(coord, "", -1, [("t", 0, 7, "meta")])
    assert resp.error == ErrorCode.NONE and len(effects) == 1
    resp, _ = coord.handle(GroupFetchOffsets(G), 0)
    assert resp.offsets == [["t", 0, 7, "meta"]]
    resp, effects = coord.handle(GroupResetOffsets(G, [["t", 0, 0], ["t", 3, 5]]), 0)
    assert resp.error == ErrorCode.NONE
    assert effects == [PersistOffsets(G, (("t", 0, 0, ""), ("t", 3, 5, "")))]
    a = ok(hb(coord, 0))
    resp, effects = coord.handle(GroupResetOffsets(G, [["t", 0, 0]]), 0)
    assert resp.error == ErrorCode.INVALID_REQUEST and effects == []
    assert "members" in resp.message
    ok(hb(coord, 10, a.member_id, -1))
    resp, _ = coord.handle(GroupResetOffsets(G, [["t", 0, 3]]), 20)
    assert resp.error == ErrorCode.NONE


def test_simple_commits_and_resets_name_partitions_that_exist():
    """Made-up topics were stored, and gossiped to every broker, without bound (2.7 MB of
    commits took a broker from 81 to 308 MB and each later commit from 0.6 to 67 ms)."""
    coord = new_coordinator()
    for offsets, code in (([("nope", 0, 1, "")], ErrorCode.UNKNOWN_TOPIC),
                          ([("t", 4, 1, "")], ErrorCode.UNKNOWN_PARTITION)):
        resp, effects = commit(coord, "", -1, offsets)
        assert resp.error == code and effects == [], resp
        resp, effects = coord.handle(GroupResetOffsets(G, [list(o[:3]) for o in offsets]), 0)
        assert resp.error == code and effects == [], resp
    assert coord.handle(GroupList(), 0)[0].groups == []


def test_groups_that_move_here_are_never_refused_for_the_group_cap():
    """A broker whose peer died takes over the peer's groups with their committed offsets;
    the cap refused them (offset -1 for every group past it: consumers reset, commits lost)."""
    coord = new_coordinator(max_groups=2)
    for g in ("a", "b"):
        resp, _ = coord.handle(GroupCommit(g, "", -1, [["t", 0, 5, ""]]), 0)
        assert resp.error == ErrorCode.NONE
    resp, _ = coord.handle(GroupCommit("c", "", -1, [["t", 0, 5, ""]]), 0)
    assert resp.error == ErrorCode.INVALID_REQUEST and "already holds 2 groups" in resp.message
    coord.load_offsets("moved", [("t", 1, 9, "m")])      # taken over: kept, over the cap
    resp, _ = coord.handle(GroupFetchOffsets("moved"), 0)
    assert resp.offsets == [["t", 1, 9, "m"]]


def test_a_group_is_deleted_only_without_members_and_leaves_tombstones():
    """Kafka's DeleteGroups. Without deletion or expiry, every group that ever committed
    stayed for good and counted against max_groups: a coordinator that had seen 10,000
    short-lived groups refused every new one, for ever."""
    coord = new_coordinator(max_groups=2)
    resp, effects = coord.handle(GroupDelete(G), 0)
    assert resp.error == ErrorCode.UNKNOWN_GROUP and effects == []
    a = ok(hb(coord, 0))
    commit(coord, a.member_id, a.member_epoch, [("t", 2, 3, ""), ("t", 0, 1, "m")])
    resp, effects = coord.handle(GroupDelete(G), 10)
    assert resp.error == ErrorCode.GROUP_NOT_EMPTY and effects == [] and "1 members" in resp.message
    ok(hb(coord, 20, a.member_id, -1))
    resp, effects = coord.handle(GroupDelete(G), 30)
    assert resp.error == ErrorCode.NONE
    # DELETED for every partition of its topics (a commit made elsewhere, never heard of here)
    assert effects == [PersistOffsets(G, tuple(("t", p, -1, "") for p in range(4)))]
    assert coord.list_groups().groups == [] and coord.committed(G) == {}
    # its place counts no more: two other groups fit under the cap of 2
    for g in ("x", "y"):
        assert coord.handle(GroupCommit(g, "", -1, [["t", 0, 5, ""]]), 40)[0].error == ErrorCode.NONE
    # a tombstone loaded from gossip (deleted through another coordinator) takes the offset away
    coord.load_offsets("x", [("t", 0, -1, "")], replace=True)
    assert coord.committed("x") == {} and [g["group_id"] for g in coord.list_groups().groups] == ["y"]


def test_no_group_is_deleted_reset_or_expired_while_its_members_may_still_rejoin():
    """A coordinator that took groups over does not know their members until they rejoin:
    a delete 50 ms after a failover was accepted and the active group lost its offsets."""
    coord = new_coordinator(grace_ms=3_000, now_ms=0, offsets_retention_ms=1_000)
    coord.load_offsets(G, [("t", 0, 100, "")], newest_ms=-5_000)
    coord.tick(50)
    for msg in (GroupDelete(G), GroupResetOffsets(G, [["t", 0, 1]])):
        resp, effects = coord.handle(msg, 50)
        assert resp.error == ErrorCode.COORDINATOR_NOT_AVAILABLE and effects == [], resp
        assert "may still rejoin" in resp.message
    assert coord.expired(50) == []
    assert coord.expired(3_000) == [G]   # retention counts from its newest commit, not the load
    assert coord.handle(GroupDelete(G), 3_000)[0].error == ErrorCode.NONE


def test_a_tombstone_for_a_group_with_members_here_gives_its_offsets_to_commit_again():
    """A broker cut off from the others deleted a group whose members are here: its
    tombstones must not take their offsets (an idle partition's offset was lost for good)."""
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    commit(coord, a.member_id, a.member_epoch, [("t", 0, 200, "m"), ("t", 1, 7, "")])
    again = coord.load_offsets(G, [("t", 0, -1, ""), ("t", 1, -1, ""), ("t", 2, -1, "")], replace=True)
    assert again == [("t", 0, 200, "m"), ("t", 1, 7, "")]
    assert coord.committed(G) == {("t", 0): (200, "m"), ("t", 1): (7, "")}
    ok(hb(coord, 10, a.member_id, -1))                # no members: a tombstone takes the offset
    assert coord.load_offsets(G, [("t", 0, -1, "")], replace=True) == []
    assert coord.committed(G) == {("t", 1): (7, "")}


def test_an_empty_group_expires_after_the_offsets_retention():
    """Kafka's offsets.retention.minutes counted from when the group became empty (KIP-211);
    a simple consumer's commit counts as activity."""
    coord = new_coordinator(offsets_retention_ms=1_000)
    a = ok(hb(coord, 0))
    commit(coord, a.member_id, a.member_epoch, [("t", 1, 3, "")])
    coord.handle(GroupCommit("simple", "", -1, [["t", 0, 5, ""]]), 0)
    coord.tick(900)
    assert coord.expired(900) == []              # members keep a group
    ok(hb(coord, 950, a.member_id, -1))
    coord.tick(950)                              # empty from here
    assert coord.expired(1_949) == ["simple"]    # its commit at 0 is the last activity
    coord.handle(GroupCommit("simple", "", -1, [["t", 0, 6, ""]]), 1_949)
    assert coord.expired(1_949) == []
    assert coord.expired(1_950) == [G]
    assert coord.expired(5_000, limit=1) == [G]
    never = new_coordinator(offsets_retention_ms=0)
    never.handle(GroupCommit(G, "", -1, [["t", 0, 5, ""]]), 0)
    never.tick(0)
    assert never.expired(10 ** 12) == []


def test_describe_and_list():
    coord = new_coordinator()
    assert coord.handle(GroupList(), 0)[0].groups == []
    a = ok(hb(coord, 0))
    commit(coord, a.member_id, a.member_epoch, [("t", 2, 3, "")])
    desc, _ = coord.handle(GroupDescribe(G), 0)
    assert desc.state == "stable" and desc.assignor == "cooperative-sticky"
    assert desc.offsets == [["t", 2, 3, ""]]
    [member] = desc.members
    assert member["member_id"] == a.member_id and len(member["assigned"]) == 4
    listing = coord.list_groups().groups
    assert listing == [{"group_id": G, "state": "stable", "members": 1, "group_epoch": desc.group_epoch}]
    ok(hb(coord, 10, a.member_id, -1))
    assert coord.list_groups().groups[0]["state"] == "empty"  # kept for its offsets


def test_empty_group_without_offsets_is_forgotten():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    ok(hb(coord, 10, a.member_id, -1))
    assert coord.list_groups().groups == []


def test_assignor_is_the_members_majority_choice():
    coord = new_coordinator()
    ok(hb(coord, 0, assignor="range"))
    ok(hb(coord, 0, assignor="round-robin"))
    assert coord.describe(G).assignor == "range"        # tie: smallest name
    ok(hb(coord, 0, assignor="round-robin"))
    assert coord.describe(G).assignor == "round-robin"


# -- bad input and bounds -------------------------------------------------------------------

@pytest.mark.parametrize("request_, code", [
    (GroupHeartbeat("", "", 0, ["t"], []), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, "t", []), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, [1], []), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, ["t"], [["t"]]), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, ["t"], [["t", -1]]), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, ["t"], [["t", 0]]), ErrorCode.INVALID_REQUEST),   # joiner owns nothing
    (GroupHeartbeat(G, "", 5, ["t"], []), ErrorCode.INVALID_REQUEST),
    (GroupHeartbeat(G, "", 0, ["t"], [], "nope"), ErrorCode.INVALID_CONFIG),
    (GroupHeartbeat(G, "", 0, ["t"], [], "", 1), ErrorCode.INVALID_CONFIG),
    (GroupHeartbeat(G, "", 0, ["t"], [], "", 1_000, 0), ErrorCode.INVALID_CONFIG),
    (GroupCommit(G, "", -1, [["t", 0, -5, ""]]), ErrorCode.INVALID_REQUEST),
    (GroupCommit(G, "", -1, [["t", 0, 5, 7]]), ErrorCode.INVALID_REQUEST),
    (GroupCommit(G, "", -1, [["t", 0, 5, "x" * 5000]]), ErrorCode.INVALID_REQUEST),
    (GroupFetchOffsets(G, [[1, 2]]), ErrorCode.INVALID_REQUEST),
    (GroupResetOffsets(G, [["t", 0]]), ErrorCode.INVALID_REQUEST),
])
def test_bad_requests_get_errors_not_crashes(request_, code):
    coord = new_coordinator()
    resp, effects = coord.handle(request_, 0)
    assert resp.error == code and resp.message and effects == []


def test_group_size_is_bounded():
    coord = new_coordinator(max_members_per_group=2)
    ok(hb(coord, 0))
    ok(hb(coord, 0))
    r = hb(coord, 0)
    assert r.error == ErrorCode.INVALID_REQUEST and "full" in r.message


def test_group_count_is_bounded():
    coord = new_coordinator(max_groups=1)
    ok(hb(coord, 0))
    resp, _ = coord.handle(GroupCommit("other", "", -1, [["t", 0, 1, ""]]), 0)
    assert resp.error == ErrorCode.INVALID_REQUEST


# -- wire -------------------------------------------------------------------------------------

def test_messages_round_trip_through_the_codec():
    coord = new_coordinator()
    a = ok(hb(coord, 0))
    requests = [
        GroupHeartbeat(G, "", 0, ["t"], []), GroupCommit(G, a.member_id, a.member_epoch, [["t", 0, 1, ""]]),
        GroupFetchOffsets(G), GroupFetchOffsets(G, [["t", 0]]), GroupResetOffsets(G, [["t", 0, 1]]),
        GroupDescribe(G), GroupList(), GroupFindCoordinator(G),
    ]
    for req in requests:
        assert decode_body(type(req).OP, encode_body(req)) == req
        if not isinstance(req, GroupFindCoordinator):
            resp, _ = coord.handle(req, 0)
            assert decode_body(type(resp).OP, encode_body(resp)) == resp
        err = error_response(req, ErrorCode.COORDINATOR_MOVED, coordinator="n2")
        assert err.error == ErrorCode.COORDINATOR_MOVED
        assert decode_body(type(err).OP, encode_body(err)) == err


def test_error_response_echoes_member_id():
    err = error_response(GroupHeartbeat(G, "m1", 3, [], []), ErrorCode.COORDINATOR_MOVED)
    assert isinstance(err, GroupHeartbeatResponse) and err.member_id == "m1"


# -- the member side ----------------------------------------------------------------------------

def member(**kw):
    kw.setdefault("session_timeout_ms", SESSION_MS)
    kw.setdefault("fence_margin_ms", 100)
    return GroupMemberState(G, ["t"], **kw)


def resp(member_id, epoch, assignment, error=0):
    return GroupHeartbeatResponse(error, "", member_id, epoch, [list(tp) for tp in assignment], 100, 1)


T0, T1, T2 = ("t", 0), ("t", 1), ("t", 2)


def test_member_joins_takes_and_revokes():
    m = member()
    assert m.heartbeat_due(0)
    req = m.heartbeat(0)
    assert (req.member_id, req.member_epoch, req.owned) == ("", 0, [])
    assert not m.heartbeat_due(10)                           # one in flight
    ch = m.on_heartbeat_response(resp("x", 2, [T0, T1]), 0, 10)
    assert ch.assigned == (T0, T1) and m.member_id == "x" and m.owned == {T0, T1}
    assert not m.heartbeat_due(50) and m.heartbeat_due(110)
    ch = m.on_heartbeat_response(resp("x", 2, [T0]), 100, 110)
    assert ch.revoke == (T1,) and m.owned == {T0, T1} and m.revoking == {T1}
    assert m.on_heartbeat_response(resp("x", 2, [T0]), 120, 130) == type(ch)()  # told once
    assert m.heartbeat(140).owned == [["t", 0], ["t", 1]]
    m.revoked([T1])
    assert m.owned == {T0} and m.heartbeat_due(141)
    assert m.heartbeat(141).owned == [["t", 0]]


def test_member_ignores_older_epochs_and_only_removes_at_its_own_epoch():
    m = member()
    m.heartbeat(0)
    m.on_heartbeat_response(resp("x", 3, [T0]), 0, 10)
    assert m.on_heartbeat_response(resp("x", 2, [T0, T1]), 5, 20).assigned == ()
    ch = m.on_heartbeat_response(resp("x", 3, [T0, T2]), 5, 20)  # same epoch: cannot add
    assert ch.assigned == () and m.owned == {T0}
    ch = m.on_heartbeat_response(resp("x", 4, [T0, T2]), 15, 25)
    assert ch.assigned == (T2,) and m.member_epoch == 4


def test_member_fences_itself_and_leaves_its_old_id():
    m = member()
    m.heartbeat(0)
    m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
    m.heartbeat(300)
    m.on_heartbeat_response(resp("x", 2, [T0]), 300, 310)
    assert m.poll(1_199) == type(m.poll(0))()
    ch = m.poll(1_200)                                      # 300 + (1000 - 100)
    assert ch.lost == (T0,) and m.member_id == "" and m.owned == set()
    [leave] = ch.send
    assert (leave.member_id, leave.member_epoch) == ("x", -1)
    # a late answer for the old id changes nothing
    assert m.on_heartbeat_response(resp("x", 2, [T0]), 1_150, 1_210) == type(ch)()
    assert m.owned == set() and m.heartbeat(1_210).member_id == ""


def test_member_ignores_answers_older_than_its_fence_time():
    m = member()
    m.heartbeat(0)
    m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
    ch = m.on_heartbeat_response(resp("x", 3, [T0, T1]), 50, 950)  # 900 ms old
    assert ch.assigned == () and m.member_epoch == 2


def test_member_unknown_or_fenced_rejoins():
    for code, leaves in ((ErrorCode.UNKNOWN_MEMBER, 0), (ErrorCode.FENCED_EPOCH, 1)):
        m = member()
        m.heartbeat(0)
        m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
        m.heartbeat(100)
        ch = m.on_heartbeat_response(GroupHeartbeatResponse(code, "", "x"), 100, 110)
        assert ch.lost == (T0,) and len(ch.send) == leaves and m.member_id == ""
        assert m.heartbeat_due(110)


def test_member_retriable_error_keeps_partitions():
    m = member(retry_backoff_ms=50)
    m.heartbeat(0)
    m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
    m.heartbeat(100)
    err = error_response(GroupHeartbeat(G, "x", 2, [], []), ErrorCode.COORDINATOR_MOVED)
    assert m.on_heartbeat_response(err, 100, 110) == type(m.poll(0))()
    assert m.owned == {T0} and not m.heartbeat_due(159) and m.heartbeat_due(160)


def test_member_leaves_ghosts_from_extra_join_answers():
    m = member()
    m.heartbeat(0)
    m.heartbeat(400)                                        # first join timed out, retried
    m.on_heartbeat_response(resp("x", 2, [T0]), 400, 410)
    ch = m.on_heartbeat_response(resp("y", 2, [T1]), 0, 420)
    assert m.member_id == "x" and m.owned == {T0}
    [leave] = ch.send
    assert (leave.member_id, leave.member_epoch) == ("y", -1)


def test_member_after_leave_frees_late_join_answers():
    m = member()
    m.heartbeat(0)
    req, ch = m.leave()
    assert req is None and ch.lost == () and not m.heartbeat_due(1_000)
    ch = m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
    assert m.member_id == "" and m.owned == set()
    assert [(r.member_id, r.member_epoch) for r in ch.send] == [("x", -1)]


def test_member_leave_and_commit():
    m = member()
    with pytest.raises(Exception):
        m.commit([("t", 0, 1, "")])
    m.heartbeat(0)
    m.on_heartbeat_response(resp("x", 2, [T0]), 0, 10)
    c = m.commit([("t", 0, 5, "")])
    assert (c.member_id, c.member_epoch, c.offsets) == ("x", 2, [["t", 0, 5, ""]])
    with pytest.raises(Exception):
        m.commit([("t", 1, 5, "")])
    req, ch = m.leave()
    assert req.member_epoch == -1 and req.member_id == "x" and ch.lost == (T0,)


def test_member_against_coordinator():
    coord = new_coordinator()
    a, b = member(), member()
    now = 0
    for _ in range(20):
        for m in (a, b):
            if m.heartbeat_due(now):
                ch = m.on_heartbeat_response(coord.handle(m.heartbeat(now), now)[0], now, now)
                if ch.revoke:
                    m.revoked(ch.revoke)
        coord.check_invariants()
        assert not (a.owned & b.owned)
        now += 50
    assert len(a.owned) == len(b.owned) == 2


# -- rendezvous ---------------------------------------------------------------------------------

def test_rendezvous_is_deterministic_and_order_free():
    nodes = ["n1", "n2", "n3", "n4"]
    for g in (f"group-{i}" for i in range(50)):
        c = coordinator_for(g, nodes)
        assert c == coordinator_for(g, list(reversed(nodes))) == ranked_nodes(g, nodes)[0]
    with pytest.raises(ValueError):
        coordinator_for("g", [])


def test_rendezvous_moves_only_the_dead_nodes_groups():
    nodes = [f"n{i}" for i in range(5)]
    groups = [f"group-{i}" for i in range(500)]
    before = {g: coordinator_for(g, nodes) for g in groups}
    after = {g: coordinator_for(g, nodes[1:]) for g in groups}
    for g in groups:
        if before[g] != "n0":
            assert after[g] == before[g]
        else:
            assert after[g] == ranked_nodes(g, nodes)[1]
    counts = {n: sum(1 for c in before.values() if c == n) for n in nodes}
    assert min(counts.values()) > 60                      # roughly even (100 each)
    assert coordinator_for("orders", ["a", "b", "c"]) == "c"   # stable across processes
