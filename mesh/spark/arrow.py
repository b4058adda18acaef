"""Arrow conversion for the mesh Spark source: record batches -> one ``pyarrow.RecordBatch``.

The record batches' columns (values, keys, timestamp deltas, headers) become Arrow arrays
in bulk, with no Python object per row beyond the bytes msgpack makes. The schema is
fixed (``SCHEMA_DDL``).
"""
from __future__ import annotations

import bisect
import itertools

from mesh.wire.errors import MeshError
from mesh.wire.compacted import ATTR_COMPACTED, compacted_columns
from mesh.wire.records import ATTR_CONTROL, decode_batch

__all__ = ["SCHEMA_DDL", "spark_schema", "arrow_schema", "to_arrow"]

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, headers array<struct<key:string,value:binary>>")


def spark_schema():
    """SCHEMA_DDL as a StructType, built without a JVM (planner workers have none)."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
    )
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(header)),
    ])


_arrow_schema_cache = None


def arrow_schema():
    """The Arrow schema Spark checks batches against (the same function Spark uses)."""
    global _arrow_schema_cache
    if _arrow_schema_cache is None:
        from pyspark.sql.pandas.types import to_arrow_schema
        _arrow_schema_cache = to_arrow_schema(spark_schema(), timezone="UTC")
    return _arrow_schema_cache


def to_arrow(pa, schema, topic: str, partition: int, batches, lo: int, hi: int, on_bad=None):
    """Columns of the records with offsets in [lo, hi) of ``batches``: one RecordBatch.
    A batch whose columns are not records (stored by an older broker, which did not check
    them) is passed to ``on_bad(header, MeshError)``, which raises or returns (the batch
    is then skipped, as a control batch is); without ``on_bad`` the MeshError is raised."""
    import pyarrow.compute as pc
    values: list = []
    keys: list | None = None
    headers: list | None = None
    ts: list = []                      # int64 microsecond arrays, one per record batch
    runs: list[tuple[int, int]] = []  # (first offset, count) per record batch
    for h, b in batches:
        if h.attributes & ATTR_CONTROL:
            continue
        try:
            if h.attributes & ATTR_COMPACTED:   # offsets with gaps: the kept records in [lo, hi)
                vs, ks, deltas, hs, offs = compacted_columns(b, h)
            else:
                _, vs, ks, deltas, hs = decode_batch(b)
                offs = None
        except MeshError as exc:   # INVALID_RECORD
            if on_bad is None:
                raise
            on_bad(h, exc)
            continue
        if offs is None:
            n = h.record_count
            a, z = max(0, lo - h.base_offset), min(n, hi - h.base_offset)
        else:
            n = len(vs)
            a = bisect.bisect_left(offs, lo - h.base_offset)
            z = bisect.bisect_left(offs, hi - h.base_offset)
        if a >= z:
            continue
        if a or z < n:
            vs = vs[a:z]
            ks = ks[a:z] if ks else None
            deltas = deltas[a:z] if deltas else None
            hs = hs[a:z] if hs else None
        m = z - a
        done = len(values)
        values.extend(vs)
        if ks is not None:
            if keys is None:
                keys = [None] * done
            keys.extend(ks)
        elif keys is not None:
            keys.extend(itertools.repeat(None, m))
        if hs is not None:
            if headers is None:
                headers = [None] * done
            headers.extend([[(str(k), v) for k, v in x] if x else None for x in hs])
        elif headers is not None:
            headers.extend(itertools.repeat(None, m))
        first_us = h.first_timestamp_ms * 1000
        if deltas:
            ts.append(pc.add(pc.multiply(pa.array(deltas, pa.int64()), 1000), first_us))
        else:  # one timestamp for the whole batch: no Python int per record
            ts.append(pa.repeat(pa.scalar(first_us, pa.int64()), m))
        if offs is None:
            runs.append((h.base_offset + a, m))
        else:
            runs.extend((h.base_offset + o, 1) for o in offs[a:z])
    n = len(values)
    if not n:
        return None
    f = schema.types
    first_off = runs[0][0]
    if all(runs[i][0] == runs[i - 1][0] + runs[i - 1][1] for i in range(1, len(runs))):
        offsets = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), first_off - 1)
    else:  # control (or skipped) batches in between
        offsets = pa.array(list(itertools.chain.from_iterable(range(s, s + c) for s, c in runs)), pa.int64())
    cols = [
        pa.array(keys, f[0]) if keys is not None else pa.nulls(n, f[0]),
        pa.array(values, f[1]),
        pa.repeat(pa.scalar(topic, f[2]), n),
        pa.repeat(pa.scalar(partition, f[3]), n),
        offsets,
        pa.concat_arrays(ts).cast(f[5]),
        pa.array(headers, f[6]) if headers is not None else pa.nulls(n, f[6]),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=schema)
