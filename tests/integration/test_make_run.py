"""``make run``'s cluster as the README uses it: the real Procfile under honcho, one broker
killed with -9 comes back by itself and the others stay up; Ctrl-C (SIGINT to honcho) ends
every broker cleanly."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mesh.testing.launcher import ROOT, free_port, wait_until

pytestmark = pytest.mark.integration


def _procfile(tmp: Path) -> tuple[Path, list[str]]:
    """The repository's Procfile with free ports and data under ``tmp``, run by this Python."""
    text = (Path(ROOT) / "Procfile").read_text()
    ports = {}
    for old in sorted(set(re.findall(r"127\.0\.0\.1:(\d+)|--(?:metrics|kafka|text)-port (\d+)", text))):
        for p in old:
            if p:
                ports[p] = str(free_port())
    text = re.sub(r"(?<=127\.0\.0\.1:)(\d+)|(?<=--metrics-port )(\d+)|(?<=--kafka-port )(\d+)|(?<=--text-port )(\d+)",
                  lambda m: ports[m.group(0)], text)
    bindir = Path(sys.executable).parent
    text = text.replace(".venv/bin/python", sys.executable).replace(".venv/bin/mesh", str(bindir / "mesh"))
    text = text.replace("data/", f"{tmp}/data/")
    path = tmp / "Procfile"
    path.write_text(text)
    binds = re.findall(r"--bind (127\.0\.0\.1:\d+)", text)
    return path, binds


def _pid(tmp: Path, node: str) -> int | None:
    try:
        return int((tmp / "data" / node / "mesh.lock").read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _alive(bootstrap: str) -> set[str]:
    out = subprocess.run([str(Path(sys.executable).parent / "mesh"), "cluster", "status", "--json",
                          "--bootstrap", bootstrap], capture_output=True, text=True, timeout=30)
    if out.returncode:
        return set()
    return {r["id"] for r in json.loads(out.stdout) if r.get("status") == "alive"}


def test_a_broker_killed_with_sigkill_comes_back_and_ctrl_c_ends_all(tmp_path):
    procfile, binds = _procfile(tmp_path)
    (tmp_path / "data").mkdir()
    honcho = subprocess.Popen([str(Path(sys.executable).parent / "honcho"), "-f", str(procfile),
                               "-d", str(ROOT), "start"], stdout=open(tmp_path / "honcho.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: _alive(binds[0]) == {"n1", "n2", "n3"}, timeout_s=90,
                   what="make run's three brokers alive")
        old = _pid(tmp_path, "n2")
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (_pid(tmp_path, "n2") not in (None, old)), timeout_s=60,
                   what="n2 started again by its supervisor")
        wait_until(lambda: _alive(binds[0]) == {"n1", "n2", "n3"}, timeout_s=90,
                   what="all three alive again after n2's restart")
        assert honcho.poll() is None, "honcho ended the cluster when one broker died"
        honcho.send_signal(signal.SIGINT)
        honcho.wait(timeout=60)
        for node in ("n1", "n2", "n3"):
            pid = _pid(tmp_path, node)
            wait_until(lambda: not Path(f"/proc/{pid}").exists() or
                       Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
                       timeout_s=30, what=f"{node} ended after Ctrl-C")
        log = (tmp_path / "honcho.log").read_text()
        assert "n2 exited (signal SIGKILL): starting it again" in log
    finally:
        if honcho.poll() is None:
            os.killpg(honcho.pid, signal.SIGKILL)
