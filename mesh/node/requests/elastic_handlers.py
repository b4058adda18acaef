"""The node's answers to the elastic-cluster admin requests (issue 14).

``BrokerStateRequest`` (``mesh node decommission|recommission``) and ``ReassignRequest``
(``mesh partition reassign``) write cluster registers (``broker/<id>``,
``reassign/<topic>/<uuid>/<p>``), exactly as topic create writes ``topic/<name>``: commit
the turn first, write the register, persist the gossip snapshot with its own commit
(``apply_cluster_change``), then answer. Every partition's leader reads them in its next
balancing round (``mesh.node.ops.elastic``). ``ListMovesRequest`` answers the moves that
partitions led *here* have in progress; ``mesh partition moves`` asks every broker.

Checks: a broker state names a broker gossip knows (or one a partition names) and is
``active`` or ``draining``; a reassignment names an existing partition and 1..16 distinct
brokers gossip knows, none of them draining.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from mesh.cluster import keys
from mesh.cluster.catalog import MAX_REPLICATION_FACTOR
from mesh.cluster.liveness import draining_ids
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["ElasticHandlers"]

log = logging.getLogger("mesh.node.ops.elastic")


def _invalid(text: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_REQUEST, text)


class ElasticHandlers:
    def __init__(self, *, gossip, catalog, elastic, commit_turn: Callable[[], Any],
                 apply_cluster_change: Callable[[], bool], reply: Callable, wall_ms: Callable[[], int]) -> None:
        self.gossip = gossip
        self.catalog = catalog
        self.elastic = elastic
        self.commit_turn = commit_turn
        self.apply_cluster_change = apply_cluster_change
        self.reply = reply
        self.wall_ms = wall_ms

    def table(self) -> dict[type, Callable]:
        return {m.BrokerStateRequest: self.on_broker_state, m.ReassignRequest: self.on_reassign,
                m.ListMovesRequest: self.on_list_moves}

    def _known(self) -> set[str]:
        known = {mem.node_id for mem in self.gossip.members(self.wall_ms())}
        for t in self.catalog.topics.values():
            for p in range(t.partitions):
                known.update(t.members_of(p))
        return known

    def _persist(self, what: str) -> None:
        if not self.apply_cluster_change():
            raise MeshError(ErrorCode.STORAGE_ERROR, f"{what} written but not persisted here (storage error)")

    def on_broker_state(self, ident, rid, req: m.BrokerStateRequest, payload) -> None:
        if req.state not in (m.BROKER_ACTIVE, m.BROKER_DRAINING):
            raise _invalid(f"a broker state is {m.BROKER_ACTIVE!r} or {m.BROKER_DRAINING!r}, not {req.state!r}")
        if req.node_id not in self._known():
            raise _invalid(f"no broker {req.node_id!r} in this cluster")
        self.commit_turn()
        self.gossip.put_cluster(keys.broker_key(req.node_id), {"state": req.state})
        self._persist("broker state")
        log.info("broker %s is now %s", req.node_id, req.state)
        self.reply(ident, rid, m.BrokerStateResponse(0))

    def on_reassign(self, ident, rid, req: m.ReassignRequest, payload) -> None:
        t, _ = self.catalog.partition(req.topic, req.partition)   # UNKNOWN_TOPIC / UNKNOWN_PARTITION
        key = keys.reassign_key(t.name, t.uuid, req.partition)
        reps = req.replicas
        if reps == []:
            self.commit_turn()
            self.gossip.delete_cluster(key)
            self._persist("cancellation")
            self.reply(ident, rid, m.ReassignResponse(0, "reassignment cancelled"))
            return
        if (not all(type(x) is str and 0 < len(x) <= 255 for x in reps) or len(set(reps)) != len(reps)
                or not 1 <= len(reps) <= MAX_REPLICATION_FACTOR):
            raise _invalid(f"replicas are 1..{MAX_REPLICATION_FACTOR} distinct broker ids")
        unknown = sorted(set(reps) - self._known())
        if unknown:
            raise _invalid(f"no broker {', '.join(unknown)} in this cluster")
        down = sorted(set(reps) - set(self.gossip.live_members(self.wall_ms())))
        if down:   # as Kafka: a replica could not be added there, and the move would wait forever
            raise _invalid(f"broker {', '.join(down)} is not alive")
        draining_now = draining_ids(self.gossip.cluster_items(keys.BROKER_PREFIX))
        draining = [x for x in reps if x in draining_now]
        if draining:
            raise _invalid(f"broker {', '.join(draining)} is being decommissioned")
        self.commit_turn()
        self.gossip.put_cluster(key, {"replicas": list(reps)})
        self._persist("reassignment")
        log.info("%s/%d: reassignment to %s requested", t.name, req.partition, ",".join(reps))
        self.reply(ident, rid, m.ReassignResponse(0))

    def on_list_moves(self, ident, rid, req: m.ListMovesRequest, payload) -> None:
        topics = None if req.topics is None else {str(x) for x in req.topics}   # a set: one lookup each
        self.reply(ident, rid, m.ListMovesResponse(0, self.elastic.moves(topics)))
