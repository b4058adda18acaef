"""End to end: `bench run --scenario smoke` in a subprocess, against brokers it starts
itself, then the files a user reads; plus the clear errors a user meets first."""
from __future__ import annotations

import csv
import json
import os
import sys

import pytest
from click.testing import CliRunner

from bench.cli import main as bench_main
from bench.events import read_cells
from bench.scenarios import BenchError, get_scenario

@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The real CLI, in this process (click's CliRunner), so that Spark reuses the JVM an
    earlier module may have started; workers and brokers are real processes."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    out = str(tmp_path_factory.mktemp("bench") / "smoke")
    res = CliRunner().invoke(bench_main, ["run", "--scenario", "smoke", "--out", out, "--no-progress"])
    assert res.exit_code == 0, f"bench run failed:\n{res.output}\n{res.exception!r}"
    return out, res


@pytest.mark.spark
@pytest.mark.integration
def test_smoke_run_writes_report_summary_and_plots(smoke_run):
    out, res = smoke_run
    assert f"report: {os.path.join(out, 'report.md')}" in res.output
    for name in ("run.json", "cells.jsonl", "analysis.json", "report.md", "summary.csv",
                 "throughput.png", "latency.png", "timeline.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    report = open(os.path.join(out, "report.md")).read()
    cells = get_scenario("smoke").cells()
    for c in cells:
        assert c.id in report
    assert "MISMATCH" not in report
    # one unmeasured warm-up cell ran first, its events apart from the measured ones
    with open(os.path.join(out, "run.json")) as f:
        warm = json.load(f)["warmup"]
    assert warm == {"cell": cells[0].id, "messages": cells[0].workload.messages, "seconds": warm["seconds"]}
    assert os.listdir(os.path.join(out, "warmup", "events"))
    assert f"one unmeasured cell first ({cells[0].workload.messages:,} records" in report


@pytest.mark.spark
@pytest.mark.integration
def test_smoke_counts_match_what_was_sent(smoke_run):
    import pyarrow.parquet as pq
    out, _ = smoke_run
    with open(os.path.join(out, "summary.csv")) as f:
        rows = list(csv.DictReader(f))
    cells = get_scenario("smoke").cells()
    assert [r["cell"] for r in rows] == [c.id for c in cells]
    for r, c in zip(rows, cells):
        n = c.workload.messages
        assert int(r["produced"]) == int(r["consumed"]) == int(r["log_end"]) == n, r
        assert float(r["produce_rps"]) > 0 and float(r["consume_rps"]) > 0
        assert float(r["ack_p50_ms"]) <= float(r["ack_p99_ms"]) <= float(r["ack_max_ms"])
    # the recorded events hold every record once on each side
    produce = pq.read_table(os.path.join(out, "events", "produce"))
    consume = pq.read_table(os.path.join(out, "events", "consume"))
    assert sum(produce.column("count").to_pylist()) == sum(c.workload.messages for c in cells)
    assert sum(consume.column("count").to_pylist()) == sum(c.workload.messages for c in cells)
    streaming = [r for r in rows if r["mode"] == "streaming"]
    assert streaming and all(float(r["e2e_p50_ms"]) > 0 for r in streaming)


@pytest.mark.spark
@pytest.mark.integration
def test_compare_two_runs(smoke_run):
    out, _ = smoke_run
    res = CliRunner().invoke(bench_main, ["compare", out, out])
    assert res.exit_code == 0, res.output
    assert "produce rec/s A" in res.output and "1.00x" in res.output


@pytest.mark.integration
def test_unreachable_bootstrap_is_a_clear_error(tmp_path):
    from mesh.testing.launcher import free_port
    port = free_port()
    res = CliRunner().invoke(bench_main, ["run", "--scenario", "smoke", "--bootstrap", f"127.0.0.1:{port}",
                                          "--connect-timeout-s", "1", "--skip-analysis", "--out", str(tmp_path / "r")])
    assert res.exit_code == 1
    assert f"no broker answered at 127.0.0.1:{port} within 1 s" in res.output


def test_bad_flags_are_clear_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(bench_main, ["run", "--scenario", "nope", "--skip-analysis"])
    assert res.exit_code == 1 and "unknown scenario 'nope'" in res.output
    res = runner.invoke(bench_main, ["run", "--scenario", "smoke", "--acks", "2", "--skip-analysis"])
    assert res.exit_code == 2 and "acks must be 0, 1 or all" in res.output
    res = runner.invoke(bench_main, ["run", "--scenario", "smoke", "--consumers", "5", "--skip-analysis"])
    assert res.exit_code == 1 and "need at least as many partitions" in res.output


@pytest.mark.integration
def test_group_flag_runs_with_groups_or_errors_clearly_without(tmp_path):
    import importlib.util
    out = str(tmp_path / "g")
    args = ["run", "--scenario", "smoke", "--group", "g1", "--consumers", "1", "--mode", "streaming",
            "--messages", "1000", "--skip-analysis", "--no-progress", "--out", out]
    res = CliRunner().invoke(bench_main, args)
    if importlib.util.find_spec("mesh.client.group") is None:
        assert res.exit_code == 1 and "consumer groups are not supported" in res.output
        return
    assert res.exit_code == 0, res.output
    (row,) = read_cells(out)
    assert row["produced"] == row["consumed"] == row["log_end"] == 1000


def test_flags_override_and_sweep_scenarios():
    sc = get_scenario("dsbs").with_overrides({"message_bytes": [64]})
    assert {c.workload.message_bytes for c in sc.cells()} == {64}
    assert {c.workload.batch for c in sc.cells()} == {1, 20, 50}
    sc = get_scenario("smoke").with_overrides({"batch": [1, 20], "mode": ["split"]})
    assert [(c.workload.batch, c.workload.mode) for c in sc.cells()] == [(1, "split"), (20, "split")]
    with pytest.raises(BenchError):
        get_scenario("smoke").with_overrides({"nope": [1]})


def test_scenarios_command_lists_every_scenario():
    res = CliRunner().invoke(bench_main, ["scenarios"])
    assert res.exit_code == 0
    for name in ("smoke", "quick", "default", "dsbs", "latency"):
        assert f"{name}:" in res.output
