"""User and ACL admin handlers (mesh/node/requests/security_handlers.py) over a real gossip core:
registers written, persisted before the answer, replicated to a second core, and fed to
the registry and the authorizer by SecuritySync."""
from __future__ import annotations

import random

import pytest

from mesh.cluster import keys
from mesh.gossip import Gossip, GossipConfig
from mesh.node.requests.security_handlers import SecurityHandlers, SecuritySync
from mesh.security.authorizer import Authorizer
from mesh.security.registry import Registry
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError

KEY_A = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
KEY_B = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
KEY_ROOT = "HH{M:(SbA!]Dk1bT&E5<^O*)n>S[5Tn(tP-=tr7H"


class Shell:
    """The parts of the node the handlers use: a gossip core, a turn commit, a persist step."""

    def __init__(self, registry=None):
        self.gossip = Gossip("n1", "addr-n1", 1, [], random.Random(1), GossipConfig(), 1_000)
        self.events: list[str] = []
        self.replies: list = []
        self.persist_ok = True
        self.h = SecurityHandlers(gossip=self.gossip, commit_turn=lambda: self.events.append("commit_turn"),
                                  apply_cluster_change=self.apply, reply=self.reply, registry=registry)

    def apply(self) -> bool:
        self.events.append("persist")
        return self.persist_ok

    def reply(self, ident, rid, msg, payload=None):
        self.events.append("reply")
        self.replies.append(msg)

    def call(self, msg):
        self.h.table()[type(msg)](b"c", 1, msg, None)
        return self.replies[-1]

    def fails(self, msg) -> str:
        with pytest.raises(MeshError) as e:
            self.call(msg)
        assert e.value.code == ErrorCode.INVALID_REQUEST
        return e.value.message


def test_users_are_registers_persisted_before_the_answer():
    s = Shell()
    assert s.call(m.AddUserRequest("alice", KEY_A)) == m.AddUserResponse(0)
    assert s.events == ["commit_turn", "persist", "reply"]
    assert s.gossip.cluster_items(keys.USER_PREFIX) == {"user/alice": {"name": "alice", "public_key": KEY_A}}
    s.events.clear()
    assert s.call(m.AddUserRequest("alice", KEY_A)) == m.AddUserResponse(0)    # idempotent: no write
    assert s.events == ["reply"]
    assert "exists with another key" in s.fails(m.AddUserRequest("alice", KEY_B))
    assert "already the key of user alice" in s.fails(m.AddUserRequest("bob", KEY_A))
    assert "reserved" in s.fails(m.AddUserRequest("broker", KEY_B))
    assert "user name" in s.fails(m.AddUserRequest("a/b", KEY_B))
    assert "public key" in s.fails(m.AddUserRequest("bob", "x" * 39))
    assert s.call(m.ListUsersRequest()).users == [{"name": "alice", "public_key": KEY_A}]
    assert s.call(m.RemoveUserRequest("alice")) == m.RemoveUserResponse(0)
    assert s.gossip.cluster_items(keys.USER_PREFIX) == {}
    assert "no user named" in s.fails(m.RemoveUserRequest("alice"))


def test_static_names_are_refused_and_listed():
    s = Shell(Registry({"root": KEY_ROOT}))
    assert "reserved" in s.fails(m.AddUserRequest("root", KEY_B))
    assert "(static)" in s.fails(m.AddUserRequest("bob", KEY_ROOT))
    assert s.call(m.ListUsersRequest()).users == [{"name": "root", "public_key": KEY_ROOT, "static": True}]


def test_storage_failure_is_not_acknowledged():
    s = Shell()
    s.persist_ok = False
    with pytest.raises(MeshError) as e:
        s.call(m.AddAclRequest("alice", "allow", ["read"], "topic", "t"))
    assert e.value.code == ErrorCode.STORAGE_ERROR and s.replies == []


def test_acls_add_list_remove():
    s = Shell()
    r1 = s.call(m.AddAclRequest("alice", "allow", ["write", "describe"], "topic", "orders"))
    assert len(r1.id) == 16
    s.events.clear()
    assert s.call(m.AddAclRequest("alice", "allow", ["describe", "write"], "topic", "orders")).id == r1.id
    assert s.events == ["reply"]                                                  # the same row: no write
    r2 = s.call(m.AddAclRequest("bob", "deny", ["read"], "group", "billing", "literal"))
    r3 = s.call(m.AddAclRequest("*", "allow", ["read"], "topic", "pub.", "prefixed"))
    assert s.gossip.cluster_items(keys.ACL_PREFIX)[keys.acl_key(r1.id)] == {
        "principal": "alice", "permission": "allow", "operations": ["write", "describe"],
        "resource": "topic", "name": "orders", "pattern": "literal"}
    assert [a["id"] for a in s.call(m.ListAclsRequest()).acls] == sorted([r1.id, r2.id, r3.id])
    assert [a["principal"] for a in s.call(m.ListAclsRequest(principal="bob")).acls] == ["bob"]
    assert [a["id"] for a in s.call(m.ListAclsRequest(resource="topic")).acls] == sorted([r1.id, r3.id])
    assert "bad ACL" in s.fails(m.AddAclRequest("alice", "allow", ["fly"], "topic", "t"))
    assert "bad ACL" in s.fails(m.AddAclRequest("alice", "allow", ["read"], "cluster", "t"))
    assert "at least one field" in s.fails(m.RemoveAclRequest())
    assert s.call(m.RemoveAclRequest("0123456789abcdef")).removed == []
    assert [a["id"] for a in s.call(m.RemoveAclRequest(principal="*")).removed] == [r3.id]
    assert [a["id"] for a in s.call(m.RemoveAclRequest(r1.id)).removed] == [r1.id]
    assert [a["id"] for a in s.call(m.ListAclsRequest()).acls] == [r2.id]


def test_changes_reach_another_broker_and_its_authorizer():
    """Two gossip cores exchange rounds; the second's SecuritySync feeds its authorizer."""
    cfg = GossipConfig()
    a = Shell()
    b_gossip = Gossip("n2", "addr-n2", 1, ["addr-n1"], random.Random(2), cfg, 1_000)
    reg = Registry()
    auth = Authorizer(reg, set(), topic_names=lambda: ["orders"])
    sync = SecuritySync(b_gossip, reg, auth)
    nodes = {"addr-n1": a.gossip, "addr-n2": b_gossip}

    def rounds(n=10):
        now = 1_000
        for _ in range(n):
            now += cfg.interval_ms
            queue = [("addr-n1", e) for e in a.gossip.tick(now)] + [("addr-n2", e) for e in b_gossip.tick(now)]
            while queue:
                src, e = queue.pop(0)
                queue += [(e.dest, x) for x in nodes[e.dest].receive(src, e.msg, now)]

    a.call(m.AddUserRequest("alice", KEY_A))
    acl = a.call(m.AddAclRequest("alice", "allow", ["write"], "topic", "orders"))
    produce = m.ProduceRequest("orders", 0, -1)
    rounds()
    assert sync.refresh() and not sync.refresh()           # changed once, then nothing new
    assert reg.principal_for_key(KEY_A) == "alice"
    assert auth.authorize("alice", produce) is produce
    a.call(m.RemoveAclRequest(acl.id))
    rounds()
    sync.refresh()
    with pytest.raises(MeshError, match="alice may not write topic orders"):
        auth.authorize("alice", produce)
    a.call(m.AddAclRequest("alice", "allow", ["write"], "topic", "orders"))
    a.call(m.RemoveUserRequest("alice"))
    rounds()
    sync.refresh()
    with pytest.raises(MeshError, match="alice is not a user"):
        auth.authorize("alice", produce)


def test_adding_many_acls_costs_linear_work(monkeypatch):
    """Issue 39 finding 10: adding 2,000 ACL rows took 535 s: every add parsed the whole
    table, and so did every refresh (the loop calls it whenever gossip moved). Rows parsed
    while adding n rows one by one, with a refresh after each and idle refreshes between,
    must grow linearly."""
    from mesh.security.acl import AclRule
    parsed = [0]
    real = AclRule.from_register.__func__

    def counting(cls, value):
        parsed[0] += 1
        return real(cls, value)

    monkeypatch.setattr(AclRule, "from_register", classmethod(counting))

    def parses(n: int) -> int:
        s = Shell()
        reg = Registry()
        sync = SecuritySync(s.gossip, reg, Authorizer(reg, set()))
        parsed[0] = 0
        for i in range(n):
            s.call(m.AddAclRequest("alice", "allow", ["read"], "topic", f"t{i}"))
            sync.refresh()
            for _ in range(5):
                assert not sync.refresh()   # nothing changed: nothing read
        assert len(sync.authorizer.table) == n
        return parsed[0]

    assert parses(200) <= 2 * 200 + 10, parses(200)
