"""The replication simulator: many seeded runs with faults, and proof that its checkers bite.

More seeds: ``python -m tests.sim.replication_sim --seed 0 --seeds 1000 --steps 3000``.
"""
from __future__ import annotations

import pytest

from mesh.raft.leading import Leading
from mesh.raft.partition import Partition, Role
from mesh.raft.messages import VoteRespRow
from mesh.raft.progress import Progress
from tests.sim.replication_sim import (
    SimConfig, SimFailure, expected_idle_messages_per_sec, idle_messages_per_sec, main, run,
)

STEPS = 1200

# (brokers, partitions, rf, seeds): 64 seeded runs, about 15 s on one core
SHAPES = [
    (3, 8, 3, range(0, 20)),
    (3, 8, 3, range(20, 40)),
    (5, 6, 5, range(100, 108)),
    (5, 10, 3, range(200, 208)),
    (3, 4, 1, range(300, 304)),
    (2, 4, 2, range(400, 404)),
]


@pytest.mark.parametrize("brokers, partitions, rf, seeds", SHAPES,
                         ids=[f"{b}brokers-{p}parts-rf{rf}-seeds{s.start}-{s.stop - 1}" for b, p, rf, s in SHAPES])
def test_seeded_runs_keep_every_invariant(brokers, partitions, rf, seeds):
    for seed in seeds:
        sim = run(SimConfig(seed=seed, steps=STEPS, brokers=brokers, partitions=partitions, rf=rf))
        assert sim.acked, sim.summary()  # clients got acknowledgements through the faults


# disk faults (issue 17): wipe, roll back, corrupt one broker's disk at a time: 20 runs, about 8 s
DISK_STEPS = 3000
DISK_SHAPES = [
    (3, 8, 3, range(500, 512)),
    (5, 6, 3, range(600, 604)),
    (3, 4, 2, range(700, 703)),
]


@pytest.mark.parametrize("brokers, partitions, rf, seeds", DISK_SHAPES,
                         ids=[f"disk-{b}brokers-{p}parts-rf{rf}-seeds{s.start}-{s.stop - 1}"
                              for b, p, rf, s in DISK_SHAPES])
def test_disk_faults_lose_no_acknowledged_batch(brokers, partitions, rf, seeds):
    totals: dict[str, int] = {}
    for seed in seeds:
        sim = run(SimConfig(seed=seed, steps=DISK_STEPS, brokers=brokers, partitions=partitions, rf=rf,
                            disk_faults=True))
        assert sim.acked, sim.summary()
        for k, v in sim.counts.items():
            totals[k] = totals.get(k, 0) + v
    if seeds.start == 500:
        assert all(totals[k] > 0 for k in ("wipe", "rollback", "corrupt")), totals


def test_faults_are_really_injected():
    totals: dict[str, int] = {}
    for seed in range(12):
        for k, v in run(SimConfig(seed=seed, steps=STEPS)).counts.items():
            totals[k] = totals.get(k, 0) + v
    for kind in ("crash", "mid_turn_crash", "pause", "partition", "retention", "truncates", "resets"):
        assert totals[kind] > 0, totals


def test_a_run_is_a_function_of_its_seed():
    a, b = run(SimConfig(seed=11, steps=600)), run(SimConfig(seed=11, steps=600))
    assert a.trace.hexdigest() == b.trace.hexdigest() and a.counts == b.counts and a.acked == b.acked
    assert run(SimConfig(seed=12, steps=600)).trace.hexdigest() != a.trace.hexdigest()


def _first_failure(seeds: range, steps: int = 2000, disk_faults: bool = False) -> SimFailure:
    for seed in seeds:
        try:
            run(SimConfig(seed=seed, steps=steps, disk_faults=disk_faults))
        except SimFailure as exc:
            return exc
    pytest.fail("the checkers missed an injected bug")


def test_checkers_catch_votes_for_out_of_date_candidates(monkeypatch):
    def careless_vote(self, src, row):  # grants without comparing logs
        if self.vote in (None, src) or row.pre_vote:
            if not row.pre_vote:
                self.vote = src
                self._state_changed()
            self._send(src, VoteRespRow(self.pid, row.term, 0, 1, row.pre_vote))
        else:
            self._send(src, VoteRespRow(self.pid, self.term, 0, 0, row.pre_vote))

    monkeypatch.setattr(Partition, "_handle_vote", careless_vote)
    exc = _first_failure(range(40))
    assert "reproduce with: python -m tests.sim.replication_sim --seed " in str(exc)
    assert "leader completeness" in str(exc) or "committed" in str(exc)


def test_checkers_catch_a_commit_without_a_quorum(monkeypatch):
    def eager_commit(self):  # counts one replica too few
        if self.role is Role.LEADER:
            held = sorted([self.synced] + [pr.match for pr in self.progress.values()], reverse=True)
            self._set_commit(max(self.commit, held[max(0, self.quorum - 2)]))

    monkeypatch.setattr(Partition, "_maybe_commit", eager_commit)
    assert "reproduce with" in str(_first_failure(range(40)))


def test_checkers_catch_a_leader_that_never_lowers_what_a_follower_holds(monkeypatch):
    """The bug of issue 17: the leader kept counting a wiped follower at its old offset."""
    def never_lower(self, offset):
        self.become_probe(max(offset, self.match) if offset >= 0 else offset)
        return False

    monkeypatch.setattr(Progress, "lower", never_lower)
    monkeypatch.setattr(Leading, "peer_restarted", lambda self, peer, store, new_store: None)
    exc = _first_failure(range(10), steps=4000, disk_faults=True)
    assert "which lost state" in str(exc) and "reproduce with" in str(exc)


def test_checkers_catch_replicas_that_lost_state_voting_and_counting(monkeypatch):
    monkeypatch.setattr(Progress, "counted", lambda self: True)
    monkeypatch.setattr(Partition, "eligible", lambda self: True)
    exc = _first_failure(range(10), steps=4000, disk_faults=True)
    # a committed batch is gone: a leader without it, or a replica whose committed log differs
    assert "leader completeness" in str(exc) or "committed" in str(exc) or "lost state" in str(exc), exc


def test_idle_heartbeats_are_coalesced_per_broker_pair():
    got = idle_messages_per_sec(brokers=3, partitions=300, rf=3, seconds=5)
    exp = expected_idle_messages_per_sec(3, 300, 3)
    assert exp["per_broker"] == 40 and exp["uncoalesced_per_broker"] == 4000
    # the simulated clocks drift by up to 5 %
    assert exp["per_broker"] * 0.94 <= got["per_broker"] <= exp["per_broker"] * 1.06, got
    assert expected_idle_messages_per_sec(3, 1000, 3)["per_broker"] == 40


def test_cli_reports_each_seed(capsys):
    assert main(["--seed", "5", "--seeds", "2", "--steps", "300"]) == 0
    out = capsys.readouterr().out
    assert "seed 5:" in out and "seed 6:" in out and "2/2 seeds passed" in out
