"""The node's group host over fakes of its collaborators (store, gossip, sync, reply):
persist-then-reply-then-gossip, the merged offset view (latest commit wins), failover with
adoption, reload after a crash."""
from __future__ import annotations

import random

import pytest

from mesh.cluster.schema import validate_entry
from mesh.gossip import Member
from mesh.groups import (
    GroupCommit, GroupDelete, GroupDescribe, GroupFetchOffsets, GroupFindCoordinator, GroupHeartbeat, GroupList,
    GroupResetOffsets, coordinator_for,
)
from mesh.node.groups.group_host import GroupHost, GroupHostConfig
from mesh.wire.errors import ErrorCode
from storage.memory import MemoryStore

CONFIG = GroupHostConfig(max_session_timeout_ms=1_000, heartbeat_interval_ms=100,
                         offsets_retention_ms=3_600_000, tombstone_ms=7_200_000)


class World:
    """Gossip as every node sees it at once: namespaces, statuses, a clock, an event log."""

    def __init__(self):
        self.ns: dict[str, dict[str, tuple[int, object]]] = {}
        self.status: dict[str, str] = {}
        self.now_ms = 1_000_000
        self.events: list[str] = []
        self.brokers: dict[str, "Broker"] = {}
        self.wire: list[tuple[str, str, object]] = []   # peer messages in flight: (src, dest, msg)
        self.down: set[str] = set()                      # brokers that receive nothing (killed)

    def deliver(self, limit: int = 1_000) -> None:
        """Deliver peer messages in order until none is left; each receiver's turn is
        committed after each message (as its loop would)."""
        for _ in range(limit):
            if not self.wire:
                return
            src, dest, msg = self.wire.pop(0)
            node = self.brokers.get(dest)
            if node is None or dest in self.down:
                continue
            node.groups.handle_peer(src, msg)
            node.data.commit_turn()
        raise AssertionError("peer messages never stopped")


class FakeGossip:
    def __init__(self, world: World, node_id: str):
        self.world, self.node_id = world, node_id
        world.ns.setdefault(node_id, {})
        world.status[node_id] = "alive"

    def members(self, now_ms):
        return [Member(n, f"{n}:1", 1, self.world.status[n], 0, 0, 0.0, max((v for v, _ in ns.values()), default=0))
                for n, ns in sorted(self.world.ns.items())]

    def node_items(self, node_id, prefix=""):
        return {k: v for k, (_, v) in sorted(self.world.ns.get(node_id, {}).items()) if k.startswith(prefix)}

    def entry_version(self, node_id, key):
        e = self.world.ns.get(node_id, {}).get(key)
        return None if e is None else (1, e[0], False)

    def set_local(self, key, value):
        reason = validate_entry(key, value, self.world.now_ms)   # as the real gossip core checks it
        if reason is not None:
            raise ValueError(f"gossip entry refused: {reason}")
        self.put_raw(key, value)

    def put_raw(self, key, value):
        """A test's own entry, unchecked (as if another writer's had arrived)."""
        ns = self.world.ns[self.node_id]
        version = max((v for v, _ in ns.values()), default=0) + 1
        ns[key] = (version, value)
        self.world.events.append(f"gossip {key}")

    def delete_local(self, key):
        del self.world.ns[self.node_id][key]
        self.world.events.append(f"gossip delete {key}")


class LoggingStore(MemoryStore):
    def __init__(self, world):
        super().__init__()
        self.world = world

    def put(self, db, key, value):
        super().put(db, key, value)
        self.world.events.append(f"put {db}")


class FakeData:
    """The data path's commit: one sync per turn (only if it wrote), then its listeners."""

    def __init__(self, store, world):
        self.store, self.world, self.ok = store, world, True
        self.on_commit = []

    def commit_turn(self):
        if not self.ok:
            self.store.rollback()
            for listener in self.on_commit:
                listener(False)
            return False
        if self.store.has_writes():
            self.world.events.append("sync")
        self.store.commit()
        for listener in self.on_commit:
            listener(True)
        return True


class WorldClock:
    def __init__(self, world: World):
        self.world = world

    def now_ms(self) -> int:
        return self.world.now_ms

    def wall_ms(self) -> int:
        return self.world.now_ms


class Broker:
    """One broker's group host, wired to the world the way the node wires it."""

    def __init__(self, world: World, node_id: str, store=None, seeded=True):
        self.node_id, self.world = node_id, world
        self.gossip = FakeGossip(world, node_id)
        self.store = store or LoggingStore(world)
        self.store.world = world
        self.data = FakeData(self.store, world)
        self.replies: list = []
        self.groups = GroupHost(node_id, store=self.store, commit_turn=self.data.commit_turn,
                                gossip=self.gossip, reply=self._on_reply,
                                address_of=lambda n: f"{n}:1", topic_partitions=lambda: {"t": 4},
                                clock=WorldClock(world), rng=random.Random(node_id),
                                seeded=seeded, config=CONFIG,
                                send_to_node=lambda dest, msg: world.wire.append((node_id, dest, msg)))
        world.brokers[node_id] = self
        self.data.on_commit.append(self.groups.after_commit)   # as the node wires it
        self.groups.on_cluster_change(world.now_ms)

    def _on_reply(self, ident, rid, msg):
        self.world.events.append(f"reply {type(msg).__name__}")
        self.replies.append(msg)

    def ask(self, msg):
        """One request in a turn of its own: handled, then the turn's commit, then the
        peer messages it caused (offsets replication) delivered."""
        for _ in range(2):   # a new coordinator loading the group's offsets: asked again, as a client does
            self.groups.handle(b"client", 1, msg)
            self.data.commit_turn()
            self.world.deliver()
            if "loading" not in getattr(self.replies[-1], "message", ""):
                break
        return self.replies[-1]


@pytest.fixture
def world():
    return World()


def group_on(node: str, nodes: list[str]) -> str:
    return next(g for g in (f"g{i}" for i in range(1000)) if coordinator_for(g, nodes) == node)


def past_grace(world: World) -> None:
    world.now_ms += 2 * CONFIG.max_session_timeout_ms


def join(node: Broker, group: str):
    r = node.ask(GroupHeartbeat(group, "", 0, ["t"], [], "", 1_000))
    assert r.error == 0, r
    return r


def deleted_elsewhere(node: Broker, group: str, stamp: int) -> None:
    """Tombstones for t/0..3 in ``node``'s namespace, as if it had deleted ``group``."""
    node.gossip.put_raw(f"off/{group}/t/0", {"g": group, "t": "t", "o": {str(p): [-1, "", stamp] for p in range(4)}})


def with_member(world: World, node: str = "a"):
    """Brokers a and b, past the grace, and a group coordinated by ``node`` with one member."""
    a, b = Broker(world, "a"), Broker(world, "b")
    for n in (a, b):
        n.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    g = group_on(node, ["a", "b"])
    return a, b, g, join(a if node == "a" else b, g)


def test_commit_is_synced_then_gossiped_then_answered(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    r = join(a, g)
    world.events.clear()
    resp = a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, "m"], ["t", 1, 7, ""]]))
    assert resp.error == 0
    assert world.events == ["put offsets", "put offsets", "sync", f"gossip off/{g}/t/0",
                            "reply GroupCommitResponse"]   # (alone: its own sync is the majority)
    (value,) = a.gossip.node_items("a", "off/").values()
    assert value["g"] == g and value["t"] == "t" and {p: v[:2] for p, v in value["o"].items()} == \
        {"0": [5, "m"], "1": [7, ""]}
    assert a.ask(GroupFetchOffsets(g, [["t", 0], ["t", 2]])).offsets == [["t", 0, 5, "m"], ["t", 2, -1, ""]]


def test_a_commit_that_cannot_be_synced_is_refused_and_undone(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, ""]])).error == 0
    a.data.ok = False
    world.events.clear()
    resp = a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 9, ""], ["t", 1, 3, ""]]))
    assert resp.error == ErrorCode.STORAGE_ERROR
    assert not [e for e in world.events if e.startswith("gossip")]
    assert a.ask(GroupFetchOffsets(g, None)).offsets == [["t", 0, 5, ""]]


def test_other_brokers_redirect_and_answer_offsets_from_gossip(world):
    a, b = Broker(world, "a"), Broker(world, "b")
    for n in (a, b):
        n.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    g = group_on("a", ["a", "b"])
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 2, 11, ""]])).error == 0
    b.groups.on_cluster_change(world.now_ms)
    found = b.ask(GroupFindCoordinator(g))
    assert (found.error, found.node_id, found.address) == (0, "a", "a:1")
    moved = b.ask(GroupHeartbeat(g, "", 0, ["t"], []))
    assert moved.error == ErrorCode.COORDINATOR_MOVED and moved.coordinator == "a"
    fetched = b.ask(GroupFetchOffsets(g, None))
    assert fetched.error == ErrorCode.COORDINATOR_MOVED and fetched.offsets == [["t", 2, 11, ""]]
    described = b.ask(GroupDescribe(g))
    assert described.coordinator == "a" and described.offsets == [["t", 2, 11, ""]]
    listed = b.ask(GroupList()).groups
    assert listed == [{"group_id": g, "state": "unknown", "members": -1, "group_epoch": -1, "coordinator": "a"}]
    assert a.ask(GroupDescribe(g)).coordinator == "a"


def test_merged_view_latest_commit_wins(world):
    a, b = Broker(world, "a"), Broker(world, "b")
    # two namespaces disagree (a failover happened): the later stamp wins, then the higher offset
    a.gossip.put_raw("off/x/t/0", {"g": "x", "t": "t", "o": {"0": [50, "", 1000], "1": [9, "", 2000]}})
    b.gossip.put_raw("off/x/t/0", {"g": "x", "t": "t", "o": {"0": [40, "", 1001], "1": [8, "", 2000]}})
    a.gossip.put_raw("off/x/t/junk", {"g": "x", "t": "t", "o": {"2": ["bad"]}})
    a.groups.on_cluster_change(world.now_ms)
    assert {tp: v[0] for tp, v in a.groups.committed("x").items()} == {("t", 0): 40, ("t", 1): 9}


def test_failover_takes_over_adopts_offsets_and_holds_partitions_for_the_grace(world):
    a, b = Broker(world, "a"), Broker(world, "b")
    for n in (a, b):
        n.groups.on_cluster_change(world.now_ms)
    g = group_on("a", ["a", "b"])
    assert coordinator_for(g, ["b"]) == "b"
    world.now_ms += 5_000    # past the start grace
    r = join(a, g)
    assert r.assignment  # a coordinator past its grace gives partitions at once
    a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", p, 10 + p, ""] for _, p in r.assignment]))
    world.status["a"] = "dead"
    b.groups.on_cluster_change(world.now_ms)
    committed = b.ask(GroupFetchOffsets(g, None))
    assert committed.error == 0 and committed.offsets == [["t", p, 10 + p, ""] for _, p in r.assignment]
    # adopted: durable here and in b's own namespace
    assert len(b.store.items("offsets")) == len(r.assignment)
    assert b.gossip.node_items("b", "off/")
    # a member joining now gets nothing until the grace (the max session timeout) ends
    r2 = join(b, g)
    assert r2.assignment == []
    world.now_ms += 1_000
    r3 = b.ask(GroupHeartbeat(g, r2.member_id, r2.member_epoch, ["t"], [], "", 1_000))
    assert sorted(tuple(x) for x in r3.assignment) == [("t", p) for p in range(4)]
    # a late commit of the old coordinator, newer than what b holds, replaces it
    world.now_ms += 1
    a.gossip.put_raw(f"off/{g}/t/0", {"g": g, "t": "t", "o": {"0": [99, "", 10 ** 13]}})
    b.groups.on_cluster_change(world.now_ms)
    assert b.ask(GroupFetchOffsets(g, [["t", 0]])).offsets == [["t", 0, 99, ""]]
    # a comes back: the group moves back and b forgets its members
    world.status["a"] = "alive"
    b.groups.on_cluster_change(world.now_ms)
    assert b.ask(GroupHeartbeat(g, r2.member_id, r3.member_epoch, ["t"], [])).error == ErrorCode.COORDINATOR_MOVED
    assert b.ask(GroupList()).groups[0]["state"] == "unknown"


def test_offsets_survive_a_crash_and_are_published_again(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    r = join(a, g)
    a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 3, 42, "meta"]]))
    a.ask(GroupResetOffsets(g, [["t", 1, 1]]))   # refused: the group has a member
    assert a.replies[-1].error == ErrorCode.INVALID_REQUEST
    world.ns["a"] = {}     # a new life starts with an empty namespace
    again = Broker(world, "a", store=a.store.crash())
    assert again.ask(GroupFetchOffsets(g, [["t", 3]])).offsets == [["t", 3, 42, "meta"]]
    assert again.gossip.node_items("a", "off/")


def test_bad_group_ids_get_a_clear_error(world):
    a = Broker(world, "a")
    for msg in (GroupFindCoordinator(""), GroupFetchOffsets("x" * 300, None), GroupDescribe("")):
        assert a.ask(msg).error == ErrorCode.INVALID_REQUEST
    assert a.groups.handles(GroupList()) and not a.groups.handles(object())


def test_a_node_started_alone_gives_partitions_at_once_a_seeded_one_waits(world):
    alone = Broker(world, "a", seeded=False)
    g = group_on("a", ["a"])
    assert sorted(tuple(x) for x in join(alone, g).assignment) == [("t", p) for p in range(4)]
    other = World()
    seeded = Broker(other, "a")
    assert join(seeded, g).assignment == []


def test_commits_of_one_turn_share_its_sync_and_are_answered_after_it(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    r = join(a, g)
    world.events.clear()
    a.replies.clear()
    for offset in (5, 6, 7):   # three commits arrive in one turn
        a.groups.handle(b"client", offset, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, offset, ""]]))
    assert a.replies == [] and "sync" not in world.events   # held until the turn's sync
    a.data.commit_turn()
    assert world.events.count("sync") == 1
    assert [x.error for x in a.replies] == [0, 0, 0]
    assert world.events.index("sync") < world.events.index("reply GroupCommitResponse")
    assert a.ask(GroupFetchOffsets(g, [["t", 0]])).offsets == [["t", 0, 7, ""]]


def test_a_failed_turn_refuses_every_commit_it_held_and_keeps_the_synced_offset(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, ""]])).error == 0
    a.replies.clear()
    for offset in (8, 9):
        a.groups.handle(b"client", offset, GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, offset, ""]]))
    a.data.ok = False
    a.data.commit_turn()
    assert [x.error for x in a.replies] == [ErrorCode.STORAGE_ERROR] * 2
    a.data.ok = True
    assert a.ask(GroupFetchOffsets(g, [["t", 0]])).offsets == [["t", 0, 5, ""]]


def test_a_deleted_group_is_gone_from_every_view_and_its_garbage_is_collected(world):
    a, b, g, r = with_member(world)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 5, ""], ["t", 1, 6, ""]])).error == 0
    assert a.ask(GroupDelete(g)).error == ErrorCode.GROUP_NOT_EMPTY
    a.ask(GroupHeartbeat(g, r.member_id, -1, ["t"], []))
    world.events.clear()
    assert a.ask(GroupDelete(g)).error == 0
    # synced and gossiped on a, then on b (its other replica), then answered
    assert world.events == (["put offsets"] * 4 + ["sync", f"gossip off/{g}/t/0"]) * 2 + ["reply GroupDeleteResponse"]
    assert b.ask(GroupDelete(g)).error == ErrorCode.COORDINATOR_MOVED
    b.groups.on_cluster_change(world.now_ms)
    for n in (a, b):
        assert n.ask(GroupList()).groups == []
        assert n.ask(GroupFetchOffsets(g, [["t", 0]])).offsets == [["t", 0, -1, ""]]
    assert a.ask(GroupDelete(g)).error == ErrorCode.UNKNOWN_GROUP
    # a crash and restart does not bring it back (the tombstones are durable)
    world.ns["a"] = {}
    a = Broker(world, "a", store=a.store.crash())
    b.groups.on_cluster_change(world.now_ms)
    assert a.ask(GroupList()).groups == [] and b.ask(GroupList()).groups == []
    # past the tombstone horizon they go, from the store and from gossip
    world.now_ms += CONFIG.tombstone_ms + 20_000
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert a.store.items("offsets") == [] and a.gossip.node_items("a", "off/") == {}


def test_an_empty_group_past_the_offsets_retention_is_deleted_by_its_coordinator(world):
    a = Broker(world, "a")
    past_grace(world)
    g = group_on("a", ["a"])
    assert a.ask(GroupCommit(g, "", -1, [["t", 2, 9, ""]])).error == 0
    a.groups.tick(world.now_ms)
    world.now_ms += CONFIG.offsets_retention_ms - 1
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert a.ask(GroupList()).groups != []
    world.now_ms += 20_000
    world.events.clear()
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert world.events[:6] == ["put offsets"] * 4 + ["sync", f"gossip off/{g}/t/0"]   # nobody to answer
    assert a.ask(GroupList()).groups == []
    assert a.ask(GroupFetchOffsets(g, [["t", 2]])).offsets == [["t", 2, -1, ""]]


def test_a_broker_that_sees_a_minority_deletes_nothing_and_members_elsewhere_keep_their_offsets(world):
    a, b, c = Broker(world, "a"), Broker(world, "b"), Broker(world, "c")
    for n in (a, b, c):
        n.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    g = group_on("a", ["a", "b", "c"])
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 200, ""], ["t", 1, 7, ""]])).error == 0
    # b alone sees a and c dead: it would coordinate g, with no members, and refuses to delete it
    world.status.update(a="dead", c="dead")
    b.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    assert b.ask(GroupDelete(g)).error == ErrorCode.COORDINATOR_NOT_AVAILABLE
    world.now_ms += CONFIG.offsets_retention_ms + 20_000
    b.groups.tick(world.now_ms)
    b.data.commit_turn()
    adopted = [v for value in b.gossip.node_items("b", "off/").values() for v in value["o"].values()]
    assert adopted and all(v[0] >= 0 for v in adopted)   # nor does it expire it (it took the offsets over)
    # tombstones made anyway (a broker that coordinated g for a moment): a, where the
    # members are, commits its offsets again above them
    world.status.update(a="alive", c="alive")
    stamp = world.now_ms
    deleted_elsewhere(b, g, stamp)
    world.events.clear()
    a.groups.on_cluster_change(world.now_ms)
    a.data.commit_turn()
    # the tombstones of the partitions without an offset here are adopted (synced at once),
    # then the two offsets are committed again above the tombstones (and synced with the turn)
    assert world.events == ["put offsets"] * 2 + ["sync", f"gossip off/{g}/t/0"] + \
        ["put offsets"] * 2 + ["sync", f"gossip off/{g}/t/0"]
    for n in (a, b, c):
        n.groups.on_cluster_change(world.now_ms)
        assert {tp: v[0] for tp, v in n.groups.committed(g).items()} == {("t", 0): 200, ("t", 1): 7}
        assert all(v[2] > stamp for v in n.groups.committed(g).values())


def test_offsets_deleted_on_the_other_side_of_a_split_come_back_from_where_the_members_were(world):
    """A split: b (with c, a majority) deleted g, whose members were with a. When it heals g
    moves from a to b, and a, which had the members, commits their offsets again."""
    a, b, c = Broker(world, "a"), Broker(world, "b"), Broker(world, "c")
    g = next(x for x in (f"g{i}" for i in range(1000))
             if coordinator_for(x, ["a", "b", "c"]) == "b")
    world.status.update(b="dead", c="dead")          # a alone: it coordinates every group
    a.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 300, ""], ["t", 2, 9, ""]])).error == 0
    deleted_elsewhere(b, g, world.now_ms + 1)
    world.status.update(b="alive", c="alive")        # healed: g is b's again
    a.groups.on_cluster_change(world.now_ms)
    a.data.commit_turn()
    for n in (a, b, c):
        n.groups.on_cluster_change(world.now_ms)
        assert {tp: v[0] for tp, v in n.groups.committed(g).items()} == {("t", 0): 300, ("t", 2): 9}
    assert b.ask(GroupFetchOffsets(g, None)).offsets == [["t", 0, 300, ""], ["t", 2, 9, ""]]


def test_tombstones_that_arrive_after_the_group_moved_away_are_still_answered(world):
    """The heal's status change comes before the other side's namespace (gossip deltas are
    bounded): the tombstones arrive after g moved away from a, where its members were."""
    a, b, _ = Broker(world, "a"), Broker(world, "b"), Broker(world, "c")
    g = next(x for x in (f"g{i}" for i in range(1000)) if coordinator_for(x, ["a", "b", "c"]) == "b")
    world.status.update(b="dead", c="dead")
    a.groups.on_cluster_change(world.now_ms)
    past_grace(world)
    r = join(a, g)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 1, 50, ""]])).error == 0
    world.now_ms += 10
    deleted_at = world.now_ms - 5                    # b deleted g during the split, after that commit
    world.status.update(b="alive", c="alive")
    a.groups.on_cluster_change(world.now_ms)         # g moves to b; no tombstone known yet
    world.now_ms += 300
    deleted_elsewhere(b, g, deleted_at)
    a.groups.on_cluster_change(world.now_ms)
    a.data.commit_turn()
    b.groups.on_cluster_change(world.now_ms)
    assert b.ask(GroupFetchOffsets(g, None)).offsets == [["t", 1, 50, ""]]


def test_offsets_committed_again_in_a_failed_turn_are_committed_again_next_tick(world):
    a, b, g, r = with_member(world)
    assert a.ask(GroupCommit(g, r.member_id, r.member_epoch, [["t", 0, 200, ""]])).error == 0
    deleted_elsewhere(b, g, world.now_ms + 1)
    a.data.ok = False
    a.groups.on_cluster_change(world.now_ms)         # commits p0 again ... in a turn that fails
    a.data.commit_turn()
    assert a.groups.committed(g) == {}
    a.data.ok = True
    world.now_ms += 100
    a.groups.tick(world.now_ms)
    a.data.commit_turn()
    assert {tp: v[0] for tp, v in a.groups.committed(g).items()} == {("t", 0): 200}
