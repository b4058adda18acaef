"""One error enum for the wire, and the exception that carries it.

Every response on every protocol carries an ``ErrorCode``. Whether a client may retry is a
property of the code (``retriable(code)``), not of the call site, so the client library,
the CLI and the tests all agree on it.
"""
from __future__ import annotations

import enum

__all__ = ["ErrorCode", "MeshError", "retriable"]


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN = 1
    INVALID_REQUEST = 2
    UNSUPPORTED_VERSION = 3
    UNKNOWN_TOPIC = 4
    UNKNOWN_PARTITION = 5
    TOPIC_EXISTS = 6
    OFFSET_OUT_OF_RANGE = 7
    MESSAGE_TOO_LARGE = 8
    CORRUPT_MESSAGE = 9
    NOT_LEADER = 10
    LEADER_NOT_AVAILABLE = 11
    NOT_ENOUGH_REPLICAS = 12
    TIMEOUT = 13
    FENCED_EPOCH = 14
    UNAUTHORIZED = 15
    COORDINATOR_MOVED = 16
    COORDINATOR_NOT_AVAILABLE = 17
    REBALANCE_IN_PROGRESS = 18
    UNKNOWN_MEMBER = 19
    ILLEGAL_GENERATION = 20
    OUT_OF_ORDER_SEQUENCE = 21
    DUPLICATE_SEQUENCE = 22
    STORAGE_ERROR = 23
    BROKER_UNAVAILABLE = 24
    INVALID_CONFIG = 25
    THROTTLED = 26   # over a byte-rate quota: not done, send again later
    GROUP_NOT_EMPTY = 27   # a group with members cannot be deleted (Kafka's NON_EMPTY_GROUP)
    UNKNOWN_GROUP = 28     # no such group: no members, no committed offsets (GROUP_ID_NOT_FOUND)
    INVALID_RECORD = 29    # a batch whose columns are not records (Kafka's INVALID_RECORD): not stored

    @classmethod
    def _missing_(cls, value):
        """A code this version does not know (a newer broker's) is UNKNOWN, not a ValueError
        that would stop a producer's I/O thread: codes are only ever added."""
        return cls.UNKNOWN if isinstance(value, int) else None


_RETRIABLE = frozenset({
    ErrorCode.UNKNOWN_TOPIC,  # may be a topic whose creation has not gossiped here yet
    ErrorCode.NOT_LEADER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.TIMEOUT,
    ErrorCode.COORDINATOR_MOVED,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.CORRUPT_MESSAGE,  # corrupted in flight: send again
    ErrorCode.STORAGE_ERROR,  # e.g. a full disk: may clear
    ErrorCode.BROKER_UNAVAILABLE,
    ErrorCode.OUT_OF_ORDER_SEQUENCE,  # an earlier batch of the producer is still in flight
    ErrorCode.THROTTLED,
})


def retriable(code: int) -> bool:
    return ErrorCode(code) in _RETRIABLE


class MeshError(Exception):
    """An error with a wire code. ``retriable`` follows from the code.

    ``maybe_written`` (produce errors): True when the records may have been written all
    the same ("outcome unknown": a request timed out or its connection dropped after it
    was sent, or the broker failed it after appending, e.g. leadership moved before it
    committed); False when they certainly were not ("not written": refused before any
    append, such as MESSAGE_TOO_LARGE, UNKNOWN_TOPIC or NOT_LEADER, or never sent)."""

    def __init__(self, code: ErrorCode | int, message: str = "", *, leader: str | None = None,
                 maybe_written: bool = False):
        self.code = ErrorCode(code)
        self.message = message or self.code.name
        self.leader = leader
        self.maybe_written = maybe_written
        super().__init__(f"{self.code.name}: {self.message}")

    @property
    def retriable(self) -> bool:
        return retriable(self.code)
