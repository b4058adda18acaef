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
- ``headers``: nil, or ``record_count`` arrays, each of ``[str, bytes or nil]`` pairs.

Header fields the broker cannot check from the columns (magic, attributes, reserved) are
checked by ``records.validate_batch`` before this.

``decode_columns`` decodes and type-checks in one C pass: msgspec's msgpack decoder with
the columns' types as its schema (strict: no str for bytes, no bool or float for an int,
trailing bytes refused), which costs about what a plain ``msgpack.unpackb`` does. Without
msgspec installed, msgpack's unpacker (maps and extension types refused by its limits),
then C-level checks of each column (``b"".join`` of a column of bytes raises on anything
else; a column with nils takes a set-of-types pass): about twice the cost, the same
verdicts. Either way no Python frame runs per record. ``check_columns`` then checks the
counts and timestamps against the header (O(1), plus min/max of the deltas in C).
Consumers decode with ``decode_columns`` too, so a batch an older broker stored unchecked
is a MeshError, never an int handed to the application.
"""
from __future__ import annotations

import re
from itertools import chain

import msgpack

from mesh.wire.errors import ErrorCode, MeshError

try:
    import msgspec
except ImportError:   # the slower path below gives the same verdicts
    msgspec = None

__all__ = ["decode_columns", "check_columns"]

_COLUMN_NAMES = ("values", "keys", "timestamp deltas", "headers")
_decoder = None if msgspec is None else msgspec.msgpack.Decoder(
    tuple[list[bytes | None], list[bytes | None] | None, list[int] | None,
          list[list[tuple[str, bytes | None]]] | None])
_AT_COLUMN = re.compile(r"at `\$\[(\d)\]")

_BYTES_OR_NIL = frozenset({bytes, type(None)})
_INT = frozenset({int})
_ARRAY = frozenset({list, tuple})
_LIST = frozenset({list})
_STR = frozenset({str})
_PAIR = frozenset({2})
_join = b"".join


def _bad(reason: str) -> MeshError:
    return MeshError(ErrorCode.INVALID_RECORD, reason)


def decode_columns(payload) -> tuple:
    """(values, keys, deltas, headers) of a batch payload (bytes or memoryview), types
    checked (module docstring); MeshError(INVALID_RECORD) naming the column otherwise.
    Arrays come as lists (header pairs may be tuples)."""
    if _decoder is not None:
        try:
            return _decoder.decode(payload)
        except msgspec.ValidationError as exc:
            m = _AT_COLUMN.search(str(exc))
            where = f"record {_COLUMN_NAMES[int(m.group(1))]}" if m and int(m.group(1)) < 4 else "batch payload"
            raise _bad(f"{where}: {exc}"[:300]) from None
        except msgspec.DecodeError as exc:
            if "trailing" in str(exc):
                raise _bad("trailing bytes after the record columns") from None
            raise _bad(f"record columns are not valid msgpack ({exc})"[:300]) from None
    return _decode_slow(payload)


def check_columns(cols, record_count: int, first_timestamp_ms: int | None = None,
                  max_timestamp_ms: int | None = None) -> None:
    """Counts (every column nil or ``record_count`` long) and, given the header's first and
    max timestamps, the deltas against them; MeshError(INVALID_RECORD) otherwise."""
    values, keys, deltas, headers = cols
    n = record_count
    if len(values) != n:
        raise _bad(f"the values column has {len(values)} entries, the header says {n} records")
    for col, name in ((keys, "keys"), (deltas, "timestamp deltas"), (headers, "headers")):
        if col is not None and len(col) != n:
            raise _bad(f"the {name} column is neither nil nor {n} entries (record_count)")
    if first_timestamp_ms is None:
        return
    if deltas is None:
        if first_timestamp_ms != max_timestamp_ms:
            raise _bad(f"no timestamp deltas, but the header's timestamps differ "
                       f"({first_timestamp_ms}..{max_timestamp_ms})")
    elif deltas[0] != 0 or first_timestamp_ms + max(deltas) != max_timestamp_ms \
            or first_timestamp_ms + min(deltas) < 0:
        raise _bad(f"timestamp deltas do not match the header's timestamps "
                   f"{first_timestamp_ms}..{max_timestamp_ms} (the first delta must be 0, the largest "
                   f"must reach the max timestamp, and no timestamp may be negative)")


# -- without msgspec -----------------------------------------------------------------------
def _kind(x) -> str:
    """What msgpack calls the type of a decoded ``x``."""
    t = type(x)
    return "array" if t in _ARRAY else "nil" if x is None else t.__name__


def _decode_slow(payload) -> tuple:
    try:
        cols = msgpack.unpackb(payload, raw=False, max_map_len=0, max_ext_len=0)
    except msgpack.ExtraData:
        raise _bad("trailing bytes after the record columns") from None
    except Exception as exc:   # msgpack's errors, bad UTF-8 in a str, a map or ext over its limit
        raise _bad(f"record columns are not valid msgpack of bytes, ints and strs "
                   f"({type(exc).__name__}: {exc})"[:300]) from None
    if type(cols) is not list or len(cols) != 4:
        raise _bad("batch payload is not [values, keys, timestamp deltas, headers]")
    values, keys, deltas, headers = cols
    if type(values) is not list:
        raise _bad(f"record values: the column is {_kind(values)}, not an array")
    _bytes_or_nil(values, "record values")
    if keys is not None:
        if type(keys) is not list:
            raise _bad(f"record keys: the column is {_kind(keys)}, not nil or an array")
        _bytes_or_nil(keys, "record keys")
    if deltas is not None:
        if type(deltas) is not list:
            raise _bad(f"record timestamp deltas: the column is {_kind(deltas)}, not nil or an array")
        if not _INT.issuperset(map(type, deltas)):
            bad = next(x for x in deltas if type(x) is not int)
            raise _bad(f"record timestamp deltas must be ints, not {_kind(bad)}")
    if headers is not None:
        if type(headers) is not list or not _LIST.issuperset(map(type, headers)):
            raise _bad("record headers: each record's headers must be an array of [name, value] pairs")
        pairs = list(chain.from_iterable(headers))
        if pairs:
            # (no type pass over the pairs: a str or bytes "pair" of length 2 flattens into
            # names that are not strs or values that are not bytes, and fails below)
            try:
                pair_lengths_ok = _PAIR.issuperset(map(len, pairs))
            except TypeError:   # an int, a nil
                pair_lengths_ok = False
            if not pair_lengths_ok:
                raise _bad("record headers: each header must be a [name, value] pair")
            flat = list(chain.from_iterable(pairs))   # name, value, name, value...
            if not _STR.issuperset(map(type, flat[0::2])):
                raise _bad("record headers: header names must be strs")
            _bytes_or_nil(flat[1::2], "record headers: header values")
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
