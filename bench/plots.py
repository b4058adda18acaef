"""The PNG plots of a bench report (matplotlib, Agg backend: no display needed).

Rules, so that a plot reads at a glance: every bar or point carries its value; units are
in the title or the axis label; axes are linear unless the values span more than
``LOG_SPAN`` (then log, with a tick label at every 1-2-5 step, never two labels for three
decades). Each function takes rows the Spark job computed and writes one file; it
returns False (no file) when there is nothing to draw.
"""
from __future__ import annotations

from bench.scenarios import format_size

__all__ = ["plot_throughput", "plot_latency", "plot_timeline", "plot_by", "plot_paper", "plot_rate_sweep", "plot_peer",
           "short_num", "LOG_SPAN"]

LOG_SPAN = 50.0   # max/min beyond which an axis goes logarithmic


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def short_num(v: float) -> str:
    """12,345 -> '12.3k'; 0.42 -> '0.42'; 1,500,000 -> '1.5M'."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    if a >= 10:
        return f"{v:.0f}"
    return f"{v:.2g}"


def _ms_label(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _ticks_125(lo: float, hi: float) -> list[float]:
    import math
    out = []
    e = math.floor(math.log10(max(lo, 1e-9)))
    while 10 ** e <= hi * 10:
        for m in (1, 2, 5):
            t = m * 10 ** e
            if lo / 1.5 <= t <= hi * 1.5:
                out.append(t)
        e += 1
    return out


def _scale(ax, axis: str, values: list[float], force_log: bool = False) -> None:
    """Linear, or log with labelled 1-2-5 ticks when the values span more than LOG_SPAN."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    vals = [v for v in values if v is not None and v > 0]
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: short_num(v)))  # 200k, not 0.2 x 1e6
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    if not force_log and hi / lo <= LOG_SPAN:
        return
    getattr(ax, f"set_{axis}scale")("log")
    getattr(ax, f"set_{axis}ticks")(_ticks_125(lo, hi))
    target.set_major_formatter(FuncFormatter(lambda v, _: short_num(v)))
    target.set_minor_formatter(NullFormatter())


def _label_bars(ax, bars, fmt=short_num, fontsize: int = 6) -> None:
    for b in bars:
        h = b.get_height()
        if h:
            ax.annotate(fmt(h), (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom",
                        fontsize=fontsize, rotation=90 if len(bars) > 12 else 0, xytext=(0, 2),
                        textcoords="offset points")


def _save(fig, path: str) -> None:
    plt = _plt()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(path: str, cells: list[dict]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(cells) + 3), 4.5))
    xs = range(len(cells))
    width = 0.4
    prod = [c.get("produce_rps") or 0 for c in cells]
    cons = [c.get("consume_rps") or 0 for c in cells]
    _label_bars(ax, ax.bar([x - width / 2 for x in xs], prod, width, label="production"))
    _label_bars(ax, ax.bar([x + width / 2 for x in xs], cons, width, label="consumption"))
    ax.set_xticks(list(xs))
    ax.set_xticklabels([c["cell"] for c in cells], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("records/s")
    _scale(ax, "y", [], force_log=False)
    ax.set_title("Throughput per cell (records/s)")
    ax.margins(y=0.15)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_latency(path: str, cells: list[dict]) -> None:
    """Percentile bars per cell; when some cells are paced (a target rate), only those:
    an unpaced cell drives the system past saturation and measures its queue."""
    plt = _plt()
    names = ("p50", "p95", "p99", "p999")
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 1.2 * len(cells) + 6), 4.5))
    for ax, prefix, title in zip(axes, ("ack", "e2e"),
                                 ("produce ack latency (ms, from the scheduled send)",
                                  "end-to-end latency (ms, streaming cells)")):
        shown = [c for c in cells if c.get(f"{prefix}_p50_ms") is not None]
        paced = [c for c in shown if c.get("rate")]
        if paced and len(paced) < len(shown):  # unpaced cells' latency is queueing by design
            shown = paced
            title += "; paced cells only"
        width = 0.8 / len(names)
        values = []
        for i, n in enumerate(names):
            v = [max(c.get(f"{prefix}_{n}_ms") or 0, 1e-3) for c in shown]
            values += v
            bars = ax.bar([x + (i - 1.5) * width for x in range(len(shown))], v, width,
                          label=n.replace("p999", "p99.9"))
            _label_bars(ax, bars, fmt=_ms_label, fontsize=6)
        ax.set_xticks(list(range(len(shown))))
        ax.set_xticklabels([c["cell"] for c in shown], rotation=60, ha="right", fontsize=7)
        _scale(ax, "y", values)
        ax.margins(y=0.15)
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if not shown:
            ax.text(0.5, 0.5, "no cells with this latency", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend(fontsize=8)
    _save(fig, path)


def plot_timeline(path: str, timeline: list[dict], cells: list[dict], bin_s: float) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    order = [c["cell"] for c in cells]
    for ax, side in zip(axes, ("produce", "consume")):
        for cell in order:
            pts = sorted((r["t_s"], r["rps"]) for r in timeline if r["cell"] == cell and r["side"] == side)
            if pts:
                ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=cell)
        ax.set_title(f"{side}: records/s per {bin_s:g} s bin")
        ax.set_xlabel("seconds since the phase started")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("records/s")
    _scale(axes[0], "y", [])
    if len(order) <= 12:
        axes[0].legend(fontsize=7)
    _save(fig, path)


def plot_by(path: str, rows: list[dict], x_key: str, group_key: str, title: str) -> bool:
    """Lines of rec/s and kB/s against ``x_key`` for each (mode, side, parallelism, group
    value); False (no file) when no series has two points."""
    series: dict = {}
    for r in rows:
        if r["rps"] is None:
            continue
        key = (r["mode"], r["side"], r.get("producers", 1), r.get("consumers", 1), r[group_key])
        series.setdefault(key, []).append(r)
    series = {k: sorted(v, key=lambda r: r[x_key]) for k, v in series.items() if len(v) >= 2}
    if not series:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    xs_all, ys = set(), {"rps": [], "kBps": []}
    for (mode, side, np_, nc, g), pts in sorted(series.items()):
        shown = f"size {format_size(g)}" if group_key == "message_bytes" else f"{group_key} {g}"
        label = f"{mode} {side}, {np_}P/{nc}C ({shown})"
        style = "-" if side == "production" else "--"
        for ax, metric in zip(axes, ("rps", "kBps")):
            xs = [p[x_key] for p in pts]
            vs = [p[metric] for p in pts]
            xs_all.update(xs)
            ys[metric] += vs
            ax.plot(xs, vs, style, marker="o", label=label)
    fmt_x = format_size if x_key == "message_bytes" else str
    for ax, metric, ylabel in zip(axes, ("rps", "kBps"), ("records/s", "kB/s")):
        ax.set_xscale("log", base=2)  # sizes and batches double from point to point
        ax.set_xticks(sorted(xs_all))
        ax.set_xticklabels([fmt_x(x) for x in sorted(xs_all)], fontsize=7, rotation=45)
        ax.minorticks_off()
        _scale(ax, "y", ys[metric])
        ax.set_xlabel("message size" if x_key == "message_bytes" else "records per request (batch)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({ylabel})", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    _save(fig, path)
    return True


def plot_paper(path: str, pairs: list[tuple[str, float, float]]) -> None:
    """Bars of this cluster against the paper, cell by cell, the ratio above each pair."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(pairs) + 3), 5))
    xs = range(len(pairs))
    ax.bar([x - 0.2 for x in xs], [p[1] for p in pairs], 0.4, label="this cluster")
    ax.bar([x + 0.2 for x in xs], [p[2] for p in pairs], 0.4, label="DSBS paper (avg)")
    for x, (_, ours, theirs) in zip(xs, pairs):
        if theirs:
            ax.annotate(f"{ours / theirs:.2f}x", (x, max(ours, theirs)), ha="center", va="bottom", fontsize=6,
                        xytext=(0, 2), textcoords="offset points",
                        color="green" if ours >= theirs else "firebrick")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([p[0] for p in pairs], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("records/s")
    _scale(ax, "y", [p[1] for p in pairs] + [p[2] for p in pairs])
    ax.margins(y=0.12)
    ax.set_title("This cluster vs the DSBS paper, cell by cell (records/s; label = ours / paper)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_rate_sweep(path: str, cells: list[dict]) -> bool:
    """Latency (p50, p99 of ack and end-to-end) against offered rate, and achieved rate
    against offered rate; False when fewer than two paced cells."""
    pts = sorted((c for c in cells if c.get("rate")), key=lambda c: c["rate"])
    if len(pts) < 2:
        return False
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    rates = [c["rate"] for c in pts]
    values = []
    for key, style, label in (("ack_p50_ms", "-o", "ack p50"), ("ack_p99_ms", "-s", "ack p99"),
                              ("e2e_p50_ms", "--o", "end-to-end p50"), ("e2e_p99_ms", "--s", "end-to-end p99")):
        xs = [c["rate"] for c in pts if c.get(key) is not None]
        ys = [c[key] for c in pts if c.get(key) is not None]
        if not xs:
            continue
        values += ys
        ax.plot(xs, ys, style, label=label)
        above, e2e = key.endswith("p99_ms"), key.startswith("e2e")
        for x, y in zip(xs, ys):  # p99 above its point, p50 below; ack left, end-to-end right
            ax.annotate(_ms_label(y), (x, y), fontsize=6, textcoords="offset points", ha="left" if e2e else "right",
                        xytext=(2 if e2e else -2, 3 if above else -9), color=ax.lines[-1].get_color())
    for a in (ax, bx):
        _scale(a, "x", rates, force_log=max(rates) / min(rates) > 8)
        a.set_xticks(rates)
        a.set_xticklabels([short_num(r) for r in rates], fontsize=7)
        a.set_xlabel("offered rate (records/s)")
        a.grid(alpha=0.3)
    _scale(ax, "y", values)
    ax.set_ylabel("ms")
    ax.set_title("Latency against offered rate (ms, from the scheduled send time)", fontsize=10)
    ax.legend(fontsize=8)
    got = [c.get("produce_rps") or 0 for c in pts]
    bx.plot(rates, rates, ":", color="grey", label="offered")
    bx.plot(rates, got, "-o", label="achieved (acknowledged)")
    for x, y in zip(rates, got):
        bx.annotate(short_num(y), (x, y), fontsize=7, xytext=(3, -10), textcoords="offset points")
    _scale(bx, "y", rates + got, force_log=max(rates) / min(rates) > 8)
    bx.set_ylabel("records/s")
    bx.set_title("Achieved against offered rate (records/s)", fontsize=10)
    bx.legend(fontsize=8)
    _save(fig, path)
    return True


def plot_peer(path: str, results: dict, systems: tuple) -> None:
    """Three panels: blocking publish latency (p50, p99), end-to-end latency at a fixed rate
    (p50, p99) and throughput (publish, consume) per system, values on the bars."""
    plt = _plt()
    shown = [(k, label) for k, label, *_ in systems if k in results]
    fig, (ax, ex, bx) = plt.subplots(1, 3, figsize=(18, 5))
    xs = range(len(shown))
    for a, part in ((ax, "latency"), (ex, "e2e")):
        vals = []
        for i, (name, key) in enumerate((("p50", "p50_ms"), ("p99", "p99_ms"))):
            v = [(results[k].get(part) or {}).get(key) or 0.0 for k, _ in shown]
            vals += v
            _label_bars(a, a.bar([x + (i - 0.5) * 0.4 for x in xs], v, 0.4, label=name),
                        fmt=_ms_label, fontsize=8)
        _scale(a, "y", vals)
        a.set_ylabel("ms")
    for i, (name, key) in enumerate((("async publish", "produce_rps"), ("consume", "consume_rps"))):
        v = [results[k][key] for k, _ in shown]
        _label_bars(bx, bx.bar([x + (i - 0.5) * 0.4 for x in xs], v, 0.4, label=name), fontsize=8)
    for a in (ax, ex, bx):
        a.set_xticks(list(xs))
        a.set_xticklabels([label for _, label in shown], rotation=20, ha="right", fontsize=8)
        a.margins(y=0.15)
        a.grid(axis="y", alpha=0.3)
        a.legend(fontsize=8)
    rate = next(((results[k].get("e2e") or {}).get("rate") for k, _ in shown if results[k].get("e2e")), None)
    ax.set_title("Blocking publish latency (ms, lower is better)", fontsize=10)
    ex.set_title(f"End-to-end latency at {rate:,} records/s (ms, lower is better)" if rate else
                 "End-to-end latency at a fixed rate (ms, lower is better)", fontsize=10)
    _scale(bx, "y", [])
    bx.set_ylabel("records/s")
    bx.set_title("Throughput (records/s, higher is better)", fontsize=10)
    _save(fig, path)
