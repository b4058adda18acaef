"""The node's answers to client requests: admin, metadata, list offsets (produce and fetch
are the data path's, ``mesh.node.data.datapath``; consumer groups are the group host's).

Each handler is ``handler(ident, rid, request, payload)`` and answers through ``reply``; a
handler that cannot answer raises ``MeshError`` and the loop turns it into an error
response. Handlers decide nothing a peer could disagree about: topic placement is
``mesh.cluster.placement`` (through the catalog), leaders are ``mesh.cluster.leaders``
(through the directory).

Admin requests never share a transaction with the turn's staged appends: they commit the
turn first, then apply the change to gossip, reconcile and persist it with their own
commit, and answer only once the change is on this node's disk.

A topic is created, altered and deleted by one broker, its *owner*: the rendezvous hash of
its name over the brokers that may coordinate (``mesh.cluster.ownership.topic_owner``),
as a group's coordinator is chosen. Another broker answers COORDINATOR_MOVED naming the
owner, and the admin client asks there. A topic's shape is several last-writer-wins
registers written from the writer's own view, so two brokers changing one topic at once
could each win a part: two creates of one name both succeeded (the loser's partitions,
acknowledged records and all, were dropped when gossip settled), and two alters left a
header and a partition table that never agreed again. The owner sees its own writes at
once, so it serializes them; only while the brokers' views of who is alive disagree (a
few seconds after a death or a join) can two brokers each believe they own a name.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from mesh.wire.topic_config import compacted
from mesh.cluster import keys
from mesh.cluster.catalog import Catalog, Topic
from mesh.cluster.liveness import draining_ids
from mesh.cluster.ownership import topic_owner
from mesh.clock import Clock
from mesh.node.data.datapath import DataPath
from mesh.node.lifecycle.directory import Directory
from mesh.node.requests.security_handlers import SecurityHandlers
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from storage.base import CorruptBatch, LogError
from storage.timestamps import MAX_WALK_BATCHES, StillIndexing

__all__ = ["ClientHandlers"]

log = logging.getLogger("mesh.node.requests.handlers")

MAX_METADATA_TOPICS = 10_000   # names in one metadata request (after duplicates are dropped)


class ClientHandlers:
    def __init__(self, *, node_id: str, gossip, catalog: Catalog, directory: Directory, store,
                 replicas, data: DataPath, peers, reply: Callable, clock: Clock,
                 apply_cluster_change: Callable[[], bool], identity: Callable[[], str] = lambda: "confirmed",
                 learning: Callable[[], bool] = lambda: False):
        """``apply_cluster_change()``: reconcile the catalog with gossip, persist the gossip
        snapshot and commit; False if the commit failed. ``identity()``: whether this node's
        store identity is confirmed by peers, unconfirmed yet, or lost state (refilling)."""
        self.node_id = node_id
        self.gossip = gossip
        self.catalog = catalog
        self.directory = directory
        self.store = store
        self.compactor = None   # mesh.node.data.compactor.Compactor (set by the node): describe's dirty ratio
        self.replicas = replicas
        self.data = data
        self.peers = peers
        self.reply = reply
        self.clock = clock
        self.apply_cluster_change = apply_cluster_change
        self.identity = identity   # "unconfirmed" | "confirmed" | "lost" (mesh.node.lifecycle.identity)
        self.learning = learning   # the cluster is still being learned (no peer heard yet, relearning)
        self.peer_clock = None     # mesh.node.peers.peer_clock.PeerClock (the node sets it): clock offsets
        self._table: dict[type, Callable] = {
            m.ProduceRequest: data.on_produce,
            m.FetchRequest: data.on_fetch,
            m.MetadataRequest: self.on_metadata,
            m.CreateTopicRequest: self.on_create_topic,
            m.DeleteTopicRequest: self.on_delete_topic,
            m.AlterTopicRequest: self.on_alter_topic,
            m.ListOffsetsRequest: self.on_list_offsets,
        }
        # users and ACLs (``mesh.node.requests.security_handlers``); secured mode sets ``.registry``
        self.security = SecurityHandlers(gossip=gossip, commit_turn=data.commit_turn,
                                         apply_cluster_change=apply_cluster_change, reply=reply)
        self._table.update(self.security.table())

    def extend(self, table: dict[type, Callable]) -> None:
        """More request handlers (``mesh.node.requests.elastic_handlers``)."""
        self._table.update(table)

    def handler_for(self, msg: Any) -> Callable | None:
        return self._table.get(type(msg))

    # -- admin --------------------------------------------------------------------------
    def _owned_here(self, name: Any) -> None:
        """COORDINATOR_MOVED naming the broker that owns topic ``name`` (module doc), unless
        it is this one."""
        owner = topic_owner(str(name), self.gossip.members(self.clock.wall_ms()))
        if owner is not None and owner != self.node_id:
            addr = self.directory.address_of(owner)
            raise MeshError(ErrorCode.COORDINATOR_MOVED, f"topic {name!r} is created, altered and deleted "
                                                         f"by broker {owner} ({addr}): ask there", leader=addr)
        if self.learning():   # its view may lack the topic: a create would replace it
            raise MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"broker {self.node_id} is still learning the "
                                                                 f"cluster from its peers: retry in a moment")

    def _active(self, rf: int) -> list[str]:
        """Brokers that are not draining where new replicas may go: the alive ones, or, when
        fewer than ``rf`` are, the suspects too (one slow turn on a loaded host must not
        refuse a create; a suspect that is really dead would hold its share until it is
        replaced, so it is taken only when needed)."""
        rf = rf if type(rf) is int else 0   # (a malformed request is refused by the catalog)
        draining = draining_ids(self.gossip.cluster_items(keys.BROKER_PREFIX))
        alive = [n for n in self.gossip.live_members(self.clock.wall_ms()) if n not in draining]
        return alive if len(alive) >= rf else [n for n in self.directory.live() if n not in draining]

    def on_create_topic(self, ident, rid, req: m.CreateTopicRequest, payload) -> None:
        self._owned_here(req.name)
        self.data.commit_turn()  # admin changes never share a transaction with staged appends
        self.catalog.create(req.name, req.partitions, req.replication_factor, req.config,
                            self._active(req.replication_factor))
        if not self.apply_cluster_change():
            raise MeshError(ErrorCode.STORAGE_ERROR, "topic created but not persisted here (storage error)")
        log.info("created topic %s with %d partitions", req.name, req.partitions)
        self.reply(ident, rid, m.CreateTopicResponse(0))

    def on_delete_topic(self, ident, rid, req: m.DeleteTopicRequest, payload) -> None:
        self._owned_here(req.name)
        self.data.commit_turn()
        self.catalog.delete(req.name)
        if not self.apply_cluster_change():
            raise MeshError(ErrorCode.STORAGE_ERROR, "topic deleted but not persisted here (storage error)")
        log.info("deleted topic %s", req.name)
        self.reply(ident, rid, m.DeleteTopicResponse(0))

    def on_alter_topic(self, ident, rid, req: m.AlterTopicRequest, payload) -> None:
        """More partitions and/or another replication factor (``Catalog.alter``); new
        partitions go to live brokers that are not draining."""
        self._owned_here(req.name)
        self.data.commit_turn()
        rf = req.replication_factor or self.catalog.topic(req.name).replication_factor
        t = self.catalog.alter(req.name, req.partitions, req.replication_factor, self._active(rf), req.config)
        if not self.apply_cluster_change():
            raise MeshError(ErrorCode.STORAGE_ERROR, "topic altered but not persisted here (storage error)")
        log.info("altered topic %s: %d partitions, replication factor %d", req.name, t.partitions,
                 t.replication_factor)
        self.reply(ident, rid, m.AlterTopicResponse(0))

    # -- metadata -----------------------------------------------------------------------
    def on_metadata(self, ident, rid, req: m.MetadataRequest, payload) -> None:
        now = self.clock.wall_ms()
        members = self.gossip.members(now)
        live = set(self.directory.live())
        brokers = []
        stats: dict[str, dict] = {}        # node -> {stats/<topic>/<k>: {"<p>": [start, end, hw]}}
        recovering: dict[str, dict] = {}   # node -> {recovering/<topic>/<k>: [partitions refilling]}
        for mem in members:
            age = None if mem.last_heard_ms is None else now - mem.last_heard_ms
            recovering[mem.node_id] = self.gossip.node_items(mem.node_id, keys.RECOVERING_PREFIX)
            member = self.gossip.node_items(mem.node_id, keys.MEMBER_KEY).get(keys.MEMBER_KEY) or {}
            entry = {"id": mem.node_id, "address": mem.address, "status": mem.status,
                     "generation": mem.generation, "heartbeat": mem.heartbeat, "heartbeat_age_ms": age,
                     "store_id": member.get("store_id") if isinstance(member, dict) else None,
                     "recovering": sum(len(v) for v in recovering[mem.node_id].values() if isinstance(v, list))}
            kafka = self.gossip.node_items(mem.node_id, keys.KAFKA_KEY).get(keys.KAFKA_KEY)
            entry["kafka"] = kafka if isinstance(kafka, dict) else None   # {host, port, id}: mesh.kafka
            entry.update(self._elastic_entry(mem.node_id))
            if mem.node_id == self.node_id:
                entry.update(identity=self.identity(), recovering=sum(
                    1 for pid in self.catalog.local if self.replicas.recovering(pid)))
                entry.update(heartbeat_age_ms=0, peer_messages_sent=self.peers.sent,
                             peer_bytes_sent=self.peers.bytes_sent, peer_messages_dropped=self.peers.dropped)
            brokers.append(entry)
            stats[mem.node_id] = self.gossip.node_items(mem.node_id, keys.STATS_PREFIX)
        pc = self.peer_clock
        if pc is not None:
            self._clock_offsets(brokers, pc)
        addresses = {mem.node_id: mem.address for mem in members}
        addresses[self.node_id] = self.directory.address
        if req.topics is None:
            names = sorted(self.catalog.topics)
        else:   # each name once: a name repeated 100,000 times was 100,000 copies of its partitions
            names = list(dict.fromkeys(req.topics))
            if len(names) > MAX_METADATA_TOPICS:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"at most {MAX_METADATA_TOPICS} topics per metadata "
                                                           f"request (all topics: ask for none)")
        topics = []
        for name in names:
            t = self.catalog.topics.get(name)
            if t is None:
                topics.append({"name": name, "error": int(ErrorCode.UNKNOWN_TOPIC)})
                continue
            topics.append({"name": name, "error": 0, "topic_id": t.uuid, "config": t.config,
                           "replication_factor": t.replication_factor,
                           "partitions": [self._partition_entry(t, p, live, stats, recovering, addresses)
                                          for p in range(len(t.replicas))]})
        self.reply(ident, rid, m.MetadataResponse(0, brokers, topics, self.node_id))

    def _clock_offsets(self, brokers: list[dict], pc) -> None:
        """Each broker's ``clock_offset_ms``, as the metric ``mesh_clock_offset_seconds``
        (the peers' clock minus the broker's): ours is our estimate; a peer's is our
        estimate minus its clock's lead on ours (its last stamp), None when not heard."""
        own = pc.offset_ms()
        for entry in brokers:
            if entry["id"] == self.node_id:
                entry.update(clock_offset_ms=own, clock=pc.state())
                continue
            lead = pc.sample_ms(entry["address"])
            entry["clock_offset_ms"] = None if lead is None else (own or 0) - lead

    def _elastic_entry(self, node: str) -> dict:
        """A broker's operator state (active, draining, drained) and the load it reports."""
        load = self.gossip.node_items(node, keys.LOAD_KEY).get(keys.LOAD_KEY)
        load = load if isinstance(load, dict) else {}
        reg = self.gossip.cluster_items(keys.broker_key(node)).get(keys.broker_key(node))
        state = reg.get("state", "active") if isinstance(reg, dict) else "active"
        if state == "draining" and load.get("replicas") == 0:
            state = "drained"
        return {"state": state, "replicas": load.get("replicas"), "leaders": load.get("leaders"),
                "bytes": load.get("bytes")}

    def _partition_entry(self, t: Topic, p: int, live: set[str], stats: dict[str, dict],
                         recovering: dict[str, dict], addresses: dict[str, str]) -> dict:
        reps = list(t.replicas[p])
        leader, epoch = self.directory.leader(t, p, live)
        pid = t.pids[p]
        if pid is not None and leader == self.node_id:
            start, end, hw = self.store.log_start(pid), self.store.log_end(pid), self.replicas.commit_offset(pid)
            isr = self.replicas.isr(pid)
        else:
            chunk = stats.get(leader, {}).get(keys.stats_key(t.name, keys.chunk_of(p)))
            start, end, hw = (chunk.get(str(p)) if isinstance(chunk, dict) else None) or [-1, -1, -1]
            isr = [r for r in reps if r in live]
        local = {}
        if pid is not None and self.replicas.hosts(pid):  # this node's own replica, first hand
            local = {"local_end": self.store.log_end(pid), "local_recovering": self.replicas.recovering(pid),
                     "local_size_bytes": self.store.size_bytes(pid)}
            if compacted(t.config) and self.compactor is not None:   # mesh.node.data.compactor
                ratio = round(self.compactor.dirty_ratio(pid), 3)
                applied, target = self.store.clean_applied(pid), self.store.clean_target(pid)
                local.update(local_clean_end=applied[0], local_dirty_ratio=ratio, local_clean_target=target[0],
                             local_clean_pending=applied != target,   # (a horizon alone may move)
                             local_compaction=self.compactor.job_stats.get(pid, [0, 0, 0]))
                if leader == self.node_id:
                    local["dirty_ratio"] = ratio
        return {**local, "partition": p, "leader": leader,
                "leader_address": addresses.get(leader) if leader else None,
                "epoch": max(epoch, 0), "replicas": reps, "isr": isr,
                "learners": list(t.learners[p]) if t.learners else [],
                "log_start": start, "log_end": end, "high_watermark": hw,
                "recovering": [r for r in reps if self._recovering(recovering.get(r), t.name, p)]}

    @staticmethod
    def _recovering(rec: dict | None, topic: str, p: int) -> bool:
        """Whether a node's ``recovering/`` gossip entries list ``topic``/``p``."""
        parts = rec.get(keys.recovering_key(topic, keys.chunk_of(p))) if rec else None
        return isinstance(parts, list) and p in parts

    # -- offsets ------------------------------------------------------------------------
    def on_list_offsets(self, ident, rid, req: m.ListOffsetsRequest, payload) -> None:
        out = []
        if not isinstance(req.parts, (list, tuple)):   # (its length is bounded by the decoder)
            raise MeshError(ErrorCode.INVALID_REQUEST, "parts must be a list")
        for part in req.parts:
            if not isinstance(part, (list, tuple)) or len(part) != 3 or not (
                    part[2] in (m.EARLIEST, m.LATEST) or (type(part[2]) is int and 0 <= part[2] < 1 << 63)):
                raise MeshError(ErrorCode.INVALID_REQUEST, f"each part must be [topic, partition, {m.EARLIEST} "
                                                           f"(earliest), {m.LATEST} (latest) or a timestamp in ms "
                                                           f"(>= 0)], not {part!r:.80}")
        budget = [MAX_WALK_BATCHES]   # header reads all lookups by time of this request may make
        for topic, partition, which in req.parts:
            by_time = which >= 0   # a timestamp: the answer carries the record's timestamp too
            try:
                _, pid = self.data.local_partition(topic, partition)
                if which != m.EARLIEST and not self.replicas.commit_known(pid):
                    # just elected: its commit may lag what the previous leader acknowledged (an
                    # "end" below acknowledged records); as Kafka's OFFSET_NOT_AVAILABLE: retry
                    raise MeshError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}/{partition}: the leader was "
                                                                   f"just elected, its high watermark is not known yet")
                if by_time:   # Kafka's answer when no record reaches it: offset -1, timestamp -1
                    off, ts = self.store.offset_for_time(pid, which, self.replicas.commit_offset(pid),
                                                         budget) or (-1, -1)
                    out.append(m.OffsetsPart(topic, partition, 0, off, None, ts))
                    continue
                off = self.store.log_start(pid) if which == m.EARLIEST else self.replicas.commit_offset(pid)
                out.append(m.OffsetsPart(topic, partition, 0, off, None))
            except MeshError as exc:
                out.append(m.OffsetsPart(topic, partition, int(exc.code), -1, exc.leader, -1 if by_time else None))
            except StillIndexing as exc:   # bounded work per request: the client asks again
                out.append(m.OffsetsPart(topic, partition, int(ErrorCode.TIMEOUT), -1, None, -1))
                log.debug("%s/%s: %s", topic, partition, exc)
            except LogError as exc:   # a damaged batch (CorruptBatch: noted for repair) or a failed read
                out.append(m.OffsetsPart(topic, partition, int(ErrorCode.STORAGE_ERROR if not isinstance(exc, CorruptBatch)
                                                               else ErrorCode.CORRUPT_MESSAGE), -1, None, -1))
        self.reply(ident, rid, m.ListOffsetsResponse(out))
