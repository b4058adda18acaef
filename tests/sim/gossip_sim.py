"""The gossip simulator now lives in ``mesh.testing`` (bench uses it too); this module keeps
the old names and command line for the tests and for old reproduce lines.

    python -m tests.sim.gossip_sim ...   is   python -m mesh.testing.gossip_scenarios ...
"""
from __future__ import annotations

import os
import sys

from mesh.testing.gossip_scenarios import SCENARIOS, Report, main, run_scenario
from mesh.testing.gossip_sim import NetConfig, Simulation, SimulationFailure, address_of

__all__ = ["NetConfig", "Simulation", "SimulationFailure", "Report", "SCENARIOS", "run_scenario",
           "main", "address_of", "ROOT"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    sys.exit(main())
