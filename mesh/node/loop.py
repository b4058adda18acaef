"""The node shell: one process, one loop thread, one LMDB environment, one ROUTER socket.

Theory of operation
-------------------
Clients and peers connect to the node's ROUTER with DEALER sockets; the first frame after
the identity names the protocol (``mesh.wire.codec``). The node is the process around a
broker turn (``mesh.node.turn``, the turn order and its tasks) and its parts (wired by
``mesh.node.wiring``): it opens the store and the sockets, runs the start-up checks, waits
on the ROUTER at most until the next deadline (a loop tick, the gossip core's next round,
the earliest parked fetch), drains ready messages (at most ``max_requests_per_turn`` and
for at most ``max_drain_ms``, so one busy client cannot starve the turn's other duties)
into their handlers (``mesh.node.requests.dispatch``), then runs the turn.

A storage error or any other exception in a step fails the turn, not the broker: the turn
is doomed (``DataPath.doom``), rolled back at its commit, and nothing from it is persisted;
the replication core is rebuilt from disk (it had run ahead of it) and the next good turn
reconciles and persists again. After an exception out of the gossip core, its snapshot is
persisted again only once it loads (``_persist_snapshot``; when: ``mesh.node.replication.snapshot_pace``).
Each failing site writes one traceback per minute (``mesh.node.limits.ratelog``).

Bounds (issue 13): every resource a client can make the node hold has a ``NodeConfig``
field and a ``mesh node`` option: frame size (ZMQ_MAXMSGSIZE: a bigger frame is dropped
by ZeroMQ, with its connection, before it is read), body decoding (``DecodeLimits``),
fetch bytes, waits and parked fetches (``DataLimits``), answers queued per client
(SNDHWM and ``Outbox``), byte-rate quotas, idempotent-producer state, and heartbeats on
peer links (a dead client's pipe goes by the TTL its own PINGs announce: see
``mesh.node.limits.bounds.router_options`` for why the ROUTER has none). RLIMIT_NOFILE's soft
limit is raised to the hard limit at start.

Persisted state that cannot be loaded stops the start with one message (``StartupError``)
saying what and how to recover: a gossip snapshot -> ``--reset-gossip`` (start without it
and relearn the cluster from peers: partitions are neither reconciled nor dropped, and no
snapshot is written, until gossip has been quiet for ``_RELEARN_QUIET_MS`` after a peer
was heard); the replication state -> move the data directory aside and rejoin empty.

Stopping (SIGTERM, SIGINT): Kafka's controlled shutdown (``mesh.node.lifecycle.shutdown``): leaderships
handed over for at most ``shutdown_handover_ms``, then LEFT in gossip; a second signal stops.

Nothing a client or a peer sends can crash the loop: each message is handled inside a
guard (``mesh.node.requests.dispatch``, which also owns the ROUTER socket).

Identity (``storage.datadir``; the rules: ``mesh.node.lifecycle.identity``): the data directory is
locked and ``data.mdb`` checked before LMDB opens it; each life's generation is incremented
and synced (LMDB, then ``identity.json``) before the node says anything. A store older
than its identity file, or empty, or one whose newer life a peer remembers (gossip's
``identity_conflict``) has *lost state*: a generation above it is persisted and spoken
(``Gossip.reincarnate``) and the replication core told (``declare_lost_state``: replicas
refill and neither vote nor count before they caught up). Until a peer has shown its view
of this node, the core runs unconfirmed (no votes); once a majority held this life, a
conflicting row is refuted instead (a forgery, or a second process with this id). Corrupt
batches found by the store go to the core once each (``report_corrupt``).
"""
from __future__ import annotations

import gc
import logging
import signal

import msgpack
import zmq

from mesh.cluster import keys
from mesh.cluster.liveness import is_up
from mesh.gossip import Gossip
from mesh.clock import SYSTEM_CLOCK, Clock
from mesh.node.peers.peer_clock import PeerClock
from mesh.node.config import NodeConfig
from mesh.node.limits.bounds import StartupError, check_bounds, raise_nofile_limit, router_options
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.node.requests.dispatch import open_router
from mesh.node.ops.elastic import raft_config
from mesh.node.ops.membership_log import log_membership_events
from mesh.node.lifecycle.gossip_start import make_gossip, open_gossip, seeded_rng
from mesh.node.lifecycle.identity import BUMP_WINDOW_MS, LOST, Identity
from mesh.node.peers.peers import PeerLinks
from mesh.node.replication.snapshot_pace import SnapshotPace
from mesh.node.lifecycle.shutdown import Shutdown
from mesh.node.lifecycle.sidecars import SidecarError, Sidecars
from mesh.node.data.compactor import Compactor
from mesh.node.turn import BrokerTurn, Task
from mesh.node.wiring import wire_node
from mesh.security.broker import BrokerSecurity, check_text_gateway
from storage.base import LogError
from storage.datadir import open_data_dir, refuse_from_now_on, update_identity

__all__ = ["NodeConfig", "Node", "StartupError"]

log = logging.getLogger("mesh.node.loop")

_RELEARN_QUIET_MS = 2_000      # --reset-gossip: gossip unchanged this long after a peer was heard
_PRODUCER_EXPIRY_CHECK_MS = 1_000   # one slice of the producer states (producer_state.EXPIRE_SLICE)
_ISOLATED_WARN_MS = 5_000      # no live peer this long (seeds set): say so (a start takes a round or two)
# The cyclic collector, set for a broker (CPython's defaults are 700, 10, 10). At 10,000
# partitions a broker holds some 200,000 long-lived objects, and each request that builds
# many short-lived ones (a metadata answer, a 4,096-row replication message) pushed some of
# them into the old generation, so a full collection ran about once a second even on a
# settled cluster asked for metadata: 70-240 ms of the loop each (finding nothing), 10-20% of the
# CPU. Young collections every 50,000 objects: what dies young is freed by refcounting first.
_GC_THRESHOLDS = (50_000, 20, 10)
_DAMAGED_COMMITS = 50          # commits in a row failing on a damaged page: the store is given up
_DAMAGE_MARKS = ("MDB_CORRUPTED", "MDB_PAGE_NOTFOUND")


class Node:
    def __init__(self, config: NodeConfig, clock: Clock = SYSTEM_CLOCK):
        self.cfg = config
        self.clock = clock
        # the clock checked against the peers' (gossip stamps): mesh.node.peers.peer_clock
        self.peer_clock = PeerClock(clock, bound_ms=config.clock_offset_bound_ms)
        self.node_id = config.node_id
        self.address = config.bind
        check_bounds(config)
        raise_nofile_limit()
        self._rlog = RateLimitedLog(log)
        self._gossip_suspect = False
        self._relearning = config.reset_gossip   # --reset-gossip: see _relearned
        self._relearn_quiet_since: int | None = None
        self.ctx = zmq.Context.instance()
        self.security = BrokerSecurity(self.ctx, secrets_dir=config.secrets_dir, superusers=config.superusers,
                                       max_connections=config.max_connections, binds=[config.bind],
                                       max_connections_per_ip=config.max_connections_per_ip,
                                       insecure=config.insecure, topic_names=lambda: self.catalog.topics)
        text_creds = check_text_gateway(self.security, config.bind, config.text_port, config.text_creds)
        self.kafka_listener = None   # (host, port, Kafka node id) with --kafka-port: mesh.kafka.process
        if config.kafka_port is not None:
            from mesh.kafka.process import KafkaError, kafka_listener_of
            try:
                self.kafka_listener = kafka_listener_of(config, self.security.secured, config.insecure)
            except KafkaError as exc:
                raise StartupError(str(exc)) from None
        # lock, check, and a new life: the generation bumped and synced before saying anything
        self.disk = open_data_dir(config.data_dir, config.node_id, rejoin_empty=config.rejoin_empty,
                                  map_size=config.map_size_bytes, sync=config.sync)
        self.store = self.disk.store
        if self.disk.lost is not None:
            log.error("node %s: this store lost state (%s): starting as store %s, generation %d, whose "
                      "replicas refill from their leaders and neither vote nor count before they catch up",
                      config.node_id, self.disk.lost, self.disk.identity.store_id, self.disk.identity.generation)
        seeds = [s for s in config.seeds if s != self.address]
        self.gossip = self._open_gossip(seeds)
        # unconfirmed until a peer shows its view of us; at once if there is nobody to ask
        self.identity = Identity(self.disk.identity.generation, self.disk.identity.store_id,
                                 lost=self.disk.lost is not None,
                                 alone=not seeds and len(self.gossip.members(clock.wall_ms())) <= 1)
        self._identity_write_failed = False
        self.peer_clock.alone = lambda: self.gossip.isolated
        self.router = open_router(self.ctx, config.bind, config.hwm_messages, options=router_options(config),
                                  configure=self.security.configure_router)
        self.peers = PeerLinks(self.ctx, self.address, config.hwm_messages, creds=self.security.peer_creds,
                               heartbeat_ivl_ms=config.heartbeat_ivl_ms,
                               heartbeat_timeout_ms=config.heartbeat_timeout_ms)
        wire_node(self, config, clock, seeded_rng, self.router, self.peers)   # mesh.node.wiring
        if self.identity.state == LOST:
            self.replicas.declare_lost_state()
        self._running = False
        self.fatal: str | None = None     # why the node stopped by itself (a damaged store), if it did
        self.shutdown = Shutdown(self.node_id, self.replicas, config.shutdown_handover_ms)   # SIGTERM's turns
        self.metrics = None   # mesh.node.ops.metrics.NodeMetrics with --metrics-port
        self._seen_version = -1
        self.snapshot_pace = SnapshotPace()   # when the gossip snapshot is staged (mesh.node.replication.snapshot_pace)
        self._isolated_logged = False
        self._isolated_since_ms: int | None = None
        self.compactor = self.handlers.compactor = Compactor(self.store, self.catalog, self.replicas,
                                                             config.compaction_bytes_per_s)
        self.turn = self._make_turn()
        self._start_sidecars(config, text_creds)
        if config.metrics_port is not None:   # /metrics on its own thread (mesh.node.ops.metrics_http)
            from mesh.node.ops.metrics import serve_metrics
            try:
                self.metrics = self.dispatch.metrics = self.data.metrics = serve_metrics(self, config)
            except StartupError:
                self.sidecars.close()   # (serve_metrics released the router and the lock)
                raise

    generation = property(lambda self: self.identity.generation, doc="this life's generation (int)")
    store_id = property(lambda self: self.identity.store_id, doc="this store's id (str)")

    def _open_gossip(self, seeds: list[str]) -> Gossip:
        """The gossip core from its snapshot (``mesh.node.lifecycle.gossip_start``), speaking for this node."""
        try:
            gossip, self._relearning = open_gossip(self.cfg, self.address, self.store, self.disk.identity.generation,
                                                   seeds, self.clock.wall_ms())
        except StartupError:
            self.disk.data_dir.unlock()
            raise
        gossip.set_local(keys.MEMBER_KEY, {"address": self.address, "text_port": self.cfg.text_port,
                                           "store_id": self.disk.identity.store_id})
        if self.kafka_listener is not None:
            host, kport, kid = self.kafka_listener
            gossip.set_local(keys.KAFKA_KEY, {"host": host, "port": kport, "id": kid})
        gossip.hold_heartbeat = True   # heartbeat 0 until a peer is heard: see identity_conflict
        return gossip

    def _start_sidecars(self, config: NodeConfig, text_creds) -> None:
        """The text gateway and the Kafka listener (``mesh.node.lifecycle.sidecars``), then the first
        reconcile; on a failure, what started is closed and the node's resources released."""
        self.sidecars = Sidecars()
        try:
            if config.text_port is not None:   # the telnet text gateway: a client of this node
                from mesh.gateway.process import GatewayError, GatewayProcess
                self.sidecars.start("text gateway", lambda: GatewayProcess.start(
                    self.address, config.text_port, node_id=config.node_id,
                    max_session_timeout_ms=config.group_max_session_timeout_ms,
                    max_connections=config.text_max_connections, idle_timeout_ms=config.text_idle_timeout_ms,
                    evict_idle_ms=config.text_evict_idle_ms, max_subscriptions=config.text_max_subscriptions,
                    creds_path=config.text_creds if text_creds is not None else None), GatewayError)
            if self.kafka_listener is not None:   # the Kafka listener: a client of this node too
                from mesh.kafka.process import KafkaError, KafkaProcess
                self.sidecars.start("kafka listener", lambda: KafkaProcess.start(
                    self.address, *self.kafka_listener, node_id=config.node_id, config=config), KafkaError)
            try:
                self._reconcile()
            except Exception as exc:
                self.sidecars.close()
                raise StartupError(
                    f"the replication state in {config.data_dir} cannot be loaded ({type(exc).__name__}: {exc}). "
                    f"Move the data directory aside (keep it: mv {config.data_dir} {config.data_dir}.damaged) and "
                    "start the node again: it rejoins as an empty replica and refills from its peers (with no "
                    "peers, what it held is only in the moved directory)") from exc
        except (SidecarError, StartupError) as exc:
            self.router.close(linger=0)
            self.disk.data_dir.unlock()
            if isinstance(exc, StartupError):
                raise
            raise StartupError(str(exc)) from exc.__cause__

    def _make_turn(self) -> BrokerTurn:
        """The broker turn (``mesh.node.turn``) with this node's tasks."""
        cfg, mono = self.cfg, lambda: self.clock.now_ms()
        tasks = [
            Task("clock", self._check_clock),
            Task("gossip tick", lambda: self._tick_gossip(self.clock.wall_ms())),
            Task("corrupt batches", self._report_corrupt),
            Task("gossip moved", lambda: self._gossip_moved(self.clock.wall_ms()), guarded=False),
            Task("stats", lambda: self.publish.stats(), period_ms=cfg.stats_every_ms),
            Task("peer links", self._prune_links, period_ms=cfg.stats_every_ms),
            Task("isolation", lambda: self._note_isolation(self.clock.wall_ms()), guarded=False),
            Task("groups", lambda: self.groups.tick(self.clock.wall_ms())),
            # by time only while this clock agrees with the peers' (DESIGN.md section 11)
            Task("retention", lambda: self.data.enforce_retention(self.clock.wall_ms(), self.peer_clock.trusted()),
                 period_ms=cfg.retention_check_ms),
            Task("compaction plan", lambda: self.compactor.plan(self.clock.wall_ms(), self.peer_clock.trusted()),
                 period_ms=cfg.compaction_check_ms),  # compacted topics: the leaders' cuts, then a slice
            Task("compaction", lambda: self.compactor.step(self.clock.now_ms())),
            Task("producer expiry", lambda: self.producers.expire(self.clock.wall_ms()),
                 period_ms=min(_PRODUCER_EXPIRY_CHECK_MS, cfg.producer_id_expiration_ms),
                 when=self.peer_clock.trusted),
            # config changes to gossip; moves (mesh.node.ops.elastic)
            Task("elastic", lambda: self.elastic.tick(self.clock.wall_ms()), when=lambda: not self._relearning),
            Task("hand over", self._hand_over, when=lambda: bool(self.shutdown.asked and self._running)),
            Task("gossip snapshot", self._maybe_snapshot),
            Task("publish", lambda: self.publish.flush()),     # leadership changes of the turn, to gossip
            Task("outbox", lambda: self.outbox.flush(), guarded=False),
            Task("identity", self._check_identity), Task("sidecars", lambda: self.sidecars.supervise(), period_ms=1000),
            Task("metrics", lambda: self.metrics.maybe_refresh(self.clock.now_ms()),   # guarded, read-only
                 when=lambda: self.metrics is not None, guarded=False),
        ]
        return BrokerTurn(self.data, self.replicas, mono, tasks, on_commit=self._committed,
                          on_error=self._step_failed, rlog=self._rlog)

    # -- lifecycle ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def stop(self) -> None:
        """Stop serving: first hand the partitions led here over (``mesh.node.lifecycle.shutdown``, at
        most ``shutdown_handover_ms``); a second call, or 0 ms, stops at the end of this turn."""
        if self.shutdown.ask():
            self._running = False

    def _hand_over(self) -> None:
        gone = {m.node_id for m in self.gossip.members(self.clock.wall_ms()) if not is_up(m.status, strict=True)}
        if self.shutdown.turn(self.clock.now_ms(), gone):
            self._running = False

    def run(self) -> None:
        self._running = True
        gc.freeze()   # what start-up loaded (a large catalog, every partition's state) is never scanned again
        gc.set_threshold(*_GC_THRESHOLDS)
        # links to the peers the restored gossip state knows, before the first round
        self.peers.connect(sorted(mem.address for mem in self.gossip.members(self.clock.wall_ms())
                                  if mem.node_id != self.node_id and mem.address != self.address and is_up(mem.status)))
        log.info("node %s (generation %d) serving on %s, data in %s, seeds %s", self.node_id,
                 self.generation, self.address, self.cfg.data_dir, ",".join(self.cfg.seeds) or "none")
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        zap = self.security.zap
        poller.register(zap.sock, zmq.POLLIN)
        monitor = zap.monitor
        if monitor is not None:   # the ROUTER's connection events: drained every turn (mesh.security.zap)
            poller.register(monitor, zmq.POLLIN)
        try:
            while self._running:
                try:
                    events = dict(poller.poll(self._poll_timeout_ms()))
                except InterruptedError:
                    continue
                if monitor in events:
                    zap.drain_monitor()
                if zap.sock in events:
                    zap.handle()   # before the ROUTER: a handshake waits for this answer
                if self.router in events:
                    self._drain()
                    self.turn.drained()   # early acks and appends: no sync of this turn needed
                    if not self.data.doomed:   # the rows of offsets commits, to the group's replicas
                        self.turn.step("early offsets", self.groups.send_early, self.clock.wall_ms())
                try:
                    self._after_turn()   # each task guarded (BrokerTurn.step); this is the last resort
                except Exception as exc:  # fail the turn, not the broker
                    self._rlog.exception("turn", exc, "turn failed, rolled back: %s", exc)
                    self.data.doom(f"{type(exc).__name__} after the turn")
                    self.data.commit_turn()  # fails: rolls back, rebuilds the replication core
            self.sidecars.close()  # a gateway's subscriptions commit and leave their groups first
            self._send(self.gossip.leave(self.clock.wall_ms()))  # graceful: peers see LEFT at once
            log.info("node %s leaving the cluster", self.node_id)
        finally:
            self.close()

    def close(self) -> None:
        self.sidecars.close()
        try:
            self.data.refuse_held()   # held through a handover whose winner is not known yet
        except Exception as exc:      # closing anyway
            log.error("could not answer the held produce requests: %r", exc)
        try:
            self._persist_snapshot()
            self.store.commit()
        except LogError:
            self.store.rollback()
        self.peers.flush_and_close()
        if self.metrics is not None:
            self.metrics.close()
        self.security.close(self.router)
        self.router.close(linger=self.shutdown.linger_ms)
        self.store.close()
        self.disk.data_dir.unlock()
        log.info("node %s stopped", self.node_id)

    # -- loop ---------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        now_ms, dues = self.clock.now_ms(), (self.data.next_deadline_ms(), self.outbox.next_due_ms())
        waits = [max(0, d - now_ms + 1) for d in dues if d is not None]
        waits += [w for w in (self.compactor.next_in_ms(),) if w is not None]   # a compaction job's next slice
        return max(0, min(self.replicas.next_tick_in_ms(), self.gossip.next_tick_ms - self.clock.wall_ms(), *waits))

    def _drain(self) -> None:
        recv, handle, now_ms = self.dispatch.recv, self.dispatch.handle, self.clock.now_ms
        until_ms = now_ms() + self.cfg.max_drain_ms
        for _ in range(self.cfg.max_requests_per_turn):
            try:
                frames = recv(zmq.NOBLOCK)   # recv_multipart (+ the ZAP User-Id when secured)
            except zmq.Again:
                break
            handle(frames)
            if self.replicas.commit_moved:   # a follower's answer committed: ack before the next message
                self.turn.early_acks()       # (an RF-3 leader back from its sync finds both answers queued)
            if now_ms() >= until_ms:
                break

    def _after_turn(self) -> None:
        """The turn's steps after the drain (``BrokerTurn.run``)."""
        if self.dispatch.gossip_suspect:   # a gossip message raised inside the core this turn
            self.dispatch.gossip_suspect = False
            self._gossip_suspect = True
        self.turn.run()

    def _gossip_moved(self, now_ms: int) -> None:
        """If the gossip state moved (not on mere heartbeats): membership changes logged,
        users and ACLs, the topic catalog (local partitions created and dropped; the group
        host told), the snapshot marked due (``_maybe_snapshot`` stages it before the commit)."""
        step = self.turn.step
        if self.gossip.version != self._seen_version:
            self._seen_version = self.gossip.version
            log_membership_events(self.gossip.take_events(), self.node_id, self.metrics)
            step("security sync", self.security_sync.refresh)   # users and ACLs: cluster-wide within a few rounds
            if self._relearning:
                self._relearn_quiet_since = now_ms
            step("reconcile", self._reconcile)
            self.snapshot_pace.moved(self.clock.now_ms())
        elif self._relearning:
            step("relearn", self._relearned, now_ms)

    def _maybe_snapshot(self) -> None:
        """Stage the gossip snapshot when ``SnapshotPace`` says so."""
        now = self.clock.now_ms()
        if self.snapshot_pace.ready(now, self.store.has_writes()):
            self._persist_snapshot()
            self.snapshot_pace.staged(now, self.clock.now_ms())

    def _note_isolation(self, now_ms: int) -> None:
        if not self.gossip.isolated:
            self._isolated_since_ms, self._isolated_logged = None, False
        elif self._isolated_since_ms is None:
            self._isolated_since_ms = now_ms
        elif (not self._isolated_logged and self.cfg.seeds
              and now_ms - self._isolated_since_ms >= _ISOLATED_WARN_MS):
            self._isolated_logged = True
            log.warning("no live peer known for %d s: retrying seeds %s with backoff",
                        (now_ms - self._isolated_since_ms) // 1000, ",".join(self.cfg.seeds))

    def _committed(self, ok: bool) -> None:
        if not ok:
            self._seen_version = -1      # reconcile and persist the snapshot again on a good turn
            self.snapshot_pace.failed()
            self._check_damaged()

    def _step_failed(self, name: str, exc: Exception) -> None:
        if name in ("gossip tick", "stats", "publish"):
            self._gossip_suspect = True   # the gossip core may be half-updated

    def _prune_links(self) -> None:
        """Links only to seeds, members not DEAD or LEFT, and addresses used within the
        last minute (``PeerLinks.prune``)."""
        self.peers.prune(set(self.cfg.seeds) | {mem.address for mem in self.gossip.members(self.clock.wall_ms())
                                                if is_up(mem.status)})

    def _check_damaged(self) -> None:
        """A store whose every commit fails on a damaged page (one the start-up checks did
        not reach: only a write touches it) serves nothing and never recovers: after
        ``_DAMAGED_COMMITS`` in a row, stop with a clear error and the way out (``fatal``;
        ``mesh node`` exits 1), as a store refused at start."""
        err = self.data.last_commit_error
        if self.data.commit_failures >= _DAMAGED_COMMITS and any(m in err for m in _DAMAGE_MARKS):
            self.fatal = (f"the store in {self.cfg.data_dir} is damaged: {self.data.commit_failures} commits in "
                          f"a row failed ({err}). The way out: restart with --rejoin-empty, which moves it aside "
                          f"(renamed, not deleted) and rejoins as an empty replica that refills from its peers")
            log.critical("%s", self.fatal)
            try:
                refuse_from_now_on(self.cfg.data_dir, self.fatal)   # the start-up checks cannot see it
            except OSError as exc:
                log.error("could not mark %s as given up: %s", self.cfg.data_dir, exc)
            self._running = False

    def _tick_gossip(self, now_ms: int) -> None:
        self._send(self.gossip.tick(now_ms))

    def _relearned(self, now_ms: int) -> None:
        """--reset-gossip: once a peer was heard and gossip stayed unchanged for
        ``_RELEARN_QUIET_MS``, the cluster is known again: reconcile and persist."""
        if not self.gossip.seen_by_peer or self._relearn_quiet_since is None:
            return
        if now_ms - self._relearn_quiet_since >= _RELEARN_QUIET_MS:
            self._relearning = False
            log.warning("gossip relearned from peers (%d topics): reconciling partitions and persisting "
                        "the snapshot again", len(self.gossip.cluster_items(keys.TOPIC_PREFIX)))
            self._reconcile()
            self._persist_snapshot()

    # -- identity and lost state --------------------------------------------------------
    def _check_identity(self) -> None:
        """At a turn boundary (nothing staged): act on what peers showed of this node
        (the rules: ``mesh.node.lifecycle.identity``)."""
        if self.gossip.majority_confirmed and self.identity.majority_seen():
            log.info("identity confirmed by a majority of peers: generation %d", self.generation)
        conflict = self.gossip.identity_conflict
        if conflict:
            self._lost_identity(conflict)
        elif self.gossip.seen_by_peer and self.identity.seen_by_peer():
            self.replicas.confirm_identity()
            log.info("identity confirmed by a peer: store %s, generation %d (voting)", self.store_id, self.generation)
        if self.disk.identity.recovering and self.identity.state == LOST and self._refilled():
            if self._write_identity(recovering=False) and self.identity.refilled():
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
        state, unless this life was held by a majority (``Identity.majority_seen``: then the
        claim is refuted). Persist a generation above it (LMDB, then the identity file,
        synced) before speaking as it, then tell the replication core."""
        old, refute = self.generation, self.identity.refutes
        gen = self.identity.next_generation(conflict, self.clock.now_ms())
        if gen is None:
            # two live processes with one --id push each other's generation up without end
            # (each takes the other's newer row for proof that its own store went back)
            self._rlog.warning("bumps", "peers keep showing newer lives of node %s (%d new generations within "
                               "%d s): another live broker may be running with --id %s; this one waits before "
                               "taking another (its replicas stay out of votes meanwhile)", self.node_id,
                               self.identity.bumps, BUMP_WINDOW_MS // 1000, self.node_id)
            return
        if not self._write_identity(generation=gen, **({} if refute else {"recovering": True})):
            return                                # not durable: do not speak as it yet
        self.gossip.reincarnate(gen, self.clock.wall_ms())
        if refute:
            self.identity.refuted(gen)
            self._rlog.warning("refute", "node %s: a row claims generation %d of this node, which this process "
                               "never issued (it started as %d, and a majority of peers confirmed that life): a "
                               "forged row or another broker with --id %s. Refuted: now generation %d; no state "
                               "was lost", self.node_id, conflict, old, self.node_id, gen)
        else:
            log.error("node %s: peers remember generation %d of this node, but this store started as generation "
                      "%d: it lost state (wiped or rolled back). Now generation %d; replicas refill from their "
                      "leaders and neither vote nor count before they catch up", self.node_id, conflict, old, gen)
            if self.identity.reincarnated(gen):
                self.replicas.declare_lost_state()
        self._persist_snapshot()

    def _report_corrupt(self) -> None:
        for pid, offset in self.store.take_corrupt():
            if self.replicas.hosts(pid):
                self.replicas.report_corrupt(pid, offset)
            else:
                self.store.corrupt.get(pid, set()).discard(offset)  # found again when hosted and read

    def _check_clock(self) -> None:
        """Log a change of the clock's state once; judge gossip stamps by the peers' time."""
        self.peer_clock.check()
        self.gossip.set_clock_offset(self.peer_clock.correction_ms())

    def _send(self, effects) -> None:
        before = self.peers.bytes_sent
        stamp = self.peer_clock.stamp
        for e in effects:
            self.peers.send(e.dest, stamp(e.dest, e.msg), e.payload)
        if self.metrics is not None:   # gossip effects only come this way
            self.metrics.gossip_sent_bytes += self.peers.bytes_sent - before

    def _send_to_node(self, node_id: str, msg, payload) -> None:
        addr = self.directory.address_of(node_id)
        if addr is not None:
            self.peers.send(addr, msg, payload or None)

    def _local_leader(self, pid: int) -> tuple[str | None, int] | None:
        return self.replicas.leader(pid) if self.replicas.hosts(pid) else None

    def _reconcile(self) -> None:
        if self._relearning:
            return   # --reset-gossip: an empty view must not drop the partitions on disk
        added, removed = self.catalog.reconcile()
        for pid in removed:
            self.replicas.remove(pid)
        if removed:
            self.data.forget(removed)
        for pid in sorted(added):
            self.replicas.add(pid, raft_config(self.catalog.config_of_pid(pid)))
            if len(added) <= 8:
                log.info("now hosting %s/%d", *self.catalog.local[pid])
        if len(added) > 8:
            log.info("now hosting %d more partitions", len(added))
        self.groups.on_cluster_change(self.clock.wall_ms())

    def _drop_stray(self, pid: int) -> None:
        """A replica this node no longer holds (``mesh.cluster.configs`` rule 3), in the turn."""
        self.replicas.remove(pid)
        self.data.forget({pid})
        self.catalog.drop_stray(pid)

    def _apply_cluster_change(self) -> bool:
        """After an admin change to gossip: reconcile, persist, commit. False if not durable."""
        self._reconcile()
        self._persist_snapshot()
        return self.data.commit_turn()

    def _persist_snapshot(self) -> None:
        """Stage the gossip state into the turn's transaction, so a restart comes back
        knowing the cluster (and a topic whose creation was acknowledged here survives a
        kill -9 of the whole cluster). The caller commits.

        Not while relearning (--reset-gossip), and after an exception out of the gossip
        core only a snapshot that loads."""
        if self._relearning:
            return
        packed = msgpack.packb(self.gossip.snapshot(), use_bin_type=True)
        if self._gossip_suspect:
            try:
                self._make_gossip(self.generation + 1, [], msgpack.unpackb(packed, raw=False, strict_map_key=False))
            except Exception as exc:
                self._rlog.warning("snapshot", "gossip state does not load after an internal error (%s): "
                                   "the snapshot on disk is kept as it was", exc)
                return
            self._gossip_suspect = False
        try:
            self.store.put("gossip", b"snapshot", packed)
        except LogError as exc:
            log.warning("could not persist the gossip snapshot: %s", exc)

    def _make_gossip(self, generation: int, seeds: list[str], snapshot: dict | None) -> Gossip:
        return make_gossip(self.cfg, self.address, generation, seeds, snapshot, self.clock.wall_ms())

    def _reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        self.dispatch.reply(ident, rid, msg, payload)

