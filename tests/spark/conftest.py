"""Fixtures for the Spark source/sink tests: one real broker and one SparkSession for the
whole session (Spark takes seconds to start; a broker takes a fraction of one)."""
from __future__ import annotations

import itertools
import os
import shutil
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must see this venv's packages

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'broker-mesh[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'broker-mesh[spark]')")

from mesh.client import Admin, Consumer, Producer  # noqa: E402
from mesh.testing.launcher import BrokerProcess  # noqa: E402

_names = itertools.count()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    b = BrokerProcess("s1", str(tmp_path_factory.mktemp("spark-broker") / "s1")).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed (Spark needs Java 17+)")
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName("mesh-spark-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    from mesh.spark import register
    register(s)
    yield s
    s.stop()


@pytest.fixture
def admin(broker):
    with Admin(broker.address) as a:
        yield a


@pytest.fixture
def new_topic(admin):
    """new_topic(partitions) -> a fresh topic name."""
    def make(partitions: int = 1, prefix: str = "t", config: dict | None = None) -> str:
        name = f"{prefix}-{os.getpid()}-{next(_names)}"
        admin.create_topic(name, partitions=partitions, config=config)
        return name
    return make


def produce(bootstrap: str, topic: str, records) -> None:
    """records: iterable of dicts with value and optional key / partition / headers /
    timestamp_ms, written with acks=all."""
    with Producer(bootstrap, acks="all", linger_ms=1) as p:
        futs = [p.send(topic, **r) for r in records]
        p.flush()
        for f in futs:
            f.get(10)


def consume_all(bootstrap: str, topic: str) -> list:
    """Every record of ``topic`` up to the current end, as Records."""
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50) as c:
        n = c.cluster.partitions(topic)
        tps = [(topic, p) for p in range(n)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        want = sum(ends.values()) - sum(c.beginning_offsets(tps).values())
        out: list = []
        for _ in range(1000):
            if len(out) >= want:
                break
            for recs in c.poll_batches(200):
                out.extend(r for r in recs if r.offset < ends[(r.topic, r.partition)])
        return out
