"""``python -m bench.request_cpu``: CPU per small produce request, client and each broker,
measured on a real RF-3 cluster (issue 41)."""
from __future__ import annotations

import pytest

from bench.cluster import create_topic
from bench.produce_cpu import cpu_s
from bench.request_cpu import measure
from mesh.testing.launcher import Cluster


def test_cpu_of_this_process_is_read_from_proc():
    import os
    import time
    t0, c0 = time.monotonic(), cpu_s(os.getpid())
    while cpu_s(os.getpid()) - c0 < 0.05 and time.monotonic() - t0 < 10:
        sum(range(10_000))   # burn CPU until /proc's clock ticks move
    assert cpu_s(os.getpid()) - c0 >= 0.05


@pytest.mark.integration
def test_measure_splits_cpu_between_client_leader_and_followers(tmp_path):
    with Cluster(tmp_path, 3, new_session=True) as c:
        create_topic(c.bootstrap, "cpu", 1, 3)
        r = measure(c, "cpu", 32, 1, 2_000, 15)   # (CPU clocks tick every 10 ms: enough to count)
    # every request cost the client and the leader CPU, and each follower some (it applied
    # the appends); the leader, which also answers the client, more than a follower
    assert r["client_us"] > 0 and r["leader_us"] > 0 and r["follower_us"] > 0
    assert r["leader_us"] > r["follower_us"]
    assert r["requests_per_s"] > 0
