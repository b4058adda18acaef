"""Offset planning for the mesh Spark source: pure functions, no I/O.

Offsets are per topic-partition, written as Spark's Kafka source writes them:
``{"orders": {"0": 23, "1": 40}}`` (string partition keys, because Spark round-trips
offsets through JSON). An offset is the next record to read, so a range is
``[start, end)``.

* ``resolve_offsets``: ``startingOffsets`` / ``endingOffsets`` ("earliest", "latest" or
  JSON with -2 / -1 / offsets) -> an offset per partition; the log starts and ends it
  needs come from a ``list_offsets`` callable (the source passes the cluster's).
* ``plan_partitions``: the ranges -> one ``MeshPartition`` (Spark task) per range, cut into
  ``minPartitions`` pieces in proportion to their size.
* ``rate_limit``: ``maxOffsetsPerTrigger`` shared among partitions in proportion to
  their backlog (largest remainder, so the sum is exact).
"""
from __future__ import annotations

import json
from typing import Callable

from mesh.spark.options import MeshOptions, MeshSparkError
from mesh.wire.messages import EARLIEST, LATEST

from pyspark.sql.datasource import InputPartition

__all__ = ["MeshPartition", "offsets_to_json", "offsets_from_json", "resolve_offsets", "resolve_by_timestamp",
           "plan_partitions", "rate_limit"]


# -- offsets as Spark keeps them -------------------------------------------------------
def offsets_to_json(offsets: dict) -> dict:
    """{(topic, partition): offset} -> {"topic": {"partition": offset}}, sorted."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def offsets_from_json(js: dict | str) -> dict:
    if isinstance(js, str):
        js = json.loads(js)
    out = {}
    for t, parts in js.items():
        if not isinstance(parts, dict):
            raise MeshSparkError(f"offsets of topic {t!r} must be an object like {{\"0\": 23}}, not {parts!r}")
        for p, off in parts.items():
            try:
                out[(t, int(p))] = int(off)
            except (TypeError, ValueError):
                raise MeshSparkError(f"bad offset {t}/{p}: {off!r}") from None
    return out


def resolve_offsets(spec: str | None, default: str, leaders: dict,
                    list_offsets: Callable[[dict, int], dict], *, what: str,
                    allow: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """startingOffsets / endingOffsets -> {(topic, partition): offset} for every partition of
    ``leaders`` ({(topic, partition): leader address}); ``list_offsets(leaders, EARLIEST or
    LATEST)`` answers the log starts / ends."""
    spec = (spec or default).strip()
    if spec.lower() in ("earliest", "latest"):
        if spec.lower() not in allow:
            raise MeshSparkError(f"{what}={spec} is not allowed here (use {' or '.join(allow)} or JSON)")
        return list_offsets(leaders, EARLIEST if spec.lower() == "earliest" else LATEST)
    try:
        given = offsets_from_json(spec)
    except json.JSONDecodeError:
        raise MeshSparkError(f'{what} must be "earliest", "latest" or JSON like '
                             f'{{"orders":{{"0":23,"1":-2}}}}, not {spec!r}') from None
    unknown = sorted(set(given) - set(leaders))
    if unknown:
        raise MeshSparkError(f"{what} names partitions that are not subscribed or do not exist: {unknown}")
    out = {}
    need = {EARLIEST: {}, LATEST: {}}
    fallback = EARLIEST if default == "earliest" else LATEST
    for tp, addr in leaders.items():
        off = given.get(tp, fallback)
        if off in (EARLIEST, LATEST):
            if off == EARLIEST and "earliest" not in allow:
                raise MeshSparkError(f"{what}: -2 (earliest) is not allowed for {tp[0]}/{tp[1]}")
            need[off][tp] = addr
        elif off < 0:
            raise MeshSparkError(f"{what}: offset {off} of {tp[0]}/{tp[1]} is negative (use -2 earliest, -1 latest)")
        else:
            out[tp] = off
    for which, sub in need.items():
        if sub:
            out.update(list_offsets(sub, which))
    return out


def resolve_by_timestamp(spec, leaders: dict, offsets_for_times: Callable[[dict, dict], dict],
                         list_offsets: Callable[[dict, int], dict], strategy: str) -> dict[tuple[str, int], int]:
    """startingTimestamp (``spec`` an int) / startingOffsetsByTimestamp (``spec`` {tp: ms},
    naming every partition, as Spark's Kafka source asks) -> {tp: the first offset whose
    record's timestamp is >= it}. A partition with no such record: an error (strategy
    "error", Spark's default) or its latest offset ("latest")."""
    if isinstance(spec, int):
        query = {tp: spec for tp in leaders}
    else:
        unknown = sorted(set(spec) - set(leaders))
        if unknown:
            raise MeshSparkError(f"startingOffsetsByTimestamp names partitions that are not subscribed or do "
                                 f"not exist: {unknown}")
        missing = sorted(set(leaders) - set(spec))
        if missing:
            raise MeshSparkError(f"startingOffsetsByTimestamp must name every subscribed partition (as Spark's "
                                 f"Kafka source); missing: {missing[:5]}{'...' if len(missing) > 5 else ''}")
        query = dict(spec)
    found = offsets_for_times(leaders, query) if query else {}
    none = sorted(tp for tp in query if found.get(tp) is None)
    if none and strategy != "latest":
        tp = none[0]
        raise MeshSparkError(f"no record of {tp[0]}/{tp[1]} has a timestamp at or after {query[tp]} "
                             f"({len(none)} partition(s) like it). Set option startingOffsetsByTimestampStrategy "
                             f'to "latest" to start those at their latest offset')
    out = {tp: off for tp, off in found.items() if off is not None}
    if none:
        out.update(list_offsets({tp: leaders[tp] for tp in none}, LATEST))
    return out


# -- tasks -----------------------------------------------------------------------------
class MeshPartition(InputPartition):
    """One Spark task: records [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int, leader: str | None,
                 opts: MeshOptions, new_partition: bool = False):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.leader, self.opts, self.new_partition = leader, opts, new_partition

    def __repr__(self) -> str:
        return f"MeshPartition({self.topic}/{self.partition} [{self.start}, {self.end}))"


def _split(topic, partition, start, end, leader, opts, pieces, new=False) -> list[MeshPartition]:
    n = max(1, min(pieces, end - start))
    step, extra = divmod(end - start, n)
    out, s = [], start
    for i in range(n):
        e = s + step + (1 if i < extra else 0)
        out.append(MeshPartition(topic, partition, s, e, leader, opts, new))
        s = e
    return out


def plan_partitions(start: dict, end: dict, leaders: dict, opts: MeshOptions,
                    new_partitions: frozenset = frozenset()) -> list[MeshPartition]:
    ranges = [(tp, start.get(tp, 0), end[tp]) for tp in sorted(end) if end[tp] > start.get(tp, 0)]
    total = sum(e - s for _, s, e in ranges)
    out = []
    for (t, p), s, e in ranges:
        pieces = 1
        if opts.min_partitions and opts.min_partitions > len(ranges) and total:
            pieces = max(1, -(-opts.min_partitions * (e - s) // total))  # ceil: at least minPartitions
        out.extend(_split(t, p, s, e, leaders.get((t, p)), opts, pieces, (t, p) in new_partitions))
    return out


def rate_limit(begin: dict, end: dict, max_rows: int) -> dict:
    """Advance at most ``max_rows`` records in all, shared in proportion to each partition's
    backlog (largest remainder: the shares add up exactly)."""
    backlog = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    shares = {tp: max_rows * n / total for tp, n in backlog.items()}
    take = {tp: int(x) for tp, x in shares.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(shares, key=lambda tp: (take[tp] - shares[tp], tp))[:left]:
        take[tp] += 1
    return {tp: begin[tp] + min(take[tp], backlog[tp]) for tp in end}
