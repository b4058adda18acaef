"""Assignors: Kafka's shapes for range and round-robin, balance and stickiness for sticky."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.groups.assignors import ASSIGNORS, assign

ALL = sorted(ASSIGNORS)


def subs(**members):
    return {m: frozenset(topics) for m, topics in members.items()}


def shape(result):
    return {m: sorted(parts) for m, parts in result.items()}


# -- Kafka's documented examples ---------------------------------------------------------

def test_range_matches_kafka_example():
    # RangeAssignor javadoc: two consumers, two topics of three partitions each.
    result = assign("range", subs(C0=["t0", "t1"], C1=["t0", "t1"]), {"t0": 3, "t1": 3})
    assert shape(result) == {
        "C0": [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)],
        "C1": [("t0", 2), ("t1", 2)],
    }


def test_round_robin_matches_kafka_examples():
    result = assign("round-robin", subs(C0=["t0", "t1"], C1=["t0", "t1"]), {"t0": 3, "t1": 3})
    assert shape(result) == {
        "C0": [("t0", 0), ("t0", 2), ("t1", 1)],
        "C1": [("t0", 1), ("t1", 0), ("t1", 2)],
    }
    # RoundRobinAssignor javadoc, different subscriptions.
    result = assign("round-robin", subs(C0=["t0"], C1=["t0", "t1"], C2=["t0", "t1", "t2"]),
                    {"t0": 1, "t1": 2, "t2": 3})
    assert shape(result) == {
        "C0": [("t0", 0)],
        "C1": [("t1", 0)],
        "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)],
    }


def test_range_extra_partitions_go_to_the_first_members():
    result = assign("range", subs(a=["t"], b=["t"], c=["t"]), {"t": 7})
    assert shape(result) == {
        "a": [("t", 0), ("t", 1), ("t", 2)],
        "b": [("t", 3), ("t", 4)],
        "c": [("t", 5), ("t", 6)],
    }


@pytest.mark.parametrize("name", ALL)
def test_edge_cases(name):
    assert assign(name, {}, {"t": 3}) == {}
    # unknown topic and a topic with no partitions give nothing
    assert shape(assign(name, subs(a=["nope"], b=[]), {"t": 3})) == {"a": [], "b": []}
    # more members than partitions: some get none, none gets two
    result = assign(name, subs(a=["t"], b=["t"], c=["t"]), {"t": 2})
    assert sorted(len(v) for v in result.values()) == [0, 1, 1]


# -- properties --------------------------------------------------------------------------

TOPICS = ["a", "b", "c", "d"]

scenario = st.fixed_dictionaries({
    "partitions": st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12)),
    "members": st.dictionaries(st.text("mnopqrs", min_size=1, max_size=3),
                               st.frozensets(st.sampled_from(TOPICS)), max_size=8),
})


@settings(max_examples=150, deadline=None)
@given(scenario, st.sampled_from(ALL))
def test_every_partition_exactly_once_to_a_subscriber(sc, name):
    # assign() itself asserts this; here we check it from the outside too.
    result = assign(name, sc["members"], sc["partitions"])
    expected = {(t, p) for t, n in sc["partitions"].items()
                if any(t in s for s in sc["members"].values()) for p in range(n)}
    got = [tp for parts in result.values() for tp in parts]
    assert len(got) == len(set(got)) and set(got) == expected
    for m, parts in result.items():
        assert all(t in sc["members"][m] for t, _ in parts)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10), st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 20), min_size=1),
       st.sampled_from(ALL))
def test_same_subscriptions_are_balanced_within_one(n_members, partitions, name):
    members = {f"m{i}": frozenset(partitions) for i in range(n_members)}
    loads = [len(v) for v in assign(name, members, partitions).values()]
    if name == "range":  # range balances per topic only, as in Kafka
        return
    assert max(loads) - min(loads) <= 1


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(0, 40), st.data())
def test_sticky_moves_only_what_it_must(n_members, n_partitions, data):
    partitions = {"t": n_partitions}
    members = {f"m{i}": frozenset({"t"}) for i in range(n_members)}
    before = assign("cooperative-sticky", members, partitions)
    # a member joins: the old members keep everything they keep, and only the newcomer gains
    joined = dict(members, newcomer=frozenset({"t"}))
    after = assign("cooperative-sticky", joined, partitions, before)
    for m in members:
        assert after[m] <= before[m]
    moved = sum(len(before[m] - after[m]) for m in members)
    assert moved == len(after["newcomer"]) == n_partitions // (n_members + 1)
    # a member leaves: the others keep everything they had
    gone = data.draw(st.sampled_from(sorted(joined)))
    rest = {m: s for m, s in joined.items() if m != gone}
    final = assign("cooperative-sticky", rest, partitions, after)
    for m in rest:
        assert after[m] <= final[m]
    loads = [len(v) for v in final.values()]
    assert max(loads) - min(loads) <= 1


def test_sticky_ignores_invalid_current_ownership():
    members = subs(a=["t"], b=["t"])
    current = {"a": frozenset({("t", 0), ("t", 9), ("gone", 0)}), "b": frozenset({("t", 0)})}
    result = assign("cooperative-sticky", members, {"t": 4}, current)
    assert ("t", 0) in result["a"]          # first claimant in id order keeps it
    assert all(p < 4 for _, p in result["a"] | result["b"])
    assert sorted(len(v) for v in result.values()) == [2, 2]


def test_sticky_heterogeneous_is_locally_balanced():
    members = subs(a=["x"], b=["x", "y"], c=["y"])
    result = assign("cooperative-sticky", members, {"x": 4, "y": 4})
    assert sorted(len(v) for v in result.values()) == [2, 3, 3]


def test_assignors_are_deterministic():
    rng = random.Random(7)
    members = {f"m{i}": frozenset(rng.sample(TOPICS, 2)) for i in range(6)}
    partitions = {t: rng.randint(1, 9) for t in TOPICS}
    for name in ALL:
        reordered = dict(reversed(list(members.items())))
        assert assign(name, members, partitions) == assign(name, reordered, partitions)


def test_sticky_scales():
    members = {f"m{i:03}": frozenset({"t"}) for i in range(200)}
    before = assign("cooperative-sticky", members, {"t": 5000})
    members["zzz"] = frozenset({"t"})
    after = assign("cooperative-sticky", members, {"t": 5000}, before)
    assert len(after["zzz"]) == 5000 // 201
