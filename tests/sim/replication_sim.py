"""Deterministic simulator for mesh.raft.manager: N brokers x P partitions, one seed.

    python -m tests.sim.replication_sim --seed 7 --steps 3000 [--brokers 3 --partitions 8]
    python -m tests.sim.replication_sim --seed 0 --seeds 1000 --steps 2000
    python -m tests.sim.replication_sim --seed 0 --seeds 100 --steps 5000 --disk-faults
    python -m tests.sim.replication_sim --idle-rate --partitions 1000

How it works
------------
The real ``ReplicaManager`` runs on every simulated broker; the simulator plays the node
shell and owns the disks; the shared ``SimNet`` (mesh.testing.simnet) owns time and the
network: one event heap ordered by (simulated microseconds, sequence number). One
``random.Random`` for the world, one for the network and one per broker incarnation, all
seeded from strings: a run is a pure function of its arguments.

- A broker *turn* is the shell's loop turn: feed every message that has arrived, the ticks
  that elapsed, the produce requests; apply each ``Ready``'s storage effects to the staged
  view at once; ``flush()``; then group commit (the staged view becomes durable), then
  ``synced()``, then send the messages and answer produce requests whose batch committed.
  A broker may crash between staging and the sync: the turn's writes and messages vanish.
- Disk (``SimDisk``, replication_disk.py): the real ``storage.memory.MemoryStore`` holding
  real record batches (``mesh.wire.records``), plus the checkers' index of every log; the
  index and the store are compared after every sync and crash, and every ``Append`` the
  core asks for is checked batch by batch (offsets, epochs, CRCs).
- Network and faults: every message is encoded with ``mesh.wire.codec`` and decoded on
  delivery; loss, duplication, delay, slow messages (reordering), partitions (splits,
  one-way links), crashes (at a turn boundary or mid-turn; in-flight messages to and from
  the broker are lost), restarts from what was committed, pauses (SIGSTOP: no ticks, the
  network holds the broker's messages, then a burst) and retention (the head of a log
  deleted below its persisted commit).
- Identity: every broker has a store id and starts its core unconfirmed; a seeded moment
  later (``identity_ms``) the shell plays gossip's answer: ``confirm_identity()``, or
  ``declare_lost_state()`` after a wipe or rollback.
- Disk faults (``--disk-faults``; only for brokers whose partitions all have RF >= 2, one
  broker at a time, the next only once that one is refilled and back in every leader's
  in-sync set, as the issue's checker did): crash and restart with (a) an empty store and
  a new store id, (b) the store as it was at an earlier sync (log and persisted state), (c)
  a corrupt batch found at recovery; or (d) a corrupt batch found by a running broker
  (often a leader). For (c) and (d) the shell calls ``report_corrupt(pid, offset)``.
- Clients produce batches to whoever some broker believes leads; a batch is acknowledged
  when the leader's ``committed`` covers it after the turn's sync (acks=all).

Checkers (replication_checks.py), after every Ready and turn:
- election safety: at most one leader per (partition, epoch), ever;
- leader completeness: a new leader of epoch E holds every batch committed before E;
- committed batches never change or disappear: every replica's log, up to its commit
  offset, equals the canonical committed log; truncations never cut below commit;
- the core's state matches what it asked to persist, and its epoch cache matches the
  epochs stored in the batches;
- disk faults: a replica that lost state is never elected, nor counted by a leader beyond
  what it holds, before it holds again what it may have acknowledged;
- final phase: heal everything, restart and resume every broker; within a bound every
  partition must have one leader known to all replicas, identical logs and commit = end;
  a new batch per partition must commit; every acknowledged batch must be present; then
  leadership must move back to each partition's preferred replica.

A failure prints ``reproduce with: python -m tests.sim.replication_sim --seed N ...``.

Files: replication_sim.py (this: ``run``, the idle-rate measurement, the command line),
replication_world.py (``Sim``: brokers, turns, clients, faults, the final phase),
replication_checks.py (the invariants), replication_disk.py (the disk),
replication_store.py (``PartLog``, the checkers' index of a log, and ``SimFailure``).
"""
from __future__ import annotations

import argparse
import sys
import time

from mesh.raft import ReplicationConfig
from mesh.testing.seeds import run_seeds
from tests.sim.replication_store import PartLog, SimFailure
from tests.sim.replication_world import SIM_REPLICATION, US, Sim, SimConfig

__all__ = [
    "SimConfig", "Sim", "SimFailure", "PartLog", "run", "main",
    "idle_messages_per_sec", "expected_idle_messages_per_sec", "SIM_REPLICATION",
]



def run(cfg: SimConfig) -> Sim:
    """One seeded run: faults for ``cfg.steps`` broker turns, then heal and check."""
    sim = Sim(cfg)
    try:
        sim.run_steps(cfg.steps)
        sim.finish()
    except SimFailure:
        raise
    except Exception as exc:  # an assertion inside the core is a failure of this seed too
        raise SimFailure(f"seed {cfg.seed}, t={sim.now_us / 1e6:.3f}s, step {sim.steps_done}: "
                         f"{type(exc).__name__}: {exc}\n"
                         f"reproduce with: python -m tests.sim.replication_sim {cfg.argv()}") from exc
    return sim


# -- idle message rate (MultiRaft coalescing) -----------------------------------------------------

def expected_idle_messages_per_sec(brokers: int, partitions: int, rf: int, tick_ms: int = 50,
                                   heartbeat_ticks: int = 2) -> dict:
    """Messages per second an idle cluster sends, with leaders on the preferred replicas
    (placement as in this simulator): per beat each broker sends one heartbeat to every
    peer following one of its partitions and one response to every peer leading one of its
    partitions. ``uncoalesced`` is what one message per partition would cost."""
    beats = 1000 / (tick_ms * heartbeat_ticks)
    nodes = [f"n{i}" for i in range(brokers)]
    rf = min(rf, brokers)
    pairs: set[tuple[str, str]] = set()
    rows = 0
    for pid in range(1, partitions + 1):
        reps = [nodes[(pid + k) % brokers] for k in range(rf)]
        for f in reps[1:]:
            pairs.add((reps[0], f))
            rows += 1
    per_broker = {n: beats * (sum(1 for a, _ in pairs if a == n) + sum(1 for _, b in pairs if b == n))
                  for n in nodes}
    return {"per_broker": max(per_broker.values()), "cluster": sum(per_broker.values()),
            "uncoalesced_per_broker": beats * 2 * rows / brokers, "uncoalesced_cluster": beats * 2 * rows}


def idle_messages_per_sec(brokers: int = 3, partitions: int = 1000, rf: int = 3, seconds: float = 10.0,
                          seed: int = 0, config: ReplicationConfig | None = None, settle_s: float = 0.0) -> dict:
    """Measure it: elect and balance leaders with no faults and no clients, wait
    ``settle_s`` more, then count the messages sent during ``seconds`` of idle simulated
    time (``quiet``: partitions not ticked, summed over brokers, at the end)."""
    rcfg = config or ReplicationConfig()
    cfg = SimConfig(seed=seed, brokers=brokers, partitions=partitions, rf=rf, faults=False, clients=False,
                    loss=0.0, dup=0.0, slow_p=0.0, replication=rcfg, check_replicas=False)
    sim = Sim(cfg)
    sim.run_until(lambda: sim.converged() and sim.balanced(), 120_000 * US, "idle cluster balanced")
    settled = sim.now_us + int(settle_s * 1e6)
    while (t := sim.net.next_time()) is not None and t <= settled:
        sim._event()
    start = sim.now_us
    before_m, before_r = dict(sim.sent_messages), dict(sim.sent_rows)
    end = start + int(seconds * 1e6)
    while (t := sim.net.next_time()) is not None and t <= end:
        sim._event()
    msgs = {n: (sim.sent_messages[n] - before_m[n]) / seconds for n in sim.node_ids}
    rows = {n: (sim.sent_rows[n] - before_r[n]) / seconds for n in sim.node_ids}
    return {"per_broker": max(msgs.values()), "cluster": sum(msgs.values()),
            "rows_per_broker": max(rows.values()), "rows_cluster": sum(rows.values()),
            "quiet": sum(sim.nodes[n].core.quiet() for n in sim.node_ids if sim.nodes[n].core is not None)}


# -- command line -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.replication_sim",
                                description="Deterministic simulation of mesh.raft.manager.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    p.add_argument("--steps", type=int, default=2000, help="broker turns with faults before the heal")
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=None, help="default 8 (1,000 with --idle-rate)")
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--disk-faults", action="store_true", help="also wipe, roll back and corrupt disks")
    p.add_argument("--idle-rate", action="store_true",
                   help="measure idle messages/s per broker (defaults: 1,000 partitions, production config)")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.idle_rate:
        parts = args.partitions or 1000
        t0 = time.perf_counter()
        got = idle_messages_per_sec(args.brokers, parts, args.rf, seed=args.seed)
        exp = expected_idle_messages_per_sec(args.brokers, parts, args.rf)
        print(f"{parts} partitions x RF{args.rf} on {args.brokers} brokers, tick 50 ms, heartbeat every 2 ticks:")
        print(f"  measured: {got['per_broker']:.0f} messages/s per broker ({got['cluster']:.0f}/s cluster), "
              f"carrying {got['rows_per_broker']:.0f} partition rows/s per broker")
        print(f"  expected: {exp['per_broker']:.0f} messages/s per broker ({exp['cluster']:.0f}/s cluster); "
              f"one message per partition would be {exp['uncoalesced_per_broker']:.0f}/s per broker")
        print(f"  ({time.perf_counter() - t0:.1f}s wall)")
        return 0
    return run_seeds(args.seed, args.seeds, lambda seed: run(SimConfig(
        seed=seed, steps=args.steps, brokers=args.brokers, partitions=args.partitions or 8, rf=args.rf,
        faults=not args.no_faults, disk_faults=args.disk_faults)),
        failure=SimFailure, quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
