"""The data directory around the LMDB store: an exclusive lock, start-up checks of
``data.mdb``, and the store's identity kept outside LMDB.

Theory of operation
-------------------
A data directory holds ``data.mdb``/``lock.mdb`` (LMDB), ``mesh.lock`` and
``identity.json``. ``open_data_dir`` runs before LMDB is opened:

1. **Lock**: ``flock(LOCK_EX | LOCK_NB)`` on ``mesh.lock``, held for the life of the
   process (the kernel drops it when the process dies, even on ``kill -9``). A second
   broker on the same directory is refused (``DataDirLocked``) instead of overwriting the
   first one's acknowledged records.
2. **Structure of data.mdb**: LMDB trusts its file; a file shorter than its last used page
   makes the first read of that page a SIGBUS, and flipped meta fields make it start on a
   wrong tree. We read both meta pages with ordinary file I/O (``check_lmdb_file``):
   magic, version, page size, last page number, root pages, and check the file is long
   enough for the last used page of the meta LMDB will use (the one with the higher
   transaction id), that the root page numbers are in range, that each root page names
   itself in its header and has the shape its meta says (a leaf holding as many keys as
   the tree has; the main tree's keys are named databases), and that no tree's root is a
   page the free list holds (an old copy: LMDB never changes a page in place). Then
   ``probe_in_child`` opens the store in a forked child, stages a write and aborts it:
   whatever LMDB still trips over (its assertions abort the process) kills the child,
   not the broker. A failure is ``DataDirDamaged`` with the path, what is wrong and the
   way out.
3. **Identity** (``identity.json``, written atomically: temp file, fsync, rename, fsync of
   the directory): node id, store id (random hex, created with a new store) and the last
   generation. LMDB's ``meta`` database keeps the same store id and generation. The
   start-up order is LMDB first (sync), identity file second, so the file is never ahead
   of LMDB unless LMDB lost state. ``Identity.reconcile`` compares them: another node id
   is refused; an LMDB older than the file (lower generation, no generation at all, or
   another store id at the same generation) means the store *lost state*: the node must
   start as a replica that forgot (``ReplicaManager.declare_lost_state``), and the store
   gets a new store id.

What LMDB itself detects: bad magic or version in both metas (``MDB_INVALID``), some
page-type mismatches on the way down a tree (``MDB_CORRUPTED``, not always). What it does
not: a file shorter than its metas say (SIGBUS), a root page number flipped in range
(a wrong or empty tree, silently, or an assertion that aborts the process), flipped
bytes inside a key or a value (no checksums). We add: the checks above, the identity
comparison (a store older or emptier than ``identity.json`` lost state), the lock, and
per-batch checks on read and at recovery (``storage.base.StoreBase.read``,
``storage.log.Store._recover``): the CRC, the header's base offset against the key, no
gap between batches (a flipped key byte moves a batch), epochs that never go down along
a log (the CRC does not cover the epoch), and batches under a partition id nobody has
(``Store.stray``). Still undetected: a flipped epoch in a partition's last batch that
makes it larger, which nothing reads (Raft keeps its own epochs in ``repl``), and a
flipped byte inside a ``meta``/``repl``/``offsets`` value that still parses.

``move_aside`` renames a refused directory to ``<dir>.<reason>-<UTC time>`` (never
deletes it); ``mesh node ... --rejoin-empty`` uses it and starts as a new store that
refills from its peers (lost state).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import struct
import time
from dataclasses import dataclass

import lmdb

__all__ = ["DataDirError", "DataDirLocked", "DataDirDamaged", "Identity", "DataDir", "check_lmdb_file", "probe_in_child",
           "read_identity", "write_identity", "move_aside", "new_store_id", "reconcile", "open_data_dir",
           "update_identity", "Opened", "IDENTITY_FILE", "LOCK_FILE", "REFUSED_FILE", "refuse_from_now_on"]

log = logging.getLogger("storage.datadir")

IDENTITY_FILE = "identity.json"
LOCK_FILE = "mesh.lock"
REFUSED_FILE = "refused.txt"   # why a running broker gave the store up: refused at the next start
DATA_FILE = "data.mdb"
_FORMAT = 1

_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_VERSION = 1
_P_INVALID = (1 << 64) - 1
_P_BRANCH, _P_LEAF, _P_LEAF2 = 0x01, 0x02, 0x20   # page flags
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02               # node flags: data on overflow pages; a named database
_PAGE_HEADER = 16            # mp_pgno u64, pad u16, flags u16, lower/upper u16 x2
_META = struct.Struct("<II QQ")       # magic, version, address, mapsize
_DB = struct.Struct("<IHH QQQQQ")     # pad (psize in FREE_DBI), flags, depth, branch, leaf, overflow, entries, root
_TAIL = struct.Struct("<QQ")          # last_pg, txnid
_META_SIZE = _META.size + 2 * _DB.size + _TAIL.size


class DataDirError(Exception):
    """The data directory cannot be used as it is; the message says why and what to do."""


class DataDirLocked(DataDirError):
    """Another process holds the directory's lock."""


class DataDirDamaged(DataDirError):
    """The store or its identity is unreadable, damaged, or belongs to another node."""


def new_store_id() -> str:
    return os.urandom(8).hex()


# ---------------------------------------------------------------- data.mdb structure ----

def _parse_meta(raw: bytes, where: str) -> dict:
    if len(raw) < _PAGE_HEADER + _META_SIZE:
        raise DataDirDamaged(f"{where}: meta page cut short ({len(raw)} bytes)")
    at = _PAGE_HEADER
    magic, version, _, mapsize = _META.unpack_from(raw, at)
    at += _META.size
    free = _DB.unpack_from(raw, at)
    main = _DB.unpack_from(raw, at + _DB.size)
    last_pg, txnid = _TAIL.unpack_from(raw, at + 2 * _DB.size)
    return {"magic": magic, "version": version, "psize": free[0], "free_root": free[7], "main_root": main[7],
            "last_pg": last_pg, "txnid": txnid, "mapsize": mapsize,
            "free_db": (free[2], free[6]), "main_db": (main[2], main[6])}   # (depth, entries)


def _root_problem(page: bytes, root: int, depth: int, entries: int, main: bool) -> str | None:
    """Why ``page`` cannot be the root page ``root`` of a tree of ``depth`` levels holding
    ``entries`` keys (the main tree: only named databases), or None."""
    pgno, _, flags, lower = struct.unpack_from("<QHHH", page, 0)
    if pgno != root:
        return f"says it is page {pgno}"
    if depth > 1:
        return None if flags & _P_BRANCH else f"is not a branch page (flags {flags:#x}) of a {depth}-level tree"
    if not flags & _P_LEAF or flags & _P_LEAF2:
        return f"is not a leaf page (flags {flags:#x})"
    nkeys = (lower - _PAGE_HEADER) >> 1
    if nkeys != entries:
        return f"holds {nkeys} keys, but the meta page says the tree holds {entries}"
    if main:
        for i in range(min(nkeys, 64)):
            at = struct.unpack_from("<H", page, _PAGE_HEADER + 2 * i)[0]
            if at + 8 > len(page) or not struct.unpack_from("<H", page, at + 4)[0] & _F_SUBDATA:
                return "holds keys that are not named databases"
    return None


def _nodes(page: bytes):
    """(flags, key size, data size, offset of the key, child page number) of each node."""
    lower = struct.unpack_from("<H", page, 12)[0]
    for i in range(max(0, (lower - _PAGE_HEADER) >> 1)):
        at = struct.unpack_from("<H", page, _PAGE_HEADER + 2 * i)[0]
        if at + 8 > len(page):
            raise ValueError(f"node {i} at {at} lies outside its page")
        lo, hi, flags, ksize = struct.unpack_from("<HHHH", page, at)
        yield flags, ksize, lo | hi << 16, at + 8, lo | hi << 16 | flags << 32


def _free_pages(f, psize: int, root: int, last: int, limit: int = 1 << 20) -> set[int]:
    """The page numbers LMDB's free list (the tree at ``root``) holds: pages no tree of the
    current meta may use. At most ``limit`` pages are read."""
    out: set[int] = set()
    todo = [root]
    while todo and limit > 0:
        pg = todo.pop()
        if not 2 <= pg <= last:
            raise ValueError(f"page {pg} is outside the used pages 2..{last}")
        f.seek(pg * psize)
        page = f.read(psize)
        limit -= 1
        flags = struct.unpack_from("<H", page, 10)[0]
        for nflags, ksize, dsize, at, child in _nodes(page):
            if flags & _P_BRANCH:
                todo.append(child)
                continue
            if nflags & _F_BIGDATA:   # the ids are on overflow pages
                f.seek(struct.unpack_from("<Q", page, at + ksize)[0] * psize + _PAGE_HEADER)
                data = f.read(dsize)
                limit -= 1 + dsize // psize
            else:
                data = page[at + ksize:at + ksize + dsize]
            n = struct.unpack_from("<Q", data, 0)[0] if len(data) >= 8 else 0
            out.update(struct.unpack_from(f"<{min(n, len(data) // 8 - 1)}Q", data, 8))
    return out


def check_lmdb_file(path: str) -> None:
    """Raise ``DataDirDamaged`` unless ``path`` (a data.mdb) is structurally sound enough
    to open: see the module docstring. A missing or empty file is fine (a new store)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb") as f:
        head = f.read(_PAGE_HEADER + _META_SIZE)
        if len(head) < _PAGE_HEADER + _META_SIZE:
            raise DataDirDamaged(f"{path} is {size} bytes: too short to hold LMDB's meta pages")
        m0 = _parse_meta(head, "meta page 0")
        psize = m0["psize"]
        if m0["magic"] != _LMDB_MAGIC or m0["version"] != _LMDB_VERSION:
            raise DataDirDamaged(f"{path}: meta page 0 has magic {m0['magic']:#x} version {m0['version']}, "
                                 f"not an LMDB {_LMDB_VERSION} file")
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise DataDirDamaged(f"{path}: page size {psize} in meta page 0 is not a power of two in 512..65536")
        if size < 2 * psize:
            raise DataDirDamaged(f"{path} is {size} bytes: shorter than its two meta pages ({2 * psize})")
        f.seek(psize)
        m1 = _parse_meta(f.read(_PAGE_HEADER + _META_SIZE), "meta page 1")
        metas = [m for m in (m0, m1) if m["magic"] == _LMDB_MAGIC and m["version"] == _LMDB_VERSION]
        meta = max(metas, key=lambda m: m["txnid"])  # the one LMDB will use
        which = 0 if meta is m0 else 1
        last = meta["last_pg"]
        need = (last + 1) * psize
        if last < 1 or need > size:
            raise DataDirDamaged(f"{path} is {size} bytes but its meta page {which} (transaction {meta['txnid']}) "
                                 f"uses pages up to {last}, i.e. {need} bytes: the file was truncated "
                                 f"or the meta page is damaged")
        for name, db in (("free_root", "free_db"), ("main_root", "main_db")):
            root = meta[name]
            if root == _P_INVALID:
                continue
            if root < 2 or root > last:
                raise DataDirDamaged(f"{path}: meta page {which} names root page {root} ({name}), "
                                     f"outside the used pages 2..{last}")
            f.seek(root * psize)
            why = _root_problem(f.read(psize), root, *meta[db], main=name == "main_root")
            if why is not None:
                raise DataDirDamaged(f"{path}: root page {root} ({name}) of meta page {which} "
                                     f"{why}: the file is damaged")
        # the trees must not start on a page the free list holds (an old copy of a root:
        # LMDB writes every change to a new page and frees the old one)
        roots = {"main_root": meta["main_root"]}
        if meta["main_root"] != _P_INVALID:
            f.seek(meta["main_root"] * psize)
            page = f.read(psize)
            for _, ksize, dsize, at, _ in _nodes(page):
                if dsize >= _DB.size:
                    name = page[at:at + ksize].decode(errors="replace")
                    roots[f"root of database {name!r}"] = _DB.unpack_from(page, at + ksize)[7]
        if meta["free_root"] != _P_INVALID:
            try:
                free = _free_pages(f, psize, meta["free_root"], last)
            except (ValueError, struct.error) as exc:
                raise DataDirDamaged(f"{path}: the free list of meta page {which} is unreadable "
                                     f"({exc}): the file is damaged") from exc
            for name, root in roots.items():
                if root in free:
                    raise DataDirDamaged(f"{path}: the {name} (page {root}) of meta page {which} is a "
                                         f"page the free list holds (an old copy?): the file is damaged")


def probe_in_child(path: str, **store_kwargs) -> None:
    """Run ``storage.log.Store.probe`` on ``path`` in a forked child; raise
    ``DataDirDamaged`` with LMDB's own words if it fails or the child dies (an LMDB
    assertion aborts the process; a page beyond the file's end is a bus error). The child
    touches nothing but LMDB (already imported) and leaves with ``os._exit``, so the
    parent's threads (ZeroMQ's) and their locks do not matter. It walks every key, as the
    start-up scan then does again in the broker."""
    if not os.path.exists(os.path.join(path, DATA_FILE)):
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: LMDB only, then _exit (no atexit, no flush of the parent's buffers)
        code = 0
        try:
            os.close(r)
            os.dup2(w, 2)            # LMDB prints its assertion on stderr
            import faulthandler
            faulthandler.disable()   # the parent's (pytest's) crash report is not ours to print
            from storage.log import Store
            Store.probe(path, **store_kwargs)
        except BaseException as exc:
            os.write(2, f"{type(exc).__name__}: {exc}".encode(errors="replace")[:2000])
            code = 3
        os._exit(code)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        while len(chunks) < 64:
            chunk = f.read(4096)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    said = b"".join(chunks).decode(errors="replace").strip()[-600:]
    if os.WIFSIGNALED(status):
        import signal
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise DataDirDamaged(f"{path}: LMDB crashed ({sig}) opening the store in a test process"
                             f"{': ' + said if said else ''}: the file is damaged")
    if os.WEXITSTATUS(status) != 0:
        raise DataDirDamaged(f"{path}: LMDB cannot open the store: {said or 'no reason given'}")


# ---------------------------------------------------------------- identity ------------------

@dataclass
class Identity:
    node_id: str
    store_id: str
    generation: int
    recovering: bool = False   # lost state declared and not yet refilled (kept across restarts)


def read_identity(data_dir: str) -> Identity | None:
    path = os.path.join(data_dir, IDENTITY_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(65536)
    except FileNotFoundError:
        return None
    try:
        d = json.loads(raw)
        ident = Identity(str(d["node_id"]), str(d["store_id"]), int(d["generation"]), bool(d.get("recovering")))
        if d.get("format") != _FORMAT or ident.generation < 0 or not ident.node_id or not ident.store_id:
            raise ValueError("unexpected format or values")
        return ident
    except (ValueError, KeyError, TypeError) as exc:
        raise DataDirDamaged(f"{path} is unreadable ({exc})") from exc


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_identity(data_dir: str, ident: Identity) -> None:
    """Atomically: temp file, fsync, rename, fsync the directory."""
    path = os.path.join(data_dir, IDENTITY_FILE)
    tmp = path + ".tmp"
    body = json.dumps({"format": _FORMAT, "node_id": ident.node_id, "store_id": ident.store_id,
                       "generation": ident.generation, "recovering": ident.recovering}, sort_keys=True)
    with open(tmp, "wb") as f:
        f.write(body.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(data_dir)


# ---------------------------------------------------------------- the directory -------------

def move_aside(data_dir: str, reason: str = "refused") -> str:
    """Rename ``data_dir`` to ``<dir>.<reason>-<UTC time>`` (never delete); return the new name."""
    base = os.path.abspath(data_dir).rstrip("/")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    dest = f"{base}.{reason}-{stamp}"
    n = 1
    while os.path.exists(dest):
        n += 1
        dest = f"{base}.{reason}-{stamp}-{n}"
    os.rename(base, dest)
    _fsync_dir(os.path.dirname(base) or ".")
    return dest


class DataDir:
    """The locked data directory of one broker process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None

    def lock(self) -> None:
        """Take the exclusive lock, or raise ``DataDirLocked``. The lock is held on the
        directory itself, which cannot be removed while it holds files: a lock on the lock
        file alone was lost when someone deleted that file (a clean-up of ``*.lock``), and a
        second broker then wrote the same store. The lock file names the holder's pid."""
        os.makedirs(self.path, exist_ok=True)
        dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as exc:
            holder = ""
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                pass
            os.close(fd)
            os.close(dir_fd)
            if not isinstance(exc, BlockingIOError):
                raise DataDirLocked(f"cannot lock data directory {self.path}: {exc}") from exc
            raise DataDirLocked(f"data directory {self.path} is in use by another broker"
                                f"{f' (pid {holder})' if holder else ''}: two brokers on one directory would "
                                f"overwrite each other's records; stop the other one or use another --data")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd, self._dir_fd = fd, dir_fd

    def unlock(self) -> None:
        for fd in (self._lock_fd, self._dir_fd):
            if fd is not None:
                os.close(fd)   # closing the descriptor drops the flock
        self._lock_fd = self._dir_fd = None

    def check(self, node_id: str) -> Identity | None | DataDirDamaged:
        """Structural checks before LMDB is opened; the identity file (None if absent, the
        error if it cannot be read: LMDB's copy may stand in, see ``open_data_dir``)."""
        try:
            with open(os.path.join(self.path, REFUSED_FILE), "rb") as f:
                why = f.read(4096).decode(errors="replace").strip()
            raise DataDirDamaged(f"{self.path} was given up by the broker that ran on it: {why}")
        except FileNotFoundError:
            pass
        check_lmdb_file(os.path.join(self.path, DATA_FILE))
        try:
            ident = read_identity(self.path)
        except DataDirDamaged as exc:
            return exc
        if ident is not None and ident.node_id != node_id:
            raise DataDirDamaged(f"data directory {self.path} belongs to node {ident.node_id!r} "
                                 f"(its {IDENTITY_FILE} says so), not {node_id!r}: check --id and --data")
        return ident

    def move_aside(self, reason: str = "refused") -> str:
        """Rename the directory aside and start a new, empty, locked one in its place."""
        old = (self._lock_fd, self._dir_fd)
        dest = move_aside(self.path, reason)
        self._lock_fd = self._dir_fd = None
        self.lock()
        for fd in old:
            if fd is not None:
                os.close(fd)
        return dest


def reconcile(ident: Identity | None, lmdb_store_id: str | None, lmdb_generation: int,
              node_id: str, lmdb_recovering: bool = False) -> tuple[Identity, str | None]:
    """Compare the identity file with what LMDB says. Returns (the identity of this life,
    with the generation bumped and a new store id if state was lost; the reason state was
    lost, or None). Both copies hold the recovering mark, and either one saying so counts
    (a crash between the two writes of ``update_identity`` leaves one of them old). The
    caller persists LMDB first, then the identity file."""
    lost = None
    store_id = lmdb_store_id
    refilling = lmdb_recovering or (ident is not None and ident.recovering)
    if ident is not None:
        if lmdb_generation == 0:
            lost = (f"the store is empty but {IDENTITY_FILE} says generation {ident.generation} "
                    f"(store {ident.store_id}) was here")
        elif lmdb_generation < ident.generation:
            lost = (f"the store is older than {IDENTITY_FILE} says: generation {lmdb_generation}, "
                    f"identity generation {ident.generation} (a rolled-back copy?)")
        elif lmdb_store_id not in (None, ident.store_id):
            lost = (f"the store {lmdb_store_id} is not the one {IDENTITY_FILE} names ({ident.store_id})")
    if lost is None and refilling:
        lost = "the previous life had not finished refilling its lost state"
    if store_id is None or (lost is not None and not refilling):
        store_id = new_store_id()   # what LMDB holds is not the store the identity described
    last = max(lmdb_generation, ident.generation if ident is not None else 0)
    return Identity(node_id, store_id, last + 1, recovering=lost is not None), lost


def _write_meta(store, ident: Identity) -> None:
    """This life's identity in LMDB (synced), before the identity file."""
    store.put("meta", b"generation", str(ident.generation).encode())
    store.put("meta", b"store_id", ident.store_id.encode())
    store.put("meta", b"node_id", ident.node_id.encode())
    store.put("meta", b"recovering", b"1" if ident.recovering else b"0")
    store.commit()
    store.sync_now()


@dataclass
class Opened:
    """What ``open_data_dir`` hands the node."""
    data_dir: DataDir
    store: object               # storage.log.Store
    identity: Identity          # this life's (already persisted)
    lost: str | None            # why this store lost state, or None
    moved_to: str | None        # where --rejoin-empty moved a refused directory


def _lmdb_identity(store) -> tuple[bytes | None, int, bytes | None]:
    """(store id, generation, node id) as LMDB's ``meta`` holds them; ValueError (the store
    is damaged) if they cannot be read: a flipped byte there was a bare ``int()`` error."""
    sid, gen, node = (store.get("meta", k) for k in (b"store_id", b"generation", b"node_id"))
    try:
        generation = int((gen or b"0").decode("ascii"))
        if sid is not None:
            sid.decode()
    except ValueError as exc:   # (UnicodeDecodeError is one)
        raise ValueError(f"its identity in LMDB is garbled (generation {bytes(gen or b'')[:40]!r}, "
                         f"store id {bytes(sid or b'')[:40]!r})") from exc
    if generation < 0:
        raise ValueError(f"its identity in LMDB is garbled (generation {generation})")
    return sid, generation, node


def open_data_dir(path: str, node_id: str, rejoin_empty: bool = False, **store_kwargs) -> Opened:
    """Lock, check, open LMDB, compare identities, bump and persist the generation (LMDB
    first, synced; then the identity file). A refused directory raises ``DataDirError``
    (or ``LogError`` from LMDB) unless ``rejoin_empty``: then it is moved aside and the
    node starts on a new, empty store that knows it lost state."""
    from storage.base import LogError
    from storage.log import Store
    dd = DataDir(path)
    dd.lock()
    moved = None
    old: Identity | None = None
    try:
        try:
            old = dd.check(node_id)
            probe_in_child(path, **store_kwargs)
            store = Store(path, **store_kwargs)
            try:
                lmdb_store, lmdb_gen, lmdb_node = _lmdb_identity(store)
            except ValueError:
                store.close()
                raise
        except (DataDirDamaged, LogError, lmdb.Error, struct.error, ValueError) as exc:
            if not rejoin_empty:
                said = (str(exc) if isinstance(exc, (DataDirDamaged, LogError))
                        else f"{path}: the store is damaged ({type(exc).__name__}: {exc})")
                raise DataDirDamaged(f"{said}. The way out: restart with --rejoin-empty, which moves "
                                     f"{path} aside (renamed, not deleted) and rejoins as an empty "
                                     f"replica that refills from its peers") from exc
            try:
                old = read_identity(path)
            except DataDirError:
                old = None
            moved = dd.move_aside("refused")
            log.error("--rejoin-empty: %s; moved %s to %s, starting on an empty store", exc, path, moved)
            store = Store(path, **store_kwargs)
            lmdb_store, lmdb_gen, lmdb_node = None, 0, None
        if isinstance(old, DataDirDamaged):
            # an unreadable identity file (an empty one, as some file systems leave after a
            # crash around a rename): LMDB holds the same identity since it names its node,
            # so the file is written again from it; an older store without that is refused
            if lmdb_node is not None and lmdb_store is not None:
                log.warning("%s; its LMDB copy stands in (store %s, generation %d)", old, lmdb_store.decode(),
                            lmdb_gen)
                old = Identity(lmdb_node.decode(errors="replace"), lmdb_store.decode(), lmdb_gen,
                               store.get("meta", b"recovering") == b"1")
            elif not rejoin_empty:
                store.close()
                raise DataDirDamaged(f"{old}. The way out: restart with --rejoin-empty, which moves {path} "
                                     f"aside (renamed, not deleted) and rejoins as an empty replica")
            else:
                store.close()
                moved = dd.move_aside("refused")
                log.error("--rejoin-empty: %s; moved %s to %s, starting on an empty store", old, path, moved)
                store, old = Store(path, **store_kwargs), None
                lmdb_store, lmdb_gen, lmdb_node = None, 0, None
        if moved is None and lmdb_node is not None and lmdb_node.decode(errors="replace") != node_id:
            store.close()
            raise DataDirDamaged(f"the store in {path} belongs to node {lmdb_node.decode(errors='replace')!r} "
                                 f"(its LMDB says so), not {node_id!r}: check --id and --data (another "
                                 f"broker's data, say, copied in); a store never votes under another name")
        if moved is not None:
            prev = Identity(node_id, "moved-aside", old.generation if old else 0, False)
            ident, lost = reconcile(prev, None, 0, node_id)
            lost = f"the previous store was moved aside to {moved}"
        else:
            ident, lost = reconcile(old, lmdb_store.decode() if lmdb_store else None, lmdb_gen, node_id,
                                    lmdb_recovering=store.get("meta", b"recovering") == b"1")
        _write_meta(store, ident)
        write_identity(path, ident)
    except BaseException:
        dd.unlock()
        raise
    return Opened(dd, store, ident, lost, moved)


def refuse_from_now_on(path: str, why: str) -> None:
    """Leave ``why`` in the directory: the next start refuses it (and ``--rejoin-empty``
    moves it aside), as a store found damaged at start is. For what only the running
    broker finds (a page only a commit touches) or cannot use alone."""
    tmp = os.path.join(path, REFUSED_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(why.encode()[:4000])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, REFUSED_FILE))
    _fsync_dir(path)


def update_identity(opened: Opened, **changes) -> None:
    """Change this life's identity (a generation bump, the recovering flag): LMDB first,
    synced, then the identity file. The caller's store must have no open turn."""
    ident = dataclasses.replace(opened.identity, **changes)
    _write_meta(opened.store, ident)
    write_identity(opened.data_dir.path, ident)
    opened.identity = ident   # only once durable
