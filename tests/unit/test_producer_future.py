"""The producer's cheap futures (``mesh.client.future.BatchFuture``) and its batches: the
interface callers use of ``concurrent.futures.Future``, across threads; no sockets."""
import threading

import pytest

from mesh.client.future import BatchFuture
from mesh.client.producer import RecordFuture, _Batch
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
