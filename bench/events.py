"""Recording: one row per batch per side, as Parquet files Spark reads; run metadata as JSON.

Layout of a run directory::

    run.json                     scenario, parameters, environment (CPUs, versions, git commit)
    cells.jsonl                  one line per cell: its workload and its phase start times
    events/produce/<cell>-p<i>.parquet   producer i's batches in that cell
    events/consume/<cell>-c<i>.parquet   consumer i's received batches in that cell
    brokers/<id>.log             logs of brokers the bench started itself

Times are wall-clock nanoseconds (``time.time_ns()``) so that producer and consumer
processes on one machine share a clock; across machines their clocks must be in sync
for end-to-end latency to mean anything.

Producer row: the batch's ``send_ns`` (handed to the client), ``intended_ns`` (when the
rate schedule wanted it sent; equals ``send_ns`` without a target rate, and latency is
measured from it so a stalled producer cannot hide queueing: no coordinated omission),
``ack_ns`` (its future resolved), ``count``, ``bytes`` (keys + values), ``partition``,
``producer``, and ``error`` (null when acknowledged).

Consumer row: ``recv_ns`` (the poll returned it), ``count``, ``bytes``, ``partition``,
``first_offset``, and the producer stamps of its records run-length encoded as
``ts_us``/``ts_n`` (stamp in microseconds, number of records with it). The stamp is the
intended send time the producer wrote in the first 8 bytes of each value (microsecond
resolution); records shorter than 8 bytes fall back to the record timestamp (ms).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata

__all__ = ["PRODUCE", "CONSUME", "produce_schema", "consume_schema", "EventBuffer", "write_run_json", "append_cell",
           "read_cells", "read_run_json", "environment", "now_iso"]


def _pa():
    import pyarrow as pa
    return pa


def produce_schema():
    pa = _pa()
    return pa.schema([
        ("cell", pa.string()), ("producer", pa.int32()), ("partition", pa.int32()),
        ("send_ns", pa.int64()), ("intended_ns", pa.int64()), ("ack_ns", pa.int64()),
        ("count", pa.int32()), ("bytes", pa.int64()), ("error", pa.string()),
    ])


def consume_schema():
    pa = _pa()
    return pa.schema([
        ("cell", pa.string()), ("consumer", pa.int32()), ("partition", pa.int32()),
        ("recv_ns", pa.int64()), ("count", pa.int32()), ("bytes", pa.int64()),
        ("first_offset", pa.int64()), ("ts_us", pa.list_(pa.int64())), ("ts_n", pa.list_(pa.int32())),
    ])


PRODUCE = "produce"
CONSUME = "consume"


class EventBuffer:
    """Column lists in memory, written once as one Parquet file (workers write at the end
    of their phase, so recording costs no I/O while measuring)."""

    def __init__(self, kind: str):
        assert kind in (PRODUCE, CONSUME)
        self.kind = kind
        self.schema = produce_schema() if kind == PRODUCE else consume_schema()
        self.cols: dict[str, list] = {name: [] for name in self.schema.names}

    def __len__(self) -> int:
        return len(self.cols["cell"])

    def add(self, **row) -> None:
        for name, col in self.cols.items():
            col.append(row[name])

    def write(self, path: str) -> None:
        import pyarrow.parquet as pq
        pa = _pa()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        table = pa.table({n: pa.array(c, type=self.schema.field(n).type) for n, c in self.cols.items()},
                         schema=self.schema)
        tmp = path + ".tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict:
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "versions": {d: _version(d) for d in ("broker-mesh", "pyzmq", "msgpack", "lmdb", "pyspark",
                                              "pyarrow", "matplotlib", "tqdm", "click")},
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def write_run_json(run_dir: str, info: dict) -> None:
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, "run.json.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, os.path.join(run_dir, "run.json"))


def read_run_json(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)


def append_cell(run_dir: str, row: dict) -> None:
    with open(os.path.join(run_dir, "cells.jsonl"), "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def read_cells(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "cells.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
