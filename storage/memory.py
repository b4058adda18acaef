"""The in-memory twin of ``storage.log.Store`` for simulations and unit tests.

Same interface and the same crash semantics: what ``commit()`` made durable survives
``crash()``; what was only staged is lost.
"""
from __future__ import annotations

import bisect

from storage.base import StoreBase

__all__ = ["MemoryStore"]


class MemoryStore(StoreBase):
    def __init__(self) -> None:
        super().__init__()
        self._durable: dict[str, dict[bytes, bytes]] = {db: {} for db in
                                                         ("log", "meta", "repl", "offsets", "producers", "gossip")}
        self._staged: dict[str, dict[bytes, bytes | None]] | None = None
        self._bases: dict[int, list[int]] = {}   # durable + staged view of log keys per pid
        self._logv: dict[tuple[int, int], bytes] = {}

    def _stage(self) -> dict[str, dict[bytes, bytes | None]]:
        if self._staged is None:
            self._staged = {db: {} for db in self._durable}
            self._bases_undo = {pid: list(b) for pid, b in self._bases.items()}
            self._logv_undo = dict(self._logv)
        return self._staged

    def _put_batch(self, pid, base, batch):
        from storage.base import key_of
        self._stage()["log"][key_of(pid, base)] = bytes(batch)
        lst = self._bases.setdefault(pid, [])
        i = bisect.bisect_left(lst, base)
        if i == len(lst) or lst[i] != base:
            lst.insert(i, base)
        self._logv[(pid, base)] = bytes(batch)

    def _get_batch(self, pid, base):
        return self._logv.get((pid, base))

    def _del_batch(self, pid, base):
        from storage.base import key_of
        self._must_sync = True
        self._stage()["log"][key_of(pid, base)] = None
        lst = self._bases.get(pid, [])
        i = bisect.bisect_left(lst, base)
        if i < len(lst) and lst[i] == base:
            lst.pop(i)
        self._logv.pop((pid, base), None)

    def _bases_from(self, pid, offset):
        lst = self._bases.get(pid, [])
        return lst[bisect.bisect_left(lst, offset):]

    def _head_batches(self, pid, limit):
        for base in self._bases.get(pid, [])[:limit]:
            yield base, self._logv[(pid, base)]

    def _put_row(self, db, key, value):
        self._stage()[db][key] = bytes(value)

    def _delete_row(self, db, key):
        self._stage()[db][key] = None

    def get(self, db, key):
        if self._staged is not None and key in self._staged[db]:
            return self._staged[db][key]
        return self._durable[db].get(key)

    def items(self, db, prefix=b""):
        return sorted((k, v) for k, v in self._durable[db].items() if k.startswith(prefix))

    def items_from(self, db, start, limit):
        return sorted((k, v) for k, v in self._durable[db].items() if k >= start)[:limit]

    def count(self, db):
        return len(self._durable[db])

    def has_writes(self) -> bool:
        return self._staged is not None

    def _commit_txn(self, sync: bool = True) -> bool:
        """True if it synced (here: counted, as the LMDB store would)."""
        if self._staged is None:
            return sync and self.unsynced_due_ms is not None
        for db, kv in self._staged.items():
            d = self._durable[db]
            for k, v in kv.items():
                if v is None:
                    d.pop(k, None)
                else:
                    d[k] = v
        self._staged = None
        return sync

    def _abort_txn(self):
        if self._staged is not None:
            self._bases = self._bases_undo
            self._logv = self._logv_undo
        self._staged = None

    def _read_raw(self, pid, offset, max_bytes, limit_offset):
        from storage.base import key_of
        lst = [b for b in self._bases.get(pid, []) if key_of(pid, b) in self._durable["log"]]
        i = bisect.bisect_right(lst, offset) - 1
        i = max(i, 0)
        out, size = [], 0
        for base in lst[i:]:
            if base >= limit_offset:
                break
            v = self._durable["log"][key_of(pid, base)]
            if base + int.from_bytes(v[20:24], "big") <= offset:
                continue
            if out and size + len(v) > max_bytes:
                break
            out.append((base, v))
            size += len(v)
        return out

    def _walk_headers(self, pid, from_offset, limit_offset):
        from storage.base import key_of
        for base in list(self._bases.get(pid, [])):
            v = self._durable["log"].get(key_of(pid, base))
            if v is None:
                continue
            if base >= limit_offset:
                return
            count = int.from_bytes(v[20:24], "big")
            if base + count > from_offset:
                yield base, count, int.from_bytes(v[32:40], "big")

    def _batch_before(self, pid, offset):
        from storage.base import key_of
        lst = [b for b in self._bases.get(pid, []) if key_of(pid, b) in self._durable["log"]]
        i = bisect.bisect_left(lst, offset) - 1
        if i < 0:
            return None
        v = self._durable["log"][key_of(pid, lst[i])]
        return lst[i], int.from_bytes(v[20:24], "big")

    def sync_now(self) -> None:
        pass

    def crash(self) -> "MemoryStore":
        """A new store holding only what was committed (a process crash + restart)."""
        from storage.base import unkey
        self._abort_txn()
        fresh = MemoryStore()
        fresh._durable = {db: dict(kv) for db, kv in self._durable.items()}
        for k, v in sorted(fresh._durable["log"].items()):
            pid, base = unkey(k)
            fresh._bases.setdefault(pid, []).append(base)
            fresh._logv[(pid, base)] = v
            st = fresh._parts.setdefault(pid, [base, 0, 0])
            st[1] = base + int.from_bytes(v[20:24], "big")
            st[2] += len(v)
        for k, v in fresh._durable["meta"].items():
            if k.startswith(b"logstart:"):
                st = fresh._parts.setdefault(int(k[9:]), [0, 0, 0])
                st[0] = max(st[0], int(v))
                if st[2] == 0:
                    st[1] = max(st[1], st[0])
        return fresh

    def close(self):
        self._abort_txn()
