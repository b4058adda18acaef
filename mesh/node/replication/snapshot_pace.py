"""When the node stages its gossip snapshot (the whole gossip state, packed and written again).

It is staged once gossip moved (not on mere heartbeats), but:
- no sooner after the last one than ``COST_FACTOR`` times what that one cost: with 100,000
  committed offsets in gossip it is 8.7 MB and ~65 ms, on every commit anywhere in the
  cluster. What a restart would miss meanwhile its peers send again; what was acknowledged
  (topics, users, ACLs, moves) is persisted by its handler at once, offsets in their own
  database;
- in a turn that syncs anyway (a commit, an append), or alone after waiting ``ALONE_MS``
  for one: alone, its sync came just after every commit's, on each broker that gossips the
  offsets, and the quorum's answers waited behind it (``bench.group_commits``: ms on a
  busy disk).
A failed turn makes it due again at once (``failed``).
"""
from __future__ import annotations

__all__ = ["SnapshotPace", "COST_FACTOR", "ALONE_MS"]

COST_FACTOR = 10
ALONE_MS = 1_000


class SnapshotPace:
    def __init__(self) -> None:
        self.due = False       # gossip moved since the snapshot last staged
        self.due_ms = 0        # when it became due
        self.next_ms = 0       # not before: COST_FACTOR times what the last one cost

    def moved(self, now_ms: int) -> None:
        if not self.due:
            self.due, self.due_ms = True, now_ms

    def ready(self, now_ms: int, turn_syncs: bool) -> bool:
        """Stage it now? (Then call ``staged``.)"""
        if not self.due or now_ms < self.next_ms:
            return False
        return turn_syncs or now_ms - self.due_ms >= ALONE_MS

    def staged(self, started_ms: int, ended_ms: int) -> None:
        self.due = False
        self.next_ms = started_ms + COST_FACTOR * (ended_ms - started_ms)

    def failed(self) -> None:
        """The turn was rolled back: stage it again on the next good one."""
        self.next_ms = 0
