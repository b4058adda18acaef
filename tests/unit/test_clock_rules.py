"""One wrong clock never deletes data (issue 38, DESIGN.md section 11): retention moves a
log start only as the leader decides and its followers follow (never on a follower's own
clock, never by time on a leader whose clock is off), groups and producer ids do not
expire on a clock that disagrees with the peers', and a replica that was dropped and is
hosted again refills as recovering (not voting, not counted in sync)."""
from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest

from mesh.groups import GroupCommit, GroupList
from mesh.node.data.datapath import DataPath
from mesh.node.loop import Node, NodeConfig
from mesh.wire.records import encode_batch
from tests.unit.test_group_host import CONFIG, Broker, World, group_on, past_grace
from tests.unit.test_raft_host import PID, TICK_MS, Cluster

HOUR_MS = 3_600_000
T0 = 1_790_000_000_000


# -- retention: the leader decides, followers follow --------------------------------------------
def _cluster_with_old_batches(n: int = 6) -> Cluster:
    c = Cluster()
    c.start()
    for i in range(n):
        h, store = c.hosts["n0"], c.stores["n0"]
        base, epoch = h.append_position(PID)
        _, end = store.stage_append(PID, encode_batch([b"v%d" % i], timestamps_ms=T0), epoch, 1)
        h.leader_append(PID, end, epoch)
        c.turn("n0")
        c.deliver()
    for _ in range(30):                  # heartbeats carry the commit; it is written within a second
        c.advance(TICK_MS)
        c.deliver()
    assert all(c.hosts[nid].persisted_commit(PID) == n for nid in c.ids)
    return c


def _retention(c: Cluster, nid: str, now_ms: int, by_time: bool = True) -> None:
    """One retention pass of ``nid``'s data path (its real ``enforce_retention``)."""
    topic = SimpleNamespace(config={"retention.ms": HOUR_MS, "retention.bytes": -1}, pids=(PID,))
    shell = SimpleNamespace(store=c.stores[nid], replicas=c.hosts[nid],
                            catalog=SimpleNamespace(topics={"t": topic}))
    DataPath.enforce_retention(shell, now_ms, by_time)
    c.turn(nid)


def _starts(c: Cluster) -> list[int]:
    return [c.stores[nid].log_start(PID) for nid in c.ids]


def test_a_follower_whose_clock_is_ahead_cuts_nothing_on_its_own():
    c = _cluster_with_old_batches()
    _retention(c, "n1", T0 + 2 * HOUR_MS)      # n1's clock: two hours ahead, retention 1 h
    assert _starts(c) == [0, 0, 0]


def test_a_leader_whose_clock_is_untrusted_proposes_no_time_cut():
    c = _cluster_with_old_batches()
    _retention(c, "n0", T0 + 2 * HOUR_MS, by_time=False)
    assert _starts(c) == [0, 0, 0]


def test_the_leaders_cut_reaches_every_replica_so_they_agree_on_the_log_start():
    c = _cluster_with_old_batches()
    _retention(c, "n0", T0 + 2 * HOUR_MS)      # its clock agrees with the peers': the batches are old
    assert c.stores["n0"].log_start(PID) == 5  # every batch but the last
    for _ in range(40):
        c.advance(TICK_MS)
        c.deliver()
    assert _starts(c) == [5, 5, 5]
    assert [c.stores[nid].log_end(PID) for nid in c.ids] == [6, 6, 6]


def test_the_leaders_cut_reaches_a_quiet_partition():
    c = _cluster_with_old_batches()
    for _ in range(20):
        c.advance(TICK_MS)
        c.deliver()
    assert c.hosts["n0"].core.status(PID)["quiesced"]          # idle: no heartbeats any more
    _retention(c, "n0", T0 + 2 * HOUR_MS)
    for _ in range(40):
        c.advance(TICK_MS)
        c.deliver()
    assert _starts(c) == [5, 5, 5]


# -- a replica dropped and hosted again refills as recovering -------------------------------------
def test_a_replica_dropped_and_hosted_again_is_recovering_until_refilled(caplog):
    c = _cluster_with_old_batches()
    n2 = c.hosts["n2"]
    n2.remove(PID)                                     # "dropping local partition ..."
    c.stores["n2"].stage_reset(PID, 0)
    c.turn("n2")
    with caplog.at_level(logging.WARNING, logger="mesh.node.replication.raft_host"):
        n2.add(PID, c.ids)
    assert any("dropped before" in r.getMessage() and "recovering" in r.getMessage() for r in caplog.records)
    c.turn("n2")
    assert n2.recovering(PID) and c.hosts["n0"].core.status(PID)["quiesced"]   # its leader is quiet
    seen = []
    for _ in range(20):
        c.advance(TICK_MS)
        c.deliver()
        seen.append(("n2" in c.hosts["n0"].isr(PID), c.hosts["n0"].core.status(PID)["followers"]["n2"]["recovering"]))
    assert (False, True) in seen[:3]                   # the leader heard it at once: not in sync, refilling
    assert not n2.recovering(PID) and c.stores["n2"].log_end(PID) == 6
    assert seen[-1] == (True, False)                   # refilled: in sync again


# -- group expiry waits for a clock that agrees ------------------------------------------------------
def test_no_group_expires_while_the_clock_is_untrusted():
    world = World()
    a = Broker(world, "a")
    trusted = [False]
    a.groups.clock_trusted = lambda: trusted[0]
    past_grace(world)
    g = group_on("a", ["a"])
    assert a.ask(GroupCommit(g, "", -1, [["t", 2, 9, ""]])).error == 0
    world.now_ms += CONFIG.offsets_retention_ms + 60_000   # (a clock far ahead)
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert a.ask(GroupList()).groups != []
    trusted[0] = True
    world.now_ms += 20_000
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert a.ask(GroupList()).groups == []


# -- the node's loop: no time-based deletion on a clock that is off --------------------------------
class FakeClock:
    def __init__(self, wall_ms: int):
        self.wall, self.mono = wall_ms, 1_000_000

    def wall_ms(self) -> int:
        return self.wall

    def now_ms(self) -> int:
        return self.mono


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def skewed_node(tmp_path):
    clock = FakeClock(T0 + 2 * HOUR_MS)
    n = Node(NodeConfig(node_id="n1", bind=f"127.0.0.1:{_port()}", data_dir=str(tmp_path), sync=False), clock=clock)
    yield n, clock
    n.close()


def test_a_node_whose_clock_is_off_expires_no_producer_id_and_retains_by_size_only(skewed_node, monkeypatch):
    n, clock = skewed_node
    calls = []
    monkeypatch.setattr(n.data, "enforce_retention", lambda now, by_time=True: calls.append(("retention", by_time)))
    monkeypatch.setattr(n.producers, "expire", lambda now: calls.append(("expire", now)))
    n.peer_clock.alone = lambda: False                   # it has peers ...
    for peer in ("127.0.0.1:1", "127.0.0.1:2"):         # ... two hours behind it
        n.peer_clock.offsets.observe(peer, T0, clock.wall, clock.mono)
    n._after_turn()
    assert calls == [("retention", False)]
    assert n.peer_clock.offset_ms() == -2 * HOUR_MS
    assert n.data.wall_ms() == T0                        # record timestamps judged by the peers' time
    # the clock is fixed: the peers agree again
    clock.wall, clock.mono = T0 + 10, clock.mono + 60_000
    for peer in ("127.0.0.1:1", "127.0.0.1:2"):
        n.peer_clock.offsets.observe(peer, T0 + 12, clock.wall, clock.mono)
    calls.clear()
    n._after_turn()
    assert calls == [("retention", True), ("expire", clock.wall)]


# -- the log start on the wire --------------------------------------------------------------------
def test_appends_and_heartbeats_carry_the_log_start_and_older_rows_read_as_0():
    import msgpack

    from mesh.raft.messages import AppendRow, HeartbeatRow, ReplAppend, ReplHeartbeat, parse_rows
    from mesh.wire.codec import decode_body, encode_body
    from mesh.wire.errors import MeshError
    row = AppendRow(1, 2, 4, 2, 4, 0, 0, 9, 0, 0, 0, 0, [], 3)
    (got,) = parse_rows(decode_body(b"REPL_APPEND", encode_body(ReplAppend([row]))))
    assert got.log_start == 3
    older = list(row)[:13]                       # a broker before the field: 0, nothing to cut
    (got,) = parse_rows(decode_body(b"REPL_APPEND", msgpack.packb([[older], "", 0])))
    assert got.log_start == 0 and got.commit == 9
    with pytest.raises(MeshError, match="log start above the leader's commit"):
        parse_rows(ReplAppend([row._replace(log_start=10)]))
    hb = HeartbeatRow(1, 2, 5, 0, 0, 0, 7)
    (got,) = parse_rows(decode_body(b"REPL_HEARTBEAT", encode_body(ReplHeartbeat([hb]))))
    assert got.log_start == 7
    (got,) = parse_rows(decode_body(b"REPL_HEARTBEAT", msgpack.packb([[list(hb)[:6]], "", 0])))
    assert got.log_start == 0
    with pytest.raises(MeshError):
        parse_rows(ReplHeartbeat([hb._replace(log_start=-1)]))
