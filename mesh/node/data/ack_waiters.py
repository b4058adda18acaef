"""acks=all produce requests waiting for their partition's commit (``mesh.node.replication.raft_host``).

A waiter is answered when the commit offset passes its batch's end, failed with NOT_LEADER
when this node loses leadership or truncates below it, and with TIMEOUT when its deadline
passes (all retriable; the idempotent producer makes retries safe). ``reply(ident, rid,
msg)`` is the node's answer function, passed at each call (the node sets it after start).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode

__all__ = ["AckWaiter", "AckWaiters"]

Reply = Callable[[bytes, int, object], None]


@dataclass
class AckWaiter:
    ident: bytes
    rid: int
    base: int
    end: int
    deadline_ms: int
    done: bool = False


class AckWaiters(dict[int, list[AckWaiter]]):
    """pid -> its waiters, in the order they were parked."""

    def park(self, pid: int, waiter: AckWaiter, bound: int, reply: Reply | None) -> None:
        """Park ``waiter``; with ``bound`` waiting already it is answered TIMEOUT at once
        (the write may be made all the same: the client's retry is deduplicated)."""
        ws = self.setdefault(pid, [])
        if len(ws) >= bound:
            if reply is not None:
                reply(waiter.ident, waiter.rid, m.ProduceResponse(
                    int(ErrorCode.TIMEOUT), f"{len(ws)} acks=all requests already wait for this "
                                            f"partition's commit; not acknowledged yet"))
            return
        ws.append(waiter)

    def answer(self, pid: int, commit: int, log_start: Callable[[int], int], reply: Reply) -> None:
        """Answer the waiters of ``pid`` whose batch ends at or below ``commit``."""
        waiters = self.get(pid)
        if not waiters:
            return
        for w in waiters:
            if not w.done and w.end <= commit:
                w.done = True
                reply(w.ident, w.rid, m.ProduceResponse(0, base_offset=w.base, log_start=log_start(pid)))
        self._gc(pid)

    def fail(self, pid: int, code: ErrorCode, why: str, reply: Reply | None,
             pred: Callable[[AckWaiter], bool] = lambda w: True, leader: str | None = None) -> None:
        for w in self.get(pid, ()):
            if not w.done and pred(w):
                w.done = True
                if reply is not None:
                    reply(w.ident, w.rid, m.ProduceResponse(int(code), why, leader=leader))
        self._gc(pid)

    def expire(self, now_ms: int, reply: Reply | None) -> None:
        for pid in list(self):
            self.fail(pid, ErrorCode.TIMEOUT, "not acknowledged by a quorum in time", reply,
                      lambda w: w.deadline_ms <= now_ms)

    def _gc(self, pid: int) -> None:
        ws = [w for w in self.get(pid, ()) if not w.done]
        if ws:
            self[pid] = ws
        else:
            self.pop(pid, None)
