"""A lean model of one update's spread, for clusters the full simulator cannot hold.

    python -m mesh.testing.gossip_lean --nodes 100000 [--loss 0.0] [--seed 7] [--check 1000]

What it models. The full simulator (``mesh.testing.gossip_sim``) runs every node's real
``Gossip`` core; at 100,000 nodes each node's table of 100,000 rows, copied on its first
write, does not fit in memory. For *rounds to converge* only three rules of the protocol
matter, and the model keeps exactly those:

1. Peer choice (``Rounds.start``): each node starts a round every ``interval_ms`` at its
   own fixed phase (drawn uniformly in the first interval, as ``Gossip.__init__`` does),
   and sends one SYN (fanout 1) to a uniformly random other node; with
   ``seed_probe_prob`` one more to a seed.
2. What one exchange carries (``Rounds``). A node's k-th partial SYN carries the row
   bucket hashes when k is a multiple of ``hashes_every(nodes)`` (every other SYN below
   ``HASHES_EVERY_SYN_ROWS`` rows, every SYN from there), and the updated row while it is the
   origin's own or was among the last ``RECENT_SENDS`` it pushed since it learned it
   (``Membership.recent``). When the SYN's sender holds the new version, it crosses if the
   SYN carries the row or the hashes: SYN -> ACK (the receiver's older row) -> ACK2 (the
   delta), 3 messages. When the receiver holds it, it crosses only if the SYN carries the
   hashes: SYN -> ACK (its rows of the differing bucket) -> ACK2 (the sender's older row)
   -> ACK2 (the delta), 4 messages (``on_ack``, ``on_ack2``). Each message is lost with
   ``loss``; a lost message ends the exchange.
3. Message delays of 1-10 ms (the simulator's default), small against the 200 ms
   interval: an exchange completes before most nodes' next round.

It does not model bytes (the full simulator measures them at 1,000 and 10,000 nodes; at
100,000 a row bucket holds ~1,560 rows, and an ACK expanding one sends it whole, ~40 KB),
liveness, several updates at once, or ``max_nodes`` (20,000 by default: a real 100,000-node
cluster needs it raised). ``--check N`` runs the full simulator's spread scenario at N nodes
with the same settings next to the model, so the two can be compared.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from mesh.gossip.membership import RECENT_SENDS
from mesh.gossip.rounds import hashes_every

__all__ = ["lean_spread", "main"]


def lean_spread(nodes: int, seed: int = 7, loss: float = 0.0, interval_ms: int = 200,
                max_rounds: int = 60, delay_ms: tuple[int, int] = (1, 10)) -> float:
    """Rounds (elapsed time / interval) until every node holds one update."""
    rng = random.Random(f"lean/{seed}/{nodes}")
    phase = [rng.randrange(interval_ms) for _ in range(nodes)]
    order = sorted(range(nodes), key=phase.__getitem__)
    t0 = 3 * interval_ms + rng.randrange(interval_ms)     # the update, at a random node and time
    have_at = [None] * nodes                                # when each node got it (ms)
    pushes = [RECENT_SENDS] * nodes                         # partial digests that still carry it
    syns = [0] * nodes
    origin = rng.randrange(nodes)
    have_at[origin] = t0
    pushes[origin] = 1 << 30                                # its own row: in every SYN
    count = 1
    every = hashes_every(nodes)
    lo, hi = delay_ms
    for k in range(3, max_rounds + 4):
        base = k * interval_ms
        for i in order:
            t = base + phase[i]
            j = rng.randrange(nodes - 1)
            if j >= i:
                j += 1
            ai, aj = have_at[i], have_at[j]
            hi_ = ai is not None and ai <= t
            hj = aj is not None and aj <= t + hi      # (it got there before our SYN did)
            syns[i] += 1
            hashes = syns[i] % every == 0
            carried = hi_ and pushes[i] > 0
            if carried:
                pushes[i] -= 1
            if hi_ == hj or not (hashes or carried):
                continue
            msgs = 3 if hi_ else 4
            if loss and any(rng.random() < loss for _ in range(msgs)):
                continue
            arrive = t + sum(rng.randint(lo, hi) for _ in range(msgs))
            if hi_:
                if aj is None or arrive < aj:
                    if aj is None:
                        count += 1
                    have_at[j] = arrive
            elif ai is None or arrive < ai:
                if ai is None:
                    count += 1
                have_at[i] = arrive
        if count == nodes:
            return round((max(have_at) - t0) / interval_ms, 2)
    return float("inf")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mesh.testing.gossip_lean", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    p.add_argument("--seed", type=int, nargs="+", default=[7])
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--check", type=int, default=0, help="also run the full simulator at this size")
    args = p.parse_args(argv)
    for n in args.nodes:
        t = time.perf_counter()
        rounds = [lean_spread(n, s, args.loss) for s in args.seed]
        print(f"lean model, {n} nodes, loss {args.loss}: rounds {rounds} "
              f"(mean {sum(rounds) / len(rounds):.2f}), wall {time.perf_counter() - t:.1f} s", flush=True)
    if args.check:
        from mesh.testing.gossip_scenarios import run_scenario
        for s in args.seed:
            r = run_scenario("spread", nodes=args.check, seed=s, loss=args.loss, lan=True)
            print(f"full simulator, {args.check} nodes, seed {s}: rounds {r.metrics.get('rounds to full convergence')}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
