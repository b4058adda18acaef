"""Idempotent-producer dedup state, per (partition, producer id).

A batch header carries ``producer_id`` and ``base_sequence``; the leader remembers the last
``RECENT_BATCHES`` (``mesh.wire.topic_config``) batches of each producer per partition
(first sequence, last sequence, base offset), as Kafka does (Kafka keeps 5). Answers:

- the next sequence (last + 1): new, append it;
- a remembered batch (same first and last sequence): a retry of a stored batch, answered
  with its original base offset and not stored again;
- older than the last sequence but not remembered: DUPLICATE_SEQUENCE (not retriable).
  The batch was stored before (its sequences are taken) but fell out of the window; the
  client completes it as written with offset -1, as Kafka's producer does. The client
  keeps fewer than RECENT_BATCHES batches between its oldest unacknowledged one and its
  newest sent (so a truncation of every unacknowledged batch still leaves the last
  acknowledged one here), so this only happens for the Spark sink's re-cut replays or
  after a producer outran its window some other way;
- a gap (beyond last + 1), or a producer id with no state here and a batch that does not
  start at 0: OUT_OF_ORDER_SEQUENCE (retriable). Either an earlier batch is still in
  flight, or the state is gone: the topic was deleted and created again, or the state
  expired (Kafka answers UNKNOWN_PRODUCER_ID to that one; a new code would stop clients
  that predate it, so the client tells the two apart itself: ``mesh.client.sequencer``
  rule 8, which starts again under a fresh producer id). Nothing is appended.

The state is written in the same LMDB transaction as the batch it describes, so after a
crash the log and the dedup state agree: ``stage`` only marks the state dirty, and the
store's ``pre_commit`` hook (``flush``) writes each dirty state once, at the start of
every commit of the transaction (a producer with several batches in one turn costs one
write); a rollback of the store rolls these states back too. On a follower the same state is derived from the
batch headers it appends (they carry producer id and sequence), so a new leader keeps
dropping duplicates.

Bounds (Kafka: ``producer.id.expiration.ms``): each state is stored with the time
(wall-clock ms) of its last batch; ``expire(now_ms)`` (the node runs it every second,
staged in the turn's transaction) deletes the states idle for longer than
``expiration_ms`` (1 day by default) in slices of ``EXPIRE_SLICE`` states, a cursor going
round the table (a whole pass over a million states held the loop 0.7 s every minute);
only beyond ``max_ids`` does it make a whole pass (at most once a minute), to delete the
longest-idle ones.
In memory at most ``max_cached`` states are kept (least recently used go first; they are
read back from LMDB when needed). A producer whose state expired and that comes back with
a sequence other than 0 gets OUT_OF_ORDER_SEQUENCE, and continues under a fresh producer
id (the client's rule 8, ``mesh.client.sequencer``), as Kafka's producer does after
UNKNOWN_PRODUCER_ID.

Owners (issue 39 finding 7: a co-writer wrote batches under another producer's id and
next sequences, and the victim's records were never stored): on a secured node each
state remembers a tag of the principal that wrote its first batch here (``owner_tag``,
64 bits of a hash of the name, stored with the state as ``o``); a batch under that
producer id from another principal is refused (UNAUTHORIZED, not retriable, nothing
stored) while the state has batches. Open mode has one anonymous principal (tag 0: no
check). Followers derive states from batch headers, which carry no principal: a state
learned by replication has no owner, and the first principal to write under it after
this node becomes its leader takes it (a new leader keeps the binding only for states it
wrote itself as an earlier leader).
"""
from __future__ import annotations

import hashlib
import itertools
import struct
import time
from typing import Callable

import msgpack

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import BatchHeader
from mesh.wire.topic_config import RECENT_BATCHES

__all__ = ["ProducerStates", "RECENT_BATCHES", "owner_tag"]

_KEY = struct.Struct(">Qq")
EXPIRE_SLICE = 5_000   # states looked at per ``expire`` call (about 4 ms)
WHOLE_PASS_EVERY_MS = 60_000   # beyond max_ids, a whole pass (the longest idle go) at most this often


def owner_tag(principal: str | None) -> int:
    """The owner tag of a principal (0: none, open mode)."""
    if not principal:
        return 0
    return int.from_bytes(hashlib.blake2b(principal.encode(), digest_size=8).digest(), "big") >> 1 | 1


def _decode(raw: bytes) -> tuple[list[list[int]], int]:
    """(batches, last-used ms) of a stored state; states written before expiry existed have
    no time (0: the first sweep stamps them with its own time)."""
    v = msgpack.unpackb(raw)
    if isinstance(v, dict):
        return v["b"], v["t"]
    return v, 0


def _owner_of(raw: bytes) -> int:
    v = msgpack.unpackb(raw)
    return v.get("o", 0) if isinstance(v, dict) else 0


def _encode(st: list[list[int]], t_ms: int, pack: Callable[[object], bytes] = msgpack.packb, owner: int = 0) -> bytes:
    """``pack``: a reused ``msgpack.Packer().pack`` on the hot path (same bytes as packb)."""
    return pack({"b": st, "t": t_ms, "o": owner} if owner else {"b": st, "t": t_ms})


class ProducerStates:
    def __init__(self, store, now_ms: Callable[[], int] | None = None, expiration_ms: int = 86_400_000,
                 max_ids: int = 1_000_000, max_cached: int = 10_000):
        self.store = store
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.expiration_ms = expiration_ms
        self.max_ids = max_ids
        self.max_cached = max_cached
        self._cache: dict[tuple[int, int], list[list[int]]] = {}
        self._undo: dict[tuple[int, int], list[list[int]] | None] = {}
        self._dirty: dict[tuple[int, int], list[list[int]]] = {}   # staged, written by flush()
        self._owners: dict[tuple[int, int], int] = {}   # owner tags of cached and staged states (not 0)
        self._expire_from = b""   # where the next expiry slice starts
        self._next_whole_ms = 0
        self._pack = msgpack.Packer().pack   # one Packer for every write (the node loop is one thread)
        store.pre_commit.append(self.flush)
        store.post_commit.append(self.committed)   # a commit in the middle of a turn (a catalog
        # rebuild) made the staged states durable: a later rollback must not bring older ones back
        store.on_rollback.append(self.rollback)

    def _get(self, pid: int, producer_id: int) -> list[list[int]]:
        key = (pid, producer_id)
        st = self._cache.get(key)
        if st is None:
            st = self._dirty.get(key)   # staged, not yet written: the store has an older one
            if st is None:
                raw = self.store.get("producers", _KEY.pack(pid, producer_id))
                if raw:
                    v = msgpack.unpackb(raw)
                    st = v["b"] if isinstance(v, dict) else v
                    owner = v.get("o", 0) if isinstance(v, dict) else 0
                    if owner:
                        self._owners[key] = owner
                else:
                    st = []
            if len(self._cache) >= self.max_cached:
                self._evict()
            self._cache[key] = st
        return st

    def _evict(self) -> None:
        """Drop the older half of the cache (insertion order). States staged this turn go
        too: ``_dirty`` keeps them until the commit, and ``_get`` looks there first, so a
        turn staging many more ids than ``max_cached`` (a follower applying one large
        replicated append) evicts half the cache once every ``max_cached / 2`` lookups:
        linear (keeping the staged ones made every lookup copy the whole cache)."""
        cache, owners, dirty = self._cache, self._owners, self._dirty
        for key in list(itertools.islice(cache, len(cache) // 2)):
            del cache[key]
            if owners and key not in dirty:   # (flush writes a staged state's owner)
                owners.pop(key, None)

    def _put(self, pid: int, producer_id: int, st: list[list[int]]) -> None:
        self.store.put("producers", _KEY.pack(pid, producer_id),
                       _encode(st, self.now_ms(), self._pack, self._owners.get((pid, producer_id), 0)))

    def flush(self) -> None:
        """Write the states staged since the last flush (the store calls it before each commit)."""
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            now, put, key, pack, owners = self.now_ms(), self.store.put, _KEY.pack, self._pack, self._owners
            for k, st in dirty.items():
                owner = owners.get(k) if owners else None
                put("producers", key(*k), pack({"b": st, "t": now, "o": owner} if owner else {"b": st, "t": now}))

    def expire(self, now_ms: int, slice_rows: int | None = None) -> int:
        """Delete states idle past ``expiration_ms``, from the next ``slice_rows`` (default
        ``EXPIRE_SLICE``) of the table on (going round); all of them, and then the longest
        idle, beyond ``max_ids``. Staged in the turn's transaction; returns how many went."""
        limit = slice_rows or EXPIRE_SLICE
        whole = now_ms >= self._next_whole_ms and self.store.count("producers") > self.max_ids
        if whole:   # (at most once a minute: a flood of new ids must not make it every call)
            self._next_whole_ms = now_ms + WHOLE_PASS_EVERY_MS
            rows, self._expire_from = self.store.items("producers"), b""
        else:
            rows = self.store.items_from("producers", self._expire_from, limit)
            self._expire_from = rows[-1][0] + b"\0" if len(rows) >= limit else b""
        doomed, kept = [], []
        for k, raw in rows:
            try:
                st, t = _decode(raw)
            except Exception:   # unreadable: it cannot dedup anything
                st, t = None, -1
            if t == 0 and st is not None:   # an old-format state: idle from now on
                t = now_ms
                self.store.put("producers", k, _encode(st, t, owner=_owner_of(raw)))
            if t < 0 or now_ms - t > self.expiration_ms:
                doomed.append(k)
            else:
                kept.append((t, k))
        if whole and len(kept) > self.max_ids:
            kept.sort()
            doomed.extend(k for _, k in kept[:len(kept) - self.max_ids])
        for k in doomed:
            pid, producer_id = _KEY.unpack(k)
            if (pid, producer_id) in self._undo:
                continue   # written this turn: not idle
            self.store.delete("producers", k)
            self._cache.pop((pid, producer_id), None)
            self._owners.pop((pid, producer_id), None)
        return len(doomed)

    def check(self, pid: int, h: BatchHeader, owner: int = 0) -> int | None:
        """The original base offset if ``h`` is a duplicate, None if it is new; raises
        OUT_OF_ORDER_SEQUENCE on a gap or a first batch here not at 0, UNAUTHORIZED if the
        producer id is another principal's (``owner``: the writer's ``owner_tag``)."""
        if h.producer_id < 0:
            return None
        st = self._get(pid, h.producer_id)
        if st and owner and self._owners:
            bound = self._owners.get((pid, h.producer_id), 0)
            if bound and bound != owner:
                raise MeshError(ErrorCode.UNAUTHORIZED,
                                f"not written: producer id {h.producer_id} is another principal's on this "
                                f"partition (a producer id belongs to the principal that wrote under it first)")
        if not st:
            if h.base_sequence != 0:
                raise MeshError(ErrorCode.OUT_OF_ORDER_SEQUENCE,
                                f"producer {h.producer_id} is new here: its first sequence must be 0, "
                                f"not {h.base_sequence}")
            return None
        last_seq = st[-1][1]
        first, last = h.base_sequence, h.base_sequence + h.record_count - 1
        if first == last_seq + 1:
            return None
        for f, l, base in st:
            if f == first and l == last:
                return base
        if first <= last_seq:
            raise MeshError(ErrorCode.DUPLICATE_SEQUENCE,
                            f"sequence {first} of producer {h.producer_id} is older than the batches kept")
        raise MeshError(ErrorCode.OUT_OF_ORDER_SEQUENCE,
                        f"producer {h.producer_id}: expected sequence {last_seq + 1}, got {first}")

    def stage(self, pid: int, h: BatchHeader, base_offset: int, owner: int = 0) -> None:
        """``owner``: the writer's ``owner_tag`` (0: unknown, a follower's append, or open
        mode): it takes a state that has no batches or no owner yet."""
        producer_id = h.producer_id
        if producer_id < 0:
            return
        key = (pid, producer_id)
        st = self._cache.get(key)
        if st is None:
            st = self._get(pid, producer_id)
        if owner and (not st or not self._owners.get(key)):
            self._owners[key] = owner
        if key not in self._undo:
            self._undo[key] = list(st)   # entries are never changed in place: a shallow copy
        first = h.base_sequence
        st.append([first, first + h.record_count - 1, base_offset])
        if len(st) > RECENT_BATCHES:
            del st[:-RECENT_BATCHES]
        self._dirty[key] = st

    def stage_replicated(self, pid: int, batches) -> None:
        """A follower's append: learn sequences from the batch headers (already offset)."""
        from mesh.wire.records import iter_batches
        self.stage_replicated_batches(pid, iter_batches(batches, verify_crc=False))

    def stage_replicated_batches(self, pid: int, batches) -> None:
        """``stage_replicated`` of batches walked already: ``(header, batch bytes)`` pairs."""
        for h, _ in batches:
            if h.producer_id >= 0:
                self.stage(pid, h, h.base_offset)

    def truncate(self, pid: int, to_offset: int) -> None:
        """Forget batches at or past ``to_offset`` (a diverged suffix was cut), so a retry
        of one of them is appended again instead of being answered with a dead offset."""
        for k, raw in self.store.items("producers", struct.pack(">Q", pid)):
            _, producer_id = _KEY.unpack(k)
            st = self._get(pid, producer_id)
            keep = [e for e in st if e[2] < to_offset]
            if len(keep) != len(st):
                key = (pid, producer_id)
                if key not in self._undo:
                    self._undo[key] = list(st)
                st[:] = keep
                self._put(pid, producer_id, st)
        staged = {**self._dirty, **self._cache}
        for (p, producer_id), st in list(staged.items()):  # staged, not yet in the db
            if p == pid and any(e[2] >= to_offset for e in st):
                key = (pid, producer_id)
                if key not in self._undo:
                    self._undo[key] = list(st)
                st[:] = [e for e in st if e[2] < to_offset]
                self._put(pid, producer_id, st)

    def committed(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        for key, st in self._undo.items():
            self._cache[key] = st
        self._undo.clear()
        self._dirty.clear()

    def forget_partition(self, pid: int) -> None:
        for key in [k for k in self._cache if k[0] == pid]:
            del self._cache[key]
            self._dirty.pop(key, None)
        for key in [k for k in self._owners if k[0] == pid]:
            del self._owners[key]
