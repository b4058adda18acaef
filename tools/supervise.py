"""Keep one broker of a local cluster running: ``python -m tools.supervise NAME -- CMD ...``.

``make run`` starts each broker of the Procfile under this, because honcho ends every process
when one exits: a ``kill -9`` of one broker (the README's failover demo) would end the whole
cluster. Rules:

- the command exits on its own with a non-zero status or by a signal (``kill -9``): it is
  started again after ``RESTART_DELAY_S``, as a supervisor (systemd's ``Restart=on-failure``)
  would; more than ``MAX_RESTARTS`` restarts within ``WINDOW_S`` and it gives up (a broker
  that cannot start, e.g. a damaged store, says why in its log and stays down);
- it exits with status 0: this ends too (the broker was stopped on purpose);
- SIGTERM or SIGINT here (Ctrl-C of ``make run``): passed on to the command, which stops
  cleanly (hands its leaderships over); this exits with its status and restarts nothing.
A paused broker (``kill -STOP``) is not a dead one: nothing is done until it exits.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

__all__ = ["main"]

RESTART_DELAY_S = 1.0
MAX_RESTARTS = 5
WINDOW_S = 60.0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m tools.supervise NAME -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    name, cmd = argv[0], argv[2:]
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    restarts: list[float] = []
    while True:
        child = subprocess.Popen(cmd)
        rc = child.wait()
        if stopping or rc == 0:
            return rc if rc >= 0 else 128 - rc
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"status {rc}"
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < WINDOW_S] + [now]
        if len(restarts) > MAX_RESTARTS:
            print(f"supervise: {name} exited ({how}) {MAX_RESTARTS} times within {WINDOW_S:.0f} s: "
                  f"not restarting it again (its log above says why)", file=sys.stderr, flush=True)
            return 1
        print(f"supervise: {name} exited ({how}): starting it again in {RESTART_DELAY_S:.0f} s",
              file=sys.stderr, flush=True)
        time.sleep(RESTART_DELAY_S)
        if stopping:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
