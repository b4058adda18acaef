"""Per-origin namespaces, and the deltas that copy them from node to node.

Every node owns a *namespace*: keys that only it writes (its member info, the leaderships
it holds, offsets committed through it). Each write takes the next *version* of that
namespace (1, 2, 3, ... within one generation); a key holds only its latest version; a
delete leaves a *tombstone* (a versioned "deleted" entry). The origin's ``Row`` carries
its *max version* (the newest version held here) and its *gc version*.

A delta for one origin is every entry with a version above the receiver's max version,
oldest first. Deltas of one message are bounded by ``max_delta_bytes``; a truncated delta
says how far it goes (``upto_version``), so the receiver always holds a *prefix* of the
origin's history and asks for the rest next round.

Rules:
R1 Prefix: a receiver applies a delta only if it holds the same generation of that
   origin and its max version >= the delta's ``from_version``; it skips entries at or
   below its max version. Duplicated, reordered or replayed messages are therefore
   harmless.
R3 Tombstones are collected ``tombstone_gc_ms`` after a node stored them; the node then
   records the highest collected version as the origin's *gc version*. A peer whose
   ``max(max version, gc version)`` is below my gc version may still hold a key whose
   tombstone is gone, so it gets a *reset*: its copy is replaced by mine.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Iterable

from mesh.gossip.rows import (DELTA_OVERHEAD, ENTRY_FIELDS, ENTRY_OVERHEAD, Budget, Delta, Entry, Row,
                              check_key, entry_size, size_of)

if TYPE_CHECKING:
    from mesh.gossip.membership import Membership

__all__ = ["Namespace", "Namespaces"]


class Namespace:
    """One origin's keys at one generation. ``by_version`` lists keys in version order."""

    __slots__ = ("entries", "by_version", "tombstones")

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.by_version: dict[int, str] = {}   # ascending: versions only ever append
        self.tombstones = 0

    def put(self, key: str, version: int, value: Any, deleted: bool, now_ms: int, size: int) -> None:
        old = self.entries.get(key)
        if old is not None:
            del self.by_version[old.version]
            if old.deleted:
                self.tombstones -= 1
        self.entries[key] = Entry(version, value, deleted, now_ms, size)
        self.by_version[version] = key
        if deleted:
            self.tombstones += 1

    def since(self, version: int) -> list[tuple[int, str]]:
        """(version, key) above ``version``, ascending."""
        if version <= 0:
            return list(self.by_version.items())
        out = []
        for v in reversed(self.by_version):
            if v <= version:
                break
            out.append((v, self.by_version[v]))
        out.reverse()
        return out

    def collect(self, older_than_ms: int) -> int:
        """Drop tombstones stored before ``older_than_ms``; the highest dropped version (or 0)."""
        top = 0
        for key in [k for k, e in self.entries.items() if e.deleted and e.stored_ms <= older_than_ms]:
            version = self.entries.pop(key).version
            del self.by_version[version]
            self.tombstones -= 1
            top = max(top, version)
        return top

    def check(self, origin: str, row: Row) -> None:
        assert list(self.by_version) == sorted(self.by_version), f"{origin}: versions out of order"
        assert len(self.by_version) == len(self.entries), f"{origin}: index size"
        assert all(self.entries[k].version == v for v, k in self.by_version.items()), f"{origin}: index"
        assert not self.by_version or max(self.by_version) <= row.max_version, \
            f"{origin}: entry above max version"
        assert self.tombstones == sum(1 for e in self.entries.values() if e.deleted), f"{origin}: tombstones"


class Namespaces:
    """Own writes, outgoing deltas and incoming deltas over ``Membership.namespaces``.

    Membership owns the table of origins (row, status, namespace) and drops a namespace
    when it replaces or collects its origin; this class changes namespace contents and
    the max/gc versions in the rows.
    """

    def __init__(self, members: Membership, rng: random.Random, stats: dict[str, int],
                 max_entry_bytes: int) -> None:
        self._members = members
        self._node_id = members.node_id
        self._by_origin = members.namespaces
        self._rng = rng
        self._stats = stats
        self._max_entry_bytes = max_entry_bytes
        self.version = 0                    # moves on every change (see Gossip.version)

    # ------------------------------------------------------------- own writes ----------

    def set_local(self, key: str, value: Any, now_ms: int) -> None:
        check_key(key)
        size = entry_size(key, value, self._max_entry_bytes)
        ns = self._by_origin.get(self._node_id)
        if ns is None:
            ns = self._by_origin[self._node_id] = Namespace()
        old = ns.entries.get(key)
        if old is not None and not old.deleted and old.value == value and type(old.value) is type(value):
            return
        self._own_write(ns, key, value, False, size, now_ms)

    def delete_local(self, key: str, now_ms: int) -> None:
        check_key(key)
        ns = self._by_origin.get(self._node_id)
        old = None if ns is None else ns.entries.get(key)
        if old is None or old.deleted:
            return
        self._own_write(ns, key, None, True, ENTRY_OVERHEAD + size_of(key), now_ms)

    def _own_write(self, ns: Namespace, key: str, value: Any, deleted: bool, size: int,
                   now_ms: int) -> None:
        row = self._members.rows[self._node_id]
        version = row.max_version + 1
        ns.put(key, version, value, deleted, now_ms, size)
        self._members.set_row(row._replace(max_version=version))
        self.version += 1

    # ---------------------------------------------------------------- reads ------------

    def items(self, origin: str, prefix: str = "") -> dict[str, Any]:
        """Live keys of ``origin``'s namespace (as far as this node knows), sorted by key."""
        ns = self._by_origin.get(origin)
        if ns is None:
            return {}
        return {k: e.value for k, e in sorted(ns.entries.items()) if not e.deleted and k.startswith(prefix)}

    def entry_version(self, origin: str, key: str) -> tuple[int, int, bool] | None:
        """(generation, version, deleted) of ``key`` in ``origin``'s namespace, if held."""
        ns = self._by_origin.get(origin)
        e = None if ns is None else ns.entries.get(key)
        return None if e is None else (self._members.rows[origin].generation, e.version, e.deleted)

    # ------------------------------------------------------------- deltas out ----------

    def deltas(self, peer_rows: Iterable[tuple[str, Row | None]], budget: Budget) -> list[Delta]:
        """Deltas the peer lacks, given its rows; origins in random order when truncating.

        What is taken is charged to ``budget`` (shared with the message's cluster entries).
        """
        rows = self._members.rows
        wanted = []
        for o, peer in peer_rows:
            row = rows.get(o)
            if row is None or o == "" or (peer is not None and peer.generation > row.generation):
                continue
            if peer is not None and peer.generation == row.generation and peer.life != row.life \
                    and peer.life and row.life:
                continue                                    # another life of o (R2): not its keys
            if peer is None or peer.generation < row.generation:
                if row.max_version > 0:
                    wanted.append((o, 0, False))
            elif max(peer.max_version, peer.gc_version) < row.gc_version:
                wanted.append((o, 0, True))                 # R3: behind the horizon
            elif peer.max_version < row.max_version:
                wanted.append((o, peer.max_version, False))
        if len(wanted) > 1:
            self._rng.shuffle(wanted)
        out = []
        for o, frm, reset in wanted:
            if budget.left_bytes < DELTA_OVERHEAD + len(o):
                self._stats["truncated"] += 1
                break
            d = self._delta(o, frm, reset, budget, first=not out)
            if d is not None:
                out.append(d)
                if reset:
                    self._stats["resets_sent"] += 1
        return out

    def _delta(self, o: str, frm: int, reset: bool, budget: Budget, first: bool) -> Delta | None:
        row = self._members.rows[o]
        ns = self._by_origin.get(o)
        left = budget.left_bytes - DELTA_OVERHEAD - len(o)
        ents: list = []
        upto = row.max_version
        if ns is not None:
            for v, k in ns.since(frm):
                e = ns.entries[k]
                if e.size_bytes > left and (ents or not first):
                    upto = ents[-3] if ents else frm      # the last version taken
                    self._stats["truncated"] += 1
                    break
                left -= e.size_bytes
                ents += [k, v, e.value, e.deleted]
        if upto <= frm and not reset:
            return None
        budget.left_bytes = left
        return Delta(o, row.generation, frm, upto, row.gc_version, reset, ents)

    # ------------------------------------------------------------- deltas in -----------

    def apply(self, deltas: list[tuple[Delta, list[int]]], now_ms: int) -> None:
        """Apply parsed deltas (``mesh.gossip.parsing.parse_deltas``) under R1 and R3."""
        for d, sizes in deltas:
            self._apply(d, sizes, now_ms)

    def _apply(self, d: Delta, sizes: list[int], now_ms: int) -> None:
        o, gen, frm, upto, gc, reset, ents = d
        if o == self._node_id:
            return
        row = self._members.rows.get(o)
        if row is None or row.generation != gen:
            self._stats["deltas_skipped"] += 1
            return
        mv, my_gc = row.max_version, row.gc_version
        ns = self._by_origin.get(o)
        if reset and max(mv, my_gc) < gc:
            ns = self._by_origin[o] = Namespace()      # R3: replace, do not merge
            mv, my_gc = 0, gc
            self._stats["resets_applied"] += 1
        elif frm > mv:
            self._stats["deltas_skipped"] += 1         # R1: a gap; the next round asks again
            return
        elif upto <= mv:
            return
        if ents:
            if ns is None:
                ns = self._by_origin[o] = Namespace()
            for j, i in enumerate(range(0, len(ents), ENTRY_FIELDS)):
                v = ents[i + 1]
                if v > mv:
                    ns.put(ents[i], v, ents[i + 2], ents[i + 3], now_ms, sizes[j])
        self._members.set_row(Row(o, gen, row.heartbeat, max(mv, upto), my_gc, row.address, row.left, row.life))
        self._stats["deltas_applied"] += 1
        self.version += 1

    # ------------------------------------------------------------- collection ----------

    def collect(self, horizon_ms: int) -> None:
        """Drop tombstones stored at or before ``horizon_ms``; raise the gc versions (R3)."""
        by_origin = self._by_origin
        for o in [o for o, ns in by_origin.items() if ns.tombstones]:
            top = by_origin[o].collect(horizon_ms)
            if top:
                row = self._members.rows[o]
                self._members.set_row(row._replace(gc_version=max(row.gc_version, top)))
                self.version += 1
