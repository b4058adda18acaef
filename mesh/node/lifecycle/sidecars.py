"""The node's sidecar processes (the text gateway, the Kafka listener): each a client of
the node in a process of its own, started after the node's socket is bound, closed before
the node leaves the cluster (a gateway's subscriptions commit and leave their groups first).

``Sidecars`` is the list of started processes, closed in reverse order: at a failed start
(what was started before it, then the caller's own resources), at stop, and at close (a
second close does nothing).

Supervision: a sidecar that exits while its node runs (killed, out of memory, a crash) is
started again, as a supervisor would: ``supervise()`` (a task of the node's turn, once a
second) sees the exit, logs it, and after a back-off (1 s, doubling to 30 s; back to 1 s
once a restarted sidecar stayed up a minute) starts it on a thread of its own, so the
node's loop never waits for the start (up to the sidecar's start timeout). A restart that
fails is logged and tried again after the next back-off; the node goes on serving its own
port meanwhile.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("mesh.node.lifecycle.sidecars")

RESTART_FIRST_S = 1.0     # back-off before the first restart
RESTART_MAX_S = 30.0      # ... doubling up to this
STAYED_UP_S = 60.0        # a sidecar up this long since its restart: the back-off starts over


class _Sidecar:
    def __init__(self, name: str, start, proc) -> None:
        self.name, self.start, self.proc = name, start, proc
        self.backoff = RESTART_FIRST_S
        self.due: float | None = None              # a restart is due then
        self.thread: threading.Thread | None = None   # a restart in progress
        self.result = None                         # its process, or its exception
        self.started_at = time.monotonic()

    def restart(self) -> None:
        try:
            self.result = self.start()
        except Exception as exc:   # (the sidecar's own start error, or anything else): tried again later
            self.result = exc


class Sidecars:
    def __init__(self) -> None:
        self._started: list[_Sidecar] = []
        self._closed = False

    def start(self, name: str, start, errors: type[Exception] | tuple[type[Exception], ...]):
        """Run ``start()`` and keep what it returns (with a ``close()``); on one of
        ``errors``, close what was started before it and raise ``SidecarError``."""
        try:
            proc = start()
        except errors as exc:
            self.close()
            raise SidecarError(f"{name}: {exc}") from exc
        self._started.append(_Sidecar(name, start, proc))
        return proc

    def supervise(self, now: float | None = None) -> None:
        """Restart what exited (module doc); never blocks."""
        now = time.monotonic() if now is None else now
        for s in self._started:
            if s.thread is not None:
                if not s.thread.is_alive():
                    self._restarted(s, now)
            elif s.due is not None:
                if now >= s.due and not self._closed:
                    s.due, s.result = None, None
                    s.thread = threading.Thread(target=s.restart, name=f"restart {s.name}", daemon=True)
                    s.thread.start()
            elif not _alive(s.proc):
                log.error("the %s exited (code %s): starting it again in %.0f s", s.name,
                          getattr(getattr(s.proc, "proc", None), "returncode", "?"), s.backoff)
                s.due = now + s.backoff
                s.backoff = min(RESTART_MAX_S, s.backoff * 2)
            elif s.backoff > RESTART_FIRST_S and now - s.started_at >= STAYED_UP_S:
                s.backoff = RESTART_FIRST_S

    def _restarted(self, s: _Sidecar, now: float) -> None:
        s.thread, result = None, s.result
        if isinstance(result, Exception):
            log.error("the %s did not start again: %s (next try in %.0f s)", s.name, result, s.backoff)
            s.due = now + s.backoff
            s.backoff = min(RESTART_MAX_S, s.backoff * 2)
            return
        s.proc, s.started_at = result, now
        log.warning("the %s was started again", s.name)

    def close(self) -> None:
        self._closed = True
        while self._started:
            s = self._started.pop()
            if s.thread is not None:   # a restart in progress: its process is closed too
                s.thread.join()
                if s.result is not None and not isinstance(s.result, Exception):
                    s.proc = s.result
            try:
                s.proc.close()
            except Exception as exc:   # closing anyway: the others still go
                log.error("could not close the %s: %r", s.name, exc)

    def __len__(self) -> int:
        return len(self._started)


def _alive(proc) -> bool:
    """Whether a sidecar's process runs (one without a ``proc`` handle is taken as alive)."""
    p = getattr(proc, "proc", None)
    return p is None or p.poll() is None


class SidecarError(Exception):
    """A sidecar did not start (what was started before it is closed)."""
