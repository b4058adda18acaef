"""What the cell runner and both bench workers share: the value stamp, request sizing and
the partition count of a topic.

Each value a producer sends starts with its 8-byte due time in microseconds (``STAMP``);
the consumer unpacks it for the end-to-end latency. ``request_bytes`` bounds one produce
request of a workload, which sizes the client buffers and, through ``topic_config``, the
topic's ``max.message.bytes``.
"""
from __future__ import annotations

import struct
import time

from bench.scenarios import Workload

__all__ = ["MIB", "STAMP", "STAMP_QUANTUM_US", "partition_count", "request_bytes", "topic_config"]

STAMP = struct.Struct(">q")
STAMP_QUANTUM_US = 100   # the consumer's end-to-end records group stamps to 0.1 ms
MIB = 1 << 20


def partition_count(client, topic: str, timeout_s: float = 60.0) -> int:
    """The topic's partition count, retrying while a busy broker is slow to answer."""
    from mesh.wire.errors import MeshError
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.cluster.partitions(topic)
        except MeshError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # back off before asking again


def request_bytes(w: Workload) -> int:
    """Upper bound of one produce request's record batch."""
    per = w.message_bytes + (12 if w.keys else 0) + 16
    n = w.batch if w.batch else max(1, w.batch_bytes // max(1, w.message_bytes))
    return n * per + 4096


def topic_config(w: Workload) -> dict:
    """Raise max.message.bytes when a batch of large messages needs it (128 KB x 50); write
    caching on when the workload asks (``--write-caching``)."""
    need = request_bytes(w)
    out = {"max.message.bytes": need} if need > MIB else {}
    if w.write_caching:
        out["write.caching"] = "true"
    return out
