"""Persistence of a node's gossip view: ``snapshot`` (msgpack data) and ``restore``.

A snapshot holds what this node knows of the others (rows, verdicts, namespaces,
graveyard) and the cluster registers with their clocks. Our own namespace is not
included: a restart is a new generation, which starts empty (the shell re-publishes
what it still holds). Restored origins start SUSPECT, unconfirmed, until their heartbeat
moves (R4), so a long-dead node is never shown alive after a restart.

A snapshot is checked like a message (R8, ``mesh.gossip.checks``) but dropped piece by
piece, so the node always starts: a cluster entry that fails (shape, a stamp beyond
2**53, a key of the wrong kind, a value the validator refuses) is dropped (a stamp later
than now plus the clock skew is kept with a warning: this node wrote it, so its clock went
back, and dropping the topics made it drop every local partition); a node row that fails is dropped with its namespace; a namespace with one bad
entry is dropped and its row's versions go back to 0, so peers send it again whole (a
namespace must stay a prefix of its origin's history, R1). Each drop is a warning
(logged, and returned for ``Gossip.load_warnings``). Stamps of the old Lamport scheme are small: simply older.

Layout (``format`` 1)::

    {"format": 1, "node_id", "generation", "clock", "cluster_gc",
     "cluster":   [key, clock, writer, value, deleted, stored_ms, ...],
     "nodes":     [[node_id, generation, heartbeat, max_version, gc_version, address, left,
                    status, since_ms, [key, version, value, deleted, stored_ms, ...], life], ...],
     (a node without the trailing life, as written before lives existed, loads with life 0)
     "graveyard": [[node_id, generation, heartbeat, removed_ms], ...]}
"""
from __future__ import annotations

import logging
from typing import Any

from mesh.gossip.checks import EntryCheck
from mesh.gossip.membership import Membership
from mesh.gossip.namespaces import Namespace
from mesh.gossip.registers import ClusterRegisters
from mesh.gossip.rows import (ALIVE, DEAD, ENTRY_OVERHEAD, LEFT, MAX_COUNTER, MAX_GENERATION, MAX_KEY_CHARS, MAX_LIFE,
                              MAX_NAME_CHARS, SUSPECT, Grave, Row, Verdict, register_size, size_of)

__all__ = ["take_snapshot", "restore_snapshot", "ForeignSnapshot"]


class ForeignSnapshot(ValueError):
    """The snapshot is another node's: the store under it is not this node's."""

_FORMAT = 1
_CLUSTER_FIELDS = 6          # per register: key, clock, writer, value, deleted, stored_ms
_NS_FIELDS = 5               # per namespace entry: key, version, value, deleted, stored_ms
_NODE_FIELDS = 10
_SHOWN_WARNINGS = 10

log = logging.getLogger("mesh.gossip.snapshot")


class _Bad(Exception):
    """One piece of a snapshot that fails its checks (dropped, with this reason)."""


def _name(v: Any, what: str, limit: int = MAX_NAME_CHARS) -> str:
    if type(v) is not str or not 1 <= len(v) <= limit:
        raise _Bad(f"{what}: not a string of 1..{limit} characters")
    return v


def _count(v: Any, what: str, top: int = MAX_COUNTER) -> int:
    if type(v) is not int or not 0 <= v <= top:
        raise _Bad(f"{what}: {v!r} is not an int within 0..{top}")
    return v


def _flag(v: Any, what: str) -> bool:
    if type(v) is not bool and v not in (0, 1):
        raise _Bad(f"{what}: not a bool")
    return bool(v)


def _flat(v: Any, fields: int, what: str) -> list:
    if not isinstance(v, (list, tuple)) or len(v) % fields:
        raise _Bad(f"{what}: not a flat list of {fields}-field entries")
    return list(v)


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
        nodes.append([*row[:7], st, since, ents, row.life])
    cluster = []
    for k, e in sorted(registers.entries.items()):
        cluster += [k, e.clock, e.writer, e.value, e.deleted, e.stored_ms]
    return {
        "format": _FORMAT, "node_id": members.node_id, "generation": members.generation,
        "clock": registers.clock, "cluster_gc": registers.gc_clock, "cluster": cluster,
        "nodes": nodes,
        "graveyard": [[o, g.generation, g.heartbeat, g.removed_ms] for o, g in members.graveyard.items()],
    }


def restore_snapshot(snap: dict, members: Membership, registers: ClusterRegisters, now_ms: int,
                     check: EntryCheck) -> list[str]:
    """Load ``snap`` into a freshly built node; returns a warning for each piece dropped.
    ValueError only if the snapshot is another node's, another format, or not older."""
    if not isinstance(snap, dict):
        raise ValueError("unusable gossip snapshot: not a map")
    if snap.get("format") != _FORMAT:
        raise ValueError(f"gossip snapshot of another format ({snap.get('format')!r})")
    if snap.get("node_id") != members.node_id:
        raise ForeignSnapshot(f"gossip snapshot belongs to another node ({str(snap.get('node_id'))[:255]!r})")
    if type(snap.get("generation")) is not int or snap["generation"] >= members.generation:
        raise ValueError(f"generation must increase across restarts: snapshot has "
                         f"{snap.get('generation')}, starting with {members.generation}")
    warnings: list[str] = []
    _restore_cluster(snap, members.node_id, registers, now_ms, check, warnings)
    nodes = snap.get("nodes")
    if not isinstance(nodes, (list, tuple)):
        warnings.append("every node dropped: 'nodes' is not a list")
        nodes = []
    rows = members.rows
    for node in nodes:
        try:
            o, gen, hb, mv, gc, addr, left, st, since, ents, life = _node(node)
        except _Bad as exc:
            warnings.append(f"node dropped: {exc}"[:300])
            continue
        if o == members.node_id or o in rows or len(rows) >= members.config.max_nodes:
            continue
        ns = None
        if ents:
            try:
                ns = _namespace(o, ents, mv, check, now_ms)
            except (_Bad, TypeError) as exc:
                warnings.append(f"node {o!r}: namespace dropped (peers send it again): {exc}"[:300])
                mv = gc = 0
        rows[o] = Row(o, gen, hb, mv, gc, addr, left, life)
        if ns is not None:
            members.namespaces[o] = ns
        if left:
            members.status[o] = Verdict(LEFT, min(since, now_ms))
        elif st == DEAD:
            members.status[o] = Verdict(DEAD, min(since, now_ms))
        else:
            members.status[o] = Verdict(SUSPECT, now_ms)   # unconfirmed until its heartbeat moves
        members.retarget(o)
    graves = snap.get("graveyard")
    for grave in graves if isinstance(graves, (list, tuple)) else ():
        try:
            if not isinstance(grave, (list, tuple)) or len(grave) != 4:
                raise _Bad("not [node_id, generation, heartbeat, removed_ms]")
            o, gen, hb, removed = grave
            _name(o, "grave")
            _count(gen, f"grave {o!r}: generation", MAX_GENERATION - 1)
            _count(hb, f"grave {o!r}: heartbeat")
            _count(removed, f"grave {o!r}: removed_ms")
        except _Bad as exc:
            warnings.append(f"grave dropped: {exc}"[:300])
            continue
        if o not in rows:
            members.graveyard[o] = Grave(gen, hb, min(removed, now_ms))
    members.version += 1
    if warnings:
        log.warning("gossip snapshot of %s: %d pieces fail the checks and were dropped (peers send them "
                    "again): %s%s", members.node_id, len(warnings), "; ".join(warnings[:_SHOWN_WARNINGS]),
                    " ..." if len(warnings) > _SHOWN_WARNINGS else "")
    return warnings


def _restore_cluster(snap: dict, node_id: str, registers: ClusterRegisters, now_ms: int, check: EntryCheck,
                     warnings: list[str]) -> None:
    """The snapshot's cluster clocks and registers (``restore_snapshot``); a warning for each
    piece dropped."""
    # This node wrote its snapshot: a stamp later than its clock says the clock went back
    # (a restart with a wrong clock), not that the stamp is forged. Dropping those registers
    # emptied the topic table of a broker started a day behind, and it dropped every local
    # partition as "topic deleted or replaced"; they are kept (and counted in one warning).
    limit = MAX_COUNTER
    ahead = 0
    try:
        registers.clock = max(registers.clock, _count(snap.get("clock"), "clock", limit))
    except _Bad as exc:
        warnings.append(f"cluster clock ignored: {exc}")
    try:
        registers.gc_clock = _count(snap.get("cluster_gc"), "cluster gc clock", limit)
    except _Bad as exc:
        warnings.append(f"cluster gc clock ignored: {exc}")
    try:
        c = _flat(snap.get("cluster"), _CLUSTER_FIELDS, "cluster")
    except _Bad as exc:
        warnings.append(f"every cluster entry dropped: {exc}")
        c = []
    for i in range(0, len(c), _CLUSTER_FIELDS):
        key, clock, writer, value, deleted, stored = c[i:i + _CLUSTER_FIELDS]
        try:
            _name(key, "key", MAX_KEY_CHARS)
            _count(clock, f"{key!r}: stamp", limit)
            ahead += clock > check.stamp_limit(now_ms)
            _name(writer, f"{key!r}: writer")
            deleted = _flag(deleted, f"{key!r}: deleted")
            _count(stored, f"{key!r}: stored_ms")
            size = register_size(key, value, writer)
            why = check.register_entry(key, value, deleted, now_ms)
            if why is not None:
                raise _Bad(why)
        except (_Bad, TypeError) as exc:
            warnings.append(f"cluster entry dropped: {exc}"[:300])
            continue
        registers.store(key, clock, writer, value, deleted, size, min(stored, now_ms))
    if ahead:
        log.warning("gossip snapshot of %s: %d cluster entries are stamped more than %d ms after this "
                    "node's clock (kept: is the clock behind?)", node_id, ahead, check.max_clock_skew_ms)


def _node(node: Any) -> tuple:
    if not isinstance(node, (list, tuple)) or len(node) not in (_NODE_FIELDS, _NODE_FIELDS + 1):
        raise _Bad(f"not a {_NODE_FIELDS}-field row")
    o, gen, hb, mv, gc, addr, left, st, since, ents = node[:_NODE_FIELDS]
    life = node[_NODE_FIELDS] if len(node) > _NODE_FIELDS else 0     # (snapshots before lives: unknown)
    _name(o, "node id")
    _count(life, f"node {o!r}: life", MAX_LIFE - 1)
    _count(gen, f"node {o!r}: generation", MAX_GENERATION - 1)
    for v, what in ((hb, "heartbeat"), (mv, "max version"), (gc, "gc version"), (since, "since_ms")):
        _count(v, f"node {o!r}: {what}")
    _name(addr, f"node {o!r}: address")
    if st not in (ALIVE, SUSPECT, DEAD, LEFT):
        raise _Bad(f"node {o!r}: status {st!r}")
    ents = _flat(ents if ents else [], _NS_FIELDS, f"node {o!r}: namespace")
    return o, gen, hb, mv, gc, addr, _flag(left, f"node {o!r}: left"), st, since, ents, life


def _namespace(o: str, ents: list, max_version: int, check: EntryCheck, now_ms: int) -> Namespace:
    ns = Namespace()
    prev = 0
    for i in range(0, len(ents), _NS_FIELDS):
        k, v, value, deleted, stored = ents[i:i + _NS_FIELDS]
        _name(k, "key", MAX_KEY_CHARS)
        if type(v) is not int or not prev < v <= max_version:
            raise _Bad(f"{k!r}: version {v!r} not ascending within 1..{max_version}")
        prev = v
        deleted = _flag(deleted, f"{k!r}: deleted")
        _count(stored, f"{k!r}: stored_ms")
        why = check.node_entry(k, value, deleted, now_ms)
        if why is not None:
            raise _Bad(why)
        ns.put(k, v, value, deleted, min(stored, now_ms), ENTRY_OVERHEAD + size_of(k) + size_of(value))
    return ns
