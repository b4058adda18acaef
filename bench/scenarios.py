"""Named benchmark scenarios: a base workload plus sweeps that expand into cells.

Theory of operation
-------------------
A *workload* fixes every knob of one measurement (message size, records per request,
acks, producers, consumers, partitions, ...). A *scenario* is a base workload and a list
of *sweeps*; each sweep maps some knobs to lists of values and contributes the cross
product of those lists. The union of all sweeps, in order and without duplicates, is the
scenario's list of *cells*; each cell is measured on its own fresh topic.

Command-line flags override the scenario: a flag sets that knob in the base workload and
replaces it in every sweep, so ``--size 64`` turns a size sweep into one size, and
``--size 64,128`` into a sweep of two. Cells are listed by ``bench scenarios``.

Records per request (``batch``): ``batch >= 1`` sends exactly that many records per
produce request with ``Producer.send_batch`` (the DSBS study's "messages per
communication package"); ``batch = 0`` sends record by record with ``Producer.send`` and
lets the client batch by ``linger_ms`` and ``batch_bytes``, as a Kafka application does.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass

__all__ = ["Workload", "Scenario", "Cell", "SCENARIOS", "DEFAULT_BROKERS", "get_scenario",
           "KNOBS", "parse_size", "format_size", "BenchError"]

# The broker build this bench ships with serves single-broker clusters only (gossip and
# replication arrive with their own issues). Raise to 3 once `mesh node --seed` forms a
# cluster; `bench run --brokers 3` already starts three brokers seeding from the first.
DEFAULT_BROKERS = 3

KB = 1024


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreachable broker, missing Java...)."""


@dataclass(frozen=True)
class Workload:
    message_bytes: int = 100
    batch: int = 100                 # records per produce request; 0 = send() + linger
    linger_ms: int = 5               # batch = 0 only
    batch_bytes: int = 256 * KB      # batch = 0 only: the client's batch_size (its default)
    acks: str = "1"                  # "0", "1" or "all"
    in_flight: int = 5               # produce requests in flight per partition
    keys: bool = False               # keyed records (murmur2 partitioning) or none
    key_space: int = 1000            # distinct keys when keys are on
    producers: int = 1
    consumers: int = 1
    partitions: int = 3
    replication_factor: int = 1
    messages: int = 100_000          # total per cell (all producers); 0 = use duration_s
    max_bytes: int = 0               # cap a cell's messages x size at this (0 = no cap)
    duration_s: float = 0.0          # producers send this long when messages == 0
    rate: int = 0                    # target records/s for all producers; 0 = open throttle
    mode: str = "split"              # "split": produce then consume; "streaming": both at once
    group: str | None = None         # consumer group id (needs broker support)
    write_caching: bool = False      # the cell's topic has write.caching on (issue 41); False: fsync

    def validate(self) -> None:
        def need(cond, msg):
            if not cond:
                raise BenchError(msg)
        need(self.message_bytes >= 1, "message size must be at least 1 byte")
        need(self.message_bytes <= 1 << 20, "message size must be at most 1 MiB (the broker's record limit)")
        need(self.batch >= 0, "batch must be >= 0 (0 = send() with linger)")
        need(self.batch <= 100_000, "batch must be at most 100,000 records")
        need(self.linger_ms >= 0 and self.batch_bytes >= 1, "linger_ms >= 0 and batch_bytes >= 1")
        need(self.acks in ("0", "1", "all"), f"acks must be 0, 1 or all, not {self.acks!r}")
        need(self.in_flight >= 1, "in_flight must be >= 1")
        need(self.key_space >= 1, "key_space must be >= 1")
        need(self.producers >= 1, "at least one producer")
        need(self.consumers >= 0, "consumers must be >= 0")
        need(self.partitions >= 1, "at least one partition")
        need(self.replication_factor >= 1, "replication factor must be >= 1")
        need(self.mode in ("split", "streaming"), f"mode must be split or streaming, not {self.mode!r}")
        need(self.messages > 0 or self.duration_s > 0, "give a message count or a duration")
        need(self.messages >= 0 and self.duration_s >= 0 and self.rate >= 0 and self.max_bytes >= 0,
             "counts, sizes, durations and rates are >= 0")
        need(self.group is not None or self.consumers <= self.partitions,
             f"{self.consumers} consumers without a group need at least as many partitions "
             f"(have {self.partitions}): each consumer is assigned a share of the partitions")
        need(not (self.mode == "streaming" and self.consumers == 0), "streaming needs at least one consumer")


KNOBS = tuple(f.name for f in dataclasses.fields(Workload))


_SHORT = {"acks": "acks", "producers": "p", "consumers": "c", "partitions": "parts", "replication_factor": "rf",
          "rate": "r", "in_flight": "if", "linger_ms": "l", "batch_bytes": "bb", "keys": "keys", "key_space": "ks",
          "messages": "n", "max_bytes": "max", "duration_s": "d", "group": "g", "write_caching": "wc"}


@dataclass(frozen=True)
class Cell:
    index: int
    workload: Workload
    swept: tuple = ()      # knobs besides size, batch and mode that vary across the cells

    @property
    def id(self) -> str:
        w = self.workload
        extra = "".join(f"-{_SHORT.get(k, k)}{getattr(w, k)}" for k in self.swept)
        name = f"c{self.index:02d}-{format_size(w.message_bytes)}-b{w.batch}-{w.mode}{extra}"
        return re.sub(r"[^A-Za-z0-9._-]", "", name)  # it names a topic too

    @property
    def label(self) -> str:
        w = self.workload
        b = f"batch {w.batch}" if w.batch else f"send()+linger {w.linger_ms} ms"
        extra = "".join(f", {k} {getattr(w, k)}" for k in self.swept)
        return f"{format_size(w.message_bytes)} {b} {w.mode}{extra}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    base: Workload
    sweeps: tuple = ()                       # tuple of {knob: [values]}
    notes: str = ""
    paper: bool = False                      # compare with the DSBS paper's tables
    runner: str = ""                         # "" = cells through bench.cell; "peer-nats" = bench.peer; "kafka" = bench.peer_kafka

    def with_overrides(self, overrides: dict) -> "Scenario":
        """Flags win. ``overrides`` maps a knob to a list of values: one value sets the
        knob in the base and removes it from every sweep (except a sweep's ``rate`` of 0:
        ``--rate`` paces the latency cells, not a maximum-throughput cell); several values
        sweep it in every sweep."""
        for k in overrides:
            if k not in KNOBS:
                raise BenchError(f"unknown knob {k!r}; known: {', '.join(KNOBS)}")
        base = dataclasses.replace(self.base, **{k: v[0] for k, v in overrides.items()})
        sweeps = []
        for sw in self.sweeps or ({},):
            sw = dict(sw)
            for k, v in overrides.items():
                if len(v) > 1:
                    sw[k] = list(v)
                elif k == "rate" and list(sw.get(k, ())) == [0]:
                    pass  # a sweep's unpaced maximum-throughput cell stays unpaced
                else:
                    sw.pop(k, None)
            sweeps.append(sw)
        return dataclasses.replace(self, base=base, sweeps=tuple(sweeps))

    def swept_knobs(self) -> tuple:
        """Knobs besides size, batch and mode that name a cell: those a sweep lists
        several values of, and configuration knobs that different sweeps set differently
        (amounts of work, messages and duration_s, only when one sweep lists several)."""
        out = []
        for k in KNOBS:
            if k in ("message_bytes", "batch", "mode"):
                continue
            if any(len(sw.get(k, ())) > 1 for sw in self.sweeps):
                out.append(k)
            elif k not in ("messages", "duration_s", "max_bytes"):
                vals = {v for sw in self.sweeps for v in sw.get(k, ())}
                if any(k not in sw for sw in self.sweeps):
                    vals.add(getattr(self.base, k))
                if len(vals) > 1:
                    out.append(k)
        return tuple(out)

    def cells(self) -> list[Cell]:
        seen, out = set(), []
        swept = self.swept_knobs()
        for sw in self.sweeps or ({},):
            keys = list(sw)
            for combo in itertools.product(*(sw[k] for k in keys)):
                w = dataclasses.replace(self.base, **dict(zip(keys, combo)))
                if w.max_bytes and w.messages * w.message_bytes > w.max_bytes:
                    w = dataclasses.replace(w, messages=max(1, w.max_bytes // w.message_bytes))
                if w in seen:
                    continue
                seen.add(w)
                w.validate()
                out.append(Cell(len(out), w, swept))
        return out


def parse_size(text: str | int) -> int:
    """'32' -> 32, '4K'/'4KB' -> 4096, '1M' -> 1048576."""
    if isinstance(text, int):
        return text
    t = text.strip().upper().removesuffix("B")
    mult = 1
    if t.endswith("K"):
        mult, t = KB, t[:-1]
    elif t.endswith("M"):
        mult, t = KB * KB, t[:-1]
    try:
        return int(float(t) * mult)
    except ValueError:
        raise BenchError(f"bad size {text!r}: use bytes or a K/M suffix, e.g. 32, 4K, 1M") from None


def format_size(n: int) -> str:
    if n >= KB * KB and n % (KB * KB) == 0:
        return f"{n // (KB * KB)}MB"
    if n >= KB and n % KB == 0:
        return f"{n // KB}KB"
    return f"{n}B"


# The DSBS study (reference/seeds/004): message sizes 8-128 bytes (its appendix tables)
# and 1-128 KB (its method section and figures), batches of 1, 20 and 50 records,
# 30,000 messages per session, production and consumption apart ("split") and together
# ("streaming"). Its published tables are a cross: the size sweep at batch 20 and the
# batch sweep at 32 bytes; `dsbs` measures exactly that cross, `dsbs-full` the whole
# product (78 cells).
DSBS_SIZES = [8, 16, 32, 64, 128, 1 * KB, 2 * KB, 4 * KB, 8 * KB, 16 * KB, 32 * KB, 64 * KB, 128 * KB]
DSBS_BATCHES = [1, 20, 50]
_DSBS_BASE = Workload(message_bytes=32, batch=20, acks="1", in_flight=5, producers=1, consumers=1,
                      partitions=3, messages=30_000, max_bytes=256 * KB * KB, mode="split")
# The paper's parallelism: "one Linux machine as a producer and one ... as consumer. Both
# machines will use multi-thread programming to simulate a producer/consumer group", 3-5
# brokers, and its information table shows a topic of 3 partitions, one per broker. It
# does not give the thread count. We run 3 producer and 3 consumer processes: a consumer
# group cannot use more consumers than the topic's 3 partitions, and one producer per
# partition keeps each partition's leader fed by its own stream. A thread of the paper's
# machine is a request in flight here: each producer pipelines up to 15 requests per
# partition (the most the idempotent producer allows; 3 x 3 x 15 = up to 135 requests at
# once), which the brokers' group commit absorbs (one sync per turn for all of them). At
# batch 1 the client default of 5 leaves the brokers waiting: a cell is then bound by
# requests in flight / round trip (Little's law), not by what the brokers can do. And, for
# contrast, one of each with the client's defaults (the configuration of earlier runs).
DSBS_PARALLEL = ({"producers": [3], "consumers": [3], "in_flight": [15]}, {"producers": [1], "consumers": [1]})
RATE_SWEEP = (1_000, 2_000, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 320_000)


def _dsbs_sweeps(sizes: list[int], batches: list[int], cross: bool) -> tuple:
    out = []
    for par in DSBS_PARALLEL:
        if cross:
            out.append({"message_bytes": sizes, "batch": batches, "mode": ["split", "streaming"], **par})
        else:
            out.append({"message_bytes": sizes, "batch": [20], "mode": ["split", "streaming"], **par})
            out.append({"message_bytes": [32], "batch": batches, "mode": ["split", "streaming"], **par})
    return tuple(out)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("smoke", "tiny: two cells, a few thousand records (for tests)",
             Workload(message_bytes=64, batch=20, producers=1, consumers=1, partitions=2, messages=2_000),
             sweeps=({"mode": ["split", "streaming"]},)),
    # quick: the replicated system as a user would run it (3 brokers, RF 3, acks=all).
    # Cell 1 measures latency open-loop at a fixed rate well below saturation (10,000 rec/s,
    # send() with the client's default linger and in-flight limit), cell 2 the maximum
    # throughput (send_batch of 100, split); a rate past saturation would measure queueing.
    Scenario("quick", "a first look in about a minute: 3 brokers RF 3 acks=all, 100 B; latency at 10,000 rec/s "
                      "(streaming, 8 s) and maximum throughput (batch 100, split)",
             Workload(message_bytes=100, acks="all", replication_factor=3, producers=1, consumers=1,
                      partitions=3),
             sweeps=({"batch": [0], "rate": [10_000], "messages": [0], "duration_s": [8.0],
                      "mode": ["streaming"]},
                     {"batch": [100], "rate": [0], "in_flight": [8], "messages": [300_000], "mode": ["split"]}),
             notes="Latency is measured from each record's scheduled send time (open loop, as the "
                   "OpenMessaging Benchmark does), so queueing behind a slow request is counted. "
                   "`--rate` changes the target rate; `bench run --scenario rate-sweep` draws the whole "
                   "latency-versus-throughput curve."),
    Scenario("rate-sweep", "latency against offered rate (open loop): send() at 1k-320k rec/s, 6 s each, "
                           "streaming; 3 brokers RF 3 acks=all, 100 B",
             Workload(message_bytes=100, batch=0, acks="all", replication_factor=3, producers=1, consumers=1,
                      partitions=3, messages=0, duration_s=6.0, mode="streaming"),
             sweeps=({"rate": list(RATE_SWEEP)},),
             notes="Each cell offers a fixed rate and measures latency from the scheduled send time. "
                   "Below saturation the achieved rate equals the offered rate and latency is flat; past it "
                   "the achieved rate stops growing and latency grows with the run (queueing). Cells whose "
                   "achieved rate is under 90% of the offered rate are marked saturated."),
    Scenario("default", "throughput: 2 producers, 2 consumers, 6 partitions; 100 B and 1 KB; batch 20 and 200",
             Workload(message_bytes=100, batch=200, in_flight=8, producers=2, consumers=2, partitions=6,
                      messages=200_000),
             sweeps=({"message_bytes": [100, 1 * KB], "batch": [20, 200], "mode": ["split", "streaming"]},)),
    Scenario("dsbs", "the DSBS study's published cross: sizes 8 B-128 KB at batch 20, batches 1/20/50 at 32 B; "
                     "30,000 messages; split and streaming",
             _DSBS_BASE,
             sweeps=_dsbs_sweeps(DSBS_SIZES, DSBS_BATCHES, cross=False),
             notes="Cells are compared with the paper's appendix tables where it published numbers "
                   "(8-128 B at batch 20; batches 1/20/50 at 32 B). Every cell runs twice: with the "
                   "paper's parallelism (3 producer and 3 consumer processes, each producer with up to 15 "
                   "requests in flight per partition: the paper used one multi-threaded producer "
                   "machine and one consumer machine against 3-5 brokers and a 3-partition topic) and "
                   "with one of each (client defaults: 5 in flight). Each cell is capped at 256 MB "
                   "(16 KB and up send fewer than 30,000 messages); --max-bytes 0 lifts the cap.",
             paper=True),
    Scenario("dsbs-full", "every size x batch x mode of the DSBS study, 3+3 and 1+1 processes (156 cells; long)",
             _DSBS_BASE,
             sweeps=_dsbs_sweeps(DSBS_SIZES, DSBS_BATCHES, cross=True),
             paper=True),
    # in_flight 32: a linger-bound producer stays on one partition (the sticky partitioner
    # moves on when a batch fills), and 5 requests in flight, each waiting for a synced
    # broker turn, cannot carry 10,000 records/s on a busy 2-core machine.
    Scenario("latency", "fixed rate 10,000 records/s for 20 s, streaming, send()+linger 1 ms: latency percentiles",
             Workload(message_bytes=100, batch=0, linger_ms=1, in_flight=32, producers=1, consumers=1,
                      partitions=3, messages=0, duration_s=20, rate=10_000, mode="streaming")),
    # peer-nats: not cells; bench.peer runs it (its own clusters, no Spark)
    Scenario("peer-nats", "the same 100 B workload against this mesh (3 brokers RF 3 acks=all, fsync and write "
                          "caching; 1 broker) and a "
                          "NATS JetStream cluster it starts (R3; R1): blocking publish latency, end-to-end latency "
                          "at 10,000 rec/s, async publish and consume throughput, side by side",
             Workload(message_bytes=100, batch=0, acks="all", replication_factor=3, producers=1, consumers=1,
                      partitions=1, messages=100_000, rate=10_000, duration_s=5.0),
             notes="Needs `nats-server` on the PATH (`apt-get install nats-server`) and nats-py "
                   "(`pip install .[peer]`). --size and --messages change the workload; --rate and "
                   "--duration-s the end-to-end phase.",
             runner="peer-nats"),
    Scenario("kafka", "the same 100 B workload through the native client and through confluent-kafka against "
             "the Kafka port of one 3-broker cluster (RF 3, acks=all): blocking send p50/p99, async send and "
             "consume records/s, side by side (bench/peer_kafka.py)",
             Workload(message_bytes=100, messages=100_000, acks="all", partitions=1, replication_factor=3),
             runner="kafka"),
]}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise BenchError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
