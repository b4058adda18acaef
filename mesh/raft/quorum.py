"""Quorum arithmetic (etcd-raft's ``quorum/``): pure functions over counts and offsets.

- A quorum of ``n`` replicas is a strict majority, ``n // 2 + 1``: any two quorums share
  a replica, which is what makes a committed offset and an election result stick.
- **Commit.** The committed offset (high watermark) is the largest offset that a quorum
  holds durably, counting only replicas whose log holds the current leader's epoch marker
  (their offset is at or past ``epoch_start``; Raft 5.4.2: entries of older epochs become
  committed only through a quorum holding the current epoch). The leader counts with what
  its shell synced, followers with what they acked in this term.
- **Elections.** A (pre-)candidate wins with a quorum of grants and loses as soon as the
  refusals make a quorum of grants impossible.
"""
from __future__ import annotations

import enum
from typing import Iterable, Mapping

__all__ = ["majority", "committed_offset", "VoteResult", "vote_result"]


def majority(replicas: int) -> int:
    """The size of a quorum of ``replicas`` voters."""
    return replicas // 2 + 1


def committed_offset(held: Iterable[int], epoch_start: int, quorum: int) -> int | None:
    """The largest offset at least ``quorum`` of the ``held`` offsets reach, counting only
    offsets at or past ``epoch_start``; None when fewer than ``quorum`` qualify."""
    eligible = [h for h in held if h >= epoch_start]
    if len(eligible) < quorum:
        return None
    eligible.sort(reverse=True)
    return eligible[quorum - 1]


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def vote_result(votes: Mapping[str, bool], voters: int, quorum: int) -> VoteResult:
    """Tally ``votes`` (voter -> granted) of an election among ``voters`` replicas."""
    granted = sum(1 for v in votes.values() if v)
    if granted >= quorum:
        return VoteResult.WON
    if len(votes) - granted > voters - quorum:
        return VoteResult.LOST
    return VoteResult.PENDING
