"""The LMDB store and its in-memory twin behave the same (parametrized over both)."""
import pytest

from mesh.wire.records import encode_batch, parse_header, records_from
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
