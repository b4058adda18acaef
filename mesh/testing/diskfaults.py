"""Disk faults on real brokers (``mesh.testing.launcher``), for the disk-loss tests and
the ``bench diskfaults`` campaign.

Each fault stops one broker (``kill -9``), damages its data directory and restarts it
with the same id:

- ``wipe``: the directory is deleted (a new disk);
- ``rollback``: the directory is replaced by a copy taken earlier (``snapshot``);
- ``truncate``: ``data.mdb`` is cut to half (the broker refuses it with a clear error;
  the fault restarts it with ``--rejoin-empty``);
- ``flip``: one byte inside a stored record batch is flipped (CRC failure on read).

``wait_in_sync`` waits until every partition of a topic has a leader whose in-sync set is
the whole replica set, no replica reports recovering, and the high watermark reached a
floor; ``read_back`` reads every partition from the start below the high watermark.
"""
from __future__ import annotations

import os
import shutil
import time

from mesh.testing.launcher import BrokerProcess, wait_until

__all__ = ["wipe", "snapshot", "restore", "truncate", "flip", "wait_in_sync", "read_back",
           "partition_state", "leader_broker"]


def wipe(b: BrokerProcess, start: bool = True) -> None:
    b.kill()
    shutil.rmtree(b.data_dir, ignore_errors=True)
    if start:
        b.start(wait=False)


def snapshot(b: BrokerProcess, dest: str) -> None:
    """Copy the broker's data directory to ``dest`` while it is stopped (then start it)."""
    b.stop()
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(b.data_dir, dest, ignore=shutil.ignore_patterns("mesh.lock"))
    b.start(wait=False)


def restore(b: BrokerProcess, src: str, start: bool = True) -> None:
    """Roll the broker's data directory back to the copy ``src``."""
    b.kill()
    shutil.rmtree(b.data_dir, ignore_errors=True)
    shutil.copytree(src, b.data_dir)
    if start:
        b.start(wait=False)


def truncate(b: BrokerProcess, timeout_s: float = 20.0) -> str:
    """Cut data.mdb in half; check the broker refuses it clearly; restart it with
    --rejoin-empty. Returns the refusal's log line."""
    b.kill()
    f = os.path.join(b.data_dir, "data.mdb")
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    mark = len(b.log(1 << 30))
    b.start(wait=False)
    code = b.wait_stopped(timeout_s)
    said = b.log(1 << 30)[mark:]
    if code != 1 or "--rejoin-empty" not in said:
        raise AssertionError(f"{b.node_id} did not refuse its truncated store clearly (exit {code}):\n{said}")
    b.extra = [*b.extra, "--rejoin-empty"]
    try:
        b.start(wait=False)
    finally:
        b.extra = [a for a in b.extra if a != "--rejoin-empty"]
    return next((ln for ln in said.splitlines() if "truncated" in ln), said.strip()[-300:])


def flip(b: BrokerProcess, marker: bytes | None = None, start: bool = True) -> bool:
    """Stop the broker and flip one byte inside a stored record (the first occurrence of
    ``marker``, or a byte in the middle of the file's record data). True if flipped."""
    b.kill()
    f = os.path.join(b.data_dir, "data.mdb")
    with open(f, "r+b") as fh:
        data = fh.read()
        at = data.find(marker) if marker else -1
        if at < 0:
            return False
        fh.seek(at)
        fh.write(bytes([data[at] ^ 0x20]))
    if start:
        b.start(wait=False)
    return True


def _topic(b: BrokerProcess, topic: str) -> dict | None:
    """``topic`` as broker ``b`` describes it (None if it does not know it)."""
    from mesh.client import Admin
    with Admin(b.address, request_timeout_ms=1000) as a:
        ts = a.metadata([topic]).topics
    return ts[0] if ts and not ts[0].get("error") else None


def partition_state(brokers: list[BrokerProcess], topic: str) -> list[dict] | None:
    """Each partition as its leader describes it (None if some partition has no answering
    leader)."""
    live = [b for b in brokers if b.alive()]
    if not live:
        return None
    t = None
    for b in live:
        try:
            t = _topic(b, topic)
            break
        except Exception:
            continue
    if t is None:
        return None
    out = []
    for p in t["partitions"]:
        lb = next((b for b in live if b.node_id == p["leader"]), None)
        if lb is None:
            return None
        lt = _topic(lb, topic)
        if lt is None:
            return None
        out.append(lt["partitions"][p["partition"]])
    return out


def leader_broker(brokers: list[BrokerProcess], topic: str, partition: int = 0) -> BrokerProcess:
    def find():
        st = partition_state(brokers, topic)
        if st is None:
            return None
        return next((b for b in brokers if b.node_id == st[partition]["leader"]), None)
    return wait_until(find, 30, f"a leader of {topic}/{partition}")


def wait_in_sync(brokers: list[BrokerProcess], topic: str, min_hw: int | dict = 0,
                 timeout_s: float = 60.0) -> float:
    """Wait until every partition is fully replicated (in-sync set = replicas, nobody
    recovering, high watermark >= ``min_hw``, per partition if a dict). Returns seconds."""
    t0 = time.monotonic()

    def floor_of(p):
        return min_hw.get(p["partition"], 0) if isinstance(min_hw, dict) else min_hw

    def ok():
        for b in brokers:
            b.check_running()
        st = partition_state(brokers, topic)
        if st is None:
            return False
        for p in st:
            if (sorted(p["isr"]) != sorted(p["replicas"]) or p.get("recovering")
                    or p["high_watermark"] < floor_of(p)):
                return False
        for b in brokers:   # and each replica, first hand: settled identity, refilled, holding the floor
            from mesh.client import Admin
            with Admin(b.address, request_timeout_ms=1000) as a:
                md = a.metadata([topic])
            me = next(x for x in md.brokers if x["id"] == b.node_id)
            if me.get("identity", "confirmed") != "confirmed" or me.get("recovering"):
                return False
            for p in md.topics[0]["partitions"]:
                if b.node_id in p["replicas"] and ("local_end" not in p or p["local_recovering"]
                                                   or p["local_end"] < floor_of(p)):
                    return False
        return True
    wait_until(ok, timeout_s, f"{topic} fully replicated with high watermark >= {min_hw}")
    return time.monotonic() - t0


def read_back(bootstrap: str, topic: str, partitions: int, expect: int, timeout_s: float = 60.0) -> dict:
    """{value: (partition, offset)} of everything readable from the start; stops once
    ``expect`` records were read or the time is up (retrying retriable errors)."""
    from mesh.client import Consumer, TopicPartition
    got: dict[bytes, tuple[int, int]] = {}
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        while len(got) < expect and time.monotonic() < deadline:
            try:
                batches = c.poll_batches(500)
            except Exception:
                continue
            for recs in batches:
                for r in recs:
                    got[r.value] = (r.partition, r.offset)
    return got
