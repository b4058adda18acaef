"""Users and ACLs for ``Admin`` (a mixin: ``Admin`` inherits these methods).

Every change goes to any broker, which answers once the change is on its disk; gossip then
carries it to the others. With ``wait_s`` (the default, like ``create_topic``) the call
returns only when every live broker has it, so the next request anywhere sees it.
The rules (operations, resources, deny wins, default deny) are ``mesh.security.acl``'s.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

from mesh.cluster.liveness import row_is_up
from mesh.wire.errors import MeshError
from mesh.wire.messages import (AddAclRequest, AddUserRequest, ListAclsRequest, ListUsersRequest,
                                RemoveAclRequest, RemoveUserRequest)

__all__ = ["SecurityAdmin"]


def _ops(operations: str | Iterable[str]) -> list[str]:
    if isinstance(operations, str):
        return [o.strip().lower() for o in operations.split(",") if o.strip()]
    return list(operations)


class SecurityAdmin:
    """Users (principals with a CURVE public key) and Kafka-style ACLs."""

    # -- users --------------------------------------------------------------------------
    def add_user(self, name: str, public_key: str, wait_s: float = 10.0, *, kafka_password: str | None = None,
                 kafka_iterations: int | None = None) -> None:
        """Register principal ``name`` with its CURVE public key (Z85 text, 40 chars).
        ``kafka_password``: also give it a Kafka password (SCRAM-SHA-256 and -512
        credentials are derived here; the password never leaves this process); for a user
        that exists with this key, it replaces the former Kafka password."""
        scram = None
        if kafka_password is not None:
            from mesh.security.scram import DEFAULT_ITERATIONS, credentials_to_register, make_credentials
            scram = credentials_to_register(make_credentials(kafka_password,
                                                             iterations=kafka_iterations or DEFAULT_ITERATIONS))
        self._call(AddUserRequest(name, public_key, scram))
        mechs = sorted(scram or {})
        self._wait_security(ListUsersRequest(), lambda r: any(
            u["name"] == name and (not mechs or u.get("kafka") == mechs) for u in r.users), wait_s)

    def remove_user(self, name: str, wait_s: float = 10.0) -> None:
        """Remove a user: every broker refuses its requests (open connections too) as soon
        as gossip brings the removal (within a few rounds)."""
        self._call(RemoveUserRequest(name))
        self._wait_security(ListUsersRequest(), lambda r: all(u["name"] != name for u in r.users), wait_s)

    def list_users(self) -> list[dict]:
        """[{name, public_key[, kafka: the SCRAM mechanisms of its Kafka password]}] (static
        superusers of the answering broker: ``static: True``)."""
        return self._call(ListUsersRequest()).users

    # -- ACLs ---------------------------------------------------------------------------
    def add_acl(self, principal: str, operations: str | Iterable[str], resource: str, name: str,
                permission: str = "allow", pattern: str = "literal", wait_s: float = 10.0) -> str:
        """Add one ACL row; returns its id (the same row added twice is one row).
        ``operations``: a list or "read,write"; ``resource``: topic, group or cluster;
        ``pattern``: literal or prefixed."""
        acl_id = self._call(AddAclRequest(principal, permission, _ops(operations), resource, name, pattern)).id
        self._wait_security(ListAclsRequest(), lambda r: any(a["id"] == acl_id for a in r.acls), wait_s)
        return acl_id

    def remove_acl(self, acl_id: str | None = None, *, principal: str | None = None,
                   permission: str | None = None, operations: str | Iterable[str] | None = None,
                   resource: str | None = None, name: str | None = None, pattern: str | None = None,
                   wait_s: float = 10.0) -> list[dict]:
        """Remove the row ``acl_id``, or every row matching all the fields given; returns
        the rows removed (none matched: an empty list)."""
        ops = None if operations is None else _ops(operations)
        removed = self._call(RemoveAclRequest(acl_id, principal, permission, ops, resource, name, pattern)).removed
        gone = {a["id"] for a in removed}
        if gone:
            self._wait_security(ListAclsRequest(), lambda r: gone.isdisjoint(a["id"] for a in r.acls), wait_s)
        return removed

    def list_acls(self, principal: str | None = None, resource: str | None = None,
                  name: str | None = None) -> list[dict]:
        """[{id, principal, permission, operations, resource, name, pattern}], by id."""
        return self._call(ListAclsRequest(principal, resource, name)).acls

    def _wait_security(self, request, ok: Callable, wait_s: float) -> None:
        """Until every live broker answers ``request`` with something ``ok`` (or ``wait_s``)."""
        if wait_s <= 0:
            return
        deadline = time.monotonic() + wait_s
        pending = [b["address"] for b in self.metadata([]).brokers if row_is_up(b, strict=True)]
        while pending and time.monotonic() < deadline:
            addr = pending[0]
            try:
                resp, _ = self.transport.call(addr, request, timeout_ms=1000)
                if ok(resp):
                    pending.pop(0)
                    continue
            except MeshError:
                self.transport.forget(addr)
            time.sleep(0.02)  # a gossip round is 200 ms: poll a few times per round
