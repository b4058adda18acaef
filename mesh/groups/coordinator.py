"""Consumer groups: the coordinator's state machine and its wire messages.

The member side is ``mesh.groups.member.GroupMemberState``; the node shell that drives the
coordinator is ``mesh.node.group_host``; the client shell is ``mesh.client.group``.

Theory of operation
-------------------
Modelled on Kafka's KIP-848 ("next generation" rebalance): assignment is computed on the
server, members learn it from their heartbeats, and partitions move incrementally.

A member heartbeats ``GROUP_HEARTBEAT`` to the group's coordinator (the broker chosen by
``mesh.groups.rendezvous.coordinator_for``) with its subscription and the partitions it holds
right now. Member id ``""`` with epoch 0 joins (the coordinator makes up the id); epoch
-1 leaves. The answer carries the member's id, its *member epoch* and the partitions it
may hold.

Per group the coordinator keeps the members, the *group epoch* (bumped on every change of
membership, subscriptions, assignor, or the partition count of a subscribed topic), the
*target assignment* (recomputed by the assignor at every bump, ``mesh.groups.assignors``), and
per member what it has been *given* (``assigned``) and what it has been told to give back
but has not yet reported released (``revoking``). When a member heartbeats:

1. if its epoch is current, partitions missing from its ``owned`` list are released;
2. what it was given but is no longer in its target moves to ``revoking``;
3. only when nothing is left revoking, target partitions that no member holds (in anyone's
   ``assigned`` or ``revoking``) are given to it, and its member epoch goes up by one.

Rules, and why they keep two members from ever holding one partition:

* The coordinator gives a partition only when it is in no member's ``assigned`` or
  ``revoking`` (the ``owners`` map; asserted by ``check_invariants``).
* A member epoch goes up exactly when partitions are given, so the first answer carrying a
  new epoch carries every partition given at that epoch. An answer never both gives and
  revokes: grants wait until the member has released everything it was asked to.
* ``owned`` lists are believed only from requests carrying the member's *current* epoch:
  such a member has accepted an answer of that epoch, so it holds everything given to it
  up to then, and a partition missing from its list is truly gone. A delayed or duplicated
  older heartbeat cannot release anything.
* Members (``mesh.groups.member.GroupMemberState``) take given partitions at once, accept an answer only if
  its epoch is not older than theirs, and from an answer of their own epoch only *remove*
  partitions, so a delayed answer cannot hand back a partition already released.
* Leaving member ids are never reused (64 random bits from the injected ``rng``), so a
  leave (epoch -1), however late, is always true: that id holds nothing and never will.
* Session timeout: a member not heard from for ``session_timeout_ms`` is removed and its
  partitions are free at once. That is safe because the member fences itself first: it
  drops everything and rejoins under a new id once ``session_timeout_ms`` (minus a margin)
  has passed since it *sent* its last acknowledged heartbeat, which the coordinator
  processed no earlier than that.
* Rebalance timeout: a member that has not released what it was asked to within
  ``rebalance_timeout_ms`` is fenced: it leaves the assignment at once, but the partitions
  it holds stay held until its session would have ended, since it may still think it owns
  them.
* Failover: a coordinator starts empty. Members rejoin (the new coordinator does not know
  their ids: UNKNOWN_MEMBER), and committed offsets come from gossip (``load_offsets``).
  Members of the old coordinator may still hold partitions until their sessions end, so a
  group that gets its first member within ``takeover_grace_ms`` of the coordinator starting
  (or of ``begin_takeover``) is given no partitions before that window ends.

Offsets: ``GROUP_COMMIT`` is accepted from a member with its current epoch that holds the
partitions (``assigned`` or ``revoking``: members commit while revoking), or from a
"simple" consumer (member id ``""``, epoch -1) when the group has no members, as Kafka
allows. Success returns ``PersistOffsets``; the shell makes it durable, then replies, then
gossips it. ``GROUP_RESET_OFFSETS`` is refused while the group has members.

Pacing: every heartbeat answer says when to heartbeat next: ``heartbeat_interval_ms``
while the group is stable, ``reconcile_heartbeat_interval_ms`` (100 ms) while partitions
are waiting to move, so a hand-over takes a few round trips rather than a few intervals.

Public API (sans-I/O: time is ``now_ms``, randomness the injected ``rng``)::

    coord = GroupCoordinator(GroupConfig(), random.Random(seed), now_ms=now)
    coord.set_topic_partitions("orders", 12)           # from the metadata view
    coord.load_offsets("g", [("orders", 0, 42, "")])    # from gossip, on taking over
    response, effects = coord.handle(request, now_ms)   # any GROUP_* request below
    effects = coord.tick(now_ms)                        # expire sessions, fence laggards
    coord.describe("g"), coord.list_groups(), coord.drop_group("g"), coord.begin_takeover(now)

The shell: routes GROUP_* requests for groups whose ``coordinator_for`` is this node to
``handle`` and answers the others with ``error_response(req, COORDINATOR_MOVED,
coordinator=node)``; answers GROUP_FIND_COORDINATOR itself; carries out ``PersistOffsets``
before sending the response; calls ``tick`` every loop turn and ``set_topic_partitions``
when metadata changes; when the live broker set changes, calls ``drop_group`` for groups
no longer hashed here and ``begin_takeover`` (then ``load_offsets`` for groups that are).

The client drives a ``mesh.groups.member.GroupMemberState`` (see its docstring).

Errors: UNKNOWN_MEMBER (the id is gone: drop everything, rejoin), FENCED_EPOCH (this
member is out: drop everything, rejoin), ILLEGAL_GENERATION on a commit (the epoch is
stale or the partition is not held: heartbeat, then retry what is still held),
INVALID_REQUEST / INVALID_CONFIG for bad input. COORDINATOR_MOVED and
COORDINATOR_NOT_AVAILABLE come from the shell (``error_response``).
"""
from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from mesh.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, TopicPartition, assign
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.codec import message

__all__ = [
    "GroupHeartbeat", "GroupHeartbeatResponse", "GroupCommit", "GroupCommitResponse",
    "GroupFetchOffsets", "GroupFetchOffsetsResponse", "GroupResetOffsets",
    "GroupResetOffsetsResponse", "GroupDescribe", "GroupDescribeResponse", "GroupList",
    "GroupListResponse", "GroupFindCoordinator", "GroupFindCoordinatorResponse",
    "PersistOffsets", "MemberRemoved", "GroupConfig", "GroupCoordinator", "error_response",
    "MemberChanges", "GroupMemberState", "JOIN_EPOCH", "LEAVE_EPOCH",
]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
MAX_GROUP_ID_CHARS = 255
MAX_TOPIC_CHARS = 249
MAX_PARTITIONS_PER_TOPIC = 10_000


# ---------------------------------------------------------------------------------------
# Wire messages. Partitions travel as [topic, partition] pairs, offsets as
# [topic, partition, offset, metadata]. Every response has `error` and `message`;
# `coordinator` is a hint (node id) that comes with COORDINATOR_MOVED.

@message("GROUP_HEARTBEAT")
@dataclass(frozen=True, slots=True)
class GroupHeartbeat:
    group_id: str
    member_id: str            # "" to join
    member_epoch: int         # JOIN_EPOCH to join, LEAVE_EPOCH to leave, else the last received
    topics: list              # subscribed topic names
    owned: list               # [[topic, partition], ...] held now, including ones being revoked
    assignor: str = ""        # "" lets the coordinator choose
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 60_000


@message("GROUP_HEARTBEAT_R")
@dataclass(frozen=True, slots=True)
class GroupHeartbeatResponse:
    error: int
    message: str = ""
    member_id: str = ""
    member_epoch: int = LEAVE_EPOCH
    assignment: list = field(default_factory=list)   # [[topic, partition], ...] to hold
    heartbeat_interval_ms: int = 0
    group_epoch: int = -1
    coordinator: str | None = None


@message("GROUP_COMMIT")
@dataclass(frozen=True, slots=True)
class GroupCommit:
    group_id: str
    member_id: str            # "" with epoch -1: a simple (manually assigned) consumer
    member_epoch: int
    offsets: list             # [[topic, partition, offset, metadata], ...]


@message("GROUP_COMMIT_R")
@dataclass(frozen=True, slots=True)
class GroupCommitResponse:
    error: int
    message: str = ""
    coordinator: str | None = None


@message("GROUP_FETCH_OFFSETS")
@dataclass(frozen=True, slots=True)
class GroupFetchOffsets:
    group_id: str
    partitions: list | None = None   # [[topic, partition], ...]; None: all committed


@message("GROUP_FETCH_OFFSETS_R")
@dataclass(frozen=True, slots=True)
class GroupFetchOffsetsResponse:
    error: int
    message: str = ""
    offsets: list = field(default_factory=list)   # offset -1 where nothing is committed
    coordinator: str | None = None


@message("GROUP_RESET_OFFSETS")
@dataclass(frozen=True, slots=True)
class GroupResetOffsets:
    group_id: str
    offsets: list             # [[topic, partition, offset], ...] (the shell resolves earliest/latest)


@message("GROUP_RESET_OFFSETS_R")
@dataclass(frozen=True, slots=True)
class GroupResetOffsetsResponse:
    error: int
    message: str = ""
    coordinator: str | None = None


@message("GROUP_DESCRIBE")
@dataclass(frozen=True, slots=True)
class GroupDescribe:
    group_id: str


@message("GROUP_DESCRIBE_R")
@dataclass(frozen=True, slots=True)
class GroupDescribeResponse:
    """members: [{member_id, member_epoch, topics, assignor, assigned, revoking, target,
    fenced, session_timeout_ms, last_heartbeat_ms}]; offsets: [[topic, partition, offset,
    metadata]]. The shell may add log end and lag per offset."""
    error: int
    message: str = ""
    group_id: str = ""
    state: str = "dead"       # empty | reconciling | stable | dead (unknown here)
    group_epoch: int = -1
    assignor: str = ""
    members: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    coordinator: str | None = None


@message("GROUP_LIST")
@dataclass(frozen=True, slots=True)
class GroupList:
    pass


@message("GROUP_LIST_R")
@dataclass(frozen=True, slots=True)
class GroupListResponse:
    """groups: [{group_id, state, members, group_epoch}] for the groups this broker coordinates."""
    error: int
    message: str = ""
    groups: list = field(default_factory=list)


@message("GROUP_FIND_COORDINATOR")
@dataclass(frozen=True, slots=True)
class GroupFindCoordinator:
    """Answered by the shell from its gossip view with ``mesh.groups.rendezvous.coordinator_for``."""
    group_id: str


@message("GROUP_FIND_COORDINATOR_R")
@dataclass(frozen=True, slots=True)
class GroupFindCoordinatorResponse:
    error: int
    message: str = ""
    node_id: str = ""
    address: str = ""


_RESPONSE_OF: dict[type, type] = {
    GroupHeartbeat: GroupHeartbeatResponse,
    GroupCommit: GroupCommitResponse,
    GroupFetchOffsets: GroupFetchOffsetsResponse,
    GroupResetOffsets: GroupResetOffsetsResponse,
    GroupDescribe: GroupDescribeResponse,
    GroupList: GroupListResponse,
    GroupFindCoordinator: GroupFindCoordinatorResponse,
}


def error_response(request: Any, code: ErrorCode | int, text: str = "",
                   coordinator: str | None = None) -> Any:
    """The error answer to any GROUP_* request (the shell uses it for COORDINATOR_MOVED)."""
    cls = _RESPONSE_OF[type(request)]
    kwargs: dict[str, Any] = {"error": int(code), "message": text or ErrorCode(code).name}
    if "coordinator" in cls.__dataclass_fields__:
        kwargs["coordinator"] = coordinator
    if cls is GroupHeartbeatResponse:  # the member matches answers by id
        kwargs["member_id"] = request.member_id if isinstance(request.member_id, str) else ""
    if cls is GroupDescribeResponse and isinstance(request.group_id, str):
        kwargs["group_id"] = request.group_id
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------
# Effects

@dataclass(frozen=True, slots=True)
class PersistOffsets:
    """Make these offsets durable, then answer the request, then gossip them."""
    group_id: str
    offsets: tuple[tuple[str, int, int, str], ...]   # (topic, partition, offset, metadata)


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    """For the log: a member was removed or fenced by ``tick``."""
    group_id: str
    member_id: str
    reason: str


# ---------------------------------------------------------------------------------------
# Configuration and validation

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

    def __post_init__(self):
        if self.default_assignor not in ASSIGNORS:
            raise ValueError(f"unknown assignor {self.default_assignor!r}")
        if not 0 < self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("need 0 < min_session_timeout_ms <= max_session_timeout_ms")
        if self.heartbeat_interval_ms <= 0 or self.reconcile_heartbeat_interval_ms <= 0:
            raise ValueError("heartbeat intervals must be positive")

    @property
    def grace_ms(self) -> int:
        return self.max_session_timeout_ms if self.takeover_grace_ms is None else self.takeover_grace_ms


def _invalid(text: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_REQUEST, text)


def _check_group_id(group_id: Any) -> str:
    if not isinstance(group_id, str) or not 0 < len(group_id) <= MAX_GROUP_ID_CHARS:
        raise _invalid(f"group id must be 1-{MAX_GROUP_ID_CHARS} characters")
    return group_id


def _check_topic(topic: Any) -> str:
    if not isinstance(topic, str) or not 0 < len(topic) <= MAX_TOPIC_CHARS:
        raise _invalid(f"topic must be a string of 1-{MAX_TOPIC_CHARS} characters, got {topic!r:.60}")
    return topic


def _check_int(value: Any, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _invalid(f"{what} must be an integer in [{low}, {high}], got {value!r:.40}")
    return value


def _check_list(items: Any, limit: int, what: str) -> list:
    if not isinstance(items, (list, tuple)):
        raise _invalid(f"{what} must be a list")
    if len(items) > limit:
        raise _invalid(f"{what}: {len(items)} entries, at most {limit}")
    return list(items)


def _check_partitions(items: Any, limit: int, what: str) -> set[TopicPartition]:
    out = set()
    for item in _check_list(items, limit, what):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _invalid(f"{what}: each entry must be [topic, partition]")
        out.add((_check_topic(item[0]), _check_int(item[1], 0, (1 << 31) - 1, "partition")))
    return out


def _check_offsets(items: Any, limit: int, max_metadata_chars: int,
                   with_metadata: bool) -> list[tuple[str, int, int, str]]:
    width = 4 if with_metadata else 3
    out: dict[TopicPartition, tuple[str, int, int, str]] = {}
    for item in _check_list(items, limit, "offsets"):
        if not isinstance(item, (list, tuple)) or len(item) != width:
            fields = "[topic, partition, offset, metadata]" if with_metadata else "[topic, partition, offset]"
            raise _invalid(f"offsets: each entry must be {fields}")
        topic = _check_topic(item[0])
        partition = _check_int(item[1], 0, (1 << 31) - 1, "partition")
        offset = _check_int(item[2], 0, (1 << 63) - 1, "offset")
        metadata = item[3] if with_metadata else ""
        if not isinstance(metadata, str) or len(metadata) > max_metadata_chars:
            raise _invalid(f"offset metadata must be a string of at most {max_metadata_chars} characters")
        out[(topic, partition)] = (topic, partition, offset, metadata)
    return [out[tp] for tp in sorted(out)]


def _wire_partitions(parts: Iterable[TopicPartition]) -> list:
    return [[t, p] for t, p in sorted(parts)]


# ---------------------------------------------------------------------------------------
# The coordinator

@dataclass(slots=True)
class _Member:
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
class _Group:
    group_id: str
    epoch: int = 0
    assignor: str = ""
    members: dict[str, _Member] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    owners: dict[TopicPartition, str] = field(default_factory=dict)   # assigned or revoking
    offsets: dict[TopicPartition, tuple[int, str]] = field(default_factory=dict)
    hold_until_ms: int = 0   # no partitions given before this (takeover grace)

    def state(self) -> str:
        if not self.members:
            return "empty"
        for m in self.members.values():
            if m.fenced or m.revoking or m.assigned != self.target.get(m.member_id, frozenset()):
                return "reconciling"
        return "stable"


class GroupCoordinator:
    """The coordinator for the groups hashed to this broker. See the module docstring."""

    def __init__(self, config: GroupConfig | None = None, rng: random.Random | None = None, *,
                 now_ms: int = 0):
        if rng is None:
            raise ValueError("GroupCoordinator needs an injected random.Random (member ids)")
        self.config = config or GroupConfig()
        self._rng = rng
        self._groups: dict[str, _Group] = {}
        self._topic_partitions: dict[str, int] = {}
        self._takeover_until_ms = now_ms + self.config.grace_ms
        self._handlers = {
            GroupHeartbeat: self._heartbeat,
            GroupCommit: self._commit,
            GroupFetchOffsets: self._fetch_offsets,
            GroupResetOffsets: self._reset_offsets,
            GroupDescribe: lambda req, now_ms: (self.describe(req.group_id), []),
            GroupList: lambda req, now_ms: (self.list_groups(), []),
        }

    # -- inputs from the shell ----------------------------------------------------------

    def handle(self, request: Any, now_ms: int) -> tuple[Any, list]:
        """Answer one GROUP_* request (not FIND_COORDINATOR: the shell answers that).
        Returns (response, effects); carry out the effects before sending the response."""
        handler = self._handlers.get(type(request))
        if handler is None:
            raise TypeError(f"not a group coordinator request: {type(request).__name__}")
        try:
            return handler(request, now_ms)
        except MeshError as exc:
            return error_response(request, exc.code, exc.message), []

    def tick(self, now_ms: int) -> list:
        """Remove members whose session ended, fence those that did not revoke in time."""
        effects: list = []
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            for member_id in sorted(group.members):
                was_fenced = group.members[member_id].fenced
                outcome = self._expire(group, group.members[member_id], now_ms)
                if outcome == "removed":
                    effects.append(MemberRemoved(group_id, member_id,
                                                 "fenced member's session ended" if was_fenced
                                                 else "session timeout"))
                elif outcome == "fenced":
                    effects.append(MemberRemoved(group_id, member_id, "fenced: rebalance timeout"))
            self._maybe_forget(group)
        return effects

    def set_topic_partitions(self, topic: str, partitions: int) -> None:
        """The partition count of ``topic`` (0: the topic is gone). Groups subscribed to it
        get a new epoch and target when it changes."""
        _check_topic(topic)
        _check_int(partitions, 0, MAX_PARTITIONS_PER_TOPIC, "partitions")
        if self._topic_partitions.get(topic, 0) == partitions:
            return
        if partitions == 0:
            del self._topic_partitions[topic]
        else:
            if topic not in self._topic_partitions and len(self._topic_partitions) >= self.config.max_topics:
                raise MeshError(ErrorCode.INVALID_CONFIG, f"more than {self.config.max_topics} topics")
            self._topic_partitions[topic] = partitions
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            if any(topic in m.topics for m in group.members.values() if not m.fenced):
                self._bump(group)

    def load_offsets(self, group_id: str, offsets: Iterable[tuple[str, int, int, str]],
                     replace: bool = False) -> None:
        """Committed offsets from gossip (the shell picks the winners), when taking a group
        over. By default only partitions with no offset here are filled: while this node
        coordinates the group its own commits are the newest, and gossip may lag behind
        them. ``replace``: the shell knows these are newer (a later commit made through
        another broker, e.g. the previous coordinator's last ones arriving late)."""
        group = self._group(group_id, create=True)
        for topic, partition, offset, metadata in offsets:
            if replace:
                group.offsets[(topic, partition)] = (offset, metadata)
            else:
                group.offsets.setdefault((topic, partition), (offset, metadata))
        self._maybe_forget(group)

    def discard_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Forget committed offsets (the shell could not make a commit durable and restores
        what it had: it discards, then ``load_offsets(replace=True)`` the old values)."""
        group = self._groups.get(group_id)
        if group is None:
            return
        for tp in partitions:
            group.offsets.pop((tp[0], tp[1]), None)
        self._maybe_forget(group)

    def begin_takeover(self, now_ms: int) -> None:
        """Groups may have moved here (the live broker set changed): groups that get their
        first member in the next ``takeover_grace_ms`` are given no partitions before then."""
        self._takeover_until_ms = max(self._takeover_until_ms, now_ms + self.config.grace_ms)

    def drop_group(self, group_id: str) -> None:
        """Forget a group entirely (this broker stopped coordinating it). If it comes back,
        it starts empty and its members rejoin."""
        self._groups.pop(group_id, None)

    # -- queries --------------------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescribeResponse:
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescribeResponse(error=0, group_id=group_id, state="dead")
        members = []
        for member_id in sorted(group.members):
            m = group.members[member_id]
            members.append({
                "member_id": member_id, "member_epoch": m.epoch, "topics": sorted(m.topics),
                "assignor": m.assignor, "assigned": _wire_partitions(m.assigned),
                "revoking": _wire_partitions(m.revoking),
                "target": _wire_partitions(group.target.get(member_id, ())),
                "fenced": m.fenced, "session_timeout_ms": m.session_timeout_ms,
                "last_heartbeat_ms": m.last_heartbeat_ms,
            })
        offsets = [[t, p, off, meta] for (t, p), (off, meta) in sorted(group.offsets.items())]
        return GroupDescribeResponse(error=0, group_id=group_id, state=group.state(),
                                     group_epoch=group.epoch, assignor=group.assignor,
                                     members=members, offsets=offsets)

    def list_groups(self) -> GroupListResponse:
        return GroupListResponse(error=0, groups=[
            {"group_id": g.group_id, "state": g.state(), "members": len(g.members),
             "group_epoch": g.epoch}
            for g in (self._groups[gid] for gid in sorted(self._groups))])

    def has_group(self, group_id: str) -> bool:
        """True while the group has members or committed offsets here."""
        return group_id in self._groups

    def committed(self, group_id: str) -> dict[TopicPartition, tuple[int, str]]:
        group = self._groups.get(group_id)
        return dict(group.offsets) if group else {}

    def check_invariants(self) -> None:
        """Assert the ownership invariants (tests call it after every step)."""
        for group in self._groups.values():
            seen: dict[TopicPartition, str] = {}
            for member_id, m in group.members.items():
                assert not (m.assigned & m.revoking), (group.group_id, member_id)
                for tp in m.assigned | m.revoking:
                    assert tp not in seen, f"{tp} held by {seen[tp]} and {member_id}"
                    seen[tp] = member_id
                assert (m.revoke_since_ms is None) == (not m.revoking)
                assert not m.fenced or member_id not in group.target
            assert seen == group.owners, "owners map out of date"

    # -- heartbeats -----------------------------------------------------------------------

    def _heartbeat(self, req: GroupHeartbeat, now_ms: int) -> tuple[GroupHeartbeatResponse, list]:
        cfg = self.config
        group_id = _check_group_id(req.group_id)
        if req.member_epoch == LEAVE_EPOCH:
            return self._leave(group_id, req.member_id), []
        topics = frozenset(_check_topic(t) for t in
                           _check_list(req.topics, cfg.max_topics_per_member, "topics"))
        owned = _check_partitions(req.owned, cfg.max_partitions_per_request, "owned")
        assignor = req.assignor or cfg.default_assignor
        if assignor not in ASSIGNORS:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"unknown assignor {assignor!r}; known: {', '.join(sorted(ASSIGNORS))}")
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"session_timeout_ms must be in [{cfg.min_session_timeout_ms}, "
                            f"{cfg.max_session_timeout_ms}]")
        if not 0 < req.rebalance_timeout_ms <= cfg.max_rebalance_timeout_ms:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"rebalance_timeout_ms must be in [1, {cfg.max_rebalance_timeout_ms}]")
        if req.member_id == "":
            if req.member_epoch != JOIN_EPOCH or owned:
                raise _invalid("a joining member sends member epoch 0 and owns nothing")
            group = self._group(group_id, create=True)
            member = self._join(group, topics, assignor, req, now_ms)
        else:
            group = self._groups.get(group_id)
            member = group.members.get(req.member_id) if group else None
            if member is not None and self._expire(group, member, now_ms) == "removed":
                member = None
            if member is None:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER,
                                f"member {req.member_id!r:.80} is not in group {group_id!r}: rejoin")
            if member.fenced:
                raise MeshError(ErrorCode.FENCED_EPOCH, f"member {req.member_id} was fenced: rejoin")
            if req.member_epoch > member.epoch or (req.member_epoch == member.epoch
                                                    and not owned <= member.assigned | member.revoking):
                self._fence(group, member)
                raise MeshError(ErrorCode.FENCED_EPOCH,
                                f"member {req.member_id} sent epoch {req.member_epoch} or partitions "
                                f"it was never given (epoch {member.epoch}): rejoin")
            member.last_heartbeat_ms = now_ms
            if req.member_epoch == member.epoch:  # only a current request may change things
                member.session_timeout_ms = req.session_timeout_ms
                member.rebalance_timeout_ms = req.rebalance_timeout_ms
                if member.topics != topics or member.assignor != assignor:
                    member.topics, member.assignor = topics, assignor
                    self._bump(group)
                self._reconcile(group, member, owned, now_ms)
            else:  # a late or repeated request: its `owned` may be stale, believe nothing
                self._reconcile(group, member, None, now_ms)
        return GroupHeartbeatResponse(
            error=0, member_id=member.member_id, member_epoch=member.epoch,
            assignment=_wire_partitions(member.assigned),
            heartbeat_interval_ms=self._heartbeat_interval_ms(group), group_epoch=group.epoch), []

    def _heartbeat_interval_ms(self, group: _Group) -> int:
        cfg = self.config
        if group.state() == "stable":
            return cfg.heartbeat_interval_ms
        return min(cfg.heartbeat_interval_ms, cfg.reconcile_heartbeat_interval_ms)

    def _join(self, group: _Group, topics: frozenset[str], assignor: str, req: GroupHeartbeat,
              now_ms: int) -> _Member:
        if len(group.members) >= self.config.max_members_per_group:
            raise _invalid(f"group {group.group_id!r} is full ({len(group.members)} members)")
        member_id = f"{self._rng.getrandbits(64):016x}"
        while member_id in group.members:  # pragma: no cover - 64 random bits
            member_id = f"{self._rng.getrandbits(64):016x}"
        if not group.members and now_ms < self._takeover_until_ms:
            group.hold_until_ms = self._takeover_until_ms
        member = _Member(member_id, topics, assignor, req.session_timeout_ms,
                         req.rebalance_timeout_ms, last_heartbeat_ms=now_ms)
        group.members[member_id] = member
        self._bump(group)
        self._reconcile(group, member, set(), now_ms)
        return member

    def _leave(self, group_id: str, member_id: Any) -> GroupHeartbeatResponse:
        """A leaving id holds nothing and never will again, so its partitions are free now."""
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group and isinstance(member_id, str) else None
        if member is not None:
            self._remove(group, member)
            self._maybe_forget(group)
        return GroupHeartbeatResponse(error=0, member_id=member_id if isinstance(member_id, str) else "",
                                      member_epoch=LEAVE_EPOCH)

    def _reconcile(self, group: _Group, m: _Member, owned: set[TopicPartition] | None,
                   now_ms: int) -> None:
        if owned is not None:
            for tp in sorted(m.revoking - owned):
                m.revoking.discard(tp)
                del group.owners[tp]
        target = group.target.get(m.member_id, frozenset())
        drop = m.assigned - target
        if drop:
            m.assigned -= drop
            m.revoking |= drop
        if not m.revoking:
            m.revoke_since_ms = None
            if now_ms >= group.hold_until_ms:
                grant = [tp for tp in sorted(target - m.assigned) if tp not in group.owners]
                if grant:
                    m.assigned.update(grant)
                    for tp in grant:
                        group.owners[tp] = m.member_id
                    m.epoch += 1
        elif m.revoke_since_ms is None:
            m.revoke_since_ms = now_ms

    def _bump(self, group: _Group) -> None:
        """Membership or subscriptions changed: new group epoch, new target assignment."""
        group.epoch += 1
        active = {mid: m for mid, m in group.members.items() if not m.fenced}
        if not active:
            group.target = {}
            return
        votes = collections.Counter(m.assignor for m in active.values())
        group.assignor = min(votes, key=lambda name: (-votes[name], name))
        group.target = assign(group.assignor, {mid: m.topics for mid, m in active.items()},
                              self._topic_partitions,
                              {mid: group.target.get(mid, frozenset()) for mid in active})

    def _fence(self, group: _Group, m: _Member) -> None:
        """Out of the assignment now; its partitions stay held until its session ends."""
        if not m.fenced:
            m.fenced = True
            self._bump(group)

    def _remove(self, group: _Group, m: _Member) -> None:
        for tp in m.assigned | m.revoking:
            del group.owners[tp]
        del group.members[m.member_id]
        if not m.fenced:
            self._bump(group)

    def _expire(self, group: _Group, m: _Member, now_ms: int) -> str | None:
        """Apply the session and rebalance timeouts to one member: "removed", "fenced" or None."""
        if now_ms - m.last_heartbeat_ms > m.session_timeout_ms:
            self._remove(group, m)
            return "removed"
        if (not m.fenced and m.revoke_since_ms is not None
                and now_ms - m.revoke_since_ms > m.rebalance_timeout_ms):
            self._fence(group, m)
            return "fenced"
        return None

    # -- offsets --------------------------------------------------------------------------

    def _commit(self, req: GroupCommit, now_ms: int) -> tuple[GroupCommitResponse, list]:
        group_id = _check_group_id(req.group_id)
        offsets = _check_offsets(req.offsets, self.config.max_partitions_per_request,
                                 self.config.max_metadata_chars, with_metadata=True)
        group = self._groups.get(group_id)
        if req.member_id == "" and req.member_epoch == LEAVE_EPOCH:
            if group is not None and group.members:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER,
                                f"group {group_id!r} has {len(group.members)} members; "
                                "a simple consumer may commit only to a group without members")
        else:
            member = group.members.get(req.member_id) if group else None
            if member is None:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER, f"member {req.member_id!r:.80} is not in "
                                                          f"group {group_id!r}: rejoin")
            if member.fenced or req.member_epoch > member.epoch:
                raise MeshError(ErrorCode.FENCED_EPOCH, f"member {req.member_id} is fenced")
            if req.member_epoch < member.epoch:
                raise MeshError(ErrorCode.ILLEGAL_GENERATION,
                                f"stale member epoch {req.member_epoch} (current {member.epoch}): "
                                "heartbeat, then commit again")
            for topic, partition, _, _ in offsets:
                if group.owners.get((topic, partition)) != member.member_id:
                    raise MeshError(ErrorCode.ILLEGAL_GENERATION,
                                    f"member {req.member_id} does not hold {topic}/{partition}")
        return self._write_offsets(group_id, offsets)

    def _reset_offsets(self, req: GroupResetOffsets, now_ms: int) -> tuple[GroupResetOffsetsResponse, list]:
        group_id = _check_group_id(req.group_id)
        offsets = _check_offsets(req.offsets, self.config.max_partitions_per_request,
                                 self.config.max_metadata_chars, with_metadata=False)
        group = self._groups.get(group_id)
        if group is not None and group.members:
            raise _invalid(f"group {group_id!r} has {len(group.members)} members: offsets can be "
                           "reset only when it has none (stop its consumers first)")
        response, effects = self._write_offsets(group_id, offsets)
        return GroupResetOffsetsResponse(error=response.error, message=response.message), effects

    def _write_offsets(self, group_id: str, offsets: list) -> tuple[GroupCommitResponse, list]:
        group = self._group(group_id, create=True)
        new = sum(1 for t, p, _, _ in offsets if (t, p) not in group.offsets)
        if len(group.offsets) + new > self.config.max_offsets_per_group:
            raise _invalid(f"group {group_id!r} would hold more than "
                           f"{self.config.max_offsets_per_group} committed offsets")
        for topic, partition, offset, metadata in offsets:
            group.offsets[(topic, partition)] = (offset, metadata)
        return GroupCommitResponse(error=0), [PersistOffsets(group_id, tuple(offsets))]

    def _fetch_offsets(self, req: GroupFetchOffsets, now_ms: int) -> tuple[GroupFetchOffsetsResponse, list]:
        group_id = _check_group_id(req.group_id)
        group = self._groups.get(group_id)
        stored = group.offsets if group else {}
        if req.partitions is None:
            wanted = sorted(stored)
        else:
            wanted = sorted(_check_partitions(req.partitions, self.config.max_partitions_per_request,
                                              "partitions"))
        out = []
        for tp in wanted:
            offset, metadata = stored.get(tp, (-1, ""))
            out.append([tp[0], tp[1], offset, metadata])
        return GroupFetchOffsetsResponse(error=0, offsets=out), []

    # -- group table ----------------------------------------------------------------------

    def _group(self, group_id: str, create: bool) -> _Group:
        group = self._groups.get(group_id)
        if group is None and create:
            if len(self._groups) >= self.config.max_groups:
                raise _invalid(f"this coordinator already holds {self.config.max_groups} groups")
            group = self._groups[group_id] = _Group(group_id)
        return group

    def _maybe_forget(self, group: _Group) -> None:
        if not group.members and not group.offsets:
            self._groups.pop(group.group_id, None)


# ---------------------------------------------------------------------------------------
# The member side lives in mesh.groups.member; these names stay importable from here.

def __getattr__(name: str):
    if name in ("GroupMemberState", "MemberChanges"):
        from mesh.groups import member as group_member
        return getattr(group_member, name)
    raise AttributeError(f"module 'mesh.groups.coordinator' has no attribute {name!r}")
