"""The shape of every gossip value, checked before gossip applies or persists it (pure).

``validate_entry(key, value, now_ms)`` returns None for a key and value a broker could have
written (``mesh.cluster.keys`` lists them all), else a short reason. The gossip core calls
it for every entry of a message and of a restored snapshot (``Gossip(validate_entry=...)``)
and drops, counts and never persists what fails: in a gossip mesh one bad value would
reach every broker and survive their restarts (DESIGN section 10). Tombstones carry no
value and are not given to it (``mesh.gossip.checks``); a live value None is invalid.
``REGISTER_PREFIXES`` are the cluster register keys (every other key is a node's).

Rules (each a bound, so nothing checked here can grow without limit):
- unknown keys are invalid; a key that names a topic, group, user or chunk must agree
  with its value (``topic/<name>`` holds ``"name": <name>``, ...);
- ints are ints (not bools), non-negative and below 2**53 unless said otherwise (offsets
  in ``off/`` below 2**63, as the group protocol accepts); partition numbers below
  ``MAX_PARTITIONS`` and within the key's chunk; uuids are 16 lowercase hex characters;
- replica lists: 1..``MAX_REPLICATION_FACTOR`` distinct node ids of 1..255 characters;
- wall-clock stamps (``off/`` commit times) are no later than ``now_ms`` + 60 s;
- topic configs are exactly what ``normalize_config`` makes of them (its ranges apply).
"""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Callable

from mesh.cluster import keys
from mesh.cluster.catalog import MAX_REPLICATION_FACTOR
from mesh.wire.topic_config import MAX_PARTITIONS, normalize_config

__all__ = ["validate_entry", "REGISTER_PREFIXES", "MAX_NODE_ID_CHARS", "MAX_INT", "FUTURE_SLACK_MS"]

MAX_INT = 2 ** 53                 # counters, epochs, log offsets, ports: below this
MAX_OFFSET = 2 ** 63              # committed consumer offsets (the group protocol's bound)
MAX_NODE_ID_CHARS = 255
MAX_ADDRESS_CHARS = 255
MAX_STORE_ID_CHARS = 64
MAX_GROUP_CHARS = 255             # mesh.groups.messages.MAX_GROUP_ID_CHARS
MAX_METADATA_CHARS = 256          # mesh.node.groups.group_host.MAX_METADATA_CHARS
FUTURE_SLACK_MS = 60_000          # a wall-clock stamp may be this far ahead of ours
SCRAM_MIN_ITERATIONS = 4096       # mesh.security.scram (Kafka's bounds)
SCRAM_MAX_ITERATIONS = 16384
_SCRAM_DIGEST = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}

REGISTER_PREFIXES = keys.REGISTER_PREFIXES

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,9}")      # a canonical decimal, as str(int) writes it
_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
_OPERATIONS = frozenset({"read", "write", "create", "delete", "describe", "alter", "all"})


class _Bad(Exception):
    """A value that fails its schema; the message is the reason."""


def validate_entry(key: str, value: Any, now_ms: int) -> str | None:
    """None if ``key`` = ``value`` is a well-formed live gossip entry, else a short reason."""
    if type(key) is not str:
        return "key is not a string"
    try:
        for prefix, check in _CHECKS:
            if key == prefix or (prefix.endswith("/") and key.startswith(prefix)):
                check(key[len(prefix):], value, now_ms)
                return None
        raise _Bad("unknown key")
    except _Bad as exc:
        return f"{key[:80]}: {exc}"
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:   # defensive
        return f"{key[:80]}: malformed ({type(exc).__name__})"


# ----------------------------------------------------------------------- primitives ----

def _int(v: Any, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(v) is not int or not lo <= v < hi:
        raise _Bad(f"{what} must be an int in [{lo}, {hi})")
    return v


def _str(v: Any, what: str, hi: int, pattern: re.Pattern | None = None) -> str:
    if type(v) is not str or not 1 <= len(v) <= hi or (pattern is not None and not pattern.fullmatch(v)):
        raise _Bad(f"{what} must be a string of 1..{hi} allowed characters")
    return v


def _map(v: Any, fields: tuple[str, ...], what: str) -> dict:
    if type(v) is not dict or set(v) != set(fields):
        raise _Bad(f"{what} must be a map of exactly {', '.join(fields)}")
    return v


def _number(s: str, what: str, hi: int) -> int:
    if not _NUMBER.fullmatch(s):
        raise _Bad(f"{what} {s[:20]!r} is not a canonical number")
    return _int(int(s), what, 0, hi)


def _topic_chunk(rest: str) -> tuple[str, int]:
    """``<topic>/<k>`` of a lead/, stats/ or recovering/ key."""
    topic, _, k = rest.rpartition("/")
    _str(topic, "topic", 249, _TOPIC)
    return topic, _number(k, "chunk", keys.chunk_of(MAX_PARTITIONS - 1) + 1)


def _partition_in_chunk(s: Any, chunk: int) -> int:
    if type(s) is not str:
        raise _Bad("partition keys are strings")
    p = _number(s, "partition", MAX_PARTITIONS)
    if keys.chunk_of(p) != chunk:
        raise _Bad(f"partition {p} is not in chunk {chunk}")
    return p


def _replicas(v: Any) -> None:
    if type(v) is not list or not 1 <= len(v) <= MAX_REPLICATION_FACTOR:
        raise _Bad(f"a replica list has 1..{MAX_REPLICATION_FACTOR} node ids")
    for n in v:
        _str(n, "node id", MAX_NODE_ID_CHARS)
    if len(set(v)) != len(v):
        raise _Bad("a replica list names a node twice")


# ----------------------------------------------------------------------- namespaces ----

def _member(rest: str, v: Any, now_ms: int) -> None:
    _map(v, ("address", "text_port", "store_id"), "member")
    _str(v["address"], "address", MAX_ADDRESS_CHARS)
    if v["text_port"] is not None:
        _int(v["text_port"], "text_port", 1, 65536)
    _str(v["store_id"], "store_id", MAX_STORE_ID_CHARS)


def _kafka(rest: str, v: Any, now_ms: int) -> None:
    _map(v, ("host", "port", "id"), "kafka listener")
    _str(v["host"], "host", MAX_ADDRESS_CHARS)
    _int(v["port"], "port", 1, 65536)
    _int(v["id"], "id", 0, 2 ** 31)


def _lead(rest: str, v: Any, now_ms: int) -> None:
    _, chunk = _topic_chunk(rest)
    if type(v) is not dict or not 1 <= len(v) <= keys.PARTITION_CHUNK:
        raise _Bad(f"leaderships are a map of 1..{keys.PARTITION_CHUNK} partitions")
    for p, epoch in v.items():
        _partition_in_chunk(p, chunk)
        _int(epoch, "epoch")


def _stats(rest: str, v: Any, now_ms: int) -> None:
    _, chunk = _topic_chunk(rest)
    if type(v) is not dict or not 1 <= len(v) <= keys.PARTITION_CHUNK:
        raise _Bad(f"stats are a map of 1..{keys.PARTITION_CHUNK} partitions")
    for p, offsets in v.items():
        _partition_in_chunk(p, chunk)
        if type(offsets) is not list or len(offsets) != 3:
            raise _Bad("stats of a partition are [log_start, log_end, high_watermark]")
        _int(offsets[0], "log_start")
        _int(offsets[1], "log_end")
        _int(offsets[2], "high_watermark", -1)


def _recovering(rest: str, v: Any, now_ms: int) -> None:
    _, chunk = _topic_chunk(rest)
    if type(v) is not list or not 1 <= len(v) <= keys.PARTITION_CHUNK:
        raise _Bad(f"recovering partitions are a list of 1..{keys.PARTITION_CHUNK}")
    last = -1
    for p in v:
        _int(p, "partition", 0, MAX_PARTITIONS)
        if p <= last or keys.chunk_of(p) != chunk:
            raise _Bad(f"recovering partitions must be ascending and in chunk {chunk}")
        last = p


def _offsets(rest: str, v: Any, now_ms: int) -> None:
    _map(v, ("g", "t", "o"), "offsets")
    group = _str(v["g"], "group", MAX_GROUP_CHARS)
    topic = _str(v["t"], "topic", 249)
    head = f"{group}/{topic}/"
    if not rest.startswith(head):
        raise _Bad("the key does not name the value's group and topic")
    chunk = _number(rest[len(head):], "chunk", (2 ** 31) // keys.OFFSETS_CHUNK_PARTITIONS + 1)
    o = v["o"]
    if type(o) is not dict or len(o) > keys.OFFSETS_CHUNK_PARTITIONS:
        raise _Bad(f"offsets are a map of at most {keys.OFFSETS_CHUNK_PARTITIONS} partitions")
    for p, committed in o.items():
        if type(p) is not str:
            raise _Bad("partition keys are strings")
        if _number(p, "partition", 2 ** 31) // keys.OFFSETS_CHUNK_PARTITIONS != chunk:
            raise _Bad(f"partition {p} is not in chunk {chunk}")
        if type(committed) is not list or len(committed) != 3:
            raise _Bad("a committed offset is [offset, metadata, wall_ms]")
        _int(committed[0], "offset", -1, MAX_OFFSET)   # -1: a deleted group's tombstone (mesh.groups.offsets)
        if type(committed[1]) is not str or len(committed[1]) > MAX_METADATA_CHARS:
            raise _Bad(f"offset metadata is a string of at most {MAX_METADATA_CHARS} characters")
        _int(committed[2], "wall_ms", 0, min(MAX_INT, now_ms + FUTURE_SLACK_MS + 1))


# ----------------------------------------------------------------------- registers -----

def _topic(rest: str, v: Any, now_ms: int) -> None:
    _str(rest, "topic", 249, _TOPIC)
    legacy = type(v) is dict and "replicas" in v    # written before replica tables were chunked
    _map(v, ("name", "uuid", "partitions", "replication_factor", "config", "replicas" if legacy else "chunks"),
         "topic header")
    if v["name"] != rest:
        raise _Bad("the header names another topic")
    _str(v["uuid"], "uuid", 16, _HEX16)
    partitions = _int(v["partitions"], "partitions", 1, MAX_PARTITIONS + 1)
    _int(v["replication_factor"], "replication_factor", 1, MAX_REPLICATION_FACTOR + 1)
    if legacy:
        if type(v["replicas"]) is not list or len(v["replicas"]) != partitions:
            raise _Bad("a legacy topic lists the replicas of each partition")
        for r in v["replicas"]:
            _replicas(r)
    else:
        _int(v["chunks"], "chunks", 1, partitions + 1)
    config = v["config"]
    if type(config) is not dict or any(type(x) is not int for x in config.values()):
        raise _Bad("config is a map of ints")
    try:
        if normalize_config(config) != config:
            raise _Bad("config is not normalized")
    except _Bad:
        raise
    except Exception as exc:     # MeshError: out of range or unknown
        raise _Bad(f"config: {str(exc)[:80]}") from None


def _tparts(rest: str, v: Any, now_ms: int) -> None:
    parts = rest.split("/")
    if len(parts) != 3:
        raise _Bad("a chunk key is tparts/<name>/<uuid>/<k>")
    _str(parts[0], "topic", 249, _TOPIC)
    _str(parts[1], "uuid", 16, _HEX16)
    _number(parts[2], "chunk", MAX_PARTITIONS)
    _map(v, ("first", "replicas"), "replica chunk")
    first = _int(v["first"], "first", 0, MAX_PARTITIONS)
    reps = v["replicas"]
    if type(reps) is not list or not 1 <= len(reps) <= keys.TPARTS_CHUNK_PARTITIONS \
            or first + len(reps) > MAX_PARTITIONS:
        raise _Bad(f"a chunk holds 1..{keys.TPARTS_CHUNK_PARTITIONS} partitions below {MAX_PARTITIONS}")
    for r in reps:
        _replicas(r)


def _user(rest: str, v: Any, now_ms: int) -> None:
    _str(rest, "user name", 64, _USER)
    _map(v, ("name", "public_key", "scram") if type(v) is dict and "scram" in v else ("name", "public_key"), "user")
    if v["name"] != rest:
        raise _Bad("the value names another user")
    key = v["public_key"]
    if type(key) is not str or len(key) != 40 or not _Z85.issuperset(key):
        raise _Bad("public_key is the 40-character Z85 text of a CURVE key")
    if "scram" in v:
        _scram(v["scram"])


def _b64(v: Any, what: str, lo: int, hi: int) -> None:
    if type(v) is not str or len(v) > 4 * hi:
        raise _Bad(f"{what} is base64 text")
    try:
        n = len(base64.b64decode(v, validate=True))
    except (binascii.Error, ValueError):
        raise _Bad(f"{what} is base64 text") from None
    if not lo <= n <= hi:
        raise _Bad(f"{what} has {lo}..{hi} bytes")


def _scram(v: Any) -> None:
    """A user's Kafka SCRAM credentials (``mesh.security.scram``: the same bounds)."""
    if type(v) is not dict or not v or not set(v) <= set(_SCRAM_DIGEST):
        raise _Bad("scram is a non-empty map keyed by SCRAM-SHA-256, SCRAM-SHA-512")
    for mech, c in v.items():
        _map(c, ("salt", "iterations", "stored_key", "server_key"), "scram credential")
        _int(c["iterations"], "iterations", SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS + 1)
        _b64(c["salt"], "salt", 16, 64)
        _b64(c["stored_key"], "stored_key", _SCRAM_DIGEST[mech], _SCRAM_DIGEST[mech])
        _b64(c["server_key"], "server_key", _SCRAM_DIGEST[mech], _SCRAM_DIGEST[mech])


def _acl(rest: str, v: Any, now_ms: int) -> None:
    _str(rest, "acl id", 16, _HEX16)
    _map(v, ("principal", "permission", "operations", "resource", "name", "pattern"), "acl")
    if v["principal"] != "*":
        _str(v["principal"], "principal", 64, _USER)
    if v["permission"] not in ("allow", "deny"):
        raise _Bad("permission is allow or deny")
    ops = v["operations"]
    if type(ops) is not list or not ops or any(type(o) is not str or o not in _OPERATIONS for o in ops) \
            or len(set(ops)) != len(ops):
        raise _Bad(f"operations are distinct names from {', '.join(sorted(_OPERATIONS))}")
    if v["resource"] not in ("topic", "group", "cluster"):
        raise _Bad("resource is topic, group or cluster")
    _str(v["name"], "resource name", 249)
    if v["pattern"] not in ("literal", "prefixed"):
        raise _Bad("pattern is literal or prefixed")


def _partition_key(rest: str) -> None:
    parts = rest.split("/")
    if len(parts) != 3:
        raise _Bad("a partition key is <prefix>/<name>/<uuid>/<p>")
    _str(parts[0], "topic", 249, _TOPIC)
    _str(parts[1], "uuid", 16, _HEX16)
    _number(parts[2], "partition", MAX_PARTITIONS)


def _pconf(rest: str, v: Any, now_ms: int) -> None:
    _partition_key(rest)
    _map(v, ("v", "t", "voters", "learners", "committed"), "partition config")
    _int(v["v"], "version", 1, 2 ** 40)
    _int(v["t"], "term", 0, 2 ** 40)
    _replicas(v["voters"])
    learners = v["learners"]
    if type(learners) is not list or len(learners) + len(v["voters"]) > MAX_REPLICATION_FACTOR:
        raise _Bad(f"voters and learners are at most {MAX_REPLICATION_FACTOR} node ids")
    if learners:
        _replicas(learners)
    if set(learners) & set(v["voters"]):
        raise _Bad("a node is both voter and learner")
    if type(v["committed"]) is not bool:
        raise _Bad("committed is a bool")


def _broker(rest: str, v: Any, now_ms: int) -> None:
    _str(rest, "node id", MAX_NODE_ID_CHARS)
    _map(v, ("state",), "broker state")
    if v["state"] not in ("active", "draining"):
        raise _Bad("state is active or draining")


def _reassign(rest: str, v: Any, now_ms: int) -> None:
    _partition_key(rest)
    _map(v, ("replicas",), "reassignment")
    _replicas(v["replicas"])


def _load(rest: str, v: Any, now_ms: int) -> None:
    _map(v, ("bytes", "replicas", "leaders"), "load")
    _int(v["bytes"], "bytes")
    _int(v["replicas"], "replicas")
    _int(v["leaders"], "leaders")


_Check = Callable[[str, Any, int], None]
_CHECKS: tuple[tuple[str, _Check], ...] = (
    (keys.MEMBER_KEY, _member),
    (keys.KAFKA_KEY, _kafka),
    (keys.LEAD_PREFIX, _lead),
    (keys.STATS_PREFIX, _stats),
    (keys.RECOVERING_PREFIX, _recovering),
    (keys.OFFSETS_PREFIX, _offsets),
    (keys.TOPIC_PREFIX, _topic),
    (keys.TPARTS_PREFIX, _tparts),
    (keys.USER_PREFIX, _user),
    (keys.ACL_PREFIX, _acl),
    (keys.PCONF_PREFIX, _pconf),
    (keys.BROKER_PREFIX, _broker),
    (keys.REASSIGN_PREFIX, _reassign),
    (keys.LOAD_KEY, _load),
)
