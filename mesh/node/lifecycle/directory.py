"""Who is where, from this node's gossip view: live brokers, addresses, partition leaders.

Lookups only: liveness is the gossip core's (``up_members``), leader choice is
``mesh.cluster.leaders`` (a rule every broker applies alike); this module just feeds them
the node's clock and replicas and turns node ids into addresses for clients and peers.
"""
from __future__ import annotations

from typing import Callable

from mesh.cluster.catalog import Topic
from mesh.cluster.leaders import Leader, LeaderView

__all__ = ["Directory"]


class Directory:
    def __init__(self, node_id: str, address: str, gossip, wall_ms: Callable[[], int],
                 local_leader: Callable[[int], tuple[str | None, int] | None]):
        """``wall_ms``: the gossip core's clock; ``local_leader(pid)``: this node's replica's
        (leader, epoch), None if it hosts no replica of ``pid``."""
        self.node_id = node_id
        self.address = address
        self.gossip = gossip
        self.wall_ms = wall_ms
        self.leaders = LeaderView(node_id, gossip, local_leader)
        self._node_of_address: dict[str, str] = {}
        self._node_at_version = -1
        self._address_of: dict[str, str] = {}   # node id -> address, for gossip version ``_address_version``
        self._address_version = -1

    def live(self) -> list[str]:
        """Node ids of the brokers this node sees up, alive or suspect (itself included):
        where replicas go and whose leadership claims count. A suspect is a broker that
        missed a probe (one slow turn on a loaded host) and refutes it a round later;
        leaving it out refused topic creates and hid leaders meanwhile. A dead leader's
        claim loses to its successor's higher epoch anyway."""
        return self.gossip.up_members(self.wall_ms())

    def address_of(self, node_id: str) -> str | None:
        """Called on every message to a peer: a dict lookup, rebuilt only when the gossip
        state moved (a member's address changes only with a new row, which moves
        ``gossip.version``; ``members()`` computes every member's phi, too dear per send)."""
        if node_id == self.node_id:
            return self.address
        version = self.gossip.version
        if version != self._address_version:
            self._address_of = {mem.node_id: mem.address for mem in self.gossip.members(self.wall_ms())}
            self._address_version = version
        return self._address_of.get(node_id)

    def node_at(self, address: str) -> str | None:
        """The node id of the peer at ``address`` (None if gossip does not know it yet).
        Rebuilt when the gossip state moved (as ``address_of``), or on a miss: a map kept
        until the next miss gave a live broker's address to a forged row for good. Where
        rows share an address, live ones win, and among them the one mapped before (a
        newcomer claiming a live broker's address does not take it over)."""
        version = self.gossip.version
        node = self._node_of_address.get(address) if version == self._node_at_version else None
        if node is None:
            now = self.wall_ms()
            live = set(self.gossip.live_members(now))
            before = self._node_of_address
            members = sorted(self.gossip.members(now), key=lambda mem: (
                mem.node_id in live, before.get(mem.address) == mem.node_id, mem.node_id))
            self._node_of_address = {mem.address: mem.node_id for mem in members}   # the last wins
            self._node_at_version = version
            node = self._node_of_address.get(address)
        return node

    def leader(self, topic: Topic, partition: int, live: set[str] | None = None) -> Leader:
        """(leader node id or None, epoch); ``live`` defaults to ``self.live()``."""
        return self.leaders.leader(topic, partition, set(self.live()) if live is None else live)

    def leader_address(self, topic: Topic, partition: int) -> str | None:
        leader = self.leader(topic, partition).node_id
        return self.address_of(leader) if leader else None
