"""Admin: topics and cluster metadata, synchronous, in the caller's thread."""
from __future__ import annotations

import time

from mesh.client.cluster import ClusterView
from mesh.client.elastic_admin import ElasticAdmin, Moves
from mesh.client.security_admin import SecurityAdmin
from mesh.client.transport import Transport, parse_address
from mesh.cluster.liveness import row_is_up
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import CreateTopicRequest, DeleteTopicRequest, MetadataRequest

__all__ = ["Admin", "ClientBase", "Moves"]

_LEADER_ASK_MS = 500    # a leader that is up answers a metadata call in milliseconds
_FIRST_HAND = ("log_start", "log_end", "high_watermark", "isr")   # what only a leader knows first hand


class ClientBase:
    """A synchronous client: a transport, a cluster view, a context manager."""

    def __init__(self, bootstrap: str = "127.0.0.1:7101", request_timeout_ms: int = 10_000, *, creds=None):
        """``creds``: a creds file path or ``Creds`` (None: $MESH_CREDS, else none)."""
        self.transport = Transport(creds=creds)
        self.cluster = ClusterView(self.transport, bootstrap, timeout_ms=request_timeout_ms)
        self.timeout_ms = request_timeout_ms

    def close(self) -> None:
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _while_unavailable(call, wait_s: float):
        """``call()``, again with a backoff (50 ms doubling to 1 s) while it raises
        COORDINATOR_NOT_AVAILABLE (the broker says it is not ready yet: still learning the
        cluster, or taking groups over), for up to ``wait_s``; then that error."""
        deadline, pause_s = time.monotonic() + wait_s, 0.05
        while True:
            try:
                return call()
            except MeshError as exc:
                if exc.code != ErrorCode.COORDINATOR_NOT_AVAILABLE or time.monotonic() + pause_s > deadline:
                    raise
            time.sleep(pause_s)   # (the broker said so: a client backs off, it does not spin)
            pause_s = min(1.0, 2 * pause_s)


class Admin(ElasticAdmin, SecurityAdmin, ClientBase):
    """Topics and cluster metadata; users and ACLs (``mesh.client.security_admin``); topic
    growth, decommission, reassignment and moves (``mesh.client.elastic_admin``)."""

    def _call(self, msg):
        """Send to the first broker that answers (any broker serves admin requests; a topic
        change goes on to the topic's owner, ``_call_owner``). COORDINATOR_NOT_AVAILABLE (the
        owner still learns the cluster, or brokers disagree on who owns a name for a moment)
        is retried with a backoff for up to the request timeout."""
        return self._while_unavailable(lambda: self._call_any(msg), self.timeout_ms / 1000)

    def _call_any(self, msg):
        last = None
        for addr in self.cluster.addresses():
            try:
                return self._call_owner(addr, msg)
            except MeshError as exc:
                if exc.code not in (ErrorCode.TIMEOUT, ErrorCode.BROKER_UNAVAILABLE):
                    raise
                self.transport.forget(addr)
                last = exc
        raise MeshError(ErrorCode.BROKER_UNAVAILABLE, f"no broker answered: {last}")

    def _call_owner(self, addr: str, msg):
        """A topic is created, altered and deleted by its owner (``mesh.node.requests.handlers``):
        another broker answers COORDINATOR_MOVED naming it, and the request goes there, at
        most twice (views of who owns a name agree again within seconds of a broker
        joining or dying)."""
        first = addr
        for _ in range(3):
            try:
                return self.transport.call(addr, msg, timeout_ms=self.timeout_ms)[0]
            except MeshError as exc:
                if addr != first and exc.code in (ErrorCode.TIMEOUT, ErrorCode.BROKER_UNAVAILABLE):
                    self.transport.forget(addr)   # the owner did not answer (the caller forgets ``first``)
                if exc.code != ErrorCode.COORDINATOR_MOVED or not exc.leader or exc.leader == addr:
                    raise
                moved = exc
            try:
                parse_address(moved.leader)   # before any socket is made for it
            except ValueError:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"a broker named an owner that is not an "
                                                           f"address: {moved.leader!r}") from None
            addr = moved.leader
        raise MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"brokers disagree on who owns it: {moved.message}")

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None, wait_s: float = 10.0, exist_ok: bool = False) -> None:
        """Create a topic through any broker; then wait (up to ``wait_s``) until every live
        broker knows it and a leader for each partition, so the next producer or consumer
        finds it wherever it asks. ``exist_ok``: a topic of that name already there is not
        an error (TOPIC_EXISTS); its partitions and configs are left as they are."""
        try:
            self._call(CreateTopicRequest(name, partitions, replication_factor,
                                          {k: str(v) for k, v in (config or {}).items()}))
        except MeshError as e:
            if not (exist_ok and e.code == ErrorCode.TOPIC_EXISTS):
                raise
        self._wait_everywhere(lambda topics: name in topics and all(
            p.get("leader") for p in topics[name]["partitions"]), wait_s, name)

    def delete_topic(self, name: str, wait_s: float = 10.0) -> None:
        self._call(DeleteTopicRequest(name))
        self._wait_everywhere(lambda topics: name not in topics, wait_s, name)

    def _wait_everywhere(self, ok, wait_s: float, topic: str | None = None) -> None:
        """Poll each live broker's view of ``topic`` (None: of every topic) until ``ok``
        holds there. A broker spends time on each answer (a 10,000-partition topic: tens of
        ms), so the poll waits at least twice as long as the last answer took: it takes at
        most a third of a broker's time."""
        deadline = time.monotonic() + wait_s
        pending = [b["address"] for b in self.metadata([]).brokers if row_is_up(b, strict=True)]
        while pending and time.monotonic() < deadline:
            addr = pending[0]
            t0 = time.monotonic()
            try:
                resp, _ = self.transport.call(addr, MetadataRequest(None if topic is None else [topic]),
                                              timeout_ms=1000)
                if ok({t["name"]: t for t in resp.topics if not t.get("error")}):
                    pending.pop(0)
                    continue
            except MeshError:
                self.transport.forget(addr)
            # a gossip round is 200 ms: poll a few times per round, and never hog the broker
            time.sleep(max(0.02, 2 * (time.monotonic() - t0)))

    def metadata(self, topics: list[str] | None = None):
        return self._call(MetadataRequest(topics))

    def list_topics(self) -> list[str]:
        return sorted(t["name"] for t in self.metadata().topics if not t.get("error"))

    def describe_topic(self, name: str) -> dict:
        """The topic as one broker sees it, with each partition's offsets and in-sync
        replicas first hand: a broker knows them for the partitions it leads, and for the
        others only from their leaders' gossiped stats (up to about a second old), so each
        other leader is asked too (one metadata call per leader, at most
        ``_LEADER_ASK_MS`` each; one that does not answer leaves the gossiped figures)."""
        resp = self.metadata([name])
        (t,) = resp.topics
        if t.get("error"):
            raise MeshError(t["error"], f"unknown topic {name!r}")
        try:
            self._ask_leaders(name, t, resp.node_id)
        except (KeyError, TypeError, AttributeError):
            pass   # an answer not shaped as asked: the figures stay as the first broker gave them
        return t

    def _ask_leaders(self, name: str, t: dict, answered_by: str) -> None:
        """Replace the gossiped offsets and ISR of ``t``'s partitions led elsewhere by what
        their leaders say of themselves (``describe_topic``)."""
        elsewhere: dict[str, list[dict]] = {}
        for p in t["partitions"]:
            addr = p.get("leader_address")
            if p.get("leader") and p["leader"] != answered_by and isinstance(addr, str):
                try:
                    parse_address(addr)   # before any socket is made for it
                except ValueError:
                    continue              # that partition keeps the gossiped figures; the others are asked
                elsewhere.setdefault(addr, []).append(p)
        for addr, parts in sorted(elsewhere.items()):
            try:
                r, _ = self.transport.call(addr, MetadataRequest([name]), timeout_ms=_LEADER_ASK_MS)
            except MeshError as exc:
                if exc.code in (ErrorCode.TIMEOUT, ErrorCode.BROKER_UNAVAILABLE):
                    self.transport.forget(addr)
                continue
            theirs = next((x for x in getattr(r, "topics", None) or () if isinstance(x, dict)
                           and x.get("name") == name and not x.get("error")), None)
            if theirs is None:
                continue
            node = getattr(r, "node_id", None)
            led = {q.get("partition"): q for q in theirs.get("partitions") or ()
                   if isinstance(q, dict) and q.get("leader") == node and type(q.get("partition")) is int}
            for p in parts:
                q = led.get(p["partition"])
                if (q is not None and q["leader"] == p["leader"]
                        and all(type(q.get(k)) is int for k in ("log_start", "log_end", "high_watermark"))
                        and isinstance(q.get("isr"), list) and all(isinstance(x, str) for x in q["isr"])):
                    p.update({k: q[k] for k in _FIRST_HAND})
                    if isinstance(q.get("dirty_ratio"), (int, float)):   # a compacted topic's leader says
                        p["dirty_ratio"] = q["dirty_ratio"]

    def brokers(self) -> list[dict]:
        return self.metadata([]).brokers
