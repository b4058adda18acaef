"""The peer scenario's end-to-end phase: the stamp it writes and reads, and the mesh side
against a real broker (the NATS side is in test_peer_nats.py, with the peer)."""
from __future__ import annotations

import pytest

from bench.cluster import LocalCluster, create_topic
from bench.peer_e2e import _count, _latency_ns, mesh_e2e, value_for
from bench.scenarios import BenchError
from mesh.client import Consumer


def test_a_value_carries_its_due_time_and_has_the_asked_size():
    v = value_for(1_700_000_000_123_456_789, 100)
    assert len(v) == 100
    # stamped in whole microseconds: the latency read back is exact to the microsecond
    assert _latency_ns(v, 1_700_000_000_125_456_789) == 2_000_789
    assert len(value_for(5_000, 3)) == 8    # shorter records are padded to hold the stamp


def test_the_phase_needs_a_rate_and_a_duration():
    assert _count(10_000, 5.0) == 50_000
    for rate, seconds in ((0, 5.0), (10_000, 0.0), (-1, 1.0)):
        with pytest.raises(BenchError, match="rate and a duration"):
            _count(rate, seconds)


@pytest.mark.integration
def test_mesh_e2e_receives_every_paced_record_in_another_process(tmp_path):
    cluster = LocalCluster(1, str(tmp_path / "logs")).start()
    try:
        create_topic(cluster.bootstrap, "e2e", 3, 1)
        res = mesh_e2e(cluster.bootstrap, "e2e", 100, 2_000, 1.0, partitions=3)
        with Consumer(bootstrap=cluster.bootstrap) as c:
            ends = c.end_offsets([("e2e", p) for p in range(3)])
    finally:
        cluster.stop()
    # every record was stored once and received, wherever the producer put it
    assert sum(ends.values()) == 2_000
    assert res["samples"] == 2_000 and res["rate"] == 2_000
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]
    # open loop: the producer kept the schedule (a late sender would be a lower rate)
    assert res["achieved_rps"] == pytest.approx(2_000, rel=0.2)


@pytest.mark.integration
def test_mesh_e2e_reports_a_consumer_that_cannot_read_as_a_clear_error(tmp_path):
    cluster = LocalCluster(1, str(tmp_path / "logs")).start()
    try:
        with pytest.raises(BenchError, match="end-to-end consumer"):
            mesh_e2e(cluster.bootstrap, "no-such-topic", 100, 100, 0.5)
    finally:
        cluster.stop()
