import collections

import pytest

from mesh.cluster.placement import place_replicas


@pytest.mark.parametrize("parts,rf,n", [(12, 3, 3), (12, 3, 5), (7, 2, 3), (1, 1, 1), (100, 3, 7)])
def test_leaders_and_replicas_are_spread(parts, rf, n):
    nodes = [f"n{i}" for i in range(n)]
    layout = place_replicas(parts, rf, nodes)
    assert len(layout) == parts
    for reps in layout:
        assert len(reps) == rf == len(set(reps))
    leaders = collections.Counter(r[0] for r in layout)
    assert max(leaders.values()) - min(leaders.get(x, 0) for x in nodes) <= 1
    replicas = collections.Counter(x for r in layout for x in r)
    assert max(replicas.values()) - min(replicas.get(x, 0) for x in nodes) <= 1


def test_start_goes_to_the_least_loaded():
    layout = place_replicas(1, 1, ["a", "b", "c"], {"a": 5, "b": 0, "c": 2})
    assert layout == [["b"]]


def test_rf_larger_than_cluster_is_a_clear_error():
    with pytest.raises(ValueError, match="larger than the 2 live brokers"):
        place_replicas(3, 3, ["a", "b"])
