"""``bench run --scenario peer-nats``: one workload against this mesh and against NATS
JetStream, in one run, side by side with the ratio.

Theory of operation
-------------------
Five systems are measured one after another, each on a cluster started for it and
stopped after it (so no two share the machine at once), alternating mesh and peer so
that load from other work on the machine falls on both alike:

    mesh, 3 brokers, RF 3, acks=all, fsync (the default)  |  NATS JetStream, 3 servers, R3
    mesh, 3 brokers, RF 3, acks=all, write caching        |  (the same NATS R3 row)
    mesh, 1 broker,  RF 1, acks=all, fsync                |  NATS JetStream, 1 server,  R1

The report says what an acknowledgement means on each row (``DURABILITY``): the fsync
rows are stronger than NATS's (it does not sync each message), the write-caching row is
like for like with it (issue 41).

On each, with ``message_bytes`` records into one partition / one stream (each is one
ordered log): blocking publish latency (``latency_samples`` sends, each waiting for its
acknowledgement before the next: ``Producer.send().get()`` with default settings,
``js.publish``), after 100 warm-up sends; async publish throughput (``messages`` records:
``send()`` per record then ``flush()``; ``js.publish_async`` then wait for every ack);
consume throughput (read those records back from the start); end-to-end latency at a
fixed rate (``e2e_rate`` records/s for ``e2e_seconds``, open loop, a consumer in its own
process: ``bench.peer_e2e``); on the mesh, that once more into 3 partitions (the producer's
default sticky partitioner; a leader on each broker: issue 41's row; NATS has no such row,
its stream is one log). Records/s are acknowledged or received records over the wall
time of the phase.

Writes ``peer.json``, ``report.md`` and ``peer.png`` in the run directory. No Spark: the
samples are few and summarised here (``bench.peer_nats.latency_summary``).
"""
from __future__ import annotations

import json
import os
import time

from bench import plots as charts
from bench.calibrate import describe, floor_ms, probe
from bench.peer_e2e import mesh_e2e
from bench.peer_nats import INSTALL_HINT, NatsCluster, available, latency_summary, run_nats
from bench.scenarios import BenchError, format_size

__all__ = ["run_peer", "run_mesh", "peer_spec", "side_by_side", "SYSTEMS"]

# (key, label, system, servers, replicas), in the order they run
SYSTEMS = (
    ("mesh-rf3", "mesh 3 brokers RF 3 acks=all, fsync", "mesh", 3, 3),
    ("nats-r3", "NATS JetStream R3", "nats", 3, 3),
    ("mesh-rf3-wc", "mesh 3 brokers RF 3 acks=all, write caching", "mesh", 3, 3),
    ("mesh-rf1", "mesh 1 broker RF 1, fsync", "mesh", 1, 1),
    ("nats-r1", "NATS JetStream R1", "nats", 1, 1),
)
PAIRS = (("mesh-rf3", "nats-r3"), ("mesh-rf3-wc", "nats-r3"), ("mesh-rf1", "nats-r1"))
# the mesh systems whose topics have write.caching on (issue 41: docs/decisions/41-durability.md)
WRITE_CACHED = frozenset({"mesh-rf3-wc"})
# what an acknowledgement means on each system: the report says it beside the numbers
DURABILITY = {
    "mesh-rf3": "acknowledged once 2 of 3 replicas synced (fdatasync) the record: survives a power loss of every replica",
    "mesh-rf3-wc": "acknowledged once 2 of 3 replicas wrote it (page cache), a sync started within flush.ms (100 ms): "
                   "survives process kills; lost if those replicas lose power within the window",
    "mesh-rf1": "acknowledged once the one broker synced it",
    "nats-r3": "acknowledged once a majority of replicas hold it in memory/page cache; synced every 2 min "
               "(sync_interval default)",
    "nats-r1": "acknowledged once the one server holds it; synced every 2 min",
}

E2E_PARTITIONS = 3   # the mesh's second end-to-end phase: one partition led by each of 3 brokers

# (label, key in a result, better): the rows of the side-by-side table
MEASURES = (
    ("blocking publish p50 (ms)", ("latency", "p50_ms"), "lower"),
    ("blocking publish p99 (ms)", ("latency", "p99_ms"), "lower"),
    ("blocking publish p99.9 (ms)", ("latency", "p999_ms"), "lower"),
    ("blocking publish mean (ms)", ("latency", "mean_ms"), "lower"),
    ("end-to-end p50 at a fixed rate (ms)", ("e2e", "p50_ms"), "lower"),
    ("end-to-end p99 at a fixed rate (ms)", ("e2e", "p99_ms"), "lower"),
    ("end-to-end p99.9 at a fixed rate (ms)", ("e2e", "p999_ms"), "lower"),
    ("end-to-end p50, mesh over 3 partitions (ms)", ("e2e3", "p50_ms"), "lower"),
    ("end-to-end p99, mesh over 3 partitions (ms)", ("e2e3", "p99_ms"), "lower"),
    ("async publish (records/s)", ("produce_rps",), "higher"),
    ("consume (records/s)", ("consume_rps",), "higher"),
)


def peer_spec(message_bytes: int, messages: int, e2e_rate: int = 10_000, e2e_seconds: float = 5.0) -> dict:
    return {"message_bytes": message_bytes, "messages": messages,
            "latency_samples": max(20, min(1000, messages // 100)),
            "e2e_rate": e2e_rate or 10_000, "e2e_seconds": e2e_seconds or 5.0}


def run_mesh(bootstrap: str, replication_factor: int, spec: dict, write_caching: bool = False) -> dict:
    """The peer workload against a mesh cluster (see the module docstring); ``write_caching``:
    its topics have ``write.caching`` on."""
    from bench.cluster import create_topic
    from mesh.client import Consumer, Producer
    size, n, n_lat = spec["message_bytes"], spec["messages"], spec["latency_samples"]
    payload = b"m" * size
    config = {"write.caching": "true"} if write_caching else None
    create_topic(bootstrap, "peer-lat", 1, replication_factor, config)
    create_topic(bootstrap, "peer-thr", 1, replication_factor, config)
    create_topic(bootstrap, "peer-e2e", 1, replication_factor, config)
    create_topic(bootstrap, "peer-e2e3", E2E_PARTITIONS, replication_factor, config)
    out: dict = {}
    with Producer(bootstrap) as p:  # default settings (acks=all)
        for _ in range(min(100, n_lat)):
            p.send("peer-lat", payload).get(30)
        lat = []
        for _ in range(n_lat):
            t = time.perf_counter_ns()
            p.send("peer-lat", payload).get(30)
            lat.append(time.perf_counter_ns() - t)
        out["latency"] = latency_summary(lat)
        t = time.perf_counter_ns()
        for _ in range(n):
            p.send("peer-thr", payload, partition=0)
        p.flush(120)
        out["produce_rps"] = n / ((time.perf_counter_ns() - t) / 1e9)
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([("peer-thr", 0)])
        c.seek_to_beginning()
        got = 0
        t = time.perf_counter_ns()
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            got += sum(len(b) for b in c.poll_batches(200))
        out["consume_rps"] = got / ((time.perf_counter_ns() - t) / 1e9)
        out["consumed"] = got
    if got < n:
        raise BenchError(f"mesh consumer read {got} of {n} records within 120 s")
    out["e2e"] = mesh_e2e(bootstrap, "peer-e2e", size, spec["e2e_rate"], spec["e2e_seconds"])
    out["e2e3"] = mesh_e2e(bootstrap, "peer-e2e3", size, spec["e2e_rate"], spec["e2e_seconds"], E2E_PARTITIONS)
    return out


def _get(result: dict | None, path: tuple):
    v = result
    for k in path:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


def _fmt(v, ms: bool) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if ms else f"{v:,.0f}"


def side_by_side(results: dict) -> str:
    """The markdown table: each measure, mesh and NATS per replication, and mesh/NATS."""
    header = ["measure"]
    for a, b in PAIRS:
        header += [dict((k, lab) for k, lab, *_ in SYSTEMS)[a], dict((k, lab) for k, lab, *_ in SYSTEMS)[b],
                   "mesh/NATS"]
    header.append("better")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 2) + [":---"]) + "|"]
    for label, path, better in MEASURES:
        ms = path[0] in ("latency", "e2e")
        row = [label]
        for a, b in PAIRS:
            va, vb = _get(results.get(a), path), _get(results.get(b), path)
            ratio = f"{va / vb:.2f}x" if va is not None and vb else "-"
            row += [_fmt(va, ms), _fmt(vb, ms), ratio]
        row.append(better)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def against_targets(results: dict, cal: dict | None) -> list[str]:
    """Issue 41's yardsticks, from this run: the fsync row's blocking p50 over the floor the
    calibration measured (2 ZeroMQ round trips + 1 synced commit, one of 3 at once as the
    replicas' on this one disk, and beside it with a commit alone; target <= 2x), the
    write-caching row's over NATS R3's (target <= 1x), the fsync row's end-to-end p99 over 3
    partitions against NATS R3's (target <= 1x), and each RF-3 row's async publish over NATS
    R3's (target >= 16x)."""
    out = []
    alone, shared = floor_ms(cal), floor_ms(cal, shared_disk=True)
    fsync, wc, nats = (_get(results.get(k), ("latency", "p50_ms")) for k in ("mesh-rf3", "mesh-rf3-wc", "nats-r3"))
    floor = shared or alone
    if floor and fsync is not None:
        commit = "while 3 commit at once, as an RF-3 write's replicas on this one disk, " if shared else ""
        out.append(f"- fsync, blocking publish p50 {fsync:.2f} ms = {fsync / floor:.2f}x the floor {floor:.2f} ms "
                   f"(2 ZeroMQ round trips + 1 synced LMDB commit {commit}at the calibration's p50; target <= 2x)"
                   + (f"; {fsync / alone:.2f}x {alone:.2f} ms with a commit alone" if shared and alone else ""))
    if wc is not None and nats:
        out.append(f"- write caching, blocking publish p50 {wc:.2f} ms = {wc / nats:.2f}x NATS R3's {nats:.2f} ms "
                   "(target <= 1x)")
    e2e3, nats_e2e = _get(results.get("mesh-rf3"), ("e2e3", "p99_ms")), _get(results.get("nats-r3"), ("e2e", "p99_ms"))
    if e2e3 is not None and nats_e2e:
        out.append(f"- fsync, end-to-end p99 over {E2E_PARTITIONS} partitions {e2e3:.2f} ms = {e2e3 / nats_e2e:.2f}x "
                   f"NATS R3's {nats_e2e:.2f} ms (target <= 1x)")
    nats_rps = _get(results.get("nats-r3"), ("produce_rps",))
    for key, mode in (("mesh-rf3", "fsync"), ("mesh-rf3-wc", "write caching")):
        rps = _get(results.get(key), ("produce_rps",))
        if rps is not None and nats_rps:
            out.append(f"- {mode}, async publish {rps:,.0f} records/s = {rps / nats_rps:.1f}x NATS R3's "
                       f"{nats_rps:,.0f} (target >= 16x)")
    return out


def _report(out_dir: str, spec: dict, results: dict, info: dict) -> str:
    lines = ["# Benchmark report: peer-nats", "",
             f"The same workload against this mesh and NATS JetStream, in one run: {format_size(spec['message_bytes'])} "
             f"records; blocking publish latency over {spec['latency_samples']:,} sends (each acknowledged before the "
             f"next); end-to-end latency at {spec['e2e_rate']:,} records/s for {spec['e2e_seconds']:g} s (open loop: "
             "from each record's due time to its receipt by a consumer in another process); async publish and "
             f"consume throughput over {spec['messages']:,} records; one partition / one stream (and the mesh's "
             f"end-to-end once more over {E2E_PARTITIONS} partitions). Ratios are "
             "mesh/NATS: for latency lower is better, for records/s higher is better.", "",
             side_by_side(results), "",
             *(against_targets(results, info.get("calibration")) + [""]),
             "![peer.png](peer.png)", "",
             "## Setup", "",
             f"- command: `{info.get('command', '-')}`",
             f"- started {info.get('started', '-')}; machine: {info.get('machine', '-')}",
             f"- machine at start: {describe(info.get('calibration'))} (`bench.calibrate`: how quiet the host "
             "was; compare runs by it)",
             "- systems run one after another, alternating mesh and NATS, each on a cluster started for it on "
             "127.0.0.1 (fresh data directories) and stopped after it.",
             "- mesh: `Producer` with default settings (acks=all, linger 5 ms upper bound); fsync rows: the "
             "topics' default durability (the broker syncs before it acknowledges); write caching rows: the "
             "topics have `write.caching=true` (flush.ms 100).",
             f"- NATS: {info.get('nats_version', 'nats-server')}, nats-py, file storage; JetStream acknowledges "
             "once the replicas hold a message but does not fsync each one (sync_interval default 2 min).",
             "", "## Durability of each row", ""] + [
             f"- {label}: {DURABILITY.get(key, '-')}" for key, label, *_ in SYSTEMS] + [""]
    if info.get("errors"):
        lines += ["## Errors", ""] + [f"- {k}: {v}" for k, v in info["errors"].items()] + [""]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def run_peer(out_dir: str, message_bytes: int, messages: int, command: str = "", echo=print,
             e2e_rate: int = 10_000, e2e_seconds: float = 5.0) -> str:
    """Measure every system of SYSTEMS; write peer.json, report.md and peer.png; return
    the report's path. BenchError (with how to install it) when the peer is missing."""
    missing = available()
    if missing:
        raise BenchError(f"{missing}. {INSTALL_HINT}")
    import subprocess
    from bench.cluster import LocalCluster
    from bench.events import environment, now_iso
    spec = peer_spec(message_bytes, messages, e2e_rate, e2e_seconds)
    env = environment()
    version = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
    info = {"command": command, "started": now_iso(), "nats_version": version, "errors": {},
            "machine": f"{env.get('cpu_count')} CPUs, load average at start "
                       f"{', '.join(f'{x:.1f}' for x in env.get('loadavg') or [])}",
            "calibration": probe(out_dir)}
    echo(f"bench: machine now: {describe(info['calibration'])}")
    results: dict = {}
    for key, label, system, servers, replicas in SYSTEMS:
        echo(f"bench: peer-nats: {label}...")
        root = os.path.join(out_dir, key)
        t0 = time.monotonic()
        try:
            if system == "mesh":
                cluster = LocalCluster(servers, root).start()
                try:
                    results[key] = run_mesh(cluster.bootstrap, replicas, spec, key in WRITE_CACHED)
                finally:
                    cluster.stop()
            else:
                nc = NatsCluster(servers, root).start()
                try:
                    results[key] = run_nats(nc.url, replicas, spec)
                finally:
                    nc.stop()
        except BenchError as exc:
            info["errors"][key] = str(exc)
            echo(f"bench: peer-nats: {label} failed: {exc}")
            continue
        r = results[key]
        echo(f"bench: peer-nats: {label}: publish p50 {r['latency']['p50_ms']:.2f} ms, "
             f"p99 {r['latency']['p99_ms']:.2f} ms; end-to-end at {spec['e2e_rate']:,} rec/s p50 "
             f"{r['e2e']['p50_ms']:.2f} ms, p99 {r['e2e']['p99_ms']:.2f} ms; async {r['produce_rps']:,.0f} rec/s; "
             f"consume {r['consume_rps']:,.0f} rec/s ({time.monotonic() - t0:.1f} s)")
    with open(os.path.join(out_dir, "peer.json"), "w") as f:
        json.dump({"spec": spec, "info": info, "results": results}, f, indent=1)
    try:
        charts.plot_peer(os.path.join(out_dir, "peer.png"), results, SYSTEMS)
    except Exception as exc:  # a plot must not cost the table
        echo(f"warning: plot peer.png failed: {exc}")
    for line in against_targets(results, info["calibration"]):
        echo(f"bench: peer-nats: {line[2:]}")
    path = _report(out_dir, spec, results, info)
    if info["errors"]:
        raise BenchError(f"peer-nats: {len(info['errors'])} system(s) failed; see {path}")
    return path
