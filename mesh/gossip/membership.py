"""Membership: the table of known origins, their generations and their liveness.

Each known origin has a ``Row`` (the digest line), a namespace (``mesh.gossip.namespaces``)
and, unless it is ALIVE, a ``Verdict`` (status and since when). The *targets* are the
origins one may gossip with (ALIVE or SUSPECT, self included), kept as a list with an
index so a random peer is drawn in O(1).

Rules:
R2 Identity: rows merge by generation first. A higher generation *replaces* the origin
   (namespace dropped, not merged); within a generation the heartbeat and the ``left`` flag
   only grow. Each life draws a random ``life`` nonce, carried in its row: two lives of one
   generation (a rolled-back store restarts with a generation the cluster saw) are told
   apart, and a peer keeps the first life it saw of a generation (a later one, even with a
   higher heartbeat, does not overwrite it), so the evidence stays until the restarted node
   has seen it (a row restored with life 0 from an older snapshot takes the first life it
   then hears of); deltas never cross lives (``Namespaces.deltas``). Nobody but the owner
   changes its own row. A row for our own id that cannot be this life's (a higher
   generation, or our generation with another life, a max version above ours or a heartbeat
   above the highest one this life ever *sent*: peers only hold what we sent) is an
   *identity conflict*: counted, ignored, and the highest such generation kept in
   ``identity_conflict``. It means this node's stored generation went back (its disk lost
   state); the shell persists a generation above it and calls ``Gossip.reincarnate`` (never
   the core on its own: the new generation must be durable before it is spoken). Once a
   majority (``majority_confirmed``, not the timer below) held this life, a later conflict
   is a forgery or a second process with our id: the shell refutes it (a new generation,
   no lost state: ``mesh.node.loop``). With
   ``hold_heartbeat`` the heartbeat stays 0 until a peer has shown its view of us (a row
   for us, or a full digest without one): that first view is compared before the first
   beat, so a peer holding another life of our generation is a conflict, never a
   confirmation. Confirmed (``seen_by_peer``): a majority of the other members (LEFT aside)
   showed they hold this life, at a heartbeat >= 1 that we sent; that majority shares a
   peer with any majority that held another life of our generation, and that peer kept the
   other one. Short of a majority (peers down or cut off), one such view suffices
   ``confirm_wait_ms`` after the first (a timer): a peer holding the other life that was
   not heard in that time shows the conflict only later.
   An ACK without a row of our generation for us (it may be a late answer to another life)
   is not a view of us. Peers answer a SYN from a life just begun (heartbeat <= 2), or one
   whose row they hold differently, with the sender's row as they hold it
   (``Rounds.on_syn``), so both views come quickly.
R4 Liveness: an origin's heartbeat moving feeds a phi-accrual detector
   (``mesh.gossip.detector``). ALIVE -> SUSPECT when phi > ``phi_threshold``;
   SUSPECT -> DEAD after ``dead_after_ms`` more (with partial digests, at least 20 times
   the detector's floor, ``detector_floor``: heartbeat news of one origin is then rarer); SUSPECT/DEAD -> ALIVE only when its
   heartbeat moves or a newer generation appears. An origin learned second-hand (or
   restored from a snapshot) starts SUSPECT, unconfirmed, until its heartbeat moves or a
   message from it arrives carrying its own row, so a long-dead node is never shown
   alive. LEFT (graceful leave, a flag in the origin's own row) is final for that
   generation. A node whose own loop stalled (``stall_threshold_ms`` between steps)
   restarts every detector clock instead of convicting peers it could not hear.
R5 No zombies: DEAD and LEFT origins keep their namespace (readable) for
   ``tombstone_gc_ms``, then are removed into a *graveyard* of (generation, heartbeat);
   rows at or below a grave are ignored, so a stale peer cannot bring them back.

The table can start *shared* between many nodes of one process (copy-on-write, see
``Gossip.converged_cluster``): every write goes through ``set_row`` or copies first.
"""
from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mesh.gossip.config import GossipConfig
from mesh.gossip.detector import FailureDetector
from mesh.gossip.rows import ALIVE, DEAD, LEFT, MAX_GENERATION, MAX_GENERATION_JUMP, ROW_FIELDS, SUSPECT, Grave, Row, Verdict

if TYPE_CHECKING:
    from mesh.gossip.namespaces import Namespace

__all__ = ["Member", "MembershipEvent", "Membership", "ROW_BUCKETS", "RECENT_SENDS", "row_bucket", "row_hash"]

ROW_BUCKETS = 64            # the table is compared as this many bucket hashes (``Membership.row_hashes``)
RECENT_SENDS = 3            # partial digests that carry a row after its hash changed here (``Rounds``)


def row_bucket(origin: str) -> int:
    """Which of the ``ROW_BUCKETS`` hashes ``origin``'s row counts in (the same on every node)."""
    return zlib.crc32(origin.encode()) % ROW_BUCKETS


def row_hash(r: Row) -> int:
    """A row's contribution to its bucket: everything but the heartbeat and the gc version
    (heartbeats spread by push; gc versions follow each node's own collection)."""
    return zlib.crc32(f"{r.node_id}\0{r.generation}\0{r.max_version}\0{r.address}\0{r.left:d}\0{r.life}".encode())


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


class Membership:
    """Rows, verdicts, targets, detector and graveyard of one node (R2, R4, R5)."""

    def __init__(self, node_id: str, address: str, generation: int, config: GossipConfig,
                 stats: dict[str, int], now_ms: int, life: int = 0) -> None:
        self.node_id = node_id
        self.address = address
        self.generation = generation
        self.config = config
        self.stats = stats
        self.now_ms = now_ms               # the latest time seen; events are stamped with it
        self.left = False                  # this node left (graceful shutdown)
        self.version = 0                   # moves on every change (see Gossip.version)
        self.rows: dict[str, Row] = {node_id: Row(node_id, generation, 0, 0, 0, address, False, life)}
        self.rows_shared = False           # copy-on-write (see Gossip.converged_cluster)
        self.namespaces: dict[str, Namespace] = {}
        self.status: dict[str, Verdict] = {}      # non-ALIVE origins only
        self.targets: list[str] = [node_id]       # gossip-able: ALIVE or SUSPECT, incl. self
        self.tindex: dict[str, int] = {node_id: 0}
        self.targets_shared = False
        self.detector = FailureDetector(
            expected_interval_ms=config.effective_heartbeat_ms, threshold=config.phi_threshold,
            window_size=config.detector_window, max_sample_ms=20 * config.effective_heartbeat_ms)
        self.graveyard: dict[str, Grave] = {}
        self.events: deque[MembershipEvent] = deque(maxlen=config.max_events)
        self.identity_conflict = 0          # highest generation of a row for us not of this life (R2)
        self.heard_peer = False             # a peer showed its view of us (since start): see saw_our_row
        self.seen_by_peer = False           # peers' rows for us showed this life (see check_confirmed)
        self.majority_confirmed = False     # ... a majority of them, not the timer
        self.confirmed_by: set[str] = set()  # peers whose row for us showed this life at heartbeat >= 1
        self.first_confirm_ms = 0           # when the first of them did
        self.sent_heartbeat = 0             # the highest own heartbeat put in a message in this life
        self.hold_heartbeat = False         # heartbeat 0 until a peer is heard (see Gossip.hold_heartbeat)
        self._hashes: list[int] | None = None   # per bucket: sum of row_hash mod 2**32 (None: not yet computed)
        self._hashes_shared = False
        self._in_bucket: list[dict[str, None]] | None = None   # per bucket: its origins (with _hashes)
        self.recent: dict[str, int] = {}    # origins whose row hash just changed here: partial digests left
        self.suspected: dict | None = None  # with probes: suspicion records; only a refutation revives those

    def detector_floor(self, gap_ms: int) -> None:
        """The shortest mean gap the detector assumes between one origin's heartbeat news
        (larger when partial digests carry each origin only now and then, ``Rounds``)."""
        d = self.detector
        if d.min_mean_ms != gap_ms:
            d.min_mean_ms = float(gap_ms)
            d.expected_interval_ms = gap_ms
            d.max_sample_ms = 20 * gap_ms

    def row_hashes(self) -> list[int]:
        """The ``ROW_BUCKETS`` bucket hashes of the table (kept current by every write)."""
        if self._hashes is None:
            h = [0] * ROW_BUCKETS
            index: list[dict[str, None]] = [{} for _ in range(ROW_BUCKETS)]
            for o, r in self.rows.items():
                b = row_bucket(o)
                h[b] = (h[b] + row_hash(r)) & 0xFFFFFFFF
                index[b][o] = None
            self._hashes, self._in_bucket, self._hashes_shared = h, index, False
        return self._hashes

    def bucket_rows(self, bucket: int) -> list[Row]:
        """This node's rows in ``bucket``, in insertion order."""
        self.row_hashes()
        rows = self.rows
        return [rows[o] for o in self._in_bucket[bucket]]

    def _rehash(self, old: Row | None, new: Row | None) -> None:
        h = self._hashes
        if h is None:
            return
        ho = 0 if old is None else row_hash(old)
        hn = 0 if new is None else row_hash(new)
        if ho == hn and old is not None and new is not None:
            return
        if self._hashes_shared:
            h = self._hashes = list(h)
            self._in_bucket = [dict(d) for d in self._in_bucket]
            self._hashes_shared = False
        o = (old or new).node_id
        b = row_bucket(o)
        h[b] = (h[b] - ho + hn) & 0xFFFFFFFF
        if new is not None:
            self.recent[o] = RECENT_SENDS     # a new version: pushed in our next partial digests
        if old is None:
            self._in_bucket[b][o] = None
        elif new is None:
            del self._in_bucket[b][o]

    @property
    def life(self) -> int:
        """This life's nonce (R2), as our own row carries it (0 only in shared fixtures)."""
        return self.rows[self.node_id].life

    def share(self, rows: dict[str, Row], targets: list[str], tindex: dict[str, int],
              hashes: tuple[list[int], list[dict[str, None]]] | None = None) -> None:
        """Start from a table shared with other nodes; the first write copies it (and
        ``hashes``, ``shared_hashes()`` of a node sharing it)."""
        self.rows, self.rows_shared = rows, True
        self.targets, self.tindex, self.targets_shared = targets, tindex, True
        self._hashes, self._in_bucket = hashes if hashes is not None else (None, None)
        self._hashes_shared = hashes is not None

    def shared_hashes(self) -> tuple[list[int], list[dict[str, None]]]:
        self.row_hashes()
        self._hashes_shared = True
        return self._hashes, self._in_bucket

    # ---------------------------------------------------------------- rows -------------

    def set_row(self, row: Row) -> None:
        if self.rows_shared:
            self.rows = dict(self.rows)
            self.rows_shared = False
        if self._hashes is not None:
            self._rehash(self.rows.get(row.node_id), row)
        self.rows[row.node_id] = row

    def beat(self) -> None:
        """Our own heartbeat moves."""
        row = self.rows[self.node_id]
        self.set_row(tuple.__new__(Row, (row.node_id, row.generation, row.heartbeat + 1, row.max_version,
                                         row.gc_version, row.address, row.left, row.life)))

    def mark_left(self) -> None:
        """This node leaves: the flag goes into its own row (R4: final for this generation)."""
        self.left = True
        self.set_row(self.rows[self.node_id]._replace(left=True))
        self.retarget(self.node_id)
        self.event(self.node_id, ALIVE, LEFT)

    def merge_rows(self, rows: dict[str, Row], now_ms: int, sender: str = "", full: bool = False) -> None:
        """Merge a peer's digest (R2), in the sender's order: deterministic. ``full``: the
        sender's whole digest (a SYN), so a missing row for us means it holds none."""
        mine_rows = self.rows
        if rows == mine_rows:
            if sender:
                self.heard_from(sender, rows.get(sender), now_ms)
            if sender and sender != self.node_id:
                self.saw_our_row(rows.get(self.node_id), full, sender)
            return
        status = self.status
        me = self.node_id
        get = mine_rows.get
        for o, r in rows.items():
            mine = get(o)
            if mine == r:
                continue
            if (mine is not None and r.generation == mine.generation and r.left == mine.left
                    and r.life == mine.life and o != me and not self.rows_shared):
                # the common case: a heartbeat moved (or the peer is behind)
                if r.heartbeat > mine.heartbeat:      # (tuple.__new__: the hot path, in C)
                    mine_rows[o] = tuple.__new__(Row, (o, mine.generation, r.heartbeat, mine.max_version,
                                                       mine.gc_version, mine.address, mine.left, mine.life))
                    self.detector.report(o, now_ms)
                    st = status.get(o)
                    if st is not None and st.status != LEFT and (self.suspected is None or o not in self.suspected):
                        self.set_status(o, ALIVE, now_ms)
                continue
            self._merge_row(r, now_ms, o == sender)
            mine_rows = self.rows                  # may have been copied (copy-on-write)
            get = mine_rows.get
        if sender:
            self.heard_from(sender, rows.get(sender), now_ms)
        if sender and sender != self.node_id:
            self.saw_our_row(rows.get(self.node_id), full, sender)

    def sending_own_row(self) -> None:
        """Our row goes into a message: peers may hold its heartbeat from now on (R2)."""
        hb = self.rows[self.node_id].heartbeat
        if hb > self.sent_heartbeat:
            self.sent_heartbeat = hb

    def saw_our_row(self, row: Row | None, full: bool, sender: str) -> None:
        """A peer's view of us, after its rows were merged (a differing row for us was
        compared there, ``_merge_row``). This life's row with a heartbeat we sent means the
        peer holds this life (a later life of the same generation then sees a conflict, R2).
        The first view of us (a row for us, or a full digest without one) releases a held
        heartbeat: only after it was compared."""
        if not full and (row is None or row.generation != self.generation):
            return                         # an ACK (maybe late, to another life) without this life's row
        if row is not None and row.generation == self.generation:
            if row.heartbeat > self.sent_heartbeat:
                if row == self.rows[self.node_id]:     # equal to ours, so not compared in the merge
                    self._conflict(row)
            elif (row.heartbeat >= 1 and row.life == self.life and sender not in self.confirmed_by
                  and sender in self.rows):     # (known members only: the set stays bounded)
                if not self.confirmed_by:
                    self.first_confirm_ms = self.now_ms
                self.confirmed_by.add(sender)
                self.check_confirmed()
        if not self.heard_peer:
            self.heard_peer = True
            if self.hold_heartbeat:
                self.beat()                # the first beat of this life, once a view of us was compared

    def check_confirmed(self) -> None:
        """``seen_by_peer`` once a majority of the other members (LEFT ones aside) hold this
        life: a peer keeps the first life it saw of a generation, so such a majority shares a
        peer with any majority that held another life of it (R2). Short of a majority (peers
        down or cut off), one peer's view is enough ``confirm_wait_ms`` after the first one
        (a timer: a peer holding another life heard in that time shows the conflict first).
        Cost: O(non-ALIVE origins), and only until confirmed."""
        if self.majority_confirmed or not self.confirmed_by:
            return
        me, status = self.node_id, self.status
        left = {o for o, v in status.items() if v.status == LEFT and o != me}
        others = len(self.rows) - 1 - len(left)
        held = sum(1 for o in self.confirmed_by if o in self.rows and o not in left)
        if held > others // 2:
            # (``majority_confirmed``: counted on after a timer confirmed, until a majority did;
            # the node shell refutes, rather than believes, a later conflict: issue 39)
            self.seen_by_peer = self.majority_confirmed = True
        elif self.now_ms - self.first_confirm_ms >= self.config.confirm_wait_ms:
            self.seen_by_peer = True

    def _conflict(self, r: Row) -> None:
        self.stats["identity_conflicts"] += 1
        if r.generation >= MAX_GENERATION or r.generation - self.generation > MAX_GENERATION_JUMP:
            # forged, never adopted: a node that took it would move to a generation its
            # peers refuse (2**48) and be cut off for good
            self.stats["identity_conflicts_refused"] += 1
            return
        self.identity_conflict = max(self.identity_conflict, r.generation)

    def heard_from(self, sender: str, row: Row | None, now_ms: int) -> None:
        """A message from ``sender`` carrying its own current row confirms an unconfirmed node."""
        st = self.status.get(sender)
        if (st is not None and st.status == SUSPECT and row is not None and sender not in self.detector
                and self.rows[sender].generation == row.generation and self.rows[sender].life in (0, row.life)):
            self.detector.report(sender, now_ms)
            self.set_status(sender, ALIVE, now_ms)

    def _merge_row(self, r: Row, now_ms: int, from_itself: bool = False) -> None:
        o = r.node_id
        if o == self.node_id:
            me = self.rows[o]
            if r.generation > self.generation or (r.generation == self.generation and (
                    r.heartbeat > self.sent_heartbeat or r.max_version > me.max_version
                    or (r.life and r.life != self.life))):
                self._conflict(r)
            return
        mine = self.rows.get(o)
        if mine is None:
            grave = self.graveyard.get(o)
            if grave is not None and (r.generation, r.heartbeat) <= (grave.generation, grave.heartbeat):
                return                                   # R5: no zombies
            if len(self.rows) >= self.config.max_nodes:
                self.stats["nodes_refused"] += 1
                return
            if grave is not None:
                del self.graveyard[o]
            self._adopt(r, now_ms, "unknown", from_itself)
            return
        if r.generation > mine.generation:
            if r.generation - mine.generation > MAX_GENERATION_JUMP:   # forged: it would shadow the
                self.stats["generation_jumps_refused"] += 1             # node's real rows for good
                return
            self._adopt(r, now_ms, self.status_of(o), from_itself)   # R2: a newer generation replaces
            return
        if r.generation < mine.generation:
            return
        if r.life != mine.life:
            if mine.life:
                if r.life:   # another life of this generation: the first one seen stays (R2)
                    self.stats["other_lives"] += 1
                    return
            else:            # a row restored without its life (0, unknown) learns it
                mine = mine._replace(life=r.life)
                self.set_row(mine)
        hb_moved = r.heartbeat > mine.heartbeat
        left_now = r.left and not mine.left
        if not hb_moved and not left_now:
            return
        self.set_row(Row(o, mine.generation, max(r.heartbeat, mine.heartbeat), mine.max_version,
                         mine.gc_version, mine.address, mine.left or r.left, mine.life))
        if left_now:
            self.set_status(o, LEFT, now_ms)
        elif hb_moved:
            self.detector.report(o, now_ms)
            st = self.status.get(o)
            if st is not None and st.status in (SUSPECT, DEAD) and (self.suspected is None or o not in self.suspected):
                self.set_status(o, ALIVE, now_ms)

    def _adopt(self, r: Row, now_ms: int, old_status: str, from_itself: bool) -> None:
        """Start tracking origin ``r.node_id`` at generation ``r.generation``, namespace empty.

        Learned from the node itself (it sent the message), it is ALIVE; learned second-hand
        it is SUSPECT, unconfirmed, until its heartbeat moves (R4).
        """
        o = r.node_id
        self.namespaces.pop(o, None)
        self.detector.forget(o)
        self.set_row(Row(o, r.generation, r.heartbeat, 0, 0, r.address, r.left, r.life))
        if r.left:
            new = LEFT
        elif from_itself:
            new = ALIVE
            self.detector.report(o, now_ms)
        else:
            new = SUSPECT
        if new == ALIVE:
            self.status.pop(o, None)
        else:
            self.status[o] = Verdict(new, now_ms)
        self.retarget(o)
        self.event(o, old_status, new)

    def reincarnate(self, generation: int, namespace: "Namespace | None", life: int) -> None:
        """This node starts a new life at ``generation`` (R2), with the nonce ``life``: own
        row replaced (heartbeat 0, max version of ``namespace``, the own namespace
        re-versioned by the caller)."""
        me = self.node_id
        if namespace is None:
            self.namespaces.pop(me, None)
        else:
            self.namespaces[me] = namespace
        self.generation = generation
        self.set_row(Row(me, generation, 0, len(namespace.entries) if namespace else 0, 0, self.address, self.left,
                         life))
        self.identity_conflict = 0
        self.sent_heartbeat = 0
        self.seen_by_peer = self.majority_confirmed = False
        self.confirmed_by = set()
        self.first_confirm_ms = 0
        self.version += 1

    # ------------------------------------------------------------- liveness ------------

    def on_stall(self, now_ms: int) -> None:
        """Our own loop did not run for a while: what we did not hear is not evidence (R4)."""
        self.detector.suspend(now_ms)
        for o, (st, since) in list(self.status.items()):
            if st == SUSPECT:
                self.status[o] = Verdict(SUSPECT, max(since, now_ms))

    def judge(self, now_ms: int, expired=None) -> None:
        """Move origins along ALIVE -> SUSPECT -> DEAD -> removed as time passes (R4, R5).
        ``expired(origin, now_ms)``: with probes, whether a SUSPECT origin's suspicion ran
        out (``mesh.gossip.suspicion``; one learned second-hand and never suspected waits)."""
        status = self.status
        if expired is not None:
            for o, (st, since) in list(status.items()):
                if st == SUSPECT:
                    if expired(o, now_ms):
                        self.set_status(o, DEAD, now_ms)
                elif now_ms - since >= self.config.tombstone_gc_ms:
                    self._remove(o, now_ms)
            return
        for o in [o for o in self.detector.expired(now_ms) if o not in status]:
            if o in self.rows:
                self.set_status(o, SUSPECT, now_ms)
            else:
                self.detector.forget(o)
        cfg = self.config
        for o, (st, since) in list(status.items()):
            if st == SUSPECT:
                if now_ms - since >= max(cfg.dead_after_ms, 20 * self.detector.min_mean_ms
                                         if self.detector.min_mean_ms > cfg.effective_heartbeat_ms else 0):
                    self.set_status(o, DEAD, now_ms)
            elif now_ms - since >= cfg.tombstone_gc_ms:      # DEAD or LEFT
                self._remove(o, now_ms)

    def status_of(self, o: str) -> str:
        if o == self.node_id:
            return LEFT if self.left else ALIVE
        st = self.status.get(o)
        return ALIVE if st is None else st.status

    def set_status(self, o: str, new: str, now_ms: int) -> None:
        old = self.status_of(o)
        if old == new:
            return
        if new == ALIVE:
            del self.status[o]
        else:
            self.status[o] = Verdict(new, now_ms)
        self.retarget(o)
        self.event(o, old, new)

    def event(self, o: str, old: str, new: str) -> None:
        self.events.append(MembershipEvent(self.now_ms, o, old, new))
        self.version += 1

    def retarget(self, o: str) -> None:
        """Keep ``o`` in the targets exactly while it is known and ALIVE or SUSPECT."""
        should = o in self.rows and self.status_of(o) in (ALIVE, SUSPECT)
        has = o in self.tindex
        if should == has:
            return
        if self.targets_shared:
            self.targets = list(self.targets)
            self.tindex = dict(self.tindex)
            self.targets_shared = False
        if should:
            self.tindex[o] = len(self.targets)
            self.targets.append(o)
        else:
            i = self.tindex.pop(o)
            last = self.targets.pop()
            if last != o:
                self.targets[i] = last
                self.tindex[last] = i

    def others(self) -> int:
        """How many origins other than this node one may gossip with."""
        return len(self.targets) - (self.node_id in self.tindex)

    def _remove(self, o: str, now_ms: int) -> None:
        """Collect a DEAD/LEFT origin into the graveyard (R5)."""
        old = self.status_of(o)
        row = self.rows[o]
        if self.rows_shared:
            self.rows = dict(self.rows)
            self.rows_shared = False
        del self.rows[o]
        self._rehash(row, None)
        self.namespaces.pop(o, None)
        self.status.pop(o, None)
        self.detector.forget(o)
        self.retarget(o)
        self.graveyard.pop(o, None)
        self.graveyard[o] = Grave(row.generation, row.heartbeat, now_ms)
        while len(self.graveyard) > self.config.max_graveyard:
            del self.graveyard[next(iter(self.graveyard))]
        self.event(o, old, "removed")

    def collect_graves(self, now_ms: int) -> None:
        """Graves are kept twice the tombstone horizon, then forgotten."""
        grave_horizon = now_ms - 2 * self.config.tombstone_gc_ms
        while self.graveyard:
            o = next(iter(self.graveyard))
            if self.graveyard[o].removed_ms > grave_horizon:
                break
            del self.graveyard[o]

    # ---------------------------------------------------------------- reads ------------

    def members(self, now_ms: int) -> list[Member]:
        out = []
        for o in sorted(self.rows):
            row = self.rows[o]
            if o == self.node_id:
                out.append(Member(o, row.address, row.generation, self.status_of(o), row.heartbeat,
                                  now_ms, 0.0, row.max_version))
            else:
                out.append(Member(o, row.address, row.generation, self.status_of(o), row.heartbeat,
                                  self.detector.last_ms(o), self.detector.phi(o, now_ms), row.max_version))
        return out

    def live_members(self) -> list[str]:
        """Node ids considered alive, self included (unless it left), sorted."""
        status = self.status
        live = [o for o in self.rows if o not in status]
        if self.left:
            live.remove(self.node_id)
        live.sort()
        return live

    def take_events(self) -> list[MembershipEvent]:
        out = list(self.events)
        self.events.clear()
        return out

    # --------------------------------------------------------------- checks ------------

    def check(self) -> None:
        """Assert the structural invariants of the table (O(state))."""
        me = self.rows.get(self.node_id)
        assert me is not None and me.generation == self.generation and me.address == self.address, "own row"
        assert me.left == self.left, "own left flag"
        for o, row in self.rows.items():
            assert type(row) is Row and row.node_id == o and len(row) == ROW_FIELDS, f"row shape {o}"
            assert o not in self.graveyard, f"{o} both known and in the graveyard"
            ns = self.namespaces.get(o)
            if ns is not None:
                ns.check(o, row)
            if row.left and o != self.node_id:
                assert self.status_of(o) == LEFT, f"{o}: left flag without LEFT status"
        assert set(self.status) <= set(self.rows) and self.node_id not in self.status, "status keys"
        assert set(self.namespaces) <= set(self.rows), "namespaces without rows"
        want = sorted(o for o in self.rows if self.status_of(o) in (ALIVE, SUSPECT))
        assert sorted(self.targets) == want, "targets"
        assert all(self.targets[i] == o for o, i in self.tindex.items()), "target index"
        assert len(self.tindex) == len(self.targets), "target index size"
        if self._hashes is not None:
            h = [0] * ROW_BUCKETS
            for o, r in self.rows.items():
                h[row_bucket(o)] = (h[row_bucket(o)] + row_hash(r)) & 0xFFFFFFFF
            assert h == self._hashes, "row bucket hashes"
            assert sorted(o for d in self._in_bucket for o in d) == sorted(self.rows), "row bucket index"
