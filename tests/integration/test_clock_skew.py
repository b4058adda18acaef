"""One broker restarted with a wrong clock (libfaketime) deletes nothing and says its clock
is off (issue 38, DESIGN.md section 11).

Three brokers, a topic with ``retention.ms`` of one hour at RF 3; records produced (stamped
now); the broker that is the preferred leader of most partitions restarted under
libfaketime's ``FAKETIME=+2h`` (or ``-1d``), so it takes its leaderships back; then, for a while, time
retention runs every 200 ms. Nothing acknowledged may become unreadable, every replica's
log must still start at 0 (read from the stores once the brokers stopped), the skewed broker
reports its offset (``mesh_clock_offset_seconds``, ``mesh cluster status``, an error line)
and, a day behind, it drops no local partition and takes new writes stamped with the
peers' time. ``FAKETIME_DONT_FAKE_MONOTONIC=1``: only the wall clock is wrong.
"""
from __future__ import annotations

import glob
import os
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.client import Admin, Producer
from tests.tooling import need
from mesh.testing.diskfaults import partition_state, read_back
from mesh.testing.launcher import Cluster, wait_until
from storage.log import Store

pytestmark = pytest.mark.integration

PARTS = 4
HOUR_MS = 3_600_000


def _metric(b, name: str) -> float | None:
    with urllib.request.urlopen(b.metrics_url, timeout=5) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == name and fam.samples:
            return fam.samples[0].value
    return None


def _produce(bootstrap: str, per_partition: int, tag: bytes) -> dict:
    acked = {}
    with Producer(bootstrap, acks="all", delivery_timeout_ms=30_000) as p:
        futs = [(b"%s-%d-%d" % (tag, part, i), p.send("t", b"%s-%d-%d" % (tag, part, i), partition=part))
                for part in range(PARTS) for i in range(per_partition)]
        p.flush(60)
        for v, f in futs:
            acked[v] = f.get(60).offset
    return acked


def _log_starts(c: Cluster) -> dict[str, list[int]]:
    out = {}
    for b in c.brokers:
        assert not b.alive()
        s = Store(b.data_dir)
        try:
            out[b.node_id] = sorted(s.log_start(pid) for _, _, pid in s.partitions())
        finally:
            s.close()
    return out


def _faketime_prefix(skew: str) -> list[str]:
    """libfaketime preloaded into the broker itself (``env`` execs it): the ``faketime``
    program forks and waits, so stopping it would leave the broker running."""
    need("faketime", "apt-get install faketime")
    lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
    if not os.path.exists(lib):
        lib = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), lib)
    return ["env", f"LD_PRELOAD={lib}", f"FAKETIME={skew}", "FAKETIME_DONT_FAKE_MONOTONIC=1"]


@pytest.mark.parametrize("skew, offset_s", [("+2h", -7200), ("-1d", 86400)])
def test_a_broker_restarted_with_a_wrong_clock_deletes_nothing_and_says_so(tmp_path, skew, offset_s):
    c = Cluster(tmp_path, 3, extra=["--retention-check-ms", "200"], metrics=True).start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("t", PARTS, 3, config={"retention.ms": HOUR_MS})
        acked = _produce(c.bootstrap, 300, b"before")
        st = partition_state(c.brokers, "t")
        preferred = {p["partition"]: p["replicas"][0] for p in st}
        victim = max(c.brokers, key=lambda b: sum(1 for n in preferred.values() if n == b.node_id))
        mine = [p for p, n in preferred.items() if n == victim.node_id]
        assert mine
        victim.stop()
        victim.prefix = _faketime_prefix(skew)
        victim.start(timeout_s=60)

        def leads_its_own():
            s = partition_state(c.brokers, "t")
            return s is not None and all(s[p]["leader"] == victim.node_id for p in mine)
        wait_until(leads_its_own, 90, f"{victim.node_id} leading its preferred partitions again")
        # time retention has had its chances (every 200 ms, for a few seconds, as the leader)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            s = partition_state(c.brokers, "t")
            assert s is None or all(p.get("log_start", 0) == 0 for p in s), s
            time.sleep(0.5)   # polling a condition that must hold throughout, not waiting for one
        # writes stamped with the peers' time go through the skewed leader too
        acked.update(_produce(c.bootstrap, 20, b"after"))
        got = read_back(c.bootstrap, "t", PARTS, len(acked), timeout_s=60)
        lost = [v for v in acked if v not in got]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records unreadable (e.g. {lost[:3]})"
        wait_until(lambda: _metric(victim, "mesh_clock_offset_seconds") is not None, 30, "a clock offset estimate")
        offset = _metric(victim, "mesh_clock_offset_seconds")
        print(f"{victim.node_id} under faketime {skew}: mesh_clock_offset_seconds {offset:+.3f}")
        assert abs(offset - offset_s) < 5, offset
        assert _metric(victim, "mesh_clock_trusted") == 0
        with Admin(c.bootstrap) as a:
            rows = {b["id"]: b for b in a.metadata().brokers}
        assert abs(rows[victim.node_id]["clock_offset_ms"] / 1000 - offset_s) < 5, rows[victim.node_id]
        for b in c.brokers:
            if b is not victim:
                assert abs(_metric(b, "mesh_clock_offset_seconds")) < 5
        log = victim.log(1 << 22)
        assert "clock offset" in log and "beyond the 30 s bound" in log, log[-3000:]
        assert "dropping local partition" not in log, log[-3000:]
    finally:
        c.stop()
    starts = _log_starts(c)
    assert all(s == [0] * PARTS for s in starts.values()), starts   # every replica starts at 0
