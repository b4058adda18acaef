"""`mesh top` and the ops assets against real brokers.

- `mesh top --once` against three brokers names every broker (id and address) and shows a
  group's lag per partition, and the rates row it measured;
- one broker with --metrics-port exports every metric the Grafana dashboard and the alert
  rules use (ops/), after a little produce and consume (skipped while `mesh node` has no
  --metrics-port).
"""
from __future__ import annotations

import re
import urllib.request

import pytest
from click.testing import CliRunner

from mesh.client import Admin, Consumer, Producer, TopicPartition
from mesh.client.group_admin import GroupAdmin
from mesh.testing.launcher import BrokerProcess, free_port, wait_until
from tests.unit.test_ops_assets import asset_metric_names
from tools.cli import main as cli

pytestmark = pytest.mark.integration


def test_top_once_names_every_broker_and_shows_group_lag(cluster3):
    boot = cluster3.bootstrap
    with Admin(boot) as admin:
        admin.create_topic("orders", 3, 3)
    with Producer(boot) as p:
        for i in range(90):
            p.send("orders", b"%d" % i, partition=i % 3)
        p.flush()
    with GroupAdmin(boot) as ga:   # a group with no members, 7 records in: lag 23 everywhere
        ga.reset_offsets("audit", "orders", 7)
    r = CliRunner().invoke(cli, ["top", "--once", "--interval", "0.2", "-b", cluster3.brokers[0].address])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "brokers 3/3 alive" in out and "under-replicated 0" in out and "offline 0" in out, out
    for b in cluster3.brokers:
        row = next((line for line in out.splitlines() if re.search(rf"\|\s*{b.node_id}\s*\|", line)), None)
        assert row is not None and b.address in row and "alive" in row, out
        assert "rec/s" in row, row   # rates were measured (nothing moved: 0 rec/s)
    lags = sorted(tuple(c.strip() for c in line.strip("|").split("|"))
                  for line in out.splitlines() if re.match(r"\|\s*audit\s*\|", line))
    assert lags == [("audit", "orders", str(p), "7", "30", "23") for p in range(3)], out


def test_top_refuses_a_too_short_live_interval():
    r = CliRunner().invoke(cli, ["top", "--interval", "0.01", "-b", "127.0.0.1:1"])
    assert r.exit_code != 0 and "--interval" in r.output, r.output


def _has_metrics_port() -> bool:
    return "--metrics-port" in CliRunner().invoke(cli, ["node", "--help"]).output


def _exported(text: str) -> set[str]:
    """Every series name the families of a /metrics text can carry (a family with labels
    shows no sample until it has one, so names come from the TYPE lines)."""
    from prometheus_client.parser import text_string_to_metric_families
    names = set()
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(fam.name)
        names.update(s.name for s in fam.samples)
    return names


@pytest.mark.skipif(not _has_metrics_port(), reason="`mesh node` has no --metrics-port yet (issue 16, G1)")
def test_broker_exports_every_metric_the_ops_assets_use(tmp_path):
    port = free_port()
    b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--metrics-port", str(port)]).start()
    try:
        with Admin(b.address) as admin:
            admin.create_topic("events", 2)
        with Producer(b.address) as p:
            for i in range(20):
                p.send("events", b"x%d" % i, partition=i % 2)
            p.flush()
        c = Consumer(bootstrap=b.address, group_id="readers", auto_offset_reset="earliest")
        try:
            c.subscribe(["events"])
            got = []
            wait_until(lambda: got.extend(r for rs in c.poll_batches(50) for r in rs) or len(got) >= 20, 20,
                       "20 records consumed")
            c.commit({TopicPartition("events", 0): 5, TopicPartition("events", 1): 5})
        finally:
            c.close()

        needed = set(asset_metric_names()) - {"up"}   # "up" is Prometheus's own
        last = {}

        def complete():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                last["text"] = resp.read().decode()
            last["missing"] = sorted(needed - _exported(last["text"]))
            return not last["missing"]
        try:
            wait_until(complete, 15, "every metric of the dashboard and rules in /metrics")
        except AssertionError:
            raise AssertionError(f"metrics the ops assets use that the broker does not export: "
                                 f"{last.get('missing')}") from None
        assert 'node="n1"' in last["text"] and "mesh_broker_info{" in last["text"]
    finally:
        b.stop()
