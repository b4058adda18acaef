"""ACL evaluation (mesh/security/acl.py): the allow/deny matrix, and a brute-force
reference checked against the indexed table (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mesh.security.acl import (OPERATIONS, RESOURCES, AclRule, AclTable, acl_id, check_user_name,
                               parse_operations)

OPS = [o for o in OPERATIONS if o != "all"]
IMPLY_DESCRIBE = {"read", "write", "delete", "alter"}


def rule(principal="alice", permission="allow", ops=("read",), resource="topic", name="orders",
         pattern="literal") -> AclRule:
    return AclRule(principal, permission, tuple(ops), resource, name, pattern)


def expected_allow(granted: str, asked: str) -> bool:
    """Kafka: an allow of ``granted`` covers ``asked`` (all; itself; describe implied)."""
    return granted in ("all", asked) or (asked == "describe" and granted in IMPLY_DESCRIBE)


@pytest.mark.parametrize("resource", RESOURCES)
@pytest.mark.parametrize("granted", OPERATIONS)
def test_allow_matrix(resource, granted):
    name = "cluster" if resource == "cluster" else "orders"
    t = AclTable([rule(ops=[granted], resource=resource, name=name)])
    for asked in OPS:
        assert t.allows("alice", asked, resource, name) == expected_allow(granted, asked), (granted, asked)
        assert not t.allows("bob", asked, resource, name)               # another principal
        other = [r for r in RESOURCES if r != resource][0]
        assert not t.allows("alice", asked, other, name)                # another resource type
        if resource != "cluster":
            assert not t.allows("alice", asked, resource, "orders2")    # literal: not a prefix


@pytest.mark.parametrize("denied", OPERATIONS)
def test_deny_wins_matrix(denied):
    t = AclTable([rule(ops=["all"]), rule(permission="deny", ops=[denied])])
    for asked in OPS:
        # a deny covers only its own operations (and all): a deny of read does not deny describe
        assert t.allows("alice", asked, "topic", "orders") == (denied != "all" and asked != denied), (denied, asked)


def test_default_deny_and_superusers():
    t = AclTable()
    for asked in OPS:
        for resource in RESOURCES:
            assert not t.allows("alice", asked, resource, "x")
            assert t.allows("root", asked, resource, "x", superusers={"root"})
    denied = AclTable([rule(principal="*", permission="deny", ops=["all"], name="*")])
    assert denied.allows("root", "write", "topic", "orders", superusers={"root"})   # superusers bypass rows
    assert not denied.allows("alice", "write", "topic", "orders")


def test_patterns_and_wildcards():
    t = AclTable([rule(ops=["write"], name="orders.", pattern="prefixed"),
                  rule(principal="*", ops=["read"], name="public"),
                  rule(principal="bob", ops=["read"], name="*")])
    assert t.allows("alice", "write", "topic", "orders.eu")
    assert t.allows("alice", "write", "topic", "orders.")
    assert not t.allows("alice", "write", "topic", "orders")          # shorter than the prefix
    assert not t.allows("alice", "write", "topic", "xorders.eu")
    assert t.allows("alice", "read", "topic", "public") and t.allows("carol", "read", "topic", "public")
    assert not t.allows("carol", "read", "topic", "public2")
    assert t.allows("bob", "read", "topic", "anything") and not t.allows("bob", "write", "topic", "anything")
    # a prefixed deny for everyone beats a literal allow for one
    t2 = AclTable([rule(ops=["read"], name="secret.x"),
                   rule(principal="*", permission="deny", ops=["read"], name="secret.", pattern="prefixed")])
    assert not t2.allows("alice", "read", "topic", "secret.x")
    assert t2.allows("alice", "describe", "topic", "secret.x")        # read implies describe; deny read does not
    allowed, by = t2.decide("alice", "read", "topic", "secret.x")
    assert not allowed and by is not None and by.permission == "deny"


def test_groups_are_not_topics():
    t = AclTable([rule(ops=["read"], resource="group", name="billing")])
    assert t.allows("alice", "read", "group", "billing")
    assert not t.allows("alice", "read", "topic", "billing")


def test_rule_validation_and_ids():
    r = rule(ops=["write", "read", "read"])
    assert r.operations == ("read", "write")                         # canonical order, distinct
    assert r.id == rule(ops=["write", "read"]).id == acl_id("alice", "allow", ["write", "read"], "topic", "orders", "literal")
    assert len(r.id) == 16 and int(r.id, 16) >= 0
    assert rule(permission="deny").id != rule().id
    assert AclRule.from_register(r.to_register()) == r
    assert AclTable([r, rule(ops=["read", "write"])]).rules.keys() == {r.id}   # one row
    for bad in [dict(principal="a b"), dict(permission="maybe"), dict(ops=[]), dict(ops=["fly"]),
                dict(resource="table"), dict(name=""), dict(name="x" * 250), dict(pattern="regex"),
                dict(resource="cluster", name="other"), dict(resource="cluster", name="cluster", pattern="prefixed")]:
        with pytest.raises(ValueError):
            rule(**bad)
    assert rule(principal="*").principal == "*"
    assert rule(resource="cluster", name="cluster").name == "cluster"
    assert parse_operations("Write, read") == ("read", "write")
    with pytest.raises(ValueError):
        check_user_name("x" * 65)
    for value in [None, [], {"principal": "a"}, {**r.to_register(), "operations": "read"},
                  {**r.to_register(), "operations": [["read"]]}]:
        with pytest.raises((ValueError, KeyError, TypeError)):
            AclRule.from_register(value)


def test_from_registers_skips_malformed_and_select():
    good = rule()
    table, bad = AclTable.from_registers({"acl/" + good.id: good.to_register(), "acl/0000000000000000": {"x": 1},
                                          "acl/1111111111111111": "junk",
                                          "acl/2222222222222222": good.to_register()})   # not its id
    assert list(table.rules) == [good.id]
    assert sorted(bad) == ["acl/0000000000000000", "acl/1111111111111111", "acl/2222222222222222"]
    t = AclTable([rule(), rule(principal="bob"), rule(ops=["write"], resource="group", name="g")])
    assert [r.principal for r in t.select(principal="bob")] == ["bob"]
    assert len(t.select(resource="topic")) == 2
    assert len(t.select(operations=["write"])) == 1
    assert t.select(name="nothing") == []


# -- the indexed table agrees with a brute-force reference --------------------------------
NAMES = ["a", "ab", "abc", "b", "*"]
PRINCIPALS = ["alice", "bob", "*"]

rules_st = st.builds(
    lambda p, perm, ops, res, name, pat: AclRule(p, perm, tuple(ops), res,
                                                 "cluster" if res == "cluster" else name,
                                                 "literal" if res == "cluster" else pat),
    st.sampled_from(PRINCIPALS), st.sampled_from(["allow", "deny"]),
    st.lists(st.sampled_from(OPERATIONS), min_size=1, max_size=3, unique=True),
    st.sampled_from(RESOURCES), st.sampled_from(NAMES), st.sampled_from(["literal", "prefixed"]))


def reference(rules, principal, op, resource, name) -> bool:
    def matches(r):
        if r.principal not in (principal, "*") or r.resource != resource:
            return False
        if r.pattern == "prefixed":
            if not name.startswith(r.name):
                return False
        elif r.name not in ("*", name):
            return False
        return True
    matching = [r for r in rules if matches(r)]
    if any(r.permission == "deny" and ("all" in r.operations or op in r.operations) for r in matching):
        return False
    return any(r.permission == "allow" and any(expected_allow(g, op) for g in r.operations) for r in matching)


@settings(max_examples=300, deadline=None)
@given(st.lists(rules_st, max_size=8), st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(OPS),
       st.sampled_from(RESOURCES), st.sampled_from(["a", "ab", "abc", "b", "c"]))
def test_table_matches_reference(rules, principal, op, resource, name):
    name = "cluster" if resource == "cluster" else name
    assert AclTable(rules).allows(principal, op, resource, name) == reference(rules, principal, op, resource, name)
