"""The replication simulator with a reconfiguration nemesis: partitions move between a pool
of brokers while the usual faults run (loss, delay, duplication, partitions, crashes,
restarts, pauses, retention).

    python -m tests.sim.replication_reconfig --seed 0 --seeds 40 --steps 2500

How it works (on top of ``tests.sim.replication_world.Sim``)
-------------------------------------------------------------
- Every partition has a *target* voter list (ordered: the preferred leader first), drawn
  from the pool (``brokers``) with the seeded rng; during the fault phase the nemesis
  redraws some targets now and then (a move to spare brokers, a new preferred order).
- The partition's leader takes ONE single-server step toward its target when the
  nemesis pokes it (``next_step``, the same rule a balancer follows): drop a learner not
  in the target; promote a learner of the target once it holds the leader's commit
  offset; add a missing target broker as a learner; remove a voter not in the target
  (the leader hands leadership to a target voter first); reorder. Refused steps
  (pending change, epoch marker not committed) are simply retried later.
- Gossip is played by a registry: after each turn's sync, the configs a *leader* reports
  (``Ready.configs``) are registered. A broker named by the newest registered config
  starts hosting the partition (after a seeded gossip delay) with that config; a broker
  drops its replica (core and data) by the product's rule (``mesh.cluster.configs``
  rule 3, ``keep_local``, checked each turn for a replica the newest register does not
  name): no leader reached it for ``stray_quiet_ms``, and its own log says it is a learner
  or removed, or the register is committed, at least as new, and does not name it. (With
  only the second half, an orphan learner of a deposed leader's discarded config was
  never dropped: about 2% of the balance simulator's seeds never settled.)
- A leader also rewrites a register that disagrees with its own log, at each nemesis poke
  (``mesh.node.ops.elastic._repair_registers``, once a second in the product). Without it the
  newest register could stay a deposed leader's uncommitted config naming a learner the
  current leader (an older version) never had: that learner was neither caught up nor
  dropped (about 1 seed in 500, e.g. 8497).

Invariants, after every step, besides the base simulator's (one leader per epoch, no
committed batch changes or disappears, leader completeness, state = what was persisted):
- the committed configs form one history: never two different configs committed with
  the same version (every replica's reports count, leaders' and followers');
- after the heal phase (faults and clients stop, the targets stay): every partition has
  exactly its target voters, no learners, a committed config and a leader; then the base
  liveness checks run over the target replicas (convergence, a new write per partition
  commits, every acknowledged batch present, leadership on the preferred replica).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from mesh.cluster.configs import PartitionConfig, keep_local
from mesh.raft import Config, Role
from mesh.testing.seeds import run_seeds
from mesh.wire.errors import MeshError
from tests.sim.replication_store import SimFailure
from tests.sim.replication_world import US, Node, Sim, SimConfig

__all__ = ["ReconfigConfig", "ReconfigSim", "next_step", "targets_reached", "finish", "run", "main"]


@dataclass
class ReconfigConfig(SimConfig):
    brokers: int = 5                   # the pool
    partitions: int = 6
    rf: int = 3
    move_gap_ms: tuple[int, int] = (50, 400)   # between nemesis pokes
    retarget_p: float = 0.15           # a poke redraws one partition's target
    gossip_ms: tuple[int, int] = (20, 300)
    settle_ms: int = 60_000            # targets reached within this after the heal
    stray_quiet_ms: int = 5_000        # mesh.node.ops.elastic's: no leader reached a stray for this long

    def argv(self) -> str:
        return (f"--seed {self.seed} --steps {self.steps} --brokers {self.brokers} "
                f"--partitions {self.partitions} --rf {self.rf}")


def next_step(c: Config, leader: str, target: list[str], caught_up: set[str]) -> tuple | None:
    """The one next single-server step from ``c`` toward ``target`` voters (no learners):
    ``("config", voters, learners)``, ``("transfer", node)`` or None (there, or waiting)."""
    voters, learners = list(c.voters), list(c.learners)
    for lrn in learners:
        if lrn not in target:
            return ("config", tuple(voters), tuple(x for x in learners if x != lrn))
    for lrn in learners:
        if lrn in caught_up:
            before = set(target[:target.index(lrn)])
            pos = sum(1 for v in voters if v in before)
            return ("config", tuple(voters[:pos] + [lrn] + voters[pos:]), tuple(x for x in learners if x != lrn))
    if learners:
        return None  # wait for the learner to catch up
    for t in target:
        if t not in voters:
            return ("config", tuple(voters), (t,))
    for v in voters:
        if v not in target:
            if v != leader:
                return ("config", tuple(x for x in voters if x != v), ())
            succ = [t for t in target if t in caught_up]
            return ("transfer", succ[0]) if succ else None
    if voters != target:
        return ("config", tuple(target), ())
    return None


class ReconfigSim(Sim):
    MODULE = "tests.sim.replication_reconfig"
    def __init__(self, cfg: ReconfigConfig) -> None:
        self.join_cfg: dict[tuple[str, int], Config] = {}       # (node, pid) -> config it joined with
        super().__init__(cfg)
        self.target = {pid: list(self.replicas[pid]) for pid in self.pids}
        self.reg_latest: dict[int, tuple[Config, bool]] = {}    # gossip: the newest config a leader wrote
        self.reg_committed: dict[int, Config] = {}              # gossip: the newest committed one
        self.committed_ids: dict[int, dict[int, tuple]] = {pid: {} for pid in self.pids}
        self.pokes: dict[str, set[int]] = {nid: set() for nid in self.node_ids}
        self.heard: dict[str, set[int]] = {nid: set() for nid in self.node_ids}  # gossip about pids arrived
        self.counts.update({"steps": 0, "refused_steps": 0, "transfers": 0, "joins": 0, "drops": 0,
                            "retargets": 0})
        self.moving = True
        self._at(self._ms(*cfg.move_gap_ms), "move", None)

    def summary(self) -> str:
        c = self.counts
        return (super().summary() + f"; moves: {c['retargets']} retargets, {c['steps']} config steps "
                f"({c['refused_steps']} refused), {c['transfers']} transfers, {c['joins']} joins, "
                f"{c['drops']} drops, committed versions up to "
                f"{max((max(v) for v in self.committed_ids.values() if v), default=0)}")

    # -- the base simulator's hooks --------------------------------------------------------
    def initial_config(self, node: Node, pid: int):
        return self.join_cfg.get((node.id, pid), self.replicas[pid])

    def on_event(self, kind: str, arg) -> None:
        if kind == "move":
            self._move()
            if self.moving or not targets_reached(self):
                self._at(self._ms(*self.cfg.move_gap_ms), "move", None)
        elif kind == "gossip":
            nid, pid = arg
            node = self.nodes[nid]
            if not node.up:
                self._at(self._ms(*self.cfg.gossip_ms), "gossip", arg)  # it hears once it is back
            else:
                self.heard[nid].add(pid)
                self._want_turn(node)
        else:
            super().on_event(kind, arg)

    def shell_turn(self, node: Node, turn) -> None:
        core = node.core
        heard, self.heard[node.id] = self.heard[node.id], set()
        strays = {pid for pid in node.pids
                  if pid in self.reg_latest and node.id not in self.reg_latest[pid][0].members}
        for pid in sorted(heard | strays):  # the hosting rule, against what gossip says now
            if pid in node.pids:
                if self._may_drop(node, pid) and not core.wake_quiet_follower(pid):   # as mesh.node.ops.elastic
                    self._drop(node, pid)
            elif pid in self.reg_latest and node.id in self.reg_latest[pid][0].members:
                self._join(node, pid, self.reg_latest[pid][0])
        pokes, self.pokes[node.id] = self.pokes[node.id], set()
        for pid in sorted(pokes):
            if pid in node.pids and core.role(pid) is Role.LEADER:
                self._step_toward_target(node, turn, pid)

    def configs_durable(self, node: Node, configs: dict) -> None:
        for pid, (c, committed) in sorted(configs.items()):
            if committed:
                seen = self.committed_ids[pid].setdefault(c.version, c.ident)
                if seen != c.ident:
                    self.fail(f"{node.id} p{pid}: config version {c.version} committed as {seen} and as "
                              f"{c.ident}: two histories")
            if pid not in node.pids or node.core.role(pid) is not Role.LEADER:
                continue  # only leaders write the gossip register
            last = self.reg_latest.get(pid)
            if last is None or c.ident >= last[0].ident:
                self.reg_latest[pid] = (c, committed)
            if committed and (pid not in self.reg_committed or c.version >= self.reg_committed[pid].version):
                self.reg_committed[pid] = c
            self._gossip(pid)

    # -- gossip: who hosts what ---------------------------------------------------------------
    def _gossip(self, pid: int) -> None:
        """Every broker hears (after a delay) that the registry changed for ``pid``."""
        for nid in self.node_ids:
            self._at(self._ms(*self.cfg.gossip_ms), "gossip", (nid, pid))

    def _may_drop(self, node: Node, pid: int) -> bool:
        """``mesh.cluster.configs.keep_local`` (rule 3), against the newest register."""
        reg = self.reg_latest.get(pid)
        if reg is None:
            return False
        c, committed = reg
        core = node.core
        mine = core.config(pid)
        silence_ms = core.leader_silence_ticks(pid) * node.tick_us // 1000
        return not keep_local(node.id, PartitionConfig(c.version, c.term, tuple(c.voters), tuple(c.learners),
                                                       committed),
                              (mine.version, tuple(mine.voters), tuple(mine.learners)), silence_ms,
                              self.cfg.stray_quiet_ms)

    def _drop(self, node: Node, pid: int) -> None:
        node.core.remove_partition(pid)
        node.store.drop(pid)
        node.store.sync()  # nothing else of this turn is staged yet
        node.pids.remove(pid)
        node.pending[pid] = []
        self.replicas[pid] = [r for r in self.replicas[pid] if r != node.id]
        self.counts["drops"] += 1

    def _join(self, node: Node, pid: int, c: Config) -> None:
        store = node.store
        if pid in store.live and (store.live[pid].end or store.live_state[pid] is not None
                                  or store.mem.log_start(pid)):
            store.drop(pid)   # stale data of an earlier stay: discarded
            store.sync()
        store.host(pid)
        node.core.add_partition(pid, c, None, 0)
        self.join_cfg[(node.id, pid)] = c
        if pid not in node.pids:  # (the store shares the list: host() may have added it)
            node.pids.append(pid)
        node.pids.sort()
        node.pending[pid] = []
        node.commit_seen[pid] = 0
        self.replicas[pid] = sorted(set(self.replicas[pid]) | {node.id})
        self.counts["joins"] += 1

    # -- the nemesis --------------------------------------------------------------------------
    def _step_toward_target(self, node: Node, turn, pid: int) -> None:
        core = node.core
        c = core.config(pid)
        fol = core.followers(pid)
        commit = core.commit_offset(pid)
        caught = {n for n, m in fol.items() if m >= commit} | {node.id}
        step = next_step(c, node.id, self.target[pid], caught)
        if step is None:
            return
        try:
            if step[0] == "transfer":
                self._apply(node, turn, core.transfer_leadership(pid, step[1]))
                self.counts["transfers"] += 1
            else:
                self._apply(node, turn, core.propose_config(pid, step[1], step[2]))
                self.counts["steps"] += 1
        except MeshError:
            self.counts["refused_steps"] += 1

    def _leader_of(self, pid: int) -> str | None:
        for nid in self.node_ids:
            node = self.nodes[nid]
            if node.up and pid in node.pids and node.core.role(pid) is Role.LEADER:
                return nid
        return None

    def _repair_registry(self) -> None:
        """``mesh.node.ops.elastic._repair_registers``: a leader rewrites a register that disagrees
        with its own log (a deposed leader's uncommitted config, say)."""
        for pid in self.pids:
            lead = self._leader_of(pid)
            if lead is None:
                continue
            core = self.nodes[lead].core
            c, committed = core.config(pid), not core.config_pending(pid)
            reg = self.reg_latest.get(pid)
            if (reg is None and c.version > 0) or (reg is not None and reg != (c, committed)):
                self.reg_latest[pid] = (c, committed)
                self._gossip(pid)

    def _move(self) -> None:
        self._repair_registry()
        if self.moving and self.rng.random() < self.cfg.retarget_p * len(self.pids):
            pid = self.rng.choice(self.pids)
            self.target[pid] = self.rng.sample(self.node_ids, min(self.cfg.rf, len(self.node_ids)))
            self.counts["retargets"] += 1
        for pid in self.pids:
            if self.rng.random() < 0.1:
                self._gossip(pid)  # anti-entropy: gossip keeps repeating what it holds
            for nid in self.replicas[pid]:
                node = self.nodes[nid]
                if node.up and pid in node.pids and node.core.role(pid) is Role.LEADER:
                    self.pokes[nid].add(pid)
                    self._want_turn(node)


def run(cfg: ReconfigConfig) -> ReconfigSim:
    sim = ReconfigSim(cfg)
    try:
        sim.run_steps(cfg.steps)
        finish(sim)
    except SimFailure:
        raise
    except Exception as exc:
        raise SimFailure(f"seed {cfg.seed}, t={sim.now_us / 1e6:.3f}s, step {sim.steps_done}: "
                         f"{type(exc).__name__}: {exc}\n"
                         f"reproduce with: python -m tests.sim.replication_reconfig {cfg.argv()}") from exc
    return sim


def targets_reached(sim: ReconfigSim) -> bool:
    for pid in sim.pids:
        lead = [sim.nodes[r] for r in sim.replicas[pid]
                if sim.nodes[r].up and pid in sim.nodes[r].pids and sim.nodes[r].core.role(pid) is Role.LEADER]
        if len(lead) != 1:
            return False
        c = lead[0].core.config(pid)
        if list(c.voters) != sim.target[pid] or c.learners or lead[0].core.config_pending(pid):
            return False
        if sorted(sim.replicas[pid]) != sorted(sim.target[pid]):
            return False  # a removed replica not dropped yet
    return True


def finish(sim: ReconfigSim) -> None:
    cfg = sim.cfg
    sim.heal()
    sim.moving = False
    sim.run_until(lambda: targets_reached(sim), cfg.settle_ms * US, "every partition on its target voters")
    for pid in sim.pids:
        sim.replicas[pid] = list(sim.target[pid])  # the base checks run over the target replicas
    Sim.finish(sim)  # the base final phase: convergence, a new write per partition, the logs, preferred leaders


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.replication_reconfig",
                                description="Replication simulation with a reconfiguration nemesis.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--brokers", type=int, default=5)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    return run_seeds(args.seed, args.seeds, lambda seed: run(ReconfigConfig(
        seed=seed, steps=args.steps, brokers=args.brokers, partitions=args.partitions, rf=args.rf)),
        failure=SimFailure, quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
