"""``bench soak``: seeded Jepsen-style runs against real brokers (``mesh.testing.jepsen``).

    bench soak --seed 1 --seconds 90 --brokers 5 --partitions 6 --producers 4 --runs 10
    bench soak --faults kill,pause --seconds 60          # only some fault kinds

Run i uses seed N+i. Each run starts its own brokers, records every send of the producer
processes, injects faults for ``--seconds``, heals, reads everything back and checks it:
lost, duplicated, acknowledged out of send order, phantom, offset mismatches, and client
recovery (fault to the first acknowledgement of a send made after it; the headline p50
and max leave out ``kill2``, whose outage is part of it, shown per kind). Prints a line per
run and a summary table; writes ``report.json`` (and each run's histories and broker
logs) under ``results/<time>-soak/`` or ``--out``. Exits 1 when any run found a
violation or failed.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import sys
import time

import click

from mesh.testing.nemesis import FAULT_KINDS, parse_faults

__all__ = ["soak"]


def _faults(ctx, param, value):
    try:
        return parse_faults(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


_COLUMNS = [("run", 4), ("seed", 6), ("faults", 6), ("acked", 8), ("lost", 5), ("dups", 5), ("order", 6),
            ("phantom", 7), ("offset", 6), ("failwr", 6), ("rec p50", 8), ("rec max", 8), ("unrec", 5),
            ("wall s", 7)]


def _row(cells: list) -> str:
    return " ".join(str(c).rjust(w) for c, (_, w) in zip(cells, _COLUMNS))


@click.command()
@click.option("--seed", type=int, default=1, show_default=True, help="seed of the first run (run i: seed+i)")
@click.option("--seconds", type=click.FloatRange(1), default=90, show_default=True, help="faults per run")
@click.option("--brokers", type=click.IntRange(3), default=5, show_default=True)
@click.option("--partitions", type=click.IntRange(1), default=6, show_default=True)
@click.option("--replication-factor", type=click.IntRange(1), default=3, show_default=True)
@click.option("--producers", type=click.IntRange(1), default=4, show_default=True, help="producer processes")
@click.option("--rate", type=click.FloatRange(1), default=100, show_default=True, help="sends/s per producer")
@click.option("--runs", type=click.IntRange(1), default=1, show_default=True)
@click.option("--faults", callback=_faults, default=",".join(FAULT_KINDS), show_default=True,
              help="fault kinds, comma-separated (partition needs root and `ip netns`)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="report directory (default results/<time>-soak)")
@click.option("--keep-data", is_flag=True, help="keep the brokers' data directories (logs are always kept)")
def soak(seed, seconds, brokers, partitions, replication_factor, producers, rate, runs, faults, out_dir,
         keep_data) -> None:
    """Seeded fault runs against real brokers, checked for lost, duplicated and reordered records."""
    from mesh.testing.jepsen import JepsenConfig, run
    out_dir = out_dir or os.path.join("results", time.strftime("%Y%m%d-%H%M%S") + "-soak")
    if os.path.exists(os.path.join(out_dir, "report.json")):
        raise click.ClickException(f"{out_dir} already holds a soak report; choose another --out")
    os.makedirs(out_dir, exist_ok=True)
    report = {"command": "bench soak " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
              "seed": seed, "seconds": seconds, "brokers": brokers, "partitions": partitions,
              "replication_factor": min(replication_factor, brokers), "producers": producers, "rate": rate,
              "faults": faults, "runs": []}
    click.echo(f"bench soak: {runs} run(s) of {seconds:g} s, {brokers} brokers, {partitions} partitions, "
               f"{producers} producers at {rate:g}/s, faults {','.join(faults)} -> {out_dir}")
    rows = []
    for i in range(runs):
        s = seed + i
        workdir = os.path.join(out_dir, f"run-{i:02d}-seed-{s}")
        cfg = JepsenConfig(workdir, seed=s, brokers=brokers, partitions=partitions,
                           replication_factor=min(replication_factor, brokers), producers=producers,
                           rate_per_s=rate, fault_s=seconds, faults=list(faults))
        t0 = time.monotonic()
        try:
            r = run(cfg, log=lambda m: click.echo("  " + m))
        except Exception as exc:  # a run that could not finish is a result too
            entry = {"run": i, "seed": s, "error": f"{type(exc).__name__}: {exc}",
                     "wall_s": round(time.monotonic() - t0, 1)}
            click.echo(f"run {i} (seed {s}) FAILED: {entry['error']}")
        else:
            entry = {"run": i, "seed": s, **r.to_dict()}
            res = r.result
            rows.append((i, s, res))
            click.echo(res.summary())
            if not res.ok:
                click.echo(f"  reproduce with seed={s}: bench soak --seed {s} --seconds {seconds:g} "
                           f"--brokers {brokers} --partitions {partitions} --producers {producers} "
                           f"--rate {rate:g} --faults {','.join(faults)}")
            for kind, why in r.skipped:
                click.echo(f"  skipped {kind}: {why}")
        report["runs"].append(entry)
        if not keep_data:
            _drop_data(workdir, brokers)
        _write(out_dir, report)
    click.echo("")
    click.echo(_row([c for c, _ in _COLUMNS]))
    for i, s, res in rows:
        click.echo(_row([i, s, len(res.faults), res.acked, res.lost, res.duplicated,
                         res.order_violations + res.log_order_violations, res.phantoms, res.offset_mismatches,
                         res.failed_but_written, _s(res.recovery_p50_s), _s(res.recovery_max_s), res.unrecovered,
                         f"{report['runs'][i].get('wall_s', 0):.0f}"]))
    summary = _summary(rows, report["runs"])
    report["summary"] = summary
    _write(out_dir, report)
    click.echo(_row(["all", "", summary["faults"], summary["acked"], summary["lost"], summary["duplicated"],
                     summary["order_violations"], summary["phantoms"], summary["offset_mismatches"],
                     summary["failed_but_written"], _s(summary["recovery_p50_s"]), _s(summary["recovery_max_s"]),
                     summary["unrecovered"], ""]))
    for kind, xs in summary["recovery_by_kind"].items():
        got = sorted(x for x in xs if x is not None)
        p50 = statistics.median(got) if got else None
        click.echo(f"recovery after {kind:<12} {len(xs):>3} fault(s): p50 {_s(p50)} s, "
                   f"max {_s(max(got) if got else None)} s, never recovered {len(xs) - len(got)}")
    click.echo(f"\nruns with a violation: {summary['runs_with_violations']} of {runs}"
               f"{', runs that failed: ' + str(summary['runs_failed']) if summary['runs_failed'] else ''}")
    click.echo(f"report: {os.path.join(out_dir, 'report.json')}")
    if summary["runs_with_violations"] or summary["runs_failed"]:
        sys.exit(1)


def _summary(rows, entries) -> dict:
    recs = [x for _, _, res in rows for x in res.recovered]
    by_kind: dict = {}
    for _, _, res in rows:
        for kind, xs in res.recovery_by_kind.items():
            by_kind.setdefault(kind, []).extend(xs)
    return {
        "runs": len(entries), "runs_failed": sum(1 for e in entries if "error" in e),
        "runs_with_violations": sum(1 for _, _, res in rows if not res.ok),
        "faults": sum(len(res.faults) for _, _, res in rows),
        "acked": sum(res.acked for _, _, res in rows),
        "lost": sum(res.lost for _, _, res in rows),
        "duplicated": sum(res.duplicated for _, _, res in rows),
        "acked_duplicated": sum(res.acked_duplicated for _, _, res in rows),
        "order_violations": sum(res.order_violations + res.log_order_violations for _, _, res in rows),
        "phantoms": sum(res.phantoms for _, _, res in rows),
        "offset_mismatches": sum(res.offset_mismatches for _, _, res in rows),
        "failed_but_written": sum(res.failed_but_written for _, _, res in rows),
        "unknown_written": sum(res.unknown_written for _, _, res in rows),
        "recovery_p50_s": statistics.median(recs) if recs else None,
        "recovery_max_s": max(recs) if recs else None,
        "unrecovered": sum(res.unrecovered for _, _, res in rows),
        "liveness_failed": sum(1 for _, _, res in rows if res.liveness_failed),
        "recovery_by_kind": by_kind,
    }


def _write(out_dir: str, report: dict) -> None:
    tmp = os.path.join(out_dir, "report.json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "report.json"))


def _drop_data(workdir: str, brokers: int) -> None:
    for i in range(1, brokers + 1):
        shutil.rmtree(os.path.join(workdir, "brokers", f"n{i}"), ignore_errors=True)
