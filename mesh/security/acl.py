"""ACL rows and their evaluation, in Kafka's style (pure: no I/O, no clock).

An ACL row (``AclRule``) says: principal P is allowed (or denied) operations O on resources
of one type whose name matches N, literally or as a prefix. Rows live in the cluster-wide
gossip registers ``acl/<id>`` (``mesh.cluster.keys``); ``AclTable`` indexes them for
evaluation.

Rules (as Kafka's ``AclAuthorizer``):

- operations: read, write, create, delete, describe, alter, and ``all`` (every operation);
  resources: topic, group, cluster. The cluster is one resource named ``cluster``.
- a row's principal is a user name or ``*`` (every principal); its name is matched
  ``literal`` (equal; the literal name ``*`` matches every name) or ``prefixed`` (the
  resource name starts with it).
- deny wins: if any matching row denies the operation, it is denied; otherwise it is
  allowed if a matching row allows it; otherwise denied (default deny). Superusers are
  allowed everything before any row is looked at (``AclTable.allows(..., superusers)``).
- implied operations: allowing read, write, delete or alter also allows describe (a deny of
  read does not deny describe). ``all`` matches every operation, allowed or denied.
- a row's id is derived from its content (``acl_id``), so adding the same row twice is one
  row, and every broker computes the same id.

Evaluation looks only at the rows of the principal and of ``*`` for the resource type: a
dict lookup for literal names and a scan of the (few) prefixed rows.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = [
    "OPERATIONS", "RESOURCES", "PERMISSIONS", "PATTERNS", "ANY_PRINCIPAL", "CLUSTER_NAME",
    "MAX_NAME_CHARS", "AclRule", "AclTable", "acl_id", "parse_operations", "check_user_name",
    "USER_NAME_RE",
]

OPERATIONS = ("read", "write", "create", "delete", "describe", "alter", "all")
RESOURCES = ("topic", "group", "cluster")
PERMISSIONS = ("allow", "deny")
PATTERNS = ("literal", "prefixed")
ANY_PRINCIPAL = "*"
CLUSTER_NAME = "cluster"          # the name of the one cluster resource
MAX_NAME_CHARS = 249
USER_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_IMPLY_DESCRIBE = frozenset({"read", "write", "delete", "alter"})


def check_user_name(name: Any) -> str:
    """A user name: 1..64 characters of ``[A-Za-z0-9._-]``; else ValueError."""
    if not isinstance(name, str) or not USER_NAME_RE.fullmatch(name):
        raise ValueError(f"a user name is 1-64 characters of A-Z a-z 0-9 . _ -, not {name!r:.80}")
    return name


def parse_operations(ops: Any) -> tuple[str, ...]:
    """Operations from a list or a comma-separated string: distinct, known, non-empty,
    in the order of ``OPERATIONS``; else ValueError."""
    if isinstance(ops, str):
        ops = [o.strip().lower() for o in ops.split(",") if o.strip()]
    if not isinstance(ops, (list, tuple, set, frozenset)) or not ops:
        raise ValueError("operations: a non-empty list of " + ", ".join(OPERATIONS))
    bad = [o for o in ops if o not in OPERATIONS]
    if bad:
        raise ValueError(f"unknown operation {bad[0]!r:.40}: use {', '.join(OPERATIONS)}")
    return tuple(o for o in OPERATIONS if o in set(ops))


def acl_id(principal: str, permission: str, operations: Iterable[str], resource: str,
           name: str, pattern: str) -> str:
    """16 hex characters derived from the row's content (the same on every broker)."""
    text = "\0".join([principal, permission, ",".join(sorted(operations)), resource, name, pattern])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class AclRule:
    """One ACL row; ``to_register`` is the ``acl/<id>`` gossip value."""
    principal: str
    permission: str
    operations: tuple[str, ...]
    resource: str
    name: str
    pattern: str = "literal"

    def __post_init__(self) -> None:
        p = self.principal
        if p != ANY_PRINCIPAL:
            check_user_name(p)
        if self.permission not in PERMISSIONS:
            raise ValueError(f"permission must be allow or deny, not {self.permission!r:.40}")
        if tuple(parse_operations(list(self.operations))) != tuple(self.operations):
            object.__setattr__(self, "operations", parse_operations(list(self.operations)))
        if self.resource not in RESOURCES:
            raise ValueError(f"resource must be one of {', '.join(RESOURCES)}, not {self.resource!r:.40}")
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= MAX_NAME_CHARS:
            raise ValueError(f"resource name must be 1-{MAX_NAME_CHARS} characters")
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be literal or prefixed, not {self.pattern!r:.40}")
        if self.resource == "cluster" and (self.pattern != "literal" or self.name not in (CLUSTER_NAME, "*")):
            raise ValueError(f"the cluster resource is named {CLUSTER_NAME!r} (literal)")

    @property
    def id(self) -> str:
        return acl_id(self.principal, self.permission, self.operations, self.resource, self.name, self.pattern)

    def to_register(self) -> dict[str, Any]:
        return {"principal": self.principal, "permission": self.permission,
                "operations": list(self.operations), "resource": self.resource,
                "name": self.name, "pattern": self.pattern}

    @classmethod
    def from_register(cls, value: Mapping[str, Any]) -> "AclRule":
        """A row from an ``acl/<id>`` value; ValueError (or KeyError, TypeError) if malformed."""
        if not isinstance(value, Mapping):
            raise ValueError("an ACL value is a map")
        ops = value["operations"]
        if not isinstance(ops, list) or len(set(map(str, ops))) != len(ops):
            raise ValueError("operations: a list of distinct operations")
        return cls(principal=value["principal"], permission=value["permission"],
                   operations=parse_operations(value["operations"]), resource=value["resource"],
                   name=value["name"], pattern=value["pattern"])

    def matches_name(self, name: str) -> bool:
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return self.name == "*" or self.name == name

    def covers(self, operation: str) -> bool:
        """Whether this row speaks about ``operation`` (implied describe only for allows)."""
        ops = self.operations
        if "all" in ops or operation in ops:
            return True
        return self.permission == "allow" and operation == "describe" and not _IMPLY_DESCRIBE.isdisjoint(ops)

    def describe(self) -> str:
        how = "prefixed " if self.pattern == "prefixed" else ""
        return (f"{self.principal} {self.permission} {','.join(self.operations)} "
                f"{self.resource} {how}{self.name}")


class _Index:
    """The rows of one (principal, resource type): literal by name, prefixed in a list."""
    __slots__ = ("literal", "prefixed")

    def __init__(self) -> None:
        self.literal: dict[str, list[AclRule]] = {}
        self.prefixed: list[AclRule] = []

    def add(self, rule: AclRule) -> None:
        if rule.pattern == "prefixed":
            self.prefixed.append(rule)
        else:
            self.literal.setdefault(rule.name, []).append(rule)

    def remove(self, rule: AclRule) -> None:
        rows = self.prefixed if rule.pattern == "prefixed" else self.literal.get(rule.name, [])
        if rule in rows:
            rows.remove(rule)
        if rule.pattern != "prefixed" and not rows:
            self.literal.pop(rule.name, None)

    def matching(self, name: str) -> Iterable[AclRule]:
        yield from self.literal.get(name, ())
        if name != "*":
            yield from self.literal.get("*", ())
        for r in self.prefixed:
            if name.startswith(r.name):
                yield r


class AclTable:
    """Every ACL row, indexed by (principal, resource type) for evaluation."""

    def __init__(self, rules: Iterable[AclRule] = ()) -> None:
        self.rules: dict[str, AclRule] = {}
        self._index: dict[tuple[str, str], _Index] = {}
        for r in rules:
            self.rules[r.id] = r
        for _, r in sorted(self.rules.items()):
            self._index.setdefault((r.principal, r.resource), _Index()).add(r)

    @classmethod
    def from_registers(cls, registers: Mapping[str, Any]) -> tuple["AclTable", list[str]]:
        """The table from ``acl/<id>`` registers (key -> value), and the keys skipped as
        malformed (a value that is not a row, or whose id is not the key's)."""
        rules, bad = [], []
        for key, value in sorted(registers.items()):
            try:
                rule = AclRule.from_register(value)
            except (KeyError, TypeError, ValueError):
                bad.append(key)
                continue
            if key.rpartition("/")[2] != rule.id:
                bad.append(key)
                continue
            rules.append(rule)
        return cls(rules), bad

    def __len__(self) -> int:
        return len(self.rules)

    def add(self, rule: AclRule, rule_id: str | None = None) -> None:
        """One more row (``rule_id``: its id, if known already; a row already here is kept)."""
        rid = rule_id or rule.id
        if rid not in self.rules:
            self.rules[rid] = rule
            self._index.setdefault((rule.principal, rule.resource), _Index()).add(rule)

    def remove(self, rule_id: str) -> None:
        rule = self.rules.pop(rule_id, None)
        if rule is not None:
            self._index[(rule.principal, rule.resource)].remove(rule)

    def decide(self, principal: str, operation: str, resource: str, name: str) -> tuple[bool, AclRule | None]:
        """(allowed, the deciding row: the deny, or an allow; None for default deny)."""
        allow: AclRule | None = None
        for who in (principal, ANY_PRINCIPAL):
            idx = self._index.get((who, resource))
            if idx is None:
                continue
            for rule in idx.matching(name):
                if not rule.covers(operation):
                    continue
                if rule.permission == "deny":
                    return False, rule
                allow = allow or rule
        return allow is not None, allow

    def allows(self, principal: str, operation: str, resource: str, name: str,
               superusers: frozenset[str] | set[str] = frozenset()) -> bool:
        if principal in superusers:
            return True
        return self.decide(principal, operation, resource, name)[0]

    def select(self, *, principal: str | None = None, permission: str | None = None,
               operations: Iterable[str] | None = None, resource: str | None = None,
               name: str | None = None, pattern: str | None = None) -> list[AclRule]:
        """Rows whose fields equal every filter given (None: any), sorted by id."""
        ops = None if operations is None else tuple(parse_operations(list(operations)))
        out = []
        for _, r in sorted(self.rules.items()):
            if ((principal is None or r.principal == principal)
                    and (permission is None or r.permission == permission)
                    and (ops is None or r.operations == ops)
                    and (resource is None or r.resource == resource)
                    and (name is None or r.name == name)
                    and (pattern is None or r.pattern == pattern)):
                out.append(r)
        return out
