"""The pure committed-offsets book of the group host: last-writer-wins fold, incremental
gossip merge, stamps, takeover, adoption, rehoming."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from mesh.cluster.keys import OFFSETS_CHUNK_PARTITIONS, OFFSETS_PREFIX
from mesh.cluster.ownership import coordination_set, coordinator_among
from mesh.groups import coordinator_for
from mesh.groups.offsets import (
    MalformedOffsets, Moved, OffsetBook, Takeover, chunk_of, encode_chunk, starts_alone, takeover_due,
)


def group_on(node: str, nodes: list[str]) -> str:
    return next(g for g in (f"g{i}" for i in range(1000)) if coordinator_for(g, nodes) == node)


def chunk_value(group: str, topic: str, offsets: dict[int, tuple[int, str, int]]) -> dict:
    return {"g": group, "t": topic, "o": {str(p): list(v) for p, v in offsets.items()}}


# -- the fold ------------------------------------------------------------------------------

def test_the_later_stamp_wins_then_the_higher_offset():
    book = OffsetBook("a")
    assert book.fold("g", "t", 0, 50, "", 1000)
    assert book.fold("g", "t", 0, 40, "reset", 1001)        # a later reset to an earlier offset
    assert not book.fold("g", "t", 0, 99, "", 1000)         # older stamp: ignored
    assert book.fold("g", "t", 0, 41, "", 1001)             # same stamp: higher offset
    assert not book.fold("g", "t", 0, 41, "", 1001)         # the same commit again: no change
    assert book.committed("g") == {("t", 0): (41, "", 1001)}


def test_merge_entry_reports_the_groups_that_moved():
    book = OffsetBook("a")
    value = chunk_value("g/with/slashes", "t", {0: (5, "m", 10), 1: (7, "", 10)})
    assert book.merge_entry(value) == {"g/with/slashes"}
    assert book.merge_entry(value) == set()
    assert book.knows("g/with/slashes") and book.groups() == ["g/with/slashes"]
    assert book.offsets_for("g/with/slashes", [["t", 1], ["t", 2]]) == \
        [["t", 1, 7, ""], ["t", 2, -1, ""]]
    assert book.offsets_for("g/with/slashes", None) == [["t", 0, 5, "m"], ["t", 1, 7, ""]]


@pytest.mark.parametrize("value", [
    None, [], {"g": "g", "t": "t"}, {"g": 1, "t": "t", "o": {}}, {"g": "g", "t": "t", "o": []},
    {"g": "g", "t": "t", "o": {"x": [1, "", 1]}}, {"g": "g", "t": "t", "o": {"0": ["bad"]}},
    {"g": "g", "t": "t", "o": {"0": [1, 2, 3]}},
])
def test_malformed_entries_are_refused(value):
    with pytest.raises(MalformedOffsets):
        OffsetBook("a").merge_entry(value)


def test_namespaces_and_entries_are_read_again_only_when_they_moved():
    book = OffsetBook("a")
    assert book.node_moved("b", 1, 5) and not book.node_moved("b", 1, 5)
    assert book.node_moved("b", 1, 6) and book.node_moved("b", 2, 6)
    assert book.entry_moved("b", "off/g/t/0", (1, 3, False))
    assert not book.entry_moved("b", "off/g/t/0", (1, 3, False))
    assert book.entry_moved("b", "off/g/t/0", (1, 4, False))
    book.forget_absent(["a"])
    assert book.node_moved("b", 2, 6) and book.entry_moved("b", "off/g/t/0", (1, 4, False))


# -- own offsets -------------------------------------------------------------------------

def test_stamps_strictly_increase_and_survive_a_reload():
    book = OffsetBook("a")
    assert [book.next_stamp(100, "g"), book.next_stamp(100, "g"), book.next_stamp(50, "g"),
            book.next_stamp(500, "g")] == [100, 101, 102, 500]
    again = OffsetBook("a")
    again.reload("g", "t", 3, 42, "meta", 9_000)
    assert again.next_stamp(100, "g") == 9_001
    assert again.own_chunks() == [("g", "t", 0)]
    assert again.committed("g") == {("t", 3): (42, "meta", 9_000)}


def test_commits_are_chunked_into_gossip_entries():
    book = OffsetBook("a")
    chunks = book.committed_here("g/x", [("t", 1, 5, ""), ("t", OFFSETS_CHUNK_PARTITIONS, 6, "m")], 77)
    assert chunks == [("g/x", "t", 0), ("g/x", "t", 1)]
    key, value = book.chunk_entry(("g/x", "t", 1))
    assert key == f"{OFFSETS_PREFIX}g/x/t/1"
    assert value == {"g": "g/x", "t": "t", "o": {str(OFFSETS_CHUNK_PARTITIONS): [6, "m", 77]}}
    assert chunk_of("g", "t", 2 * OFFSETS_CHUNK_PARTITIONS - 1) == ("g", "t", 1)
    assert encode_chunk(("g", "t", 0), {1: [1, "", 2], 0: [0, "", 2]})[1]["o"] == \
        {"0": [0, "", 2], "1": [1, "", 2]}
    assert OffsetBook("b").merge_entry(value) == {"g/x"}


# -- coordination: takeover, adoption, rehoming --------------------------------------------

def test_taking_a_group_over_loads_and_adopts_the_newer_offsets():
    book = OffsetBook("b")
    g = group_on("b", ["b"])
    book.merge_entry(chunk_value(g, "t", {0: (10, "", 100), 1: (11, "", 100)}))
    book.reload(g, "t", 1, 11, "", 100)   # already durable here: loaded, not adopted
    took = book.claim(g)
    assert took == Takeover(g, load=(("t", 0, 10, ""), ("t", 1, 11, "")),
                            adopt=(("t", 0, 10, "", 100),), claimed=True, newest_ms=100)
    assert book.is_mine(g) and book.claim(g) is None
    assert book.adopted(g, took.adopt) == [(g, "t", 0)]
    assert book.take_newer(g) is None
    # the old coordinator's last commit arrives late through gossip: newer, so it replaces ours
    assert book.merge_entry(chunk_value(g, "t", {0: (12, "", 200)})) == {g}
    assert book.take_newer(g) == Takeover(g, load=(("t", 0, 12, ""),), adopt=(("t", 0, 12, "", 200),),
                                          newest_ms=200)
    # our own commits are what the core holds already
    book.committed_here(g, [("t", 0, 13, "")], 300)
    assert book.take_newer(g) is None


def test_a_claimed_group_without_offsets_loads_nothing():
    book = OffsetBook("a")
    assert book.claim("new") == Takeover("new", claimed=True)


def test_rehoming_follows_the_coordination_set():
    book = OffsetBook("a")
    g = next(g for g in (f"g{i}" for i in range(1000))
             if coordinator_for(g, ["a", "b"]) == "a" and coordinator_for(g, ["a", "b", "c"]) == "c")
    book.merge_entry(chunk_value(g, "t", {0: (1, "", 10)}))
    takeover, actions = book.on_cluster_change(frozenset({"a", "b"}), {g})
    assert not takeover   # the first view: nothing moved here
    assert actions == [Takeover(g, load=(("t", 0, 1, ""),), adopt=(("t", 0, 1, "", 10),), claimed=True,
                                newest_ms=10)]
    book.adopted(g, actions[0].adopt)   # the shell made them durable here
    assert book.on_cluster_change(frozenset({"a", "b"}), set()) == (False, [])
    # a newcomer joins: the group moves to it (and a takeover grace starts here: any change)
    takeover, actions = book.on_cluster_change(frozenset({"a", "b", "c"}), set())
    assert takeover and actions == [Moved(g, "c")] and not book.is_mine(g)   # (any change: a split may heal)
    # c and b leave: the group comes back (adopted before, so only loaded), and the core
    # must hold its partitions for a while
    takeover, actions = book.on_cluster_change(frozenset({"a"}), set())
    assert takeover and actions == [Takeover(g, load=(("t", 0, 1, ""),), claimed=True, newest_ms=10)]
    assert book.is_mine(g) and book.coord_set == frozenset({"a"})


def test_changed_groups_of_ours_are_taken_newer_after_rehoming():
    book = OffsetBook("a")
    g = group_on("a", ["a"])
    book.on_cluster_change(frozenset({"a"}), set())
    book.claim(g)
    changed = book.merge_entry(chunk_value(g, "t", {2: (5, "", 50)}))
    takeover, actions = book.on_cluster_change(frozenset({"a"}), changed)
    assert not takeover and actions == [Takeover(g, load=(("t", 2, 5, ""),), adopt=(("t", 2, 5, "", 50),),
                                                 newest_ms=50)]


def test_takeover_is_due_when_a_broker_left_or_a_lone_node_meets_others():
    s = frozenset
    assert not takeover_due(None, s({"a"}), "a")
    assert takeover_due(s({"a", "b"}), s({"a", "b", "c"}), "a")   # a split that healed brings groups too
    assert not takeover_due(s({"a", "b"}), s({"a", "b"}), "a")
    assert takeover_due(s({"a", "b"}), s({"a"}), "a")
    assert takeover_due(s({"a", "b"}), s({"a", "c"}), "a")
    assert takeover_due(s({"a"}), s({"a", "b"}), "a")


def test_pruning_forgets_groups_that_ended():
    book = OffsetBook("a")
    book.claim("ended")
    book.claim("active")
    book.claim("committed")
    book.merge_entry(chunk_value("committed", "t", {0: (1, "", 1)}))
    assert book.prune(lambda g: g == "active") == ["ended"]
    assert not book.is_mine("ended") and book.is_mine("active") and book.is_mine("committed")


def test_the_coordination_set_and_a_lone_start():
    members = [SimpleNamespace(node_id=n, status=s) for n, s in
               [("a", "alive"), ("b", "suspect"), ("c", "dead"), ("d", "left")]]
    assert coordination_set(members) == frozenset({"a", "b"})
    assert coordinator_among("g", []) is None
    assert coordinator_among("g", ["a"]) == "a"
    assert starts_alone(False, ["a"], "a")
    assert not starts_alone(True, ["a"], "a")
    assert not starts_alone(False, ["a", "b"], "a")


@pytest.mark.parametrize("partitions", [[[1, 2], ["a", 3]], [[["x"], 1]], [["t", -1]], "tt", [["t"]]])
def test_offsets_from_the_merged_view_check_what_they_are_asked_for(partitions):
    """A broker that does not coordinate the group answers a fetch of offsets from the merged
    view; a bad list raised TypeError there, which rolled back the whole turn (every produce
    of it refused): sent in a loop, it stopped every producer on that broker."""
    from mesh.wire.errors import ErrorCode, MeshError
    with pytest.raises(MeshError) as exc:
        OffsetBook("a").offsets_for("g", partitions)
    assert exc.value.code == ErrorCode.INVALID_REQUEST
    assert OffsetBook("a").offsets_for("g", [["t", 0]]) == [["t", 0, -1, ""]]


# -- deletion: tombstones and their garbage ------------------------------------------------

def test_a_tombstone_wins_over_older_commits_and_the_views_hide_it():
    book = OffsetBook("a")
    book.merge_entry(chunk_value("g", "t", {0: (10, "", 5_000), 1: (11, "", 5_000)}))
    # this node's clock is behind the last committer's: the deletion is stamped above it all
    stamp = book.next_stamp(1_000, "g")
    assert stamp == 5_001
    book.committed_here("g", [("t", 0, -1, ""), ("t", 1, -1, "")], stamp)
    assert not book.knows("g") and book.groups() == [] and book.committed("g") == {}
    assert book.offsets_for("g", None) == []
    assert book.offsets_for("g", [["t", 0]]) == [["t", 0, -1, ""]]
    assert book.merge_entry(chunk_value("g", "t", {0: (99, "", 5_000)})) == set()   # older: ignored
    # a commit after the deletion starts the group again
    book.committed_here("g", [("t", 1, 3, "")], book.next_stamp(1_000, "g"))
    assert book.committed("g") == {("t", 1): (3, "", 5_002)}


def test_collect_drops_superseded_entries_at_once_and_tombstones_after_the_horizon():
    book = OffsetBook("a")
    book.committed_here("g", [("t", 0, 10, ""), ("t", 1, 11, "")], 1_000)
    book.committed_here("h", [("t", 0, 7, "")], 1_000)
    assert book.collect(2_000, horizon_ms=10_000) == {}
    # another broker deleted g: a's own entries are superseded, planned at once ...
    book.merge_entry(chunk_value("g", "t", {0: (-1, "", 4_000), 1: (-1, "", 4_000)}))
    plan = book.collect(2_000, horizon_ms=10_000, busy=lambda g, t, p: p == 1)
    assert plan == {("g", "t", 0): [(0, 10, 1_000)]}          # (partition 1 has a write this turn)
    assert book.has_chunk(("g", "t", 0))                       # ... and forgotten once synced
    assert book.collected(plan) == [("g", "t", 0)]
    plan = book.collect(2_000, horizon_ms=10_000)
    assert plan == {("g", "t", 0): [(1, 11, 1_000)]}
    book.committed_here("g", [("t", 1, 12, "")], 5_000)      # (a commit since the plan: kept)
    assert book.collected(plan) == [("g", "t", 0)] and book.own_chunks() == [("g", "t", 0), ("h", "t", 0)]
    assert book.committed("g") == {("t", 1): (12, "", 5_000)}
    # a's own tombstone (it deleted h) is kept until the horizon, then goes, from the view too
    book.committed_here("h", [("t", 0, -1, "")], 6_000)
    assert book.collect(15_999, horizon_ms=10_000) == {}
    assert not book.knows("h") and book.groups() == ["g"]
    plan = book.collect(16_001, horizon_ms=10_000)
    assert plan == {("h", "t", 0): [(0, -1, 6_000)]}
    book.collected(plan)
    assert not book.has_chunk(("h", "t", 0)) and "h" not in book._merged and "h" not in book._tombstoned
    assert book._merged["g"] == {("t", 1): (12, "", 5_000)} and book._tombstoned == set()


def test_keys_gone_from_a_namespace_are_forgotten():
    book = OffsetBook("a")
    assert book.entry_moved("b", "off/g/t/0", (1, 3, False)) and book.entry_moved("b", "off/h/t/0", (1, 4, False))
    book.forget_keys("b", ["off/h/t/0"])
    assert book._seen_keys == {"b": {"off/h/t/0": (1, 4, False)}}


@pytest.mark.parametrize("seed", range(40))
def test_books_converge_and_a_deletion_that_saw_every_commit_wins_whatever_the_clocks(seed):
    """Three brokers with clocks seconds apart commit, delete and collect while their
    namespaces reach each other in any order; once every namespace reached every broker
    they agree, and a deletion made by the broker with the slowest clock, after it saw
    every commit, deletes the group everywhere. (Stamped by its wall clock alone, such a
    deletion lost to the commits it had seen, and the group came back.)"""
    rng = random.Random(seed)
    nodes = ["a", "b", "c"]
    skew = {n: rng.randint(-5_000, 5_000) for n in nodes}
    books = {n: OffsetBook(n) for n in nodes}
    now = 100_000

    def gossip(src: str, dst: str) -> None:
        for chunk in books[src].own_chunks():
            books[dst].merge_entry(books[src].chunk_entry(chunk)[1])

    def everywhere() -> None:
        for src in nodes:
            for dst in nodes:
                gossip(src, dst)

    def delete_at(n: str) -> None:
        known = books[n].committed("g")
        if known:
            books[n].committed_here("g", [(t, p, -1, "") for t, p in sorted(known)],
                                    books[n].next_stamp(now + skew[n], "g"))

    for _ in range(300):
        now += rng.randint(0, 30)
        n = rng.choice(nodes)
        op = rng.random()
        if op < 0.4:
            books[n].committed_here("g", [("t", rng.randrange(4), rng.randrange(1_000), "")],
                                    books[n].next_stamp(now + skew[n], "g"))
        elif op < 0.5:
            delete_at(n)
        elif op < 0.9:
            gossip(rng.choice(nodes), n)
        else:
            books[n].collect(now, horizon_ms=10 ** 9)
    everywhere()
    assert books["a"].committed("g") == books["b"].committed("g") == books["c"].committed("g")
    slowest = min(nodes, key=lambda n: skew[n])
    books[slowest].committed_here("g", [("t", 0, 1, "")], books[slowest].next_stamp(now + skew[slowest], "g"))
    delete_at(slowest)
    everywhere()
    for n in nodes:
        books[n].collect(now, horizon_ms=10 ** 9)
    everywhere()
    assert not any(books[n].knows("g") for n in nodes)


def test_stamps_stay_above_what_was_seen_and_one_group_never_pushes_another():
    """A peer's entry almost a minute ahead, then a burst of commits: every stamp went one
    millisecond further, for every group of the node, until gossip refused them (found by
    review); so stamps are per group. They were also capped at 30 s ahead of the clock, so
    after an entry further ahead (a coordinator whose clock was ahead) every commit lost to
    it, though acknowledged (found by review): never capped."""
    book = OffsetBook("a")
    book.merge_entry(chunk_value("g", "t", {0: (1, "", 1_000 + 59_500)}))
    stamps = [book.next_stamp(1_000, "g") for _ in range(600)]
    assert stamps == list(range(1_000 + 59_501, 1_000 + 59_501 + 600))
    book.fold("g", "t", 0, 5, "", 1_000 + 7_200_000)        # two hours ahead
    assert book.next_stamp(1_000, "g") == 1_000 + 7_200_001
    assert book.next_stamp(1_000, "h") == 1_000                     # another group: its own clock
    assert book.next_stamp(1_000, "h") == 1_001                     # (strictly increasing per group)


def test_an_own_tombstone_that_a_newer_commit_replaced_is_collected_at_once():
    """The group started again through another coordinator: the tombstones of this node
    stayed in its store and namespace for good (found by review)."""
    book = OffsetBook("a")
    book.committed_here("g", [("t", 0, -1, "")], 1_000)
    book.merge_entry(chunk_value("g", "t", {0: (5, "", 2_000)}))
    plan = book.collect(3_000, horizon_ms=10 ** 9)
    assert plan == {("g", "t", 0): [(0, -1, 1_000)]}
    book.collected(plan)
    assert book.own_chunks() == [] and book.committed("g") == {("t", 0): (5, "", 2_000)}
