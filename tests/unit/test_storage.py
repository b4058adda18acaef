"""The LMDB store and its in-memory twin behave the same (parametrized over both)."""
import os

import pytest

from mesh.wire.records import encode_batch, records_from
from storage.base import CorruptBatch, StorageFull
from storage.log import Store
from storage.memory import MemoryStore


@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    if request.param == "lmdb":
        s = Store(str(tmp_path / "db"), map_size=64 << 20)
    else:
        s = MemoryStore()
    yield s
    s.close()


def reopen(s, tmp_path):
    if isinstance(s, MemoryStore):
        return s.crash()
    s.close()
    return Store(str(tmp_path / "db"), map_size=64 << 20)


def append(s, pid, values, epoch=0):
    b = encode_batch(values)
    return s.stage_append(pid, b, epoch, len(values))


def offsets(chunks, topic="t", part=0, start=0):
    return [r.offset for c in chunks for r in records_from(topic, part, c, start)]


def test_append_assigns_offsets_and_reads_from_any_offset(store):
    pid = store.partition_id("t", 0)
    assert append(store, pid, [b"a", b"b", b"c"]) == (0, 3)
    assert append(store, pid, [b"d", b"e"]) == (3, 5)
    store.commit()
    assert (store.log_start(pid), store.log_end(pid)) == (0, 5)
    # one seek finds the batch that holds the offset, even mid-batch
    assert offsets(store.read(pid, 1, 1 << 20, 5), start=1) == [1, 2, 3, 4]
    assert offsets(store.read(pid, 4, 1 << 20, 5), start=4) == [4]
    assert store.read(pid, 5, 1 << 20, 5) == []
    # the limit (high watermark) is respected
    assert offsets(store.read(pid, 0, 1 << 20, 3)) == [0, 1, 2]


def test_partitions_do_not_mix(store):
    p0, p1 = store.partition_id("t", 0), store.partition_id("t", 1)
    assert p0 != p1 and store.partition_id("t", 0) == p0
    append(store, p0, [b"x"] * 3)
    append(store, p1, [b"y"] * 2)
    store.commit()
    assert [r.value for c in store.read(p1, 0, 1 << 20, 10) for r in records_from("t", 1, c)] == [b"y", b"y"]
    assert store.read(store.partition_id("u", 0), 0, 1 << 20, 10) == []


def test_max_bytes_returns_at_least_one_batch(store):
    pid = store.partition_id("t", 0)
    for _ in range(5):
        append(store, pid, [b"v" * 100] * 10)
    store.commit()
    assert len(store.read(pid, 0, 1, 50)) == 1
    assert len(store.read(pid, 0, 3 * 1200, 50)) in (2, 3)


def test_uncommitted_is_invisible_and_lost_on_crash(store, tmp_path):
    pid = store.partition_id("t", 0)
    append(store, pid, [b"a"])
    store.commit()
    append(store, pid, [b"b"])  # staged only
    assert store.read(pid, 0, 1 << 20, 10) and offsets(store.read(pid, 0, 1 << 20, 10)) == [0]
    s2 = reopen(store, tmp_path)  # LMDB: the open transaction dies with the process
    assert s2.log_end(pid) == 1
    assert offsets(s2.read(pid, 0, 1 << 20, 10)) == [0]


def test_recovery_rebuilds_offsets(store, tmp_path):
    pid = store.partition_id("t", 0)
    append(store, pid, [b"a"] * 4)
    append(store, pid, [b"b"] * 6)
    store.commit()
    s2 = reopen(store, tmp_path)
    assert (s2.log_start(pid), s2.log_end(pid)) == (0, 10)
    assert s2.partition_id("t", 0) == pid
    assert s2.size_bytes(pid) == store.size_bytes(pid)
    assert offsets(s2.read(pid, 7, 1 << 20, 10), start=7) == [7, 8, 9]


def test_rollback_restores_everything(store):
    pid = store.partition_id("t", 0)
    append(store, pid, [b"a"] * 2)
    store.commit()
    append(store, pid, [b"b"] * 3)
    store.rollback()
    assert store.log_end(pid) == 2
    assert append(store, pid, [b"c"]) == (2, 3)


def test_truncate_drops_a_suffix(store):
    pid = store.partition_id("t", 0)
    for _ in range(4):
        append(store, pid, [b"a"] * 5)
    store.commit()
    store.stage_truncate(pid, 10)
    store.commit()
    assert store.log_end(pid) == 10
    assert offsets(store.read(pid, 0, 1 << 20, 100)) == list(range(10))
    assert append(store, pid, [b"z"]) == (10, 11)


def test_retention_by_bytes_and_time(store, tmp_path):
    pid = store.partition_id("t", 0)
    for i in range(10):
        store.stage_append(pid, encode_batch([b"v" * 100] * 10, timestamps_ms=1000 * i), 0, 10)
    store.commit()
    size = store.size_bytes(pid)
    start = store.stage_retention(pid, now_ms=10**9, retention_ms=-1, retention_bytes=size // 2)
    store.commit()
    assert start == 50 and store.log_start(pid) == 50 and store.size_bytes(pid) <= size // 2 + 1200
    assert offsets(store.read(pid, 50, 1 << 20, 100), start=50)[0] == 50
    # by time: batches whose max timestamp is older than now - retention_ms go; the last one stays
    start = store.stage_retention(pid, now_ms=8500, retention_ms=1000, retention_bytes=None)
    store.commit()
    assert start == 80
    s2 = reopen(store, tmp_path)
    assert s2.log_start(pid) == 80 and s2.log_end(pid) == 100


def test_forget_partition(store):
    pid = store.partition_id("t", 0)
    append(store, pid, [b"a"])
    store.commit()
    store.forget_partition("t", 0)
    store.commit()
    assert store.log_end(pid) == 0
    assert store.partition_id("t", 0) != pid


def test_full_store_refuses_the_turn_and_keeps_serving(tmp_path):
    s = Store(str(tmp_path / "small"), map_size=1 << 20)
    pid = s.partition_id("t", 0)
    append(s, pid, [b"a" * 100])
    s.commit()
    with pytest.raises(StorageFull):
        for _ in range(100):
            append(s, pid, [b"x" * 10_000] * 10)
    with pytest.raises(StorageFull):  # the failed turn stays failed until commit
        s.commit()
    assert s.log_end(pid) == 1
    assert offsets(s.read(pid, 0, 1 << 20, 1)) == [0]
    assert append(s, pid, [b"small"]) == (1, 2)
    s.commit()
    s.close()


def test_corrupt_batch_is_found_not_served(tmp_path):
    path = tmp_path / "db"
    s = Store(str(path), map_size=64 << 20)
    pid = s.partition_id("t", 0)
    append(s, pid, [b"MARKER-%03d" % i for i in range(50)])
    s.commit()
    s.close()
    data = bytearray((path / "data.mdb").read_bytes())
    at = data.find(b"MARKER-025")
    assert at > 0
    data[at] ^= 0x20
    (path / "data.mdb").write_bytes(bytes(data))
    s = Store(str(path), map_size=64 << 20)
    with pytest.raises(CorruptBatch):
        s.read(pid, 0, 1 << 20, 50)
    s.close()


# ---------------------------------------------------------------- batch checks --------------

def _flip_header_base(path, marker):
    """Rewrite the stored base offset of the batch holding ``marker`` (its CRC stays valid:
    the CRC does not cover the base offset)."""
    data = bytearray((path / "data.mdb").read_bytes())
    at = data.find(marker)
    assert at > 0
    for hdr in range(at - 56, max(0, at - 4096), -1):
        if data[hdr + 16] == 1 and int.from_bytes(data[hdr + 52:hdr + 56], "big") > 0 and \
                int.from_bytes(data[hdr:hdr + 8], "big") == 3:
            data[hdr + 7] ^= 0x40
            (path / "data.mdb").write_bytes(bytes(data))
            return
    raise AssertionError("header not found")


def test_a_header_base_offset_that_is_not_its_key_is_corrupt_on_read_and_at_recovery(tmp_path):
    path = tmp_path / "db"
    s = Store(str(path), map_size=64 << 20)
    pid = s.partition_id("t", 0)
    append(s, pid, [b"a"] * 3)
    append(s, pid, [b"BASE-MARK"] * 2)
    append(s, pid, [b"c"] * 2)
    s.commit()
    s.close()
    _flip_header_base(path, b"BASE-MARK")
    s = Store(str(path), map_size=64 << 20)
    assert s.take_corrupt() == [(pid, 3)]          # found by recovery's scan, reported once
    assert offsets(s.read(pid, 0, 1 << 20, 7)) == [0, 1, 2]   # what precedes it is served
    with pytest.raises(CorruptBatch) as e:
        s.read(pid, 3, 1 << 20, 7)
    assert (e.value.pid, e.value.offset) == (pid, 3) and "says it starts at" in str(e.value)
    for _ in range(100):                          # found again and again: noted once
        with pytest.raises(CorruptBatch):
            s.read(pid, 3, 1 << 20, 7)
    assert s.take_corrupt() == []
    s.stage_truncate(pid, 3)                      # the repair: truncate and refill
    s.commit()
    assert s.corrupt == {}
    s.close()


def test_a_crc_failure_is_noted_once(tmp_path):
    path = tmp_path / "db"
    s = Store(str(path), map_size=64 << 20)
    pid = s.partition_id("t", 0)
    append(s, pid, [b"MARKER-%03d" % i for i in range(50)])
    append(s, pid, [b"tail"])
    s.commit()
    s.close()
    data = bytearray((path / "data.mdb").read_bytes())
    data[data.find(b"MARKER-025")] ^= 0x20
    (path / "data.mdb").write_bytes(bytes(data))
    s = Store(str(path), map_size=64 << 20)
    assert s.take_corrupt() == []                 # recovery checks the tail batch's CRC only
    for _ in range(10):
        with pytest.raises(CorruptBatch):
            s.read(pid, 0, 1 << 20, 51)
    assert s.take_corrupt() == [(pid, 0)]
    s.close()


# ---------------------------------------------------------------- data directory ------------

from storage import datadir  # noqa: E402


def _store_dir(tmp_path, node="n1", **kw):
    return datadir.open_data_dir(str(tmp_path / "d"), node, map_size=64 << 20, **kw)


def _close(o):
    o.store.close()
    o.data_dir.unlock()


def test_identity_is_created_then_generations_grow(tmp_path):
    o = _store_dir(tmp_path)
    assert o.lost is None and o.identity.generation == 1
    sid = o.identity.store_id
    _close(o)
    o = _store_dir(tmp_path)
    assert o.lost is None and o.identity.generation == 2 and o.identity.store_id == sid
    assert datadir.read_identity(str(tmp_path / "d")).generation == 2
    assert o.store.get("meta", b"store_id") == sid.encode()
    _close(o)


def test_a_second_broker_on_the_directory_is_refused(tmp_path):
    o = _store_dir(tmp_path)
    with pytest.raises(datadir.DataDirLocked, match="in use by another broker"):
        _store_dir(tmp_path)
    _close(o)
    _close(_store_dir(tmp_path))   # the lock went with the first


def test_a_second_broker_is_refused_even_after_the_lock_file_is_deleted(tmp_path):
    o = _store_dir(tmp_path)
    os.remove(tmp_path / "d" / datadir.LOCK_FILE)   # a clean-up of *.lock, say
    with pytest.raises(datadir.DataDirLocked, match="in use by another broker"):
        _store_dir(tmp_path)
    _close(o)


def test_another_nodes_directory_is_refused(tmp_path):
    _close(_store_dir(tmp_path, "n1"))
    with pytest.raises(datadir.DataDirDamaged, match="belongs to node 'n1'"):
        _store_dir(tmp_path, "n2")


def test_an_empty_or_older_store_than_the_identity_lost_state(tmp_path, tmp_path_factory):
    d = tmp_path / "d"
    _close(_store_dir(tmp_path))
    old = tmp_path_factory.mktemp("copy")
    for f in ("data.mdb", "identity.json"):
        (old / f).write_bytes((d / f).read_bytes())
    o = _store_dir(tmp_path)
    sid = o.identity.store_id
    _close(o)
    (d / "data.mdb").write_bytes((old / "data.mdb").read_bytes())   # roll LMDB back, keep the identity
    o = _store_dir(tmp_path)
    assert o.lost and "older" in o.lost and o.identity.generation == 3 and o.identity.store_id != sid
    assert o.identity.recovering
    _close(o)
    # still recovering at the next start (nothing cleared it)
    o = _store_dir(tmp_path)
    assert o.lost and "refilling" in o.lost
    datadir.update_identity(o, recovering=False)
    _close(o)
    o = _store_dir(tmp_path)
    assert o.lost is None
    _close(o)
    (d / "data.mdb").unlink()
    (d / "lock.mdb").unlink()
    o = _store_dir(tmp_path)
    assert o.lost and "empty" in o.lost and o.identity.generation == 6
    _close(o)


def test_a_truncated_store_is_refused_and_rejoin_empty_moves_it_aside(tmp_path):
    o = _store_dir(tmp_path)
    pid = o.store.partition_id("t", 0)
    for _ in range(50):
        append(o.store, pid, [b"x" * 1000] * 10)
    o.store.commit()
    _close(o)
    f = tmp_path / "d" / "data.mdb"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(datadir.DataDirDamaged, match="truncated.*--rejoin-empty"):
        _store_dir(tmp_path)
    o = _store_dir(tmp_path, rejoin_empty=True)
    assert o.lost and o.moved_to and o.identity.generation == 2 and o.identity.recovering
    assert o.store.log_end(pid) == 0
    moved = tmp_path / o.moved_to.rsplit("/", 1)[1]
    assert (moved / "data.mdb").stat().st_size == size // 2      # kept, never deleted
    _close(o)


@pytest.mark.parametrize("key, value", [(b"generation", b"2\xff"), (b"generation", b"-3"),
                                        (b"store_id", b"\xfe\xff")])
def test_a_garbled_identity_in_lmdb_is_a_clear_error_and_rejoin_empty_moves_it_aside(tmp_path, key, value):
    o = _store_dir(tmp_path)
    o.store.put("meta", key, value)   # a flipped byte in the store's own identity records
    o.store.commit()
    _close(o)
    with pytest.raises(datadir.DataDirDamaged, match="identity in LMDB is garbled.*--rejoin-empty"):
        _store_dir(tmp_path)
    o = _store_dir(tmp_path, rejoin_empty=True)
    assert o.lost and o.moved_to and o.identity.recovering
    _close(o)
    o = _store_dir(tmp_path)   # and it starts normally from then on
    assert o.moved_to is None
    _close(o)


@pytest.mark.parametrize("damage", ["magic", "root", "short"])
def test_damaged_meta_pages_are_a_clear_error(tmp_path, damage):
    o = _store_dir(tmp_path)
    pid = o.store.partition_id("t", 0)
    append(o.store, pid, [b"x"] * 10)
    o.store.commit()
    _close(o)
    f = tmp_path / "d" / "data.mdb"
    data = bytearray(f.read_bytes())
    if damage == "magic":
        for page in (0, 4096):
            data[page + 16] ^= 0xFF
    elif damage == "root":          # the main root page number, in both metas, out of range
        for page in (0, 4096):
            data[page + 16 + 24 + 48 + 40 + 6] = 0x7F
    else:
        data = data[:5000]
    f.write_bytes(bytes(data))
    with pytest.raises(datadir.DataDirDamaged, match="--rejoin-empty"):
        _store_dir(tmp_path)


# ---------------------------------------------------------------- flipped keys and epochs ---
# Each case damages a real data.mdb the way a bad disk would, then checks that the store
# never serves a wrong record silently: every read either raises CorruptBatch or returns
# batches that hold exactly the offsets asked for, and the damage is reported.

import struct  # noqa: E402

from storage.base import key_of  # noqa: E402


def _three_batches(path, epochs=(1, 1, 1)):
    s = Store(str(path), map_size=64 << 20)
    pid = s.partition_id("t", 0)
    for n, epoch, tag in zip((3, 2, 2), epochs, (b"A", b"B", b"C")):
        append(s, pid, [b"EPOCH-MARK-" + tag] * n, epoch=epoch)
    s.commit()            # one transaction: few stale copies of the pages in the file
    s.close()
    return pid


def _replace_all(path, old: bytes, new: bytes) -> None:
    data = (path / "data.mdb").read_bytes()
    assert old in data
    (path / "data.mdb").write_bytes(data.replace(old, new))


def _served_or_refused(s, pid, end):
    """Every read from 0..end either raises or returns exactly contiguous offsets from there."""
    refused = 0
    for o in range(end):
        try:
            got = offsets(s.read(pid, o, 1 << 20, end))
        except CorruptBatch:
            refused += 1
            continue
        first = next(i for i in range(len(got)) if got[i] >= o) if got and got[-1] >= o else None
        assert first is not None, f"offset {o}: nothing served below the log end {end}"
        assert got[first:] == list(range(o, o + len(got) - first)), f"offset {o}: served {got}"
    return refused


@pytest.mark.parametrize("flip", [
    ("offset-in-order", 1, 3, 1, 4),       # the key of the batch at 3 now says 4
    ("offset-out-of-order", 1, 3, 1, 67),  # ... says 67 (the page's key order is broken too)
    ("pid-middle", 1, 3, 0, 3),            # the batch at 3 moved to partition id 0
    ("offset-inside-previous", 1, 5, 1, 4),  # the key of the batch at 5 now lies inside 3..4
])
def test_a_flipped_key_byte_is_found_not_served(tmp_path, flip):
    _, pid0, off0, pid1, off1 = flip
    path = tmp_path / "db"
    pid = _three_batches(path)
    assert pid == pid0
    _replace_all(path, key_of(pid0, off0), key_of(pid1, off1))
    s = Store(str(path), map_size=64 << 20)
    noted = s.take_corrupt()
    assert noted and all(p == pid or p == pid1 for p, _ in noted)
    cut = min(o for p, o in noted if p == pid)
    # the repair cuts at or before the damage, at a batch boundary (else the leader could
    # not refill from there: its batches have the same boundaries)
    assert cut <= min(off0, off1) and cut in (0, 3, 5)
    assert _served_or_refused(s, pid, s.log_end(pid)) > 0   # and the rest served exactly
    s.close()


@pytest.mark.parametrize("kind", ["lmdb", "memory"])
def test_a_missing_offset_on_read_is_noted_at_the_end_of_the_batch_before(tmp_path, kind):
    """A read that finds no batch holding its offset (a key moved away while running)
    reports the boundary where the sound prefix stops, not the offset asked for."""
    s = Store(str(tmp_path / "db"), map_size=64 << 20) if kind == "lmdb" else MemoryStore()
    pid = s.partition_id("t", 0)
    for n in (3, 2, 2):
        append(s, pid, [b"x"] * n)
    s.commit()
    s._del_batch(pid, 3)                          # as if its key had been damaged
    s.commit()
    s._parts[pid][1] = 7                          # ... while the log end still says 7
    with pytest.raises(CorruptBatch) as e:
        s.read(pid, 4, 1 << 20, 7)
    assert e.value.offset == 3 and s.take_corrupt() == [(pid, 3)]
    s.close()


def test_a_flipped_pid_of_the_last_batch_is_reported_as_a_stray(tmp_path):
    path = tmp_path / "db"
    pid = _three_batches(path)
    _replace_all(path, key_of(pid, 5), key_of(pid | 0x100, 5))
    s = Store(str(path), map_size=64 << 20)
    assert s.stray == {pid | 0x100: (5, 7)}               # batches under an id no partition has
    assert s.log_end(pid) == 5                             # what the log can vouch for
    assert _served_or_refused(s, pid, 5) == 0
    s.close()


def _flip_epoch(path, tag: bytes, new_epoch: int) -> None:
    data = bytearray((path / "data.mdb").read_bytes())
    at = data.find(b"EPOCH-MARK-" + tag)
    assert at > 0
    for hdr in range(at - 56, max(0, at - 4096), -1):
        if data[hdr + 16] == 1 and int.from_bytes(data[hdr + 8:hdr + 12], "big") == 1 and \
                int.from_bytes(data[hdr:hdr + 8], "big") in (0, 3, 5):
            data[hdr + 8:hdr + 12] = struct.pack(">I", new_epoch)
            (path / "data.mdb").write_bytes(bytes(data))
            return
    raise AssertionError("header not found")


@pytest.mark.parametrize("tag,new_epoch,cut", [(b"B", 0x01000001, 3), (b"C", 0, 3)])
def test_a_flipped_epoch_is_found_at_recovery_and_on_read(tmp_path, tag, new_epoch, cut):
    """Epochs never go down along a log; a flipped one breaks that with a neighbour (the CRC
    does not cover the epoch). The repair cuts before both batches of the pair."""
    path = tmp_path / "db"
    pid = _three_batches(path)
    _flip_epoch(path, tag, new_epoch)
    s = Store(str(path), map_size=64 << 20)
    assert (pid, cut) in s.take_corrupt()
    with pytest.raises(CorruptBatch):
        s.read(pid, cut, 1 << 20, 7)
    assert offsets(s.read(pid, 0, 1 << 20, 7)) == [0, 1, 2]   # what precedes the damage is served
    s.close()


def test_growing_epochs_are_fine(tmp_path):
    path = tmp_path / "db"
    pid = _three_batches(path, epochs=(1, 2, 9))
    s = Store(str(path), map_size=64 << 20)
    assert s.take_corrupt() == [] and offsets(s.read(pid, 0, 1 << 20, 7)) == list(range(7))
    s.close()


def test_a_root_page_number_flipped_in_range_in_both_metas_is_never_a_silent_new_store(tmp_path):
    """LMDB would open the tree at whatever page the metas name; a page that is not the main
    tree's root is refused by the structural check, and an old copy of it (LMDB never
    overwrites a page in place) is a store older than its identity: lost state, not a new node."""
    o = _store_dir(tmp_path)
    pid = o.store.partition_id("t", 0)
    for _ in range(20):
        append(o.store, pid, [b"y" * 500] * 8)
        o.store.commit()
    _close(o)
    f, ident = tmp_path / "d" / "data.mdb", tmp_path / "d" / "identity.json"
    clean, clean_ident = f.read_bytes(), ident.read_bytes()
    metas = [datadir._parse_meta(clean[p:p + 200], "m") for p in (0, 4096)]
    meta = max(metas, key=lambda m: m["txnid"])
    main_at = 16 + datadir._META.size + datadir._DB.size + 40   # md_root of the main tree
    outcomes = set()
    for page in range(2, meta["last_pg"] + 1):
        if page == meta["main_root"]:
            continue
        data = bytearray(clean)
        for m in (0, 4096):
            data[m + main_at:m + main_at + 8] = page.to_bytes(8, "little")
        f.write_bytes(bytes(data))
        ident.write_bytes(clean_ident)
        try:
            o = _store_dir(tmp_path)
        except datadir.DataDirDamaged as exc:
            assert "--rejoin-empty" in str(exc)
            outcomes.add("refused")
            continue
        assert o.lost, f"page {page}: started as if nothing were wrong"
        outcomes.add("lost state")
        _close(o)
    assert "refused" in outcomes


def test_what_lmdb_itself_dies_of_is_tried_in_a_child_process_first(tmp_path):
    """An old copy of the main tree's root (LMDB leaves it in the file, on the free list)
    makes LMDB abort on its first write (an assertion in mdb_page_touch): the probe runs in a
    forked child, so the broker gets a clear error instead of dying."""
    o = _store_dir(tmp_path)
    pid = o.store.partition_id("t", 0)
    for _ in range(20):
        append(o.store, pid, [b"y" * 500] * 8)
        o.store.commit()
    _close(o)
    path = str(tmp_path / "d")
    f = tmp_path / "d" / "data.mdb"
    clean = f.read_bytes()
    datadir.probe_in_child(path, map_size=64 << 20)        # a sound store passes
    metas = [datadir._parse_meta(clean[p:p + 200], "m") for p in (0, 4096)]
    meta = max(metas, key=lambda m: m["txnid"])
    with open(f, "rb") as fh:
        free = datadir._free_pages(fh, 4096, meta["free_root"], meta["last_pg"])
    main_at = 16 + datadir._META.size + datadir._DB.size + 40
    crashed = []
    for page in sorted(free):
        if datadir._root_problem(clean[page * 4096:(page + 1) * 4096], page, 1, 6, main=True) is not None:
            continue           # not an old copy of the main root
        data = bytearray(clean)
        for m in (0, 4096):
            data[m + main_at:m + main_at + 8] = page.to_bytes(8, "little")
        f.write_bytes(bytes(data))
        try:
            datadir.probe_in_child(path, map_size=64 << 20)
        except datadir.DataDirDamaged as exc:
            crashed.append(str(exc))
    assert any("LMDB crashed (SIGABRT)" in c for c in crashed), crashed


def test_a_read_in_the_middle_of_a_turn_sees_only_committed_batches_and_no_damage(store):
    pid = store.partition_id("t", 0)
    append(store, pid, [b"a"] * 3)
    store.commit()
    append(store, pid, [b"b"] * 2)               # staged, not committed: invisible, not missing
    assert store.read(pid, 3, 1 << 20, 5) == []
    assert store.take_corrupt() == []
    store.commit()
    assert offsets(store.read(pid, 3, 1 << 20, 5)) == [3, 4]


def test_commit_hooks_run_inside_the_commit_and_after_a_rollback(store):
    """``pre_commit`` writes land in the committed transaction; ``on_rollback`` is told."""
    rolled = []
    store.pre_commit.append(lambda: store.put("meta", b"hooked", b"1"))
    store.on_rollback.append(lambda: rolled.append(True))
    append(store, 1, [b"a"])
    store.commit()
    assert store.get("meta", b"hooked") == b"1"
    append(store, 1, [b"b"])
    store.rollback()
    assert rolled == [True] and store.log_end(1) == 1


def test_a_replica_append_checks_crcs_unless_the_caller_did(store):
    from mesh.wire.errors import MeshError
    from mesh.wire.records import patch_batch
    good = patch_batch(encode_batch([b"x"]), 0, 1)
    bad = good[:-1] + bytes([good[-1] ^ 1])   # a flipped payload bit: the CRC no longer matches
    with pytest.raises(MeshError):
        store.stage_replica_append(2, bad)
    store.rollback()
    assert store.stage_replica_append(2, good, verified=True) == 1


def test_a_write_that_would_not_fit_is_refused_alone_and_the_turn_goes_on(tmp_path):
    s = Store(str(tmp_path / "small"), map_size=2 << 20)
    pid = s.partition_id("t", 0)
    assert s.room_for(10_000)   # far from the end: arithmetic only
    while s.room_for(50_000):
        append(s, pid, [b"x" * 50_000])
        s.commit()
    end = s.log_end(pid)
    assert end > 10
    append(s, pid, [b"small"])   # the turn has other writes; the refusal must not spoil them
    assert not s.room_for(50_000)
    s.commit()
    assert s.log_end(pid) == end + 1
    assert offsets(s.read(pid, end, 1 << 20, end + 1)) == [end]
    s.close()


def test_another_nodes_store_is_refused_without_its_identity_file(tmp_path):
    _close(_store_dir(tmp_path, "n2"))
    os.remove(tmp_path / "d" / datadir.IDENTITY_FILE)   # n2's store copied in as n1's, the file left out
    with pytest.raises(datadir.DataDirDamaged, match="belongs to node 'n2' \\(its LMDB says so\\)"):
        _store_dir(tmp_path, "n1")


def test_the_lost_state_mark_is_kept_in_lmdb_too():
    old = datadir.Identity("n1", "aaaa", 1, recovering=False)
    # a crash inside update_identity(recovering=True) after the LMDB write: the file is old
    ident, lost = datadir.reconcile(old, "bbbb", 2, "n1", lmdb_recovering=True)
    assert lost and ident.recovering and ident.generation == 3
    # another store under the file's name, at a higher generation, is not this store
    ident, lost = datadir.reconcile(old, "bbbb", 5, "n1")
    assert lost and ident.recovering and ident.store_id not in ("aaaa", "bbbb")
    # the file lost (deleted) while refilling: LMDB still says so
    ident, lost = datadir.reconcile(None, "aaaa", 1, "n1", lmdb_recovering=True)
    assert lost and ident.recovering and ident.store_id == "aaaa"
    assert datadir.reconcile(None, "aaaa", 1, "n1") == (datadir.Identity("n1", "aaaa", 2, False), None)


def test_a_damaged_page_in_the_middle_of_the_log_is_found_by_the_probe_not_the_broker(tmp_path):
    """The probe walked each database's first and last key only: a leaf in the middle of
    the log with a wrong page type aborted the broker itself (an LMDB assertion in its
    start-up scan), with no message and no way out. The probe walks every key now."""
    import struct
    o = _store_dir(tmp_path)
    pid = o.store.partition_id("t", 0)
    for i in range(1500):
        append(o.store, pid, [b"v-%05d" % i])
        if i % 100 == 99:
            o.store.commit()
    o.store.commit()
    _close(o)
    f = tmp_path / "d" / "data.mdb"
    data = bytearray(f.read_bytes())
    meta = max((datadir._parse_meta(bytes(data[p:p + 200]), "m") for p in (0, 4096)), key=lambda m: m["txnid"])
    main = bytes(data[meta["main_root"] * 4096:(meta["main_root"] + 1) * 4096])
    root = next(struct.unpack_from("<Q", main, at + ks + 40)[0] for _, ks, _, at, _ in datadir._nodes(main)
                if main[at:at + ks] == b"log")
    page = bytes(data[root * 4096:(root + 1) * 4096])
    assert struct.unpack_from("<H", page, 10)[0] & datadir._P_BRANCH, "the log fits one leaf: more records"
    leaves = [child for *_, child in datadir._nodes(page)]
    victim = leaves[len(leaves) // 2]
    flags = struct.unpack_from("<H", data, victim * 4096 + 10)[0]
    struct.pack_into("<H", data, victim * 4096 + 10, flags ^ 0x03)   # leaf <-> branch
    f.write_bytes(bytes(data))
    with pytest.raises(datadir.DataDirDamaged, match="damaged"):
        datadir.probe_in_child(str(tmp_path / "d"), map_size=64 << 20)


def test_an_unreadable_identity_file_is_written_again_from_lmdb(tmp_path):
    """An empty identity.json (as some file systems leave after a crash around a rename)
    was refused with --rejoin-empty as the only way out, which set a healthy store aside.
    LMDB holds the same identity: the file is written again from it."""
    o = _store_dir(tmp_path)
    sid, gen = o.identity.store_id, o.identity.generation
    _close(o)
    (tmp_path / "d" / datadir.IDENTITY_FILE).write_bytes(b"")
    o = _store_dir(tmp_path)
    assert o.lost is None and o.identity.store_id == sid and o.identity.generation == gen + 1
    assert datadir.read_identity(str(tmp_path / "d")) == o.identity
    _close(o)


def test_room_is_probed_value_by_value_where_the_free_list_is_fragmented(tmp_path):
    """A follower's append is many batches: probed as one value, it needed a contiguous run
    of free pages that a free list fragmented by deletes does not have, and the follower
    dropped appends it had room for."""
    s = Store(str(tmp_path / "small"), map_size=8 << 20)
    a, b = s.partition_id("t", 0), s.partition_id("t", 1)
    while s.room_for(40_000):   # interleaved: freeing one partition leaves holes, not runs
        append(s, a, [b"a" * 8000])
        append(s, b, [b"b" * 8000])
        s.commit()
    s.forget_partition("t", 1)
    s.commit()
    for i in range(2):   # LMDB reuses pages freed by a transaction from the one after next
        s.put("meta", b"k%d" % i, b"v")
        s.commit()
    n = 2 << 20
    assert s.room_for(n, lambda: [8_000] * (n // 8_000))
    assert not s.room_for(n)   # the same bytes as one value: no run of free pages is that long
    s.close()


def test_a_store_given_up_while_running_is_refused_at_the_next_start_and_rejoin_moves_it(tmp_path):
    """Damage only a commit touches passes the start-up checks: the broker that found it
    leaves a note, so the next start refuses the store and --rejoin-empty moves it aside."""
    _close(_store_dir(tmp_path))
    datadir.refuse_from_now_on(str(tmp_path / "d"), "commits kept failing: MDB_CORRUPTED")
    with pytest.raises(datadir.DataDirDamaged, match="given up by the broker that ran on it: commits kept"):
        _store_dir(tmp_path)
    o = _store_dir(tmp_path, rejoin_empty=True)
    assert o.moved_to and o.lost and not os.path.exists(tmp_path / "d" / datadir.REFUSED_FILE)
    _close(o)
