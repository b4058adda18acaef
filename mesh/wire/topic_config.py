"""Topic names, configs and their validation (shared by the node and the client).

Every config value is an integer within its range (``CONFIG_RANGES``); anything else is
INVALID_CONFIG with the range named, never a crash further in (a value the store or the
msgpack encoder could not hold, e.g. retention.ms=99999999999999999999999).
"""
from __future__ import annotations

import re

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["TOPIC_DEFAULTS", "CONFIG_RANGES", "BROKER_DEFAULTED", "write_caching_of", "MAX_MESSAGE_BYTES", "validate_topic_name", "normalize_config",
           "MAX_PARTITIONS", "RECENT_BATCHES"]

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
