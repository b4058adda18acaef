"""Consumer groups: the committed offsets every broker knows, and who takes which group over.

The pure half of the node's group host (``mesh.node.groups.group_host``): inputs in, results out,
no store, no gossip, no clock (stamps and views are passed in).

Theory of operation
-------------------
Offsets are durable, then gossiped (the etcd-raft "persist, then send" order): a commit the
coordinator core accepted is written to the coordinator's disk and to a majority of the
group's replicas before it is answered (``mesh.groups.replication``), and put in the gossip
namespaces of the coordinator and of each replica that holds it, chunked:
``mesh.cluster.keys.offsets_key(group, topic, n)`` holds
``{"g": group, "t": topic, "o": {"<partition>": [offset, metadata, wall_ms]}}`` for
partitions ``32n .. 32n+31`` (``encode_chunk``; group and topic ride in the value, so names
containing "/" are unambiguous; commit metadata is limited to 256 characters, so 32
partitions stay far below the 60 KB gossip entry limit). A commit is on a majority of the
group's replicas when it is acknowledged and on every broker a gossip round or two later.
If the coordinator dies in between, its successor is one of those replicas, or pulls from
them at its takeover (``rows_of``, ``fold_rows``): it resumes from the last acknowledged
commit. Replicated rows are this node's own offsets (``newer_than_own``, ``held_here``), as
adopted ones are.

The merged view: every broker folds all namespaces' ``off/`` entries into one table,
``(group, topic, partition) -> (offset, metadata, wall_ms)``, where the latest commit wins
(greater ``wall_ms``, then greater offset: ``fold``). Commit stamps are strictly increasing
per node (``next_stamp``), so a reset to an *earlier* offset is still the latest commit.
The fold is monotone, so it is incremental (``node_moved`` and ``entry_moved`` say which
namespace entries to read again) and needs no deletes.

Coordination: a group is coordinated by ``coordinator_for`` over the *coordination set*,
the brokers the gossip view holds up (``mesh.cluster.ownership.coordination_set``: ALIVE and
SUSPECT both count, so a broker that misses a few heartbeats does not bounce its groups
around). When the set changes (``on_cluster_change``):

* *rehoming*: groups that now hash here are claimed, groups that hash elsewhere are
  dropped from the core (``Moved``);
* *takeover*: when a broker left the set, or when this node, alone so far, meets others
  (it may be the newcomer), the core must ``begin_takeover``: members of the old
  coordinator may still hold partitions until their sessions end (``takeover_due``);
* a claimed group, and any group of ours whose merged offsets moved, gets the merged
  offsets newer than what the core holds (``Takeover.load``); those not yet durable here are
  *adopted* (``Takeover.adopt``): written to this node's store and namespace with their
  original stamps, so they survive the old node's namespace being garbage-collected from
  gossip. A later commit for one of our groups that arrives through gossip (the old
  coordinator's last commits, late) thus replaces ours when its stamp is newer.

At start, a node with no seeds that knows no other node starts alone (``starts_alone``): no
coordinator can hold members of its groups, so there is no takeover grace.

Deletion: a deleted group (``GROUP_DELETE``, or offsets retention) is a commit of
*tombstones*, offset ``DELETED`` (-1), made durable and gossiped like any commit, so each
wins over every older commit of its partition by the same rule (per partition, so the view
converges whatever order entries arrive in). The coordinator writes one for every
partition of every topic the group has an offset of, not only those it holds offsets for,
so a commit it never heard of (made on a broker that crashed before gossiping it) is
deleted too when that broker comes back. The views (``committed``, ``knows``, ``groups``,
``offsets_for``) hide tombstones; a coordinator that loads one drops that partition's
offset. Stamps of a group's commits (tombstones included) are
above every stamp this node has seen for the group (``next_stamp``), so a deletion wins
even where the deleting broker's clock is behind the last committer's, and a commit after
a deletion (the group starts again) wins over the tombstone.

A deletion can be wrong: the broker that made it may not have known the group's members
(it was cut off from the others, or had just taken the group over). So a coordinator
deletes only with more than half of the known brokers in view (``sees_majority``) and only
once its takeover grace has passed (the core's rule), and a coordinator that *has* members
of the group and learns of a tombstone for an offset it holds keeps the offset and commits
it again above the tombstone (the core's ``load_offsets``; the host's ``_commit_again``),
also when the group moves away from it at that moment (a split healed: the deleting broker
is where the members go next; the core's ``drop_group``), or later, for a tombstone older
than the move that arrives after it (the host remembers such groups for the horizon). What
we accept: gossip forgets a DEAD broker after an hour, so a broker cut off for longer than
that sees a majority of what it still knows, and may delete.

Bounds, by garbage collection (``collect``, every few seconds): the merged view drops
tombstones older than the horizon (a day by default); a node drops from its own namespace
and store the entries a newer tombstone superseded, and its tombstones past the horizon,
in two steps (the store first, the book and gossip once that is synced). A broker
that was away for longer than the horizon with offsets of a deleted group brings them back
(as Kafka has no such case, this is ours to document): the group reappears with no members
and expires again after the retention.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from mesh.cluster.keys import OFFSETS_CHUNK_PARTITIONS, offsets_key
from mesh.cluster.liveness import is_member
from mesh.cluster.ownership import coordination_set, coordinator_among
from mesh.groups.messages import check_partitions
from mesh.groups.state import DELETED

__all__ = [
    "OffsetBook", "Takeover", "Moved", "MalformedOffsets", "Stamp", "Chunk", "DELETED",
    "sees_majority", "starts_alone",
    "takeover_due", "chunk_of", "encode_chunk",
]

Stamp = tuple[int, int]          # (wall_ms, offset): the greater is the later commit
Chunk = tuple[str, str, int]     # (group, topic, partition // OFFSETS_CHUNK_PARTITIONS)
Committed = tuple[int, str, int]  # (offset, metadata, wall_ms)
OffsetEntry = tuple[str, int, int, str]          # (topic, partition, offset, metadata)
StampedEntry = tuple[str, int, int, str, int]    # ... and the commit's wall_ms

_NO_STAMP: Stamp = (-1, -1)
_MAX_FETCH_PARTITIONS = 100_000   # a fetch of offsets answered from the merged view (as the coordinator's bound)


class MalformedOffsets(ValueError):
    """An ``off/`` gossip entry that is not ``{"g": str, "t": str, "o": {...}}``."""


@dataclass(frozen=True, slots=True)
class Takeover:
    """Merged offsets of a group coordinated here that are newer than what its core holds.

    Give ``load`` to the core (``load_offsets(..., replace=True)``); make ``adopt`` durable
    here, then call ``OffsetBook.adopted`` and gossip the chunks it returns. ``claimed``:
    the group just became coordinated here."""
    group_id: str
    load: tuple[OffsetEntry, ...] = ()
    adopt: tuple[StampedEntry, ...] = ()
    claimed: bool = False
    newest_ms: int = -1   # the group's newest live commit stamp (``newest_commit_ms``)


@dataclass(frozen=True, slots=True)
class Moved:
    """A group coordinated here until now hashes to ``coordinator``: drop it from the core."""
    group_id: str
    coordinator: str | None


# ---------------------------------------------------------------------------------------
# Pure helpers

def starts_alone(seeded: bool, member_ids: Iterable[str], node_id: str) -> bool:
    """A node started without seeds that knows no other node: no takeover grace at start."""
    return not seeded and all(m == node_id for m in member_ids)


def sees_majority(members: Iterable[Any]) -> bool:
    """More than half of the brokers gossip knows (those that did not leave) may coordinate:
    a broker cut off from the others may not know a group's members, so it deletes nothing."""
    members = list(members)
    known = sum(1 for m in members if is_member(m.status))
    return 2 * len(coordination_set(members)) > known


def takeover_due(before: frozenset[str] | None, after: frozenset[str], node_id: str) -> bool:
    """Groups may have moved here: any change of the set. A broker left it; this node,
    alone so far, met others (it may be the newcomer to a running cluster); or a split
    healed, where the set only grows but groups coordinated on the other side (with
    members holding partitions) move here. (Only growth used to count as no takeover: a
    group that came here as a split healed got partitions given, and could be deleted, at
    once, while its members were still with the other side.)"""
    return before is not None and before != after


def chunk_of(group_id: str, topic: str, partition: int) -> Chunk:
    return (group_id, topic, partition // OFFSETS_CHUNK_PARTITIONS)


def encode_chunk(chunk: Chunk, entries: dict[int, list]) -> tuple[str, dict]:
    """The gossip key and value of one chunk of this node's offsets."""
    group_id, topic, n = chunk
    value = {"g": group_id, "t": topic, "o": {str(p): list(v) for p, v in sorted(entries.items())}}
    return offsets_key(group_id, topic, n), value


# ---------------------------------------------------------------------------------------
# The book

class OffsetBook:
    """What one broker knows about committed offsets, and which groups it coordinates."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        # what this node committed or adopted: chunk -> {partition: [offset, metadata, wall_ms]}
        self._own: dict[Chunk, dict[int, list]] = {}
        # the merged view of every namespace: group -> {(topic, partition): (offset, metadata, wall_ms)}
        self._merged: dict[str, dict[tuple[str, int], Committed]] = {}
        self._seen_nodes: dict[str, tuple[int, int]] = {}   # node -> (generation, max version)
        self._seen_keys: dict[str, dict[str, Any]] = {}      # node -> key -> entry version
        # stamps of the offsets the core holds, for the groups coordinated here
        self._loaded: dict[str, dict[tuple[str, int], Stamp]] = {}
        self._mine: set[str] = set()
        # per group: how many partitions hold a commit, not a tombstone (``knows`` without a
        # walk); the newest stamp seen of any entry (``next_stamp``); newest live commit
        self._live: dict[str, int] = {}
        self._max_stamp: dict[str, int] = {}
        self._newest_ms: dict[str, int] = {}
        self._tombstoned: set[str] = set()   # groups with a tombstone in the view (``collect`` looks there only)
        self._issued: dict[str, int] = {}    # per group: the last stamp handed out, not yet folded
        self._own_tombstoned: set[str] = set()   # groups with a tombstone among this node's own entries
        self.coord_set: frozenset[str] | None = None   # None until the first cluster change

    # -- views ----------------------------------------------------------------------------

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        """The merged view of one group: (topic, partition) -> (offset, metadata, wall_ms)."""
        return {tp: v for tp, v in self._merged.get(group_id, {}).items() if v[0] != DELETED}

    def knows(self, group_id: str) -> bool:
        """Some broker committed offsets for this group (not deleted since)."""
        return self._live.get(group_id, 0) > 0

    def groups(self) -> list[str]:
        """Every group with committed offsets anywhere, sorted."""
        return sorted(g for g in self._merged if self.knows(g))

    def deleted(self, group_id: str) -> dict[tuple[str, int], int]:
        """The group's partitions whose newest entry is a tombstone, with its stamp."""
        if group_id not in self._tombstoned:
            return {}
        return {tp: v[2] for tp, v in self._merged.get(group_id, {}).items() if v[0] == DELETED}

    def is_mine(self, group_id: str) -> bool:
        return group_id in self._mine

    def offsets_for(self, group_id: str, partitions: Any) -> list:
        """``[[topic, partition, offset, metadata]]`` from the merged view (offset -1 where
        nothing is committed); ``partitions`` None: all committed."""
        merged = self._merged.get(group_id, {})
        if partitions is None:
            wanted = sorted(tp for tp, v in merged.items() if v[0] != DELETED)
        else:   # checked as the coordinator checks them: a bad entry is INVALID_REQUEST, never a TypeError
            wanted = sorted(check_partitions(partitions, _MAX_FETCH_PARTITIONS, "partitions"))
        out = []
        for tp in wanted:
            offset, metadata, _ = merged.get(tp, (DELETED, "", 0))   # (DELETED is -1: nothing committed)
            out.append([tp[0], tp[1], offset, metadata])
        return out

    def own_chunks(self) -> list[Chunk]:
        return sorted(self._own)

    def chunk_entry(self, chunk: Chunk) -> tuple[str, dict]:
        """The gossip key and value of one chunk of this node's own offsets."""
        return encode_chunk(chunk, self._own[chunk])

    # -- the merged view (last writer wins) -----------------------------------------------

    def fold(self, group_id: str, topic: str, partition: int, offset: int, metadata: str,
             wall_ms: int) -> bool:
        """Fold one commit into the merged view; True if it is the latest for its partition."""
        table = self._merged.setdefault(group_id, {})
        if wall_ms > self._max_stamp.get(group_id, -1):
            self._max_stamp[group_id] = wall_ms
        old = table.get((topic, partition))
        if old is not None and (old[2], old[0]) >= (wall_ms, offset):
            return False
        table[(topic, partition)] = (offset, metadata, wall_ms)
        self._live[group_id] = self._live.get(group_id, 0) + (offset != DELETED) - (old is not None and old[0] != DELETED)
        if offset == DELETED:
            self._tombstoned.add(group_id)
        elif wall_ms > self._newest_ms.get(group_id, -1):
            self._newest_ms[group_id] = wall_ms
        return True

    def node_moved(self, node_id: str, generation: int, max_version: int) -> bool:
        """True if ``node_id``'s namespace changed since the last call (read its entries)."""
        mark = (generation, max_version)
        if self._seen_nodes.get(node_id) == mark:
            return False
        self._seen_nodes[node_id] = mark
        return True

    def entry_moved(self, node_id: str, key: str, version: Any) -> bool:
        """True if this namespace entry changed since the last call (fold it)."""
        seen = self._seen_keys.setdefault(node_id, {})
        if seen.get(key) == version:
            return False
        seen[key] = version
        return True

    def forget_keys(self, node_id: str, present: Iterable[str]) -> None:
        """Entries gone from a namespace that moved (collected): stop remembering them."""
        seen = self._seen_keys.get(node_id)
        if seen:
            present = set(present)
            for key in [k for k in seen if k not in present]:
                del seen[key]

    def forget_absent(self, present: Iterable[str]) -> None:
        """Nodes gone from the gossip view: read them in full if they come back."""
        present = set(present)
        for node_id in [n for n in self._seen_nodes if n not in present]:
            del self._seen_nodes[node_id]
            self._seen_keys.pop(node_id, None)

    def merge_entry(self, value: Any) -> set[str]:
        """Fold one ``off/`` entry; the groups whose merged offsets moved.
        MalformedOffsets if the value is not an offsets chunk."""
        try:
            group_id, topic, entries = value["g"], value["t"], value["o"]
            if not isinstance(group_id, str) or not isinstance(topic, str) or not isinstance(entries, dict):
                raise TypeError("bad types")
            changed = False
            for p, (offset, metadata, wall_ms) in entries.items():
                partition = int(p)
                if not (isinstance(offset, int) and isinstance(metadata, str) and isinstance(wall_ms, int)):
                    raise TypeError("bad offset entry")
                changed |= self.fold(group_id, topic, partition, offset, metadata, wall_ms)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedOffsets(str(exc)) from exc
        return {group_id} if changed else set()

    # -- this node's own offsets ----------------------------------------------------------

    def next_stamp(self, wall_ms: int, group_id: str) -> int:
        """The stamp of a commit of ``group_id`` made now: the wall clock, strictly
        increasing per group and above every stamp seen for the group (a hybrid clock: a
        deletion, or a commit after one, wins even where this clock is behind another
        broker's; a reload at start counts as seen). Per group, so one group's floor never
        pushes the others' stamps ahead. Never capped by this clock: a commit stamped below
        a row it follows (one of a coordinator whose clock was ahead) loses to it everywhere,
        replicas included, though it was acknowledged. Such a stamp is refused by gossip
        (too far ahead of the peers' clocks) until their clocks reach it, but the group's
        replicas hold it (``mesh.groups.replication`` never judges a stamp by a clock), and
        the coordinator and any broker that pulls answer with it; stamps run ahead of the
        clock by themselves only while a group commits more than once a millisecond."""
        floor = max(self._max_stamp.get(group_id, -1), self._issued.get(group_id, -1))
        stamp = max(wall_ms, floor + 1)
        self._issued[group_id] = stamp   # (two commits of a group in one turn: the second is later)
        return stamp

    def reload(self, group_id: str, topic: str, partition: int, offset: int, metadata: str,
               wall_ms: int) -> None:
        """An offset made durable here in an earlier life (then gossip ``own_chunks``)."""
        self._own.setdefault(chunk_of(group_id, topic, partition), {})[partition] = \
            [offset, metadata, wall_ms]
        if offset == DELETED:
            self._own_tombstoned.add(group_id)
        self.fold(group_id, topic, partition, offset, metadata, wall_ms)

    def committed_here(self, group_id: str, offsets: Iterable[OffsetEntry],
                       wall_ms: int) -> list[Chunk]:
        """A commit is durable here: record it; the chunks to gossip."""
        chunks = set()
        loaded = self._loaded.setdefault(group_id, {}) if group_id in self._mine else None
        if self._issued.get(group_id, -1) <= wall_ms:
            self._issued.pop(group_id, None)   # folded below: the group's max stamp covers it
        for topic, partition, offset, metadata in offsets:
            chunk = chunk_of(group_id, topic, partition)
            self._own.setdefault(chunk, {})[partition] = [offset, metadata, wall_ms]
            if offset == DELETED:
                self._own_tombstoned.add(group_id)
            self.fold(group_id, topic, partition, offset, metadata, wall_ms)
            if loaded is not None:
                loaded[(topic, partition)] = (wall_ms, offset)
            chunks.add(chunk)
        return sorted(chunks)

    def adopted(self, group_id: str, entries: Iterable[StampedEntry]) -> list[Chunk]:
        """Adopted offsets are durable here: record them; the chunks to gossip."""
        chunks = set()
        for topic, partition, offset, metadata, wall_ms in entries:
            chunk = chunk_of(group_id, topic, partition)
            self._own.setdefault(chunk, {})[partition] = [offset, metadata, wall_ms]
            if offset == DELETED:
                self._own_tombstoned.add(group_id)
            chunks.add(chunk)
        return sorted(chunks)

    # -- rows from peers (``mesh.groups.replication``) ------------------------------------

    def rows_of(self, group_ids: Iterable[str]) -> list[tuple]:
        """The merged view of these groups as rows ``(group, topic, partition, offset,
        metadata, stamp)``, tombstones included (the answer to a new coordinator's pull)."""
        return [(g, t, p, o, m, w) for g in sorted(set(group_ids))
                for (t, p), (o, m, w) in sorted(self._merged.get(g, {}).items())]

    def fold_rows(self, rows: Iterable[tuple]) -> set[str]:
        """Fold checked rows from a peer into the merged view; the groups that moved."""
        changed = set()
        for group_id, topic, partition, offset, metadata, stamp in rows:
            if self.fold(group_id, topic, partition, offset, metadata, stamp):
                changed.add(group_id)
        return changed

    def newer_than_own(self, rows: Iterable[tuple]) -> list[tuple]:
        """The rows newer (stamp, then offset) than this node's own entry of their partition:
        those a replica must persist (an older one must never overwrite a newer one)."""
        out = []
        for row in rows:
            group_id, topic, partition, offset, _, stamp = row
            own = self._own.get(chunk_of(group_id, topic, partition), {}).get(partition)
            if own is None or (own[2], own[0]) < (stamp, offset):
                out.append(row)
        return out

    def held_here(self, rows: Iterable[tuple]) -> tuple[list[Chunk], set[str]]:
        """Replicated rows are durable here: own entries (as adopted ones) and folded;
        (the chunks to gossip, the groups whose merged offsets moved)."""
        chunks, changed = set(), set()
        for row in self.newer_than_own(rows):
            group_id, topic, partition, offset, metadata, stamp = row
            chunk = chunk_of(group_id, topic, partition)
            self._own.setdefault(chunk, {})[partition] = [offset, metadata, stamp]
            if offset == DELETED:
                self._own_tombstoned.add(group_id)
            if self.fold(group_id, topic, partition, offset, metadata, stamp):
                changed.add(group_id)
            chunks.add(chunk)
        return sorted(chunks), changed

    # -- coordination ---------------------------------------------------------------------

    def on_cluster_change(self, coord_set: frozenset[str],
                          changed: set[str]) -> tuple[bool, list[Takeover | Moved]]:
        """After merging gossip (``changed``: groups whose merged offsets moved): whether the
        core must ``begin_takeover``, and what to do, in order."""
        actions: list[Takeover | Moved] = []
        takeover = False
        if coord_set != self.coord_set:
            before, self.coord_set = self.coord_set, coord_set
            takeover = takeover_due(before, coord_set, self.node_id)
            actions.extend(self._rehome())
        for group_id in sorted(changed & self._mine):
            newer = self.take_newer(group_id)
            if newer is not None:
                actions.append(newer)
        return takeover, actions

    def claim(self, group_id: str) -> Takeover | None:
        """Coordinate ``group_id`` here (a request for it came, or it hashes here now).
        None if it already was."""
        if group_id in self._mine:
            return None
        self._mine.add(group_id)
        self._loaded[group_id] = {}
        newer = self.take_newer(group_id)
        return Takeover(group_id, newer.load if newer else (), newer.adopt if newer else (),
                        claimed=True, newest_ms=self.newest_commit_ms(group_id))

    def take_newer(self, group_id: str) -> Takeover | None:
        """Merged offsets newer than what the core holds (to load), and those of them not
        yet durable here (to adopt); None if there are none."""
        loaded = self._loaded.setdefault(group_id, {})
        newer, adopt = [], []
        for (topic, partition), (offset, metadata, wall_ms) in sorted(self._merged.get(group_id, {}).items()):
            if loaded.get((topic, partition), _NO_STAMP) >= (wall_ms, offset):
                continue
            loaded[(topic, partition)] = (wall_ms, offset)
            newer.append((topic, partition, offset, metadata))
            own = self._own.get(chunk_of(group_id, topic, partition), {}).get(partition)
            if own is None or (own[2], own[0]) < (wall_ms, offset):
                adopt.append((topic, partition, offset, metadata, wall_ms))
        if not newer:
            return None
        return Takeover(group_id, tuple(newer), tuple(adopt), newest_ms=self.newest_commit_ms(group_id))

    def newest_commit_ms(self, group_id: str) -> int:
        """The stamp of the group's newest live commit; -1 if none (offsets retention counts
        from it on a coordinator that takes the group over)."""
        return self._newest_ms.get(group_id, -1) if self.knows(group_id) else -1

    def prune(self, has_group: Callable[[str], bool]) -> list[str]:
        """Forget groups that ended here (no committed offsets anywhere, nothing in the core:
        ``has_group``); the groups forgotten."""
        gone = [g for g in self._mine if not self.knows(g) and not has_group(g)]
        for group_id in gone:
            self._mine.discard(group_id)
            self._loaded.pop(group_id, None)
        return gone

    def collect(self, now_ms: int, horizon_ms: int,
                busy: Callable[[str, str, int], bool] = lambda g, t, p: False) -> dict[Chunk, list[tuple]]:
        """Garbage collection (see the module doc). The merged view drops tombstones older
        than ``horizon_ms`` now (nothing durable). Own entries are only planned: returns,
        per own chunk, ``(partition, offset, wall_ms)`` of each entry to drop (those a newer
        tombstone superseded, and own tombstones past the horizon), leaving out partitions
        that ``busy`` says have a write staged in this turn (a delete after it in the same
        transaction would undo it). Delete them from the store, and once that is synced
        call ``collected``; a turn rolled back changes nothing, the next collect plans again."""
        plan: dict[Chunk, list[tuple]] = {}
        cutoff = now_ms - horizon_ms
        tombstoned, own_tombstoned = self._tombstoned, set()
        for chunk in sorted(c for c in self._own if c[0] in tombstoned or c[0] in self._own_tombstoned):
            group_id, topic, _ = chunk
            merged = self._merged.get(group_id, {})
            for partition, (offset, _, wall_ms) in sorted(self._own[chunk].items()):
                latest = merged.get((topic, partition))
                newer = latest is not None and (latest[2], latest[0]) > (wall_ms, offset)
                if offset == DELETED:   # an own tombstone: gone once anything replaced it, or past the horizon
                    own_tombstoned.add(group_id)
                    gone = newer or wall_ms < cutoff
                else:                   # an own commit: gone once a newer tombstone replaced it
                    gone = newer and latest[0] == DELETED
                if gone and not busy(group_id, topic, partition):
                    plan.setdefault(chunk, []).append((partition, offset, wall_ms))
        self._own_tombstoned = own_tombstoned
        for group_id in sorted(tombstoned):
            table = self._merged.get(group_id, {})
            old = [tp for tp, v in table.items() if v[0] == DELETED and v[2] < cutoff]
            for tp in old:
                del table[tp]
            if len(table) == self._live.get(group_id, 0):
                tombstoned.discard(group_id)   # no tombstone left
            if not table:
                for index in (self._merged, self._live, self._max_stamp, self._newest_ms, self._issued):
                    index.pop(group_id, None)
                if group_id not in self._mine:
                    self._loaded.pop(group_id, None)
        return plan

    def collected(self, plan: dict[Chunk, list[tuple]]) -> list[Chunk]:
        """The store deletes of a ``collect`` plan are synced: forget those own entries (each
        only if it is still the one planned). The chunks that changed: gossip each again,
        or delete its key if it is gone (``has_chunk``)."""
        changed = []
        for chunk, drops in plan.items():
            entries = self._own.get(chunk)
            if entries is None:
                continue
            for partition, offset, wall_ms in drops:
                e = entries.get(partition)
                if e is not None and e[0] == offset and e[2] == wall_ms:
                    del entries[partition]
            if not entries:
                del self._own[chunk]
            changed.append(chunk)
        return sorted(changed)

    def has_chunk(self, chunk: Chunk) -> bool:
        return chunk in self._own

    def _rehome(self) -> list[Takeover | Moved]:
        actions: list[Takeover | Moved] = []
        for group_id in sorted({g for g in self._merged if self.knows(g)} | self._mine):   # (rare: the set changed)
            coordinator = coordinator_among(group_id, self.coord_set or ())
            if coordinator == self.node_id:
                claimed = self.claim(group_id)
                if claimed is not None:
                    actions.append(claimed)
            elif group_id in self._mine:
                self._mine.discard(group_id)
                self._loaded.pop(group_id, None)
                actions.append(Moved(group_id, coordinator))
        return actions
