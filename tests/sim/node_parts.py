"""The pieces of the node-level simulation (tests/sim/node_sim.py): its configuration, the
store (``MemoryStore`` whose group commit can fail), the simulated broker's slots, and the
clients' state."""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass

import msgpack

from mesh.client.sequencer import RetryPolicy, SeqBatch, Sequencer
from mesh.cluster.catalog import Catalog
from mesh.node.data.datapath import DataPath
from mesh.node.replication.raft_host import ReplicaHost
from mesh.raft import ReplicationConfig
from storage.base import LogError
from storage.memory import MemoryStore

__all__ = ["TOPIC", "SIM_REPLICATION", "NodeSimConfig", "SimStore", "Registry", "Broker", "SimBatch",
           "Producer", "Consumer", "REQUEST_TIMEOUT_MS", "CLIENT_EVERY_MS", "MAX_INBOX_PER_TURN"]

TOPIC = "t"
_STATE_KEY = struct.Struct(">Q")
MAX_INBOX_PER_TURN = 256
REQUEST_TIMEOUT_MS = 1_500     # a client gives up on an answer and retries
CLIENT_EVERY_MS = 20           # clients look at their timers this often

SIM_REPLICATION = ReplicationConfig(
    heartbeat_ticks=2, election_ticks=10, retransmit_ticks=6, rebalance_delay_ticks=40,
    isr_lag_ticks=40, housekeeping_ticks=20, max_inflight_msgs=4, max_inflight_bytes=4096,
    max_append_bytes=700, max_message_bytes=2048, max_rows_per_message=64,
)


@dataclass
class NodeSimConfig:
    seed: int = 0
    steps: int = 1500              # broker turns in the fault phase
    brokers: int = 3
    partitions: int = 3
    rf: int = 3
    producers: int = 2
    tick_ms: int = 50
    faults: bool = True
    wipes: bool = False            # also lose whole disks (a broker restarts empty: lost state)
    early_appends: bool = True     # leaders' appends leave before the turn's sync (ReplicaHost)
    early_acks: bool = True        # acks=all answers a drained commit advance allows, before the sync
    follow_hints: bool = True      # producers retry at a NOT_LEADER's named leader at once (first time)
    stops: bool = False            # a third of the crashes are graceful stops (hand leaderships over first)
    catch_up_ticks: bool = False   # the shell's cadence before one tick per turn: every tick due, at most 10
    loss: float = 0.03
    dup: float = 0.03
    delay_ms: tuple[int, int] = (1, 12)
    slow_p: float = 0.03
    slow_ms: tuple[int, int] = (40, 500)
    fault_gap_ms: tuple[int, int] = (50, 800)
    produce_gap_ms: tuple[int, int] = (5, 60)
    converge_ms: int = 60_000
    replication: ReplicationConfig = SIM_REPLICATION

    def argv(self) -> str:
        return (f"--seed {self.seed} --steps {self.steps} --brokers {self.brokers} "
                f"--partitions {self.partitions} --rf {self.rf} --producers {self.producers}"
                + ("" if self.faults else " --no-faults") + (" --wipes" if self.wipes else "")
                + ("" if self.early_appends else " --no-early-appends")
                + ("" if self.early_acks else " --no-early-acks")
                + ("" if self.follow_hints else " --no-follow-hints") + (" --stops" if self.stops else "")
                + (" --catch-up-ticks" if self.catch_up_ticks else ""))


# -- the store: MemoryStore whose group commit can fail ---------------------------------------

class SimStore(MemoryStore):
    """``MemoryStore`` plus a fault (``armed``: the next commit fails, the turn is rolled
    back) and the checkers' record of what the last successful commit made durable."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__()
        self._init_sim(pids)

    def _init_sim(self, pids: list[int]) -> None:
        self.pids = pids
        self.armed = False
        self.commits_ok = self.commits_failed = 0
        self.durable_end: dict[int, int] = {}
        self.durable_state: dict[int, bytes | None] = {}
        self._snapshot()

    def commit(self, now_ms: int | None = None) -> None:
        if self.armed:
            self.armed = False
            self.commits_failed += 1
            self.rollback()
            raise LogError("simulated: the disk refused the turn's commit")
        super().commit(now_ms)
        self.commits_ok += 1
        self._snapshot()

    def _snapshot(self) -> None:
        # right after a commit nothing is staged: what the store shows is what is durable
        for pid in self.pids:
            self.durable_end[pid] = self.log_end(pid)
            self.durable_state[pid] = self.get("repl", _STATE_KEY.pack(pid))

    def crash(self) -> "SimStore":
        fresh = MemoryStore.crash(self)
        out = SimStore.__new__(SimStore)
        out.__dict__.update(fresh.__dict__)
        out._init_sim(self.pids)
        return out

    def state(self, pid: int) -> tuple[int, str | None]:
        """(term, vote) durable for ``pid`` ((0, None) before the first)."""
        raw = self.durable_state.get(pid)
        if raw is None:
            return 0, None
        term, vote = msgpack.unpackb(raw, raw=False)[:2]   # [term, vote, commit, epoch cache, ...]
        return term, vote

    def epoch_cache(self, pid: int) -> list:
        """The durable epoch cache of ``pid``: [[epoch, start offset], ...]."""
        raw = self.durable_state.get(pid)
        return [] if raw is None else [list(e) for e in msgpack.unpackb(raw, raw=False)[3]]

    def held_batch(self, pid: int, base: int) -> bytes | None:
        """The batch at ``base`` as the store holds it now, staged or committed."""
        return self._logv.get((pid, base))

    def durable_batch(self, pid: int, base: int) -> bytes | None:
        """The committed batch starting at ``base``, if any (reads see committed data only)."""
        got = self.read(pid, base, 1, base + 1)
        if got and struct.unpack_from(">Q", got[0], 0)[0] == base:
            return bytes(got[0])
        return None


class Registry:
    """The part of the gossip core the catalog reads: ``cluster_items(prefix)``."""

    def __init__(self, registers: dict) -> None:
        self.registers = registers

    def cluster_items(self, prefix: str) -> dict:
        return {k: v for k, v in self.registers.items() if k.startswith(prefix)}


# -- brokers and clients ------------------------------------------------------------------------

class Broker:
    def __init__(self, nid: str, pids: list[int]) -> None:
        self.id = nid
        self.store = SimStore(pids)
        self.up = self.paused = False
        self.incarnation = 0
        self.skew_ms = 0
        self.inbox: list[tuple[str, list]] = []
        self.turn_at: int | None = None
        self.crash_in_turn = self.fail_commit = False
        self.stop_until: int | None = None  # stopping gracefully (``--stops``): until then, handing over
        self.handovers: dict[int, int] = {}  # pid -> handovers started while stopping
        self.wipes = 0                      # disks lost so far (``--wipes``)
        self.lost = False                   # restarted on an empty disk, replicas not yet refilled
        self.lost_stores: list[SimStore] = []  # disks lost (``--wipes``), as they were
        self.in_turn = False
        self.turn_commits = (0, 0)          # the store's (ok, failed) commit counts when the turn began
        self.host: ReplicaHost | None = None
        self.data: DataPath | None = None
        self.catalog: Catalog | None = None
        self.turn = None                    # mesh.node.turn.BrokerTurn
        self.stopped = False                # handed over (``--stops``): stops after this turn
        self.old_core = None                # the host's core when the turn came to its commit
        self.now_ms = lambda: 0


class SimBatch(SeqBatch):
    __slots__ = ("label", "values", "ts", "raw", "acked_at")

    def __init__(self, label: str, values: list[bytes], ts: int) -> None:
        super().__init__(len(values))
        self.label, self.values, self.ts = label, values, ts
        self.raw = b""
        self.acked_at = -1


class Producer:
    def __init__(self, cid: str, index: int, rng: random.Random, follow_hints: bool = True) -> None:
        self.id = cid
        self.ids = iter(range(1000 * (index + 1), 1000 * (index + 2)))
        self.seq = Sequencer(RetryPolicy(max_in_flight=3, backoff_ms=30, backoff_max_ms=400, jitter=0.2,
                                         follow_hints=follow_hints),
                             producer_id=next(self.ids), new_producer_id=lambda: next(self.ids), rng=rng)
        self.leader: dict[int, str] = {}
        self.rid = 0
        self.appended: dict[int, int] = {}
        self.acked: list[tuple[int, SimBatch, int]] = []    # (partition, batch, base offset)
        self.failed: list[tuple[int, SimBatch, str]] = []


class Consumer:
    def __init__(self, cid: str, partition: int) -> None:
        self.id = cid
        self.partition = partition
        self.offset = 0
        self.leader: str | None = None
        self.rid = 0
        self.waiting: tuple[int, int] | None = None          # (rid, sent at)
        self.seen: dict[int, bytes] = {}                      # base offset -> batch
