"""The text protocol's pure line parser and reply formatting (mesh/gateway/protocol.py)."""
from __future__ import annotations

import json

import pytest

from mesh.gateway.protocol import (
    BYE, END, HELP, MAX_LINE_BYTES, MAX_OFFSET, BadCommand, Cons, Help, Invalid, Pubs, Quit, Subs,
    error_line, help_lines, line_too_long, mesh_error_line, ok_published, ok_subscribed,
    parse_command, parse_message, parse_offset, parse_partitions, pubs_error_line, record_line,
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


@pytest.mark.parametrize("text", ["²", "٣", "1²", "０", "3\u0663"])
def test_numbers_are_ascii_digits_only(text):
    # str.isdigit takes these; int() refuses some ("²") and reads others ("٣" as 3)
    with pytest.raises(BadCommand, match="non-negative integer"):
        parse_offset(text)
    with pytest.raises(BadCommand, match="partitions must look like"):
        parse_partitions(text, 8)
    with pytest.raises(BadCommand, match="partitions must look like"):
        parse_partitions(f"0-{text}", 8)


def test_offsets_are_at_most_2_63_minus_1():
    assert parse_offset(str(MAX_OFFSET)) == MAX_OFFSET == 2 ** 63 - 1
    assert parse_offset("0" * 5000 + "7") == 7       # leading zeros are no size
    for big in (str(2 ** 63), str(2 ** 64), "9" * 5000):   # 5000 digits: beyond int()'s limit
        with pytest.raises(BadCommand, match=f"offset must be at most {MAX_OFFSET}"):
            parse_offset(big)
    with pytest.raises(BadCommand, match=r"partitions 0\.\.7"):
        parse_partitions("1" * 5000, 8)               # refused, not an internal error
    with pytest.raises(BadCommand, match=r"partitions 0\.\.7"):
        parse_partitions("0-" + "1" * 5000, 8)


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


@pytest.mark.parametrize("message, what", [
    ('{"Key": "k", "Body": "b", "Header": {"\\ud800": "x"}}', "a header name"),
    ('{"Key": "k", "Body": "b", "Header": {"h": "\\udfff"}}', "a header value"),
    ('{"Header": "\\ud800x"}', "the header"),
    ('{"Key": "\\ud800"}', "the key"),
    ('{"Body": "a\\udc00"}', "the body"),
])
def test_a_string_that_is_not_utf8_is_refused(message, what):
    # a JSON escape can make a lone surrogate, which no UTF-8 encoder takes: refused here,
    # before the producer (whose I/O thread would fail on a header name)
    with pytest.raises(BadCommand, match=f"{what} is not valid UTF-8"):
        parse_message(message)


def test_header_names_are_kept_as_str_and_checked():
    assert parse_message('{"Header": {"\\u00e9t\\u00e9": "x"}, "Body": "b"}') == (None, b"b", [("été", b"x")])
    # a surrogate pair escaped in JSON is one character, valid in UTF-8
    assert parse_message('{"Header": {"\\ud83d\\ude00": "x"}}')[2] == [("\U0001f600", b"x")]


def test_json_nested_too_deeply_is_refused():
    deep = '{"Body": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(BadCommand, match="nested too deeply"):
        parse_message(deep)
    with pytest.raises(BadCommand, match="nested too deeply"):
        parse_message('{"a":' + "[" * 100_000)      # not even valid JSON: refused all the same
    assert parse_message("[" * 100_000) == (None, b"[" * 100_000, [])   # not an object: the value, as is


# -- replies ---------------------------------------------------------------------------
def test_reply_lines():
    assert ok_published(3, 41) == b"OK 3 41"
    assert ok_subscribed("2") == b"OK 2"
    assert error_line(BadCommand("bad thing")) == b"ERR bad thing"
    assert mesh_error_line(MeshError(ErrorCode.UNKNOWN_TOPIC, "unknown topic 'x'")) == \
        b"ERR UNKNOWN_TOPIC: unknown topic 'x'"
    assert line_too_long() == f"ERR line longer than {MAX_LINE_BYTES} bytes".encode()
    assert help_lines() == [h.encode() for h in HELP] + [END]
    assert (END, BYE) == (b"END", b"BYE")


def test_pubs_errors_say_whether_the_record_may_be_written():
    assert pubs_error_line(MeshError(ErrorCode.TIMEOUT, "no answer", maybe_written=True)) == \
        b"ERR TIMEOUT maybe written: no answer"
    assert pubs_error_line(MeshError(ErrorCode.UNKNOWN, "producer I/O failed: x", maybe_written=True)) == \
        b"ERR UNKNOWN maybe written: producer I/O failed: x"
    assert pubs_error_line(MeshError(ErrorCode.MESSAGE_TOO_LARGE, "big")) == b"ERR MESSAGE_TOO_LARGE not written: big"
    assert pubs_error_line(MeshError(ErrorCode.UNKNOWN_TOPIC, "unknown topic 'x'", maybe_written=False)) == \
        b"ERR UNKNOWN_TOPIC not written: unknown topic 'x'"
    # the wait for the acknowledgement ran out: the outcome is unknown
    assert pubs_error_line(TimeoutError()) == b"ERR TIMEOUT maybe written: no acknowledgement"
    assert pubs_error_line(TimeoutError("15 s")) == b"ERR TIMEOUT maybe written: 15 s"


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


def _obj(line: bytes) -> dict:
    p, o, obj = line.split(b" ", 2)
    assert (p, o) == (b"2", b"17")
    obj.decode()        # valid UTF-8
    return json.loads(obj)


class _Deep:
    def __repr__(self):
        raise RecursionError("maximum recursion depth exceeded")


@pytest.mark.parametrize("value, shown", [
    ("a str, not bytes", {"BodyRepr": "'a str, not bytes'"}),
    (5, {"BodyRepr": "5"}),
    (None, {"Body": None}),             # a null value (tombstone): JSON null, not an odd value
    (1.5, {"BodyRepr": "1.5"}),
    ([b"x", {"k": 1}], {"BodyRepr": "[b'x', {'k': 1}]"}),
    ("\ud800", {"BodyRepr": "'\\ud800'"}),     # repr escapes it: the line is valid UTF-8
    (_Deep(), {"BodyRepr": "<_Deep>"}),
    (memoryview(b"\xff"), {"BodyBase64": "/w=="}),
])
def test_a_value_that_is_not_bytes_still_makes_a_line(value, shown):
    # a low-level client can store any msgpack value in a batch's values column
    assert _obj(record_line(_record(value))) == {**shown, "Timestamp": 1234}


def test_keys_and_headers_that_are_not_bytes_still_make_a_line():
    assert _obj(record_line(_record(b"v", key=7))) == {"KeyRepr": "7", "Body": "v", "Timestamp": 1234}
    assert _obj(record_line(_record(b"v", key="k"))) == {"KeyRepr": "'k'", "Body": "v", "Timestamp": 1234}
    assert _obj(record_line(_record(b"v", headers=[("h", None), ("g", b"1")]))) == \
        {"Header": {"h": None, "g": "1"}, "Body": "v", "Timestamp": 1234}   # a null header value
    for headers in ([("h", "str")], [(1, b"x")], [("a", b"1", b"extra")], [("only",)],
                    [["h", 5], ("g", b"ok")]):
        obj = _obj(record_line(_record(b"v", headers=headers)))
        assert obj == {"HeaderRepr": repr(headers), "Body": "v", "Timestamp": 1234}
    # well-formed ones as before, lists or tuples
    assert _obj(record_line(_record(b"v", headers=[["a", b"1"], ("b", bytearray(b"2"))]))) == \
        {"Header": {"a": "1", "b": "2"}, "Body": "v", "Timestamp": 1234}
    # a str field with a lone surrogate (not from msgpack, whose strings are valid UTF-8): escaped
    line = record_line(_record(b"v", headers=[("\ud800", b"x")]))
    assert _obj(line) == {"Header": {"\ud800": "x"}, "Body": "v", "Timestamp": 1234}


def test_record_line_never_raises():
    class Odd:   # a record of an unexpected shape: still one line, saying so
        partition, offset = 2, 17

        @property
        def key(self):
            raise RuntimeError("no key")
    obj = _obj(record_line(Odd()))
    assert list(obj) == ["BodyRepr"] and "no key" in obj["BodyRepr"]
    p, o, obj = record_line(object()).split(b" ", 2)
    assert (p, o) == (b"-1", b"-1") and list(json.loads(obj)) == ["BodyRepr"]


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


def test_a_null_body_is_a_null_value_and_a_missing_one_is_empty():
    assert parse_message('{"Key": "k", "Body": null}') == (b"k", None, [])
    assert parse_message('{"Key": "k"}') == (b"k", b"", [])
    assert parse_message('{"Key": "k", "Body": ""}') == (b"k", b"", [])
    assert parse_message('{"Header": {"a": null, "b": "x"}, "Body": "v"}') == (None, b"v", [("a", None), ("b", b"x")])
    assert _obj(record_line(_record(b""))) == {"Body": "", "Timestamp": 1234}
