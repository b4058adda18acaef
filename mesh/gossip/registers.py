"""Cluster-wide last-writer-wins registers (topics, configs), compared by bucket hashes.

Next to the per-origin namespaces there is one cluster-wide store of registers that any
node may write, each stamped ``(clock, writer node id)``. Two stores are compared
cheaply: each key falls in one of ``BUCKETS`` buckets, and a bucket's hash is the sum
(mod 2**32) of its entries' hashes, kept up to date on every change. Peers send each
other only the entries of the buckets whose hashes differ.

Rule:
R6 The greater stamp wins. Stamps come from a hybrid clock ``max(clock + 1, now_ms)`` (a
   Lamport clock that also follows time), so a peer's stamp later than now plus
   ``max_clock_skew_ms`` is forged and refused before it gets here (``mesh.gossip.checks``),
   as is a kill of a stamp too young to have been collected. A tombstone is collected ``tombstone_gc_ms``
   after it was stored, raising the node's *cluster gc clock*. An entry for a key we do
   not hold, stamped at or below that clock, is a deleted key offered by a stale peer:
   it is never stored, and a live one is answered with a *kill* (same stamp, deleted)
   that makes the peer drop its copy. A kill is not stored anywhere, so a mistaken one
   cannot delete a key cluster-wide. A node adopts a peer's gc clock only when their
   stores are equal (so a joiner cannot kill entries it has merely not received yet).
"""
from __future__ import annotations

import hashlib
import random
import zlib
from typing import Any

from mesh.gossip.rows import (BUCKETS, ENTRY_OVERHEAD, REGISTER_FIELDS, Budget, Register, check_key,
                              entry_size, size_of)

__all__ = ["ClusterRegisters", "ZERO_BUCKETS", "bucket_of", "entry_hash"]

ZERO_BUCKETS = [0] * BUCKETS


def bucket_of(key: str) -> int:
    return zlib.crc32(key.encode()) % BUCKETS


def entry_hash(key: str, clock: int, writer: str, deleted: bool) -> int:
    h = hashlib.blake2b(f"{key}\x00{clock}\x00{writer}\x00{int(deleted)}".encode(), digest_size=4)
    return int.from_bytes(h.digest(), "big")


class ClusterRegisters:
    """One node's copy of the cluster registers, its bucket hashes and its clocks (R6)."""

    def __init__(self, node_id: str, rng: random.Random, stats: dict[str, int],
                 max_entry_bytes: int) -> None:
        self._node_id = node_id
        self._rng = rng
        self._stats = stats
        self._max_entry_bytes = max_entry_bytes
        self.entries: dict[str, Register] = {}
        self.buckets = [0] * BUCKETS
        self.tombstones = 0
        self.gc_clock = 0                  # stamps at or below it may be collected tombstones
        self.clock = 0                     # the hybrid clock: the highest stamp seen
        self.version = 0                   # moves on every change (see Gossip.version)

    # ------------------------------------------------------------- own writes ----------

    def put(self, key: str, value: Any, now_ms: int) -> None:
        """Write a register, stamped (clock, this node); a no-op if it already holds ``value``."""
        check_key(key)
        size = entry_size(key, value, self._max_entry_bytes) + size_of(self._node_id)
        old = self.entries.get(key)
        if old is not None and not old.deleted and old.value == value and type(old.value) is type(value):
            return
        self.clock = max(self.clock + 1, now_ms)
        self.store(key, self.clock, self._node_id, value, False, size, now_ms)

    def delete(self, key: str, now_ms: int) -> None:
        """Delete a register. The tombstone beats every older write, wherever it is."""
        check_key(key)
        old = self.entries.get(key)
        if old is not None and old.deleted:
            return
        self.clock = max(self.clock + 1, now_ms)
        self.store(key, self.clock, self._node_id, None, True,
                   ENTRY_OVERHEAD + size_of(key) + size_of(self._node_id), now_ms)

    # ---------------------------------------------------------------- store ------------

    def store(self, key: str, clock: int, writer: str, value: Any, deleted: bool,
              size: int, stored_ms: int) -> None:
        old = self.entries.get(key)
        bucket = bucket_of(key) if old is None else old.bucket
        if old is not None:
            self.buckets[bucket] = (self.buckets[bucket] - old.hash) & 0xFFFFFFFF
            if old.deleted:
                self.tombstones -= 1
        h = entry_hash(key, clock, writer, deleted)
        self.buckets[bucket] = (self.buckets[bucket] + h) & 0xFFFFFFFF
        if deleted:
            self.tombstones += 1
        self.entries[key] = Register(clock, writer, value, deleted, stored_ms, size, bucket, h)
        if clock > self.clock:
            self.clock = clock
        self.version += 1

    def drop(self, key: str) -> None:
        e = self.entries.pop(key)
        self.buckets[e.bucket] = (self.buckets[e.bucket] - e.hash) & 0xFFFFFFFF
        if e.deleted:
            self.tombstones -= 1
        self.version += 1

    def merge(self, ents: Any, sizes: list[int], now_ms: int, kill_limit: int | None = None) -> list:
        """Merge a peer's flat cluster entries (R6); returns kills to send back to that peer.
        A kill of a stamp above ``kill_limit`` is refused: that tombstone cannot have been
        collected yet (``mesh.gossip.checks``)."""
        kills: list = []
        for j, i in enumerate(range(0, len(ents), REGISTER_FIELDS)):
            key, clock, writer, value, deleted = ents[i:i + REGISTER_FIELDS]
            old = self.entries.get(key)
            if old is None:
                if clock <= self.gc_clock:
                    # a key whose tombstone we collected: the peer is stale. Never store it;
                    # answer a live one with a kill (same stamp, deleted).
                    if not deleted:
                        self._stats["stale_cluster_killed"] += 1
                        kills += [key, clock, writer, None, True]
                    continue
            elif (clock, writer) <= (old.clock, old.writer):
                if (clock, writer) == (old.clock, old.writer) and deleted and not old.deleted:
                    # a kill: the sender collected this key's tombstone long ago. Drop our
                    # copy, but store no tombstone: a kill never travels further than one hop
                    if kill_limit is not None and clock > kill_limit:
                        self._stats["kills_refused"] += 1
                        continue
                    self.drop(key)
                    self._stats["stale_cluster_dropped"] += 1
                continue
            self.store(key, clock, writer, value, deleted, sizes[j], now_ms)
        return kills

    def adopt_gc_clock(self, their_gc_clock: int) -> None:
        """Call only when the peer's store equals ours (R6)."""
        if their_gc_clock > self.gc_clock:
            self.gc_clock = their_gc_clock

    def collect(self, horizon_ms: int) -> None:
        """Drop tombstones stored at or before ``horizon_ms``, raising the gc clock (R6)."""
        if self.tombstones:
            for k in [k for k, e in self.entries.items() if e.deleted and e.stored_ms <= horizon_ms]:
                self.gc_clock = max(self.gc_clock, self.entries[k].clock)
                self.drop(k)

    # ------------------------------------------------------------- exchange ------------

    def hashes(self) -> list[int]:
        """The bucket hashes to compare with a peer's (zeros when the store is empty)."""
        return self.buckets if self.entries else ZERO_BUCKETS

    def entries_for(self, buckets: set[int], budget: Budget, offered: Any = None) -> list:
        """Our entries in ``buckets`` as flat wire entries, charged to ``budget``.

        With ``offered`` (the flat entries the peer just sent), entries the peer holds at
        the same or a newer stamp are left out.
        """
        sent = None
        if offered is not None:     # key -> ((clock, writer), deleted)
            sent = {offered[i]: ((offered[i + 1], offered[i + 2]), offered[i + 4])
                    for i in range(0, len(offered), REGISTER_FIELDS)}
        cands = []
        for k, e in self.entries.items():
            if e.bucket in buckets:
                if sent is not None:
                    s = sent.get(k)
                    if s is not None:
                        their_stamp, their_deleted = s
                        stamp = (e.clock, e.writer)
                        if stamp < their_stamp or (stamp == their_stamp and (their_deleted or not e.deleted)):
                            continue
                cands.append(k)
        out: list = []
        if not cands:
            return out
        start = self._rng.randrange(len(cands))     # rotate: truncation must not starve a key
        for j in range(len(cands)):
            k = cands[(start + j) % len(cands)]
            e = self.entries[k]
            if e.size_bytes > budget.left_bytes and out:
                self._stats["truncated"] += 1
                break
            budget.left_bytes -= e.size_bytes
            out += [k, e.clock, e.writer, e.value, e.deleted]
        return out

    # ---------------------------------------------------------------- reads ------------

    def items(self, prefix: str = "") -> dict[str, Any]:
        """Live registers whose key starts with ``prefix``, sorted by key."""
        if not prefix:
            return {k: e.value for k, e in sorted(self.entries.items()) if not e.deleted}
        # filtered before sorting: a prefix (acl/, user/) is a small part of every register
        return dict(sorted((k, e.value) for k, e in self.entries.items() if not e.deleted and k.startswith(prefix)))

    def stamp(self, key: str) -> tuple[int, str, bool] | None:
        """(clock, writer, deleted) of the register ``key`` as this node holds it."""
        e = self.entries.get(key)
        return None if e is None else (e.clock, e.writer, e.deleted)

    def check(self) -> None:
        """Assert the structural invariants of the store (O(state))."""
        buckets = [0] * BUCKETS
        for k, e in self.entries.items():
            assert type(e) is Register, f"cluster {k}: not a Register"
            assert e.bucket == bucket_of(k) and e.hash == entry_hash(k, e.clock, e.writer, e.deleted), \
                f"cluster {k}"
            buckets[e.bucket] = (buckets[e.bucket] + e.hash) & 0xFFFFFFFF
            assert e.clock <= self.clock, "clock behind a stamp"
        assert buckets == self.buckets, "bucket hashes"
        assert self.tombstones == sum(1 for e in self.entries.values() if e.deleted), "cluster tombstones"
