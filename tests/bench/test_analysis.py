"""The Spark analysis on a small hand-built event set whose answers are computed here
independently, in plain Python; then the report and `bench compare` on its output."""
from __future__ import annotations

import csv
import json
import math
import os
import sys

import pytest

from bench.events import CONSUME, PRODUCE, EventBuffer, append_cell
from bench.scenarios import BenchError

pytestmark = pytest.mark.spark

S = 1_000_000_000          # ns per second
G = 1_700_000_000 * S      # the split cell's produce "go"
H = G + 100 * S            # the streaming cell's "go" (both sides)


def pct(values_weights: list[tuple[float, int]], p: float) -> float:
    """Weighted percentile by expansion: linear interpolation between closest ranks."""
    xs = sorted(v for v, w in values_weights for _ in range(w))
    pos = p * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def cell_row(cell, index, mode, size, batch, produce_go, consume_go, produced, **extra):
    row = {"cell": cell, "label": cell, "index": index, "mode": mode, "message_bytes": size, "batch": batch,
           "linger_ms": 5, "batch_bytes": 65536, "acks": "1", "in_flight": 5, "keys": False, "key_space": 1000,
           "producers": 1, "consumers": 1, "partitions": 2, "replication_factor": 1, "messages": produced,
           "duration_s": 0.0, "rate": 0, "group": None, "topic": "t", "produce_go_ns": produce_go,
           "produce_end_ns": produce_go + 3 * S, "consume_go_ns": consume_go, "consume_end_ns": consume_go + 3 * S,
           "produced": produced, "consumed": produced, "log_end": produced, "produce_errors": 0, "wall_s": 1.0}
    row.update(extra)
    return row


# split cell "A": 32 B records, batch 20 ------------------------------------------------
# (count, send offset from go, ack latency us); the 5th batch failed
A_PRODUCE = [(20, 0.0, 1_000), (20, 0.1, 2_000), (20, 0.2, 3_000), (20, 1.0, 10_000), (40, 1.99, 7_000)]
A_FAILED = (20, 1.5, 500)
A_CONSUME = [(50, 3.1), (30, 3.3), (40, 3.5)]   # (count, recv offset from go); consume go = G + 3 s
# streaming cell "B": 64 B records, batch 20; stamps and their counts per received batch
B_PRODUCE = [(20, 0.0, 4_000), (20, 0.5, 6_000)]
B_CONSUME = [(0.010, [(H // 1000, 20)]),                                   # 10 ms e2e for 20 records
             (0.520, [(H // 1000 + 500_000, 15), (H // 1000 + 505_000, 5)])]  # 20 ms and 15 ms


def build_run(run_dir: str) -> None:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump({"scenario": "handmade", "description": "hand-built events", "paper": True,
                   "environment": {"cpu_count": 2}, "cluster": {"started_by_bench": True, "brokers": 1}}, f)
    append_cell(run_dir, cell_row("A", 0, "split", 32, 20, G, G + 3 * S, 120))
    append_cell(run_dir, cell_row("B", 1, "streaming", 64, 20, H, H, 40))
    ev = EventBuffer(PRODUCE)
    for n, off, lat in A_PRODUCE:
        t = G + int(off * S)
        ev.add(cell="A", producer=0, partition=0, send_ns=t, intended_ns=t, ack_ns=t + lat * 1000, count=n,
               bytes=n * 32, error=None)
    n, off, lat = A_FAILED
    t = G + int(off * S)
    ev.add(cell="A", producer=0, partition=1, send_ns=t, intended_ns=t, ack_ns=t + lat * 1000, count=n,
           bytes=n * 32, error="TIMEOUT: no answer")
    for n, off, lat in B_PRODUCE:
        t = H + int(off * S)
        # intended earlier than send: latency counts from the intended time
        ev.add(cell="B", producer=0, partition=0, send_ns=t + 500_000, intended_ns=t, ack_ns=t + lat * 1000,
               count=n, bytes=n * 64, error=None)
    ev.write(os.path.join(run_dir, "events", PRODUCE, "handmade-p0.parquet"))
    ev = EventBuffer(CONSUME)
    off_ = 0
    for n, off in A_CONSUME:
        ev.add(cell="A", consumer=0, partition=0, recv_ns=G + int(off * S), count=n, bytes=n * 32,
               first_offset=off_, ts_us=[G // 1000], ts_n=[n])
        off_ += n
    for off, stamps in B_CONSUME:
        n = sum(c for _, c in stamps)
        ev.add(cell="B", consumer=0, partition=0, recv_ns=H + int(off * S), count=n, bytes=n * 64, first_offset=0,
               ts_us=[s for s, _ in stamps], ts_n=[c for _, c in stamps])
    ev.write(os.path.join(run_dir, "events", CONSUME, "handmade-c0.parquet"))


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from bench.analysis import spark_scope
    with spark_scope() as s:   # a session another module of this worker runs is left to it
        yield s


@pytest.fixture(scope="module")
def result(spark, tmp_path_factory):
    from bench.analysis import analyze
    run_dir = str(tmp_path_factory.mktemp("run"))
    build_run(run_dir)
    res = analyze(run_dir, spark=spark)
    res["_dir"] = run_dir
    return res


def by_cell(res, cell):
    (c,) = [c for c in res["cells"] if c["cell"] == cell]
    return c


def test_production_throughput_counts_acknowledged_records_over_go_to_last_ack(result):
    a = by_cell(result, "A")
    records = sum(n for n, _, _ in A_PRODUCE)
    last_ack_s = max(off + lat / 1e6 for _, off, lat in A_PRODUCE)
    assert a["produced_records"] == records == 120
    assert a["failed_requests"] == 1
    assert a["produce_s"] == pytest.approx(last_ack_s)
    assert a["produce_rps"] == pytest.approx(records / last_ack_s)
    assert a["produce_kBps"] == pytest.approx(records * 32 / 1000 / last_ack_s)


def test_consumption_throughput_runs_from_the_consumers_go(result):
    a = by_cell(result, "A")
    records = sum(n for n, _ in A_CONSUME)
    window = max(off for _, off in A_CONSUME) - 3.0
    assert a["consumed_records"] == records
    assert a["consume_rps"] == pytest.approx(records / window)
    assert a["consume_kBps"] == pytest.approx(records * 32 / 1000 / window)


def test_ack_latency_percentiles_are_exact_and_weighted_by_records(result):
    a = by_cell(result, "A")
    vw = [(lat, n) for n, _, lat in A_PRODUCE]   # the failed batch is left out
    for name, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert a[f"ack_{name}_ms"] == pytest.approx(pct(vw, p) / 1000), name
    mean = sum(lat * n for lat, n in vw) / sum(n for _, n in vw)
    assert a["ack_mean_ms"] == pytest.approx(mean / 1000)
    assert a["ack_max_ms"] == pytest.approx(10.0)


def test_latency_counts_from_the_intended_send_time(result):
    b = by_cell(result, "B")
    vw = [(lat, n) for n, _, lat in B_PRODUCE]
    assert b["ack_p50_ms"] == pytest.approx(pct(vw, 0.5) / 1000)
    assert b["ack_p99_ms"] == pytest.approx(pct(vw, 0.99) / 1000)


def test_end_to_end_latency_only_for_streaming_cells(result):
    assert by_cell(result, "A")["e2e_p50_ms"] is None
    b = by_cell(result, "B")
    vw = []
    for off, stamps in B_CONSUME:
        recv_us = (H + int(off * S)) / 1000
        vw += [(recv_us - s, n) for s, n in stamps]
    for name, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert b[f"e2e_{name}_ms"] == pytest.approx(pct(vw, p) / 1000), name
    assert b["e2e_max_ms"] == pytest.approx(20.0)


def test_dsbs_long_table_and_timeline(result):
    d = {(r["mode"], r["side"], r["message_bytes"], r["batch"]): r for r in result["dsbs"]}
    assert d[("split", "production", 32, 20)]["rps"] == pytest.approx(by_cell(result, "A")["produce_rps"])
    assert d[("streaming", "consumption", 64, 20)]["rps"] == pytest.approx(by_cell(result, "B")["consume_rps"])
    # every phase is shorter than 10 s: 100 ms bins; the bins add up to the totals
    assert result["timeline_bin_s"] == pytest.approx(0.1)
    tl = [r for r in result["timeline"] if r["cell"] == "A" and r["side"] == "produce"]
    assert sum(r["records"] for r in tl) == 120
    first = min(tl, key=lambda r: r["t_s"])
    assert first["t_s"] == 0 and first["records"] == 20 and first["rps"] == pytest.approx(200)  # acked at 1 ms
    tl = [r for r in result["timeline"] if r["cell"] == "A" and r["side"] == "consume"]
    assert sum(r["records"] for r in tl) == 120


def test_report_summary_and_paper_comparison(result):
    from bench.events import read_run_json
    from bench.report import write_report
    run_dir = result["_dir"]
    path = write_report(run_dir, result, read_run_json(run_dir))
    text = open(path).read()
    assert "## Throughput per cell" in text and "## Latency percentiles (ms)" in text
    # cell A (32 B, batch 20, split) sits beside the paper's 213,546 rec/s production average
    assert "213,546" in text and "Compared with the DSBS paper" in text
    for png in ("throughput.png", "latency.png", "timeline.png", "dsbs_vs_paper.png"):
        assert os.path.getsize(os.path.join(run_dir, png)) > 1000, png
    with open(os.path.join(run_dir, "summary.csv")) as f:
        rows = {r["cell"]: r for r in csv.DictReader(f)}
    assert int(rows["A"]["produced"]) == 120 and int(rows["A"]["consumed"]) == 120
    assert float(rows["A"]["produce_rps"]) == pytest.approx(by_cell(result, "A")["produce_rps"], rel=1e-5)


def test_compare_puts_runs_side_by_side(result):
    from bench.report import compare_runs
    text = compare_runs(result["_dir"], result["_dir"])
    assert text.count("1.00x") >= 6   # same run twice: every ratio is 1


@pytest.mark.parametrize("key,expected", [
    (("size", "split", "production", 32, 20), (213_546, 6_833)),
    (("batch", "split", "consumption", 32, 20), (86_741, 2_776)),
    (("size", "streaming", "consumption", 128, 20), (85_203, 10_906)),
    (("batch", "streaming", "production", 32, 50), (184_901, 5_917)),
])
def test_paper_table_transcription(key, expected):
    from bench.report import PAPER
    assert PAPER[key]["DSBS"] == expected
    rps, kbps = PAPER[key]["DSBS"]
    # the paper's kbps is kB/s: rec/s x message size / 1000, within its rounding
    assert kbps == pytest.approx(rps * key[3] / 1000, rel=0.01)


def test_missing_java_is_a_clear_error(monkeypatch, tmp_path):
    from bench.analysis import check_java
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(BenchError, match="Java not found"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BenchError, match="Java 17 or newer"):
        check_java()


def test_analyze_refuses_a_directory_that_is_not_a_run(spark, tmp_path):
    from bench.analysis import analyze
    with pytest.raises(BenchError, match="not a bench run directory"):
        analyze(str(tmp_path), spark=spark)
