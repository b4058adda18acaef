"""Real broker processes on 127.0.0.1 for integration and fault tests.

Tests never sleep to wait: ``wait_until`` polls a condition with a deadline and fails with
a message that says what it was waiting for.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["free_port", "wait_until", "BrokerProcess", "Cluster"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.02):
    """Poll ``cond()`` until it returns a truthy value; return it. Exceptions count as False."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except Exception as exc:  # the condition may fail while a broker starts
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval_s)  # polling interval of a deadline loop, not a wait for an event


class BrokerProcess:
    def __init__(self, node_id: str, data_dir: str, port: int | None = None,
                 seeds: list[str] | None = None, extra: list[str] | None = None):
        self.node_id = node_id
        self.data_dir = data_dir
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.seeds = seeds or []
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.rstrip("/") + ".log"

    def start(self, wait: bool = True) -> "BrokerProcess":
        cmd = [sys.executable, "-m", "tools.cli", "node", "--id", self.node_id, "--data", self.data_dir,
               "--bind", self.address]
        for s in self.seeds:
            cmd += ["--seed", s]
        cmd += self.extra
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        from mesh.client import Admin

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {self.node_id} exited with {self.proc.returncode}:\n{self.log()}")
            with Admin(self.address, request_timeout_ms=300) as a:
                return a.metadata([]) is not None
        wait_until(ready, timeout_s, f"broker {self.node_id} on {self.address} to answer")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode if self.proc else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""


class Cluster:
    """N brokers; node i seeds from node 1 (as the Procfile does)."""

    def __init__(self, tmp_path, n: int = 1, extra: list[str] | None = None):
        self.brokers: list[BrokerProcess] = []
        first = None
        for i in range(1, n + 1):
            b = BrokerProcess(f"n{i}", str(tmp_path / f"n{i}"), seeds=[first] if first else [], extra=extra)
            first = first or b.address
            self.brokers.append(b)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def start(self) -> "Cluster":
        """Start every broker; return once each one sees all of them alive."""
        for b in self.brokers:
            b.start(wait=False)
        for b in self.brokers:
            b.wait_ready()
        self.wait_converged()
        return self

    def wait_converged(self, timeout_s: float = 20.0) -> None:
        from mesh.client import Admin
        ids = {b.node_id for b in self.brokers if b.alive()}

        def converged(b):
            with Admin(b.address, request_timeout_ms=500) as a:
                alive = {x["id"] for x in a.metadata([]).brokers if x["status"] == "alive"}
            return ids <= alive
        for b in self.brokers:
            if b.alive():
                wait_until(lambda: converged(b), timeout_s, f"{b.node_id} to see {sorted(ids)} alive")

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()
