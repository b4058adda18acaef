"""The node shell: one process, one loop thread, one LMDB environment, one ROUTER socket.

Theory of operation
-------------------
Clients and peers connect to the node's ROUTER with DEALER sockets; the first frame after
the identity names the protocol (``mesh.wire.codec``). The loop decides nothing itself: it
moves messages between the socket, the cores (gossip, raft, groups) and the store, in this
order each turn (``run``, then ``_after_turn``):

1. wait for the ROUTER, at most until the next deadline (a loop tick, the gossip core's
   next round, the earliest parked fetch);
2. drain ready messages (at most ``max_requests_per_turn`` and for at most
   ``max_drain_ms``, so one busy client cannot starve the loop's other duties, and a flood
   of peer messages, such as a large topic's elections, does not keep its ticks and pings
   from going out); then answer the acks=all requests and wake the
   parked fetches the drain's commit advances allow (they need no sync of this turn:
   ``ReplicaHost.answer_committed``). Client requests go to their handler
   (``mesh.node.handlers``: admin and metadata, which commit on their own; the data path
   for produce, staged in the turn's transaction, and fetch; the group host for GROUP_*).
   Peer messages go to their core: gossip answers are sent at once (gossip keeps nothing
   that must be durable first), replication effects are staged and their sends held;
3. log a change of the clock's state (``mesh.node.peer_clock``); tick the gossip core
   (it starts a round when one is due) and send its effects; tick the replication cores
   that are due (effects staged, sends held);
4. if the gossip state moved (not on mere heartbeats): reconcile the topic catalog
   (create/drop local partitions), tell the group host (coordination and offsets may
   have moved) and stage the gossip snapshot (at most once per ten times its last cost:
   ``_SNAPSHOT_COST_FACTOR``);
5. publish this node's partition stats to gossip (every ``stats_every_ms``;
   ``mesh.node.publish``);
6. tick the group host;
7. every ``retention_check_ms``, stage retention (``DataPath.enforce_retention``: the
   partitions led here; by time only while ``PeerClock.trusted``, as producer-id expiry)
   into the turn's transaction (a failure there dooms the turn like any other write);
8. commit the turn's LMDB transaction with one sync (group commit), then answer the
   staged produce requests, send the held replication messages, note leadership
   changes and answer acks=all requests now committed (``DataPath.commit_turn``), and
   write the leadership chunks they touched to gossip (``Publisher.flush``);
9. wake parked fetches whose partitions grew, expire acks=all waits, answer fetches whose
   wait is over (``DataPath.after_turn``).

A storage error in steps 3-9 fails the turn, not the broker: the transaction is rolled back
and the replication core rebuilt from disk (it had run ahead of it). So does any other
exception, in a message handler (``Dispatcher``) or in one step here (``_step``): the
turn is doomed (``DataPath.doom``), rolled back at its commit, and nothing from it is
persisted; the next good turn reconciles and persists again. After an exception out of
the gossip core, its snapshot is persisted again only once it loads (``_persist_snapshot``).
Each failing site writes one traceback per minute (``mesh.node.ratelog``).

Bounds (issue 13): every resource a client can make the node hold has a ``NodeConfig``
field and a ``mesh node`` option: frame size (ZMQ_MAXMSGSIZE: a bigger frame is dropped
by ZeroMQ, with its connection, before it is read), body decoding (``DecodeLimits``),
fetch bytes, waits and parked fetches (``DataLimits``), answers queued per client
(SNDHWM and ``Outbox``), byte-rate quotas, idempotent-producer state, and heartbeats on
peer links (a dead client's pipe goes by the TTL its own PINGs announce: see
``mesh.node.bounds.router_options`` for why the ROUTER has none). RLIMIT_NOFILE's soft
limit is raised to the hard limit at start.

Persisted state that cannot be loaded stops the start with one message (``StartupError``)
saying what and how to recover: a gossip snapshot -> ``--reset-gossip`` (start without it
and relearn the cluster from peers: partitions are neither reconciled nor dropped, and no
snapshot is written, until gossip has been quiet for ``_RELEARN_QUIET_MS`` after a peer
was heard); the replication state -> move the data directory aside and rejoin empty.

Stopping (SIGTERM, SIGINT): the node first hands every partition it leads to a caught-up
replica on a live broker (``_hand_over``, Kafka's controlled shutdown; produce requests
meanwhile are held and then sent to the new leader), for at most ``shutdown_handover_ms``,
then tells its peers it left (gossip LEFT) and closes. A second signal stops at once.

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

import collections
import gc
import logging
import os
import random
import signal

import msgpack
import zmq

from mesh.cluster import keys, schema
from mesh.cluster.catalog import Catalog
from mesh.gossip import ALIVE, SUSPECT, Gossip, GossipConfig
from mesh.gossip.snapshot import ForeignSnapshot
from mesh.clock import SYSTEM_CLOCK, Clock
from mesh.node.peer_clock import PeerClock
from mesh.node.config import NodeConfig
from mesh.node.bounds import StartupError, check_bounds, raise_nofile_limit, router_options
from mesh.node.datapath import DataLimits, DataPath
from mesh.node.outbox import Outbox
from mesh.node.ratelog import RateLimitedLog
from mesh.node.dispatch import Dispatcher, open_router
from mesh.node.directory import Directory
from mesh.node.elastic import Elastic, ElasticSettings, raft_config
from mesh.node.elastic_handlers import ElasticHandlers
from mesh.node.group_host import GroupHost, GroupHostConfig
from mesh.node.handlers import ClientHandlers
from mesh.node.peers import PeerLinks
from mesh.node.producer_state import ProducerStates
from mesh.node.request_quota import RequestTimeQuota
from mesh.node.answer_budget import AnswerBudget
from mesh.node.publish import Publisher
from mesh.node.raft_host import ReplicaHost
from mesh.node.security_handlers import SecuritySync
from mesh.security.broker import BrokerSecurity, check_text_gateway
from mesh.raft import ReplicationConfig
from mesh.wire.codec import DecodeLimits
from storage.base import LogError
from storage.datadir import open_data_dir, refuse_from_now_on, update_identity

__all__ = ["NodeConfig", "Node", "StartupError"]

log = logging.getLogger("mesh.node.loop")

_RELEARN_QUIET_MS = 2_000      # --reset-gossip: gossip unchanged this long after a peer was heard
_PRODUCER_EXPIRY_CHECK_MS = 1_000   # one slice of the producer states (producer_state.EXPIRE_SLICE)
_LAME_DUCK_MS = 500            # stopping, leaderships handed over: clients redirected this long
_ISOLATED_WARN_MS = 5_000      # no live peer this long (seeds set): say so (a start takes a round or two)
# The cyclic collector, set for a broker (CPython's defaults are 700, 10, 10). At 10,000
# partitions a broker holds some 200,000 long-lived objects, and each request that builds
# many short-lived ones (a metadata answer, a 4,096-row replication message) pushed some of
# them into the old generation, so a full collection ran about once a second even on a
# settled cluster asked for metadata: 70-240 ms of the loop each (finding nothing), 10-20%
# of the CPU. Young collections every 50,000 objects instead of 700: what dies young is
# freed by reference counting before it is ever scanned.
_GC_THRESHOLDS = (50_000, 20, 10)
_MAX_BUMPS, _BUMP_WINDOW_MS = 3, 60_000   # generation bumps for lost state, at most this many a minute
_DAMAGED_COMMITS = 50          # commits in a row failing on a damaged page: the store is given up
_DAMAGE_MARKS = ("MDB_CORRUPTED", "MDB_PAGE_NOTFOUND")
# The gossip snapshot is staged on the turn after gossip moved, but no sooner after the last
# one than ten times what that one cost: it is the whole state, packed and written again
# (8.7 MB and ~65 ms with 100,000 committed offsets in gossip, on every commit anywhere in
# the cluster). What a restart would miss meanwhile its peers send again; what was
# acknowledged (topics, users, ACLs, moves) is persisted by its handler at once
# (``_apply_cluster_change``), offsets in their own database.
_SNAPSHOT_COST_FACTOR = 10


def _seeded_rng() -> random.Random:
    return random.Random(int.from_bytes(os.urandom(8), "big"))


class Node:
    def __init__(self, config: NodeConfig, clock: Clock = SYSTEM_CLOCK):
        self.cfg = config
        self.clock = clock
        # the clock checked against the peers' (gossip stamps): mesh.node.peer_clock
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
        gen = self.generation = self.disk.identity.generation
        self.store_id = self.disk.identity.store_id
        if self.disk.lost is not None:
            log.error("node %s: this store lost state (%s): starting as store %s, generation %d, whose "
                      "replicas refill from their leaders and neither vote nor count before they catch up",
                      config.node_id, self.disk.lost, self.store_id, gen)
        seeds = [s for s in config.seeds if s != self.address]
        if config.reset_gossip:
            if not seeds:
                raise StartupError("--reset-gossip needs --seed: this node relearns the cluster from its peers")
            log.warning("starting without the gossip snapshot (--reset-gossip): relearning the cluster from "
                        "peers %s; raft state and logs are kept", ",".join(seeds))
        snapshot = None
        try:
            raw = None if config.reset_gossip else self.store.get("gossip", b"snapshot")
            if raw is None and not config.reset_gossip and self.store.items("meta", b"pid:"):
                # partitions on disk and no snapshot (deleted, or damage that hid it): an empty
                # view would drop every one of them at the first reconcile, and the replicas
                # would then vote with raft state for logs they deleted. Relearn, as --reset-gossip
                if not seeds:
                    why = (f"the store in {config.data_dir} holds partitions but no gossip snapshot, and there "
                           f"is no peer to relearn the cluster from. The way out: restart with --seed of a live "
                           f"broker (raft state and logs are kept), or with --rejoin-empty, which moves the "
                           f"directory aside (renamed, not deleted) and starts empty")
                    refuse_from_now_on(config.data_dir, why)   # so that --rejoin-empty moves it aside
                    raise StartupError(why)
                log.warning("the store holds partitions but no gossip snapshot: relearning the cluster from "
                            "peers %s before anything is dropped (as --reset-gossip)", ",".join(seeds))
                self._relearning = True
            snapshot = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None
            self.gossip = self._make_gossip(gen, seeds, snapshot)
        except StartupError:
            self.disk.data_dir.unlock()
            raise
        except Exception as exc:
            self.disk.data_dir.unlock()
            if isinstance(exc, ForeignSnapshot):   # another broker's store under this name
                raise StartupError(
                    f"the gossip snapshot in {config.data_dir} belongs to another node: this store is not "
                    f"{config.node_id}'s. Check --id and --data, or restart with --rejoin-empty (the "
                    f"directory is moved aside); never --reset-gossip, which would keep its raft state") from exc
            raise StartupError(
                f"the gossip snapshot in {config.data_dir} cannot be loaded ({type(exc).__name__}: {exc}). "
                "Restart with --reset-gossip (and --seed of a live broker) to start without it and relearn "
                "the cluster from peers; raft state and logs are kept") from exc
        self.gossip.set_local(keys.MEMBER_KEY, {"address": self.address, "text_port": config.text_port,
                                                "store_id": self.store_id})
        if self.kafka_listener is not None:
            host, kport, kid = self.kafka_listener
            self.gossip.set_local(keys.KAFKA_KEY, {"host": host, "port": kport, "id": kid})
        self.gossip.hold_heartbeat = True   # heartbeat 0 until a peer is heard: see identity_conflict
        # unconfirmed until a peer shows its view of us; at once if there is nobody to ask
        alone = not seeds and len(self.gossip.members(clock.wall_ms())) <= 1
        self._identity = "lost" if self.disk.lost is not None else ("confirmed" if alone else "unconfirmed")
        self._identity_write_failed = False
        self._majority_confirmed = False   # a majority of peers held this life: later conflicts are refuted
        self.peer_clock.alone = lambda: self.gossip.isolated
        self.catalog = Catalog(config.node_id, self.gossip, self.store)
        self.producers = ProducerStates(self.store, now_ms=self.peer_clock.agreed_wall_ms,   # (peers' time)
                                        expiration_ms=config.producer_id_expiration_ms,
                                        max_ids=config.max_producer_ids)
        self._next_producer_expiry_ms = 0
        self.publish = Publisher(config.node_id, self.gossip, self.catalog, self.store)  # lead/, stats/
        self.replicas = ReplicaHost(config.node_id, self.store, self.producers, _seeded_rng(),
                                    self._send_to_node, self.publish.leadership,
                                    ReplicationConfig(election_ticks=config.election_ticks,
                                                      learner_bytes_per_tick=config.move_rate_bytes * config.tick_ms // 1000),
                                    tick_ms=config.tick_ms, now_ms=clock.now_ms,
                                    store_id=self.store_id, confirmed=self._identity == "confirmed")
        self.replicas.reply = self._reply
        self.publish.replicas = self.replicas
        if self._identity == "lost":
            self.replicas.declare_lost_state()
        self.directory = Directory(config.node_id, self.address, self.gossip, clock.wall_ms,
                                   self._local_leader)
        self.data = DataPath(self.store, self.catalog, self.replicas, self.producers, self._reply,
                             self.directory.leader_address, now_ms=clock.now_ms,
                             wall_ms=self.peer_clock.agreed_wall_ms,   # record timestamps: the peers' time
                             address_of=self.directory.address_of,
                             limits=DataLimits(fetch_max_bytes=config.fetch_max_bytes,
                                               partition_fetch_max_bytes=config.partition_fetch_max_bytes,
                                               fetch_max_wait_ms=config.fetch_max_wait_ms,
                                               max_parked_fetches=config.max_parked_fetches,
                                               max_parked_per_client=config.max_parked_per_client))
        self.replicas.address_of = self.directory.address_of  # leader hints for waiting clients
        self.router = open_router(self.ctx, config.bind, config.hwm_messages, options=router_options(config),
                                  configure=self.security.configure_router)
        self.peers = PeerLinks(self.ctx, self.address, config.hwm_messages, creds=self.security.peer_creds,
                               heartbeat_ivl_ms=config.heartbeat_ivl_ms,
                               heartbeat_timeout_ms=config.heartbeat_timeout_ms)
        self.handlers = ClientHandlers(node_id=config.node_id, gossip=self.gossip, catalog=self.catalog,
                                       directory=self.directory, store=self.store, replicas=self.replicas,
                                       data=self.data, peers=self.peers, reply=self._reply, clock=clock,
                                       apply_cluster_change=self._apply_cluster_change,
                                       identity=lambda: self._identity,
                                       learning=lambda: self._relearning or self._identity == "unconfirmed")
        self.handlers.peer_clock = self.peer_clock
        self._running = False
        self.fatal: str | None = None     # why the node stopped by itself (a damaged store), if it did
        self._bumps: collections.deque[int] = collections.deque()   # when lost state raised the generation
        self._stop_asked = 0              # signals seen: the first hands leaderships over, the second stops
        self._stop_since_ms: int | None = None
        self._handovers: dict[int, int] = {}   # pid -> handovers started while stopping
        self._lame_duck_until_ms: int | None = None
        self._linger_ms = 0
        self.metrics = None   # mesh.node.metrics.NodeMetrics with --metrics-port
        self._next_retention_ms = 0
        self._seen_version = -1
        self._snapshot_due = False     # gossip moved since the snapshot last staged
        self._next_snapshot_ms = 0     # not before: ten times what the last one cost
        self._next_stats_ms = 0
        self._isolated_logged = False
        self._isolated_since_ms: int | None = None
        self.groups = GroupHost(
            config.node_id, store=self.store, commit_turn=self.data.commit_turn, gossip=self.gossip,
            reply=self._reply, address_of=self.directory.address_of,
            topic_partitions=lambda: {name: t.partitions for name, t in self.catalog.topics.items()},
            clock=self.peer_clock.agreed, rng=_seeded_rng(), seeded=bool(config.seeds),   # commit stamps peers take
            config=GroupHostConfig(max_session_timeout_ms=config.group_max_session_timeout_ms,
                                   heartbeat_interval_ms=config.group_heartbeat_interval_ms,
                                   offsets_retention_ms=config.offsets_retention_ms,
                                   tombstone_ms=config.group_tombstone_ms),
            send_to_node=lambda node_id, msg: self._send_to_node(node_id, msg, None),
            doomed=lambda: self.data.doomed)
        self.groups.clock_trusted = self.peer_clock.trusted    # no group expiry on a wrong clock
        self.data.on_commit.append(self.groups.after_commit)   # offsets commits share the turn's sync
        self.dispatch = Dispatcher(self.router, self.handlers, self.groups, self.gossip, self.replicas,
                                   self.directory, self._send, self.clock, security=self.security)
        self.dispatch.limits = DecodeLimits(max_body_bytes=config.max_body_bytes,
                                            max_body_containers=config.max_body_containers)
        self.dispatch.peer_limits = DecodeLimits(max_body_bytes=config.max_frame_bytes, max_str_len=config.max_frame_bytes,
                                                 max_bin_len=config.max_frame_bytes, max_array_len=1 << 22,
                                                 max_map_len=1 << 22, max_body_containers=0)
        self.dispatch.on_doom = self.data.doom
        self.data.writer_tag = lambda: self.dispatch.writer_tag   # producer ids belong to their first writer
        if config.request_percentage:
            self.dispatch.request_quota = RequestTimeQuota(config.request_percentage)
        self.dispatch.peer_clock = self.peer_clock
        self.outbox = Outbox(self.router, clock.now_ms, max_backlog_bytes=config.client_backlog_bytes,
                             produce_bytes_per_s=config.produce_quota_bytes_per_s,
                             fetch_bytes_per_s=config.fetch_quota_bytes_per_s,
                             budget=AnswerBudget(per_client=config.fetch_max_bytes,
                                                 total=config.queued_max_answer_bytes))
        self.outbox.on_gone = self.data.drop_client
        self.dispatch.outbox = self.outbox
        self.outbox.principal_of = self.dispatch.principal_of
        self.data.reply = self.replicas.reply = self.dispatch.reply   # what _reply does, one call fewer
        self.elastic = Elastic(config.node_id, self.gossip, self.catalog, self.replicas, self.store, clock.wall_ms,
                               ElasticSettings(replace_dead_after_ms=config.replace_dead_after_ms,
                                               max_moves_per_broker=config.max_moves_per_broker,
                                               enabled=config.balance),
                               leader_of=lambda t, p: self.directory.leader(t, p).node_id, drop=self._drop_stray)
        self.handlers.extend(ElasticHandlers(gossip=self.gossip, catalog=self.catalog, elastic=self.elastic,
                                             commit_turn=self.data.commit_turn, reply=self._reply,
                                             apply_cluster_change=self._apply_cluster_change,
                                             wall_ms=clock.wall_ms).table())
        self.security_sync = SecuritySync(self.gossip, self.security.registry, self.security.authorizer)
        self.security_sync.refresh()
        if self.security.secured:
            self.handlers.security.registry, self.handlers.security.superusers = self.security.registry, self.security.superusers
        self.text = None   # the telnet text gateway: a client of this node, in a process of its own
        if config.text_port is not None:
            from mesh.gateway.process import GatewayError, GatewayProcess
            try:
                self.text = GatewayProcess.start(self.address, config.text_port, node_id=config.node_id,
                                                 max_session_timeout_ms=config.group_max_session_timeout_ms,
                                                 max_connections=config.text_max_connections,
                                                 idle_timeout_ms=config.text_idle_timeout_ms,
                                                 evict_idle_ms=config.text_evict_idle_ms,
                                                 max_subscriptions=config.text_max_subscriptions,
                                                 creds_path=config.text_creds if text_creds is not None else None)
            except GatewayError as exc:
                self.router.close(linger=0)
                self.disk.data_dir.unlock()
                raise StartupError(f"text gateway: {exc}") from exc
        self.kafka = None   # the Kafka listener: a client of this node too, in a process of its own
        if self.kafka_listener is not None:
            from mesh.kafka.process import KafkaError, KafkaProcess
            try:
                self.kafka = KafkaProcess.start(self.address, *self.kafka_listener, node_id=config.node_id, config=config)
            except KafkaError as exc:
                if self.text is not None:
                    self.text.close()
                self.router.close(linger=0)
                self.disk.data_dir.unlock()
                raise StartupError(f"kafka listener: {exc}") from exc
        try:
            self._reconcile()
        except Exception as exc:
            if self.text is not None:
                self.text.close()
            if self.kafka is not None:
                self.kafka.close()
            self.router.close(linger=0)
            self.disk.data_dir.unlock()
            raise StartupError(
                f"the replication state in {config.data_dir} cannot be loaded ({type(exc).__name__}: {exc}). "
                f"Move the data directory aside (keep it: mv {config.data_dir} {config.data_dir}.damaged) and "
                "start the node again: it rejoins as an empty replica and refills from its peers (with no "
                "peers, what it held is only in the moved directory)") from exc
        if config.metrics_port is not None:   # /metrics on its own thread (mesh.node.metrics_http)
            from mesh.node.metrics import serve_metrics
            self.metrics = self.dispatch.metrics = self.data.metrics = serve_metrics(self, config)

    # -- lifecycle ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def stop(self) -> None:
        """Stop serving: first hand the partitions led here over (``_hand_over``, at most
        ``shutdown_handover_ms``); a second call, or 0 ms, stops at the end of this turn."""
        self._stop_asked += 1
        if self._stop_asked > 1 or self.cfg.shutdown_handover_ms <= 0:
            self._running = False

    def _hand_over(self) -> None:
        """Controlled shutdown (Kafka's): each turn after the first stop signal, start a
        handover of every partition led here that has a caught-up, answering replica on a
        live broker (at most 3 per partition: an abandoned one is tried again); stop once
        none is led or in progress, or when ``shutdown_handover_ms`` has passed. Producers
        meanwhile are held and then sent to the new leader (``DataPath._hold``). Then, as
        NATS's lame-duck mode, it serves ``_LAME_DUCK_MS`` more, so clients that come to it
        meanwhile are pointed to the new leaders (at once: KIP-951) rather than finding it
        gone; a rolling restart costs them milliseconds, not an election timeout."""
        now = self.clock.now_ms()
        if self._stop_since_ms is None:
            self._stop_since_ms = now
            log.info("node %s stopping: handing over the %d partitions it leads (at most %d ms)",
                     self.node_id, len(self.replicas.leaders()), self.cfg.shutdown_handover_ms)
        if self._lame_duck_until_ms is not None:   # handed over: redirecting clients a little longer
            if now >= self._lame_duck_until_ms:
                self._running = False
                self._linger_ms = 200   # the answers of this last turn still go out
            return
        gone = {m.node_id for m in self.gossip.members(self.clock.wall_ms()) if m.status != "alive"}
        busy = self.replicas.hand_over_all(gone, self._handovers)
        if not busy or now - self._stop_since_ms >= self.cfg.shutdown_handover_ms:
            still = self.replicas.leaders()
            log.log(logging.WARNING if busy else logging.INFO,
                    "node %s handed over %d partitions in %d ms; still leading %d", self.node_id,
                    sum(1 for pid in self._handovers if pid not in still),
                    now - self._stop_since_ms, len(still))
            self._lame_duck_until_ms = now + min(_LAME_DUCK_MS, self.cfg.shutdown_handover_ms)

    def run(self) -> None:
        self._running = True
        gc.freeze()   # what start-up loaded (a large catalog, every partition's state) is never scanned again
        gc.set_threshold(*_GC_THRESHOLDS)
        # links to the peers the restored gossip state knows, before the first round
        self.peers.connect(sorted(mem.address for mem in self.gossip.members(self.clock.wall_ms())
                                  if mem.node_id != self.node_id and mem.address != self.address
                                  and mem.status in (ALIVE, SUSPECT)))
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
                    self._step("early acks", self.data.answer_committed)   # no sync needed: at once
                    if not self.data.doomed:   # (a doomed turn sends nothing)
                        self._step("early appends", self.replicas.send_early_appends)   # before the turn's steps
                try:
                    self._after_turn()   # each step guarded (_step); this is the last resort
                except Exception as exc:  # fail the turn, not the broker
                    self._rlog.exception("turn", exc, "turn failed, rolled back: %s", exc)
                    self.data.doom(f"{type(exc).__name__} after the turn")
                    self.data.commit_turn()  # fails: rolls back, rebuilds the replication core
            if self.text is not None:
                self.text.close()  # subscriptions commit and leave their groups first
                self.text = None
            if self.kafka is not None:
                self.kafka.close()
                self.kafka = None
            self._send(self.gossip.leave(self.clock.wall_ms()))  # graceful: peers see LEFT at once
            log.info("node %s leaving the cluster", self.node_id)
        finally:
            self.close()

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
        if getattr(self, "kafka", None) is not None:
            self.kafka.close()
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
        self.router.close(linger=self._linger_ms)
        self.store.close()
        self.disk.data_dir.unlock()
        log.info("node %s stopped", self.node_id)

    # -- loop ---------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        t = self.replicas.next_tick_in_ms()
        d = self.data.next_deadline_ms()
        if d is not None:
            t = min(t, max(0, d - self.clock.now_ms() + 1))
        d = self.outbox.next_due_ms()
        if d is not None:
            t = min(t, max(0, d - self.clock.now_ms()))
        return max(0, min(t, self.gossip.next_tick_ms - self.clock.wall_ms()))

    def _drain(self) -> None:
        recv, handle, now_ms = self.dispatch.recv, self.dispatch.handle, self.clock.now_ms
        until_ms = now_ms() + self.cfg.max_drain_ms
        for _ in range(self.cfg.max_requests_per_turn):
            try:
                frames = recv(zmq.NOBLOCK)   # recv_multipart (+ the ZAP User-Id when secured)
            except zmq.Again:
                break
            handle(frames)
            if now_ms() >= until_ms:
                break

    def _after_turn(self) -> None:
        """Steps 3-9, each guarded by ``_step``."""
        now_ms = self.clock.wall_ms()
        if self.dispatch.gossip_suspect:   # a gossip message raised inside the core this turn
            self.dispatch.gossip_suspect = False
            self._gossip_suspect = True
        self._step("clock", self._check_clock)
        self._step("gossip tick", self._tick_gossip, now_ms)
        self._step("replication tick", self.replicas.tick_due)
        self._step("held produces", self.data.release_held)   # a handover that ended: run them again
        self._step("corrupt batches", self._report_corrupt)
        if self.gossip.version != self._seen_version:
            self._seen_version = self.gossip.version
            self._step("security sync", self.security_sync.refresh)   # users and ACLs: cluster-wide within a few rounds
            if self._relearning:
                self._relearn_quiet_since = now_ms
            self._step("reconcile", self._reconcile)
            self._snapshot_due = True
        elif self._relearning:
            self._step("relearn", self._relearned, now_ms)
        if self._snapshot_due and self.clock.now_ms() >= self._next_snapshot_ms:
            self._snapshot_due = False
            started_ms = self.clock.now_ms()
            self._step("gossip snapshot", self._persist_snapshot)
            self._next_snapshot_ms = started_ms + _SNAPSHOT_COST_FACTOR * (self.clock.now_ms() - started_ms)
        if now_ms >= self._next_stats_ms:
            self._next_stats_ms = now_ms + self.cfg.stats_every_ms
            self._step("stats", self.publish.stats)
            self._step("peer links", self._prune_links)
        if not self.gossip.isolated:
            self._isolated_since_ms, self._isolated_logged = None, False
        elif self._isolated_since_ms is None:
            self._isolated_since_ms = now_ms
        elif (not self._isolated_logged and self.cfg.seeds
              and now_ms - self._isolated_since_ms >= _ISOLATED_WARN_MS):
            self._isolated_logged = True
            log.warning("no live peer known for %d s: retrying seeds %s with backoff",
                        (now_ms - self._isolated_since_ms) // 1000, ",".join(self.cfg.seeds))
        self._step("groups", self.groups.tick, now_ms)
        mono_ms = self.clock.now_ms()
        if mono_ms >= self._next_retention_ms:
            self._next_retention_ms = mono_ms + self.cfg.retention_check_ms
            # by time only while this clock agrees with the peers' (DESIGN.md section 11)
            self._step("retention", self.data.enforce_retention, self.clock.wall_ms(), self.peer_clock.trusted())
        if mono_ms >= self._next_producer_expiry_ms and self.peer_clock.trusted():
            self._next_producer_expiry_ms = mono_ms + min(_PRODUCER_EXPIRY_CHECK_MS, self.cfg.producer_id_expiration_ms)
            self._step("producer expiry", self.producers.expire, self.clock.wall_ms())
        if not self._relearning:
            self._step("elastic", self.elastic.tick, now_ms)   # config changes to gossip; moves (mesh.node.elastic)
        if self._stop_asked and self._running:
            self._step("hand over", self._hand_over)   # stopping: leaderships to others first
        if not self.data.commit_turn():  # the turn's one sync; then acks, replication sends, wake-ups
            self._seen_version = -1      # reconcile and persist the snapshot again on a good turn
            self._next_snapshot_ms = 0
            self._check_damaged()
        self._step("publish", self.publish.flush)     # leadership changes of the turn, to gossip
        self.outbox.flush()
        self._step("wake fetches", self.data.after_turn)
        self._step("identity", self._check_identity)
        if self.metrics is not None:
            self.metrics.maybe_refresh(mono_ms)   # the snapshot /metrics serves (guarded, read-only)

    def _prune_links(self) -> None:
        """Links only to seeds, members not DEAD or LEFT, and addresses used within the
        last minute (``PeerLinks.prune``)."""
        self.peers.prune(set(self.cfg.seeds) | {mem.address for mem in self.gossip.members(self.clock.wall_ms())
                                                if mem.status in (ALIVE, SUSPECT)})

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

    def _step(self, name: str, fn, *args) -> None:
        """Run one step of the turn; an exception dooms the turn (rolled back at its commit,
        nothing persisted from it) and is logged (a traceback per site per minute)."""
        try:
            fn(*args)
        except LogError as exc:   # e.g. a full disk: the store refuses the rest of the turn
            self._rlog.warning(("storage", name), "storage error in %s, turn rolled back: %s", name, exc)
            self.data.doom(f"storage error in {name}")
        except Exception as exc:
            self.data.doom(f"{type(exc).__name__} in {name}")
            if name in ("gossip tick", "stats", "publish"):
                self._gossip_suspect = True   # the gossip core may be half-updated
            self._rlog.exception(("step", name), exc, "%s failed, turn rolled back: %s", name, exc)

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
        """At a turn boundary (nothing staged): act on what peers showed of this node."""
        if not self._majority_confirmed and self.gossip.majority_confirmed and self._identity == "confirmed":
            self._majority_confirmed = True   # for this process's life: see _refute
            log.info("identity confirmed by a majority of peers: generation %d", self.generation)
        conflict = self.gossip.identity_conflict
        if conflict and self._majority_confirmed:
            self._refute(conflict)
        elif conflict:
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
        if not self._take_bump():
            return
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

    def _refute(self, conflict: int) -> None:
        """A row for this node that this process never issued (a higher generation, or its
        own with a higher version, heartbeat or another life) after a majority of peers had
        shown they hold this life: no majority held another life of this node since (R2 in
        ``mesh.gossip.membership``), so it is a forgery (open mode trusts local processes,
        issue 39 finding 9: rows for every broker at generation + 5 made all three declare
        lost state, every replica recovering and no leader ever, across restarts) or a
        second process with this id. This store lost nothing: like SWIM's refutation with a
        higher incarnation, take a generation above the claim (persisted first) and speak
        as it, with no lost state declared. Rate-limited as ``_lost_identity``."""
        if not self._take_bump():
            return
        old = self.generation
        gen = max(conflict, old) + 1
        if not self._write_identity(generation=gen):
            return
        self.gossip.reincarnate(gen, self.clock.wall_ms())
        self.generation = gen
        self._rlog.warning("refute", "node %s: a row claims generation %d of this node, which this process never "
                           "issued (it started as %d, and a majority of peers confirmed that life): a forged "
                           "row or another broker with --id %s. Refuted: now generation %d; no state was lost",
                           self.node_id, conflict, old, self.node_id, gen)
        self._persist_snapshot()

    def _take_bump(self) -> bool:
        """One more generation bump within ``_MAX_BUMPS`` a minute (else a warning, False)."""
        now = self.clock.now_ms()
        while self._bumps and now - self._bumps[0] >= _BUMP_WINDOW_MS:
            self._bumps.popleft()
        if len(self._bumps) >= _MAX_BUMPS:
            # two live processes with one --id push each other's generation up without end
            # (each takes the other's newer row for proof that its own store went back)
            self._rlog.warning("bumps", "peers keep showing newer lives of node %s (%d new generations within "
                               "%d s): another live broker may be running with --id %s; this one waits before "
                               "taking another (its replicas stay out of votes meanwhile)", self.node_id,
                               len(self._bumps), _BUMP_WINDOW_MS // 1000, self.node_id)
            return False
        self._bumps.append(now)
        return True

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
        """The gossip core (at start, and to check that a snapshot loads)."""
        return Gossip(self.cfg.node_id, self.address, generation, seeds, _seeded_rng(),
                      GossipConfig.lan(interval_ms=self.cfg.gossip_interval_ms), self.clock.wall_ms(),
                      snapshot=snapshot, validate_entry=schema.validate_entry, register_prefixes=keys.REGISTER_PREFIXES)

    def _reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        self.dispatch.reply(ident, rid, msg, payload)

