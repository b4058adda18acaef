"""Client protocol messages (``mesh/1``). Peer-protocol messages live beside their cores
(``mesh.gossip.core``, ``mesh.raft.manager``, ``mesh.groups.coordinator``) and share the same registry.

Every response carries ``error`` (an ``ErrorCode``) and ``message`` (human-readable); a
``leader`` hint (an address) comes with NOT_LEADER.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from mesh.wire.codec import message

__all__ = [
    "ErrorResponse", "ProduceRequest", "ProduceResponse", "FetchRequest", "FetchResponse",
    "MetadataRequest", "MetadataResponse", "CreateTopicRequest", "CreateTopicResponse",
    "DeleteTopicRequest", "DeleteTopicResponse", "ListOffsetsRequest", "ListOffsetsResponse",
    "EARLIEST", "LATEST", "Acks", "ACKS_WIRE", "FetchPart", "OffsetsPart",
    "AddUserRequest", "AddUserResponse", "RemoveUserRequest", "RemoveUserResponse",
    "ListUsersRequest", "ListUsersResponse", "AddAclRequest", "AddAclResponse",
    "RemoveAclRequest", "RemoveAclResponse", "ListAclsRequest", "ListAclsResponse",
    "KafkaSecurityRequest", "KafkaSecurityResponse",
    "AlterTopicRequest", "AlterTopicResponse", "BrokerStateRequest", "BrokerStateResponse",
    "ReassignRequest", "ReassignResponse", "ListMovesRequest", "ListMovesResponse",
    "BROKER_ACTIVE", "BROKER_DRAINING",
]

EARLIEST = -2
LATEST = -1


class Acks(enum.IntEnum):
    """A produce request's ``acks``, as Kafka numbers them (the wire carries the int):
    NONE (0) is never answered, LEADER (1) is answered once the leader's turn synced it,
    ALL (-1) once a majority of the replicas hold it (the commit offset passed it)."""
    NONE = 0
    LEADER = 1
    ALL = -1

    @classmethod
    def parse(cls, value: object) -> "Acks":
        """0, 1, -1, "0", "1", "-1" or "all"; ValueError for anything else."""
        got = _ACKS_NAMED.get(value) if type(value) is str else (
            cls(value) if type(value) is int and value in ACKS_WIRE else None)
        if got is None:
            raise ValueError(f"acks must be 0, 1 or 'all', not {value!r}")
        return got


ACKS_WIRE = frozenset(int(a) for a in Acks)   # what a ProduceRequest's acks may be
_tuple_new = tuple.__new__
_ACKS_NAMED = {"0": Acks.NONE, "1": Acks.LEADER, "-1": Acks.ALL, "all": Acks.ALL}


class FetchPart(NamedTuple):
    """One partition of a ``FetchResponse`` (on the wire, the 7-element array it packs as):
    its ``nbytes`` of batches follow the previous parts' in the payload frame; ``leader``,
    an address, comes with NOT_LEADER."""
    topic: str
    partition: int
    error: int
    high_watermark: int
    log_start: int
    nbytes: int
    leader: str | None

    @staticmethod
    def from_wire(v: list) -> "FetchPart":
        if v.__class__ is not list or len(v) != 7:
            raise ValueError(f"a FetchPart is an array of 7 elements, not {v!r:.40}")
        return _tuple_new(FetchPart, v)   # (without the NamedTuple's Python __new__: on every fetch)


class OffsetsPart(NamedTuple):
    """One partition of a ``ListOffsetsResponse``. On the wire a 5-element array, or 6 with
    ``timestamp`` when the part was asked by timestamp (EARLIEST/LATEST parts keep five, as
    older clients read them)."""
    topic: str
    partition: int
    error: int
    offset: int
    leader: str | None
    timestamp: int | None = None

    def to_wire(self) -> tuple:
        return self if self.timestamp is not None else self[:5]

    @staticmethod
    def from_wire(v: list) -> "OffsetsPart":
        if v.__class__ is list and len(v) == 6:
            return _tuple_new(OffsetsPart, v)
        if v.__class__ is not list or len(v) != 5:
            raise ValueError(f"an OffsetsPart is an array of 5 or 6 elements, not {v!r:.40}")
        return _tuple_new(OffsetsPart, (*v, None))


@message("ERROR")
@dataclass(frozen=True, slots=True)
class ErrorResponse:
    error: int
    message: str
    leader: str | None = None


@message("PRODUCE")
@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """One record batch for one partition travels in the payload frame."""
    topic: str
    partition: int
    acks: int            # an Acks: 0, 1, or -1 (all)
    timeout_ms: int = 30_000


@message("PRODUCE_R")
@dataclass(frozen=True, slots=True)
class ProduceResponse:
    error: int
    message: str = ""
    base_offset: int = -1
    log_start: int = 0
    leader: str | None = None


@message("FETCH")
@dataclass(frozen=True, slots=True)
class FetchRequest:
    """parts: [[topic, partition, offset, max_bytes], ...]"""
    parts: list
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 << 20


@message("FETCH_R", rows={"parts": FetchPart})
@dataclass(frozen=True, slots=True)
class FetchResponse:
    """parts: [FetchPart, ...] (each a [topic, partition, error, high_watermark, log_start,
    nbytes, leader] array on the wire); the payload frame holds every part's batches back to
    back, in this order."""
    parts: list
    error: int = 0
    message: str = ""


@message("METADATA")
@dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: list | None = None


@message("METADATA_R")
@dataclass(frozen=True, slots=True)
class MetadataResponse:
    """brokers: [{id, address, status, ...}]; topics: [{name, config, partitions: [{partition,
    leader, leader_address, epoch, replicas, isr, log_start, log_end, high_watermark}]}]"""
    error: int
    brokers: list = field(default_factory=list)
    topics: list = field(default_factory=list)
    node_id: str = ""
    message: str = ""


@message("CREATE_TOPIC")
@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    config: dict = field(default_factory=dict)


@message("CREATE_TOPIC_R")
@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    error: int
    message: str = ""


@message("DELETE_TOPIC")
@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    name: str


@message("DELETE_TOPIC_R")
@dataclass(frozen=True, slots=True)
class DeleteTopicResponse:
    error: int
    message: str = ""


@message("LIST_OFFSETS")
@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    """parts: [[topic, partition, spec], ...]; spec EARLIEST (log start), LATEST (high
    watermark) or a timestamp in ms >= 0: the first offset whose record's timestamp is >= it
    (Kafka's ListOffsets by timestamp, ``offsets_for_times``)."""
    parts: list


@message("LIST_OFFSETS_R", rows={"parts": OffsetsPart})
@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    """parts: [OffsetsPart, ...]; a part asked by timestamp carries the record's timestamp
    (offset and timestamp -1: no record reaches it below the high watermark)."""
    parts: list
    error: int = 0
    message: str = ""


# -- users and ACLs (``mesh.node.requests.security_handlers``; rules in ``mesh.security.acl``) ---

@message("USER_ADD")
@dataclass(frozen=True, slots=True)
class AddUserRequest:
    """A principal ``name`` authenticated by the CURVE key ``public_key`` (40 chars Z85);
    ``scram``: its Kafka SCRAM credentials (``mesh.security.scram.credentials_to_register``),
    which replace the user's former ones when the user exists with this key."""
    name: str
    public_key: str
    scram: dict | None = None


@message("USER_ADD_R")
@dataclass(frozen=True, slots=True)
class AddUserResponse:
    error: int
    message: str = ""


@message("USER_REMOVE")
@dataclass(frozen=True, slots=True)
class RemoveUserRequest:
    name: str


@message("USER_REMOVE_R")
@dataclass(frozen=True, slots=True)
class RemoveUserResponse:
    error: int
    message: str = ""


@message("USER_LIST")
@dataclass(frozen=True, slots=True)
class ListUsersRequest:
    pass


@message("USER_LIST_R")
@dataclass(frozen=True, slots=True)
class ListUsersResponse:
    """users: [{name, public_key}], sorted by name."""
    error: int
    message: str = ""
    users: list = field(default_factory=list)


@message("ACL_ADD")
@dataclass(frozen=True, slots=True)
class AddAclRequest:
    """One ACL row (``mesh.security.acl.AclRule``); its id follows from its content."""
    principal: str
    permission: str           # allow | deny
    operations: list          # [read | write | create | delete | describe | alter | all, ...]
    resource: str             # topic | group | cluster
    name: str
    pattern: str = "literal"  # literal | prefixed


@message("ACL_ADD_R")
@dataclass(frozen=True, slots=True)
class AddAclResponse:
    error: int
    message: str = ""
    id: str = ""


@message("ACL_REMOVE")
@dataclass(frozen=True, slots=True)
class RemoveAclRequest:
    """Remove the row ``id``, or every row whose fields equal all the filters given (None:
    any; at least one filter)."""
    id: str | None = None
    principal: str | None = None
    permission: str | None = None
    operations: list | None = None
    resource: str | None = None
    name: str | None = None
    pattern: str | None = None


@message("ACL_REMOVE_R")
@dataclass(frozen=True, slots=True)
class RemoveAclResponse:
    """removed: the rows removed, as in ListAclsResponse."""
    error: int
    message: str = ""
    removed: list = field(default_factory=list)


@message("ACL_LIST")
@dataclass(frozen=True, slots=True)
class ListAclsRequest:
    """Rows whose fields equal every filter given (None: any)."""
    principal: str | None = None
    resource: str | None = None
    name: str | None = None


@message("ACL_LIST_R")
@dataclass(frozen=True, slots=True)
class ListAclsResponse:
    """acls: [{id, principal, permission, operations, resource, name, pattern}], by id."""
    error: int
    message: str = ""
    acls: list = field(default_factory=list)


@message("KAFKA_SECURITY")
@dataclass(frozen=True, slots=True)
class KafkaSecurityRequest:
    """What the Kafka listener beside a node needs to authenticate and authorize Kafka
    clients (brokers only: the cluster keypair). ``since``: the ``version`` last received
    (unchanged: the answer carries no users and no ACLs)."""
    since: str = ""


@message("KAFKA_SECURITY_R")
@dataclass(frozen=True, slots=True)
class KafkaSecurityResponse:
    """users: {name: scram map} of the users with Kafka credentials; acls: the ``acl/<id>``
    registers (key -> value); superusers: this node's; both None when ``version`` is
    ``since``."""
    error: int
    message: str = ""
    version: str = ""
    users: dict | None = None
    acls: dict | None = None
    superusers: list = field(default_factory=list)


# -- an elastic cluster (``mesh.node.requests.elastic_handlers``; decisions in ``mesh.cluster.balance``) ---

BROKER_ACTIVE = "active"
BROKER_DRAINING = "draining"


@message("ALTER_TOPIC")
@dataclass(frozen=True, slots=True)
class AlterTopicRequest:
    """Grow a topic: ``partitions`` (0 = unchanged; may only grow, as in Kafka) and
    ``replication_factor`` (0 = unchanged; the partitions' leaders then add or remove
    replicas one at a time); ``config``: topic configs to set (the others unchanged)."""
    name: str
    partitions: int = 0
    replication_factor: int = 0
    config: dict = field(default_factory=dict)


@message("ALTER_TOPIC_R")
@dataclass(frozen=True, slots=True)
class AlterTopicResponse:
    error: int
    message: str = ""


@message("BROKER_STATE")
@dataclass(frozen=True, slots=True)
class BrokerStateRequest:
    """``state``: BROKER_DRAINING (decommission: every replica moves off ``node_id``,
    leaderships first) or BROKER_ACTIVE (recommission)."""
    node_id: str
    state: str


@message("BROKER_STATE_R")
@dataclass(frozen=True, slots=True)
class BrokerStateResponse:
    error: int
    message: str = ""


@message("REASSIGN")
@dataclass(frozen=True, slots=True)
class ReassignRequest:
    """Move one partition to ``replicas`` (preferred leader first); ``[]`` cancels a
    reassignment that has not finished."""
    topic: str
    partition: int
    replicas: list


@message("REASSIGN_R")
@dataclass(frozen=True, slots=True)
class ReassignResponse:
    error: int
    message: str = ""


@message("MOVES")
@dataclass(frozen=True, slots=True)
class ListMovesRequest:
    """The replica moves that partitions led by the receiving broker have in progress."""
    topics: list | None = None


@message("MOVES_R")
@dataclass(frozen=True, slots=True)
class ListMovesResponse:
    """moves: [{"topic", "partition", "leader", "voters", "learners", "target",
    "adding", "bytes_copied", "bytes_remaining", "reason"}, ...]"""
    error: int
    moves: list = field(default_factory=list)
    message: str = ""
