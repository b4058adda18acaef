"""aiokafka (non-flexible versions, its own C record code) and kafkajs (pure JavaScript)
against the Kafka listeners: produce, read back (groups come with their own change)."""
from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from tests.integration.kafka_support import kcluster, new_topic  # noqa: F401 (fixture)
from tests.tooling import kafkajs_modules

pytestmark = pytest.mark.integration


def test_aiokafka_produce_and_consume(kcluster):
    aiokafka = pytest.importorskip("aiokafka")
    topic = new_topic(kcluster, "aio")

    async def run():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, enable_idempotence=True,
                                      compression_type="snappy")
        await p.start()
        try:
            for i in range(200):
                await p.send(topic, b"v%d" % i, key=b"k%d" % i, partition=0, headers=[("i", b"%d" % i)])
            last = await p.send_and_wait(topic, None, key=b"tomb", partition=0)
        finally:
            await p.stop()
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap, enable_auto_commit=False)
        await c.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            got = []
            for _ in range(60):
                for recs in (await c.getmany(timeout_ms=500)).values():
                    got += recs
                if len(got) >= 201:
                    break
            return last, got
        finally:
            await c.stop()

    last, got = asyncio.run(run())
    assert last.offset == 200
    assert [(r.offset, r.key, r.value, tuple(r.headers)) for r in got[:200]] == [
        (i, b"k%d" % i, b"v%d" % i, (("i", b"%d" % i),)) for i in range(200)]
    assert (got[200].key, got[200].value) == (b"tomb", None)


def test_kafkajs_produce_and_list_offsets(kcluster, tmp_path):
    kafkajs = os.path.join(kafkajs_modules(), "kafkajs")   # (a missing kafkajs skips, and fails under CI)
    topic = new_topic(kcluster, "kjs")
    script = tmp_path / "kjs.js"
    script.write_text(f"""
const {{ Kafka, logLevel }} = require({kafkajs!r});
(async () => {{
  const k = new Kafka({{ brokers: {kcluster.kafka_bootstrap!r}.split(','), logLevel: logLevel.ERROR }});
  const p = k.producer({{ idempotent: true, maxInFlightRequests: 1 }}); await p.connect();
  const r = await p.send({{ topic: {topic!r}, acks: -1,
                           messages: [{{ key: 'a', value: 'x', headers: {{ h: 'v' }} }}, {{ value: 'y' }}] }});
  await p.disconnect();
  const a = k.admin(); await a.connect();
  const o = await a.fetchTopicOffsets({topic!r});
  await a.disconnect();
  console.log(JSON.stringify({{ sent: r, offsets: o }}));
}})().catch(e => {{ console.error(e); process.exit(1); }});
""")
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    import json
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["sent"][0]["errorCode"] == 0 and res["sent"][0]["baseOffset"] == "0"
    assert res["offsets"] == [{"partition": 0, "offset": "2", "high": "2", "low": "0"}]
