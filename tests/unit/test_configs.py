"""Where replicas live (``mesh.cluster.configs``): the effective config overlay and rule 3,
when a local replica that gossip no longer names may go."""
from __future__ import annotations

from mesh.cluster import keys
from mesh.cluster.catalog import cluster_pid
from mesh.cluster.configs import PartitionConfig, keep_local
from tests.unit.test_catalog import UUID_A, make, put, registers

QUIET = 5_000


def cfg(version, voters, learners=(), committed=True):
    return PartitionConfig(version, 1, tuple(voters), tuple(learners), committed)


def test_a_named_member_or_a_replica_hearing_its_leader_always_stays():
    forged = cfg(2 ** 40 - 1, ["zz"])
    assert keep_local("n1", cfg(3, ["n1", "n2"]), (3, ("n1", "n2"), ()), QUIET * 10, QUIET)
    assert keep_local("n1", forged, (3, ("n1", "n2"), ()), 0, QUIET)            # leads, or just heard
    assert keep_local("n1", forged, (3, ("n1", "n2"), ()), QUIET - 1, QUIET)
    assert keep_local("n1", forged, None, QUIET * 10, QUIET)                      # not loaded yet


def test_a_silent_voter_goes_only_for_a_committed_config_at_least_as_new():
    mine = (3, ("n1", "n2", "n3"), ())
    assert not keep_local("n1", cfg(4, ["n2", "n3"]), mine, QUIET, QUIET)
    assert not keep_local("n1", cfg(3, ["n2", "n3"]), mine, QUIET, QUIET)
    assert keep_local("n1", cfg(4, ["n2", "n3"], committed=False), mine, QUIET, QUIET)
    assert keep_local("n1", cfg(2, ["n2", "n3"]), mine, QUIET, QUIET)           # older than our log


def test_a_silent_learner_or_a_removed_replica_goes():
    # the orphan learner: its leader died before the learner was committed; the new
    # leader's config is older than the learner's own log
    assert not keep_local("n4", cfg(4, ["n1", "n2"]), (5, ("n1", "n2"), ("n4",)), QUIET, QUIET)
    assert not keep_local("n3", cfg(6, ["n1", "n2"], committed=False), (6, ("n1", "n2"), ()), QUIET, QUIET)


def test_reconcile_never_drops_a_replica_on_a_register_alone():
    for node in ("n1", "n2"):
        cat, gossip, store = make(node)
        put(gossip, registers("a", UUID_A, [["n1", "n2"]]))
        pid = cluster_pid(UUID_A, 0)
        cat.reconcile()
        bogus = {"v": 2 ** 40 - 1, "t": 0, "voters": ["zz"], "learners": [], "committed": True}
        put(gossip, {keys.pconf_key("a", UUID_A, 0): bogus})
        added, removed = cat.reconcile()
        assert not removed and store.partitions() and pid in cat.local
        assert cat.strays() == [pid]            # a candidate, for keep_local to judge
        assert cat.topics["a"].replicas[0] == ("zz",) and cat.topics["a"].pids[0] is None


def test_a_learner_is_hosted_from_the_register():
    cat, gossip, store = make("n4")
    put(gossip, registers("a", UUID_A, [["n1", "n2"]]))
    assert cat.reconcile() == (set(), set())
    put(gossip, {keys.pconf_key("a", UUID_A, 0): {"v": 1, "t": 2, "voters": ["n1", "n2"], "learners": ["n4"],
                                                  "committed": False}})
    added, _ = cat.reconcile()
    pid = cluster_pid(UUID_A, 0)
    assert added == {pid}
    c = cat.config_of_pid(pid)
    assert (c.version, c.voters, c.learners, c.committed) == (1, ("n1", "n2"), ("n4",), False)
