"""The node-level simulation (tests/sim/node_sim.py): seeded runs of the real raft host and
data path over MemoryStore and the shared simulated network, and proof that its checkers
bite. More seeds: ``python -m tests.sim.node_sim --seed 0 --seeds 200``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from mesh.node.replication.raft_host import ReplicaHost
from mesh.raft import Ready
from mesh.wire.errors import ErrorCode
from tests.sim.node_parts import SIM_REPLICATION
from tests.sim.node_sim import NodeSim, NodeSimConfig, SimFailure, main, run

STEPS = 2000
ALWAYS_TICKING = dataclasses.replace(SIM_REPLICATION, quiesce_after_beats=0)   # schedules found before quiescence
SHAPES = [  # (brokers, partitions, rf, seeds, steps)
    (3, 3, 3, range(0, 4), STEPS),
    (5, 4, 3, range(100, 101), STEPS),
    (2, 2, 2, range(200, 201), 1000),   # every fault stops a two-replica quorum: slower
]
_runs: dict[int, NodeSim] = {}


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level("CRITICAL")  # failed commits are logged by the shells on purpose


@pytest.mark.parametrize("brokers, partitions, rf, seeds, steps", SHAPES,
                         ids=[f"{b}brokers-{p}parts-rf{rf}-seeds{s.start}-{s.stop - 1}" for b, p, rf, s, _ in SHAPES])
def test_seeded_runs_keep_every_invariant(brokers, partitions, rf, seeds, steps):
    for seed in seeds:
        sim = _runs[seed] = run(NodeSimConfig(seed=seed, steps=steps, brokers=brokers, partitions=partitions, rf=rf))
        assert sim.counts["acked"] > 50 and sim.counts["fetched"] > 50, sim.summary()


def test_faults_are_really_injected():
    totals: dict[str, int] = {}
    for seed in range(4):
        sim = _runs.get(seed) or run(NodeSimConfig(seed=seed, steps=STEPS))
        for k, v in sim.counts.items():
            totals[k] = totals.get(k, 0) + v
    for kind in ("crash", "mid_turn_crash", "failed_commit", "pause", "partition", "retries"):
        assert totals[kind] > 0, totals


@pytest.mark.parametrize("early", [False, True])
def test_a_broker_that_lost_its_disk_refills_and_nothing_acknowledged_is_lost(early):
    for seed in range(12):   # the first seed whose schedule wipes a disk (schedules move with the code)
        sim = run(NodeSimConfig(seed=seed, steps=STEPS, wipes=True, early_appends=early))
        if sim.counts["wipe"] > 0:
            break
    assert sim.counts["wipe"] > 0 and sim.counts["acked"] > 50, sim.summary()


@pytest.mark.parametrize("seed", [40, 164])
def test_wiped_disks_never_stall_a_partition(seed):
    """Seed 40: a late message from a life never heard retired a peer's live identity for
    good. Seed 164: a rebuild after refilling declared lost state again, so two replicas of
    a partition were recovering at once and no leader could be elected. Both replay the
    schedule they were found with: appends and acks only after the leader's sync,
    producers that back off after every NOT_LEADER, no quiescence and every tick due run in
    one turn (both came later). Schedules move with the code: when a change of timing
    moves a seed's wipes away (the election timeouts' ranks did for seed 40), the first
    seed after it whose schedule wipes a disk runs instead."""
    for s in range(seed, seed + 25):
        sim = run(NodeSimConfig(seed=s, steps=1500, wipes=True, early_appends=False, early_acks=False,
                                follow_hints=False, replication=ALWAYS_TICKING, catch_up_ticks=True))
        if sim.counts["wipe"] > 0:
            break
    assert sim.counts["wipe"] > 0, sim.summary()


def test_leaders_send_appends_before_their_sync():
    sim = _runs.get(0) or run(NodeSimConfig(seed=0, steps=STEPS))
    assert sim.counts["early_appends"] > 50, sim.summary()


def test_an_early_append_of_a_leader_whose_epoch_is_not_durable_is_caught(monkeypatch):
    """The planted bug: appends leave before the sync even for a partition whose hard state
    (here a new leader's epoch marker) this turn wrote."""
    def send_every_append(self):
        self._hard = set()
        send_early(self)

    send_early = ReplicaHost._send_early
    monkeypatch.setattr(ReplicaHost, "_send_early", send_every_append)
    with pytest.raises(SimFailure) as err:
        run(NodeSimConfig(seed=0, steps=STEPS))
    assert "before the turn's commit" in str(err.value) and "epoch" in str(err.value), err.value


def test_a_run_is_a_function_of_its_seed():
    a, b = run(NodeSimConfig(seed=5, steps=600)), run(NodeSimConfig(seed=5, steps=600))
    assert a.trace.hexdigest() == b.trace.hexdigest() and a.counts == b.counts
    assert run(NodeSimConfig(seed=6, steps=600)).trace.hexdigest() != a.trace.hexdigest()


def test_a_host_that_sends_before_the_commit_is_caught(monkeypatch):
    """The planted bug: the raft host sends what the core returns at once, before the turn's
    commit made the vote or the appended data durable."""
    cfg = NodeSimConfig(seed=3, steps=STEPS)
    sim = NodeSim(cfg)
    apply = ReplicaHost.apply

    def eager_apply(self, ready):
        sim.send_now(self.node_id, ready.messages)
        apply(self, dataclasses.replace(ready, messages=[]))

    monkeypatch.setattr(ReplicaHost, "apply", eager_apply)
    with pytest.raises(SimFailure) as err:
        run(cfg, sim)
    text = str(err.value)
    assert "shell contract" in text and "before the turn's commit" in text, text
    assert "reproduce with: python -m tests.sim.node_sim --seed 3 " in text


def test_a_turn_that_sends_before_its_commit_is_caught(monkeypatch):
    """The planted bug, in the node's own turn (``mesh.node.turn``, which the simulation
    runs): the messages the host held are sent before the turn's commit, not after it."""
    from mesh.node.turn import BrokerTurn
    commit = BrokerTurn._commit

    def send_then_commit(self):
        held, self.replicas._held = self.replicas._held, []
        for e in held:
            self.replicas._send(e.dest, e.msg, e.payload)
        return commit(self)

    monkeypatch.setattr(BrokerTurn, "_commit", send_then_commit)
    with pytest.raises(SimFailure) as err:
        run(NodeSimConfig(seed=0, steps=STEPS))
    assert "shell contract" in str(err.value) and "before the turn's commit" in str(err.value), str(err.value)


def test_a_host_that_persists_after_sending_is_caught(monkeypatch):
    """The planted bug: messages leave after the commit, but the state they claim (a vote,
    a new term) is written only after them, into the next turn's transaction."""
    apply, after_commit = ReplicaHost.apply, ReplicaHost.after_commit
    late: dict[int, list] = {}

    def apply_without_persist(self, ready):
        late.setdefault(id(self), []).extend(ready.persist)
        apply(self, dataclasses.replace(ready, persist=[]))

    def after_commit_then_persist(self, ok):
        out = after_commit(self, ok)
        apply(self, Ready(persist=late.pop(id(self), [])))
        return out

    monkeypatch.setattr(ReplicaHost, "apply", apply_without_persist)
    monkeypatch.setattr(ReplicaHost, "after_commit", after_commit_then_persist)
    with pytest.raises(SimFailure) as err:
        run(NodeSimConfig(seed=1, steps=STEPS))
    assert "shell contract" in str(err.value) and "durable" in str(err.value), err.value


def test_a_host_that_keeps_its_core_after_a_failed_commit_is_caught(monkeypatch):
    monkeypatch.setattr(ReplicaHost, "_rebuild", lambda self: None)
    for seed in range(10):
        try:
            run(NodeSimConfig(seed=seed, steps=STEPS))
        except SimFailure as exc:
            assert "not rebuilt" in str(exc) or "shell contract" in str(exc), exc
            return
    pytest.fail("no seed noticed a core kept after a failed commit")


def test_the_command_line_replays_a_seed(capsys):
    assert main(["--seed", "1", "--steps", "300"]) == 0
    assert "seed 1:" in capsys.readouterr().out


def test_requests_held_through_handovers_are_all_run_again():
    """A leader handing over holds produce requests (``DataPath._hold``) and runs them again
    when the handover ends; ``run`` checks that nothing acknowledged is lost, doubled or
    reordered meanwhile. These seeds must hold some, or the check proves nothing."""
    held = 0
    for seed in range(6):
        sim = run(NodeSimConfig(seed=seed, steps=STEPS))
        held += sum(b.data.held_total for b in sim.brokers.values())
        assert all(b.data.holding == 0 for b in sim.brokers.values() if b.up), sim.summary()
    assert held > 0


def test_graceful_stops_hand_leaderships_over_and_lose_nothing():
    """With ``stops``, a third of the crashes are graceful: the broker first hands what it
    leads to caught-up replicas (``ReplicaHost.hand_over_all``, as ``mesh.node.lifecycle.shutdown``
    does), producers held meanwhile, then stops. Nothing acknowledged may be lost, doubled
    or reordered; these seeds must hand some leaderships over, or the check proves nothing."""
    stops = handed = 0
    for seed in range(4):
        sim = run(NodeSimConfig(seed=seed, steps=STEPS, stops=True))
        stops += sim.counts["stop"]
        handed += sim.counts["handed_over"]
    assert stops > 0 and handed > 0, (stops, handed)


def test_a_client_request_is_handled_at_most_once(monkeypatch):
    """A request travels once over its TCP connection (ZeroMQ never delivers it twice), and
    the producer's rules take "refused before any append" to mean "not stored by this
    attempt" (sequencer rule 8). The simulator duplicated client requests like peer
    messages, and seeds 1281 and 5335 then stored a batch twice: a request was refused
    (its broker had not appended the batch before it yet) and its twin, arriving later,
    was stored. Peer messages and answers are still duplicated."""
    handled = Counter()
    orig = NodeSim._client_in

    def client_in(self, b, src, frames):
        handled[(src, frames[1])] += 1
        orig(self, b, src, frames)
    monkeypatch.setattr(NodeSim, "_client_in", client_in)
    sim = run(NodeSimConfig(seed=1281, steps=1500, dup=0.2))
    assert sim.net.stats["duplicated"] > 100 and handled, sim.summary()
    assert max(handled.values()) == 1, [k for k, n in handled.items() if n > 1][:5]


def test_a_doomed_turn_sends_no_early_append(monkeypatch):
    """An unexpected error after a produce request's batch was staged dooms the turn, and
    the request is answered with an ErrorResponse: "not written" (the client may then fail
    it as certainly not written, or number it again under a fresh producer id). The turn's
    early appends left all the same, so the followers could store the batch and a new
    leader commit it (found by review). A doomed turn now sends nothing."""
    from mesh.node.data.datapath import DataPath
    from mesh.raft import ReplAppend
    from mesh.wire import messages as m
    state = {"calls": 0, "doomed": [], "leaked": []}
    on_produce = DataPath.on_produce

    def failing_on_produce(self, *args, **kwargs):
        staged = len(self._staged)
        on_produce(self, *args, **kwargs)
        if len(self._staged) > staged:
            state["calls"] += 1
            if state["calls"] % 7 == 0:
                raise RuntimeError("planted: after the batch was staged")
    monkeypatch.setattr(DataPath, "on_produce", failing_on_produce)
    client_in = NodeSim._client_in

    def client_in_as_the_dispatcher(self, b, src, frames):
        try:
            client_in(self, b, src, frames)
        except RuntimeError:   # what Dispatcher.handle does with an unexpected error
            b.data.doom("planted")
            state["doomed"].append(b.id)
            self._reply(b, src.encode(), int.from_bytes(frames[1], "big"),
                        m.ErrorResponse(int(ErrorCode.INVALID_REQUEST), "request could not be handled"))
    monkeypatch.setattr(NodeSim, "_client_in", client_in_as_the_dispatcher)
    peer_send = NodeSim._peer_send

    def watched_peer_send(self, b, dest, msg, payload):
        if type(msg) is ReplAppend and b.data.doomed:
            state["leaked"].append((b.id, dest))
        peer_send(self, b, dest, msg, payload)
    monkeypatch.setattr(NodeSim, "_peer_send", watched_peer_send)
    sim = NodeSim(NodeSimConfig(seed=3, steps=600, faults=False))
    sim.run_steps(600)
    assert state["doomed"], "no turn was doomed"
    assert not state["leaked"], state["leaked"][:5]
