"""Quiescence (rule 10 of ``mesh.raft.partition``, the manager's "Quiescence"): idle
partitions stop ticking and heartbeating, and every way a quiet partition must wake up.
Each test drives three real cores through ``tests.unit.test_replication.Net``."""
from __future__ import annotations

import dataclasses

from mesh.raft import ReplicationConfig, Role
from mesh.raft.messages import HeartbeatRow, ReplHeartbeat, ReplVote
from tests.unit.test_replication import CFG, Net

QCFG = dataclasses.replace(CFG, quiesce_after_beats=3)   # heartbeat every tick, election timeout 10
E = QCFG.election_ticks


def quiet(net: Net, nids=None, pid: int = 1) -> bool:
    return all(net.cores[n].status(pid)["quiesced"] for n in (nids or net.cores))


def settle(net: Net, nids=None, limit: int = 4 * E) -> int:
    """Tick until every replica (of ``nids``) is quiet; returns the ticks it took."""
    for i in range(limit):
        if quiet(net, nids):
            return i
        net.tick()
    raise AssertionError(f"not quiet after {limit} ticks: "
                         f"{ {n: net.cores[n].status(1)['quiesced'] for n in net.cores} }")


def leader_of(net: Net, pid: int = 1) -> str | None:
    leads = [n for n in net.cores if net.cores[n].role(pid) is Role.LEADER]
    assert len(leads) <= 1, leads
    return leads[0] if leads else None


def quiet_net(writes: int = 3) -> Net:
    net = Net(cfg=QCFG)
    net.elect("n0")
    for i in range(writes):
        net.produce("n0", data=b"q%d" % i)
    settle(net)
    return net


def restart(net: Net, nid: str, campaign: bool = False) -> int:
    """Crash ``nid`` and start it again (a new life), campaigning at once if asked;
    returns the term before."""
    term = net.cores["n0"].leader(1)[1]
    net.crash(nid)
    net.start(nid)
    if campaign:
        net.apply(nid, net.cores[nid].campaign(1))
        net.deliver()
    return term


def test_an_idle_caught_up_partition_goes_quiet_and_its_brokers_only_ping():
    net = quiet_net()
    term = net.cores["n0"].leader(1)[1]
    assert net.cores["n0"].quiet() == 1 and net.cores["n0"].commit_offset(1) == 3
    net.sent.clear()
    net.tick(5 * E)
    rows = [r for _, s in net.sent for r in s.msg.rows]
    assert rows == [], rows[:5]   # no partition rows at all: pings only
    pings = [(src, s.dest) for src, s in net.sent]
    assert pings and all(type(s.msg) is ReplHeartbeat for _, s in net.sent)
    # every broker pings every peer it shares a partition with, once per beat (a tick here)
    assert set(pings) == {(a, b) for a in net.ids for b in net.ids if a != b}
    assert len(pings) == 6 * 5 * E
    assert leader_of(net) == "n0" and net.cores["n1"].leader(1) == ("n0", term)
    assert net.cores["n0"].isr(1) == ["n0", "n1", "n2"]   # its followers' nodes are heard


def test_always_ticking_when_quiescence_is_off():
    net = Net(cfg=dataclasses.replace(QCFG, quiesce_after_beats=0))
    net.elect("n0")
    net.produce("n0")
    net.tick(5 * E)
    assert not any(net.cores[n].status(1)["quiesced"] for n in net.ids)
    net.sent.clear()
    net.tick(1)
    assert any(type(r) is HeartbeatRow for _, s in net.sent for r in s.msg.rows)


def test_a_write_wakes_the_partition_and_it_goes_quiet_again():
    net = quiet_net()
    net.produce("n0", data=b"w")
    assert not net.cores["n0"].status(1)["quiesced"]
    net.deliver()
    assert not quiet(net, ["n1", "n2"])       # the append woke them
    net.tick(2)
    assert net.cores["n0"].commit_offset(1) == 4 and net.cores["n1"].commit_offset(1) == 4
    settle(net)
    assert net.log("n1") == net.log("n0") == net.log("n2")


def test_a_dead_leaders_quiet_followers_elect_a_successor_in_about_an_election_timeout():
    net = quiet_net()
    term = net.cores["n0"].leader(1)[1]
    net.crash("n0")
    for ticks in range(1, 4 * E):
        net.tick()
        if leader_of(net) is not None:
            break
    new = leader_of(net)
    assert new in ("n1", "n2") and net.cores[new].leader(1)[1] == term + 1
    # silent for an election timeout, then the timers as they would stand: campaign within [E, 2E)
    assert E <= ticks <= 3 * E, ticks
    assert net.cores[new].commit_offset(1) >= 3 and len(net.log(new)) == 3


def test_a_quiet_follower_keeps_its_leaders_lease_while_the_leaders_node_is_heard():
    """A restarted follower campaigns at once (it heard no leader yet); the other, quiet,
    follower must not grant it a (pre-)vote while the leader's node pings: no term change."""
    net = quiet_net()
    term = restart(net, "n1", campaign=True)
    assert net.cores["n2"].leader(1) == ("n0", term) and net.cores["n2"].status(1)["quiesced"]
    for _ in range(5 * E):
        net.tick()
    assert leader_of(net) == "n0" and net.cores["n0"].leader(1)[1] == term
    assert net.cores["n1"].leader(1) == ("n0", term) and net.log("n1") == net.log("n0")
    settle(net)


def test_a_restarted_leader_is_replaced_its_quiet_followers_drop_the_lease():
    net = quiet_net()
    term = restart(net, "n0")   # a new life: it leads nothing, its followers are quiet
    for _ in range(5 * E):
        net.tick()
        if leader_of(net) is not None:
            break
    lead = leader_of(net)
    assert lead is not None and net.cores[lead].leader(1)[1] > term
    assert len(net.log(lead)) == 3


def test_a_restarted_leaders_quiet_followers_wake_and_their_lease_runs_out_as_if_ticking():
    """Restarted and campaigning at once: its quiet followers wake (its new life) but keep
    the lease until an election timeout after its last heartbeat, as ticking followers
    would; then a leader of a newer term is elected."""
    net = quiet_net()
    term = restart(net, "n0", campaign=True)
    assert leader_of(net) is None and not quiet(net, ["n1", "n2"])
    for ticks in range(1, 4 * E):
        net.tick()
        if leader_of(net) is not None:
            break
    lead = leader_of(net)
    assert lead is not None and net.cores[lead].leader(1)[1] > term and ticks <= 3 * E


def test_a_quiet_leader_cut_off_from_its_quorum_wakes_and_steps_down():
    net = quiet_net()
    net.isolate("n0")
    net.tick(4 * E)
    assert net.cores["n0"].role(1) is not Role.LEADER   # woken by the silence, then check-quorum
    assert leader_of(net) in ("n1", "n2")


def test_a_follower_left_behind_is_caught_up_when_its_node_is_heard_again():
    net = quiet_net()
    net.cut |= {("n0", "n2"), ("n2", "n0"), ("n1", "n2"), ("n2", "n1")}
    for i in range(4):
        net.produce("n0", data=b"late%d" % i)
    net.tick(3 * E)   # n2 silent: left behind, the leader quiet again with n1
    assert net.cores["n0"].status(1)["quiesced"] and net.cores["n0"].commit_offset(1) == 7
    assert len(net.log("n2")) == 3
    net.heal()
    net.tick(3 * E)
    assert leader_of(net) == "n0" and net.log("n2") == net.log("n0")
    settle(net)


def test_a_follower_heard_again_after_a_silence_wakes_the_quiet_leader():
    """The returning node may lag (the leader went quiet without it): hearing it again
    (here a ping) wakes the leader, which then checks and catches it up."""
    net = quiet_net()
    net.isolate("n2")
    net.tick(2 * E)
    assert net.cores["n0"].status(1)["quiesced"]   # woken by the silence once, quiet again with n1
    net.heal()
    net.apply("n0", net.cores["n0"].step("n2", ReplHeartbeat([], "store-n2", net.cores["n2"].life)))
    assert not net.cores["n0"].status(1)["quiesced"]


def test_a_follower_restarted_on_an_empty_disk_is_refilled_by_a_quiet_leader():
    """It lost its state: its replica is recovering (never campaigns) and has nothing to
    say; its pings carry its new store to the leader, which wakes and refills it."""
    from tests.unit.test_replication import wipe
    net = quiet_net()
    wipe(net, "n2", "wiped-n2")
    net.apply("n2", net.cores["n2"].declare_lost_state())
    net.tick(4 * E)
    assert not net.cores["n2"].recovering(1) and net.log("n2") == net.log("n0")
    settle(net)


def test_a_lost_quiesce_heartbeat_costs_a_wake_up_not_an_election():
    net = Net(cfg=QCFG)
    net.elect("n0")
    net.produce("n0")
    term = net.cores["n0"].leader(1)[1]
    lost = []

    def drop(src, dest, msg):
        if dest == "n2" and type(msg) is ReplHeartbeat and any(r[5] for r in msg.rows) and not lost:
            lost.append(msg)
            return True
        return False

    for _ in range(6 * E):
        for nid in sorted(net.cores):
            net.apply(nid, net.cores[nid].tick())
        net.deliver(drop=drop)
    assert lost and net.cores["n0"].leader(1)[1] == term and leader_of(net) == "n0"
    settle(net)


def test_a_vote_request_wakes_a_quiet_leader():
    net = quiet_net()
    term = net.cores["n0"].leader(1)[1]
    rd = net.cores["n0"].step("n1", ReplVote([], "store-n1", net.cores["n1"].life))   # empty: a ping
    assert net.cores["n0"].status(1)["quiesced"] and not rd.messages
    from mesh.raft.messages import VoteRow
    net.apply("n0", net.cores["n0"].step("n1", ReplVote([VoteRow(1, term + 1, term, 3, 1, 0, 0)],
                                                       "store-n1", net.cores["n1"].life)))
    assert not net.cores["n0"].status(1)["quiesced"] and leader_of(net) == "n0"


def test_quiesce_after_beats_is_checked():
    import pytest
    from mesh.wire.errors import MeshError
    with pytest.raises(MeshError):
        ReplicationConfig(quiesce_after_beats=-1)


# -- found by review: replicas that stop leading or lose state while their partition is quiet --------

def test_a_quiet_leader_that_finds_a_corrupt_batch_is_replaced_even_if_its_timeout_now_is_lost():
    """It steps down within its term and cannot campaign (recovering): its quiet followers
    would keep its lease for good; its step-down notice (every beat, for an election
    timeout) ends the lease, so they elect a successor anyway."""
    from mesh.raft.messages import ReplTimeoutNow
    net = quiet_net()
    net.apply("n0", net.cores["n0"].report_corrupt(1, 1))
    net.deliver(drop=lambda src, dest, msg: type(msg) is ReplTimeoutNow)
    net.tick(6 * E)
    lead = leader_of(net)
    assert lead in ("n1", "n2") and len(net.log(lead)) == 3
    net.tick(6 * E)
    assert not net.cores["n0"].recovering(1) and net.log("n0") == net.log(lead)


def test_a_quiet_leader_that_finds_a_corrupt_batch_is_replaced_even_if_the_transfer_vote_is_lost():
    net = quiet_net()
    lost = []

    def drop(src, dest, msg):
        if type(msg) is ReplVote and not lost:
            lost.append(dest)
            return True
        return False
    net.apply("n0", net.cores["n0"].report_corrupt(1, 1))
    net.deliver(drop=drop)
    net.tick(6 * E)
    assert lost and leader_of(net) in ("n1", "n2")


def test_a_follower_that_loses_state_under_a_quiet_leader_is_refilled():
    net = quiet_net()
    net.apply("n1", net.cores["n1"].declare_lost_state())
    assert net.cores["n1"].recovering(1)
    net.tick(4 * E)
    assert not net.cores["n1"].recovering(1) and net.log("n1") == net.log("n0")
    assert net.cores["n0"].isr(1) == ["n0", "n1", "n2"]
    settle(net)


def test_a_follower_that_finds_a_corrupt_batch_under_a_quiet_leader_is_refilled():
    net = quiet_net()
    net.apply("n1", net.cores["n1"].report_corrupt(1, 1))
    assert net.cores["n1"].recovering(1) and net.cores["n1"].end_offset(1) == 1
    net.tick(4 * E)
    assert not net.cores["n1"].recovering(1) and net.log("n1") == net.log("n0")


def test_a_leader_that_hears_nobody_steps_down_and_is_replaced():
    """It can send but not receive: its pings keep its quiet followers in its lease until
    check-quorum deposes it and its step-down notice ends the lease."""
    net = quiet_net()
    net.cut |= {("n1", "n0"), ("n2", "n0")}
    net.tick(8 * E)
    assert leader_of(net) in ("n1", "n2")


def test_a_quiet_follower_is_woken_before_its_silence_counts_and_hears_its_leader_again():
    """Rule 3 of mesh.cluster.configs drops a replica that a committed config no longer
    names once its leader has been silent: a quiet follower hears no heartbeat rows by
    design, and a forged config register made every replica of an idle partition drop its
    data. The shell first wakes a quiet follower (``wake_quiet_follower``): still a member,
    it hears its leader again within an election timeout or two; its silence stays short."""
    net = quiet_net()
    net.tick(5 * E)
    n1 = net.cores["n1"]
    assert n1.status(1)["quiesced"] and n1.leader_silence_ticks(1) > 4 * E   # silent, by design
    assert n1.wake_quiet_follower(1) and not n1.wake_quiet_follower(1)
    assert n1.leader_silence_ticks(1) == 0
    peak = 0
    for _ in range(4 * E):
        net.tick()
        peak = max(peak, n1.leader_silence_ticks(1) if not n1.status(1)["quiesced"] else 0)
    assert peak < 2 * E and leader_of(net) == "n0", peak
