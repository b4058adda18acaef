"""Which quiet partitions of one ``ReplicaManager`` depend on which peer (quiescence, rule 10
of ``mesh.raft.partition``): a quiet leader on each of its followers' nodes, a quiet
follower on its leader's node. The manager wakes them by peer: when a peer falls silent
for an election timeout (``check_silences``), is heard again after that, or restarts."""
from __future__ import annotations

from typing import Callable

__all__ = ["QuietIndex"]


class QuietIndex:
    def __init__(self) -> None:
        self.leaders: dict[str, set[int]] = {}    # peer -> quiet partitions led here it follows
        self.followers: dict[str, set[int]] = {}  # leader node -> quiet partitions following it here
        self.silent: set[str] = set()             # peers of quiet partitions found silent (woken once)

    def __bool__(self) -> bool:
        return bool(self.leaders or self.followers)

    def add(self, p) -> None:
        """``p`` went quiet: index it under the peers it depends on."""
        if p.role.value == "leader":
            p.quiet_peers = tuple(sorted(p.progress))
            for peer in p.quiet_peers:
                self.leaders.setdefault(peer, set()).add(p.pid)
        else:
            assert p.leader is not None, p.pid
            p.quiet_leader = p.leader
            self.followers.setdefault(p.leader, set()).add(p.pid)

    def remove(self, p) -> None:
        for peer in p.quiet_peers:
            _unindex(self.leaders, peer, p.pid)
        if p.quiet_leader is not None:
            _unindex(self.followers, p.quiet_leader, p.pid)
        p.quiet_peers, p.quiet_leader = (), None

    def led_by(self, peer: str) -> list[int]:
        """The quiet partitions that follow ``peer`` here, sorted."""
        return sorted(self.followers.get(peer, ()))

    def following(self, peer: str) -> list[int]:
        """The quiet partitions led here that ``peer`` follows, sorted."""
        return sorted(self.leaders.get(peer, ()))

    def check_silences(self, now: int, election_ticks: int, heard: Callable[[str], int],
                       wake: Callable[[int], None]) -> None:
        """A peer silent for an election timeout: the quiet followers it leads wake (their
        election timers where they would stand: they campaign as usual); the quiet leaders
        it follows wake once (check-quorum runs; they go quiet again without it if a quorum
        is left, and wake when it is heard again)."""
        for peer in sorted(self.followers.keys() | self.leaders.keys()):
            if now - heard(peer) < election_ticks:
                continue
            for pid in self.led_by(peer):
                wake(pid)
            if peer not in self.silent:
                self.silent.add(peer)
                for pid in self.following(peer):
                    wake(pid)


def _unindex(index: dict[str, set[int]], key: str, pid: int) -> None:
    pids = index.get(key)
    if pids is not None:
        pids.discard(pid)
        if not pids:
            del index[key]
