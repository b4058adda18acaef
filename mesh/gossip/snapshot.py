"""Persistence of a node's gossip view: ``snapshot`` (msgpack data) and ``restore``.

A snapshot holds what this node knows of the others (rows, verdicts, namespaces,
graveyard) and the cluster registers with their clocks. Our own namespace is not
included: a restart is a new generation, which starts empty (the shell re-publishes
what it still holds). Restored origins start SUSPECT, unconfirmed, until their heartbeat
moves (R4), so a long-dead node is never shown alive after a restart.

Layout (``format`` 1)::

    {"format": 1, "node_id", "generation", "clock", "cluster_gc",
     "cluster":   [key, clock, writer, value, deleted, stored_ms, ...],
     "nodes":     [[node_id, generation, heartbeat, max_version, gc_version, address, left,
                    status, since_ms, [key, version, value, deleted, stored_ms, ...]], ...],
     "graveyard": [[node_id, generation, heartbeat, removed_ms], ...]}
"""
from __future__ import annotations

from mesh.gossip.membership import Membership
from mesh.gossip.namespaces import Namespace
from mesh.gossip.registers import ClusterRegisters
from mesh.gossip.rows import ALIVE, DEAD, ENTRY_OVERHEAD, LEFT, SUSPECT, Grave, Row, Verdict, register_size, size_of

__all__ = ["take_snapshot", "restore_snapshot"]

_FORMAT = 1
_CLUSTER_FIELDS = 6          # per register: key, clock, writer, value, deleted, stored_ms
_NS_FIELDS = 5               # per namespace entry: key, version, value, deleted, stored_ms


def take_snapshot(members: Membership, registers: ClusterRegisters) -> dict:
    """This node's view of the cluster, msgpack-able."""
    nodes = []
    for o in sorted(members.rows):
        if o == members.node_id:
            continue
        row = members.rows[o]
        st, since = members.status.get(o, (ALIVE, members.now_ms))
        ns = members.namespaces.get(o)
        ents = []
        if ns is not None:
            for v, k in ns.by_version.items():
                e = ns.entries[k]
                ents += [k, v, e.value, e.deleted, e.stored_ms]
        nodes.append([*row, st, since, ents])
    cluster = []
    for k, e in sorted(registers.entries.items()):
        cluster += [k, e.clock, e.writer, e.value, e.deleted, e.stored_ms]
    return {
        "format": _FORMAT, "node_id": members.node_id, "generation": members.generation,
        "clock": registers.clock, "cluster_gc": registers.gc_clock, "cluster": cluster,
        "nodes": nodes,
        "graveyard": [[o, g.generation, g.heartbeat, g.removed_ms] for o, g in members.graveyard.items()],
    }


def restore_snapshot(snap: dict, members: Membership, registers: ClusterRegisters, now_ms: int) -> None:
    """Load ``snap`` into a freshly built node; ValueError if it is unusable."""
    try:
        if snap.get("format") != _FORMAT or snap.get("node_id") != members.node_id:
            raise ValueError("gossip snapshot belongs to another node or format")
        if not isinstance(snap.get("generation"), int) or snap["generation"] >= members.generation:
            raise ValueError(f"generation must increase across restarts: snapshot has "
                             f"{snap.get('generation')}, starting with {members.generation}")
        registers.clock = max(registers.clock, int(snap["clock"]))
        registers.gc_clock = int(snap["cluster_gc"])
        c = snap["cluster"]
        for i in range(0, len(c), _CLUSTER_FIELDS):
            key, clock, writer, value, deleted, stored = c[i:i + _CLUSTER_FIELDS]
            registers.store(key, clock, writer, value, bool(deleted), register_size(key, value, writer),
                            min(stored, now_ms))
        rows = members.rows
        for o, gen, hb, mv, gc, addr, left, st, since, ents in snap["nodes"]:
            if o == members.node_id or len(rows) >= members.config.max_nodes:
                continue
            rows[o] = Row(o, gen, hb, mv, gc, addr, bool(left))
            if ents:
                ns = members.namespaces[o] = Namespace()
                for i in range(0, len(ents), _NS_FIELDS):
                    k, v, value, deleted, stored = ents[i:i + _NS_FIELDS]
                    ns.put(k, v, value, bool(deleted), min(stored, now_ms),
                           ENTRY_OVERHEAD + size_of(k) + size_of(value))
            if left:
                members.status[o] = Verdict(LEFT, min(since, now_ms))
            elif st == DEAD:
                members.status[o] = Verdict(DEAD, min(since, now_ms))
            else:
                members.status[o] = Verdict(SUSPECT, now_ms)   # unconfirmed until its heartbeat moves
            members.retarget(o)
        for o, gen, hb, removed in snap["graveyard"]:
            if o not in rows:
                members.graveyard[o] = Grave(gen, hb, min(removed, now_ms))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"unusable gossip snapshot: {exc}") from exc
    members.version += 1
