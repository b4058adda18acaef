"""The gossip key schema: every key the brokers store in gossip, in one place.

Gossip holds two kinds of state (``mesh.gossip``): each node's own *namespace* (keys only
that node writes; they vanish with the node's namespace) and cluster-wide *registers*
(last-writer-wins by stamp, any node may write, deletes leave tombstones).

No value has to fit one message by luck (DESIGN section 10): everything that grows with
the partitions of a topic is split into *chunks* of a bounded number of partitions, so
one entry stays far below the gossip entry limit (~60 KB) even at ``MAX_PARTITIONS``.
Per-partition chunks hold ``PARTITION_CHUNK`` partitions: chunk ``k`` covers partitions
``k * PARTITION_CHUNK`` up to ``(k + 1) * PARTITION_CHUNK - 1``. A topic's replica table
is chunked by size instead (at most ``TPARTS_CHUNK_PARTITIONS`` partitions and about
``TPARTS_CHUNK_BYTES``), each chunk saying which partition it starts at.

================================  =========  ==========================================  ====================  ======================
key                               kind       value (msgpack)                             written by            read by
================================  =========  ==========================================  ====================  ======================
``member``                        namespace  ``{"address": str, "text_port": int |      node loop, at start   metadata (cluster
                                             None, "store_id": str}``: the store id                            status)
                                             names the data directory's store
``kafka``                         namespace  ``{"host": str, "port": int, "id": int}``:  node loop, at start   the Kafka listeners
                                             this node's Kafka listener and its int32    (with --kafka-port)   (Metadata), cluster
                                             Kafka node id                                                     status
``recovering/<topic>/<k>``        namespace  ``[partition, ...]`` (ascending) of chunk   ``mesh.node.peers.publish``  metadata (cluster
                                             ``k``: replicas on this node refilling      every                 status, topic
                                             lost state; deleted when none               ``stats_every_ms``    describe)
``lead/<topic>/<k>``              namespace  ``{"<partition>": epoch}`` of chunk ``k``:  ``mesh.node.peers.publish``  leader view (metadata,
                                             partitions this node leads; deleted when    on a leadership       redirects)
                                             it leads none of them                       change
``stats/<topic>/<k>``             namespace  ``{"<partition>": [log_start, log_end,      ``mesh.node.peers.publish``  metadata answers
                                             high_watermark]}`` of chunk ``k``, for      every
                                             partitions this node leads                  ``stats_every_ms``
``off/<group>/<topic>/<n>``       namespace  ``{"g": group, "t": topic, "o":             group host, on        group hosts (the
                                             {"<partition>": [offset, metadata,          commit and adoption   merged offsets view)
                                             wall_ms]}}`` for partitions ``32n ..
                                             32n+31``
``topic/<name>``                  register   the header: ``{"name", "uuid",              catalog (create,      catalog (``reconcile``)
                                             "partitions", "replication_factor",         delete)
                                             "config", "chunks"}``
``tparts/<name>/<uuid>/<k>``      register   ``{"first": partition, "replicas":          catalog (create,      catalog (``reconcile``)
                                             [[node, ...], ...]}``: chunk ``k`` of the    delete)
                                             replica table, partitions ``first`` and up
``user/<name>``                   register   ``{"name", "public_key"}`` (a principal)    ``mesh.security``     ``mesh.security``,
                                             and optionally ``"scram"``: its Kafka                            the Kafka listener
                                             SCRAM credentials (``mesh.security.scram``)
``acl/<id>``                      register   ``{"principal", "permission",               ``mesh.security``     ``mesh.security``
                                             "operations", "resource", "name",
                                             "pattern"}``
``pconf/<name>/<uuid>/<p>``       register   ``{"v": version, "t": term, "voters":        the partition's       catalog (the current
                                             [...], "learners": [...], "committed":      leader, when its      replica set),
                                             bool}``: partition p's newest Raft config   config changes        balancer, metadata
                                             as its leader knows it (absent: the
                                             topic's replica table, version 0)
``broker/<id>``                   register   ``{"state": "active" | "draining"}``        ``mesh node           balancer, cluster
                                                                                         (de|re)commission``   status
``reassign/<name>/<uuid>/<p>``    register   ``{"replicas": [...]}``: a manual move's    ``mesh partition      balancer (the
                                             target; deleted by the leader once done     reassign``            partition's leader)
``load``                          namespace  ``{"bytes": int, "replicas": int,           ``mesh.node.ops.elastic``  balancer (bytes),
                                             "leaders": int}``: this broker's disk       every second, on      cluster status
                                             bytes and counts                            change
================================  =========  ==========================================  ====================  ======================

A topic is usable once its header and all ``chunks`` chunks with the header's uuid are
present (``mesh.cluster.catalog``); a delete tombstones the header and every chunk. The
exact shape of every value is checked by ``mesh.cluster.schema.validate_entry``.

Names may contain "/" (topics cannot, groups can): readers take the group and topic of an
``off/`` entry from its value, never by splitting the key.
"""
from __future__ import annotations

__all__ = [
    "MEMBER_KEY", "KAFKA_KEY", "RECOVERING_PREFIX", "LEAD_PREFIX", "STATS_PREFIX", "TOPIC_PREFIX", "TPARTS_PREFIX",
    "OFFSETS_PREFIX", "USER_PREFIX", "ACL_PREFIX", "PARTITION_CHUNK", "TPARTS_CHUNK_PARTITIONS",
    "TPARTS_CHUNK_BYTES", "OFFSETS_CHUNK_PARTITIONS", "REGISTER_PREFIXES",
    "lead_key", "stats_key", "recovering_key", "topic_key", "tparts_key", "topic_of_key", "chunk_of",
    "offsets_key", "user_key", "acl_key",
    "PCONF_PREFIX", "BROKER_PREFIX", "REASSIGN_PREFIX", "LOAD_KEY", "pconf_key", "broker_key", "reassign_key",
    "parse_partition_key",
]

MEMBER_KEY = "member"
KAFKA_KEY = "kafka"
RECOVERING_PREFIX = "recovering/"
LEAD_PREFIX = "lead/"
STATS_PREFIX = "stats/"
TOPIC_PREFIX = "topic/"
TPARTS_PREFIX = "tparts/"
OFFSETS_PREFIX = "off/"
USER_PREFIX = "user/"
ACL_PREFIX = "acl/"
PARTITION_CHUNK = 512           # partitions per lead/, stats/, recovering/ entry (stats: ~21 KB)
TPARTS_CHUNK_PARTITIONS = 1000  # at most this many partitions per tparts/ chunk ...
TPARTS_CHUNK_BYTES = 30_000     # ... and about this many bytes (long node ids, high RF)
OFFSETS_CHUNK_PARTITIONS = 32   # partitions per ``off/`` entry (metadata <= 256 chars: < 60 KB)
PCONF_PREFIX = "pconf/"
BROKER_PREFIX = "broker/"
REASSIGN_PREFIX = "reassign/"
LOAD_KEY = "load"
REGISTER_PREFIXES = (TOPIC_PREFIX, TPARTS_PREFIX, USER_PREFIX, ACL_PREFIX,
                     PCONF_PREFIX, BROKER_PREFIX, REASSIGN_PREFIX)   # cluster registers


def chunk_of(partition: int) -> int:
    """The chunk of ``lead/``, ``stats/`` and ``recovering/`` entries holding ``partition``."""
    return partition // PARTITION_CHUNK


def lead_key(topic: str, chunk: int) -> str:
    """``lead/<topic>/<k>``: the partitions of chunk ``k`` of ``topic`` the writer leads."""
    return f"{LEAD_PREFIX}{topic}/{chunk}"


def stats_key(topic: str, chunk: int) -> str:
    """``stats/<topic>/<k>``: offsets of the partitions of chunk ``k`` the writer leads."""
    return f"{STATS_PREFIX}{topic}/{chunk}"


def recovering_key(topic: str, chunk: int) -> str:
    """``recovering/<topic>/<k>``: partitions of chunk ``k`` the writer is refilling."""
    return f"{RECOVERING_PREFIX}{topic}/{chunk}"


def topic_key(name: str) -> str:
    """``topic/<name>``: the cluster register holding topic ``name``'s header."""
    return TOPIC_PREFIX + name


def tparts_key(name: str, uuid: str, chunk: int) -> str:
    """``tparts/<name>/<uuid>/<k>``: chunk ``k`` of the replica table of topic ``name``
    (the incarnation ``uuid``: a re-created name never mixes with the old one's chunks)."""
    return f"{TPARTS_PREFIX}{name}/{uuid}/{chunk}"


def topic_of_key(key: str) -> str:
    """The topic name of a ``topic/``, ``tparts/``, ``lead/``, ``stats/`` or ``recovering/``
    key (topic names contain no "/")."""
    if key.startswith(TOPIC_PREFIX):
        return key[len(TOPIC_PREFIX):]
    for prefix in (TPARTS_PREFIX, LEAD_PREFIX, STATS_PREFIX, RECOVERING_PREFIX):
        if key.startswith(prefix):
            return key[len(prefix):].split("/", 1)[0]
    raise ValueError(f"{key!r} is not a topic key")


def offsets_key(group: str, topic: str, chunk: int) -> str:
    """``off/<group>/<topic>/<chunk>``: the committed offsets of ``group`` on partitions
    ``chunk * OFFSETS_CHUNK_PARTITIONS`` and up of ``topic`` (the value names group and
    topic again: read those from it, never by splitting the key)."""
    return f"{OFFSETS_PREFIX}{group}/{topic}/{chunk}"


def user_key(name: str) -> str:
    """``user/<name>``: a principal and its CURVE public key (``mesh.security``)."""
    return USER_PREFIX + name


def acl_key(acl_id: str) -> str:
    """``acl/<id>``: one ACL rule (id: 16 hex characters)."""
    return ACL_PREFIX + acl_id


def pconf_key(name: str, uuid: str, partition: int) -> str:
    """``pconf/<name>/<uuid>/<p>``: partition ``p``'s newest Raft config, by its leader."""
    return f"{PCONF_PREFIX}{name}/{uuid}/{partition}"


def reassign_key(name: str, uuid: str, partition: int) -> str:
    """``reassign/<name>/<uuid>/<p>``: a manual reassignment's target for partition ``p``."""
    return f"{REASSIGN_PREFIX}{name}/{uuid}/{partition}"


def broker_key(node_id: str) -> str:
    """``broker/<id>``: a broker's operator-set state (active, draining)."""
    return BROKER_PREFIX + node_id


def parse_partition_key(key: str, prefix: str) -> tuple[str, str, int] | None:
    """(topic, uuid, partition) of a ``pconf/`` or ``reassign/`` key; None if malformed."""
    parts = key[len(prefix):].split("/")
    if not key.startswith(prefix) or len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])
