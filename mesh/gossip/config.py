"""Gossip settings (``GossipConfig``) and the preset the broker uses (``GossipConfig.lan``)."""
from __future__ import annotations

from dataclasses import dataclass

from mesh.gossip.rows import DELTA_OVERHEAD

__all__ = ["GossipConfig"]


@dataclass(frozen=True)
class GossipConfig:
    interval_ms: int = 200              # one round per interval
    fanout: int = 1                     # random live peers per round
    max_delta_bytes: int = 60_000       # bound on deltas + cluster entries in one message
    phi_threshold: float = 8.0
    dead_after_ms: int = 5_000          # a suspect becomes DEAD after this
    tombstone_gc_ms: int = 3_600_000    # tombstones and DEAD/LEFT namespaces live this long
    unreachable_probe_prob: float = 0.1  # per round: also try one DEAD node (heals partitions)
    seed_probe_prob: float = 0.05        # per round: also try one seed
    heartbeat_interval_ms: int = 0      # 0: bump the heartbeat every round
    stall_threshold_ms: int = 0         # 0: three rounds; a longer gap between steps is a local stall
    seed_retry_max_ms: int = 5_000      # backoff cap while we know no live peer
    leave_fanout: int = 3               # peers told at once on a graceful leave
    max_nodes: int = 20_000             # rows beyond this are ignored
    max_graveyard: int = 20_000
    max_events: int = 10_000
    detector_window: int = 100
    max_clock_skew_ms: int = 60_000     # a peer's stamp or gc clock beyond now + this is refused (R8)
    confirm_wait_ms: int = 2_000        # a new life confirmed by fewer than a majority of peers after this
    # SWIM probes with Lifeguard suspicion (``mesh.gossip.probes``, ``suspicion``) instead of
    # phi accrual on heartbeats: liveness that does not depend on heartbeat news reaching
    # everyone, so detection time does not grow with the cluster
    probes: bool = False
    probe_timeout_ms: int = 0           # 0: one interval; a direct ping unanswered this long goes indirect
    indirect_probes: int = 3            # peers asked to ping the target for us (SWIM's k)
    suspicion_min_ms: int = 0           # 0: 5 intervals; a suspicion confirmed by SUSPICION_K peers
    suspicion_max_ms: int = 0           # 0: 4 times the min; a suspicion nobody else confirmed
    retransmit_mult: int = 4            # news (suspicions, refutations) piggybacks this * log10(n+1) times

    def __post_init__(self) -> None:
        for name in ("interval_ms", "fanout", "dead_after_ms", "tombstone_gc_ms",
                     "seed_retry_max_ms", "leave_fanout", "max_nodes", "max_graveyard",
                     "max_events", "detector_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"GossipConfig.{name} must be at least 1")
        if self.max_delta_bytes < 1024:
            raise ValueError("GossipConfig.max_delta_bytes must be at least 1024")
        if self.indirect_probes < 0 or self.retransmit_mult < 1:
            raise ValueError("GossipConfig: indirect_probes >= 0 and retransmit_mult >= 1")
        if self.phi_threshold <= 0:
            raise ValueError("GossipConfig.phi_threshold must be positive")
        for name in ("unreachable_probe_prob", "seed_probe_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"GossipConfig.{name} must be within [0, 1]")
        if (self.heartbeat_interval_ms < 0 or self.stall_threshold_ms < 0 or self.max_clock_skew_ms < 0
                or self.confirm_wait_ms < 0 or self.probe_timeout_ms < 0 or self.suspicion_min_ms < 0
                or self.suspicion_max_ms < 0):
            raise ValueError("GossipConfig: negative interval")

    @classmethod
    def lan(cls, **overrides) -> "GossipConfig":
        """The preset the broker uses (memberlist's DefaultLANConfig idea): brokers on one
        low-loss network, liveness by SWIM probes with Lifeguard suspicion
        (``mesh.gossip.probes``): a direct ping answered within 250 ms, else through 3
        peers within 750 ms, else a suspicion; convicted 1.0-4.0 s (times log10 of the
        cluster size, at least 1) after a node learns it, the less the more peers confirmed
        it. Checked by the stall-hour simulation (1% loss, a node stalling 1 s in every
        10 s: no false conviction) and ``mesh.testing.gossip_detection`` (50-1,000 nodes).
        (``phi_threshold`` and ``dead_after_ms`` apply with ``probes=False`` only.)"""
        return cls(**{"phi_threshold": 4.0, "dead_after_ms": 1_000, "probes": True, "probe_timeout_ms": 250,
                      **overrides})

    @property
    def effective_probe_timeout_ms(self) -> int:
        return self.probe_timeout_ms or self.interval_ms

    @property
    def effective_suspicion_ms(self) -> tuple[int, int]:
        """(min, max) of the suspicion timeout (``mesh.gossip.suspicion``)."""
        lo = self.suspicion_min_ms or 5 * self.interval_ms
        return lo, max(lo, self.suspicion_max_ms or 4 * lo)

    @property
    def effective_heartbeat_ms(self) -> int:
        return self.heartbeat_interval_ms or self.interval_ms

    @property
    def effective_stall_ms(self) -> int:
        return self.stall_threshold_ms or 3 * self.interval_ms

    @property
    def max_entry_bytes(self) -> int:
        """The largest key + value one entry may have: it must fit in one message."""
        return self.max_delta_bytes - 2 * DELTA_OVERHEAD
