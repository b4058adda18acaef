"""The cell runner: measures one cell of a scenario with producer and consumer *processes*
(spawned, so the GIL of one does not throttle another; ``bench.producer_worker``,
``bench.consumer_worker``), coordinated by the bench process.

Theory of operation
-------------------
For each cell the coordinator creates a fresh topic, spawns the workers and waits until
each has connected and fetched metadata ("ready"); then it sets one "go" event and
records that instant as the phase start. In ``split`` mode producers run to completion,
then consumers are spawned and started; in ``streaming`` mode consumers are started
first, then both get the same "go".

Once the producers are done, each consumer is told how many records it must read: the
log end of its partitions, asked of their leaders (a fresh topic starts at 0; with
acks=0 only the log knows what arrived). Workers write their events (``bench.events``)
at the end of their phase and report through a queue; live progress goes through one
shared counter per worker. The cell's row is appended to ``cells.jsonl``.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue as queue_mod
import time
from collections import Counter
from dataclasses import dataclass

from bench.consumer_worker import consumer_main
from bench.events import append_cell
from bench.producer_worker import producer_main
from bench.scenarios import BenchError, Cell
from bench.worker_common import partition_count, topic_config

__all__ = ["CellResult", "run_cell", "check_group_support"]


def check_group_support() -> None:
    try:
        import mesh.client.group  # noqa: F401
    except ImportError:
        raise BenchError("consumer groups are not supported by this broker build yet "
                         "(mesh.client.group is missing); run without --group") from None


@dataclass
class CellResult:
    cell: str
    produced: int
    consumed: int
    produce_s: float
    consume_s: float
    errors: int


class _Phase:
    """Spawned workers of one side, their ready/go handshake and live counters."""

    def __init__(self, ctx, kind: str, n: int, target, spec: dict, results, events_dir: str,
                 expected=None):
        self.kind, self.n = kind, n
        self.ready = ctx.Queue()
        self.go = ctx.Event()
        self.progress = ctx.Array("q", n, lock=False)
        self.procs = []
        for i in range(n):
            args = (spec, i, self.ready, self.go, self.progress)
            args += ((expected,) if expected is not None else ()) + (results, events_dir)
            pr = ctx.Process(target=target, args=args, name=f"bench-{kind}-{i}", daemon=True)
            pr.start()
            self.procs.append(pr)

    def wait_ready(self, timeout_s: float, results) -> None:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < self.n:
            try:
                self.ready.get(timeout=0.2)
                seen += 1
            except queue_mod.Empty:
                _raise_worker_error(results)
                for pr in self.procs:
                    if pr.exitcode not in (None, 0):
                        raise BenchError(f"{pr.name} exited with code {pr.exitcode} before it was ready")
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.kind}s not ready after {timeout_s:.0f} s")

    def total(self) -> int:
        return sum(self.progress[:])

    def kill(self) -> None:
        for pr in self.procs:
            if pr.is_alive():
                pr.terminate()
        for pr in self.procs:
            pr.join(5)


_pending_results: list = []


def _raise_worker_error(results) -> None:
    """Drain ``results``; raise the first worker error."""
    while True:
        try:
            item = results.get_nowait()
        except queue_mod.Empty:
            return
        _pending_results.append(item)
        kind, idx, res = item
        if "error" in res:
            raise BenchError(f"{kind} {idx} failed: {res['error']}")


def _collect(results, kind: str, n: int, phase: _Phase, bar, deadline: float, totals=None) -> dict:
    """Wait for ``n`` results of ``kind``; keep the progress bars moving meanwhile."""
    out = {}
    last = 0
    while len(out) < n:
        _raise_worker_error(results)
        for item in [x for x in _pending_results if x[0] == kind]:
            _pending_results.remove(item)
            out[item[1]] = item[2]
        if len(out) >= n:
            break
        for b, ph in totals or [(bar, phase)]:
            if b is not None:
                cur = ph.total()
                b.update(cur - b.n)
        for i, pr in enumerate(phase.procs):
            if i not in out and pr.exitcode not in (None, 0):
                time.sleep(0.5)  # its error report may still be in the queue
                _raise_worker_error(results)
                raise BenchError(f"{pr.name} died with exit code {pr.exitcode}")
        if time.monotonic() > deadline:
            raise BenchError(f"{kind}s did not finish within the phase timeout")
        time.sleep(0.1 if last == phase.total() else 0.05)  # progress display cadence
        last = phase.total()
    return out


def _log_ends(bootstrap: str, topic: str, settle: bool) -> list[int]:
    """Each partition's log end, asked of its leader (another broker's gossiped view of a
    partition it does not lead may lag)."""
    from mesh.client import Consumer
    with Consumer(bootstrap=bootstrap) as c:
        tps = [(topic, q) for q in range(partition_count(c, topic))]

        def ends():
            got = c.end_offsets(tps)
            return [got[tp] for tp in sorted(got, key=lambda tp: tp.partition)]
        now = ends()
        while settle:  # acks=0: wait until the brokers have taken in what was sent
            time.sleep(0.3)
            again = ends()
            settle, now = again != now, again
    return now


def _bar(tqdm, desc: str, total: int | None, position: int, quiet: bool):
    if tqdm is None or quiet:
        return None
    return tqdm(total=total, desc=desc, unit="rec", unit_scale=True, position=position, leave=False,
                dynamic_ncols=True, mininterval=0.25, smoothing=0.3)


def run_cell(cell: Cell, bootstrap: str, run_dir: str, run_id: str, *, quiet: bool = False,
             timeout_s: float = 600.0, idle_timeout_s: float = 30.0, keep_topic: bool = False,
             echo=print) -> CellResult:
    """Measure one cell; append its row to cells.jsonl; return the counts."""
    from bench.cluster import create_topic, delete_topic
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    w = cell.workload
    if w.group:
        check_group_support()
    topic = f"bench-{run_id}-{cell.id}"
    create_topic(bootstrap, topic, w.partitions, w.replication_factor, topic_config(w))
    events_dir = os.path.join(run_dir, "events")
    spec = {"workload": dataclasses.asdict(w), "topic": topic, "cell": cell.id, "bootstrap": bootstrap,
            "idle_timeout_s": idle_timeout_s}
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    expected = ctx.Array("q", [-1] * max(1, w.consumers), lock=False)
    _pending_results.clear()
    prod = cons = None
    pbar = cbar = None
    row = {"cell": cell.id, "label": cell.label, "index": cell.index, "topic": topic, **dataclasses.asdict(w)}
    started = time.monotonic()
    try:
        if w.mode == "streaming":
            cons = _Phase(ctx, "consumer", w.consumers, consumer_main, spec, results, events_dir, expected)
            cons.wait_ready(60, results)
        prod = _Phase(ctx, "producer", w.producers, producer_main, spec, results, events_dir)
        prod.wait_ready(60, results)
        total = w.messages or None
        pbar = _bar(tqdm, f"{cell.id} produce", total, 1, quiet)
        if cons is not None:
            cbar = _bar(tqdm, f"{cell.id} consume", total, 2, quiet)
        go_ns = time.time_ns()
        row["produce_go_ns"] = go_ns
        if cons is not None:
            row["consume_go_ns"] = go_ns
            cons.go.set()
        prod.go.set()
        deadline = time.monotonic() + timeout_s
        bars = [(pbar, prod)] + ([(cbar, cons)] if cons is not None else [])
        pres = _collect(results, "producer", w.producers, prod, pbar, deadline, bars)
        row["produce_end_ns"] = time.time_ns()
        acked = Counter()
        for r in pres.values():
            acked.update({int(k): v for k, v in r["acked"].items()})
        errors = sum(r["errors"] for r in pres.values())
        produced = sum(acked.values())
        if errors:
            first = next(r["first_error"] for r in pres.values() if r["first_error"])
            echo(f"warning: {cell.id}: {errors} produce requests failed, e.g. {first}")
        if pbar is not None:
            pbar.close()
        # what each consumer must read: the log end of its partitions (a fresh topic starts
        # at 0; with acks=0 only the log knows what arrived)
        ends = _log_ends(bootstrap, topic, settle=w.acks == "0")
        row["log_end"] = sum(ends)
        if w.batch and w.acks != "0":  # send_batch rows know their partition exactly
            ends = [max(e, acked.get(q, 0)) for q, e in enumerate(ends)]
        for j in range(w.consumers):
            if w.group:  # the broker assigns: all stop when the group has read everything
                expected[j] = sum(ends)
            else:
                expected[j] = sum(e for q, e in enumerate(ends) if q % w.consumers == j)
        consumed = 0
        if w.consumers:
            if cons is None:  # split: consumption starts now, on a topic that is complete
                cons = _Phase(ctx, "consumer", w.consumers, consumer_main, spec, results, events_dir, expected)
                cons.wait_ready(60, results)
                cbar = _bar(tqdm, f"{cell.id} consume", produced, 1, quiet)
                row["consume_go_ns"] = time.time_ns()
                cons.go.set()
            elif cbar is not None:
                cbar.total = produced
                cbar.refresh()
            cres = _collect(results, "consumer", w.consumers, cons, cbar, time.monotonic() + timeout_s)
            row["consume_end_ns"] = time.time_ns()
            consumed = sum(r["total"] for r in cres.values())
            if cbar is not None:
                cbar.close()
        row.update(produced=produced, consumed=consumed, produce_errors=errors,
                   wall_s=round(time.monotonic() - started, 3))
        append_cell(run_dir, row)
        p_s = (row["produce_end_ns"] - row["produce_go_ns"]) / 1e9
        c_s = (row["consume_end_ns"] - row["consume_go_ns"]) / 1e9 if w.consumers else 0.0
        return CellResult(cell.id, produced, consumed, p_s, c_s, errors)
    finally:
        for b in (pbar, cbar):
            if b is not None:
                b.close()
        for ph in (prod, cons):
            if ph is not None:
                ph.kill()
        if not keep_topic:
            delete_topic(bootstrap, topic)
