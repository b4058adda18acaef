"""DescribeConfigs (API 32, v1-4): a topic's configs as the mesh keeps them.

A TOPIC resource lists every topic config the mesh knows (``mesh.wire.topic_config``:
``TOPIC_DEFAULTS``' keys, plus any other key the topic's metadata carries), or only the
``configuration_keys`` asked for (a key the mesh does not know is left out, as Kafka
does). Values are strings, as Kafka sends them; a value other than the default is
DYNAMIC_TOPIC_CONFIG, the default DEFAULT_CONFIG (the mesh stores a topic's configs with
the defaults filled in, so an explicit default cannot be told apart); none is read-only
or sensitive; no synonyms. A topic no broker knows (after one refresh) is
UNKNOWN_TOPIC_OR_PARTITION; without DESCRIBE_CONFIGS on the topic,
TOPIC_AUTHORIZATION_FAILED. A BROKER resource (a Kafka node id) is answered with no
configs (the mesh has no per-broker config a Kafka client could use); it needs
DESCRIBE_CONFIGS on the cluster. Other resource types: INVALID_REQUEST.
"""
from __future__ import annotations

from kio.schema.errors import ErrorCode as K

from mesh.kafka.build import make
from mesh.kafka.codec import response_class
from mesh.wire.topic_config import TOPIC_DEFAULTS

__all__ = ["ConfigsApi"]

TOPIC, BROKER = 2, 4                       # Kafka's ConfigResource types
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5   # Kafka's ConfigSource
_TYPE_STRING, _TYPE_INT, _TYPE_LONG = 2, 3, 5   # Kafka's ConfigType (DescribeConfigs v3+)
_CONFIG_TYPES = {"max.message.bytes": _TYPE_INT}


class ConfigsApi:
    def on_describe_configs(self, ctx, req):
        cache = ctx.cluster.fresh()
        refreshed = False
        results = []
        for r in req.resources:
            res = {"error_code": K.none, "error_message": None, "resource_type": r.resource_type,
                   "resource_name": r.resource_name, "configs": []}
            if r.resource_type == TOPIC:
                if not ctx.authorizer.allowed(ctx.principal, "DESCRIBE_CONFIGS", "TOPIC", r.resource_name):
                    res["error_code"] = K.topic_authorization_failed
                else:
                    topic = cache.topic(r.resource_name)
                    if topic is None and not refreshed:
                        cache.refresh()
                        refreshed = True
                        topic = cache.topic(r.resource_name)
                    if topic is None:
                        res.update(error_code=K.unknown_topic_or_partition,
                                   error_message=f"no topic {r.resource_name!r}")
                    else:
                        res["configs"] = _topic_configs(topic.get("config") or {}, r.configuration_keys,
                                                        bool(getattr(req, "include_synonyms", False)))
            elif r.resource_type == BROKER:
                if not ctx.authorizer.allowed(ctx.principal, "DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster"):
                    res["error_code"] = K.cluster_authorization_failed
            else:
                res.update(error_code=K.invalid_request,
                           error_message=f"resource type {r.resource_type}: only topics (2) and brokers (4)")
            results.append(res)
        return make(response_class(32, ctx.api_version), {"throttle_time": 0, "results": results})


def _topic_configs(config: dict, keys, synonyms: bool) -> list[dict]:
    values = dict(TOPIC_DEFAULTS)
    values.update({k: v for k, v in config.items() if isinstance(k, str)})
    names = sorted(values) if not keys else [k for k in keys if k in values]
    out = []
    for name in names:
        v = values[name]
        source = DEFAULT_CONFIG if name in TOPIC_DEFAULTS and v == TOPIC_DEFAULTS[name] else DYNAMIC_TOPIC_CONFIG
        value = None if v is None else str(v)
        out.append({"name": name, "value": value, "read_only": False, "config_source": source,
                    "is_default": source == DEFAULT_CONFIG, "is_sensitive": False,
                    "synonyms": [{"name": name, "value": value, "source": source}] if synonyms else [],
                    "config_type": _CONFIG_TYPES.get(name, _TYPE_LONG if isinstance(v, int) else _TYPE_STRING),
                    "documentation": None})
    return out
