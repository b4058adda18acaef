"""The authorizer (mesh/security/authorizer.py) and the user registry (registry.py): every
client request type is in the table, what each needs, metadata narrowing, removed users."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mesh.groups import messages as g
from mesh.node.requests.handlers import ClientHandlers
from mesh.security.acl import AclRule
from mesh.security.authorizer import REQUIREMENTS, Authorizer, requirements
from mesh.security.registry import Registry, check_public_key
from mesh.wire import messages as m
from mesh.wire.codec import REGISTRY
from mesh.wire.errors import ErrorCode, MeshError

KEY_A = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
KEY_B = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
KEY_ROOT = "HH{M:(SbA!]Dk1bT&E5<^O*)n>S[5Tn(tP-=tr7H"


def client_request_types() -> set[type]:
    """Every request a client can send: the client and group messages that are not answers
    (the groups' peer messages, GROUP_PEER_MESSAGES, travel between brokers only)."""
    out = set()
    for cls in REGISTRY.values():
        if cls.__module__ in ("mesh.wire.messages", "mesh.groups.messages") \
                and not cls.__name__.endswith("Response") and cls not in g.GROUP_PEER_MESSAGES:
            out.add(cls)
    return out


def test_every_client_request_type_is_in_the_table():
    types = client_request_types()
    assert m.ProduceRequest in types and g.GroupCommit in types and m.AddAclRequest in types
    assert types <= set(REQUIREMENTS), sorted(t.__name__ for t in types - set(REQUIREMENTS))
    assert set(g.GROUP_REQUESTS) <= set(REQUIREMENTS)
    # and everything the node's handler table answers
    data = SimpleNamespace(on_produce=None, on_fetch=None, commit_turn=lambda: True)
    handlers = ClientHandlers(node_id="n1", gossip=None, catalog=None, directory=None, store=None, replicas=None,
                              data=data, peers=None, reply=None, clock=None, apply_cluster_change=lambda: True)
    assert set(handlers._table) <= set(REQUIREMENTS)


def make(acls=(), superusers=("root",), topics=("orders", "orders.eu", "payments")) -> Authorizer:
    reg = Registry({"root": KEY_ROOT})
    reg.update({"user/alice": {"name": "alice", "public_key": KEY_A},
                "user/bob": {"name": "bob", "public_key": KEY_B}})
    a = Authorizer(reg, set(superusers), topic_names=lambda: list(topics))
    a.update_acls({"acl/" + r.id: r.to_register() for r in acls})
    return a


def allow(ops, resource, name, principal="alice", pattern="literal", permission="allow"):
    return AclRule(principal, permission, tuple(ops.split(",")), resource, name, pattern)


def refused(a, principal, msg) -> str:
    with pytest.raises(MeshError) as e:
        a.authorize(principal, msg)
    assert e.value.code == ErrorCode.UNAUTHORIZED and not e.value.retriable
    return e.value.message


def test_requirements_of_each_request():
    assert requirements(m.ProduceRequest("t", 0, -1)) == [(("write", "topic", "t"),)]
    assert requirements(m.FetchRequest([["a", 0, 0, 1], ["b", 1, 0, 1], ["a", 1, 0, 1]])) == \
        [(("read", "topic", "a"),), (("read", "topic", "b"),)]
    assert requirements(m.ListOffsetsRequest([["a", 0, -1]])) == [(("describe", "topic", "a"),)]
    assert requirements(m.CreateTopicRequest("t")) == [(("create", "topic", "t"), ("create", "cluster", "cluster"))]
    assert requirements(m.DeleteTopicRequest("t")) == [(("delete", "topic", "t"),)]
    assert requirements(g.GroupCommit("grp", "", -1, [["t", 0, 5, ""]])) == \
        [(("read", "group", "grp"),), (("read", "topic", "t"),)]
    assert requirements(g.GroupResetOffsets("grp", [["t", 0, 5]]))[0] == (("read", "group", "grp"),)
    assert requirements(g.GroupHeartbeat("grp", "", 0, ["t"], [])) == \
        [(("read", "group", "grp"),), (("describe", "topic", "t"),)]
    assert requirements(g.GroupFetchOffsets("grp", None)) == [(("describe", "group", "grp"),)]
    assert requirements(g.GroupList()) == [(("describe", "cluster", "cluster"),)]
    assert requirements(m.AddAclRequest("a", "allow", ["read"], "topic", "t")) == [(("alter", "cluster", "cluster"),)]
    assert requirements(m.ListUsersRequest()) == [(("describe", "cluster", "cluster"),)]
    with pytest.raises(MeshError) as e:
        requirements(m.MetadataRequest([["not", "a name"]]))
    assert e.value.code == ErrorCode.INVALID_REQUEST


def test_allow_and_deny_end_to_end_in_the_authorizer():
    a = make([allow("write", "topic", "orders"), allow("read", "group", "billing"),
              allow("read", "topic", "orders.", pattern="prefixed"),
              allow("read", "topic", "orders.eu", permission="deny")])
    produce = m.ProduceRequest("orders", 0, -1)
    assert a.authorize("alice", produce) is produce
    assert refused(a, "alice", m.ProduceRequest("payments", 0, -1)) == "alice may not write topic payments"
    assert refused(a, "bob", produce) == "bob may not write topic orders"
    assert refused(a, "alice", m.FetchRequest([["orders.eu", 0, 0, 1]])) == "alice may not read topic orders.eu"
    assert a.authorize("alice", m.FetchRequest([["orders.us", 0, 0, 1]]))
    assert refused(a, "alice", m.FetchRequest([["orders.us", 0, 0, 1], ["orders", 0, 0, 1]])) \
        == "alice may not read topic orders"
    assert a.authorize("alice", g.GroupCommit("billing", "", -1, [["orders.us", 0, 1, ""]]))
    assert refused(a, "alice", g.GroupCommit("other", "", -1, [["orders.us", 0, 1, ""]])) == "alice may not read group other"
    assert refused(a, "alice", m.DeleteTopicRequest("orders")) == "alice may not delete topic orders"
    assert refused(a, "alice", m.CreateTopicRequest("new")) == "alice may not create topic new"
    assert refused(a, "alice", m.AddUserRequest("eve", KEY_A)) == "alice may not alter cluster"
    assert refused(a, "alice", g.GroupList()) == "alice may not describe cluster"
    # create: on the topic name or on the cluster
    assert make([allow("create", "cluster", "cluster")]).authorize("alice", m.CreateTopicRequest("x"))
    assert make([allow("create", "topic", "x")]).authorize("alice", m.CreateTopicRequest("x"))
    # superusers pass everything; the broker principal and strangers are not users
    assert a.authorize("root", m.DeleteTopicRequest("orders"))
    assert "not a user" in refused(a, "mallory", m.MetadataRequest([]))
    assert "not a user" in refused(a, "broker", m.MetadataRequest([]))


def test_unknown_request_type_is_refused():
    a = make()
    assert refused(a, "root", m.ErrorResponse(0, "")) == "root may not send ErrorResponse"
    assert refused(a, "root", g.GroupHeartbeatResponse(0)) == "root may not send GroupHeartbeatResponse"


def test_metadata_narrowing():
    a = make([allow("write", "topic", "orders"), allow("describe", "topic", "pay", pattern="prefixed")])
    assert a.authorize("alice", m.MetadataRequest(None)) == m.MetadataRequest(["orders", "payments"])
    assert a.authorize("bob", m.MetadataRequest(None)) == m.MetadataRequest([])
    assert a.authorize("bob", m.MetadataRequest([])) == m.MetadataRequest([])          # brokers only
    assert a.authorize("root", m.MetadataRequest(None)) == m.MetadataRequest(None)     # superuser: all
    assert a.authorize("alice", m.MetadataRequest(["orders"])) == m.MetadataRequest(["orders"])
    assert refused(a, "alice", m.MetadataRequest(["orders", "orders.eu"])) == "alice may not describe topic orders.eu"


def test_removed_user_loses_access_at_once():
    a = make([allow("all", "topic", "*")])
    msg = m.ProduceRequest("orders", 0, 1)
    assert a.authorize("alice", msg) is msg
    a.registry.update({"user/bob": {"name": "bob", "public_key": KEY_B}})
    assert "alice is not a user" in refused(a, "alice", msg)
    assert a.registry.principal_for_key(KEY_A) is None
    # a superuser named by --superuser who is a gossip user loses access with the user too
    b = make(superusers=("root", "alice"))
    assert b.authorize("alice", m.DeleteTopicRequest("x"))
    b.registry.update({})
    assert "not a user" in refused(b, "alice", m.DeleteTopicRequest("x"))
    assert b.authorize("root", m.DeleteTopicRequest("x"))                     # static: never removed


def test_acl_change_takes_effect_on_update():
    a = make()
    msg = m.ProduceRequest("orders", 0, 1)
    refused(a, "alice", msg)
    r = allow("write", "topic", "orders")
    a.update_acls({"acl/" + r.id: r.to_register(), "acl/ffffffffffffffff": {"bad": True}})
    assert a.authorize("alice", msg) is msg and a.skipped == ["acl/ffffffffffffffff"]
    a.update_acls({})
    refused(a, "alice", msg)


def test_registry():
    reg = Registry({"root": KEY_ROOT})
    assert reg.principal_for_key(KEY_ROOT) == "root" and reg.knows("root")
    reg.update({"user/bob": {"name": "bob", "public_key": KEY_A},
                "user/alice": {"name": "alice", "public_key": KEY_A},        # same key: smaller name wins
                "user/root": {"name": "root", "public_key": KEY_B},          # static name: ignored
                "user/evil": {"name": "evil", "public_key": KEY_ROOT},       # static key: static wins
                "user/broker": {"name": "broker", "public_key": KEY_B},      # reserved
                "user/x": {"name": "x y", "public_key": KEY_B}, "user/y": "junk"})
    assert reg.principal_for_key(KEY_A) == "alice" and reg.knows("alice") and not reg.knows("bob")
    assert reg.principal_for_key(KEY_ROOT) == "root" and not reg.knows("evil")
    assert reg.principal_for_key(KEY_B) is None and not reg.knows("broker")
    assert reg.skipped == 2 and reg.names() == ["alice", "bob", "evil", "root"]
    for bad in ["short", KEY_A[:-1] + "~", None, 42]:
        with pytest.raises(ValueError):
            check_public_key(bad)
    with pytest.raises(ValueError):
        Registry({"root": "nope"})
