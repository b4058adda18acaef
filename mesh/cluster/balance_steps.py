"""Self-balancing, part 2: the ONE next single-server step a partition's leader takes.

Pure. ``next_step`` compares a partition's current config (as its leader holds it) with
its target (``mesh.cluster.balance.target``) and returns one step or None; the shell
carries it out with ``propose_config`` (``apply_step`` gives the new voters and
learners) or ``transfer_leadership``, and asks again once the change is done. Steps, in
this order of precedence:

1. ``Promote``: a learner in the target that is caught up (its durable match within
   ``catch_up_lag`` of the leader's end) becomes a voter, at its target position; when the
   leader says (``Led.active``), only one not dead in gossip, heard within two heartbeats
   and not recovering (a learner is refilled, and confirmed, before it may vote: on an
   empty partition a learner that had not even answered was "caught up", and promoted, it
   made a 4-voter config that one more failure left without a quorum for good).
2. ``Reorder``: the preferred leader (voters[0]) is not in the target: a target voter goes
   first, so preferred-leader election never pulls leadership back to a broker on its way
   out (a draining one, say).
3. ``Transfer``: the leader itself is not in the target: hand leadership to the target's
   first current voter that is caught up and not dead (a leader never removes itself).
4. ``RemoveVoter``: more voters than the target has: a voter not in the target, never the
   leader; dead ones first, then the least caught up. Only once every target member is a
   voter, so a replacement is always added (learner, promoted) before the replica it
   replaces is removed, also when the target is shorter (a reassignment to fewer brokers,
   or to a dead one that can never be added); no step leaves fewer than min(rf,
   len(target)) voters; and only if a majority of the voters left is the leader or alive
   and caught up: a config without a live quorum has no leader to change it again (a
   shrink of the replication factor that kept a dead preferred replica and removed a live
   one left its partition leaderless for good). Alive means not dead in gossip and, when
   the leader says (``Led.active``, from ``live_for_removal``), heard by the leader since
   it first saw the surplus (so a shrink waits one round for the voters it keeps to
   answer) and within two heartbeats: gossip convicts a broker only 3-5 s after it died,
   and a shrink inside that window counted the dead broker as alive (a broker that dies
   within those two heartbeats of the deciding round can still be kept: a Raft config
   change cannot be taken back once made). Dead, silent and lagging voters go first (the
   longest silent first: ``Led.silence``), and the first whose removal passes this test
   is removed.
5. ``RemoveLearner``: a learner not in the target.
6. ``AddLearner``: the first target member that is neither voter nor learner, at most
   ``max_learners_per_partition`` learners at a time, never on a broker known dead, and
   only if admitted (below).
7. ``Reorder``: the voter set is the target's but the order is not.

Admission (two leaders must not overload one destination): every broker computes the same
targets, so every broker knows every pending addition toward every destination.
``MovesInProgress.queue[dest]`` lists them in one global order (under-replicated partitions
first, then stable rank). A leader adds a learner on ``dest`` only if the moves already
running there (``incoming``: partitions where ``dest`` is a learner) plus the pending ones
ranked ahead of this partition are below ``max_moves_per_broker``, and its own outgoing
moves (partitions it leads that have learners) are below it too. With identical views this
admits exactly the limit; views that lag can each admit up to the limit, so the excess is
bounded by the number of distinct views in flight (the simulator measures it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Iterable, Mapping

from mesh.cluster.balance import BalanceSettings, BrokerInfo, PartitionInfo, stable_rank, target

__all__ = ["AddLearner", "Balancer", "Led", "MovesInProgress", "Promote", "RemoveLearner",
           "RemoveVoter", "Reorder", "Step", "Transfer", "apply_step", "live_for_removal",
           "moves_in_progress", "next_step"]


@dataclass(frozen=True, slots=True)
class AddLearner:
    node: str


@dataclass(frozen=True, slots=True)
class Promote:
    node: str
    voters: tuple[str, ...]          # the new voter list, the learner at its target position


@dataclass(frozen=True, slots=True)
class RemoveLearner:
    node: str


@dataclass(frozen=True, slots=True)
class RemoveVoter:
    node: str


@dataclass(frozen=True, slots=True)
class Reorder:
    voters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    node: str                        # hand leadership to this voter (no config change)


Step = AddLearner | Promote | RemoveLearner | RemoveVoter | Reorder | Transfer


@dataclass(frozen=True, slots=True)
class MovesInProgress:
    incoming: Mapping[str, int] = field(default_factory=dict)   # node -> partitions it learns
    outgoing: Mapping[str, int] = field(default_factory=dict)   # leader -> led ones with learners
    queue: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # dest -> pending pids
    dead: frozenset[str] = frozenset()

    def admits(self, pid: int, dest: str, leader: str, limit: int) -> bool:
        if self.outgoing.get(leader, 0) >= limit:
            return False
        pending = self.queue.get(dest, ())
        try:
            ahead = pending.index(pid)
        except ValueError:
            ahead = len(pending)        # the view has not seen this need yet: last in line
        return self.incoming.get(dest, 0) + ahead < limit


@dataclass(frozen=True, slots=True)
class Led:
    """A partition this broker leads, as its own replica knows it."""
    partition: PartitionInfo         # voters and learners from the local (latest) config
    match: Mapping[str, int]         # follower/learner -> durable match offset
    end_offset: int                  # the leader's log end
    active: AbstractSet[str] | None = None   # followers heard lately, able to vote (live_for_removal) (None: not known)
    silence: Mapping[str, int] | None = None  # ticks since each follower was heard (None: not known)


def live_for_removal(silence: Mapping[str, int], now_tick: int, surplus_since: int | None,
                     window_ticks: int) -> frozenset[str]:
    """``Led.active`` from the leader's ``follower_silence``: the followers heard within
    ``window_ticks`` (two heartbeats) and, while the partition has more voters than its
    target (``surplus_since``: the tick the leader first saw it), heard since then. So a
    shrink waits one round for every voter it keeps to answer: a broker that died just
    before (a shrink and a death at once) has not, whatever gossip says."""
    if surplus_since is not None:
        window_ticks = min(window_ticks, now_tick - surplus_since)
    return frozenset(n for n, ticks in silence.items() if ticks < window_ticks)


def apply_step(voters: tuple[str, ...], learners: tuple[str, ...],
               step: Step) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (voters, learners) a config step leads to (Transfer: unchanged)."""
    if isinstance(step, AddLearner):
        return voters, learners + (step.node,)
    if isinstance(step, Promote):
        return step.voters, tuple(x for x in learners if x != step.node)
    if isinstance(step, RemoveLearner):
        return voters, tuple(x for x in learners if x != step.node)
    if isinstance(step, RemoveVoter):
        return tuple(v for v in voters if v != step.node), learners
    if isinstance(step, Reorder):
        return step.voters, learners
    return voters, learners


def _insert_at_target_position(voters: tuple[str, ...], node: str,
                               tgt: tuple[str, ...]) -> tuple[str, ...]:
    pos = {v: i for i, v in enumerate(tgt)}
    k = pos[node]
    for i, v in enumerate(voters):
        if v in pos and pos[v] > k:
            return voters[:i] + (node,) + voters[i:]
    return voters + (node,)


def next_step(p: PartitionInfo, tgt: tuple[str, ...], leader: str, match: Mapping[str, int],
              leader_end: int, moves: MovesInProgress,
              settings: BalanceSettings = BalanceSettings(), active: AbstractSet[str] | None = None,
              silence: Mapping[str, int] | None = None) -> Step | None:
    """The one next step for partition ``p`` (led by ``leader``) toward ``tgt``, or None.
    ``active``: the followers the leader heard lately (``live_for_removal``; None: unknown,
    gossip's liveness alone); ``silence``: ticks since it heard each (the longest silent
    voter is removed first)."""
    if not tgt or p.pinned is None and not p.voters:
        return None
    voters, learners = p.voters, p.learners
    tset = set(tgt)
    # caught up: within catch_up_lag offsets of the leader's end, and never more than a tenth
    # of the log behind (a young log must be copied, not skipped because it is short)
    floor = leader_end - min(settings.catch_up_lag, leader_end // 10)

    def caught_up(n: str) -> bool:
        return n == leader or match.get(n, -1) >= floor

    for n in sorted((x for x in learners if x in tset), key=tgt.index):
        if caught_up(n) and n not in moves.dead and (active is None or n in active):
            return Promote(n, _insert_at_target_position(voters, n, tgt))
    staying = [v for v in voters if v in tset]
    if voters and voters[0] not in tset and staying:
        first = min(staying, key=tgt.index)
        return Reorder((first,) + tuple(v for v in voters if v != first))
    if leader not in tset:
        for v in tgt:
            if v in voters and v != leader and v not in moves.dead and caught_up(v):
                return Transfer(v)
    if len(voters) > len(tgt) and tset <= set(voters):
        out = [v for v in voters if v not in tset and v != leader]
        if out and len(voters) - 1 >= min(p.rf, len(tgt)):
            quiet = silence or {}
            out.sort(key=lambda v: (v not in moves.dead, active is None or v in active, caught_up(v),
                                    -quiet.get(v, 0), match.get(v, -1), v))
            for gone in out:   # the first whose removal leaves a live quorum
                left = [v for v in voters if v != gone]
                if 2 * sum(1 for v in left if v not in moves.dead and caught_up(v)
                           and (active is None or v == leader or v in active)) > len(left):
                    return RemoveVoter(gone)
    for n in learners:
        if n not in tset:
            return RemoveLearner(n)
    missing = [n for n in tgt if n not in voters and n not in learners and n not in moves.dead]
    if missing:
        if (len(learners) < settings.max_learners_per_partition
                and moves.admits(p.pid, missing[0], leader, settings.max_moves_per_broker)):
            return AddLearner(missing[0])
        return None
    if set(voters) == tset and tuple(voters) != tuple(tgt) and not learners:
        return Reorder(tuple(tgt))
    return None


def moves_in_progress(brokers: Iterable[BrokerInfo], partitions: Iterable[PartitionInfo],
                      targets: Mapping[int, tuple[str, ...]],
                      max_learners_per_partition: int = 1) -> MovesInProgress:
    """Moves running and pending in a view, and the global admission order per destination:
    a partition queues for the one addition it would make next (its first missing target
    member), and only while it has room for another learner and a live leader."""
    info = {b.node_id: b for b in brokers}
    eligible = {n for n, b in info.items() if b.alive and not b.draining}
    dead = frozenset(n for n, b in info.items() if not b.alive)
    incoming: dict[str, int] = {}
    outgoing: dict[str, int] = {}
    wants: dict[str, list[tuple[int, int, int]]] = {}
    for p in sorted(partitions, key=lambda p: p.pid):
        for n in p.learners:
            incoming[n] = incoming.get(n, 0) + 1
        if p.learners and p.leader is not None:
            outgoing[p.leader] = outgoing.get(p.leader, 0) + 1
        tgt = targets.get(p.pid, ())
        if p.leader is None or p.leader in dead:
            continue                  # nobody can act on it now: it must not hold a slot
        healthy = sum(1 for v in p.voters if v in eligible)
        urgent = 0 if healthy < min(p.rf, len(tgt)) else 1
        have = set(p.voters) | set(p.learners)
        missing = [n for n in tgt if n not in have and n not in dead]
        if missing and len(p.learners) < max_learners_per_partition:
            n = missing[0]
            wants.setdefault(n, []).append((urgent, stable_rank(p.pid, n), p.pid))
    queue = {n: tuple(pid for _, _, pid in sorted(lst)) for n, lst in sorted(wants.items())}
    return MovesInProgress(incoming, outgoing, queue, dead)


class Balancer:
    """One view's decisions: targets and admission computed once, steps per leader.

    The shell builds one per view change (or once a second) and calls ``steps`` with the
    partitions this broker leads; each step is for a partition with no change pending."""

    def __init__(self, brokers: Iterable[BrokerInfo], partitions: Iterable[PartitionInfo],
                 settings: BalanceSettings = BalanceSettings()):
        brokers, partitions = list(brokers), list(partitions)
        self.settings = settings
        self.versions = {p.pid: p.version for p in partitions}
        self.targets = target(brokers, partitions, settings)
        self.moves = moves_in_progress(brokers, partitions, self.targets,
                                       settings.max_learners_per_partition)

    def steps(self, node: str, led: Iterable[Led]) -> list[tuple[int, Step]]:
        """(pid, step) for the partitions ``node`` leads, in pid order. Its own outgoing
        moves are counted from its own configs (exact), updated as learners are added.
        A partition whose config in the view is older than the local one is skipped: its
        target was computed from a state its leader has already left, so acting on it could
        undo the last step; the next view (with the change gossiped) decides."""
        led = sorted(led, key=lambda x: x.partition.pid)
        outgoing = sum(1 for x in led if x.partition.learners)
        out: list[tuple[int, Step]] = []
        for x in led:
            tgt = self.targets.get(x.partition.pid)
            if tgt is None or self.versions[x.partition.pid] < x.partition.version:
                continue
            moves = MovesInProgress(self.moves.incoming, {node: outgoing}, self.moves.queue,
                                    self.moves.dead)
            step = next_step(x.partition, tgt, node, x.match, x.end_offset, moves, self.settings, x.active,
                             x.silence)
            if step is None:
                continue
            if isinstance(step, AddLearner):
                outgoing += 1
            out.append((x.partition.pid, step))
        return out
