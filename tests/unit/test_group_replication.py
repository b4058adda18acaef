"""The pure rules of offsets replication (``mesh.groups.replication``): who the replicas
are, when a commit has its quorum, whom a new coordinator asks, what a peer may send."""
from __future__ import annotations

import pytest

from mesh.groups import coordinator_for, ranked_nodes
from mesh.groups.offsets import OffsetBook
from mesh.groups.replication import (
    MAX_ROWS_PER_MESSAGE, CommitQuorum, check_groups, check_rows, pull_targets, quorum, replicas_for,
)
from mesh.wire.errors import ErrorCode, MeshError

NODES = ["n1", "n2", "n3", "n4", "n5"]


def row(group="g", partition=0, offset=10, stamp=1_000, topic="t"):
    return (group, topic, partition, offset, "", stamp)


def test_replicas_are_the_first_of_the_ranking_coordinator_first():
    for g in ("a", "b", "orders"):
        reps = replicas_for(g, NODES, 3)
        assert reps == ranked_nodes(g, NODES)[:3] and reps[0] == coordinator_for(g, NODES)
    assert replicas_for("a", ["n1", "n2"], 3) == ranked_nodes("a", ["n1", "n2"])   # all, if fewer
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_the_surviving_holders_of_a_commit_stay_among_the_replicas_after_failures():
    """Removing brokers only moves the others up: the replicas of a commit that survive are
    among the first ``count`` of the new ranking, and the successor is the first of them."""
    for i in range(200):
        g = f"g{i}"
        before = replicas_for(g, NODES, 3)
        for dead in ([before[0]], [before[0], before[2]], [before[1]]):
            after = replicas_for(g, [n for n in NODES if n not in dead], 3)
            survivors = [n for n in before if n not in dead]
            assert set(survivors) <= set(after)
            assert after[0] == survivors[0]


def test_a_commit_is_done_once_a_majority_of_its_replicas_answered():
    g = next(f"g{i}" for i in range(1000) if coordinator_for(f"g{i}", NODES) == "n1")
    _, r2, r3 = replicas_for(g, NODES, 3)
    q = CommitQuorum("n1", replicas=3, timeout_ms=100)
    sends, done, refused = q.begin([("k", g, [row(g)])], NODES, now_ms=0)
    assert done == [] and refused == [] and sorted(d for d, _ in sends) == sorted([r2, r3])
    seq = {d: m.seq for d, m in sends}
    assert sends[0][1].rows == [list(row(g))]
    assert q.acked(r3, seq[r2]) == []            # an answer from the wrong replica: ignored
    assert q.acked(r2, 999) == [] and q.acked(r2, "x") == []
    assert q.acked(r2, seq[r2]) == ["k"]          # itself + r2: 2 of 3
    assert q.acked(r3, seq[r3]) == [] and q.waiting == 0
    assert q.expire(10_000) == []


def test_no_quorum_no_success_a_timeout_says_so():
    g = "g"
    q = CommitQuorum(replicas_for(g, NODES, 1)[0], replicas=3, timeout_ms=100)
    sends, done, _ = q.begin([("k", g, [row(g)])], NODES, now_ms=0)
    assert sends and not done
    assert q.expire(99) == []
    assert q.expire(100) == ["k"] and q.waiting == 0
    for dest, m in sends:                          # late answers change nothing
        assert q.acked(dest, m.seq) == []


def test_alone_a_commit_is_done_at_once_and_a_turn_shares_one_message_per_replica():
    assert CommitQuorum("n1").begin([("k", "g", [row()])], ["n1"], 0)[1] == ["k"]
    q = CommitQuorum("n1", replicas=5, timeout_ms=100)
    groups = [f"g{i}" for i in range(50)]
    sends, done, _ = q.begin([(g, g, [row(g), row(g, 1)]) for g in groups], NODES, 0)
    dests = [d for d, _ in sends]
    assert len(dests) == len(set(dests)) == 4 and not done      # one message to each other broker
    assert sum(len(m.rows) for _, m in sends) == 50 * 2 * 4
    for dest, m in sends[:2]:
        finished = q.acked(dest, m.seq)
    assert sorted(finished) == sorted(groups)   # 3 of 5 (itself + 2)


def test_a_large_commit_is_split_and_needs_every_part_from_a_replica():
    q = CommitQuorum("n1", replicas=2, timeout_ms=100)
    g = "g"
    rows = [row(g, p) for p in range(MAX_ROWS_PER_MESSAGE + 5)]
    sends, _, _ = q.begin([("k", g, rows)], ["n1", "n2"], 0)
    assert [len(m.rows) for _, m in sends] == [MAX_ROWS_PER_MESSAGE, 5]
    assert q.acked("n2", sends[0][1].seq) == []
    assert q.acked("n2", sends[1][1].seq) == ["k"]


def test_the_bound_on_waiting_commits_refuses_rather_than_grows():
    q = CommitQuorum("n1", replicas=3, timeout_ms=100, max_waiting=2)
    _, _, refused = q.begin([(i, "g", [row()]) for i in range(3)], NODES, 0)
    assert refused == [2] and q.waiting == 2


def test_a_new_coordinator_pulls_from_the_first_of_the_ranking_but_not_itself():
    g = "g"
    ranked = ranked_nodes(g, NODES)
    targets = pull_targets([g, g], NODES, ranked[0], 2)
    assert sorted(targets) == sorted(ranked[1:4]) and all(v == [g] for v in targets.values())
    assert pull_targets([g], [ranked[0]], ranked[0], 3) == {}


def test_rows_are_checked_as_gossip_rows_but_a_stamp_ahead_of_any_clock_is_taken():
    far = 10 ** 15   # decades ahead of any receiver's clock: its order is still the group's stamp
    assert check_rows([list(row(stamp=far)), list(row(offset=-1))], 256) == [row(stamp=far), row(offset=-1)]
    for bad in ([["g", "t", 0, 1, ""]], [[1, "t", 0, 1, "", 1]], [["g", "", 0, 1, "", 1]],
                [["g", "t", -1, 1, "", 1]], [["g", "t", 0, -2, "", 1]], [["g", "t", 0, 1, "x" * 300, 1]],
                [["g", "t", 0, 1, "", -5]], [["g", "t", 0, True, "", 1]], "rows", [None]):
        with pytest.raises(MeshError) as info:
            check_rows(bad, 256)
        assert info.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(MeshError):
        check_rows([list(row())] * 3, 256, limit=2)
    assert check_groups(["a", "b"]) == ["a", "b"]
    with pytest.raises(MeshError):
        check_groups(["a", ""])


def test_a_replica_keeps_the_newest_row_and_a_successor_stamps_above_it():
    book = OffsetBook("n2")
    assert book.newer_than_own([row(stamp=10)]) == [row(stamp=10)]
    chunks, changed = book.held_here([row(offset=10, stamp=10)])
    assert chunks == [("g", "t", 0)] and changed == {"g"}
    assert book.newer_than_own([row(offset=9, stamp=9)]) == []       # older: never overwrites
    assert book.held_here([row(offset=9, stamp=9)]) == ([], set())
    assert book.committed("g") == {("t", 0): (10, "", 10)}
    # rows from a coordinator whose clock is far ahead: held, and this node's next commit
    # of the group is stamped above them although its own clock is behind
    book.held_here([row(offset=20, stamp=5_000)])
    assert book.next_stamp(100, "g") == 5_001
    assert book.rows_of(["g", "none"]) == [row(offset=20, stamp=5_000)]
    assert book.fold_rows([row(offset=21, stamp=5_001), row(offset=1, stamp=1)]) == {"g"}


def test_a_group_loads_until_every_target_answered_or_the_wait_is_over():
    from mesh.groups.replication import Loading
    loading = Loading(wait_ms=1_000)
    assert not loading.begin("alone", [], 0) and not loading.loading("alone", 0)
    assert loading.begin("g", ["n2", "n3"], 0) and loading.begin("h", ["n2"], 0)
    loading.answered("n2", ["g", "h", "other"])
    assert loading.loading("g", 10) and not loading.loading("h", 10)
    loading.answered("n3", ["g"])
    assert not loading.loading("g", 10) and len(loading) == 0
    loading.begin("k", ["n9"], 0)                      # a target that died: over after the wait
    assert loading.loading("k", 999) and not loading.loading("k", 1_000)
    loading.expire(1_000)
    assert len(loading) == 0


def test_a_group_loads_past_the_wait_while_a_required_target_in_the_set_has_not_answered():
    from mesh.groups.replication import Loading
    loading = Loading(wait_ms=1_000)
    assert loading.begin("g", ["n2", "n3", "n4"], 0, required=["n1", "n2"])   # (n1: itself, not a target)
    live = frozenset(["n1", "n2", "n3", "n4"])
    assert loading.expire(500, live) == {}
    loading.answered("n3", ["g"])
    assert loading.loading("g", 5_000, live)                      # n2 is required and in the set
    assert loading.expire(1_000, live) == {"n2": ["g"]}           # asked again, then each wait_ms
    assert loading.expire(1_500, live) == {} and loading.expire(2_000, live) == {"n2": ["g"]}
    assert not loading.loading("g", 5_000, live - {"n2"})         # it left the set: not waited for
    loading.answered("n2", ["g"])
    assert not loading.loading("g", 5_000, live)                  # n4 may stay silent past the wait
    assert loading.expire(5_000, live) == {} and len(loading) == 0
