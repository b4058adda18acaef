"""The Jepsen-style checker (``mesh.testing.checker``) on made-up histories: each kind of
anomaly is found and counted once; client recovery is measured from the fault."""
import pytest

from mesh.testing.checker import _inversions, check
from mesh.testing.history import Op, parse_value, value_of
from mesh.testing.nemesis import Fault, parse_faults


def _op(n, p, outcome="ok", offset=None, proc=0, t=0.0, done=0.5, mw=None):
    return Op(proc, n, f"p{proc}-{n}", p, t, outcome, offset, done, None, mw)


def test_checker_finds_each_kind_of_violation():
    """The checker itself, on a made-up history: each anomaly is counted once."""
    ops = [_op(0, 0, offset=0), _op(1, 0, offset=1), _op(2, 0, offset=2), _op(3, 0, offset=3),
           _op(4, 0, offset=9),                       # lost
           _op(5, 0, "fail", mw=False),               # failed, yet written
           _op(6, 1, offset=0, t=10.0, done=11.5)]   # acked 1.5 s after the fault at t=10
    log = {0: [(0, "p0-0"), (1, "p0-2"), (2, "p0-1"), (3, "p0-3"), (4, "p0-3"), (5, "p0-5"), (6, "x-1")],
           1: [(0, "p0-6")]}
    res = check(ops, log, [Fault("kill", ["n1"], 10.0, 12.0, "kill n1")])
    assert res.lost == 1
    assert res.duplicated == 1 and res.acked_duplicated == 1      # p0-3 twice
    assert res.phantoms == 1                                        # x-1
    assert res.offset_mismatches == 2                               # p0-1 and p0-2 swapped
    assert res.log_order_violations == 1                            # p0-1 stored after p0-2
    assert res.order_violations == 0                                # the acks said 1 then 2
    assert res.failed_but_written == 1
    assert res.recoveries_s == [1.5]
    assert not res.ok
    clean = check(ops[:4], {0: [(0, "p0-0"), (1, "p0-1"), (2, "p0-2"), (3, "p0-3")]})
    assert clean.ok and clean.acked == 4, clean.summary()


def test_order_violations_count_the_fewest_values_out_of_place():
    assert _inversions([0, 1, 2, 3]) == []
    assert _inversions([0, 900, 1, 2, 3]) == [1]   # one value far away counts once
    assert len(_inversions([3, 2, 1])) == 2


def test_recovery_waits_for_every_producer_and_partition():
    ops = [_op(0, 0, offset=0, t=10.1, done=10.2), _op(1, 1, offset=0, t=10.2, done=13.0),
           _op(0, 0, offset=1, proc=1, t=10.3, done=10.4)]
    res = check(ops, {0: [(0, "p0-0"), (1, "p1-0")], 1: [(0, "p0-1")]}, [Fault("pause", ["n2"], 10.0)])
    assert res.ok and res.recoveries_s == [pytest.approx(3.0)]
    never = check(ops[:1] + [_op(5, 1, "info", t=10.5, done=None)], {0: [(0, "p0-0")]},
                  [Fault("kill", ["n1"], 10.0)])
    assert never.recoveries_s == [None] and never.unrecovered == 1


def test_values_and_fault_names_parse():
    assert parse_value(value_of(3, 17)) == (3, 17)
    assert parse_value("x-1") is None and parse_value(b"p1-") is None
    assert parse_faults("kill,pause") == ["kill", "pause"]
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("kill,flood")


def test_partitions_are_skipped_with_a_reason_when_not_root(monkeypatch):
    from mesh.testing import netns
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    ok, why = netns.netns_available()
    assert not ok and "root" in why and "skipped" in why


def test_a_client_stuck_after_the_final_heal_fails_the_run():
    ops = [_op(0, 0, offset=0, t=1.0, done=1.1), _op(1, 0, "info", t=20.0, done=None)]
    res = check(ops, {0: [(0, "p0-0")]}, [], healed_t=19.0)
    assert res.liveness_failed and not res.ok
    ok = check(ops[:1] + [_op(1, 0, offset=1, t=20.0, done=20.3)], {0: [(0, "p0-0"), (1, "p0-1")]}, [],
               healed_t=19.0)
    assert ok.ok and ok.liveness_s == pytest.approx(1.3)
