"""What a stored batch's columns must be: the broker's LogValidator.

A batch's payload is one msgpack array ``[values, keys, timestamp_deltas, headers]``
(``mesh.wire.records``). Before a leader stores a client's batch it checks, as Kafka's
LogValidator checks each record of a batch it appends:

- the payload is exactly that 4-array, with nothing after it (no trailing bytes);
- ``values``: ``record_count`` entries, each bytes (msgpack bin) or nil (a null value,
  a tombstone); never a str, an int, a map, an array;
- ``keys``: nil, or ``record_count`` entries of bytes or nil;
- ``timestamp_deltas``: nil (every record has the batch's first timestamp, which must then
  equal its max timestamp), or ``record_count`` ints; the first is 0 and first timestamp +
  the largest delta is the header's max timestamp (``ListOffsets`` by timestamp skips
  batches by that max: it must not lie), and no record's timestamp is negative;
- ``headers``: nil, or ``record_count`` lists, each of ``[str, bytes or nil]`` pairs.

Header fields the broker cannot check from the columns (magic, attributes, reserved) are
checked by ``records.validate_batch`` before this.

Cost: one C call of msgpack's unpacker over the payload (maps and extension types refused
by its limits), then C-level checks of each column (``b"".join`` of a column of bytes
raises on anything else; a column with nils takes a set-of-types pass). Nothing runs a
Python frame per record. ``check_columns`` is the same check on decoded columns; a
consumer reading a batch that an older broker stored unchecked runs its type checks.
"""
from __future__ import annotations

from itertools import chain

import msgpack

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["unpack_columns", "check_columns"]

_BYTES_OR_NIL = frozenset({bytes, type(None)})
_INT = frozenset({int})
_ARRAY = frozenset({list, tuple})   # what msgpack makes of an array (use_list or not)
_LIST, _TUPLE = frozenset({list}), frozenset({tuple})
_STR = frozenset({str})
_PAIR = frozenset({2})
_join = b"".join


def _kind(x) -> str:
    """What msgpack calls the type of a decoded ``x``."""
    t = type(x)
    return "array" if t in _ARRAY else "nil" if x is None else t.__name__


def _bad(reason: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_RECORD, reason)


def unpack_columns(payload, use_list: bool = True) -> list:
    """The four columns of a batch payload (bytes or memoryview), decoded in one C call;
    MeshError(INVALID_RECORD) if it is not msgpack, has trailing bytes, maps or extensions.
    ``use_list=False``: arrays as tuples (about a third cheaper to make: the broker's check
    throws the columns away)."""
    try:
        cols = msgpack.unpackb(payload, raw=False, max_map_len=0, max_ext_len=0, use_list=use_list)
    except msgpack.ExtraData:
        raise _bad("trailing bytes after the record columns") from None
    except Exception as exc:   # msgpack's errors, bad UTF-8 in a str, a map or ext over its limit
        raise _bad(f"record columns are not valid msgpack of bytes, ints and strs "
                   f"({type(exc).__name__}: {exc})"[:300]) from None
    if type(cols) not in _ARRAY or len(cols) != 4:
        raise _bad("batch payload is not [values, keys, timestamp deltas, headers]")
    return cols


def _bytes_or_nil(col: list, what: str) -> None:
    try:
        _join(col)          # every entry bytes (the common case: one C pass)
        return
    except TypeError:
        pass
    if not _BYTES_OR_NIL.issuperset(map(type, col)):
        bad = next(x for x in col if type(x) not in _BYTES_OR_NIL)
        raise _bad(f"{what} must be bytes or nil, not {_kind(bad)}")


def check_columns(cols, record_count: int, first_timestamp_ms: int | None,
                  max_timestamp_ms: int | None, seq: type = list) -> None:
    """Check decoded columns against the header's count and timestamps (see the module
    docstring); MeshError(INVALID_RECORD) naming what is wrong. Timestamps None: the
    types only (a consumer: the deltas must be ints, their agreement with the header is
    the broker's to check). ``seq``: the type msgpack made arrays (``unpack_columns``)."""
    values, keys, deltas, headers = cols
    seqs = _LIST if seq is list else _TUPLE
    n = record_count
    if type(values) is not seq or len(values) != n:
        raise _bad(f"the values column is not a list of {n} entries (record_count)")
    _bytes_or_nil(values, "record values")
    if keys is not None:
        if type(keys) is not seq or len(keys) != n:
            raise _bad(f"the keys column is neither nil nor a list of {n} entries")
        _bytes_or_nil(keys, "record keys")
    if deltas is None:
        if first_timestamp_ms != max_timestamp_ms:   # (None, None: not asked)
            raise _bad(f"no timestamp deltas, but the header's timestamps differ "
                       f"({first_timestamp_ms}..{max_timestamp_ms})")
    else:
        if type(deltas) is not seq or len(deltas) != n:
            raise _bad(f"the timestamp deltas column is neither nil nor a list of {n} entries")
        if not _INT.issuperset(map(type, deltas)):
            bad = next(x for x in deltas if type(x) is not int)
            raise _bad(f"timestamp deltas must be ints, not {_kind(bad)}")
        if first_timestamp_ms is not None and (deltas[0] != 0 or first_timestamp_ms + max(deltas) != max_timestamp_ms
                                               or first_timestamp_ms + min(deltas) < 0):
            raise _bad(f"timestamp deltas do not match the header's timestamps "
                       f"{first_timestamp_ms}..{max_timestamp_ms} (the first delta must be 0, the largest "
                       f"must reach the max timestamp, and no timestamp may be negative)")
    if headers is not None:
        if type(headers) is not seq or len(headers) != n:
            raise _bad(f"the headers column is neither nil nor a list of {n} entries")
        if not seqs.issuperset(map(type, headers)):
            raise _bad("each record's headers must be a list of [name, value] pairs")
        pairs = list(chain.from_iterable(headers))
        if pairs:
            # (no type pass over the pairs: a str or bytes "pair" of length 2 flattens into
            # names that are not strs or values that are not bytes, and fails below)
            try:
                pair_lengths_ok = _PAIR.issuperset(map(len, pairs))
            except TypeError:   # an int, a nil
                pair_lengths_ok = False
            if not pair_lengths_ok:
                raise _bad("each header must be a [name, value] pair")
            flat = list(chain.from_iterable(pairs))   # name, value, name, value...
            if not _STR.issuperset(map(type, flat[0::2])):
                raise _bad("header names must be strs")
            _bytes_or_nil(flat[1::2], "header values")
