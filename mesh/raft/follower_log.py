"""A follower's side of log replication for ``mesh.raft.partition.Partition`` (its rules 3, 7
and 11): take an append's batches where the logs agree, truncate a conflicting suffix, record
the leader's epoch marker, answer with a hint when the logs disagree, restart at the
leader's log start (``reset``) and cut the head to it (``CutHead``). Functions of the
partition (``p``): the state they change is the replica's log, which every role keeps.

The partition's rules, in full:

3. Appends (follower). Accept if ``prev_offset <= commit`` (committed entries agree with
   every current leader) or our epoch at ``prev_offset - 1`` equals ``prev_epoch``.
   Otherwise reject with a hint (Kafka's OffsetsForLeaderEpoch idea): the leader then
   jumps straight to the point of agreement instead of backing off one batch at a time.
   Carried batches already present with the same epoch are not rewritten; a conflicting
   suffix is truncated (never below commit; a corrupt range, rule 6, is the one
   exception). When our log agrees with the leader's up to its ``epoch_start`` we record
   the leader's epoch marker there. A ``reset`` row (we are
   behind the leader's log start, which retention moved) restarts our log at that start.
7. Heartbeat commit. A follower takes a heartbeat's commit offset only up to ``agreed``:
   where an append of this term showed its log equal to the leader's (its own persisted
   commit before that); a rolled-back log never gets a commit over data it does not hold.
11. Log start (retention). Only the leader decides where its log starts (the node's
   retention pass: by size, and by time only while its clock agrees with its peers'); a
   cut is always below its commit offset. Every append and heartbeat carries the leader's
   log start; a follower cuts its head to it, up to its own commit offset (``CutHead``),
   and never by its own clock, so all replicas agree on the log start (a follower behind
   it restarts there: rule 3's ``reset``). A leader whose log start moved is woken and
   does not go quiet until it has beaten with the new start for a few beats. The
   leader's compaction cut travels the same way (``follow_clean``): decided by the leader
   alone, applied by each replica to its own committed records.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.wire.errors import ErrorCode
from mesh.raft import recovery
from mesh.raft.log import Append, CleanTo, CutHead, ResetLog, Truncate
from mesh.raft.messages import AppendRespRow, AppendRow

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["handle_append", "follow_start", "follow_clean"]

_NONE = int(ErrorCode.NONE)


def handle_append(p: Partition, src: str, row: AppendRow, payload: bytes) -> None:
    prev = row.prev_offset
    if row.reset and prev > p.commit:
        reset_log(p, prev, row.prev_epoch)
    if prev > p.end or (prev > p.commit and p.cache.epoch_at(prev - 1) != row.prev_epoch):
        reject(p, src, row)
        return
    if row.end_offset > prev and row.batch_epoch < p.cache.epoch_before(prev):
        # our log agrees with the leader's below prev, so its batches there cannot be older
        p.host.refuse(src, f"batches of epoch {row.batch_epoch} after epoch {p.cache.epoch_before(prev)}")
        return
    match = accept_batches(p, row, payload) if row.end_offset > prev else prev
    if match == row.epoch_start and p.cache.last_epoch() < p.term:
        # Our log agrees with the leader's up to where its epoch starts: record its
        # marker there. Anything after it is from an older epoch, which the leader's
        # log does not hold at those offsets.
        if p.end > match:
            truncate(p, match)
        p.cache.assign(p.term, match)
        p._state_changed()
    assert match <= row.epoch_start or p.cache.last_epoch() == p.term, (p.pid, match, row)
    if row.configs and p.history.replace_window(row.configs, match, p.term):
        p.membership.config_updated()
    p.agreed = max(p.agreed, match)
    p._set_commit(min(row.commit, match))
    p.membership.note_cfg_commit(row.cfg_commit, row.cfg_commit_term)
    follow_start(p, row.log_start)
    follow_clean(p, row.clean_end, row.clean_horizon)
    if p.recovering:
        if p.recover_term != p.term:
            # Where this leader's epoch starts in its log: it held every entry committed
            # before its term there. Its commit offset alone can be older than entries
            # we acknowledged before we forgot (a new leader learns of them only by
            # committing in its own term).
            p.recover_term = p.term
            p.recover_to = max(p.recover_floor, row.commit, row.epoch_start)
        if match >= p.recover_to:
            recovery.confirm_term(p, src)
    p._send(src, AppendRespRow(p.pid, p.term, _NONE, 1, match, row.end_offset, 0,
                                  int(p.recovering), *p.history.latest().ident))


def accept_batches(p: Partition, row: AppendRow, payload: bytes) -> int:
    """Take the batches [base, end) of epoch E; returns how far our log now agrees."""
    base, end, epoch = row.prev_offset, row.end_offset, row.batch_epoch
    have = min(end, p.end)
    lo = max(base, p.commit)  # below commit the logs agree by definition
    agree = have
    if lo < have:
        agree = lo if p.cache.epoch_at(lo) != epoch else min(have, p.cache.end_for_epoch(epoch, p.end))
    if agree < have:
        truncate(p, agree)  # a conflicting suffix
    if agree >= end:
        return end  # we hold them all already (a duplicate or an old message)
    if agree == base:
        append(p, base, end, epoch, payload)
        return end
    return agree  # we hold [base, agree): the leader resends from there (payloads are opaque)


def append(p: Partition, base: int, end: int, epoch: int, payload: bytes) -> None:
    assert base == p.end and end > base
    changed = p.cache.truncate_from(base)  # a marker at our end is superseded
    assert epoch >= p.cache.last_epoch(), (p.pid, epoch, p.cache)
    if p.cache.assign(epoch, base) or changed:   # (the end offset is not persisted state)
        p._state_changed()
    p.host.log_op(Append(p.pid, base, end, epoch, payload))
    p.end = end
    p.synced = end


def truncate(p: Partition, to: int) -> None:
    assert p.role.value != "leader" and p.commit <= to < p.end, (p.pid, p.commit, to, p.end)
    p.host.log_op(Truncate(p.pid, to))
    p.end = to
    p.synced = min(p.synced, to)
    p.agreed = min(p.agreed, to)
    if p.cache.truncate_from(to):
        p._state_changed()
    if p.history.truncate_after(to):
        p.membership.config_updated()


def reset_log(p: Partition, start: int, epoch: int) -> None:
    p.host.log_op(ResetLog(p.pid, start))
    p.end = start
    p.synced = start
    p.agreed = start
    p.cache.reset(epoch, start)
    p._state_changed()
    p._set_commit(start)  # everything below the leader's log start is committed


def follow_start(p: Partition, start: int) -> None:
    """Rule 11: cut our head to the leader's log start, as far as our commit goes (the
    shell: as far as the commit on disk goes; the next row carries it again)."""
    cut = min(start, p.commit)
    if cut > p.host.reader.start_offset(p.pid):
        p.host.log_op(CutHead(p.pid, cut))


def follow_clean(p: Partition, clean_end: int, horizon_ms: int) -> None:
    """Compaction: hand the shell a leader's cut newer than the one this replica knows; it
    applies it to its own committed records (never above its commit on disk). The cut
    and the horizon only grow, whichever leader sent them; a cut beyond our log end is
    not taken (never clamped: a different cut would compact differently), and every row
    carries it again."""
    if not clean_end or clean_end > p.end:
        return   # (none; or beyond what we hold: the leader counts stale matches; heard again later)
    end, horizon = p.host.reader.clean_cut(p.pid)
    if clean_end > end or horizon_ms > horizon:
        p.host.log_op(CleanTo(p.pid, max(end, clean_end), max(horizon, horizon_ms)))


def reject(p: Partition, src: str, row: AppendRow) -> None:
    prev = min(row.prev_offset, p.end)
    hint_end = min(prev, p.cache.end_for_epoch(row.prev_epoch, p.end))
    hint_epoch = p.cache.epoch_at(hint_end - 1) if hint_end > 0 else 0
    p._send(src, AppendRespRow(p.pid, p.term, _NONE, 0, row.prev_offset, hint_end, hint_epoch,
                                  int(p.recovering), *p.history.latest().ident))
