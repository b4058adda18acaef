"""/metrics cannot be turned against its broker (issue 39, finding 10).

prometheus_client's server spent one thread per connection and had no timeout: 1,000
connections that send half a request held 1,000 threads in the broker process. Now one
thread serves /metrics with at most 32 connections (``mesh.node.ops.metrics_http``), and a
secured node serves it on loopback unless told otherwise."""
from __future__ import annotations

import os
import socket
import time
import urllib.request

import pytest

from mesh.security import Creds
from mesh.security.creds import init_secrets
from mesh.testing.launcher import BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.integration

SLOW = 1_000


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def test_slow_connections_do_not_cost_a_thread_each_and_a_scrape_answers(tmp_path):
    b = BrokerProcess("n1", str(tmp_path / "n1"), metrics_port=free_port()).start()
    held: list[socket.socket] = []
    try:
        assert "mesh_broker_info" in _scrape(b.metrics_url)
        before = _threads(b.proc.pid)
        for _ in range(SLOW):   # half a request each, then nothing (slowloris)
            s = socket.create_connection((b.host, b.metrics_port), timeout=5)
            s.sendall(b"GET /metr")
            held.append(s)
        time.sleep(1.0)   # let a thread-per-connection server spawn what it would
        peak = _threads(b.proc.pid)
        t0 = time.monotonic()
        text = _scrape(b.metrics_url)
        scrape_ms = (time.monotonic() - t0) * 1000
        after = _threads(b.proc.pid)
        print(f"\nthreads: {before} before, {peak} with {SLOW} slow connections, {after} after a scrape "
              f"({scrape_ms:.0f} ms)")
        assert "mesh_broker_info" in text
        assert max(peak, after) < before + 20, f"{peak} threads with {SLOW} slow connections (was {before})"
        # and a slow reader is closed after the request timeout (10 s): its socket reads EOF
        s = held[-1]
        s.settimeout(30)
        t0 = time.monotonic()
        try:
            got = s.recv(100)
        except ConnectionResetError:
            got = b""
        assert got == b"", got
        print(f"a slow connection was closed after {time.monotonic() - t0:.1f} s more")
    finally:
        for s in held:
            s.close()
        b.kill()


def test_a_secured_node_serves_metrics_on_loopback_only_by_default(tmp_path):
    init_secrets(tmp_path / "secrets")
    admin = Creds.load(tmp_path / "secrets" / "admin.creds")
    # bound on 127.0.0.2 (loopback as well, but another address than 127.0.0.1): /metrics
    # is not on the bind host but on 127.0.0.1
    b = BrokerProcess("n1", str(tmp_path / "n1"), host="127.0.0.2", secrets=str(tmp_path / "secrets"),
                      creds=admin, metrics_port=free_port()).start()
    try:
        wait_until(lambda: _try(f"http://127.0.0.1:{b.metrics_port}/metrics"), 20, "/metrics on 127.0.0.1")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", b.metrics_port), timeout=2).close()
    finally:
        b.kill()


def _try(url: str) -> bool:
    try:
        return "mesh_broker_info" in _scrape(url, 3)
    except OSError:
        return False
