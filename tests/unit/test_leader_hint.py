"""A deposed leader tells its waiting acks=all clients at once: NOT_LEADER, with the new
leader's address when it knows it (a paused leader that resumes and hears its successor).
Over the replica-host harness of tests/unit/test_raft_host.py."""
from __future__ import annotations

from mesh.wire.errors import ErrorCode
from tests.unit.test_raft_host import PID, TICK_MS, Cluster


def test_a_paused_leader_that_resumes_answers_its_waiters_not_leader_with_the_new_address():
    c = Cluster()
    for h in c.hosts.values():
        h.address_of = lambda node_id: f"{node_id}.example:9000"
    c.start()
    assert c.hosts["n0"].is_leader(PID)
    c.produce("n0")                          # staged and synced on n0: its acks=all request waits
    c.queue.clear()                          # n0 is paused: nothing it sends gets out ...
    cut = lambda src, dest: "n0" in (src, dest)   # ... and nothing reaches it
    for _ in range(100):                     # the others elect a successor (n0 does not tick)
        c.now_ms += TICK_MS
        for nid in ("n1", "n2"):
            c.hosts[nid].tick_due()
            c.turn(nid)
        c.deliver(drop=lambda src, dest: cut(src, dest))
        if any(c.hosts[n].is_leader(PID) for n in ("n1", "n2")):
            break
    new = next(n for n in ("n1", "n2") if c.hosts[n].is_leader(PID))
    assert c.replies["n0"] == []
    c.now_ms += TICK_MS                      # n0 resumes: the successor's heartbeat reaches it
    c.hosts[new].tick_due()
    c.turn(new)
    c.deliver()
    (ident, rid, resp), = c.replies["n0"]
    assert (ident, rid, resp.error) == (b"client", 7, ErrorCode.NOT_LEADER)
    assert resp.leader == f"{new}.example:9000"
