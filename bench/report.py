"""The report people read: report.md (tables), summary.csv, PNG plots; and `bench compare`.

Everything here formats what the Spark job (``bench.analysis``) computed; nothing is
aggregated again. The plots are ``bench.plots``.
"""
from __future__ import annotations

import csv
import math
import os

from bench import plots as charts
from bench.calibrate import describe
from bench.scenarios import BenchError, format_size

__all__ = ["write_report", "compare_runs", "PAPER", "paper_cell", "SUMMARY_FIELDS", "headline_rows",
           "SATURATED_BELOW"]

SATURATED_BELOW = 0.9   # a paced cell that got less than this share of its offered rate

# -- the DSBS paper's published averages ----------------------------------------------------
# Transcribed from reference/seeds/004_a5a7143f391079be.txt ("Redesigning Kafka Message
# Queue System: Toward a Decentralized Stateful Broker System", Li, Liu, Zhang, Zhu, SCU
# COEN241, 2017), appendix tables; the "avg" column of four tries, records/s ("rps") and
# "kbps" (which is kB/s: e.g. 178,361 rec/s x 8 B = 1,427 kB/s).
#
# SIZE: appendix "DSBS Performance Data" and "ZooKeeper Performance Data", message sizes
# 8-128 B. The batch size is not stated there; its 32 B column equals the batch-20 column
# of the batch table (213,546 rec/s), so these are taken as batch 20.
# BATCH: appendix "Varying Batch Size Data", 32 B messages, batches 1, 20, 50.
# The two tables disagree on one cell (32 B, batch 20, split consumption: 192,758 in the
# size table, 86,741 in the batch table); each sweep is compared with its own table.
# The paper's 1-128 KB results exist only as figures, not as numbers: no comparison.
_SIZES = (8, 16, 32, 64, 128)
_SIZE_TABLE = {
    # (system, mode, side): ([rps per size], [kB/s per size])
    ("DSBS", "split", "production"): ([178_361, 191_205, 213_546, 205_402, 192_396],
                                      [1_427, 3_059, 6_833, 13_146, 24_627]),
    ("DSBS", "split", "consumption"): ([215_730, 200_529, 192_758, 193_202, 211_804],
                                       [1_726, 3_208, 6_168, 12_365, 27_111]),
    ("DSBS", "streaming", "production"): ([108_331, 82_109, 115_820, 91_678, 126_280],
                                          [867, 1_314, 3_706, 5_867, 16_164]),
    ("DSBS", "streaming", "consumption"): ([72_918, 62_124, 76_236, 67_016, 85_203],
                                           [583, 994, 2_440, 4_289, 10_906]),
    ("ZK", "split", "production"): ([83_751, 91_222, 63_615, 94_708, 97_070],
                                    [670, 1_460, 2_036, 6_061, 12_425]),
    ("ZK", "split", "consumption"): ([66_109, 78_498, 79_900, 80_500, 74_859],
                                     [529, 1_256, 2_557, 5_152, 9_582]),
    ("ZK", "streaming", "production"): ([34_398, 32_953, 28_774, 36_023, 31_658],
                                        [275, 527, 921, 2_305, 4_052]),
    ("ZK", "streaming", "consumption"): ([36_916, 36_418, 32_488, 38_342, 36_189],
                                        [295, 583, 1_040, 2_454, 4_632]),
}
_BATCHES = (1, 20, 50)
_BATCH_TABLE = {
    ("DSBS", "split", "production"): ([19_407, 213_546, 307_349], [621, 6_833, 9_835]),
    ("DSBS", "split", "consumption"): ([11_461, 86_741, 104_572], [367, 2_776, 3_346]),
    ("DSBS", "streaming", "production"): ([11_666, 115_820, 184_901], [373, 3_706, 5_917]),
    ("DSBS", "streaming", "consumption"): ([8_467, 76_236, 93_625], [271, 2_440, 2_996]),
    ("ZK", "split", "production"): ([19_396, 63_615, 256_418], [621, 2_036, 8_205]),
    ("ZK", "split", "consumption"): ([11_027, 79_900, 106_197], [353, 2_557, 3_398]),
    ("ZK", "streaming", "production"): ([11_847, 28_774, 156_566], [379, 921, 5_010]),
    ("ZK", "streaming", "consumption"): ([8_177, 32_488, 84_577], [262, 1_040, 2_706]),
}


def _build_paper() -> dict:
    """{(sweep, mode, side, message_bytes, batch): {"DSBS": (rps, kBps), "ZK": (rps, kBps)}}"""
    out: dict = {}
    for (system, mode, side), (rps, kbps) in _SIZE_TABLE.items():
        for i, size in enumerate(_SIZES):
            out.setdefault(("size", mode, side, size, 20), {})[system] = (rps[i], kbps[i])
    for (system, mode, side), (rps, kbps) in _BATCH_TABLE.items():
        for i, batch in enumerate(_BATCHES):
            out.setdefault(("batch", mode, side, 32, batch), {})[system] = (rps[i], kbps[i])
    return out


PAPER = _build_paper()


def paper_cell(mode: str, side: str, message_bytes: int, batch: int) -> list[tuple[str, dict]]:
    """The paper's numbers for a cell: [(sweep, {"DSBS": (rps, kBps), "ZK": ...})]."""
    return [(sw, PAPER[(sw, mode, side, message_bytes, batch)]) for sw in ("size", "batch")
            if (sw, mode, side, message_bytes, batch) in PAPER]


# -- formatting helpers ---------------------------------------------------------------------
def _num(v, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def _ms(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def _ratio(a, b) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def _table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


SUMMARY_FIELDS = [
    "cell", "label", "mode", "message_bytes", "batch", "linger_ms", "acks", "in_flight", "keys", "producers",
    "consumers", "partitions", "replication_factor", "rate", "messages", "duration_s",
    "produced", "consumed", "log_end", "failed_requests",
    "produce_s", "produce_rps", "produce_kBps", "consume_s", "consume_rps", "consume_kBps",
    "ack_p50_ms", "ack_p95_ms", "ack_p99_ms", "ack_p999_ms", "ack_mean_ms", "ack_max_ms",
    "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "e2e_p999_ms", "e2e_mean_ms", "e2e_max_ms",
]


def _check(c: dict) -> str:
    p, k, e = c.get("produced_records"), c.get("consumed_records"), c.get("log_end")
    if not c.get("consumers"):
        return "produce only"
    if p == k == e:
        return "ok"
    if c.get("acks") == "0" and k == e and e is not None and p is not None and e < p:
        return f"read all in log; acks=0: {p - e:,} of {p:,} sent never reached it"
    return f"MISMATCH acked {p} / log {e} / read {k}"


def _write_timeline_csv(path: str, timeline: list[dict]) -> None:
    fields = ["cell", "side", "t_s", "records", "rps", "kBps", "lat_p50_ms", "lat_p99_ms"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in timeline:
            w.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()})


def _write_csv(path: str, cells: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, extrasaction="ignore")
        w.writeheader()
        for c in cells:
            row = dict(c)
            row["produced"] = c.get("produced_records")
            row["consumed"] = c.get("consumed_records")
            for k, v in row.items():
                if isinstance(v, float):
                    row[k] = round(v, 6)
            w.writerow(row)


# -- report.md -----------------------------------------------------------------------------
def _dsbs_tables(dsbs: list[dict]) -> list[str]:
    """The DSBS-style grid: rows (mode, side, batch), columns message sizes."""
    sizes = sorted({r["message_bytes"] for r in dsbs})
    batches = sorted({r["batch"] for r in dsbs})
    if len(sizes) < 2 and len(batches) < 2:
        return []
    out = []
    par = sorted({(r.get("producers", 1), r.get("consumers", 1)) for r in dsbs}, reverse=True)
    by = {(r["mode"], r["side"], r.get("producers", 1), r.get("consumers", 1), r["batch"], r["message_bytes"]): r
          for r in dsbs}
    for metric, unit in (("rps", "records/s"), ("kBps", "kB/s")):
        rows = []
        for mode in ("split", "streaming"):
            for side in ("production", "consumption"):
                for np_, nc in par:
                    for b in batches:
                        vals = [by.get((mode, side, np_, nc, b, s), {}).get(metric) for s in sizes]
                        if all(v is None for v in vals):
                            continue
                        rows.append([mode, side, f"{np_}/{nc}", b] + [_num(v) for v in vals])
        out.append(f"**{unit}** (message size across; P/C = producer/consumer processes; batch = records "
                   f"per request)\n\n"
                   + _table(["mode", "side", "P/C", "batch"] + [format_size(s) for s in sizes], rows,
                            "llll" + "r" * len(sizes)))
    return out


def _paper_section(cells: list[dict]) -> tuple[list[str], list[tuple[str, float, float]]]:
    parts, pairs = [], []
    for sweep, title, source in (
            ("size", "Message-size sweep at batch 20",
             "appendix tables \"DSBS Performance Data\" / \"ZooKeeper Performance Data\""),
            ("batch", "Batch sweep at 32 B", "appendix table \"Varying Batch Size Data\"")):
        rows = []
        for c in cells:
            for side, prefix in (("production", "produce"), ("consumption", "consume")):
                key = (sweep, c["mode"], side, c["message_bytes"], c["batch"])
                if key not in PAPER:
                    continue
                d_rps, d_kb = PAPER[key]["DSBS"]
                z_rps, _ = PAPER[key]["ZK"]
                ours, ours_kb = c.get(f"{prefix}_rps"), c.get(f"{prefix}_kBps")
                rows.append([c["mode"], side, format_size(c["message_bytes"]), c["batch"],
                             f"{c.get('producers', 1)}/{c.get('consumers', 1)}", _num(ours), _num(d_rps), _ratio(ours, d_rps), _num(z_rps), _ratio(ours, z_rps),
                             _num(ours_kb), _num(d_kb), _ratio(ours_kb, d_kb)])
                if sweep == "size" or c["batch"] != 20:
                    pairs.append((f"{c['mode'][:5]} {side[:4]} {format_size(c['message_bytes'])} b{c['batch']} "
                                  f"{c.get('producers', 1)}/{c.get('consumers', 1)}",
                                  ours or 0, d_rps))
        if rows:
            parts.append(f"### {title}\n\nPaper: {source}, average of 4 tries.\n\n" + _table(
                ["mode", "side", "size", "batch", "P/C", "ours rec/s", "DSBS rec/s", "ours/DSBS", "Kafka+ZK rec/s",
                 "ours/ZK", "ours kB/s", "DSBS kB/s", "ours/DSBS"], rows, "lllll" + "r" * 8))
    return parts, pairs


def headline_rows(cells: list[dict]) -> tuple[list[list], list[list]]:
    """(paced rows, maximum-throughput rows): cells with a target rate, with what they got
    and their latency; cells without one, with their throughput."""
    paced, unpaced = [], []
    for c in cells:
        w = f"{c.get('replication_factor')}/{c.get('acks')}/{c.get('producers')}/{c.get('consumers')}"
        if c.get("rate"):
            got = c.get("produce_rps")
            state = "-" if got is None else "saturated" if got < SATURATED_BELOW * c["rate"] else "below saturation"
            paced.append([c["cell"], w, _num(c["rate"]), _num(got), _ms(c.get("ack_p50_ms")),
                          _ms(c.get("ack_p99_ms")), _ms(c.get("e2e_p50_ms")), _ms(c.get("e2e_p99_ms")), state])
        else:
            unpaced.append([c["cell"], w, c["batch"] or f"send(), linger {c['linger_ms']} ms",
                            _num(c.get("produce_rps")), _num(c.get("consume_rps")), _ms(c.get("ack_p50_ms")),
                            _ms(c.get("ack_p99_ms"))])
    return paced, unpaced


def _headline(cells: list[dict]) -> list[str]:
    paced, unpaced = headline_rows(cells)
    out = ["## Headline", ""]
    if paced:
        out += ["Open loop at a target rate: latency from each record's scheduled send time (ms); "
                f"\"saturated\" = got under {SATURATED_BELOW:.0%} of the offered rate, so latency there is "
                "queueing.", "",
                _table(["cell", "RF/acks/P/C", "offered rec/s", "achieved rec/s", "ack p50", "ack p99",
                        "e2e p50", "e2e p99", ""], paced, "ll" + "r" * 6 + "l"), ""]
    if unpaced:
        out += ["As fast as flow control allows (maximum throughput; its latency is queueing by design):", "",
                _table(["cell", "RF/acks/P/C", "batch", "produce rec/s", "consume rec/s", "ack p50", "ack p99"],
                       unpaced, "lll" + "r" * 4), ""]
    return out


def _where(run_info: dict) -> str:
    cluster = run_info.get("cluster", {})
    if cluster.get("started_by_bench"):
        return f"{cluster.get('brokers')} broker(s) started by bench on 127.0.0.1 (fresh temporary data dirs)"
    return f"external cluster at {cluster.get('bootstrap')}"


def _warmup(run_info: dict) -> str:
    """The unmeasured cell ``bench run`` ran first (``bench.cli._warm_up``), if any."""
    w = run_info.get("warmup")
    return f"one unmeasured cell first ({w['messages']:,} records of {w['cell']}'s workload)" if w else "none"


def _durability(run_info: dict) -> str:
    """What an acks=all acknowledgement meant in the run's cells (issue 41)."""
    modes = {bool(c.get("write_caching")) for c in run_info.get("cells") or [{}]}
    say = {False: "fsync (the default: a batch is acknowledged once synced, by the leader for acks=1, by a "
                  "majority of replicas for acks=all)",
           True: "write caching (write.caching=true: a batch is acknowledged once written, not yet synced, by the "
                 "leader for acks=1, by a majority for acks=all; a sync starts within flush.ms, 100 ms)"}
    return "; ".join(say[m] for m in sorted(modes)) if len(modes) == 1 else "cells of both: " + "; ".join(
        say[m] for m in sorted(modes))


def write_report(run_dir: str, analysis: dict, run_info: dict) -> str:
    """Write report.md, summary.csv and the plots; return the report's path."""
    cells = analysis["cells"]
    if not cells:
        raise BenchError(f"{run_dir}: no analysed cells")
    _write_csv(os.path.join(run_dir, "summary.csv"), cells)
    _write_timeline_csv(os.path.join(run_dir, "timeline.csv"), analysis.get("timeline", []))
    plots = []

    def plot(name, fn, *args):
        try:
            if fn(os.path.join(run_dir, name), *args) is not False:
                plots.append(name)
        except Exception as exc:  # a plot must not cost the tables
            print(f"warning: plot {name} failed: {exc}")

    plot("throughput.png", charts.plot_throughput, cells)
    plot("latency.png", charts.plot_latency, cells)
    plot("timeline.png", charts.plot_timeline, analysis["timeline"], cells, analysis.get("timeline_bin_s", 1.0))
    if len({r["message_bytes"] for r in analysis["dsbs"]}) > 1:
        plot("throughput_by_size.png", charts.plot_by, analysis["dsbs"], "message_bytes", "batch",
             "Throughput by message size")
    if len({r["batch"] for r in analysis["dsbs"]}) > 1:
        plot("throughput_by_batch.png", charts.plot_by, analysis["dsbs"], "batch", "message_bytes",
             "Throughput by batch size")
    paper_parts, pairs = _paper_section(cells) if run_info.get("paper") else ([], [])
    if pairs:
        plot("dsbs_vs_paper.png", charts.plot_paper, pairs)
    plot("rate_sweep.png", charts.plot_rate_sweep, cells)

    env = run_info.get("environment", {})
    lines = [f"# Benchmark report: {run_info.get('scenario')}", "",
             run_info.get("description", ""), ""]
    if run_info.get("notes"):
        lines += [run_info["notes"], ""]
    lines += _headline(cells)
    setup = [
        ["run", os.path.basename(os.path.abspath(run_dir))],
        ["started", run_info.get("started", "-")],
        ["workload wall time", f"{run_info.get('workload_s', 0):.1f} s"],
        ["cells", str(len(cells))],
        ["warm-up", _warmup(run_info)],
        ["cluster", _where(run_info)], ["durability", _durability(run_info)],
        ["machine", f"{env.get('cpu_count')} CPUs, {env.get('platform')}, load average at start "
                    f"{', '.join(f'{x:.1f}' for x in env.get('loadavg') or [])}"],
        ["machine at start", describe(env.get("calibration"))],
        ["versions", ", ".join(f"{k} {v}" for k, v in (env.get("versions") or {}).items() if v)],
        ["git commit", f"{env.get('git_commit') or '-'}{' (uncommitted changes)' if env.get('git_dirty') else ''}"],
        ["command", run_info.get("command", "-")],
        ["Spark master", analysis.get("master") or "local[2]"],
    ]
    lines += ["## Setup", "", _table(["", ""], setup, "ll"), ""]
    rows = []
    for c in cells:
        rows.append([c["cell"], c["mode"], format_size(c["message_bytes"]), c["batch"] or f"linger {c['linger_ms']} ms",
                     c["acks"], f"{c['producers']}/{c['consumers']}/{c['partitions']}", c["replication_factor"],
                     _num(c.get("produced_records")), _num(c.get("produce_rps")), _num(c.get("produce_kBps")),
                     _num(c.get("consume_rps")), _num(c.get("consume_kBps")), _ms(c.get("ack_p99_ms")),
                     _ms(c.get("e2e_p99_ms")), _check(c)])
    lines += ["## Throughput per cell", "",
              "Records per request = batch; P/C/parts = producers / consumers / partitions; RF = replication "
              "factor; kB = 1000 bytes; latencies in ms.", "",
              _table(["cell", "mode", "size", "batch", "acks", "P/C/parts", "RF", "records", "produce rec/s",
                      "produce kB/s", "consume rec/s", "consume kB/s", "ack p99", "e2e p99", "check"],
                     rows, "llllllr" + "r" * 7 + "l"), ""]
    rows = []
    for c in cells:
        rows.append([c["cell"]] + [_ms(c.get(f"ack_{n}_ms")) for n in ("p50", "p95", "p99", "p999", "mean", "max")]
                    + [_ms(c.get(f"e2e_{n}_ms")) for n in ("p50", "p95", "p99", "p999", "mean", "max")])
    lines += ["## Latency percentiles (ms)", "",
              "ack = produce request acknowledged, from its intended send time; e2e = record received by a "
              "consumer, from the producer's stamp in it (streaming cells only).", "",
              _table(["cell", "ack p50", "p95", "p99", "p99.9", "mean", "max",
                      "e2e p50", "p95", "p99", "p99.9", "mean", "max"], rows), ""]
    dsbs = _dsbs_tables(analysis["dsbs"])
    if dsbs:
        lines += ["## DSBS-style tables: message size x batch x split/streaming", ""]
        for t in dsbs:
            lines += [t, ""]
    if paper_parts:
        lines += ["## Compared with the DSBS paper", "",
                  "The paper ran a multi-threaded Java producer machine and a consumer machine against 3-5 "
                  "brokers (2017); here everything shares one machine. P/C = producer/consumer processes of "
                  "the cell (the `dsbs` scenario runs each cell with 3/3, the paper's parallelism, each "
                  "producer with up to 15 requests in flight per partition, and with 1/1 and the "
                  "client's default of 5). Ratios above 1 mean this cluster was faster.", ""]
        for p in paper_parts:
            lines += [p, ""]
        lines += ["The paper published its 1-128 KB results only as figures, so those cells have no "
                  "numbers to compare with.", ""]
    lines += ["## Plots", "", f"Timelines use {analysis.get('timeline_bin_s', 1.0):g} s bins (all bins: "
              "`timeline.csv`).", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## How this was measured", "",
              "- Producers and consumers are separate processes (multiprocessing spawn). Each cell uses a fresh "
              "topic; in `split` mode consumers start after every producer has finished, in `streaming` mode "
              "both start on one signal.",
              "- `batch` N >= 1: N records per produce request (`Producer.send_batch`); `batch` 0: `send()` per "
              "record, the client batches by linger and batch bytes.",
              "- Throughput: records (bytes) acknowledged / received, divided by the time from the phase's start "
              "signal to the last ack / receive. Computed by Spark (`bench/analysis.py`) from one event per "
              "batch (`events/`).",
              "- Percentiles are exact (Spark `percentile` weighted by records per batch); all processes share "
              "one wall clock.",
              "- check: acknowledged records = records in the log = records read back.", ""]
    path = os.path.join(run_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


# -- bench compare ---------------------------------------------------------------------------
_KEY = ("mode", "message_bytes", "batch", "acks", "producers", "consumers", "partitions",
        "replication_factor", "rate", "keys", "linger_ms")


def _read_summary(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "summary.csv") if os.path.isdir(run_dir) else run_dir
    if not os.path.exists(path):
        raise BenchError(f"{path} not found: run `bench analyze {run_dir}` first")
    with open(path) as f:
        return list(csv.DictReader(f))


def _f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def compare_runs(a_dir: str, b_dir: str) -> str:
    """A markdown table of two runs' summaries side by side, with ratios b/a."""
    a, b = _read_summary(a_dir), _read_summary(b_dir)
    b_by_key = {tuple(r.get(k) for k in _KEY): r for r in b}
    b_by_cell = {r["cell"]: r for r in b}
    metrics = (("produce_rps", "produce rec/s"), ("consume_rps", "consume rec/s"),
               ("ack_p99_ms", "ack p99 ms"), ("e2e_p99_ms", "e2e p99 ms"))
    rows, matched = [], set()
    for ra in a:
        rb = b_by_key.get(tuple(ra.get(k) for k in _KEY)) or b_by_cell.get(ra["cell"])
        if rb is None:
            continue
        matched.add(rb["cell"])
        row = [ra["cell"] if ra["cell"] == rb["cell"] else f"{ra['cell']} ~ {rb['cell']}"]
        for m, _ in metrics:
            va, vb = _f(ra.get(m)), _f(rb.get(m))
            fmt = _ms if m.endswith("_ms") else _num
            row += [fmt(va), fmt(vb), _ratio(vb, va)]
        rows.append(row)
    header = ["cell"]
    for _, name in metrics:
        header += [f"{name} A", "B", "B/A"]
    out = [f"A = {a_dir}", f"B = {b_dir}", ""]
    if not rows:
        out.append("no cells in common (cells match by workload parameters, else by cell id)")
    else:
        out.append(_table(header, rows))
    only_a = [r["cell"] for r in a if (b_by_key.get(tuple(r.get(k) for k in _KEY)) or b_by_cell.get(r["cell"])) is None]
    only_b = [r["cell"] for r in b if r["cell"] not in matched]
    if only_a:
        out += ["", f"only in A: {', '.join(only_a)}"]
    if only_b:
        out += ["", f"only in B: {', '.join(only_b)}"]
    return "\n".join(out) + "\n"

