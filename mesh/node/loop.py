"""The node shell: one process, one loop thread, one LMDB environment, one ROUTER socket.

Theory of operation
-------------------
Clients and peers connect to the node's ROUTER with DEALER sockets; the first frame after
the identity names the protocol (``mesh.wire.codec``). Each loop turn:

1. drain ready messages from the ROUTER (at most ``max_requests_per_turn``, so one busy
   client cannot starve the loop's other duties): client requests go to their handler
   (admin, metadata, ``DataPath`` for produce and fetch), peer messages to their core;
2. commit the turn's LMDB transaction with one sync (group commit), then answer the
   staged produce requests (``DataPath.commit_turn``);
3. tick the gossip core (it starts a round when one is due), send its effects;
4. if the gossip state moved (not on mere heartbeats): reconcile the topic catalog
   (create/drop local partitions) and persist the gossip snapshot;
5. wake parked fetches whose partitions grew, expire long polls, run retention.

Nothing a client sends can crash the loop: every request runs inside a guard that turns
any failure into an error response (logged once per client and code). Peer messages get
no error responses (peers do not read them); a bad one is logged and dropped.

Identity: the node id is stable; the generation is read from LMDB, incremented and synced
before the node says anything, so each life of a node is newer than the last.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field

import msgpack
import zmq

from mesh.wire import messages as m
from mesh.cluster.catalog import Catalog
from mesh.node.datapath import DataPath
from mesh.wire.errors import ErrorCode, MeshError
from mesh.gossip.core import Gossip, GossipAck, GossipAck2, GossipConfig, GossipSyn
from mesh.node.peers import PeerLinks, sender_address
from mesh.node.producer_state import ProducerStates
from mesh.node.raft_host import REPLICATION_MESSAGES, ReplicaHost
from mesh.raft.manager import ReplicationConfig
from mesh.wire.codec import PROTOCOL_CLIENT, PROTOCOL_PEER, pack, unpack
from storage.base import LogError
from storage.log import Store

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


def _now_ms() -> int:
    """Wall-clock ms for the gossip core: its register stamps are compared across nodes and
    its snapshot outlives the process (a jump only pauses failure detection)."""
    return time.time_ns() // 1_000_000


class Node:
    def __init__(self, config: NodeConfig):
        self.cfg = config
        self.node_id = config.node_id
        self.address = config.bind
        self.store = Store(config.data_dir, map_size=config.map_size_bytes, sync=config.sync)
        # a new life: bump and sync the generation before saying anything
        gen = int(self.store.get("meta", b"generation") or 0) + 1
        self.store.put("meta", b"generation", str(gen).encode())
        self.store.commit()
        self.generation = gen
        raw = self.store.get("gossip", b"snapshot")
        snapshot = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None
        seeds = [s for s in config.seeds if s != self.address]
        self.gossip = Gossip(config.node_id, self.address, gen, seeds,
                             random.Random(int.from_bytes(os.urandom(8), "big")),
                             GossipConfig.lan(interval_ms=config.gossip_interval_ms), _now_ms(),
                             snapshot=snapshot)
        self.gossip.set_local("member", {"address": self.address, "text_port": config.text_port})
        self.catalog = Catalog(config.node_id, self.gossip, self.store)
        self.producers = ProducerStates(self.store)
        self.replicas = ReplicaHost(config.node_id, self.store, self.producers,
                                    random.Random(int.from_bytes(os.urandom(8), "big")),
                                    self._send_to_node, self._publish_leadership,
                                    ReplicationConfig(election_ticks=config.election_ticks),
                                    tick_ms=config.tick_ms)
        self.replicas.reply = self._reply
        self.data = DataPath(self.store, self.catalog, self.replicas, self.producers, self._reply,
                             self._leader_address)
        self._node_of_address: dict[str, str] = {}
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.router.setsockopt(zmq.SNDHWM, config.hwm_messages)
        self.router.setsockopt(zmq.RCVHWM, config.hwm_messages)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://{config.bind}")
        self.peers = PeerLinks(self.ctx, self.address, config.hwm_messages)
        self._running = False
        self._logged: set[tuple[bytes, int]] = set()
        self._next_retention = 0.0
        self._seen_version = -1
        self._next_stats_ms = 0
        self._last_stats: dict = {}
        self._isolated_logged = False
        # consumer groups (mesh/group_service.py) and the telnet text gateway (mesh/text.py)
        # plug in here; each owns its own module and is driven by the hooks below
        self.groups = None
        self.text = None
        try:
            from mesh.node.group_host import GroupService
        except ImportError:
            GroupService = None
        if GroupService is not None:
            self.groups = GroupService(self)
        if config.text_port is not None:
            from mesh.gateway.text import TextGateway
            self.text = TextGateway(self, config.text_port)
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
        if self.text is not None and self.text.socket is not None:
            poller.register(self.text.socket, zmq.POLLIN)
        try:
            while self._running:
                try:
                    events = dict(poller.poll(self._poll_timeout_ms()))
                except InterruptedError:
                    continue
                if self.router in events:
                    self._drain()
                if self.text is not None and self.text.socket is not None and self.text.socket in events:
                    self.text.on_readable()
                try:
                    self._after_turn()
                except LogError as exc:  # e.g. a full disk: fail the turn, not the broker
                    log.error("storage error, turn rolled back: %s", exc)
                    self.data.commit_turn()  # fails: rolls back, rebuilds the replication core
            if self.text is not None:
                self.text.close()  # subscriptions commit and leave their groups first
                self.text = None
            self._send(self.gossip.leave(_now_ms()))  # graceful: peers see LEFT at once
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
        log.info("node %s stopped", self.node_id)

    # -- loop ---------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        t = self.cfg.tick_ms
        d = self.data.next_deadline()
        if d is not None:
            t = min(t, max(0, int((d - now) * 1000) + 1))
        return max(0, min(t, self.gossip.next_tick_ms - _now_ms()))

    def _drain(self) -> None:
        router = self.router
        for _ in range(self.cfg.max_requests_per_turn):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._handle(frames)

    def _after_turn(self) -> None:
        now_ms = _now_ms()
        self._send(self.gossip.tick(now_ms))
        self.replicas.tick_due()
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
        if self.groups is not None:
            self.groups.tick(now_ms)
        now = time.monotonic()
        if now >= self._next_retention:
            self._next_retention = now + self.cfg.retention_check_ms / 1000
            self.data.enforce_retention(int(time.time() * 1000))
        self.data.commit_turn()  # the turn's one sync; then acks, replication sends, wake-ups
        self.data.after_turn()

    def _send(self, effects) -> None:
        for e in effects:
            self.peers.send(e.dest, e.msg, e.payload)

    def _send_to_node(self, node_id: str, msg, payload) -> None:
        addr = self._address_of(node_id)
        if addr is not None:
            self.peers.send(addr, msg, payload or None)

    def _publish_leadership(self, pid: int, leader: str | None, epoch: int) -> None:
        """Leaders announce themselves in gossip (``lead/<topic>``: {partition: epoch}), so
        any broker can redirect a client."""
        where = self.catalog.local.get(pid)
        if where is None:
            return
        name, _ = where
        led = {}
        t = self.catalog.topics.get(name)
        for p, q in enumerate(t["pids"] if t else []):
            if q is not None and self.replicas.is_leader(q):
                led[str(p)] = self.replicas.leader(q)[1]
        if led:
            self.gossip.set_local("lead/" + name, led)
        elif self.gossip.node_items(self.node_id, "lead/" + name):
            self.gossip.delete_local("lead/" + name)
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
        if self.groups is not None:
            self.groups.on_cluster_change(_now_ms())

    def _persist_snapshot(self) -> None:
        """Stage the gossip state into the turn's transaction, so a restart comes back
        knowing the cluster (and a topic whose creation was acknowledged here survives a
        kill -9 of the whole cluster). The caller commits."""
        try:
            self.store.put("gossip", b"snapshot", msgpack.packb(self.gossip.snapshot(), use_bin_type=True))
        except LogError as exc:
            log.warning("could not persist the gossip snapshot: %s", exc)

    def _publish_stats(self) -> None:
        """Offsets of the partitions served here, so any broker can describe them."""
        stats = {}
        for pid, (name, p) in sorted(self.catalog.local.items()):
            if self.replicas.is_leader(pid):
                stats.setdefault(name, {})[str(p)] = [self.store.log_start(pid), self.store.log_end(pid),
                                                      self.replicas.commit_offset(pid)]
        if stats != self._last_stats:
            self._last_stats = stats
            self.gossip.set_local("stats", stats)

    # -- dispatch -----------------------------------------------------------------------
    def _handle(self, frames: list) -> None:
        ident = frames[0]
        if len(frames) > 1 and frames[1] == PROTOCOL_PEER:
            self._handle_peer(ident, frames)
            return
        rid = 0
        try:
            if len(frames) >= 3 and len(frames[2]) == 8:
                rid = int.from_bytes(frames[2], "big")
            protocol, rid, msg, payload = unpack(frames[1:])
            handler = self._handlers.get(type(msg))
            if handler is not None:
                handler(self, ident, rid, msg, payload)
            elif self.groups is not None and self.groups.handles(msg):
                self.groups.handle(ident, rid, msg)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__} is not a request")
        except MeshError as exc:
            self._error(ident, rid, exc.code, exc.message, exc.leader)
        except Exception as exc:  # a bug or an input we did not foresee: answer, keep serving
            log.exception("request from %r failed", ident)
            self._error(ident, rid, ErrorCode.INVALID_REQUEST, f"request could not be handled: {exc}")

    def _handle_peer(self, ident: bytes, frames: list) -> None:
        src = sender_address(bytes(ident))
        try:
            if src is None:
                raise MeshError(ErrorCode.INVALID_REQUEST, "peer message without a peer identity")
            _, _, msg, payload = unpack(frames[1:])
            if isinstance(msg, (GossipSyn, GossipAck, GossipAck2)):
                self._send(self.gossip.receive(src, msg, _now_ms()))
            elif isinstance(msg, REPLICATION_MESSAGES):
                node = self._node_at(src)
                if node is not None:  # not yet known through gossip: the sender will retry
                    self.replicas.step(node, msg, payload)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"unexpected peer message {type(msg).__name__}")
        except Exception as exc:
            key = (bytes(ident), -1)
            if key not in self._logged and len(self._logged) < 10_000:
                self._logged.add(key)
                log.warning("bad peer message from %s: %s", src or bytes(ident).hex(), exc)

    def _error(self, ident: bytes, rid: int, code: ErrorCode, message: str, leader: str | None = None) -> None:
        key = (bytes(ident), int(code))
        if key not in self._logged and len(self._logged) < 10_000:
            self._logged.add(key)
            log.warning("client %s: %s: %s", bytes(ident).hex(), code.name, message)
        self._reply(ident, rid, m.ErrorResponse(int(code), message, leader))

    def _reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        frames = [ident] + pack(PROTOCOL_CLIENT, rid, msg, payload)
        try:
            self.router.send_multipart(frames, zmq.NOBLOCK, copy=payload is None or len(payload) < 65536)
        except zmq.ZMQError as exc:  # client gone (EHOSTUNREACH) or its pipe is full (EAGAIN)
            log.debug("dropping reply to %s: %s", bytes(ident).hex(), exc)

    # -- cluster view -------------------------------------------------------------------
    def _live(self) -> list[str]:
        return self.gossip.live_members(_now_ms())

    def _address_of(self, node_id: str) -> str | None:
        if node_id == self.node_id:
            return self.address
        for mem in self.gossip.members(_now_ms()):
            if mem.node_id == node_id:
                return mem.address
        return None

    def _node_at(self, address: str) -> str | None:
        node = self._node_of_address.get(address)
        if node is None:
            self._node_of_address = {mem.address: mem.node_id for mem in self.gossip.members(_now_ms())}
            node = self._node_of_address.get(address)
        return node

    def _leader(self, t: dict, partition: int) -> tuple[str | None, int]:
        """(leader node id or None, epoch): from the local replica if there is one, else
        the highest-epoch claim gossiped by a live replica."""
        pid = t["pids"][partition]
        if pid is not None and self.replicas.hosts(pid):
            leader, epoch = self.replicas.leader(pid)
            if leader is not None:
                return leader, epoch
        best: tuple[str | None, int] = (None, -1)
        live = set(self._live())
        for node in t["replicas"][partition]:
            if node in live and node != self.node_id:
                epoch = self.gossip.node_items(node, "lead/" + t["name"]).get("lead/" + t["name"], {}).get(str(partition))
                if epoch is not None and epoch > best[1]:
                    best = (node, epoch)
        return best

    def _leader_address(self, t: dict, partition: int) -> str | None:
        leader, _ = self._leader(t, partition)
        return self._address_of(leader) if leader else None

    # -- admin and metadata -------------------------------------------------------------
    def on_create_topic(self, ident, rid, req: m.CreateTopicRequest, payload) -> None:
        self.data.commit_turn()  # admin changes never share a transaction with staged appends
        self.catalog.create(req.name, req.partitions, req.replication_factor, req.config, self._live())
        self._reconcile()
        self._persist_snapshot()
        if not self.data.commit_turn():
            raise MeshError(ErrorCode.STORAGE_ERROR, "topic created but not persisted here (storage error)")
        log.info("created topic %s with %d partitions", req.name, req.partitions)
        self._reply(ident, rid, m.CreateTopicResponse(0))

    def on_delete_topic(self, ident, rid, req: m.DeleteTopicRequest, payload) -> None:
        self.data.commit_turn()
        self.catalog.delete(req.name)
        self._reconcile()
        self._persist_snapshot()
        if not self.data.commit_turn():
            raise MeshError(ErrorCode.STORAGE_ERROR, "topic deleted but not persisted here (storage error)")
        log.info("deleted topic %s", req.name)
        self._reply(ident, rid, m.DeleteTopicResponse(0))

    def on_metadata(self, ident, rid, req: m.MetadataRequest, payload) -> None:
        now = _now_ms()
        members = self.gossip.members(now)
        live = set(self.gossip.live_members(now))
        brokers = []
        stats: dict[str, dict] = {}
        for mem in members:
            age = None if mem.last_heard_ms is None else now - mem.last_heard_ms
            entry = {"id": mem.node_id, "address": mem.address, "status": mem.status,
                     "generation": mem.generation, "heartbeat_age_ms": age}
            if mem.node_id == self.node_id:
                entry.update(heartbeat_age_ms=0, peer_messages_sent=self.peers.sent,
                             peer_bytes_sent=self.peers.bytes_sent, peer_messages_dropped=self.peers.dropped)
            brokers.append(entry)
            stats[mem.node_id] = self.gossip.node_items(mem.node_id, "stats").get("stats") or {}
        names = sorted(self.catalog.topics) if req.topics is None else list(req.topics)
        topics = []
        for name in names:
            t = self.catalog.topics.get(name)
            if t is None:
                topics.append({"name": name, "error": int(ErrorCode.UNKNOWN_TOPIC)})
                continue
            parts = []
            for p, reps in enumerate(t["replicas"]):
                leader, epoch = self._leader(t, p)
                pid = t["pids"][p]
                if pid is not None and leader == self.node_id:
                    start, end, hw = self.store.log_start(pid), self.store.log_end(pid), self.replicas.commit_offset(pid)
                    isr = self.replicas.isr(pid)
                else:
                    start, end, hw = (stats.get(leader, {}).get(name, {}).get(str(p)) or [-1, -1, -1])
                    isr = [r for r in reps if r in live]
                parts.append({"partition": p, "leader": leader,
                              "leader_address": self._address_of(leader) if leader else None,
                              "epoch": max(epoch, 0), "replicas": reps, "isr": isr,
                              "log_start": start, "log_end": end, "high_watermark": hw})
            topics.append({"name": name, "error": 0, "config": t["config"],
                           "replication_factor": t["replication_factor"], "partitions": parts})
        self._reply(ident, rid, m.MetadataResponse(0, brokers, topics, self.node_id))

    def on_list_offsets(self, ident, rid, req: m.ListOffsetsRequest, payload) -> None:
        out = []
        for topic, partition, which in req.parts:
            try:
                _, pid = self.data.local_partition(topic, partition)
                off = self.store.log_start(pid) if which == m.EARLIEST else self.replicas.commit_offset(pid)
                out.append([topic, partition, 0, off, None])
            except MeshError as exc:
                out.append([topic, partition, int(exc.code), -1, exc.leader])
        self._reply(ident, rid, m.ListOffsetsResponse(out))

    def on_produce(self, ident, rid, req, payload) -> None:
        self.data.on_produce(ident, rid, req, payload)

    def on_fetch(self, ident, rid, req, payload) -> None:
        self.data.on_fetch(ident, rid, req, payload)

    _handlers = {
        m.ProduceRequest: on_produce,
        m.FetchRequest: on_fetch,
        m.MetadataRequest: on_metadata,
        m.CreateTopicRequest: on_create_topic,
        m.DeleteTopicRequest: on_delete_topic,
        m.ListOffsetsRequest: on_list_offsets,
    }
