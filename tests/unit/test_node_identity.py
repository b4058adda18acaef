"""The node's identity rules (``mesh.node.lifecycle.identity``): who may vote, and lost state."""
from mesh.node.lifecycle.identity import BUMP_WINDOW_MS, CONFIRMED, LOST, MAX_BUMPS, UNCONFIRMED, Identity


def test_a_node_with_peers_to_ask_votes_only_once_a_peer_showed_its_view():
    ident = Identity(4, "s1", lost=False, alone=False)
    assert ident.state == UNCONFIRMED and ident.learning and not ident.may_vote
    assert ident.seen_by_peer() is True            # the caller tells the replication core once
    assert ident.state == CONFIRMED and ident.may_vote and not ident.learning
    assert ident.seen_by_peer() is False


def test_a_node_alone_is_confirmed_at_once_and_a_lost_store_never_is_by_a_peer():
    assert Identity(1, "s", lost=False, alone=True).may_vote
    lost = Identity(1, "s", lost=True, alone=True)
    assert lost.state == LOST and not lost.may_vote and not lost.learning
    assert lost.seen_by_peer() is False and lost.state == LOST


def test_a_newer_life_remembered_by_a_peer_gives_a_generation_above_both():
    ident = Identity(5, "s", lost=False, alone=False)
    assert ident.next_generation(9, now_ms=0) == 10
    assert ident.generation == 5                  # not spoken before it is durable
    assert ident.reincarnated(10) is True         # the replication core is told once
    assert ident.generation == 10 and ident.state == LOST and not ident.may_vote
    assert ident.next_generation(3, now_ms=1) == 11
    assert ident.reincarnated(11) is False        # lost already


def test_generation_bumps_are_limited_per_window():
    ident = Identity(1, "s", lost=False, alone=False)
    gens = [ident.next_generation(ident.generation, now_ms=i) for i in range(MAX_BUMPS + 1)]
    assert gens[-1] is None and None not in gens[:-1]
    assert ident.next_generation(1, now_ms=BUMP_WINDOW_MS) is not None   # the first bump left the window


def test_lost_state_ends_only_when_refilled():
    ident = Identity(2, "s", lost=True, alone=False)
    assert ident.refilled() is True and ident.state == CONFIRMED and ident.may_vote
    assert Identity(2, "s", lost=False, alone=False).refilled() is False


def test_a_life_a_majority_held_refutes_conflicts_instead_of_losing_state():
    """Issue 39 finding 9: forged rows at generation + 5 for every broker made all three
    declare lost state; a life a majority confirmed takes a generation above the claim and
    stays confirmed (SWIM's refutation)."""
    from mesh.node.lifecycle.identity import CONFIRMED, UNCONFIRMED, Identity
    ident = Identity(4, "s", lost=False, alone=False)
    assert ident.state == UNCONFIRMED and not ident.majority_seen()   # only a confirmed life
    assert ident.seen_by_peer() and ident.majority_seen() and ident.refutes
    assert not ident.majority_seen()                                    # once
    gen = ident.next_generation(9, now_ms=0)
    ident.refuted(gen)
    assert (ident.generation, ident.state, ident.may_vote) == (10, CONFIRMED, True)
