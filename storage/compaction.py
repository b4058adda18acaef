"""The compaction rule: pure functions over stored batches (no store, no clock).

A *cut* is ``(clean_end, horizon_ms)``: ``clean_end`` a batch boundary at or below the
high watermark, ``horizon_ms`` a timestamp. Applied to the batches below ``clean_end``:

- a keyed record is kept iff it is the newest record of its key below ``clean_end``, and
  it is not a tombstone (null value) whose timestamp is below ``horizon_ms``;
- a keyless record, and every record of a control batch, is kept (a compacted topic
  refuses keyless records; ones written before its policy changed stay);
- records at or above ``clean_end`` are never looked at.

Offsets never change: a rewritten batch keeps its base offset and the span of offsets it
covers (``mesh.wire.compacted``), so the log has no gap between batches, only inside them.
A batch that loses no record is left as it is (same bytes).

Why replicas agree: the result is a function of the *records* below ``clean_end`` only,
not of how they are batched or of what was compacted before. For two cuts with
``clean_end1 <= clean_end2`` and ``horizon1 <= horizon2``, applying the first then the
second keeps exactly what applying the second alone keeps (a record superseded below
``clean_end1`` is superseded below ``clean_end2``; a tombstone dropped under ``horizon1``
was the newest of its key and is dropped under ``horizon2`` too). So every replica that
applies the leader's latest cut to the same committed records serves the same records,
whichever earlier cuts it saw (``tests/unit/test_compaction_rule.py`` checks this).

The work is split in two passes so the node can run it a slice at a time
(``mesh.node.data.compactor``): ``scan_batch`` over every batch below the cut builds the
newest offset of each key, then ``rewrite_batch`` over the same batches.
"""
from __future__ import annotations

from mesh.wire.compacted import encode_compacted
from mesh.wire.records import ATTR_CONTROL, batch_records, parse_header

__all__ = ["scan_batch", "rewrite_batch", "rewrite_batch_stats", "compact_batches", "kept_offsets"]


def scan_batch(batch, newest: dict[bytes, int]) -> None:
    """Note in ``newest`` (key -> offset) the offset of each keyed record of ``batch``; the
    batches are scanned in offset order, so the last one noted is the newest."""
    h, recs = batch_records(batch)
    if h.attributes & ATTR_CONTROL:
        return
    base = h.base_offset
    for od, _value, key, _ts, _hs in recs:
        if key is not None:
            newest[key] = base + od


def rewrite_batch(batch, newest: dict[bytes, int], horizon_ms: int) -> bytes | None:
    """``batch`` with the records the rule drops left out (a compacted batch, valid CRC),
    or None when it keeps them all. ``newest``: ``scan_batch`` over every batch below the
    cut."""
    return rewrite_batch_stats(batch, newest, horizon_ms)[0]


def rewrite_batch_stats(batch, newest: dict[bytes, int], horizon_ms: int) -> tuple[bytes | None, int | None]:
    """``rewrite_batch``, and the oldest timestamp of a tombstone it keeps (None: none)."""
    h, recs = batch_records(batch)
    if h.attributes & ATTR_CONTROL:
        return None, None
    base = h.base_offset
    kept = [r for r in recs if r[2] is None or (newest.get(r[2]) == base + r[0]
                                                  and not (r[1] is None and r[3] < horizon_ms))]
    tombs = [r[3] for r in kept if r[1] is None and r[2] is not None]
    tomb = min(tombs) if tombs else None
    if len(kept) == len(recs):
        return None, tomb
    return encode_compacted(h, kept), tomb


def compact_batches(batches: list[bytes], clean_end: int, horizon_ms: int) -> list[bytes]:
    """The whole rule at once (tests, and small logs): ``batches`` in offset order, the
    ones below ``clean_end`` rewritten, the others as given."""
    below = [b for b in batches if parse_header(b).next_offset <= clean_end]
    newest: dict[bytes, int] = {}
    for b in below:
        scan_batch(b, newest)
    out = []
    for b in batches:
        h = parse_header(b)
        if h.next_offset <= clean_end:
            nb = rewrite_batch(b, newest, horizon_ms)
            out.append(b if nb is None else nb)
        else:
            out.append(b)
    return out


def kept_offsets(records: list[tuple[int, bytes | None, bytes | None, int]], clean_end: int,
                 horizon_ms: int) -> list[int]:
    """The rule on plain ``(offset, key, value, timestamp)`` records (the property test's
    model): the offsets kept."""
    newest = {k: o for o, k, _v, _t in records if k is not None and o < clean_end}
    return [o for o, k, v, t in records
            if o >= clean_end or k is None or (newest[k] == o and not (v is None and t < horizon_ms))]
