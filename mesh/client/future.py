"""Futures of the producer: ``BatchFuture`` (a batch), ``RecordFuture`` (one record of it).

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
is logged, as ``concurrent.futures`` does. A record's callback (``RecordFuture.add_callback``
/ ``add_errback``) is kept as a ``(fn, record future, on success)`` ``_RecordCallback``, which completion
calls with the record's metadata (or the error) directly: no closure made per record, no
Python frames between the completion and ``fn``.
"""
from __future__ import annotations

import logging
import threading
from typing import NamedTuple

__all__ = ["BatchFuture", "RecordFuture", "RecordMetadata"]

log = logging.getLogger("mesh.producer")
_state_lock = threading.Lock()
_new_lock = threading.Lock        # a waiter: made acquired; completion releases it
_PENDING = object()
_tuple_new = tuple.__new__


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
        if not self._keep(fn):
            self._call(fn)

    def _add_record_callback(self, cb: "_RecordCallback") -> None:
        """``add_done_callback`` of a record's ``(fn, record future, on success)``."""
        if not self._keep(cb):
            self._call_record(cb, self._result, self._exc)

    def _keep(self, cb) -> bool:
        """Keep ``cb`` for the completion; False if done already (the caller runs it now)."""
        with _state_lock:
            if self.done():
                return False
            if self._callbacks is None:
                self._callbacks = [cb]
            else:
                self._callbacks.append(cb)
            return True

    def set_result(self, result) -> None:
        self._complete(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._complete(_PENDING, exc)

    def _complete(self, result, exc: BaseException | None) -> None:
        with _state_lock:
            if self._result is not _PENDING or self._exc is not None:
                return   # completed once already (an I/O thread failing mid-round finishes the rest)
            if exc is None:
                self._result = result
            else:
                self._exc = exc
            w, cbs = self._waiter, self._callbacks
            self._waiter = self._callbacks = None
        if w is not None:
            w.release()
        if cbs:
            for fn in cbs:
                if fn.__class__ is _RecordCallback:
                    self._call_record(fn, result, exc)
                else:
                    self._call(fn)

    def _call(self, fn) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)

    def _call_record(self, cb: "_RecordCallback", base, exc: BaseException | None) -> None:
        fn, rf, on_success = cb
        if (exc is None) is not on_success:
            return   # a callback on failure, an errback on success
        try:
            if exc is None:
                b = rf._batch   # (RecordFuture.get without its frames)
                fn(_tuple_new(RecordMetadata, (b.topic, b.partition, base + rf._index if base >= 0 else -1)))
            else:
                fn(exc)
        except Exception:
            log.exception("exception calling callback for %r", rf)


class _RecordCallback(tuple):
    """``(fn, record future, on success)``: a record's callback or errback, told apart
    from any callable a user gives ``add_done_callback`` (a tuple among them included)."""
    __slots__ = ()


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int


class RecordFuture:
    """The future of one record: a view on its batch's future."""
    __slots__ = ("_batch", "_index")

    def __init__(self, batch, index: int):   # batch: mesh.client.batching._Batch
        self._batch = batch
        self._index = index

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata; its offset is -1 when the broker said the batch was
        stored before but no longer remembered where (DUPLICATE_SEQUENCE). Raises the
        MeshError of a failed send (see ``MeshError.maybe_written``)."""
        base = self._batch.future.result(timeout)
        b = self._batch
        return RecordMetadata(b.topic, b.partition, base + self._index if base >= 0 else -1)

    def done(self) -> bool:
        return self._batch.future.done()

    def exception(self, timeout: float | None = None):
        return self._batch.future.exception(timeout)

    def add_callback(self, fn) -> "RecordFuture":
        """``fn(RecordMetadata)`` once the record is written (see ``BatchFuture`` for the thread)."""
        self._batch.future._add_record_callback(_tuple_new(_RecordCallback, (fn, self, True)))
        return self

    def add_errback(self, fn) -> "RecordFuture":
        """``fn(exception)`` if the record's batch fails."""
        self._batch.future._add_record_callback(_tuple_new(_RecordCallback, (fn, self, False)))
        return self
