"""Each peer's identity as one ``ReplicaManager`` last heard it: ``(store id, life)`` on every
peer message (see the manager's "Lost state", rule 1), when it was first and last heard,
and the lives it left behind (a late message from one of those is dropped: it may claim
what is gone)."""
from __future__ import annotations

__all__ = ["PeerLives", "SAME", "NEW", "STALE"]

SAME, NEW, STALE = "same", "new", "stale"   # what ``heard`` found
NEVER = -(1 << 62)


class PeerLives:
    def __init__(self) -> None:
        self.stores: dict[str, str] = {}                  # peer -> store id, as last heard
        self.life: dict[str, tuple[str, int]] = {}        # peer -> (store, life) as last heard
        self.retired: dict[str, list[tuple[str, int]]] = {}   # peer -> identities it no longer has
        self.heard_at: dict[str, int] = {}                # peer -> tick its current identity was last heard
        self.since: dict[str, int] = {}                   # peer -> tick its current identity was first heard

    def heard_tick(self, peer: str) -> int:
        return self.heard_at.get(peer, NEVER)

    def heard(self, src: str, store: str, life: int, now: int,
              election_ticks: int) -> tuple[str, tuple[str, int] | None]:
        """A message from ``src`` as ``(store, life)``: (SAME, None), (STALE, None) for a life
        it left behind, or (NEW, the identity it replaced or None when first heard)."""
        ident = (store, life)
        last = self.life.get(src)
        if last == ident:
            self.heard_at[src] = now
            return SAME, None
        retired = self.retired.setdefault(src, [])
        if ident in retired:
            if now - self.heard_at.get(src, 0) < election_ticks:
                return STALE, None   # a late message from a life that ended
            retired.remove(ident)  # what replaced it went silent: it was the late one ("Lost state" 1)
        self.life[src] = ident
        self.heard_at[src] = self.since[src] = now
        self.stores[src] = store
        if last is not None:
            retired.append(last)
            del retired[:-16]
        return NEW, last

    def new_lives(self, now: int, window: int) -> set[str]:
        """Peers whose current life we have known for less than ``window`` ticks."""
        return {peer for peer, since in self.since.items() if now - since < window}
