"""The ``mesh`` command line: node, topic, produce, consume, group, cluster (kafka-topics / kcat style).

Every client command takes ``--bootstrap HOST:PORT`` (default: $MESH_BOOTSTRAP, else
127.0.0.1:7101). Errors are printed as one line ``error: CODE: reason`` with exit code 1.
"""
from __future__ import annotations

import json
import logging
import os
import sys

import click

from tools.node_options import node_bound_options
from tools.common import bootstrap_option, friendly
from tools.elastic_cli import (node_decommission, node_recommission, partition, status_rows, status_table,
                               topic_alter)
from tools.security_cli import node_security_options, security

_bootstrap_option = bootstrap_option
_friendly = friendly


@click.group()
@click.option("-v", "--verbose", count=True, help="more logging")
def main(verbose: int) -> None:
    """mesh: a peer-to-peer distributed log. Run `mesh COMMAND --help` for details."""
    logging.basicConfig(level=logging.WARNING - 10 * verbose,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- node ------------------------------------------------------------------------------
@main.group(invoke_without_command=True, subcommand_metavar="[decommission|recommission ID]")
@click.option("--id", "node_id", default=None, help="stable node id, e.g. n1  [required to run a node]")
@click.option("--data", "data_dir", default=None, type=click.Path(file_okay=False),
              help="data directory  [required to run a node]")
@click.option("--bind", default="127.0.0.1:7101", show_default=True, help="HOST:PORT to listen on")
@click.option("--seed", "seeds", multiple=True, help="address of any live node (repeatable)")
@click.option("--text-port", type=int, default=None, help="also serve the telnet text protocol on this port")
@click.option("--text-max-connections", type=click.IntRange(min=1), default=64, show_default=True,
              help="text gateway: connections at once (one more closes the one idle longest, if idle "
                   "for --text-evict-idle-ms, else it is refused with ERR)")
@click.option("--text-evict-idle-ms", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="text gateway: when full, a connection idle this long is closed to make room")
@click.option("--text-idle-timeout-ms", type=click.IntRange(min=1), default=300_000, show_default=True,
              help="text gateway: a connection without a command for this long is closed")
@click.option("--text-max-subscriptions", type=click.IntRange(min=1), default=256, show_default=True,
              help="text gateway: SUBS held at once by all connections (16 per connection)")
@click.option("--kafka-port", type=click.IntRange(1, 65535), default=None,
              help="also serve the Kafka wire protocol on this port (a process of its own beside the node); "
                   "off by default")
@click.option("--kafka-host", default=None,
              help="host the Kafka listener binds and advertises (default: the --bind host; an open node: "
                   "loopback only)")
@click.option("--kafka-node-id", type=click.IntRange(0, 2 ** 31 - 1), default=None,
              help="this broker's Kafka node id (default: the trailing number of --id, e.g. n3 -> 3, else a "
                   "hash of it)")
@click.option("--max-storage-bytes", type=int, default=64 << 30, show_default=True,
              help="size limit of the LMDB log (a full store refuses writes, keeps serving reads)")
@click.option("--retention-check-ms", type=int, default=5_000, show_default=True,
              help="how often retention runs")
@click.option("--group-max-session-ms", type=int,
              default=lambda: int(os.environ.get("MESH_GROUP_MAX_SESSION_MS", 10_000)),
              show_default="10000 or $MESH_GROUP_MAX_SESSION_MS",
              help="longest consumer session allowed; also how long a new group coordinator waits")
@click.option("--offsets-retention-ms", type=click.IntRange(min=0), default=7 * 86_400_000, show_default=True,
              help="a consumer group with no members and no commit for this long is deleted with its "
                   "offsets (Kafka's offsets.retention.minutes); 0: never")
@click.option("--rejoin-empty", is_flag=True,
              help="if the data directory is refused (damaged store, another node's identity), move it "
                   "aside (renamed with a timestamp, never deleted) and rejoin as an empty replica that "
                   "refills from its peers")
@node_security_options
@node_bound_options
@click.pass_context
def node(ctx, node_id, data_dir, bind, seeds, text_port, text_max_connections, text_evict_idle_ms,
         text_idle_timeout_ms, text_max_subscriptions, kafka_port, kafka_host, kafka_node_id, max_storage_bytes, retention_check_ms,
         group_max_session_ms, offsets_retention_ms, rejoin_empty, security, bounds) -> None:
    """Run a broker node in the foreground (SIGTERM/SIGINT stop it cleanly): `mesh node --id
    n1 --data DIR ...`; or drain a broker (`mesh node decommission ID`) or undo it
    (`mesh node recommission ID`).

    The data directory is locked while the node runs (a second broker on it is refused) and
    checked before it is opened; a damaged one is refused with the reason and the way out
    (--rejoin-empty); a gossip snapshot that cannot be loaded too (--reset-gossip). Every
    resource a client can make the node hold has a bound (the --max-*, --fetch-*,
    --client-*, --*-quota-* and --producer-* options)."""
    if ctx.invoked_subcommand is not None:
        return          # mesh node decommission|recommission ...: the options above are not used
    for value, flag in ((node_id, "--id"), (data_dir, "--data")):
        if value is None:
            raise click.MissingParameter(ctx=ctx, param_hint=f"'{flag}'", param_type="option")
    from mesh.node.loop import Node, NodeConfig
    logging.getLogger().setLevel(logging.INFO)
    for h in logging.getLogger().handlers:
        h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{node_id}] %(name)s: %(message)s"))
    try:
        n = Node(NodeConfig(node_id=node_id, bind=bind, data_dir=data_dir, seeds=list(seeds),
                            map_size_bytes=max_storage_bytes, text_port=text_port,
                            text_max_connections=text_max_connections,
                            text_evict_idle_ms=text_evict_idle_ms,
                            text_idle_timeout_ms=text_idle_timeout_ms,
                            text_max_subscriptions=text_max_subscriptions,
                            kafka_port=kafka_port, kafka_host=kafka_host, kafka_node_id=kafka_node_id,
                            retention_check_ms=retention_check_ms,
                            group_max_session_timeout_ms=group_max_session_ms,
                            offsets_retention_ms=offsets_retention_ms, rejoin_empty=rejoin_empty,
                            **security, **bounds))
    except Exception as exc:
        click.echo(f"error: cannot start node {node_id}: {exc}", err=True)
        sys.exit(1)
    n.install_signal_handlers()
    n.run()
    if n.fatal:
        click.echo(f"error: node {node_id} stopped: {n.fatal}", err=True)
        sys.exit(1)


# -- topics ----------------------------------------------------------------------------
@main.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


def _parse_kv(pairs, what: str) -> dict:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{what} must look like key=value, not {p!r}")
        out[k] = v
    return out


@topic.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(1), default=1, show_default=True)
@click.option("--replication-factor", "-r", type=click.IntRange(1), default=1, show_default=True)
@click.option("--config", "-c", "configs", multiple=True, help="key=value, e.g. retention.ms=60000")
@_bootstrap_option
@_friendly
def topic_create(name, partitions, replication_factor, configs, bootstrap) -> None:
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions, replication_factor, _parse_kv(configs, "--config"))
    click.echo(f"created topic {name} ({partitions} partitions, replication factor {replication_factor})")


@topic.command("list")
@_bootstrap_option
@_friendly
def topic_list(bootstrap) -> None:
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        for name in admin.list_topics():
            click.echo(name)


@topic.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_bootstrap_option
@_friendly
def topic_describe(name, as_json, bootstrap) -> None:
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        t = admin.describe_topic(name)
    if as_json:
        click.echo(json.dumps(t, indent=2, sort_keys=True))
        return
    from mesh.wire.topic_config import compacted, shown_config
    cfg = ",".join(f"{k}={v}" for k, v in sorted(shown_config(t["config"]).items()))
    dirty = compacted(t["config"])   # a compacted topic: each partition's dirty ratio (its leader's)
    click.echo(f"Topic: {t['name']}  Partitions: {len(t['partitions'])}  "
               f"ReplicationFactor: {t['replication_factor']}  Config: {cfg}")
    click.echo(f"{'partition':>9} {'leader':>8} {'epoch':>5} {'replicas':<14} {'isr':<14} "
               f"{'log_start':>10} {'log_end':>10} {'commit':>10}" + ("  dirty" if dirty else "") + "  recovering")
    for p in t["partitions"]:
        ratio = p.get("dirty_ratio")
        click.echo(f"{p['partition']:>9} {str(p['leader']):>8} {p['epoch']:>5} {','.join(p['replicas']):<14} "
                   f"{','.join(p['isr']):<14} {p['log_start']:>10} {p['log_end']:>10} {p['high_watermark']:>10}  "
                   + (f"{'-' if ratio is None else f'{ratio:.3f}':>5}  " if dirty else "")
                   + f"{','.join(p.get('recovering') or []) or '-'}")


@topic.command("delete")
@click.argument("name")
@_bootstrap_option
@_friendly
def topic_delete(name, bootstrap) -> None:
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        admin.delete_topic(name)
    click.echo(f"deleted topic {name}")


# -- produce / consume -----------------------------------------------------------------
@main.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--key-separator", "-K", default=None, help="split each line into KEY<sep>VALUE")
@click.option("--partition", "-p", type=int, default=None, help="send every record to this partition")
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="all", show_default=True,
              help="all: a quorum of replicas synced it; 1: the leader did; 0: no answer")
@click.option("--header", "-H", "headers", multiple=True, help="name=value header on every record")
@click.option("--linger-ms", type=int, default=5, show_default=True)
@click.option("--null-value", default=None, metavar="TEXT",
              help="a line (value) equal to TEXT is sent as a null value (a tombstone), not as TEXT")
@click.option("--empty-is-null", "-Z", is_flag=True, help="an empty value is sent as a null value (kcat's -Z)")
@_bootstrap_option
@_friendly
def produce(topic_name, key_separator, partition, acks, headers, linger_ms, null_value, empty_is_null,
            bootstrap) -> None:
    """Send each line of standard input as one record."""
    from mesh.client import Producer
    hdrs = [(k, v.encode()) for k, v in _parse_kv(headers, "--header").items()] or None
    nulls = {b""} if empty_is_null else set()
    if null_value is not None:
        nulls.add(null_value.encode())
    futures = []
    n = 0
    with Producer(bootstrap, acks=acks, linger_ms=linger_ms) as producer:
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\r\n")
            key = None
            if key_separator is not None:
                k, sep, v = line.partition(key_separator.encode())
                if sep:
                    key, line = k, v
            value = None if line in nulls else line
            futures.append(producer.send(topic_name, value, key=key, partition=partition, headers=hdrs))
            n += 1
            if len(futures) >= 10_000:
                futures = [f for f in futures if not f.done() or f.exception()]
        producer.flush()
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        unknown = sum(1 for e in failed if getattr(e, "maybe_written", True))
        first = failed[0]
        what = getattr(first, "code", None)
        click.echo(f"error: {what.name + ': ' + first.message if what is not None else first} "
                   f"({_outcome(first)})", err=True)
        click.echo(f"{n - len(failed)} of {n} records produced to {topic_name}; {len(failed)} failed: "
                   f"{unknown} with outcome unknown (they may have been written), "
                   f"{len(failed) - unknown} not written", err=True)
        sys.exit(1)
    click.echo(f"produced {n} record{'' if n == 1 else 's'} to {topic_name}", err=True)


def _outcome(exc: BaseException) -> str:
    """Kafka's distinction: may a failed send have been written all the same?"""
    if getattr(exc, "maybe_written", True):
        return "outcome unknown: the record may have been written"
    return "not written"


def _text(b: bytes | None) -> str:
    if b is None:
        return ""
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.hex()


def _parse_time_ms(text: str) -> int:
    """--from-time: ms since the epoch, or an ISO 8601 time (UTC unless it names a zone)."""
    import datetime
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither ms since the epoch nor an ISO 8601 time "
                                 "(e.g. 2026-12-01T21:00:00Z)", param_hint="--from-time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    ms = int(t.timestamp() * 1000)
    if ms < 0:
        raise click.BadParameter(f"{text!r} is before 1970", param_hint="--from-time")
    return ms


@main.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from-beginning", is_flag=True, help="start at the earliest offset")
@click.option("--offset", "-o", type=int, default=None, help="start at this offset (with --partition)")
@click.option("--partition", "-p", type=int, default=None, help="read only this partition")
@click.option("--count", "-c", type=int, default=None, help="exit after this many records")
@click.option("--timeout-ms", type=int, default=None, help="exit when no record arrives for this long")
@click.option("--from-time", default=None, metavar="TIME",
              help="start at the first record whose timestamp is at or after TIME: ms since the epoch, or "
                   "ISO 8601 (2026-12-01T21:00:00, UTC unless it names a zone); a partition with none: its end")
@click.option("--format", "-f", "fmt", default="{value}", show_default=True,
              help="fields: {topic} {partition} {offset} {timestamp} {key} {value} {headers}")
@click.option("--null-text", default="NULL", show_default=True,
              help="what {value} prints for a null value (a tombstone; an empty value prints nothing)")
@click.option("--group", "-g", default=None,
              help="consume as a member of this consumer group (members share the partitions; "
                   "--from-beginning applies where the group has no committed offset)")
@click.option("--session-timeout-ms", type=click.IntRange(100), default=10_000, show_default=True,
              help="with --group: a member silent this long loses its partitions")
@click.option("--auto-commit-interval-ms", type=click.IntRange(0), default=5_000, show_default=True,
              help="with --group: commit what was printed this often (and on exit)")
@_bootstrap_option
@_friendly
def consume(topic_name, from_beginning, offset, partition, count, timeout_ms, from_time, fmt, null_text, group,
            session_timeout_ms, auto_commit_interval_ms, bootstrap) -> None:
    """Print records of a topic, one per line."""
    from mesh.client import Consumer, TopicPartition
    if group and (partition is not None or offset is not None or from_time is not None):
        raise click.UsageError("--group shares the topic's partitions among the group's members: "
                               "it cannot be combined with --partition, --offset or --from-time")
    if from_time is not None and (offset is not None or from_beginning):
        raise click.UsageError("--from-time cannot be combined with --offset or --from-beginning")
    since_ms = None if from_time is None else _parse_time_ms(from_time)
    reset = "earliest" if from_beginning else "latest"
    kwargs = {"group_id": group, "session_timeout_ms": session_timeout_ms,
              "auto_commit_interval_ms": auto_commit_interval_ms} if group else {}
    consumer = Consumer(bootstrap=bootstrap, auto_offset_reset=reset, **kwargs)
    _sigterm_as_interrupt()           # SIGTERM ends it as Ctrl-C does: commits, leaves the group
    try:
        if group:
            _warn_if_missing(consumer, topic_name)
            consumer.subscribe([topic_name])
        else:
            n = consumer.cluster.partitions(topic_name)
            parts = [partition] if partition is not None else list(range(n))
            consumer.assign([TopicPartition(topic_name, p) for p in parts])
            if offset is not None:
                for p in parts:
                    consumer.seek(TopicPartition(topic_name, p), offset)
            elif since_ms is not None:
                found = consumer.offsets_for_times({TopicPartition(topic_name, p): since_ms for p in parts})
                ends = consumer.end_offsets([tp for tp, v in found.items() if v is None])
                for tp, v in found.items():
                    consumer.seek(tp, ends[tp] if v is None else v.offset)
            elif from_beginning:
                consumer.seek_to_beginning()
        seen = 0
        idle_ms = 0
        while count is None or seen < count:
            got = consumer.poll_batches(timeout_ms=200, max_records=None if count is None else count - seen)
            if not got:
                idle_ms += 200
                if timeout_ms is not None and idle_ms >= timeout_ms:
                    break
                continue
            idle_ms = 0
            for recs in got:
                for r in recs:
                    click.echo(fmt.format(topic=r.topic, partition=r.partition, offset=r.offset,
                                          timestamp=r.timestamp, key=_text(r.key),
                                          value=null_text if r.value is None else _text(r.value),
                                          headers=",".join(f"{k}={_text(v)}" for k, v in r.headers)))
                    seen += 1
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _sigterm_as_interrupt() -> None:
    import signal

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def _warn_if_missing(consumer, topic_name: str) -> None:
    """A group member of a topic that does not exist waits for it to be created (as Kafka's
    console consumer does); say so on stderr instead of waiting silently."""
    from mesh.wire.errors import ErrorCode, MeshError
    try:
        consumer.cluster.topic(topic_name)
    except MeshError as e:
        if e.code != ErrorCode.UNKNOWN_TOPIC:
            raise
        click.echo(f"warning: UNKNOWN_TOPIC: topic {topic_name!r} does not exist (yet); waiting for it "
                   f"to be created (mesh topic create {topic_name} ...)", err=True)


# -- groups ----------------------------------------------------------------------------
@main.group()
def group() -> None:
    """Consumer groups: list, describe (members, assignment, offsets, lag), reset offsets,
    delete."""


@group.command("list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_bootstrap_option
@_friendly
def group_list(as_json, bootstrap) -> None:
    """Every group a live broker knows: coordinated there, or with committed offsets."""
    from mesh.client.group_admin import GroupAdmin
    with GroupAdmin(bootstrap) as admin:
        groups = admin.list_groups()
    if as_json:
        click.echo(json.dumps(groups, indent=2, sort_keys=True))
        return
    click.echo(f"{'group':<24} {'coordinator':<12} {'state':<12} {'members':>7} {'epoch':>6}")
    for g in groups:
        members = "-" if g.get("members", -1) < 0 else g["members"]
        epoch = "-" if g.get("group_epoch", -1) < 0 else g["group_epoch"]
        click.echo(f"{g['group_id']:<24} {str(g.get('coordinator')):<12} {g['state']:<12} {members:>7} {epoch:>6}")


@group.command("describe")
@click.argument("group_id", metavar="GROUP")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_bootstrap_option
@_friendly
def group_describe(group_id, as_json, bootstrap) -> None:
    """Members, assignment, and per partition: committed offset, log end, lag."""
    from mesh.client.group_admin import GroupAdmin
    with GroupAdmin(bootstrap) as admin:
        d = admin.describe(group_id)
    if as_json:
        click.echo(json.dumps(d, indent=2, sort_keys=True))
        return
    click.echo(f"Group: {d['group_id']}  Coordinator: {d['coordinator']}  State: {d['state']}  "
               f"Epoch: {d['group_epoch']}  Assignor: {d['assignor'] or '-'}")
    if d["members"]:
        click.echo(f"{'member':<18} {'epoch':>5} {'partitions':>10}  assigned (revoking)")
        for m in d["members"]:
            assigned = ",".join(f"{t}/{p}" for t, p in m["assigned"]) or "-"
            revoking = ",".join(f"{t}/{p}" for t, p in m["revoking"])
            click.echo(f"{m['member_id']:<18} {m['member_epoch']:>5} {len(m['assigned']):>10}  {assigned}"
                       + (f" ({revoking})" if revoking else "") + ("  FENCED" if m.get("fenced") else ""))
    click.echo(f"{'topic':<20} {'partition':>9} {'committed':>10} {'log_end':>10} {'lag':>8}  member")
    for p in d["partitions"]:
        committed = "-" if p["committed"] < 0 else p["committed"]
        lag = "-" if p["lag"] is None else p["lag"]
        click.echo(f"{p['topic']:<20} {p['partition']:>9} {committed:>10} {p['log_end']:>10} {lag:>8}  "
                   f"{p['member'] or '-'}")


@group.command("reset-offsets")
@click.argument("group_id", metavar="GROUP")
@click.option("--topic", "-t", "topic_name", required=True)
@click.option("--partition", "-p", "partitions", type=click.IntRange(0), multiple=True,
              help="only these partitions (repeatable; default all)")
@click.option("--to-earliest", "to", flag_value="earliest", help="the log start of each partition")
@click.option("--to-latest", "to", flag_value="latest", help="the log end of each partition")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="this offset (clamped to each log)")
@_bootstrap_option
@_friendly
def group_reset_offsets(group_id, topic_name, partitions, to, to_offset, bootstrap) -> None:
    """Set a group's committed offsets (only while the group has no members)."""
    if (to is None) == (to_offset is None):
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset N")
    from mesh.client.group_admin import GroupAdmin
    with GroupAdmin(bootstrap) as admin:
        done = admin.reset_offsets(group_id, topic_name, to if to is not None else to_offset,
                                   list(partitions) or None)
    for tp, off in sorted(done.items()):
        click.echo(f"{tp.topic} {tp.partition} {off}")


@group.command("delete")
@click.argument("group_ids", metavar="GROUP...", nargs=-1, required=True)
@_bootstrap_option
@_friendly
def group_delete(group_ids, bootstrap) -> None:
    """Delete groups and their committed offsets (only groups with no members). Groups
    empty and without a commit for the brokers' --offsets-retention-ms go by themselves."""
    from mesh.client.group_admin import GroupAdmin
    with GroupAdmin(bootstrap) as admin:
        for group_id in group_ids:
            admin.delete(group_id)
            click.echo(f"deleted group {group_id}")


# -- cluster ---------------------------------------------------------------------------
@main.group()
def cluster() -> None:
    """Cluster membership and health."""


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True)
@_bootstrap_option
@_friendly
def cluster_status(as_json, bootstrap) -> None:
    """Brokers: liveness, state (active, draining, drained), leaders, replicas, recovery."""
    from mesh.client import Admin
    with Admin(bootstrap) as admin:
        md = admin.metadata()
    rows = status_rows(md)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for line in status_table(rows):
        click.echo(line)


node.add_command(node_decommission); node.add_command(node_recommission)  # noqa: E702
topic.add_command(topic_alter); main.add_command(partition)  # noqa: E702

from tools.acl_cli import acl, user  # noqa: E402  (mesh user ..., mesh acl ...)
main.add_command(user); main.add_command(acl)  # noqa: E702


main.add_command(security)

from tools.top import top  # noqa: E402  (mesh top)
main.add_command(top)

if __name__ == "__main__":
    main()
