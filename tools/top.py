"""``mesh top``: a live terminal view of the cluster (rich), or one plain snapshot (``--once``).

It shows the brokers (id, address, status, partitions led, replicas, produce and consume
rates), the under-replicated and offline partitions, and the largest consumer lags.

Theory of operation
-------------------
Each refresh takes a ``Sample`` (``collect``, the only I/O): the cluster's metadata (the
client's merged ``ClusterView.refresh`` of every topic), the lag of each consumer group
(``GroupAdmin.list_groups`` + ``describe``, at most ``MAX_GROUPS`` groups), and, with
``--metrics HOST:PORT,...``, two counters scraped from each broker's ``/metrics``.

Rates are the difference between two samples over the time between them (``rates``,
pure). From /metrics: produce is appended bytes/s and consume fetched bytes/s, per
broker (named by its ``mesh_broker_info``). Without /metrics they come from the metadata:
produce is the growth of the log ends of the partitions a broker leads, consume the growth
of the groups' committed offsets on them (records/s; reads outside groups are not seen,
and the log ends are the gossiped stats, so these rates are coarser).

``render`` (pure) turns the latest sample and the rates into rich renderables: a live
``rich.live.Live`` display refreshed every ``--interval`` seconds, or, with ``--once``, one
plain-text print (rates measured over ``--interval`` seconds; ``--interval 0``: none).
rich is imported only when the command runs (the rest of the CLI starts without it).
A failed refresh keeps the last view and shows the error; the view never exits on its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import click

from mesh.wire.errors import MeshError
from tools.common import bootstrap_option, friendly

__all__ = ["Rates", "Sample", "collect", "rates", "render", "top"]

MAX_GROUPS = 50            # groups described per refresh
MAX_PARTITION_ROWS = 20    # under-replicated/offline partitions listed (the rest counted)
SCRAPE_TIMEOUT_S = 2.0
_PRODUCED = "mesh_topic_appended_bytes_total"
_FETCHED = "mesh_topic_fetched_bytes_total"


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the cluster. ``partitions``: {(topic, partition): {leader, replicas, isr,
    log_end}}; ``lags``: [{group, topic, partition, committed, log_end, lag}]; ``counters``:
    {broker id: (appended records, fetched bytes)} from /metrics (empty without it)."""
    at_s: float
    brokers: list = field(default_factory=list)
    partitions: dict = field(default_factory=dict)
    lags: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    groups: int = 0


@dataclass(frozen=True, slots=True)
class Rates:
    """Per broker id: produce and consume per second, both in ``unit`` (B/s from /metrics,
    rec/s from the metadata)."""
    produce: dict = field(default_factory=dict)
    consume: dict = field(default_factory=dict)
    unit: str = "rec/s"


# -- collecting (I/O) -------------------------------------------------------------------
def scrape(address: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> tuple[str | None, float, float]:
    """(broker id from mesh_broker_info, appended bytes, fetched bytes) of one /metrics."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    url = address if "://" in address else f"http://{address}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode()
    node, produced, fetched = None, 0.0, 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == _PRODUCED:
                produced += s.value
            elif s.name == _FETCHED:
                fetched += s.value
            elif s.name == "mesh_broker_info":
                node = s.labels.get("node") or node
    return node, produced, fetched


def collect(admin, metrics: list[str], now_s: float | None = None) -> Sample:
    """A ``Sample`` through ``admin`` (a ``GroupAdmin``) and the /metrics addresses."""
    errors: list[str] = []
    md = admin.cluster.refresh(None)
    names = {t["name"] for t in md.topics if not t.get("error")}
    partitions = {}
    for name in sorted(names):
        t = admin.cluster.topics.get(name) or {}
        for p in t.get("partitions", []):
            partitions[(name, p["partition"])] = {
                "leader": p.get("leader"), "replicas": list(p.get("replicas") or []),
                "isr": list(p.get("isr") or []), "log_end": p.get("high_watermark", p.get("log_end", 0))}
    lags = []
    groups = []
    try:
        groups = admin.list_groups()
    except MeshError as exc:
        errors.append(f"groups: {exc.code.name}: {exc.message}")
    for g in groups[:MAX_GROUPS]:
        try:
            d = admin.describe(g["group_id"])
        except MeshError as exc:
            errors.append(f"group {g['group_id']}: {exc.code.name}: {exc.message}")
            continue
        for p in d["partitions"]:
            if p["lag"] is not None:
                lags.append({"group": g["group_id"], "topic": p["topic"], "partition": p["partition"],
                             "committed": p["committed"], "log_end": p["log_end"], "lag": p["lag"]})
    if len(groups) > MAX_GROUPS:
        errors.append(f"{len(groups) - MAX_GROUPS} more groups not shown")
    counters = {}
    for addr in metrics:
        try:
            node, produced, fetched = scrape(addr)
        except (OSError, ValueError) as exc:
            errors.append(f"metrics {addr}: {exc}")
            continue
        counters[node or addr] = (produced, fetched)
    return Sample(at_s=time.monotonic() if now_s is None else now_s, brokers=list(md.brokers),
                  partitions=partitions, lags=lags, counters=counters, errors=errors, groups=len(groups))


# -- rates (pure) -------------------------------------------------------------------------
def rates(prev: Sample | None, cur: Sample) -> Rates:
    """Per-broker rates between two samples (none when there is no earlier sample)."""
    if prev is None or cur.at_s <= prev.at_s:
        return Rates(unit="B/s" if cur.counters else "rec/s")
    dt = cur.at_s - prev.at_s
    if cur.counters:
        produce, consume = {}, {}
        for b, (rec, byt) in cur.counters.items():
            if b in prev.counters:
                prec, pbyt = prev.counters[b]
                if rec >= prec and byt >= pbyt:   # else the broker restarted: no rate this time
                    produce[b] = (rec - prec) / dt
                    consume[b] = (byt - pbyt) / dt
        return Rates(produce, consume, "B/s")
    produce: dict[str, float] = {}
    for tp, p in cur.partitions.items():
        before = prev.partitions.get(tp)
        if p["leader"] is not None and before is not None:
            produce[p["leader"]] = produce.get(p["leader"], 0.0) + max(0, p["log_end"] - before["log_end"]) / dt
    committed = {(x["group"], x["topic"], x["partition"]): x["committed"] for x in prev.lags}
    consume: dict[str, float] = {}
    for x in cur.lags:
        before = committed.get((x["group"], x["topic"], x["partition"]))
        leader = cur.partitions.get((x["topic"], x["partition"]), {}).get("leader")
        if leader is not None and before is not None and before >= 0:
            consume[leader] = consume.get(leader, 0.0) + max(0, x["committed"] - before) / dt
    for b in cur.brokers:   # a broker that leads nothing moves nothing
        produce.setdefault(b["id"], 0.0)
        consume.setdefault(b["id"], 0.0)
    return Rates(produce, consume, "rec/s")


# -- rendering (pure) -------------------------------------------------------------------
def _human(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.1f} {prefix}{unit}"
    return f"{v:.1f} {unit}" if v else f"0 {unit}"


def render(cur: Sample, r: Rates, lags_shown: int = 10, plain: bool = False, note: str = ""):
    """The view: a summary line, then the brokers, the partitions short of replicas and
    the largest consumer lags."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    style = box.ASCII if plain else box.SIMPLE_HEAD
    parts = cur.partitions
    under = sorted(tp for tp, p in parts.items() if p["leader"] is not None and len(p["isr"]) < len(p["replicas"]))
    offline = sorted(tp for tp, p in parts.items() if p["leader"] is None)
    alive = sum(1 for b in cur.brokers if b.get("status", "alive") == "alive")
    head = Text(f"mesh top  brokers {alive}/{len(cur.brokers)} alive  topics {len({t for t, _ in parts})}  "
                f"partitions {len(parts)}  under-replicated {len(under)}  offline {len(offline)}  "
                f"groups {cur.groups}" + (f"  {note}" if note else ""),
                style="" if plain else "bold")

    brokers = Table(title="brokers", box=style, title_justify="left", expand=False)
    for col, just in (("id", "left"), ("address", "left"), ("status", "left"), ("leads", "right"),
                      ("replicas", "right"), ("produce", "right"), ("consume", "right")):
        brokers.add_column(col, justify=just)
    for b in sorted(cur.brokers, key=lambda b: b["id"]):
        bid = b["id"]
        status = b.get("status", "alive")
        leads = sum(1 for p in parts.values() if p["leader"] == bid)
        reps = sum(1 for p in parts.values() if bid in p["replicas"])
        brokers.add_row(bid, b.get("address", "-"),
                        status if plain or status == "alive" else f"[red]{status}[/red]",
                        str(leads), str(reps), _human(r.produce.get(bid), r.unit),
                        _human(r.consume.get(bid), r.unit))

    short = Table(title="under-replicated and offline partitions", box=style, title_justify="left")
    for col in ("topic", "partition", "leader", "replicas", "in sync", "missing"):
        short.add_column(col, justify="right" if col == "partition" else "left")
    listed = (offline + under)[:MAX_PARTITION_ROWS]
    for tp in listed:
        p = parts[tp]
        missing = [x for x in p["replicas"] if x not in p["isr"]]
        short.add_row(tp[0], str(tp[1]), p["leader"] or ("OFFLINE" if plain else "[red]OFFLINE[/red]"),
                      ",".join(p["replicas"]), ",".join(p["isr"]) or "-", ",".join(missing) or "-")
    if len(offline) + len(under) > len(listed):
        short.caption = f"and {len(offline) + len(under) - len(listed)} more"
    if not listed:
        short = Text("under-replicated and offline partitions: none (every partition has a leader and all "
                     "its replicas in sync)")

    lag = Table(title=f"largest consumer lags (top {lags_shown})", box=style, title_justify="left")
    for col in ("group", "topic", "partition", "committed", "log end", "lag"):
        lag.add_column(col, justify="left" if col in ("group", "topic") else "right")
    for x in sorted(cur.lags, key=lambda x: (-x["lag"], x["group"], x["topic"], x["partition"]))[:lags_shown]:
        lag.add_row(x["group"], x["topic"], str(x["partition"]),
                    "-" if x["committed"] < 0 else str(x["committed"]), str(x["log_end"]), str(x["lag"]))
    if not cur.lags:
        lag = Text("largest consumer lags: none (no consumer group has committed offsets)")

    items = [head, brokers, short, lag]
    for e in cur.errors:
        items.append(Text(f"warning: {e}", style="" if plain else "yellow"))
    return Group(*items)


# -- the command ----------------------------------------------------------------------------
@click.command("top")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="seconds between refreshes; with --once, the window rates are measured over (0: no rates)")
@click.option("--once", is_flag=True, help="print one snapshot as plain text and exit (for scripts)")
@click.option("--metrics", "metrics", default="",
              help="HOST:PORT,... of the brokers' --metrics-port: rates from their counters "
                   "(else from the metadata's log ends and the groups' commits)")
@click.option("--lags", "lags_shown", type=click.IntRange(1), default=10, show_default=True,
              help="how many of the largest consumer lags to list")
@bootstrap_option
@friendly
def top(interval, once, metrics, lags_shown, bootstrap) -> None:
    """A live view of brokers, partitions led, produce/consume rates, under-replicated
    partitions and the largest consumer lags (Ctrl-C quits)."""
    from mesh.client.group_admin import GroupAdmin
    addrs = [a.strip() for a in metrics.split(",") if a.strip()]
    if not once and interval < 0.1:
        raise click.BadParameter("must be at least 0.1 without --once", param_hint="--interval")
    try:
        _run(GroupAdmin(bootstrap), addrs, interval, once, lags_shown)
    except KeyboardInterrupt:
        pass


def _run(admin, addrs: list[str], interval: float, once: bool, lags_shown: int) -> None:
    from rich.console import Console
    with admin:
        if once:
            prev = collect(admin, addrs) if interval > 0 else None
            if prev is not None:
                time.sleep(interval)   # the measuring window of the rates
            cur = collect(admin, addrs)
            console = Console(color_system=None, force_terminal=False, width=120, highlight=False)
            console.print(render(cur, rates(prev, cur), lags_shown, plain=True,
                                 note=f"rates over {interval:g} s" if prev else "no rates (--interval 0)"))
            return
        _live(admin, addrs, interval, lags_shown)


def _live(admin, addrs: list[str], interval: float, lags_shown: int) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text
    prev = cur = None
    view = Text("mesh top: connecting...")
    with Live(view, refresh_per_second=4, screen=False, transient=False) as live:
        while True:
            note = f"every {interval:g} s  {time.strftime('%H:%M:%S')}"
            try:
                cur = collect(admin, addrs)
                live.update(render(cur, rates(prev, cur), lags_shown, note=note))
                prev = cur
            except (MeshError, OSError) as exc:   # keep the last view; the next refresh may work
                why = f"{exc.code.name}: {exc.message}" if isinstance(exc, MeshError) else str(exc)
                failed = Text(f"refresh failed: {why}", style="red")
                live.update(Group(render(cur, rates(None, cur), lags_shown, note=note), failed)
                            if cur is not None else failed)
            time.sleep(interval)
