"""What a node publishes about its partitions (mesh/node/peers/publish.py): per-topic chunks,
written only when they change, leadership batched per turn, stale keys deleted."""
from __future__ import annotations

from mesh.cluster import keys
from mesh.cluster.catalog import Topic, cluster_pid
from mesh.node.peers.publish import Publisher
from mesh.wire.topic_config import normalize_config

UUID = "0123456789abcdef"


class Gossip:
    def __init__(self):
        self.ns: dict = {}
        self.writes = 0

    def set_local(self, key, value):
        self.ns[key] = value
        self.writes += 1

    def delete_local(self, key):
        del self.ns[key]
        self.writes += 1


class Catalog:
    def __init__(self, *topics: Topic):
        self.topics = {t.name: t for t in topics}
        self.local = {pid: (t.name, p) for t in topics for p, pid in enumerate(t.pids) if pid is not None}


class Replicas:
    def __init__(self):
        self.leading: dict[int, int] = {}      # pid -> epoch
        self.refilling: set[int] = set()

    def is_leader(self, pid):
        return pid in self.leading

    def leader(self, pid):
        return ("n1", self.leading[pid]) if pid in self.leading else (None, 0)

    def commit_offset(self, pid):
        return 5

    def recovering(self, pid):
        return pid in self.refilling


class Store:
    def log_start(self, pid):
        return 0

    def log_end(self, pid):
        return 7


def wide(n: int = 1200) -> Topic:
    return Topic("w", UUID, n, 1, normalize_config({}), (("n1",),) * n,
                 tuple(cluster_pid(UUID, p) for p in range(n)))


def make(*topics):
    g, cat, reps = Gossip(), Catalog(*topics), Replicas()
    return Publisher("n1", g, cat, Store(), reps), g, cat, reps


def test_leadership_is_written_per_chunk_once_per_turn():
    pub, g, cat, reps = make(wide())
    for p in range(0, 1200, 7):
        reps.leading[cluster_pid(UUID, p)] = 2
        pub.leadership(cluster_pid(UUID, p), "n1", 2)
    assert g.writes == 0
    pub.flush()
    assert sorted(g.ns) == [keys.lead_key("w", k) for k in range(3)] and g.writes == 3
    assert g.ns[keys.lead_key("w", 2)]["1197"] == 2
    reps.leading = {pid: 2 for pid in reps.leading if cat.local[pid][1] >= keys.PARTITION_CHUNK}
    pub.leadership(cluster_pid(UUID, 0), None, 3)
    pub.flush()
    assert keys.lead_key("w", 0) not in g.ns and g.writes == 4    # lost every partition of chunk 0


def test_stats_change_only_what_moved_and_forget_deleted_topics():
    pub, g, cat, reps = make(wide())
    reps.leading = {cluster_pid(UUID, p): 1 for p in (3, 700)}
    reps.refilling = {cluster_pid(UUID, 1100)}
    pub.stats()
    assert g.ns == {keys.stats_key("w", 0): {"3": [0, 7, 5]}, keys.stats_key("w", 1): {"700": [0, 7, 5]},
                    keys.lead_key("w", 0): {"3": 1}, keys.lead_key("w", 1): {"700": 1},
                    keys.recovering_key("w", 2): [1100]}
    writes = g.writes
    pub.stats()
    assert g.writes == writes                                      # idle: nothing written
    cat.topics, cat.local = {}, {}                                 # the topic was deleted
    pub.stats()
    assert g.ns == {}
