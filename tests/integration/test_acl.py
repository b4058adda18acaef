"""Users and ACLs against real brokers: the registers replicate cluster-wide by gossip and
survive a restart (open brokers on loopback); the CLI. The end-to-end allow/deny matrix on
a secured cluster is in the second half (brokers started with --secrets)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from mesh.client import Admin, Consumer, Producer, TopicPartition
from mesh.client.transport import Transport
from mesh.groups import messages as g
from mesh.security.creds import Creds, init_secrets, new_keypair
from mesh.testing.launcher import Cluster, wait_until
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from tools.cli import main as cli

pytestmark = pytest.mark.integration

KEY_A = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def ask_each(brokers, msg) -> list:
    """``msg``'s answer from every broker itself (not the first responder)."""
    t = Transport()
    try:
        return [t.call(b.address, msg, timeout_ms=2000)[0] for b in brokers]
    finally:
        t.close()


def test_users_and_acls_replicate_and_survive_a_restart(cluster3):
    brokers = cluster3.brokers
    with Admin(brokers[1].address) as admin:       # through n2: any broker takes admin requests
        admin.add_user("alice", KEY_A)
        acl_id = admin.add_acl("alice", "write,describe", "topic", "orders")
        deny_id = admin.add_acl("*", ["read"], "group", "billing.", permission="deny", pattern="prefixed")
        assert admin.add_acl("alice", ["describe", "write"], "topic", "orders") == acl_id   # one row
        with pytest.raises(MeshError) as e:
            admin.add_acl("alice", "fly", "topic", "orders")
        assert e.value.code == ErrorCode.INVALID_REQUEST and "unknown operation" in e.value.message
        with pytest.raises(MeshError, match="exists with another key"):
            admin.add_user("alice", "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID")
    # add_* returned once every live broker had them
    for resp in ask_each(brokers, m.ListAclsRequest()):
        assert sorted(a["id"] for a in resp.acls) == sorted([acl_id, deny_id])
    for resp in ask_each(brokers, m.ListUsersRequest()):
        assert resp.users == [{"name": "alice", "public_key": KEY_A}]
    # a full restart: every broker comes back with them (persisted before the answer)
    cluster3.stop()
    cluster3.start()
    for resp in ask_each(brokers, m.ListAclsRequest(principal="alice")):
        assert [a["id"] for a in resp.acls] == [acl_id]
        assert resp.acls[0]["operations"] == ["write", "describe"]
    with Admin(brokers[2].address) as admin:
        assert [a["id"] for a in admin.remove_acl(principal="*")] == [deny_id]
        admin.remove_user("alice")
        assert admin.remove_acl("0123456789abcdef") == []
    for resp in ask_each(brokers, m.ListUsersRequest()):
        assert resp.users == []
    wait_until(lambda: all(len(r.acls) == 1 for r in ask_each(brokers, m.ListAclsRequest())), 5, "ACL removal")


def test_cli(broker, tmp_path):
    run = CliRunner().invoke
    b = ["--bootstrap", broker.address]
    r = run(cli, ["user", "add", "carol", "--public-key", KEY_A] + b)
    assert r.exit_code == 0, r.output
    assert "added user carol" in r.output
    r = run(cli, ["user", "list"] + b)
    assert r.exit_code == 0 and "carol" in r.output and KEY_A in r.output
    r = run(cli, ["user", "add", "dave", "--out", str(tmp_path / "dave.creds")] + b, env={"MESH_CREDS": ""})
    assert r.exit_code != 0 and "--creds" in r.output and not (tmp_path / "dave.creds").exists()
    r = run(cli, ["acl", "add", "--principal", "carol", "--allow", "write,describe", "--topic", "orders"] + b)
    assert r.exit_code == 0, r.output
    acl_id = r.output.split()[-1]
    r = run(cli, ["acl", "add", "--principal", "carol", "--deny", "read", "--group", "bill", "--prefix"] + b)
    assert r.exit_code == 0, r.output
    r = run(cli, ["acl", "add", "--principal", "carol", "--allow", "alter", "--cluster"] + b)
    assert r.exit_code == 0, r.output
    r = run(cli, ["acl", "add", "--principal", "carol", "--allow", "read", "--topic", "t", "--group", "g"] + b)
    assert r.exit_code != 0 and "exactly one of --topic" in r.output
    r = run(cli, ["acl", "add", "--principal", "carol", "--allow", "fly", "--topic", "t"] + b)
    assert r.exit_code == 1 and "error: INVALID_REQUEST" in r.output
    r = run(cli, ["acl", "list", "--principal", "carol"] + b)
    assert r.exit_code == 0 and len(r.output.splitlines()) == 3, r.output
    assert "prefixed bill" in r.output and "write,describe" in r.output
    r = run(cli, ["acl", "list", "--topic", "orders", "--json"] + b)
    assert r.exit_code == 0 and '"id": "%s"' % acl_id in r.output
    r = run(cli, ["acl", "remove", acl_id] + b)
    assert r.exit_code == 0 and f"removed ACL {acl_id}" in r.output
    r = run(cli, ["acl", "remove", acl_id] + b)
    assert r.exit_code == 1 and "no ACL with id" in r.output
    r = run(cli, ["user", "remove", "carol"] + b)
    assert r.exit_code == 0, r.output
    r = run(cli, ["user", "remove", "carol"] + b)
    assert r.exit_code == 1 and "no user named" in r.output


# -- a secured cluster (--secrets): the ACLs decide ----------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """Three brokers with --secrets; the admin's creds in $MESH_CREDS (the launcher's
    readiness checks and Admin use them)."""
    root = tmp_path_factory.mktemp("secured")
    secrets, admin_creds = init_secrets(root / "secrets")
    mp = pytest.MonkeyPatch()
    mp.setenv("MESH_CREDS", admin_creds)
    c = Cluster(root, 3, extra=["--secrets", str(root / "secrets")])
    try:
        c.start()
        yield c, secrets, root
    finally:
        c.kill()
        mp.undo()


def new_user(admin: Admin, secrets, root, name: str) -> Creds:
    pub, sec = new_keypair()
    creds = Creds(name, pub, sec, secrets.cluster.public_key)
    creds.save(root / f"{name}.creds")
    admin.add_user(name, pub)
    return creds


def code(t: Transport, addr: str, msg, payload: bytes | None = None) -> int:
    """The error code of ``msg``'s answer from ``addr`` (0: answered without error)."""
    try:
        t.call(addr, msg, payload, timeout_ms=3000)
        return 0
    except MeshError as exc:
        return int(exc.code)


UNAUTH = int(ErrorCode.UNAUTHORIZED)


def test_acl_matrix_end_to_end(secured):
    c, secrets, root = secured
    addr = c.brokers[0].address
    with Admin(c.bootstrap) as admin:
        for name in ("mx.w", "mx.r", "mx.del", "mx.z"):
            admin.create_topic(name, 1, 3)
        mx = new_user(admin, secrets, root, "mx")
        for ops, res, name, kw in [("write", "topic", "mx.w", {}), ("read", "topic", "mx.r", {}),
                                   ("read", "topic", "mx.w", {"permission": "deny"}),
                                   ("create", "topic", "mx.new.", {"pattern": "prefixed"}),
                                   ("delete", "topic", "mx.del", {}), ("read", "group", "mx.g", {})]:
            admin.add_acl("mx", ops, res, name, **kw)
        leader = {n: admin.describe_topic(n)["partitions"][0]["leader_address"] for n in ("mx.w", "mx.r")}
    t = Transport(creds=mx)
    try:
        cells = [  # (request, address, allowed?)
            (m.ProduceRequest("mx.w", 0, 1), leader["mx.w"], True),
            (m.ProduceRequest("mx.r", 0, 1), leader["mx.r"], False),
            (m.FetchRequest([["mx.r", 0, 0, 1024]], max_wait_ms=0), leader["mx.r"], True),
            (m.FetchRequest([["mx.w", 0, 0, 1024]], max_wait_ms=0), leader["mx.w"], False),   # denied read
            (m.ListOffsetsRequest([["mx.w", 0, m.LATEST]]), leader["mx.w"], True),          # write: describe
            (m.ListOffsetsRequest([["mx.z", 0, m.LATEST]]), addr, False),
            (m.MetadataRequest(["mx.z"]), addr, False),
            (m.MetadataRequest(["mx.del"]), addr, True),                                      # delete: describe
            (m.CreateTopicRequest("mx.x"), addr, False),
            (m.DeleteTopicRequest("mx.w"), addr, False),
            (g.GroupCommit("mx.g2", "", -1, [["mx.r", 0, 0, ""]]), addr, False),
            (g.GroupCommit("mx.g", "", -1, [["mx.w", 0, 0, ""]]), addr, False),                # no read on mx.w
            (g.GroupDescribe("mx.g"), addr, True),                                            # read implies describe
            (g.GroupList(), addr, False),
            (m.AddAclRequest("mx", "allow", ["all"], "cluster", "cluster"), addr, False),
            (m.ListUsersRequest(), addr, False),
        ]
        for msg, where, allowed in cells:
            got = code(t, where, msg, b"" if isinstance(msg, m.ProduceRequest) else None)
            assert (got != UNAUTH) == allowed, (msg, got)
        # narrowing: every-topic metadata lists only what mx may describe
        resp, _ = t.call(addr, m.MetadataRequest(None), timeout_ms=3000)
        assert sorted(x["name"] for x in resp.topics) == ["mx.del", "mx.r", "mx.w"]
    finally:
        t.close()
    with Admin(c.bootstrap, creds=mx) as admin:   # create (prefixed) and delete as allowed, at the owner
        admin.create_topic("mx.new.a", wait_s=0)
        admin.delete_topic("mx.del", wait_s=0)
    # real clients: produce to mx.w is allowed; a consumer group reads mx.r and commits
    with Admin(c.bootstrap) as admin:
        admin.add_acl("*", "write", "topic", "mx.r")   # everyone (admin is a superuser anyway)
    with Producer(c.bootstrap, creds=mx) as p:
        p.send("mx.w", b"w").get(10)
        p.send("mx.r", b"r").get(10)
    cons = Consumer("mx.r", bootstrap=c.bootstrap, group_id="mx.g", auto_offset_reset="earliest", creds=mx)
    try:
        got = []
        wait_until(lambda: got.extend(r for rs in cons.poll(200).values() for r in rs) or got, 20, "a record")
        assert got[0].value == b"r"
        cons.commit()
        assert cons.committed(TopicPartition("mx.r", 0)) == 1
    finally:
        cons.close()


def test_removed_user_and_acl_changes_take_effect_cluster_wide(secured):
    c, secrets, root = secured
    with Admin(c.bootstrap) as admin:
        admin.create_topic("rm.t", 1, 3)
        rm = new_user(admin, secrets, root, "rm")
        leader = admin.describe_topic("rm.t")["partitions"][0]["leader_address"]
    t = Transport(creds=rm)      # connections to every broker, opened before the changes
    ask = m.ListOffsetsRequest([["rm.t", 0, m.LATEST]])
    try:
        for b in c.brokers:
            assert code(t, b.address, ask) == UNAUTH                 # default deny
        with Admin(c.brokers[1].address) as admin:
            acl_id = admin.add_acl("rm", "describe", "topic", "rm.t")
        # add_acl returned once every broker had it: allowed everywhere now, no restart
        assert code(t, leader, ask) == 0
        for b in c.brokers:
            assert code(t, b.address, ask) != UNAUTH
        with Admin(c.brokers[2].address) as admin:
            admin.remove_acl(acl_id)
        for b in c.brokers:
            assert code(t, b.address, ask) == UNAUTH
        with Admin(c.bootstrap) as admin:
            admin.add_acl("rm", "describe", "topic", "rm.t")
        assert code(t, leader, ask) == 0
        with Admin(c.brokers[0].address) as admin:
            admin.remove_user("rm")
        # the open connections now get UNAUTHORIZED for everything, on every broker
        for b in c.brokers:
            wait_until(lambda: code(t, b.address, ask) == UNAUTH, 5, f"{b.node_id} to refuse rm")
        with pytest.raises(MeshError) as e:
            t.call(leader, ask, timeout_ms=3000)
        assert e.value.code == ErrorCode.UNAUTHORIZED and "any more" in e.value.message
    finally:
        t.close()


def test_cli_secured(secured, tmp_path):
    c, secrets, root = secured
    admin_creds = str(root / "secrets" / "admin.creds")
    out = tmp_path / "cli.creds"
    run = CliRunner().invoke
    b = ["--bootstrap", c.bootstrap]
    env = {"MESH_CREDS": ""}      # only --creds names the admin here
    r = run(cli, ["user", "add", "cliuser", "--out", str(out), "--creds", admin_creds] + b, env=env)
    assert r.exit_code == 0, r.output
    assert (out.stat().st_mode & 0o777) == 0o600
    mine = Creds.load(out)
    assert mine.principal == "cliuser" and mine.cluster_public_key == secrets.cluster.public_key
    r = run(cli, ["user", "add", "cliuser", "--out", str(out), "--creds", admin_creds] + b, env=env)
    assert r.exit_code != 0 and "exists" in r.output
    r = run(cli, ["acl", "add", "--principal", "cliuser", "--allow", "all", "--cluster", "--creds", str(out)] + b, env=env)
    assert r.exit_code == 1 and "UNAUTHORIZED: cliuser may not alter cluster" in r.output
    r = run(cli, ["acl", "add", "--principal", "cliuser", "--allow", "describe", "--cluster", "--creds", admin_creds] + b,
            env=env)
    assert r.exit_code == 0, r.output
    r = run(cli, ["user", "list", "--creds", str(out)] + b, env=env)    # describe cluster: allowed now
    assert r.exit_code == 0 and "cliuser" in r.output and "admin" in r.output and "superuser" in r.output
