"""The node's answers to user and ACL admin requests, and keeping the authorizer current.

Users (``user/<name>``) and ACL rows (``acl/<id>``) are cluster-wide gossip registers
(``mesh.cluster.keys``), written here as topic create writes ``topic/<name>``: commit the
turn first (an admin change never shares a transaction with staged appends), write the
register, then ``apply_cluster_change()`` persists the gossip snapshot with its own commit,
and the answer goes out only once the change is on this node's disk. Gossip carries it to
every broker within a few rounds; each broker's loop then calls ``SecuritySync.refresh``
(whenever the gossip state moved), which feeds the registry and the authorizer, so a new
ACL, a removed ACL or a removed user takes effect cluster-wide without a restart.

Rules kept here (the shapes are ``mesh.security.acl`` / ``registry``'s):
- a user name is new, or re-added with the same key (idempotent); a key belongs to one user;
  the name ``broker`` and the node's static (superuser) names are refused;
- an ACL row's id is its content's hash: adding a row twice is one row;
- removing ACLs by filters needs at least one filter (never "remove everything" by accident);
- a user may carry Kafka SCRAM credentials (``scram``, never a password: ``mesh.security.scram``),
  given when it is added; adding it again with the same key and new credentials replaces
  them (a new Kafka password). ``USER_LIST`` names the mechanisms only; the credentials go
  to brokers only (``KAFKA_SECURITY``, for the Kafka listener beside each node), with a
  version so that a poll that finds nothing new is answered without them.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Callable

from mesh.cluster.keys import ACL_PREFIX, USER_PREFIX, acl_key, user_key
from mesh.cluster.schema import validate_entry
from mesh.security.acl import AclRule, AclTable, check_user_name, parse_operations
from mesh.security.registry import RESERVED_NAMES, Registry, check_public_key
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["SecurityHandlers", "SecuritySync"]

log = logging.getLogger("mesh.node.security")


def _invalid(text: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_REQUEST, text)


def _acl_entry(rule: AclRule) -> dict[str, Any]:
    return {"id": rule.id, **rule.to_register()}


class SecurityHandlers:
    def __init__(self, *, gossip, commit_turn: Callable[[], Any], apply_cluster_change: Callable[[], bool],
                 reply: Callable, registry: Registry | None = None) -> None:
        """``registry``: the node's (secured mode), to refuse its static names; None when open."""
        self.gossip = gossip
        self.commit_turn = commit_turn
        self.apply_cluster_change = apply_cluster_change
        self.reply = reply
        self.registry = registry
        self.superusers: frozenset[str] = frozenset()   # secured mode: the node's (for the Kafka listener)

    def table(self) -> dict[type, Callable]:
        return {
            m.AddUserRequest: self.on_add_user,
            m.RemoveUserRequest: self.on_remove_user,
            m.ListUsersRequest: self.on_list_users,
            m.AddAclRequest: self.on_add_acl,
            m.RemoveAclRequest: self.on_remove_acl,
            m.ListAclsRequest: self.on_list_acls,
            m.KafkaSecurityRequest: self.on_kafka_security,
        }

    def _persist(self, what: str) -> None:
        if not self.apply_cluster_change():
            raise MeshError(ErrorCode.STORAGE_ERROR, f"{what} but not persisted here (storage error)")

    def _users(self) -> dict[str, dict]:
        """name -> value of the well-formed ``user/`` registers."""
        out = {}
        for value in self.gossip.cluster_items(USER_PREFIX).values():
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                out[value["name"]] = value
        return out

    def _acls(self) -> AclTable:
        return AclTable.from_registers(self.gossip.cluster_items(ACL_PREFIX))[0]

    # -- users --------------------------------------------------------------------------
    def on_add_user(self, ident, rid, req: m.AddUserRequest, payload) -> None:
        try:
            name = check_user_name(req.name)
            key = check_public_key(req.public_key)
        except ValueError as exc:
            raise _invalid(str(exc))
        if name in RESERVED_NAMES or (self.registry is not None and name in self.registry.static):
            raise _invalid(f"the name {name!r} is reserved")
        users = self._users()
        old = users.get(name)
        if old is not None and old.get("public_key") != key:
            raise _invalid(f"user {name} exists with another key: remove it first")
        owner = next((n for n, v in sorted(users.items()) if v.get("public_key") == key and n != name), None)
        if owner is not None or (self.registry is not None and key in self.registry.static.values()):
            raise _invalid(f"this public key is already the key of user {owner or '(static)'}")
        value = {"name": name, "public_key": key}
        if req.scram is not None:
            value["scram"] = req.scram
            why = validate_entry(user_key(name), value, 0)
            if why is not None:
                raise _invalid(f"bad Kafka credentials: {why}")
        elif old is not None and "scram" in old:
            value["scram"] = old["scram"]     # re-added without a Kafka password: it keeps its own
        if old != value:
            self.commit_turn()
            self.gossip.put_cluster(user_key(name), value)
            self._persist(f"user {name} added")
            log.info("%s user %s%s", "added" if old is None else "updated", name,
                     " (Kafka credentials)" if "scram" in value else "")
        self.reply(ident, rid, m.AddUserResponse(0))

    def on_remove_user(self, ident, rid, req: m.RemoveUserRequest, payload) -> None:
        if not isinstance(req.name, str) or req.name not in self._users():
            raise _invalid(f"no user named {req.name!r:.80}")
        self.commit_turn()
        self.gossip.delete_cluster(user_key(req.name))
        self._persist(f"user {req.name} removed")
        log.info("removed user %s", req.name)
        self.reply(ident, rid, m.RemoveUserResponse(0))

    def on_list_users(self, ident, rid, req: m.ListUsersRequest, payload) -> None:
        users = [{"name": n, "public_key": v.get("public_key"),
                  **({"kafka": sorted(v["scram"])} if isinstance(v.get("scram"), dict) else {})}
                 for n, v in sorted(self._users().items())]
        if self.registry is not None:
            users += [{"name": n, "public_key": k, "static": True} for n, k in sorted(self.registry.static.items())]
        self.reply(ident, rid, m.ListUsersResponse(0, users=users))

    # -- ACLs ---------------------------------------------------------------------------
    def on_add_acl(self, ident, rid, req: m.AddAclRequest, payload) -> None:
        try:
            rule = AclRule(principal=req.principal, permission=req.permission,
                           operations=parse_operations(req.operations), resource=req.resource,
                           name=req.name, pattern=req.pattern)
        except (TypeError, ValueError) as exc:
            raise _invalid(f"bad ACL: {exc}")
        stamp = self.gossip.cluster_stamp(acl_key(rule.id))   # (not the whole table)
        if stamp is None or stamp[2]:
            self.commit_turn()
            self.gossip.put_cluster(acl_key(rule.id), rule.to_register())
            self._persist(f"ACL {rule.id} added")
            log.info("added ACL %s: %s", rule.id, rule.describe())
        self.reply(ident, rid, m.AddAclResponse(0, id=rule.id))

    def on_remove_acl(self, ident, rid, req: m.RemoveAclRequest, payload) -> None:
        table = self._acls()
        filters = {f: getattr(req, f) for f in ("principal", "permission", "operations", "resource", "name", "pattern")}
        if req.id is not None:
            rules = [table.rules[req.id]] if req.id in table.rules else []
        elif all(v is None for v in filters.values()):
            raise _invalid("give an ACL id or at least one field to match")
        else:
            try:
                rules = table.select(**filters)
            except (TypeError, ValueError) as exc:
                raise _invalid(str(exc))
        if rules:
            self.commit_turn()
            for rule in rules:
                self.gossip.delete_cluster(acl_key(rule.id))
            self._persist(f"{len(rules)} ACL(s) removed")
            log.info("removed ACLs %s", ", ".join(r.id for r in rules))
        self.reply(ident, rid, m.RemoveAclResponse(0, removed=[_acl_entry(r) for r in rules]))

    def on_list_acls(self, ident, rid, req: m.ListAclsRequest, payload) -> None:
        rules = self._acls().select(principal=req.principal, resource=req.resource, name=req.name)
        self.reply(ident, rid, m.ListAclsResponse(0, acls=[_acl_entry(r) for r in rules]))


    def on_kafka_security(self, ident, rid, req: m.KafkaSecurityRequest, payload) -> None:
        """Brokers only (the authorizer refuses every user): the Kafka listener's poll."""
        users = {n: v["scram"] for n, v in sorted(self._users().items()) if isinstance(v.get("scram"), dict)}
        acls = self.gossip.cluster_items(ACL_PREFIX)
        supers = sorted(self.superusers)
        digest = hashlib.sha256(repr((sorted(users.items()), sorted(acls.items()), supers)).encode())
        version = digest.hexdigest()[:32]
        if req.since == version:
            self.reply(ident, rid, m.KafkaSecurityResponse(0, version=version, superusers=supers))
            return
        self.reply(ident, rid, m.KafkaSecurityResponse(0, version=version, users=users, acls=acls,
                                                       superusers=supers))


class SecuritySync:
    """Feeds the registry and the authorizer from gossip; the loop calls ``refresh()``
    whenever the gossip state moved (cheap when users and ACLs did not change)."""

    def __init__(self, gossip, registry: Registry, authorizer) -> None:
        self.gossip = gossip
        self.registry = registry
        self.authorizer = authorizer
        self._users: dict | None = None
        self._acls: dict | None = None
        self._signature = None   # the registers' bucket hashes at the last refresh

    def refresh(self) -> bool:
        """True if users or ACLs changed. Nothing is read while no cluster register changed
        (the bucket hashes tell, as for the catalog): the loop calls this whenever gossip
        moved, and reading every ACL each time made adding 2,000 rows take 535 s."""
        cluster_hash = getattr(self.gossip, "cluster_hash", None)
        signature = cluster_hash() if cluster_hash is not None else None
        if signature is not None and signature == self._signature:
            return False
        self._signature = signature
        users = self.gossip.cluster_items(USER_PREFIX)
        acls = self.gossip.cluster_items(ACL_PREFIX)
        changed = False
        if users != self._users:
            self._users = users
            self.registry.update(users)
            changed = True
        if acls != self._acls:
            self._acls = acls
            self.authorizer.update_acls(acls)
            if self.authorizer.skipped:
                log.warning("skipped %d malformed ACL value(s): %s", len(self.authorizer.skipped),
                            ", ".join(k[:40] for k in self.authorizer.skipped[:5]))
            changed = True
        if changed:
            log.info("security: %d user(s), %d ACL row(s)", len(self.registry.users), len(self.authorizer.table))
        return changed
