"""Settings of the replication core (``ReplicationConfig``), shared by the manager and
every partition replica. Times are in ticks; sizes in bytes; every bound is checked here,
when the config is built."""
from __future__ import annotations

from dataclasses import dataclass

from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["ReplicationConfig"]


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """Times are in ticks (the shell ticks every ``tick_ms``, e.g. 50 ms)."""
    heartbeat_ticks: int = 2
    election_ticks: int = 20            # timeouts are drawn from [election_ticks, 2 * election_ticks)
    retransmit_ticks: int = 10          # an unacked append older than this is resent
    rebalance_delay_ticks: int = 100    # lead this long before handing over to the preferred replica
    isr_lag_ticks: int = 200            # a follower caught up within this many ticks is in sync
    housekeeping_ticks: int = 100       # how often epoch caches are trimmed to the log start
    pre_vote: bool = True
    check_quorum: bool = True
    auto_rebalance: bool = True
    max_inflight_msgs: int = 16         # per follower
    max_inflight_bytes: int = 8 << 20   # per follower
    max_append_bytes: int = 1 << 20     # per append row (at least one batch)
    max_message_bytes: int = 4 << 20    # payload of one coalesced REPL_APPEND
    max_rows_per_message: int = 4096
    max_partitions: int = 100_000
    max_replicas: int = 9
    max_term_jump: int = 100            # a row more terms ahead than this is refused (see Partition.step)
    learner_bytes_per_tick: int = 0     # node-wide catch-up bytes to learners per tick (0: unlimited)
    quiesce_after_beats: int = 3        # an idle, caught-up partition goes quiet after this many beats (0: never)

    def __post_init__(self) -> None:
        if self.heartbeat_ticks < 1 or self.election_ticks < 2 * self.heartbeat_ticks + 1:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            "need heartbeat_ticks >= 1 and election_ticks > 2 * heartbeat_ticks")
        for name in ("retransmit_ticks", "rebalance_delay_ticks", "isr_lag_ticks", "housekeeping_ticks",
                     "max_inflight_msgs", "max_inflight_bytes", "max_append_bytes", "max_message_bytes",
                     "max_rows_per_message", "max_partitions", "max_replicas", "max_term_jump"):
            if getattr(self, name) < 1:
                raise MeshError(ErrorCode.INVALID_CONFIG, f"{name} must be positive")
        if self.quiesce_after_beats < 0:
            raise MeshError(ErrorCode.INVALID_CONFIG, "quiesce_after_beats must be 0 (never) or positive")
        if self.learner_bytes_per_tick < 0:
            raise MeshError(ErrorCode.INVALID_CONFIG, "learner_bytes_per_tick must be 0 (unlimited) or positive")
