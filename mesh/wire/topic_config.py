"""Topic names, configs and their validation (shared by the node and the client)."""
from __future__ import annotations

import re

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["TOPIC_DEFAULTS", "validate_topic_name", "normalize_config", "MAX_PARTITIONS", "RECENT_BATCHES"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000
MAX_RECORD_BYTES = 1 << 20
BATCH_OVERHEAD_BYTES = 4096
# The idempotence window, shared by broker and client: a leader remembers the last
# RECENT_BATCHES batches of each producer per partition (sequences and offsets,
# mesh.node.producer_state), and a producer never has more than that many batches between
# its oldest unacknowledged one and its newest sent one (mesh.client.sequencer), so a
# retried batch that was stored is always recognised and answered with its offsets.
RECENT_BATCHES = 16

# Kafka's names where the meaning is the same. -1 means unlimited.
TOPIC_DEFAULTS: dict[str, int] = {
    "retention.ms": 7 * 24 * 3600 * 1000,
    "retention.bytes": -1,
    "max.message.bytes": MAX_RECORD_BYTES + BATCH_OVERHEAD_BYTES,
}


def validate_topic_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"invalid topic name {name!r}: use 1-249 characters from [A-Za-z0-9._-]")


def normalize_config(config: dict) -> dict[str, int]:
    """Defaults filled in; unknown keys and non-integer values are errors."""
    out = dict(TOPIC_DEFAULTS)
    for k, v in (config or {}).items():
        if k not in TOPIC_DEFAULTS:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"unknown topic config {k!r}; known: {', '.join(sorted(TOPIC_DEFAULTS))}")
        try:
            out[k] = int(v)
        except (TypeError, ValueError):
            raise MeshError(ErrorCode.INVALID_CONFIG, f"topic config {k}={v!r} is not an integer")
    if out["max.message.bytes"] < 1024:
        raise MeshError(ErrorCode.INVALID_CONFIG, "max.message.bytes must be at least 1024")
    return out
