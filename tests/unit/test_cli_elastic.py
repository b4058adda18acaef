"""The elastic-cluster commands (``tools.elastic_cli``) and their client calls
(``mesh.client.elastic_admin``), with no broker: click's CliRunner against a fake Admin,
the tables as pure functions, ``list_moves`` against a fake transport."""
from __future__ import annotations

import json
import sys
import types

import pytest
from click.testing import CliRunner

import mesh.client
from mesh.client.elastic_admin import ElasticAdmin, Moves
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from tools.cli import main
from tools.elastic_cli import format_bytes, moves_table, parse_replicas, status_rows, status_table

MOVE = {"topic": "orders", "partition": 3, "leader": "n1", "voters": ["n1", "n2"], "learners": ["n4"],
        "target": ["n1", "n2", "n4"], "adding": "n4", "bytes_copied": 3 << 20, "bytes_remaining": 1536,
        "reason": "balance"}


class FakeAdmin:
    """Records the calls; ``fail`` makes every call raise it."""
    calls: list = []
    fail: MeshError | None = None
    moves = Moves([MOVE], {"n3": "no answer from 127.0.0.1:7103"})
    md = m.MetadataResponse(0, [], [{"name": "orders", "replication_factor": 2,
                                     "partitions": [{"partition": 0, "replicas": ["n1", "n2"]}]}])

    def __init__(self, bootstrap, *args, **kwargs):
        self.calls.append(("bootstrap", bootstrap))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def __getattr__(self, name):
        def call(*args, **kwargs):
            if self.fail is not None:
                raise self.fail
            self.calls.append((name, *args, *([kwargs] if kwargs else [])))
            return {"list_moves": self.moves, "metadata": self.md}.get(name)
        return call


@pytest.fixture
def admin(monkeypatch):
    FakeAdmin.calls, FakeAdmin.fail = [], None
    monkeypatch.setattr(mesh.client, "Admin", FakeAdmin)
    return FakeAdmin


def run(*args):
    return CliRunner().invoke(main, list(args))


# -- parsing ---------------------------------------------------------------------------
def test_node_still_runs_a_broker_and_has_subcommands():
    out = run("node", "--help")
    assert out.exit_code == 0
    for text in ("--id", "--data", "--seed", "--bind", "decommission", "recommission"):
        assert text in out.output
    missing = run("node", "--data", "/nonexistent")
    assert missing.exit_code == 2 and "Missing option '--id'" in missing.output
    assert "Missing option '--data'" in run("node", "--id", "n1").output
    assert "ID" in run("node", "decommission", "--help").output
    assert run("node", "decommission").exit_code == 2            # the ID is required


def test_the_launcher_and_procfile_invocations_parse(monkeypatch, tmp_path):
    seen = {}

    class FakeNode:
        fatal = None

        def __init__(self, cfg):
            seen["cfg"] = cfg

        def install_signal_handlers(self):
            pass

        def run(self):
            seen["ran"] = True
    fake = types.ModuleType("mesh.node.loop")
    fake.Node, fake.NodeConfig = FakeNode, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "mesh.node.loop", fake)
    out = run("node", "--id", "n2", "--data", str(tmp_path / "n2"), "--bind", "127.0.0.1:7102",
              "--seed", "127.0.0.1:7101", "--metrics-port", "9102")
    assert out.exit_code == 0, out.output
    assert seen["ran"] and seen["cfg"]["node_id"] == "n2" and seen["cfg"]["seeds"] == ["127.0.0.1:7101"]
    assert seen["cfg"]["bind"] == "127.0.0.1:7102" and seen["cfg"]["metrics_port"] == 9102


def test_decommission_and_recommission(admin):
    out = run("node", "decommission", "n3", "--bootstrap", "h:1")
    assert out.exit_code == 0 and "n3 is draining" in out.output
    assert admin.calls == [("bootstrap", "h:1"), ("decommission", "n3")]
    assert run("node", "recommission", "n3").exit_code == 0
    assert admin.calls[-1] == ("recommission", "n3")


def test_topic_alter(admin):
    out = run("topic", "alter", "orders", "--partitions", "12")
    assert out.exit_code == 0 and "12 partitions" in out.output
    assert admin.calls[-1] == ("alter_topic", "orders", 12, 0)
    assert run("topic", "alter", "orders", "-r", "3").exit_code == 0
    assert admin.calls[-1] == ("alter_topic", "orders", 0, 3)
    out = run("topic", "alter", "orders")
    assert out.exit_code == 2 and "--partitions N, --replication-factor N and/or --config" in out.output
    out = run("topic", "alter", "orders", "--config", "cleanup.policy=compact", "-c", "delete.retention.ms=5")
    assert out.exit_code == 0 and "cleanup.policy=compact" in out.output
    assert admin.calls[-1] == ("alter_topic", "orders", 0, 0, {"config": {"cleanup.policy": "compact",
                                                                          "delete.retention.ms": "5"}})
    assert run("topic", "alter", "orders", "--config", "nonsense").exit_code == 2
    assert run("topic", "alter", "orders", "--partitions", "0").exit_code == 2
    admin.fail = MeshError(ErrorCode.INVALID_REQUEST, "topic 'orders' has 12 partitions: partitions can only be added")
    out = run("topic", "alter", "orders", "--partitions", "4")
    assert out.exit_code == 1
    assert "error: INVALID_REQUEST: topic 'orders' has 12 partitions" in out.output


def test_partition_reassign(admin):
    assert run("partition", "reassign", "orders", "3", "--replicas", "n1, n2,n4").exit_code == 0
    assert admin.calls[-1] == ("reassign", "orders", 3, ["n1", "n2", "n4"])
    assert run("partition", "reassign", "orders", "3", "--cancel").exit_code == 0
    assert admin.calls[-1] == ("reassign", "orders", 3, [])
    n = len(admin.calls)
    for bad in (["--cancel", "--replicas", "n1"], [], ["--replicas", "n1,,n2"], ["--replicas", "n1,n1"]):
        out = run("partition", "reassign", "orders", "3", *bad)
        assert out.exit_code in (1, 2) and "error" in out.output.lower(), out.output
    assert run("partition", "reassign", "orders", "-1", "--cancel").exit_code == 2
    assert len(admin.calls) == n                                # refused before any request


def test_parse_replicas():
    assert parse_replicas("n1,n2,n4") == ["n1", "n2", "n4"]
    for bad in ("", "n1,", "n1,n1"):
        with pytest.raises(ValueError):
            parse_replicas(bad)


def test_partition_moves(admin):
    out = run("partition", "moves")
    assert out.exit_code == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["topic", "partition", "leader", "voters", "learners", "target", "adding",
                                "copied", "/", "remaining", "reason"]
    assert lines[1].split() == ["orders", "3", "n1", "n1,n2", "n4", "n1,n2,n4", "n4", "3.0", "MiB", "/",
                                "1.5", "KiB", "balance"]
    assert "warning: broker n3 did not answer" in out.stderr
    got = json.loads(run("partition", "moves", "--json").stdout)
    assert got == {"moves": [MOVE], "unanswered": {"n3": "no answer from 127.0.0.1:7103"}}
    admin.moves = Moves([], {})
    assert run("partition", "moves", "-t", "orders").stdout.strip() == "no moves in progress"
    assert admin.calls[-1] == ("list_moves", ["orders"])


# -- tables ----------------------------------------------------------------------------
def _md(brokers):
    parts = [{"partition": 0, "leader": "n1", "replicas": ["n1", "n2"]},
             {"partition": 1, "leader": "n2", "replicas": ["n2", "n1"]},
             {"partition": 2, "leader": "n1", "replicas": ["n1", "n2"]}]
    return m.MetadataResponse(0, brokers, [{"name": "t", "partitions": parts}])


def test_status_counts_from_partitions_when_brokers_do_not_report():
    rows = status_rows(_md([{"id": "n1", "address": "a:1", "status": "alive"},
                            {"id": "n3", "address": "a:3", "status": "dead", "state": "draining"}]))
    assert [(r["id"], r["status"], r["state"], r["leaders"], r["replicas"]) for r in rows] == [
        ("n1", "alive", "active", 2, 3), ("n3", "dead", "drained", 0, 0)]


def test_status_takes_what_brokers_report():
    rows = status_rows(_md([{"id": "n1", "address": "a:1", "status": "alive", "state": "draining",
                             "replicas": 7, "leaders": 0},
                            {"id": "n2", "address": "a:2", "status": "alive", "state": "active",
                             "replicas": 5, "leaders": 5, "heartbeat_age_ms": None, "clock_offset_ms": -7_200_012}]))
    assert [(r["state"], r["leaders"], r["replicas"]) for r in rows] == [("draining", 0, 7), ("active", 5, 5)]
    lines = status_table(rows)
    assert lines[0].split() == ["id", "address", "status", "state", "gen", "hb_age_ms", "leaders", "replicas",
                                "recovering", "clock_s", "store", "kafka"]
    assert lines[1].split() == ["n1", "a:1", "alive", "draining", "0", "0", "0", "7", "0", "-", "-", "-"]
    assert lines[2].split()[5] == "-"                            # no heartbeat age known
    assert lines[2].split()[9] == "-7200.012"                    # the peers' clock minus n2's
    assert len({line.index("leaders") if i == 0 else None for i, line in enumerate(lines)}) == 2


def test_status_does_not_show_a_dead_brokers_last_report():
    """A dead broker's gossiped stats are its last ones: the partitions of the answer say
    what it leads and holds now (README tour: n4 dead showed `leaders 14 replicas 18`)."""
    rows = status_rows(_md([{"id": "n1", "address": "a:1", "status": "alive", "replicas": 3, "leaders": 2},
                            {"id": "n2", "address": "a:2", "status": "dead", "replicas": 18, "leaders": 14}]))
    assert [(r["id"], r["leaders"], r["replicas"]) for r in rows] == [("n1", 2, 3), ("n2", 1, 3)]


def test_status_command(admin):
    admin.md = _md([{"id": "n1", "address": "a:1", "status": "alive"}])
    out = run("cluster", "status")
    assert out.exit_code == 0 and out.output.splitlines()[1].split()[:4] == ["n1", "a:1", "alive", "active"]
    assert json.loads(run("cluster", "status", "--json").output)[0]["replicas"] == 3


def test_moves_table_shows_unknowns_as_dashes():
    (head, line) = moves_table([{"topic": "a-long-topic-name", "partition": 12}])
    assert line.split() == ["a-long-topic-name", "12", "-", "-", "-", "-", "-", "-", "/", "-", "-"]
    assert head.index("partition") + len("partition") == line.index("12") + 2   # right-aligned numbers
    assert [format_bytes(x) for x in (0, 1023, 1024, 5 << 30, None, -1)] == [
        "0 B", "1023 B", "1.0 KiB", "5.0 GiB", "-", "-"]


# -- the client ------------------------------------------------------------------------
class FakeTransport:
    def __init__(self, answers):
        self.answers = answers          # address -> response (absent: no answer)
        self.sent, self.forgotten = {}, []

    def send(self, addr, msg):
        rid = len(self.sent) + 1
        self.sent[rid] = (addr, msg)
        return rid

    def gather(self, rids, timeout_ms):
        return {r: (self.sent[r][0], self.answers[self.sent[r][0]], None)
                for r in rids if self.sent[r][0] in self.answers}

    def forget(self, addr):
        self.forgotten.append(addr)


class Client(ElasticAdmin):
    timeout_ms = 1000

    def __init__(self, md, answers):
        self.md, self.transport, self.requests = md, FakeTransport(answers), []

    def metadata(self, topics=None):
        return self.md

    def _call(self, msg):
        self.requests.append(msg)
        return getattr(self, "answer", None) or type("R", (), {"error": 0})()

    def _wait_everywhere(self, ok, wait_s, topic=None):
        self.requests.append(("wait", ok({"t": {"partitions": [{"leader": "n1"}] * 4,
                                                "replication_factor": 2}})))

    def _wait_security(self, request, ok, wait_s):
        self.requests.append(("wait", ok(self.md)))


def test_list_moves_asks_every_live_broker_and_reports_the_silent():
    md = m.MetadataResponse(0, [{"id": "n1", "address": "h:1", "status": "alive"},
                                {"id": "n2", "address": "h:2", "status": "alive"},
                                {"id": "n3", "address": "h:3", "status": "alive"},
                                {"id": "n4", "address": "h:4", "status": "dead"}],
                            [{"name": "orders", "error": 0,
                              "partitions": [{"partition": 3, "leader": "n2"}, {"partition": 1, "leader": "n1"}]}])
    stale = {**MOVE, "leader": "n1", "reason": "stale"}
    fresh = {**MOVE, "leader": "n2"}
    c = Client(md, {"h:1": m.ListMovesResponse(0, [stale, {**MOVE, "partition": 1}]),
                    "h:2": m.ListMovesResponse(0, [fresh]),
                    "h:3": m.ErrorResponse(int(ErrorCode.UNAUTHORIZED), "describe cluster")})
    c.md = md
    got = c.list_moves(None)
    assert sorted(a for a, _ in c.transport.sent.values()) == ["h:1", "h:2", "h:3"]   # not the dead one
    assert [(mv["partition"], mv["leader"]) for mv in got.moves] == [(1, "n1"), (3, "n2")]
    assert got.unanswered == {"n3": "UNAUTHORIZED: describe cluster"}
    c = Client(md, {"h:1": m.ListMovesResponse(0, [])})
    got = c.list_moves(["orders"])
    assert got.moves == [] and set(got.unanswered) == {"n2", "n3"} and "no answer" in got.unanswered["n2"]
    assert all(msg.topics == ["orders"] for _, msg in c.transport.sent.values())


def test_admin_requests_and_errors():
    md = m.MetadataResponse(0, [{"id": "n3", "state": "draining"}], [])
    c = Client(md, {})
    c.alter_topic("t", 4, 2)
    c.decommission("n3")
    c.recommission("n3")
    c.reassign("t", 1, ("n1", "n2"))
    assert c.requests == [m.AlterTopicRequest("t", 4, 2), ("wait", True),
                          m.BrokerStateRequest("n3", m.BROKER_DRAINING), ("wait", True),
                          m.BrokerStateRequest("n3", m.BROKER_ACTIVE), ("wait", False),
                          m.ReassignRequest("t", 1, ["n1", "n2"])]
    c.answer = m.ReassignResponse(int(ErrorCode.INVALID_REQUEST), "n9 is not a live broker")
    with pytest.raises(MeshError) as info:
        c.reassign("t", 1, ["n9"])
    assert info.value.code == ErrorCode.INVALID_REQUEST and info.value.message == "n9 is not a live broker"
