"""Consumer groups: the coordinator's configuration, its per-group records and its effects.

``GroupRecord`` and ``MemberRecord`` are the coordinator's whole state for one group (see
``mesh.groups.coordinator`` for what each field means to the protocol); the transitions
that change them live in ``mesh.groups.rebalance``. ``PersistOffsets`` and
``MemberRemoved`` are what the coordinator asks its shell to do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mesh.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR
from mesh.wire.types import TopicPartition

__all__ = ["GroupConfig", "GroupRecord", "MemberRecord", "PersistOffsets", "MemberRemoved", "DELETED"]

DELETED = -1   # the offset of a tombstone: a deleted group's (or partition's) committed offset


# ---------------------------------------------------------------------------------------
# Configuration

@dataclass(frozen=True, slots=True)
class GroupConfig:
    heartbeat_interval_ms: int = 1_000
    # while a group is reconciling (partitions waiting to move), members are asked to
    # heartbeat this often, so a hand-over takes a few round trips, not a few intervals
    reconcile_heartbeat_interval_ms: int = 100
    min_session_timeout_ms: int = 100
    max_session_timeout_ms: int = 30_000
    max_rebalance_timeout_ms: int = 300_000
    takeover_grace_ms: int | None = None        # None: max_session_timeout_ms
    default_assignor: str = DEFAULT_ASSIGNOR
    max_groups: int = 10_000
    max_members_per_group: int = 1_000
    max_topics_per_member: int = 1_000
    max_partitions_per_request: int = 100_000
    max_offsets_per_group: int = 100_000
    max_metadata_chars: int = 4_096
    max_topics: int = 100_000
    # a group with no members is deleted (its offsets with it) once it has been empty and
    # without a commit for this long: Kafka's offsets.retention.minutes (7 days); 0: never
    offsets_retention_ms: int = 7 * 86_400_000

    def __post_init__(self):
        if self.default_assignor not in ASSIGNORS:
            raise ValueError(f"unknown assignor {self.default_assignor!r}")
        if not 0 < self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("need 0 < min_session_timeout_ms <= max_session_timeout_ms")
        if self.heartbeat_interval_ms <= 0 or self.reconcile_heartbeat_interval_ms <= 0:
            raise ValueError("heartbeat intervals must be positive")
        if self.offsets_retention_ms < 0:
            raise ValueError("offsets_retention_ms must be >= 0 (0: never expire)")

    @property
    def grace_ms(self) -> int:
        return self.max_session_timeout_ms if self.takeover_grace_ms is None else self.takeover_grace_ms


# ---------------------------------------------------------------------------------------
# Effects

@dataclass(frozen=True, slots=True)
class PersistOffsets:
    """Make these offsets durable (on a majority of the group's replicas, the shell's
    ``mesh.groups.replication``), then answer the request; gossip them. An offset
    of ``DELETED`` (-1) is a deletion (a tombstone: the group or partition was deleted)."""
    group_id: str
    offsets: tuple[tuple[str, int, int, str], ...]   # (topic, partition, offset, metadata)


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    """For the log: a member was removed or fenced by ``tick``."""
    group_id: str
    member_id: str
    reason: str


# ---------------------------------------------------------------------------------------
# Records

@dataclass(slots=True)
class MemberRecord:
    """One member as the coordinator knows it: what it was given and what it must give back."""
    member_id: str
    topics: frozenset[str]
    assignor: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_heartbeat_ms: int
    epoch: int = 1
    assigned: set[TopicPartition] = field(default_factory=set)
    revoking: set[TopicPartition] = field(default_factory=set)
    revoke_since_ms: int | None = None   # when it was first told to revoke what is revoking
    fenced: bool = False                 # out of the group; holds its partitions until its session ends


@dataclass(slots=True)
class GroupRecord:
    """One group: members, epoch, target assignment, who holds what, committed offsets."""
    group_id: str
    epoch: int = 0
    assignor: str = ""
    members: dict[str, MemberRecord] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    owners: dict[TopicPartition, str] = field(default_factory=dict)   # assigned or revoking
    offsets: dict[TopicPartition, tuple[int, str]] = field(default_factory=dict)
    hold_until_ms: int = 0   # no partitions given before this (takeover grace)
    # since when the group has had no members and no commit (None: it has members, or
    # ``tick`` has not seen it empty yet); ``offsets_retention_ms`` counts from here
    idle_since_ms: int | None = None

    def state(self) -> str:
        if not self.members:
            return "empty"
        for m in self.members.values():
            if m.fenced or m.revoking or m.assigned != self.target.get(m.member_id, frozenset()):
                return "reconciling"
        return "stable"
