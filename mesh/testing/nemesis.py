"""The nemesis of the Jepsen-style checker: seeded faults against real brokers, each one
healed before the next.

Theory of operation
-------------------
``Nemesis(cluster, topic, partitions, rng)`` injects one fault at a time, chosen by a
seeded ``random.Random`` from the enabled kinds:

- ``kill``: kill -9 a random broker, hold, restart it;
- ``leader-kill``: kill -9 the leader of a random partition, hold, restart it;
- ``pause``: SIGSTOP the leader of a random partition, hold, SIGCONT;
- ``kill2``: kill -9 two random brokers (with 5 or more brokers: a minority), hold,
  restart both;
- ``partition``: with brokers in network namespaces (``mesh.testing.netns``), cut a
  random broker (half the time the leader of a random partition) off from the other
  brokers, or split the brokers into a minority and a majority; clients still reach
  every broker; hold, heal;
- ``stop``: SIGTERM the leader of a random partition (a controlled shutdown: it hands its
  leaderships over, then leaves), wait until it has exited, hold, restart it;
- ``roll``: a rolling restart, as an operator's script does it: every broker in turn
  (random order) is SIGTERM'd, restarted, and waited for until every partition's leader
  reports all its replicas in sync (``diskfaults.wait_in_sync``), before the next; no hold.

Every fault is recorded as a ``Fault`` (kind, targets, start time, heal time, in
``time.monotonic()`` seconds, the clock of the history files). ``heal_all()`` undoes
whatever may still be in effect (resume paused brokers, restart dead ones, heal links)
and waits until the cluster has formed again and every partition has a leader.

The nemesis decides with its own rng only, so a seed fixes the sequence of fault kinds,
targets and hold times (which broker leads a partition depends on the run).
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field

from mesh.testing.diskfaults import wait_in_sync
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until

__all__ = ["FAULT_KINDS", "Fault", "Nemesis", "parse_faults"]

FAULT_KINDS = ("kill", "leader-kill", "pause", "kill2", "partition", "stop", "roll")


def parse_faults(spec: str | list[str]) -> list[str]:
    kinds = [k.strip() for k in spec.split(",")] if isinstance(spec, str) else list(spec)
    kinds = [k for k in kinds if k]
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        raise ValueError(f"unknown fault kind(s) {', '.join(bad)}: choose from {', '.join(FAULT_KINDS)}")
    return kinds


@dataclass
class Fault:
    kind: str
    targets: list[str]
    start_t: float
    heal_t: float | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class Nemesis:
    def __init__(self, cluster: Cluster, topic: str, partitions: int, rng: random.Random,
                 kinds: list[str], net=None, hold_s: tuple[float, float] = (2.0, 5.0),
                 log=print):
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.rng = rng
        self.net = net
        self.hold_s = hold_s
        self.log = log
        self.kinds = [k for k in kinds if self._possible(k)]
        self.faults: list[Fault] = []
        self._paused: set[str] = set()

    def _possible(self, kind: str) -> bool:
        if kind == "partition" and self.net is None:
            return False
        if kind == "kill2" and len(self.cluster.brokers) < 5:
            return False  # 2 of 3 is no quorum: nothing could be acknowledged
        return True

    # -- what the cluster says ------------------------------------------------------------
    def _broker(self, node_id: str) -> BrokerProcess:
        return next(b for b in self.cluster.brokers if b.node_id == node_id)

    def leader_of(self, partition: int) -> str | None:
        """The leader with the highest epoch any live broker reports."""
        return self._partitions_seen().get(partition, {}).get("leader")

    def _partitions_seen(self) -> dict[int, dict]:
        """partition -> its entry with the highest epoch that any live broker reports."""
        from mesh.client import Admin
        best: dict[int, dict] = {}
        for b in self.cluster.brokers:
            if not b.alive() or b.node_id in self._paused:
                continue
            try:
                with Admin(b.address, request_timeout_ms=500) as a:
                    md = a.metadata([self.topic])
            except Exception:
                continue
            for t in md.topics:
                if t.get("name") == self.topic and not t.get("error"):
                    for i, p in enumerate(t["partitions"]):
                        if p.get("leader") and p.get("epoch", -1) > best.get(i, {}).get("epoch", -1):
                            best[i] = p
        return best

    def all_led(self) -> bool:
        """Every partition has a leader that a live broker names, and that leader is live."""
        live = {b.node_id for b in self.cluster.brokers if b.alive()}
        seen = self._partitions_seen()
        return all(seen.get(p, {}).get("leader") in live for p in range(self.partitions))

    # -- faults ---------------------------------------------------------------------------
    def _hold(self) -> float:
        return self.rng.uniform(*self.hold_s)

    def _sleep(self, s: float) -> None:
        time.sleep(s)  # the fault's duration: part of the workload, not a wait for an event

    def run_one(self, kind: str | None = None) -> Fault:
        """Inject one fault (``kind`` or a random enabled one), hold it, heal it. A fault
        kind ``k`` is the method ``fault_<k>`` (dashes as underscores): a subclass adds
        kinds (e.g. disk faults) by adding methods and naming them in ``kinds``."""
        kind = kind or self.rng.choice(self.kinds)
        hold = self._hold()
        part = self.rng.randrange(self.partitions)
        f = Fault(kind, [], time.monotonic(), extra={"partition": part})
        getattr(self, "fault_" + kind.replace("-", "_"))(f, hold)
        f.detail = f.detail or f"{kind} {','.join(f.targets)} for {hold:.1f} s"
        self.faults.append(f)
        self.log(f"nemesis: {f.detail}")
        return f

    def _alive(self) -> list[BrokerProcess]:
        return [b for b in self.cluster.brokers if b.alive()]

    def _leader_or_any(self, part: int) -> BrokerProcess:
        leader = self.leader_of(part)
        return self._broker(leader) if leader else self.rng.choice(self._alive())

    def _kill_hold_restart(self, f: Fault, victims: list[BrokerProcess], hold: float) -> None:
        f.targets = [b.node_id for b in victims]
        for b in victims:
            b.kill()
        f.start_t = time.monotonic()
        self._sleep(hold)
        f.heal_t = time.monotonic()
        for b in victims:
            b.start(wait=True, timeout_s=30)

    def fault_kill(self, f: Fault, hold: float) -> None:
        self._kill_hold_restart(f, [self.rng.choice(self._alive())], hold)

    def fault_leader_kill(self, f: Fault, hold: float) -> None:
        self._kill_hold_restart(f, [self._leader_or_any(f.extra["partition"])], hold)

    def fault_kill2(self, f: Fault, hold: float) -> None:
        self._kill_hold_restart(f, self.rng.sample(self._alive(), 2), hold)

    def fault_pause(self, f: Fault, hold: float) -> None:
        b = self._leader_or_any(f.extra["partition"])
        f.targets = [b.node_id]
        b.pause()
        self._paused.add(b.node_id)
        f.start_t = time.monotonic()
        self._sleep(hold)
        f.heal_t = time.monotonic()
        b.resume()
        self._paused.discard(b.node_id)

    def fault_stop(self, f: Fault, hold: float) -> None:
        b = self._leader_or_any(f.extra["partition"])
        f.targets = [b.node_id]
        f.start_t = time.monotonic()
        f.extra["exit_code"] = b.stop(timeout_s=30)   # SIGKILL if it has not left in 30 s
        f.extra["stop_s"] = round(time.monotonic() - f.start_t, 3)
        self._sleep(hold)
        f.heal_t = time.monotonic()
        b.start(wait=True, timeout_s=30)

    def fault_roll(self, f: Fault, hold: float) -> None:
        order = self.rng.sample(self._alive(), len(self._alive()))
        f.targets = [b.node_id for b in order]
        f.start_t = time.monotonic()
        f.extra["exit_codes"] = []
        for b in order:
            f.extra["exit_codes"].append(b.stop(timeout_s=30))
            b.start(wait=True, timeout_s=30)
            wait_in_sync(self.cluster.brokers, self.topic, timeout_s=60)
        f.heal_t = time.monotonic()
        f.detail = f"roll {','.join(f.targets)} in {f.heal_t - f.start_t:.1f} s"

    def fault_partition(self, f: Fault, hold: float) -> None:
        """Cut one broker (half the time a partition's leader) off from the other brokers,
        or a random minority from the majority; clients still reach all of them."""
        ids = [b.node_id for b in self.cluster.brokers]
        n = len(ids)
        if self.rng.random() < 0.5:
            leader = self.leader_of(f.extra["partition"])
            side = [ids.index(leader) if leader in ids else self.rng.randrange(n)]
            f.extra["mode"] = "isolate"
        else:
            side = self.rng.sample(range(n), (n - 1) // 2 or 1)
            f.extra["mode"] = "split"
        f.targets = [ids[i] for i in sorted(side)]
        self.net.split(side)
        f.start_t = time.monotonic()
        self._sleep(hold)
        f.heal_t = time.monotonic()
        self.net.heal()

    def heal_all(self, timeout_s: float = 60.0) -> None:
        """Undo every fault still in effect; wait until the cluster has formed and every
        partition has a live leader."""
        for b in self.cluster.brokers:
            if b.node_id in self._paused and b.alive():
                b.resume()
        self._paused.clear()
        if self.net is not None:
            self.net.heal()
        for b in self.cluster.brokers:
            if not b.alive():
                b.start(wait=True, timeout_s=30)
        self.cluster.wait_converged(timeout_s)
        wait_until(self.all_led, timeout_s, f"a live leader for every partition of {self.topic}",
                   interval_s=0.1)

    def run(self, duration_s: float, gap_s: tuple[float, float] = (1.0, 3.0),
            schedule: list[str] | None = None) -> list[Fault]:
        """Faults one after another for ``duration_s``, a random gap between them; the
        kinds drawn at random, or taken in the order of ``schedule`` (then it stops)."""
        end = time.monotonic() + duration_s
        todo = list(schedule) if schedule is not None else None
        while time.monotonic() + self.hold_s[0] < end and self.kinds and todo != []:
            self.run_one(todo.pop(0) if todo else None)
            gap = self.rng.uniform(*gap_s)
            if time.monotonic() + gap >= end:
                break
            self._sleep(gap)
        return self.faults
