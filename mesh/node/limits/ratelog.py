"""Rate-limited logging for a broker that must not drown in its own error reports.

A failing request must not write a traceback each time: ``RateLimitedLog.once(key)`` is
True at most once per ``window_ms`` for each key (e.g. (client, error code), or an
exception site), and ``RateLimitedLog.exception(...)`` writes one full traceback per
distinct exception site (type, file, line of the innermost frame) per window, a one-line
warning otherwise. The table of keys is bounded (``max_keys``): when it is full, keys
older than the window are forgotten, and if that is not enough the table starts over (so
a flood of distinct keys costs at most ``max_keys`` lines per window). ``suppressed``
counts lines not written.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

__all__ = ["RateLimitedLog", "exception_site"]


def exception_site(exc: BaseException) -> tuple:
    """(type name, file, line) of the innermost frame that raised ``exc``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return (type(exc).__name__, "", 0)
    return (type(exc).__name__, tb.tb_frame.f_code.co_filename, tb.tb_lineno)


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, window_ms: int = 60_000, max_keys: int = 10_000,
                 now_ms: Callable[[], int] | None = None):
        self.log = logger
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.now_ms = now_ms or (lambda: int(time.monotonic() * 1000))
        self._last: dict[Hashable, int] = {}
        self.suppressed = 0

    def once(self, key: Hashable) -> bool:
        """True if ``key`` was not reported within the window (and remember it now)."""
        now = self.now_ms()
        last = self._last.get(key)
        if last is not None and now - last < self.window_ms:
            self.suppressed += 1
            return False
        if last is None and len(self._last) >= self.max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window_ms}
            if len(self._last) >= self.max_keys:
                self._last = {}
        self._last[key] = now
        return True

    def warning(self, key: Hashable, fmt: str, *args) -> None:
        if self.once(key):
            self.log.warning(fmt, *args)

    def exception(self, key: Hashable, exc: BaseException, fmt: str, *args) -> None:
        """A traceback once per exception site per window; else one line once per ``key``."""
        site = self.once(("site",) + exception_site(exc))
        seen = not self.once(key)
        if site:
            self.log.error(fmt, *args, exc_info=exc)
        elif not seen:
            self.log.error(fmt + " (%s: %s; traceback logged earlier)", *args, type(exc).__name__, exc)
