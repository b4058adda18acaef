"""The Kafka listener's authorizer and security view (mesh/kafka/authorizer.py), and the node
side they read (KAFKA_SECURITY, users with Kafka credentials in mesh/node/requests/security_handlers.py):
the Kafka operations on the mesh's ACLs (allowed, denied, deny wins, prefixes, implied
describe, IDEMPOTENT_WRITE), superusers, removed users, refresh, brokers-only."""
from __future__ import annotations

import pytest

from mesh.kafka.authorizer import KafkaAuthorizer, SecurityView, denied_error
from mesh.security.scram import credentials_to_register, make_credentials
from mesh.security.acl import AclRule
from mesh.security.authorizer import Authorizer
from mesh.security.registry import Registry
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from tests.unit.test_acl_handlers import KEY_A, KEY_B, KEY_ROOT, Shell

SCRAM = credentials_to_register(make_credentials("pw", iterations=4096))


def rule(principal, permission, ops, resource, name, pattern="literal"):
    return AclRule(principal, permission, tuple(ops.split(",")), resource, name, pattern)


def view(rules=(), users=("alice", "bob", "root"), supers=("root",), version="v1") -> SecurityView:
    v = SecurityView()
    v.apply(m.KafkaSecurityResponse(0, version=version, users={u: SCRAM for u in users},
                                    acls={"acl/" + r.id: r.to_register() for r in rules},
                                    superusers=list(supers)))
    return v


def test_open_listener_allows_everything_and_unknown_principals_nothing():
    a = KafkaAuthorizer(SecurityView())          # no view yet: fail closed for principals
    assert a.allowed(None, "WRITE", "TOPIC", "t") and a.allowed(None, "CLUSTER_ACTION", "CLUSTER", "kafka-cluster")
    assert not a.allowed("alice", "READ", "TOPIC", "t")
    a = KafkaAuthorizer(view([rule("*", "allow", "all", "topic", "*")]))
    assert a.allowed("alice", "READ", "TOPIC", "t")
    assert not a.allowed("mallory", "READ", "TOPIC", "t")     # no Kafka credentials: not a Kafka user


def test_allowed_and_denied_per_acl():
    a = KafkaAuthorizer(view([rule("alice", "allow", "read", "topic", "orders"),
                              rule("alice", "allow", "write", "topic", "logs.", "prefixed"),
                              rule("alice", "allow", "read", "group", "g1"),
                              rule("bob", "allow", "create", "cluster", "cluster")]))
    assert a.allowed("alice", "READ", "TOPIC", "orders")
    assert a.allowed("alice", "read", "topic", "orders")                   # case does not matter
    assert not a.allowed("alice", "WRITE", "TOPIC", "orders")
    assert not a.allowed("alice", "READ", "TOPIC", "payments")
    assert a.allowed("alice", "DESCRIBE", "TOPIC", "orders")               # implied by read
    assert a.allowed("alice", "DESCRIBE_CONFIGS", "TOPIC", "orders")
    assert not a.allowed("alice", "ALTER_CONFIGS", "TOPIC", "orders")
    assert a.allowed("alice", "WRITE", "TOPIC", "logs.eu") and not a.allowed("alice", "WRITE", "TOPIC", "logs")
    assert a.allowed("alice", "READ", "GROUP", "g1") and not a.allowed("alice", "READ", "GROUP", "g2")
    assert not a.allowed("bob", "READ", "TOPIC", "orders")
    assert a.allowed("bob", "CREATE", "CLUSTER", "kafka-cluster")          # Kafka's cluster name
    assert not a.allowed("alice", "CREATE", "CLUSTER", "kafka-cluster")
    assert a.allowed("bob", "CREATE", "TOPIC", "anything") and not a.allowed("alice", "CREATE", "TOPIC", "orders")
    for op, rt in (("CLUSTER_ACTION", "CLUSTER"), ("WRITE", "TRANSACTIONAL_ID"), ("READ", "USER"),
                   ("FLY", "TOPIC"), ("READ", "BOGUS")):
        assert not a.allowed("alice", op, rt, "orders")
    assert a.refused > 0


def test_deny_wins_and_prefixed_patterns():
    a = KafkaAuthorizer(view([rule("alice", "allow", "all", "topic", "*"),
                              rule("alice", "deny", "write", "topic", "audit.", "prefixed"),
                              rule("*", "deny", "read", "topic", "secret")]))
    assert a.allowed("alice", "WRITE", "TOPIC", "orders")
    assert not a.allowed("alice", "WRITE", "TOPIC", "audit.log")
    assert a.allowed("alice", "READ", "TOPIC", "audit.log")
    assert not a.allowed("alice", "READ", "TOPIC", "secret")
    assert a.allowed("alice", "DESCRIBE", "TOPIC", "secret")   # a deny of read does not deny describe


def test_idempotent_write_as_kafka_3():
    assert KafkaAuthorizer(view([rule("alice", "allow", "write", "topic", "orders")])).allowed(
        "alice", "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
    assert KafkaAuthorizer(view([rule("alice", "allow", "write", "topic", "o", "prefixed")])).allowed(
        "alice", "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
    assert KafkaAuthorizer(view([rule("alice", "allow", "write", "cluster", "cluster")])).allowed(
        "alice", "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
    for rules in ([rule("alice", "allow", "read", "topic", "orders")],
                  [rule("alice", "allow", "write", "topic", "orders"), rule("alice", "deny", "write", "topic", "orders")],
                  [rule("alice", "allow", "write", "topic", "o", "prefixed"), rule("*", "deny", "all", "topic", "*")],
                  [rule("alice", "allow", "write", "topic", "or", "prefixed"),
                   rule("alice", "deny", "write", "topic", "o", "prefixed")],
                  [rule("bob", "allow", "write", "topic", "orders")]):
        assert not KafkaAuthorizer(view(rules)).allowed("alice", "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
    a = KafkaAuthorizer(view([rule("alice", "allow", "write", "topic", "orders")]))
    assert not a.allowed("alice", "IDEMPOTENT_WRITE", "TOPIC", "orders")


def test_superusers_and_a_removed_user():
    v = view([rule("alice", "allow", "read", "topic", "orders")])
    a = KafkaAuthorizer(v)
    assert a.allowed("root", "ALTER", "CLUSTER", "kafka-cluster") and a.allowed("root", "CLUSTER_ACTION", "CLUSTER", "x")
    assert a.allowed("alice", "READ", "TOPIC", "orders")
    # alice removed (and her ACL stays, as Kafka does): refused at once, even with a cached decision
    v.apply(m.KafkaSecurityResponse(0, version="v2", users={"root": SCRAM, "bob": SCRAM},
                                    acls={"acl/" + r.id: r.to_register()
                                          for r in [rule("alice", "allow", "read", "topic", "orders")]},
                                    superusers=["root"]))
    assert not a.allowed("alice", "READ", "TOPIC", "orders")
    assert v.lookup("alice", "SCRAM-SHA-256") is None and v.lookup("bob", "SCRAM-SHA-512") is not None


def test_denied_error_codes():
    assert (denied_error("TOPIC"), denied_error("GROUP"), denied_error("CLUSTER"), denied_error("USER")) == (29, 30, 31, 31)


class FakeNode:
    """``fetch(since)`` as the node answers it (mesh.node.requests.security_handlers), over a Shell."""

    def __init__(self):
        self.shell = Shell()
        self.fail = False
        self.calls = []

    def __call__(self, since):
        self.calls.append(since)
        if self.fail:
            raise MeshError(ErrorCode.TIMEOUT, "no answer")
        return self.shell.call(m.KafkaSecurityRequest(since))


def test_the_view_polls_the_node_cheaply_and_keeps_the_last_view_on_failure():
    node = FakeNode()
    node.shell.h.superusers = frozenset({"root"})
    v = SecurityView(node)
    a = KafkaAuthorizer(v)
    assert v.poll() and v.ready.is_set()                     # empty, but a view
    node.shell.call(m.AddUserRequest("alice", KEY_A, SCRAM))
    node.shell.call(m.AddUserRequest("bob", KEY_B))          # no Kafka password: not in the view
    node.shell.call(m.AddAclRequest("alice", "allow", ["read"], "topic", "orders"))
    assert v.poll() and set(v.state.credentials) == {"alice"} and v.state.superusers == {"root"}
    assert a.allowed("alice", "READ", "TOPIC", "orders")
    first = v.state
    assert not v.poll() and v.state is first                  # nothing new: the same view
    resp = node.shell.call(m.KafkaSecurityRequest(v.state.version))
    assert resp.users is None and resp.acls is None           # ... and the answer carried nothing
    node.shell.call(m.RemoveAclRequest(principal="alice"))
    assert v.poll() and not a.allowed("alice", "READ", "TOPIC", "orders")
    node.fail = True
    assert not v.poll() and v.failures == 1 and set(v.state.credentials) == {"alice"}
    node.fail = False
    node.shell.call(m.RemoveUserRequest("alice"))
    assert v.poll() and v.state.credentials == {}


def test_the_poller_thread_refreshes_and_stops():
    node = FakeNode()
    v = SecurityView(node, refresh_s=0.01).start()
    try:
        assert v.ready.wait(10)
        node.shell.call(m.AddUserRequest("alice", KEY_A, SCRAM))
        deadline = __import__("time").monotonic() + 10
        while v.lookup("alice", "SCRAM-SHA-256") is None and __import__("time").monotonic() < deadline:
            v._stop.wait(0.01)
        assert v.lookup("alice", "SCRAM-SHA-256") is not None
    finally:
        v.stop()
    assert not v._thread.is_alive()


def test_a_miss_asks_for_a_poll_at_once_so_a_password_or_acl_just_set_works_for_the_next_request():
    node = FakeNode()
    v = SecurityView(node, refresh_s=3600).start()   # the periodic poll never comes again
    a = KafkaAuthorizer(v)
    try:
        assert v.ready.wait(10)
        node.shell.call(m.AddUserRequest("alice", KEY_A, SCRAM))   # set just now
        assert v.lookup("alice", "SCRAM-SHA-256") is not None and v.asked == 1
        assert v.lookup("mallory", "SCRAM-SHA-256") is None and v.asked == 2
        assert v.lookup("mallory", "SCRAM-SHA-256") is None and v.asked == 2   # once per miss and view
        node.shell.call(m.AddAclRequest("alice", "allow", ["read"], "topic", "orders"))
        assert a.allowed("alice", "READ", "TOPIC", "orders") and v.asked == 3
        # denials wait once per principal and view: 500 denied topics (one Metadata request) cost one poll
        assert not any(a.allowed("alice", "WRITE", "TOPIC", f"t{i}") for i in range(500)) and v.asked == 4
        node.shell.call(m.AddAclRequest("bob", "allow", ["read"], "topic", "bills"))
        assert v.lookup("carol", "SCRAM-SHA-256") is None and v.asked == 5   # (its poll brings a new view)
        assert not a.allowed("alice", "WRITE", "TOPIC", "orders") and v.asked == 6   # a new view: once again
        assert not a.allowed("alice", "WRITE", "TOPIC", "other") and v.asked == 6
        polls = v.polls
        for i in range(50):   # a client spraying names costs one poll each at most, rate-limited
            assert v.lookup(f"u{i}", "SCRAM-SHA-256") is None
        assert v.polls - polls <= 50
    finally:
        v.stop()
    assert v.lookup("nobody", "SCRAM-SHA-256") is None and v.asked == 56   # stopped: no wait


def test_users_carry_kafka_credentials_without_a_password():
    s = Shell()
    assert s.call(m.AddUserRequest("alice", KEY_A, SCRAM)) == m.AddUserResponse(0)
    stored = s.gossip.cluster_items("user/")["user/alice"]
    assert stored == {"name": "alice", "public_key": KEY_A, "scram": SCRAM}
    assert s.call(m.ListUsersRequest()).users == [{"name": "alice", "public_key": KEY_A,
                                                   "kafka": ["SCRAM-SHA-256", "SCRAM-SHA-512"]}]
    s.events.clear()
    assert s.call(m.AddUserRequest("alice", KEY_A)) == m.AddUserResponse(0)   # keeps its password
    assert s.events == ["reply"] and s.gossip.cluster_items("user/")["user/alice"]["scram"] == SCRAM
    new = credentials_to_register(make_credentials("new", iterations=4096))
    assert s.call(m.AddUserRequest("alice", KEY_A, new)) == m.AddUserResponse(0)   # a new password
    assert s.events[-3:] == ["commit_turn", "persist", "reply"]
    assert s.gossip.cluster_items("user/")["user/alice"]["scram"] == new
    bad = {"SCRAM-SHA-256": {**SCRAM["SCRAM-SHA-256"], "iterations": 1}}
    assert "bad Kafka credentials" in s.fails(m.AddUserRequest("alice", KEY_A, bad))
    assert "bad Kafka credentials" in s.fails(m.AddUserRequest("carol", KEY_B, {"x": 1}))
    assert "user/carol" not in s.gossip.cluster_items("user/")


def test_the_kafka_security_request_is_for_brokers_only():
    reg = Registry({"root": KEY_ROOT})
    reg.update({"user/alice": {"name": "alice", "public_key": KEY_A, "scram": SCRAM}})
    a = Authorizer(reg, {"root"})
    a.update_acls({"acl/" + r.id: r.to_register() for r in [rule("alice", "allow", "all", "cluster", "cluster")]})
    for who in ("root", "alice"):     # a superuser too: the answer carries SCRAM keys
        with pytest.raises(MeshError) as e:
            a.authorize(who, m.KafkaSecurityRequest())
        assert e.value.code == ErrorCode.UNAUTHORIZED and "only brokers" in e.value.message
    assert reg.knows("alice")         # the registry reads users with Kafka credentials as before
