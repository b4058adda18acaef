"""Gossip at scale: how many rounds one update needs to reach every node.

    python bench/gossip_scale.py [--seed 7] [--skip-10k]

Runs the deterministic simulator (mesh/testing/gossip_scenarios.py) on the real gossip core:

  1. 1,000 nodes, fanout 1, no loss            target <= 12 rounds
  2. 1,000 nodes, fanout 1, 10% message loss   target <= 14 rounds
  3. 10,000 nodes, fanout 1, no loss           target <= 15 rounds

A round is elapsed simulated time divided by ``interval_ms`` (200 ms). The 1,000-node runs
go through the msgpack codec with heartbeats on, so they also report bytes per node per
round and per second (10 idle rounds before the update; target <= 10 KB/s at 1,000 nodes). The 10,000-node run skips the codec and turns heartbeats off: with 10,000 moving
heartbeats every digest differs everywhere, which costs O(N^2) Python work per round but
does not change dissemination (heartbeats ride in digests, never in deltas; the
1,000-node runs give the same rounds with heartbeats on or off). It needs a few GB of
memory and some minutes.

Exit status 1 if a target is missed. Every line can be reproduced on its own with
``python -m mesh.testing.gossip_scenarios --scenario spread --nodes N --seed S [--loss L]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mesh.testing.gossip_scenarios import run_scenario  # noqa: E402

RUNS = [
    # (label, nodes, loss, target rounds)
    ("1k nodes", 1_000, 0.0, 12),
    ("1k nodes, 10% loss", 1_000, 0.1, 14),
    ("10k nodes", 10_000, 0.0, 15),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--skip-10k", action="store_true", help="only the 1,000-node runs")
    args = p.parse_args(argv)
    rows = []
    failed = False
    for label, nodes, loss, target in RUNS:
        if nodes > 1_000 and args.skip_10k:
            continue
        t = time.perf_counter()
        r = run_scenario("spread", nodes=nodes, seed=args.seed, loss=loss, max_rounds=target)
        wall = time.perf_counter() - t
        m = r.metrics
        rounds = m.get("rounds to full convergence", float("nan"))
        ok = r.ok
        failed |= not ok
        rows.append((label, rounds, target, m.get("bytes per node per round", "-"), wall, ok))
        print(f"{label:<22} rounds {rounds:>6}  (target <= {target})  "
              f"bytes/node/round {m.get('bytes per node per round', '-')!s:>7}  "
              f"bytes/node/s {m.get('bytes per node per second (10 rounds before the update)', '-')!s:>7}  "
              f"wall {wall:6.1f} s  {'ok' if ok else 'MISSED'}", flush=True)
        if not ok:
            print(r.render(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
