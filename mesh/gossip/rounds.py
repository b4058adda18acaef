"""Rounds: whom to gossip with, and the three-message exchange (SYN, ACK, ACK2).

Exchange (one round every ``interval_ms``, started by ``Gossip.tick``):
1. SYN  A -> B: A's digest and the hashes of A's cluster-store buckets.
2. ACK  B -> A: the rows where B differs from A (what B knows newer, where B is
   behind), the deltas A lacks, and B's cluster entries in the buckets that differ. A
   sender whose life has just begun (heartbeat <= 2), or whose row B holds otherwise (a
   higher heartbeat or another life: a rolled-back copy), also gets its own row back, as
   B holds it: the view of itself a restarted node waits for (``Membership.saw_our_row``).
   When the only difference is heartbeats at most two beats newer, B does not answer:
   heartbeats then spread by push, in every SYN, which halves idle traffic; a sender
   further behind (a joiner, a healed partition) gets them pulled in the ACK.
3. ACK2 A -> B: the deltas B lacks and A's newer cluster entries.
When nothing changed, only digests travel (heartbeats ride in them); an exchange with
nothing to say ends after the SYN.

Above ``FULL_DIGEST_ROWS`` rows the digest would make every SYN O(N), so a SYN carries a
*partial* digest instead (the sender's row, the receiver's, rows whose version just
changed here (``Membership.recent``), ``_HOT_ROWS`` random live ones: heartbeat news) and,
in every ``_HASHES_EVERY``-th SYN (every SYN from ``HASHES_EVERY_SYN_ROWS`` rows on, else ``[0]``), the 64 bucket hashes of the sender's table without heartbeats
(``Membership.row_hashes``). The receiver answers rows of the partial digest where it holds
another version (heartbeats alone: never), and its rows of every bucket whose hash differs
with its own hashes; the ACK2 then carries the sender's rows of the buckets that still
differ, with the deltas the receiver lacks; an ACK2 with rows gets one ACK2 back with the
deltas its sender lacks. Bytes per node per round stay flat as N grows; the cost is that
one origin's heartbeat reaches a node only every ~N/16 rounds, so the detector's floor
(``Membership.detector_floor``) and the suspicion wait grow with N (R4). Deltas and cluster entries of one message share one
budget of ``max_delta_bytes``.

Peer selection, per round: ``fanout`` random targets (ALIVE or SUSPECT); with
probability ``unreachable_probe_prob`` also one DEAD node (that heals partitions); with
``seed_probe_prob`` also one seed. A node that knows no live peer probes its seeds with
exponential backoff up to ``seed_retry_max_ms``.
"""
from __future__ import annotations

import random
from typing import Any

from mesh.gossip.checks import EntryCheck
from mesh.gossip.config import GossipConfig
from mesh.gossip.membership import ROW_BUCKETS, Membership, row_bucket, row_hash
from mesh.gossip.messages import GossipAck, GossipAck2, GossipSyn
from mesh.gossip.namespaces import Namespaces
from mesh.gossip.parsing import Malformed, parse_buckets, parse_deltas, parse_gc_clock, parse_registers, parse_row_hashes, parse_rows
from mesh.gossip.registers import ZERO_BUCKETS, ClusterRegisters
from mesh.gossip.rows import BUCKETS, DEAD, Budget, Row
from mesh.wire.effects import Send

__all__ = ["Rounds"]

_HEARTBEAT_SLACK_BEATS = 2   # a SYN this far behind on some heartbeat gets an answer
_ECHO_BEATS = 2              # a SYN whose sender's life is this young gets its own row back
_CONFIRM_FANOUT = 8          # an unconfirmed life's SYNs per round, at most (larger clusters: confirm_wait_ms)
_MAX_CLUSTER_ENTRIES = 1_000_000
FULL_DIGEST_ROWS = 128       # a table this small goes whole in every SYN (~4 KB); a larger one, partially
PROBE_FULL_DIGEST_ROWS = 16  # the same with probes (heartbeats carry no liveness: whole digests buy nothing)
_HOT_ROWS = 32               # rows of others (a random sample: heartbeat news) in a partial SYN
_PROBE_HOT_ROWS = 1          # the same with probes
_HASHES_EVERY = 2            # a partial SYN carries the row bucket hashes once in this many (else [0]) ...
HASHES_EVERY_SYN_ROWS = 4_096  # ... and in every one from this many rows on (pull rate: rounds at 10^4-10^5)
_MAX_RECENT_ROWS = 32        # rows whose version just changed here (Membership.recent) in a partial SYN
_MAX_EXPAND_ROWS = 256       # rows of mismatched buckets in one ACK or ACK2, at most (whole buckets)


def hashes_every(rows: int) -> int:
    """A partial SYN carries the row bucket hashes once in this many: every other one up to
    ``HASHES_EVERY_SYN_ROWS`` rows, every one from there (docs/decisions/42-swim-probes.md)."""
    return 1 if rows >= HASHES_EVERY_SYN_ROWS else _HASHES_EVERY


def _same_version(a: Row, b: Row) -> bool:
    """Equal but for heartbeat and gc version (what ``row_hash`` ignores)."""
    return (a.generation == b.generation and a.max_version == b.max_version and a.left == b.left
            and a.life == b.life and a.address == b.address)


class Rounds:
    """Starts rounds and answers the exchange for one node."""

    def __init__(self, members: Membership, namespaces: Namespaces, registers: ClusterRegisters,
                 seeds: list[str], rng: random.Random, config: GossipConfig, stats: dict[str, int],
                 now_ms: int, check: EntryCheck) -> None:
        self._members = members
        self._check = check
        self._namespaces = namespaces
        self._registers = registers
        self._node_id = members.node_id
        self._address = members.address
        self.seeds = sorted({s for s in seeds if s and s != members.address})
        self._rng = rng
        self._config = config
        self._stats = stats
        self._interval_ms = config.interval_ms
        self._seed_backoff_ms = config.interval_ms
        self._next_seed_ms = now_ms
        self._syns = 0
        self._full_rows = PROBE_FULL_DIGEST_ROWS if config.probes else FULL_DIGEST_ROWS
        self._hot_rows = _PROBE_HOT_ROWS if config.probes else _HOT_ROWS
        # with probes a life beats once (its first view of itself released it), then only to refute
        self._echo_beats = 0 if config.probes else _ECHO_BEATS

    def syn(self, dest: str | None = None) -> GossipSyn:
        """The SYN of this round (to ``dest``, a node id, if known): the whole table while it
        is small, else a partial digest and the row bucket hashes."""
        reg = self._registers
        m = self._members
        m.sending_own_row()
        cluster = list(reg.buckets) if reg.entries else []
        rows = m.rows
        if len(rows) <= self._full_rows:
            return GossipSyn(self._node_id, list(rows.values()), cluster, reg.gc_clock)
        self._syns += 1
        every = hashes_every(len(rows))
        hashes = list(m.row_hashes()) if self._syns % every == 0 else [0]   # ([0]: omitted)
        return GossipSyn(self._node_id, self._partial_digest(dest), cluster, reg.gc_clock, rows_hash=hashes)

    def _partial_digest(self, dest: str | None) -> list[Row]:
        rows = self._members.rows
        targets = self._members.targets            # (ALIVE or SUSPECT: news worth spreading)
        n = self._hot_rows
        picks = self._rng.sample(targets, n) if len(targets) > n else targets
        out = [rows[self._node_id]]
        d = rows.get(dest) if dest is not None else None
        if d is not None and d.node_id != self._node_id:
            out.append(d)
        seen = {r.node_id for r in out}
        recent = self._members.recent
        for o, left in list(recent.items())[:_MAX_RECENT_ROWS]:   # news of versions: pushed first
            if left <= 1:
                del recent[o]
            else:
                recent[o] = left - 1
            r = rows.get(o)
            if r is not None and o not in seen:
                seen.add(o)
                out.append(r)
        out += [rows[o] for o in picks if o not in seen]
        return out

    def _adjusted(self, mine: list[int], rows: dict[str, Row]) -> list[int]:
        """Our row bucket hashes as they would be with the peer's version of each row it
        listed: buckets that still differ hold something neither side listed."""
        adj = None
        get = self._members.rows.get
        for o, a in rows.items():
            r = get(o)
            if r is None or not _same_version(r, a):
                if adj is None:
                    adj = list(mine)
                b = row_bucket(o)
                adj[b] = (adj[b] + row_hash(a) - (0 if r is None else row_hash(r))) & 0xFFFFFFFF
        return mine if adj is None else adj

    # ---------------------------------------------------------- peer selection ---------

    def start(self, now_ms: int) -> list[Send]:
        """A round: the SYN, to the peers chosen for it."""
        cfg = self._config
        rng = self._rng
        m = self._members
        rows = m.rows
        dests: list[str] = []
        targets = m.targets
        others = m.others()
        if len(rows) > self._full_rows:
            # partial digests carry one origin's row to a given node about every
            # n / (fanout * (1 + _HOT_ROWS)) rounds, a newer heartbeat about half as often:
            # the detector's floor follows (R4)
            gap = 2 * self._interval_ms * len(rows) // (cfg.fanout * (1 + _HOT_ROWS))
            m.detector_floor(max(cfg.effective_heartbeat_ms, gap))
        else:
            m.detector_floor(cfg.effective_heartbeat_ms)
        if others > 0:
            self._seed_backoff_ms = self._interval_ms
            k = min(cfg.fanout, others)
            if m.hold_heartbeat and not m.seen_by_peer:   # a new life: to a majority (its confirmation),
                k = min(others, max(k, min(others // 2 + 1, _CONFIRM_FANOUT)))   # a few at most
            if k == 1:
                p = self._node_id
                while p == self._node_id:
                    p = targets[int(rng.random() * len(targets))]
                dests.append(p)
            else:
                picks = rng.sample(targets, min(k + 1, len(targets)))
                dests += [p for p in picks if p != self._node_id][:k]
        dead = [o for o, (st, _) in m.status.items() if st == DEAD]
        if dead and rng.random() < cfg.unreachable_probe_prob:
            dests.append(rng.choice(dead))
        ids = {rows[p].address: p for p in dests}
        dests = list(ids)
        if self.seeds:
            if others <= 0:
                if now_ms >= self._next_seed_ms:
                    dests.append(rng.choice(self.seeds))
                    self._stats["seed_probes"] += 1
                    self._next_seed_ms = now_ms + self._seed_backoff_ms
                    self._seed_backoff_ms = min(2 * self._seed_backoff_ms, cfg.seed_retry_max_ms)
            elif rng.random() < cfg.seed_probe_prob:
                dests.append(rng.choice(self.seeds))
        if not dests:
            return []
        seen = {self._address}
        out = []
        full = len(rows) <= self._full_rows
        syn = self.syn() if full else None
        for d in dests:
            if d not in seen:
                seen.add(d)
                out.append(Send(d, syn if full else self.syn(ids.get(d))))
        return out

    def leave(self) -> list[Send]:
        """The SYN announcing our leave, to ``leave_fanout`` random live peers at once."""
        m = self._members
        others = [t for t in m.targets if t != self._node_id]
        picks = self._rng.sample(others, min(self._config.leave_fanout, len(others)))
        syn = self.syn()
        return [Send(m.rows[p].address, syn) for p in picks]

    # ------------------------------------------------------------- exchange ------------

    def on_syn(self, src: str, msg: GossipSyn, now_ms: int) -> list[Send]:
        their_buckets = parse_buckets(msg.cluster)
        their_gc = parse_gc_clock(msg.cluster_gc, self._check, now_ms)
        if type(msg.rows_hash) is list and len(msg.rows_hash) == 1:   # a partial digest, hashes omitted
            if msg.rows_hash[0] != 0:
                raise Malformed("row buckets")
            return self._on_partial_syn(src, msg, their_buckets, their_gc, None, now_ms)
        their_rows_hash = parse_row_hashes(msg.rows_hash, ROW_BUCKETS)
        if their_rows_hash is not None:
            return self._on_partial_syn(src, msg, their_buckets, their_gc, their_rows_hash, now_ms)
        m = self._members
        same = type(msg.digest) is list and msg.digest == list(m.rows.values())
        rows = m.rows if same else parse_rows(msg.digest, 4 * self._config.max_nodes)
        own = self._senders_row(rows, msg, src)
        if same:
            m.heard_from(msg.node_id, own, now_ms)   # the same digest, row for row: nothing to merge
            if msg.node_id != m.node_id:
                m.saw_our_row(rows.get(m.node_id), True, msg.node_id)
        else:
            m.merge_rows(rows, now_ms, msg.node_id, full=True)
        # rows where we know more, or where we are behind: the sender needs to see them.
        # Slightly newer heartbeats alone do not justify an answer (they spread by push).
        reply_rows: list[Row] = []
        must_reply = False
        get = rows.get
        for o, r in m.rows.items() if rows != m.rows else ():
            a = get(o)
            if a == r:
                continue
            if (a is None or r.generation != a.generation or r.max_version != a.max_version
                    or r.gc_version != a.gc_version or r.left != a.left):
                reply_rows.append(r)
                must_reply = True
            elif r.heartbeat > a.heartbeat:
                reply_rows.append(r)
                if r.heartbeat > a.heartbeat + _HEARTBEAT_SLACK_BEATS:
                    must_reply = True
        must_reply = self._echo_sender(msg.node_id, own, reply_rows) or must_reply
        budget, cluster_reply, centries = self._registers_reply(their_buckets, their_gc)
        if not must_reply and not cluster_reply:
            return []
        if rows.get(self._node_id) != m.rows[self._node_id]:
            m.sending_own_row()              # (our row is among reply_rows, or they hold a higher one)
        deltas = self._namespaces.deltas([(r.node_id, rows.get(r.node_id)) for r in reply_rows], budget)
        ack = GossipAck(self._node_id, reply_rows, deltas, cluster_reply, centries, self._registers.gc_clock)
        return [Send(src, ack)]

    @staticmethod
    def _senders_row(rows: dict[str, Row], msg: GossipSyn, src: str) -> Row:
        """The sender's own row in its SYN, at the address it came from. Every node's SYN
        carries it (whole digest or partial): anything else is not a peer joining or
        gossiping, and gets nothing of the cluster's state."""
        own = rows.get(msg.node_id) if type(msg.node_id) is str else None
        if own is None or own.address != src:
            raise Malformed("a SYN must carry its sender's own row, at the address it came from", "hello")
        return own

    def _echo_sender(self, sender_id: str, own: Row, reply_rows: list[Row]) -> bool:
        """A life just begun (heartbeat 0 held until a peer's view of it, then its first
        beats) gets its row back as we now hold it: the view it waits for to beat, then to
        be confirmed (``Membership.saw_our_row``), in one exchange instead of waiting for a
        peer to pick it as a target; and a row for the sender ahead of the one it sent is
        another life of it, answered always so the sender sees the conflict now. True when
        the SYN must be answered for this."""
        sender = self._members.rows.get(sender_id) if sender_id != self._node_id else None
        if sender is None or not (sender.heartbeat <= self._echo_beats or sender != own):
            return False
        if sender not in reply_rows:
            reply_rows.append(sender)
        return True

    def _registers_reply(self, their_buckets: list[int] | None, their_gc: int) -> tuple[Budget, list, list]:
        """(the reply's byte budget, our bucket hashes, our cluster entries of the buckets
        whose hashes differ from the sender's), both empty when every bucket agrees: then
        the sender holds the same registers, and its GC horizon is ours."""
        budget = Budget(self._config.max_delta_bytes)
        reg = self._registers
        mine = reg.hashes()
        theirs = their_buckets or ZERO_BUCKETS
        if theirs == mine:
            reg.adopt_gc_clock(their_gc)
            return budget, [], []
        return budget, list(mine), reg.entries_for({i for i in range(BUCKETS) if theirs[i] != mine[i]}, budget)

    def _on_partial_syn(self, src: str, msg: GossipSyn, their_buckets: list[int] | None, their_gc: int,
                        their_rows_hash: list[int] | None, now_ms: int) -> list[Send]:
        """A SYN with a partial digest: merge its rows, answer where they differ from ours
        (not for heartbeats alone: those spread by push) and with our rows of every bucket
        whose hash differs (``_MAX_EXPAND_ROWS`` at most), plus our hashes (``on_ack``)."""
        m = self._members
        rows = parse_rows(msg.digest, 4 * self._config.max_nodes)
        own = self._senders_row(rows, msg, src)
        m.merge_rows(rows, now_ms, msg.node_id)
        reply_rows: list[Row] = []
        must_reply = False
        for o, a in rows.items():
            r = m.rows.get(o)
            if r is not None and r != a and not _same_version(r, a):
                reply_rows.append(r)
                must_reply = True
        must_reply = self._echo_sender(msg.node_id, own, reply_rows) or must_reply
        mine_hash = self._adjusted(m.row_hashes(), rows) if their_rows_hash is not None else None
        unexplained = their_rows_hash is not None and mine_hash != their_rows_hash   # (listed rows: answered above)
        if unexplained:
            expanded = self._expand(mine_hash, their_rows_hash)
            listed = {r.node_id for r in reply_rows}
            reply_rows += [r for r in expanded if r.node_id not in listed]
            must_reply = True
        budget, cluster_reply, centries = self._registers_reply(their_buckets, their_gc)
        if not must_reply and not cluster_reply:
            return []
        if any(r.node_id == self._node_id for r in reply_rows):
            m.sending_own_row()
        # deltas only where the sender showed its row (for the others we do not know its version)
        deltas = self._namespaces.deltas([(r.node_id, rows[r.node_id]) for r in reply_rows if r.node_id in rows],
                                         budget)
        ack = GossipAck(self._node_id, reply_rows, deltas, cluster_reply, centries, self._registers.gc_clock,
                        rows_hash=list(m.row_hashes()) if unexplained else [])
        return [Send(src, ack)]

    def _expand(self, mine: list[int], theirs: list[int]) -> list[Row]:
        """Our rows of the buckets whose hashes differ: whole buckets, in random order,
        ``_MAX_EXPAND_ROWS`` at most (but always one bucket)."""
        diff = [i for i in range(ROW_BUCKETS) if mine[i] != theirs[i]]
        if len(diff) > 1:
            self._rng.shuffle(diff)
        out: list[Row] = []
        for i in diff:
            rows = self._members.bucket_rows(i)
            if out and len(out) + len(rows) > _MAX_EXPAND_ROWS:
                break
            out += rows
        return out

    def _parse_answer(self, msg: GossipAck | GossipAck2, now_ms: int) -> tuple:
        """(rows, deltas, cluster entries, their sizes) of an ACK or ACK2, checked; Malformed."""
        limit = 4 * self._config.max_nodes      # rows beyond max_nodes are refused one by one
        if type(msg.node_id) is not str:
            raise Malformed("sender")
        rows = parse_rows(msg.digest, limit)
        deltas = parse_deltas(msg.deltas, limit, self._check, now_ms)
        return (rows, deltas) + parse_registers(msg.cluster_entries, _MAX_CLUSTER_ENTRIES, self._check, now_ms)

    def on_ack(self, src: str, msg: GossipAck, now_ms: int) -> list[Send]:
        check = self._check
        rows, deltas, their_entries, their_sizes = self._parse_answer(msg, now_ms)
        their_buckets = parse_buckets(msg.cluster)
        their_gc = parse_gc_clock(msg.cluster_gc, check, now_ms)
        their_rows_hash = parse_row_hashes(msg.rows_hash, ROW_BUCKETS)
        self._members.merge_rows(rows, now_ms, msg.node_id)
        self._namespaces.apply(deltas, now_ms)
        out_rows: list[Row] = []
        new_origins: list = []
        mine_hash = self._adjusted(self._members.row_hashes(), rows) if their_rows_hash is not None else None
        if their_rows_hash is not None and mine_hash != their_rows_hash:
            # our rows of the differing buckets where the peer showed another version (or none)
            for r in self._expand(mine_hash, their_rows_hash):
                a = rows.get(r.node_id)
                if a is None or not _same_version(a, r):
                    out_rows.append(r)
                    if a is None:
                        new_origins.append((r.node_id, None))
        if len(self._members.rows) > self._full_rows:
            # rows the peer listed (of its buckets that differed) where it is ahead: it did not
            # know our version, so it sent no deltas; our row goes back and it does (on_ack2)
            listed = {r.node_id for r in out_rows}
            get = self._members.rows.get
            for o, a in rows.items():
                r = get(o)
                if (r is not None and o not in listed and not _same_version(a, r)
                        and (a.generation, a.max_version) > (r.generation, r.max_version)):
                    out_rows.append(r)
        if any(r.node_id == self._node_id for r in out_rows):
            self._members.sending_own_row()
        reg = self._registers
        kills = reg.merge(their_entries, their_sizes, now_ms, check.kill_limit(now_ms))
        budget = Budget(self._config.max_delta_bytes - 20 * len(kills))
        centries: list = kills
        if their_buckets is not None:
            mine = reg.hashes()
            if mine == their_buckets:
                reg.adopt_gc_clock(their_gc)
            else:
                mismatched = {i for i in range(BUCKETS) if mine[i] != their_buckets[i]}
                centries += reg.entries_for(mismatched, budget, their_entries)
        deltas_out = self._namespaces.deltas(sorted(rows.items()) + new_origins, budget)
        if not deltas_out and not centries and not out_rows:
            return []
        return [Send(src, GossipAck2(self._node_id, deltas_out, centries, out_rows))]

    def on_ack2(self, src: str, msg: GossipAck2, now_ms: int) -> list[Send]:
        check = self._check
        rows, deltas, their_entries, their_sizes = self._parse_answer(msg, now_ms)
        if rows:
            self._members.merge_rows(rows, now_ms)
        self._namespaces.apply(deltas, now_ms)
        self._registers.merge(their_entries, their_sizes, now_ms, check.kill_limit(now_ms))
        if not rows:
            return []
        # the peer showed rows of differing buckets: the deltas it lacks go back (no rows, so
        # no further answer)
        deltas_out = self._namespaces.deltas(sorted(rows.items()), Budget(self._config.max_delta_bytes))
        return [Send(src, GossipAck2(self._node_id, deltas_out, []))] if deltas_out else []

    def dispatch(self, src: str, msg: Any, now_ms: int) -> list[Send] | None:
        """Handle a gossip message; None if ``msg`` is not one. Malformed propagates."""
        if isinstance(msg, GossipSyn):
            self._stats["syn_received"] += 1
            return self.on_syn(src, msg, now_ms)
        if isinstance(msg, GossipAck):
            self._stats["ack_received"] += 1
            return self.on_ack(src, msg, now_ms)
        if isinstance(msg, GossipAck2):
            self._stats["ack2_received"] += 1
            return self.on_ack2(src, msg, now_ms)
        return None
