"""DescribeConfigs (mesh.kafka.configs) and CreatePartitions (mesh.kafka.topics): keys asked for, refusals, every version encodes."""
from __future__ import annotations

import importlib

import pytest

from mesh.kafka.codec import encode_response
from mesh.kafka.configs import ConfigsApi
from mesh.kafka.context import RequestContext
from mesh.wire.topic_config import TOPIC_DEFAULTS


class _Cache:
    def __init__(self, topics):
        self.topics, self.refreshed = topics, 0

    def fresh(self):
        return self

    def refresh(self):
        self.refreshed += 1

    def topic(self, name):
        return self.topics.get(name)


class _Deny:
    def __init__(self, *denied):
        self.denied = set(denied)

    def allowed(self, principal, op, rtype, name):
        return (op, rtype, name) not in self.denied


def _ctx(version, cache, authorizer=None):
    from mesh.kafka.server import OpenAuthorizer
    return RequestContext(api_key=32, api_version=version, correlation_id=1, client_id="t", principal="u",
                          peer_host="127.0.0.1", cluster=cache, authorizer=authorizer or OpenAuthorizer())


def _request(version, resources, synonyms=False):
    mod = importlib.import_module(f"kio.schema.describe_configs.v{version}.request")
    res = tuple(mod.DescribeConfigsResource(resource_type=t, resource_name=n, configuration_keys=k)
                for t, n, k in resources)
    kw = {"include_synonyms": synonyms} if version >= 1 else {}
    return mod.DescribeConfigsRequest(resources=res, **kw)


TOPICS = {"t": {"config": dict(TOPIC_DEFAULTS, **{"retention.ms": 60_000})}}


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_topic_configs_every_version_encodes(version):
    cache = _Cache(TOPICS)
    resp = ConfigsApi().on_describe_configs(_ctx(version, cache), _request(version, [(2, "t", None)], True))
    (r,) = resp.results
    assert int(r.error_code) == 0
    got = {c.name: c for c in r.configs}
    assert set(got) == set(TOPIC_DEFAULTS)
    assert got["retention.ms"].value == "60000" and got["retention.ms"].config_source == 1
    assert got["retention.bytes"].config_source == 5 and got["retention.bytes"].value == "-1"
    assert [s.name for s in got["retention.ms"].synonyms] == ["retention.ms"]
    assert encode_response(32, version, 1, resp)


def test_only_the_keys_asked_for_and_unknown_keys_left_out():
    cache = _Cache(TOPICS)
    resp = ConfigsApi().on_describe_configs(_ctx(1, cache),
                                            _request(1, [(2, "t", ("max.message.bytes", "no.such.key"))]))
    assert [c.name for c in resp.results[0].configs] == ["max.message.bytes"]


def test_refusals_unknown_topics_brokers_and_other_types():
    cache = _Cache(TOPICS)
    deny = _Deny(("DESCRIBE_CONFIGS", "TOPIC", "t"))
    resp = ConfigsApi().on_describe_configs(
        _ctx(2, cache, deny), _request(2, [(2, "t", None), (2, "nope", None), (4, "1", None), (8, "1", None)]))
    codes = [int(r.error_code) for r in resp.results]
    assert codes == [29, 3, 0, 42]   # TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, -, INVALID_REQUEST
    assert all(not r.configs for r in resp.results)
    assert cache.refreshed == 1   # an unknown topic: one refresh per request, not per resource
    deny = _Deny(("DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster"))
    resp = ConfigsApi().on_describe_configs(_ctx(2, cache, deny), _request(2, [(4, "1", None)]))
    assert int(resp.results[0].error_code) == 31   # CLUSTER_AUTHORIZATION_FAILED


def test_create_partitions_refusals_without_touching_the_mesh():
    """CreatePartitions (mesh.kafka.topics): checks before any native call."""
    from mesh.kafka.topics import TopicsApi
    req_mod = importlib.import_module("kio.schema.create_partitions.v1.request")

    def ask(*topics, validate_only=False, authorizer=None):
        import datetime
        req = req_mod.CreatePartitionsRequest(
            topics=tuple(req_mod.CreatePartitionsTopic(name=n, count=c, assignments=a) for n, c, a in topics),
            timeout=datetime.timedelta(seconds=5), validate_only=validate_only)
        cache = _Cache({"t": {"partitions": [{}, {}]}, "u": {"partitions": [{}]}})
        ctx = RequestContext(api_key=37, api_version=1, correlation_id=1, client_id="t", principal="u",
                             peer_host="127.0.0.1", cluster=cache, authorizer=authorizer or _Deny(),
                             mesh=None)   # no native link: any call into the mesh would fail the test
        resp = TopicsApi().on_create_partitions(ctx, req)
        assert encode_response(37, 1, 1, resp)
        return [int(r.error_code) for r in resp.results]

    assign = (req_mod.CreatePartitionsAssignment(broker_ids=(1,)),)
    # INVALID_PARTITIONS (not more), UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST (assignments, named twice)
    assert ask(("t", 2, None), ("nope", 3, None), ("u", 2, assign), ("t", 3, None), validate_only=True) \
        == [37, 3, 42, 42]
    assert ask(("u", 4, None), validate_only=True) == [0]
    assert ask(("t", 3, None), authorizer=_Deny(("ALTER", "TOPIC", "t"))) == [29]
