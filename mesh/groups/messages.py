"""Consumer groups: the wire messages of the heartbeat protocol and the checks of their input.

Every GROUP_* request and response is a frozen, slotted dataclass registered with the codec
(``mesh.wire.codec.message``). Partitions travel as ``[topic, partition]`` pairs, offsets as
``[topic, partition, offset, metadata]``. Every response has ``error`` and ``message``;
``coordinator`` is a hint (node id) that comes with COORDINATOR_MOVED.

The coordinator (``mesh.groups.coordinator``), the member (``mesh.groups.member``), the
node's group host and the client all import them from here, and check what a peer sent
with the ``check_*`` functions below (each raises ``MeshError(INVALID_REQUEST)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from mesh.wire.codec import message
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.types import TopicPartition

__all__ = [
    "GroupHeartbeat", "GroupHeartbeatResponse", "GroupCommit", "GroupCommitResponse",
    "GroupFetchOffsets", "GroupFetchOffsetsResponse", "GroupResetOffsets",
    "GroupResetOffsetsResponse", "GroupDelete", "GroupDeleteResponse", "GroupDescribe", "GroupDescribeResponse", "GroupList",
    "GroupListResponse", "GroupFindCoordinator", "GroupFindCoordinatorResponse",
    "GROUP_REQUESTS", "JOIN_EPOCH", "LEAVE_EPOCH", "MAX_GROUP_ID_CHARS", "MAX_TOPIC_CHARS",
    "MAX_PARTITIONS_PER_TOPIC", "error_response", "invalid", "check_group_id", "check_topic",
    "check_int", "check_list", "check_partitions", "check_offsets", "wire_partitions",
    "GroupReplicate", "GroupReplicateAck", "GroupOffsetsPull", "GroupOffsetsRows", "GROUP_PEER_MESSAGES",
]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
MAX_GROUP_ID_CHARS = 255
MAX_TOPIC_CHARS = 249
MAX_PARTITIONS_PER_TOPIC = 10_000

# ---------------------------------------------------------------------------------------
# Wire messages

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


@message("GROUP_DELETE")
@dataclass(frozen=True, slots=True)
class GroupDelete:
    """Delete a group with no members: its committed offsets go (Kafka's DeleteGroups)."""
    group_id: str


@message("GROUP_DELETE_R")
@dataclass(frozen=True, slots=True)
class GroupDeleteResponse:
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
    """Answered by the shell from its gossip view with ``mesh.cluster.ownership.coordinator_for``."""
    group_id: str


@message("GROUP_FIND_COORDINATOR_R")
@dataclass(frozen=True, slots=True)
class GroupFindCoordinatorResponse:
    error: int
    message: str = ""
    node_id: str = ""
    address: str = ""


# ---------------------------------------------------------------------------------------
# Peer messages (broker to broker, one-way; ``mesh.groups.replication`` has the rules):
# rows travel as ``[group, topic, partition, offset, metadata, stamp]`` (offset DELETED: a tombstone)

@message("GROUP_REPLICATE")
@dataclass(frozen=True, slots=True)
class GroupReplicate:
    """A coordinator asks a replica to make ``rows`` durable, then answer ``seq``."""
    seq: int
    rows: list


@message("GROUP_REPLICATE_R")
@dataclass(frozen=True, slots=True)
class GroupReplicateAck:
    """The rows of ``seq`` are synced on the sender (or something newer is)."""
    seq: int


@message("GROUP_OFFSETS_PULL")
@dataclass(frozen=True, slots=True)
class GroupOffsetsPull:
    """A new coordinator asks a replica for what it holds of ``groups``."""
    groups: list


@message("GROUP_OFFSETS_ROWS")
@dataclass(frozen=True, slots=True)
class GroupOffsetsRows:
    """The answer to a pull: the sender's newest rows of the groups asked (tombstones too);
    ``groups``: the groups this answer completes (in its last message)."""
    rows: list
    groups: list = field(default_factory=list)


GROUP_PEER_MESSAGES: tuple[type, ...] = (GroupReplicate, GroupReplicateAck, GroupOffsetsPull, GroupOffsetsRows)


_RESPONSE_OF: dict[type, type] = {
    GroupHeartbeat: GroupHeartbeatResponse,
    GroupCommit: GroupCommitResponse,
    GroupFetchOffsets: GroupFetchOffsetsResponse,
    GroupResetOffsets: GroupResetOffsetsResponse,
    GroupDelete: GroupDeleteResponse,
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


GROUP_REQUESTS: tuple[type, ...] = tuple(_RESPONSE_OF)   # every GROUP_* request a broker answers


# ---------------------------------------------------------------------------------------
# Checks of wire input

def invalid(text: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_REQUEST, text)


def check_group_id(group_id: Any) -> str:
    if not isinstance(group_id, str) or not 0 < len(group_id) <= MAX_GROUP_ID_CHARS:
        raise invalid(f"group id must be 1-{MAX_GROUP_ID_CHARS} characters")
    return group_id


def check_topic(topic: Any) -> str:
    if not isinstance(topic, str) or not 0 < len(topic) <= MAX_TOPIC_CHARS:
        raise invalid(f"topic must be a string of 1-{MAX_TOPIC_CHARS} characters, got {topic!r:.60}")
    return topic


def check_int(value: Any, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise invalid(f"{what} must be an integer in [{low}, {high}], got {value!r:.40}")
    return value


def check_list(items: Any, limit: int, what: str) -> list:
    if not isinstance(items, (list, tuple)):
        raise invalid(f"{what} must be a list")
    if len(items) > limit:
        raise invalid(f"{what}: {len(items)} entries, at most {limit}")
    return list(items)


def check_partitions(items: Any, limit: int, what: str) -> set[TopicPartition]:
    out = set()
    for item in check_list(items, limit, what):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise invalid(f"{what}: each entry must be [topic, partition]")
        out.add((check_topic(item[0]), check_int(item[1], 0, (1 << 31) - 1, "partition")))
    return out


def check_offsets(items: Any, limit: int, max_metadata_chars: int,
                  with_metadata: bool) -> list[tuple[str, int, int, str]]:
    width = 4 if with_metadata else 3
    out: dict[TopicPartition, tuple[str, int, int, str]] = {}
    for item in check_list(items, limit, "offsets"):
        if not isinstance(item, (list, tuple)) or len(item) != width:
            fields = "[topic, partition, offset, metadata]" if with_metadata else "[topic, partition, offset]"
            raise invalid(f"offsets: each entry must be {fields}")
        topic = check_topic(item[0])
        partition = check_int(item[1], 0, (1 << 31) - 1, "partition")
        offset = check_int(item[2], 0, (1 << 63) - 1, "offset")
        metadata = item[3] if with_metadata else ""
        if not isinstance(metadata, str) or len(metadata) > max_metadata_chars:
            raise invalid(f"offset metadata must be a string of at most {max_metadata_chars} characters")
        out[(topic, partition)] = (topic, partition, offset, metadata)
    return [out[tp] for tp in sorted(out)]


def wire_partitions(parts: Iterable[TopicPartition]) -> list:
    return [[t, p] for t, p in sorted(parts)]
