"""Coalescing (MultiRaft): the rows one call into ``mesh.raft.manager.ReplicaManager``
produces, grouped into one message per peer and row kind, and the inverse for appends
(one payload frame split back into each row's batches).

Rules: rows leave in ``ROW_ORDER`` (votes first: they decide elections); one message per
(peer, kind), split only at ``max_rows`` rows or, for appends, ``max_bytes`` of payload
(a single row larger than that still goes alone). Peers are visited in sorted order, so
the output is deterministic.
"""
from __future__ import annotations

from mesh.wire.effects import Send
from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft.messages import (
    AppendRespRow, AppendRow, HeartbeatRespRow, HeartbeatRow, MESSAGE_OF, PeerRow, TimeoutNowRow, VoteRespRow,
    VoteRow,
)

__all__ = ["Outbox", "split_payload", "ROW_ORDER"]

# Rows go out in this order within one Ready (votes first: they decide elections).
ROW_ORDER = (VoteRow, VoteRespRow, TimeoutNowRow, AppendRow, AppendRespRow, HeartbeatRow, HeartbeatRespRow)


class Outbox:
    """Rows queued per peer until the next ``take``."""
    __slots__ = ("_rows", "_payloads")

    def __init__(self) -> None:
        self._rows: dict[str, dict[type, list[PeerRow]]] = {}  # dest -> row type -> rows
        self._payloads: dict[str, list[bytes]] = {}            # dest -> payload of each AppendRow

    def __bool__(self) -> bool:
        return bool(self._rows)

    def add(self, dest: str, row: PeerRow, payload: bytes = b"") -> None:
        by_type = self._rows.get(dest)
        if by_type is None:
            by_type = self._rows[dest] = {}
        rows = by_type.get(type(row))
        if rows is None:
            rows = by_type[type(row)] = []
        rows.append(row)
        if type(row) is AppendRow:
            self._payloads.setdefault(dest, []).append(payload)

    def ping(self, dest: str) -> None:
        """Make sure a message goes to ``dest``: an empty ``REPL_HEARTBEAT`` unless rows for
        it are queued already (any message tells the peer we are alive; see quiescence)."""
        if dest not in self._rows:
            self._rows[dest] = {HeartbeatRow: []}

    def take(self, store: str, life: int, max_rows: int, max_bytes: int) -> list[Send]:
        """Every queued row as coalesced messages (signed with the sender's identity)."""
        out: list[Send] = []
        for dest in sorted(self._rows):
            by_type = self._rows[dest]
            for row_type in (by_type if len(by_type) == 1 else [t for t in ROW_ORDER if t in by_type]):
                rows = by_type[row_type]   # (empty only for a ping)
                msg_type = MESSAGE_OF[row_type]
                if row_type is not AppendRow:
                    if len(rows) <= max_rows:
                        out.append(Send(dest, msg_type(rows, store, life)))
                        continue
                    for i in range(0, len(rows), max_rows):
                        out.append(Send(dest, msg_type(rows[i:i + max_rows], store, life)))
                    continue
                payloads = self._payloads[dest]
                i = 0
                while i < len(rows):
                    j, size = i, 0
                    while j < len(rows) and j - i < max_rows and (j == i or size + len(payloads[j]) <= max_bytes):
                        size += len(payloads[j])
                        j += 1
                    body = b"".join(payloads[i:j]) if size else b""
                    out.append(Send(dest, msg_type(rows[i:j], store, life), body))
                    i = j
        self._rows = {}
        self._payloads = {}
        return out


def split_payload(rows: list[AppendRow], payload: bytes) -> list[bytes]:
    """Each row's share of a REPL_APPEND payload frame; MeshError(INVALID_REQUEST) when the
    rows' offsets and byte counts do not match the frame."""
    total = 0
    for r in rows:
        if (r.prev_offset < 0 or r.end_offset < r.prev_offset
                or (r.end_offset > r.prev_offset) != (r.payload_bytes > 0)):
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"REPL_APPEND row for partition {r.pid}: offsets {r.prev_offset}.."
                            f"{r.end_offset} do not match {r.payload_bytes} payload bytes")
        total += r.payload_bytes
    if total != len(payload):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"REPL_APPEND rows name {total} payload bytes, the frame has {len(payload)}")
    if len(rows) == 1:
        return [bytes(payload)]
    view, out, at = memoryview(payload), [], 0
    for r in rows:
        out.append(bytes(view[at:at + r.payload_bytes]))
        at += r.payload_bytes
    return out
