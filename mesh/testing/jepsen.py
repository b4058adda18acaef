"""A Jepsen-style run against real brokers: record, break, heal, read back, check.

Theory of operation
-------------------
``run(JepsenConfig(...))``:

1. starts N brokers (in network namespaces when partitions are asked for and possible,
   ``mesh.testing.netns``; otherwise on 127.0.0.1, and the partition fault is skipped
   with a message saying why), creates one topic;
2. starts the producer processes (``mesh.testing.history``), each sending unique values
   at a steady rate with the default ``Producer`` settings, and waits until every one
   has an acknowledgement;
3. runs the seeded nemesis (``mesh.testing.nemesis``) for ``fault_s`` seconds;
4. heals everything, lets the producers go on through a quiet period, stops them (each
   flushes what it has in flight);
5. reads every partition back through the client and checks it against the histories
   (``mesh.testing.checker``).

Everything a run produces stays in ``workdir``: the broker logs and data, one history
file per producer (``history-<i>.jsonl``), ``faults.jsonl`` and ``result.json``. A run
is reproduced by its seed (fault kinds, targets and timing; not the brokers' own
scheduling). ``python -m mesh.testing.jepsen --help`` runs one from the shell.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field

from mesh.testing.checker import CheckResult, check, read_back
from mesh.testing.history import ProducerProcess, load_history
from mesh.testing.launcher import Cluster, wait_until
from mesh.testing.nemesis import FAULT_KINDS, Nemesis
from mesh.testing.netns import NetnsNet, netns_available

__all__ = ["JepsenConfig", "JepsenRun", "run"]


@dataclass
class JepsenConfig:
    workdir: str
    seed: int = 1
    brokers: int = 5
    partitions: int = 6
    replication_factor: int = 3
    producers: int = 4
    rate_per_s: float = 100.0              # per producer
    fault_s: float = 90.0                  # how long the nemesis runs
    faults: list = field(default_factory=lambda: [k for k in FAULT_KINDS])
    hold_s: tuple = (2.0, 5.0)             # how long each fault lasts
    gap_s: tuple = (1.0, 3.0)              # quiet time between faults
    quiet_s: float = 5.0                   # after the heal, producers still sending
    drain_s: float = 20.0                  # each producer's final flush
    producer_options: dict = field(default_factory=dict)
    broker_extra: list = field(default_factory=list)
    topic: str = "jepsen"
    schedule: list | None = None           # fault kinds in this order instead of at random
    nemesis_class: type = Nemesis          # a subclass adds fault kinds (methods fault_<kind>)


@dataclass
class JepsenRun:
    config: JepsenConfig
    result: CheckResult
    faults: list
    skipped: list                           # (fault kind, why)
    wall_s: float

    def to_dict(self) -> dict:
        config = {**asdict(self.config), "nemesis_class": self.config.nemesis_class.__name__}
        return {"config": config, "result": self.result.to_dict(),
                "faults": [f.to_dict() for f in self.faults], "skipped": self.skipped,
                "wall_s": round(self.wall_s, 3)}


def run(cfg: JepsenConfig, log=print) -> JepsenRun:
    t_start = time.monotonic()
    if os.path.exists(os.path.join(cfg.workdir, "brokers")):
        raise ValueError(f"{cfg.workdir} already holds a run: choose an empty directory")
    os.makedirs(cfg.workdir, exist_ok=True)
    rng = random.Random(cfg.seed)
    skipped: list = []
    net = None
    kinds = list(cfg.faults)
    if "partition" in kinds:
        ok, why = netns_available()
        if ok:
            net = NetnsNet(cfg.brokers, random.Random(rng.random())).setup()
        else:
            kinds.remove("partition")
            skipped.append(("partition", why))
            log(f"jepsen: {why}")
    if "kill2" in kinds and cfg.brokers < 5:
        kinds.remove("kill2")
        skipped.append(("kill2", f"needs 5 brokers or more, not {cfg.brokers}"))
    producers: list[ProducerProcess] = []
    cluster = None
    try:
        cluster = Cluster(os.path.join(cfg.workdir, "brokers"), cfg.brokers, extra=list(cfg.broker_extra),
                          hosts=net.hosts if net else None, prefixes=net.prefixes if net else None)
        cluster.start(timeout_s=30)
        from mesh.client import Admin
        with Admin(cluster.bootstrap) as a:
            a.create_topic(cfg.topic, cfg.partitions, cfg.replication_factor, wait_s=20)
        paths = [os.path.join(cfg.workdir, f"history-{i}.jsonl") for i in range(cfg.producers)]
        producers = [ProducerProcess(cluster.bootstrap, cfg.topic, i, cfg.partitions, cfg.rate_per_s, paths[i],
                                     cfg.drain_s, cfg.producer_options).start() for i in range(cfg.producers)]
        try:
            wait_until(lambda: all(_has_ack(p) for p in paths), 30, "a first acknowledgement in every history",
                       interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the producers' errors: {_errors(paths)}") from None
        nemesis = cfg.nemesis_class(cluster, cfg.topic, cfg.partitions, rng, kinds, net=net,
                                    hold_s=cfg.hold_s, log=log)
        log(f"jepsen: seed {cfg.seed}, {cfg.brokers} brokers, {cfg.partitions} partitions, "
            f"{cfg.producers} producers, faults {','.join(nemesis.kinds) or 'none'} for {cfg.fault_s:g} s")
        try:
            nemesis.run(cfg.fault_s, cfg.gap_s, cfg.schedule)
        finally:
            nemesis.heal_all()
        healed_t = time.monotonic()
        log("jepsen: healed; quiet period")
        time.sleep(cfg.quiet_s)  # producers keep sending on a healthy cluster: the liveness phase
        for p in producers:
            p.stop_event.set()
        for p in producers:
            p.stop(cfg.drain_s + 30)
        ops = load_history(paths)
        got = read_back(cluster.bootstrap, cfg.topic, cfg.partitions)
        result = check(ops, got, nemesis.faults, healed_t)
        with open(os.path.join(cfg.workdir, "faults.jsonl"), "w") as f:
            for x in nemesis.faults:
                f.write(json.dumps(x.to_dict()) + "\n")
        out = JepsenRun(cfg, result, nemesis.faults, skipped, time.monotonic() - t_start)
        with open(os.path.join(cfg.workdir, "result.json"), "w") as f:
            json.dump(out.to_dict(), f, indent=1)
        return out
    finally:
        for p in producers:
            if p.process.is_alive():
                p.stop(5)
        if cluster is not None:
            for b in cluster.brokers:
                if b.alive():
                    b.resume()  # a paused broker ignores SIGTERM until it runs again
            cluster.stop()
        if net is not None:
            net.teardown()


def _has_ack(path: str) -> bool:
    try:
        with open(path) as f:
            return any('"f":"ok"' in line for line in f)
    except OSError:
        return False


def _errors(paths: list[str], limit: int = 3) -> list[str]:
    out: list[str] = []
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    rec = json.loads(line)
                    if rec.get("error") and rec["error"] not in out:
                        out.append(rec["error"])
                        if len(out) >= limit:
                            return out
        except (OSError, ValueError):
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="one Jepsen-style run against real brokers")
    ap.add_argument("workdir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--faults", default="kill,leader-kill,pause")
    a = ap.parse_args(argv)
    r = run(JepsenConfig(a.workdir, a.seed, a.brokers, a.partitions, min(3, a.brokers), a.producers, a.rate,
                         a.seconds, a.faults.split(",")))
    print(r.result.summary())
    return 0 if r.result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
