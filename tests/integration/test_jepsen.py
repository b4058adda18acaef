"""The Jepsen-style checker, short version: real brokers, seeded faults, every send
recorded, everything read back (``mesh.testing.jepsen``; the long version is
``bench soak``).

3 brokers, one topic of 3 partitions at RF 3, 2 producer processes at the default
settings (acks=all, idempotent); the nemesis kills a leader, pauses a leader and kills a
broker, then heals. Nothing acknowledged may be lost, duplicated, reordered or moved,
and nothing may appear that was never sent. (The checker's own test, on made-up
histories, is tests/unit/test_jepsen_checker.py.)
"""
import pytest

from mesh.testing.jepsen import JepsenConfig, run
from mesh.testing.netns import netns_available

pytestmark = pytest.mark.integration


def test_jepsen_short_run_loses_duplicates_and_reorders_nothing(tmp_path):
    cfg = JepsenConfig(str(tmp_path), seed=11, brokers=3, partitions=3, replication_factor=3, producers=2,
                       rate_per_s=100, fault_s=25, faults=["leader-kill", "pause", "kill"],
                       schedule=["leader-kill", "pause", "kill"],
                       hold_s=(2.0, 3.5), gap_s=(1.0, 2.0), quiet_s=2.0, drain_s=10.0)
    r = run(cfg)
    res = r.result
    print(res.summary())
    assert [f.kind for f in r.faults] == ["leader-kill", "pause", "kill"], r.faults
    assert res.acked > 1000, "too little was acknowledged for the run to prove anything"
    assert res.lost == 0, res.summary()
    assert res.phantoms == 0, res.summary()
    assert res.offset_mismatches == 0, res.summary()
    assert res.duplicated == 0, res.summary()
    assert res.order_violations == 0 and res.log_order_violations == 0, res.summary()
    assert res.unrecovered == 0, res.summary()


def test_jepsen_graceful_stop_and_rolling_restart_lose_nothing(tmp_path):
    """SIGTERM a leader (controlled shutdown: it hands its leaderships over, then leaves),
    then restart every broker in turn, waiting for all replicas in sync between two (an
    operator's rolling restart), under the same producers and checks."""
    cfg = JepsenConfig(str(tmp_path), seed=12, brokers=3, partitions=3, replication_factor=3, producers=2,
                       rate_per_s=100, fault_s=20, faults=["stop", "roll"], schedule=["stop", "roll"],
                       hold_s=(2.0, 3.0), gap_s=(1.0, 2.0), quiet_s=2.0, drain_s=10.0)
    r = run(cfg)
    res = r.result
    print(res.summary())
    stop, roll = r.faults
    assert (stop.kind, roll.kind) == ("stop", "roll"), r.faults
    # every stop was graceful (exit code 0), not the SIGKILL after 30 s
    assert stop.extra["exit_code"] == 0 and roll.extra["exit_codes"] == [0, 0, 0], r.faults
    assert sorted(roll.targets) == ["n1", "n2", "n3"], r.faults
    assert res.acked > 1000, "too little was acknowledged for the run to prove anything"
    assert res.lost == 0 and res.phantoms == 0 and res.offset_mismatches == 0, res.summary()
    assert res.duplicated == 0, res.summary()
    assert res.order_violations == 0 and res.log_order_violations == 0, res.summary()
    assert res.unrecovered == 0, res.summary()


def test_jepsen_network_partitions_between_brokers(tmp_path):
    """Brokers in network namespaces; the nemesis cuts broker-to-broker links (clients still
    reach every broker). Needs root and `ip netns`: skipped with the reason otherwise."""
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)
    cfg = JepsenConfig(str(tmp_path), seed=5, brokers=3, partitions=3, replication_factor=3, producers=2,
                       rate_per_s=100, fault_s=15, faults=["partition"], schedule=["partition", "partition"],
                       hold_s=(2.5, 3.5), gap_s=(1.0, 2.0), quiet_s=2.0, drain_s=10.0)
    r = run(cfg)
    res = r.result
    print(res.summary())
    assert [f.kind for f in r.faults] == ["partition", "partition"], r.faults
    assert res.acked > 500, "too little was acknowledged for the run to prove anything"
    assert res.lost == 0 and res.phantoms == 0 and res.offset_mismatches == 0, res.summary()
    assert res.duplicated == 0, res.summary()
    assert res.order_violations == 0 and res.log_order_violations == 0, res.summary()
    assert res.unrecovered == 0, res.summary()
