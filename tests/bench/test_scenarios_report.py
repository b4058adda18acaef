"""Scenario expansion (quick, rate-sweep, dsbs with the paper's parallelism, --rate) and the
report pieces built from canned rows: the headline, the peer side-by-side table, plots."""
from __future__ import annotations

import os

import pytest

from bench.scenarios import DSBS_PARALLEL, RATE_SWEEP, get_scenario


def test_quick_is_the_replicated_system_at_a_rate_plus_a_max_throughput_cell():
    latency, peak = get_scenario("quick").cells()
    for c in (latency, peak):
        assert (c.workload.replication_factor, c.workload.acks) == (3, "all")
    assert latency.workload.rate == 10_000 and latency.workload.mode == "streaming"
    assert latency.workload.messages == 0 and latency.workload.duration_s > 0
    assert peak.workload.rate == 0 and peak.workload.batch > 1 and peak.workload.messages > 0
    assert latency.id != peak.id and "r10000" in latency.id


def test_rate_flag_paces_the_latency_cell_and_leaves_the_max_cell_unpaced():
    latency, peak = get_scenario("quick").with_overrides({"rate": [20_000]}).cells()
    assert latency.workload.rate == 20_000 and peak.workload.rate == 0
    cells = get_scenario("quick").with_overrides({"rate": [5_000, 20_000]}).cells()
    assert sorted(c.workload.rate for c in cells if c.workload.batch == 0) == [5_000, 20_000]


def test_rate_sweep_expands_to_one_streaming_cell_per_rate():
    cells = get_scenario("rate-sweep").cells()
    assert [c.workload.rate for c in cells] == list(RATE_SWEEP)
    assert len({c.id for c in cells}) == len(cells)
    for c in cells:
        w = c.workload
        assert (w.mode, w.batch, w.replication_factor, w.acks) == ("streaming", 0, 3, "all")
        assert f"r{w.rate}" in c.id
    narrowed = get_scenario("rate-sweep").with_overrides({"rate": [1_000, 3_000]}).cells()
    assert [c.workload.rate for c in narrowed] == [1_000, 3_000]


def test_dsbs_runs_every_cell_with_the_papers_parallelism_and_with_one_of_each():
    cells = get_scenario("dsbs").cells()
    by_par: dict = {}
    for c in cells:
        w = c.workload
        by_par.setdefault((w.producers, w.consumers), set()).add((w.message_bytes, w.batch, w.mode))
    assert set(by_par) == {(p["producers"][0], p["consumers"][0]) for p in DSBS_PARALLEL} == {(3, 3), (1, 1)}
    assert by_par[(3, 3)] == by_par[(1, 1)] and len(by_par[(1, 1)]) == 30
    assert len({c.id for c in cells}) == len(cells) == 60
    assert all(c.workload.consumers <= c.workload.partitions for c in cells)
    assert any("-p3-c3" in c.id for c in cells) and any("-p1-c1" in c.id for c in cells)
    # the paper's threads are requests in flight; one of each keeps the client's default
    assert {(c.workload.producers, c.workload.in_flight) for c in cells} == {(3, 15), (1, 5)}
    # the old single sweeps are unchanged in naming: smoke's cells name no extra knob
    assert [c.id for c in get_scenario("smoke").cells()] == ["c00-64B-b20-split", "c01-64B-b20-streaming"]


def _cell(name, rate, produce_rps, **kw):
    row = {"cell": name, "rate": rate, "produce_rps": produce_rps, "consume_rps": produce_rps, "batch": 0,
           "linger_ms": 5, "replication_factor": 3, "acks": "all", "producers": 1, "consumers": 1,
           "ack_p50_ms": 1.0, "ack_p99_ms": 3.0, "e2e_p50_ms": 2.0, "e2e_p99_ms": 5.0}
    row.update(kw)
    return row


def test_headline_marks_saturated_cells_and_lists_max_throughput_apart():
    from bench.report import headline_rows
    paced, unpaced = headline_rows([_cell("a", 10_000, 9_990), _cell("b", 160_000, 90_000),
                                    _cell("m", 0, 500_000, batch=100)])
    assert [r[0] for r in paced] == ["a", "b"] and [r[0] for r in unpaced] == ["m"]
    assert paced[0][-1] == "below saturation" and paced[1][-1] == "saturated"
    assert paced[0][1] == "3/all/1/1" and paced[0][2] == "10,000" and paced[0][3] == "9,990"
    assert unpaced[0][3] == "500,000"


CANNED = {
    "mesh-rf3": {"latency": {"p50_ms": 2.0, "p99_ms": 4.0, "p999_ms": 6.0, "mean_ms": 2.5}, "produce_rps": 200_000.0,
                 "consume_rps": 800_000.0, "e2e": {"p50_ms": 4.0, "p99_ms": 8.0, "p999_ms": 10.0, "rate": 10_000}},
    "nats-r3": {"latency": {"p50_ms": 0.5, "p99_ms": 2.0, "p999_ms": 3.0, "mean_ms": 0.6}, "produce_rps": 20_000.0,
                "consume_rps": 80_000.0, "e2e": {"p50_ms": 3.0, "p99_ms": 24.0, "p999_ms": 40.0, "rate": 10_000}},
    "mesh-rf1": {"latency": {"p50_ms": 1.0, "p99_ms": 2.0, "p999_ms": 2.5, "mean_ms": 1.1}, "produce_rps": 300_000.0,
                 "consume_rps": 900_000.0},
}


def test_peer_table_puts_systems_side_by_side_with_the_ratio():
    from bench.peer import side_by_side
    text = side_by_side(CANNED)
    lines = text.splitlines()
    assert "mesh 3 brokers RF 3 acks=all" in lines[0] and "NATS JetStream R3" in lines[0]
    p50 = next(ln for ln in lines if ln.startswith("| blocking publish p50"))
    assert "| 2.00 | 0.50 | 4.00x |" in p50
    assert p50.rstrip(" |").endswith("lower")
    thr = next(ln for ln in lines if ln.startswith("| async publish"))
    assert "| 200,000 | 20,000 | 10.00x |" in thr
    # NATS R1 missing (failed): its cells and ratio are "-", the others still shown
    assert "| 300,000 | - | - |" in thr
    e2e = next(ln for ln in lines if ln.startswith("| end-to-end p99 at a fixed rate (ms)"))
    assert "| 8.00 | 24.00 | 0.33x |" in e2e and e2e.rstrip(" |").endswith("lower")
    # mesh RF 1 ran without the end-to-end phase (an older run): "-", not an error
    assert "| - | - | - |" in e2e


def test_latency_summary_percentiles():
    from bench.peer_nats import latency_summary
    s = latency_summary([i * 1_000_000 for i in range(1, 101)])   # 1..100 ms
    assert s["p50_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01)
    assert s["max_ms"] == 100 and s["samples"] == 100
    assert latency_summary([]) == {}


def test_plots_from_canned_rows(tmp_path):
    from bench import plots
    from bench.peer import SYSTEMS
    cells = [_cell(f"c{i}", r, min(r, 60_000), ack_p99_ms=3.0 if r < 60_000 else 900.0)
             for i, r in enumerate(RATE_SWEEP)]
    assert plots.plot_rate_sweep(str(tmp_path / "sweep.png"), cells) is True
    assert plots.plot_rate_sweep(str(tmp_path / "none.png"), cells[:1]) is False
    plots.plot_latency(str(tmp_path / "lat.png"), cells)
    plots.plot_throughput(str(tmp_path / "thr.png"), cells)
    plots.plot_peer(str(tmp_path / "peer.png"), CANNED, SYSTEMS)
    for name in ("sweep.png", "lat.png", "thr.png", "peer.png"):
        assert os.path.getsize(tmp_path / name) > 5000, name
    assert not (tmp_path / "none.png").exists()


def test_log_axis_only_when_values_span_widely():
    from bench.plots import _ticks_125, short_num
    assert _ticks_125(1, 1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert [short_num(v) for v in (0.42, 12, 12_345, 1_500_000)] == ["0.42", "12", "12.3k", "1.5M"]


def test_dsbs_report_shows_both_parallelisms_beside_the_paper():
    from bench.report import _dsbs_tables, _paper_section
    cells = [{"cell": f"c{p}", "mode": "split", "message_bytes": 32, "batch": 20, "producers": p, "consumers": p,
              "produce_rps": 100_000.0 * p, "consume_rps": 50_000.0 * p, "produce_kBps": 3_200.0 * p,
              "consume_kBps": 1_600.0 * p} for p in (3, 1)]
    parts, pairs = _paper_section(cells)
    size_table = parts[0]
    p3 = next(ln for ln in size_table.splitlines() if "| production |" in ln and "| 3/3 |" in ln)
    p1 = next(ln for ln in size_table.splitlines() if "| production |" in ln and "| 1/1 |" in ln)
    assert "| 300,000 | 213,546 | 1.40x |" in p3 and "| 100,000 | 213,546 | 0.47x |" in p1
    assert {lab.split()[-1] for lab, _, _ in pairs} == {"3/3", "1/1"}
    dsbs = [{"mode": "split", "side": "production", "producers": p, "consumers": p, "batch": 20, "message_bytes": s,
             "rps": float(p * s), "kBps": 1.0} for p in (3, 1) for s in (32, 64)]
    rps_table = _dsbs_tables(dsbs)[0]
    assert "| split | production | 3/3 | 20 | 96 | 192 |" in rps_table
    assert "| split | production | 1/1 | 20 | 32 | 64 |" in rps_table
