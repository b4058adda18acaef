"""The bench's durability modes (issue 41): the DSBS cells run with write caching when asked,
the report says which mode, and peer-nats says what each row's acknowledgement means."""
from bench.report import _durability
from bench.scenarios import get_scenario
from bench.worker_common import topic_config


def test_dsbs_cells_take_write_caching_and_their_topics_have_it():
    fsync = get_scenario("dsbs").cells()
    cached = get_scenario("dsbs").with_overrides({"write_caching": [True]}).cells()
    assert len(cached) == len(fsync)
    assert all(c.workload.write_caching for c in cached) and not any(c.workload.write_caching for c in fsync)
    assert topic_config(cached[0].workload)["write.caching"] == "true"
    assert "write.caching" not in topic_config(fsync[0].workload)


def test_the_report_says_which_durability_the_cells_had():
    assert _durability({"cells": [{"write_caching": False}]}).startswith("fsync")
    assert _durability({"cells": [{"write_caching": True}]}).startswith("write caching")
    assert _durability({}).startswith("fsync")   # a run recorded before the knob


def test_peer_nats_has_both_mesh_modes_beside_nats_r3_and_says_each_rows_durability():
    from bench.peer import DURABILITY, PAIRS, SYSTEMS, WRITE_CACHED
    keys = [k for k, *_ in SYSTEMS]
    assert {"mesh-rf3", "mesh-rf3-wc", "nats-r3", "nats-r1", "mesh-rf1"} <= set(keys)
    assert ("mesh-rf3", "nats-r3") in PAIRS and ("mesh-rf3-wc", "nats-r3") in PAIRS
    assert WRITE_CACHED == {"mesh-rf3-wc"} and set(DURABILITY) == set(keys)


def test_the_peer_report_puts_fsync_against_the_floor_and_write_caching_against_nats_r3():
    from bench.calibrate import floor_ms
    from bench.peer import against_targets
    cal = {"wakeup_rtt_us": {"p50": 150.0, "p99": 300.0}, "sync_commit_ms": {"p50": 0.5, "p99": 1.5}}
    assert floor_ms(cal) == 0.8 and floor_ms(cal, round_trips=1, syncs=0) == 0.15
    assert floor_ms({"wakeup_rtt_us": {"error": "x"}, "sync_commit_ms": {"p50": 0.5}}) is None and floor_ms(None) is None
    results = {"mesh-rf3": {"latency": {"p50_ms": 1.6}}, "mesh-rf3-wc": {"latency": {"p50_ms": 0.9}},
               "nats-r3": {"latency": {"p50_ms": 0.45}}}
    fsync, wc = against_targets(results, cal)
    assert "1.60 ms = 2.00x the floor 0.80 ms" in fsync and "target <= 2x" in fsync
    assert "0.90 ms = 2.00x NATS R3's 0.45 ms" in wc and "target <= 1x" in wc
    # a failed probe or a missing row: that line is left out, never a guess
    assert against_targets(results, None) == [wc]
    assert against_targets({"mesh-rf3": results["mesh-rf3"]}, cal) == [fsync]
    # with the commit measured 3 at once (an RF-3 write's replicas on one disk): judged by that floor, the other beside it
    shared = dict(cal, sync_commit_x3_ms={"p50": 0.9, "p99": 2.0})
    assert floor_ms(shared, shared_disk=True) == 1.2 and floor_ms(shared) == 0.8 and floor_ms(cal, shared_disk=True) is None
    (line, _) = against_targets(results, shared)
    assert "1.60 ms = 1.33x the floor 1.20 ms" in line and "while 3 commit at once" in line
    assert line.endswith("; 2.00x 0.80 ms with a commit alone")
    # the end-to-end row over 3 partitions and each mode's async publish, against NATS R3
    results["mesh-rf3"].update(e2e3={"p99_ms": 4.0}, produce_rps=480_000)
    results["mesh-rf3-wc"]["produce_rps"] = 320_000
    results["nats-r3"].update(e2e={"p99_ms": 8.0}, produce_rps=30_000)
    lines = against_targets(results, cal)
    assert lines[:2] == [fsync, wc]
    assert "end-to-end p99 over 3 partitions 4.00 ms = 0.50x NATS R3's 8.00 ms (target <= 1x)" in lines[2]
    assert "fsync, async publish 480,000 records/s = 16.0x NATS R3's 30,000 (target >= 16x)" in lines[3]
    assert "write caching, async publish 320,000 records/s = 10.7x" in lines[4] and len(lines) == 5
