"""The node's identity rules as a small pure state machine: no store, no clock, no log.

A node's life has a generation (bumped and synced at every start, ``storage.datadir``) and
its store a store id. The state says whether this store's replicas may vote:

- ``unconfirmed``: no peer has shown its view of this node yet (no votes, as a store that
  may have gone back in time could otherwise vote twice in one term);
- ``confirmed``: a peer showed it and nothing conflicts, or there is nobody to ask;
- ``lost``: the store lost state (empty or older than its identity file, or a peer
  remembers a newer life of this node); its replicas refill from their leaders and vote
  again once every one has caught up and ``recovering=False`` is durable.

Once a majority of peers held a confirmed life (``majority_seen``), a row claiming a newer
life of this node is *refuted* instead (SWIM's refutation with a higher incarnation): a
generation above the claim is persisted and spoken, and no state is declared lost.

The caller (``mesh.node.loop.Node``) does the effects each transition names: persist a
generation, tell the replication core (``confirm_identity``, ``declare_lost_state``), speak
as the new generation (``Gossip.reincarnate``). Generation bumps for lost state are limited
(``MAX_BUMPS`` per ``BUMP_WINDOW_MS``): two live processes with one ``--id`` would push each
other's generation up without end.
"""
from __future__ import annotations

import collections

UNCONFIRMED, CONFIRMED, LOST = "unconfirmed", "confirmed", "lost"
MAX_BUMPS, BUMP_WINDOW_MS = 3, 60_000


class Identity:
    def __init__(self, generation: int, store_id: str, *, lost: bool, alone: bool) -> None:
        """``lost``: the store was found empty or older than its identity file at start;
        ``alone``: no seed and no other member known (nobody to confirm it: confirmed)."""
        self.generation = generation
        self.store_id = store_id
        self.state = LOST if lost else (CONFIRMED if alone else UNCONFIRMED)
        self.refutes = False   # a majority of peers held this confirmed life: later conflicts are forged
        self._bumps: collections.deque[int] = collections.deque()

    @property
    def may_vote(self) -> bool:
        return self.state == CONFIRMED

    @property
    def learning(self) -> bool:
        """Not yet told by a peer what the cluster remembers of this node."""
        return self.state == UNCONFIRMED

    def seen_by_peer(self) -> bool:
        """A peer showed its view of this node and nothing conflicts: True if this confirms
        the identity now (the caller tells the replication core)."""
        if self.state != UNCONFIRMED:
            return False
        self.state = CONFIRMED
        return True

    def majority_seen(self) -> bool:
        """A majority of the peers showed they hold this life (``Gossip.majority_confirmed``):
        True if, being confirmed, this life refutes conflicting rows from now on (for the
        process's life). No majority can have held another life of this node since (R2 in
        ``mesh.gossip.membership``), so such a row is a forgery (open mode trusts local
        processes: issue 39 finding 9) or a second process with this id, never lost state."""
        if self.refutes or self.state != CONFIRMED:
            return False
        self.refutes = True
        return True

    def next_generation(self, conflict: int, now_ms: int) -> int | None:
        """A peer remembers generation ``conflict`` (>= ours): the generation to persist
        before speaking as it, or None while bumps are over their rate (the caller waits)."""
        while self._bumps and now_ms - self._bumps[0] >= BUMP_WINDOW_MS:
            self._bumps.popleft()
        if len(self._bumps) >= MAX_BUMPS:
            return None
        self._bumps.append(now_ms)
        return max(conflict, self.generation) + 1

    @property
    def bumps(self) -> int:
        return len(self._bumps)

    def refuted(self, generation: int) -> None:
        """``generation`` is durable and spoken, above a forged claim: no state was lost."""
        self.generation = generation

    def reincarnated(self, generation: int) -> bool:
        """``generation`` is durable and spoken: lost state. True if the replication core
        must be told now (it was not lost already)."""
        self.generation = generation
        if self.state == LOST:
            return False
        self.state = LOST
        return True

    def refilled(self) -> bool:
        """Every replica refilled and ``recovering=False`` is durable: True if this ends the
        lost state (voting again)."""
        if self.state != LOST:
            return False
        self.state = CONFIRMED
        return True
