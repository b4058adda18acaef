"""Micro-benchmark of the Kafka listener's record conversion (``python -m bench.kafka_convert``):
CPU microseconds per record of ``convert.to_mesh`` (a Produce request's Kafka v2 batch ->
a mesh batch, CRC32C checked) and ``convert.to_kafka`` (a fetched mesh batch -> a Kafka
batch), for batches of 1,000 records of 100-byte values: unkeyed (what librdkafka sends in
``bench run --scenario kafka``), keyed, keyed with headers, with 10% null values, and each
compressed (lz4, zstd). CPU time of this process (``time.process_time``), best of 7: the
machine may be shared."""
from __future__ import annotations

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
    best = min(timeit.repeat(fn, number=number, repeat=7, timer=time.process_time))
    return best / (N * number) * 1e6


def main() -> None:
    number = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"{'batch of 1,000 x 100 B':34} {'to_mesh us/rec':>15} {'to_kafka us/rec':>16}")
    for name, kw in shapes().items():
        kb = kafka_batch(**kw)
        mb, _info = to_mesh(kb)
        fetched = patch_batch(mb, 1000, 1)
        produce = us_per_record(lambda: to_mesh(kb), number)
        fetch = us_per_record(lambda: to_kafka(fetched, 0), number)
        print(f"{name:34} {produce:15.3f} {fetch:16.3f}")


if __name__ == "__main__":
    main()
