"""Client protocol messages (``mesh/1``). Peer-protocol messages live beside their cores
(``mesh.gossip.core``, ``mesh.raft.manager``, ``mesh.groups.coordinator``) and share the same registry.

Every response carries ``error`` (an ``ErrorCode``) and ``message`` (human-readable); a
``leader`` hint (an address) comes with NOT_LEADER.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mesh.wire.codec import message

__all__ = [
    "ErrorResponse", "ProduceRequest", "ProduceResponse", "FetchRequest", "FetchResponse",
    "MetadataRequest", "MetadataResponse", "CreateTopicRequest", "CreateTopicResponse",
    "DeleteTopicRequest", "DeleteTopicResponse", "ListOffsetsRequest", "ListOffsetsResponse",
    "EARLIEST", "LATEST",
]

EARLIEST = -2
LATEST = -1


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
    acks: int            # 0, 1, or -1 (all)
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


@message("FETCH_R")
@dataclass(frozen=True, slots=True)
class FetchResponse:
    """parts: [[topic, partition, error, high_watermark, log_start, nbytes, leader], ...];
    the payload frame holds every part's batches back to back, in this order."""
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
    """parts: [[topic, partition, EARLIEST | LATEST], ...]"""
    parts: list


@message("LIST_OFFSETS_R")
@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    """parts: [[topic, partition, error, offset, leader], ...]"""
    parts: list
    error: int = 0
    message: str = ""
