"""The node's view of topics, partitions and brokers, derived from gossip.

A topic lives in cluster-wide last-writer-wins gossip registers (``mesh.cluster.keys``):
the header ``topic/<name>`` = ``{name, uuid, partitions, replication_factor, config,
chunks}`` and its replica table in ``chunks`` registers ``tparts/<name>/<uuid>/<k>`` =
``{first, replicas}``, each of at most ``TPARTS_CHUNK_PARTITIONS`` partitions and about
``TPARTS_CHUNK_BYTES`` (no value has to fit one gossip message by luck). ``replicas[p]``
lists the brokers of partition p, preferred leader first. The uuid tells a topic from an
older one of the same name: local data is keyed by ``<name>#<uuid>``, so a node that
missed a delete and a re-create still drops the old data.

Rules:
- a topic exists for this node once its header and *all* its chunks with the header's
  uuid are present, consecutive (chunk k starts where chunk k-1 ended) and cover exactly
  ``partitions`` partitions; until then it is pending (not listed, nothing registered);
- create writes the chunks, then the header; delete tombstones the header and every
  chunk of the name; alter (more partitions, another replication factor) keeps the uuid,
  rewrites only the chunks that change (new partitions are appended), then the header;
  the registers are never modified otherwise;
- while an altered topic's header and chunks disagree (either arrived first), the node
  keeps its previous row of that uuid, and a restarted node with no previous row keeps
  the topic's local partitions (never dropped for a header whose chunks are incomplete).

``reconcile`` runs whenever the gossip state moved: it rebuilds the topic table (``Topic``
rows, reusing a row whose registers are the very same values as last time, so a node
holding 100,000 partitions does not rebuild them for every heartbeat of metadata), then,
only if the table changed, registers a local partition id for every partition this node
replicates and forgets local partitions that no topic wants any more (deleted topics, or
a re-created name), all in one store commit (one sync, however many partitions). Only the
metadata decides that: the topic's header is a tombstone or names another uuid. A local
partition whose topic this node holds no header of is kept (logged once): a view that
lost registers (a broker restarted with its clock a day behind once dropped its
snapshot's) must not delete data.
"""
from __future__ import annotations

import logging
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mesh.wire.errors import ErrorCode, MeshError
from mesh.cluster.keys import (TOPIC_PREFIX, TPARTS_CHUNK_BYTES, TPARTS_CHUNK_PARTITIONS, TPARTS_PREFIX,
                               topic_key, tparts_key)
from mesh.cluster.configs import PartitionConfig, configs_by_topic, overlay
from mesh.cluster.keys import PCONF_PREFIX, REASSIGN_PREFIX
from mesh.cluster.placement import place_replicas
from mesh.wire.topic_config import MAX_PARTITIONS, normalize_config, validate_topic_name, write_caching_of

__all__ = ["Catalog", "Topic", "TOPIC_PREFIX", "MAX_REPLICATION_FACTOR", "cluster_pid", "split_replicas",
           "topic_registers", "topics_from_registers"]

log = logging.getLogger("mesh.cluster.catalog")

MAX_REPLICATION_FACTOR = 16   # a chunk of the replica table stays bounded with long node ids
# Partitions of all topics together: every broker holds the whole table in gossip, and a
# broker may host a replica of each (``ReplicationConfig.max_partitions``). Each broker
# checks it against the topics it knows, so two creates racing on two brokers may pass it
# by the smaller of them (there is no controller to ask).
MAX_CLUSTER_PARTITIONS = 100_000


def cluster_pid(topic_uuid: str, partition: int) -> int:
    """The cluster-wide id of a partition: 48 bits of the topic's uuid, 14 of the partition
    number. Replication messages name partitions by it, and each broker stores the
    partition's log under it."""
    return (int(topic_uuid[:12], 16) << 14) | partition


def _replicas_bytes(reps: Sequence[str]) -> int:
    """What one partition's replica list costs in a gossip value (msgpack, upper bound)."""
    return 5 + sum(len(n.encode()) + 5 for n in reps)


def split_replicas(replicas: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The ``tparts/`` chunk values of a replica table: consecutive runs of at most
    ``TPARTS_CHUNK_PARTITIONS`` partitions and about ``TPARTS_CHUNK_BYTES`` each."""
    chunks: list[dict[str, Any]] = []
    run: list[list[str]] = []
    size = 0
    first = 0
    for p, reps in enumerate(replicas):
        cost = _replicas_bytes(reps)
        if run and (len(run) >= TPARTS_CHUNK_PARTITIONS or size + cost > TPARTS_CHUNK_BYTES):
            chunks.append({"first": first, "replicas": run})
            run, size, first = [], 0, p
        run.append(list(reps))
        size += cost
    if run:
        chunks.append({"first": first, "replicas": run})
    return chunks


@dataclass(frozen=True, slots=True)
class Topic:
    """One row of the topic table: the ``topic/<name>`` header and its ``tparts/`` chunks,
    plus this node's view.

    ``replicas[p]``: the brokers of partition p, preferred leader first. ``pids[p]``: the
    partition's cluster id if *this* node holds a replica, else None. ``config`` is the
    normalized topic config (read-only by convention)."""
    name: str
    uuid: str
    partitions: int
    replication_factor: int
    config: dict[str, Any]
    replicas: tuple[tuple[str, ...], ...]
    pids: tuple[int | None, ...] = ()
    # The partitions' current configs (``mesh.cluster.configs``); empty: the table as created
    # (version 0, no learners, committed).
    learners: tuple[tuple[str, ...], ...] = ()
    versions: tuple[int, ...] = ()
    committed: tuple[bool, ...] = ()

    def config_of(self, p: int) -> PartitionConfig:
        """Partition ``p``'s effective config (``mesh.cluster.configs`` rule 1)."""
        if not self.versions:
            return PartitionConfig(0, 0, self.replicas[p])
        return PartitionConfig(self.versions[p], 0, self.replicas[p], self.learners[p], self.committed[p])

    def members_of(self, p: int) -> tuple[str, ...]:
        """Voters then learners of partition ``p``."""
        return self.replicas[p] + self.learners[p] if self.learners else self.replicas[p]

    @property
    def store_key(self) -> str:
        """``<name>#<uuid>``: the name under which this node stores the topic's partitions."""
        return f"{self.name}#{self.uuid}"

    @classmethod
    def from_registers(cls, header: Mapping[str, Any], chunks: Sequence[Mapping[str, Any]],
                       node_id: str) -> "Topic":
        """A row from a header and its chunks (in chunk order), seen from ``node_id``;
        ValueError (or KeyError, TypeError) if they do not fit together."""
        replicas: list[tuple[str, ...]] = []
        for k, chunk in enumerate(chunks):
            if chunk["first"] != len(replicas):
                raise ValueError(f"chunk {k} starts at partition {chunk['first']}, not {len(replicas)}")
            replicas.extend(tuple(reps) for reps in chunk["replicas"])
        if len(replicas) != header["partitions"]:
            raise ValueError(f"chunks hold {len(replicas)} partitions, the header says {header['partitions']}")
        uuid = header["uuid"]
        return cls(name=header["name"], uuid=uuid, partitions=header["partitions"],
                   replication_factor=header["replication_factor"], config=header["config"],
                   replicas=tuple(replicas),
                   pids=tuple(cluster_pid(uuid, p) if node_id in reps else None
                              for p, reps in enumerate(replicas)))

    def header(self, chunks: int) -> dict[str, Any]:
        """The ``topic/<name>`` value: exactly the msgpack shape every broker reads."""
        return {"name": self.name, "uuid": self.uuid, "partitions": self.partitions,
                "replication_factor": self.replication_factor, "config": self.config, "chunks": chunks}


def topic_registers(t: Topic) -> dict[str, Any]:
    """Every register of topic ``t``, key -> value: its chunks, then its header."""
    chunks = split_replicas(t.replicas)
    out = {tparts_key(t.name, t.uuid, k): v for k, v in enumerate(chunks)}
    out[topic_key(t.name)] = t.header(len(chunks))
    return out


def _chunk_keys(header: Any, key: str) -> list[str] | None:
    """The ``tparts/`` keys a header names, in order; None if it is not a topic header."""
    if not isinstance(header, dict):
        return None
    name, uuid, n = header.get("name"), header.get("uuid"), header.get("chunks")
    if (type(name) is not str or key != topic_key(name) or type(uuid) is not str
            or type(n) is not int or not 1 <= n <= MAX_PARTITIONS):
        return None
    return [tparts_key(name, uuid, k) for k in range(n)]


def topics_from_registers(registers: Mapping[str, Any], node_id: str,
                          previous: Mapping[str, tuple] | None = None) -> tuple[dict[str, Topic], dict[str, tuple]]:
    """The topic table from the ``topic/`` and ``tparts/`` registers (key -> value), as
    ``node_id`` sees it, and the memo to pass back as ``previous`` next time (a row whose
    header and chunks are the same objects is reused). Pending and malformed topics are
    skipped (see the module docstring)."""
    previous = previous or {}
    parts = {k: v for k, v in registers.items() if k.startswith(TPARTS_PREFIX)}
    topics: dict[str, Topic] = {}
    memo: dict[str, tuple] = {}
    for key, header in sorted(registers.items()):
        if not key.startswith(TOPIC_PREFIX):
            continue
        old = previous.get(key)
        if old is not None and old[0] is header:
            _, chunk_keys, old_chunks, t = old
            chunks = [parts.get(k) for k in chunk_keys]
            if all(a is b for a, b in zip(old_chunks, chunks)):
                memo[key] = old
                topics[t.name] = t
                continue
        elif isinstance(header, dict) and "replicas" in header:   # legacy: the table inline, no chunks
            chunk_keys, chunks = [], [{"first": 0, "replicas": header["replicas"]}]
        else:
            chunk_keys = _chunk_keys(header, key)
            if chunk_keys is None:
                continue
            chunks = [parts.get(k) for k in chunk_keys]
        if not all(isinstance(c, dict) for c in chunks):
            _keep_previous(key, old, header, memo, topics)   # pending: a chunk has not arrived yet
            continue
        try:
            t = Topic.from_registers(header, chunks, node_id)
        except (KeyError, TypeError, ValueError) as exc:
            if not _keep_previous(key, old, header, memo, topics):
                log.warning("ignoring malformed topic %s: %s", key[:80], exc)
            continue
        memo[key] = (header, chunk_keys, chunks, t)
        topics[t.name] = t
    return topics, memo


def _keep_previous(key: str, old: tuple | None, header: Any, memo: dict[str, tuple],
                   topics: dict[str, Topic]) -> bool:
    """An altered topic whose new header and chunks have not all arrived (in either order)
    keeps its previous complete row of the same uuid, so no partition of it is dropped in
    between; True if it did."""
    if old is None or not isinstance(header, dict) or header.get("uuid") != old[3].uuid:
        return False
    memo[key] = old
    topics[old[3].name] = old[3]
    return True


def _pending_store_keys(registers: Mapping[str, Any], topics: Mapping[str, Topic]) -> set[str]:
    """``<name>#<uuid>`` of every topic header the table does not hold with that uuid
    (its chunks are incomplete): a node restarted in the middle of an alter keeps their
    local partitions until the chunks arrive."""
    out = set()
    for key, header in registers.items():
        if key.startswith(TOPIC_PREFIX) and isinstance(header, dict):
            name, uuid = header.get("name"), header.get("uuid")
            if type(name) is str and type(uuid) is str and getattr(topics.get(name), "uuid", None) != uuid:
                out.add(f"{name}#{uuid}")
    return out


class Catalog:
    def __init__(self, node_id: str, gossip, store):
        self.node_id = node_id
        self.gossip = gossip
        self.store = store
        self.topics: dict[str, Topic] = {}
        self.local: dict[int, tuple[str, int]] = {}   # pid -> (topic name, partition)
        self._memo: dict[str, tuple] = {}
        self._loaded = False
        self._kept: set[tuple[str, int]] = set()   # local partitions kept for want of metadata (logged once)
        self._signature = None      # the registers' bucket hashes at the last rebuild
        self._calls = 0
        self._overlaid: dict[str, tuple] = {}   # name -> (base row, pconf values, overlaid row)
        # the broker's write.caching and flush.ms for topics that set neither (mesh node
        # --write-caching, --flush-ms; set by the wiring): the store is told per hosted partition
        self.cache_default: tuple[bool, int] = (False, 100)

    def _overlay(self, topics: dict[str, Topic]) -> dict[str, Topic]:
        """The topic rows with each partition's effective config (``mesh.cluster.configs``),
        reusing a row whose base row and ``pconf/`` values are the same objects as last time."""
        by_topic: dict[tuple[str, str], list] = {}
        for key, value in sorted(self.gossip.cluster_items(PCONF_PREFIX).items()):
            name_uuid = key[len(PCONF_PREFIX):].rsplit("/", 1)[0]
            name, _, uuid = name_uuid.partition("/")
            by_topic.setdefault((name, uuid), []).append((key, value))
        out: dict[str, Topic] = {}
        memo: dict[str, tuple] = {}
        for name, t in topics.items():
            items = by_topic.get((name, t.uuid))
            if not items:
                out[name] = t
                continue
            old = self._overlaid.get(name)
            if old is not None and old[0] is t and len(old[1]) == len(items) and \
                    all(a is b for a, (_, b) in zip(old[1], items)):
                out[name], memo[name] = old[2], old
                continue
            row = overlay(t, configs_by_topic(dict(items)).get((name, t.uuid)), self.node_id, cluster_pid)
            memo[name] = (t, [v for _, v in items], row)
            out[name] = row
        self._overlaid = memo
        return out

    def replicas_of(self, pid: int) -> list[str]:
        name, p = self.local[pid]
        return list(self.topics[name].replicas[p])

    def strays(self) -> list[int]:
        """Local partitions whose effective config does not name this node (configs rule 3:
        candidates for ``drop_stray``)."""
        out = []
        for pid, (name, p) in self.local.items():
            t = self.topics.get(name)
            if t is not None and self.node_id not in t.members_of(p):
                out.append(pid)
        return sorted(out)

    def drop_stray(self, pid: int) -> None:
        """Forget local partition ``pid`` (its data too); the caller commits."""
        name, p = self.local.pop(pid)
        t = self.topics[name]
        log.info("dropping local partition %s/%d: no longer a replica here", name, p)
        self.store.forget_partition(t.store_key, p)

    def config_of_pid(self, pid: int) -> PartitionConfig:
        """The effective config of local partition ``pid`` (``mesh.cluster.configs``)."""
        name, p = self.local[pid]
        return self.topics[name].config_of(p)

    def write_caching(self, pid: int) -> int | None:
        """Local partition ``pid``'s flush.ms if its topic's writes are cached (``write.caching``,
        else the broker's ``cache_default``), None if every write is synced first (issue 41)."""
        t = self.topics.get(self.local[pid][0]) if pid in self.local else None
        return None if t is None else write_caching_of(t.config, *self.cache_default)

    # -- topics -------------------------------------------------------------------------
    def reconcile(self) -> tuple[set[int], set[int]]:
        """Rebuild from gossip; returns (pids added, pids removed) on this node. Gossip's
        bucket hashes of the registers (``cluster_hash``) tell at once whether any register
        moved; a change they miss (a 2**-32 chance per write) is caught by the full
        rebuild every 64th call."""
        cluster_hash = getattr(self.gossip, "cluster_hash", None)
        signature = cluster_hash() if cluster_hash is not None else None
        self._calls += 1
        if self._loaded and signature is not None and signature == self._signature and self._calls % 64:
            return set(), set()                     # no register changed (checked in full now and then)
        self._signature = signature
        registers = dict(self.gossip.cluster_items(TOPIC_PREFIX))
        registers.update(self.gossip.cluster_items(TPARTS_PREFIX))
        topics, memo = topics_from_registers(registers, self.node_id, self._memo)
        self._memo = memo
        topics = self._overlay(topics)
        if self._loaded and topics.keys() == self.topics.keys() and \
                all(t is self.topics[name] for name, t in topics.items()):
            return set(), set()                     # the same rows: nothing to do here
        wanted: dict[tuple[str, int], tuple[str, int, int]] = {}
        for t in topics.values():
            for p, pid in enumerate(t.pids):
                if pid is not None:
                    wanted[(t.store_key, p)] = (t.name, p, pid)
        before = set(self.local)
        pending = _pending_store_keys(registers, topics)
        by_key = {t.store_key: t for t in topics.values()}
        for tkey, p, pid in self.store.partitions():
            t = by_key.get(tkey)
            if (tkey, p) not in wanted and t is not None and p < t.partitions and pid == cluster_pid(t.uuid, p):
                wanted[(tkey, p)] = (t.name, p, pid)     # configs rule 3: a stray goes by drop_stray
        for tkey, p, pid in self.store.partitions():
            if (tkey, p) not in wanted and tkey not in pending:
                why = self._gone(tkey, registers)
                if why is None:
                    if (tkey, p) not in self._kept:
                        self._kept.add((tkey, p))
                        log.warning("keeping local partition %s/%d: the cluster metadata this node holds does "
                                    "not name its topic (not deleted, not replaced: not learned yet?)", tkey, p)
                    continue
                log.info("dropping local partition %s/%d (topic %s)", tkey, p, why)
                self.store.forget_partition(tkey, p)
        self.store.register_partitions([(tkey, p, pid) for (tkey, p), (_, _, pid) in wanted.items()])
        self.store.commit()                         # one sync for the whole change
        self.topics = topics
        self.local = {pid: (name, p) for name, p, pid in wanted.values()}
        self._loaded = True
        now = set(self.local)
        added, removed = now - before, before - now
        for pid in removed:
            self.store.set_cached(pid, None)
        for pid in added:   # (a topic's configs never change: set once, when hosted)
            self.store.set_cached(pid, self.write_caching(pid))
        return added, removed

    def _gone(self, store_key: str, registers: Mapping[str, Any]) -> str | None:
        """Why the cluster's metadata says local data ``<name>#<uuid>`` is no topic's any more
        ("deleted": the header is a tombstone; "replaced": a header of another uuid), or None
        when it does not say (no header held: a view that lost registers, as a broker whose
        clock went back once dropped its snapshot's, must not delete data). A gossip view
        without stamps (tests) goes by the live registers alone."""
        name, _, uuid = store_key.rpartition("#")
        header = registers.get(TOPIC_PREFIX + name)
        if isinstance(header, dict) and header.get("uuid") != uuid:
            return "replaced"
        stamp = getattr(self.gossip, "cluster_stamp", None)
        if stamp is None:
            return "deleted or replaced"
        held = stamp(TOPIC_PREFIX + name)
        if held is not None and held[2]:
            return "deleted"
        return None if header is None else "deleted or replaced"

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name!r}")
        return t

    def partition(self, name: str, partition: int) -> tuple[Topic, int | None]:
        """(topic, local pid or None if this node holds no replica)."""
        t = self.topic(name)
        if not isinstance(partition, int) or not 0 <= partition < t.partitions:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION,
                            f"topic {name!r} has partitions 0..{t.partitions - 1}, not {partition!r}")
        return t, t.pids[partition]

    def create(self, name: str, partitions: int, replication_factor: int, config: dict,
               live_nodes: list[str]) -> Topic:
        validate_topic_name(name)
        if name in self.topics:
            raise MeshError(ErrorCode.TOPIC_EXISTS, f"topic {name!r} already exists")
        if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"partitions must be 1..{MAX_PARTITIONS}")
        if type(replication_factor) is not int or not 1 <= replication_factor <= MAX_REPLICATION_FACTOR:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"replication factor must be 1..{MAX_REPLICATION_FACTOR}")
        self._check_room(partitions)
        cfg = normalize_config(config)
        try:
            replicas = place_replicas(partitions, replication_factor, live_nodes, self.leader_load())
        except ValueError as exc:
            raise MeshError(ErrorCode.INVALID_CONFIG, str(exc))
        t = Topic(name=name, uuid=uuidlib.uuid4().hex[:16], partitions=partitions,
                  replication_factor=replication_factor, config=cfg,
                  replicas=tuple(tuple(reps) for reps in replicas))
        for key, value in topic_registers(t).items():   # chunks first, the header last
            self.gossip.put_cluster(key, value)
        return t

    def _check_room(self, more: int) -> None:
        held = sum(t.partitions for t in self.topics.values())
        if held + more > MAX_CLUSTER_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"the cluster holds {held} partitions; at most {MAX_CLUSTER_PARTITIONS} in all "
                            f"(asked for {more} more): delete a topic first")

    def alter(self, name: str, partitions: int, replication_factor: int, live_nodes: list[str],
              config: dict | None = None) -> Topic:
        """Grow topic ``name`` to ``partitions`` (0: unchanged; only growth, as Kafka's
        CreatePartitions) and set its ``replication_factor`` (0: unchanged). New partitions
        are placed over ``live_nodes``, starting at the brokers that lead the fewest of the
        topic; existing partitions keep their replica lists, cluster ids and data (the uuid
        stays). A new replication factor only changes the header: each partition's leader
        then adds or removes replicas one at a time. Writes the changed chunks, then the
        header; returns the new row (without ``pids``)."""
        validate_topic_name(name)
        t = self.topic(name)
        if type(partitions) is not int or type(replication_factor) is not int:
            raise MeshError(ErrorCode.INVALID_REQUEST, "partitions and replication factor must be integers")
        if config is not None and not isinstance(config, dict):
            raise MeshError(ErrorCode.INVALID_CONFIG, "topic config must be a map of names to values")
        cfg = normalize_config({**t.config, **config}) if config else t.config   # the keys given, set
        if partitions == 0 and replication_factor == 0 and cfg == t.config:
            if config:
                return t                                # the same values again: a no-op
            raise MeshError(ErrorCode.INVALID_REQUEST, "nothing to alter: give partitions, a replication "
                                                       "factor or configs")
        if partitions and partitions <= t.partitions:
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"topic {name!r} has {t.partitions} partitions: partitions can only be added, "
                            f"asked for {partitions}")
        if partitions > MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"partitions must be 1..{MAX_PARTITIONS}")
        if partitions:
            self._check_room(partitions - t.partitions)
        rf = replication_factor or t.replication_factor
        if not 1 <= rf <= MAX_REPLICATION_FACTOR:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"replication factor must be 1..{MAX_REPLICATION_FACTOR}")
        live = sorted(set(live_nodes))
        if rf > len(live) and (rf != t.replication_factor or partitions):
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"replication factor {rf} is larger than the {len(live)} live broker(s) that are not draining")
        if rf == t.replication_factor and not partitions and cfg == t.config:
            return t                                    # nothing changes: an idempotent no-op
        replicas = self._table(t)
        if partitions:
            topic_lead: dict[str, int] = {}
            for reps in t.replicas:
                topic_lead[reps[0]] = topic_lead.get(reps[0], 0) + 1
            cluster_lead = self.leader_load()           # ties: the brokers leading least overall
            load = {n: (topic_lead.get(n, 0) << 32) + cluster_lead.get(n, 0) for n in live}
            try:
                replicas += [tuple(reps) for reps in place_replicas(partitions - t.partitions, rf, live, load)]
            except ValueError as exc:
                raise MeshError(ErrorCode.INVALID_CONFIG, str(exc))
        new = Topic(name=name, uuid=t.uuid, partitions=len(replicas), replication_factor=rf,
                    config=cfg, replicas=tuple(replicas))
        existing = self.gossip.cluster_items(f"{TPARTS_PREFIX}{name}/{t.uuid}/")
        for key, value in topic_registers(new).items():  # the changed chunks first, the header last
            if existing.get(key) != value:
                self.gossip.put_cluster(key, value)
        return new

    def _table(self, t: Topic) -> list[tuple[str, ...]]:
        """Topic ``t``'s replica table as its registers hold it (the initial replica lists,
        whatever membership changes did since), so an alter rewrites no existing entry."""
        key = topic_key(t.name)
        header = self.gossip.cluster_items(key).get(key)
        if isinstance(header, dict) and "replicas" in header:  # legacy: the table inline
            return [tuple(reps) for reps in header["replicas"]]
        chunk_keys = _chunk_keys(header, key) or []
        parts = self.gossip.cluster_items(f"{TPARTS_PREFIX}{t.name}/{t.uuid}/")
        table = [tuple(reps) for k in chunk_keys if isinstance(parts.get(k), dict)
                 for reps in parts[k].get("replicas", ())]
        if not isinstance(header, dict) or header.get("uuid") != t.uuid or len(table) != t.partitions:
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"topic {t.name!r} is being changed (its registers are still arriving here): retry")
        return table

    def delete(self, name: str) -> Topic:
        t = self.topic(name)
        for prefix in (TPARTS_PREFIX, PCONF_PREFIX, REASSIGN_PREFIX):
            for key in self.gossip.cluster_items(f"{prefix}{name}/"):
                self.gossip.delete_cluster(key)
        self.gossip.delete_cluster(topic_key(name))
        return t

    def leader_load(self) -> dict[str, int]:
        """Partitions per broker as preferred leader (placement evens them out)."""
        load: dict[str, int] = {}
        for t in self.topics.values():
            for reps in t.replicas:
                load[reps[0]] = load.get(reps[0], 0) + 1
        return load
