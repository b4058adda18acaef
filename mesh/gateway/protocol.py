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
    "ok_published", "ok_subscribed", "error_line", "mesh_error_line", "timeout_line",
    "line_too_long", "NOT_UTF8", "help_lines", "record_line",
]

MAX_LINE_BYTES = (1 << 20) + (64 << 10)
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


def parse_message(text: str) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of a PUBS message: a JSON object with any of ``Header``,
    ``Key``, ``Body`` (any case) is a keyed record (see ``mesh.gateway.text``); anything
    else is the value of a record with no key."""
    if text.startswith("{"):
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
                    headers = [(str(k), _text_bytes(v)) for k, v in header.items()]
                else:
                    headers = [("Header", _text_bytes(header))]
                return (None if key is None else _text_bytes(key)), _text_bytes(body), headers
    return None, text.encode(), []


def _text_bytes(v: Any) -> bytes:
    return (v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))).encode()


def parse_partitions(spec: str, count: int) -> list[int]:
    """``0,3,5-7`` -> [0, 3, 5, 6, 7], each within [0, count)."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise BadCommand(f"partitions must look like 0,3,5-7, not {spec[:40]!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a > b or b >= count:
            raise BadCommand(f"partitions {part!r}: the topic has partitions 0..{count - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def parse_offset(text: str) -> int:
    """The ``<offset>`` of a CONS: a non-negative integer."""
    if not text.isdigit():
        raise BadCommand(f"offset must be a non-negative integer, not {text[:20]!r}")
    return int(text)


# -- replies ---------------------------------------------------------------------------
def ok_published(partition: int, offset: int) -> bytes:
    return f"OK {partition} {offset}".encode()


def ok_subscribed(subscription: str) -> bytes:
    return f"OK {subscription}".encode()


def error_line(reason: object) -> bytes:
    return f"ERR {reason}".encode()


def mesh_error_line(exc: MeshError) -> bytes:
    return f"ERR {exc.code.name}: {exc.message}".encode()


def timeout_line(exc: object) -> bytes:
    """A PUBS whose acknowledgement did not come in time."""
    return f"ERR TIMEOUT: {exc or 'no acknowledgement'}".encode()


def line_too_long() -> bytes:
    return error_line(f"line longer than {MAX_LINE_BYTES} bytes")


def help_lines() -> list[bytes]:
    return [h.encode() for h in HELP] + [END]


def record_line(r) -> bytes:
    """``<partition> <offset> <json>`` of a consumed record: ``Key`` and ``Header`` when
    present (one header named "Header" is shown as a string), ``Body`` (or ``BodyBase64``
    when the value is not UTF-8) and ``Timestamp``."""
    obj: dict[str, Any] = {}
    if r.key is not None:
        obj["Key"] = _decode(r.key)
    if r.headers:
        if len(r.headers) == 1 and r.headers[0][0] == "Header":
            obj["Header"] = _decode(r.headers[0][1])
        else:
            obj["Header"] = {k: _decode(v) for k, v in r.headers}
    try:
        obj["Body"] = r.value.decode()
    except UnicodeDecodeError:
        obj["BodyBase64"] = base64.b64encode(r.value).decode()
    obj["Timestamp"] = r.timestamp
    return f"{r.partition} {r.offset} {json.dumps(obj, ensure_ascii=False)}".encode()


def _decode(b: bytes) -> str:
    return b.decode(errors="replace")
