"""Typed rows of the gossip state, and what each one costs in a message.

Every record the gossip core keeps or sends is a ``NamedTuple`` with named fields instead
of a positional tuple. A ``NamedTuple`` *is* a tuple: msgpack encodes it as the same array
the fields would make, and it compares equal to a plain tuple of the same values, so the
wire format is exactly the positional one documented in ``mesh.gossip.messages``.

=============  ==============================================  =========================
row            fields                                          where
=============  ==============================================  =========================
``Row``        node_id, generation, heartbeat, max_version,    digest (on the wire)
               gc_version, address, left
``Delta``      origin, generation, from_version,               deltas (on the wire)
               upto_version, gc_version, reset, entries
``Entry``      version, value, deleted, stored_ms, size_bytes  one key of a namespace
``Register``   clock, writer, value, deleted, stored_ms,       one cluster register
               size_bytes, bucket, hash
``Grave``      generation, heartbeat, removed_ms               a collected origin
``Verdict``    status, since_ms                                a non-ALIVE origin
=============  ==============================================  =========================

A delta's ``entries`` and a message's cluster entries stay *flat* lists
(``[key, version, value, deleted, ...]``, ``[key, clock, writer, value, deleted, ...]``):
that is their wire layout, and it is cheap to validate column by column.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from mesh.wire.types import ALIVE, DEAD, LEFT, SUSPECT

__all__ = [
    "ALIVE", "SUSPECT", "DEAD", "LEFT",
    "Row", "Delta", "Entry", "Register", "Grave", "Verdict",
    "ROW_FIELDS", "DELTA_FIELDS", "ENTRY_FIELDS", "REGISTER_FIELDS", "BUCKETS",
    "DELTA_OVERHEAD", "ENTRY_OVERHEAD", "MAX_KEY_CHARS", "MAX_NAME_CHARS", "MAX_COUNTER", "MAX_GENERATION", "MAX_GENERATION_JUMP",
    "MAX_LIFE",
    "Budget", "size_of", "check_key", "entry_size", "register_size",
]

# Member states (``mesh.wire.types``: metadata answers carry them too). "unknown" (just
# learned) and "removed" (collected into the graveyard) appear only in membership events.


class Row(NamedTuple):
    """One origin's line of the digest; on the wire an 8-element array in this order."""
    node_id: str
    generation: int
    heartbeat: int
    max_version: int        # the origin's newest version this node holds
    gc_version: int         # the highest version whose tombstone was collected
    address: str
    left: bool              # graceful leave: final for this generation
    life: int = 0           # random per life of the origin (0: unknown): tells apart two lives of
                            # one generation, as a rolled-back store restarts with (R2)


class Delta(NamedTuple):
    """Entries of one origin above ``from_version``; on the wire a 7-element array."""
    origin: str
    generation: int
    from_version: int
    upto_version: int       # how far the delta goes (it may be truncated)
    gc_version: int
    reset: bool             # replace the receiver's copy (it is behind the gc horizon)
    entries: list           # flat: [key, version, value, deleted, ...], versions ascending


class Entry(NamedTuple):
    """One key of a namespace, as this node stores it."""
    version: int
    value: Any
    deleted: bool
    stored_ms: int          # when this node stored it (tombstone GC counts from here)
    size_bytes: int         # its cost in a delta


class Register(NamedTuple):
    """One cluster-wide last-writer-wins register, as this node stores it."""
    clock: int              # the stamp is (clock, writer)
    writer: str
    value: Any
    deleted: bool
    stored_ms: int
    size_bytes: int
    bucket: int             # which of the BUCKETS hashes it counts in
    hash: int               # its contribution to that bucket's hash


class Grave(NamedTuple):
    """A DEAD or LEFT origin collected from the table (R5)."""
    generation: int
    heartbeat: int
    removed_ms: int


class Verdict(NamedTuple):
    """The state of an origin that is not ALIVE, and since when."""
    status: str
    since_ms: int


ROW_FIELDS = len(Row._fields)
DELTA_FIELDS = len(Delta._fields)
ENTRY_FIELDS = 4            # per entry of a delta: key, version, value, deleted
REGISTER_FIELDS = 5         # per cluster entry: key, clock, writer, value, deleted
BUCKETS = 16                # the cluster store is compared as this many bucket hashes

# ---------------------------------------------------------------- sizes ----------------

DELTA_OVERHEAD = 40         # bytes: a delta's header, roughly
ENTRY_OVERHEAD = 12
MAX_KEY_CHARS = 1024
MAX_NAME_CHARS = 255        # a node id, an address, a register's writer
MAX_COUNTER = 2 ** 53 - 1   # heartbeats, versions, stamps: exact in every msgpack reader (R8)
MAX_GENERATION = 2 ** 48    # a generation this high is forged: refused in rows, deltas, snapshots (R2)
MAX_GENERATION_JUMP = 2 ** 20   # a row this far ahead of the generation known for its node is forged
MAX_LIFE = 2 ** 32         # a life nonce is drawn below this (0 means unknown)
MAX_HEARTBEAT = 2 ** 48     # no life beats this often (5 a second: 1.8 million years): forged, refused in rows
_MAX_DEPTH = 32


class Budget:
    """Bytes still free in one outgoing message, shared by its deltas and cluster entries."""

    __slots__ = ("left_bytes",)

    def __init__(self, left_bytes: int) -> None:
        self.left_bytes = left_bytes


def size_of(v: Any, depth: int = 0) -> int:
    """A cheap upper-ish estimate of msgpack's size for ``v``; TypeError if not msgpack data."""
    if v is None or v is True or v is False:
        return 1
    t = type(v)
    if t is int:
        return 1 if -32 <= v < 128 else 9
    if t is str:
        return (len(v) if v.isascii() else len(v.encode())) + 5
    if t is float:
        return 9
    if t is bytes or t is bytearray:
        return len(v) + 5
    if depth >= _MAX_DEPTH:
        raise TypeError("value nested too deeply")
    if t is list or t is tuple:
        return 5 + sum(size_of(x, depth + 1) for x in v)
    if t is dict:
        return 5 + sum(size_of(k, depth + 1) + size_of(x, depth + 1) for k, x in v.items())
    raise TypeError(f"gossip values must be msgpack data, not {t.__name__}")


def entry_size(key: str, value: Any, limit_bytes: int | None = None) -> int:
    """What one entry (key and value) costs in a message; ValueError above ``limit_bytes``."""
    size = ENTRY_OVERHEAD + size_of(key) + size_of(value)
    if limit_bytes is not None and size > limit_bytes:
        raise ValueError(f"gossip entry {key!r} is {size} bytes; "
                         f"at most {limit_bytes} fit in a message")
    return size


def register_size(key: str, value: Any, writer: str) -> int:
    """What one cluster register, as received or restored, costs in a message."""
    return ENTRY_OVERHEAD + size_of(key) + size_of(value) + size_of(writer)


def check_key(key: Any) -> None:
    if type(key) is not str or not key or len(key) > MAX_KEY_CHARS:
        raise ValueError(f"gossip keys are non-empty strings of at most {MAX_KEY_CHARS} characters")
