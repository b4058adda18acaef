"""The node shell: one process, one loop thread, one LMDB environment, one ROUTER socket.

Theory of operation
-------------------
Clients and peers connect to the node's ROUTER with DEALER sockets; the first frame after
the identity names the protocol (``mesh.wire.codec``). The loop decides nothing itself: it
moves messages between the socket, the cores (gossip, raft, groups) and the store, in this
order each turn (``run``, then ``_after_turn``):

1. wait for the ROUTER, at most until the next deadline (a loop tick, the gossip core's
   next round, the earliest parked fetch);
2. drain ready messages (at most ``max_requests_per_turn``, so one busy client cannot
   starve the loop's other duties). Client requests go to their handler
   (``mesh.node.handlers``: admin and metadata, which commit on their own; the data path
   for produce, staged in the turn's transaction, and fetch; the group host for GROUP_*).
   Peer messages go to their core: gossip answers are sent at once (gossip keeps nothing
   that must be durable first), replication effects are staged and their sends held;
3. tick the gossip core (it starts a round when one is due) and send its effects; tick
   the replication cores that are due (effects staged, sends held);
4. if the gossip state moved (not on mere heartbeats): reconcile the topic catalog
   (create/drop local partitions), tell the group host (coordination and offsets may
   have moved) and stage the gossip snapshot;
5. publish this node's partition stats to gossip (every ``stats_every_ms``);
6. tick the group host;
7. every ``retention_check_ms``, stage retention (``DataPath.enforce_retention``) into
   the turn's transaction (a failure there dooms the turn like any other write);
8. commit the turn's LMDB transaction with one sync (group commit), then answer the
   staged produce requests, send the held replication messages, publish leadership
   changes and answer acks=all requests now committed (``DataPath.commit_turn``);
9. wake parked fetches whose partitions grew, expire acks=all waits, answer fetches whose
   wait is over (``DataPath.after_turn``).

A storage error in steps 3-9 fails the turn, not the broker: the transaction is rolled back
and the replication core rebuilt from disk (it had run ahead of it).

Nothing a client or a peer sends can crash the loop: each message is handled inside a
guard (``mesh.node.dispatch``, which also owns the ROUTER socket).

Identity (``storage.datadir``): the data directory is locked (a second broker on it is
refused) and ``data.mdb`` checked before LMDB opens it. The node id is stable; each store
has a store id (random, created with the store); the generation is incremented and synced
(LMDB, then ``identity.json``) before the node says anything, so each life of a node is
newer than the last. A store older than its identity file says, or empty, *lost state*:
the node tells the replication core at once (``declare_lost_state``: its replicas refill
from their leaders and are neither counted nor elected before they caught up). A wiped
directory has no identity file: the cluster remembers for it. Until a peer has shown its
view of this node, the core runs unconfirmed (no votes); then either nothing conflicts
(``confirm_identity``) or a peer remembers a newer life of this node (gossip's
``identity_conflict``): the node persists a generation above it, starts speaking as that
generation (``Gossip.reincarnate``) and declares lost state. Corrupt batches found by the
store (on read, at recovery) go to the core once each (``report_corrupt``).
"""
from __future__ import annotations

import logging
import os
import random
import signal
from dataclasses import dataclass, field

import msgpack
import zmq

from mesh.cluster import keys
from mesh.cluster.catalog import Catalog
from mesh.cluster.leaders import lead_claims
from mesh.gossip import Gossip, GossipConfig
from mesh.node.clock import SYSTEM_CLOCK, Clock
from mesh.node.datapath import DataPath
from mesh.node.dispatch import Dispatcher, open_router
from mesh.node.directory import Directory
from mesh.node.group_host import GroupHost, GroupHostConfig
from mesh.node.handlers import ClientHandlers
from mesh.node.peers import PeerLinks
from mesh.node.producer_state import ProducerStates
from mesh.node.raft_host import ReplicaHost
from mesh.raft import ReplicationConfig
from storage.base import LogError
from storage.datadir import open_data_dir, update_identity

__all__ = ["NodeConfig", "Node"]

log = logging.getLogger("mesh.node.loop")


@dataclass
class NodeConfig:
    node_id: str
    bind: str = "127.0.0.1:7101"
    data_dir: str = "data"
    seeds: list[str] = field(default_factory=list)
    max_requests_per_turn: int = 512
    tick_ms: int = 50
    # election timeouts are drawn from [election_ticks, 2 * election_ticks) ticks: 0.7-1.4 s,
    # at least 7 heartbeats (every 2 ticks) without a word from the leader
    election_ticks: int = 14
    retention_check_ms: int = 5_000
    gossip_interval_ms: int = 200
    stats_every_ms: int = 1_000
    map_size_bytes: int = 64 << 30
    sync: bool = True
    hwm_messages: int = 10_000
    text_port: int | None = None
    group_max_session_timeout_ms: int = 10_000   # also the takeover grace of a new coordinator
    group_heartbeat_interval_ms: int = 500
    rejoin_empty: bool = False   # a refused data directory is moved aside; start empty (lost state)


def _seeded_rng() -> random.Random:
    return random.Random(int.from_bytes(os.urandom(8), "big"))


class Node:
    def __init__(self, config: NodeConfig, clock: Clock = SYSTEM_CLOCK):
        self.cfg = config
        self.clock = clock
        self.node_id = config.node_id
        self.address = config.bind
        # lock, check, and a new life: the generation bumped and synced before saying anything
        self.disk = open_data_dir(config.data_dir, config.node_id, rejoin_empty=config.rejoin_empty,
                                  map_size=config.map_size_bytes, sync=config.sync)
        self.store = self.disk.store
        gen = self.generation = self.disk.identity.generation
        self.store_id = self.disk.identity.store_id
        if self.disk.lost is not None:
            log.error("node %s: this store lost state (%s): starting as store %s, generation %d, whose "
                      "replicas refill from their leaders and neither vote nor count before they catch up",
                      config.node_id, self.disk.lost, self.store_id, gen)
        raw = self.store.get("gossip", b"snapshot")
        snapshot = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None
        seeds = [s for s in config.seeds if s != self.address]
        self.gossip = Gossip(config.node_id, self.address, gen, seeds, _seeded_rng(),
                             GossipConfig.lan(interval_ms=config.gossip_interval_ms), clock.wall_ms(),
                             snapshot=snapshot)
        self.gossip.set_local(keys.MEMBER_KEY, {"address": self.address, "text_port": config.text_port,
                                                "store_id": self.store_id})
        self.gossip.hold_heartbeat = True   # heartbeat 0 until a peer is heard: see identity_conflict
        # unconfirmed until a peer shows its view of us; at once if there is nobody to ask
        alone = not seeds and len(self.gossip.members(clock.wall_ms())) <= 1
        self._identity = "lost" if self.disk.lost is not None else ("confirmed" if alone else "unconfirmed")
        self._recovering_published: dict = {}
        self._identity_write_failed = False
        self.catalog = Catalog(config.node_id, self.gossip, self.store)
        self.producers = ProducerStates(self.store)
        self.replicas = ReplicaHost(config.node_id, self.store, self.producers, _seeded_rng(),
                                    self._send_to_node, self._publish_leadership,
                                    ReplicationConfig(election_ticks=config.election_ticks),
                                    tick_ms=config.tick_ms, now_ms=clock.now_ms,
                                    store_id=self.store_id, confirmed=self._identity == "confirmed")
        self.replicas.reply = self._reply
        if self._identity == "lost":
            self.replicas.declare_lost_state()
        self.directory = Directory(config.node_id, self.address, self.gossip, clock.wall_ms,
                                   self._local_leader)
        self.data = DataPath(self.store, self.catalog, self.replicas, self.producers, self._reply,
                             self.directory.leader_address, now_ms=clock.now_ms,
                             address_of=self.directory.address_of)
        self.replicas.address_of = self.directory.address_of  # leader hints for waiting clients
        self.ctx = zmq.Context.instance()
        self.router = open_router(self.ctx, config.bind, config.hwm_messages)
        self.peers = PeerLinks(self.ctx, self.address, config.hwm_messages)
        self.handlers = ClientHandlers(node_id=config.node_id, gossip=self.gossip, catalog=self.catalog,
                                       directory=self.directory, store=self.store, replicas=self.replicas,
                                       data=self.data, peers=self.peers, reply=self._reply, clock=clock,
                                       apply_cluster_change=self._apply_cluster_change,
                                       identity=lambda: self._identity)
        self._running = False
        self._next_retention_ms = 0
        self._seen_version = -1
        self._next_stats_ms = 0
        self._last_stats: dict = {}
        self._isolated_logged = False
        self.groups = GroupHost(
            config.node_id, store=self.store, commit_turn=self.data.commit_turn, gossip=self.gossip,
            reply=self._reply, address_of=self.directory.address_of,
            topic_partitions=lambda: {name: t.partitions for name, t in self.catalog.topics.items()},
            clock=clock, rng=_seeded_rng(), seeded=bool(config.seeds),
            config=GroupHostConfig(max_session_timeout_ms=config.group_max_session_timeout_ms,
                                   heartbeat_interval_ms=config.group_heartbeat_interval_ms))
        self.dispatch = Dispatcher(self.router, self.handlers, self.groups, self.gossip, self.replicas,
                                   self.directory, self._send, self.clock)
        self.text = None   # the telnet text gateway: a client of this node on its own thread
        if config.text_port is not None:
            from mesh.gateway.text import TextGateway
            self.text = TextGateway(self.address, config.text_port,
                                    max_session_timeout_ms=config.group_max_session_timeout_ms,
                                    now_ms=clock.now_ms)
        self._reconcile()

    # -- lifecycle ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def stop(self) -> None:
        self._running = False

    def run(self) -> None:
        self._running = True
        log.info("node %s (generation %d) serving on %s, data in %s, seeds %s", self.node_id,
                 self.generation, self.address, self.cfg.data_dir, ",".join(self.cfg.seeds) or "none")
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        try:
            while self._running:
                try:
                    events = dict(poller.poll(self._poll_timeout_ms()))
                except InterruptedError:
                    continue
                if self.router in events:
                    self._drain()
                try:
                    self._after_turn()
                except LogError as exc:  # e.g. a full disk: fail the turn, not the broker
                    log.error("storage error, turn rolled back: %s", exc)
                    self.data.commit_turn()  # fails: rolls back, rebuilds the replication core
            if self.text is not None:
                self.text.close()  # subscriptions commit and leave their groups first
                self.text = None
            self._send(self.gossip.leave(self.clock.wall_ms()))  # graceful: peers see LEFT at once
            log.info("node %s leaving the cluster", self.node_id)
        finally:
            self.close()

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
        try:
            self._persist_snapshot()
            self.store.commit()
        except LogError:
            self.store.rollback()
        self.peers.flush_and_close()
        self.router.close(linger=0)
        self.store.close()
        self.disk.data_dir.unlock()
        log.info("node %s stopped", self.node_id)

    # -- loop ---------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        t = self.cfg.tick_ms
        d = self.data.next_deadline_ms()
        if d is not None:
            t = min(t, max(0, d - self.clock.now_ms() + 1))
        return max(0, min(t, self.gossip.next_tick_ms - self.clock.wall_ms()))

    def _drain(self) -> None:
        router = self.router
        for _ in range(self.cfg.max_requests_per_turn):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.dispatch.handle(frames)

    def _after_turn(self) -> None:
        now_ms = self.clock.wall_ms()
        self._send(self.gossip.tick(now_ms))
        self.replicas.tick_due()
        self._report_corrupt()
        if self.gossip.version != self._seen_version:
            self._seen_version = self.gossip.version
            self._reconcile()
            self._persist_snapshot()
        if now_ms >= self._next_stats_ms:
            self._next_stats_ms = now_ms + self.cfg.stats_every_ms
            self._publish_stats()
        isolated = self.gossip.isolated
        if isolated and not self._isolated_logged and self.cfg.seeds:
            log.warning("no live peer known: retrying seeds %s with backoff", ",".join(self.cfg.seeds))
        self._isolated_logged = isolated
        self.groups.tick(now_ms)
        mono_ms = self.clock.now_ms()
        if mono_ms >= self._next_retention_ms:
            self._next_retention_ms = mono_ms + self.cfg.retention_check_ms
            self.data.enforce_retention(self.clock.wall_ms())
        self.data.commit_turn()  # the turn's one sync; then acks, replication sends, wake-ups
        self.data.after_turn()
        self._check_identity()

    # -- identity and lost state --------------------------------------------------------
    def _check_identity(self) -> None:
        """At a turn boundary (nothing staged): act on what peers showed of this node."""
        conflict = self.gossip.identity_conflict
        if conflict:
            self._lost_identity(conflict)
        elif self._identity == "unconfirmed" and self.gossip.seen_by_peer:
            self._identity = "confirmed"
            self.replicas.confirm_identity()
            log.info("identity confirmed by a peer: store %s, generation %d (voting)", self.store_id, self.generation)
        if self.disk.identity.recovering and self._identity == "lost" and self._refilled():
            if self._write_identity(recovering=False):
                self._identity = "confirmed"
                log.info("every replica on this node has refilled its lost state: voting again")

    def _write_identity(self, **changes) -> bool:
        """``update_identity`` (LMDB, then identity.json, synced); False if it failed (the
        caller retries on a later turn; logged once)."""
        try:
            update_identity(self.disk, **changes)
        except (LogError, OSError) as exc:
            self.store.rollback()
            if not self._identity_write_failed:
                log.error("could not persist this node's identity (%s): retrying", exc)
            self._identity_write_failed = True
            return False
        self._identity_write_failed = False
        return True

    def _refilled(self) -> bool:
        pids = self.catalog.local
        return bool(pids) and not any(self.replicas.recovering(pid) for pid in pids)

    def _lost_identity(self, conflict: int) -> None:
        """A peer remembers generation ``conflict`` (>= ours) of this node: this store lost
        state. Persist a generation above it (LMDB, then the identity file, synced) before
        speaking as it, then tell the replication core."""
        old = self.generation
        gen = max(conflict, old) + 1
        if not self._write_identity(generation=gen, recovering=True):
            return                                # not durable: do not speak as it yet
        self.gossip.reincarnate(gen, self.clock.wall_ms())
        self.generation = gen
        log.error("node %s: peers remember generation %d of this node, but this store started as generation %d: "
                  "it lost state (wiped or rolled back). Now generation %d; replicas refill from their leaders "
                  "and neither vote nor count before they catch up", self.node_id, conflict, old, gen)
        if self._identity != "lost":
            self._identity = "lost"
            self.replicas.declare_lost_state()
        self._persist_snapshot()

    def _report_corrupt(self) -> None:
        for pid, offset in self.store.take_corrupt():
            if self.replicas.hosts(pid):
                self.replicas.report_corrupt(pid, offset)
            else:
                self.store.corrupt.get(pid, set()).discard(offset)  # found again when hosted and read

    def _send(self, effects) -> None:
        for e in effects:
            self.peers.send(e.dest, e.msg, e.payload)

    def _send_to_node(self, node_id: str, msg, payload) -> None:
        addr = self.directory.address_of(node_id)
        if addr is not None:
            self.peers.send(addr, msg, payload or None)

    def _local_leader(self, pid: int) -> tuple[str | None, int] | None:
        return self.replicas.leader(pid) if self.replicas.hosts(pid) else None

    def _epoch_if_leading(self, pid: int) -> int | None:
        return self.replicas.leader(pid)[1] if self.replicas.is_leader(pid) else None

    def _publish_leadership(self, pid: int, leader: str | None, epoch: int) -> None:
        """Leaders announce themselves in gossip (``lead/<topic>``, see
        ``mesh.cluster.leaders``), so any broker can redirect a client."""
        where = self.catalog.local.get(pid)
        if where is None:
            return
        name, _ = where
        t = self.catalog.topics.get(name)
        led = lead_claims(t, self._epoch_if_leading) if t is not None else {}
        if led:
            self.gossip.set_local(keys.lead_key(name), led)
        elif self.gossip.node_items(self.node_id, keys.lead_key(name)):
            self.gossip.delete_local(keys.lead_key(name))
        if leader is not None:
            log.info("%s/%d: leader %s, epoch %d", name, where[1], leader, epoch)

    def _reconcile(self) -> None:
        added, removed = self.catalog.reconcile()
        for pid in removed:
            self.replicas.remove(pid)
        if removed:
            self.data.forget(removed)
        for pid in sorted(added):
            self.replicas.add(pid, self.catalog.replicas_of(pid))
            log.info("now hosting %s/%d", *self.catalog.local[pid])
        self.groups.on_cluster_change(self.clock.wall_ms())

    def _apply_cluster_change(self) -> bool:
        """After an admin change to gossip: reconcile, persist, commit. False if not durable."""
        self._reconcile()
        self._persist_snapshot()
        return self.data.commit_turn()

    def _persist_snapshot(self) -> None:
        """Stage the gossip state into the turn's transaction, so a restart comes back
        knowing the cluster (and a topic whose creation was acknowledged here survives a
        kill -9 of the whole cluster). The caller commits."""
        try:
            self.store.put("gossip", b"snapshot", msgpack.packb(self.gossip.snapshot(), use_bin_type=True))
        except LogError as exc:
            log.warning("could not persist the gossip snapshot: %s", exc)

    def _publish_stats(self) -> None:
        """Offsets of the partitions led here (``stats``), so any broker can describe them."""
        stats: dict[str, dict[str, list[int]]] = {}
        for pid, (name, p) in sorted(self.catalog.local.items()):
            if self.replicas.is_leader(pid):
                stats.setdefault(name, {})[str(p)] = [self.store.log_start(pid), self.store.log_end(pid),
                                                      self.replicas.commit_offset(pid)]
        if stats != self._last_stats:
            self._last_stats = stats
            self.gossip.set_local(keys.STATS_KEY, stats)
        recovering: dict[str, list[int]] = {}
        for pid, (name, p) in sorted(self.catalog.local.items()):
            if self.replicas.recovering(pid):
                recovering.setdefault(name, []).append(p)
        if recovering != self._recovering_published:
            self._recovering_published = recovering
            if recovering:
                self.gossip.set_local(keys.RECOVERING_KEY, recovering)
            else:
                self.gossip.delete_local(keys.RECOVERING_KEY)

    def _reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        self.dispatch.reply(ident, rid, msg, payload)
