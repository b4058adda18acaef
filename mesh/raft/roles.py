"""The role of one partition replica as a state object (Kafka KRaft's ``EpochState``): a
``Partition`` holds exactly one of ``FollowerState``, ``CandidateState`` or
``mesh.raft.leading.LeaderState``, made new by each transition (``Partition._enter``, from
``_become_follower``, ``_campaign`` and ``_become_leader``), so what one role knows is never
read, or left stale, in another. What every role keeps (term, vote, log, commit, config,
recovering) stays on the partition."""
from __future__ import annotations

import enum

__all__ = ["Role", "FollowerState", "CandidateState"]


class Role(str, enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class FollowerState:
    role = Role.FOLLOWER

    def __init__(self, handed_to: str | None = None, stepdown_beats: int = 0) -> None:
        self.handed_to = handed_to            # stepped down for this transfer's target; no leader known yet
        self.stepdown_beats = stepdown_beats  # beats left to tell the followers we stopped leading (rule 10)


class CandidateState:
    def __init__(self, pre: bool, node: str) -> None:
        self.role = Role.PRE_CANDIDATE if pre else Role.CANDIDATE
        self.votes: dict[str, bool] = {node: True}   # voter -> granted (our own vote counted)
