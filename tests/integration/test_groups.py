"""Consumer groups on real brokers: members share partitions, a SIGKILLed member's partitions
move on from its committed offsets, groups are independent, a killed coordinator is
replaced, and the `mesh group` commands work against any broker.

The brokers run with a 3 s maximum session timeout ($MESH_GROUP_MAX_SESSION_MS), which is
also their takeover grace, so failures are handled in seconds.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from mesh.client import Admin, Consumer, Producer
from mesh.client.group_admin import GroupAdmin
from mesh.cluster.ownership import coordinator_for
from mesh.testing.launcher import ROOT, Cluster, wait_until
from tools.cli import main as cli

pytestmark = pytest.mark.integration

SESSION_MS = 3000


def start_cluster(tmp_path, n: int = 3) -> Cluster:
    old = os.environ.get("MESH_GROUP_MAX_SESSION_MS")
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(SESSION_MS)
    try:
        c = Cluster(tmp_path, n).start()
    finally:
        if old is None:
            del os.environ["MESH_GROUP_MAX_SESSION_MS"]
        else:
            os.environ["MESH_GROUP_MAX_SESSION_MS"] = old

    def all_alive():
        for b in c.brokers:
            with Admin(b.address, request_timeout_ms=1000) as a:
                bs = a.metadata([]).brokers
            if len(bs) != n or any(x["status"] != "alive" for x in bs):
                return False
        return True
    wait_until(all_alive, 15, "every broker to see every other alive")
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("groups"))
    yield c
    for b in c.brokers:
        b.kill()


def member(bootstrap, group, **kw) -> Consumer:
    kw.setdefault("auto_offset_reset", "earliest")
    kw.setdefault("session_timeout_ms", SESSION_MS)
    kw.setdefault("auto_commit_interval_ms", 200)
    return Consumer(bootstrap=bootstrap, group_id=group, **kw)


def member_that_read_everything(bootstrap, topic, partitions, n, group) -> Consumer:
    """Create ``topic``, write ``n`` records round-robin, read them all as a member of
    ``group`` and commit: the member, still in its group."""
    Admin(bootstrap).create_topic(topic, partitions)
    with Producer(bootstrap) as p:
        for i in range(n):
            p.send(topic, b"%d" % i, partition=i % partitions)
        p.flush()
    c = member(bootstrap, group)
    c.subscribe([topic])
    got = []
    wait_until(lambda: got.extend(r for rs in c.poll_batches(50) for r in rs) or len(got) == n, 20, f"{n} records")
    c.commit()
    return c


def describe(bootstrap, group):
    with GroupAdmin(bootstrap, request_timeout_ms=2000) as ga:
        return ga.describe(group)


def stable_with(bootstrap, group, sizes):
    d = describe(bootstrap, group)
    got = sorted(len(m["assigned"]) for m in d["members"])
    return d if d["state"] == "stable" and got == sorted(sizes) else None


class Feeder:
    """Produces keyed records 0, 1, 2, ... in the background until stopped."""

    def __init__(self, bootstrap, topic, per_tick=20, tick_s=0.01):
        self.producer = Producer(bootstrap, linger_ms=2)
        self.topic, self.per_tick, self.tick_s = topic, per_tick, tick_s
        self.futures = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        while not self._stop.is_set():
            for _ in range(self.per_tick):
                value = b"%d" % i
                self.futures.append((value, self.producer.send(self.topic, value, key=value)))
                i += 1
            self._stop.wait(self.tick_s)   # pacing the feed, not waiting for a condition

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop; {(partition, offset): value} of every acknowledged record."""
        self._stop.set()
        self._thread.join()
        self.producer.flush()
        acked = {}
        for value, f in self.futures:
            md = f.get(timeout=30)
            acked[(md.partition, md.offset)] = value
        self.producer.close()
        return acked

    def __exit__(self, *exc):
        if not self._stop.is_set():
            self.stop()


def gossip_offsets(address, group) -> dict[int, int]:
    """What one broker knows of a group's committed offsets from gossip alone (a broker that
    does not coordinate the group answers COORDINATOR_MOVED with them)."""
    from mesh.client.transport import Transport
    from mesh.groups import GroupFetchOffsets
    t = Transport()
    try:
        resp, _ = t.call(address, GroupFetchOffsets(group, None), timeout_ms=2000)
    finally:
        t.close()
    return {p: off for _, p, off, _ in resp.offsets}


def cli_consumer(bootstrap, topic, group, out_path) -> subprocess.Popen:
    """`mesh consume --group` in its own process (it may be SIGKILLed)."""
    cmd = [sys.executable, "-m", "tools.cli", "consume", topic, "--group", group, "--from-beginning",
           "--format", "{partition} {offset} {value}", "--session-timeout-ms", str(SESSION_MS),
           "--auto-commit-interval-ms", "200", "--bootstrap", bootstrap]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(out_path, "wb"), stderr=subprocess.STDOUT)


def read_output(path) -> list[tuple[int, int, bytes]]:
    out = []
    with open(path, "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                out.append((int(parts[0]), int(parts[1]), parts[2]))
    return out


def test_three_cli_members_share_twelve_partitions_and_survive_a_sigkill(cluster, tmp_path):
    boot = cluster.bootstrap
    Admin(boot).create_topic("payments", 12)
    outs = [tmp_path / f"member{i}.out" for i in range(3)]
    procs = []
    try:
        with Feeder(boot, "payments") as feed:
            procs = [cli_consumer(boot, "payments", "billing", p) for p in outs]
            d = wait_until(lambda: stable_with(boot, "billing", [4, 4, 4]), 30,
                           "three members with four partitions each")
            owned = [tp for m in d["members"] for tp in m["assigned"]]
            assert sorted(owned) == sorted(["payments", p] for p in range(12))
            # a member that has consumed, mid-stream, dies without a word
            wait_until(lambda: all(len(read_output(p)) > 50 for p in outs), 20, "every member consuming")
            victim = procs[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            killed_at = time.monotonic()
            wait_until(lambda: stable_with(boot, "billing", [6, 6]), 20, "the two survivors to take over")
            takeover_s = time.monotonic() - killed_at
            acked = feed.stop()
        want = set(acked)

        def seen_all():
            got = {(p, o) for path in outs for p, o, _ in read_output(path)}
            return want <= got
        wait_until(seen_all, 30, f"all {len(want)} acknowledged records to be consumed")
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    per_member = [read_output(p) for p in outs]
    for recs in per_member:   # right values, and each member reads a partition in order
        for p, o, v in recs:
            assert acked.get((p, o), v) == v
    counts = collections.Counter((p, o) for recs in per_member for p, o, _ in recs)
    dups = {k for k, n in counts.items() if n > 1}
    # duplicates only from the killed member's uncommitted work: per partition, a run of
    # offsets that ends with the last record it printed
    victim_recs = per_member[0]
    victim_last = {}
    for p, o, _ in victim_recs:
        victim_last[p] = max(victim_last.get(p, -1), o)
    assert dups <= {(p, o) for p, o, _ in victim_recs}
    by_part = collections.defaultdict(list)
    for p, o in dups:
        by_part[p].append(o)
    for p, offs in by_part.items():
        offs.sort()
        assert offs == list(range(offs[0], offs[-1] + 1)) and offs[-1] == victim_last[p], (p, offs)
    assert takeover_s < 3 * SESSION_MS / 1000 + 5, takeover_s


def test_two_groups_each_get_every_record_and_members_do_not_overlap(cluster):
    boot = cluster.bootstrap
    Admin(boot).create_topic("orders", 6)
    with Producer(boot) as p:
        for i in range(3000):
            p.send("orders", b"%d" % i, key=b"%d" % i)
        p.flush()
    a1, a2, b1 = member(boot, "audit"), member(boot, "audit"), member(boot, "shipping")
    for c in (a1, a2, b1):
        c.subscribe(["orders"])
    seen = {id(c): [] for c in (a1, a2, b1)}

    def poll_all():
        for c in (a1, a2, b1):
            for recs in c.poll_batches(timeout_ms=20):
                seen[id(c)].extend((r.partition, r.offset, r.value) for r in recs)
        audit = {r[2] for r in seen[id(a1)] + seen[id(a2)]}
        shipping = {r[2] for r in seen[id(b1)]}
        return len(audit) == 3000 and len(shipping) == 3000
    try:
        wait_until(poll_all, 30, "both groups to read every record")
        wait_until(lambda: poll_all() and sorted(len(c.assignment()) for c in (a1, a2)) == [3, 3], 15,
                   "the audit group to settle on 3 + 3 partitions")
        assert {r[2] for r in seen[id(b1)]} == {b"%d" % i for i in range(3000)}
        # cooperative hand-over commits before release: no record read twice in a group
        audit = seen[id(a1)] + seen[id(a2)]
        assert len(audit) == len({(p, o) for p, o, _ in audit}) == 3000
        assert len(seen[id(b1)]) == 3000
        assert not set(a1.assignment()) & set(a2.assignment())
        # manual commit and committed()
        tp = a1.assignment()[0]
        a1.commit({tp: 1})
        assert a1.committed(tp) == 1
        a1.commit()
        assert a1.committed(tp) == max(o for p, o, _ in seen[id(a1)] if p == tp.partition) + 1
    finally:
        for c in (a1, a2, b1):
            c.close()
    # closed members left and committed what they read: lag 0 everywhere, from any broker
    for b in cluster.brokers:
        d = describe(b.address, "audit")
        assert d["state"] == "empty" and not d["members"]
        assert [(p["partition"], p["lag"]) for p in d["partitions"]] == [(i, 0) for i in range(6)]


def test_group_commands_list_describe_and_reset_offsets(cluster):
    boot = cluster.bootstrap
    runner = CliRunner()
    c = member_that_read_everything(boot, "ledger", 3, 90, "books")
    # while the group has a member, offsets cannot be reset
    r = runner.invoke(cli, ["group", "reset-offsets", "books", "--topic", "ledger", "--to-earliest", "-b", boot])
    assert r.exit_code == 1 and "members" in r.output, r.output
    for b in cluster.brokers:   # any broker: list shows it, describe finds the coordinator
        r = runner.invoke(cli, ["group", "list", "-b", b.address])
        assert r.exit_code == 0 and "books" in r.output, r.output
        line = next(x for x in r.output.splitlines() if x.startswith("books"))
        assert "stable" in line and " 1 " in line, line
        r = runner.invoke(cli, ["group", "describe", "books", "-b", b.address])
        assert r.exit_code == 0, r.output
        assert "State: stable" in r.output and c._group.member_id in r.output
        rows = [x.split() for x in r.output.splitlines() if x.startswith("ledger")]
        assert [(x[1], x[2], x[3], x[4]) for x in rows] == [(str(p), "30", "30", "0") for p in range(3)]
    c.close()
    r = runner.invoke(cli, ["group", "reset-offsets", "books", "--topic", "ledger", "--to-offset", "7", "-b", boot])
    assert r.exit_code == 0 and r.output.split("\n")[:3] == ["ledger 0 7", "ledger 1 7", "ledger 2 7"], r.output
    d = describe(boot, "books")
    assert [(p["committed"], p["lag"]) for p in d["partitions"]] == [(7, 23)] * 3
    r = runner.invoke(cli, ["group", "reset-offsets", "books", "--topic", "ledger", "--to-earliest",
                            "--partition", "1", "-b", boot])
    assert r.exit_code == 0 and r.output.strip() == "ledger 1 0", r.output
    # a new member starts from the reset offsets
    c = member(boot, "books", enable_auto_commit=False)
    c.subscribe(["ledger"])
    got = []
    try:
        wait_until(lambda: got.extend(r for rs in c.poll_batches(50) for r in rs) or len(got) >= 23 + 30 + 23,
                   20, "records from the reset offsets")
    finally:
        c.close()
    assert sorted((r.partition, r.offset) for r in got) == sorted(
        [(0, o) for o in range(7, 30)] + [(1, o) for o in range(0, 30)] + [(2, o) for o in range(7, 30)])
    r = runner.invoke(cli, ["group", "reset-offsets", "books", "--topic", "ledger", "-b", boot])
    assert r.exit_code != 0 and "exactly one" in r.output


def group_ids(address) -> list[str]:
    with GroupAdmin(address, request_timeout_ms=2000) as ga:
        return [g["group_id"] for g in ga.list_groups()]


def test_mesh_group_delete_forgets_a_group_on_every_broker_and_its_consumers_start_over(cluster):
    """Without deletion or expiry every group that ever committed stayed for good, counted
    against each coordinator's 10,000-group cap, and was gossiped to every broker."""
    boot = cluster.bootstrap
    runner = CliRunner()
    c = member_that_read_everything(boot, "erasable", 2, 20, "doomed")
    for b in cluster.brokers:
        wait_until(lambda: gossip_offsets(b.address, "doomed") == {0: 10, 1: 10}, 10, "the commit gossiped")
    r = runner.invoke(cli, ["group", "delete", "doomed", "-b", boot])
    assert r.exit_code == 1 and "GROUP_NOT_EMPTY" in r.output, r.output
    c.close()
    r = runner.invoke(cli, ["group", "delete", "doomed", "-b", cluster.brokers[-1].address])
    assert r.exit_code == 0 and r.output.strip() == "deleted group doomed", r.output
    for b in cluster.brokers:   # gone from every broker's view (gossip)
        wait_until(lambda: "doomed" not in group_ids(b.address) and gossip_offsets(b.address, "doomed") == {},
                   10, f"{b.node_id} to forget the group")
    r = runner.invoke(cli, ["group", "delete", "doomed", "-b", boot])
    assert r.exit_code == 1 and "UNKNOWN_GROUP" in r.output, r.output
    # a new member of the same group id starts from auto_offset_reset, not the old offsets
    c = member(boot, "doomed", enable_auto_commit=False)
    c.subscribe(["erasable"])
    again = []
    try:
        wait_until(lambda: again.extend(r for rs in c.poll_batches(50) for r in rs) or len(again) >= 20,
                   20, "every record again")
    finally:
        c.close()
    assert sorted((r.partition, r.offset) for r in again) == [(p, o) for p in range(2) for o in range(10)]


def test_an_empty_group_expires_after_the_offsets_retention_and_stays_gone_after_a_restart(tmp_path):
    c = Cluster(tmp_path, 1, extra=["--offsets-retention-ms", "500"]).start()
    try:
        boot = c.bootstrap
        Admin(boot).create_topic("brief", 1)
        with GroupAdmin(boot) as ga:
            wait_until(lambda: ga.reset_offsets("fleeting", "brief", "latest") is not None, 10, "a commit")
        assert "fleeting" in group_ids(boot)
        # the coordinator checks every 10 s (group_host.PRUNE_EVERY_MS)
        wait_until(lambda: "fleeting" not in group_ids(boot), 25, "the group to expire")
        c.brokers[0].kill()
        c.brokers[0].restart()
        assert "fleeting" not in group_ids(boot) and gossip_offsets(boot, "fleeting") == {}
    finally:
        c.kill()


def test_the_group_carries_on_when_its_coordinator_broker_is_killed(tmp_path):
    c = start_cluster(tmp_path)
    try:
        ids = [b.node_id for b in c.brokers]
        group = next(f"g{i}" for i in range(1000) if coordinator_for(f"g{i}", ids) == "n3")
        n3 = c.brokers[2]
        boot = ",".join(b.address for b in c.brokers[:2])
        Admin(boot).create_topic("stream", 6)
        leaders = {p["partition"]: p["leader"] for p in Admin(boot).describe_topic("stream")["partitions"]}
        live_parts = [p for p, leader in leaders.items() if leader != "n3"]
        with Producer(boot) as p:
            for i in range(600):
                p.send("stream", b"a%d" % i, partition=i % 6)
            p.flush()
        members = [member(boot, group) for _ in range(2)]
        for m in members:
            m.subscribe(["stream"])
        seen = []

        def poll_all():
            for m in members:
                for recs in m.poll_batches(timeout_ms=20):
                    seen.extend((r.partition, r.offset, r.value) for r in recs)
            return True

        def caught_up():
            poll_all()
            d = describe(boot, group)
            return d["coordinator"] == "n3" and len(d["partitions"]) == 6 and \
                all(p["lag"] == 0 for p in d["partitions"])
        wait_until(caught_up, 30, "the group to read and commit the first 600 records")
        # commits are durable on the coordinator, then gossiped: wait until the survivors
        # know them (a commit made in the last gossip round before a crash is only on the
        # dead broker's disk until it returns: the group would re-read from the one before)
        wait_until(lambda: poll_all() and all(gossip_offsets(b.address, group) == {p: 100 for p in range(6)}
                                              for b in c.brokers[:2]), 10, "the commits to reach n1 and n2")
        n3.kill()
        killed_at = time.monotonic()
        with Producer(boot) as p:   # more records, on the partitions that are still served
            for i in range(300):
                p.send("stream", b"b%d" % i, partition=live_parts[i % len(live_parts)])
            p.flush()
        ends = {p: 100 + sum(1 for i in range(300) if live_parts[i % len(live_parts)] == p) for p in live_parts}

        def carried_on():
            poll_all()
            d = describe(boot, group)
            committed = {p["partition"]: p["committed"] for p in d["partitions"]}
            return d["coordinator"] in ("n1", "n2") and d["state"] == "stable" and len(d["members"]) == 2 \
                and all(committed.get(p) == end for p, end in ends.items()) and committed
        committed = wait_until(carried_on, 30, "the group to read and commit, through its new coordinator, "
                                                "the records sent after n3 died")
        recovered_s = time.monotonic() - killed_at
        # n3's partitions kept the offsets committed through n3
        assert all(committed[p] == 100 for p in leaders if p not in live_parts)
        assert {v for _, _, v in seen} == {b"a%d" % i for i in range(600)} | {b"b%d" % i for i in range(300)}
        assert recovered_s < 25, recovered_s
        for m in members:
            m.close()
    finally:
        for b in c.brokers:
            b.kill()


def commit_until_acknowledged(transport, address, group, offsets, deadline_s=15.0):
    """A simple consumer's native GROUP_COMMIT to ``address`` until it is acknowledged
    (a new coordinator answers COORDINATOR_NOT_AVAILABLE while it loads the group)."""
    from mesh.groups import GroupCommit
    from mesh.wire.errors import MeshError, retriable
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            resp, _ = transport.call(address, GroupCommit(group, "", -1, offsets), timeout_ms=3000)
            if resp.error == 0:
                return
            last = resp
            if not retriable(resp.error):
                raise AssertionError(f"commit refused: {resp}")
        except MeshError as exc:
            last = exc
            if not exc.retriable:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"commit never acknowledged: {last}")
        time.sleep(0.05)   # retry backoff, not a wait for a condition


def test_a_coordinator_killed_right_after_a_commit_returns_loses_nothing_it_acknowledged(tmp_path):
    """Issue 38: a commit was synced on the coordinator alone, answered, then gossiped; a
    coordinator killed in between took its newest commits with it (the successor resumed
    3-12 records low; 1-12 after a SIGTERM). Now it is answered once a majority of the
    group's replicas hold it. Two kill -9s of different brokers, then a SIGTERM."""
    from mesh.client.transport import Transport
    c = start_cluster(tmp_path)
    t = Transport()
    try:
        ids = [b.node_id for b in c.brokers]
        boot = ",".join(b.address for b in c.brokers)
        Admin(boot).create_topic("durable", 3)   # (a commit naming it is retried until its broker knows it)
        for round_no, (victim, how) in enumerate((("n3", "kill"), ("n1", "kill"), ("n2", "stop"))):
            group = next(f"d{round_no}-{i}" for i in range(1000) if coordinator_for(f"d{round_no}-{i}", ids) == victim)
            coord = next(b for b in c.brokers if b.node_id == victim)
            for n in range(1, 41):   # commits in a row, the last one answered just before the kill
                commit_until_acknowledged(t, coord.address, group, [["durable", p, 100 * n + p, ""] for p in range(3)])
            if how == "kill":
                coord.kill()         # kill -9 right after the last commit returned
            else:
                coord.signal(signal.SIGTERM)   # a clean stop: it hands over and leaves
                coord.wait_stopped()
            last = {p: 4000 + p for p in range(3)}
            survivors = [b for b in c.brokers if b.alive()]

            def everywhere():
                return all(all(gossip_offsets(b.address, group).get(p, -1) >= off for p, off in last.items())
                           for b in survivors)
            wait_until(everywhere, 20, f"every surviving broker to answer the acknowledged commit of {group}")
            coord.restart()          # back for the next round (one broker down at a time)
            c.brokers[0].wait_ready()
            wait_until(lambda: all(x["status"] == "alive" for x in Admin(boot).metadata([]).brokers), 20,
                       "every broker alive again")
    finally:
        t.close()
        for b in c.brokers:
            b.kill()
