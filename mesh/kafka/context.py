"""The contract between the Kafka listener's server and its API handlers.

The listener (``mesh.kafka.server``, its own process beside a node, one more client of the
node) decodes each Kafka request with ``kio``'s dataclasses and calls the handler registered
for its API key as a plain blocking function::

    handler(ctx: RequestContext, request) -> response | None

``request`` and ``response`` are ``kio.schema`` dataclasses of version ``ctx.api_version``;
``None`` means "no response" (Produce with acks=0); a ``Deferred`` an answer still on its
way (below). A handler may block (it runs on a
worker thread, never on the thread that reads sockets); it raises nothing for a bad
request: it answers the Kafka error code (``kio.static.constants.ErrorCode``). Handlers
authorize through ``ctx.authorizer`` before doing anything expensive.

Extensions (fields with defaults, after the lead's): ``mesh`` is the calling thread's
native client (``mesh.kafka.link.MeshLink``: ``.transport``, ``.cluster`` a
``ClusterView``, ``.address`` the node's); ``session`` a dict private to the connection
(per-connection state a handler keeps between requests).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Authorizer", "ClusterInfo", "Deferred", "KafkaBroker", "RequestContext"]


class Deferred:
    """A handler's answer that is not ready yet: ``finish()`` (blocking) returns the
    response. The server may read and start the connection's next request of the same API
    meanwhile (pipelined Produce), and writes the answers in request order."""

    __slots__ = ("finish",)

    def __init__(self, finish) -> None:
        self.finish = finish


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """One broker as a Kafka client sees it: a stable int32 node id and its Kafka address."""
    node_id: int            # Kafka node id (int32, stable across restarts)
    host: str
    port: int
    mesh_id: str            # the mesh node id ("n1")


class ClusterInfo(Protocol):
    """What the listener knows of the cluster (from its node's gossiped metadata)."""

    def kafka_brokers(self) -> list[KafkaBroker]: ...
    def kafka_broker_of(self, mesh_id: str) -> KafkaBroker | None: ...
    def self_broker(self) -> KafkaBroker: ...


class Authorizer(Protocol):
    """Kafka-style ACLs of the mesh, evaluated for a SASL principal (None: open listener,
    everything allowed). ``operation``: "READ", "WRITE", "CREATE", "DELETE", "DESCRIBE",
    "ALTER", "IDEMPOTENT_WRITE"...; ``resource_type``: "TOPIC", "GROUP", "CLUSTER"."""

    def allowed(self, principal: str | None, operation: str, resource_type: str, name: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class RequestContext:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    principal: str | None       # the SASL-authenticated mesh user; None on an open listener
    peer_host: str              # the client's address (for logs, per-IP limits)
    cluster: ClusterInfo
    authorizer: Authorizer
    mesh: Any = None            # mesh.kafka.link.MeshLink of the calling thread
    session: dict = field(default_factory=dict)   # the connection's own state
