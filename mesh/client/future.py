"""A cheap one-shot future for the producer's batches.

``concurrent.futures.Future`` costs a ``Condition`` per future, built when the future is
made and entered (in Python) by every ``set_result`` and ``result``: about a tenth of the
producer's CPU per small request. ``BatchFuture`` has the part of its interface callers
use (``result(timeout)``, ``exception(timeout)``, ``done()``, ``add_done_callback(fn)``;
``cancel()`` always says False: a batch handed to the producer cannot be taken back) and
builds nothing until someone waits: a waiter is a lock that ``set_result`` /
``set_exception`` releases; the state moves under one module-wide lock (C-level, held for
a few attribute writes). Not for ``concurrent.futures.wait`` / ``as_completed``.

A timed-out wait raises ``TimeoutError`` (``concurrent.futures.TimeoutError`` is the same
class). A callback added after completion runs at once in the caller's thread; one added
before runs in the completing thread (the producer's I/O thread); a callback's exception
is logged, as ``concurrent.futures`` does.
"""
from __future__ import annotations

import logging
import threading

__all__ = ["BatchFuture"]

log = logging.getLogger("mesh.producer")
_state_lock = threading.Lock()
_new_lock = threading.Lock        # a waiter: made acquired; completion releases it
_PENDING = object()


class BatchFuture:
    __slots__ = ("_result", "_exc", "_waiter", "_callbacks")

    def __init__(self):
        self._result = _PENDING       # the result, or _PENDING until done (also when failed)
        self._exc: BaseException | None = None
        self._waiter = None
        self._callbacks: list | None = None

    def done(self) -> bool:
        return self._result is not _PENDING or self._exc is not None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self.done()

    def _wait(self, timeout: float | None) -> None:
        with _state_lock:
            if self.done():
                return
            w = self._waiter
            if w is None:
                w = self._waiter = _new_lock()
                w.acquire()
        if not w.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            raise TimeoutError()
        w.release()   # let any other waiter through

    def result(self, timeout: float | None = None):
        if self._result is _PENDING:
            if self._exc is None:
                self._wait(timeout)
            if self._exc is not None:
                raise self._exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._result is _PENDING and self._exc is None:
            self._wait(timeout)
        return self._exc

    def add_done_callback(self, fn) -> None:
        with _state_lock:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        self._call(fn)

    def set_result(self, result) -> None:
        with _state_lock:
            self._result = result
            w, cbs = self._waiter, self._callbacks
            self._waiter = self._callbacks = None
        if w is not None:
            w.release()
        if cbs:
            for fn in cbs:
                self._call(fn)

    def set_exception(self, exc: BaseException) -> None:
        with _state_lock:
            self._exc = exc
            w, cbs = self._waiter, self._callbacks
            self._waiter = self._callbacks = None
        if w is not None:
            w.release()
        if cbs:
            for fn in cbs:
                self._call(fn)

    def _call(self, fn) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)
