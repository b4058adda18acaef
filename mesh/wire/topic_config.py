"""Topic names, configs and their validation (shared by the node and the client).

Every config value is an integer within its range (``CONFIG_RANGES``); anything else is
INVALID_CONFIG with the range named, never a crash further in (a value the store or the
msgpack encoder could not hold, e.g. retention.ms=99999999999999999999999).
"""
from __future__ import annotations

import re

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["TOPIC_DEFAULTS", "CONFIG_RANGES", "BROKER_DEFAULTED", "write_caching_of", "MAX_MESSAGE_BYTES",
           "validate_topic_name", "normalize_config", "MAX_PARTITIONS", "RECENT_BATCHES", "COMPACTION_DEFAULTS",
           "topic_setting", "compacted", "deletes", "POLICY_NAMES", "shown_config"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000
MAX_RECORD_BYTES = 1 << 20
BATCH_OVERHEAD_BYTES = 4096
# The idempotence window, shared by broker and client: a leader remembers the last
# RECENT_BATCHES batches of each producer per partition (sequences and offsets,
# mesh.node.data.producer_state), and a producer never has more than that many batches between
# its oldest unacknowledged one and its newest sent one (mesh.client.sequencer), so a
# retried batch that was stored is always recognised and answered with its offsets.
RECENT_BATCHES = 16
# The largest max.message.bytes a topic may set; a broker's frame limit (``mesh node
# --max-frame-bytes``, ZMQ_MAXMSGSIZE) must leave room for it.
MAX_MESSAGE_BYTES = 8 << 20
_FOREVER_MS = 100 * 365 * 24 * 3600 * 1000   # 100 years: "as good as unlimited"

# Kafka's names where the meaning is the same. -1 means unlimited.
TOPIC_DEFAULTS: dict[str, int] = {
    "retention.ms": 7 * 24 * 3600 * 1000,
    "retention.bytes": -1,
    "max.message.bytes": MAX_RECORD_BYTES + BATCH_OVERHEAD_BYTES,
}

# Configs a topic may leave unset: then each broker's default holds (``mesh node
# --write-caching``, ``--flush-ms``; issue 41, docs/decisions/41-durability.md). write.caching
# is 0 or 1 ("true"/"false" accepted, as Redpanda's).
BROKER_DEFAULTED = ("write.caching", "flush.ms")

# Inclusive ranges; -1 (unlimited) is inside where it is allowed.
CONFIG_RANGES: dict[str, tuple[int, int]] = {
    "retention.ms": (-1, _FOREVER_MS),
    "retention.bytes": (-1, 1 << 50),
    "max.message.bytes": (1024, MAX_MESSAGE_BYTES),
    "write.caching": (0, 1),
    "flush.ms": (0, 3_600_000),
}


# Compaction (issue 40; Kafka's names and defaults). Kept out of TOPIC_DEFAULTS: a topic's
# register holds these keys only when they were set, so a register without them (every
# topic created before) stays normalized, and a broker that knows no compaction refuses
# only the registers of topics that use it. Read them with ``topic_setting``.
# cleanup.policy: 0 delete, 1 compact, 2 compact,delete (names accepted, see POLICY_NAMES).
# min.cleanable.dirty.ratio: stored in thousandths (500 = 0.5); a str value ("0.5") is
# taken as the fraction Kafka's users write, an int as thousandths (the stored form).
COMPACTION_DEFAULTS: dict[str, int] = {
    "cleanup.policy": 0,
    "min.cleanable.dirty.ratio": 500,
    "delete.retention.ms": 86_400_000,
    "min.compaction.lag.ms": 0,
    "max.compaction.lag.ms": -1,
}
POLICY_NAMES = {"delete": 0, "compact": 1, "compact,delete": 2, "delete,compact": 2}
CONFIG_RANGES.update({
    "cleanup.policy": (0, 2),
    "min.cleanable.dirty.ratio": (0, 1000),
    "delete.retention.ms": (0, _FOREVER_MS),
    "min.compaction.lag.ms": (0, _FOREVER_MS),
    "max.compaction.lag.ms": (-1, _FOREVER_MS),
})


def topic_setting(config: dict, name: str) -> int:
    """A topic config's value, its default when the register does not hold it."""
    v = config.get(name)
    return (TOPIC_DEFAULTS.get(name) if name in TOPIC_DEFAULTS else COMPACTION_DEFAULTS[name]) if v is None else v


def compacted(config: dict) -> bool:
    return config.get("cleanup.policy", 0) in (1, 2)


def deletes(config: dict) -> bool:
    """Retention by time and size applies (policy delete, or compact,delete)."""
    return config.get("cleanup.policy", 0) in (0, 2)


def shown_config(config: dict) -> dict:
    """A topic's config as users write it (describe): every key, policy by name, the ratio
    as a fraction."""
    out = {**TOPIC_DEFAULTS, **COMPACTION_DEFAULTS, **config}
    out["cleanup.policy"] = {0: "delete", 1: "compact", 2: "compact,delete"}.get(out["cleanup.policy"], "?")
    out["min.cleanable.dirty.ratio"] = out["min.cleanable.dirty.ratio"] / 1000
    return out


def _user_value(k: str, v):
    """A compaction key's value as users write it, in its stored int form (None: not one)."""
    if k == "cleanup.policy" and isinstance(v, str) and v.strip().lower().replace(" ", "") in POLICY_NAMES:
        return POLICY_NAMES[v.strip().lower().replace(" ", "")]
    if k == "min.cleanable.dirty.ratio" and (isinstance(v, float) or (isinstance(v, str) and len(v) <= 40)):
        try:
            f = float(v)
        except ValueError:
            return None
        if f != f or not 0.0 <= f <= 1.0:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"topic config {k}={v!r} is out of range: 0..1")
        return round(f * 1000)
    return None


def write_caching_of(config: dict, default: bool, default_flush_ms: int) -> int | None:
    """The topic's flush.ms if its writes are cached (``write.caching``, else the broker's
    default), None if every write is synced before it is acknowledged."""
    on = config.get("write.caching")
    if not (default if on is None else on):
        return None
    f = config.get("flush.ms")
    return default_flush_ms if f is None else f


def validate_topic_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"invalid topic name {name!r}: use 1-249 characters from [A-Za-z0-9._-]")


def normalize_config(config: dict) -> dict[str, int]:
    """Defaults filled in; unknown keys and non-integer values are errors."""
    out = dict(TOPIC_DEFAULTS)
    if config is not None and not isinstance(config, dict):
        raise MeshError(ErrorCode.INVALID_CONFIG, "topic config must be a map of names to integers")
    for k, v in (config or {}).items():
        if k not in CONFIG_RANGES:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"unknown topic config {k!r}; known: {', '.join(sorted(CONFIG_RANGES))}")
        if k in COMPACTION_DEFAULTS and (u := _user_value(k, v)) is not None:
            v = u
        if k == "write.caching" and isinstance(v, (bool, str)) and str(v).lower() in ("true", "false"):
            v = int(str(v).lower() == "true")
        if isinstance(v, bool) or isinstance(v, float) or (isinstance(v, str) and len(v) > 40):
            raise MeshError(ErrorCode.INVALID_CONFIG, f"topic config {k}={str(v)[:40]!r} is not an integer")
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise MeshError(ErrorCode.INVALID_CONFIG, f"topic config {k}={v!r} is not an integer")
        lo, hi = CONFIG_RANGES[k]
        if not lo <= n <= hi:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"topic config {k}={n} is out of range: {lo}..{hi}")
        out[k] = n
    return out
