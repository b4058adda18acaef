"""The node's sidecar processes (the text gateway, the Kafka listener): each a client of
the node in a process of its own, started after the node's socket is bound, closed before
the node leaves the cluster (a gateway's subscriptions commit and leave their groups first).

``Sidecars`` is the list of started processes, closed in reverse order: at a failed start
(what was started before it, then the caller's own resources), at stop, and at close (a
second close does nothing).
"""
from __future__ import annotations

import logging

log = logging.getLogger("mesh.node.lifecycle.sidecars")


class Sidecars:
    def __init__(self) -> None:
        self._started: list[tuple[str, object]] = []

    def start(self, name: str, start, errors: type[Exception] | tuple[type[Exception], ...]):
        """Run ``start()`` and keep what it returns (with a ``close()``); on one of
        ``errors``, close what was started before it and raise ``SidecarError``."""
        try:
            proc = start()
        except errors as exc:
            self.close()
            raise SidecarError(f"{name}: {exc}") from exc
        self._started.append((name, proc))
        return proc

    def close(self) -> None:
        while self._started:
            name, proc = self._started.pop()
            try:
                proc.close()
            except Exception as exc:   # closing anyway: the others still go
                log.error("could not close the %s: %r", name, exc)

    def __len__(self) -> int:
        return len(self._started)


class SidecarError(Exception):
    """A sidecar did not start (what was started before it is closed)."""
