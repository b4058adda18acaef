"""What this node tells the cluster about its partitions, through its gossip namespace.

Three per-topic, chunked keys (``mesh.cluster.keys``; chunk ``k`` covers partitions
``k * PARTITION_CHUNK`` and up, so no value grows with the topic beyond ~21 KB):

- ``lead/<topic>/<k>``: ``{"<partition>": epoch}`` of the partitions this node leads
  (``mesh.cluster.leaders`` turns them into every broker's leader view). The replication
  host reports each leadership change (``leadership``); the chunks it touched are
  rewritten once per turn (``flush``), so 10,000 partitions electing at once cost 20 chunk
  writes, not 10,000 rewrites of a whole table.
- ``stats/<topic>/<k>``: ``[log_start, log_end, high_watermark]`` of the partitions led
  here, so any broker can describe them (``stats``, every ``stats_every_ms``).
- ``recovering/<topic>/<k>``: partitions on this node refilling lost state.

Rules: only changed chunks are written (an idle broker writes nothing); a chunk that
becomes empty is deleted; keys of topics this node no longer replicates are deleted at
the next ``stats``. Decides nothing: reads the catalog and the replication host.
"""
from __future__ import annotations

import logging
from typing import Any

from mesh.cluster import keys
from mesh.cluster.catalog import Catalog
from mesh.cluster.leaders import lead_claims

__all__ = ["Publisher"]

log = logging.getLogger("mesh.node.peers.publish")


class Publisher:
    def __init__(self, node_id: str, gossip, catalog: Catalog, store, replicas=None):
        """``replicas``: the node's ``ReplicaHost`` (may be set after construction, as the
        host itself takes ``leadership`` as its callback)."""
        self.node_id = node_id
        self.gossip = gossip
        self.catalog = catalog
        self.store = store
        self.replicas = replicas
        self._published: dict[str, Any] = {}          # our lead/, stats/, recovering/ key -> value
        self._dirty: dict[str, set[int]] = {}         # topic -> lead chunks to rewrite
        self._refused: set[str] = set()               # keys gossip refused (logged once each)
        self._news: list[tuple[str, int, str, int]] = []   # (topic, partition, leader, epoch), to log

    # -- leadership ---------------------------------------------------------------------
    def leadership(self, pid: int, leader: str | None, epoch: int) -> None:
        """The replication host's callback: ``pid`` has a new leader (or none)."""
        where = self.catalog.local.get(pid)
        if where is None:
            return
        name, p = where
        self._dirty.setdefault(name, set()).add(keys.chunk_of(p))
        if leader is not None:
            self._news.append((name, p, leader, epoch))

    def flush(self) -> None:
        """Rewrite the ``lead/`` chunks touched since the last call (once per turn)."""
        dirty, self._dirty = self._dirty, {}
        self._log_news()
        for name, chunks in sorted(dirty.items()):
            t = self.catalog.topics.get(name)
            if t is None:
                continue
            claims = lead_claims(t, self._epoch_if_leading, chunks)
            self._write({keys.lead_key(name, k): claims.get(keys.lead_key(name, k)) for k in chunks})

    def _log_news(self) -> None:
        """One line per leadership change, or one per turn when there are many (a topic of
        10,000 partitions electing must not write 10,000 lines)."""
        news, self._news = self._news, []
        if len(news) <= 8:
            for name, p, leader, epoch in news:
                log.info("%s/%d: leader %s, epoch %d", name, p, leader, epoch)
        else:
            mine = sum(1 for n in news if n[2] == self.node_id)
            log.info("%d leadership changes in %d topics (%d now led here), e.g. %s/%d: leader %s, epoch %d",
                     len(news), len({n[0] for n in news}), mine, *news[0])

    def _epoch_if_leading(self, pid: int) -> int | None:
        return self.replicas.leader(pid)[1] if self.replicas.is_leader(pid) else None

    # -- stats ----------------------------------------------------------------------------
    def stats(self) -> None:
        """Publish offsets and refilling partitions (every ``stats_every_ms``), and repair
        the leadership chunks (a deleted topic's keys go; a missed change is caught)."""
        want: dict[str, Any] = {}
        store, replicas = self.store, self.replicas
        for pid, (name, p) in sorted(self.catalog.local.items()):
            k = keys.chunk_of(p)
            if replicas.is_leader(pid):
                want.setdefault(keys.stats_key(name, k), {})[str(p)] = [
                    store.log_start(pid), store.log_end(pid), replicas.commit_offset(pid)]
                want.setdefault(keys.lead_key(name, k), {})[str(p)] = replicas.leader(pid)[1]
            if replicas.recovering(pid):
                want.setdefault(keys.recovering_key(name, k), []).append(p)
        changes: dict[str, Any] = {key: value for key, value in want.items() if self._published.get(key) != value}
        changes.update({key: None for key in self._published if key not in want})
        self._dirty = {}
        self._write(changes)

    def _write(self, changes: dict[str, Any]) -> None:
        """key -> new value (None: delete) for keys of this node's namespace."""
        for key, value in sorted(changes.items()):
            if value is None or value == {} or value == []:
                if self._published.pop(key, None) is not None:   # a new life starts empty
                    self.gossip.delete_local(key)
            elif self._published.get(key) != value:
                try:
                    self.gossip.set_local(key, value)
                except ValueError as exc:   # cannot happen within the chunk bounds; never fatal
                    if key not in self._refused:
                        self._refused.add(key)
                        log.error("not published: %s", exc)
                    continue
                self._published[key] = value
