"""The NATS JetStream side of ``bench run --scenario peer-nats``: a cluster started here
and the peer workload driven with nats-py.

``NatsCluster(n, root)`` starts ``n`` ``nats-server`` processes on free 127.0.0.1 ports,
JetStream on, store directories under ``root`` (``n`` > 1: one cluster block with routes
to every server), waits until JetStream answers (a meta leader is elected), and stops
them on ``stop()``. ``run_nats(url, replicas, spec)`` measures on a fresh file-backed
stream of that many replicas: blocking publish latency (one ``publish`` awaited at a
time, each acknowledged by the stream), async publish throughput (``publish_async``,
the client's default window of pending acks), consume throughput (an ordered push
consumer, nats-py's fastest way to read a stream: no acks, flow-controlled; a pull
consumer fetching 1,000 at a time read 5-8x slower here) and end-to-end latency at a fixed
rate (``bench.peer_e2e``). It returns the same keys as ``bench.peer.run_mesh``.

JetStream 2.9 acknowledges a publish once the stream's replicas hold it in their file
store; it does not fsync each message (``sync_interval`` defaults to 2 minutes), while
the mesh syncs before it acknowledges. ``available()`` says what is missing.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import time

from bench.scenarios import BenchError

__all__ = ["NatsCluster", "run_nats", "available", "latency_summary", "INSTALL_HINT"]

INSTALL_HINT = ("the peer-nats scenario needs the NATS server and its Python client: "
                "`apt-get install nats-server` (or put a nats-server binary on the PATH) and "
                "`pip install .[peer]` (nats-py)")


def available() -> str | None:
    """None when nats-server and nats-py are both here, else what is missing."""
    missing = []
    if shutil.which("nats-server") is None:
        missing.append("nats-server is not on the PATH")
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py is not installed")
    return "; ".join(missing) or None


def _free_ports(n: int) -> list[int]:
    from mesh.testing.launcher import free_port
    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p not in out:
            out.append(p)
    return out


class NatsCluster:
    """``n`` nats-server processes with JetStream; ``url`` lists every client address."""

    def __init__(self, n: int, root: str):
        self.n, self.root = n, root
        self.procs: list[subprocess.Popen] = []
        ports = _free_ports(2 * n)
        self.client_ports, self.route_ports = ports[:n], ports[n:]
        self.url = ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def _config(self, i: int) -> str:
        store = os.path.join(self.root, f"n{i}", "jetstream")
        os.makedirs(store, exist_ok=True)
        conf = [f"server_name: bench-n{i}", f"listen: 127.0.0.1:{self.client_ports[i]}",
                "jetstream {", f'  store_dir: "{store}"', "  max_memory_store: 256MB",
                "  max_file_store: 4GB", "}"]
        if self.n > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
            conf += ["cluster {", "  name: bench", f"  listen: 127.0.0.1:{self.route_ports[i]}",
                     f"  routes: [{routes}]", "}"]
        path = os.path.join(self.root, f"n{i}.conf")
        with open(path, "w") as f:
            f.write("\n".join(conf) + "\n")
        return path

    def start(self, timeout_s: float = 30.0) -> "NatsCluster":
        os.makedirs(self.root, exist_ok=True)
        try:
            for i in range(self.n):
                log = open(os.path.join(self.root, f"n{i}.log"), "wb")
                self.procs.append(subprocess.Popen(["nats-server", "-c", self._config(i)], stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
            asyncio.run(self._wait_ready(timeout_s))
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_ready(self, timeout_s: float) -> None:
        import nats
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            for i, pr in enumerate(self.procs):
                if pr.poll() is not None:
                    raise BenchError(f"nats-server {i} exited with code {pr.returncode}; "
                                     f"see {os.path.join(self.root, f'n{i}.log')}")
            try:
                nc = await nats.connect(servers=self.url.split(","), connect_timeout=1, allow_reconnect=False,
                                        error_cb=_quiet, reconnected_cb=None)
                try:
                    await nc.jetstream(timeout=1).account_info()
                    return
                finally:
                    await nc.close()
            except Exception as exc:  # not up yet, or no JetStream meta leader yet
                last = exc
            await asyncio.sleep(0.1)  # polling interval of a deadline loop
        raise BenchError(f"NATS JetStream ({self.n} server(s)) not ready after {timeout_s:.0f} s: {last!r}")

    def stop(self) -> None:
        for pr in self.procs:
            if pr.poll() is None:
                pr.terminate()
        for pr in self.procs:
            try:
                pr.wait(10)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait(5)
        self.procs = []


def latency_summary(samples_ns: list[int]) -> dict:
    """p50/p99/p99.9/mean/max in ms of latency samples in ns (linear interpolation
    between closest ranks, as numpy's default and the Spark job do)."""
    xs = sorted(samples_ns)
    if not xs:
        return {}

    def pct(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return (xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)) / 1e6

    return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
            "mean_ms": sum(xs) / len(xs) / 1e6, "max_ms": xs[-1] / 1e6, "samples": len(xs)}


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: the default logs a traceback for every refused connect
    while the servers start; errors that matter surface as exceptions."""


async def _run(url: str, replicas: int, spec: dict) -> dict:
    import nats
    from nats.js.api import StorageType
    size, n, n_lat = spec["message_bytes"], spec["messages"], spec["latency_samples"]
    payload = b"m" * size
    nc = await nats.connect(servers=url.split(","), max_reconnect_attempts=2, error_cb=_quiet)
    out: dict = {}
    try:
        js = nc.jetstream(timeout=10)
        for name, subject in (("LAT", "bench.lat"), ("THR", "bench.thr"), ("E2E", "bench.e2e")):
            deadline = time.monotonic() + 20
            while True:
                try:
                    await js.add_stream(name=name, subjects=[subject], num_replicas=replicas,
                                        storage=StorageType.FILE)
                    break
                except Exception:  # a new cluster may still be placing the stream
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)  # retry interval of a deadline loop
        for _ in range(min(100, n_lat)):  # warm up: connections, stream leader, buffers
            await js.publish("bench.lat", payload)
        lat = []
        for _ in range(n_lat):
            t = time.perf_counter_ns()
            await js.publish("bench.lat", payload)
            lat.append(time.perf_counter_ns() - t)
        out["latency"] = latency_summary(lat)

        t = time.perf_counter_ns()
        for _ in range(n):
            await js.publish_async("bench.thr", payload)
        await asyncio.wait_for(js.publish_async_completed(), 120)
        out["produce_rps"] = n / ((time.perf_counter_ns() - t) / 1e9)

        got = 0
        done = asyncio.Event()

        async def count(_msg) -> None:
            nonlocal got
            got += 1
            if got >= n:
                done.set()

        t = time.perf_counter_ns()
        sub = await js.subscribe("bench.thr", cb=count, ordered_consumer=True)
        try:
            await asyncio.wait_for(done.wait(), 120)
        except asyncio.TimeoutError:
            raise BenchError(f"NATS consumer read {got} of {n} messages within 120 s") from None
        out["consume_rps"] = n / ((time.perf_counter_ns() - t) / 1e9)
        out["consumed"] = got
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


def run_nats(url: str, replicas: int, spec: dict) -> dict:
    """The peer workload against a NATS cluster (see the module docstring)."""
    from bench.peer_e2e import nats_e2e
    out = asyncio.run(_run(url, replicas, spec))
    out["e2e"] = nats_e2e(url, "bench.e2e", spec["message_bytes"], spec["e2e_rate"], spec["e2e_seconds"])
    return out
