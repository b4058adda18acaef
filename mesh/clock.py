"""The one clock source of the broker and its gateways: shell modules read time here, never from ``time``.

Two scales, both in integer milliseconds:

- ``wall_ms()``: wall-clock time since the epoch. For anything compared across nodes or
  kept across restarts: the gossip core's clock (its register stamps are compared between
  nodes and its snapshot outlives the process; a jump only pauses failure detection), the
  consumer groups' commit stamps, retention by record timestamp.
- ``now_ms()``: monotonic time, meaningful only within this process. For local deadlines
  and pacing: long-poll fetch deadlines, retention and stats schedules, the text gateway's
  CONS wait.

The cores (gossip, raft, groups) never read a clock: the shell passes these readings in.
A ``Clock`` is anything with these two methods, so a simulation can hand the node shell a
clock it controls; ``SYSTEM_CLOCK`` is the real one.
"""
from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "SYSTEM_CLOCK", "now_ms", "wall_ms"]


def wall_ms() -> int:
    """Milliseconds since the epoch (wall clock: may jump)."""
    return time.time_ns() // 1_000_000


def now_ms() -> int:
    """Monotonic milliseconds (never jumps; no meaning outside this process)."""
    return time.monotonic_ns() // 1_000_000


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def wall_ms(self) -> int: ...


class SystemClock:
    """The real clocks (``time.monotonic_ns`` and ``time.time_ns``)."""

    __slots__ = ()

    def now_ms(self) -> int:
        return now_ms()

    def wall_ms(self) -> int:
        return wall_ms()


SYSTEM_CLOCK = SystemClock()
