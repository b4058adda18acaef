"""Running a deterministic simulation over a range of seeds, as every simulator's CLI does.

A run is a pure function of its seed; a failing one raises with its seed and the command
that replays it in the message, which is printed, and the sweep goes on.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

__all__ = ["run_seeds"]


def run_seeds(first_seed: int, count: int, run_one: Callable[[int], Any], *,
              failure: type[BaseException] = AssertionError, quiet: bool = False) -> int:
    """Run ``run_one(seed)`` for ``count`` seeds from ``first_seed``; print each run's
    ``summary()`` (unless ``quiet``) or its failure, then a tally. Exit status: 1 if any
    seed failed."""
    failures = 0
    t0 = time.perf_counter()
    for seed in range(first_seed, first_seed + count):
        try:
            sim = run_one(seed)
        except failure as exc:
            failures += 1
            print(f"FAIL {exc}", file=sys.stderr)
            continue
        if not quiet:
            print(sim.summary())
    print(f"{count - failures}/{count} seeds passed in {time.perf_counter() - t0:.1f}s")
    return 1 if failures else 0
