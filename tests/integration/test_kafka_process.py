"""The Kafka listener's process lives and dies with its node; an open node keeps it on loopback."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from mesh.testing.launcher import ROOT, BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.integration


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


def test_listener_ends_with_its_node_even_killed(tmp_path):
    b = BrokerProcess("n7", str(tmp_path / "n7"), kafka_port=free_port()).start()
    try:
        assert not _refused(b.kafka_port)
        b.kill()   # SIGKILL: the node cannot stop its listener; the listener sees its parent gone
        wait_until(lambda: _refused(b.kafka_port), 10, "the Kafka port closed after the node died")
        b.start()
        wait_until(lambda: not _refused(b.kafka_port), 20, "the Kafka port back with the node")
        assert b.stop() == 0
        assert _refused(b.kafka_port)
    finally:
        if b.alive():
            b.kill()


def test_open_node_refuses_a_non_loopback_kafka_host(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tools.cli", "node", "--id", "n1", "--data", str(tmp_path / "d"),
                          "--bind", f"127.0.0.1:{free_port()}", "--kafka-port", str(free_port()),
                          "--kafka-host", "0.0.0.0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "binds loopback only" in out.stderr


def test_a_node_restarted_without_its_listener_stops_advertising_it(tmp_path):
    from mesh.client.admin import Admin
    b = BrokerProcess("n4", str(tmp_path / "n4"), kafka_port=free_port()).start()
    try:
        with Admin(b.address) as a:
            assert a.metadata([]).brokers[0]["kafka"] == {"host": "127.0.0.1", "port": b.kafka_port, "id": 4}
        b.stop()
        b.kafka_port = None
        b.start()
        with Admin(b.address) as a:
            assert a.metadata([]).brokers[0]["kafka"] is None
    finally:
        if b.alive():
            b.kill()


def _listener_pids(port: int) -> list[int]:
    """Pids of the Kafka listener processes serving ``port`` (from /proc's command lines)."""
    import os
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"mesh.kafka.process" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == str(port).encode():
            out.append(int(d))
    return out


def test_a_killed_listener_is_started_again_by_its_node(tmp_path):
    import os
    import signal
    b = BrokerProcess("n5", str(tmp_path / "n5"), kafka_port=free_port()).start()
    try:
        (old,) = _listener_pids(b.kafka_port)
        os.kill(old, signal.SIGKILL)   # as the OOM killer would
        wait_until(lambda: (pids := _listener_pids(b.kafka_port)) and old not in pids and not _refused(b.kafka_port),
                   30, "a new listener on the Kafka port")
        assert b.alive() and len(_listener_pids(b.kafka_port)) == 1
        assert b.stop() == 0   # the restarted listener ends with its node as the first one did
        wait_until(lambda: not _listener_pids(b.kafka_port), 10, "no listener left after the node stopped")
    finally:
        if b.alive():
            b.kill()
