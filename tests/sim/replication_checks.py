"""The replication simulator's checkers: invariants after every Ready and turn, liveness at the end.

A mixin of ``Sim`` (tests/sim/replication_world.py); each check calls ``self.fail``, which
raises ``SimFailure`` with the command that reproduces the run.

- committed batches never change or disappear: every replica's log, up to its commit
  offset, equals the canonical committed log (``_check_committed``);
- leader completeness: a new leader of epoch E holds every batch committed before E;
- the core's state matches what it asked to persist, and its epoch cache matches the
  epochs stored in the batches (``_check_replica``);
- final: identical logs, every acknowledged batch present (``_check_final_logs``);
  ``converged`` and ``balanced`` are the liveness conditions;
- disk faults (issue 17): a replica whose disk was wiped, rolled back or cut for corruption
  must hold again what it may have acknowledged (``Node.lost``: the lowest commit offset
  of the other replicas at the fault, or its own commit before a corruption cut) before
  it is elected (``_check_not_lost``), and a leader that heard from its new life never
  counts it beyond what it durably holds (``_check_counted``).
(Election safety is checked where leaderships are reported, in ``Sim._apply``.)
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from mesh.raft import PersistState, Role

if TYPE_CHECKING:
    from tests.sim.replication_world import Node

__all__ = ["Checkers"]


class Checkers:
    """Invariant checks over a ``Sim``'s nodes, canonical logs and acknowledged batches
    (it reads ``nodes``, ``pids``, ``replicas``, ``canon``, ``canon_term``, ``acked`` and
    calls ``fail``)."""

    def _check_committed(self, node: Node, pid: int, commit: int, term: int = 0) -> None:
        """The node's log below ``commit`` must equal the canonical committed log; what it
        has beyond the canonical end becomes canonical."""
        log, canon = node.store.live[pid], self.canon[pid]
        if commit > log.end:
            self.fail(f"{node.id} p{pid}: commit {commit} beyond its log end {log.end}")
        if commit <= log.start:
            return
        if not log.is_boundary(commit):
            self.fail(f"{node.id} p{pid}: commit {commit} is not a batch boundary")
        mine = log.upto(commit)
        ci = bisect.bisect_left(canon.bases, log.start)
        if log.start > canon.end or (log.start < canon.end and canon.bases[ci] != log.start):
            self.fail(f"{node.id} p{pid}: log start {log.start} does not line up with the committed log "
                      f"(ends {canon.end})")
        k = min(len(mine), len(canon.batches) - ci)
        if mine[:k] != canon.batches[ci:ci + k]:
            bad = next(i for i in range(k) if mine[i] != canon.batches[ci + i])
            self.fail(f"{node.id} p{pid}: committed batch at {mine[bad][0]} differs from the committed "
                      f"log: {mine[bad][:3]} vs {canon.batches[ci + bad][:3]}")
        if len(mine) > k:
            canon.append(mine[k:])
            self.canon_term[pid].extend([term] * (len(mine) - k))

    def _check_leader_completeness(self, node: Node, pid: int, epoch: int) -> None:
        log, canon, terms = node.store.live[pid], self.canon[pid], self.canon_term[pid]
        n = next((i for i, t in enumerate(terms) if t >= epoch), len(terms))
        upto = canon.batches[n - 1][1] if n else 0
        if upto <= log.start:
            return
        if log.end < upto or log.upto(upto) != canon.batches[bisect.bisect_left(canon.bases, log.start):n]:
            self.fail(f"leader completeness: {node.id} leads p{pid} in epoch {epoch} without the batches "
                      f"committed before it (committed up to {upto}, its log {log.start}..{log.end})")

    def _check_replica(self, node: Node, pid: int, deep: bool) -> None:
        """The core's state is what it asked to persist; with ``deep``, its epoch cache also
        matches the epochs of the stored batches."""
        core, log = node.core, node.store.live[pid]
        now = core.state(pid)
        end = core.end_offset(pid)
        if end != log.end or now.commit > end:
            self.fail(f"{node.id} p{pid}: core end {end} commit {now.commit}, log ends {log.end}")
        saved = node.store.live_state[pid]
        fresh = len(now.configs) == 1 and now.configs[0][1].version == 0  # the initial config, never persisted
        if saved != now and not (saved is None and fresh and now == PersistState(pid, 0, None, 0, (), False, now.configs)):
            self.fail(f"{node.id} p{pid}: persisted {saved} but the core holds {now}")
        cache = now.epoch_cache
        if cache and cache[-1][0] > now.term:
            self.fail(f"{node.id} p{pid}: epoch cache {cache} ahead of term {now.term}")
        if not deep:
            return
        # every stored batch carries the epoch the cache says (batch epochs never decrease
        # along a log - checked at append - so the first and last batch of each range suffice)
        if log.batches and not cache:
            self.fail(f"{node.id} p{pid}: batches but an empty epoch cache")
        for i, (epoch, start) in enumerate(cache):
            lo = bisect.bisect_left(log.bases, start) if i else 0
            hi = bisect.bisect_left(log.bases, cache[i + 1][1]) if i + 1 < len(cache) else len(log.bases)
            for j in (lo, hi - 1) if lo < hi else ():
                if log.batches[j][2] != epoch:
                    self.fail(f"{node.id} p{pid}: batch at {log.bases[j]} has epoch {log.batches[j][2]}, "
                              f"epoch cache {cache}")

    def _still_lost(self, node: Node, pid: int) -> bool:
        mark = node.lost.get(pid)
        if mark is None:
            return False
        if node.store.durable[pid].end >= mark:
            del node.lost[pid]
            return False
        return True

    def _check_not_lost(self, node: Node, pid: int, what: str) -> None:
        if self._still_lost(node, pid):
            self.fail(f"{node.id} p{pid}: {what} with lost state: its log ends at "
                      f"{node.store.durable[pid].end}, it may have acknowledged up to {node.lost[pid]}")

    def _check_counted(self, lead: Node, pid: int) -> None:
        """A commit on ``lead``: no follower that lost state is counted beyond what it holds."""
        for r in self.replicas[pid]:
            f = self.nodes[r]
            if r == lead.id or not f.up or not self._still_lost(f, pid):
                continue
            if (lead.core.peer_identity(r) != (f.store.store_id, f.core.life) or pid in f.cut
                    or f.core.leader(pid)[1] != lead.core.leader(pid)[1]):
                continue  # acks from before the damage, or a leader of an older term: honest then
            fs = lead.core.status(pid)["followers"][r]
            if not fs["recovering"] and fs["match"] > f.store.durable[pid].end:
                self.fail(f"{lead.id} p{pid}: counts {r} at {fs['match']}, which lost state and holds "
                          f"{f.store.durable[pid].end}")

    def converged(self) -> bool:
        for pid in self.pids:
            reps = [self.nodes[r] for r in self.replicas[pid]]
            if not all(n.up for n in reps):
                return False
            leaders = [n for n in reps if n.core.role(pid) is Role.LEADER]
            if len(leaders) != 1:
                return False
            lead = leaders[0]
            view = lead.core.leader(pid)
            end = lead.core.end_offset(pid)
            for n in reps:
                if n.core.leader(pid) != view or n.core.end_offset(pid) != end or n.core.commit_offset(pid) != end:
                    return False
        return True

    def balanced(self) -> bool:
        return all(self.nodes[self.replicas[pid][0]].core.role(pid) is Role.LEADER for pid in self.pids)


    def _check_final_logs(self) -> None:
        for pid in self.pids:
            canon = self.canon[pid]
            for r in self.replicas[pid]:
                node = self.nodes[r]
                self._check_committed(node, pid, node.core.commit_offset(pid))
                log = node.store.live[pid]
                if log.end != canon.end:
                    self.fail(f"{r} p{pid}: log ends at {log.end}, the committed log at {canon.end}")
        for key, (pid, base, end, raw) in sorted(self.acked.items()):
            canon = self.canon[pid]
            i = bisect.bisect_left(canon.bases, base)
            if i == len(canon.bases) or canon.batches[i][3] != raw:
                self.fail(f"acknowledged batch {key} (p{pid} at {base}) is not in the committed log")
            for r in self.replicas[pid]:
                log = self.nodes[r].store.live[pid]
                if base >= log.start:
                    j = bisect.bisect_left(log.bases, base)
                    if j == len(log.bases) or log.batches[j][3] != raw:
                        self.fail(f"acknowledged batch {key} (p{pid} at {base}) is missing on {r}")
