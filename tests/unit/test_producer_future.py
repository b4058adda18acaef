"""The producer's cheap futures (``mesh.client.future.BatchFuture``) and its batches: the
interface callers use of ``concurrent.futures.Future``, across threads; no sockets."""
import threading

import pytest

from mesh.client.future import BatchFuture
from mesh.client.batching import _Batch
from mesh.client.producer import RecordFuture
from mesh.client.sequencer import SeqBatch
from mesh.wire.errors import ErrorCode, MeshError


def test_result_exception_done_and_a_timeout():
    f = BatchFuture()
    assert not f.done() and f.running() and not f.cancel() and not f.cancelled()
    with pytest.raises(TimeoutError):
        f.result(0.01)
    with pytest.raises(TimeoutError):
        f.exception(0)
    f.set_result(0)                       # a falsy result is a result
    assert f.done() and f.result() == 0 and f.result(0) == 0 and f.exception() is None
    g = BatchFuture()
    err = MeshError(ErrorCode.TIMEOUT, "x")
    g.set_exception(err)
    assert g.done() and g.exception(0) is err
    with pytest.raises(MeshError):
        g.result(0)


def test_waiters_in_other_threads_all_wake():
    f = BatchFuture()
    got, started = [], threading.Barrier(4)

    def wait():
        started.wait()
        got.append(f.result(10))
    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    started.wait()
    f.set_result(42)
    for t in threads:
        t.join(10)
    assert got == [42, 42, 42]
    assert f.result(0) == 42              # the waiter lock is left released


def test_callbacks_run_once_before_or_after_completion_and_errors_are_logged(caplog):
    f, seen = BatchFuture(), []
    f.add_done_callback(lambda x: seen.append(("before", x.result())))
    f.add_done_callback(lambda x: 1 / 0)  # logged, does not stop the others
    f.add_done_callback(lambda x: seen.append(("before2", x.exception())))
    f.set_result(7)
    f.add_done_callback(lambda x: seen.append(("after", x.result())))
    assert seen == [("before", 7), ("before2", None), ("after", 7)]
    assert "exception calling callback" in caplog.text


def test_a_record_future_reads_its_batch_future():
    b = _Batch("t", 2, now=10.0, delivery_s=60.0)
    fut = RecordFuture(b, 3)
    ok, failed = [], []
    fut.add_callback(ok.append).add_errback(failed.append)
    assert not fut.done()
    b.future.set_result(100)
    md = fut.get(0)
    assert (md.topic, md.partition, md.offset) == ("t", 2, 103) and ok == [md] and failed == []


def test_record_callbacks_and_errbacks_before_and_after_completion(caplog):
    """Each record's callback gets its own metadata (offset -1 when the broker no longer
    knew where a duplicate went), an errback gets the batch's error, neither runs for the
    other outcome, one added after completion runs at once, and one that raises is logged
    without stopping the others."""
    ok, failed = [], []
    b = _Batch("t", 1, now=10.0, delivery_s=60.0)
    r0, r1 = RecordFuture(b, 0), RecordFuture(b, 1)
    r0.add_callback(lambda md: 1 / 0).add_errback(failed.append)
    r1.add_callback(ok.append).add_errback(failed.append)
    b.future.set_result(40)
    assert ok == [("t", 1, 41)] and failed == [] and "exception calling callback" in caplog.text
    r0.add_callback(ok.append)
    assert ok == [("t", 1, 41), ("t", 1, 40)]
    dup = _Batch("t", 1, now=10.0, delivery_s=60.0)
    RecordFuture(dup, 2).add_callback(ok.append)
    dup.future.set_result(-1)
    assert ok[-1] == ("t", 1, -1)
    bad = _Batch("t", 1, now=10.0, delivery_s=60.0)
    err = MeshError(ErrorCode.TIMEOUT, "x", maybe_written=True)
    RecordFuture(bad, 0).add_callback(ok.append).add_errback(failed.append)
    bad.future.set_exception(err)
    RecordFuture(bad, 1).add_errback(failed.append).add_callback(ok.append)
    assert failed == [err, err] and len(ok) == 3


def test_a_batch_sets_every_sequencer_field():
    """_Batch inlines SeqBatch.__init__: a field added there must be added here too."""
    b, ref = _Batch("t", 0, now=10.0, delivery_s=60.0), SeqBatch(0, 70_000.0)
    for name in SeqBatch.__slots__:
        assert getattr(b, name) == getattr(ref, name), name
    assert b.tp == ("t", 0) and not b.future.done()


def test_a_future_completes_once_and_a_users_tuple_is_just_a_callable(caplog):
    """A second completion changes nothing (an I/O thread failing mid-round fails what is
    left, some of it completed already); a callable that happens to be a tuple subclass
    is called as any callback, not taken for a record's."""
    f, seen = BatchFuture(), []
    f.set_result(5)
    f.set_exception(MeshError(ErrorCode.TIMEOUT, "late"))
    assert f.result(0) == 5 and f.exception(0) is None

    class CallableTuple(tuple):
        def __call__(self, fut):
            seen.append(fut.result())
    g = BatchFuture()
    g.add_done_callback(CallableTuple((1, 2, 3)))
    g.add_done_callback((1, 2, 3))   # not callable: logged, the I/O thread goes on
    g.set_result(9)
    assert seen == [9] and "exception calling callback" in caplog.text


def test_buffer_space_is_freed_before_the_callbacks_run():
    """A record's callback that sends (say, to a dead-letter topic) while the buffer is
    full must find the finished batch's space free: only the I/O thread, which runs the
    callback, frees space (``Producer._complete``)."""
    from mesh.client.producer import Producer
    from mesh.client.sequencer import Done
    p = Producer.__new__(Producer)     # the completion step alone: no sockets, no I/O thread
    p._mutex = threading.RLock()
    p._lock = threading.Condition(p._mutex)
    p._space_waiters = 0
    b = _Batch("t", 0, now=10.0, delivery_s=60.0)
    b.nbytes = 100
    p._buffered, p._unfinished = 100, {b}
    seen = []
    RecordFuture(b, 0).add_callback(lambda md: seen.append((p._buffered, b in p._unfinished)))
    p._finished = [Done(("t", 0), b, 7)]
    p._complete()
    assert seen == [(0, True)]          # space free, the batch still unfinished until completed
    assert p._buffered == 0 and not p._unfinished and b.future.result(0) == 7
    p._finished = [Done(("t", 0), b, 7)]   # finished twice (cannot happen): nothing freed twice
    p._unfinished.add(b)
    p._complete()
    assert p._buffered == 0
