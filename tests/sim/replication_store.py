"""Logs as lists of whole batches: ``PartLog``, and ``SimFailure``.

``PartLog`` is one partition's log as (base, end, epoch, raw) batches with binary search by
base offset: the replication simulator's checkers keep the canonical committed log and
their index of every replica's log in it (the disk itself is ``SimDisk``, a real
``MemoryStore``: replication_disk.py).
"""
from __future__ import annotations

import bisect

__all__ = ["SimFailure", "PartLog"]


class SimFailure(AssertionError):
    """An invariant broke; the message ends with the command that reproduces it."""


class PartLog:
    """One partition's log on one broker: whole batches (base, end, epoch, raw)."""
    __slots__ = ("start", "bases", "batches")

    def __init__(self, start: int = 0, bases: list | None = None, batches: list | None = None) -> None:
        self.start = start
        self.bases = bases if bases is not None else []
        self.batches = batches if batches is not None else []

    @property
    def end(self) -> int:
        return self.batches[-1][1] if self.batches else self.start

    def copy(self) -> "PartLog":
        return PartLog(self.start, list(self.bases), list(self.batches))

    def is_boundary(self, offset: int) -> bool:
        if offset == self.end or offset == self.start:
            return True
        i = bisect.bisect_left(self.bases, offset)
        return i < len(self.bases) and self.bases[i] == offset

    def append(self, batches: list) -> None:
        for b in batches:
            assert b[0] == self.end
            self.bases.append(b[0])
            self.batches.append(b)

    def truncate(self, to: int) -> None:
        i = bisect.bisect_left(self.bases, to)
        del self.bases[i:], self.batches[i:]

    def reset(self, start: int) -> None:
        self.start, self.bases, self.batches = start, [], []

    def trim_head(self, new_start: int) -> None:
        i = bisect.bisect_left(self.bases, new_start)
        del self.bases[:i], self.batches[:i]
        self.start = new_start

    def upto(self, offset: int) -> list:
        """The batches below ``offset``."""
        return self.batches[:bisect.bisect_left(self.bases, offset)]

    def read(self, frm: int, to: int, max_bytes: int) -> tuple[bytes, int]:
        i = bisect.bisect_left(self.bases, frm)
        if i == len(self.bases) or self.bases[i] != frm:
            raise SimFailure(f"core read from {frm}, not a batch boundary (log {self.start}..{self.end})")
        parts, size, end = [], 0, frm
        while i < len(self.batches):
            base, b_end, _, raw = self.batches[i]
            if b_end > to or (parts and size + len(raw) > max_bytes):
                break
            parts.append(raw)
            size += len(raw)
            end = b_end
            i += 1
        if not parts:
            raise SimFailure(f"core read [{frm}, {to}) which holds no whole batch")
        return b"".join(parts), end
