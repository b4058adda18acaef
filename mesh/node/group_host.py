"""The node's consumer-group service: the coordinator core (``mesh.groups.coordinator``) in the shell.

Theory of operation
-------------------
Every broker runs one ``GroupCoordinator`` and answers GROUP_* requests for the groups that
``mesh.groups.rendezvous.coordinator_for`` hashes to it over the *coordination set*: the brokers
its gossip view does not hold DEAD or LEFT (ALIVE and SUSPECT both count, so a broker that
misses a few heartbeats does not bounce its groups around; a killed broker loses its groups
once it is convicted, ~4 s). Any broker answers GROUP_FIND_COORDINATOR from the same view;
a request for a group coordinated elsewhere gets COORDINATOR_MOVED with the coordinator's
node id (and, for FETCH_OFFSETS and DESCRIBE, the committed offsets this broker knows from
gossip, so "where is group G on partition P" has an answer on every broker).

Offsets, durable then gossiped (the etcd-raft "persist, then send" order):
1. the core accepts a commit and returns ``PersistOffsets``;
2. each partition's ``[offset, metadata, commit wall ms]`` is put in LMDB db ``offsets``
   (key: msgpack ``[group, topic, partition]``) and ``DataPath.commit_turn`` syncs it;
3. only then the member gets its answer (a failed sync answers STORAGE_ERROR and puts the
   core's offsets back as they were);
4. then the offsets go into this node's gossip namespace, chunked: key
   ``off/<group>/<topic>/<partition // 32>`` holds ``{"g": group, "t": topic, "o":
   {"<partition>": [offset, metadata, wall_ms]}}`` (group and topic ride in the value, so
   names containing "/" are unambiguous; commit metadata is limited to 256 characters, so
   32 partitions stay far below the 60 KB gossip entry limit).
A commit is on one disk (the coordinator's) when it is acknowledged, and on every broker a
gossip round or two later. If the coordinator dies in between, its successor resumes from
the commit before (the group re-reads a little: at-least-once); the newer one comes back
with the old coordinator, and then wins by its stamp.

The merged view: every broker folds all namespaces' ``off/`` entries into one table,
``(group, topic, partition) -> (offset, metadata, wall_ms)``, where the latest commit wins
(greater ``wall_ms``, then greater offset). Commit stamps are strictly increasing per node,
so a reset to an *earlier* offset is still the latest commit. The fold is monotone, so it
is incremental (only namespace entries whose version moved are read) and needs no deletes.

Failover: when the coordination set changes, groups that now hash here are taken over
(``load_offsets`` from the merged view), groups that hash elsewhere are dropped. When a
broker *left* the set, ``begin_takeover`` holds back partitions of groups that get their
first member within the takeover grace, because members of the old coordinator may still
hold them until their sessions end; likewise when a node that was alone meets other nodes
(it may be the newcomer), and at start, unless the node starts alone (no seeds, no known
peers). The grace is the node's maximum session timeout (members cannot ask for more):
``NodeConfig.group_max_session_timeout_ms`` if the node has it, else
``$MESH_GROUP_MAX_SESSION_MS``, else 10 s. A taken-over group's offsets are also
*adopted*: written to this node's LMDB and namespace with their original stamps, so they
survive the old node's namespace being garbage-collected from gossip. If a later commit
for one of our groups arrives through gossip (the old coordinator's last commits, late),
it replaces ours when its stamp is newer.

Pacing: members are asked to heartbeat every 500 ms (``group_heartbeat_interval_ms`` /
``$MESH_GROUP_HEARTBEAT_MS``), every 100 ms while their group is reconciling.

A restart reloads LMDB db ``offsets`` and re-publishes it (a new generation starts with an
empty namespace).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import sys
import time
from typing import Any

import msgpack

from mesh.wire.errors import ErrorCode, MeshError
from mesh.groups.coordinator import (
    GroupCommit, GroupConfig, GroupCoordinator, GroupDescribe, GroupDescribeResponse,
    GroupFetchOffsets, GroupFetchOffsetsResponse, GroupFindCoordinator,
    GroupFindCoordinatorResponse, GroupHeartbeat, GroupList, GroupListResponse,
    GroupResetOffsets, MemberRemoved, PersistOffsets, _check_group_id, error_response,
)
from mesh.groups.rendezvous import coordinator_for
from storage.base import LogError

__all__ = ["GroupService", "GOSSIP_PREFIX", "OFFSETS_DB", "CHUNK_PARTITIONS"]

log = logging.getLogger("mesh.groups.coordinator")

OFFSETS_DB = "offsets"
GOSSIP_PREFIX = "off/"
CHUNK_PARTITIONS = 32
MAX_METADATA_CHARS = 256
DEFAULT_MAX_SESSION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 500
TICK_EVERY_MS = 20
PRUNE_EVERY_MS = 10_000
_COORDINATING = ("alive", "suspect")

_REQUESTS = (GroupHeartbeat, GroupCommit, GroupFetchOffsets, GroupResetOffsets, GroupDescribe,
             GroupList, GroupFindCoordinator)

Stamp = tuple[int, int]   # (wall_ms, offset): the greater is the later commit


def _setting(node, attr: str, env: str, default: int) -> int:
    """A node setting: ``NodeConfig.<attr>`` if the node has it, else $<env>, else default."""
    value = getattr(getattr(node, "cfg", None), attr, None)
    if value is None:
        value = os.environ.get(env)
    return int(value) if value not in (None, "") else default


def _store_key(group: str, topic: str, partition: int) -> bytes:
    return msgpack.packb([group, topic, partition], use_bin_type=True)


def _gossip_key(group: str, topic: str, chunk: int) -> str:
    return f"{GOSSIP_PREFIX}{group}/{topic}/{chunk}"


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _clock_of(node):
    """The node's own clock (``mesh.node.loop._now_ms``): the core must see one time scale, and
    the node passes the same clock's readings to ``tick`` and ``on_cluster_change``."""
    fn = getattr(sys.modules.get(type(node).__module__), "_now_ms", None)
    return fn if callable(fn) else (lambda: _now_ms())


class GroupService:
    """Drives the group coordinator core for one node (see the module docstring)."""

    def __init__(self, node):
        self.node = node
        self.node_id = node.node_id
        self._clock = _clock_of(node)
        max_session_ms = _setting(node, "group_max_session_timeout_ms", "MESH_GROUP_MAX_SESSION_MS",
                                  DEFAULT_MAX_SESSION_TIMEOUT_MS)
        heartbeat_ms = _setting(node, "group_heartbeat_interval_ms", "MESH_GROUP_HEARTBEAT_MS",
                                DEFAULT_HEARTBEAT_INTERVAL_MS)
        self.config = GroupConfig(heartbeat_interval_ms=heartbeat_ms,
                                  min_session_timeout_ms=min(100, max_session_ms),
                                  max_session_timeout_ms=max_session_ms,
                                  max_metadata_chars=MAX_METADATA_CHARS)
        start_ms = self._clock()
        # a node with no seeds that knows no other node starts alone: no coordinator can
        # hold members of its groups, so no takeover grace (until other nodes appear)
        alone = not getattr(node.cfg, "seeds", None) and \
            all(m.node_id == self.node_id for m in node.gossip.members(start_ms))
        self.core = GroupCoordinator(self.config, random.Random(int.from_bytes(os.urandom(8), "big")),
                                     now_ms=start_ms - (self.config.grace_ms if alone else 0))
        # what this node committed or adopted: (group, topic, chunk) -> {partition: [off, meta, wall]}
        self._own: dict[tuple[str, str, int], dict[int, list]] = {}
        # the merged view of every namespace: group -> {(topic, partition): (off, meta, wall)}
        self._merged: dict[str, dict[tuple[str, int], tuple[int, str, int]]] = {}
        self._seen_nodes: dict[str, tuple[int, int]] = {}        # node -> (generation, max version)
        self._seen_keys: dict[tuple[str, str], tuple] = {}         # (node, key) -> entry version
        # stamps of the offsets the core holds, for the groups coordinated here
        self._loaded: dict[str, dict[tuple[str, int], Stamp]] = {}
        self._mine: set[str] = set()
        self._coord_set: frozenset[str] | None = None
        self._topics: dict[str, int] = {}
        self._next_tick_ms = 0
        self._next_prune_ms = 0
        self._last_wall_ms = 0
        self._load_store()

    # -- node hooks ---------------------------------------------------------------------
    def handles(self, msg: Any) -> bool:
        return isinstance(msg, _REQUESTS)

    def handle(self, ident: bytes, rid: int, msg: Any) -> None:
        reply = self.node._reply
        if isinstance(msg, GroupFindCoordinator):
            reply(ident, rid, self._find_coordinator(msg))
            return
        if isinstance(msg, GroupList):
            reply(ident, rid, self._list())
            return
        try:
            group_id = _check_group_id(msg.group_id)
        except MeshError as exc:
            reply(ident, rid, error_response(msg, exc.code, exc.message))
            return
        now_ms = self._clock()
        coordinator = self._coordinator(group_id, now_ms)
        if coordinator != self.node_id:
            reply(ident, rid, self._moved(msg, coordinator))
            return
        if group_id in self._merged or isinstance(msg, (GroupHeartbeat, GroupCommit, GroupResetOffsets)):
            self._ensure_mine(group_id)   # (a query about an unknown group creates nothing)
        previous = self.core.committed(group_id) if isinstance(msg, (GroupCommit, GroupResetOffsets)) else None
        resp, effects = self.core.handle(msg, now_ms)
        persisted = []
        for effect in effects:
            if isinstance(effect, PersistOffsets):
                wall_ms = self._wall_ms()
                if not self._persist(effect.group_id, effect.offsets, wall_ms):
                    self._restore(effect.group_id, effect.offsets, previous or {})
                    reply(ident, rid, error_response(msg, ErrorCode.STORAGE_ERROR,
                                                     "offsets could not be made durable; retry"))
                    return
                persisted.append((effect, wall_ms))
        if isinstance(resp, GroupDescribeResponse):
            resp = dataclasses.replace(resp, coordinator=self.node_id)
        reply(ident, rid, resp)
        for effect, wall_ms in persisted:   # durable and answered: now tell the cluster
            self._publish(effect.group_id, effect.offsets, wall_ms)

    def tick(self, now_ms: int) -> None:
        if self._next_tick_ms - TICK_EVERY_MS <= now_ms < self._next_tick_ms:
            return   # (a clock that jumped back does not stop the ticks)
        self._next_tick_ms = now_ms + TICK_EVERY_MS
        for effect in self.core.tick(now_ms):
            if isinstance(effect, MemberRemoved):
                log.info("group %s: member %s removed (%s)", effect.group_id, effect.member_id, effect.reason)
        if not self._next_prune_ms - PRUNE_EVERY_MS <= now_ms < self._next_prune_ms:   # forget groups that ended (no members, no offsets)
            self._next_prune_ms = now_ms + PRUNE_EVERY_MS
            for group_id in [g for g in self._mine if g not in self._merged and not self.core.has_group(g)]:
                self._mine.discard(group_id)
                self._loaded.pop(group_id, None)

    def on_cluster_change(self, now_ms: int) -> None:
        self._sync_topics()
        changed = self._merge_gossip(now_ms)
        coord_set = frozenset(self._coordination_set(now_ms))
        if coord_set != self._coord_set:
            before = self._coord_set
            self._coord_set = coord_set
            # groups can move here when a broker left the set, or when this node, alone so
            # far, meets others (it may be the newcomer to a running cluster)
            if before is not None and (not before <= coord_set or before == {self.node_id}):
                self.core.begin_takeover(now_ms)
            self._rehome(now_ms)
        for group_id in sorted(changed & self._mine):
            self._take_newer(group_id)

    # -- views --------------------------------------------------------------------------
    def committed(self, group_id: str) -> dict[tuple[str, int], tuple[int, str, int]]:
        """The merged view of one group's committed offsets: (topic, partition) -> (offset,
        metadata, commit wall ms)."""
        return dict(self._merged.get(group_id, {}))

    def coordinator_of(self, group_id: str) -> str | None:
        return self._coordinator(group_id, self._clock())

    # -- routing ------------------------------------------------------------------------
    def _coordination_set(self, now_ms: int) -> list[str]:
        return [m.node_id for m in self.node.gossip.members(now_ms) if m.status in _COORDINATING]

    def _coordinator(self, group_id: str, now_ms: int) -> str | None:
        nodes = self._coord_set if self._coord_set is not None else self._coordination_set(now_ms)
        try:
            return coordinator_for(group_id, nodes)
        except ValueError:
            return None

    def _find_coordinator(self, msg: GroupFindCoordinator) -> GroupFindCoordinatorResponse:
        try:
            group_id = _check_group_id(msg.group_id)
        except MeshError as exc:
            return error_response(msg, exc.code, exc.message)
        node_id = self._coordinator(group_id, self._clock())
        address = self.node._address_of(node_id) if node_id else None
        if not node_id or not address:
            return error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no live broker known")
        return GroupFindCoordinatorResponse(error=0, node_id=node_id, address=address)

    def _moved(self, msg: Any, coordinator: str | None):
        if coordinator is None:
            return error_response(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no live broker known")
        text = f"group {msg.group_id!r} is coordinated by {coordinator}"
        if isinstance(msg, (GroupFetchOffsets, GroupDescribe)):
            offsets = self._gossip_offsets(msg.group_id, getattr(msg, "partitions", None))
            if isinstance(msg, GroupDescribe):
                return GroupDescribeResponse(error=int(ErrorCode.COORDINATOR_MOVED), message=text,
                                             group_id=msg.group_id, state="unknown",
                                             offsets=offsets, coordinator=coordinator)
            return GroupFetchOffsetsResponse(error=int(ErrorCode.COORDINATOR_MOVED), message=text,
                                             offsets=offsets, coordinator=coordinator)
        return error_response(msg, ErrorCode.COORDINATOR_MOVED, text, coordinator=coordinator)

    def _gossip_offsets(self, group_id: str, partitions: Any) -> list:
        merged = self._merged.get(group_id, {})
        if partitions is None:
            wanted = sorted(merged)
        else:
            wanted = sorted({(tp[0], tp[1]) for tp in partitions[:100_000]
                             if isinstance(tp, (list, tuple)) and len(tp) == 2})
        out = []
        for tp in wanted:
            offset, metadata, _ = merged.get(tp, (-1, "", 0))
            out.append([tp[0], tp[1], offset, metadata])
        return out

    def _list(self) -> GroupListResponse:
        groups = [dict(g, coordinator=self.node_id) for g in self.core.list_groups().groups]
        listed = {g["group_id"] for g in groups}
        now_ms = self._clock()
        for group_id in sorted(self._merged):
            if group_id not in listed:
                groups.append({"group_id": group_id, "state": "unknown", "members": -1,
                               "group_epoch": -1, "coordinator": self._coordinator(group_id, now_ms)})
        return GroupListResponse(error=0, groups=groups)

    # -- offsets: durable, then gossiped ------------------------------------------------
    def _wall_ms(self) -> int:
        self._last_wall_ms = max(int(time.time() * 1000), self._last_wall_ms + 1)
        return self._last_wall_ms

    def _persist(self, group_id: str, offsets, wall_ms: int) -> bool:
        store = self.node.store
        try:
            for topic, partition, offset, metadata in offsets:
                store.put(OFFSETS_DB, _store_key(group_id, topic, partition),
                          msgpack.packb([offset, metadata, wall_ms], use_bin_type=True))
        except LogError as exc:
            log.error("group %s: could not stage offsets: %s", group_id, exc)
            self.node.data.commit_turn()   # fails and rolls the doomed transaction back
            return False
        return self.node.data.commit_turn()

    def _restore(self, group_id: str, offsets, previous: dict) -> None:
        tps = [(t, p) for t, p, _, _ in offsets]
        self.core.discard_offsets(group_id, tps)
        self.core.load_offsets(group_id, [(t, p, *previous[(t, p)]) for t, p in tps if (t, p) in previous],
                               replace=True)

    def _publish(self, group_id: str, offsets, wall_ms: int) -> None:
        """Record offsets that are durable here: own table, merged view, gossip."""
        chunks = set()
        loaded = self._loaded.setdefault(group_id, {})
        for topic, partition, offset, metadata in offsets:
            chunk = (group_id, topic, partition // CHUNK_PARTITIONS)
            self._own.setdefault(chunk, {})[partition] = [offset, metadata, wall_ms]
            self._fold(group_id, topic, partition, offset, metadata, wall_ms)
            if group_id in self._mine:
                loaded[(topic, partition)] = (wall_ms, offset)
            chunks.add(chunk)
        for chunk in sorted(chunks):
            self._gossip_chunk(chunk)

    def _gossip_chunk(self, chunk: tuple[str, str, int]) -> None:
        group_id, topic, n = chunk
        entries = self._own[chunk]
        value = {"g": group_id, "t": topic, "o": {str(p): list(v) for p, v in sorted(entries.items())}}
        try:
            self.node.gossip.set_local(_gossip_key(group_id, topic, n), value)
        except ValueError as exc:   # cannot happen within the metadata bound; never fatal
            log.error("group %s: offsets of %s not gossiped: %s", group_id, topic, exc)

    def _load_store(self) -> None:
        """Offsets synced here in an earlier life: back into the own table and gossip."""
        for key, raw in self.node.store.items(OFFSETS_DB):
            try:
                group_id, topic, partition = msgpack.unpackb(key, raw=False)
                offset, metadata, wall_ms = msgpack.unpackb(raw, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.warning("skipping unreadable stored offset %r: %s", key[:80], exc)
                continue
            self._own.setdefault((group_id, topic, partition // CHUNK_PARTITIONS), {})[partition] = \
                [offset, metadata, wall_ms]
            self._fold(group_id, topic, partition, offset, metadata, wall_ms)
            self._last_wall_ms = max(self._last_wall_ms, wall_ms)
        for chunk in sorted(self._own):
            self._gossip_chunk(chunk)
        if self._own:
            log.info("reloaded committed offsets of %d group/topic chunks", len(self._own))

    # -- the merged view ----------------------------------------------------------------
    def _fold(self, group_id: str, topic: str, partition: int, offset: int, metadata: str,
              wall_ms: int) -> bool:
        table = self._merged.setdefault(group_id, {})
        old = table.get((topic, partition))
        if old is not None and (old[2], old[0]) >= (wall_ms, offset):
            return False
        table[(topic, partition)] = (offset, metadata, wall_ms)
        return True

    def _merge_gossip(self, now_ms: int) -> set[str]:
        """Fold namespace entries that moved since the last call; the groups that changed."""
        gossip = self.node.gossip
        changed: set[str] = set()
        present = set()
        for member in gossip.members(now_ms):
            node_id = member.node_id
            present.add(node_id)
            mark = (member.generation, member.max_version)
            if self._seen_nodes.get(node_id) == mark:
                continue
            self._seen_nodes[node_id] = mark
            for key, value in gossip.node_items(node_id, GOSSIP_PREFIX).items():
                version = gossip.entry_version(node_id, key)
                if self._seen_keys.get((node_id, key)) == version:
                    continue
                self._seen_keys[(node_id, key)] = version
                changed |= self._fold_entry(node_id, key, value)
        for node_id in [n for n in self._seen_nodes if n not in present]:
            del self._seen_nodes[node_id]
            for k in [k for k in self._seen_keys if k[0] == node_id]:
                del self._seen_keys[k]
        return changed

    def _fold_entry(self, node_id: str, key: str, value: Any) -> set[str]:
        try:
            group_id, topic, entries = value["g"], value["t"], value["o"]
            if not isinstance(group_id, str) or not isinstance(topic, str) or not isinstance(entries, dict):
                raise TypeError("bad types")
            changed = False
            for p, (offset, metadata, wall_ms) in entries.items():
                partition = int(p)
                if not (isinstance(offset, int) and isinstance(metadata, str) and isinstance(wall_ms, int)):
                    raise TypeError("bad offset entry")
                changed |= self._fold(group_id, topic, partition, offset, metadata, wall_ms)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring malformed offsets entry %s of %s: %s", key[:80], node_id, exc)
            return set()
        return {group_id} if changed else set()

    # -- coordination changes -----------------------------------------------------------
    def _sync_topics(self) -> None:
        topics = {name: int(t["partitions"]) for name, t in self.node.catalog.topics.items()}
        for name in sorted(set(self._topics) | set(topics)):
            n = topics.get(name, 0)
            if self._topics.get(name, 0) != n:
                try:
                    self.core.set_topic_partitions(name, n)
                except MeshError as exc:
                    log.warning("consumer groups cannot use topic %s: %s", name[:80], exc)
                    continue
        self._topics = topics

    def _rehome(self, now_ms: int) -> None:
        for group_id in sorted(set(self._merged) | self._mine):
            if self._coordinator(group_id, now_ms) == self.node_id:
                self._ensure_mine(group_id)
            elif group_id in self._mine:
                log.info("group %s moved to %s", group_id, self._coordinator(group_id, now_ms))
                self.core.drop_group(group_id)
                self._mine.discard(group_id)
                self._loaded.pop(group_id, None)

    def _ensure_mine(self, group_id: str) -> None:
        if group_id in self._mine:
            return
        self._mine.add(group_id)
        self._loaded[group_id] = {}
        if group_id in self._merged:
            log.info("coordinating group %s (taking over its committed offsets)", group_id)
        self._take_newer(group_id)

    def _take_newer(self, group_id: str) -> None:
        """Load merged offsets newer than what the core holds, and adopt those that are not
        yet durable here."""
        loaded = self._loaded.setdefault(group_id, {})
        newer = []
        for (topic, partition), (offset, metadata, wall_ms) in sorted(self._merged.get(group_id, {}).items()):
            if loaded.get((topic, partition), (-1, -1)) < (wall_ms, offset):
                newer.append((topic, partition, offset, metadata, wall_ms))
        if not newer:
            return
        self.core.load_offsets(group_id, [(t, p, o, m) for t, p, o, m, _ in newer], replace=True)
        adopt = []
        for topic, partition, offset, metadata, wall_ms in newer:
            loaded[(topic, partition)] = (wall_ms, offset)
            own = self._own.get((group_id, topic, partition // CHUNK_PARTITIONS), {}).get(partition)
            if own is None or (own[2], own[0]) < (wall_ms, offset):
                adopt.append((topic, partition, offset, metadata, wall_ms))
        if adopt:
            self._adopt(group_id, adopt)

    def _adopt(self, group_id: str, entries: list) -> None:
        store = self.node.store
        try:
            for topic, partition, offset, metadata, wall_ms in entries:
                store.put(OFFSETS_DB, _store_key(group_id, topic, partition),
                          msgpack.packb([offset, metadata, wall_ms], use_bin_type=True))
        except LogError as exc:
            log.error("group %s: could not adopt offsets: %s", group_id, exc)
            self.node.data.commit_turn()
            return
        if not self.node.data.commit_turn():
            return
        chunks = set()
        for topic, partition, offset, metadata, wall_ms in entries:
            chunk = (group_id, topic, partition // CHUNK_PARTITIONS)
            self._own.setdefault(chunk, {})[partition] = [offset, metadata, wall_ms]
            chunks.add(chunk)
        for chunk in sorted(chunks):
            self._gossip_chunk(chunk)
