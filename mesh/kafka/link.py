"""The listener's way to its node and the cluster: native clients and one metadata cache.

- ``MeshLink``: a native ``Transport`` + ``ClusterView`` owned by one thread (a transport
  is single-threaded), bootstrapped at the node's address. Each connection's worker thread
  has its own (``MeshLinks.get``), so a long-polling fetch on one connection holds nobody
  else.
- ``MetaCache``: the latest native metadata of the whole cluster (brokers and every topic),
  shared by all threads, refreshed at most every ``max_age_s`` by whichever thread asks
  first (the others read the previous answer meanwhile), or at once when a handler saw it
  stale (``refresh``). It is ``context.ClusterInfo``: the brokers as Kafka clients see them,
  from each broker's gossiped ``kafka`` entry (``mesh.cluster.keys.KAFKA_KEY``), with
  colliding node ids settled by ``mesh.kafka.ids.resolve_collisions``.
"""
from __future__ import annotations

import logging
import threading
import time

from mesh.client.cluster import ClusterView
from mesh.client.transport import Transport
from mesh.cluster.liveness import row_is_up
from mesh.kafka.context import KafkaBroker
from mesh.kafka.ids import resolve_collisions
from mesh.wire.errors import MeshError

__all__ = ["MeshLink", "MeshLinks", "MetaCache"]

log = logging.getLogger("mesh.kafka.link")


class MeshLink:
    """Also the meeting point of several requests of one connection in flight at once
    (pipelined produce requests): ``collect`` moves every answer that arrived into
    ``inbox`` (rid -> (address, message, payload)), where each waiter takes its own, and
    records when each address was last seen going down (``down_at``)."""

    def __init__(self, address: str, creds=None, timeout_ms: int = 5_000) -> None:
        self.address = address
        self.transport = Transport(creds=creds)
        self.cluster = ClusterView(self.transport, address, timeout_ms=timeout_ms)
        self.inbox: dict[int, tuple] = {}
        self.down_at: dict[str, float] = {}

    def collect(self, timeout_ms: int) -> None:
        for addr, rid, msg, payload in self.transport.poll(timeout_ms):
            self.inbox[rid] = (addr, msg, payload)
        now = time.monotonic()
        for addr in self.transport.take_disconnected():
            self.down_at[addr] = now

    def close(self) -> None:
        self.transport.close()


class MeshLinks:
    """One ``MeshLink`` per thread, made on first use; ``close_all`` at the end."""

    def __init__(self, address: str, creds=None) -> None:
        self.address = address
        self.creds = creds
        self._local = threading.local()
        self._all: list[MeshLink] = []
        self._lock = threading.Lock()

    def get(self) -> MeshLink:
        link = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = MeshLink(self.address, self.creds)
            with self._lock:
                self._all.append(link)
        return link

    def release(self) -> None:
        """The calling thread ends: close its link."""
        link = getattr(self._local, "link", None)
        if link is not None:
            self._local.link = None
            with self._lock:
                if link in self._all:
                    self._all.remove(link)
            link.close()

    def close_all(self) -> None:
        with self._lock:
            links, self._all = self._all, []
        for link in links:
            try:
                link.close()
            except Exception:   # closing anyway
                pass


class MetaCache:
    """A ``ClusterInfo`` and the topics, from the native metadata (see the module doc)."""

    def __init__(self, links: MeshLinks, mesh_id: str, host: str, port: int, kafka_id: int,
                 max_age_s: float = 1.0) -> None:
        self.links = links
        self.mesh_id = mesh_id
        self._self = KafkaBroker(kafka_id, host, port, mesh_id)
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._at = 0.0
        self.brokers_raw: dict[str, dict] = {}
        self.topics: dict[str, dict] = {}
        self._kafka: dict[str, KafkaBroker] = {mesh_id: self._self}
        self._warned: set[str] = set()

    # -- refresh ----------------------------------------------------------------------------
    def fresh(self) -> "MetaCache":
        """Refreshed if older than ``max_age_s`` (one thread asks; others use what is there)."""
        if time.monotonic() - self._at > self.max_age_s:
            self.refresh(wait=not self.topics)
        return self

    def refresh(self, wait: bool = True) -> None:
        if not self._refreshing.acquire(blocking=wait):
            return
        try:
            view = self.links.get().cluster
            try:
                resp = view.refresh(None)
            except MeshError as exc:
                log.warning("metadata refresh failed: %s", exc)
                return
            # every topic the answer lists; the view keeps topics it no longer sees (deleted ones)
            names = {t["name"] for t in resp.topics if isinstance(t, dict) and not t.get("error")}
            for gone in [n for n in view.topics if n not in names]:
                del view.topics[gone]
            self._apply(dict(view.brokers), dict(view.topics))
        finally:
            self._refreshing.release()

    def _apply(self, brokers: dict[str, dict], topics: dict[str, dict]) -> None:
        ids, where = {}, {}
        for mid, b in brokers.items():
            k = b.get("kafka")
            if isinstance(k, dict) and isinstance(k.get("id"), int) and isinstance(k.get("port"), int):
                ids[mid] = k["id"]
                where[mid] = (str(k.get("host")), k["port"])
        ids.setdefault(self.mesh_id, self._self.node_id)
        where.setdefault(self.mesh_id, (self._self.host, self._self.port))
        resolved, moved = resolve_collisions(ids)
        for mid in moved:
            if mid not in self._warned:
                self._warned.add(mid)
                log.warning("Kafka node id %d of broker %s is taken by another broker: it is served as %d; "
                            "give it its own with mesh node --kafka-node-id", ids[mid], mid, resolved[mid])
        kafka = {mid: KafkaBroker(resolved[mid], where[mid][0], where[mid][1], mid) for mid in resolved}
        with self._lock:
            self.brokers_raw = brokers
            self.topics = topics
            self._kafka = kafka
            self._self = kafka[self.mesh_id]
            self._at = time.monotonic()

    # -- ClusterInfo --------------------------------------------------------------------
    def kafka_brokers(self) -> list[KafkaBroker]:
        """Brokers with a Kafka listener that gossip does not call dead or gone."""
        with self._lock:
            out = []
            for mid, kb in self._kafka.items():
                if mid == self.mesh_id or row_is_up(self.brokers_raw.get(mid, {})):
                    out.append(kb)
            return sorted(out, key=lambda b: b.node_id)

    def kafka_broker_of(self, mesh_id: str) -> KafkaBroker | None:
        with self._lock:
            return self._kafka.get(mesh_id)

    def self_broker(self) -> KafkaBroker:
        return self._self

    def topic(self, name: str) -> dict | None:
        with self._lock:
            return self.topics.get(name)
