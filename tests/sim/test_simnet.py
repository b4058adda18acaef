"""The shared simulated network (mesh.testing.simnet) on its own: determinism, fault rates,
partitions, stalls, crashes and heal."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mesh.testing.simnet import DELIVER, SimNet

pytestmark = pytest.mark.sim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def drain(net: SimNet, until: int | None = None) -> list[tuple]:
    """Every event up to ``until`` as (time, kind, a, b, c)."""
    out = []
    while (ev := net.pop(until)) is not None:
        out.append((net.now,) + ev)
    return out


def deliveries(net: SimNet, until: int | None = None) -> list[tuple]:
    return [(t, src, dest, payload) for t, kind, src, dest, payload in drain(net, until) if kind == DELIVER]


def traffic(seed: str, n: int = 2000, **faults) -> list[tuple]:
    net = SimNet(seed, **faults)
    for i in range(n):
        net.send(f"a{i % 3}", f"b{i % 5}", i)
        if i % 50 == 0:
            net.call_at(net.now + 7, "timer", i)
    return drain(net)


def test_events_come_in_time_then_scheduling_order():
    net = SimNet("order", delay=(5, 5))
    net.call_at(10, "late")
    net.call_at(3, "early", 1)
    net.call_at(3, "early", 2)          # same time: scheduled second, popped second
    net.send("x", "y", "m")              # due at 5
    assert drain(net) == [(3, "early", 1, None, None), (3, "early", 2, None, None),
                          (5, DELIVER, "x", "y", "m"), (10, "late", None, None, None)]
    assert net.pop() is None and net.next_time() is None


def test_a_seed_gives_the_same_run_and_another_seed_another():
    faults = dict(loss=0.1, dup=0.1, delay=(1, 50), slow_p=0.05, slow=(100, 900))
    a, b = traffic("seed-1", **faults), traffic("seed-1", **faults)
    assert a == b
    assert traffic("seed-2", **faults) != a


def test_a_seed_gives_the_same_run_in_processes_with_different_hash_seeds():
    code = ("from tests.sim.test_simnet import traffic; import hashlib; "
            "print(hashlib.sha256(repr(traffic('h', loss=0.2, dup=0.2, delay=(1, 30))).encode()).hexdigest())")
    outs = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        outs.add(p.stdout)
    assert len(outs) == 1


def test_loss_and_duplication_rates_and_delay_bounds():
    net = SimNet("rates", loss=0.2, dup=0.1, delay=(3, 9))
    n = 20_000
    for i in range(n):
        net.send("a", "b", i)
    got = deliveries(net)
    st = net.stats
    assert st["sent"] == n
    assert 0.18 * n < st["lost"] < 0.22 * n
    assert 0.08 * (n - st["lost"]) < st["duplicated"] < 0.12 * (n - st["lost"])
    assert len(got) == n - st["lost"] + st["duplicated"] == st["delivered"]
    assert {t for t, *_ in got} <= set(range(3, 10)) and {t for t, *_ in got} == set(range(3, 10))


def test_slow_messages_overtake_and_reorder():
    net = SimNet("slow", delay=(1, 2), slow_p=0.3, slow=(50, 100))
    for i in range(200):
        net.send("a", "b", i)
    order = [p for _, _, _, p in deliveries(net)]
    assert sorted(order) == list(range(200)) and order != list(range(200))


def test_a_partition_cuts_both_ways_and_unlisted_nodes_form_one_side():
    net = SimNet("split", delay=(1, 1))
    net.partition(["a", "b"], ["c"])
    for src, dest in [("a", "b"), ("a", "c"), ("c", "a"), ("a", "d"), ("d", "e"), ("c", "d")]:
        net.send(src, dest, f"{src}{dest}")
    assert [p for *_, p in deliveries(net)] == ["ab", "de"]
    assert net.stats["cut"] == 4


def test_a_one_way_cut_drops_one_direction_only():
    net = SimNet("oneway", delay=(1, 1))
    net.cut("a", "b")
    net.send("a", "b", "ab")
    net.send("b", "a", "ba")
    assert [p for *_, p in deliveries(net)] == ["ba"]


def test_a_cut_also_drops_what_is_in_flight_and_heal_restores_every_link():
    net = SimNet("flight", delay=(10, 10))
    net.send("a", "b", 1)
    net.partition(["a"], ["b"])          # while message 1 is in flight
    net.isolate("c")
    net.cut("d", "e")
    net.send("c", "d", 2)
    assert deliveries(net) == []
    net.heal()
    for i, (src, dest) in enumerate([("a", "b"), ("b", "a"), ("c", "d"), ("d", "e")]):
        net.send(src, dest, i)
    assert [p for *_, p in deliveries(net)] == [0, 1, 2, 3]


def test_isolation_until_a_time_ends_on_its_own():
    net = SimNet("iso", delay=(1, 1))
    net.isolate("a", until=5)
    net.send("a", "b", "early")
    net.advance(5)
    net.send("a", "b", "late")
    assert [p for *_, p in deliveries(net)] == ["late"]


def test_a_stalled_node_gets_its_messages_in_a_burst_when_the_stall_ends():
    net = SimNet("stall", delay=(1, 1))
    net.stall("b", until=100)
    assert net.stalled("b") and net.stalled_until("b") == 100
    for i in range(5):
        net.send("a", "b", i)
    net.send("a", "c", "other")
    got = deliveries(net)
    assert got[0][1:] == ("a", "c", "other")
    assert [(t, p) for t, _, _, p in got[1:]] == [(100, i) for i in range(5)]   # in arrival order
    assert not net.stalled("b") and net.stats["held"] == 5


def test_resume_ends_a_stall_early():
    net = SimNet("resume", delay=(1, 1))
    net.stall("b", until=1_000)
    net.send("a", "b", "x")
    assert net.due(10) == []
    net.resume("b")
    assert deliveries(net) == [(10, "a", "b", "x")]


def test_a_crash_drops_in_flight_messages_to_and_from_the_node():
    net = SimNet("crash", delay=(5, 5))
    net.send("a", "b", "to b")
    net.send("b", "c", "from b")
    net.send("a", "c", "bystander")
    net.crash("b")
    net.send("a", "b", "while down")
    net.restart("b")                        # a new incarnation: the old in-flight is gone
    net.send("a", "b", "after restart")
    assert [p for *_, p in deliveries(net)] == ["bystander", "after restart"]
    assert net.stats["undeliverable"] == 3


def test_a_crash_drops_the_messages_a_stall_was_holding():
    net = SimNet("crash-stall", delay=(1, 1))
    net.stall("b", until=50)
    net.send("a", "b", "held")
    assert deliveries(net, until=10) == []
    net.crash("b")
    net.restart("b")
    assert deliveries(net) == [] and not net.stalled("b")


def test_due_returns_everything_up_to_a_time_and_moves_the_clock():
    net = SimNet("due", delay=(1, 4))
    for i in range(10):
        net.send("a", "b", i)
    first = net.due(2)
    assert net.now == 2 and all(net.now >= 1 for _ in first)
    rest = net.due(10)
    assert sorted(p for *_, p in first + rest) == list(range(10)) and net.now == 10
