"""The group host's offsets replication: what ``mesh.groups.replication`` decides, carried out.

Theory of operation
-------------------
The rules (who the replicas are, when a commit has its quorum, whom a new coordinator
asks) are in ``mesh.groups.replication``; this shell only persists, sends and answers.

Coordinator side: ``begin`` takes the commits staged in the turn (the group host calls it
from its tick, before the turn's sync, or from ``after_commit`` for those staged after its
tick) and sends their rows to the other replicas; ``durable`` (the turn's sync is done) or
``abandon`` (rolled back) follow. A commit's answer is held until ``CommitQuorum`` says a
majority has it (``on_ack``, ``durable``), or ``tick`` finds it timed out (then
COORDINATOR_NOT_AVAILABLE, retriable: not acknowledged).

Replica side: ``on_replicate`` checks the rows and stages those newer than this node's own
in the turn's transaction; ``after_commit`` (after the sync) records them as own offsets
(book, gossip namespace) and answers ``GROUP_REPLICATE_R``; a turn rolled back answers
nothing (the coordinator times out).

Takeover: ``want_pull`` (a group just became coordinated here) queues the group;
``flush`` (after a cluster change or a request, and every tick) asks ``pull_targets``
for their rows (``GROUP_OFFSETS_PULL``), answered at once
from the merged view (``on_pull``); the answers are checked and folded (``on_rows``), and
any newer than the core's offsets go through the ordinary takeover (``take_newer``: load,
adopt). Until every target answered (at most ``PULL_WAIT_MS``, but as long as one of the
group's replicas in the coordination set has not: asked again each ``PULL_WAIT_MS``) the
group is ``loading``:
the host answers its offset fetches and writes COORDINATOR_NOT_AVAILABLE. A group whose
offsets were loaded at a takeover is copied to its (new) replicas (``want_copy``), so a
commit that survived a failure on one replica is on a majority again before the next.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Callable

from mesh.groups.messages import (
    GroupOffsetsPull, GroupOffsetsRows, GroupReplicate, GroupReplicateAck, error_response, invalid,
)
from mesh.groups.replication import (
    MAX_PULL_GROUPS, MAX_ROWS_PER_MESSAGE, CommitQuorum, Loading, check_groups, check_rows, pull_targets,
    replicas_for,
)
from mesh.wire.errors import ErrorCode

__all__ = ["OffsetReplication"]

log = logging.getLogger("mesh.node.groups.group_host")

_MAX_PULL_QUEUE = 100_000
_SEQ_RNG = random.SystemRandom()
_COPY = "copy"   # the held "answer" of a copy (``want_copy``): retried if it times out


class OffsetReplication:
    """``host``: the ``GroupHost`` (its book, ``_stage``, ``_gossip_chunks``, ``_carry_out``,
    ``_reply``, ``coord_nodes``); ``send(node_id, msg)``: a one-way peer message."""

    def __init__(self, host, send: Callable[[str, Any], None], replicas: int, timeout_ms: int,
                 max_metadata_chars: int):
        self.host = host
        self._send = send
        self.replicas = replicas
        # message numbers start at random: an answer to an earlier life's message never counts
        self.quorum = CommitQuorum(host.node_id, replicas, timeout_ms, first_seq=_SEQ_RNG.getrandbits(62))
        self._max_metadata_chars = max_metadata_chars
        self._answers: dict[int, tuple] = {}   # key -> (ident, rid, msg, resp, group): held for the quorum
        self._next_key = 0
        self._staged: list[tuple[str, int, list]] = []   # (coordinator, seq, rows) staged this turn
        self._pulls: dict[str, list[str]] = {}   # group -> whom to ask, sent at the next tick
        self._loading = Loading()
        self._copies: set[str] = set()   # groups taken over: their rows go to their replicas again
        self.sent = self.acked = self.timed_out = 0

    # -- coordinator side ---------------------------------------------------------------
    def begin(self, commits: list[tuple[Any, int, Any, Any, str, list]], now_ms: int,
              durable: bool = True) -> list[int]:
        """``commits``: (ident, rid, msg, resp, group, rows) staged (``durable``: synced)
        here; answered when done. Their keys (for ``durable`` and ``abandon``)."""
        batch = []
        for ident, rid, msg, resp, group_id, rows in commits:
            self._next_key += 1
            self._answers[self._next_key] = (ident, rid, msg, resp, group_id)
            batch.append((self._next_key, group_id, rows))
        sends, done, refused = self.quorum.begin(batch, self.host.coord_nodes(now_ms), self._mono_ms(), durable,
                                                 known=self.host.known_brokers(now_ms))
        for dest, message in sends:
            self._send(dest, message)
            self.sent += 1
        self._answer(done, ok=True)
        self._answer(refused, ok=False, why="too many commits wait for their replicas")
        return [key for key, _, _ in batch]

    def durable(self, keys: list[int]) -> None:
        """The turn that staged ``keys`` is synced here (it counts for their quorum)."""
        self._answer(self.quorum.durable(keys), ok=True)

    def abandon(self, keys: list[int]) -> None:
        """The turn that staged ``keys`` was rolled back: the host answers them (an error)."""
        self.quorum.abandon(keys)
        for key in keys:
            self._answers.pop(key, None)

    def on_ack(self, src: str, msg: GroupReplicateAck) -> None:
        self._answer(self.quorum.acked(src, msg.seq), ok=True)

    def _mono_ms(self) -> int:
        return self.host._clock.now_ms()   # timeouts: the monotonic scale (a wall clock may jump)

    def tick(self, now_ms: int) -> None:
        """``now_ms``: the wall clock the host ticks with (timeouts read the monotonic one)."""
        mono_ms = self._mono_ms()
        gone = self.quorum.expire(mono_ms)
        if gone:
            self.timed_out += len(gone)
            log.warning("%d offsets commits not acknowledged: no majority of their replicas answered within "
                        "%d ms", len(gone), self.quorum.timeout_ms)
            self._answer(gone, ok=False, why=f"not on a majority of the group's replicas within "
                                             f"{self.quorum.timeout_ms} ms; retry")
        self.flush()
        again = self._loading.expire(mono_ms, self.host.coord_nodes(now_ms))
        for dest, groups in sorted(again.items()):   # a replica that has not answered: asked again
            log.warning("%d groups still loading: broker %s has not answered what it holds of them",
                        len(groups), dest)
            for start in range(0, len(groups), MAX_PULL_GROUPS):
                self._send(dest, GroupOffsetsPull(groups[start:start + MAX_PULL_GROUPS]))

    def flush(self) -> None:
        """Send the queued pulls (one message per replica and ``MAX_PULL_GROUPS``) and
        copies (one ``begin``: one message per replica)."""
        if self._copies:
            groups, self._copies = sorted(self._copies), set()
            copies = [(None, 0, None, _COPY, g, self.host.book.rows_of([g])) for g in groups
                      if self.host.book.is_mine(g)]
            self.begin([c for c in copies if c[5]], self.host._clock.wall_ms())
        if self._pulls:
            per_dest: dict[str, list[str]] = {}
            for group_id, dests in sorted(self._pulls.items()):
                for dest in dests:
                    per_dest.setdefault(dest, []).append(group_id)
            self._pulls = {}
            for dest, groups in sorted(per_dest.items()):
                for start in range(0, len(groups), MAX_PULL_GROUPS):
                    self._send(dest, GroupOffsetsPull(groups[start:start + MAX_PULL_GROUPS]))

    def _answer(self, keys, ok: bool, why: str = "") -> None:
        for key in keys:
            entry = self._answers.pop(key, None)
            if entry is None:
                continue
            ident, rid, msg, resp, group_id = entry
            if ident is None:   # the host's own write (an expiry, a commit again, a copy): nobody to answer
                if resp is _COPY and not ok:
                    self.want_copy(group_id)   # a copy is tried until a majority has it
                continue
            if ok:
                self.acked += 1
                self.host._reply(ident, rid, resp)
            else:
                self.host._reply(ident, rid, error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, why))

    # -- replica side -------------------------------------------------------------------
    def on_replicate(self, src: str, msg: GroupReplicate) -> None:
        if not isinstance(msg.seq, int) or isinstance(msg.seq, bool):
            raise invalid("seq must be an int")
        latest: dict[tuple, tuple] = {}   # a partition twice (two commits of one turn): the newest only
        for row in check_rows(msg.rows, self._max_metadata_chars):
            tp = row[:3]
            old = latest.get(tp)
            if old is None or (old[5], old[3]) < (row[5], row[3]):
                latest[tp] = row
        newer = self.host.book.newer_than_own(latest[tp] for tp in sorted(latest))
        by_group: dict[str, list] = {}
        for group_id, topic, partition, offset, metadata, stamp in newer:
            by_group.setdefault(group_id, []).append((topic, partition, offset, metadata, stamp))
        for group_id, entries in sorted(by_group.items()):
            if not self.host._stage(group_id, entries, None):
                return   # the turn is rolled back: no answer, the coordinator times out
        self._staged.append((src, msg.seq, newer))

    def staged_partitions(self) -> set[tuple[str, str, int]]:
        """(group, topic, partition) with a replicated row staged in this turn."""
        return {(g, t, p) for _, _, rows in self._staged for g, t, p, *_ in rows}

    def after_commit(self, ok: bool) -> None:
        staged, self._staged = self._staged, []
        if not ok:
            return
        host = self.host
        for src, seq, rows in staged:
            chunks, changed = host.book.held_here(rows)
            for chunk in chunks:
                host._gossip_chunks(chunk[0], [chunk])
            self._send(src, GroupReplicateAck(seq))
            for group_id in sorted(changed):
                if host.book.is_mine(group_id):   # (views disagree for a moment: we think we coordinate it)
                    host._carry_out(host.book.take_newer(group_id))

    # -- takeover -----------------------------------------------------------------------
    def want_pull(self, group_id: str, now_ms: int) -> None:
        """``group_id`` just became coordinated here: ask its replicas what they hold (at the
        next tick), and answer "loading" until they did (``loading``)."""
        nodes = self.host.coord_nodes(now_ms)
        dests = sorted(pull_targets([group_id], nodes, self.host.node_id, self.replicas))
        required = replicas_for(group_id, nodes | {self.host.node_id}, self.replicas)
        if self._loading.begin(group_id, dests, self._mono_ms(), required) and len(self._pulls) < _MAX_PULL_QUEUE:
            self._pulls[group_id] = dests

    def want_copy(self, group_id: str) -> None:
        """A group taken over here: what it holds goes to the group's replicas (now this
        broker's ranking) at the next ``flush``, so an acknowledged commit that survived on
        this broker alone is on a majority again (nobody is answered)."""
        if len(self._copies) < _MAX_PULL_QUEUE:
            self._copies.add(group_id)

    def loading(self, group_id: str, now_ms: int) -> bool:
        """A pull of the group's offsets is not answered yet (and not timed out)."""
        return self._loading.loading(group_id, self._mono_ms(), self.host.coord_nodes(now_ms))

    def on_pull(self, src: str, msg: GroupOffsetsPull) -> None:
        """Answer from the merged view, at most ``MAX_ROWS_PER_MESSAGE`` rows a message, each
        naming the groups it completes (memory: one message, whatever the groups hold)."""
        rows: list = []
        done: list[str] = []
        for group_id in sorted(set(check_groups(msg.groups))):
            for row in self.host.book.rows_of([group_id]):
                if len(rows) >= MAX_ROWS_PER_MESSAGE:
                    self._send(src, GroupOffsetsRows(rows, done))
                    rows, done = [], []
                rows.append(list(row))
            done.append(group_id)
        self._send(src, GroupOffsetsRows(rows, done))

    def on_rows(self, src: str, msg: GroupOffsetsRows) -> None:
        host = self.host
        rows = check_rows(msg.rows, self._max_metadata_chars)
        self._loading.answered(src, check_groups(msg.groups))
        changed = host.book.fold_rows(rows)
        for group_id in sorted(changed):
            if host.book.is_mine(group_id):
                host._carry_out(host.book.take_newer(group_id))

    def handle(self, src: str, msg: Any) -> None:
        if isinstance(msg, GroupReplicate):
            self.on_replicate(src, msg)
        elif isinstance(msg, GroupReplicateAck):
            self.on_ack(src, msg)
        elif isinstance(msg, GroupOffsetsPull):
            self.on_pull(src, msg)
        elif isinstance(msg, GroupOffsetsRows):
            self.on_rows(src, msg)

