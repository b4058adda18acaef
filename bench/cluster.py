"""Brokers for a benchmark: start our own in a temporary directory, or check a running one.

``LocalCluster(n)`` starts ``n`` broker processes (``python -m tools.cli node``) on free
127.0.0.1 ports, each with its data in a fresh temporary directory, broker 2..n seeding
from broker 1 (as the Procfile does). It waits until every broker answers and, for
n > 1, until every broker's metadata lists all n (the cluster has formed by gossip).
Logs go to ``<log_dir>/<id>.log``; data is deleted on ``stop()``.

Topics are created through ``Admin`` with the requested replication factor; a broker
that cannot place that many replicas answers with its own error, which is passed on.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bench.scenarios import BenchError

__all__ = ["LocalCluster", "check_reachable", "create_topic", "delete_topic", "free_port"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metadata(address: str, timeout_ms: int):
    """One broker's own metadata answer (not the cluster view's first responder)."""
    from mesh.client import Admin
    with Admin(address, request_timeout_ms=timeout_ms) as a:
        return a.metadata([])


def check_reachable(bootstrap: str, timeout_s: float = 5.0) -> list[dict]:
    """The brokers the cluster reports, or BenchError saying none answered."""
    from mesh.wire.errors import MeshError
    try:
        from mesh.client.transport import parse_address
        for a in bootstrap.split(","):
            if a.strip():
                parse_address(a.strip())
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    from mesh.client import Admin
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            left_ms = max(200, int((deadline - time.monotonic()) * 1000))
            with Admin(bootstrap, request_timeout_ms=min(left_ms, 2000)) as a:
                return a.brokers()
        except MeshError as exc:
            last = exc
    raise BenchError(f"no broker answered at {bootstrap} within {timeout_s:.0f} s ({last}); "
                     f"is the cluster running? (start one with `make run`, or omit --bootstrap "
                     f"to let bench start its own)")


def create_topic(bootstrap: str, name: str, partitions: int, replication_factor: int,
                 config: dict | None = None, timeout_s: float = 20.0) -> None:
    from mesh.client import Admin
    from mesh.wire.errors import MeshError
    with Admin(bootstrap) as a:
        try:
            a.create_topic(name, partitions, replication_factor, config or {})
        except MeshError as exc:
            raise BenchError(f"cannot create topic {name} ({partitions} partitions, replication factor "
                             f"{replication_factor}): broker says {exc.code.name}: {exc.message}") from None
        # wait until leaders are known (immediate on one broker; a gossip round or two on many)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                t = a.describe_topic(name)
                if all(p.get("leader_address") for p in t["partitions"]):
                    return
            except MeshError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"topic {name} has partitions without a leader after {timeout_s:.0f} s")
            time.sleep(0.05)  # polling interval of a deadline loop


def delete_topic(bootstrap: str, name: str) -> None:
    from mesh.client import Admin
    from mesh.wire.errors import MeshError
    try:
        with Admin(bootstrap, request_timeout_ms=10_000) as a:
            a.delete_topic(name)
    except MeshError:
        pass  # best effort: a leftover topic costs disk, not correctness


class LocalCluster:
    def __init__(self, n: int, log_dir: str, extra_args: list[str] | None = None):
        if n < 1:
            raise BenchError("--brokers must be at least 1")
        self.n = n
        self.log_dir = log_dir
        self.extra_args = extra_args or []
        self.data_root: str | None = None
        self.procs: list[tuple[str, str, subprocess.Popen, str]] = []  # (id, address, proc, log)

    @property
    def bootstrap(self) -> str:
        return ",".join(addr for _, addr, _, _ in self.procs)

    def start(self, timeout_s: float = 30.0) -> "LocalCluster":
        os.makedirs(self.log_dir, exist_ok=True)
        self.data_root = tempfile.mkdtemp(prefix="mesh-bench-")
        first = None
        try:
            for i in range(1, self.n + 1):
                node_id = f"n{i}"
                addr = f"127.0.0.1:{free_port()}"
                log_path = os.path.join(self.log_dir, f"{node_id}.log")
                cmd = [sys.executable, "-m", "tools.cli", "node", "--id", node_id,
                       "--data", os.path.join(self.data_root, node_id), "--bind", addr]
                if first:
                    cmd += ["--seed", first]
                cmd += self.extra_args
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
                self.procs.append((node_id, addr, proc, log_path))
                first = first or addr
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _tail(self, log_path: str) -> str:
        try:
            with open(log_path, "rb") as f:
                return f.read().decode(errors="replace")[-2000:]
        except OSError:
            return ""

    def _wait_ready(self, timeout_s: float) -> None:
        from mesh.wire.errors import MeshError
        deadline = time.monotonic() + timeout_s
        pending = list(self.procs)
        while pending:
            node_id, addr, proc, log_path = pending[0]
            if proc.poll() is not None:
                raise BenchError(f"broker {node_id} exited with code {proc.returncode}:\n{self._tail(log_path)}")
            try:
                meta = _metadata(addr, 300)
                if len(meta.brokers) >= self.n:
                    pending.pop(0)
                    continue
                why = f"its metadata lists {len(meta.brokers)} of {self.n} brokers"
            except MeshError as exc:
                why = str(exc)
            if time.monotonic() > deadline:
                hint = ""
                if self.n > 1:
                    hint = (" (multi-broker clusters need gossip; this build may serve single brokers only: "
                            "use --brokers 1)")
                raise BenchError(f"broker {node_id} on {addr} not ready after {timeout_s:.0f} s: {why}{hint}")
            time.sleep(0.05)  # polling interval of a deadline loop

    def stop(self) -> None:
        for _, _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, _, proc, _ in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
        if self.data_root:
            shutil.rmtree(self.data_root, ignore_errors=True)
            self.data_root = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
