"""`mesh top`'s pure parts: rates between two samples, and the rendered view."""
from __future__ import annotations

import re

from rich.console import Console

from tools.top import Rates, Sample, rates, render

BROKERS = [{"id": "n1", "address": "127.0.0.1:7101", "status": "alive"},
           {"id": "n2", "address": "127.0.0.1:7102", "status": "alive"},
           {"id": "n3", "address": "127.0.0.1:7103", "status": "dead"}]


def part(leader, replicas=("n1", "n2"), isr=None, log_end=0):
    return {"leader": leader, "replicas": list(replicas), "isr": list(isr if isr is not None else replicas),
            "log_end": log_end}


def text(view) -> str:
    console = Console(color_system=None, force_terminal=False, width=140)
    with console.capture() as cap:
        console.print(view)
    return cap.get()


def test_rates_from_metrics_counters():
    a = Sample(at_s=10.0, brokers=BROKERS, counters={"n1": (100.0, 1000.0), "n2": (50.0, 0.0)})
    b = Sample(at_s=12.0, brokers=BROKERS, counters={"n1": (300.0, 5000.0), "n2": (10.0, 0.0)})
    r = rates(a, b)
    assert r.produce == {"n1": 100.0} and r.consume == {"n1": 2000.0} and r.unit == "B/s"
    # n2's counter went down (it restarted): no rate for it this time
    assert rates(None, b) == Rates(unit="B/s")


def test_rates_from_metadata_log_ends_and_group_commits():
    a = Sample(at_s=0.0, brokers=BROKERS,
               partitions={("t", 0): part("n1", log_end=10), ("t", 1): part("n2", log_end=5)},
               lags=[{"group": "g", "topic": "t", "partition": 0, "committed": 4, "log_end": 10, "lag": 6},
                     {"group": "h", "topic": "t", "partition": 0, "committed": -1, "log_end": 10, "lag": 10}])
    b = Sample(at_s=2.0, brokers=BROKERS,
               partitions={("t", 0): part("n1", log_end=30), ("t", 1): part("n1", log_end=9)},
               lags=[{"group": "g", "topic": "t", "partition": 0, "committed": 10, "log_end": 30, "lag": 20},
                     {"group": "h", "topic": "t", "partition": 0, "committed": 2, "log_end": 30, "lag": 28}])
    r = rates(a, b)
    # the new leader of t/1 gets its growth; nothing committed before does not count
    assert r.produce == {"n1": 12.0, "n2": 0.0, "n3": 0.0}
    assert r.consume == {"n1": 3.0, "n2": 0.0, "n3": 0.0} and r.unit == "rec/s"


def test_render_lists_brokers_short_partitions_and_largest_lags():
    s = Sample(at_s=0.0, brokers=BROKERS, groups=2,
               partitions={("t", 0): part("n1"), ("t", 1): part("n2", isr=("n2",)), ("u", 0): part(None)},
               lags=[{"group": f"g{i}", "topic": "t", "partition": 0, "committed": i, "log_end": 100,
                      "lag": 100 - i} for i in range(5)],
               errors=["metrics 127.0.0.1:9103: refused"])
    out = text(render(s, Rates({"n1": 1500.0}, {"n1": 2.5e6}, "B/s"), lags_shown=3, plain=True))
    assert "brokers 2/3 alive" in out and "under-replicated 1" in out and "offline 1" in out, out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("|")}
    assert "127.0.0.1:7101" in rows["n1"] and "1.5 kB/s" in rows["n1"] and "2.5 MB/s" in rows["n1"]
    assert "dead" in rows["n3"] and " - " in rows["n2"]
    short = [line for line in out.splitlines() if line.startswith("| t ") or line.startswith("| u ")]
    assert len(short) == 2 and "OFFLINE" in short[1 if "u" in short[1] else 0]
    assert any("n1,n2" in line and "| n2 " in line and "| n1 " in line for line in short), short
    lag_groups = [line.split("|")[1].strip() for line in out.splitlines() if re.match(r"\| g\d", line)]
    assert lag_groups == ["g0", "g1", "g2"], out   # the largest first, only --lags of them
    assert "warning: metrics 127.0.0.1:9103: refused" in out


def test_render_with_nothing_to_report():
    s = Sample(at_s=0.0, brokers=BROKERS[:1], partitions={("t", 0): part("n1", replicas=("n1",))})
    out = text(render(s, rates(None, s), plain=True))
    assert "partitions: none (every partition has a leader" in out and "lags: none (no consumer group" in out, out
