"""A broker turn: the order in which a broker moves messages between its socket, its cores
and its store, held once, for the node (``mesh.node.loop``) and its simulator
(``tests/sim/node_sim.py``) alike.

The turn decides nothing itself. It is given its parts (the data path and the replication
host, wired by ``mesh.node.wiring`` over a transport, a store, a clock and a random source)
and a table of tasks (name, period, function); it runs them in ``ORDER``, each guarded, and
commits once. A simulated broker gives fewer tasks (no gossip, no group host), never
another order. The steps, after the caller drained its socket into the handlers:

1. ``drained``: answer the acks=all requests and wake the parked fetches the drain's
   commit advances allow (no sync of this turn needed: ``ReplicaHost.answer_committed``),
   then, unless the turn is doomed, send the leaders' appends early (before the sync);
2. ``run``, the tasks in ``ORDER`` up to the commit: the clock's check, the gossip tick
   (its effects sent at once: gossip keeps nothing that must be durable first), the
   replication tick (effects staged, sends held), held produce requests run again (a
   handover ended), corrupt batches reported, a moved gossip state acted on (catalog
   reconciled, snapshot marked due), stats published, peer links pruned, isolation noted,
   the group host's tick, retention, the compaction cut and a slice of compaction, and
   producer-id expiry (staged), the elastic tick,
   a stopping node's handovers, the gossip snapshot (staged when due, in a turn that syncs
   anyway or after waiting for one);
3. the commit: the turn's LMDB transaction with one sync (``DataPath.commit_turn``: then
   produce answers, held replication sends, acks=all now committed); nothing of a failed
   or doomed turn is sent;
4. the tasks after it: leadership changes to gossip, the client outbox, parked fetches
   woken or expired (``DataPath.after_turn``), identity checks, sidecars that exited
   started again (``mesh.node.lifecycle.sidecars``), the metrics snapshot.

A task's exception dooms the turn (rolled back at its commit, nothing from it persisted or
sent) and is logged once a minute per site; a simulator may ask for it to be raised.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from mesh.node.limits.ratelog import RateLimitedLog
from storage.base import LogError

log = logging.getLogger("mesh.node.turn")

COMMIT = "commit"
ORDER = ("clock", "gossip tick", "replication tick", "held produces", "corrupt batches", "gossip moved",
         "stats", "peer links", "isolation", "groups", "retention", "compaction plan", "compaction", "producer expiry", "elastic", "hand over",
         "gossip snapshot", COMMIT, "publish", "outbox", "wake fetches", "identity", "sidecars", "metrics")


@dataclass
class Task:
    """``fn()`` every turn, or every ``period_ms`` of the turn's monotonic clock, and only
    while ``when()`` (if given) holds; ``guarded``: an exception dooms the turn."""
    name: str
    fn: Callable[[], object]
    period_ms: int | None = None
    when: Callable[[], bool] | None = None
    guarded: bool = True
    due_ms: int = 0


class BrokerTurn:
    def __init__(self, data, replicas, now_ms: Callable[[], int], tasks: list[Task] = (), *,
                 on_commit: Callable[[bool], None] | None = None,
                 before_commit: Callable[[], bool] | None = None,
                 on_error: Callable[[str, Exception], None] | None = None,
                 raise_errors: bool = False, rlog: RateLimitedLog | None = None) -> None:
        """``tasks`` beside the core ones (a task named as a core one replaces it);
        ``before_commit()``: False abandons the turn there (a simulated crash);
        ``on_commit(ok)`` after the commit; ``on_error(name, exc)`` after a guarded task
        raised; ``raise_errors``: raise instead (the simulator: a bug is a failure)."""
        self.data, self.replicas, self.now_ms = data, replicas, now_ms
        core = [Task("replication tick", replicas.tick_due), Task("held produces", data.release_held),
                Task("wake fetches", data.after_turn)]
        named = {t.name: t for t in core}
        for t in tasks:
            if t.name not in ORDER or t.name == COMMIT:
                raise ValueError(f"not a step of the turn: {t.name!r}")
            named[t.name] = t
        self.tasks = [named[n] for n in ORDER if n in named]
        self._commit_at = sum(1 for n in ORDER[:ORDER.index(COMMIT)] if n in named)
        self.on_commit, self.before_commit, self.on_error = on_commit, before_commit, on_error
        self.raise_errors = raise_errors
        self._rlog = rlog or RateLimitedLog(log)
        self.last_commit_ok = True

    def early_acks(self) -> None:
        """What the commit advances so far allow (also called by the drain, after a
        message that advanced a commit: its answers need not wait for the rest of it)."""
        self.step("early acks", self.data.answer_committed)

    def drained(self) -> None:
        """Step 1: what the drain's commit advances allow, and the leaders' early appends."""
        self.early_acks()
        if not self.data.doomed:   # (a doomed turn sends nothing)
            self.step("early appends", self.replicas.send_early_appends)

    def run(self) -> bool:
        """Steps 2-4; False if the commit failed (or the turn was abandoned before it). The
        tasks after the commit run after a failed one too (a rolled-back turn's fetches
        still wake and expire)."""
        for i, task in enumerate(self.tasks + [None]):
            if i == self._commit_at and not self._commit():
                return False   # abandoned: nothing after it runs
            if task is not None:
                self._run(task)
        return self.last_commit_ok

    def _commit(self) -> bool:
        """False if ``before_commit`` abandoned the turn."""
        if self.before_commit is not None and not self.before_commit():
            self.last_commit_ok = False
            return False
        ok = self.last_commit_ok = self.data.commit_turn()
        if self.on_commit is not None:
            self.on_commit(ok)
        return True

    def _run(self, task: Task) -> None:
        if task.when is not None and not task.when():
            return
        if task.period_ms is not None:
            now = self.now_ms()
            if now < task.due_ms:
                return
            task.due_ms = now + task.period_ms
        if task.guarded:
            self.step(task.name, task.fn)
        else:
            task.fn()

    def step(self, name: str, fn, *args) -> None:
        """Run one step; an exception dooms the turn (rolled back at its commit, nothing
        persisted from it) and is logged (a traceback per site per minute)."""
        try:
            fn(*args)
        except LogError as exc:   # e.g. a full disk: the store refuses the rest of the turn
            if self.raise_errors:
                raise
            self._rlog.warning(("storage", name), "storage error in %s, turn rolled back: %s", name, exc)
            self.data.doom(f"storage error in {name}")
        except Exception as exc:
            if self.raise_errors:
                raise
            self.data.doom(f"{type(exc).__name__} in {name}")
            if self.on_error is not None:
                self.on_error(name, exc)
            self._rlog.exception(("step", name), exc, "%s failed, turn rolled back: %s", name, exc)
