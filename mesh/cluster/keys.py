"""The gossip key schema: every key the brokers store in gossip, in one place.

Gossip holds two kinds of state (``mesh.gossip``): each node's own *namespace* (keys only
that node writes; they vanish with the node's namespace) and cluster-wide *registers*
(last-writer-wins by stamp, any node may write, deletes leave tombstones).

=============================  =========  ==============================================  ====================  ===========================
key                            kind       value (msgpack)                                 written by            read by
=============================  =========  ==============================================  ====================  ===========================
``member``                     namespace  ``{"address": str, "text_port": int | None,    node loop, at start   metadata (cluster status)
                                          "store_id": str}``: the store id names the
                                          data directory's store (``storage.datadir``)
``recovering``                 namespace  ``{topic: [partition, ...]}``: replicas on this  node loop, every      metadata (cluster status,
                                          node refilling lost state; deleted when none    ``stats_every_ms``    topic describe)
``lead/<topic>``               namespace  ``{"<partition>": epoch}``: partitions this     node loop, on a       leader view (metadata,
                                          node leads; deleted when it leads none          leadership change     redirects)
``stats``                      namespace  ``{topic: {"<partition>": [log_start,           node loop, every      metadata answers
                                          log_end, high_watermark]}}`` of partitions      ``stats_every_ms``
                                          this node leads
``off/<group>/<topic>/<n>``    namespace  ``{"g": group, "t": topic, "o": {"<partition>": group host, on       group hosts (the merged
                                          [offset, metadata, wall_ms]}}`` for partitions  commit and adoption   offsets view)
                                          ``32n .. 32n+31``
``topic/<name>``               register   ``{"name", "uuid", "partitions",                catalog (create,      catalog (``reconcile``)
                                          "replication_factor", "config", "replicas"}``   delete)
=============================  =========  ==============================================  ====================  ===========================

Names may contain "/" (topics cannot, groups can): readers take the group and topic of an
``off/`` entry from its value, never by splitting the key.
"""
from __future__ import annotations

__all__ = [
    "MEMBER_KEY", "STATS_KEY", "RECOVERING_KEY", "LEAD_PREFIX", "TOPIC_PREFIX", "OFFSETS_PREFIX",
    "lead_key", "topic_key", "topic_of_key", "OFFSETS_CHUNK_PARTITIONS", "offsets_key",
]

MEMBER_KEY = "member"
STATS_KEY = "stats"
RECOVERING_KEY = "recovering"
LEAD_PREFIX = "lead/"
TOPIC_PREFIX = "topic/"
OFFSETS_PREFIX = "off/"
OFFSETS_CHUNK_PARTITIONS = 32   # partitions per ``off/`` entry (metadata <= 256 chars: < 60 KB)


def lead_key(topic: str) -> str:
    """``lead/<topic>``: the partitions of ``topic`` the writing node leads, with epochs."""
    return LEAD_PREFIX + topic


def topic_key(name: str) -> str:
    """``topic/<name>``: the cluster register describing topic ``name``."""
    return TOPIC_PREFIX + name


def topic_of_key(key: str) -> str:
    """The topic name of a ``topic/<name>`` or ``lead/<topic>`` key."""
    for prefix in (TOPIC_PREFIX, LEAD_PREFIX):
        if key.startswith(prefix):
            return key[len(prefix):]
    raise ValueError(f"{key!r} is not a topic or leadership key")


def offsets_key(group: str, topic: str, chunk: int) -> str:
    """``off/<group>/<topic>/<chunk>``: the committed offsets of ``group`` on partitions
    ``chunk * OFFSETS_CHUNK_PARTITIONS`` and up of ``topic`` (the value names group and
    topic again: read those from it, never by splitting the key)."""
    return f"{OFFSETS_PREFIX}{group}/{topic}/{chunk}"
