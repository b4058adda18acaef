"""LMDB's no-sync flag, set for one commit at a time (write caching, issue 41).

LMDB lets ``MDB_NOSYNC`` be switched on and off between transactions
(``mdb_env_set_flags``); it is read when a write transaction commits. py-lmdb sets it only
when the environment is opened, for every commit alike, and its bundled LMDB hides the
symbol. So the flag word is reached where ``mdb_env_set_flags`` writes it, and only after
the address is proven: the environment object's ``MDB_env`` pointer lies in a readable
mapping of this process (``/proc/self/maps``), that struct's first three fields are the
descriptors of this environment's ``data.mdb`` and ``lock.mdb`` (``/proc/self/fd``), and
flipping the bit flips what LMDB itself reports (``Environment.flags()['sync']``), then
flips back. If any check fails ``attach`` answers None and every commit syncs (write
caching is then off, said once in the log): never a guess.

The layout read (py-lmdb 1.x-3.x ``EnvObject``: head, weak list, then ``MDB_env *``; LMDB
0.9 ``MDB_env``: three descriptors, then ``me_flags``) is checked, not assumed.
"""
from __future__ import annotations

import ctypes
import logging
import os
import struct

__all__ = ["NoSyncFlag"]

_log = logging.getLogger("storage")
MDB_NOSYNC = 0x10000
_PTR = struct.Struct("P")
_ENV_OFFSETS = (64, 56, 72, 48, 80)   # where py-lmdb keeps MDB_env* in its object, likeliest first


def _readable(addr: int, size: int) -> bool:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr and addr + size <= hi:
                    return perms.startswith("r")
    except OSError:
        pass
    return False


def _fd_is(fd: int, path: str) -> bool:
    try:
        return os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == os.path.realpath(path)
    except OSError:
        return False


class NoSyncFlag:
    def __init__(self, word: ctypes.c_uint32) -> None:
        self._word = word

    def set(self, on: bool) -> None:
        if on:
            self._word.value |= MDB_NOSYNC
        else:
            self._word.value &= ~MDB_NOSYNC

    @classmethod
    def attach(cls, env, path: str) -> "NoSyncFlag | None":
        try:
            size = type(env).__basicsize__
            for off in _ENV_OFFSETS:
                if off + _PTR.size > size:
                    continue
                ptr = ctypes.c_void_p.from_address(id(env) + off).value
                if not ptr or not _readable(ptr, 16):
                    continue
                fd, lfd = (ctypes.c_int * 2).from_address(ptr)
                if not (_fd_is(fd, os.path.join(path, "data.mdb")) and _fd_is(lfd, os.path.join(path, "lock.mdb"))):
                    continue
                flag = cls(ctypes.c_uint32.from_address(ptr + 12))
                if flag._word.value & MDB_NOSYNC or not env.flags()["sync"]:
                    continue
                flag.set(True)
                took = not env.flags()["sync"]
                flag.set(False)
                if took and env.flags()["sync"]:
                    return flag
        except (AttributeError, OSError, ValueError, TypeError):
            pass
        _log.warning("write caching unavailable with this LMDB build: every commit syncs")
        return None
