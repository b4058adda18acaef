"""The text gateway in a process of its own, beside its node.

Why a process: a gateway session does Python work for every record it parses or formats
(JSON, base64, batch decoding), and in the node's process that work held the GIL the node
loop needs. Eight text connections looping ``CONS`` raised the node's own produce latency
from p50 0.8 ms (p99 4 ms) to p50 220 ms (p99 1.2 s), the scale at which a silent leader is
replaced; the same load through a gateway in another process: p50 1.6 ms. The gateway was
already a client of its node (``mesh.gateway.text``: the public client library pointed at
the node's address), so it needs nothing of the node's but that address and its limits.

Theory of operation
-------------------
- ``GatewayProcess.start`` runs ``python -m mesh.gateway.process`` with the node's address,
  the text port and the limits, and waits (at most ``START_WAIT_S``) for the child's first
  line on its stdout: ``ready`` once it listens, else the reason it could not (a port in
  use, bad credentials), raised as ``GatewayError``. Its log lines go to the node's stderr
  (the node's log), named ``[<node>/text]``.
- The child ends when told (SIGTERM, or SIGINT: it stops accepting, ends its sessions,
  whose subscriptions leave their groups, within ``mesh.gateway.text.CLOSE_WAIT_S``), and
  on its own when its parent is gone (it asks ``getppid`` every ``PARENT_POLL_S``), so a
  node killed with -9 leaves no gateway listening on its port.
- ``close`` (the node stopping): SIGTERM, then SIGKILL if the child has not ended after
  ``CLOSE_WAIT_S`` + 1 s. Idempotent.
"""
from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from mesh.gateway.text import CLOSE_WAIT_S

__all__ = ["GatewayProcess", "GatewayError", "main", "child_args", "run_child"]

log = logging.getLogger("mesh.gateway.process")

START_WAIT_S = 20.0
PARENT_POLL_S = 0.5
_READY = "ready"


class GatewayError(Exception):
    """The gateway process could not start (the reason is the message)."""


class GatewayProcess:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    WHAT = "the text gateway process"    # in messages
    ERROR: type[Exception] = GatewayError
    CLOSE_WAIT_S = CLOSE_WAIT_S + 1.0       # SIGTERM, then SIGKILL after this

    @classmethod
    def start(cls, address: str, port: int, *, node_id: str, max_session_timeout_ms: int,
              max_connections: int, idle_timeout_ms: int, evict_idle_ms: int, max_subscriptions: int,
              creds_path: str | None = None, start_wait_s: float = START_WAIT_S) -> "GatewayProcess":
        argv = [sys.executable, "-m", "mesh.gateway.process", "--node", node_id, "--address", address,
                "--port", str(port), "--max-session-timeout-ms", str(max_session_timeout_ms),
                "--max-connections", str(max_connections), "--idle-timeout-ms", str(idle_timeout_ms),
                "--evict-idle-ms", str(evict_idle_ms), "--max-subscriptions", str(max_subscriptions),
                "--log-level", str(logging.getLogger().getEffectiveLevel())]
        if creds_path:
            argv += ["--creds", creds_path]
        return cls.spawn(argv, start_wait_s)

    @classmethod
    def spawn(cls, argv: list[str], start_wait_s: float):
        """Run ``argv`` (a ``python -m`` child of this package's tree) and wait for its first
        line: ``ready``, else the reason, raised as ``cls.ERROR``."""
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None,
                                    env=env, text=True)
        except OSError as exc:
            raise cls.ERROR(f"cannot start {cls.WHAT}: {exc}") from exc
        self = cls(proc)
        line = self._first_line(start_wait_s)
        if line != _READY:
            self.close()
            raise cls.ERROR(line or f"{cls.WHAT} ended (exit code {proc.returncode})")
        return self

    def _first_line(self, wait_s: float) -> str:
        deadline = time.monotonic() + wait_s
        fd = self.proc.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"{self.WHAT} did not start within {wait_s:.0f} s"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                return fd.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(self.CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time: killed", self.WHAT)
                self.proc.kill()
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the child --------------------------------------------------------------------------
def child_args(prog: str, description: str, argv: list[str] | None,
               more: Callable[[argparse.ArgumentParser], None]) -> argparse.Namespace:
    """A sidecar child's command line: ``--node``, ``--address`` (the node's), ``more``'s own
    arguments, ``--creds`` and ``--log-level``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--node", required=True)
    p.add_argument("--address", required=True, help="the node's HOST:PORT")
    more(p)
    p.add_argument("--creds")
    p.add_argument("--log-level", type=int, default=logging.INFO)
    return p.parse_args(argv)


def run_child(args: argparse.Namespace, tag: str, what: str, where: str,
              start: Callable[[], Callable[[], None]], logger: logging.Logger) -> int:
    """A sidecar child's life (module doc): its log lines on stderr named
    ``[<node>/<tag>]``; ``start()`` serves and returns how to stop; a failure to start is
    the first line on stdout (``<where>: <type>: <reason>``, status 1), else ``ready``;
    then it serves until SIGTERM/SIGINT or until its parent is gone."""
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{args.node}/{tag}] %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[h])
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        close = start()
    except Exception as exc:
        print(f"{where}: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(_READY, flush=True)
    try:
        while not stop.wait(PARENT_POLL_S):
            if os.getppid() != parent:
                logger.warning("the node (pid %d) is gone: %s stops", parent, what)
                break
    finally:
        close()
    return 0


def main(argv: list[str] | None = None) -> int:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--port", type=int, required=True)
        for name in ("--max-session-timeout-ms", "--max-connections", "--idle-timeout-ms", "--evict-idle-ms",
                     "--max-subscriptions"):
            p.add_argument(name, type=int, required=True)

    args = child_args("python -m mesh.gateway.process", "The text protocol gateway of one node (started by the "
                      "node).", argv, more)

    def start():
        from mesh.gateway.text import TextGateway
        creds = None
        if args.creds:
            from mesh.security.creds import Creds
            creds = Creds.load(args.creds)
        gw = TextGateway(args.address, args.port, max_session_timeout_ms=args.max_session_timeout_ms,
                         max_connections=args.max_connections, idle_timeout_ms=args.idle_timeout_ms,
                         evict_idle_ms=args.evict_idle_ms, max_subscriptions=args.max_subscriptions,
                         creds=creds)
        return gw.close

    return run_child(args, "text", "the text gateway", f"text gateway on port {args.port}", start, log)


if __name__ == "__main__":
    sys.exit(main())
