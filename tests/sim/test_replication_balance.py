"""The balancer's moves carried out by Raft membership changes under faults (issue 14):
joins, decommissions, deaths and replacements; see ``tests.sim.replication_balance``."""
from __future__ import annotations

import pytest

from tests.sim.replication_balance import BalanceSim, BalanceSimConfig, check_balanced, run
from tests.sim.replication_store import SimFailure


@pytest.mark.parametrize("seed", range(8))
def test_retire_under_faults(seed):
    sim = run(BalanceSimConfig(seed=seed, steps=2500, drain=False))
    assert sim.retired and sim.retired <= sim.dead_for_good
    assert len(sim.flaps) <= 1


@pytest.mark.parametrize("seed", range(8))
def test_drain_recommission_and_retire_under_faults(seed):
    sim = run(BalanceSimConfig(seed=seed, steps=2500))
    assert sim.counts["events"] >= 3 and sim.counts["steps"] > 0


@pytest.mark.parametrize("seed", [14149, 14277])
def test_a_briefly_down_broker_is_not_the_surplus_dropped(seed):
    """Two move-backs each before ``balance._Pass.drop_surplus`` weighed a broker only
    briefly down by its load: a move's surplus dropped it, and once back it got a replica
    back."""
    sim = run(BalanceSimConfig(seed=seed, steps=3000))
    assert len(sim.flaps) == 0, sim.flaps


def test_the_balance_check_can_fail():
    sim = BalanceSim(BalanceSimConfig(seed=0, steps=10, faults=False, clients=False))
    sim.target[sim.pids[0]] = ["n0", "n0", "n1"]
    with pytest.raises(SimFailure):
        check_balanced(sim)


def test_too_many_move_backs_fail():
    with pytest.raises(SimFailure, match="moved back"):
        run(BalanceSimConfig(seed=14031, steps=3000, max_move_backs=0))   # one move-back (module docstring)
