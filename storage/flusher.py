"""The flush.ms sync of write caching, off the broker's loop thread (issue 41).

A sync of the LMDB file takes 0.3 ms on a quiet disk and 5-40 ms on a busy one; run in
the loop it held every request of every partition for that long, ten times a second.
LMDB's ``mdb_env_sync`` is an fdatasync of the file, safe beside a write transaction
(py-lmdb releases the GIL for it), so it runs here: ``request(seq)`` asks for everything
committed up to commit number ``seq`` to be synced and returns at once; ``done`` is the
highest such number synced. A failed sync is kept in ``error`` (the store then syncs its
next commit in the loop, where a failure fails the turn as it always did).
"""
from __future__ import annotations

import logging
import threading

__all__ = ["Flusher"]

_log = logging.getLogger("storage")


class Flusher:
    def __init__(self, env) -> None:
        self._env = env
        self._cv = threading.Condition()
        self._want = self.done = 0
        self.error: Exception | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, seq: int) -> None:
        with self._cv:
            if seq <= self._want:
                return
            self._want = seq
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="store-flush", daemon=True)
                self._thread.start()
            self._cv.notify()

    def mark(self, seq: int) -> None:
        """The caller synced everything up to ``seq`` itself."""
        with self._cv:
            self.done = max(self.done, seq)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._want <= self.done and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                seq = self._want
            try:
                self._env.sync(True)
            except Exception as exc:   # (lmdb.Error: EIO, ENOSPC)
                _log.error("write caching: the store's sync failed: %s", exc)
                with self._cv:
                    self.error = exc
                    self.done = seq   # (not durable: the store syncs its next commit in the loop)
                continue
            with self._cv:
                self.done = max(self.done, seq)

    def close(self) -> None:
        """Stop after the sync in progress (the caller syncs what is left)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
