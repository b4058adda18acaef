"""The peer-nats driver: against a real nats-server (skipped, saying why, when nats-server
or nats-py is missing), and the clear error when the peer is absent."""
from __future__ import annotations

import os
import time

import pytest
from click.testing import CliRunner

from bench.cli import main as bench_main
from bench.peer_nats import NatsCluster, available, run_nats

needs_peer = pytest.mark.skipif(available() is not None,
                                reason=f"peer-nats smoke test needs the peer: {available()} "
                                       "(apt-get install nats-server; pip install .[peer])")


@pytest.mark.integration
@needs_peer
@pytest.mark.parametrize("servers", [1, 3])
def test_nats_driver_measures_a_real_jetstream_cluster(tmp_path, servers):
    spec = {"message_bytes": 100, "messages": 2_000, "latency_samples": 50, "e2e_rate": 2_000, "e2e_seconds": 1.0}
    t0 = time.monotonic()
    cluster = NatsCluster(servers, str(tmp_path / "nats")).start()
    try:
        assert len(cluster.url.split(",")) == servers
        res = run_nats(cluster.url, servers, spec)
    finally:
        cluster.stop()
    assert cluster.procs == []
    lat = res["latency"]
    assert lat["samples"] == 50 and 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert res["consumed"] == 2_000 and res["produce_rps"] > 0 and res["consume_rps"] > 0
    e2e = res["e2e"]   # every record of the paced phase reached the consumer process
    assert e2e["samples"] == 2_000 and e2e["rate"] == 2_000 and 0 < e2e["p50_ms"] <= e2e["p99_ms"] <= e2e["max_ms"]
    # JetStream kept its store under the run's directory
    assert any(os.scandir(tmp_path / "nats" / "n0" / "jetstream"))
    assert time.monotonic() - t0 < 30


def test_peer_scenario_without_the_peer_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no nats-server on this PATH
    res = CliRunner().invoke(bench_main, ["run", "--scenario", "peer-nats", "--out", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    assert "nats-server is not on the PATH" in res.output
    assert "apt-get install nats-server" in res.output and "pip install .[peer]" in res.output
    assert not (tmp_path / "r").exists()


def test_create_topic_waits_while_a_just_started_broker_looks_down(monkeypatch):
    """On a loaded host a broker of a cluster just started can look down to gossip for a
    moment: peer-nats lost whole rows to "replication factor 3 is larger than the 2 live
    brokers". The bench retries that refusal until its deadline; other refusals fail at once."""
    import mesh.client
    from bench.cluster import create_topic
    from bench.scenarios import BenchError
    from mesh.wire.errors import ErrorCode, MeshError

    calls = []

    class FakeAdmin:
        def __init__(self, bootstrap):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def create_topic(self, name, partitions, rf, config):
            calls.append(name)
            if name == "bad":
                raise MeshError(ErrorCode.INVALID_CONFIG, "unknown topic config 'x'")
            if len(calls) < 3:
                raise MeshError(ErrorCode.INVALID_CONFIG, "replication factor 3 is larger than the 2 live "
                                                          "broker(s) that are not draining")

        def describe_topic(self, name):
            return {"partitions": [{"leader_address": "127.0.0.1:1"}]}

    monkeypatch.setattr(mesh.client, "Admin", FakeAdmin)
    create_topic("127.0.0.1:1", "t", 1, 3, timeout_s=10)
    assert calls == ["t", "t", "t"]
    with pytest.raises(BenchError, match="unknown topic config"):
        create_topic("127.0.0.1:1", "bad", 1, 3, timeout_s=10)
    assert calls.count("bad") == 1
