"""The three gossip wire messages: SYN, ACK, ACK2 (one exchange, see ``mesh.gossip.rounds``).

Flat lists of fields keep them compact and cheap to validate (``mesh.gossip.parsing``)::

    digest          [[node_id, generation, heartbeat, max_version, gc_version, address, left], ...]
    delta           [origin, generation, from_version, upto_version, gc_version, reset,
                     [key, version, value, deleted, ...]]
    cluster         16 bucket hashes (uint32), or [] when the store is empty / matched
    cluster_entries [key, clock, writer, value, deleted, ...]
    rows_hash       64 bucket hashes of the sender's rows (uint32, ``Membership.row_hashes``),
                    or [] when the digest is the sender's whole table, or [0] in a partial
                    SYN that omits them (every other one: ``rounds._HASHES_EVERY``)

A SYN's digest is the sender's whole table while it has at most ``FULL_DIGEST_ROWS``
rows; above that it is a *partial* digest (the sender's row, the receiver's, and a
rotating slice of the others: heartbeat news) plus ``rows_hash``, and only the rows of
buckets that differ are exchanged (``mesh.gossip.rounds``). An ACK2's ``digest`` carries
the rows of those buckets where the SYN's sender holds something else; an ACK2 with rows
may get one ACK2 back (the deltas its sender lacks).

SYN and ACK end with ``wall_ms``, the sender's wall clock when the message left (the node
shell stamps it; 0 when not stamped): what ``mesh.gossip.clock_offset`` estimates this
node's clock offset from.

With ``GossipConfig.probes`` (``mesh.gossip.probes``) two more messages carry liveness,
SWIM-style, with news piggybacked on each::

    GossipPing      a direct ping (``target`` empty), or a ping request: ping ``target``
                    for me and pass its answer back (SWIM's indirect probe)
    GossipPingAck   the answer; ``node_id`` is the node that answered the ping
    rows            [row, ...] rows worth spreading (refutations), ``Row`` layout
    suspects        [[node_id, generation, heartbeat, [suspecter, ...]], ...]

Digest rows and deltas are built as ``mesh.gossip.rows.Row`` and ``Delta`` (NamedTuples,
which msgpack encodes as exactly these arrays); decoded messages hold plain lists.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mesh.wire.codec import message

__all__ = ["GossipSyn", "GossipAck", "GossipAck2", "GossipPing", "GossipPingAck"]


@message("GOSSIP_SYN")
@dataclass(frozen=True, slots=True)
class GossipSyn:
    node_id: str
    digest: list
    cluster: list
    cluster_gc: int
    wall_ms: int = 0    # the sender's wall clock when it left (0: not stamped); see clock_offset
    rows_hash: list = field(default_factory=list)


@message("GOSSIP_ACK")
@dataclass(frozen=True, slots=True)
class GossipAck:
    node_id: str
    digest: list
    deltas: list
    cluster: list
    cluster_entries: list
    cluster_gc: int
    wall_ms: int = 0    # as in GossipSyn
    rows_hash: list = field(default_factory=list)


@message("GOSSIP_ACK2")
@dataclass(frozen=True, slots=True)
class GossipAck2:
    node_id: str
    deltas: list
    cluster_entries: list
    digest: list = field(default_factory=list)


@message("GOSSIP_PING")
@dataclass(frozen=True, slots=True)
class GossipPing:
    node_id: str
    seq: int
    target: str = ""       # empty: ping me; else ping this node for me (indirect probe)
    rows: list = field(default_factory=list)
    suspects: list = field(default_factory=list)


@message("GOSSIP_PING_ACK")
@dataclass(frozen=True, slots=True)
class GossipPingAck:
    node_id: str           # who answered the ping (the target, also when relayed)
    seq: int
    rows: list = field(default_factory=list)
    suspects: list = field(default_factory=list)
