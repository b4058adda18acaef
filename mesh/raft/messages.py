"""Wire messages of partition replication (peer protocol ``mesh-peer/8``).

MultiRaft coalescing is built into the message shapes: every message carries a list of
*rows*, one row per partition, and a node sends at most one message of each kind to each
peer per call into the core (split only when a byte or row bound is reached). So a tick
that heartbeats 1,000 partitions led here sends one ``REPL_HEARTBEAT`` to each peer, not
1,000.

A row is a flat array of ints (and the partition id) in a fixed field order, given by the
``NamedTuple`` beside each message. Rows from a newer peer may carry extra trailing fields;
they are ignored (forward compatibility). Every row carries the sender's ``term`` (the
partition's leader epoch as the sender knows it): that is what fences stale leaders.

``REPL_APPEND`` is the only message with a raw payload frame: the concatenation of each
row's batch bytes, in row order (``payload_bytes`` says how many belong to each row). The
bytes are opaque here: record batches exactly as the leader stored them.

Every message also carries the sender's identity, once per message (it is per broker, not
per partition): ``store``, the sender's store id (random, created with its data
directory; "" when the shell has none), and ``life``, a random number drawn when the
sender's replication core started (one per process start). A leader that sees a follower
answer from another store, or from a new life of the same store, stops trusting what it
knew of that follower (``mesh.raft.manager``, "Lost state"). Both are bounded
(``MAX_STORE_ID``) and validated with the rows.

Bounds (``parse_rows``, before anything is applied): terms and epochs below ``MAX_TERM``
(2**40: a term moves once per election), offsets, counts and commits below ``MAX_OFFSET``
(2**62), flags 0 or 1, and each row consistent in itself (an append's epochs at most its
term and ascending, its end not before its start; a vote's last epoch at most its term).
What depends on the receiver's state (term jumps, who leads) is checked by the partition.

Membership (``mesh.raft.membership``, peer protocol 4): appends may carry config markers
``[[offset, version, term, [voters], [learners]], ...]`` (at most ``MAX_MARKERS``,
ascending, versions strictly increasing and below 2**40, terms at most the row's, at most
``max_replicas`` distinct node ids of at most 255 characters per config); ``parse_rows``
turns them into ``(offset, Config)`` pairs.

Retention: appends and heartbeats end with the leader's log start (``log_start``; at most
the row's commit in an append), which followers follow (``mesh.raft.partition``, rule
11). A row without it (from a broker before this field) is taken with 0: nothing to cut.
Compaction: appends and heartbeats then carry the leader's compaction cut (``clean_end``,
``clean_horizon``; 0, 0: none), which followers apply to their own committed records
(``mesh.node.data.compactor``). Appends and heartbeats carry the leader's
committed config id; their answers the follower's latest config id; votes the
candidate's latest config version (part of the log comparison).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.codec import message
from mesh.raft.membership import MAX_MARKERS, MAX_VERSION, Config, config_from_wire

__all__ = [
    "AppendRow", "AppendRespRow", "HeartbeatRow", "HeartbeatRespRow", "VoteRow", "VoteRespRow",
    "TimeoutNowRow", "ReplAppend", "ReplAppendResp", "ReplHeartbeat", "ReplHeartbeatResp",
    "ReplVote", "ReplVoteResp", "ReplTimeoutNow", "PeerRow", "PeerMessage", "PEER_MESSAGES",
    "ROW_OF", "MESSAGE_OF", "parse_rows", "MAX_ROWS_PER_MESSAGE", "MAX_TERM", "MAX_OFFSET",
]

MAX_ROWS_PER_MESSAGE = 65_536  # a hard bound on what a peer may send; the sender splits far below it
MAX_STORE_ID = 64              # characters of a store id on the wire
MAX_TERM = 1 << 40             # terms and epochs: one per election, this is never reached honestly
MAX_OFFSET = 1 << 62           # offsets, commits, byte counts


# -- rows ------------------------------------------------------------------------------

class AppendRow(NamedTuple):
    """Leader -> follower: 'my log holds epoch ``prev_epoch`` at ``prev_offset - 1``; here
    are the batches [prev_offset, end_offset), all of epoch ``batch_epoch``' (none when
    ``end_offset == prev_offset``: a probe / empty append)."""
    pid: int
    term: int
    prev_offset: int      # also the base offset of the carried batches
    prev_epoch: int
    end_offset: int
    batch_epoch: int      # 0 when no batches are carried
    epoch_start: int      # where the leader's epoch starts in its log (the epoch marker)
    commit: int           # the leader's commit offset (high watermark)
    payload_bytes: int    # this row's share of the payload frame
    reset: int            # 1: prev_offset is the leader's log start; a follower behind it restarts its log there
    cfg_commit: int = 0   # the leader's committed config id: (version, term)
    cfg_commit_term: int = 0
    configs: list = ()    # config markers from the one in force at prev_offset ([] when not carried)
    log_start: int = 0    # the leader's log start: followers cut their head to it once committed
    clean_end: int = 0    # the leader's compaction cut (mesh.node.data.compactor): below it the
    clean_horizon: int = 0   # newest record per key is kept, tombstones older than the horizon dropped


class AppendRespRow(NamedTuple):
    """Follower -> leader. ok=1: the logs agree on [0, offset) and it is durable (the
    response leaves only after the follower persisted). ok=0: the check at ``offset`` (the
    rejected prev_offset) failed; the follower's log holds epochs <= ``hint_epoch`` below
    ``hint_end``, where the leader should probe next."""
    pid: int
    term: int
    code: int             # ErrorCode: NONE, or FENCED_EPOCH when the sender's term was stale
    ok: int
    offset: int
    hint_end: int         # ok=1: the end_offset of the row answered (to spot partial acks)
    hint_epoch: int
    recovering: int       # 1: this replica lost state and is refilling: do not count it
    cfg_version: int = 0  # the follower's latest config id: (version, term)
    cfg_term: int = 0


class HeartbeatRow(NamedTuple):
    pid: int
    term: int
    commit: int           # min(leader commit, what the leader knows this follower holds)
    cfg_commit: int = 0   # the leader's committed config id: (version, term)
    cfg_commit_term: int = 0
    quiesce: int = 0      # 1: the leader goes quiet (idle, every live follower caught up); see manager
    log_start: int = 0    # as in AppendRow
    clean_end: int = 0    # as in AppendRow
    clean_horizon: int = 0


class HeartbeatRespRow(NamedTuple):
    pid: int
    term: int
    code: int
    recovering: int       # as in AppendRespRow
    cfg_version: int = 0  # as in AppendRespRow
    cfg_term: int = 0


class VoteRow(NamedTuple):
    pid: int
    term: int             # the term the candidate asks for (its term + 1 for a pre-vote)
    last_epoch: int       # the candidate's log: last epoch, then end offset
    end_offset: int
    pre_vote: int
    transfer: int         # 1: a leadership transfer; voters skip the leader-lease check
    cfg_version: int = 0  # the candidate's latest config version (after end_offset in log comparisons)


class VoteRespRow(NamedTuple):
    pid: int
    term: int
    code: int
    granted: int
    pre_vote: int


class TimeoutNowRow(NamedTuple):
    """Leader -> its chosen successor: campaign now (leadership transfer)."""
    pid: int
    term: int


# -- messages --------------------------------------------------------------------------

@message("REPL_APPEND")
@dataclass(frozen=True, slots=True)
class ReplAppend:
    rows: list[AppendRow]  # the payload frame holds the rows' batches back to back
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_APPEND_R")
@dataclass(frozen=True, slots=True)
class ReplAppendResp:
    rows: list[AppendRespRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_HEARTBEAT")
@dataclass(frozen=True, slots=True)
class ReplHeartbeat:
    rows: list[HeartbeatRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_HEARTBEAT_R")
@dataclass(frozen=True, slots=True)
class ReplHeartbeatResp:
    rows: list[HeartbeatRespRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_VOTE")
@dataclass(frozen=True, slots=True)
class ReplVote:
    rows: list[VoteRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_VOTE_R")
@dataclass(frozen=True, slots=True)
class ReplVoteResp:
    rows: list[VoteRespRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


@message("REPL_TIMEOUT_NOW")
@dataclass(frozen=True, slots=True)
class ReplTimeoutNow:
    rows: list[TimeoutNowRow]
    store: str = ""         # the sender's store id
    life: int = 0           # the sender's core incarnation


PeerRow: TypeAlias = (
    AppendRow | AppendRespRow | HeartbeatRow | HeartbeatRespRow | VoteRow | VoteRespRow | TimeoutNowRow
)
PeerMessage: TypeAlias = (
    ReplAppend | ReplAppendResp | ReplHeartbeat | ReplHeartbeatResp | ReplVote | ReplVoteResp | ReplTimeoutNow
)

# Every message of the replication peer protocol (the node routes these to the raft host).
PEER_MESSAGES: tuple[type, ...] = (
    ReplAppend, ReplAppendResp, ReplHeartbeat, ReplHeartbeatResp, ReplVote, ReplVoteResp, ReplTimeoutNow,
)
MESSAGE_OF: dict[type, type] = {
    AppendRow: ReplAppend, AppendRespRow: ReplAppendResp, HeartbeatRow: ReplHeartbeat,
    HeartbeatRespRow: ReplHeartbeatResp, VoteRow: ReplVote, VoteRespRow: ReplVoteResp,
    TimeoutNowRow: ReplTimeoutNow,
}
ROW_OF: dict[type, type] = {msg: row for row, msg in MESSAGE_OF.items()}
assert set(ROW_OF) == set(PEER_MESSAGES)


def _field_types(row_type: type) -> tuple[type, ...]:
    hints = typing.get_type_hints(row_type)
    return tuple(hints[name] for name in row_type._fields)


_FIELDS: dict[type, tuple[type, ...]] = {row: _field_types(row) for row in MESSAGE_OF}


def parse_rows(msg: object, max_replicas: int = 9) -> list[PeerRow]:
    """The rows of a decoded replication message as row tuples; a malformed message raises
    MeshError(INVALID_REQUEST) naming the problem, before anything is applied.
    ``max_replicas``: the most members a carried config may name."""
    row_type = ROW_OF.get(type(msg))
    if row_type is None:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"not a replication message: {type(msg).__name__}")
    raw_rows = msg.rows
    if not isinstance(msg.store, str) or len(msg.store) > MAX_STORE_ID or not 0 <= msg.life < 1 << 63:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__}: bad sender identity")
    if not isinstance(raw_rows, (list, tuple)) or len(raw_rows) > MAX_ROWS_PER_MESSAGE:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__}: rows must be a list "
                        f"of at most {MAX_ROWS_PER_MESSAGE}")
    kinds = _FIELDS[row_type]
    rows = []
    for raw in raw_rows:
        if type(raw) is row_type:   # handed over in-process (the simulators): typed already
            row = raw
        else:
            row = _typed(raw, row_type, kinds, type(msg).__name__)
        why = _check_row(row)
        if why is None and row_type is AppendRow and row.configs:
            row, why = _parse_configs(row, max_replicas)
        if why is not None:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"{row_type.__name__} for partition {row.pid}: {why}")
        rows.append(row)
    return rows


# Trailing fields a row may lack (added after ``mesh-peer/6``; their defaults apply).
_OPTIONAL_TAIL: dict[type, int] = {AppendRow: 3, HeartbeatRow: 3}


def _typed(raw: object, row_type: type, kinds: tuple[type, ...], msg_name: str) -> PeerRow:
    n = len(kinds)
    if isinstance(raw, (list, tuple)) and n - _OPTIONAL_TAIL.get(row_type, 0) <= len(raw) < n:
        kinds = kinds[:len(raw)]
        n = len(raw)
    if not isinstance(raw, (list, tuple)) or len(raw) < n:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{msg_name}: each row needs {n} fields {row_type._fields}")
    for value, kind, name in zip(raw, kinds, row_type._fields):
        if type(value) is not kind and not (kind is list and type(value) is tuple):  # a bool is not an int
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"{row_type.__name__}.{name}: expected {kind.__name__}, got {type(value).__name__}")
        if kind is int and not (-1 <= value < 1 << 63):
            raise MeshError(ErrorCode.INVALID_REQUEST, f"{row_type.__name__}.{name}: {value} out of range")
    return row_type._make(raw[:n]) if n == len(row_type._fields) else row_type(*raw[:n])


def _parse_configs(r: AppendRow, max_replicas: int) -> tuple[AppendRow, str | None]:
    """The row with its carried markers as ``((offset, Config), ...)``, or why they are bad."""
    if len(r.configs) > MAX_MARKERS:
        return r, f"more than {MAX_MARKERS} config markers"
    out: list[tuple[int, Config]] = []
    for raw in r.configs:
        if isinstance(raw, tuple) and len(raw) == 2 and type(raw[1]) is Config:
            m = raw  # parsed already (handed over in-process)
        else:
            try:
                m = config_from_wire(raw, max_replicas)
            except ValueError as exc:
                return r, str(exc)
        if m[1].term > r.term:
            return r, "a config of a term after the row's"
        if out and (m[0] < out[-1][0] or m[1].version <= out[-1][1].version):
            return r, "config markers out of order"
        out.append(m)
    return r._replace(configs=tuple(out)), None


def _check_row(r: PeerRow) -> str | None:
    """Why a row is out of bounds or inconsistent in itself (None: fine)."""
    if not 0 <= r.pid < MAX_OFFSET:
        return "partition id out of range"
    if not 0 <= r.term < MAX_TERM:
        return f"term {r.term} out of range"
    kind = type(r)
    if kind is AppendRow:
        if not (0 <= r.prev_offset <= r.end_offset < MAX_OFFSET and 0 <= r.commit < MAX_OFFSET
                and 0 <= r.epoch_start < MAX_OFFSET and 0 <= r.payload_bytes < MAX_OFFSET):
            return "offsets out of range"
        if r.term < 1 or not 0 <= r.prev_epoch <= r.term or not 0 <= r.batch_epoch <= r.term or r.reset not in (0, 1):
            return "epochs beyond the term"
        if r.end_offset > r.prev_offset and r.batch_epoch < max(1, r.prev_epoch):
            return "batches of an epoch older than the one before them"
        # the leader's log holds its own epoch from epoch_start on
        if r.prev_offset > r.epoch_start and r.prev_epoch != r.term:
            return "an offset past the leader's epoch start of another epoch"
        if r.end_offset > r.prev_offset and (r.batch_epoch != r.term if r.prev_offset >= r.epoch_start
                                             else r.end_offset > r.epoch_start):
            return "batches across the leader's epoch start"
        if r.reset and r.prev_offset > r.commit:
            return "a log start above the leader's commit"
        if not (0 <= r.cfg_commit < MAX_VERSION and 0 <= r.cfg_commit_term <= r.term):
            return "config id out of range"
        if not 0 <= r.log_start <= r.commit:
            return "a log start above the leader's commit"
        if not (0 <= r.clean_end < MAX_OFFSET and 0 <= r.clean_horizon < MAX_OFFSET):
            return "a compaction cut out of range"
    elif kind is AppendRespRow:
        if not (0 <= r.offset < MAX_OFFSET and 0 <= r.hint_end < MAX_OFFSET and 0 <= r.hint_epoch < MAX_TERM
                and r.ok in (0, 1) and r.recovering in (0, 1) and r.code >= 0
                and 0 <= r.cfg_version < MAX_VERSION and 0 <= r.cfg_term < MAX_TERM):
            return "fields out of range"
    elif kind is HeartbeatRow:
        if (r.term < 1 or not 0 <= r.commit < MAX_OFFSET or not 0 <= r.cfg_commit < MAX_VERSION
                or not 0 <= r.cfg_commit_term <= r.term or r.quiesce not in (0, 1)
                or not 0 <= r.log_start < MAX_OFFSET or not 0 <= r.clean_end < MAX_OFFSET
                or not 0 <= r.clean_horizon < MAX_OFFSET):
            return "commit out of range"
    elif kind is HeartbeatRespRow:
        if (r.recovering not in (0, 1) or r.code < 0 or not 0 <= r.cfg_version < MAX_VERSION
                or not 0 <= r.cfg_term < MAX_TERM):
            return "fields out of range"
    elif kind is VoteRow:
        if (r.term < 1 or not 0 <= r.last_epoch <= r.term or not 0 <= r.end_offset < MAX_OFFSET
                or r.pre_vote not in (0, 1) or r.transfer not in (0, 1) or not 0 <= r.cfg_version < MAX_VERSION):
            return "fields out of range"
    elif kind is VoteRespRow:
        if r.granted not in (0, 1) or r.pre_vote not in (0, 1) or r.code < 0:
            return "fields out of range"
    elif r.term < 1:  # TimeoutNowRow
        return "term out of range"
    return None
