"""``NodeConfig``: everything a node is started with (``mesh node`` options map onto it
one to one; ``tools/node_options.py`` keeps the bound options' defaults equal to these)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NodeConfig"]


@dataclass
class NodeConfig:
    node_id: str
    bind: str = "127.0.0.1:7101"
    data_dir: str = "data"
    seeds: list[str] = field(default_factory=list)
    max_requests_per_turn: int = 512
    max_drain_ms: int = 100          # and no longer than this (plus one message), so a busy turn
                                     # still ticks and pings its peers: a peer silent for an
                                     # election timeout wakes the quiet partitions it leads
    tick_ms: int = 50
    # election timeouts are drawn from [election_ticks, 2 * election_ticks) ticks: 0.7-1.4 s,
    # at least 7 heartbeats (every 2 ticks) without a word from the leader
    election_ticks: int = 14
    retention_check_ms: int = 5_000
    gossip_interval_ms: int = 200
    stats_every_ms: int = 1_000
    map_size_bytes: int = 64 << 30
    sync: bool = True
    hwm_messages: int = 10_000
    text_port: int | None = None
    text_max_connections: int = 64         # text gateway limits: see mesh.gateway.text
    text_idle_timeout_ms: int = 300_000
    text_evict_idle_ms: int = 10_000
    text_max_subscriptions: int = 256
    kafka_port: int | None = None          # the Kafka wire-protocol listener (mesh.kafka), off by default
    kafka_host: str | None = None          # its host (default: the --bind host)
    kafka_node_id: int | None = None       # its Kafka node id (default: mesh.kafka.ids.derive_node_id)
    group_max_session_timeout_ms: int = 10_000   # also the takeover grace of a new coordinator
    group_heartbeat_interval_ms: int = 500
    offsets_retention_ms: int = 7 * 86_400_000   # empty groups deleted after this (offsets.retention.minutes); 0: never
    group_tombstone_ms: int = 86_400_000         # deleted groups' tombstones kept this long (mesh.groups.offsets)
    # bounds (issue 13; each has a `mesh node` option; Kafka's names in the comments)
    max_frame_bytes: int = 16 << 20          # ZMQ_MAXMSGSIZE on the ROUTER (socket.request.max.bytes)
    max_body_bytes: int = 1 << 20            # msgpack body of a client request (records travel apart)
    max_body_containers: int = 50_000        # arrays and maps in one client body (a dense body: issue 39)
    request_percentage: int = 0              # per principal, % of the loop's time its requests may take; 0 = off
    fetch_max_bytes: int = 8 << 20           # per fetch answer, plus one batch (fetch.max.bytes)
    partition_fetch_max_bytes: int = 4 << 20  # per partition of a fetch (max.partition.fetch.bytes)
    fetch_max_wait_ms: int = 30_000          # long-poll cap (fetch.max.wait.ms)
    max_parked_fetches: int = 5_000          # long-poll fetches waiting at once
    max_parked_per_client: int = 16
    client_sndhwm: int = 16                  # answers queued in ZeroMQ per client pipe
    client_backlog_bytes: int = 4 << 20      # then in the node per client; beyond, answers dropped
    queued_max_answer_bytes: int = 256 << 20  # unread answers the node holds in all (mesh.node.limits.answer_budget)
    compaction_bytes_per_s: int = 8 << 20    # the compactor's read/rewrite budget (mesh.node.data.compactor)
    compaction_check_ms: int = 1_000         # how often a leader looks for a compaction cut
    heartbeat_ivl_ms: int = 1_000            # ZMTP PING on every link to a peer
    heartbeat_timeout_ms: int = 3_000        # a peer link silent this long after a PING: dropped (both ends)
    produce_quota_bytes_per_s: int = 0       # per client, 0 = off (quota producer_byte_rate)
    fetch_quota_bytes_per_s: int = 0         # per client, 0 = off (quota consumer_byte_rate)
    producer_id_expiration_ms: int = 86_400_000  # producer.id.expiration.ms
    max_producer_ids: int = 1_000_000        # idempotent-producer states kept (longest idle go first)
    clock_offset_bound_ms: int = 30_000      # beyond: the clock is off (mesh.node.peers.peer_clock)
    reset_gossip: bool = False               # start without the gossip snapshot, relearn from peers
    rejoin_empty: bool = False   # a refused data directory is moved aside; start empty (lost state)
    # security (mesh.security): CURVE + ZAP with the secrets directory; open only on loopback
    secrets_dir: str | None = None
    superusers: list[str] = field(default_factory=list)   # more superusers, by user name
    insecure: bool = False       # allow running open on a non-loopback address (a warning)
    max_connections: int = 4096  # open connections to the ROUTER; beyond: handshakes refused
    max_connections_per_ip: int = 0   # open connections to the ROUTER per source IP (max.connections.per.ip); 0 = off
    text_creds: str | None = None   # secured: the creds file the text gateway's clients use
    kafka_tls_cert: str | None = None   # the Kafka listener speaks TLS (mesh.kafka.tls) with this PEM chain
    kafka_tls_key: str | None = None    # ... and this PEM private key
    metrics_port: int | None = None   # /metrics (Prometheus): mesh.node.ops.metrics
    metrics_host: str | None = None   # where /metrics listens; None: 127.0.0.1 when secured, else the bind host
    metrics_per_partition: bool = True
    # an elastic cluster (issue 14: mesh.node.ops.elastic)
    replace_dead_after_ms: int = 600_000     # a broker dead this long has its replicas re-created elsewhere
    move_rate_bytes: int = 32 << 20          # catch-up bytes/s this broker sends to new replicas (0 = no cap)
    max_moves_per_broker: int = 4            # moves in progress per source and per target broker
    balance: bool = True                     # False: never move replicas on its own (manual reassign only)
    write_caching: bool = False   # a topic's write.caching default (issue 41: docs/decisions/41-durability.md)
    flush_ms: int = 100           # a topic's flush.ms default: unsynced writes synced within it
    shutdown_handover_ms: int = 5_000        # SIGTERM: hand led partitions over for at most this long, then stop
