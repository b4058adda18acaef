"""Data follows membership: this node's part of the self-balancing cluster (issue 14).

No broker is special. Every broker holds the whole gossiped picture; for each partition it
*leads*, it compares the partition's replica set with the target that
``mesh.cluster.balance`` computes from that picture (every broker would compute the same),
and drives the partition one Raft single-server change at a time toward it
(``mesh.raft.membership``: add a learner, promote it once caught up, remove the replica it
replaces; the leader hands over first when it is the one leaving). This module decides
nothing itself: it builds the balancer's inputs, carries out its steps, and tells the
cluster what changed. Once a turn (``tick``, before the turn's commit, so proposals share
the turn's sync):

1. publish: each config change the replication host made durable (``take_config_changes``)
   of a partition led here goes to the cluster register ``pconf/<topic>/<uuid>/<p>``
   (``mesh.cluster.configs``: where every broker learns where replicas live; a new
   learner's broker starts hosting it from there); every ``interval_ms`` a register that
   disagrees with the leader's own config is rewritten (a deposed leader's late write);
2. every ``interval_ms`` (sooner, at most every ``_MIN_ROUND_MS``, after one of our
   partitions committed a config change, so a move's steps follow each other quickly;
   later when a round is costly: the next one waits ``_COST_FACTOR`` times its cost, so
   rounds take at most a tenth of the loop however many partitions there are; at 10,000
   a round took 150-430 ms of a busy broker, once a second while a new topic's leaders
   were gossiped): the broker view (alive, draining, dead for how long: judged
   here, from when this node first saw it not alive; a broker gossip no longer lists at
   all counts as dead since then), the partition view (the led partitions from the
   replication core, the others from gossip), the balancer's steps for the partitions led
   here, carried out (a refused step, e.g. a change still pending, waits for the next
   round; a round that found nothing to do is not repeated until the gossip version or
   the partitions led here change, so an idle large cluster costs nothing here); a
   finished manual reassignment's register is deleted; local replicas that no
   config names any more are dropped on evidence (``mesh.cluster.configs`` rule 3); this node's ``load``
   (disk bytes, replica and leader counts) is published when it changed.

Bounds: the balancer admits at most ``max_moves_per_broker`` moves per source and target
broker; catch-up traffic to learners is capped by the replication core's byte budget
(``--move-rate-bytes``); at most ``_MAX_STEPS_PER_ROUND`` steps per round.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from mesh.cluster import keys
from mesh.cluster.balance import BalanceSettings, BrokerInfo, PartitionInfo
from mesh.cluster.balance_steps import (AddLearner, Balancer, Led, Promote, RemoveLearner, RemoveVoter, Reorder,
                                        Transfer, live_for_removal)
from mesh.cluster.catalog import cluster_pid
from mesh.cluster.configs import PartitionConfig, keep_local
from mesh.cluster.liveness import is_up
from mesh.raft.membership import Config
from mesh.wire.errors import MeshError

__all__ = ["Elastic", "ElasticSettings", "raft_config"]

log = logging.getLogger("mesh.node.ops.elastic")

_MAX_STEPS_PER_ROUND = 64
_MIN_ROUND_MS = 100        # a committed step brings the next round forward, to at most this often
_COST_FACTOR = 10          # ... and a round that took c ms is followed by the next no sooner than 10 c
_MAX_ROUND_GAP_MS = 30_000   # (a wall clock that jumped mid-round does not stop balancing for long)


@dataclass(frozen=True, slots=True)
class ElasticSettings:
    interval_ms: int = 1_000
    replace_dead_after_ms: int = 600_000
    max_moves_per_broker: int = 4
    enabled: bool = True
    stray_quiet_ms: int = 5_000      # a replica no leader reached for this long may be a stray


def raft_config(c: PartitionConfig) -> Config:
    """The replication core's config for a gossiped one (a new replica's starting point;
    its own log's history wins once it has one)."""
    return Config(c.version, c.term, tuple(c.voters), tuple(c.learners))


class Elastic:
    def __init__(self, node_id: str, gossip, catalog, replicas, store, wall_ms: Callable[[], int],
                 settings: ElasticSettings | None = None,
                 leader_of: Callable[[Any, int], str | None] = lambda t, p: None,
                 drop: Callable[[int], None] = lambda pid: None) -> None:
        """``leader_of(topic row, partition)``: who leads it, as the leader view says;
        ``drop(pid)``: forget a local replica and its data in the turn's transaction."""
        self.node_id = node_id
        self.gossip = gossip
        self.catalog = catalog
        self.replicas = replicas
        self.store = store
        self.wall_ms = wall_ms
        self.settings = settings or ElasticSettings()
        self.leader_of = leader_of
        self.drop = drop
        self.balance_settings = BalanceSettings(replace_dead_after_ms=self.settings.replace_dead_after_ms,
                                                max_moves_per_broker=self.settings.max_moves_per_broker)
        self._next_ms = 0
        self._last_ms = -_MIN_ROUND_MS
        self._gap_ms = _MIN_ROUND_MS      # the least time between two rounds (their cost sets it)
        self._dead_since: dict[str, int] = {}
        self._surplus_since: dict[int, int] = {}   # pid -> replication tick its leader (here) first saw surplus voters
        self._load: Any = None
        self._targets: dict[int, tuple[str, ...]] = {}   # pid -> target, as of the last round (moves)
        self._quiet: tuple | None = None   # (gossip version, led pids) of the last idle round
        self.steps_taken = 0
        self.steps_refused = 0

    # -- the turn -----------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        changes = self.replicas.take_config_changes()
        if changes:
            self._publish(changes)
            if any(committed for _, committed in changes.values()):   # a step done: the next one soon
                self._next_ms = min(self._next_ms, max(self._last_ms + self._gap_ms, now_ms))
        if now_ms < self._next_ms:
            return
        started_ms = self.wall_ms()
        self._last_ms = now_ms
        self._repair_registers()
        self._drop_strays()
        self._publish_load()
        if self.settings.enabled:
            self._balance(now_ms)
        cost_ms = self.wall_ms() - started_ms
        self._gap_ms = min(_MAX_ROUND_GAP_MS, max(_MIN_ROUND_MS, _COST_FACTOR * cost_ms))
        self._next_ms = now_ms + max(self.settings.interval_ms, self._gap_ms)

    def _where(self, pid: int):
        """(topic row, partition) of a local pid, or None."""
        where = self.catalog.local.get(pid)
        if where is None:
            return None
        t = self.catalog.topics.get(where[0])
        return None if t is None else (t, where[1])

    def _publish(self, changes: dict) -> None:
        for pid, (cfg, committed) in sorted(changes.items()):
            where = self._where(pid)
            if where is None or not self.replicas.is_leader(pid):
                continue
            t, p = where
            key = keys.pconf_key(t.name, t.uuid, p)
            if cfg.version == 0:   # the topic's table: a register could only be a discarded change
                if self.gossip.cluster_items(key).get(key) is not None:
                    self.gossip.delete_cluster(key)
                continue
            value = PartitionConfig(cfg.version, cfg.term, tuple(cfg.voters), tuple(cfg.learners), committed).value()
            self.gossip.put_cluster(key, value)
            log.info("%s/%d: replicas %s%s (config %d, %s)", t.name, p, ",".join(cfg.voters),
                     (" + learners " + ",".join(cfg.learners)) if cfg.learners else "", cfg.version,
                     "committed" if committed else "proposed")

    def _repair_registers(self) -> None:
        """Rule 1: a ``pconf/`` register of a partition led here says what its log says."""
        fixes = {}
        for pid in self.replicas.leaders():
            where = self._where(pid)
            if where is None:
                continue
            t, p = where
            cfg = self.replicas.config(pid)
            committed = not self.replicas.config_pending(pid)
            have = t.config_of(p)
            if cfg.version == 0 and have.version == 0:
                continue                                   # the topic's table says it already
            if (have.version, have.voters, have.learners, have.committed) != \
                    (cfg.version, tuple(cfg.voters), tuple(cfg.learners), committed):
                fixes[pid] = (cfg, committed)
        self._publish(fixes)

    def _drop_strays(self) -> None:
        """``mesh.cluster.configs`` rule 3: a local replica the effective config does not name
        goes once its own log and its leader's silence agree."""
        for pid in self.catalog.strays():
            where = self._where(pid)
            if where is None:
                continue
            t, p = where
            if not keep_local(self.node_id, t.config_of(p), self.replicas.local_config(pid),
                              self.replicas.leader_silence_ms(pid), self.settings.stray_quiet_ms):
                if not self.replicas.wake_quiet_follower(pid):   # a quiet follower's silence is no evidence
                    self.drop(pid)

    def _publish_load(self) -> None:
        leaders = len(self.replicas.leaders())
        load = {"bytes": sum(self.store.size_bytes(pid) for pid in self.catalog.local),
                "replicas": len(self.catalog.local), "leaders": leaders}
        if load != self._load:
            self._load = load
            self.gossip.set_local(keys.LOAD_KEY, load)

    # -- the view -----------------------------------------------------------------------
    def broker_view(self, now_ms: int, named: set[str]) -> list[BrokerInfo]:
        """Every broker gossip lists, plus those ``named`` by a config but unknown here."""
        states = {k[len(keys.BROKER_PREFIX):]: v.get("state") for k, v in
                  self.gossip.cluster_items(keys.BROKER_PREFIX).items() if isinstance(v, dict)}
        seen: dict[str, bool] = {m.node_id: is_up(m.status) for m in self.gossip.members(now_ms)}
        out = []
        for node in sorted(set(seen) | named):
            alive = seen.get(node, False)
            if alive:
                self._dead_since.pop(node, None)
                dead_ms = 0
            else:
                dead_ms = now_ms - self._dead_since.setdefault(node, now_ms)
            load = self.gossip.node_items(node, keys.LOAD_KEY).get(keys.LOAD_KEY) if node in seen else None
            out.append(BrokerInfo(node_id=node, alive=alive, draining=states.get(node) == "draining",
                                  dead_ms=dead_ms, disk_bytes=load["bytes"] if isinstance(load, dict) else 0))
        return out

    def partition_view(self) -> tuple[list[PartitionInfo], set[str]]:
        pins = {}
        for key, v in self.gossip.cluster_items(keys.REASSIGN_PREFIX).items():
            parsed = keys.parse_partition_key(key, keys.REASSIGN_PREFIX)
            if parsed is not None and isinstance(v, dict):
                pins[parsed] = tuple(v["replicas"])
        led = set(self.replicas.leaders())
        parts: list[PartitionInfo] = []
        named: set[str] = set()
        for name in sorted(self.catalog.topics):
            t = self.catalog.topics[name]
            for p in range(t.partitions):
                pid = cluster_pid(t.uuid, p)
                c = t.config_of(p)
                named.update(c.voters)
                named.update(c.learners)
                leader = self.node_id if pid in led else self.leader_of(t, p)
                parts.append(PartitionInfo(pid=pid, topic=name, partition=p, rf=t.replication_factor,
                                           voters=c.voters, learners=c.learners, pinned=pins.get((name, t.uuid, p)),
                                           size_bytes=self.store.size_bytes(pid) if pid in self.catalog.local else 0,
                                           leader=leader, version=c.version))
        return parts, named

    # -- balancing ----------------------------------------------------------------------
    def _balance(self, now_ms: int) -> None:
        led = self.replicas.leaders()
        if not led:
            return
        quiet = (self.gossip.version, tuple(led))
        if quiet == self._quiet:
            return                        # nothing it depends on moved since a round that did nothing
        parts, named = self.partition_view()
        brokers = self.broker_view(now_ms, named)
        balancer = Balancer(brokers, parts, self.balance_settings)
        self._targets = balancer.targets
        by_pid = {pi.pid: pi for pi in parts}
        mine = []
        window, tick = 2 * self.replicas.cfg.heartbeat_ticks + 1, self.replicas.now_tick   # two beats missed: not live
        surplus = {}
        for pid in led:
            pi = by_pid.get(pid)
            if pi is None or pid not in self.catalog.local or self.replicas.config_pending(pid):
                continue
            c = self.replicas.config(pid)     # the leader's own (latest) config, not gossip's
            silence = self.replicas.follower_silence(pid)
            if len(c.voters) > len(self._targets.get(pid) or c.voters):
                surplus[pid] = self._surplus_since.get(pid, tick)
            mine.append(Led(partition=PartitionInfo(
                pid=pid, topic=pi.topic, partition=pi.partition, rf=pi.rf, voters=tuple(c.voters),
                learners=tuple(c.learners), pinned=pi.pinned, size_bytes=pi.size_bytes, leader=self.node_id,
                version=c.version), match=self.replicas.followers(pid), end_offset=self.store.log_end(pid),
                active=live_for_removal(silence, tick, surplus.get(pid), window), silence=silence))
        self._surplus_since = surplus
        steps = balancer.steps(self.node_id, mine)
        for pid, step in steps[:_MAX_STEPS_PER_ROUND]:
            self._carry_out(pid, step)
        self._finish_reassignments(parts)
        # idle (no step, no move of ours under way, no dead broker whose timer runs): the next
        # round can only differ once gossip or our leaderships move, so skip it until then
        idle = (not steps and not self._dead_since and len(mine) == len(led)
                and not any(x.partition.learners for x in mine)
                and not surplus)   # a shrink held back (a voter not heard lately): ask again
        self._quiet = quiet if idle else None

    def _carry_out(self, pid: int, step) -> None:
        cfg = self.replicas.config(pid)
        voters, learners = tuple(cfg.voters), tuple(cfg.learners)
        try:
            if isinstance(step, Transfer):
                self.replicas.transfer_leadership(pid, step.node)
            elif isinstance(step, AddLearner):
                self.replicas.propose_config(pid, voters, learners + (step.node,))
            elif isinstance(step, Promote):
                self.replicas.propose_config(pid, tuple(step.voters), tuple(x for x in learners if x != step.node))
            elif isinstance(step, RemoveLearner):
                self.replicas.propose_config(pid, voters, tuple(x for x in learners if x != step.node))
            elif isinstance(step, RemoveVoter):
                self.replicas.propose_config(pid, tuple(x for x in voters if x != step.node), learners)
            elif isinstance(step, Reorder):
                self.replicas.propose_config(pid, tuple(step.voters), learners)
            else:
                return
        except MeshError as exc:
            self.steps_refused += 1
            log.debug("partition %d: %s refused: %s", pid, step, exc)
            return
        self.steps_taken += 1
        where = self._where(pid)
        if where is not None:
            log.info("%s/%d: %s", where[0].name, where[1], step)

    def _finish_reassignments(self, parts: list[PartitionInfo]) -> None:
        for pi in parts:
            if pi.pinned is None or not self.replicas.is_leader(pi.pid):
                continue
            if pi.voters == pi.pinned and not pi.learners and not self.replicas.config_pending(pi.pid):
                t = self.catalog.topics.get(pi.topic)
                if t is not None:
                    self.gossip.delete_cluster(keys.reassign_key(t.name, t.uuid, pi.partition))
                    log.info("%s/%d: reassignment to %s done", pi.topic, pi.partition, ",".join(pi.pinned))

    # -- moves (ListMoves) --------------------------------------------------------------
    def moves(self, topics: set[str] | None = None) -> list[dict]:
        """The moves partitions led here have in progress: learners being filled, or a
        target that differs from the current voters."""
        out = []
        for pid in self.replicas.leaders():
            where = self._where(pid)
            if where is None or (topics is not None and where[0].name not in topics):
                continue
            t, p = where
            cfg = self.replicas.config(pid)
            target = self._targets.get(pid)
            if not cfg.learners and (target is None or tuple(target) == tuple(cfg.voters)):
                continue
            start, end, size = self.store.log_start(pid), self.store.log_end(pid), self.store.size_bytes(pid)
            match = self.replicas.followers(pid)
            adding = list(cfg.learners)
            copied = remaining = 0
            for node in adding:
                m = max(start, min(match.get(node, 0), end))
                span = max(1, end - start)
                copied += size * (m - start) // span
                remaining += size * (end - m) // span
            reason = "" if target is None else ("rebalance" if set(target) != set(cfg.voters) else "leadership")
            out.append({"topic": t.name, "partition": p, "leader": self.node_id, "voters": list(cfg.voters),
                        "learners": adding, "target": list(target or cfg.voters), "adding": adding,
                        "bytes_copied": copied, "bytes_remaining": remaining, "reason": reason})
        return out
