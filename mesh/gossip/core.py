"""Cluster metadata by gossip: Scuttlebutt push-pull anti-entropy (sans-I/O).

Theory of operation
===================
State. Every node owns a *namespace*: keys that only it writes (its member info, the
leaderships it holds, offsets committed through it). Each write takes the next *version*
of that namespace (1, 2, 3, ... within one generation); a key holds only its latest
version; a delete leaves a *tombstone* (a versioned "deleted" entry). A node's *row* is
``(node id, generation, heartbeat, max version, gc version, address, left)``; the table
of rows is the *digest*. Next to the namespaces there is one cluster-wide store of
last-writer-wins registers (topics, configs), stamped ``(clock, writer node id)``.

Exchange (one round every ``interval_ms``, started by ``tick``):
1. SYN  A -> B: A's digest and the hashes of A's cluster-store buckets.
2. ACK  B -> A: the rows where B differs from A (what B knows newer, where B is
   behind), the deltas A lacks, and B's cluster entries in the buckets that differ.
   When the only difference is heartbeats at most two beats newer, B does not answer:
   heartbeats then spread by push, in every SYN, which halves idle traffic; a sender
   further behind (a joiner, a healed partition) gets them pulled in the ACK.
3. ACK2 A -> B: the deltas B lacks and A's newer cluster entries.
A delta for one origin is every entry with a version above the receiver's max version,
oldest first. Deltas of one message are bounded by ``max_delta_bytes``; a truncated
delta says how far it goes (``upto``), so the receiver always holds a *prefix* of the
origin's history and asks for the rest next round. When nothing changed, only digests
travel (heartbeats ride in them); an exchange with nothing to say ends after the SYN.

Rules and invariants:
R1 Prefix: a receiver applies a delta only if it holds the same generation of that
   origin and its max version >= the delta's ``from``; it skips entries at or below its
   max version. Duplicated, reordered or replayed messages are therefore harmless.
R2 Identity: rows merge by generation first. A higher generation *replaces* the origin
   (namespace dropped, not merged); within a generation the heartbeat and the ``left``
   flag only grow. Nobody but the owner changes its own row; a row for our own id with a
   higher generation is counted as an identity conflict and ignored.
R3 Tombstones are collected ``tombstone_gc_ms`` after a node stored them; the node then
   records the highest collected version as the origin's *gc version*. A peer whose
   ``max(max version, gc version)`` is below my gc version may still hold a key whose
   tombstone is gone, so it gets a *reset*: its copy is replaced by mine.
R4 Liveness: an origin's heartbeat moving feeds a phi-accrual detector (mesh.gossip.detector).
   ALIVE -> SUSPECT when phi > ``phi_threshold``; SUSPECT -> DEAD after
   ``dead_after_ms`` more; SUSPECT/DEAD -> ALIVE only when its heartbeat moves or a
   newer generation appears. An origin learned second-hand (or restored from a
   snapshot) starts SUSPECT, unconfirmed, until its heartbeat moves or a message from it
   arrives carrying its own row, so a long-dead node is never shown alive. LEFT (graceful leave, a flag
   in the origin's own row) is final for that generation. A node whose own loop stalled
   (``stall_threshold_ms`` between steps) restarts every detector clock instead of
   convicting peers it could not hear.
R5 No zombies: DEAD and LEFT origins keep their namespace (readable) for
   ``tombstone_gc_ms``, then are removed into a *graveyard* of (generation, heartbeat);
   rows at or below a grave are ignored, so a stale peer cannot bring them back.
R6 Cluster registers: the greater stamp wins. Stamps come from a hybrid clock
   ``max(clock + 1, now_ms)`` (a Lamport clock that also follows time). A tombstone is
   collected ``tombstone_gc_ms`` after it was stored, raising the node's *cluster gc
   clock*. An entry for a key we do not hold, stamped at or below that clock, is a
   deleted key offered by a stale peer: it is never stored, and a live one is answered
   with a *kill* (same stamp, deleted) that makes the peer drop its copy. A kill is not
   stored anywhere, so a mistaken one cannot delete a key cluster-wide. A node adopts a
   peer's gc clock only when their stores are equal (so a joiner cannot kill entries it
   has merely not received yet).
R7 Determinism: no clock, no global random, no I/O. Time is ``now_ms``, randomness the
   ``random.Random`` passed in, and nothing iterates a set in an order that reaches the
   output.
R8 Bounds: deltas per message (``max_delta_bytes``), entry size, key length, number of
   known nodes, graveyard and event queue sizes are all capped.

``check_invariants()`` asserts the structural invariants; the simulator calls it after
steps.
"""
from __future__ import annotations

import hashlib
import itertools
import operator
import random
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from mesh.gossip.detector import FailureDetector
from mesh.wire.effects import Send
from mesh.wire.codec import message

__all__ = [
    "GossipSyn", "GossipAck", "GossipAck2",
    "GossipConfig", "Gossip", "Member", "MembershipEvent",
    "ALIVE", "SUSPECT", "DEAD", "LEFT",
]

# ======================================================================================
# Wire messages (flat lists of fields keep them compact and cheap to validate)
#
#   digest          [[node_id, generation, heartbeat, max_version, gc_version, address, left], ...]
#   delta           [origin, generation, from_version, upto_version, gc_version, reset,
#                    [key, version, value, deleted, ...]]
#   cluster         16 bucket hashes (uint32), or [] when the store is empty / matched
#   cluster_entries [key, clock, writer, value, deleted, ...]
# ======================================================================================


@message("GOSSIP_SYN")
@dataclass(frozen=True, slots=True)
class GossipSyn:
    node_id: str
    digest: list
    cluster: list
    cluster_gc: int


@message("GOSSIP_ACK")
@dataclass(frozen=True, slots=True)
class GossipAck:
    node_id: str
    digest: list
    deltas: list
    cluster: list
    cluster_entries: list
    cluster_gc: int


@message("GOSSIP_ACK2")
@dataclass(frozen=True, slots=True)
class GossipAck2:
    node_id: str
    deltas: list
    cluster_entries: list


# ======================================================================================
# Configuration and public records
# ======================================================================================

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"

_ROW = 7                                  # fields per digest row
_ID, _GEN, _HB, _MV, _GC, _ADDR, _LEFT = range(_ROW)
_ENT = 4                                  # fields per delta entry
_CENT = 5                                 # fields per cluster entry
_BUCKETS = 16
_ZERO_BUCKETS = [0] * _BUCKETS
_DELTA_OVERHEAD = 40                      # bytes: a delta's header, roughly
_ENTRY_OVERHEAD = 12
_MAX_KEY_CHARS = 1024
_MAX_DEPTH = 32
_HEARTBEAT_SLACK_BEATS = 2   # a SYN this far behind on some heartbeat gets an answer


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

    def __post_init__(self) -> None:
        for name in ("interval_ms", "fanout", "dead_after_ms", "tombstone_gc_ms",
                     "seed_retry_max_ms", "leave_fanout", "max_nodes", "max_graveyard",
                     "max_events", "detector_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"GossipConfig.{name} must be at least 1")
        if self.max_delta_bytes < 1024:
            raise ValueError("GossipConfig.max_delta_bytes must be at least 1024")
        if self.phi_threshold <= 0:
            raise ValueError("GossipConfig.phi_threshold must be positive")
        for name in ("unreachable_probe_prob", "seed_probe_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"GossipConfig.{name} must be within [0, 1]")
        if self.heartbeat_interval_ms < 0 or self.stall_threshold_ms < 0:
            raise ValueError("GossipConfig: negative interval")

    @classmethod
    def lan(cls, **overrides) -> "GossipConfig":
        """The preset the broker uses (memberlist's DefaultLANConfig idea): brokers on one
        low-loss network. phi 4 is reached after ~9.2 mean gaps between heartbeat news
        (~3.2 s in a 5-node cluster at 200 ms); one more second of suspicion and a killed
        node is DEAD in ~4 s. Checked by the stall-hour simulation (1% loss, a node stalling
        1 s in every 10 s: no false conviction). On lossy networks (5% loss and more) it
        flaps; the conservative defaults do not."""
        return cls(**{"phi_threshold": 4.0, "dead_after_ms": 1_000, **overrides})

    @property
    def effective_heartbeat_ms(self) -> int:
        return self.heartbeat_interval_ms or self.interval_ms

    @property
    def effective_stall_ms(self) -> int:
        return self.stall_threshold_ms or 3 * self.interval_ms

    @property
    def max_entry_bytes(self) -> int:
        """The largest key + value one entry may have: it must fit in one message."""
        return self.max_delta_bytes - 2 * _DELTA_OVERHEAD


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    address: str
    generation: int
    status: str               # "alive" | "suspect" | "dead" | "left"
    heartbeat: int
    last_heard_ms: int | None  # when its heartbeat last moved here (None: never)
    phi: float
    max_version: int


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    at_ms: int
    node_id: str
    old: str                  # status, or "unknown" for a node we just learned
    new: str                  # status, or "removed" when collected into the graveyard


class _Malformed(Exception):
    pass


# ======================================================================================
# Helpers
# ======================================================================================


def _size(v: Any, depth: int = 0) -> int:
    """A cheap upper-ish estimate of msgpack's size for ``v``; TypeError if not msgpack data."""
    if v is None or v is True or v is False:
        return 1
    t = type(v)
    if t is int:
        return 1 if -32 <= v < 128 else 9
    if t is str:
        return (len(v) if v.isascii() else len(v.encode())) + 5
    if t is float:
        return 9
    if t is bytes or t is bytearray:
        return len(v) + 5
    if depth >= _MAX_DEPTH:
        raise TypeError("value nested too deeply")
    if t is list or t is tuple:
        return 5 + sum(_size(x, depth + 1) for x in v)
    if t is dict:
        return 5 + sum(_size(k, depth + 1) + _size(x, depth + 1) for k, x in v.items())
    raise TypeError(f"gossip values must be msgpack data, not {t.__name__}")


def _check_key(key: Any) -> None:
    if type(key) is not str or not key or len(key) > _MAX_KEY_CHARS:
        raise ValueError(f"gossip keys are non-empty strings of at most {_MAX_KEY_CHARS} characters")


def _types_ok(column: Any, allowed: type) -> bool:
    return not column or set(map(type, column)) <= {allowed}


def _ints_ok(column: Any) -> bool:
    return not column or (set(map(type, column)) <= {int} and min(column) >= 0)


def _bucket_of(key: str) -> int:
    return zlib.crc32(key.encode()) % _BUCKETS


def _entry_hash(key: str, clock: int, writer: str, deleted: bool) -> int:
    h = hashlib.blake2b(f"{key}\x00{clock}\x00{writer}\x00{int(deleted)}".encode(), digest_size=4)
    return int.from_bytes(h.digest(), "big")


_ROW_TYPES = [str, int, int, int, int, str, bool]


def _parse_rows(digest: Any, limit: int) -> dict[str, tuple]:
    """node id -> row tuple; _Malformed unless every row has the right shape and types."""
    if not isinstance(digest, (list, tuple)) or len(digest) > limit:
        raise _Malformed("digest")
    try:
        rows = list(map(tuple, digest))
    except TypeError as exc:
        raise _Malformed("digest rows") from exc
    if rows and (set(map(len, rows)) != {_ROW}
                 or list(map(type, itertools.chain.from_iterable(rows))) != _ROW_TYPES * len(rows)):
        raise _Malformed("digest types")
    out = dict(zip(map(operator.itemgetter(0), rows), rows))
    if len(out) != len(rows):
        raise _Malformed("digest: duplicate node")
    return out


def _parse_buckets(b: Any) -> list[int] | None:
    """None when the sender had nothing to say about its buckets."""
    if not b:
        return None
    if not isinstance(b, (list, tuple)) or len(b) != _BUCKETS or not _ints_ok(b):
        raise _Malformed("cluster buckets")
    return list(b)


def _parse_deltas(deltas: Any, limit: int) -> list[tuple]:
    if not isinstance(deltas, (list, tuple)) or len(deltas) > limit:
        raise _Malformed("deltas")
    out = []
    for d in deltas:
        if not isinstance(d, (list, tuple)) or len(d) != 7:
            raise _Malformed("delta shape")
        origin, gen, frm, upto, gc, reset, ents = d
        if (type(origin) is not str or type(reset) is not bool or not isinstance(ents, (list, tuple))
                or not _ints_ok((gen, frm, upto, gc)) or upto < frm or len(ents) % _ENT):
            raise _Malformed("delta header")
        keys, versions, deleted = ents[0::_ENT], ents[1::_ENT], ents[3::_ENT]
        if not (_types_ok(keys, str) and _ints_ok(versions) and _types_ok(deleted, bool)):
            raise _Malformed("delta entry types")
        prev = frm
        for v in versions:
            if v <= prev:
                raise _Malformed("delta versions must ascend above from_version")
            prev = v
        if prev > upto:
            raise _Malformed("delta entry beyond upto_version")
        try:
            sizes = [_ENTRY_OVERHEAD + _size(k) + _size(v) for k, v in zip(keys, ents[2::_ENT])]
        except TypeError as exc:
            raise _Malformed(str(exc)) from exc
        out.append((origin, gen, frm, upto, gc, reset, ents, sizes))
    return out


def _parse_cluster_entries(ents: Any, limit: int) -> tuple[Any, list[int]]:
    """The entries and each one's size; _Malformed unless every field is well typed."""
    if not isinstance(ents, (list, tuple)) or len(ents) % _CENT or len(ents) > _CENT * limit:
        raise _Malformed("cluster entries")
    keys = ents[0::_CENT]
    if not (_types_ok(keys, str) and _ints_ok(ents[1::_CENT])
            and _types_ok(ents[2::_CENT], str) and _types_ok(ents[4::_CENT], bool)):
        raise _Malformed("cluster entry types")
    if any(not k or len(k) > _MAX_KEY_CHARS for k in keys):
        raise _Malformed("cluster entry key")
    try:
        sizes = [_ENTRY_OVERHEAD + _size(k) + _size(v) + _size(w)
                 for k, v, w in zip(keys, ents[3::_CENT], ents[2::_CENT])]
    except TypeError as exc:
        raise _Malformed(str(exc)) from exc
    return ents, sizes


class _Namespace:
    """One origin's keys at one generation. ``by_version`` lists keys in version order."""

    __slots__ = ("entries", "by_version", "tombstones")

    def __init__(self) -> None:
        # key -> (version, value, deleted, stored_at_ms, size_bytes)
        self.entries: dict[str, tuple] = {}
        self.by_version: dict[int, str] = {}   # ascending: versions only ever append
        self.tombstones = 0

    def put(self, key: str, version: int, value: Any, deleted: bool, now_ms: int, size: int) -> None:
        old = self.entries.get(key)
        if old is not None:
            del self.by_version[old[0]]
            if old[2]:
                self.tombstones -= 1
        self.entries[key] = (version, value, deleted, now_ms, size)
        self.by_version[version] = key
        if deleted:
            self.tombstones += 1

    def since(self, version: int) -> list[tuple[int, str]]:
        """(version, key) above ``version``, ascending."""
        if version <= 0:
            return list(self.by_version.items())
        out = []
        for v in reversed(self.by_version):
            if v <= version:
                break
            out.append((v, self.by_version[v]))
        out.reverse()
        return out

    def collect(self, older_than_ms: int) -> int:
        """Drop tombstones stored before ``older_than_ms``; the highest dropped version (or 0)."""
        top = 0
        for key in [k for k, e in self.entries.items() if e[2] and e[3] <= older_than_ms]:
            version = self.entries.pop(key)[0]
            del self.by_version[version]
            self.tombstones -= 1
            top = max(top, version)
        return top


# ======================================================================================
# The state machine
# ======================================================================================


class Gossip:
    """One node's gossip state. Feed it ``tick`` and ``receive``; send what they return."""

    def __init__(self, node_id: str, address: str, generation: int, seeds: list[str],
                 rng: random.Random, config: GossipConfig, now_ms: int,
                 snapshot: dict | None = None) -> None:
        if type(node_id) is not str or not node_id or type(address) is not str or not address:
            raise ValueError("node_id and address must be non-empty strings")
        if type(generation) is not int or generation < 0:
            raise ValueError("generation must be a non-negative int")
        self.node_id = node_id
        self.address = address
        self.generation = generation
        self.config = config
        self._rng = rng
        self._seeds = sorted({s for s in seeds if s and s != address})
        self._now_ms = now_ms
        self._interval_ms = config.interval_ms
        self._max_entry_bytes = config.max_entry_bytes

        self._rows: dict[str, tuple] = {node_id: (node_id, generation, 0, 0, 0, address, False)}
        self._rows_shared = False          # copy-on-write (see converged_cluster)
        self._ns: dict[str, _Namespace] = {}
        self._status: dict[str, tuple[str, int]] = {}   # non-ALIVE origins: (status, since_ms)
        self._targets: list[str] = [node_id]             # gossip-able: ALIVE or SUSPECT, incl. self
        self._tindex: dict[str, int] = {node_id: 0}
        self._targets_shared = False
        self._detector = FailureDetector(
            expected_interval_ms=config.effective_heartbeat_ms, threshold=config.phi_threshold,
            window_size=config.detector_window, max_sample_ms=20 * config.effective_heartbeat_ms)
        self._graveyard: dict[str, tuple[int, int, int]] = {}   # origin -> (gen, heartbeat, removed_ms)

        # cluster store: key -> (clock, writer, value, deleted, stored_at_ms, size, bucket, hash)
        self._cluster: dict[str, tuple] = {}
        self._buckets = [0] * _BUCKETS
        self._cluster_tombstones = 0
        self._cluster_gc = 0
        self._clock = 0

        self._version = 0
        self._left = False
        self._last_step_ms = now_ms
        self._next_round_ms = now_ms + rng.randrange(config.interval_ms)
        self._next_hb_ms = self._next_round_ms + config.effective_heartbeat_ms - config.interval_ms
        self._gc_sweep_ms = max(config.interval_ms, config.tombstone_gc_ms // 16)
        self._next_gc_ms = now_ms + self._gc_sweep_ms
        self._seed_backoff_ms = config.interval_ms
        self._next_seed_ms = now_ms
        self._events: deque[MembershipEvent] = deque(maxlen=config.max_events)
        self.stats: dict[str, int] = dict.fromkeys((
            "rounds", "syn_received", "ack_received", "ack2_received", "malformed", "unknown_messages",
            "deltas_applied", "deltas_skipped", "resets_sent", "resets_applied", "truncated",
            "stalls", "identity_conflicts", "seed_probes", "stale_cluster_killed", "stale_cluster_dropped",
            "nodes_refused"), 0)
        if snapshot is not None:
            self._restore(snapshot, now_ms)

    # ---------------------------------------------------------------- inputs -----------

    def tick(self, now_ms: int) -> list[Send]:
        """Call every 10-50 ms: bumps the heartbeat, judges peers, starts a round when due."""
        self._observe(now_ms)
        self._last_step_ms = max(self._last_step_ms, now_ms)
        if self._left:
            return []
        if self._next_round_ms > now_ms + self._interval_ms:   # the clock went backwards
            self._next_round_ms = now_ms + self._interval_ms
        if now_ms >= self._next_hb_ms:
            self._next_hb_ms = now_ms + self.config.effective_heartbeat_ms
            row = self._rows[self.node_id]
            self._set_row(row[:_HB] + (row[_HB] + 1,) + row[_HB + 1:])
        if now_ms < self._next_round_ms:
            return []
        self._next_round_ms = now_ms + self._interval_ms
        self.stats["rounds"] += 1
        self._judge(now_ms)
        if now_ms >= self._next_gc_ms:
            self._next_gc_ms = now_ms + self._gc_sweep_ms
            self._collect(now_ms)
        return self._round(now_ms)

    def receive(self, src_address: str, msg: Any, now_ms: int) -> list[Send]:
        """A gossip message from ``src_address`` (the sender's gossip address: replies go there)."""
        self._observe(now_ms)
        try:
            if isinstance(msg, GossipSyn):
                self.stats["syn_received"] += 1
                return self._on_syn(src_address, msg, now_ms)
            if isinstance(msg, GossipAck):
                self.stats["ack_received"] += 1
                return self._on_ack(src_address, msg, now_ms)
            if isinstance(msg, GossipAck2):
                self.stats["ack2_received"] += 1
                self._on_ack2(msg, now_ms)
                return []
        except _Malformed:
            self.stats["malformed"] += 1
            return []
        self.stats["unknown_messages"] += 1
        return []

    # ------------------------------------------------------------- own writes ----------

    def set_local(self, key: str, value: Any) -> None:
        """Write ``key`` in this node's namespace (a no-op if it already holds ``value``)."""
        _check_key(key)
        size = self._entry_size(key, value)
        ns = self._ns.get(self.node_id)
        if ns is None:
            ns = self._ns[self.node_id] = _Namespace()
        old = ns.entries.get(key)
        if old is not None and not old[2] and old[1] == value and type(old[1]) is type(value):
            return
        self._own_write(ns, key, value, False, size)

    def delete_local(self, key: str) -> None:
        """Delete ``key`` from this node's namespace, leaving a tombstone."""
        _check_key(key)
        ns = self._ns.get(self.node_id)
        old = None if ns is None else ns.entries.get(key)
        if old is None or old[2]:
            return
        self._own_write(ns, key, None, True, _ENTRY_OVERHEAD + _size(key))

    def put_cluster(self, key: str, value: Any) -> None:
        """Write a cluster-wide last-writer-wins register, stamped (clock, this node)."""
        _check_key(key)
        size = self._entry_size(key, value) + _size(self.node_id)
        old = self._cluster.get(key)
        if old is not None and not old[3] and old[2] == value and type(old[2]) is type(value):
            return
        self._clock = max(self._clock + 1, self._now_ms)
        self._cluster_store(key, self._clock, self.node_id, value, False, size)

    def delete_cluster(self, key: str) -> None:
        """Delete a cluster register. The tombstone beats every older write, wherever it is."""
        _check_key(key)
        old = self._cluster.get(key)
        if old is not None and old[3]:
            return
        self._clock = max(self._clock + 1, self._now_ms)
        self._cluster_store(key, self._clock, self.node_id, None, True,
                            _ENTRY_OVERHEAD + _size(key) + _size(self.node_id))

    def leave(self, now_ms: int) -> list[Send]:
        """Mark this node LEFT and tell ``leave_fanout`` peers at once (graceful shutdown).

        After this, ``tick`` starts no rounds; ``receive`` still answers, which helps the
        news spread while the shell drains its sockets.
        """
        self._observe(now_ms)
        if self._left:
            return []
        self._left = True
        row = self._rows[self.node_id]
        self._set_row(row[:_LEFT] + (True,))
        self._retarget(self.node_id)
        self._event(self.node_id, ALIVE, LEFT)
        others = [t for t in self._targets if t != self.node_id]
        picks = self._rng.sample(others, min(self.config.leave_fanout, len(others)))
        syn = self._syn()
        return [Send(self._rows[p][_ADDR], syn) for p in picks]

    # ---------------------------------------------------------------- reads ------------

    @property
    def version(self) -> int:
        """Moves whenever persisted state changed (not on mere heartbeats)."""
        return self._version

    @property
    def next_tick_ms(self) -> int:
        """The earliest time at which ``tick`` has something to do (a poll timeout hint)."""
        if self._left:
            return self._last_step_ms + self._interval_ms
        return min(self._next_round_ms, self._next_hb_ms)

    @property
    def isolated(self) -> bool:
        """True while this node knows no other live node (it keeps probing its seeds)."""
        return len(self._targets) - (self.node_id in self._tindex) <= 0

    @property
    def seeds(self) -> list[str]:
        return list(self._seeds)

    def cluster_items(self, prefix: str = "") -> dict[str, Any]:
        """Live cluster registers whose key starts with ``prefix``, sorted by key."""
        return {k: e[2] for k, e in sorted(self._cluster.items())
                if not e[3] and k.startswith(prefix)}

    def cluster_stamp(self, key: str) -> tuple[int, str, bool] | None:
        """(clock, writer, deleted) of the register ``key`` as this node holds it."""
        e = self._cluster.get(key)
        return None if e is None else (e[0], e[1], e[3])

    def node_items(self, node_id: str, prefix: str = "") -> dict[str, Any]:
        """Live keys of ``node_id``'s namespace (as far as this node knows), sorted by key."""
        ns = self._ns.get(node_id)
        if ns is None:
            return {}
        return {k: e[1] for k, e in sorted(ns.entries.items()) if not e[2] and k.startswith(prefix)}

    def entry_version(self, node_id: str, key: str) -> tuple[int, int, bool] | None:
        """(generation, version, deleted) of ``key`` in ``node_id``'s namespace, if held."""
        ns = self._ns.get(node_id)
        e = None if ns is None else ns.entries.get(key)
        return None if e is None else (self._rows[node_id][_GEN], e[0], e[2])

    def digest_entry(self, node_id: str) -> tuple | None:
        """(generation, heartbeat, max_version, gc_version, address, left), if known."""
        row = self._rows.get(node_id)
        return None if row is None else row[1:]

    def cluster_hash(self) -> tuple[int, ...]:
        return tuple(self._buckets)

    def status_of(self, node_id: str) -> str | None:
        if node_id not in self._rows:
            return None
        return self._status_of(node_id)

    def members(self, now_ms: int) -> list[Member]:
        out = []
        for o in sorted(self._rows):
            row = self._rows[o]
            if o == self.node_id:
                out.append(Member(o, row[_ADDR], row[_GEN], self._status_of(o), row[_HB], now_ms, 0.0, row[_MV]))
            else:
                out.append(Member(o, row[_ADDR], row[_GEN], self._status_of(o), row[_HB],
                                  self._detector.last_ms(o), self._detector.phi(o, now_ms), row[_MV]))
        return out

    def live_members(self, now_ms: int) -> list[str]:
        """Node ids considered alive, self included (unless it left), sorted.

        SUSPECT nodes are not included (they are still gossiped with); DEAD and LEFT never.
        """
        status = self._status
        live = [o for o in self._rows if o not in status]
        if self._left:
            live.remove(self.node_id)
        live.sort()
        return live

    def take_events(self) -> list[MembershipEvent]:
        """Membership changes since the last call (bounded: the oldest are dropped)."""
        out = list(self._events)
        self._events.clear()
        return out

    # ------------------------------------------------------------- persistence ---------

    def snapshot(self) -> dict:
        """This node's view of the cluster, msgpack-able; pass it back as ``snapshot=``.

        Our own namespace is not included: a restart is a new generation, which starts
        empty (the shell re-publishes what it still holds).
        """
        nodes = []
        for o in sorted(self._rows):
            if o == self.node_id:
                continue
            row = self._rows[o]
            st, since = self._status.get(o, (ALIVE, self._now_ms))
            ns = self._ns.get(o)
            ents = []
            if ns is not None:
                for v, k in ns.by_version.items():
                    e = ns.entries[k]
                    ents += [k, v, e[1], e[2], e[3]]
            nodes.append([o, row[_GEN], row[_HB], row[_MV], row[_GC], row[_ADDR], row[_LEFT], st, since, ents])
        cluster = []
        for k, e in sorted(self._cluster.items()):
            cluster += [k, e[0], e[1], e[2], e[3], e[4]]
        return {
            "format": 1, "node_id": self.node_id, "generation": self.generation,
            "clock": self._clock, "cluster_gc": self._cluster_gc, "cluster": cluster,
            "nodes": nodes,
            "graveyard": [[o, g[0], g[1], g[2]] for o, g in self._graveyard.items()],
        }

    def _restore(self, snap: dict, now_ms: int) -> None:
        try:
            if snap.get("format") != 1 or snap.get("node_id") != self.node_id:
                raise ValueError("gossip snapshot belongs to another node or format")
            if not isinstance(snap.get("generation"), int) or snap["generation"] >= self.generation:
                raise ValueError(f"generation must increase across restarts: snapshot has "
                                 f"{snap.get('generation')}, starting with {self.generation}")
            self._clock = max(self._clock, int(snap["clock"]))
            self._cluster_gc = int(snap["cluster_gc"])
            c = snap["cluster"]
            for i in range(0, len(c), 6):
                key, clock, writer, value, deleted, stored = c[i:i + 6]
                self._cluster_store(key, clock, writer, value, bool(deleted),
                                    _ENTRY_OVERHEAD + _size(key) + _size(value) + _size(writer),
                                    min(stored, now_ms))
            for o, gen, hb, mv, gc, addr, left, st, since, ents in snap["nodes"]:
                if o == self.node_id or len(self._rows) >= self.config.max_nodes:
                    continue
                self._rows[o] = (o, gen, hb, mv, gc, addr, bool(left))
                if ents:
                    ns = self._ns[o] = _Namespace()
                    for i in range(0, len(ents), 5):
                        k, v, value, deleted, stored = ents[i:i + 5]
                        ns.put(k, v, value, bool(deleted), min(stored, now_ms),
                               _ENTRY_OVERHEAD + _size(k) + _size(value))
                if left:
                    self._status[o] = (LEFT, min(since, now_ms))
                elif st == DEAD:
                    self._status[o] = (DEAD, min(since, now_ms))
                else:
                    self._status[o] = (SUSPECT, now_ms)   # unconfirmed until its heartbeat moves
                self._retarget(o)
            for o, gen, hb, removed in snap["graveyard"]:
                if o not in self._rows:
                    self._graveyard[o] = (gen, hb, min(removed, now_ms))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unusable gossip snapshot: {exc}") from exc
        self._version += 1

    # ============================================================ exchange =============

    def _syn(self) -> GossipSyn:
        return GossipSyn(self.node_id, list(self._rows.values()),
                         list(self._buckets) if self._cluster else [], self._cluster_gc)

    def _on_syn(self, src: str, msg: GossipSyn, now_ms: int) -> list[Send]:
        their_buckets = _parse_buckets(msg.cluster)
        if type(msg.cluster_gc) is not int:
            raise _Malformed("cluster_gc")
        if type(msg.digest) is list and msg.digest == list(self._rows.values()):
            rows = self._rows        # the same digest, row for row: nothing to merge or say
            self._heard_from(msg.node_id, rows.get(msg.node_id), now_ms)
        else:
            rows = _parse_rows(msg.digest, 4 * self.config.max_nodes)
            self._merge_rows(rows, now_ms, msg.node_id)
        # rows where we know more, or where we are behind: the sender needs to see them.
        # Slightly newer heartbeats alone do not justify an answer (they spread by push).
        reply_rows: list[tuple] = []
        must_reply = False
        get = rows.get
        for o, r in self._rows.items() if rows != self._rows else ():
            a = get(o)
            if a == r:
                continue
            if (a is None or r[_GEN] != a[_GEN] or r[_MV] != a[_MV] or r[_GC] != a[_GC]
                    or r[_LEFT] != a[_LEFT]):
                reply_rows.append(r)
                must_reply = True
            elif r[_HB] > a[_HB]:
                reply_rows.append(r)
                if r[_HB] > a[_HB] + _HEARTBEAT_SLACK_BEATS:
                    must_reply = True
        budget = [self.config.max_delta_bytes]
        mine = self._buckets if self._cluster else _ZERO_BUCKETS
        theirs = their_buckets or _ZERO_BUCKETS
        centries: list = []
        cluster_reply: list = []
        if theirs != mine:
            mismatched = {i for i in range(_BUCKETS) if theirs[i] != mine[i]}
            centries = self._cluster_entries(mismatched, budget)
            cluster_reply = list(mine)
        elif msg.cluster_gc > self._cluster_gc:
            self._cluster_gc = msg.cluster_gc      # same store as the sender: its horizon is ours
        if not must_reply and not cluster_reply:
            return []
        deltas = self._deltas([(r[_ID], rows.get(r[_ID])) for r in reply_rows], budget)
        ack = GossipAck(self.node_id, reply_rows, deltas,
                        cluster_reply, centries, self._cluster_gc)
        return [Send(src, ack)]

    def _on_ack(self, src: str, msg: GossipAck, now_ms: int) -> list[Send]:
        limit = 4 * self.config.max_nodes      # rows beyond max_nodes are refused one by one
        rows = _parse_rows(msg.digest, limit)
        deltas = _parse_deltas(msg.deltas, limit)
        their_entries = _parse_cluster_entries(msg.cluster_entries, 1_000_000)
        their_buckets = _parse_buckets(msg.cluster)
        if type(msg.cluster_gc) is not int:
            raise _Malformed("cluster_gc")
        self._merge_rows(rows, now_ms, msg.node_id)
        self._apply_deltas(deltas, now_ms)
        kills = self._merge_cluster(their_entries, now_ms)
        budget = [self.config.max_delta_bytes - 20 * len(kills)]
        centries: list = kills
        if their_buckets is not None:
            mine = self._buckets if self._cluster else _ZERO_BUCKETS
            if mine == their_buckets:
                if msg.cluster_gc > self._cluster_gc:
                    self._cluster_gc = msg.cluster_gc
            else:
                te = their_entries[0]
                sent = {te[i]: (te[i + 1], te[i + 2], te[i + 4]) for i in range(0, len(te), _CENT)}
                mismatched = {i for i in range(_BUCKETS) if mine[i] != their_buckets[i]}
                centries += self._cluster_entries(mismatched, budget, sent)
        deltas_out = self._deltas(sorted(rows.items()), budget)
        if not deltas_out and not centries:
            return []
        return [Send(src, GossipAck2(self.node_id, deltas_out, centries))]

    def _on_ack2(self, msg: GossipAck2, now_ms: int) -> None:
        limit = 4 * self.config.max_nodes
        deltas = _parse_deltas(msg.deltas, limit)
        their_entries = _parse_cluster_entries(msg.cluster_entries, 1_000_000)
        self._apply_deltas(deltas, now_ms)
        self._merge_cluster(their_entries, now_ms)

    # -------------------------------------------------------------- rows ---------------

    def _merge_rows(self, rows: dict[str, tuple], now_ms: int, sender: str = "") -> None:
        mine_rows = self._rows
        if rows == mine_rows:
            if sender:
                self._heard_from(sender, rows.get(sender), now_ms)
            return
        status = self._status
        me = self.node_id
        get = mine_rows.get
        for o, r in rows.items():              # the sender's order: deterministic
            mine = get(o)
            if mine == r:
                continue
            if (mine is not None and r[_GEN] == mine[_GEN] and r[_LEFT] == mine[_LEFT] and o != me
                    and not self._rows_shared):
                # the common case: a heartbeat moved (or the peer is behind)
                if r[_HB] > mine[_HB]:
                    mine_rows[o] = (o, mine[_GEN], r[_HB]) + mine[_MV:]
                    self._detector.report(o, now_ms)
                    st = status.get(o)
                    if st is not None and st[0] != LEFT:
                        self._set_status(o, ALIVE, now_ms)
                continue
            self._merge_row(r, now_ms, o == sender)
            mine_rows = self._rows                 # may have been copied (copy-on-write)
            get = mine_rows.get
        if sender:
            self._heard_from(sender, rows.get(sender), now_ms)

    def _heard_from(self, sender: str, row: tuple | None, now_ms: int) -> None:
        """A message from ``sender`` carrying its own current row confirms an unconfirmed node."""
        st = self._status.get(sender)
        if (st is not None and st[0] == SUSPECT and row is not None and sender not in self._detector
                and self._rows[sender][_GEN] == row[_GEN]):
            self._detector.report(sender, now_ms)
            self._set_status(sender, ALIVE, now_ms)

    def _merge_row(self, r: tuple, now_ms: int, from_itself: bool = False) -> None:
        o = r[_ID]
        if o == self.node_id:
            if r[_GEN] > self.generation:
                self.stats["identity_conflicts"] += 1
            return
        mine = self._rows.get(o)
        if mine is None:
            grave = self._graveyard.get(o)
            if grave is not None and (r[_GEN], r[_HB]) <= (grave[0], grave[1]):
                return                                   # R5: no zombies
            if len(self._rows) >= self.config.max_nodes:
                self.stats["nodes_refused"] += 1
                return
            if grave is not None:
                del self._graveyard[o]
            self._adopt(r, now_ms, "unknown", from_itself)
            return
        if r[_GEN] > mine[_GEN]:
            self._adopt(r, now_ms, self._status_of(o), from_itself)   # R2: a newer generation replaces
            return
        if r[_GEN] < mine[_GEN]:
            return
        hb_moved = r[_HB] > mine[_HB]
        left_now = r[_LEFT] and not mine[_LEFT]
        if not hb_moved and not left_now:
            return
        self._set_row((o, mine[_GEN], max(r[_HB], mine[_HB]), mine[_MV], mine[_GC], mine[_ADDR],
                       mine[_LEFT] or r[_LEFT]))
        if left_now:
            self._set_status(o, LEFT, now_ms)
        elif hb_moved:
            self._detector.report(o, now_ms)
            st = self._status.get(o)
            if st is not None and st[0] in (SUSPECT, DEAD):
                self._set_status(o, ALIVE, now_ms)

    def _adopt(self, r: tuple, now_ms: int, old_status: str, from_itself: bool) -> None:
        """Start tracking origin ``r[0]`` at generation ``r[1]`` with an empty namespace.

        Learned from the node itself (it sent the message), it is ALIVE; learned second-hand
        it is SUSPECT, unconfirmed, until its heartbeat moves (R4).
        """
        o = r[_ID]
        self._ns.pop(o, None)
        self._detector.forget(o)
        self._set_row((o, r[_GEN], r[_HB], 0, 0, r[_ADDR], r[_LEFT]))
        if r[_LEFT]:
            new = LEFT
        elif from_itself:
            new = ALIVE
            self._detector.report(o, now_ms)
        else:
            new = SUSPECT
        if new == ALIVE:
            self._status.pop(o, None)
        else:
            self._status[o] = (new, now_ms)
        self._retarget(o)
        self._event(o, old_status, new)

    def _set_row(self, row: tuple) -> None:
        if self._rows_shared:
            self._rows = dict(self._rows)
            self._rows_shared = False
        self._rows[row[_ID]] = row


    # ------------------------------------------------------------- deltas --------------

    def _deltas(self, peer_rows: Iterable[tuple[str, tuple | None]], budget: list[int]) -> list:
        """Deltas the peer lacks, given its rows; origins in random order when truncating."""
        wanted = []
        for o, peer in peer_rows:
            row = self._rows.get(o)
            if row is None or o == "" or (peer is not None and peer[_GEN] > row[_GEN]):
                continue
            if peer is None or peer[_GEN] < row[_GEN]:
                if row[_MV] > 0:
                    wanted.append((o, 0, False))
            elif max(peer[_MV], peer[_GC]) < row[_GC]:
                wanted.append((o, 0, True))                 # R3: behind the horizon
            elif peer[_MV] < row[_MV]:
                wanted.append((o, peer[_MV], False))
        if len(wanted) > 1:
            self._rng.shuffle(wanted)
        out = []
        for o, frm, reset in wanted:
            if budget[0] < _DELTA_OVERHEAD + len(o):
                self.stats["truncated"] += 1
                break
            d = self._delta(o, frm, reset, budget, first=not out)
            if d is not None:
                out.append(d)
                if reset:
                    self.stats["resets_sent"] += 1
        return out

    def _delta(self, o: str, frm: int, reset: bool, budget: list[int], first: bool) -> list | None:
        row = self._rows[o]
        ns = self._ns.get(o)
        left = budget[0] - _DELTA_OVERHEAD - len(o)
        ents: list = []
        upto = row[_MV]
        if ns is not None:
            for v, k in ns.since(frm):
                e = ns.entries[k]
                if e[4] > left and (ents or not first):
                    upto = ents[-3] if ents else frm
                    self.stats["truncated"] += 1
                    break
                left -= e[4]
                ents += [k, v, e[1], e[2]]
        if upto <= frm and not reset:
            return None
        budget[0] = left
        return [o, row[_GEN], frm, upto, row[_GC], reset, ents]

    def _apply_deltas(self, deltas: list[tuple], now_ms: int) -> None:
        for d in deltas:
            self._apply_delta(d, now_ms)

    def _apply_delta(self, d: tuple, now_ms: int) -> None:
        o, gen, frm, upto, gc, reset, ents, sizes = d
        if o == self.node_id:
            return
        row = self._rows.get(o)
        if row is None or row[_GEN] != gen:
            self.stats["deltas_skipped"] += 1
            return
        mv, my_gc = row[_MV], row[_GC]
        ns = self._ns.get(o)
        if reset and max(mv, my_gc) < gc:
            ns = self._ns[o] = _Namespace()       # R3: replace, do not merge
            mv, my_gc = 0, gc
            self.stats["resets_applied"] += 1
        elif frm > mv:
            self.stats["deltas_skipped"] += 1      # R1: a gap; the next round asks again
            return
        elif upto <= mv:
            return
        if ents:
            if ns is None:
                ns = self._ns[o] = _Namespace()
            for j, i in enumerate(range(0, len(ents), _ENT)):
                v = ents[i + 1]
                if v > mv:
                    ns.put(ents[i], v, ents[i + 2], ents[i + 3], now_ms, sizes[j])
        self._set_row((o, gen, row[_HB], max(mv, upto), my_gc, row[_ADDR], row[_LEFT]))
        self.stats["deltas_applied"] += 1
        self._version += 1

    def _own_write(self, ns: _Namespace, key: str, value: Any, deleted: bool, size: int) -> None:
        row = self._rows[self.node_id]
        version = row[_MV] + 1
        ns.put(key, version, value, deleted, self._now_ms, size)
        self._set_row(row[:_MV] + (version,) + row[_MV + 1:])
        self._version += 1

    def _entry_size(self, key: str, value: Any) -> int:
        size = _ENTRY_OVERHEAD + _size(key) + _size(value)
        if size > self._max_entry_bytes:
            raise ValueError(f"gossip entry {key!r} is {size} bytes; "
                             f"at most {self._max_entry_bytes} fit in a message")
        return size

    # ------------------------------------------------------------- cluster store -------

    def _cluster_store(self, key: str, clock: int, writer: str, value: Any, deleted: bool,
                       size: int, stored_ms: int | None = None) -> None:
        old = self._cluster.get(key)
        bucket = _bucket_of(key) if old is None else old[6]
        if old is not None:
            self._buckets[bucket] = (self._buckets[bucket] - old[7]) & 0xFFFFFFFF
            if old[3]:
                self._cluster_tombstones -= 1
        h = _entry_hash(key, clock, writer, deleted)
        self._buckets[bucket] = (self._buckets[bucket] + h) & 0xFFFFFFFF
        if deleted:
            self._cluster_tombstones += 1
        self._cluster[key] = (clock, writer, value, deleted,
                              self._now_ms if stored_ms is None else stored_ms, size, bucket, h)
        if clock > self._clock:
            self._clock = clock
        self._version += 1

    def _merge_cluster(self, parsed: tuple[Any, list[int]], now_ms: int) -> list:
        """Merge a peer's cluster entries (R6); returns kills to send back to that peer."""
        ents, sizes = parsed
        kills: list = []
        for j, i in enumerate(range(0, len(ents), _CENT)):
            key, clock, writer, value, deleted = ents[i:i + _CENT]
            old = self._cluster.get(key)
            if old is None:
                if clock <= self._cluster_gc:
                    # a key whose tombstone we collected: the peer is stale. Never store it;
                    # answer a live one with a kill (same stamp, deleted).
                    if not deleted:
                        self.stats["stale_cluster_killed"] += 1
                        kills += [key, clock, writer, None, True]
                    continue
            elif (clock, writer) <= (old[0], old[1]):
                if (clock, writer) == (old[0], old[1]) and deleted and not old[3]:
                    # a kill: the sender collected this key's tombstone long ago. Drop our
                    # copy, but store no tombstone: a kill never travels further than one hop
                    self._cluster_drop(key)
                    self.stats["stale_cluster_dropped"] += 1
                continue
            self._cluster_store(key, clock, writer, value, deleted, sizes[j], now_ms)
        return kills

    def _cluster_drop(self, key: str) -> None:
        e = self._cluster.pop(key)
        self._buckets[e[6]] = (self._buckets[e[6]] - e[7]) & 0xFFFFFFFF
        if e[3]:
            self._cluster_tombstones -= 1
        self._version += 1

    def _cluster_entries(self, buckets: set[int], budget: list[int],
                         sent: dict[str, tuple] | None = None) -> list:
        """Our entries in ``buckets`` (newer than what the peer ``sent``), bounded by budget."""
        cands = []
        for k, e in self._cluster.items():
            if e[6] in buckets:
                if sent is not None:
                    s = sent.get(k)
                    if s is not None and ((e[0], e[1]) < (s[0], s[1]) or
                                          ((e[0], e[1]) == (s[0], s[1]) and (s[2] or not e[3]))):
                        continue
                cands.append(k)
        out: list = []
        if not cands:
            return out
        start = self._rng.randrange(len(cands))     # rotate: truncation must not starve a key
        for j in range(len(cands)):
            k = cands[(start + j) % len(cands)]
            e = self._cluster[k]
            if e[5] > budget[0] and out:
                self.stats["truncated"] += 1
                break
            budget[0] -= e[5]
            out += [k, e[0], e[1], e[2], e[3]]
        return out

    # ------------------------------------------------------------- rounds --------------

    def _round(self, now_ms: int) -> list[Send]:
        cfg = self.config
        rng = self._rng
        dests: list[str] = []
        targets = self._targets
        others = len(targets) - (self.node_id in self._tindex)
        if others > 0:
            self._seed_backoff_ms = self._interval_ms
            k = min(cfg.fanout, others)
            if k == 1:
                p = self.node_id
                while p == self.node_id:
                    p = targets[int(rng.random() * len(targets))]
                dests.append(self._rows[p][_ADDR])
            else:
                picks = rng.sample(targets, min(k + 1, len(targets)))
                dests += [self._rows[p][_ADDR] for p in picks if p != self.node_id][:k]
        dead = [o for o, (st, _) in self._status.items() if st == DEAD]
        if dead and rng.random() < cfg.unreachable_probe_prob:
            dests.append(self._rows[rng.choice(dead)][_ADDR])
        if self._seeds:
            if others <= 0:
                if now_ms >= self._next_seed_ms:
                    dests.append(rng.choice(self._seeds))
                    self.stats["seed_probes"] += 1
                    self._next_seed_ms = now_ms + self._seed_backoff_ms
                    self._seed_backoff_ms = min(2 * self._seed_backoff_ms, cfg.seed_retry_max_ms)
            elif rng.random() < cfg.seed_probe_prob:
                dests.append(rng.choice(self._seeds))
        if not dests:
            return []
        syn = self._syn()
        seen = {self.address}
        out = []
        for d in dests:
            if d not in seen:
                seen.add(d)
                out.append(Send(d, syn))
        return out

    # ------------------------------------------------------------- liveness ------------

    def _observe(self, now_ms: int) -> None:
        if now_ms - self._last_step_ms > self.config.effective_stall_ms:
            self._on_stall(now_ms)
        if now_ms > self._now_ms:
            self._now_ms = now_ms

    def _on_stall(self, now_ms: int) -> None:
        """Our own loop did not run for a while: what we did not hear is not evidence (R4)."""
        self.stats["stalls"] += 1
        self._last_step_ms = now_ms
        self._detector.suspend(now_ms)
        for o, (st, since) in list(self._status.items()):
            if st == SUSPECT:
                self._status[o] = (SUSPECT, max(since, now_ms))

    def _judge(self, now_ms: int) -> None:
        status = self._status
        for o in [o for o in self._detector.expired(now_ms) if o not in status]:
            if o in self._rows:
                self._set_status(o, SUSPECT, now_ms)
            else:
                self._detector.forget(o)
        cfg = self.config
        for o, (st, since) in list(status.items()):
            if st == SUSPECT:
                if now_ms - since >= cfg.dead_after_ms:
                    self._set_status(o, DEAD, now_ms)
            elif now_ms - since >= cfg.tombstone_gc_ms:      # DEAD or LEFT
                self._remove(o, now_ms)

    def _status_of(self, o: str) -> str:
        if o == self.node_id:
            return LEFT if self._left else ALIVE
        st = self._status.get(o)
        return ALIVE if st is None else st[0]

    def _set_status(self, o: str, new: str, now_ms: int) -> None:
        old = self._status_of(o)
        if old == new:
            return
        if new == ALIVE:
            del self._status[o]
        else:
            self._status[o] = (new, now_ms)
        self._retarget(o)
        self._event(o, old, new)

    def _event(self, o: str, old: str, new: str) -> None:
        self._events.append(MembershipEvent(self._now_ms, o, old, new))
        self._version += 1

    def _retarget(self, o: str) -> None:
        should = o in self._rows and self._status_of(o) in (ALIVE, SUSPECT)
        has = o in self._tindex
        if should == has:
            return
        if self._targets_shared:
            self._targets = list(self._targets)
            self._tindex = dict(self._tindex)
            self._targets_shared = False
        if should:
            self._tindex[o] = len(self._targets)
            self._targets.append(o)
        else:
            i = self._tindex.pop(o)
            last = self._targets.pop()
            if last != o:
                self._targets[i] = last
                self._tindex[last] = i

    def _remove(self, o: str, now_ms: int) -> None:
        """Collect a DEAD/LEFT origin into the graveyard (R5)."""
        old = self._status_of(o)
        row = self._rows[o]
        if self._rows_shared:
            self._rows = dict(self._rows)
            self._rows_shared = False
        del self._rows[o]
        self._ns.pop(o, None)
        self._status.pop(o, None)
        self._detector.forget(o)
        self._retarget(o)
        self._graveyard.pop(o, None)
        self._graveyard[o] = (row[_GEN], row[_HB], now_ms)
        while len(self._graveyard) > self.config.max_graveyard:
            del self._graveyard[next(iter(self._graveyard))]
        self._event(o, old, "removed")

    def _collect(self, now_ms: int) -> None:
        """Tombstone and graveyard garbage collection (R3, R5, R6)."""
        horizon = now_ms - self.config.tombstone_gc_ms
        for o in [o for o, ns in self._ns.items() if ns.tombstones]:
            top = self._ns[o].collect(horizon)
            if top:
                row = self._rows[o]
                self._set_row(row[:_GC] + (max(row[_GC], top),) + row[_GC + 1:])
                self._version += 1
        if self._cluster_tombstones:
            for k in [k for k, e in self._cluster.items() if e[3] and e[4] <= horizon]:
                self._cluster_gc = max(self._cluster_gc, self._cluster[k][0])
                self._cluster_drop(k)
        grave_horizon = now_ms - 2 * self.config.tombstone_gc_ms
        while self._graveyard:
            o = next(iter(self._graveyard))
            if self._graveyard[o][2] > grave_horizon:
                break
            del self._graveyard[o]

    # ------------------------------------------------------------- checks --------------

    def check_invariants(self) -> None:
        """Assert the structural invariants (O(state)); the simulator runs it after steps."""
        me = self._rows.get(self.node_id)
        assert me is not None and me[_GEN] == self.generation and me[_ADDR] == self.address, "own row"
        assert me[_LEFT] == self._left, "own left flag"
        for o, row in self._rows.items():
            assert row[_ID] == o and len(row) == _ROW, f"row shape {o}"
            assert o not in self._graveyard, f"{o} both known and in the graveyard"
            ns = self._ns.get(o)
            if ns is not None:
                assert list(ns.by_version) == sorted(ns.by_version), f"{o}: versions out of order"
                assert len(ns.by_version) == len(ns.entries), f"{o}: index size"
                assert all(ns.entries[k][0] == v for v, k in ns.by_version.items()), f"{o}: index"
                assert not ns.by_version or max(ns.by_version) <= row[_MV], f"{o}: entry above max version"
                assert ns.tombstones == sum(1 for e in ns.entries.values() if e[2]), f"{o}: tombstones"
            if row[_LEFT] and o != self.node_id:
                assert self._status_of(o) == LEFT, f"{o}: left flag without LEFT status"
        assert set(self._status) <= set(self._rows) and self.node_id not in self._status, "status keys"
        assert set(self._ns) <= set(self._rows), "namespaces without rows"
        want = sorted(o for o in self._rows if self._status_of(o) in (ALIVE, SUSPECT))
        assert sorted(self._targets) == want, "targets"
        assert all(self._targets[i] == o for o, i in self._tindex.items()), "target index"
        assert len(self._tindex) == len(self._targets), "target index size"
        buckets = [0] * _BUCKETS
        for k, e in self._cluster.items():
            assert e[6] == _bucket_of(k) and e[7] == _entry_hash(k, e[0], e[1], e[3]), f"cluster {k}"
            buckets[e[6]] = (buckets[e[6]] + e[7]) & 0xFFFFFFFF
            assert e[0] <= self._clock, "clock behind a stamp"
        assert buckets == self._buckets, "bucket hashes"
        assert self._cluster_tombstones == sum(1 for e in self._cluster.values() if e[3]), "cluster tombstones"

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
        rows = {o: (o, g, 0, 0, 0, a, False) for o, a, g in members}
        if len(rows) != len(members):
            raise ValueError("duplicate node ids")
        targets = list(rows)
        tindex = {o: i for i, o in enumerate(targets)}
        nodes = []
        for (o, a, g), rng in zip(members, rngs, strict=True):
            n = cls(o, a, g, seeds, rng, config, now_ms)
            n._rows, n._rows_shared = rows, True
            n._targets, n._tindex, n._targets_shared = targets, tindex, True
            nodes.append(n)
        return nodes
