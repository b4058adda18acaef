"""Cluster metadata by gossip: Scuttlebutt push-pull anti-entropy (sans-I/O).

Theory of operation (overview; each rule is stated again next to its code)
=========================================================================
State. Every node owns a *namespace*: keys that only it writes (its member info, the
leaderships it holds, offsets committed through it). Each write takes the next *version*
of that namespace; a delete leaves a *tombstone*. A node's *row* is ``(node id,
generation, heartbeat, max version, gc version, address, left)``; the table of rows is
the *digest*. Next to the namespaces there is one cluster-wide store of last-writer-wins
registers (topics, configs), stamped ``(clock, writer node id)``.

Exchange, once per ``interval_ms``: SYN (my digest and bucket hashes), ACK (the rows
where we differ, the deltas you lack, my entries in the buckets that differ), ACK2 (the
deltas I lack, my newer entries). Deltas are bounded in bytes and always leave the
receiver with a prefix of an origin's history. When nothing changed, only digests travel.

Rules and invariants:
R1 Prefix: deltas apply only on top of what the receiver holds (``namespaces``).
R2 Identity: a higher generation replaces an origin; only the owner changes its own row
   (``membership``).
R3 Tombstones are collected after ``tombstone_gc_ms``; a peer behind that horizon gets
   a reset (``namespaces``).
R4 Liveness: phi-accrual on heartbeat arrivals, ALIVE -> SUSPECT -> DEAD, LEFT final,
   second-hand news unconfirmed, a local stall convicts nobody (``membership``,
   ``detector``). With ``GossipConfig.probes`` (the broker preset) SWIM probes and
   Lifeguard suspicion instead: a failed probe (direct, then through k peers) suspects,
   independent peers confirm, the suspect refutes with a newer heartbeat, each node
   convicts on its own timer (``probes``, ``suspicion``).
R5 No zombies: collected origins go to a graveyard that stale rows cannot pass
   (``membership``).
R6 Cluster registers: the greater stamp wins; collected tombstones are defended by kills
   (``registers``).
R7 Determinism: no clock, no global random, no I/O. Time is ``now_ms``, randomness the
   ``random.Random`` passed in, and nothing iterates a set in an order that reaches the
   output.
R8 Bounds: deltas per message (``max_delta_bytes``), entry size, key length, number of
   known nodes, graveyard and event queue sizes are all capped (``parsing``, ``config``).
   Every message and every snapshot entry is checked before anything is applied or
   persisted: counters and versions below 2**53, generations below 2**48, stamps no
   later than now plus ``max_clock_skew_ms``, key kinds and value shapes through the
   node's ``validate_entry`` (``checks``). A failing message is dropped whole and counted;
   a failing snapshot piece is dropped with a warning.

Modules, one per mechanism: ``messages`` (wire dataclasses), ``rows`` (typed rows and
sizes), ``parsing`` (validation), ``checks`` (what a peer may write), ``namespaces`` (per-origin state and deltas),
``registers`` (cluster registers), ``membership`` (generations, liveness, graveyard),
``detector`` (phi accrual), ``probes`` and ``suspicion`` (SWIM, Lifeguard), ``rounds`` (peer selection and the exchange), ``snapshot``
(persistence), ``config`` (``GossipConfig``), ``clock_offset`` (this node's clock offset
from its peers' stamps), and ``core`` (the ``Gossip`` facade).
"""
from __future__ import annotations

from mesh.gossip.config import GossipConfig
from mesh.gossip.core import Gossip
from mesh.gossip.detector import FailureDetector
from mesh.gossip.membership import Member, MembershipEvent
from mesh.gossip.messages import GossipAck, GossipAck2, GossipPing, GossipPingAck, GossipSyn
from mesh.gossip.rows import ALIVE, DEAD, LEFT, SUSPECT

__all__ = [
    "Gossip", "GossipConfig", "GossipSyn", "GossipAck", "GossipAck2", "GossipPing", "GossipPingAck",
    "FailureDetector", "Member", "MembershipEvent",
    "ALIVE", "SUSPECT", "DEAD", "LEFT",
]
