"""The broker turn (``mesh.node.turn``): one order, tasks by period, a failing task dooms the turn."""
import pytest

from mesh.node.turn import ORDER, BrokerTurn, Task


class Parts:
    def __init__(self, log, ok=True):
        self.log, self.ok, self.doomed = log, ok, None

    def tick_due(self):
        self.log.append("replication tick")

    def release_held(self):
        self.log.append("held produces")

    def after_turn(self):
        self.log.append("wake fetches")

    def commit_turn(self):
        self.log.append("commit")
        ok, self.doomed = self.ok and self.doomed is None, None
        return ok

    def doom(self, why):
        self.doomed = why

    def answer_committed(self):
        self.log.append("early acks")

    def send_early_appends(self):
        self.log.append("early appends")


def _turn(log, tasks=(), **kw):
    p = Parts(log)
    return p, BrokerTurn(p, p, lambda: kw.pop("_now", 0), list(tasks), **kw)


def test_tasks_run_in_the_turn_order_whatever_order_they_are_given_in():
    log = []
    names = ["identity", "publish", "groups", "gossip tick", "clock"]
    _, turn = _turn(log, [Task(n, lambda n=n: log.append(n)) for n in names])
    assert turn.run() is True
    assert log == [n for n in ORDER if n in set(names) | {"replication tick", "held produces", "commit",
                                                            "wake fetches"}]
    assert log.index("commit") < log.index("publish")


def test_a_periodic_task_runs_once_per_period_and_when_gates_it():
    log, now, gate = [], [0], [False]
    p = Parts(log)
    turn = BrokerTurn(p, p, lambda: now[0], [Task("stats", lambda: log.append("stats"), period_ms=100),
                                             Task("elastic", lambda: log.append("elastic"), when=lambda: gate[0])])
    for t in (0, 50, 99, 100, 150, 200):
        now[0] = t
        turn.run()
    assert log.count("stats") == 3 and "elastic" not in log
    gate[0] = True
    turn.run()
    assert log.count("elastic") == 1


def test_a_failing_task_dooms_the_turn_and_the_next_one_commits():
    log = []
    p, turn = _turn(log, [Task("groups", lambda: 1 / 0)], on_error=lambda name, exc: log.append(("err", name)))
    assert turn.run() is False and ("err", "groups") in log
    with pytest.raises(ZeroDivisionError):
        BrokerTurn(p, p, lambda: 0, [Task("groups", lambda: 1 / 0)], raise_errors=True).run()


def test_a_turn_abandoned_before_its_commit_runs_nothing_after_it():
    log = []
    _, turn = _turn(log, [Task("publish", lambda: log.append("publish"))], before_commit=lambda: False)
    assert turn.run() is False
    assert log == ["replication tick", "held produces"]


def test_the_drained_step_sends_no_early_append_in_a_doomed_turn():
    log = []
    p, turn = _turn(log)
    turn.drained()
    p.doom("x")
    turn.drained()
    assert log == ["early acks", "early appends", "early acks"]


def test_an_unknown_step_is_refused():
    with pytest.raises(ValueError):
        _turn([], [Task("coffee", lambda: None)])


def test_the_drain_answers_a_commit_advance_before_handling_the_next_message():
    """An RF-3 leader in its own sync finds both followers' append answers queued; the first
    one commits, so its acks=all answers leave before the second is handled (issue 41:
    traced, the second answer's handling delayed every such acknowledgement)."""
    from types import SimpleNamespace
    import zmq
    from mesh.node.loop import Node, NodeConfig

    log, queue = [], [[b"peer", b"answer from n2"], [b"peer", b"answer from n3"]]
    replicas = SimpleNamespace(commit_moved=False)

    def recv(flags):
        if not queue:
            raise zmq.Again()
        return queue.pop(0)

    def handle(frames):
        log.append(frames[1])
        replicas.commit_moved = frames[1] == b"answer from n2"   # the first answer commits

    class Data(Parts):
        def answer_committed(self):
            log.append("early acks")
            replicas.commit_moved = False

    data = Data(log)
    fake = SimpleNamespace(cfg=NodeConfig(node_id="n1"), dispatch=SimpleNamespace(recv=recv, handle=handle),
                           clock=SimpleNamespace(now_ms=lambda: 0), replicas=replicas,
                           turn=BrokerTurn(data, data, lambda: 0, []))
    Node._drain(fake)
    assert log == [b"answer from n2", "early acks", b"answer from n3"]
