"""The node's group host: the consumer-group cores in the shell.

Theory of operation
-------------------
Every broker runs one ``GroupCoordinator`` (``mesh.groups.coordinator``) and one
``OffsetBook`` (``mesh.groups.offsets``, whose docstring explains the merged offsets view,
takeover, adoption and rehoming). This host decides nothing a peer could disagree about:
it routes requests, carries out what the cores return, persists, replies and gossips.

Routing: a GROUP_* request for a group that ``coordinator_for`` hashes here over the
coordination set goes to the core; any other gets COORDINATOR_MOVED with the coordinator's
node id (and, for FETCH_OFFSETS and DESCRIBE, the committed offsets this broker knows from
gossip, so "where is group G on partition P" has an answer on every broker). Any broker
answers GROUP_FIND_COORDINATOR from the same view.

Offsets, durable on a majority of the group's replicas, then answered (the etcd-raft
"persist, then send" order; the rules in ``mesh.groups.replication``, carried out by
``mesh.node.groups.offset_replication``):
1. the core accepts a commit and returns ``PersistOffsets``;
2. each partition's ``[offset, metadata, commit stamp]`` is staged in the turn's
   transaction, db ``offsets`` (key: msgpack ``[group, topic, partition]``), and the
   answer is held: the turn's one sync makes it durable with everything else the turn
   staged (group commit; no sync of its own);
3. right after the drain that staged it (the node calls ``send_early``; the tick does too,
   for commits staged later in the turn), before that sync, the rows go to the group's
   other replicas (``GROUP_REPLICATE``), whose syncs overlap this one;
4. after the sync (``after_commit``, which the node registers with the data path) the
   offsets go into this node's gossip namespace (``mesh.cluster.keys.offsets_key``); a
   failed sync answers STORAGE_ERROR and puts the core's offsets back as they were,
   latest commit first;
5. the member gets its answer once a majority of the replicas (this one included, after
   its sync) hold it, or COORDINATOR_NOT_AVAILABLE after ``commit_timeout_ms``.
Rows replicated to this node are staged in its turn, answered after its sync, and kept
as its own offsets (store, book, gossip). A group that just became coordinated here pulls
what its replicas hold and answers "loading" (COORDINATOR_NOT_AVAILABLE) to its fetches
and writes meanwhile (at most a second).
Adopting offsets at a takeover (rare) still syncs on its own (``_persist``).

Failover: ``on_cluster_change`` (the node calls it whenever the gossip state moved) merges
the ``off/`` entries that moved, then carries out the book's answer: ``begin_takeover``
on the core, drop the groups that moved away, load (and adopt: store, sync, gossip) the
offsets of the groups taken over. The takeover grace is the node's maximum session timeout
(members cannot ask for more): ``GroupHostConfig.max_session_timeout_ms``.

Pacing: members are asked to heartbeat every ``heartbeat_interval_ms`` (500 ms), every
100 ms while their group is reconciling.

Time: one clock (``mesh.clock.Clock``), its wall scale for the core's ``now_ms`` and
for commit stamps (they are compared across nodes and outlive the process); the node
passes readings of the same scale to ``tick`` and ``on_cluster_change``.

Deletion (``mesh group delete``, and offsets retention): a GROUP_DELETE goes through the
same path as a commit, with the core's tombstones (offset ``DELETED``) for ``PersistOffsets``.
Every ``PRUNE_EVERY_MS`` the host deletes the groups the core says are past
``offsets_retention_ms`` (with a GroupDelete of its own, answered to nobody), then collects
garbage (``OffsetBook.collect``): entries of its own that a tombstone superseded, and
tombstones past ``tombstone_ms``, go from the store (in the turn's transaction) and from
its gossip namespace.

A restart reloads db ``offsets`` and re-publishes it (a new generation starts with an
empty namespace).
"""
from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any, Callable, Iterable, Mapping

import msgpack

from mesh.cluster.keys import OFFSETS_PREFIX, offsets_key
from mesh.cluster.liveness import is_member
from mesh.cluster.ownership import coordination_set, coordinator_among
from mesh.groups import (
    GROUP_REQUESTS, GroupCommit, GroupConfig, GroupCoordinator, GroupDelete, GroupDescribe,
    GroupDescribeResponse, GroupFetchOffsets, GroupFetchOffsetsResponse, GroupFindCoordinator,
    GroupFindCoordinatorResponse, GroupHeartbeat, GroupList, GroupListResponse,
    GroupResetOffsets, MemberRemoved, PersistOffsets, check_group_id, error_response,
)
from mesh.groups.messages import GROUP_PEER_MESSAGES
from mesh.groups.offsets import (
    MalformedOffsets, Moved, OffsetBook, Takeover, sees_majority, starts_alone,
)
from mesh.clock import Clock
from mesh.groups.replication import DEFAULT_REPLICAS
from mesh.node.groups.offset_replication import OffsetReplication
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.wire.errors import ErrorCode, MeshError
from storage.base import LogError

__all__ = ["GroupHost", "GroupHostConfig", "OFFSETS_DB"]

log = logging.getLogger("mesh.node.groups.group_host")

OFFSETS_DB = "offsets"
MAX_METADATA_CHARS = 256
TICK_EVERY_MS = 20
PRUNE_EVERY_MS = 10_000
EXPIRE_PER_PRUNE = 1_000             # groups deleted by offsets retention per prune (bounds the turn)
EXPIRE_OFFSETS_PER_PRUNE = 100_000   # ... and their offsets (tombstones written) per prune
MAX_UNGOSSIPED = 100_000            # own chunks whose gossip is tried again (stamps ahead of the clock)
MAX_LEFT_WITH_MEMBERS = 10_000       # groups remembered after moving away with members (oldest go first)

Reply = Callable[[bytes, int, Any], None]


@dataclasses.dataclass(frozen=True, slots=True)
class GroupHostConfig:
    """The node's consumer-group settings (``NodeConfig.group_*``)."""
    max_session_timeout_ms: int = 10_000   # members cannot ask for more; also the takeover grace
    heartbeat_interval_ms: int = 500
    offsets_retention_ms: int = 7 * 86_400_000   # empty groups are deleted after this; 0: never
    tombstone_ms: int = 86_400_000               # a deleted group's tombstones are kept this long
    offset_replicas: int = DEFAULT_REPLICAS      # a commit is acknowledged once a majority of these hold it
    commit_timeout_ms: int = 3_000               # ... or answered COORDINATOR_NOT_AVAILABLE after this


def _store_key(group: str, topic: str, partition: int) -> bytes:
    return msgpack.packb([group, topic, partition], use_bin_type=True)


def _store_value(offset: int, metadata: str, wall_ms: int) -> bytes:
    return msgpack.packb([offset, metadata, wall_ms], use_bin_type=True)


class GroupHost:
    """Drives the group cores for one node (see the module docstring).

    ``store``: the node's store (db ``offsets``); ``commit_turn``: syncs the turn's
    transaction, False (rolled back) on failure; ``gossip``: the gossip core (``members``,
    ``node_items``, ``entry_version``, ``set_local``); ``reply(ident, rid, msg)``;
    ``address_of(node_id)``; ``topic_partitions()``: topic -> partition count; ``seeded``:
    the node was started with seeds (else it may start alone, without a takeover grace);
    ``send_to_node(node_id, msg)``: a one-way peer message (offsets replication); ``doomed()``:
    the turn will be rolled back (nothing is sent before its sync then).
    ``clock_trusted()`` (the node sets it; None: always): groups expire only while it is True.
    """

    clock_trusted: Callable[[], bool] | None = None

    def __init__(self, node_id: str, *, store, commit_turn: Callable[[], bool], gossip,
                 reply: Reply, address_of: Callable[[str], str | None],
                 topic_partitions: Callable[[], Mapping[str, int]], clock: Clock,
                 rng: random.Random, seeded: bool,
                 config: GroupHostConfig = GroupHostConfig(),
                 send_to_node: Callable[[str, Any], None] = lambda node_id, msg: None,
                 doomed: Callable[[], bool] = lambda: False):
        self.node_id = node_id
        self._store = store
        self._commit_turn = commit_turn
        self._gossip = gossip
        self._reply = reply
        self._address_of = address_of
        self._topic_partitions = topic_partitions
        self._clock = clock
        self.config = GroupConfig(heartbeat_interval_ms=config.heartbeat_interval_ms,
                                  min_session_timeout_ms=min(100, config.max_session_timeout_ms),
                                  max_session_timeout_ms=config.max_session_timeout_ms,
                                  max_metadata_chars=MAX_METADATA_CHARS,
                                  offsets_retention_ms=config.offsets_retention_ms)
        self._tombstone_ms = config.tombstone_ms
        start_ms = clock.wall_ms()
        alone = starts_alone(seeded, (m.node_id for m in gossip.members(start_ms)), node_id)
        self.core = GroupCoordinator(self.config, rng,
                                     now_ms=start_ms - (self.config.grace_ms if alone else 0))
        self.book = OffsetBook(node_id)
        self._topics: dict[str, int] = {}
        self._next_tick_ms = 0
        self._next_prune_ms = 0
        self._held: list[tuple] = []   # (ident|None, rid, msg|None, resp, [(PersistOffsets, wall_ms)], previous)
        self._early: list[int] = []    # replication keys of ``_held[:len(_early)]``, sent before the sync
        self._collecting: dict | None = None   # a ``collect`` plan whose store deletes this turn syncs
        # offsets to commit again (``_commit_again``) whose turn failed: tried again next tick
        self._again_pending: dict[str, list] = {}
        self._next_left_sweep_ms = 0
        # groups dropped here while they had members: (offsets, when dropped); a tombstone
        # made before then, that arrives later, was made without knowing those members
        self._left_with_members: dict[str, tuple[dict, int]] = {}
        self._doomed = doomed
        self._rlog = RateLimitedLog(log, now_ms=clock.now_ms)
        self._ungossiped: set = set()   # own chunks gossip refused (stamps ahead of this clock): tried again
        self.replication = OffsetReplication(self, send_to_node, config.offset_replicas,
                                             config.commit_timeout_ms, MAX_METADATA_CHARS)
        self._load_store()

    # -- node hooks ---------------------------------------------------------------------
    def handles(self, msg: Any) -> bool:
        return isinstance(msg, GROUP_REQUESTS)

    def handles_peer(self, msg: Any) -> bool:
        return isinstance(msg, GROUP_PEER_MESSAGES)

    def handle_peer(self, node_id: str, msg: Any) -> None:
        """A peer message of the offsets replication from broker ``node_id`` (authenticated
        by the dispatcher); bad input raises ``MeshError`` (dropped and logged there)."""
        self.replication.handle(node_id, msg)

    def handle(self, ident: bytes, rid: int, msg: Any) -> None:
        reply = self._reply
        if isinstance(msg, GroupFindCoordinator):
            reply(ident, rid, self._find_coordinator(msg))
            return
        if isinstance(msg, GroupList):
            reply(ident, rid, self._list())
            return
        try:
            group_id = check_group_id(msg.group_id)
        except MeshError as exc:
            reply(ident, rid, error_response(msg, exc.code, exc.message))
            return
        now_ms = self._clock.wall_ms()
        coordinator = self._coordinator(group_id, now_ms)
        if coordinator != self.node_id:
            reply(ident, rid, self._moved(msg, coordinator))
            return
        writes = isinstance(msg, (GroupCommit, GroupResetOffsets, GroupDelete))
        if self.book.knows(group_id) or writes or isinstance(msg, (GroupHeartbeat, GroupFetchOffsets)):
            self._carry_out(self.book.claim(group_id))   # (a query about an unknown group creates nothing)
            self.replication.flush()
        if (writes or isinstance(msg, GroupFetchOffsets)) and self.replication.loading(group_id, now_ms):
            reply(ident, rid, error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                             "loading the group's committed offsets from its replicas; retry"))
            return
        if isinstance(msg, (GroupDelete, GroupResetOffsets)) and not self._sees_majority(now_ms):
            reply(ident, rid, error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                             "this broker sees fewer than half of the brokers alive: it may "
                                             "not know the group's members; a group is deleted, or its offsets "
                                             "reset, only with a majority in view"))
            return
        self._apply(ident, rid, msg, now_ms, writes)

    def _apply(self, ident: bytes | None, rid: int, msg: Any, now_ms: int, writes: bool) -> None:
        """The core answers ``msg``; offsets it persists (tombstones too) are staged in the
        turn's transaction and the answer is held until the turn's sync (``after_commit``).
        ``ident`` None: the host's own request (an expired group's deletion), answered to
        nobody."""
        previous = self.core.committed(msg.group_id) if writes else None
        resp, effects = self.core.handle(msg, now_ms)
        persisted = []
        for effect in effects:
            if isinstance(effect, PersistOffsets):
                wall_ms = self.book.next_stamp(self._clock.wall_ms(), effect.group_id)
                if not self._stage(effect.group_id, effect.offsets, wall_ms):
                    self._restore(effect.group_id, effect.offsets, previous or {})
                    if ident is not None:
                        self._reply(ident, rid, error_response(msg, ErrorCode.STORAGE_ERROR,
                                                               "offsets could not be made durable; retry"))
                    return
                persisted.append((effect, wall_ms))
        if isinstance(resp, GroupDescribeResponse):
            resp = dataclasses.replace(resp, coordinator=self.node_id)
        if persisted:   # answered once the turn's sync made them durable (after_commit)
            self._held.append((ident, rid, msg, resp, persisted, previous))
        elif ident is not None:
            self._reply(ident, rid, resp)

    def after_commit(self, ok: bool) -> None:
        """The turn's transaction was synced (``ok``) or rolled back: gossip the offsets
        commits it held and send them to the group's replicas, answered once a majority
        holds them (``OffsetReplication``); or put the core's offsets back and refuse them."""
        held, self._held = self._held, []
        early, self._early = self._early, []
        plan, self._collecting = self._collecting, None
        self.replication.after_commit(ok)   # rows replicated to this node: durable now, answered
        if not ok:
            self.replication.abandon(early)
            for _, _, msg, _, persisted, previous in reversed(held):   # latest first: the oldest value wins
                if msg is None:   # offsets committed again (``_commit_again``): try again next tick
                    for effect, _ in persisted:
                        self._again_pending.setdefault(effect.group_id, []).extend(effect.offsets)
                    continue
                for effect, _ in persisted:
                    self._restore(effect.group_id, effect.offsets, previous or {})
            for ident, rid, msg, _, _, _ in held:
                if ident is not None:
                    self._reply(ident, rid, error_response(msg, ErrorCode.STORAGE_ERROR,
                                                           "offsets could not be made durable; retry"))
            return
        for _, _, _, _, persisted, _ in held:
            for effect, wall_ms in persisted:   # durable here: tell the cluster
                self._gossip_chunks(effect.group_id,
                                    self.book.committed_here(effect.group_id, effect.offsets, wall_ms))
        self.replication.durable(early)   # answered once a majority of each group's replicas holds it
        late = self._replicated(held[len(early):])
        if late:   # (staged after this turn's tick: sent now)
            self.replication.begin(late, self._clock.wall_ms())
        if plan:   # the collected rows are gone from the store: now from the namespace
            for chunk in self.book.collected(plan):
                if self.book.has_chunk(chunk):
                    self._gossip_chunks(chunk[0], [chunk])
                else:
                    self._gossip.delete_local(offsets_key(*chunk))

    def send_early(self, now_ms: int) -> None:
        """Before the turn's sync: send the rows of the commits it staged to their replicas,
        so that the replicas' syncs run alongside this one (``mesh.groups.replication``)."""
        fresh = self._replicated(self._held[len(self._early):])
        if fresh and not self._doomed():   # (a doomed turn sends nothing: sent after the next good sync)
            self._early.extend(self.replication.begin(fresh, now_ms, durable=False))

    @staticmethod
    def _replicated(held: list[tuple]) -> list[tuple]:
        """Held commits as ``OffsetReplication.begin`` takes them."""
        out = []
        for ident, rid, msg, resp, persisted, _ in held:
            rows = [(effect.group_id, t, p, o, m, wall_ms)
                    for effect, wall_ms in persisted for t, p, o, m in effect.offsets]
            out.append((ident, rid, msg, resp, persisted[0][0].group_id, rows))
        return out

    def tick(self, now_ms: int) -> None:
        self.send_early(now_ms)
        if self._next_tick_ms - TICK_EVERY_MS <= now_ms < self._next_tick_ms:
            return   # (a clock that jumped back does not stop the ticks)
        self._next_tick_ms = now_ms + TICK_EVERY_MS
        self.replication.tick(now_ms)
        if self._again_pending:
            pending, self._again_pending = self._again_pending, {}
            for group_id, offsets in sorted(pending.items()):
                still = self.book.deleted(group_id)   # (not if a newer commit came meanwhile)
                offsets = [o for o in offsets if (o[0], o[1]) in still]
                if offsets:
                    self._commit_again(group_id, offsets)
        for effect in self.core.tick(now_ms):
            if isinstance(effect, MemberRemoved):
                log.info("group %s: member %s removed (%s)", effect.group_id, effect.member_id, effect.reason)
        if not self._next_prune_ms - PRUNE_EVERY_MS <= now_ms < self._next_prune_ms:
            self._next_prune_ms = now_ms + PRUNE_EVERY_MS
            # (a broker cut off from the others may not know the members; one whose clock is
            # off from its peers' would expire groups that are live: DESIGN.md section 11)
            if self._sees_majority(now_ms) and (self.clock_trusted is None or self.clock_trusted()):
                budget = EXPIRE_OFFSETS_PER_PRUNE
                for group_id in self.core.expired(now_ms, limit=EXPIRE_PER_PRUNE):
                    if budget <= 0:
                        break
                    budget -= max(1, len(self.core.committed(group_id)))
                    log.info("group %s: deleted, no members and no commit for %d s (offsets retention)",
                             group_id, self.core.config.offsets_retention_ms // 1000)
                    self._apply(None, 0, GroupDelete(group_id), now_ms, writes=True)
            self._collect(now_ms)
            if self._ungossiped:   # refused by gossip so far: an idle group would never be gossiped again
                retry, self._ungossiped = sorted(self._ungossiped), set()
                for chunk in retry:
                    if self.book.has_chunk(chunk):
                        self._gossip_chunks(chunk[0], [chunk])
            self.book.prune(self.core.has_group)   # forget groups that ended

    def on_cluster_change(self, now_ms: int) -> None:
        self._sync_topics()
        changed = self._merge_gossip(now_ms)
        begin_takeover, actions = self.book.on_cluster_change(
            coordination_set(self._gossip.members(now_ms)), changed)
        if begin_takeover:
            self.core.begin_takeover(now_ms)
        for action in actions:
            self._carry_out(action)
        self.replication.flush()
        self._after_leaving(changed, now_ms)

    def _after_leaving(self, changed: set[str], now_ms: int) -> None:
        """Tombstones that reached here after a group with members here moved away (the
        split healed before the other side's deletion arrived): commit those offsets again if
        the tombstone is older than the move (made without knowing the members here)."""
        for group_id in sorted(changed & self._left_with_members.keys()):
            had, left_ms = self._left_with_members[group_id]
            if self.core.has_members(group_id):
                continue   # back here, with members: ``load_offsets`` decides
            deleted = self.book.deleted(group_id)
            again = [(t, p, *had[(t, p)]) for (t, p), stamp in sorted(deleted.items())
                     if (t, p) in had and stamp <= left_ms]
            if again:
                self._commit_again(group_id, again)
        if now_ms >= self._next_left_sweep_ms:   # forgotten after the tombstone horizon
            self._next_left_sweep_ms = now_ms + PRUNE_EVERY_MS
            for group_id in [g for g, (_, t) in self._left_with_members.items() if now_ms - t > self._tombstone_ms]:
                del self._left_with_members[group_id]

    # -- views --------------------------------------------------------------------------
    def committed(self, group_id: str) -> dict[tuple[str, int], tuple[int, str, int]]:
        """The merged view of one group's committed offsets: (topic, partition) -> (offset,
        metadata, commit wall ms)."""
        return self.book.committed(group_id)

    # -- routing ------------------------------------------------------------------------
    def coord_nodes(self, now_ms: int) -> frozenset[str]:
        """The coordination set: the book's, or gossip's before the first cluster change."""
        nodes = self.book.coord_set
        return nodes if nodes is not None else coordination_set(self._gossip.members(now_ms))

    def _coordinator(self, group_id: str, now_ms: int) -> str | None:
        return coordinator_among(group_id, self.coord_nodes(now_ms))

    def _find_coordinator(self, msg: GroupFindCoordinator) -> GroupFindCoordinatorResponse:
        try:
            group_id = check_group_id(msg.group_id)
        except MeshError as exc:
            return error_response(msg, exc.code, exc.message)
        node_id = self._coordinator(group_id, self._clock.wall_ms())
        address = self._address_of(node_id) if node_id else None
        if not node_id or not address:
            return error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no live broker known")
        return GroupFindCoordinatorResponse(error=0, node_id=node_id, address=address)

    def _moved(self, msg: Any, coordinator: str | None):
        if coordinator is None:
            return error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no live broker known")
        text = f"group {msg.group_id!r} is coordinated by {coordinator}"
        if isinstance(msg, (GroupFetchOffsets, GroupDescribe)):
            offsets = self.book.offsets_for(msg.group_id, getattr(msg, "partitions", None))
            if isinstance(msg, GroupDescribe):
                return GroupDescribeResponse(error=int(ErrorCode.COORDINATOR_MOVED), message=text,
                                             group_id=msg.group_id, state="unknown",
                                             offsets=offsets, coordinator=coordinator)
            return GroupFetchOffsetsResponse(error=int(ErrorCode.COORDINATOR_MOVED), message=text,
                                             offsets=offsets, coordinator=coordinator)
        return error_response(msg, ErrorCode.COORDINATOR_MOVED, text, coordinator=coordinator)

    def _list(self) -> GroupListResponse:
        groups = [dict(g, coordinator=self.node_id) for g in self.core.list_groups().groups]
        listed = {g["group_id"] for g in groups}
        now_ms = self._clock.wall_ms()
        for group_id in self.book.groups():
            if group_id not in listed:
                groups.append({"group_id": group_id, "state": "unknown", "members": -1,
                               "group_epoch": -1, "coordinator": self._coordinator(group_id, now_ms)})
        return GroupListResponse(error=0, groups=groups)

    # -- carrying out -------------------------------------------------------------------
    def _stage(self, group_id: str, entries: Iterable[tuple], wall_ms: int | None) -> bool:
        """Put offsets in the turn's transaction; ``wall_ms`` None: each entry carries its
        own. False if the store refused (the turn is then rolled back)."""
        try:
            for topic, partition, offset, metadata, *stamp in entries:
                self._store.put(OFFSETS_DB, _store_key(group_id, topic, partition),
                                _store_value(offset, metadata, stamp[0] if wall_ms is None else wall_ms))
        except LogError as exc:
            log.error("group %s: could not stage offsets: %s", group_id, exc)
            self._commit_turn()   # fails and rolls the doomed transaction back
            return False
        return True

    def _persist(self, group_id: str, entries: Iterable[tuple], wall_ms: int | None) -> bool:
        """Put offsets in the store and sync at once (adoption at a takeover)."""
        return self._stage(group_id, entries, wall_ms) and self._commit_turn()

    def _restore(self, group_id: str, offsets, previous: dict) -> None:
        tps = [(t, p) for t, p, _, _ in offsets]
        self.core.discard_offsets(group_id, tps)
        self.core.load_offsets(group_id, [(t, p, *previous[(t, p)]) for t, p in tps if (t, p) in previous],
                               replace=True)

    def _carry_out(self, action: Takeover | Moved | None) -> None:
        if isinstance(action, Moved):
            log.info("group %s moved to %s", action.group_id, action.coordinator)
            had = self.core.committed(action.group_id) if self.core.has_members(action.group_id) else {}
            reassert = self.core.drop_group(action.group_id, self.book.deleted(action.group_id))
            if reassert:   # deleted where its members were not known: they come from here
                self._commit_again(action.group_id, reassert)
            if had:        # the other side's tombstones may come later than the move (gossip deltas)
                self._left_with_members[action.group_id] = (had, self._clock.wall_ms())
                while len(self._left_with_members) > MAX_LEFT_WITH_MEMBERS:
                    del self._left_with_members[next(iter(self._left_with_members))]
        elif isinstance(action, Takeover):
            if action.claimed:   # what the group's replicas hold may be newer than this view
                self.replication.want_pull(action.group_id, self._clock.wall_ms())
            if action.claimed and self.book.knows(action.group_id):
                log.info("coordinating group %s (taking over its committed offsets)", action.group_id)
            reassert, adopt = [], action.adopt
            if action.load:
                self.replication.want_copy(action.group_id)
                reassert = self.core.load_offsets(action.group_id, action.load, replace=True,
                                                  newest_ms=action.newest_ms)
            if reassert:   # their tombstones are not adopted: the offsets are committed again after
                again = {(t, p) for t, p, *_ in reassert}
                adopt = tuple(e for e in adopt if (e[0], e[1]) not in again)
            if adopt and self._persist(action.group_id, adopt, None):
                self._gossip_chunks(action.group_id, self.book.adopted(action.group_id, adopt))
            if reassert:
                self._commit_again(action.group_id, reassert)

    def known_brokers(self, now_ms: int) -> int:
        """Brokers gossip knows, but those that left (a commit's majority counts them)."""
        return sum(1 for m in self._gossip.members(now_ms) if is_member(m.status))

    def _sees_majority(self, now_ms: int) -> bool:
        return sees_majority(self._gossip.members(now_ms))

    def _collect(self, now_ms: int) -> None:
        """Garbage of deleted groups (``OffsetBook.collect``): out of the store, staged in
        the turn's transaction; out of the book and this node's gossip namespace once that
        is synced (``after_commit``). Partitions with a write held in this turn are left
        for the next time."""
        busy = {(effect.group_id, t, p) for _, _, _, _, persisted, _ in self._held
                for effect, _ in persisted for t, p, *_ in effect.offsets} | self.replication.staged_partitions()
        plan = self.book.collect(now_ms, self._tombstone_ms, lambda g, t, p: (g, t, p) in busy)
        if not plan:
            return
        try:
            for (group_id, topic, _), drops in plan.items():
                for partition, _, _ in drops:
                    self._store.delete(OFFSETS_DB, _store_key(group_id, topic, partition))
        except LogError as exc:
            log.error("could not delete collected offsets: %s", exc)
            self._commit_turn()   # fails and rolls the doomed transaction back; collected again later
            return
        self._collecting = plan

    def _commit_again(self, group_id: str, offsets: list) -> None:
        """Offsets of a group with members here, which a broker that did not know them
        deleted: committed again above the deletion's stamp (answered to nobody)."""
        log.warning("group %s was deleted through a broker that did not know its members here: "
                    "committing its %d offsets again", group_id, len(offsets))
        wall_ms = self.book.next_stamp(self._clock.wall_ms(), group_id)
        if self._stage(group_id, offsets, wall_ms):
            self._held.append((None, 0, None, None, [(PersistOffsets(group_id, tuple(offsets)), wall_ms)], None))

    def _gossip_chunks(self, group_id: str, chunks: Iterable) -> None:
        for chunk in chunks:
            key, value = self.book.chunk_entry(chunk)
            try:
                self._gossip.set_local(key, value)
                self._ungossiped.discard(chunk)
            except ValueError as exc:   # a stamp far ahead of this clock (one broker's was ahead); never fatal
                if len(self._ungossiped) < MAX_UNGOSSIPED:
                    self._ungossiped.add(chunk)   # tried again every PRUNE_EVERY_MS, until this clock reaches it
                self._rlog.warning(("not gossiped", group_id), "group %s: offsets of %s not gossiped (its "
                                   "replicas hold them; once a minute per group): %s", group_id, chunk[1], exc)

    def _load_store(self) -> None:
        """Offsets synced here in an earlier life: back into the book and gossip."""
        for key, raw in self._store.items(OFFSETS_DB):
            try:
                group_id, topic, partition = msgpack.unpackb(key, raw=False)
                offset, metadata, wall_ms = msgpack.unpackb(raw, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.warning("skipping unreadable stored offset %r: %s", key[:80], exc)
                continue
            self.book.reload(group_id, topic, partition, offset, metadata, wall_ms)
        chunks = self.book.own_chunks()
        for chunk in chunks:
            self._gossip_chunks(chunk[0], [chunk])
        if chunks:
            log.info("reloaded committed offsets of %d group/topic chunks", len(chunks))

    def _merge_gossip(self, now_ms: int) -> set[str]:
        """Fold namespace entries that moved since the last call; the groups that changed."""
        gossip, book = self._gossip, self.book
        changed: set[str] = set()
        present = []
        for member in gossip.members(now_ms):
            node_id = member.node_id
            present.append(node_id)
            if not book.node_moved(node_id, member.generation, member.max_version):
                continue
            items = gossip.node_items(node_id, OFFSETS_PREFIX)
            book.forget_keys(node_id, items)
            for key, value in items.items():
                if not book.entry_moved(node_id, key, gossip.entry_version(node_id, key)):
                    continue
                try:
                    changed |= book.merge_entry(value)
                except MalformedOffsets as exc:
                    log.warning("ignoring malformed offsets entry %s of %s: %s", key[:80], node_id, exc)
        book.forget_absent(present)
        return changed

    def _sync_topics(self) -> None:
        topics = dict(self._topic_partitions())
        for name in sorted(set(self._topics) | set(topics)):
            n = topics.get(name, 0)
            if self._topics.get(name, 0) != n:
                try:
                    self.core.set_topic_partitions(name, n)
                except MeshError as exc:
                    log.warning("consumer groups cannot use topic %s: %s", name[:80], exc)
                    continue
        self._topics = topics
