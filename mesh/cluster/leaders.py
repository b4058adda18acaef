"""The leader view: who leads each partition, as far as this node can tell.

Every broker answers metadata requests and redirects clients (NOT_LEADER with the leader's
address), so every broker needs an opinion on every partition's leader, including the
partitions it does not replicate. Two sources:

1. this node's own replica, if it has one and the replica knows a leader: the replication
   core's (leader, epoch) is the freshest word there is;
2. otherwise the claims in gossip: a leader announces itself in its namespace as
   ``lead/<topic>/<k>`` = ``{"<partition>": epoch}`` for the partitions of chunk ``k``
   (``mesh.cluster.keys.chunk_of``; ``lead_claims`` builds these values). Of the
   partition's replicas that this node sees live (and that are not itself: its own claims
   are covered by rule 1), the one claiming the highest epoch wins; on equal epochs the
   first in replica order. A stale claim of a dead leader is ignored because dead nodes
   are not live; a stale claim of a deposed but live leader loses to its successor's
   higher epoch as soon as that one is gossiped.

No claim: no leader (``NO_LEADER``, epoch -1), and clients retry.

``LeaderView`` reads each node's ``lead/`` entries once per gossip version (a metadata
answer for 10,000 partitions must not scan a namespace per partition).
"""
from __future__ import annotations

from typing import Callable, Collection, Iterable, NamedTuple

from mesh.cluster.catalog import Topic
from mesh.cluster.keys import LEAD_PREFIX, PARTITION_CHUNK, chunk_of, lead_key

__all__ = ["Leader", "LeaderView", "NO_LEADER", "choose_leader", "lead_claims"]


class Leader(NamedTuple):
    node_id: str | None
    epoch: int          # -1 when there is no leader


NO_LEADER = Leader(None, -1)


def choose_leader(replicas: Collection[str], self_id: str, local: tuple[str | None, int] | None,
                  live: Collection[str], claim_of: Callable[[str], int | None]) -> Leader:
    """The leader of one partition (see the module docstring). ``local``: this node's
    replica's (leader, epoch), None if it holds no replica; ``claim_of(node)``: the epoch
    ``node`` claims in gossip for this partition, or None."""
    if local is not None and local[0] is not None:
        return Leader(local[0], local[1])
    best = NO_LEADER
    for node in replicas:
        if node in live and node != self_id:
            epoch = claim_of(node)
            if epoch is not None and epoch > best.epoch:
                best = Leader(node, epoch)
    return best


def lead_claims(topic: Topic, epoch_if_leading: Callable[[int], int | None],
                chunks: Iterable[int] | None = None) -> dict[str, dict[str, int]]:
    """This node's ``lead/<topic>/<k>`` values: key -> ``{"<partition>": epoch}`` for the
    partitions of ``topic`` it leads, chunk by chunk; a chunk where it leads none is left
    out (its key is to be deleted). ``epoch_if_leading(pid)``: the epoch if this node leads
    local partition ``pid``, else None. ``chunks``: only these chunks (default: all)."""
    n = len(topic.pids)
    out: dict[str, dict[str, int]] = {}
    for k in sorted(set(range(chunk_of(n - 1) + 1) if chunks is None else chunks)):
        led: dict[str, int] = {}
        for p in range(k * PARTITION_CHUNK, min(n, (k + 1) * PARTITION_CHUNK)):
            pid = topic.pids[p]
            if pid is not None:
                epoch = epoch_if_leading(pid)
                if epoch is not None:
                    led[str(p)] = epoch
        if led:
            out[lead_key(topic.name, k)] = led
    return out


class LeaderView:
    """``choose_leader`` over this node's gossip view and its replicas.

    ``local_leader(pid)``: the local replica's (leader, epoch), or None if this node does not
    host ``pid``."""

    def __init__(self, node_id: str, gossip, local_leader: Callable[[int], tuple[str | None, int] | None]):
        self.node_id = node_id
        self.gossip = gossip
        self.local_leader = local_leader
        self._version = None
        self._claims: dict[str, dict[str, object]] = {}   # node -> its lead/ entries

    def claim(self, node_id: str, topic: str, partition: int) -> int | None:
        """The epoch ``node_id`` claims in gossip for ``topic``/``partition``, or None."""
        version = self.gossip.version
        if version != self._version:
            self._version, self._claims = version, {}
        entries = self._claims.get(node_id)
        if entries is None:
            entries = self._claims[node_id] = self.gossip.node_items(node_id, LEAD_PREFIX)
        led = entries.get(lead_key(topic, chunk_of(partition)))
        epoch = led.get(str(partition)) if isinstance(led, dict) else None
        return epoch if type(epoch) is int else None

    def leader(self, topic: Topic, partition: int, live: Collection[str]) -> Leader:
        pid = topic.pids[partition]
        local = self.local_leader(pid) if pid is not None else None
        return choose_leader(topic.replicas[partition], self.node_id, local, live,
                             lambda node: self.claim(node, topic.name, partition))
