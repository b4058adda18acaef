"""mesh.gossip.rows and mesh.gossip.parsing: typed rows, their wire layout, validation.

Rows are NamedTuples so that code reads ``row.max_version`` instead of ``row[3]``; the
wire format must stay the positional arrays it always was. These tests pin that: typed
rows encode to the very bytes of the plain lists, and a deterministic 4-node run produces
the same bytes as the positional implementation did (``GOLDEN_TRACE_SHA256``).
"""
from __future__ import annotations

import hashlib
import random

import msgpack
import pytest

from mesh.gossip import Gossip, GossipAck, GossipConfig, GossipSyn
from mesh.gossip.parsing import Malformed, parse_buckets, parse_deltas, parse_registers, parse_rows
from mesh.gossip.rows import (BUCKETS, ENTRY_OVERHEAD, Delta, Row, check_key, entry_size, register_size,
                              size_of)
from mesh.wire.codec import decode_body, encode_body

# ---------------------------------------------------------------- wire layout ----------


def test_typed_rows_encode_exactly_as_the_positional_lists():
    row = Row("a", 1, 2, 3, 0, "addr-a", False, 0)
    delta = Delta("a", 1, 0, 3, 0, False, ["k", 3, {"v": [1, 2]}, False])
    typed = GossipAck("b", [row], [delta], [0] * BUCKETS, ["t", 5, "a", None, True], 0)
    plain = GossipAck("b", [["a", 1, 2, 3, 0, "addr-a", False, 0]],
                      [["a", 1, 0, 3, 0, False, ["k", 3, {"v": [1, 2]}, False]]],
                      [0] * BUCKETS, ["t", 5, "a", None, True], 0)
    assert encode_body(typed) == encode_body(plain)
    assert msgpack.unpackb(encode_body(typed), raw=False) == [
        "b", [["a", 1, 2, 3, 0, "addr-a", False, 0]], [["a", 1, 0, 3, 0, False, ["k", 3, {"v": [1, 2]}, False]]],
        [0] * BUCKETS, ["t", 5, "a", None, True], 0, 0, []]   # wall_ms, rows_hash (mesh-peer/7)
    assert row == ("a", 1, 2, 3, 0, "addr-a", False, 0)          # still a tuple where it matters


def test_a_real_syn_carries_rows_as_eight_element_arrays():
    g = Gossip("a", "addr-a", 4, [], random.Random(1), GossipConfig(), 0)
    syn = decode_body(b"GOSSIP_SYN", encode_body(g._syn()))
    life = syn.digest[0][7]
    assert syn.digest == [["a", 4, 0, 0, 0, "addr-a", False, life]] and 0 < life < 2 ** 32


def _golden_trace() -> str:
    cfg = GossipConfig(dead_after_ms=3_000, tombstone_gc_ms=30_000, max_delta_bytes=2_000)
    nodes = [Gossip(x, f"addr-{x}", 1, ["addr-a"], random.Random(f"golden/{x}"), cfg, 0) for x in "abcd"]
    by_addr = {n.address: n for n in nodes}
    nodes[1].set_local("member", {"rack": "r1"})
    for i in range(30):
        nodes[2].set_local(f"k{i:02d}", "v" * 50)             # more than one message: truncated deltas
    nodes[3].put_cluster("topic/t", {"partitions": 3})
    h = hashlib.sha256()
    now = 0
    for step in range(120):
        now += 50
        if step == 40:
            nodes[2].delete_local("k03")
            nodes[3].delete_cluster("topic/t")
        q = []
        for n in nodes:
            q += [(n.address, s) for s in n.tick(now)]
        while q:
            src, s = q.pop(0)
            body = encode_body(s.msg)
            h.update(src.encode() + s.dest.encode() + type(s.msg).OP + body)
            q += [(s.dest, r) for r in by_addr[s.dest].receive(src, decode_body(type(s.msg).OP, body), now)]
    return h.hexdigest()


# Computed with the positional-tuple implementation before the split into modules, then
# changed on purpose twice: a SYN from a life just begun gets its own row back in the ACK
# (rounds.py, _ECHO_BEATS); rows carry a random life nonce (rows.py, Row.life); SYN and ACK
# carry the sender's wall clock (mesh-peer/7: the clock offset estimate). A change here means the wire bytes or the protocol's choices
# changed: that must be on purpose (and said so in the change), never a side effect of a
# refactoring.
# mesh-peer/7: SYN and ACK end with wall_ms and rows_hash (empty below FULL_DIGEST_ROWS), ACK2 with its digest
GOLDEN_TRACE_SHA256 = "3237955ffa7c4f7da43dddd0da4442516b2bc5819cf939ed139085c64b52000d"


def test_a_deterministic_run_sends_the_same_bytes_as_before_the_typed_rows():
    assert _golden_trace() == GOLDEN_TRACE_SHA256


# ---------------------------------------------------------------- parsing --------------

def test_parse_rows_gives_typed_rows_by_node():
    rows = parse_rows([["a", 1, 2, 3, 4, "addr-a", False, 0], ("b", 2, 0, 0, 0, "addr-b", True, 0)], 10)
    assert list(rows) == ["a", "b"]                           # the sender's order
    a, b = rows["a"], rows["b"]
    assert type(a) is Row and a.generation == 1 and a.heartbeat == 2 and a.max_version == 3
    assert a.gc_version == 4 and a.address == "addr-a" and a.left is False
    assert b.left is True and b == ("b", 2, 0, 0, 0, "addr-b", True, 0)
    assert parse_rows([], 10) == {}


@pytest.mark.parametrize("digest,limit", [
    ("not a list", 10),
    ([["a", 1, 2, 3, 4, "addr-a", False, 0]] * 2, 10),                # duplicate node
    ([["a", 1, 2, 3, 4, "addr-a"]], 10),                            # six fields
    ([["a", 1, 2, 3, 4, "addr-a", False, 9, 9]], 10),               # nine fields
    ([["a", 1, 2, 3, 4, "addr-a", False]], 10),                     # seven fields (no life)
    ([["a", 1, 2, 3, 4, "addr-a", False, -1]], 10),                 # a life out of range
    ([["a", 1, 2, 3, 4, "addr-a", False, 2 ** 32]], 10),
    ([["a", 1, 2, 3, 4, "addr-a", 0, 0]], 10),                      # left must be a bool
    ([["a", True, 2, 3, 4, "addr-a", False, 0]], 10),                  # a bool is not an int here
    ([["a", 1.0, 2, 3, 4, "addr-a", False, 0]], 10),
    ([5], 10),                                                      # a row that is not a list
    ([["a", 1, 2, 3, 4, "addr-a", False, 0], ["b", 1, 2, 3, 4, "addr-b", False, 0]], 1),   # over the limit
])
def test_parse_rows_refuses_malformed_digests(digest, limit):
    with pytest.raises(Malformed):
        parse_rows(digest, limit)


def test_parse_deltas_gives_typed_deltas_and_entry_sizes():
    ((d, sizes),) = parse_deltas([["a", 1, 2, 5, 1, False, ["k", 3, [1, 2], False, "j", 5, None, True]]], 10)
    assert type(d) is Delta
    assert (d.origin, d.generation, d.from_version, d.upto_version, d.gc_version, d.reset) == ("a", 1, 2, 5, 1, False)
    assert d.entries == ["k", 3, [1, 2], False, "j", 5, None, True]
    assert sizes == [entry_size("k", [1, 2]), entry_size("j", None)]


@pytest.mark.parametrize("delta", [
    ["a", 1, 0, 5, 0, False],                                       # six fields
    ["a", 1, 0, 5, 0, 0, []],                                       # reset must be a bool
    ["a", -1, 0, 5, 0, False, []],                                  # negative generation
    ["a", 1, 5, 4, 0, False, []],                                   # upto below from
    ["a", 1, 0, 5, 0, False, ["k", 1, 1]],                          # entries not a multiple of 4
    ["a", 1, 0, 5, 0, False, ["k", 3, 1, False, "j", 2, 1, False]],  # versions not ascending
    ["a", 1, 2, 5, 0, False, ["k", 2, 1, False]],                   # version not above from
    ["a", 1, 0, 2, 0, False, ["k", 3, 1, False]],                   # entry beyond upto
    ["a", 1, 0, 5, 0, False, [1, 3, 1, False]],                     # key not a string
    ["a", 1, 0, 5, 0, False, ["k", 3, 1, 0]],                       # deleted not a bool
    ["a", 1, 0, 5, 0, False, ["k", 3, object(), False]],            # value not msgpack data
])
def test_parse_deltas_refuses_malformed_deltas(delta):
    with pytest.raises(Malformed):
        parse_deltas([delta], 10)


def test_parse_registers_and_buckets():
    ents, sizes = parse_registers(["topic/t", 7, "a", {"p": 1}, False, "topic/u", 8, "b", None, True], 10)
    assert ents[5:] == ["topic/u", 8, "b", None, True]
    assert sizes == [register_size("topic/t", {"p": 1}, "a"), register_size("topic/u", None, "b")]
    assert parse_buckets([]) is None and parse_buckets([1] * BUCKETS) == [1] * BUCKETS
    for bad in (["k", 1, "w", 1], ["", 1, "w", None, False], ["k", -1, "w", None, False],
                ["k", 1, 2, None, False], ["k" * 2_000, 1, "w", None, False]):
        with pytest.raises(Malformed):
            parse_registers(bad, 10)
    with pytest.raises(Malformed):
        parse_registers(["k", 1, "w", None, False] * 3, 2)
    for bad in ([1, 2, 3], [-1] * BUCKETS, ["x"] * BUCKETS):
        with pytest.raises(Malformed):
            parse_buckets(bad)


def test_a_malformed_row_in_a_syn_leaves_the_state_untouched():
    g = Gossip("a", "addr-a", 1, [], random.Random(1), GossipConfig(), 0)
    v = g.version
    assert g.receive("addr-x", GossipSyn("x", [["x", 1, 0, 0, 0, "addr-x", "no"]], [], 0), 0) == []
    assert g.stats["malformed"] == 1 and g.version == v and g.status_of("x") is None


# ---------------------------------------------------------------- sizes ----------------

def test_sizes_and_keys():
    assert size_of(None) == 1 and size_of(5) == 1 and size_of(1_000) == 9 and size_of("ab") == 7
    assert size_of([1, "ab"]) == 5 + 1 + 7 and size_of({"a": 1}) == 5 + 6 + 1
    assert entry_size("k", 1) == ENTRY_OVERHEAD + 6 + 1
    with pytest.raises(ValueError):
        entry_size("k", "x" * 100, limit_bytes=50)
    with pytest.raises(TypeError):
        size_of({1, 2})
    with pytest.raises(TypeError):
        size_of([[[[]]]], depth=30)
    for bad in ("", 5, "k" * 1_025):
        with pytest.raises(ValueError):
            check_key(bad)
