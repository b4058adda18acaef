"""The replication shell's storage side (used by ``mesh.node.replication.raft_host``, which re-exports
it): ``check_append_payload``, the check of a follower's incoming batches (walked and
CRC-checked once; the store and the producer state reuse the walk), the ``repl`` state row
(``pack_state`` / ``unpack_state``, written by ``StateRows``) and ``StoreReader``, the core's ``LogReader`` over the
store (with the batches the turn staged as leader, so appends can leave before the sync).
"""
from __future__ import annotations

import logging
import struct

import msgpack

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import MAGIC, BatchHeader, iter_batches, parse_header
from mesh.raft import PersistState, ReplAppend
from mesh.raft.membership import config_from_wire, config_to_wire
from mesh.raft.messages import AppendRow, parse_rows
from storage.base import CorruptBatch, StoreBase

__all__ = ["check_append_payload", "pack_state", "unpack_state", "StoreReader", "StateRows"]

log = logging.getLogger("mesh.node.replication.raft_host")
_STATE_KEY = struct.Struct(">Q")   # the ``repl`` row of a partition


def check_append_payload(msg: ReplAppend, payload: bytes | None, max_replicas: int = 9,
                         rows: list[AppendRow] | None = None) -> list[list[tuple[BatchHeader, bytes]]]:
    """MeshError unless every row of ``msg`` (``rows``: parsed already) carries whole, intact
    batches from its ``prev_offset`` to its ``end_offset``, all of its ``batch_epoch`` (see
    the module doc). Returns each row's batches as ``(header, bytes)``: walked and
    CRC-checked once here, then staged as they are (store and producer state)."""
    if rows is None:
        rows = parse_rows(msg, max_replicas)
    payload = payload or b""
    view, at, out = memoryview(payload), 0, []
    whole = len(payload) if type(payload) is bytes else -1   # a lone batch is staged without a copy
    for r in rows:
        chunk, at = view[at:at + r.payload_bytes], at + r.payload_bytes
        batches: list[tuple[BatchHeader, bytes]] = []
        out.append(batches)
        if r.end_offset == r.prev_offset:
            continue
        expect = r.prev_offset
        for h, mv in iter_batches(chunk):   # whole batches, CRC checked
            if (h.base_offset != expect or h.record_count < 1 or h.leader_epoch != r.batch_epoch
                    or h.magic != MAGIC):
                raise MeshError(ErrorCode.INVALID_REQUEST,
                                f"REPL_APPEND row for partition {r.pid}: batch at {h.base_offset} (epoch "
                                f"{h.leader_epoch}, {h.record_count} records) where {expect} of epoch "
                                f"{r.batch_epoch} was due")
            batches.append((h, payload if len(mv) == whole else bytes(mv)))
            expect = h.base_offset + h.record_count
        if expect != r.end_offset:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"REPL_APPEND row for partition {r.pid}: batches end at "
                            f"{expect}, the row says {r.end_offset}")
    return out


def pack_state(st: PersistState) -> bytes:
    """The ``repl`` row of a partition: [term, vote, commit, epoch cache, recovering,
    config history [[offset, version, term, voters, learners], ...], and, only while a
    corrupt leader's promise stands, its vouch [successor, term]]."""
    row = [st.term, st.vote, st.commit, [list(e) for e in st.epoch_cache], int(st.recovering),
           [config_to_wire(o, c) for o, c in st.configs]]
    if st.vouch is not None:
        row.append(list(st.vouch))
    return msgpack.packb(row)


def unpack_state(pid: int, raw: bytes) -> PersistState:
    fields = msgpack.unpackb(raw, raw=False)
    term, vote, commit, cache = fields[:4]
    recovering = bool(fields[4]) if len(fields) > 4 else False  # rows written before issue 17
    # rows written before issue 14 have no history: the partition's initial config (add's replicas)
    configs = tuple(config_from_wire(m, 1 << 10) for m in fields[5]) if len(fields) > 5 else ()
    vouch = None
    if len(fields) > 6:   # rows written before it have none
        v = fields[6]
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and v[0]
                and type(v[1]) is int and v[1] > 0):
            raise ValueError(f"partition {pid}: replication state has a malformed vouch {v!r}")
        vouch = (v[0], v[1])
    return PersistState(pid, term, vote, commit, tuple(tuple(e) for e in cache), recovering, configs, vouch)


class StoreReader:
    """The core's ``LogReader`` over the store: committed batches, plus the batches this
    turn staged as leader (``tail``: pid -> [(base, next offset, batch as stored)],
    contiguous from the durable log end), so appends can leave before the turn's sync.
    A batch that fails its CRC is not replicated."""

    def __init__(self, store: StoreBase) -> None:
        self.store = store
        self.tail: dict[int, list[tuple[int, int, bytes]]] = {}

    def _read_tail(self, tail: list, from_offset: int, to_offset: int, max_bytes: int) -> tuple[bytes, int]:
        out, end, size = [], from_offset, 0
        for base, nxt, batch in tail:
            if nxt <= from_offset:
                continue
            if base != end or nxt > to_offset or (out and size + len(batch) > max_bytes):
                break   # (a read always starts at a batch boundary: base == from_offset first)
            out.append(batch)
            size += len(batch)
            end = nxt
        return b"".join(out), end

    def read(self, pid: int, from_offset: int, to_offset: int, max_bytes: int) -> tuple[bytes, int]:
        tail = self.tail.get(pid)
        if tail and from_offset >= tail[0][0]:
            return self._read_tail(tail, from_offset, to_offset, max_bytes)
        try:
            chunks = self.store.read(pid, from_offset, max_bytes, to_offset)
        except CorruptBatch:  # logged once and reported to the core by the store (note_corrupt)
            return b"", from_offset
        if not chunks:
            return b"", from_offset
        first, last = parse_header(chunks[0]), parse_header(chunks[-1])
        if first.base_offset != from_offset:
            log.error("partition %d: read at %d found a batch starting at %d", pid, from_offset, first.base_offset)
            return b"", from_offset
        return b"".join(chunks), last.base_offset + last.record_count

    def start_offset(self, pid: int) -> int:
        return self.store.log_start(pid)

    def clean_cut(self, pid: int) -> tuple[int, int]:
        return self.store.clean_target(pid)


class StateRows:
    """Each hosted partition's ``repl`` state row: a change of term, vote, epoch cache,
    config history or recovering flag is written at once (``write``); one of the commit
    offset alone is kept (Raft's commit index is volatile state: a stale one on disk is
    safe) and written at most once a second (``flush_lazy``; another database's pages in
    every commit cost ~10% of it), or before retention needs it (``commit_on_disk``)."""

    def __init__(self, store: StoreBase) -> None:
        self.store = store
        self.persisted: dict[int, PersistState] = {}   # pid -> the row as written (or staged)
        self.lazy: dict[int, PersistState] = {}        # pid -> a commit-only change not written yet
        self._next_lazy_flush_ms = 0

    def load(self, pid: int) -> PersistState | None:
        raw = self.store.get("repl", _STATE_KEY.pack(pid))
        return None if raw is None else unpack_state(pid, raw)

    def drop(self, pid: int) -> bool:
        """Forget ``pid``; True if a row was on disk (deleted in the turn's transaction)."""
        self.persisted.pop(pid, None)
        self.lazy.pop(pid, None)
        if self.store.get("repl", _STATE_KEY.pack(pid)) is None:
            return False
        self.store.delete("repl", _STATE_KEY.pack(pid))
        return True

    def offer(self, st: PersistState) -> bool:
        """Stage ``st``; True if it was written (hard state), False if kept as commit-only."""
        last = self.persisted.get(st.pid)
        if last is not None and st.commit >= last.commit and st._replace(commit=last.commit) == last:
            self.lazy[st.pid] = st
            return False
        self.write(st)
        return True

    def write(self, st: PersistState, soft: bool = False) -> None:
        """``soft``: only the commit offset changed (its loss to a power cut is harmless: a
        turn of write-cached partitions need not sync for it, ``StoreBase.put_soft``)."""
        (self.store.put_soft if soft else self.store.put)("repl", _STATE_KEY.pack(st.pid), pack_state(st))
        self.persisted[st.pid] = st
        self.lazy.pop(st.pid, None)

    def flush_lazy(self, now_ms: int) -> None:
        if self.lazy and now_ms >= self._next_lazy_flush_ms:
            self._next_lazy_flush_ms = now_ms + 1000
            for st in list(self.lazy.values()):
                self.write(st, soft=True)   # commit only: not hard state

    def commit_on_disk(self, pid: int) -> int:
        """The commit offset on disk: retention cuts only below it."""
        st = self.persisted.get(pid)
        return st.commit if st is not None else 0

    def reload(self, pids) -> None:
        """After a failed commit: what is on disk again."""
        self.lazy = {}
        self.persisted = {pid: st for pid in pids if (st := self.load(pid)) is not None}
