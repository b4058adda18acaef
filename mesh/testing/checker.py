"""The checker of the Jepsen-style harness: read every partition back and hold the log
against the recorded history.

Theory of operation
-------------------
``read_back`` reads each partition from its log start to its high watermark through the
client (``Consumer``), as a user would. ``check(ops, log, faults)`` then counts:

- lost: acknowledged, not in the log;
- duplicated: a value stored at more than one offset (``acked_duplicated``: of those,
  the acknowledged ones; extra copies are counted, a value stored 3 times counts 2);
- order violations: within one producer process and one partition, acknowledged values
  taken in send order must have increasing acknowledged offsets (``order_violations``)
  and increasing offsets of their first copy in the log (``log_order_violations``); the
  count is the fewest values that would have to go for the rest to be in order;
- phantoms: in the log, never sent (no invoke line);
- offset mismatches: acknowledged at (partition, offset) where the log holds another
  value (or nothing), or acknowledged naming another partition than it was sent to;
- failed but written: a definite failure (``maybe_written`` False) found in the log,
  and, for the record, how many unknown outcomes were written.

Client recovery after each fault: the time from the fault's start to the first
acknowledgement of a send invoked after it, for every (producer, partition) pair that
sent after it; the fault's recovery is the slowest pair (when every producer can write
every partition again). ``None`` when some pair never recovered. The headline numbers
(``recovery_p50_s``/``recovery_max_s``) leave out faults that take away a partition's
quorum on purpose (``kill2``: recovery then includes the outage itself); those are still
listed per fault and in ``recovery_by_kind``. Liveness: measured the same way from the
moment the final heal completed (``liveness_s``); never recovering then is a failure.
"""
from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field

from mesh.testing.history import Op, parse_value

__all__ = ["CheckResult", "NO_QUORUM_KINDS", "check", "read_back"]

NO_QUORUM_KINDS = frozenset({"kill2"})  # faults whose outage is part of their recovery time


def read_back(bootstrap: str, topic: str, partitions: int,
              timeout_s: float = 60.0) -> dict[int, list[tuple[int, str]]]:
    """``{partition: [(offset, value), ...]}`` of everything below the high watermark."""
    from mesh.client import Consumer, TopicPartition
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        starts = c.beginning_offsets(tps)
        ends = c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, starts[tp])
        out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
        pos = {tp.partition: starts[tp] for tp in tps}
        while any(pos[tp.partition] < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                short = {tp.partition: (pos[tp.partition], ends[tp])
                         for tp in tps if pos[tp.partition] < ends[tp]}
                raise AssertionError(f"could not read {topic} back within {timeout_s} s: "
                                     f"(position, end) by partition {short}")
            for recs in c.poll_batches(500):
                for r in recs:
                    if r.offset < ends[TopicPartition(topic, r.partition)]:
                        out[r.partition].append((r.offset, r.value.decode("ascii", "replace")))
                    pos[r.partition] = max(pos[r.partition], r.offset + 1)
        return out


@dataclass
class CheckResult:
    sends: int = 0
    acked: int = 0
    failed: int = 0       # definite failures
    unknown: int = 0      # outcome unknown
    stored: int = 0       # records in the log
    lost: int = 0
    duplicated: int = 0
    acked_duplicated: int = 0
    order_violations: int = 0
    log_order_violations: int = 0
    phantoms: int = 0
    offset_mismatches: int = 0
    failed_but_written: int = 0
    unknown_written: int = 0
    recoveries_s: list = field(default_factory=list)  # per fault: seconds, or None
    faults: list = field(default_factory=list)        # per fault: its description
    fault_kinds: list = field(default_factory=list)   # per fault: its kind
    examples: dict = field(default_factory=dict)      # kind -> a few examples
    liveness_s: float | None = None   # after the final heal, until every pair was acknowledged
    liveness_failed: bool = False

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.order_violations or self.log_order_violations
                    or self.phantoms or self.offset_mismatches or self.failed_but_written
                    or self.liveness_failed)

    @property
    def recovered(self) -> list[float]:
        """Recovery times of the faults that kept a quorum of every partition."""
        return [r for r, k in zip(self.recoveries_s, self.fault_kinds)
                if r is not None and k not in NO_QUORUM_KINDS]

    @property
    def recovery_by_kind(self) -> dict:
        """``{kind: [seconds or None, ...]}``"""
        out: dict = {}
        for r, k in zip(self.recoveries_s, self.fault_kinds):
            out.setdefault(k, []).append(r)
        return out

    @property
    def recovery_p50_s(self) -> float | None:
        r = self.recovered
        return statistics.median(r) if r else None

    @property
    def recovery_max_s(self) -> float | None:
        r = self.recovered
        return max(r) if r else None

    @property
    def unrecovered(self) -> int:
        return sum(1 for r in self.recoveries_s if r is None)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(ok=self.ok, recovery_p50_s=self.recovery_p50_s, recovery_max_s=self.recovery_max_s,
                 unrecovered=self.unrecovered, recovery_by_kind=self.recovery_by_kind)
        return d

    def summary(self) -> str:
        def s(x):
            return "-" if x is None else f"{x:.2f} s"
        lines = [
            f"sends {self.sends}: acknowledged {self.acked}, failed {self.failed}, unknown {self.unknown}; "
            f"{self.stored} records in the log",
            f"lost {self.lost}, duplicated {self.duplicated} (acknowledged {self.acked_duplicated}), "
            f"order violations {self.order_violations} (log {self.log_order_violations}), "
            f"phantoms {self.phantoms}, offset mismatches {self.offset_mismatches}",
            f"failed but written {self.failed_but_written}, unknown outcome but written {self.unknown_written}",
            f"client recovery over {len(self.recovered)} fault(s) that kept quorum: "
            f"p50 {s(self.recovery_p50_s)}, max {s(self.recovery_max_s)}; never recovered {self.unrecovered}",
        ]
        for f, r in zip(self.faults, self.recoveries_s):
            lines.append(f"  {f}: recovered in {s(r)}")
        if self.liveness_failed:
            lines.append("  after the final heal: some producer never had a send to some partition acknowledged")
        elif self.liveness_s is not None:
            lines.append(f"  after the final heal: every producer wrote every partition within "
                         f"{s(self.liveness_s)}")
        for kind, ex in self.examples.items():
            lines.append(f"  e.g. {kind}: {'; '.join(ex)}")
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def _example(res: CheckResult, kind: str, text: str, limit: int = 5) -> None:
    ex = res.examples.setdefault(kind, [])
    if len(ex) < limit:
        ex.append(text)


def _inversions(offsets: list[int]) -> list[int]:
    """Indexes of the values out of order: the fewest values whose removal leaves the
    offsets increasing (all but a longest increasing subsequence), so one value stored
    far away counts once, not once per value it jumped over."""
    import bisect
    tails: list[int] = []       # tails[k]: smallest offset ending an increasing run of k+1
    tail_idx: list[int] = []
    prev = [-1] * len(offsets)
    for i, o in enumerate(offsets):
        k = bisect.bisect_left(tails, o)
        if k == len(tails):
            tails.append(o)
            tail_idx.append(i)
        else:
            tails[k], tail_idx[k] = o, i
        prev[i] = tail_idx[k - 1] if k else -1
    keep, i = set(), tail_idx[-1] if tail_idx else -1
    while i >= 0:
        keep.add(i)
        i = prev[i]
    return [i for i in range(len(offsets)) if i not in keep]


def check(ops: list[Op], log: dict[int, list[tuple[int, str]]], faults: list | None = None,
          healed_t: float | None = None) -> CheckResult:
    res = CheckResult(sends=len(ops))
    sent = {op.value: op for op in ops}
    where: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    at: dict[tuple[int, int], str] = {}
    for p, recs in log.items():
        for off, v in recs:
            where[v].append((p, off))
            at[(p, off)] = v
            res.stored += 1
    for v, places in where.items():
        if v not in sent or parse_value(v) is None:
            res.phantoms += 1
            _example(res, "phantom", f"{v} at {places}")
        if len(places) > 1:
            res.duplicated += len(places) - 1
            if v in sent and sent[v].outcome == "ok":
                res.acked_duplicated += len(places) - 1
            _example(res, "duplicated", f"{v} at {places}"
                     + (f" (acknowledged at {sent[v].offset})" if v in sent and sent[v].outcome == "ok" else ""))
    by_proc_part: dict[tuple[int, int], list[Op]] = collections.defaultdict(list)
    for op in ops:
        if op.outcome == "ok":
            res.acked += 1
            places = where.get(op.value)
            if not places:
                res.lost += 1
                _example(res, "lost", f"{op.value} acknowledged at {op.partition}:{op.offset}")
                continue
            if at.get((op.partition, op.offset)) != op.value or op.ack_partition not in (None, op.partition):
                res.offset_mismatches += 1
                _example(res, "offset mismatch", f"{op.value} acknowledged at {op.partition}:{op.offset}, "
                                                 f"stored at {places}")
            by_proc_part[(op.proc, op.partition)].append(op)
        elif op.outcome == "fail":
            res.failed += 1
            if op.value in where:
                res.failed_but_written += 1
                _example(res, "failed but written", f"{op.value} ({op.error}) stored at {where[op.value]}")
        else:
            res.unknown += 1
            if op.value in where:
                res.unknown_written += 1
    for (proc, part), acked in sorted(by_proc_part.items()):
        acked.sort(key=lambda op: op.n)
        for i in _inversions([op.offset for op in acked]):
            res.order_violations += 1
            _example(res, "acknowledged out of order",
                     f"{acked[i].value} acknowledged at {part}:{acked[i].offset}")
        firsts = [min([o for p, o in where[op.value] if p == part] or [o for _, o in where[op.value]])
                  for op in acked]
        for i in _inversions(firsts):
            res.log_order_violations += 1
            _example(res, "stored out of order", f"{acked[i].value} first stored at {part}:{firsts[i]}")
    for f in faults or []:
        res.faults.append(f.detail or f.kind)
        res.fault_kinds.append(f.kind)
        res.recoveries_s.append(_recovery(ops, f.start_t))
    if healed_t is not None and any(op.invoke_t >= healed_t for op in ops):
        res.liveness_s = _recovery(ops, healed_t)
        res.liveness_failed = res.liveness_s is None
    return res


def _recovery(ops: list[Op], t: float) -> float | None:
    """Seconds from ``t`` until every (producer, partition) pair that sent after ``t`` had
    a send invoked after ``t`` acknowledged."""
    first: dict[tuple[int, int], float | None] = {}
    for op in ops:
        if op.invoke_t < t:
            continue
        key = (op.proc, op.partition)
        if op.outcome == "ok" and op.done_t is not None:
            prev = first.get(key)
            if prev is None or op.done_t < prev:
                first[key] = op.done_t
        else:
            first.setdefault(key, None)
    if not first:
        return None
    if any(v is None for v in first.values()):
        return None
    return max(first.values()) - t
