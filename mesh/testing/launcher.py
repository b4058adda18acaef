"""Real broker processes on 127.0.0.1: the one launcher the integration tests and the
benchmarks use.

Theory of operation
-------------------
A ``BrokerProcess`` is one ``python -m tools.cli node`` child with a fixed id, data
directory and address (a free port chosen once, so a restart comes back on the same
address with the same data). Its output goes to a log file (``<data_dir>.log`` unless
told otherwise), which failures quote. It can be stopped cleanly (SIGTERM, then SIGKILL
after a grace period), killed (``kill -9``: nothing flushed), paused and resumed
(SIGSTOP / SIGCONT), and started again.

A ``Cluster`` is N such brokers named ``n1..nN`` under one directory, node i seeding from
node 1 (as the Procfile does). ``start()`` returns once every broker answers and each one
lists all of them alive (the cluster has formed by gossip); if that fails, every broker
it started is stopped before the error propagates.

Nothing here sleeps to wait for an event: ``wait_until`` polls a condition with a
deadline and fails with a message that says what it was waiting for. A broker that
exits while being waited for fails the wait at once (``BrokerExited``), with its log.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["ROOT", "BrokerExited", "BrokerProcess", "Cluster", "free_port", "wait_until"]

# the directory that holds the ``mesh`` and ``tools`` packages (the repository root in a checkout)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BrokerExited(AssertionError):
    """A broker process ended while something was waiting for it."""


_LOW_PORT = 10_000
_next_port: list[int] = []   # this process's next candidate (chosen at the first call)


def _port_slice() -> range:
    """The ports this process hands out: below the kernel's ephemeral range (so no outgoing
    connection of anything on the host takes one between ``free_port`` and the bind), split
    between pytest-xdist's workers (``PYTEST_XDIST_WORKER`` gw0, gw1, ...) so that two of
    them never hand out the same port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32_768
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (ephemeral_low - _LOW_PORT) // workers
    return range(_LOW_PORT + index % workers * width, _LOW_PORT + (index % workers + 1) * width)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, from this process's slice
    (``_port_slice``), taken in turn from a random start: a port is not handed out twice
    until the slice wraps. Where the slice is too small (an ephemeral range starting low),
    the kernel's choice."""
    ports = _port_slice()
    if len(ports) >= 1_000:
        if not _next_port:
            _next_port.append(ports.start + int.from_bytes(os.urandom(4), "big") % len(ports))
        for _ in range(200):
            port = _next_port[0]
            _next_port[0] = port + 1 if port + 1 < ports.stop else ports.start
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue   # taken (or in TIME_WAIT): the next one
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.02):
    """Poll ``cond()`` until it returns a truthy value; return it. Exceptions count as
    False (the condition may fail while a broker starts), except ``BrokerExited``."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except BrokerExited:
            raise
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval_s)  # polling interval of a deadline loop, not a wait for an event


class BrokerProcess:
    """One broker process; ``start()`` again after ``stop()`` or ``kill()`` restarts it on
    the same address with the same data directory."""

    def __init__(self, node_id: str, data_dir: str, port: int | None = None,
                 seeds: list[str] | None = None, extra: list[str] | None = None,
                 log_path: str | None = None, new_session: bool = False, host: str = "127.0.0.1",
                 prefix: list[str] | None = None, secrets: str | None = None, creds=None,
                 metrics_port: int | None = None, kafka_port: int | None = None):
        """``metrics_port``: ``mesh node --metrics-port`` (``metrics_url``); ``kafka_port``:
        ``mesh node --kafka-port`` (``kafka_address``). ``secrets``: a
        secrets directory (``mesh node --secrets``); ``creds``: what this launcher's own
        requests (readiness, metadata) use with it. Without secrets, a non-loopback ``host``
        runs the node with ``--insecure``."""
        self.node_id = node_id
        self.secrets = secrets
        self.creds = creds
        self.data_dir = str(data_dir)
        self.port = port or free_port()
        self.host = host  # another address than loopback: e.g. inside a network namespace
        self.address = f"{host}:{self.port}"
        self.prefix = prefix or []  # runs the node under this command, e.g. ["ip", "netns", "exec", ns]
        self.seeds = seeds or []
        self.extra = extra or []
        self.metrics_port = metrics_port
        self.kafka_port = kafka_port
        self.log_path = log_path or self.data_dir.rstrip("/") + ".log"
        self.new_session = new_session  # own process group: a Ctrl-C at the terminal does not reach it
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = self.prefix + [sys.executable, "-m", "tools.cli", "node", "--id", self.node_id,
                             "--data", self.data_dir, "--bind", self.address]
        for s in self.seeds:
            cmd += ["--seed", s]
        if self.secrets:
            cmd += ["--secrets", str(self.secrets)]
        elif not self.host.startswith("127."):
            cmd += ["--insecure"]   # open on a non-loopback address (network namespace tests)
        if self.metrics_port:
            cmd += ["--metrics-port", str(self.metrics_port)]
            if self.secrets and not self.host.startswith("127."):
                cmd += ["--metrics-host", self.host]   # a secured node serves /metrics on loopback by default
        if self.kafka_port:
            cmd += ["--kafka-port", str(self.kafka_port)]
        return cmd + self.extra

    @property
    def kafka_address(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def start(self, wait: bool = True, timeout_s: float = 20.0) -> "BrokerProcess":
        if self.alive():
            raise RuntimeError(f"broker {self.node_id} is already running")
        log_dir = os.path.dirname(self.log_path)
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=self.new_session)
        if wait:
            try:
                self.wait_ready(timeout_s)
            except BaseException:
                self.kill()   # one that never answered is not left running after the test (its log stays)
                raise
        return self

    def restart(self, wait: bool = True, timeout_s: float = 20.0) -> "BrokerProcess":
        """Clean stop (if running), then start on the same address and data directory."""
        self.stop()
        return self.start(wait, timeout_s)

    def check_running(self) -> None:
        """Raise ``BrokerExited`` (with the log's tail) unless the process runs."""
        if self.proc is None:
            raise BrokerExited(f"broker {self.node_id} was never started")
        if self.proc.poll() is not None:
            raise BrokerExited(f"broker {self.node_id} exited with code {self.proc.returncode}:\n{self.log()}")

    def metadata(self, timeout_ms: int = 500):
        """This broker's own metadata answer (not a cluster view's first responder)."""
        from mesh.client import Admin
        with Admin(self.address, request_timeout_ms=timeout_ms, creds=self.creds) as a:
            return a.metadata([])

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Return once the broker answers a metadata request. A metrics port taken between
        ``free_port`` and the broker's bind (an outgoing connection of anything on the host
        may get it as its ephemeral port) is chosen again, at most 3 times: nothing else
        names that port."""
        tries = 3

        def ready():
            nonlocal tries
            try:
                self.check_running()
            except BrokerExited as exc:
                if not (self.metrics_port and tries and f"metrics on {self.host}:{self.metrics_port}" in str(exc)
                        and "Address already in use" in str(exc)):
                    raise
                tries -= 1
                self.metrics_port = free_port()
                self.start(wait=False)
                return False
            return self.metadata(300) is not None
        wait_until(ready, timeout_s, f"broker {self.node_id} on {self.address} to answer")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process stays, silent, until ``resume()``."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); return the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_stopped(timeout_s)

    def wait_stopped(self, timeout_s: float = 15.0) -> int:
        if self.proc is None:
            return 0
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail_chars: int = 4000) -> str:
        """The end of the broker's log file."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-tail_chars:]
        except OSError:
            return ""


class Cluster:
    """N brokers ``n1..nN`` with their data under ``root``; node i seeds from node 1 (as
    the Procfile does). Logs go to ``<root>/<id>.log``, or ``<log_dir>/<id>.log``."""

    def __init__(self, root, n: int = 1, extra: list[str] | None = None, log_dir: str | None = None,
                 new_session: bool = False, hosts: list[str] | None = None,
                 prefixes: list[list[str]] | None = None, secrets: str | None = None, creds=None,
                 metrics: bool = False, kafka: bool = False):
        """``hosts[i]`` / ``prefixes[i]``, when given, are node i+1's listen host and command
        prefix (``BrokerProcess``): brokers in network namespaces (``mesh.testing.netns``).
        ``secrets`` / ``creds``: every broker secured with that secrets directory, and the
        credentials the launcher's own requests use (``BrokerProcess``). ``metrics``: every
        broker serves /metrics on a free port (``BrokerProcess.metrics_url``). ``kafka``: every
        broker runs a Kafka listener on a free port (``kafka_bootstrap``)."""
        self.root = str(root)
        self.brokers: list[BrokerProcess] = []
        first = None
        for i in range(1, n + 1):
            node_id = f"n{i}"
            log_path = os.path.join(log_dir, f"{node_id}.log") if log_dir else None
            b = BrokerProcess(node_id, os.path.join(self.root, node_id), seeds=[first] if first else [],
                              extra=extra, log_path=log_path, new_session=new_session,
                              host=hosts[i - 1] if hosts else "127.0.0.1",
                              prefix=prefixes[i - 1] if prefixes else None, secrets=secrets, creds=creds,
                              metrics_port=free_port() if metrics else None,
                              kafka_port=free_port() if kafka else None)
            first = first or b.address
            self.brokers.append(b)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(b.kafka_address for b in self.brokers if b.kafka_port)

    def start(self, timeout_s: float = 20.0) -> "Cluster":
        """Start every broker; return once each one sees all of them alive. On failure,
        stop what was started and raise."""
        try:
            for b in self.brokers:
                b.start(wait=False)
            for b in self.brokers:
                b.wait_ready(timeout_s)
            self.wait_converged(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_converged(self, timeout_s: float = 20.0) -> None:
        """Wait until every running broker lists every running broker alive."""
        ids = {b.node_id for b in self.brokers if b.alive()}

        def converged(b):
            b.check_running()
            alive = {x["id"] for x in b.metadata(500).brokers if x["status"] == "alive"}
            return ids <= alive
        for b in self.brokers:
            if b.alive():
                try:
                    wait_until(lambda: converged(b), timeout_s, f"{b.node_id} to see {sorted(ids)} alive")
                except BrokerExited:
                    raise
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{self.views()}") from None

    def views(self, tail_chars: int = 3000) -> str:
        """What each broker says of its members, and its log's end: for a failed wait."""
        out = []
        for b in self.brokers:
            try:
                seen = ", ".join(f"{x['id']}={x['status']}" for x in b.metadata(2000).brokers)
            except Exception as exc:   # a broker that does not answer says so here
                seen = f"no answer ({exc!r})"
            out.append(f"--- {b.node_id} ({'running' if b.alive() else 'stopped'}) sees: {seen}\n{b.log(tail_chars)}")
        return "\n".join(out)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to every broker at once, then wait for each."""
        for b in self.brokers:
            if b.alive():
                b.signal(signal.SIGTERM)
        for b in self.brokers:
            b.wait_stopped(timeout_s)

    def kill(self) -> None:
        """kill -9 every broker."""
        for b in self.brokers:
            b.kill()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
