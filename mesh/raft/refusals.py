"""Rows refused against one ``mesh.raft.partition.Partition`` replica's state (its rule 8):
``refusal`` says why a row must not be stepped, or None.

The partition's rule, in full:

8. Refusals (defense in depth; ``host.refuse`` counts each with its reason, nothing else
   happens). Rows are bounded and consistent in themselves (``messages.parse_rows``); here,
   against our state: a row from a node that is not a replica; a row more than
   ``max_term_jump`` terms ahead (a term moves once per election), except a vote answer
   while we campaign, which is how a replica that was away long catches up, below
   ``_CATCH_UP_TERM_CEILING`` (MAX_TERM / 2: one forged answer at MAX_TERM - 1 made a
   replica campaign at a term every peer refuses, and its answers took the others there:
   a partition without a leader for good; from below the ceiling, terms move by at most
   ``max_term_jump`` at a time, so 2**39 elections stay possible); an append or
   heartbeat of our term from another node than the leader we follow; a TimeoutNow that
   is not from our leader in our term; an append whose leader epoch starts below our
   commit while we do not hold its marker (a leader holds every committed entry), or
   whose batches are of an epoch older than our log before them. A vote request's
   ``transfer`` flag skips the lease check only for the term right after ours (the
   successor of the leader we follow); otherwise it is an ordinary request.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.raft.messages import MAX_TERM, AppendRow, HeartbeatRow, PeerRow, TimeoutNowRow, VoteRespRow
from mesh.raft.roles import Role

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["refusal"]

_CATCH_UP_TERM_CEILING = MAX_TERM // 2   # a vote answer's term above this is never caught up to (rule 8)


def refusal(p: Partition, src: str, row: PeerRow, kind: type) -> str | None:
    """Why ``row`` must be refused against our state (rule 8); None to step it."""
    if row.term > p.term + p.cfg.max_term_jump and not (
            kind is VoteRespRow and p.role in (Role.PRE_CANDIDATE, Role.CANDIDATE)
            and row.term < _CATCH_UP_TERM_CEILING):
        return f"term {row.term} is more than {p.cfg.max_term_jump} ahead of ours ({p.term})"
    if kind is TimeoutNowRow:
        if row.term != p.term or src != p.leader:
            return "TimeoutNow not from the leader of our term"
    elif kind is AppendRow or kind is HeartbeatRow:
        if row.term == p.term and p.leader is not None and src != p.leader:
            return f"{kind.__name__} of term {row.term} from {src}, whose leader is {p.leader}"
        if (kind is AppendRow and row.term >= p.term and row.epoch_start < p.commit
                and p.cache.last_epoch() < row.term):
            return f"the leader's epoch starts at {row.epoch_start}, below our commit {p.commit}"
    return None
