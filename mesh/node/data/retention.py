"""Retention by time and size, decided by each partition's leader (DESIGN.md sections 4, 11)."""
from __future__ import annotations

import logging

from mesh.wire.topic_config import deletes
from storage.base import LogError

__all__ = ["enforce_retention"]

log = logging.getLogger("mesh.node.data.datapath")


def enforce_retention(store, catalog, replicas, now_ms: int, by_time: bool = True) -> None:
    """The leader decides where each partition's log starts (by ``retention.bytes``, and
    by ``retention.ms`` only when ``by_time``: its clock agrees with its peers'); its
    appends and heartbeats carry the new start to the followers, which cut to it
    (``mesh.raft.partition``, rule 11). A follower never cuts on its own clock."""
    try:
        for t in catalog.topics.values():
            c = t.config
            if not deletes(c):   # cleanup.policy=compact: kept until compaction drops it
                continue
            retention_ms = c["retention.ms"] if by_time else None
            for pid in t.pids:
                if pid is not None and replicas.hosts(pid) and replicas.is_leader(pid):
                    before = store.log_start(pid)
                    if store.stage_retention(pid, now_ms, retention_ms, c["retention.bytes"],
                                             keep_from=replicas.persisted_commit(pid)) > before:
                        replicas.log_start_moved(pid)
    except LogError as exc:  # the turn is doomed: commit_turn rolls it back and says so
        log.error("retention pass failed: %s", exc)
