"""The text protocol's pure line parser and reply formatting (mesh/gateway/protocol.py)."""
from __future__ import annotations

import json

import pytest

from mesh.gateway.protocol import (
    BYE, END, HELP, MAX_LINE_BYTES, BadCommand, Cons, Help, Invalid, Pubs, Quit, Subs,
    error_line, help_lines, line_too_long, mesh_error_line, ok_published, ok_subscribed,
    parse_command, parse_message, parse_offset, parse_partitions, record_line, timeout_line,
)
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import Record


# -- commands --------------------------------------------------------------------------
def test_pubs_keeps_the_whole_message_after_the_topic():
    assert parse_command("PUBS orders hello  big world ") == Pubs("orders", "hello  big world ")
    assert parse_command('pubs t {"Key": "k", "Body": "b"}') == Pubs("t", '{"Key": "k", "Body": "b"}')


@pytest.mark.parametrize("line", ["PUBS", "PUBS orders", "PUBS orders ", "PUBS  orders hello"])
def test_pubs_without_topic_or_message_is_a_usage_error(line):
    assert parse_command(line) == Invalid("PUBS", "usage: PUBS <topic> <message>")


def test_subs_with_and_without_partitions():
    assert parse_command("SUBS t g") == Subs("t", "g", None)
    assert parse_command("  subs   t   g   0,3,5-7 ") == Subs("t", "g", "0,3,5-7")
    for line in ("SUBS t", "SUBS t g 1 2", "SUBS"):
        assert parse_command(line) == Invalid("SUBS", "usage: SUBS <topic> <group> [<partitions>]")


def test_cons_keeps_the_offset_as_typed():
    assert parse_command("CONS t 1") == Cons("t", "1", None)
    assert parse_command("Cons t 1 42") == Cons("t", "1", "42")
    assert parse_command("CONS t 1 -3") == Cons("t", "1", "-3")   # checked later: parse_offset
    assert parse_command("CONS t") == Invalid("CONS", "usage: CONS <topic> <subscription id> [<offset>]")


def test_help_quit_and_unknown_verbs():
    assert parse_command("help") == Help()
    assert parse_command("HELP me") == Help()
    assert parse_command("quit") == Quit()
    assert parse_command("frob x") == Invalid("FROB", "unknown command 'FROB'; try HELP")
    long_verb = "x" * 50
    assert parse_command(long_verb).reason == f"unknown command {long_verb.upper()[:20]!r}; try HELP"


def test_offsets():
    assert parse_offset("0") == 0 and parse_offset("120") == 120
    for bad in ("-1", "1.5", "x", ""):
        with pytest.raises(BadCommand, match="non-negative integer"):
            parse_offset(bad)


def test_partition_lists():
    assert parse_partitions("0,3,5-7", 8) == [0, 3, 5, 6, 7]
    assert parse_partitions("2", 3) == [2]              # one partition id, not a count
    assert parse_partitions("1-1, 0", 2) == [0, 1]
    for spec in ("a", "1-", "-1", "3-2", "0,,1"):
        with pytest.raises(BadCommand, match="partitions"):
            parse_partitions(spec, 8)
    with pytest.raises(BadCommand, match=r"partitions 0\.\.3"):
        parse_partitions("4", 4)


# -- messages --------------------------------------------------------------------------
def test_plain_text_is_a_value_without_key():
    assert parse_message("hello world") == (None, b"hello world", [])
    assert parse_message("{not json") == (None, b"{not json", [])
    assert parse_message('{"other": 1}') == (None, b'{"other": 1}', [])   # no known field
    assert parse_message("[1, 2]") == (None, b"[1, 2]", [])


def test_json_fields_make_key_value_and_headers():
    assert parse_message('{"Header": "h", "Key": "124", "Body": "Hello World!"}') == \
        (b"124", b"Hello World!", [("Header", b"h")])
    assert parse_message('{"key": 7, "body": {"a": 1}}') == (b"7", b'{"a":1}', [])
    assert parse_message('{"Header": {"x": "1", "y": 2}}') == (None, b"", [("x", b"1"), ("y", b"2")])


# -- replies ---------------------------------------------------------------------------
def test_reply_lines():
    assert ok_published(3, 41) == b"OK 3 41"
    assert ok_subscribed("2") == b"OK 2"
    assert error_line(BadCommand("bad thing")) == b"ERR bad thing"
    assert mesh_error_line(MeshError(ErrorCode.UNKNOWN_TOPIC, "unknown topic 'x'")) == \
        b"ERR UNKNOWN_TOPIC: unknown topic 'x'"
    assert timeout_line("") == b"ERR TIMEOUT: no acknowledgement"
    assert timeout_line(TimeoutError("5 s")) == b"ERR TIMEOUT: 5 s"
    assert timeout_line("slow") == b"ERR TIMEOUT: slow"
    assert line_too_long() == f"ERR line longer than {MAX_LINE_BYTES} bytes".encode()
    assert help_lines() == [h.encode() for h in HELP] + [END]
    assert (END, BYE) == (b"END", b"BYE")


def _record(value: bytes, key=None, headers=None) -> Record:
    return Record("t", 2, 17, 1234, key, value, headers or [])


def test_record_lines():
    line = record_line(_record(b"hi", key=b"k", headers=[("Header", b"h")]))
    p, o, obj = line.decode().split(" ", 2)
    assert (p, o) == ("2", "17")
    assert json.loads(obj) == {"Key": "k", "Header": "h", "Body": "hi", "Timestamp": 1234}
    obj = json.loads(record_line(_record(b"\xff\x00", headers=[("a", b"1"), ("b", b"2")])).split(b" ", 2)[2])
    assert obj == {"Header": {"a": "1", "b": "2"}, "BodyBase64": "/wA=", "Timestamp": 1234}
    assert "Key" not in json.loads(record_line(_record(b"x")).split(b" ", 2)[2])
    assert "é" in record_line(_record("é".encode())).decode()     # not escaped


def test_a_pubs_round_trip_matches_the_record_line():
    cmd = parse_command('PUBS t {"Key": "k", "Header": "h", "Body": "b"}')
    key, value, headers = parse_message(cmd.message)
    obj = json.loads(record_line(_record(value, key=key, headers=headers)).split(b" ", 2)[2])
    assert obj == {"Key": "k", "Header": "h", "Body": "b", "Timestamp": 1234}


@pytest.mark.parametrize("limit", ["max_connections", "idle_timeout_ms", "max_subscriptions",
                                   "max_subscriptions_per_connection", "max_sockets"])
def test_the_gateway_refuses_limits_that_are_not_positive(limit):
    from mesh.gateway.text import TextGateway
    with pytest.raises(ValueError, match=limit):
        TextGateway("127.0.0.1:1", 0, **{limit: 0})   # refused before anything is bound
