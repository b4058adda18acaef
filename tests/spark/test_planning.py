"""Offset planning of the Spark source (mesh.spark.planning): pure, no broker, no Spark session."""
import pytest

from mesh.spark.options import MeshOptions, MeshSparkError
from mesh.spark.planning import plan_partitions, rate_limit, resolve_offsets
from mesh.wire.messages import EARLIEST, LATEST

A, B = ("t", 0), ("t", 1)
LEADERS = {A: "h:1", B: None}
STARTS, ENDS = {A: 10, B: 0}, {A: 50, B: 30}


class Lister:
    """Stands in for the cluster's ListOffsets; records what was asked."""

    def __init__(self):
        self.asked = []

    def __call__(self, leaders, which):
        self.asked.append((sorted(leaders), which))
        return {tp: (STARTS if which == EARLIEST else ENDS)[tp] for tp in leaders}


def opts(**kw):
    return MeshOptions({"bootstrap": "h:1", "topic": "t", **kw})


def test_earliest_and_latest_ask_the_leaders():
    lo = Lister()
    assert resolve_offsets("earliest", "latest", LEADERS, lo, what="startingOffsets",
                           allow=("earliest", "latest")) == STARTS
    assert resolve_offsets(None, "latest", LEADERS, lo, what="startingOffsets", allow=("earliest", "latest")) == ENDS
    assert lo.asked == [([A, B], EARLIEST), ([A, B], LATEST)]


def test_json_offsets_mix_numbers_with_earliest_and_latest_and_default_the_rest():
    lo = Lister()
    got = resolve_offsets('{"t": {"0": 23}}', "earliest", LEADERS, lo, what="startingOffsets",
                          allow=("earliest", "latest"))
    assert got == {A: 23, B: 0} and lo.asked == [([B], EARLIEST)]
    got = resolve_offsets('{"t": {"0": -1, "1": 5}}', "earliest", LEADERS, lo, what="startingOffsets",
                          allow=("earliest", "latest"))
    assert got == {A: 50, B: 5}


@pytest.mark.parametrize("spec,allow,why", [
    ("latest", ("earliest",), "not allowed here"),
    ("soon", ("earliest", "latest"), "must be"),
    ('{"t": {"7": 1}}', ("earliest", "latest"), "not subscribed or do not exist"),
    ('{"t": {"0": -5}}', ("earliest", "latest"), "negative"),
    ('{"t": {"0": -2}}', ("latest",), "not allowed"),
])
def test_bad_offset_specs_are_named(spec, allow, why):
    with pytest.raises(MeshSparkError, match=why):
        resolve_offsets(spec, "latest", LEADERS, Lister(), what="endingOffsets", allow=allow)


def test_one_task_per_non_empty_range_with_its_leader():
    parts = plan_partitions({A: 10, B: 30}, {A: 50, B: 30}, LEADERS, opts())
    assert [(p.topic, p.partition, p.start, p.end, p.leader) for p in parts] == [("t", 0, 10, 50, "h:1")]


def test_min_partitions_cuts_ranges_in_proportion_to_their_size():
    parts = plan_partitions({A: 0, B: 0}, {A: 30, B: 10}, LEADERS, opts(minPartitions="4"), frozenset({B}))
    assert [(p.partition, p.start, p.end, p.new_partition) for p in parts] == [
        (0, 0, 10, False), (0, 10, 20, False), (0, 20, 30, False), (1, 0, 10, True)]
    assert plan_partitions({A: 0}, {A: 2}, LEADERS, opts(minPartitions="5"))[-1].end == 2  # never empty pieces
    assert len(plan_partitions({A: 0}, {A: 2}, LEADERS, opts(minPartitions="5"))) == 2


def test_rate_limit_never_goes_backwards_or_past_the_end():
    begin, end = {A: 5, B: 0}, {A: 5, B: 3}
    assert rate_limit(begin, end, 2) == {A: 5, B: 2}
