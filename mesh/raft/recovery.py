"""Lost state and corruption in one ``mesh.raft.partition.Partition`` replica (its rule 6):
becoming recovering, confirming a refilling leader's term with the other voters before
voting again (``confirm_term``), and a corrupt batch (``report_corrupt``: a leader hands
over, the log is cut and refilled). Functions of the partition (``p``).

The partition's rule, in full:

6. Eligibility. A replica of a partition with more than one replica grants no (pre-)vote
   (except with RF 2: to the other replica, whatever our log says, as it holds every
   committed entry) and never
   campaigns while its node is unconfirmed (``host.confirmed`` False: it does
   not know yet whether its disk forgot) or while it is ``recovering``; it still follows
   and acks. Recovering (lost state, or a corrupt batch cut from its log): it says so in
   every append and heartbeat response; it leaves once its log agrees with the leader's
   up to ``recover_to`` (where the current leader's epoch starts in its log, which holds
   everything committed before that term; at least its own old commit after a
   corruption), and once enough other voters confirm that term is the newest
   (``confirm_term``), and records its vote for that leader in that term, so it never
   votes twice in a term it forgot. The flag is persisted with the state.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.raft.log import Truncate
from mesh.raft.messages import TimeoutNowRow, VoteRespRow, VoteRow

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["become_recovering", "confirm_term", "confirm_answer", "drop_vouch", "report_corrupt"]


def become_recovering(p: Partition, recover_to: int | None = None) -> None:
    """This replica forgot acknowledged state (or cut a corrupt range): stop leading,
    voting and counting until refilled up to ``recover_to`` (None: where the current
    leader's epoch starts). RF 1 has no one to refill from: no change."""
    if p.voters == (p.node,):
        return
    p.wake()
    if p.role.value != "follower":
        p._become_follower(p.term, None)
    if recover_to is not None:
        p.recover_floor = max(recover_to, p.recover_floor)
        p.recover_to = max(recover_to, p.recover_to or 0)
    if not p.recovering:
        p.recovering = True
        p._state_changed()


def confirm_term(p: Partition, leader: str) -> None:
    """Refilled from ``leader``: before we count and vote again, make sure its term is
    still the newest. We may have voted for (or led) a newer term before we forgot, and
    a leader of an older term that has not heard of it (paused, cut off) would refill us
    and then win our vote for a term we already voted in. So we ask the other voters
    (a pre-vote at our own term: the answer carries the voter's term, or grants one not
    above ours) and leave only when enough of them, with the leader, are at or below our
    term that any quorum of the newer term would include one: ``n - q + 1`` of the
    ``n - 1`` others. One of them at a newer term moves us there (still recovering)."""
    if p.node not in p.voters:   # a learner has no vote to give twice
        recovered(p, leader)
        return
    now = p.host.now_tick
    c = p.confirming
    if c is None or c[0] != p.term or c[1] != leader:
        c = p.confirming = (p.term, leader, {leader}, now - p.cfg.heartbeat_ticks)
    if len(c[2]) >= len(p.voters) - p.quorum + 1:
        p.confirming = None
        recovered(p, leader)
    elif now - c[3] >= p.cfg.heartbeat_ticks:
        p.confirming = (c[0], c[1], c[2], now)
        row = VoteRow(p.pid, p.term, p.cache.last_epoch(), p.end, 1, 0, p.history.latest().version)
        for peer in p.voters:
            if peer != p.node and peer not in c[2]:
                p._send(peer, row)


def confirm_answer(p: Partition, src: str, row: VoteRespRow) -> None:
    c = p.confirming
    if c is not None and row.pre_vote and row.term == c[0] == p.term and src in p.voters:
        c[2].add(src)
        confirm_term(p, c[1])


def drop_vouch(p: Partition) -> None:
    if p.vouch is not None:
        p.vouch = None
        p._state_changed()


def recovered(p: Partition, leader: str) -> None:
    p.recovering = False
    p.recover_to, p.recover_term, p.recover_floor = None, -1, 0
    p.confirming = None
    p.vouch = None   # recovered: the ordinary rules decide our votes again
    if p.vote is None:
        p.vote = leader  # we may have voted in this term before we forgot: only for it
    p._state_changed()


def report_corrupt(p: Partition, offset: int) -> None:
    """A stored batch at ``offset`` failed its check: a leader hands over to its most
    caught-up healthy follower (TimeoutNow) and steps down; then the log is cut at
    ``offset`` (even below commit) and refilled from the leader (recovering until past
    the old commit). Idempotent: damage at or past our log end changes nothing."""
    p.corrupt_at = offset
    if p.voters == (p.node,) or offset >= p.end or offset < 0:
        return
    p.wake()
    if p.role.value == "leader":
        successor = p.lead._best_successor()
        if successor is not None:
            p._send(successor, TimeoutNowRow(p.pid, p.term))
            if p.progress[successor].match >= max(p.commit, p.epoch_start):
                # It holds every committed entry (ours, and all committed before our
                # term, which lie below our epoch start), so we may still vote for it,
                # recovering: with another replica recovering too (a follower refilling
                # from us is what reads, and finds, old damage) its election needs us.
                p.vouch = (successor, p.term + 1)
    old_commit = p.commit
    become_recovering(p, old_commit)
    p.host.log_op(Truncate(p.pid, offset))
    p.end = p.synced = offset
    p.commit = min(p.commit, offset)
    p.agreed = min(p.agreed, offset)
    p.cache.truncate_from(offset)
    if p.history.truncate_after(offset):
        p.membership.use_config()
    p._state_changed()
