"""The ``bench`` command: run workloads against a cluster, analyse them with Spark, report.

    bench run                                   # default scenario, on brokers it starts itself
    bench run --scenario dsbs                   # the DSBS study's matrix
    bench run --bootstrap 127.0.0.1:7101 --scenario quick   # against a running cluster
    bench run --scenario quick --size 100,1K --batch 1,50   # flags override (lists sweep)
    bench run --scenario quick --rate 20000                 # the latency cell's target rate
    bench run --scenario rate-sweep                         # latency against offered rate
    bench run --scenario peer-nats                          # beside NATS JetStream (bench/peer.py)
    bench analyze results/<run>                 # re-run the Spark analysis and the report
    bench compare results/<a> results/<b>       # two runs side by side
    bench scenarios [NAME]                      # scenarios, their parameters and cells
    bench soak --seed 1 --runs 10               # Jepsen-style fault runs, checked (bench/soak.py)
    bench diskfaults --runs 10 --seed 1 [--refill-mb 100]   # disk-fault campaigns (issue 17)

A run writes results/<time>-<scenario>/ (or --out DIR): run.json, cells.jsonl, events/,
analysis.json, summary.csv, report.md and PNG plots.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import sys
import time

import click

from bench.scenarios import DEFAULT_BROKERS, KNOBS, SCENARIOS, BenchError, format_size, get_scenario, parse_size

__all__ = ["main"]


def _friendly(f):
    """BenchError -> one clear line and exit code 1; Ctrl-C -> exit 130."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except BenchError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
    return wrapper


def _list_of(conv):
    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return [conv(v.strip()) for v in str(value).split(",") if v.strip()]
        except (ValueError, BenchError) as exc:
            raise click.BadParameter(str(exc)) from None
    return parse


def _acks(v: str) -> str:
    if v not in ("0", "1", "all"):
        raise ValueError(f"acks must be 0, 1 or all, not {v!r}")
    return v


def _mode(v: str) -> str:
    if v not in ("split", "streaming"):
        raise ValueError(f"mode must be split or streaming, not {v!r}")
    return v


def _count(v: str) -> int:
    return int(float(v.replace("_", "").upper().replace("K", "e3").replace("M", "e6")))


# (option, knob, converter, help); every one accepts a comma list to sweep
_KNOB_OPTIONS = [
    ("--size", "message_bytes", parse_size, "message size, e.g. 32, 1K"),
    ("--batch", "batch", _count, "records per produce request (0 = send() + linger)"),
    ("--linger-ms", "linger_ms", int, "client linger for --batch 0"),
    ("--batch-bytes", "batch_bytes", parse_size, "client batch size in bytes for --batch 0"),
    ("--acks", "acks", _acks, "0, 1 or all"),
    ("--in-flight", "in_flight", int, "produce requests in flight per partition"),
    ("--key-space", "key_space", _count, "distinct keys with --keys"),
    ("--producers", "producers", int, "producer processes"),
    ("--consumers", "consumers", int, "consumer processes"),
    ("--partitions", "partitions", int, "partitions of each cell's topic"),
    ("--replication-factor", "replication_factor", int, "replicas per partition"),
    ("--messages", "messages", _count, "messages per cell, all producers together (0 = use --duration-s)"),
    ("--max-bytes", "max_bytes", parse_size, "cap messages x size per cell, e.g. 256M (0 = no cap)"),
    ("--duration-s", "duration_s", float, "send for this long (with --messages 0)"),
    ("--rate", "rate", _count, "target records/s, all producers together (0 = as fast as possible)"),
    ("--mode", "mode", _mode, "split (produce, then consume) or streaming (both at once)"),
]


def _knob_options(f):
    for opt, knob, conv, help_ in reversed(_KNOB_OPTIONS):
        f = click.option(opt, knob, callback=_list_of(conv), default=None, help=help_ + " [list sweeps]")(f)
    f = click.option("--keys/--no-keys", "keys", default=None, help="keyed records (murmur2 partitioning) or none")(f)
    f = click.option("--write-caching/--fsync", "write_caching", default=None,
                     help="topics with write.caching on (acks=all once a majority wrote it, synced within "
                          "100 ms) or the default (once a majority synced it)")(f)
    f = click.option("--group", "group", default=None, help="consumer group id (needs broker support)")(f)
    return f


def _overrides(kw: dict) -> dict:
    out = {}
    for knob in KNOBS:
        v = kw.pop(knob, None)
        if v is None:
            continue
        out[knob] = v if isinstance(v, list) else [v]
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """bench: workloads against a broker-mesh cluster, analysed by Spark into a report."""


@main.command()
@click.option("--scenario", "-s", default="default", show_default=True, help="see `bench scenarios`")
@click.option("--bootstrap", "-b", default=None, help="HOST:PORT of a running cluster (default: start our own)")
@click.option("--brokers", type=click.IntRange(1), default=DEFAULT_BROKERS, show_default=True,
              help="brokers to start when no --bootstrap is given")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="run directory (default results/<time>-<scenario>)")
@click.option("--master", default=None, help="Spark master URL for the analysis (default local[2])")
@click.option("--skip-analysis", is_flag=True, help="record events only; analyse later with `bench analyze`")
@click.option("--keep-topics", is_flag=True, help="do not delete each cell's topic afterwards")
@click.option("--timeout-s", type=float, default=900, show_default=True, help="limit per phase of a cell")
@click.option("--connect-timeout-s", type=float, default=5, show_default=True,
              help="how long to wait for --bootstrap to answer")
@click.option("--progress/--no-progress", default=None, help="live progress bars (default: when on a terminal)")
@_knob_options
@_friendly
def run(scenario, bootstrap, brokers, out_dir, master, skip_analysis, keep_topics, timeout_s, connect_timeout_s,
        progress, **kw) -> None:
    """Run a scenario, analyse it with Spark and write the report."""
    from bench.cluster import LocalCluster, check_reachable
    from bench.cell import check_group_support, run_cell
    from bench.calibrate import describe, probe
    from bench.events import environment, now_iso, write_run_json

    sc = get_scenario(scenario).with_overrides(_overrides(kw))
    if sc.runner == "kafka":
        if bootstrap:
            raise BenchError("the kafka scenario starts its own cluster (with Kafka ports): drop --bootstrap")
        _run_kafka(sc, out_dir)
        return
    if sc.runner == "peer-nats":
        if bootstrap:
            raise BenchError("peer-nats starts its own mesh and NATS clusters (so that neither shares the "
                             "machine with the other); run it without --bootstrap")
        _run_peer(sc, out_dir)
        return
    cells = sc.cells()
    if any(c.workload.group for c in cells):
        check_group_support()
    if not skip_analysis:
        from bench.analysis import check_java
        check_java()  # fail now, not after a long run
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join("results", f"{stamp}-{scenario}")
    if os.path.exists(os.path.join(out_dir, "cells.jsonl")):
        raise BenchError(f"{out_dir} already holds a run; choose another --out")
    os.makedirs(out_dir, exist_ok=True)
    run_id = re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(os.path.abspath(out_dir)))[:80]
    show = progress if progress is not None else sys.stderr.isatty()
    info = {
        "scenario": sc.name, "description": sc.description, "notes": sc.notes, "paper": sc.paper,
        "command": "bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "base": dataclasses.asdict(sc.base), "sweeps": [dict(s) for s in sc.sweeps],
        "cells": [{"cell": c.id, "label": c.label, **dataclasses.asdict(c.workload)} for c in cells],
        "started": now_iso(), "environment": environment(), "status": "running",
    }
    click.echo(f"bench: scenario {sc.name}, {len(cells)} cell(s) -> {out_dir}")
    info["environment"]["calibration"] = cal = probe(out_dir)
    click.echo(f"bench: machine now: {describe(cal)}")
    cluster = None
    t0 = time.monotonic()
    try:
        if bootstrap:
            found = check_reachable(bootstrap, connect_timeout_s)
            info["cluster"] = {"started_by_bench": False, "bootstrap": bootstrap, "brokers": len(found)}
        else:
            cluster = LocalCluster(brokers, os.path.join(out_dir, "brokers")).start()
            bootstrap = cluster.bootstrap
            info["cluster"] = {"started_by_bench": True, "bootstrap": bootstrap, "brokers": brokers}
            click.echo(f"bench: started {brokers} broker(s) at {bootstrap}")
        write_run_json(out_dir, info)
        bar = None
        if show and len(cells) > 1:
            from tqdm import tqdm
            bar = tqdm(total=len(cells), desc="cells", unit="cell", position=0, dynamic_ncols=True)
        say = bar.write if bar is not None else click.echo
        if cells:
            info["warmup"] = _warm_up(cells[0], bootstrap, out_dir, run_id, timeout_s)
            write_run_json(out_dir, info)
            say(f"bench: warm-up cell ({info['warmup']['messages']:,} records, not measured) done")
        for cell in cells:
            r = run_cell(cell, bootstrap, out_dir, run_id, quiet=not show, timeout_s=timeout_s,
                         keep_topic=keep_topics, echo=say)
            w = cell.workload
            rps = r.produced / max(r.produce_s, 1e-9)  # a live glimpse; the report has Spark's numbers
            line = f"{cell.id:<28} produced {r.produced:>9,} in {r.produce_s:7.2f} s ({rps:>10,.0f} rec/s)"
            if w.consumers:
                line += f", consumed {r.consumed:>9,} in {r.consume_s:7.2f} s"
            say(line)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    except BaseException as exc:
        info["status"] = f"failed: {type(exc).__name__}: {exc}"
        write_run_json(out_dir, info)
        raise
    finally:
        if cluster is not None:
            cluster.stop()
    info["workload_s"] = round(time.monotonic() - t0, 3)
    info["status"] = "recorded"
    write_run_json(out_dir, info)
    click.echo(f"bench: workload done in {info['workload_s']:.1f} s; events in {os.path.join(out_dir, 'events')}")
    if skip_analysis:
        click.echo(f"bench: analyse with `bench analyze {out_dir}`")
        return
    _analyze_and_report(out_dir, master)


WARMUP_MESSAGES = 30_000   # the warm-up cell's size at most


def _warm_up(first, bootstrap: str, out_dir: str, run_id: str, timeout_s: float) -> dict:
    """One unmeasured cell before the measured ones: the first cell's workload, at most
    WARMUP_MESSAGES records, no rate, into its own topic, its events under ``warmup/`` (not
    analysed). Without it the first cells measured a cold cluster (the brokers' first
    topics, first produce paths, allocator and caches): a 30,000-record DSBS cell run first
    reached 71k-119k records/s, the same cell second 178k."""
    from bench.cell import run_cell
    from bench.scenarios import Cell
    w = first.workload
    warm = Cell(-1, dataclasses.replace(w, messages=min(w.messages, WARMUP_MESSAGES) if w.messages else WARMUP_MESSAGES,
                                        duration_s=0.0, rate=0), first.swept)
    t0 = time.monotonic()
    r = run_cell(warm, bootstrap, os.path.join(out_dir, "warmup"), f"{run_id}-warmup", quiet=True,
                 timeout_s=timeout_s, echo=lambda *_: None)
    return {"cell": first.id, "messages": r.produced, "seconds": round(time.monotonic() - t0, 3)}


def _run_kafka(sc, out_dir: str | None) -> None:
    """The kafka scenario: native client and confluent-kafka side by side (``bench.peer_kafka``)."""
    from bench.peer_kafka import run_kafka_bench
    out_dir = out_dir or os.path.join("results", f"{time.strftime('%Y%m%d-%H%M%S')}-{sc.name}")
    os.makedirs(out_dir, exist_ok=True)
    command = "bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    click.echo(f"bench: scenario {sc.name} -> {out_dir}")
    path = run_kafka_bench(out_dir, sc.base.message_bytes, sc.base.messages, command=command, echo=click.echo)
    click.echo(f"bench: report: {path}")


def _run_peer(sc, out_dir: str | None) -> None:
    """The peer-nats scenario: its own clusters and report, no Spark (``bench.peer``)."""
    from bench.peer import run_peer
    from bench.peer_nats import INSTALL_HINT, available
    missing = available()
    if missing:
        raise BenchError(f"{missing}. {INSTALL_HINT}")
    out_dir = out_dir or os.path.join("results", f"{time.strftime('%Y%m%d-%H%M%S')}-{sc.name}")
    if os.path.exists(os.path.join(out_dir, "peer.json")):
        raise BenchError(f"{out_dir} already holds a run; choose another --out")
    os.makedirs(out_dir, exist_ok=True)
    command = "bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    click.echo(f"bench: scenario {sc.name} -> {out_dir}")
    path = run_peer(out_dir, sc.base.message_bytes, sc.base.messages, command=command, echo=click.echo,
                    e2e_rate=sc.base.rate, e2e_seconds=sc.base.duration_s)
    click.echo(f"bench: report: {path}")


def _analyze_and_report(run_dir: str, master: str | None) -> None:
    from bench.analysis import analyze, spark_scope
    from bench.events import read_run_json, write_run_json
    from bench.report import write_report
    if not os.path.isdir(run_dir):
        raise BenchError(f"{run_dir} is not a directory")
    try:
        info = read_run_json(run_dir)
    except (OSError, ValueError):
        raise BenchError(f"{run_dir} has no readable run.json: not a bench run directory") from None
    t0 = time.monotonic()
    click.echo(f"bench: analysing with Spark ({master or 'local[2]'})...")
    with spark_scope(master) as spark:
        res = analyze(run_dir, spark=spark)
    res["master"] = master or "local[2]"
    info["analysis_s"] = round(time.monotonic() - t0, 3)
    info["status"] = "analysed"
    write_run_json(run_dir, info)
    path = write_report(run_dir, res, info)
    click.echo(f"bench: analysis took {info['analysis_s']:.1f} s")
    click.echo(f"bench: report: {path}")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--master", default=None, help="Spark master URL (default local[2])")
@_friendly
def analyze(run_dir, master) -> None:
    """Re-run the Spark analysis of RUN_DIR's recorded events and rewrite its report."""
    from bench.analysis import check_java
    check_java()
    _analyze_and_report(run_dir, master)


@main.command()
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@_friendly
def compare(a, b) -> None:
    """Two runs' summaries side by side, with ratios B/A."""
    from bench.report import compare_runs
    click.echo(compare_runs(a, b), nl=False)


@main.command()
@click.argument("name", required=False)
@_friendly
def scenarios(name) -> None:
    """List scenarios and their parameters (with NAME: its cells too)."""
    names = [name] if name else list(SCENARIOS)
    for n in names:
        sc = get_scenario(n)
        cells = sc.cells()
        click.echo(f"{sc.name}: {sc.description} [{len(cells)} cell(s)]")
        base = dataclasses.asdict(sc.base)
        swept = {k for s in sc.sweeps for k in s}
        click.echo("    " + ", ".join(f"{k}={_show(k, v)}" for k, v in base.items() if k not in swept))
        for s in sc.sweeps:
            click.echo("    sweep: " + "; ".join(f"{k} in {', '.join(_show(k, x) for x in v)}" for k, v in s.items()))
        if name:
            for c in cells:
                w = c.workload
                amount = f"{w.messages:,} messages" if w.messages else f"{w.duration_s:g} s"
                click.echo(f"      {c.id:<28} {c.label:<34} {amount}")
    if not name:
        click.echo("\nFlags of `bench run` override any parameter; a comma list sweeps it (e.g. --size 32,1K).")


@main.command()
@click.option("--runs", type=click.IntRange(0), default=10, show_default=True, help="seeded campaign runs")
@click.option("--seed", type=int, default=1, show_default=True, help="seed of the first run (then +1 each)")
@click.option("--brokers", type=click.IntRange(3), default=5, show_default=True)
@click.option("--partitions", type=click.IntRange(1), default=6, show_default=True)
@click.option("--producers", type=click.IntRange(1), default=4, show_default=True)
@click.option("--faults", "faults", type=click.IntRange(1), default=4, show_default=True, help="disk faults per run")
@click.option("--kinds", default="wipe,rollback,truncate,flip", show_default=True, help="fault kinds to draw from")
@click.option("--refill-mb", type=click.IntRange(0), default=0, show_default=True,
              help="also time a wiped replica's refill of this many MB (0: skip)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="run directory (default results/<time>-diskfaults)")
@_friendly
def diskfaults(runs, seed, brokers, partitions, producers, faults, kinds, refill_mb, out_dir) -> None:
    """Seeded disk-fault campaigns (wipe, rollback, truncate, flip; one broker at a time) with
    producers running: acknowledged records lost; and the refill time of a wiped replica."""
    import json
    from bench.diskfaults import FAULTS, campaign, refill
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    if not chosen or any(k not in FAULTS for k in chosen):
        raise BenchError(f"--kinds must name some of {', '.join(FAULTS)}")
    out_dir = out_dir or os.path.join("results", time.strftime("%Y%m%d-%H%M%S") + "-diskfaults")
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for i in range(runs):
        s = seed + i
        click.echo(f"diskfaults: run {i + 1}/{runs}, seed {s}")
        r = campaign(os.path.join(out_dir, f"run-{s}"), s, brokers, partitions, producers, faults=faults,
                     kinds=chosen, log=click.echo)
        results.append(r)
        if "error" in r:
            click.echo(f"  run failed: {r['error']}")
        else:
            click.echo(f"  acknowledged {r['acked']:,}, lost {r['lost']}, duplicated {r['duplicated']}, "
                       f"{'PASS' if r['ok'] else 'FAIL'} ({r['seconds']} s)")
    summary = {"runs": results}
    if runs:
        done = [r for r in results if "error" not in r]
        summary.update(acked=sum(r["acked"] for r in done), lost=sum(r["lost"] for r in done),
                       failed_runs=len(results) - len(done))
        click.echo(f"diskfaults: {len(done)}/{runs} runs completed, {summary['acked']:,} acknowledged, "
                   f"{summary['lost']} lost, {summary['failed_runs']} run(s) failed")
    if refill_mb:
        summary["refill"] = refill(os.path.join(out_dir, "refill"), refill_mb, log=click.echo)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    click.echo(f"diskfaults: results in {out_dir}")


def _show(k: str, v) -> str:
    return format_size(v) if k in ("message_bytes", "batch_bytes") else str(v)


from bench.soak import soak  # noqa: E402  (the Jepsen-style soak: its own module)
main.add_command(soak)


if __name__ == "__main__":
    main()
