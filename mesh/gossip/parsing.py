"""Validation of incoming gossip messages: wire lists in, typed rows out, or ``Malformed``.

One bad message can reach every broker in a gossip mesh and survive their restarts, so
nothing a peer sent is trusted before it is checked here: shapes, types, non-negative
counters, ascending versions, key lengths, and that every value is msgpack data whose
size can be counted (R8: everything is bounded). A message that fails any check is
dropped whole and counted (``stats["malformed"]``); the state is left untouched because
the handlers parse everything before they change anything.
"""
from __future__ import annotations

import itertools
import operator
from typing import Any

from mesh.gossip.rows import (BUCKETS, DELTA_FIELDS, ENTRY_FIELDS, ENTRY_OVERHEAD, MAX_KEY_CHARS,
                              REGISTER_FIELDS, ROW_FIELDS, Delta, Row, size_of)

__all__ = ["Malformed", "parse_rows", "parse_buckets", "parse_deltas", "parse_registers"]

_ROW_TYPES = [str, int, int, int, int, str, bool]
_node_id = operator.attrgetter("node_id")


class Malformed(Exception):
    """An incoming message that fails validation; it is dropped and counted."""


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
    return list(b)


def parse_deltas(deltas: Any, limit: int) -> list[tuple[Delta, list[int]]]:
    """Each delta with the size of each of its entries; Malformed unless all are well formed."""
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
        keys, versions, deleted = ents[0::ENTRY_FIELDS], ents[1::ENTRY_FIELDS], ents[3::ENTRY_FIELDS]
        if not (_types_ok(keys, str) and _ints_ok(versions) and _types_ok(deleted, bool)):
            raise Malformed("delta entry types")
        prev = frm
        for v in versions:
            if v <= prev:
                raise Malformed("delta versions must ascend above from_version")
            prev = v
        if prev > upto:
            raise Malformed("delta entry beyond upto_version")
        try:
            sizes = [ENTRY_OVERHEAD + size_of(k) + size_of(v) for k, v in zip(keys, ents[2::ENTRY_FIELDS])]
        except TypeError as exc:
            raise Malformed(str(exc)) from exc
        out.append((d, sizes))
    return out


def parse_registers(ents: Any, limit: int) -> tuple[Any, list[int]]:
    """Flat cluster entries and each one's size; Malformed unless every field is well typed."""
    if not isinstance(ents, (list, tuple)) or len(ents) % REGISTER_FIELDS or len(ents) > REGISTER_FIELDS * limit:
        raise Malformed("cluster entries")
    keys = ents[0::REGISTER_FIELDS]
    if not (_types_ok(keys, str) and _ints_ok(ents[1::REGISTER_FIELDS])
            and _types_ok(ents[2::REGISTER_FIELDS], str) and _types_ok(ents[4::REGISTER_FIELDS], bool)):
        raise Malformed("cluster entry types")
    if any(not k or len(k) > MAX_KEY_CHARS for k in keys):
        raise Malformed("cluster entry key")
    try:
        sizes = [ENTRY_OVERHEAD + size_of(k) + size_of(v) + size_of(w)
                 for k, v, w in zip(keys, ents[3::REGISTER_FIELDS], ents[2::REGISTER_FIELDS])]
    except TypeError as exc:
        raise Malformed(str(exc)) from exc
    return ents, sizes
