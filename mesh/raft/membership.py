"""Raft membership change per partition: configurations, their history in the log, and
the rule for which change may come next. Pure data and functions; ``mesh.raft.partition``
applies them.

Theory of operation
===================

- **Config.** ``Config(version, term, voters, learners)``: ``voters`` ordered (the first
  one is the preferred leader), ``learners`` receive the log but never vote, campaign or
  count for commit. ``term`` is the term of the leader that created it (0 for the initial
  one), so ``ident = (version, term)`` names a config uniquely: one leader per term, and
  it numbers its configs ``latest.version + 1``. Version 0 is the topic's replica list.
- **History: configs in the log.** Each replica keeps zero-width *markers*
  ``[(offset, Config), ...]``, ascending (several may share an offset): a leader records a
  new config at its log end, like the epoch marker. A replica always uses the LATEST
  config in its log, committed or not (Raft dissertation 4.1). The marker *in force* at
  offset ``o`` is the last one at or below ``o`` (the first one below the first marker:
  older markers were trimmed, and that region is committed).
- **Markers follow the log.** A truncation to ``o`` drops markers past ``o``. An append
  carries the leader's markers from the one in force at its ``prev_offset`` up to its end
  (``window``); a follower that accepted it replaces its own markers in that window
  (``replace_window``). Markers of the current term are kept even when a carried window
  lacks them: only the current leader creates them and it never removes its own, so a
  window lacking one is a reordered older message. Anything else a follower holds in the
  window that the leader lacks (an uncommitted config of a deposed leader) disappears.
- **Votes see configs.** Log comparisons in elections are (last epoch, end offset, latest
  config version): a marker is a zero-width entry, and a candidate missing a config
  entry that a voter holds has the shorter log (as in Raft, where it is a real entry).
- **Bounded.** ``trim`` keeps the newest committed marker and everything after it; with
  one uncommitted change at a time that is one or two.
- **Single-server changes** (``check_step``): add one learner; remove one learner; promote
  one learner to voter (at any position); remove one voter other than the leader; reorder
  the voters (same set: a new preferred leader). One step changes the voter set by at most
  one server, so any majority of the old voters and any majority of the new ones share a
  replica; the leader allows a step only when the latest config is committed and its own
  epoch marker is committed (Ongaro's fix), which makes one uncommitted change at a time.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Config", "History", "check_step", "initial_config", "MAX_VERSION", "MAX_MARKERS",
           "MAX_NODE_ID", "config_to_wire", "config_from_wire"]

MAX_VERSION = 1 << 40     # config versions: one per change, never reached honestly
MAX_MARKERS = 16          # markers one append row may carry (a history holds two or three)
MAX_NODE_ID = 255         # characters of a node id in a carried config


@dataclass(frozen=True, slots=True)
class Config:
    version: int
    term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @property
    def ident(self) -> tuple[int, int]:
        return (self.version, self.term)

    def describe(self) -> dict:
        return {"v": self.version, "t": self.term, "voters": list(self.voters), "learners": list(self.learners)}


def initial_config(replicas: Iterable[str]) -> Config:
    return Config(0, 0, tuple(replicas), ())


def config_to_wire(offset: int, c: Config) -> list:
    return [offset, c.version, c.term, list(c.voters), list(c.learners)]


def config_from_wire(raw: object, max_members: int) -> tuple[int, Config]:
    """``(offset, Config)`` from its wire / persisted form; ValueError naming the problem."""
    if not isinstance(raw, (list, tuple)) or len(raw) < 5:
        raise ValueError("a config marker is [offset, version, term, voters, learners]")
    offset, version, term, voters, learners = raw[:5]
    for name, v, hi in (("offset", offset, 1 << 62), ("version", version, MAX_VERSION), ("term", term, 1 << 40)):
        if type(v) is not int or not 0 <= v < hi:
            raise ValueError(f"config {name} out of range")
    for name, ids, lo in (("voters", voters, 1), ("learners", learners, 0)):
        if not isinstance(ids, (list, tuple)) or not lo <= len(ids) <= max_members:
            raise ValueError(f"config {name}: a list of {lo}..{max_members} node ids")
        for n in ids:
            if type(n) is not str or not 0 < len(n) <= MAX_NODE_ID:
                raise ValueError(f"config {name}: node ids are strings of 1..{MAX_NODE_ID} characters")
    c = Config(version, term, tuple(voters), tuple(learners))
    if len(set(c.members)) != len(c.members) or len(c.members) > max_members:
        raise ValueError("config members must be distinct and at most the replica bound")
    return offset, c


def check_step(old: Config, voters: tuple[str, ...], learners: tuple[str, ...], leader: str) -> str | None:
    """Why going from ``old`` to (``voters``, ``learners``) is not one allowed single-server
    step led by ``leader`` (None: allowed)."""
    members = voters + learners
    if not voters:
        return "a config needs at least one voter"
    if len(set(members)) != len(members):
        return "voters and learners must be distinct"
    if leader not in voters:
        return f"the leader {leader} cannot remove or demote itself: transfer leadership first"
    ov, ol, nv, nl = set(old.voters), set(old.learners), set(voters), set(learners)
    if nv == ov and nl == ol:
        if voters == old.voters:
            return "no change"
        return None                                   # reorder: a new preferred leader
    if nv == ov and voters != old.voters:
        return "reorder the voters in a step of its own"
    if nv == ov:
        added, removed = nl - ol, ol - nl
        if len(added) + len(removed) == 1:
            return None                               # add or remove one learner
        return "add or remove one learner at a time"
    if nl == ol - (nv - ov) and len(nv - ov) == 1 and ov <= nv:
        promoted = next(iter(nv - ov))
        if promoted not in ol:
            return f"{promoted} must join as a learner first"
        if tuple(v for v in voters if v != promoted) != old.voters:
            return "promote one learner without reordering the other voters"
        return None                                   # promote one learner
    if nl == ol and len(ov - nv) == 1 and nv <= ov:
        if tuple(v for v in old.voters if v in nv) != voters:
            return "remove one voter without reordering the others"
        return None                                   # remove one voter (not the leader: checked above)
    return "one single-server step at a time (add/remove a learner, promote a learner, remove a voter, reorder)"


class History:
    """A replica's config markers ``[(offset, Config), ...]`` (never empty)."""
    __slots__ = ("_offsets", "_configs", "_markers")

    def __init__(self, markers: Iterable[tuple[int, Config]]) -> None:
        self._offsets: list[int] = []
        self._configs: list[Config] = []
        self._markers: tuple[tuple[int, Config], ...] | None = None   # markers(), until the next change
        for offset, c in markers:
            self._add(offset, c)
        assert self._configs, "a config history is never empty"

    def _add(self, offset: int, c: Config) -> None:
        assert not self._offsets or (offset >= self._offsets[-1] and c.version > self._configs[-1].version), (
            offset, c, self.markers())
        self._offsets.append(offset)
        self._configs.append(c)
        self._markers = None

    def markers(self) -> tuple[tuple[int, Config], ...]:
        """The same tuple until the history changes (a persisted state compares by identity first)."""
        m = self._markers
        if m is None:
            m = self._markers = tuple(zip(self._offsets, self._configs))
        return m

    def __len__(self) -> int:
        return len(self._configs)

    def __repr__(self) -> str:
        return f"History({list(self.markers())})"

    def latest(self) -> Config:
        return self._configs[-1]

    def latest_offset(self) -> int:
        return self._offsets[-1]

    def _in_force(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._offsets, offset) - 1)

    def append(self, offset: int, c: Config) -> None:
        """A new config recorded at the log end ``offset`` (by the leader)."""
        self._add(offset, c)

    def window(self, prev_offset: int, end_offset: int) -> list[list]:
        """The markers an append [prev_offset, end_offset) carries, in wire form: from the
        one in force at ``prev_offset`` to the last at or below ``end_offset``."""
        i = self._in_force(prev_offset)
        j = bisect.bisect_right(self._offsets, end_offset)
        return [config_to_wire(self._offsets[k], self._configs[k]) for k in range(i, max(j, i + 1))]

    def replace_window(self, carried: tuple[tuple[int, Config], ...], upto: int, term: int) -> bool:
        """An accepted append carried ``carried`` (non-empty) and our log now agrees with
        the leader's up to ``upto``: our markers in [first carried offset, upto] become the
        carried ones (those up to ``upto``), keeping our markers of ``term`` (the current
        leader's, which it never removes) missing from a reordered older window. Returns
        whether anything changed."""
        lo = carried[0][0]
        i = bisect.bisect_left(self._offsets, lo)
        j = bisect.bisect_right(self._offsets, upto)
        new = [(o, c) for o, c in carried if o <= upto]
        have = {c.ident for _, c in new}
        keep = [(self._offsets[k], self._configs[k]) for k in range(i, j)
                if self._configs[k].term == term and self._configs[k].ident not in have]
        if keep:
            new = sorted(new + keep, key=lambda m: (m[0], m[1].version))
        old = list(zip(self._offsets[i:j], self._configs[i:j]))
        if new == old:
            return False
        head = list(zip(self._offsets[:i], self._configs[:i]))
        tail = list(zip(self._offsets[j:], self._configs[j:]))
        # an older head can only hold lower versions; drop anything that breaks the order
        merged = head + new
        if new:
            merged = [m for m in head if m[1].version < new[0][1].version] + new
        for m in tail:
            if not merged or (m[0] >= merged[-1][0] and m[1].version > merged[-1][1].version):
                merged.append(m)
        if not merged:
            return False
        self._offsets = [o for o, _ in merged]
        self._configs = [c for _, c in merged]
        self._markers = None
        return True

    def truncate_after(self, offset: int) -> bool:
        """The log was cut at ``offset``: markers past it go (the first one always stays)."""
        j = max(1, bisect.bisect_right(self._offsets, offset))
        if j == len(self._offsets):
            return False
        del self._offsets[j:], self._configs[j:]
        self._markers = None
        return True

    def reset(self, carried: tuple[tuple[int, Config], ...]) -> None:
        """The log restarted at the leader's log start: take the leader's markers."""
        self._offsets = [o for o, _ in carried]
        self._configs = [c for _, c in carried]
        self._markers = None

    def trim(self, committed_version: int) -> bool:
        """Keep the newest committed marker (version at most ``committed_version``) and
        everything after it: older ones can never be in force again for a new append."""
        n = 0
        for i, c in enumerate(self._configs):
            if c.version <= committed_version:
                n = i
        if n <= 0:
            return False
        del self._offsets[:n], self._configs[:n]
        self._markers = None
        return True

    def committed(self, committed_version: int) -> Config:
        """The newest config whose version is at most ``committed_version`` (the first one
        if none: it was committed before it was trimmed to)."""
        k = 0
        for i, c in enumerate(self._configs):
            if c.version <= committed_version:
                k = i
        return self._configs[k]
