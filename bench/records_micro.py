"""Micro-benchmark of the record codec and the broker's batch check (``python -m
bench.records_micro``): records/s of encode_batch, records_from (decode into Records) and
validate_batch (the broker's per-produce-request check), for batches of 1,000 records of
100-byte values, keyed and unkeyed, with headers, and with some null values."""
from __future__ import annotations

import sys
import time
import timeit

from mesh.wire.records import encode_batch, patch_batch, records_from, validate_batch

N = 1000


def shapes() -> dict:
    vals = [b"x" * 100] * N
    keys = [b"key-%d" % i for i in range(N)]
    hdrs = [[["h", b"v"]] for _ in range(N)]
    out = {"unkeyed": (vals, None, 1_700_000_000_000, None),
           "keyed, per-record ts": (vals, keys, list(range(1_700_000_000_000, 1_700_000_000_000 + N)), None),
           "keyed, headers": (vals, keys, 1_700_000_000_000, hdrs)}
    if "--nulls" in sys.argv:
        out["10% null values"] = ([None if i % 10 == 0 else v for i, v in enumerate(vals)], keys,
                                  1_700_000_000_000, None)
    return out


def rate(fn, number: int) -> float:
    # CPU time of this process (not wall time): the machine may be shared with other work
    best = min(timeit.repeat(fn, number=number, repeat=7, timer=time.process_time))
    return N * number / best


def main() -> None:
    for name, (v, k, ts, h) in shapes().items():
        b = patch_batch(encode_batch(v, k, ts, h), 0, 1)
        enc = rate(lambda: encode_batch(v, k, ts, h), 200)
        dec = rate(lambda: records_from("t", 0, b), 100)
        val = rate(lambda: validate_batch(b, 1 << 24), 200)
        print(f"{name:22s} encode {enc / 1e6:6.2f} M rec/s   decode {dec / 1e6:5.2f} M rec/s   "
              f"validate {val / 1e6:7.2f} M rec/s ({1e6 * N / val:6.1f} us per batch)")


if __name__ == "__main__":
    main()
