"""The compaction rule (storage.compaction) on encoded batches, against a plain model."""
from __future__ import annotations

import zlib
import struct

from hypothesis import given, settings, strategies as st

from mesh.wire.compacted import ATTR_COMPACTED
from mesh.wire.records import encode_batch, iter_batches, parse_header, patch_batch, records_from, validate_batch
from mesh.wire.errors import MeshError
from storage.compaction import compact_batches, kept_offsets

KEYS = [b"k%d" % i for i in range(6)]

writes = st.lists(st.tuples(st.sampled_from(KEYS + [None]), st.one_of(st.none(), st.binary(max_size=4)),
                            st.integers(0, 50)), min_size=1, max_size=60)


def build(ws, sizes):
    """Batches of the writes ``ws`` (key, value, ts delta), split by ``sizes``; offsets from 0."""
    out, i, ts = [], 0, 1000
    sizes = list(sizes) or [1]
    j = 0
    while i < len(ws):
        n = max(1, sizes[j % len(sizes)])
        j += 1
        chunk = ws[i:i + n]
        tss = []
        for _k, _v, d in chunk:
            ts += d
            tss.append(ts)
        raw = encode_batch([v for _k, v, _d in chunk], [k for k, _v, _d in chunk], tss)
        out.append(patch_batch(raw, i, 1))
        i += len(chunk)
    return out


def records(batches):
    out = []
    for b in batches:
        out.extend(records_from("t", 0, b))
    return out


def latest(recs):
    m = {}
    for r in recs:
        if r.key is not None:
            m[r.key] = r.value
    return m


def boundaries(batches):
    return [0] + [parse_header(b).next_offset for b in batches]


@settings(max_examples=300, deadline=None)
@given(writes, st.lists(st.integers(1, 7), min_size=1, max_size=5), st.data())
def test_compacted_log_reads_as_the_model(ws, sizes, data):
    batches = build(ws, sizes)
    cut = data.draw(st.sampled_from(boundaries(batches)))
    horizon = data.draw(st.integers(900, 1000 + 50 * len(ws) + 10))
    before = records(batches)
    after_batches = compact_batches(batches, cut, horizon)
    after = records(after_batches)
    # CRCs valid, boundaries and spans unchanged: the log reads as one contiguous run
    assert boundaries(after_batches) == boundaries(batches)
    for b in after_batches:
        assert zlib.crc32(memoryview(b)[16:]) == struct.unpack_from(">I", b, 12)[0]
    list(iter_batches(b"".join(after_batches)))
    # exactly the model's offsets, each record unchanged
    model = kept_offsets([(r.offset, r.key, r.value, r.timestamp) for r in before], cut, horizon)
    assert [r.offset for r in after] == model
    by_off = {r.offset: r for r in before}
    assert all(by_off[r.offset] == r for r in after)
    # the latest value of every key, minus the keys whose tombstone expired below the cut
    expect = latest(before)
    for k in list(expect):
        newest = max((r for r in before if r.key == k), key=lambda r: r.offset)
        if newest.offset < cut and newest.value is None and newest.timestamp < horizon:
            del expect[k]
    assert latest(after) == expect
    assert all(r.offset >= cut or r.key is None or sum(1 for x in after if x.key == r.key and x.offset < cut) == 1
               for r in after)


@settings(max_examples=200, deadline=None)
@given(writes, st.lists(st.integers(1, 7), min_size=1, max_size=5), st.data())
def test_later_cut_alone_equals_cuts_in_sequence(ws, sizes, data):
    """Why replicas agree whichever earlier cuts they applied (module doc of the rule)."""
    batches = build(ws, sizes)
    bs = boundaries(batches)
    c1 = data.draw(st.sampled_from(bs))
    c2 = data.draw(st.sampled_from([b for b in bs if b >= c1]))
    h1 = data.draw(st.integers(900, 1000 + 50 * len(ws)))
    h2 = data.draw(st.integers(h1, 1000 + 50 * len(ws) + 10))
    twice = compact_batches(compact_batches(batches, c1, h1), c2, h2)
    once = compact_batches(batches, c2, h2)
    assert records(twice) == records(once)
    assert compact_batches(once, c2, h2) == once   # idempotent, byte for byte


def test_a_batch_that_loses_nothing_is_left_as_it_is():
    b = patch_batch(encode_batch([b"1", b"2"], [b"a", b"b"], 5), 0, 1)
    assert compact_batches([b], 2, 0) == [b]


def test_a_batch_emptied_keeps_its_span_and_clients_cannot_send_one():
    b1 = patch_batch(encode_batch([b"1", b"2"], [b"a", b"a"], 5), 0, 1)
    b2 = patch_batch(encode_batch([None], [b"a"], 6), 2, 1)
    out = compact_batches([b1, b2], 3, 100)
    h = parse_header(out[0])
    assert h.attributes & ATTR_COMPACTED and h.record_count == 2 and h.base_offset == 0
    assert records(out) == []
    try:
        validate_batch(out[0], 1 << 20)
    except MeshError:
        pass
    else:
        raise AssertionError("a compacted batch from a client was accepted")
