"""The node's sidecar processes (``mesh.node.lifecycle.sidecars``): closed in reverse order,
never left running by a start that fails after them, and started again after an exit (a
back-off, on a thread of their own; a failed restart is tried again; close closes whatever
runs, a restart in progress included)."""
import socket
import threading
import time

import pytest

from mesh.node.loop import Node, NodeConfig, StartupError
from mesh.node.lifecycle import sidecars as sc
from mesh.node.lifecycle.sidecars import SidecarError, Sidecars
from mesh.testing.launcher import free_port


class Proc:
    def __init__(self, name, closed):
        self.name, self.closed = name, closed

    def close(self):
        self.closed.append(self.name)


def test_sidecars_close_in_reverse_order_once_and_a_failed_start_closes_the_earlier_ones():
    closed = []
    s = Sidecars()
    s.start("a", lambda: Proc("a", closed), OSError)
    s.start("b", lambda: Proc("b", closed), OSError)

    def boom():
        raise OSError("port taken")

    with pytest.raises(SidecarError, match="c: port taken"):
        s.start("c", boom, OSError)
    assert closed == ["b", "a"] and len(s) == 0
    s.close()
    assert closed == ["b", "a"]


def test_a_start_that_fails_after_the_text_gateway_closes_it(tmp_path, monkeypatch):
    """The metrics port taken: the gateway process started before it must not outlive the
    refused start (it did: only the router and the lock were released)."""
    from mesh.gateway import process
    closed = []
    monkeypatch.setattr(process.GatewayProcess, "start", staticmethod(lambda *a, **k: Proc("text", closed)))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = NodeConfig(node_id="n1", bind=f"127.0.0.1:{free_port()}", data_dir=str(tmp_path), sync=False,
                         text_port=free_port(), metrics_port=taken.getsockname()[1])
        with pytest.raises(StartupError, match="cannot serve metrics"):
            Node(cfg)
    finally:
        taken.close()
    assert closed == ["text"]


class _Popen:
    def __init__(self) -> None:
        self.returncode = None

    def poll(self):
        return self.returncode


class _Proc:
    def __init__(self) -> None:
        self.proc = _Popen()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_an_exited_sidecar_is_started_again_after_a_doubling_backoff():
    made: list[_Proc] = []
    fail = []

    def start():
        if fail:
            raise RuntimeError(fail.pop())
        made.append(_Proc())
        return made[-1]
    cars = sc.Sidecars()
    assert cars.start("kafka listener", start, RuntimeError) is made[0]
    t = 1000.0
    cars.supervise(t)
    assert len(made) == 1            # running: nothing to do
    made[0].proc.returncode = -9     # killed
    cars.supervise(t)                # seen: a restart is due after the first back-off
    cars.supervise(t + sc.RESTART_FIRST_S - 0.1)
    assert len(made) == 1
    fail.append("port in use")       # the first restart fails ...
    cars.supervise(t + sc.RESTART_FIRST_S)
    _until(lambda: cars._started[0].thread is not None and not cars._started[0].thread.is_alive(), "restart")
    t += sc.RESTART_FIRST_S
    cars.supervise(t)                # ... and is tried again after the doubled back-off
    assert len(made) == 1 and cars._started[0].due == t + 2 * sc.RESTART_FIRST_S
    cars.supervise(t + 2 * sc.RESTART_FIRST_S)
    _until(lambda: not cars._started[0].thread.is_alive(), "second restart")
    cars.supervise(t + 2 * sc.RESTART_FIRST_S)
    assert len(made) == 2 and cars._started[0].proc is made[1]
    # a restarted sidecar that stays up a minute starts the back-off over
    assert cars._started[0].backoff == 4 * sc.RESTART_FIRST_S
    cars.supervise(t + 2 * sc.RESTART_FIRST_S + sc.STAYED_UP_S)
    assert cars._started[0].backoff == sc.RESTART_FIRST_S
    cars.close()
    assert made[1].closed and len(cars) == 0


def test_close_waits_for_a_restart_in_progress_and_closes_its_process():
    gate = threading.Event()
    made: list[_Proc] = []

    def start():
        if made:
            gate.wait(10)
        made.append(_Proc())
        return made[-1]
    cars = sc.Sidecars()
    cars.start("text gateway", start, RuntimeError)
    made[0].proc.returncode = 1
    cars.supervise(0.0)
    cars.supervise(sc.RESTART_FIRST_S)      # the restart thread now waits in start()
    assert cars._started[0].thread.is_alive()
    threading.Timer(0.05, gate.set).start()
    cars.close()
    assert len(made) == 2 and made[1].closed   # the process it started did not outlive the node
    cars.supervise(100.0)                       # closed: nothing more is started
    assert len(made) == 2
