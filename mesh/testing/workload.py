"""A producer and a consumer that run while the cluster changes shape, and the check after.

Also the placement as metadata shows it (``topic_view``, ``balanced``): what the elastic
tests and ``bench.elastic`` wait for.

``Workload`` runs, on two threads, an idempotent acks=all producer sending distinct values
(``b"<tag>-<n>"``) round-robin over a topic's partitions, and a consumer assigned every
partition that reads from the beginning; it remembers every acknowledged value, every
value read, and errors by kind. ``check`` then reads the whole topic back and reports what
an acknowledged write must never suffer: lost (acknowledged, not in the log), doubled
(in the log twice) and reordered (a partition's values out of send order). Used by the
elastic-cluster tests and ``bench.elastic``.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Workload", "Verdict", "read_all", "topic_view", "placement_counts", "balanced"]


@dataclass
class Verdict:
    acked: int
    read: int
    lost: list = field(default_factory=list)
    doubled: list = field(default_factory=list)
    reordered: list = field(default_factory=list)

    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.reordered)

    def __str__(self) -> str:
        return (f"{self.acked} acknowledged, {self.read} read; lost {len(self.lost)} {self.lost[:3]}, "
                f"doubled {len(self.doubled)} {self.doubled[:3]}, reordered {len(self.reordered)} {self.reordered[:3]}")


def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0, creds=None) -> dict[int, list[bytes]]:
    """Every value of ``topic`` in log order per partition, read up to each partition's
    high watermark as it was when the read started."""
    from mesh.client import Consumer, TopicPartition
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest", creds=creds) as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning()
        ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
        pos = {p: 0 for p in range(partitions)}
        while any(pos[p] < ends[p] for p in pos) and time.monotonic() < deadline:
            try:
                batches = c.poll_batches(500)
            except Exception:
                continue
            for recs in batches:
                for r in recs:
                    if r.offset >= pos[r.partition]:
                        out[r.partition].append(r.value)
                        pos[r.partition] = r.offset + 1
    return out


class Workload:
    def __init__(self, bootstrap: str, topic: str, partitions: int, rate_per_s: float = 500.0,
                 tag: str = "w", creds=None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate_per_s = rate_per_s
        self.tag = tag.encode()
        self.creds = creds
        self.acked: dict[bytes, int] = {}           # value -> partition
        self.sent_order: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.errors: Counter = Counter()
        self.consumed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Workload":
        for target in (self._produce, self._consume):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def __enter__(self) -> "Workload":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _produce(self) -> None:
        from mesh.client import Producer
        n = 0
        interval = 1.0 / self.rate_per_s
        with Producer(self.bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000, creds=self.creds) as p:
            pending = []
            next_t = time.monotonic()
            while not self._stop.is_set():
                value = b"%s-%08d" % (self.tag, n)
                part = n % self.partitions
                self.sent_order[part].append(value)
                pending.append((value, part, p.send(self.topic, value, partition=part)))
                n += 1
                pending = self._reap(pending, block=False)
                next_t += interval
                delay = next_t - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
            p.flush(60)
            self._reap(pending, block=True)

    def _reap(self, pending: list, block: bool) -> list:
        left = []
        for value, part, fut in pending:
            if not block and not fut.done():
                left.append((value, part, fut))
                continue
            try:
                fut.get(60)
                with self._lock:
                    self.acked[value] = part
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
        return left

    def _consume(self) -> None:
        from mesh.client import Consumer, TopicPartition
        try:
            with Consumer(bootstrap=self.bootstrap, auto_offset_reset="earliest", creds=self.creds) as c:
                c.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
                c.seek_to_beginning()
                while not self._stop.is_set():
                    try:
                        for recs in c.poll_batches(200):
                            self.consumed += len(recs)
                    except Exception as exc:
                        self.errors["consume:" + type(exc).__name__] += 1
        except Exception as exc:
            self.errors["consumer:" + type(exc).__name__] += 1

    def check(self, timeout_s: float = 60.0) -> Verdict:
        """Read the topic back: lost, doubled and reordered acknowledged values."""
        logs = read_all(self.bootstrap, self.topic, self.partitions, timeout_s, creds=self.creds)
        mine = self.tag + b"-"                                 # other writers' records are not ours to judge
        logs = {p: [x for x in vals if x.startswith(mine)] for p, vals in logs.items()}
        seen = Counter(v for vals in logs.values() for v in vals)
        v = Verdict(acked=len(self.acked), read=sum(seen.values()))
        v.lost = sorted(x for x in self.acked if seen[x] == 0)
        v.doubled = sorted(x for x, k in seen.items() if k > 1)
        for p, vals in logs.items():
            rank = {x: i for i, x in enumerate(self.sent_order[p])}
            order = [rank[x] for x in vals if x in rank]
            if any(b < a for a, b in zip(order, order[1:])):
                v.reordered.append(p)
        return v


def topic_view(brokers, topic: str):
    """(partitions [{partition, replicas, learners, leader, ...}], brokers {id: entry}) of
    ``topic`` from the first live broker (``BrokerProcess``) that answers; (None, None)."""
    from mesh.client import Admin
    for b in brokers:
        if not b.alive():
            continue
        try:
            with Admin(b.address, request_timeout_ms=2000, creds=b.creds) as a:
                md = a.metadata([topic])
        except Exception:
            continue
        t = next((t for t in md.topics if t["name"] == topic), None)
        if t is not None and not t.get("error"):
            return t["partitions"], {x["id"]: x for x in md.brokers}
    return None, None


def placement_counts(parts) -> tuple[Counter, Counter]:
    """(replicas per broker, preferred leaderships per broker)."""
    reps, leads = Counter(), Counter()
    for p in parts:
        reps.update(p["replicas"])
        leads[p["replicas"][0]] += 1
    return reps, leads


def balanced(brokers, topic: str, members, rf: int, spread_leaders: bool = True) -> bool:
    """Every partition of ``topic`` has exactly ``rf`` voters, all in ``members``, no
    learners and a leader; replica (and preferred-leader) counts per member within 1."""
    parts, _ = topic_view(brokers, topic)
    if parts is None or any(len(p["replicas"]) != rf or p.get("learners") or p["leader"] is None
                            or not set(p["replicas"]) <= set(members) for p in parts):
        return False
    reps, leads = placement_counts(parts)
    rc, lc = [reps.get(m, 0) for m in members], [leads.get(m, 0) for m in members]
    return max(rc) - min(rc) <= 1 and (not spread_leaders or max(lc) - min(lc) <= 1)
