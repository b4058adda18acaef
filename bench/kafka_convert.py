"""Micro-benchmark of the Kafka listener's record conversion (``python -m bench.kafka_convert``):
CPU microseconds per record of ``convert.to_mesh`` (a Produce request's Kafka v2 batch ->
a mesh batch, CRC32C checked) and ``convert.to_kafka`` (a fetched mesh batch -> a Kafka
batch), for batches of 1,000 records of 100-byte values: unkeyed (what librdkafka sends in
``bench run --scenario kafka``), keyed, keyed with headers, with 10% null values, and each
compressed (lz4, zstd). CPU time of this process (``time.process_time``), best of 9 (3 x 3, interleaved): the
machine may be shared. With the collector on (``timeit`` turns it off) and the listener's
modules loaded (its heap), first at CPython's default thresholds, then as the listener runs
it (``mesh.kafka.process.tune_gc``)."""
from __future__ import annotations

import gc
import sys
import time
import timeit

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mesh.kafka.convert import to_kafka, to_mesh
from mesh.wire.records import patch_batch

N = 1000
_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def kafka_batch(n: int = N, keyed: bool = False, headers: bool = False, nulls: bool = False,
                codec: str = "none", value_bytes: int = 100) -> bytes:
    """A Kafka v2 batch as an idempotent producer sends it (producer id, epoch, sequence)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=_CODECS[codec], is_transactional=0,
                                  producer_id=4242, producer_epoch=0, base_sequence=0, batch_size=1 << 30)
    ts = 1_700_000_000_000
    for i in range(n):
        b.append(i, ts + i // 100, b"key-%d" % i if keyed else None,
                 None if nulls and i % 10 == 0 else b"m" * value_bytes,
                 [("h", b"v")] if headers else [])
    return bytes(b.build())


def shapes() -> dict:
    out = {}
    for codec in ("none", "lz4", "zstd"):
        out[f"unkeyed, {codec}"] = dict(codec=codec)
    out["keyed, none"] = dict(keyed=True)
    out["keyed, headers, none"] = dict(keyed=True, headers=True)
    out["keyed, 10% null values, none"] = dict(keyed=True, nulls=True)
    return out


def us_per_record(fn, number: int) -> float:
    best = min(timeit.repeat(fn, setup="gc.enable()", number=number, repeat=3, timer=time.process_time,
                             globals={"gc": gc}))
    return best / (N * number) * 1e6


def main() -> None:
    import mesh.kafka.handlers  # noqa: F401 (the listener's heap: kio schemas, the APIs)
    from mesh.kafka.process import tune_gc
    number = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    defaults = gc.get_threshold()

    def collector(tuned: bool) -> None:
        if tuned:
            tune_gc()
        else:
            gc.unfreeze()
            gc.set_threshold(*defaults)

    print(f"{'us/record, batches of 1,000 x 100 B':36} {'to_mesh':>8} {'(tuned)':>8} {'to_kafka':>9} {'(tuned)':>8}")
    for name, kw in shapes().items():
        kb = kafka_batch(**kw)
        fetched = patch_batch(to_mesh(kb)[0], 1000, 1)
        got: dict = {}
        for _ in range(3):   # interleaved: the machine's load changes under a run
            for tuned in (False, True):
                collector(tuned)
                got.setdefault(("mesh", tuned), []).append(us_per_record(lambda: to_mesh(kb), number))
                got.setdefault(("kafka", tuned), []).append(us_per_record(lambda: to_kafka(fetched, 0), number))
        pd, pt, fd, ft = (min(got[k]) for k in (("mesh", False), ("mesh", True), ("kafka", False), ("kafka", True)))
        print(f"{name:36} {pd:8.3f} {pt:8.3f} {fd:9.3f} {ft:8.3f}")
    collector(False)


if __name__ == "__main__":
    main()
