"""The text protocol's lines, without I/O: parsing commands, formatting replies.

``parse_command(line)`` turns one decoded line into a command (``Pubs``, ``Subs``, ``Cons``,
``Help``, ``Quit``) or ``Invalid`` (a known verb with bad arguments, or an unknown verb);
it never raises. The rest of the argument checks depend on the connection's state (its
subscriptions) and stay with the gateway (``mesh.gateway.text``), which raises
``BadCommand`` for them; every ``BadCommand`` is answered ``ERR <reason>``.

The reply lines (bytes, without the newline):

    OK <partition> <offset>          a PUBS acknowledged
    OK <subscription id>             a SUBS made
    <partition> <offset> <json>      one record of a CONS (``record_line``)
    END                              after the records of a CONS, and after HELP
    BYE                              the answer to QUIT
    ERR <reason>                     anything refused; ``ERR <CODE>: <message>`` for broker
                                     errors (``mesh_error_line``)

A PUBS that fails says whether its record may have been stored all the same
(``pubs_error_line``, after ``MeshError.maybe_written``), so a client knows whether a retry
can make a duplicate:

    ERR <CODE> maybe written: <message>   the outcome is unknown (e.g. ``ERR TIMEOUT maybe
                                          written: ...``): the record may be in the log
    ERR <CODE> not written: <message>     the record is certainly not in the log
    ERR <reason>                          the line was refused before anything was sent
                                          (a bad message, a full gateway): not written

Numbers (partitions, offsets) are ASCII digits; an offset is at most ``MAX_OFFSET``
(2**63-1). A PUBS message whose JSON is nested too deeply for the parser, or has a string
that cannot be UTF-8 (a lone surrogate such as ``"\\ud800"``, in a key, body, header name or
header value), is refused with ``ERR`` and a reason saying so.

``record_line`` is total: it formats any record the log holds. A field that is not bytes
(only a low-level client can store one: the broker checks a batch's outer shape, not its
record fields) comes as ``KeyRepr``, ``HeaderRepr`` or ``BodyRepr`` in place of ``Key``,
``Header`` or ``Body``: a string, the Python ``repr()`` of what was stored (``"'text'"``,
``"5"``), so the record is delivered, and seen to be odd, rather than lost. A null value
is ``"Body": null`` (an empty one ``"Body": ""``), a null header value ``null``. (Since the
broker checks record columns, only batches stored by an older broker can be odd.)

See ``mesh.gateway.text`` for the meaning of each command.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Union

from mesh.wire.errors import MeshError

__all__ = [
    "MAX_LINE_BYTES", "HELP", "END", "BYE", "BadCommand",
    "Pubs", "Subs", "Cons", "Help", "Quit", "Invalid", "Command",
    "parse_command", "parse_message", "parse_partitions", "parse_offset",
    "ok_published", "ok_subscribed", "error_line", "mesh_error_line",
    "pubs_error_line", "line_too_long", "NOT_UTF8", "help_lines", "record_line", "MAX_OFFSET",
]

MAX_LINE_BYTES = (1 << 20) + (64 << 10)
MAX_OFFSET = (1 << 63) - 1       # offsets are signed 64-bit on the wire
_MAX_OFFSET_DIGITS = len(str(MAX_OFFSET))
HELP = ["PUBS <topic> <message>                    -> OK <partition> <offset>",
        "SUBS <topic> <group> [<partitions>]       -> OK <subscription id>",
        "CONS <topic> <subscription id> [<offset>] -> records, then END",
        "QUIT"]
END = b"END"
BYE = b"BYE"
NOT_UTF8 = b"ERR the line is not UTF-8"


class BadCommand(Exception):
    """A bad command line: answered ``ERR <reason>``."""


# -- commands --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pubs:
    topic: str
    message: str


@dataclass(frozen=True, slots=True)
class Subs:
    topic: str
    group: str
    partitions: str | None      # "0,3,5-7" (``parse_partitions``), None: join the group


@dataclass(frozen=True, slots=True)
class Cons:
    topic: str
    subscription: str
    offset: str | None          # as typed: checked by ``parse_offset`` once the subscription is known


@dataclass(frozen=True, slots=True)
class Help:
    pass


@dataclass(frozen=True, slots=True)
class Quit:
    pass


@dataclass(frozen=True, slots=True)
class Invalid:
    verb: str                   # upper-cased, as typed
    reason: str


Command = Union[Pubs, Subs, Cons, Help, Quit, Invalid]


def parse_command(line: str) -> Command:
    """One decoded line (no newline, not blank) -> its command. Verbs are case-insensitive;
    arguments are separated by spaces (a PUBS message is everything after the topic)."""
    verb, _, rest = line.lstrip().partition(" ")
    verb = verb.upper()
    if verb == "PUBS":
        topic, _, message = rest.partition(" ")
        if not topic or not message:
            return Invalid(verb, "usage: PUBS <topic> <message>")
        return Pubs(topic, message)
    if verb == "SUBS":
        args = rest.split()
        if len(args) not in (2, 3):
            return Invalid(verb, "usage: SUBS <topic> <group> [<partitions>]")
        return Subs(args[0], args[1], args[2] if len(args) == 3 else None)
    if verb == "CONS":
        args = rest.split()
        if len(args) not in (2, 3):
            return Invalid(verb, "usage: CONS <topic> <subscription id> [<offset>]")
        return Cons(args[0], args[1], args[2] if len(args) == 3 else None)
    if verb == "HELP":
        return Help()
    if verb == "QUIT":
        return Quit()
    return Invalid(verb, f"unknown command {verb[:20]!r}; try HELP")


def parse_message(text: str) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """(key, value, headers) of a PUBS message: a JSON object with any of ``Header``,
    ``Key``, ``Body`` (any case) is a keyed record (see ``mesh.gateway.text``); anything
    else is the value of a record with no key. ``"Body": null`` is a null value (a
    tombstone), a missing ``Body`` an empty one; a header value null is a null header
    value. Header names stay ``str`` (as the producer
    takes them) but are checked to encode as UTF-8, as everything else is here: raises
    ``BadCommand`` for JSON nested too deeply or a string that is not valid UTF-8."""
    if not text.startswith("{"):
        return None, text.encode(), []
    try:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            fields = {k.lower(): v for k, v in obj.items() if isinstance(k, str)}
            if fields.keys() & {"header", "key", "body"}:
                key = fields.get("key")
                body = fields.get("body", "")
                header = fields.get("header")
                if header is None:
                    headers = []
                elif isinstance(header, dict):
                    headers = [(_utf8_name(k), None if v is None else _text_bytes(v, "a header value"))
                               for k, v in header.items()]
                else:
                    headers = [("Header", _text_bytes(header, "the header"))]
                value = None if body is None else _text_bytes(body, "the body")
                return (None if key is None else _text_bytes(key, "the key")), value, headers
    except RecursionError:
        raise BadCommand("the message's JSON is nested too deeply") from None
    return None, text.encode(), []


def _text_bytes(v: Any, what: str) -> bytes:
    if not isinstance(v, str):
        return json.dumps(v, separators=(",", ":")).encode()   # ASCII: non-ASCII is escaped
    try:
        return v.encode()
    except UnicodeEncodeError:
        raise BadCommand(_not_utf8(what)) from None


def _utf8_name(k: str) -> str:
    try:
        k.encode()
    except UnicodeEncodeError:
        raise BadCommand(_not_utf8("a header name")) from None
    return k


def _not_utf8(what: str) -> str:
    return f"{what} is not valid UTF-8 (a lone surrogate such as \\ud800); nothing was sent"


def _natural(text: str) -> int | None:
    """An unsigned ASCII decimal, or None (``str.isdigit`` also takes other digits, e.g. "²")."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0")
    if len(digits) > _MAX_OFFSET_DIGITS:   # beyond any offset; int() refuses 4300+ digits
        return MAX_OFFSET + 1
    return int(digits or "0")


def parse_partitions(spec: str, count: int) -> list[int]:
    """``0,3,5-7`` -> [0, 3, 5, 6, 7], each within [0, count)."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        a = _natural(lo)
        b = _natural(hi) if dash else a
        if a is None or b is None:
            raise BadCommand(f"partitions must look like 0,3,5-7, not {spec[:40]!r}")
        if a > b or b >= count:
            raise BadCommand(f"partitions {part[:40]!r}: the topic has partitions 0..{count - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def parse_offset(text: str) -> int:
    """The ``<offset>`` of a CONS: an integer in [0, ``MAX_OFFSET``]."""
    n = _natural(text)
    if n is None:
        raise BadCommand(f"offset must be a non-negative integer, not {text[:20]!r}")
    if n > MAX_OFFSET:
        raise BadCommand(f"offset must be at most {MAX_OFFSET}, not {text[:20]!r}")
    return n


# -- replies ---------------------------------------------------------------------------
def ok_published(partition: int, offset: int) -> bytes:
    return f"OK {partition} {offset}".encode()


def ok_subscribed(subscription: str) -> bytes:
    return f"OK {subscription}".encode()


def error_line(reason: object) -> bytes:
    return f"ERR {reason}".encode()


def mesh_error_line(exc: MeshError) -> bytes:
    return f"ERR {exc.code.name}: {exc.message}".encode()


def pubs_error_line(exc: BaseException) -> bytes:
    """A PUBS whose record was sent and failed: ``ERR <CODE> maybe written: <message>`` or
    ``ERR <CODE> not written: <message>`` (``MeshError.maybe_written``). Any other
    exception is a wait for the acknowledgement that ran out: the outcome is unknown."""
    if isinstance(exc, MeshError):
        outcome = "maybe written" if exc.maybe_written else "not written"
        return f"ERR {exc.code.name} {outcome}: {exc.message}".encode()
    return f"ERR TIMEOUT maybe written: {str(exc) or 'no acknowledgement'}".encode()


def line_too_long() -> bytes:
    return error_line(f"line longer than {MAX_LINE_BYTES} bytes")


def help_lines() -> list[bytes]:
    return [h.encode() for h in HELP] + [END]


def record_line(r) -> bytes:
    """``<partition> <offset> <json>`` of a consumed record: ``Key`` and ``Header`` when
    present (one header named "Header" is shown as a string), ``Body`` (or ``BodyBase64``
    when the value is not UTF-8) and ``Timestamp``. Total: a field that is not bytes comes
    as ``KeyRepr``/``HeaderRepr``/``BodyRepr`` (see the module docstring); never raises."""
    try:
        obj: dict[str, Any] = {}
        if r.key is not None:
            if _is_bytes(r.key):
                obj["Key"] = _decode(r.key)
            else:
                obj["KeyRepr"] = _repr(r.key)
        if r.headers:
            headers = _headers(r.headers)
            if headers is None:
                obj["HeaderRepr"] = _repr(r.headers)
            elif len(headers) == 1 and headers[0][0] == "Header":
                obj["Header"] = _decode(headers[0][1])
            else:
                obj["Header"] = {k: _decode(v) for k, v in headers}   # (a null header value: null)
        if r.value is None:
            obj["Body"] = None   # a null value (tombstone); an empty one is ""
        elif _is_bytes(r.value):
            try:
                obj["Body"] = bytes(r.value).decode()
            except UnicodeDecodeError:
                obj["BodyBase64"] = base64.b64encode(r.value).decode()
        else:
            obj["BodyRepr"] = _repr(r.value)
        obj["Timestamp"] = r.timestamp
        text = json.dumps(obj, ensure_ascii=False)
        try:
            return f"{r.partition} {r.offset} {text}".encode()
        except UnicodeEncodeError:   # a lone surrogate in a str field: escape it instead
            return f"{r.partition} {r.offset} {json.dumps(obj)}".encode()
    except Exception as exc:   # a last resort (a Record of an unexpected shape): still one valid line
        try:
            where = f"{int(r.partition)} {int(r.offset)}"
        except Exception:
            where = "-1 -1"
        return f"{where} {json.dumps({'BodyRepr': f'<record not shown: {_repr(exc)}>'})}".encode()


def _is_bytes(v: Any) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))


def _headers(hs) -> list[tuple[str, Any]] | None:
    """``hs`` as (name, value) pairs of str and bytes, or None if it is anything else."""
    out = []
    for h in hs:
        if not (isinstance(h, (tuple, list)) and len(h) == 2 and isinstance(h[0], str)
                and (h[1] is None or _is_bytes(h[1]))):
            return None
        out.append((h[0], h[1]))
    return out


def _repr(v: Any) -> str:
    try:
        return repr(v)
    except Exception:   # e.g. RecursionError: nesting deeper than repr goes
        return f"<{type(v).__name__}>"


def _decode(b) -> str | None:
    return None if b is None else bytes(b).decode(errors="replace")
