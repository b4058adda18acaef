"""Pauses of a secured broker (SIGSTOP / SIGCONT) heal (issue 39, finding 2).

A paused broker's kernel still accepts TCP connections, so a client's reconnections time
out in the CURVE handshake (1 s each): that is a slow broker, retried; only a definite
refusal (ZAP said no, mechanisms differ, or the broker closed the handshakes at once) is
UNAUTHORIZED. After three handshake timeouts the transport used to conclude the cluster key
in the creds was wrong, and every later send failed although the broker had resumed."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from mesh.client import Admin, Producer
from mesh.client.transport import Transport
from mesh.security import Creds
from mesh.testing.launcher import ROOT, BrokerProcess, wait_until
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import MetadataRequest

pytestmark = pytest.mark.integration

PAUSE_S = 6.0     # well over three 1 s handshake timeouts
HEAL_S = 20.0     # sends succeed within this after SIGCONT


@pytest.fixture
def secured_broker(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tools.cli", "security", "init", "--dir", str(tmp_path / "secrets")],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    admin = Creds.load(tmp_path / "secrets" / "admin.creds")
    b = BrokerProcess("n1", str(tmp_path / "n1"), secrets=str(tmp_path / "secrets"), creds=admin).start()
    b.admin = admin
    try:
        with Admin(b.address, creds=admin) as a:
            a.create_topic("paused", 1)
        yield b
    finally:
        if b.alive():
            b.signal(signal.SIGCONT)
        b.kill()


def test_a_secured_client_outlives_a_broker_pause(secured_broker):
    b = secured_broker
    t = Transport(creds=b.admin)
    try:
        with Producer(b.address, creds=b.admin, request_timeout_ms=2_000, delivery_timeout_ms=60_000) as p:
            p.send("paused", b"before").get(10)
            t.call(b.address, MetadataRequest([]), timeout_ms=5_000)
            b.pause()
            paused_at = time.monotonic()
            during = []
            while time.monotonic() - paused_at < PAUSE_S:   # holds the pause; the clients keep trying
                during.append(p.send("paused", b"during"))
                with pytest.raises(MeshError) as info:
                    t.call(b.address, MetadataRequest([]), timeout_ms=500)
                assert info.value.code == ErrorCode.TIMEOUT, info.value   # slow, not refused
            b.resume()
            resumed_at = time.monotonic()
            wait_until(lambda: t.call(b.address, MetadataRequest([]), timeout_ms=1_000), HEAL_S,
                       "the transport's calls to succeed after SIGCONT")
            p.send("paused", b"after").get(HEAL_S)
            for f in during:
                f.get(HEAL_S)
            print(f"\npaused {PAUSE_S:.0f} s: {len(during)} sends during the pause and one after all "
                  f"acknowledged {(time.monotonic() - resumed_at) * 1000:.0f} ms after SIGCONT")
    finally:
        t.close()

