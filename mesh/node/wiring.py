"""The wiring of a broker's parts, in one place: who is given which callback of whom.

``wire_data`` builds the replication host and the data path over a store, a transport
(``send`` to a peer, ``reply`` to a client), a clock and a random source: the node and its
simulator (``tests/sim/node_sim.py``) both call it. ``wire_node`` builds the rest of a real
node around it (catalog, publisher, directory, handlers, group host, dispatcher, outbox,
elastic, security sync) over the sockets and the gossip core the node opened, and sets them
on the node (``mesh.node.loop.Node``): the callbacks the parts need of each other go
through the node's few methods (``_reply``, ``_send``, ``_send_to_node``, ...).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from mesh.cluster.catalog import Catalog
from mesh.node.limits.answer_budget import AnswerBudget
from mesh.node.data.datapath import DataLimits, DataPath
from mesh.node.lifecycle.directory import Directory
from mesh.node.requests.dispatch import Dispatcher
from mesh.node.ops.elastic import Elastic, ElasticSettings
from mesh.node.requests.elastic_handlers import ElasticHandlers
from mesh.node.groups.group_host import GroupHost, GroupHostConfig
from mesh.node.requests.handlers import ClientHandlers
from mesh.node.replication.outbox import Outbox
from mesh.node.data.producer_state import ProducerStates
from mesh.node.peers.publish import Publisher
from mesh.node.replication.raft_host import ReplicaHost
from mesh.node.limits.request_quota import RequestTimeQuota
from mesh.node.requests.security_handlers import SecuritySync
from mesh.raft import ReplicationConfig
from mesh.wire.codec import DecodeLimits


@dataclass
class DataParts:
    producers: ProducerStates
    replicas: ReplicaHost
    data: DataPath


def wire_data(node_id: str, store, catalog, rng: random.Random, *, send: Callable, publish: Callable,
              reply: Callable, leader_of: Callable, address_of: Callable, now_ms: Callable[[], int],
              store_id: str, producers: ProducerStates | None = None, wall_ms: Callable[[], int] | None = None,
              replication: ReplicationConfig | None = None, tick_ms: int = 50, confirmed: bool = True,
              limits: DataLimits | None = None, **host_options) -> DataParts:
    """The replication host and the data path on ``store``: ``send(node id, msg, payload)``
    to a peer, ``reply(ident, rid, msg, payload)`` to a client, ``publish(pid, leader,
    epoch)`` leadership changes, ``leader_of(topic, partition)`` and ``address_of(node
    id)`` for redirects; ``host_options``: ``ReplicaHost``'s (early appends, early acks)."""
    producers = producers or ProducerStates(store)
    replicas = ReplicaHost(node_id, store, producers, rng, send, publish, replication, tick_ms=tick_ms,
                           now_ms=now_ms, store_id=store_id, confirmed=confirmed, **host_options)
    replicas.reply = reply
    replicas.address_of = address_of   # leader hints for waiting clients
    extra = {"wall_ms": wall_ms} if wall_ms is not None else {}
    data = DataPath(store, catalog, replicas, producers, reply, leader_of, now_ms=now_ms,
                    address_of=address_of, limits=limits, **extra)
    return DataParts(producers, replicas, data)


def _data_limits(config) -> DataLimits:
    return DataLimits(fetch_max_bytes=config.fetch_max_bytes,
                      partition_fetch_max_bytes=config.partition_fetch_max_bytes,
                      fetch_max_wait_ms=config.fetch_max_wait_ms, max_parked_fetches=config.max_parked_fetches,
                      max_parked_per_client=config.max_parked_per_client)


def wire_node(node, config, clock, rng: Callable[[], random.Random], router, peers) -> None:
    """Every part of a real node over its ``router`` and ``peers`` sockets, its store and
    gossip core (``node.store``, ``node.gossip``), set on ``node``; ``rng()`` a fresh
    seeded random source per part."""
    gossip, store, peer_clock = node.gossip, node.store, node.peer_clock
    node.catalog = catalog = Catalog(config.node_id, gossip, store)
    catalog.cache_default = (config.write_caching, config.flush_ms)   # issue 41
    node.publish = publish = Publisher(config.node_id, gossip, catalog, store)  # lead/, stats/
    node.directory = directory = Directory(config.node_id, node.address, gossip, clock.wall_ms, node._local_leader)
    parts = wire_data(
        config.node_id, store, catalog, rng(), send=node._send_to_node, publish=publish.leadership,
        reply=node._reply, leader_of=directory.leader_address, address_of=directory.address_of,
        now_ms=clock.now_ms, store_id=node.identity.store_id, confirmed=node.identity.may_vote,
        producers=ProducerStates(store, now_ms=peer_clock.agreed_wall_ms,   # (peers' time)
                                 expiration_ms=config.producer_id_expiration_ms, max_ids=config.max_producer_ids),
        wall_ms=peer_clock.agreed_wall_ms,   # record timestamps: the peers' time
        replication=ReplicationConfig(election_ticks=config.election_ticks,
                                      learner_bytes_per_tick=config.move_rate_bytes * config.tick_ms // 1000),
        tick_ms=config.tick_ms, limits=_data_limits(config))
    node.producers, node.replicas, node.data = producers, replicas, data = parts.producers, parts.replicas, parts.data
    publish.replicas = replicas
    node.handlers = handlers = ClientHandlers(
        node_id=config.node_id, gossip=gossip, catalog=catalog, directory=directory, store=store,
        replicas=replicas, data=data, peers=peers, reply=node._reply, clock=clock,
        apply_cluster_change=node._apply_cluster_change, identity=lambda: node.identity.state,
        learning=lambda: node._relearning or node.identity.learning)
    handlers.peer_clock = peer_clock
    node.groups = groups = GroupHost(
        config.node_id, store=store, commit_turn=data.commit_turn, gossip=gossip,
        reply=node._reply, address_of=directory.address_of,
        topic_partitions=lambda: {name: t.partitions for name, t in catalog.topics.items()},
        clock=peer_clock.agreed, rng=rng(), seeded=bool(config.seeds),   # commit stamps peers take
        config=GroupHostConfig(max_session_timeout_ms=config.group_max_session_timeout_ms,
                               heartbeat_interval_ms=config.group_heartbeat_interval_ms,
                               offsets_retention_ms=config.offsets_retention_ms,
                               tombstone_ms=config.group_tombstone_ms),
        send_to_node=lambda node_id, msg: node._send_to_node(node_id, msg, None),
        doomed=lambda: data.doomed)
    groups.clock_trusted = peer_clock.trusted    # no group expiry on a wrong clock
    data.on_commit.append(groups.after_commit)   # offsets commits share the turn's sync
    _wire_dispatch(node, config, clock, router)
    node.elastic = Elastic(config.node_id, gossip, catalog, replicas, store, clock.wall_ms,
                           ElasticSettings(replace_dead_after_ms=config.replace_dead_after_ms,
                                           max_moves_per_broker=config.max_moves_per_broker,
                                           enabled=config.balance),
                           leader_of=lambda t, p: directory.leader(t, p).node_id, drop=node._drop_stray)
    handlers.extend(ElasticHandlers(gossip=gossip, catalog=catalog, elastic=node.elastic,
                                    commit_turn=data.commit_turn, reply=node._reply,
                                    apply_cluster_change=node._apply_cluster_change,
                                    wall_ms=clock.wall_ms).table())
    security = node.security
    node.security_sync = SecuritySync(gossip, security.registry, security.authorizer)
    node.security_sync.refresh()
    if security.secured:
        handlers.security.registry, handlers.security.superusers = security.registry, security.superusers


def _wire_dispatch(node, config, clock, router) -> None:
    """The dispatcher (messages in) and the outbox (answers out) on the ROUTER."""
    data, replicas = node.data, node.replicas
    node.dispatch = dispatch = Dispatcher(router, node.handlers, node.groups, node.gossip, replicas,
                                          node.directory, node._send, clock, security=node.security)
    dispatch.limits = DecodeLimits(max_body_bytes=config.max_body_bytes,
                                   max_body_containers=config.max_body_containers)
    dispatch.peer_limits = DecodeLimits(max_body_bytes=config.max_frame_bytes, max_str_len=config.max_frame_bytes,
                                        max_bin_len=config.max_frame_bytes, max_array_len=1 << 22,
                                        max_map_len=1 << 22, max_body_containers=0)
    dispatch.on_doom = data.doom
    data.writer_tag = lambda: dispatch.writer_tag   # producer ids belong to their first writer
    if config.request_percentage:
        dispatch.request_quota = RequestTimeQuota(config.request_percentage)
    dispatch.peer_clock = node.peer_clock
    node.outbox = outbox = Outbox(router, clock.now_ms, max_backlog_bytes=config.client_backlog_bytes,
                                  produce_bytes_per_s=config.produce_quota_bytes_per_s,
                                  fetch_bytes_per_s=config.fetch_quota_bytes_per_s,
                                  budget=AnswerBudget(per_client=config.fetch_max_bytes,
                                                      total=config.queued_max_answer_bytes))
    outbox.on_gone = data.drop_client
    dispatch.outbox = outbox
    outbox.principal_of = dispatch.principal_of
    data.reply = replicas.reply = dispatch.reply   # what _reply does, one call fewer
