"""The operator assets in ops/: the Grafana dashboard and the Prometheus rules and example
configuration are well-formed, and name only metrics a broker exports.

``promtool`` (Debian package ``prometheus``) checks the rules, the configuration and, through
a generated rules file, the syntax of every dashboard expression; those tests skip with a
clear message where it is missing. ``tests/integration/test_top.py`` checks the same names
against a real broker's /metrics.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "ops", "grafana", "mesh.json")
ALERTS = os.path.join(ROOT, "ops", "prometheus", "alerts.yml")
PROMETHEUS = os.path.join(ROOT, "ops", "prometheus", "prometheus.yml")

# The families a broker exports (the names fixed for issue 16); histogram series carry
# _bucket/_sum/_count, counters _total (already part of the names below).
COUNTERS = {
    "mesh_requests_total", "mesh_network_received_bytes_total", "mesh_network_sent_bytes_total",
    "mesh_topic_appended_records_total", "mesh_topic_appended_bytes_total", "mesh_topic_fetched_bytes_total",
    "mesh_storage_retention_deleted_batches_total", "mesh_gossip_rounds_total", "mesh_gossip_sent_bytes_total",
    "mesh_gossip_received_bytes_total", "mesh_gossip_suspicions_total", "mesh_gossip_deaths_total",
    "mesh_gossip_refused_messages_total", "mesh_peer_refused_messages_total", "mesh_group_rebalances_total",
    "process_cpu_seconds_total",
}
HISTOGRAMS = {"mesh_request_duration_seconds", "mesh_produce_ack_latency_seconds",
              "mesh_storage_sync_duration_seconds"}
GAUGES = {
    "mesh_storage_map_used_bytes", "mesh_storage_map_size_bytes", "mesh_partition_log_size_bytes",
    "mesh_partition_leader", "mesh_partition_leader_epoch", "mesh_partition_log_end_offset",
    "mesh_partition_high_watermark", "mesh_partition_follower_lag_records", "mesh_under_replicated_partitions",
    "mesh_offline_partitions", "mesh_quiet_replicas", "mesh_gossip_members", "mesh_gossip_convergence_lag_seconds",
    "mesh_group_members", "mesh_group_generation", "mesh_group_committed_offset", "mesh_group_lag_records",
    "mesh_broker_info", "mesh_clock_offset_seconds", "mesh_clock_trusted", "process_resident_memory_bytes", "process_virtual_memory_bytes",
    "process_open_fds", "process_max_fds", "process_start_time_seconds",
}
# every series name a broker's /metrics can show; "up" is Prometheus's own
EXPORTED = COUNTERS | GAUGES | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"\b(mesh_\w+|process_\w+|up)\b(?!\s*\()")
# Grafana's variables, replaced by something PromQL parses
_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads: mesh_*, process_* and ``up`` (not label names
    after ``by``/``without``, which never start so)."""
    no_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(_NAME.findall(no_strings))


def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # panels inside collapsed rows
    return out


def dashboard_exprs(d: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard_panels(d) for t in p.get("targets", []) if t.get("expr")]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            exprs.append(m.group(1) if m else q)
    return exprs


def alert_rules() -> list[dict]:
    """The alerting rules of alerts.yml as {alert, expr, for, severity, summary, description}.

    A small reader of the file's own style (no YAML library in the test dependencies): each
    rule starts with ``- alert: NAME``; a value is on its key's line or, after ``>-``, on the
    more indented lines below it. ``test_promtool_check_rules`` checks the real YAML, and
    ``test_alert_reader_sees_every_rule`` that this reader found as many rules as promtool."""
    rules: list[dict] = []
    with open(ALERTS) as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:- )?(alert|expr|for|severity|summary|description):\s*(.*)$", lines[i])
        i += 1
        if not m:
            continue
        indent, key, value = len(m.group(1)), m.group(2), m.group(3).strip()
        if value in (">-", ">", "|", "|-"):
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            value = " ".join(b for b in block if b)
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if key == "alert":
            rules.append({"alert": value})
        elif rules:
            rules[-1][key] = value
    return rules


def asset_metric_names() -> dict[str, set[str]]:
    """{metric name: where it is used} over the dashboard's and the rules' expressions."""
    used: dict[str, set[str]] = {}
    for e in dashboard_exprs(dashboard()):
        for n in metric_names(e):
            used.setdefault(n, set()).add("dashboard")
    for r in alert_rules():
        for n in metric_names(r["expr"]):
            used.setdefault(n, set()).add(f"alert {r['alert']}")
    return used


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu: apt-get install prometheus): "
                    "cannot check the Prometheus rules and configuration")
    return path


def test_metric_name_parser():
    assert metric_names('sum by (instance, op) (rate(mesh_requests_total{code!="NONE"}[5m]))') == \
        {"mesh_requests_total"}
    assert metric_names('up{job="mesh"} == 0') == {"up"}
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(mesh_x_seconds_bucket[1m])))') == \
        {"mesh_x_seconds_bucket"}
    assert metric_names('max(mesh_gossip_members{state="mesh_not_a_name"})') == {"mesh_gossip_members"}


def test_dashboard_is_valid_json_with_unique_panel_ids():
    d = dashboard()
    assert d["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard_panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "node", "topic", "group"} <= names
    for p in dashboard_panels(d):
        if p["type"] == "row":
            continue
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", f"panel {p['title']!r} is not on ${{datasource}}"
    titles = {p["title"] for p in dashboard_panels(d) if p["type"] == "row"}
    assert {"Cluster overview", "Brokers", "Topics", "Consumer lag", "Gossip"} <= titles


def test_every_metric_in_the_assets_is_exported():
    used = asset_metric_names()
    unknown = {n: sorted(w) for n, w in used.items() if n not in EXPORTED | {"up"}}
    assert not unknown, f"metrics no broker exports: {unknown}"
    # the assets cover every area of issue 16
    for needed in ("mesh_under_replicated_partitions", "mesh_offline_partitions", "mesh_group_lag_records",
                   "mesh_storage_map_used_bytes", "mesh_gossip_members", "mesh_request_duration_seconds_bucket",
                   "mesh_storage_sync_duration_seconds_bucket", "process_open_fds", "up"):
        assert needed in used, needed


def test_alert_rules_cover_the_issue_and_are_annotated():
    rules = {r["alert"]: r for r in alert_rules()}
    assert {"MeshUnderReplicatedPartitions", "MeshOfflinePartitions", "MeshBrokerDown", "MeshBrokerDeadInGossip",
            "MeshConsumerLagGrowing", "MeshStorageNearFull", "MeshRequestErrors", "MeshClockOffset"} <= set(rules)
    for name, r in rules.items():
        assert r.get("expr") and r.get("summary") and r.get("description"), name
        assert r.get("severity") in ("warning", "critical"), name
    assert rules["MeshUnderReplicatedPartitions"]["for"] == "1m"
    assert rules["MeshOfflinePartitions"]["for"] == "30s"


def test_promtool_check_rules():
    out = subprocess.run([_promtool(), "check", "rules", ALERTS], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_reader_sees_every_rule():
    out = subprocess.run([_promtool(), "check", "rules", ALERTS], capture_output=True, text=True)
    found = re.search(r"SUCCESS: (\d+) rules found", out.stdout + out.stderr)
    assert found, out.stdout + out.stderr
    assert len(alert_rules()) == int(found.group(1))


def test_promtool_check_config():
    out = subprocess.run([_promtool(), "check", "config", PROMETHEUS], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_parses_every_dashboard_expression(tmp_path):
    """Each dashboard query, with Grafana's variables filled in, as a recording rule:
    ``promtool check rules`` then parses every one."""
    promtool = _promtool()
    rules = []
    for i, e in enumerate(dashboard_exprs(dashboard())):
        for var, value in _VARIABLES.items():
            e = e.replace(var, value)
        e = re.sub(r"\$\w+", ".*", e)   # $node, $topic, $group, $job: inside =~ matchers
        rules.append({"record": f"dashboard:expr_{i}", "expr": e})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _without_annotations(text: str) -> str:
    """The rules file without its ``annotations:`` blocks (``promtool test rules`` compares
    annotations too; ``promtool check rules`` already checks their templates)."""
    out, skip_deeper_than = [], None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None and (not line.strip() or indent > skip_deeper_than):
            continue
        skip_deeper_than = None
        if line.strip() == "annotations:":
            skip_deeper_than = indent
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def test_promtool_alerts_fire(tmp_path):
    """Unit tests of the rules (``promtool test rules``): each alert fires on a series that
    should raise it, after its ``for`` period, and not before."""
    promtool = _promtool()
    rules = tmp_path / "alerts_bare.yml"
    rules.write_text(_without_annotations(open(ALERTS).read()))
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [
                {"series": 'mesh_under_replicated_partitions{instance="a:9101", job="mesh"}',
                 "values": "0 0 2x20"},
                {"series": 'mesh_offline_partitions{instance="a:9101", job="mesh"}', "values": "1x20"},
                {"series": 'up{instance="b:9102", job="mesh"}', "values": "0x20"},
                {"series": 'mesh_storage_map_used_bytes{instance="a:9101", job="mesh"}', "values": "90x40"},
                {"series": 'mesh_storage_map_size_bytes{instance="a:9101", job="mesh"}', "values": "100x40"},
                {"series": 'mesh_group_lag_records{instance="a:9101", job="mesh", group="g", topic="t", '
                           'partition="0"}', "values": "2000+100x100"},
                {"series": 'mesh_clock_offset_seconds{instance="c:9103", job="mesh"}', "values": "-7200x20"},
                {"series": 'mesh_clock_offset_seconds{instance="a:9101", job="mesh"}', "values": "0.002x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "45s", "alertname": "MeshUnderReplicatedPartitions", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "MeshUnderReplicatedPartitions",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "instance": "a:9101"}}]},
                {"eval_time": "1m", "alertname": "MeshOfflinePartitions",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "instance": "a:9101"}}]},
                {"eval_time": "2m", "alertname": "MeshBrokerDown",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "instance": "b:9102", "job": "mesh"}}]},
                {"eval_time": "6m", "alertname": "MeshStorageNearFull",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "instance": "a:9101", "job": "mesh"}}]},
                {"eval_time": "30s", "alertname": "MeshClockOffset", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "MeshClockOffset",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "instance": "c:9103"}}]},
                {"eval_time": "22m", "alertname": "MeshConsumerLagGrowing",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "group": "g", "topic": "t",
                                                "partition": "0"}}]},
            ],
        }],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
