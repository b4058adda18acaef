"""The resource-bound options of ``mesh node`` (issue 13), one per ``NodeConfig`` field.

``node_bound_options`` adds them to the command and passes them on as ``bounds=dict(...)``
(field name -> value), ready for ``NodeConfig(**bounds)``, with ``--reset-gossip`` and the
metrics options (``--metrics-port``, ``--metrics-per-partition``: ``mesh.node.ops.metrics``).
The defaults here are ``NodeConfig``'s (a unit test keeps them equal; importing the node here would make every
``mesh`` command slow to start); Kafka's or NATS's name for the same knob is in each help.
"""
from __future__ import annotations

import functools

import click

__all__ = ["node_bound_options", "BOUND_OPTIONS", "parse_duration_ms"]

# (field, minimum, default, help). Every field is an int >= its minimum (0 where 0 means
# "off" or "no wait").
BOUND_OPTIONS: list[tuple[str, int, int, str]] = [
    ("max_frame_bytes", 1, 16 << 20, "largest frame accepted (ZMQ_MAXMSGSIZE): a bigger one is dropped with its "
                           "connection before it is read (Kafka socket.request.max.bytes, NATS max_payload)"),
    ("max_body_bytes", 1, 1 << 20, "largest msgpack body of a client request; record batches travel apart"),
    ("max_body_containers", 0, 50_000, "arrays and maps in one msgpack body of a client request; a denser body "
                                       "is refused (INVALID_REQUEST) as soon as it is seen, 0 = no bound"),
    ("request_percentage", 0, 0, "per principal (open mode: per connection), the share of the node loop's time "
                                 "its requests may take over a few seconds, in percent; beyond, its requests are "
                                 "refused (THROTTLED) before they are decoded, 0 = off (Kafka request_percentage)"),
    ("fetch_max_bytes", 1, 8 << 20, "bytes in one fetch answer, plus at most one batch (Kafka fetch.max.bytes)"),
    ("partition_fetch_max_bytes", 1, 4 << 20, "bytes per partition in one fetch answer (Kafka max.partition.fetch.bytes)"),
    ("fetch_max_wait_ms", 0, 30_000, "longest long-poll wait; a larger max_wait_ms is capped (Kafka fetch.max.wait.ms)"),
    ("max_parked_fetches", 1, 5_000, "long-poll fetches waiting at once; one more is answered at once"),
    ("max_parked_per_client", 1, 16, "long-poll fetches waiting at once per client"),
    ("client_sndhwm", 1, 16, "answers queued in ZeroMQ per client connection (SNDHWM)"),
    ("client_backlog_bytes", 1, 4 << 20, "then queued in the node per client; beyond, answers to it are dropped "
                                "(NATS max_pending, slow consumer)"),
    ("queued_max_answer_bytes", 1, 256 << 20, "bytes of answers clients have not read yet that the node holds in all; "
                                              "beyond (or beyond fetch_max_bytes for one client), a fetch is answered "
                                              "THROTTLED instead of its records (the answer side of Kafka's "
                                              "queued.max.request.bytes)"),
    ("compaction_bytes_per_s", 1, 8 << 20, "bytes a second the compactor reads and rewrites (compacted topics; "
                                           "Kafka log.cleaner.io.max.bytes.per.second)"),
    ("compaction_check_ms", 1, 1_000, "how often a leader looks for a compaction cut to decide "
                                      "(Kafka log.cleaner.backoff.ms)"),
    ("heartbeat_ivl_ms", 1, 1_000, "ZeroMQ heartbeat (PING) interval on links to peers"),
    ("heartbeat_timeout_ms", 1, 3_000, "a peer link silent this long after a PING is dropped at both ends"),
    ("produce_quota_bytes_per_s", 0, 0, "per-client produce byte rate; answers are delayed to keep it, "
                                     "0 = off (Kafka producer_byte_rate)"),
    ("fetch_quota_bytes_per_s", 0, 0, "per-client fetch byte rate; answers are delayed to keep it, "
                                   "0 = off (Kafka consumer_byte_rate)"),
    ("producer_id_expiration_ms", 1, 86_400_000, "idempotent-producer state idle this long is deleted "
                                     "(Kafka producer.id.expiration.ms)"),
    ("clock_offset_bound_ms", 1, 30_000, "this broker's clock offset from its peers' (estimated from gossip "
                                  "stamps) beyond which it logs an error and deletes nothing by time "
                                  "(retention.ms, producer-id and group expiry) until it agrees again"),
    ("max_producer_ids", 1, 1_000_000, "idempotent-producer states kept; the longest idle beyond go first"),
    ("move_rate_bytes", 0, 32 << 20, "catch-up bytes/s this broker sends to replicas being added by a move, "
                                    "0 = no cap (Kafka leader.replication.throttled.rate)"),
    ("max_moves_per_broker", 1, 4, "replica moves in progress at once per source and per target broker"),
    ("shutdown_handover_ms", 0, 5_000, "on SIGTERM or Ctrl-C, hand every partition led here to a caught-up replica, "
                                       "waiting at most this long, then stop; a second signal stops at once; "
                                       "0 = stop at once (Kafka controlled.shutdown.enable)"),
    ("flush_ms", 0, 100, "with write caching, data acknowledged but not synced yet is synced within this "
                         "many ms (the default of a topic's flush.ms; Kafka/Redpanda flush.ms)"),
]


def parse_duration_ms(text: str) -> int:
    """``10m``, ``30s``, ``1500ms``, ``1h`` or plain seconds -> milliseconds."""
    t = str(text).strip().lower()
    for suffix, scale in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)):
        if t.endswith(suffix) and t[:-len(suffix)].replace(".", "", 1).isdigit():
            return int(float(t[:-len(suffix)]) * scale)
    if t.replace(".", "", 1).isdigit():
        return int(float(t) * 1000)
    raise click.BadParameter(f"{text!r} is not a duration (e.g. 10m, 30s, 1500ms)")


def node_bound_options(f):
    """Add the bound options to ``f``; it receives them as ``bounds=dict(...)``."""
    names = [name for name, _, _, _ in BOUND_OPTIONS]

    @functools.wraps(f)
    def wrapper(*args, reset_gossip, metrics_port, metrics_host, metrics_per_partition, replace_dead_after, balance,
                write_caching, **kwargs):
        bounds = {name: kwargs.pop(name) for name in names}
        bounds["reset_gossip"] = reset_gossip
        bounds["write_caching"] = write_caching   # issue 41
        bounds.update(replace_dead_after_ms=parse_duration_ms(replace_dead_after), balance=balance)   # issue 14
        bounds.update(metrics_port=metrics_port, metrics_host=metrics_host, metrics_per_partition=metrics_per_partition)   # issue 16
        return f(*args, bounds=bounds, **kwargs)

    wrapper = click.option("--replace-dead-after", default="10m", show_default=True,
                           help="a broker dead this long has its replicas re-created on live brokers "
                                "(e.g. 10m, 30s, 1500ms)")(wrapper)
    wrapper = click.option("--balance/--no-balance", default=True, show_default=True,
                           help="move replicas and leaderships on its own toward a balanced cluster "
                                "(new brokers, decommissions, dead brokers); off: manual reassign only")(wrapper)
    wrapper = click.option("--write-caching/--no-write-caching", default=False, show_default=True,
                           help="the default of a topic's write.caching: acks=all is answered once a majority "
                                "of replicas has written the batch, synced within --flush-ms (a majority losing "
                                "power within it can lose acknowledged writes); off: once a majority synced it "
                                "(Redpanda write_caching_default)")(wrapper)
    wrapper = click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
                           help="serve Prometheus metrics on http://HOST:PORT/metrics (HOST: --metrics-host); "
                                "off by default")(wrapper)
    wrapper = click.option("--metrics-host", default=None,
                           help="the address /metrics listens on; default: 127.0.0.1 on a secured node "
                                "(the series name every topic and group hosted here), else the --bind host")(wrapper)
    wrapper = click.option("--metrics-per-partition/--no-metrics-per-partition", default=True, show_default=True,
                           help="export per-partition series (partitions hosted here); off bounds the "
                                "series count on brokers with many partitions")(wrapper)
    wrapped = click.option(
        "--reset-gossip", is_flag=True,
        help="start without the gossip snapshot (when it cannot be loaded) and relearn the cluster from "
             "the peers given with --seed; raft state and logs are kept")(wrapper)
    for name, minimum, default, help_text in reversed(BOUND_OPTIONS):
        wrapped = click.option("--" + name.replace("_", "-"), name, type=click.IntRange(min=minimum),
                               default=default, show_default=True, help=help_text)(wrapped)
    return wrapped
