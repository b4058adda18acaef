"""The node's resource bounds that live outside the loop: ROUTER socket options, the check of
a ``NodeConfig``'s bounds, and the open-files limit.

Each connection to the node is a file descriptor: ``raise_nofile_limit`` raises the soft
RLIMIT_NOFILE to the hard limit at start, so the connection bound (``max_connections``,
counted by the ZAP handler, ``mesh.security``) is what refuses connections, not EMFILE.
"""
from __future__ import annotations

import logging

import zmq

from mesh.wire.topic_config import MAX_MESSAGE_BYTES

try:
    import resource
except ImportError:   # not on every platform
    resource = None

__all__ = ["StartupError", "router_options", "check_bounds", "raise_nofile_limit"]

log = logging.getLogger("mesh.node.limits.bounds")


class StartupError(Exception):
    """The node cannot start; the message says what is wrong and how to recover."""


def router_options(cfg) -> dict:
    """The ROUTER's bounds: frame size, answers per client pipe.

    No ZeroMQ heartbeats on the ROUTER itself: libzmq 4.3.5 aborts the process
    (``Assertion failed: !_io_error``, zeromq/libzmq#4841) when a ROUTER with heartbeats
    sees connections that share a routing id come and go, which any client can arrange.
    A silent connection is dropped by the TTL its *own* side announces in its PINGs: our
    clients announce 5 s (``mesh.client.transport``), peer links ``heartbeat_timeout_ms``
    (``mesh.node.peers.peers``). A hostile client that announces none keeps at most its bounded
    parked fetches and queued answers, and one of the ``max_connections``."""
    return {zmq.MAXMSGSIZE: cfg.max_frame_bytes, zmq.SNDHWM: cfg.client_sndhwm}


def check_bounds(cfg) -> None:
    if cfg.max_frame_bytes < MAX_MESSAGE_BYTES + (64 << 10):
        raise StartupError(f"--max-frame-bytes must be at least {MAX_MESSAGE_BYTES + (64 << 10)} (the largest "
                           f"max.message.bytes a topic may set, {MAX_MESSAGE_BYTES}, and headers)")
    for name in ("max_body_bytes", "fetch_max_bytes", "partition_fetch_max_bytes", "max_parked_fetches",
                 "max_parked_per_client", "client_sndhwm", "client_backlog_bytes", "queued_max_answer_bytes",
                 "producer_id_expiration_ms",
                 "max_producer_ids", "heartbeat_ivl_ms", "heartbeat_timeout_ms"):
        if getattr(cfg, name) < 1:
            raise StartupError(f"{name} must be at least 1")
    for name in ("fetch_max_wait_ms", "produce_quota_bytes_per_s", "fetch_quota_bytes_per_s",
                 "max_body_containers", "request_percentage"):
        if getattr(cfg, name) < 0:
            raise StartupError(f"{name} must be at least 0")
    if cfg.request_percentage > 100:
        raise StartupError("request_percentage must be at most 100 (the node loop is one thread)")


def raise_nofile_limit() -> None:
    """Raise the soft limit of open files to the hard limit: each connection is a file."""
    if resource is None:
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit: %s", exc)
