"""Failure detection by SWIM probes and Lifeguard suspicion in the simulator (small sizes;
1,000 nodes: python -m mesh.testing.gossip_detection --nodes 1000), and the lean model of
one update's spread beside the full simulator."""
from __future__ import annotations

import pytest

from mesh.testing.gossip_detection import scenario_detect
from mesh.testing.gossip_lean import lean_spread
from mesh.testing.gossip_scenarios import run_scenario

pytestmark = pytest.mark.sim


def test_killed_nodes_are_dead_everywhere_in_seconds_with_loss_and_stalling_nodes_and_nobody_else_is():
    r = scenario_detect(50, seed=7, loss=0.01, kills=3)
    assert r.ok, "\n" + r.render()
    m = r.metrics
    assert m["detection: dead at all, max (ms)"] <= 8_000
    assert m["false convictions"] == 0 and m["invariant violations"] == 0   # incl. no zombie
    assert m["refutations"] >= 1          # the stalling nodes were suspected, and refuted it


def test_the_broker_preset_spreads_an_update_to_200_nodes_cheaply():
    m = run_scenario("spread", nodes=200, seed=7, lan=True, max_rounds=12).metrics
    assert m["nodes reached"] == 200 and m["false convictions"] == 0
    assert m["bytes per node per second (10 rounds before the update)"] <= 5_000


def test_the_lean_model_is_no_faster_than_the_full_simulator_at_1000_nodes_and_grows_slowly():
    full = run_scenario("spread", nodes=1000, seed=7, lan=True, max_rounds=12).metrics["rounds to full convergence"]
    lean = lean_spread(1000, seed=7)
    assert full - 0.5 <= lean <= full + 2.5, (full, lean)
    assert lean_spread(30_000, seed=7) <= lean + 4
