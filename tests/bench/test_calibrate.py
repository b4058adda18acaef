"""The machine probe written beside every bench run: real ZeroMQ and LMDB, a few seconds."""
from __future__ import annotations

from bench.calibrate import describe, probe


def test_probe_measures_a_wakeup_round_trip_and_a_synced_commit(tmp_path):
    cal = probe(str(tmp_path))
    rtt, tcp, sync, x3 = cal["wakeup_rtt_us"], cal["tcp_rtt_us"], cal["sync_commit_ms"], cal["sync_commit_x3_ms"]
    assert 0 < rtt["p50"] <= rtt["p99"] and 0 < tcp["p50"] <= tcp["p99"] and 0 < x3["p50"] <= x3["p99"]
    assert 0 < sync["p50"] <= sync["p99"]
    assert list(tmp_path.iterdir()) == []   # the probe's LMDB environment is gone
    line = describe(cal)
    assert line.startswith("ZeroMQ round trip between two processes p50 ") and "synced LMDB commit p50 " in line
    assert "; plain TCP round trip p50 " in line and "; the same, 3 at once p50 " in line


def test_a_failing_part_is_reported_and_does_not_fail_the_probe(tmp_path):
    cal = probe(str(tmp_path / "missing" / "dir"))
    assert "p50" in cal["wakeup_rtt_us"]
    assert "FileNotFoundError" in cal["sync_commit_ms"]["error"]
    assert "FileNotFoundError" in cal["sync_commit_x3_ms"]["error"]   # from the 3 processes, said as well
    assert "synced LMDB commit: FileNotFoundError" in describe(cal)
    assert describe(None) == describe({}) == "-"
