"""Prometheus metrics of one node (``mesh node --metrics-port PORT``; issue 16).

Theory of operation
-------------------
Two threads, nothing mutable shared between them unsafely:

- the node loop (the only thread that reads the cores, the store and the catalog) counts
  into plain ints, dicts and bucket lists of this object (``request``, ``answered``,
  ``appended``, ``fetched``, ``synced``: a few dict lookups and adds per request, nothing
  per record; a histogram observation is one ``bisect`` and an add, ``_Buckets``), and once
  per ``refresh_ms`` builds an immutable snapshot (``refresh``: gauges read from the cores,
  counters' and histograms' running totals) and swaps it in with one attribute assignment;
- the HTTP server thread (``mesh.node.ops.metrics_http``: one thread, at most 32 connections,
  10 s each) serves ``/metrics`` from this node's own ``CollectorRegistry`` (never the
  global one): the default process collector and ``_SnapshotCollector``, which only reads
  the last snapshot. A secured node serves it on 127.0.0.1 unless ``--metrics-host`` says
  otherwise (the series name every hosted topic and group); an open node on its bind host.

So a scrape never waits for the loop, the loop never waits for a scrape, no lock is taken
on the hot path (prometheus_client's ``Counter``/``Histogram`` take one per update: ~1.5 us
per observation, against ~0.2 us here), and every series is at most ``refresh_ms`` (1 s)
old. ``refresh`` is guarded: a failure there is logged (once a minute) and never touches
the turn (the last good snapshot stays served).

Cardinality is bounded: per-partition series only for partitions this node hosts, and none
with ``per_partition=False`` (``--no-metrics-per-partition``); per-topic series only for
topics that exist; per-group series only for groups this node coordinates; ``op`` and
``code`` come from closed sets (message types, ``ErrorCode``).

Families (Prometheus conventions, base units; labels in braces):
  mesh_requests_total{op,code}, mesh_request_duration_seconds{op} (histogram: receive ->
  answer as the node sees it; a produce with acks=0: receive -> staged),
  mesh_network_received_bytes_total, mesh_network_sent_bytes_total (client traffic),
  mesh_produce_ack_latency_seconds{acks} (acks = "0" | "1" | "all"),
  mesh_topic_appended_records_total{topic}, mesh_topic_appended_bytes_total{topic}
  (appended by the leader), mesh_topic_fetched_bytes_total{topic},
  mesh_storage_sync_duration_seconds (histogram: a turn's commit + sync, turns that wrote),
  mesh_storage_map_used_bytes, mesh_storage_map_size_bytes,
  mesh_storage_retention_deleted_batches_total,
  mesh_compaction_cleaned_bytes_total, mesh_compaction_read_bytes_total (scanned and
  rewritten), mesh_compaction_dirty_ratio{topic,partition} (bytes not yet compacted over the
  partition's bytes), mesh_compaction_lag_offsets{topic,partition} (the leader's cut minus
  the one this replica applied), on compacted topics only (mesh.node.data.compactor),
  mesh_storage_syncs_total, mesh_storage_unsynced_commits_total (write caching: commits
  left to the flush.ms sync),
  mesh_partition_log_size_bytes, mesh_partition_leader (0/1), mesh_partition_leader_epoch,
  mesh_partition_log_end_offset, mesh_partition_high_watermark ({topic,partition}),
  mesh_partition_follower_lag_records{topic,partition,follower} (on the leader: its log
  end minus the follower's match offset),
  mesh_under_replicated_partitions (led here, fewer in-sync replicas than replicas),
  mesh_offline_partitions (hosted here, no leader known),
  mesh_gossip_members{state}, mesh_gossip_rounds_total, mesh_gossip_sent_bytes_total,
  mesh_gossip_received_bytes_total, mesh_gossip_convergence_lag_seconds (estimate: the
  longest time since a live peer's heartbeat last moved here), mesh_gossip_suspicions_total,
  mesh_gossip_deaths_total, mesh_gossip_refused_messages_total{reason} (reason: a
  malformed kind, or "unknown"), mesh_peer_refused_messages_total,
  mesh_group_members{group}, mesh_group_generation{group},
  mesh_group_committed_offset{group,topic,partition}, mesh_group_lag_records{group,topic,
  partition} (high watermark - committed, never below 0: the end a consumer can read;
  from the store for partitions led here, else the leaders' ``stats/`` in gossip),
  mesh_group_rebalances_total{group} (generation bumps seen here; group series only for
  the ``GROUP_SERIES_MAX`` (500) groups with the most lag, each with at most
  ``GROUP_PARTITION_SERIES_MAX`` partitions), mesh_groups_coordinated (all of them),
  mesh_broker_info{node,address,generation} (1),
  mesh_clock_offset_seconds (the peers' clock minus this one, median over peers; absent
  until a peer's stamp arrived), mesh_clock_trusted (0 while the offset is beyond
  ``--clock-offset-bound-ms`` or unknown: no time-based deletion), and process_* (CPU,
  memory, fds).
"""
from __future__ import annotations

import logging
import time
from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from mesh.cluster import keys
from mesh.cluster.liveness import is_up
from mesh.gossip.parsing import MALFORMED_KINDS
from mesh.node.ops.metrics_http import MetricsServer
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode
from mesh.wire.types import ALIVE, DEAD, LEFT, SUSPECT

__all__ = ["NodeMetrics", "REFRESH_MS", "serve_metrics"]

log = logging.getLogger("mesh.node.ops.metrics")
_ACKS_NONE = m.Acks.NONE   # bound once (an enum member's lookup: ~1 us)

REFRESH_MS = 1_000
GROUP_SERIES_MAX = 500              # groups with per-group series (the most lagging)
GROUP_PARTITION_SERIES_MAX = 1_000  # partitions with committed/lag series per group
_MAX_PENDING = 100_000          # requests awaiting an answer (a gone client's are forgotten)
_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_ACKS = {0: "0", 1: "1", -1: "all"}
_perf = time.perf_counter


def _op_name(cls: type) -> str:
    name = cls.__name__
    return name[:-len("Request")] if name.endswith("Request") else name


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return "UNKNOWN"


class NodeMetrics:
    """Counters kept by the loop thread, histograms, the snapshot, the HTTP server."""

    def __init__(self, node, per_partition: bool = True, refresh_ms: int = REFRESH_MS) -> None:
        """``node``: the ``mesh.node.loop.Node`` (read by ``refresh`` on the loop thread)."""
        self.node = node
        self.per_partition = per_partition
        self.refresh_ms = refresh_ms
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.request_seconds: dict[str, _Buckets] = {}    # op -> histogram
        self.ack_seconds = {label: _Buckets(_LATENCY_BUCKETS_S) for label in _ACKS.values()}
        self.sync_seconds = _Buckets(_SYNC_BUCKETS_S)
        # running totals, loop thread only
        self.requests: dict[tuple[str, str], int] = {}
        self.received_bytes = 0
        self.sent_bytes = 0
        self.appended_records: dict[str, int] = {}
        self.appended_bytes: dict[str, int] = {}
        self.fetched_bytes: dict[str, int] = {}
        self.gossip_sent_bytes = 0
        self.gossip_received_bytes = 0
        self.suspicions = 0
        self.deaths = 0
        self.rebalances: dict[str, int] = {}
        self._epochs: dict[str, int] = {}
        self._pending: dict[tuple[bytes, int], tuple[str, float, str | None]] = {}
        self._op_names: dict[type, str] = {}
        self._code_names: dict[int, str] = {}
        self._open_acks0: float | None = None
        self._next_refresh_ms = 0
        self._rlog = RateLimitedLog(log)
        self.snapshot: dict[str, list] = {}
        self.registry.register(_SnapshotCollector(self))
        self.server: MetricsServer | None = None

    # -- the HTTP server ------------------------------------------------------------------
    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` (``mesh.node.ops.metrics_http``: one daemon thread)."""
        self.refresh(force=True)
        self.server = MetricsServer(self.registry, host, port)
        self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # -- hot path (loop thread) -------------------------------------------------------------
    def request(self, ident: bytes, rid: int, msg: Any, frames: list) -> None:
        """A client request was decoded: its bytes; its clock starts."""
        self.received_bytes += sum(map(len, frames))
        cls = type(msg)
        op = self._op_names.get(cls)
        if op is None:
            op = self._op_names[cls] = _op_name(cls)
        acks = None
        if cls is m.ProduceRequest:
            acks = _ACKS.get(msg.acks)
            if msg.acks == _ACKS_NONE:   # never answered: counted when handled (``handled``)
                self._open_acks0 = _perf()
                return
        pending = self._pending
        if len(pending) >= _MAX_PENDING:
            pending.clear()
        pending[(ident, rid)] = (op, _perf(), acks)

    def handled(self) -> None:
        """The dispatcher is done with a request (only acks=0 produce is still open)."""
        t0 = self._open_acks0
        if t0 is not None:
            self._open_acks0 = None
            dt = _perf() - t0
            self._count("Produce", 0, dt)
            self.ack_seconds["0"].observe(dt)

    def answered(self, ident: bytes, rid: int, msg: Any, frames: list) -> None:
        """An answer goes out: its bytes; the request's count and latency."""
        self.sent_bytes += sum(map(len, frames))
        p = self._pending.pop((ident, rid), None)
        if p is None:
            if self._open_acks0 is not None:   # an acks=0 produce refused at once
                self._open_acks0 = None
                self._count("Produce", getattr(msg, "error", 0), None)
            elif type(msg) is m.ErrorResponse:   # a request that could not be decoded
                self._count("Invalid", msg.error, None)
            return
        op, t0, acks = p
        dt = _perf() - t0
        self._count(op, getattr(msg, "error", 0), dt)
        if acks is not None:
            self.ack_seconds[acks].observe(dt)

    def _count(self, op: str, code: int, dt: float | None) -> None:
        name = self._code_names.get(code)
        if name is None:
            name = self._code_names[code] = "NONE" if code == 0 else _code_name(code)
        key = (op, name)
        self.requests[key] = self.requests.get(key, 0) + 1
        if dt is not None:
            h = self.request_seconds.get(op)
            if h is None:
                h = self.request_seconds[op] = _Buckets(_LATENCY_BUCKETS_S)
            h.observe(dt)

    def appended(self, topic: str, records: int, nbytes: int) -> None:
        self.appended_records[topic] = self.appended_records.get(topic, 0) + records
        self.appended_bytes[topic] = self.appended_bytes.get(topic, 0) + nbytes

    def fetched(self, topic: str, nbytes: int) -> None:
        self.fetched_bytes[topic] = self.fetched_bytes.get(topic, 0) + nbytes

    def synced(self, seconds: float) -> None:
        self.sync_seconds.observe(seconds)

    # -- the snapshot (loop thread) -------------------------------------------------------------
    def maybe_refresh(self, mono_ms: int) -> None:
        """Refresh every ``refresh_ms``, or less often when a refresh is slow (many
        partitions): at most ~2% of the loop's time goes to it."""
        if mono_ms >= self._next_refresh_ms:
            t0 = _perf()
            self.refresh()
            self._next_refresh_ms = mono_ms + max(self.refresh_ms, int((_perf() - t0) * 50_000))

    def refresh(self, force: bool = False) -> None:
        """Build the snapshot from the cores and swap it in; never raises."""
        try:
            self.snapshot = _build_snapshot(self, self.node)
        except Exception as exc:
            self._rlog.exception("refresh", exc, "metrics snapshot failed: %s", exc)


def metrics_host(config, secured: bool) -> str:
    """Where ``/metrics`` listens: ``--metrics-host`` if given, else 127.0.0.1 on a secured
    node (the series name every hosted topic and group, and HTTP has no CURVE), else the
    bind host."""
    if config.metrics_host:
        return config.metrics_host.strip("[]")
    if secured:
        return "127.0.0.1"
    return config.bind.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"


def serve_metrics(node, config) -> NodeMetrics:
    """The node's metrics, served on ``config.metrics_port`` of ``metrics_host``; a port that
    cannot be bound stops the start (``StartupError``, the node's router and lock released)."""
    from mesh.node.limits.bounds import StartupError
    mx = NodeMetrics(node, per_partition=config.metrics_per_partition)
    host = metrics_host(config, node.security.secured)
    try:
        mx.serve(host, config.metrics_port)
    except OSError as exc:
        node.router.close(linger=0)
        node.disk.data_dir.unlock()
        raise StartupError(f"cannot serve metrics on {host}:{config.metrics_port}: {exc}") from exc
    log.info("metrics on http://%s:%d/metrics", host, config.metrics_port)
    return mx


class _Buckets:
    """A histogram kept by the loop thread: per-bucket counts (not cumulative) and a sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)   # the last one: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def exposition(self) -> tuple[list, float]:
        """([(le, cumulative count)], sum), as ``HistogramMetricFamily.add_metric`` takes them."""
        out, acc = [], 0
        for le, n in zip([*map(str, self.bounds), "+Inf"], self.counts):
            acc += n
            out.append((le, acc))
        return out, self.sum


def _histogram(name: str, doc: str, labels: tuple, hists: dict) -> list:
    return ["histogram", name, doc, labels, [(values, h.exposition()) for values, h in sorted(hists.items())]]


def _gauge(name: str, doc: str, labels: tuple = (), rows=None) -> list:
    return ["gauge", name, doc, labels, rows if rows is not None else []]


def _counter(name: str, doc: str, labels: tuple = (), rows=None) -> list:
    return ["counter", name, doc, labels, rows if rows is not None else []]


def _build_snapshot(mx: NodeMetrics, node) -> dict[str, list]:
    """Families as [kind, name, doc, label names, [(label values, value)]] (loop thread)."""
    now_ms = node.clock.wall_ms()
    out: list[list] = []
    topics = node.catalog.topics
    out.append(_counter("mesh_requests_total", "Client requests answered, by type and error code", ("op", "code"),
                        sorted(((op, code), n) for (op, code), n in mx.requests.items())))
    out.append(_histogram("mesh_request_duration_seconds", "Request latency, receive to answer", ("op",),
                          {(op,): h for op, h in mx.request_seconds.items()}))
    out.append(_histogram("mesh_produce_ack_latency_seconds", "Produce acknowledgement latency", ("acks",),
                          {(a,): h for a, h in mx.ack_seconds.items()}))
    out.append(_histogram("mesh_storage_sync_duration_seconds", "A turn's commit and sync (turns that wrote)", (),
                          {(): mx.sync_seconds}))
    out.append(_counter("mesh_network_received_bytes_total", "Client request bytes received",
                        rows=[((), mx.received_bytes)]))
    out.append(_counter("mesh_network_sent_bytes_total", "Client answer bytes sent", rows=[((), mx.sent_bytes)]))
    for d in (mx.appended_records, mx.appended_bytes, mx.fetched_bytes):
        for gone in [t for t in d if t not in topics]:
            del d[gone]
    out.append(_counter("mesh_topic_appended_records_total", "Records appended (as leader)", ("topic",),
                        sorted(((t,), n) for t, n in mx.appended_records.items())))
    out.append(_counter("mesh_topic_appended_bytes_total", "Batch bytes appended (as leader)", ("topic",),
                        sorted(((t,), n) for t, n in mx.appended_bytes.items())))
    out.append(_counter("mesh_topic_fetched_bytes_total", "Batch bytes served to fetches", ("topic",),
                        sorted(((t,), n) for t, n in mx.fetched_bytes.items())))
    store = node.store
    env = getattr(store, "env", None)
    if env is not None:
        info, psize = env.info(), env.stat()["psize"]
        out.append(_gauge("mesh_storage_map_used_bytes", "LMDB pages in use",
                          rows=[((), (info["last_pgno"] + 1) * psize)]))
        out.append(_gauge("mesh_storage_map_size_bytes", "LMDB map size (the store's limit)",
                          rows=[((), info["map_size"])]))
    out.append(_counter("mesh_storage_retention_deleted_batches_total", "Batches deleted by retention",
                        rows=[((), getattr(store, "retention_deleted_batches", 0))]))
    out.extend(_compaction_families(node))
    out.append(_counter("mesh_storage_syncs_total", "Commits and flushes that synced the store",
                        rows=[((), getattr(store, "syncs", 0))]))
    out.append(_counter("mesh_storage_unsynced_commits_total", "Commits left unsynced by write caching "
                        "(synced within flush.ms)", rows=[((), getattr(store, "unsynced_commits", 0))]))
    out.extend(_partition_families(mx, node))
    out.extend(_gossip_families(mx, node, now_ms))
    out.extend(_group_families(mx, node))
    out.append(_gauge("mesh_broker_info", "This broker", ("node", "address", "generation"),
                      [((node.node_id, node.address, str(node.generation)), 1)]))
    out.extend(_clock_families(node))
    return {"families": out}


def _compaction_families(node) -> list[list]:
    comp = getattr(node, "compactor", None)
    if comp is None:
        return []
    ratios, lags = [], []
    for t, p, pid in comp.hosted_compacted():
        ratios.append(((t.name, str(p)), round(comp.dirty_ratio(pid), 4)))
        lags.append(((t.name, str(p)), comp.lag(pid)))
    return [_counter("mesh_compaction_cleaned_bytes_total", "Bytes removed by compaction",
                     rows=[((), comp.cleaned_bytes)]),
            _counter("mesh_compaction_read_bytes_total", "Bytes compaction scanned or rewrote",
                     rows=[((), comp.read_bytes)]),
            _gauge("mesh_compaction_dirty_ratio", "Share of a compacted partition's bytes not yet compacted",
                   ("topic", "partition"), sorted(ratios)),
            _gauge("mesh_compaction_lag_offsets", "Offsets between the leader's compaction cut and the one "
                   "applied here", ("topic", "partition"), sorted(lags))]


def _clock_families(node) -> list[list]:
    """This clock against the peers' (``mesh.node.peers.peer_clock``): no series without an estimate."""
    pc = getattr(node, "peer_clock", None)
    if pc is None:
        return []
    est = pc.offset_ms()
    rows = [((), est / 1000)] if est is not None else []
    return [_gauge("mesh_clock_offset_seconds", "The peers' clock minus this broker's (median over peers, "
                   "from gossip stamps)", rows=rows),
            _gauge("mesh_clock_trusted", "1 while this clock agrees with its peers' (time-based deletion allowed)",
                   rows=[((), int(pc.trusted()))])]


def _partition_families(mx: NodeMetrics, node) -> list[list]:
    replicas, store = node.replicas, node.store
    size, leader, epoch, end, hw, lag = ([] for _ in range(6))
    under = offline = 0
    for pid, (name, p) in sorted(node.catalog.local.items()):
        if not replicas.hosts(pid):
            continue
        who, term = replicas.leader(pid)
        leading = who == node.node_id
        if who is None:
            offline += 1
        if leading and len(replicas.isr(pid)) < len(node.catalog.replicas_of(pid)):
            under += 1
        if not mx.per_partition:
            continue
        status = replicas.status(pid) if leading else None   # followers' match offsets
        lv = (name, str(p))
        log_end = store.log_end(pid)
        size.append((lv, store.size_bytes(pid)))
        leader.append((lv, int(leading)))
        epoch.append((lv, term))
        end.append((lv, log_end))
        hw.append((lv, replicas.commit_offset(pid)))
        if status is not None:
            for peer, pr in sorted(status.get("followers", {}).items()):
                lag.append(((name, str(p), peer), max(0, log_end - pr["match"])))
    tp = ("topic", "partition")
    out = [_gauge("mesh_under_replicated_partitions", "Partitions led here with fewer in-sync replicas than replicas",
                  rows=[((), under)]),
           _gauge("mesh_offline_partitions", "Partitions hosted here with no leader known", rows=[((), offline)]),
           _gauge("mesh_quiet_replicas", "Partition replicas hosted here that are quiet (idle: not ticked, no "
                  "heartbeats)", rows=[((), replicas.quiet())])]
    if mx.per_partition:
        out += [_gauge("mesh_partition_log_size_bytes", "Bytes of the local log", tp, size),
                _gauge("mesh_partition_leader", "1 if this broker leads the partition", tp, leader),
                _gauge("mesh_partition_leader_epoch", "Leader epoch (term) known here", tp, epoch),
                _gauge("mesh_partition_log_end_offset", "End offset of the local log", tp, end),
                _gauge("mesh_partition_high_watermark", "Commit offset (high watermark) known here", tp, hw),
                _gauge("mesh_partition_follower_lag_records", "Leader's log end minus the follower's match offset",
                       tp + ("follower",), lag)]
    return out


def _gossip_families(mx: NodeMetrics, node, now_ms: int) -> list[list]:
    gossip = node.gossip   # (suspicions and deaths: counted by the loop as it logs them)
    states = dict.fromkeys((ALIVE, SUSPECT, DEAD, LEFT), 0)
    lag_ms = 0
    for mem in gossip.members(now_ms):
        states[mem.status] = states.get(mem.status, 0) + 1
        if mem.node_id != node.node_id and is_up(mem.status) and mem.last_heard_ms is not None:
            lag_ms = max(lag_ms, now_ms - mem.last_heard_ms)
    st = gossip.stats
    refused = [((kind,), st.get(f"malformed_{kind}", 0)) for kind in MALFORMED_KINDS]
    refused.append((("unknown",), st.get("unknown_messages", 0)))
    return [
        _gauge("mesh_gossip_members", "Members by state, as this broker sees them", ("state",),
               sorted(((s,), n) for s, n in states.items())),
        _counter("mesh_gossip_rounds_total", "Gossip rounds started", rows=[((), st.get("rounds", 0))]),
        _counter("mesh_gossip_sent_bytes_total", "Gossip bytes sent", rows=[((), mx.gossip_sent_bytes)]),
        _counter("mesh_gossip_received_bytes_total", "Gossip bytes received", rows=[((), mx.gossip_received_bytes)]),
        _gauge("mesh_gossip_convergence_lag_seconds", "Longest time since a live peer's heartbeat moved here",
               rows=[((), max(0, lag_ms) / 1000.0)]),
        _counter("mesh_gossip_suspicions_total", "Members this broker began to suspect", rows=[((), mx.suspicions)]),
        _counter("mesh_gossip_deaths_total", "Members this broker declared dead", rows=[((), mx.deaths)]),
        _counter("mesh_gossip_refused_messages_total", "Gossip messages dropped whole, by reason", ("reason",),
                 refused),
        _counter("mesh_peer_refused_messages_total", "Peer messages not from a broker",
                 rows=[((), node.dispatch.peer_messages_refused)]),
    ]


def _read_ends(node) -> dict[tuple[str, int], int]:
    """(topic, partition) -> high watermark, from the leaders' ``stats/`` in gossip (max)."""
    ends: dict[tuple[str, int], int] = {}
    gossip = node.gossip
    for mem in gossip.members(node.clock.wall_ms()):
        for key, chunk in gossip.node_items(mem.node_id, keys.STATS_PREFIX).items():
            if not isinstance(chunk, dict):
                continue
            topic = keys.topic_of_key(key)
            for p, row in chunk.items():
                if isinstance(row, list) and len(row) == 3 and str(p).isdigit():
                    k = (topic, int(p))
                    ends[k] = max(ends.get(k, -1), row[2])
    return ends


def _group_families(mx: NodeMetrics, node) -> list[list]:
    core = node.groups.core
    groups = core.list_groups().groups
    ends = None
    seen = set()
    per_group = []   # (total lag, members, gid, generation, committed rows, lag rows)
    for g in groups:
        gid, gen = g["group_id"], g["group_epoch"]
        seen.add(gid)
        last = mx._epochs.get(gid, 0)   # a group born here starts at generation 0
        if gen > last:
            mx.rebalances[gid] = mx.rebalances.get(gid, 0) + gen - last
        mx._epochs[gid] = gen
        committed, lag = [], []
        per_group.append([0, g["members"], gid, gen, committed, lag])
        for (topic, p), (offset, _meta) in sorted(core.committed(gid).items()):
            t = node.catalog.topics.get(topic)
            if t is None or not 0 <= p < len(t.pids):
                continue
            committed.append(((gid, topic, str(p)), offset))
            pid = t.pids[p]
            if pid is not None and node.replicas.is_leader(pid):
                end = node.replicas.commit_offset(pid)
            else:
                if ends is None:
                    ends = _read_ends(node)
                end = ends.get((topic, p))
            if end is not None and end >= 0:
                lag.append(((gid, topic, str(p)), max(0, end - offset)))
                per_group[-1][0] += max(0, end - offset)
    for gone in [g for g in mx._epochs if g not in seen]:   # moved away: its series go
        del mx._epochs[gone]
        mx.rebalances.pop(gone, None)
    # bounded output: the GROUP_SERIES_MAX groups with the most lag (then members) get
    # series, each with at most GROUP_PARTITION_SERIES_MAX partitions (5,000 groups made
    # a scrape 3.1 MB); mesh_groups_coordinated counts them all
    if len(per_group) > GROUP_SERIES_MAX:
        per_group.sort(key=lambda x: (-x[0], -x[1], x[2]))
        del per_group[GROUP_SERIES_MAX:]
        per_group.sort(key=lambda x: x[2])
    members, generation, committed, lag, rebalances = [], [], [], [], []
    for _total, n, gid, gen, com, lg in per_group:
        members.append(((gid,), n))
        generation.append(((gid,), gen))
        rebalances.append(((gid,), mx.rebalances.get(gid, 0)))
        committed.extend(com[:GROUP_PARTITION_SERIES_MAX])
        lag.extend(lg[:GROUP_PARTITION_SERIES_MAX])
    gtp = ("group", "topic", "partition")
    return [
        _gauge("mesh_groups_coordinated", "Groups coordinated here (series only for the most lagging "
               f"{GROUP_SERIES_MAX})", (), [((), len(groups))]),
        _gauge("mesh_group_members", "Members of groups coordinated here", ("group",), members),
        _gauge("mesh_group_generation", "Generation (epoch) of groups coordinated here", ("group",), generation),
        _gauge("mesh_group_committed_offset", "Committed offsets of groups coordinated here", gtp, committed),
        _gauge("mesh_group_lag_records", "High watermark minus committed offset", gtp, lag),
        _counter("mesh_group_rebalances_total", "Generation bumps seen here", ("group",), rebalances),
    ]


class _SnapshotCollector:
    """Serves the last snapshot (HTTP thread: reads one attribute, builds families)."""

    def __init__(self, mx: NodeMetrics) -> None:
        self._mx = mx

    def collect(self):
        snap = self._mx.snapshot   # one atomic read; the loop swaps in a new dict, never mutates it
        for kind, name, doc, labels, rows in snap.get("families", ()):
            if kind == "histogram":
                fam = HistogramMetricFamily(name, doc, labels=list(labels))
                for values, (buckets, total) in rows:
                    fam.add_metric(list(values), buckets, total)
                yield fam
                continue
            if kind == "counter":
                fam = CounterMetricFamily(name[:-len("_total")], doc, labels=list(labels))
            else:
                fam = GaugeMetricFamily(name, doc, labels=list(labels))
            for values, value in rows:
                fam.add_metric(list(values), value)
            yield fam
