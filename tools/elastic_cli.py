"""The ``mesh`` commands of an elastic cluster: ``topic alter``, ``node decommission`` /
``node recommission``, ``partition reassign`` / ``partition moves``, and the tables of
``cluster status`` and ``partition moves`` (pure functions of the answers, so they are
tested without a broker).

Each change goes to any broker and returns once that broker has it on disk and every
live broker knows it; the partitions' leaders then carry it out one replica at a time
(learner first, promoted once caught up, then the old replica removed), so the data moves
after the command returns: ``mesh partition moves`` and ``mesh cluster status`` show the
progress.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

import click

from tools.common import bootstrap_option, friendly

__all__ = ["topic_alter", "node_decommission", "node_recommission", "partition",
           "status_rows", "status_table", "moves_table", "format_bytes", "parse_replicas"]


# -- tables (pure) ---------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: set[int]) -> list[str]:
    """Lines of a plain table: each column as wide as its widest cell, columns ``right``
    aligned right, no trailing blanks."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(parts).rstrip())
    return out


def format_bytes(n: Any) -> str:
    """1536 -> '1.5 KiB'; None or a negative number -> '-' (unknown)."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n < 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _names(v: Any) -> str:
    """A list of broker ids as 'n1,n2'; a single id as itself; nothing as '-'."""
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v) or "-"
    return "-" if v in (None, "") else str(v)


def _kafka_of(b: dict) -> str:
    """"<id>@host:port" of a broker's Kafka listener (``mesh.kafka``), "-" without one."""
    k = b.get("kafka")
    if not isinstance(k, dict):
        return "-"
    return f"{k.get('id')}@{k.get('host')}:{k.get('port')}"


def status_rows(md) -> list[dict]:
    """One row per broker of a MetadataResponse: liveness (``status``: alive, suspect, dead,
    left), operator ``state`` (active, draining, drained = draining with no replica left),
    and its ``replicas`` and ``leaders``: from the broker entry when a live broker reports
    them, else (none reported, or the broker is dead or left: its last report is stale)
    counted from the partitions of the same answer."""
    parts = [p for t in md.topics for p in t.get("partitions", []) or []]
    rows = []
    for b in md.brokers:
        bid = b["id"]
        live = b.get("status", "alive") in ("alive", "suspect")
        replicas = b.get("replicas")
        if not live or not isinstance(replicas, int):
            replicas = sum(1 for p in parts if bid in (p.get("replicas") or []))
        leaders = b.get("leaders")
        if not live or not isinstance(leaders, int):
            leaders = sum(1 for p in parts if p.get("leader") == bid)
        state = b.get("state") or "active"
        if state == "draining" and replicas == 0:
            state = "drained"
        rows.append({"id": bid, "address": b.get("address"), "status": b.get("status", "alive"),
                     "state": state, "generation": b.get("generation", 0),
                     "heartbeat_age_ms": b.get("heartbeat_age_ms", 0), "leaders": leaders,
                     "replicas": replicas, "recovering": b.get("recovering", 0),
                     "store_id": b.get("store_id"), "clock_offset_ms": b.get("clock_offset_ms"),
                     "kafka": _kafka_of(b)})
    return rows


def _clock(r: dict) -> str:
    """The peers' clock minus the broker's, in seconds ('-': not known)."""
    off = r.get("clock_offset_ms")
    return "-" if not isinstance(off, int) else f"{off / 1000:+.3f}"


def status_table(rows: list[dict]) -> list[str]:
    age = (lambda r: "-" if r["heartbeat_age_ms"] is None else r["heartbeat_age_ms"])
    return _table(["id", "address", "status", "state", "gen", "hb_age_ms", "leaders", "replicas", "recovering",
                   "clock_s", "store", "kafka"],
                  ([r["id"], r["address"], r["status"], r["state"], r["generation"], age(r), r["leaders"],
                    r["replicas"], r["recovering"], _clock(r), r["store_id"] or "-", r.get("kafka", "-")] for r in rows),
                  right={4, 5, 6, 7, 8, 9})


def moves_table(moves: list[dict]) -> list[str]:
    """The ``partition moves`` table, one line per partition with a move in progress."""
    def row(mv: dict) -> list:
        copied, left = mv.get("bytes_copied"), mv.get("bytes_remaining")
        return [mv.get("topic", "?"), mv.get("partition", "?"), _names(mv.get("leader")), _names(mv.get("voters")),
                _names(mv.get("learners")), _names(mv.get("target")), _names(mv.get("adding")),
                f"{format_bytes(copied)} / {format_bytes(left)}", mv.get("reason") or "-"]
    return _table(["topic", "partition", "leader", "voters", "learners", "target", "adding",
                   "copied / remaining", "reason"], (row(mv) for mv in moves), right={1})


def parse_replicas(text: str) -> list[str]:
    """'n1,n2,n4' -> ['n1', 'n2', 'n4'] (preferred leader first); ValueError if empty or
    a broker is named twice."""
    reps = [x.strip() for x in text.split(",")]
    if not reps or any(not x for x in reps):
        raise ValueError(f"--replicas must be broker ids separated by commas, e.g. n1,n2,n4, not {text!r}")
    if len(set(reps)) != len(reps):
        raise ValueError(f"--replicas names a broker twice: {text!r}")
    return reps


# -- commands --------------------------------------------------------------------------
@click.command("alter")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(1), default=None,
              help="the new number of partitions (can only grow; keyed records may then map elsewhere)")
@click.option("--replication-factor", "-r", type=click.IntRange(1), default=None,
              help="the new replication factor (each partition's leader adds or removes replicas)")
@click.option("--config", "-c", "configs", multiple=True,
              help="key=value to set, e.g. cleanup.policy=compact (the other configs stay)")
@bootstrap_option
@friendly
def topic_alter(name, partitions, replication_factor, configs, bootstrap) -> None:
    """Add partitions to a topic, change its replication factor and/or set configs."""
    if partitions is None and replication_factor is None and not configs:
        raise click.UsageError("give --partitions N, --replication-factor N and/or --config KEY=VALUE")
    from mesh.client import Admin
    config = {}
    for kv in configs:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise click.UsageError(f"--config wants KEY=VALUE, not {kv!r}")
        config[k.strip()] = v.strip()
    with Admin(bootstrap) as admin:
        before = admin.metadata([name]).topics[0] if replication_factor else None
        if config:
            admin.alter_topic(name, partitions or 0, replication_factor or 0, config=config)
        else:
            admin.alter_topic(name, partitions or 0, replication_factor or 0)
    done = ([f"{partitions} partitions"] if partitions else []) + \
        ([f"replication factor {replication_factor}"] if replication_factor else []) + \
        [f"{k}={v}" for k, v in config.items()]
    click.echo(f"altered topic {name}: {', '.join(done)}")
    if replication_factor:
        if before.get("replication_factor") == replication_factor and all(
                len(p.get("replicas") or ()) == replication_factor for p in before.get("partitions") or ()):
            click.echo(f"the replication factor was {replication_factor} already: no replica moves")
        else:
            click.echo("replicas are being added or removed now: `mesh partition moves` shows the progress")


@click.command("decommission")
@click.argument("node_id", metavar="ID")
@bootstrap_option
@friendly
def node_decommission(node_id, bootstrap) -> None:
    """Drain broker ID: its leaderships, then every replica, move to other brokers.
    `mesh cluster status` shows it draining, then drained: then stop it for good."""
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        admin.decommission(node_id)
    click.echo(f"{node_id} is draining: `mesh cluster status` shows it drained once it holds no replica")


@click.command("recommission")
@click.argument("node_id", metavar="ID")
@bootstrap_option
@friendly
def node_recommission(node_id, bootstrap) -> None:
    """Undo `mesh node decommission ID`: the broker is active again and takes replicas
    as balancing needs them."""
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        admin.recommission(node_id)
    click.echo(f"{node_id} is active")


@click.group()
def partition() -> None:
    """Move a partition by hand; list the moves in progress."""


@partition.command("reassign")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("number", metavar="PARTITION", type=click.IntRange(0))
@click.option("--replicas", default=None, help="the new replica list, preferred leader first: n1,n2,n4")
@click.option("--cancel", is_flag=True, help="cancel a reassignment that has not finished")
@bootstrap_option
@friendly
def partition_reassign(topic_name, number, replicas, cancel, bootstrap) -> None:
    """Move partition PARTITION of TOPIC to other brokers (its leader adds each new replica
    as a learner, promotes it once caught up, then removes an old one)."""
    if (replicas is None) == (not cancel):
        raise click.UsageError("give exactly one of --replicas n1,n2,... and --cancel")
    reps = [] if cancel else parse_replicas(replicas)
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        admin.reassign(topic_name, number, reps)
    if cancel:
        click.echo(f"cancelled the reassignment of {topic_name}/{number}")
    else:
        click.echo(f"reassigning {topic_name}/{number} to {','.join(reps)}: `mesh partition moves` shows "
                   f"the progress")


@partition.command("moves")
@click.option("--topic", "-t", "topics", multiple=True, help="only this topic (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@bootstrap_option
@friendly
def partition_moves(topics, as_json, bootstrap) -> None:
    """The replica moves in progress, with bytes copied and remaining (every live broker
    reports the partitions it leads)."""
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        got = admin.list_moves(list(topics) or None)
    if as_json:
        click.echo(json.dumps({"moves": got.moves, "unanswered": got.unanswered}, indent=2, sort_keys=True))
    elif got.moves:
        for line in moves_table(got.moves):
            click.echo(line)
    else:
        click.echo("no moves in progress")
    for node, why in sorted(got.unanswered.items()):
        click.echo(f"warning: broker {node} did not answer ({why}): its moves are not listed", err=True)
    sys.stdout.flush()
