"""The broker's durable state in one LMDB environment.

Named databases (a small, fixed set):

- ``log``       (partition id u32, base offset u64) big-endian -> batch bytes as received
- ``meta``      broker identity, partition-id registry, topic configs (single-node mode)
- ``repl``      replication state per partition (term, vote, commit)
- ``offsets``   consumer-group offsets made durable on the coordinator
- ``producers`` idempotent-producer sequence state
- ``gossip``    the gossip snapshot

Writes of one node-loop turn go into one write transaction, committed with one sync
(group commit): ``stage_append`` ... ``commit()``. Reads never see uncommitted data
(LMDB readers see the last committed snapshot), so a fetch can never serve a record that
a crash could take back.

``Store`` (LMDB) and ``storage.memory.MemoryStore`` share the interface in
``storage.base.StoreBase``; simulations use the memory twin.

The node never opens a ``Store`` directly: ``storage.datadir.open_data_dir`` locks the
directory, checks ``data.mdb`` before LMDB maps it, and keeps the store's identity (store
id, generation) both here (``meta``) and in ``identity.json``. Every stored batch is
checked when read (CRC, header base offset against the key, no gap after the previous
batch, epochs that never go down) and, at recovery, each key against its header, the
previous batch's end and epoch, and each partition's last batch in full; a failure is
noted once (``note_corrupt``) for the replication core to repair. Batches under a
partition id that no partition has (a flipped key byte) are reported (``stray``).
"""
from __future__ import annotations

import logging
import os
import struct
from typing import Callable

import lmdb

from mesh.wire.records import HEADER_SIZE
from storage.base import LogError, StoreBase, StorageFull, batch_problem, key_of, unkey
from storage.flusher import Flusher
from storage.nosync import NoSyncFlag

__all__ = ["Store"]

_log = logging.getLogger("storage")

_COUNT = struct.Struct(">I")    # a batch header's record count, at byte 20
_MAX_TS = struct.Struct(">Q")   # its max timestamp, at byte 32
_DBS = (b"log", b"meta", b"repl", b"offsets", b"producers", b"gossip")
DEFAULT_MAP_SIZE = 64 << 30  # address space, not disk: the file grows as written
_HEADROOM_BYTES = 8 << 20      # nearer the map's end than this (or 1/8 of it), batches are probed
_PROBE_PIECES = 64             # a turn's first probe also puts this many small values: room for its
_PROBE_PIECE_BYTES = 1000      # small writes, on leaf pages (not contiguous: a free list fragments)


class Store(StoreBase):
    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True):
        os.makedirs(path, exist_ok=True)
        try:
            self.env = lmdb.open(path, map_size=map_size, max_dbs=len(_DBS) + 2, subdir=True,
                                 sync=sync, metasync=sync, readahead=False, lock=True,
                                 max_readers=64)
        except lmdb.Error as exc:
            raise LogError(f"cannot open LMDB environment in {path!r}: {exc}") from exc
        self.path = path
        self.dbs = {name.decode(): self.env.open_db(name) for name in _DBS}
        # per-commit no-sync for write caching (None: not available, every commit syncs)
        self._nosync = NoSyncFlag.attach(self.env, path) if sync else None
        self._flusher = Flusher(self.env)   # write caching's flush.ms syncs, off the loop
        self._commits = 0                   # commits left unsynced so far (the flusher's numbers)
        self._log = self.dbs["log"]
        self._wtxn: lmdb.Transaction | None = None
        self._failed: LogError | None = None
        self._psize = self.env.stat()["psize"]
        self._headroom = min(_HEADROOM_BYTES, map_size // 8)
        self._turn_bytes = 0   # bytes this turn put (``room_for`` counts each twice: pages, B-tree)
        self._probed = False   # this turn's room for its small writes was probed (``room_for``)
        self._note_room()
        super().__init__()
        self._recover()

    @staticmethod
    def probe(path: str, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True) -> None:
        """What opening the store does to the file, and no more: open the environment and
        the named databases, stage a write to ``meta`` (as the start-up's generation bump
        does; aborted, so nothing is written), and walk every key of every database,
        touching each value (as the start-up scan, ``_recover``, does: a walk of the first
        and last keys only let a damaged page in the middle abort the broker itself with
        an LMDB assertion). ``storage.datadir`` runs this in a child process first: a page
        LMDB trips over (an assertion, a bus error) kills the child, not the broker."""
        env = lmdb.open(path, map_size=map_size, max_dbs=len(_DBS) + 2, subdir=True, sync=False,
                        metasync=False, readahead=False, lock=True, max_readers=64)
        try:
            txn = env.begin(write=True, buffers=True)
            try:
                dbs = {name: env.open_db(name, txn=txn) for name in _DBS}   # created only in txn
                txn.put(b"probe", b"x", db=dbs[b"meta"])
                for db in dbs.values():
                    for _, v in txn.cursor(db=db):
                        v[:1].tobytes()
            finally:
                txn.abort()
        finally:
            env.close()

    # -- recovery ---------------------------------------------------------------------
    def _recover(self) -> None:
        """Rebuild start/end/size per partition from the log's keys (one scan). Each batch's
        header base offset is checked against its key and against the previous batch's end
        (a gap, e.g. a flipped key byte, is noted at that end, so the repair refills the
        gap), its epoch against the previous batch's (epochs never go down; a drop is noted
        at the previous batch), and the last batch of each partition (it sets the log end)
        has its CRC checked: a mismatch is a corrupt batch (``note_corrupt``), repaired by
        replication once the node runs."""
        last: dict[int, tuple[int, bytes]] = {}
        epochs: dict[int, int] = {}
        with self.env.begin(db=self._log, buffers=True) as txn:
            cur = txn.cursor()
            for k, v in cur:
                pid, base = unkey(bytes(k))
                st = self._parts.get(pid)
                # where a repair must cut to drop this batch: a boundary of the sound prefix
                # (the previous batch's end, or its base when this key lies inside it), so the
                # leader can refill from there (its batches have the same boundaries)
                cut = base if st is None else (st[1] if base >= st[1] else last[pid][0])
                epoch = -1
                if len(v) < HEADER_SIZE:
                    self.note_corrupt(pid, cut, f"stored batch at offset {base} is {len(v)} bytes")
                    count = 0
                else:
                    header_base, epoch = struct.unpack_from(">QI", v, 0)
                    count = struct.unpack_from(">I", v, 20)[0]
                    if header_base != base:
                        self.note_corrupt(pid, min(cut, header_base) if st is None else cut,
                                          f"stored batch at offset {base} says it starts at {header_base}")
                if st is None:
                    self._parts[pid] = st = [base, base + count, 0]
                else:
                    if st[1] != base:
                        self.note_corrupt(pid, cut, f"stored batch at offset {base} follows a batch ending at {st[1]}")
                    if epoch < epochs.get(pid, -1):
                        prev = last[pid][0]
                        self.note_corrupt(pid, prev, f"stored batches at offsets {prev} and {base} have "
                                                     f"epochs {epochs[pid]} then {epoch}")
                st[1] = base + count
                epochs[pid] = epoch
                st[2] += len(v)
                last[pid] = (base, v)
            for pid, (base, v) in last.items():
                why = batch_problem(base, v)
                if why is not None:
                    self.note_corrupt(pid, base, why)
        self.stray: dict[int, tuple[int, int]] = {}   # pid no partition has -> (first, end) offsets
        with self.env.begin(db=self.dbs["meta"]) as txn:
            known = {int(v) for k, v in txn.cursor() if k.startswith(b"pid:")}
        for pid in sorted(set(self._parts) - known):   # e.g. a flipped byte in a key's partition id
            self.stray[pid] = (self._parts[pid][0], self._parts[pid][1])
            _log.error("stored batches at offsets %d..%d under partition id %d, which no partition "
                       "has: a damaged key? (left as they are; a partition that lost its tail "
                       "refills from its peers)", *self.stray[pid], pid)
        with self.env.begin(db=self.dbs["meta"]) as txn:
            for k, v in txn.cursor():
                if k.startswith(b"logstart:"):
                    pid = int(k[9:])
                    st = self._parts.setdefault(pid, [0, 0, 0])
                    floor = int(v)
                    if st[2] == 0:  # empty log: keep offsets where they were
                        st[0] = st[1] = max(st[1], floor)
                    st[0] = max(st[0], floor)

    # -- write path (one transaction per loop turn) -----------------------------------
    def _txn(self) -> lmdb.Transaction:
        if self._wtxn is None:
            self._wtxn = self.env.begin(write=True)
        return self._wtxn

    def _put_batch(self, pid: int, base: int, batch: bytes) -> None:
        self._put(key_of(pid, base), batch, self._log)

    def _note_room(self) -> None:
        """Bytes never yet used at the map's end, as of the last commit (the free list may
        hold more: LMDB does not say how much)."""
        info = self.env.info()
        self._room = info["map_size"] - (info["last_pgno"] + 1) * self._psize

    def room_for(self, nbytes: int, sizes: Callable[[], list[int]] | None = None) -> bool:
        """Would ``nbytes`` more fit in this turn, with some room left for the turn's small
        writes (replication state, offsets)? A write that does not fit dooms the whole turn
        (LMDB requires the transaction to be aborted), so a client's batch is checked first
        and refused alone. ``sizes()``: the values that make up ``nbytes`` (a follower's
        append is many batches; default: one value), asked only near the map's end.

        Far from the map's end (as of the last commit) this is arithmetic. Near it, in a
        nested transaction that is then aborted, so the free list counts: the largest value
        is put as one (contiguous pages, as the real put needs), the rest as small pieces
        (leaf pages: a free list fragmented by deletes has few long runs), and once per turn
        ``_PROBE_PIECES`` small values stand for the turn's other writes. A failed turn, or
        an LMDB error other than a full map, answers True: the real write then fails as it
        would have."""
        if self._failed is not None:
            return True
        if 2 * (self._turn_bytes + nbytes) + self._headroom < self._room:
            return True
        values = [nbytes] if sizes is None else sizes()
        fresh = self._wtxn is None   # then this probe must not leave the turn a sync to do
        child = None
        try:
            child = self.env.begin(write=True, parent=self._txn())
            meta = self.dbs["meta"]
            small = 0
            for i, n in enumerate(values):
                if n > _PROBE_PIECE_BYTES:
                    child.put(b"\0room:b%d" % i, bytes(n), db=meta)
                else:
                    small += n
            piece = bytes(_PROBE_PIECE_BYTES)
            for i in range(-(-small // _PROBE_PIECE_BYTES) + (0 if self._probed else _PROBE_PIECES)):
                child.put(b"\0room:%d" % i, piece, db=meta)
            self._probed = True
            return True
        except lmdb.MapFullError:
            return False
        except lmdb.Error:
            return True
        finally:
            if child is not None:
                child.abort()
            if fresh and self._wtxn is not None:
                self._wtxn.abort()
                self._wtxn = None

    def _put(self, key: bytes, value: bytes, db) -> None:
        """A put. Any LMDB error dooms the whole turn (LMDB requires the txn to be aborted):
        it is remembered, every later write of the turn is refused with it, and ``commit``
        raises it after rolling the turn back."""
        if self._failed is not None:
            raise self._failed
        self._turn_bytes += len(value)
        try:
            txn = self._wtxn
            (txn if txn is not None else self._txn()).put(key, value, db=db)
        except lmdb.MapFullError as exc:
            self._failed = StorageFull(f"log store full (limit {self.env.info()['map_size']} bytes)")
            raise self._failed from exc
        except lmdb.Error as exc:
            self._failed = LogError(f"write failed: {exc}")
            raise self._failed from exc

    def _get_batch(self, pid: int, base: int):
        return self._txn().get(key_of(pid, base), db=self._log)

    def _del_batch(self, pid: int, base: int) -> None:
        self._must_sync = True
        self._delete(key_of(pid, base), self._log)

    def _delete(self, key: bytes, db) -> None:
        if self._failed is not None:
            raise self._failed
        try:
            self._txn().delete(key, db=db)
        except lmdb.Error as exc:
            self._failed = LogError(f"delete failed: {exc}")
            raise self._failed from exc

    def _bases_from(self, pid: int, offset: int) -> list[int]:
        """Base offsets of batches of ``pid`` whose base >= offset (committed or staged)."""
        out = []
        cur = self._txn().cursor(db=self._log)
        if cur.set_range(key_of(pid, offset)):
            for k in cur.iternext(keys=True, values=False):
                p, base = unkey(k)
                if p != pid:
                    break
                out.append(base)
        return out

    def _head_batches(self, pid: int, limit: int):
        cur = self._txn().cursor(db=self._log)
        if not cur.set_range(key_of(pid, 0)):
            return
        for k, v in cur:
            p, base = unkey(k)
            if p != pid or limit <= 0:
                return
            limit -= 1
            yield base, v

    def _put_row(self, db: str, key: bytes, value: bytes) -> None:
        self._put(key, value, self.dbs[db])

    def _delete_row(self, db: str, key: bytes) -> None:
        self._delete(key, self.dbs[db])

    def has_writes(self) -> bool:
        """True if this turn staged anything (its commit will sync)."""
        return self._wtxn is not None

    def _commit_txn(self, sync: bool = True) -> bool:
        """Commit the turn's transaction, synced (LMDB: the pages, then the meta page, each
        fdatasync'ed: a power cut leaves the last synced state whole) unless ``sync`` is
        False and this LMDB lets its no-sync flag be set per commit (``storage.nosync``).
        With no transaction, a ``sync`` flushes earlier unsynced commits. True if it synced."""
        txn, self._wtxn = self._wtxn, None
        if self._flusher.error is not None:   # a sync behind failed: this one is made here
            self._flusher.error, sync = None, True
        if txn is None:
            if sync and self._commits > self._flusher.done:
                self.sync_now()
                return True
            return False
        self._turn_bytes, self._probed = 0, False
        if self._failed is not None:
            failed, self._failed = self._failed, None
            txn.abort()
            raise failed
        skip = not sync and self._nosync is not None
        try:
            if skip:
                self._nosync.set(True)
            try:
                txn.commit()  # LMDB syncs on commit (sync=True): one group commit per turn
            finally:
                if skip:
                    self._nosync.set(False)
        except lmdb.MapFullError as exc:
            raise StorageFull(f"log store full ({self.env.info()['map_size']} bytes): {exc}") from exc
        except lmdb.Error as exc:
            raise LogError(f"commit failed: {exc}") from exc
        self._note_room()
        if skip:
            self._commits += 1
        else:
            self._flusher.mark(self._commits)   # (its sync covered every commit before it)
        return not skip

    def _abort_txn(self) -> None:
        self._failed = None
        self._turn_bytes, self._probed = 0, False
        txn, self._wtxn = self._wtxn, None
        if txn is not None:
            txn.abort()

    # -- read path ----------------------------------------------------------------------
    def get(self, db: str, key: bytes) -> bytes | None:
        with self.env.begin(db=self.dbs[db]) as txn:
            return txn.get(key)

    def items(self, db: str, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        out = []
        with self.env.begin(db=self.dbs[db]) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    out.append((k, v))
        return out

    def items_from(self, db: str, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """At most ``limit`` committed rows of ``db`` from key ``start`` on, in key order."""
        out = []
        with self.env.begin(db=self.dbs[db]) as txn:
            cur = txn.cursor()
            if cur.set_range(start):
                for kv in cur:
                    out.append(kv)
                    if len(out) >= limit:
                        break
        return out

    def count(self, db: str) -> int:
        """Committed rows of ``db`` (LMDB keeps the count: no walk)."""
        with self.env.begin() as txn:
            return txn.stat(self.dbs[db])["entries"]

    def _read_raw(self, pid: int, offset: int, max_bytes: int, limit_offset: int):
        """Committed ``(key base offset, batch)`` of ``pid`` covering [offset, limit_offset),
        up to max_bytes (at least one batch). One cursor seek: set_range on (pid, offset), and one step
        back if the batch before it straddles ``offset``."""
        chunks: list[bytes] = []
        size = 0
        with self.env.begin(db=self._log, buffers=True) as txn:
            cur = txn.cursor()
            start_key = key_of(pid, offset)
            found = cur.set_range(start_key)
            if not found or bytes(cur.key()) != start_key:
                # the batch holding `offset` may start before it
                if found:
                    stepped = cur.prev()
                else:
                    stepped = cur.last()
                if not stepped or unkey(bytes(cur.key()))[0] != pid:
                    if not cur.set_range(start_key):
                        return chunks
            for k, v in cur:
                p, base = unkey(bytes(k))
                if p != pid or base >= limit_offset:
                    break
                if base + struct.unpack_from(">I", v, 20)[0] <= offset:
                    continue  # the batch before `offset` ends before it
                if chunks and size + len(v) > max_bytes:
                    break
                chunks.append((base, bytes(v)))
                size += len(v)
        return chunks

    def _walk_headers(self, pid: int, from_offset: int, limit_offset: int):
        """(base, record count, max timestamp) of each committed batch of ``pid`` holding
        offsets in [from_offset, limit_offset), in order: 12 bytes read from each value,
        zero-copy, no record decoded (``storage.timestamps``)."""
        with self.env.begin(db=self._log, buffers=True) as txn:
            cur = txn.cursor()
            start_key = key_of(pid, from_offset)
            if not (cur.prev() if cur.set_range(start_key) else cur.last()) or unkey(bytes(cur.key()))[0] != pid:
                if not cur.set_range(start_key):
                    return
            for k, v in cur:   # (from the batch before from_offset, which may hold it)
                p, base = unkey(bytes(k))
                if p != pid or base >= limit_offset:
                    return
                if len(v) < HEADER_SIZE:
                    continue
                count = _COUNT.unpack_from(v, 20)[0]
                if base + count > from_offset:
                    yield base, count, _MAX_TS.unpack_from(v, 32)[0]

    def _batch_before(self, pid: int, offset: int) -> tuple[int, int] | None:
        """(base, record count) of the last committed batch of ``pid`` whose base < offset."""
        with self.env.begin(db=self._log, buffers=True) as txn:
            cur = txn.cursor()
            if not (cur.prev() if cur.set_range(key_of(pid, offset)) else cur.last()):
                return None
            p, base = unkey(bytes(cur.key()))
            v = cur.value()
            if p != pid or len(v) < HEADER_SIZE:
                return None
            return base, struct.unpack_from(">I", v, 20)[0]

    def sync_now(self) -> None:
        """Force what is committed to disk (even with ``sync=False``)."""
        self.env.sync(True)
        self.unsynced_due_ms = None
        self._flusher.mark(self._commits)

    def _flush_behind(self) -> None:
        self._flusher.request(self._commits)

    def close(self) -> None:
        """A clean close: what write caching left unsynced is synced first."""
        self._abort_txn()
        self._flusher.close()
        if self._commits > self._flusher.done or self._flusher.error is not None:
            try:
                self.sync_now()
            except lmdb.Error as exc:
                _log.error("could not sync the store on close: %s", exc)
        self.env.close()
