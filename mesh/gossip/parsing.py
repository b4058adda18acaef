"""Validation of incoming gossip messages: wire lists in, typed rows out, or ``Malformed``.

One bad message can reach every broker in a gossip mesh and survive their restarts, so
nothing a peer sent is trusted before it is checked here: shapes, types, non-negative
counters below ``MAX_COUNTER`` (2**53: exact everywhere), generations below
``MAX_GENERATION``, ascending versions, key and name lengths, bucket hashes below 2**32,
stamps and gc clocks no later than ``now_ms`` plus the clock skew, and every entry
through the node's ``EntryCheck`` (key kinds, value schemas: ``mesh.gossip.checks``);
every value must be msgpack data whose size can be counted (R8: everything is bounded).
A message that fails any check is dropped whole and counted (``stats["malformed"]`` and
``stats["malformed_<kind>"]``, the reason kept for the node to log); the state is left
untouched because the handlers parse everything before they change anything.
"""
from __future__ import annotations

import itertools
import operator
from typing import Any

from mesh.gossip.checks import EntryCheck
from mesh.gossip.rows import (BUCKETS, DELTA_FIELDS, ENTRY_FIELDS, ENTRY_OVERHEAD, MAX_COUNTER, MAX_GENERATION,
                              MAX_HEARTBEAT, MAX_KEY_CHARS, MAX_LIFE, MAX_NAME_CHARS, REGISTER_FIELDS, ROW_FIELDS, Delta, Row, size_of)

__all__ = ["Malformed", "MALFORMED_KINDS", "parse_rows", "parse_buckets", "parse_row_hashes", "parse_deltas", "parse_registers",
           "parse_gc_clock"]

_ROW_TYPES = [str, int, int, int, int, str, bool, int]
_node_id = operator.attrgetter("node_id")
MALFORMED_KINDS = ("shape", "bounds", "stamp", "entry", "hello")


class Malformed(Exception):
    """An incoming message that fails validation; it is dropped and counted.

    ``kind``: "shape" (structure, types), "bounds" (a number or length out of range),
    "stamp" (a stamp or gc clock in the future), "entry" (a key of the wrong kind, or a
    value its validator refuses), "hello" (a SYN that does not present its sender)."""

    def __init__(self, reason: str, kind: str = "shape") -> None:
        super().__init__(reason)
        self.kind = kind


def _names_ok(column: Any) -> bool:
    return not column or (min(map(len, column)) >= 1 and max(map(len, column)) <= MAX_NAME_CHARS)


def _types_ok(column: Any, allowed: type) -> bool:
    return not column or set(map(type, column)) <= {allowed}


def _ints_ok(column: Any) -> bool:
    return not column or (set(map(type, column)) <= {int} and min(column) >= 0)


def parse_rows(digest: Any, limit: int) -> dict[str, Row]:
    """node id -> Row; Malformed unless every row has the right shape and types."""
    if not isinstance(digest, (list, tuple)) or len(digest) > limit:
        raise Malformed("digest")
    if set(map(type, digest)) <= {Row}:
        rows = list(digest)             # handed over in-process (no codec): already Rows
    else:
        try:
            rows = list(map(tuple.__new__, itertools.repeat(Row), digest))   # Rows, built in C
        except TypeError as exc:
            raise Malformed("digest rows") from exc
    if rows and (set(map(len, rows)) != {ROW_FIELDS}
                 or list(map(type, itertools.chain.from_iterable(rows))) != _ROW_TYPES * len(rows)):
        raise Malformed("digest types")
    if rows:
        ids, gens, hbs, mvs, gcs, addrs, _, lives = zip(*rows)
        if min(min(gens), min(hbs), min(mvs), min(gcs), min(lives)) < 0 or max(gens) >= MAX_GENERATION \
                or max(hbs) >= MAX_HEARTBEAT or max(max(mvs), max(gcs)) > MAX_COUNTER or max(lives) >= MAX_LIFE:
            raise Malformed("digest: a generation, heartbeat, version or life out of range", "bounds")
        if not (_names_ok(ids) and _names_ok(addrs)):
            raise Malformed(f"digest: node ids and addresses are 1..{MAX_NAME_CHARS} characters", "bounds")
    out = dict(zip(map(_node_id, rows), rows))
    if len(out) != len(rows):
        raise Malformed("digest: duplicate node")
    return out


def parse_buckets(b: Any) -> list[int] | None:
    """The sender's cluster bucket hashes; None when it had nothing to say about them."""
    if not b:
        return None
    if not isinstance(b, (list, tuple)) or len(b) != BUCKETS or not _ints_ok(b):
        raise Malformed("cluster buckets")
    if max(b) > 0xFFFFFFFF:
        raise Malformed("cluster bucket hash above 2**32", "bounds")
    return list(b)


def parse_row_hashes(b: Any, buckets: int) -> list[int] | None:
    """The sender's row bucket hashes (``Membership.row_hashes``); None when it sent its
    whole table instead."""
    if not b:
        return None
    if not isinstance(b, (list, tuple)) or len(b) != buckets or not _ints_ok(b):
        raise Malformed("row buckets")
    if max(b) > 0xFFFFFFFF:
        raise Malformed("row bucket hash above 2**32", "bounds")
    return list(b)


def parse_gc_clock(v: Any, check: EntryCheck, now_ms: int) -> int:
    """The sender's cluster gc clock: an int, not in the future (R6, R8)."""
    if type(v) is not int or v < 0:
        raise Malformed("cluster_gc")
    if v > check.stamp_limit(now_ms):
        raise Malformed(f"cluster gc clock {v} is later than now + {check.max_clock_skew_ms} ms", "stamp")
    return v


def parse_deltas(deltas: Any, limit: int, check: EntryCheck | None = None,
                 now_ms: int = 0) -> list[tuple[Delta, list[int]]]:
    """Each delta with the size of each of its entries; Malformed unless all are well formed
    and every entry passes ``check`` (if given)."""
    if not isinstance(deltas, (list, tuple)) or len(deltas) > limit:
        raise Malformed("deltas")
    out = []
    for d in deltas:
        if not isinstance(d, (list, tuple)) or len(d) != DELTA_FIELDS:
            raise Malformed("delta shape")
        d = Delta._make(d)
        origin, gen, frm, upto, gc, reset, ents = d
        if (type(origin) is not str or type(reset) is not bool or not isinstance(ents, (list, tuple))
                or not _ints_ok((gen, frm, upto, gc)) or upto < frm or len(ents) % ENTRY_FIELDS):
            raise Malformed("delta header")
        if gen >= MAX_GENERATION or upto > MAX_COUNTER or gc > MAX_COUNTER or not 1 <= len(origin) <= MAX_NAME_CHARS:
            raise Malformed("delta header out of range", "bounds")
        keys, versions, deleted = ents[0::ENTRY_FIELDS], ents[1::ENTRY_FIELDS], ents[3::ENTRY_FIELDS]
        if not (_types_ok(keys, str) and _ints_ok(versions) and _types_ok(deleted, bool)):
            raise Malformed("delta entry types")
        if keys and (min(map(len, keys)) < 1 or max(map(len, keys)) > MAX_KEY_CHARS):
            raise Malformed("delta entry key", "bounds")
        prev = frm
        for v in versions:
            if v <= prev:
                raise Malformed("delta versions must ascend above from_version")
            prev = v
        if prev > upto:
            raise Malformed("delta entry beyond upto_version")
        values = ents[2::ENTRY_FIELDS]
        try:
            sizes = [ENTRY_OVERHEAD + size_of(k) + size_of(v) for k, v in zip(keys, values)]
        except TypeError as exc:
            raise Malformed(str(exc)) from exc
        for k, v, dead in zip(keys, values, deleted) if check is not None else ():
            why = check.node_entry(k, v, dead, now_ms)
            if why is not None:
                raise Malformed(f"node {origin[:80]!r}: {why}", "entry")
        out.append((d, sizes))
    return out


def parse_registers(ents: Any, limit: int, check: EntryCheck | None = None,
                    now_ms: int = 0) -> tuple[Any, list[int]]:
    """Flat cluster entries and each one's size; Malformed unless every field is well typed,
    and (with ``check``) every stamp is not in the future and every entry passes it."""
    if not isinstance(ents, (list, tuple)) or len(ents) % REGISTER_FIELDS or len(ents) > REGISTER_FIELDS * limit:
        raise Malformed("cluster entries")
    keys = ents[0::REGISTER_FIELDS]
    if not (_types_ok(keys, str) and _ints_ok(ents[1::REGISTER_FIELDS])
            and _types_ok(ents[2::REGISTER_FIELDS], str) and _types_ok(ents[4::REGISTER_FIELDS], bool)):
        raise Malformed("cluster entry types")
    if any(not k or len(k) > MAX_KEY_CHARS for k in keys):
        raise Malformed("cluster entry key", "bounds")
    if not keys:
        return ents, []
    clocks, writers = ents[1::REGISTER_FIELDS], ents[2::REGISTER_FIELDS]
    values, deleted = ents[3::REGISTER_FIELDS], ents[4::REGISTER_FIELDS]
    if not _names_ok(writers):
        raise Malformed(f"cluster entry writers are 1..{MAX_NAME_CHARS} characters", "bounds")
    top = max(clocks)
    if check is not None and top > check.stamp_limit(now_ms):
        raise Malformed(f"cluster entry {keys[clocks.index(top)][:80]!r} stamped {top}, later than now + "
                        f"{check.max_clock_skew_ms} ms", "stamp")
    if top > MAX_COUNTER:
        raise Malformed(f"cluster entry stamped {top}, above 2**53", "bounds")
    try:
        sizes = [ENTRY_OVERHEAD + size_of(k) + size_of(v) + size_of(w) for k, v, w in zip(keys, values, writers)]
    except TypeError as exc:
        raise Malformed(str(exc)) from exc
    for k, v, dead in zip(keys, values, deleted) if check is not None else ():
        why = check.register_entry(k, v, dead, now_ms)
        if why is not None:
            raise Malformed(why, "entry")
    return ents, sizes
