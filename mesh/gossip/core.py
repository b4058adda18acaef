"""The ``Gossip`` facade: one node's gossip state machine, composed of its mechanisms.

Feed it ``tick`` and ``receive``; send what they return (``mesh.wire.effects.Send``).
Write with ``set_local``/``delete_local`` (this node's namespace) and
``put_cluster``/``delete_cluster`` (cluster registers); read with ``node_items``,
``cluster_items``, ``members``, ``live_members``. The package docstring
(``mesh.gossip``) gives the overview; each rule lives next to its code:

==========================  =================================================  ==========
mechanism                   module                                             rules
==========================  =================================================  ==========
wire messages               ``mesh.gossip.messages``
typed rows, sizes           ``mesh.gossip.rows``
validation                  ``mesh.gossip.parsing``, ``checks``                R8
namespaces and deltas       ``mesh.gossip.namespaces``                         R1, R3
cluster registers           ``mesh.gossip.registers``                          R6
membership and liveness     ``mesh.gossip.membership``, ``detector``           R2, R4, R5
rounds and the exchange     ``mesh.gossip.rounds``
persistence                 ``mesh.gossip.snapshot``
==========================  =================================================  ==========

This module owns time: ``now_ms`` comes in with every call (R7: no clock, no global
random, no I/O), the heartbeat, round and GC timers, and the detection of a local stall.
``check_invariants()`` asserts the structural invariants; the simulator calls it after
steps.
"""
from __future__ import annotations

import random
from typing import Any

from mesh.gossip.checks import EntryCheck, Validator
from mesh.gossip.config import GossipConfig
from mesh.gossip.membership import Member, MembershipEvent, Membership
from mesh.gossip.messages import GossipPing, GossipPingAck, GossipSyn
from mesh.gossip.namespaces import Namespace, Namespaces
from mesh.gossip.parsing import MALFORMED_KINDS, Malformed
from mesh.gossip.probes import Probes
from mesh.gossip.registers import ClusterRegisters
from mesh.gossip.rounds import Rounds
from mesh.gossip.rows import MAX_LIFE, Row
from mesh.gossip.snapshot import restore_snapshot, take_snapshot
from mesh.gossip.suspicion import Suspicions
from mesh.wire.effects import Send

__all__ = ["Gossip"]

_STATS = ("rounds", "syn_received", "ack_received", "ack2_received", "malformed", "unknown_messages",
          "deltas_applied", "deltas_skipped", "resets_sent", "resets_applied", "truncated",
          "stalls", "identity_conflicts", "seed_probes", "stale_cluster_killed", "stale_cluster_dropped",
          "nodes_refused", "other_lives", "identity_conflicts_refused", "generation_jumps_refused", "kills_refused",
          "snapshot_dropped", "probes_sent", "probes_failed", "indirect_probes_sent", "relayed_pings",
          "suspicions_raised", "refutations", "pings_ignored",
          *(f"malformed_{k}" for k in MALFORMED_KINDS))


_YOUNG_BEATS = 0     # with probes, a life beats once (then only to refute: mesh.gossip.probes)


def _draw_life(rng: random.Random) -> int:
    """A life's nonce (``Row.life``): random, never 0 (0 means unknown)."""
    return 1 + rng.randrange(MAX_LIFE - 1)


class Gossip:
    """One node's gossip state. Feed it ``tick`` and ``receive``; send what they return."""

    def __init__(self, node_id: str, address: str, generation: int, seeds: list[str],
                 rng: random.Random, config: GossipConfig, now_ms: int,
                 snapshot: dict | None = None, validate_entry: Validator | None = None,
                 register_prefixes: tuple[str, ...] | None = None) -> None:
        """``validate_entry(key, value, now_ms) -> str | None`` judges every live entry a
        peer sends, a snapshot holds or this node writes (None: fine; else the reason);
        with ``register_prefixes`` cluster registers must use one of them and node
        namespace keys none (``mesh.gossip.checks``). Snapshot entries that fail are
        dropped (``load_warnings`` says which; peers send them again)."""
        if type(node_id) is not str or not node_id or type(address) is not str or not address:
            raise ValueError("node_id and address must be non-empty strings")
        if type(generation) is not int or generation < 0:
            raise ValueError("generation must be a non-negative int")
        self.node_id = node_id
        self.address = address
        self.generation = generation
        self.config = config
        self._rng = rng
        self.stats: dict[str, int] = dict.fromkeys(_STATS, 0)
        self._check = EntryCheck(validate_entry, register_prefixes, config.max_clock_skew_ms,
                                 config.tombstone_gc_ms)
        self._refused: str | None = None
        self.load_warnings: list[str] = []
        self._members = Membership(node_id, address, generation, config, self.stats, now_ms,
                                   life=_draw_life(rng))
        self._namespaces = Namespaces(self._members, rng, self.stats, config.max_entry_bytes)
        self._registers = ClusterRegisters(node_id, rng, self.stats, config.max_entry_bytes)
        self._rounds = Rounds(self._members, self._namespaces, self._registers, seeds, rng, config,
                              self.stats, now_ms, self._check)
        self._probes: Probes | None = None
        self._expired = None
        if config.probes:
            sus = Suspicions(self._members, config, self.stats)
            self._probes = Probes(self._members, sus, rng, config, self.stats)
            self._expired = sus.expired
        self._interval_ms = config.interval_ms
        self._last_step_ms = now_ms
        self._next_round_ms = now_ms + rng.randrange(config.interval_ms)
        self._next_hb_ms = self._next_round_ms + config.effective_heartbeat_ms - config.interval_ms
        self._gc_sweep_ms = max(config.interval_ms, config.tombstone_gc_ms // 16)
        self._next_gc_ms = now_ms + self._gc_sweep_ms
        if snapshot is not None:
            self.load_warnings = restore_snapshot(snapshot, self._members, self._registers, now_ms, self._check)
            self.stats["snapshot_dropped"] = len(self.load_warnings)

    # ---------------------------------------------------------------- inputs -----------

    def tick(self, now_ms: int) -> list[Send]:
        """Call every 10-50 ms: bumps the heartbeat, judges peers, starts a round when due."""
        self._observe(now_ms)
        self._last_step_ms = max(self._last_step_ms, now_ms)
        if self._members.left:
            return []
        if not self._members.seen_by_peer:   # (after, only a new confirmer can change it: saw_our_row)
            self._members.check_confirmed()
        if self._next_round_ms > now_ms + self._interval_ms:   # the clock went backwards
            self._next_round_ms = now_ms + self._interval_ms
        probes = self._probes
        if now_ms >= self._next_hb_ms:
            self._next_hb_ms = now_ms + self.config.effective_heartbeat_ms
            if (self._members.heard_peer or not self._members.hold_heartbeat) and (
                    probes is None or self._members.rows[self.node_id].heartbeat <= _YOUNG_BEATS):
                self._members.beat()     # (with probes: its first beat, then only to refute)
        out = probes.tick(now_ms) if probes is not None else []
        if now_ms < self._next_round_ms:
            return out
        self._next_round_ms = now_ms + self._interval_ms
        self.stats["rounds"] += 1
        self._members.judge(now_ms, self._expired)
        if now_ms >= self._next_gc_ms:
            self._next_gc_ms = now_ms + self._gc_sweep_ms
            self._collect(now_ms)
        if probes is not None:
            out += probes.round(now_ms)
        out += self._rounds.start(now_ms)
        return out

    def receive(self, src_address: str, msg: Any, now_ms: int) -> list[Send]:
        """A gossip message from ``src_address`` (the sender's gossip address: replies go there)."""
        self._observe(now_ms)
        unheard = self._members.hold_heartbeat and not self._members.heard_peer
        try:
            if self._probes is not None and type(msg) is GossipPing:
                out = self._probes.on_ping(src_address, msg, now_ms)
            elif self._probes is not None and type(msg) is GossipPingAck:
                out = self._probes.on_ack(src_address, msg, now_ms)
            else:
                out = self._rounds.dispatch(src_address, msg, now_ms)
        except Malformed as exc:
            self.stats["malformed"] += 1
            self.stats[f"malformed_{exc.kind}"] += 1
            self._refused = f"{type(msg).__name__} refused ({exc.kind}): {exc}"[:400]
            return []
        if out is None:
            self.stats["unknown_messages"] += 1
            return []
        if unheard and self._members.heard_peer:
            self._next_round_ms = now_ms   # a held first beat was just released: show it at once
        return out

    def take_refused(self) -> str | None:
        """Why the last message given to ``receive`` was refused (None if it was not, or if
        this was already taken): the node logs it once per peer."""
        why, self._refused = self._refused, None
        return why

    # ------------------------------------------------------------- own writes ----------

    def set_local(self, key: str, value: Any) -> None:
        """Write ``key`` in this node's namespace (a no-op if it already holds ``value``).
        ValueError if peers would refuse it (``validate_entry``, ``register_prefixes``)."""
        self._own_check(self._check.node_entry, key, value)
        self._namespaces.set_local(key, value, self._members.now_ms)

    def delete_local(self, key: str) -> None:
        """Delete ``key`` from this node's namespace, leaving a tombstone."""
        self._namespaces.delete_local(key, self._members.now_ms)

    def put_cluster(self, key: str, value: Any) -> None:
        """Write a cluster-wide last-writer-wins register, stamped (clock, this node).
        ValueError if peers would refuse it (``validate_entry``, ``register_prefixes``)."""
        self._own_check(self._check.register_entry, key, value)
        self._registers.put(key, value, self._members.now_ms)

    def _own_check(self, check, key: Any, value: Any) -> None:
        if type(key) is str:
            why = check(key, value, False, self._members.now_ms)
            if why is not None:
                raise ValueError(f"gossip entry refused: {why}")

    def delete_cluster(self, key: str) -> None:
        """Delete a cluster register. The tombstone beats every older write, wherever it is."""
        self._registers.delete(key, self._members.now_ms)

    def leave(self, now_ms: int) -> list[Send]:
        """Mark this node LEFT and tell ``leave_fanout`` peers at once (graceful shutdown).

        After this, ``tick`` starts no rounds; ``receive`` still answers, which helps the
        news spread while the shell drains its sockets.
        """
        self._observe(now_ms)
        if self._members.left:
            return []
        self._members.mark_left()
        return self._rounds.leave()

    def reincarnate(self, generation: int, now_ms: int) -> None:
        """Start a new life at ``generation`` without restarting (R2): the node learned
        that its generation is stale (``identity_conflict``) and has persisted a higher
        one. Our own namespace keeps its live keys, re-versioned from 1 (peers replace it
        wholesale on the new generation); tombstones are dropped with the old generation."""
        if type(generation) is not int or generation <= self.generation:
            raise ValueError(f"a new generation must exceed {self.generation}, not {generation!r}")
        self._observe(now_ms)
        old = self._members.namespaces.get(self.node_id)
        fresh = None
        if old is not None:
            fresh = Namespace()
            for k, e in sorted(old.entries.items(), key=lambda ke: ke[1].version):
                if not e.deleted:
                    fresh.put(k, len(fresh.entries) + 1, e.value, False, now_ms, e.size_bytes)
        self.generation = generation
        self._members.reincarnate(generation, fresh, _draw_life(self._rng))
        self._namespaces.version += 1

    @property
    def identity_conflict(self) -> int:
        """The highest generation a peer showed for this node that is not this life's
        (0: none): this node's stored state went back. See ``reincarnate``."""
        return self._members.identity_conflict

    @property
    def heard_peer(self) -> bool:
        """True once another node showed its view of us: a row for us (in a SYN, or of our
        generation in an ACK), or a full digest (SYN) without one. An ACK without a row of
        our generation for us does not count: it may be a late answer to another life."""
        return self._members.heard_peer

    @property
    def hold_heartbeat(self) -> bool:
        """Our heartbeat stays 0 until a peer showed its view of us (``heard_peer``), then
        beats at once (set by a shell that checks its identity): that first view is compared
        before the first beat, so a peer holding a row for our generation with another life,
        or with a heartbeat above 0, shows another life of it (R2, ``identity_conflict``)."""
        return self._members.hold_heartbeat

    @hold_heartbeat.setter
    def hold_heartbeat(self, on: bool) -> None:
        self._members.hold_heartbeat = bool(on)

    @property
    def seen_by_peer(self) -> bool:
        """True once a majority of the other members showed they hold this life of ours (our
        generation and life, a heartbeat >= 1 that this life sent), or one did and
        ``confirm_wait_ms`` passed (``Membership.check_confirmed``): from then on a restart
        that reuses our generation is detectable. With ``hold_heartbeat``, never before a
        peer's view of us was compared."""
        return self._members.seen_by_peer

    @property
    def majority_confirmed(self) -> bool:
        """True once a majority of the other members (not the ``confirm_wait_ms`` timer)
        showed they hold this life: no majority ever held another life of this node since
        (R2), so a conflict seen later is a forgery or a second process with our id, not a
        store that went back (``mesh.node.loop`` refutes it)."""
        return self._members.majority_confirmed

    # ---------------------------------------------------------------- reads ------------

    @property
    def version(self) -> int:
        """Moves whenever persisted state changed (not on mere heartbeats)."""
        return (self._members.version + self._namespaces.version + self._registers.version)

    @property
    def next_tick_ms(self) -> int:
        """The earliest time at which ``tick`` has something to do (a poll timeout hint)."""
        if self._members.left:
            return self._last_step_ms + self._interval_ms
        nxt = min(self._next_round_ms, self._next_hb_ms)
        probe = self._probes.next_deadline_ms() if self._probes is not None else None
        return nxt if probe is None else min(nxt, probe)

    @property
    def isolated(self) -> bool:
        """True while this node knows no other live node (it keeps probing its seeds)."""
        return self._members.others() <= 0

    @property
    def seeds(self) -> list[str]:
        return list(self._rounds.seeds)

    def set_clock_offset(self, offset_ms: int) -> None:
        """Judge peers' stamps and values by this clock plus ``offset_ms`` (the peers' time
        when ours is off: ``mesh.gossip.clock_offset``; ``mesh.gossip.checks``)."""
        self._check.offset_ms = int(offset_ms)

    def cluster_items(self, prefix: str = "") -> dict[str, Any]:
        """Live cluster registers whose key starts with ``prefix``, sorted by key."""
        return self._registers.items(prefix)

    def cluster_stamp(self, key: str) -> tuple[int, str, bool] | None:
        """(clock, writer, deleted) of the register ``key`` as this node holds it."""
        return self._registers.stamp(key)

    def cluster_hash(self) -> tuple[int, ...]:
        return tuple(self._registers.buckets)

    def node_items(self, node_id: str, prefix: str = "") -> dict[str, Any]:
        """Live keys of ``node_id``'s namespace (as far as this node knows), sorted by key."""
        return self._namespaces.items(node_id, prefix)

    def entry_version(self, node_id: str, key: str) -> tuple[int, int, bool] | None:
        """(generation, version, deleted) of ``key`` in ``node_id``'s namespace, if held."""
        return self._namespaces.entry_version(node_id, key)

    def digest_entry(self, node_id: str) -> tuple | None:
        """(generation, heartbeat, max_version, gc_version, address, left, life), if known."""
        row = self._members.rows.get(node_id)
        return None if row is None else row[1:]

    def status_of(self, node_id: str) -> str | None:
        if node_id not in self._members.rows:
            return None
        return self._members.status_of(node_id)

    def members(self, now_ms: int) -> list[Member]:
        return self._members.members(now_ms)

    def live_members(self, now_ms: int) -> list[str]:
        """Node ids considered alive, self included (unless it left), sorted.

        SUSPECT nodes are not included (they are still gossiped with); DEAD and LEFT never.
        """
        return self._members.live_members()

    def up_members(self, now_ms: int) -> list[str]:
        """Node ids ALIVE or SUSPECT, self included (unless it left), sorted: the brokers that
        still count (``mesh.cluster.liveness.is_up``). A suspicion is a question, not a
        verdict: under load a live broker is suspected for a round and refutes it."""
        m = self._members   # its targets: ALIVE or SUSPECT, self included
        return sorted(o for o in m.targets if o != m.node_id or not m.left)

    def take_events(self) -> list[MembershipEvent]:
        """Membership changes since the last call (bounded: the oldest are dropped)."""
        return self._members.take_events()

    # ------------------------------------------------------------- persistence ---------

    def snapshot(self) -> dict:
        """This node's view of the cluster, msgpack-able; pass it back as ``snapshot=``.

        Our own namespace is not included: a restart is a new generation, which starts
        empty (the shell re-publishes what it still holds).
        """
        return take_snapshot(self._members, self._registers)

    # ------------------------------------------------------------- time ----------------

    def _observe(self, now_ms: int) -> None:
        if now_ms - self._last_step_ms > self.config.effective_stall_ms:
            self.stats["stalls"] += 1            # our own loop stalled (R4)
            self._last_step_ms = now_ms
            self._members.on_stall(now_ms)
            if self._probes is not None:
                self._probes.on_stall(now_ms)
        if now_ms > self._members.now_ms:
            self._members.now_ms = now_ms

    def _collect(self, now_ms: int) -> None:
        """Tombstone and graveyard garbage collection (R3, R5, R6)."""
        horizon = now_ms - self.config.tombstone_gc_ms
        self._namespaces.collect(horizon)
        self._registers.collect(horizon)
        self._members.collect_graves(now_ms)

    def _syn(self) -> GossipSyn:
        """The SYN this node would send now (tests use it to replay a stale view)."""
        return self._rounds.syn()

    # ------------------------------------------------------------- checks --------------

    def check_invariants(self) -> None:
        """Assert the structural invariants (O(state)); the simulator runs it after steps."""
        self._members.check()
        self._registers.check()

    # ------------------------------------------------------------- simulation fixture --

    @classmethod
    def converged_cluster(cls, members: list[tuple[str, str, int]], seeds: list[str],
                          rngs: list[random.Random], config: GossipConfig, now_ms: int) -> list["Gossip"]:
        """Nodes that already agree on membership (as after a long quiet period).

        A fixture for simulations of large clusters: all nodes start from one shared,
        copy-on-write digest (every member ALIVE, no keys), so 10,000 nodes do not need
        10,000 copies of a 10,000-row table until they actually diverge. Detector clocks
        start when a member's heartbeat first moves.
        """
        rows = {o: Row(o, g, 0, 0, 0, a, False, 0) for o, a, g in members}   # lives unknown (0)
        if len(rows) != len(members):
            raise ValueError("duplicate node ids")
        targets = list(rows)
        tindex = {o: i for i, o in enumerate(targets)}
        hashes = None
        nodes = []
        for (o, a, g), rng in zip(members, rngs, strict=True):
            n = cls(o, a, g, seeds, rng, config, now_ms)
            n._members.share(rows, targets, tindex, hashes)
            if hashes is None:
                hashes = n._members.shared_hashes()
            nodes.append(n)
        return nodes
