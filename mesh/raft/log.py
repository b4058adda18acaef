"""The replication core's view of a partition log: the leader-epoch cache, the storage
effects the core asks the shell to carry out, and the read interface it needs.

The core never sees records. A log, to it, is an end offset plus an *epoch cache*: a short
list of ``(epoch, start_offset)``, one entry per leader epoch that appended to the log,
strictly increasing in both (Kafka's leader-epoch checkpoint file). From it:

- ``epoch_at(o)``: the epoch of the batch holding offset ``o``;
- ``end_for_epoch(e)``: where the log stops holding epochs <= ``e`` (Kafka's
  OffsetsForLeaderEpoch answer), which locates a divergence in one round trip;
- ``last_epoch()``: with the end offset, how up to date a log is (vote comparisons).

An entry may start *at* the log end with no batch after it yet: the epoch marker a new
leader writes instead of a no-op batch (see ``mesh.raft.manager``, "commit after an
election"). Two entries never share a start: a later epoch assigned at the same offset
replaces the earlier one (that epoch never appended anything).

The cache is bounded by the log itself: ``trim_before(log_start)`` drops the entries below
the log start when retention deletes the head (keeping the one covering the offset just
below it); there is one entry per epoch that appended a retained batch, plus one marker.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:
    from mesh.raft.membership import Config
    from mesh.wire.effects import Send

__all__ = ["EpochCache", "Append", "Truncate", "ResetLog", "CutHead", "CleanTo", "LogOp", "PersistState", "LogReader", "Ready",
           "NO_READY"]


class EpochCache:
    __slots__ = ("_epochs", "_starts", "_entries")

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._entries: tuple[tuple[int, int], ...] | None = None   # entries(), until the next change
        for epoch, start in entries:
            self.assign(int(epoch), int(start))

    def entries(self) -> tuple[tuple[int, int], ...]:
        """``((epoch, start_offset), ...)``: what the shell persists (msgpack-friendly). The
        same tuple until the cache changes (a persisted state compares by identity first)."""
        e = self._entries
        if e is None:
            e = self._entries = tuple(zip(self._epochs, self._starts))
        return e

    def __len__(self) -> int:
        return len(self._epochs)

    def __repr__(self) -> str:
        return f"EpochCache({list(self.entries())})"

    def last_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else 0

    def last_start(self) -> int:
        return self._starts[-1] if self._starts else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch of the batch holding ``offset`` (0 for an empty cache; the first
        entry's epoch below the first start, which only happens below the commit offset
        after retention, where logs agree anyway)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return self._epochs[0] if self._epochs else 0
        return self._epochs[i]

    def epoch_before(self, offset: int) -> int:
        """The last epoch starting before ``offset`` (0 if none): what ``last_epoch`` is
        after ``truncate_from(offset)``."""
        i = bisect.bisect_left(self._starts, offset)
        return self._epochs[i - 1] if i > 0 else 0

    def end_for_epoch(self, epoch: int, log_end: int) -> int:
        """The first offset whose epoch is greater than ``epoch`` (``log_end`` if none)."""
        i = bisect.bisect_right(self._epochs, epoch)
        if i >= len(self._epochs):
            return log_end
        return min(self._starts[i], log_end)

    def assign(self, epoch: int, start: int) -> bool:
        """Record that ``epoch`` starts at ``start`` (at or after every known start).
        Returns whether anything changed."""
        if self._epochs:
            last_epoch, last_start = self._epochs[-1], self._starts[-1]
            if epoch == last_epoch:
                return False
            assert epoch > last_epoch, f"epoch {epoch} after {last_epoch}"
            assert start >= last_start, f"epoch {epoch} starts at {start}, before {last_start}"
            if start == last_start:  # the previous epoch never appended: replace it
                self._epochs[-1] = epoch
                self._entries = None
                return True
        self._entries = None
        self._epochs.append(epoch)
        self._starts.append(start)
        return True

    def truncate_from(self, offset: int) -> bool:
        """Forget epochs that start at or after ``offset`` (the log is cut there)."""
        i = bisect.bisect_left(self._starts, offset)
        if i == len(self._starts):
            return False
        del self._epochs[i:], self._starts[i:]
        self._entries = None
        return True

    def trim_before(self, log_start: int) -> bool:
        """Drop entries retention made useless: all but the one covering ``log_start - 1``
        (an append at the log start is checked against the epoch just below it)."""
        n = 0
        while n + 1 < len(self._starts) and self._starts[n + 1] < log_start:
            n += 1
        if n:
            del self._epochs[:n], self._starts[:n]
            self._entries = None
        return n > 0

    def reset(self, epoch: int, start: int) -> None:
        """The log restarts empty at ``start``; ``epoch`` is the epoch at ``start - 1``."""
        self._epochs[:] = [epoch]
        self._starts[:] = [start]
        self._entries = None


# -- effects: what the shell must write (one transaction per loop turn) ------------------

class Append(NamedTuple):
    """Store ``payload`` (whole batches, as received) at ``base_offset``, which is the
    current log end. All its batches carry leader epoch ``epoch``. (A NamedTuple: one per
    follower append, ~4x cheaper to build than a frozen dataclass; the rare ``Truncate`` and
    ``ResetLog`` stay dataclasses, so the two never compare equal.)"""
    pid: int
    base_offset: int
    end_offset: int
    epoch: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Truncate:
    """Delete every batch at or after ``to_offset`` (a batch boundary, never below the
    commit offset): a diverged, uncommitted suffix."""
    pid: int
    to_offset: int


@dataclass(frozen=True, slots=True)
class ResetLog:
    """Delete every batch; the log now starts and ends at ``start_offset`` (this replica
    fell behind the leader's log start, which retention moved)."""
    pid: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class CutHead:
    """A follower follows its leader's log start: delete the whole batches that end at or
    before ``offset`` (never the last one), at most up to the commit offset on disk. Only
    retention on the leader moves a log start; followers never cut on their own clock."""
    pid: int
    offset: int


@dataclass(frozen=True, slots=True)
class CleanTo:
    """A follower heard its leader's compaction cut (``clean_end``, ``horizon_ms``): the
    shell records it and compacts its own committed records below ``clean_end`` by the
    same rule (``storage.compaction``) once its commit on disk reaches it."""
    pid: int
    clean_end: int
    horizon_ms: int


LogOp: TypeAlias = Append | Truncate | ResetLog | CutHead | CleanTo  # a storage effect, applied in order


class PersistState(NamedTuple):
    """The partition's replication state; the shell stores it (one small record per
    partition) in the same transaction as the log effects of the same turn, and hands it
    back to ``add_partition`` after a restart. Immutable; a NamedTuple, not a frozen
    dataclass: one is built per commit advance, and a frozen dataclass costs ~2 us to build."""
    pid: int
    term: int
    vote: str | None
    commit: int
    epoch_cache: tuple[tuple[int, int], ...]  # ((epoch, start_offset), ...)
    recovering: bool = False  # lost state, refilling: no votes, not counted (kept across restarts)
    configs: tuple = ()       # ((offset, membership.Config), ...): the config history; () = the initial one
    vouch: tuple[str, int] | None = None  # (successor, term): a corrupt leader's promised vote (Partition.vouch)


@dataclass(slots=True)
class Ready:
    """What one call into the core asks of the shell (``mesh.raft.manager``, "Shell contract")."""
    log_ops: list[LogOp] = field(default_factory=list)          # Append | Truncate | ResetLog, in order
    persist: list[PersistState] = field(default_factory=list)   # one per changed partition
    messages: list[Send] = field(default_factory=list)          # to peers, after the fsync
    committed: dict[int, int] = field(default_factory=dict)     # pid -> new commit offset
    leadership: dict[int, tuple[str | None, int]] = field(default_factory=dict)  # pid -> (leader | None, epoch)
    configs: dict[int, tuple[Config, bool]] = field(default_factory=dict)  # pid -> (latest config, committed)

    def __bool__(self) -> bool:
        return bool(self.log_ops or self.persist or self.messages or self.committed or self.leadership
                    or self.configs)


class _EmptyList(list):
    """An empty list that refuses to change (``NO_READY``'s sequences)."""
    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("NO_READY is shared: it must not be changed")

    append = extend = insert = pop = remove = clear = sort = reverse = __setitem__ = __delitem__ = _refuse
    __iadd__ = __imul__ = _refuse


# The Ready of a call that asks nothing (most flushes and ticks): one shared instance, never
# to be changed (its lists and maps refuse changes).
NO_READY = Ready(_EmptyList(), _EmptyList(), _EmptyList(), MappingProxyType({}), MappingProxyType({}),
                 MappingProxyType({}))


class LogReader(Protocol):
    """How the core reads what it must send to followers. In production a thin view over
    the broker's store (reading through the turn's open write transaction, so data staged
    earlier in the turn is visible); in the simulator an in-memory dict."""

    def read(self, pid: int, from_offset: int, to_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole batches starting exactly at ``from_offset`` (a batch boundary) and ending at
        or before ``to_offset``, concatenated: ``(payload, end_offset)``. At least one batch
        even if it is larger than ``max_bytes``; otherwise stop before exceeding it.
        ``(b"", from_offset)`` if the reader cannot see that data yet (staged in a
        transaction it does not read through): the core sends it on a later flush."""
        ...

    def start_offset(self, pid: int) -> int:
        """The log start (first retained offset)."""
        ...

    def clean_cut(self, pid: int) -> tuple[int, int]:
        """The compaction cut this replica knows (``(clean_end, horizon_ms)``; (0, 0): none)."""
        ...
