"""The listener's API table: which handler serves which API key and versions.

``core_registry`` registers what this package implements; the lead registers the group
APIs (``mesh.kafka.groups``) and SASL (``mesh.kafka.sasl``) into the same ``Registry``.
ApiVersions answers exactly the table, so an API is advertised once it is registered and
never before. Produce is advertised from version 0 as Kafka 4 does (librdkafka before
2.11.1 turns compression off otherwise), and versions 0-2 are refused when used (the
connection is closed: there is no v0-2 schema to decode them).
"""
from __future__ import annotations

from mesh.kafka.build import make
from mesh.kafka.codec import response_class
from mesh.kafka.configs import ConfigsApi
from mesh.kafka.fetch import FetchApi
from mesh.kafka.meta import MetadataApi, TopicDefaults
from mesh.kafka.produce import ProduceApi
from mesh.kafka.server import Registry
from mesh.kafka.topics import TopicsApi

__all__ = ["core_registry", "register_all", "API_VERSIONS", "CORE_VERSIONS"]

API_VERSIONS = 18
CORE_VERSIONS = {   # api key: (min, max) served by this package
    0: (0, 9),      # Produce (0-2 refused when used)
    1: (4, 12),     # Fetch
    2: (1, 7),      # ListOffsets
    3: (1, 12),     # Metadata
    18: (0, 3),     # ApiVersions
    19: (2, 5),     # CreateTopics
    20: (1, 4),     # DeleteTopics
    22: (0, 4),     # InitProducerId
    32: (1, 4),     # DescribeConfigs (topics; brokers with no configs)
    37: (0, 3),     # CreatePartitions
}


def core_registry(defaults: TopicDefaults = TopicDefaults(), max_message_bytes: int = 1 << 20) -> Registry:
    reg = Registry()
    meta, topics = MetadataApi(defaults), TopicsApi(defaults)
    produce, fetch = ProduceApi(max_message_bytes=max_message_bytes), FetchApi()
    configs = ConfigsApi()

    def on_api_versions(ctx, req):
        keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in reg.versions()]
        return make(response_class(API_VERSIONS, ctx.api_version),
                    {"error_code": 0, "api_keys": keys, "throttle_time": 0})

    handlers = {0: produce.on_produce, 1: fetch.on_fetch, 2: fetch.on_list_offsets, 3: meta.on_metadata,
                18: on_api_versions, 19: topics.on_create_topics, 20: topics.on_delete_topics,
                22: produce.on_init_producer_id, 32: configs.on_describe_configs,
                37: topics.on_create_partitions}
    for key, (lo, hi) in CORE_VERSIONS.items():
        reg.register(key, lo, hi, handlers[key])
    return reg


def register_all(reg: Registry, handlers: dict, versions: dict) -> None:
    """Register another module's APIs (``{api key: handler}``, ``{api key: (min, max)}``),
    e.g. ``mesh.kafka.groups.ClassicGroups``' or the SASL session's: they are advertised
    from then on."""
    for key, handler in handlers.items():
        lo, hi = versions[key]
        reg.register(key, lo, hi, handler)
