"""Consumer groups: a commit is acknowledged only once a majority of the group's replicas hold it.

The pure half of the offsets replication the node's group host (``mesh.node.groups.group_host``)
carries out: who the replicas of a group are, when a commit has its quorum, what a new
coordinator asks for, and the checks of what a peer sent. No clock (``now_ms`` comes in),
no socket, no store.

Theory of operation
-------------------
The *replicas* of a group are the first ``count`` brokers (3 by default, all of them if
fewer) of the group's rendezvous ranking over the coordination set (``replicas_for``): the
coordinator first, then the brokers that take the group over if it fails, in that order.

1. The coordinator stages a commit in its turn's transaction and sends the rows,
   ``[group, topic, partition, offset, metadata, stamp]``, to the other replicas before
   that turn's sync, so their syncs run alongside its own (Raft's leader does the same;
   the rows of one turn for one replica travel in one message, at most
   ``MAX_ROWS_PER_MESSAGE`` rows each). It counts itself only once its own sync is done
   (``durable``); a turn rolled back abandons the commit (answered STORAGE_ERROR, though
   the replicas may still hold it: an error answer means "outcome unknown", as for a
   timed-out produce). Each replica checks them
   (``check_rows``, as a gossip row: bounds and types, but no bound on the stamp from its
   own clock, so a coordinator whose clock is ahead is still believed), persists those
   newer than what it holds in its own turn, and after that turn's sync answers
   ``GROUP_REPLICATE_R``. A replica keeps the rows as its own offsets (store, merged view,
   gossip namespace), exactly as a coordinator adopts offsets at a takeover.
3. ``CommitQuorum`` answers the member once a majority of the replicas (``quorum``) have
   it synced; after ``timeout_ms`` it answers a retriable error instead, never success (the
   commit may still take effect: it is on the coordinator's disk, as a timed-out produce).

Why the successor holds every acknowledged commit: the ranking is the same on every broker
and removing brokers only moves the others up, so the replicas of the acknowledging
majority that survive a failure are among the first ``count`` of the new ranking, and the
new coordinator is the first of them. A new coordinator also pulls what the replicas hold
(``GROUP_OFFSETS_PULL`` to ``pull_targets``: the first ``PULL_SPREAD x count`` of the new
ranking, which covers brokers pushed down by a newcomer too; answered at once with
``GROUP_OFFSETS_ROWS``), and folds the answers like gossip rows; until every target has
answered (at most ``PULL_WAIT_MS``) it answers offset fetches and commits of the group
COORDINATOR_NOT_AVAILABLE (Kafka's COORDINATOR_LOAD_IN_PROGRESS), and past that wait
while one of its own replicas (the first ``count``: every surviving holder of an
acknowledged commit is among them) is in the coordination set and has not answered
(asked again every ``PULL_WAIT_MS``), and its takeover grace
keeps members from being given partitions (and so from reading offsets) meanwhile. Ordering is
the per-group stamp (``OffsetBook.next_stamp``: above every stamp seen for the group), so
no broker's clock decides which of two commits is newer, and a committed offset moves
back only by an explicit reset or deletion (a newer stamp).

What it costs: one round trip to the nearest majority of the replicas per turn of commits
(the rows of every commit of a turn share one message per replica). What survives: the
failure of any minority of the group's replicas (one broker of three, or of a 3-broker
cluster).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

from mesh.groups.messages import (
    GroupReplicate, check_group_id, check_int, check_list, check_topic, invalid,
)
from mesh.cluster.ownership import ranked_nodes
from mesh.groups.state import DELETED

__all__ = [
    "Row", "CommitQuorum", "Loading", "replicas_for", "quorum", "majority_of", "pull_targets", "check_rows", "check_groups",
    "DEFAULT_REPLICAS", "MAX_ROWS_PER_MESSAGE", "MAX_PULL_GROUPS", "PULL_SPREAD", "PULL_WAIT_MS",
]

Row = tuple[str, str, int, int, str, int]   # (group, topic, partition, offset, metadata, stamp)

DEFAULT_REPLICAS = 3
MAX_ROWS_PER_MESSAGE = 10_000
MAX_PULL_GROUPS = 1_000          # groups named in one pull
PULL_SPREAD = 2                  # a new coordinator pulls from the first 2 x count of the ranking
MAX_WAITING = 100_000            # commits waiting for their quorum (beyond: refused at once)
PULL_WAIT_MS = 1_000             # a new coordinator answers "loading" this long at most while it pulls
_MAX_STAMP = (1 << 63) - 1
_NEVER = 1 << 62


def replicas_for(group_id: str, coord_set: Iterable[str], count: int) -> list[str]:
    """The group's replicas: the first ``count`` of its ranking (the coordinator first)."""
    return ranked_nodes(group_id, coord_set)[:max(1, count)]


def quorum(replicas: int) -> int:
    """How many replicas must hold a commit before it is acknowledged: a majority."""
    return replicas // 2 + 1


def majority_of(live_replicas: int, count: int, known: int) -> int:
    """How many of the group's replicas must hold a commit: a majority of the ``count``
    it would have over every broker gossip knows (``known``: all but those that left), not
    only over those alive in this broker's view. Counted over the live ones, a coordinator
    cut off from the others (its view: they are dead) was its group's only replica and
    acknowledged alone what the other side never saw. Below 3 known brokers a failure
    cannot be survived anyway: the survivor of a pair goes on alone once the other is
    convicted (as before)."""
    if known < 3:
        return quorum(live_replicas)
    return quorum(min(count, known))


def pull_targets(group_ids: Iterable[str], coord_set: Iterable[str], node_id: str,
                 count: int) -> dict[str, list[str]]:
    """Whom a new coordinator asks for what they hold: destination -> groups (sorted)."""
    nodes = frozenset(coord_set)
    out: dict[str, list[str]] = {}
    for group_id in sorted(set(group_ids)):
        for dest in ranked_nodes(group_id, nodes)[:PULL_SPREAD * max(1, count)]:
            if dest != node_id:
                out.setdefault(dest, []).append(group_id)
    return out


def check_rows(rows: Any, max_metadata_chars: int, limit: int = MAX_ROWS_PER_MESSAGE) -> list[Row]:
    """Rows a peer sent, checked as a gossip row is (``MeshError(INVALID_REQUEST)``): the
    stamp is any non-negative int (never judged by this broker's clock)."""
    out = []
    for row in check_list(rows, limit, "rows"):
        if not isinstance(row, (list, tuple)) or len(row) != 6:
            raise invalid("rows: each must be [group, topic, partition, offset, metadata, stamp]")
        group_id, topic, partition, offset, metadata, stamp = row
        check_group_id(group_id)
        check_topic(topic)
        check_int(partition, 0, (1 << 31) - 1, "partition")
        check_int(offset, DELETED, _MAX_STAMP, "offset")
        if not isinstance(metadata, str) or len(metadata) > max_metadata_chars:
            raise invalid(f"offset metadata must be a string of at most {max_metadata_chars} characters")
        check_int(stamp, 0, _MAX_STAMP, "stamp")
        out.append((group_id, topic, partition, offset, metadata, stamp))
    return out


def check_groups(groups: Any) -> list[str]:
    return [check_group_id(g) for g in check_list(groups, MAX_PULL_GROUPS, "groups")]


@dataclass(slots=True)
class _Waiting:
    needed: int          # answers from the other replicas, with this one's own sync counted
    mine: bool           # this broker is one of the replicas: its own sync counts, and must come
    durable: bool        # ... and it is done
    deadline_ms: int
    acked: set[str] = field(default_factory=set)
    outstanding: dict[str, int] = field(default_factory=dict)   # replica -> messages not yet answered


class CommitQuorum:
    """Commits synced here, waiting for a majority of their replicas (module doc).

    ``begin`` takes the commits of one turn (``durable``: already synced here, else call
    ``durable`` once they are, or ``abandon`` if the turn is rolled back) and says what to
    send and which are acknowledged already (a group whose only replica is this broker);
    ``acked`` and ``expire`` say which are done or failed later. Keys are the shell's."""

    def __init__(self, node_id: str, replicas: int = DEFAULT_REPLICAS, timeout_ms: int = 3_000,
                 max_waiting: int = MAX_WAITING, first_seq: int = 0):
        """``first_seq``: where this life's message numbers start; the shell draws it at
        random, so that an answer to a message of an earlier life of this broker (queued in a
        replica's link while it restarted) never counts for a message of this one."""
        if replicas < 1 or timeout_ms < 1:
            raise ValueError("replicas and timeout_ms must be positive")
        self.node_id = node_id
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.max_waiting = max_waiting
        self._seq = first_seq
        self._waiting: dict[Hashable, _Waiting] = {}
        self._batches: dict[int, tuple[str, list[Hashable]]] = {}   # seq -> (replica, keys)
        # (deadline, key or seq) in the order they began: deadlines never decrease (a
        # monotonic ``now_ms``), so expiry pops from the front
        self._deadlines: collections.deque[tuple[int, Hashable]] = collections.deque()
        self._batch_deadlines: collections.deque[tuple[int, int]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def begin(self, commits: Iterable[tuple[Hashable, str, list[Row]]], coord_set: Iterable[str],
              now_ms: int, durable: bool = True, known: int = 0
              ) -> tuple[list[tuple[str, GroupReplicate]], list[Hashable], list[Hashable]]:
        """``commits``: (key, group, rows) staged (``durable``: synced) here; ``known``: how
        many brokers gossip knows (all but those that left; ``majority_of``). Returns
        (sends: (replica, message), done: keys acknowledged now, refused: keys over the
        bound, answer an error)."""
        nodes = frozenset(coord_set) | {self.node_id}
        per_dest: dict[str, list[tuple[Hashable, Row]]] = {}
        done, refused = [], []
        for key, group_id, rows in commits:
            replicas = replicas_for(group_id, nodes, self.replicas)
            mine = self.node_id in replicas
            needed = majority_of(len(replicas), self.replicas, known) - mine
            others = [r for r in replicas if r != self.node_id]
            if len(self._waiting) >= self.max_waiting or key in self._waiting:
                refused.append(key)
                continue
            waiting = _Waiting(needed, mine, durable, now_ms + self.timeout_ms)
            if not rows or self._done(waiting):
                done.append(key)
                continue
            self._waiting[key] = waiting
            self._deadlines.append((waiting.deadline_ms, key))
            for dest in others:
                per_dest.setdefault(dest, []).extend((key, row) for row in rows)
        sends = []
        for dest in sorted(per_dest):
            items = per_dest[dest]
            for start in range(0, len(items), MAX_ROWS_PER_MESSAGE):
                part = items[start:start + MAX_ROWS_PER_MESSAGE]
                self._seq += 1
                keys = list(dict.fromkeys(k for k, _ in part))
                self._batches[self._seq] = (dest, keys)
                self._batch_deadlines.append((now_ms + self.timeout_ms, self._seq))
                for key in keys:
                    w = self._waiting[key]
                    w.outstanding[dest] = w.outstanding.get(dest, 0) + 1
                sends.append((dest, GroupReplicate(self._seq, [list(r) for _, r in part])))
        return sends, done, refused

    def acked(self, src: str, seq: Any) -> list[Hashable]:
        """``src`` has synced message ``seq``: the keys that now have their quorum. An
        answer from anyone but the replica it was sent to, or for no message, is ignored."""
        batch = self._batches.get(seq) if isinstance(seq, int) else None
        if batch is None or batch[0] != src:
            return []
        del self._batches[seq]
        done = []
        for key in batch[1]:
            w = self._waiting.get(key)
            if w is None:
                continue
            left = w.outstanding.get(src, 0) - 1
            w.outstanding[src] = left
            if left <= 0:
                w.acked.add(src)
                if self._done(w):
                    del self._waiting[key]
                    done.append(key)
        return done

    def durable(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """The turn that staged these keys is synced here: those that now have their quorum."""
        done = []
        for key in keys:
            w = self._waiting.get(key)
            if w is not None:
                w.durable = True
                if self._done(w):
                    del self._waiting[key]
                    done.append(key)
        return done

    def abandon(self, keys: Iterable[Hashable]) -> None:
        """The turn that staged these keys was rolled back: they are answered (an error) now
        (their messages are forgotten when they would have timed out)."""
        for key in keys:
            self._waiting.pop(key, None)

    @staticmethod
    def _done(w: _Waiting) -> bool:
        return len(w.acked) >= w.needed and (w.durable or not w.mine)

    def expire(self, now_ms: int) -> list[Hashable]:
        """Keys whose quorum did not come within ``timeout_ms``: answer a retriable error.
        ``now_ms`` must be monotonic (a timeout is about liveness, never safety)."""
        gone = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            _, key = deadlines.popleft()
            w = self._waiting.get(key)
            if w is not None and w.deadline_ms <= now_ms:
                del self._waiting[key]
                gone.append(key)
        batches = self._batch_deadlines
        while batches and batches[0][0] <= now_ms:   # answers that may still come are ignored
            self._batches.pop(batches.popleft()[1], None)
        return gone


class Loading:
    """Groups a new coordinator is loading: it asked ``targets`` what they hold, and answers
    "loading" until each has answered or ``wait_ms`` has passed (a target that died), and
    past that while one of the ``required`` ones (its own replicas: among them every
    surviving holder of an acknowledged commit) has not answered and is still in the
    coordination set. A timeout alone let a successor hand out an older offset when the one
    replica holding the commit was slow for a second (found by review); a required target
    is asked again every ``wait_ms`` (the question or the answer may have been dropped)."""

    def __init__(self, wait_ms: int = PULL_WAIT_MS, max_groups: int = MAX_WAITING):
        self.wait_ms = wait_ms
        self.max_groups = max_groups
        # group -> [not answered yet, required not answered yet, until, ask the required again at]
        self._groups: dict[str, list] = {}
        self._next_due_ms = _NEVER   # no group is due before this (``expire`` walks them only then)

    def begin(self, group_id: str, targets: Iterable[str], now_ms: int,
              required: Iterable[str] = ()) -> bool:
        """False if there is nobody to ask (or too many groups load at once: not gated)."""
        targets = set(targets)
        if not targets or (group_id not in self._groups and len(self._groups) >= self.max_groups):
            return False
        self._groups[group_id] = [targets, set(required) & targets, now_ms + self.wait_ms, now_ms + self.wait_ms]
        self._next_due_ms = min(self._next_due_ms, now_ms + self.wait_ms)
        return True

    def answered(self, src: str, groups: Iterable[str]) -> None:
        for group_id in groups:
            entry = self._groups.get(group_id)
            if entry is not None:
                entry[0].discard(src)
                entry[1].discard(src)
                if not entry[0]:
                    del self._groups[group_id]

    def loading(self, group_id: str, now_ms: int, live: frozenset[str] | None = None) -> bool:
        """``live``: the coordination set (a required target that left it no longer counts)."""
        entry = self._groups.get(group_id)
        if entry is None:
            return False
        return now_ms < entry[2] or bool(entry[1] if live is None else entry[1] & live)

    def expire(self, now_ms: int, live: frozenset[str] | None = None) -> dict[str, list[str]]:
        """Forget groups that are done waiting; the required targets to ask again (target ->
        groups, sorted), for the groups past their wait that still need them. Walks the
        groups only when one of them is due."""
        again: dict[str, list[str]] = {}
        if now_ms < self._next_due_ms:
            return again
        next_due = _NEVER
        for group_id in list(self._groups):
            entry = self._groups[group_id]
            _, required, until, ask_at = entry
            if until > now_ms:
                next_due = min(next_due, until)
                continue
            waiting = required if live is None else required & live
            if not waiting:
                del self._groups[group_id]
                continue
            if ask_at <= now_ms:
                ask_at = entry[3] = now_ms + self.wait_ms
                for dest in waiting:
                    again.setdefault(dest, []).append(group_id)
            next_due = min(next_due, ask_at)
        self._next_due_ms = next_due
        return {dest: sorted(groups) for dest, groups in sorted(again.items())}

    def __len__(self) -> int:
        return len(self._groups)
