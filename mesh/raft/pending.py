"""What the calls into one ``ReplicaManager`` produced since the last ``Ready``, and its
assembly into the next ``Ready`` (``take``): storage effects in order, the rows for each
peer coalesced (``mesh.raft.outbox``), which partitions' state to persist, whose commit
offset moved, and leadership and config changes, each told once (``_announced``)."""
from __future__ import annotations

from typing import Callable

from mesh.raft.log import NO_READY, LogOp, PersistState, Ready
from mesh.raft.membership import Config
from mesh.raft.outbox import Outbox

__all__ = ["Pending"]


class Pending:
    """The manager's outputs waiting for the next ``Ready``."""

    def __init__(self) -> None:
        self.out = Outbox()
        self.log_ops: list[LogOp] = []
        self.persist: set[int] = set()
        self.committed: set[int] = set()
        self.leader_dirty: set[int] = set()
        self.cfg_dirty: set[int] = set()
        self._announced: dict[int, tuple[str | None, int]] = {}
        self.cfg_announced: dict[int, tuple[Config, bool]] = {}

    def forget(self, pid: int) -> None:
        """``pid`` is no longer hosted."""
        for pending in (self.persist, self.committed, self.leader_dirty, self.cfg_dirty):
            pending.discard(pid)
        self._announced.pop(pid, None)
        self.cfg_announced.pop(pid, None)

    def take(self, parts: dict, state: Callable[[int], PersistState], store_id: str, life: int,
             max_rows: int, max_bytes: int) -> Ready:
        """The next ``Ready`` (``parts``: pid -> Partition; ``state``: its PersistState)."""
        if not (self.log_ops or self.out or self.persist or self.committed or self.leader_dirty
                or self.cfg_dirty):
            return NO_READY   # (most flushes and ticks)
        rd = Ready()
        if self.log_ops:
            rd.log_ops, self.log_ops = self.log_ops, []
        if self.out:
            rd.messages = self.out.take(store_id, life, max_rows, max_bytes)
        if self.persist:
            rd.persist = [state(pid) for pid in sorted(self.persist) if pid in parts]
            self.persist = set()
        if self.committed:
            for pid in sorted(self.committed):
                p = parts.get(pid)
                if p is not None:
                    rd.committed[pid] = p.commit
            self.committed = set()
        if self.leader_dirty:
            for pid in sorted(self.leader_dirty):
                p = parts.get(pid)
                if p is not None and self._announced.get(pid) != (p.leader, p.term):
                    self._announced[pid] = rd.leadership[pid] = (p.leader, p.term)
            self.leader_dirty = set()
        if self.cfg_dirty:
            for pid in sorted(self.cfg_dirty):
                p = parts.get(pid)
                if p is not None:
                    now = (p.history.latest(), p.membership.config_committed())
                    if self.cfg_announced.get(pid) != now:
                        self.cfg_announced[pid] = rd.configs[pid] = now
            self.cfg_dirty = set()
        return rd
