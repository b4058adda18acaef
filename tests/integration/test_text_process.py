"""The text gateway runs in a process of its own beside its node (``mesh.gateway.process``):
it serves, it never outlives its node, and a port it cannot take stops the node's start
with a clear error."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from mesh.testing.launcher import BrokerExited, BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:   # the field after the state: ppid
            out.append(int(entry))
    return out


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"   # a zombie has ended
    except OSError:
        return True


def _ask(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(line)
        buf = b""
        while not buf.endswith(b"END\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf


def test_the_gateway_is_a_child_process_that_ends_with_a_killed_node(tmp_path):
    port = free_port()
    b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--text-port", str(port)]).start()
    try:
        (child,) = _children(b.proc.pid)
        with open(f"/proc/{child}/cmdline", "rb") as f:
            assert b"mesh.gateway.process" in f.read()
        assert b"PUBS" in _ask(port, b"HELP\n")
        b.signal(signal.SIGKILL)
        wait_until(lambda: _gone(child), 10, "the gateway process to end after its node was killed")
        with socket.socket() as s:   # and its port is free again
            s.bind(("127.0.0.1", port))
    finally:
        b.kill()


def test_a_text_port_in_use_stops_the_start_with_a_clear_error(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--text-port", str(port)])
        with pytest.raises(BrokerExited) as exc:
            b.start(timeout_s=30)
        assert "text gateway" in str(exc.value) and "in use" in str(exc.value), str(exc.value)[-600:]
        b.kill()
