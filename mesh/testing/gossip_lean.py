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
2. Push-pull in one exchange: if exactly one side holds the new version, it crosses. When
   the sender holds it: SYN (its row, or a differing bucket hash) -> ACK (the receiver's
   older row) -> ACK2 (the delta): 3 messages. When the receiver holds it: SYN -> ACK (its
   rows of the differing bucket) -> ACK2 (the sender's older row) -> ACK2 (the delta): 4
   messages (``Rounds.on_ack``, ``on_ack2``). Each message is lost with ``loss``; a lost
   message ends the exchange.
3. Message delays of 1-10 ms (the simulator's default), small against the 200 ms
   interval: an exchange completes before most nodes' next round.

It does not model bytes (the full simulator measures them at 1,000 nodes), liveness, or
several updates at once. ``--check N`` runs the full simulator's spread scenario at N nodes
with the same settings next to the model, so the two can be compared.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

__all__ = ["lean_spread", "main"]


def lean_spread(nodes: int, seed: int = 7, loss: float = 0.0, interval_ms: int = 200,
                max_rounds: int = 60, delay_ms: tuple[int, int] = (1, 10)) -> float:
    """Rounds (elapsed time / interval) until every node holds one update."""
    rng = random.Random(f"lean/{seed}/{nodes}")
    phase = [rng.randrange(interval_ms) for _ in range(nodes)]
    order = sorted(range(nodes), key=phase.__getitem__)
    t0 = 3 * interval_ms + rng.randrange(interval_ms)     # the update, at a random node and time
    have_at = [None] * nodes                                # when each node got it (ms)
    origin = rng.randrange(nodes)
    have_at[origin] = t0
    count = 1
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
            if hi_ == hj:
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
