"""Consumer groups: the coordinator's state machine (request handlers, tick, queries).

The package, by concern: the wire messages and the checks of their input are in
``mesh.groups.messages``; the configuration, per-group records and effects in
``mesh.groups.state``; the pure transitions of a group's assignment (bump, reconcile,
fence, remove, expire) in ``mesh.groups.rebalance``; the assignors in
``mesh.groups.assignors``. The member side is ``mesh.groups.member.GroupMemberState``; the
node shell that drives the coordinator is ``mesh.node.groups.group_host`` (with the pure offsets
logic of ``mesh.groups.offsets``); the client shell is ``mesh.client.group``.

Theory of operation
-------------------
Modelled on Kafka's KIP-848 ("next generation" rebalance): assignment is computed on the
server, members learn it from their heartbeats, and partitions move incrementally.

A member heartbeats ``GROUP_HEARTBEAT`` to the group's coordinator (the broker chosen by
``mesh.cluster.ownership.coordinator_for``) with its subscription and the partitions it holds
right now. Member id ``""`` with epoch 0 joins (the coordinator makes up the id); epoch
-1 leaves. The answer carries the member's id, its *member epoch* and the partitions it
may hold.

Per group the coordinator keeps the members, the *group epoch* (bumped on every change of
membership, subscriptions, assignor, or the partition count of a subscribed topic), the
*target assignment* (recomputed by the assignor at every bump, ``mesh.groups.assignors``), and
per member what it has been *given* (``assigned``) and what it has been told to give back
but has not yet reported released (``revoking``). When a member heartbeats:

1. if its epoch is current, partitions missing from its ``owned`` list are released;
2. what it was given but is no longer in its target moves to ``revoking``;
3. only when nothing is left revoking, target partitions that no member holds (in anyone's
   ``assigned`` or ``revoking``) are given to it, and its member epoch goes up by one.

Rules, and why they keep two members from ever holding one partition:

* The coordinator gives a partition only when it is in no member's ``assigned`` or
  ``revoking`` (the ``owners`` map; asserted by ``check_invariants``).
* A member epoch goes up exactly when partitions are given, so the first answer carrying a
  new epoch carries every partition given at that epoch. An answer never both gives and
  revokes: grants wait until the member has released everything it was asked to.
* ``owned`` lists are believed only from requests carrying the member's *current* epoch:
  such a member has accepted an answer of that epoch, so it holds everything given to it
  up to then, and a partition missing from its list is truly gone. A delayed or duplicated
  older heartbeat cannot release anything.
* Members (``mesh.groups.member.GroupMemberState``) take given partitions at once, accept an answer only if
  its epoch is not older than theirs, and from an answer of their own epoch only *remove*
  partitions, so a delayed answer cannot hand back a partition already released.
* Leaving member ids are never reused (64 random bits from the injected ``rng``), so a
  leave (epoch -1), however late, is always true: that id holds nothing and never will.
* Session timeout: a member not heard from for ``session_timeout_ms`` is removed and its
  partitions are free at once. That is safe because the member fences itself first: it
  drops everything and rejoins under a new id once ``session_timeout_ms`` (minus a margin)
  has passed since it *sent* its last acknowledged heartbeat, which the coordinator
  processed no earlier than that.
* Rebalance timeout: a member that has not released what it was asked to within
  ``rebalance_timeout_ms`` is fenced: it leaves the assignment at once, but the partitions
  it holds stay held until its session would have ended, since it may still think it owns
  them.
* Failover: a coordinator starts empty. Members rejoin (the new coordinator does not know
  their ids: UNKNOWN_MEMBER), and committed offsets come from gossip (``load_offsets``).
  Members of the old coordinator may still hold partitions until their sessions end, so a
  group that gets its first member within ``takeover_grace_ms`` of the coordinator starting
  (or of ``begin_takeover``) is given no partitions before that window ends.

Offsets: ``GROUP_COMMIT`` is accepted from a member with its current epoch that holds the
partitions (``assigned`` or ``revoking``: members commit while revoking), or from a
"simple" consumer (member id ``""``, epoch -1) when the group has no members, as Kafka
allows. Success returns ``PersistOffsets``; the shell makes it durable on a majority of
the group's replicas, then replies, and gossips it (``mesh.groups.replication``). ``GROUP_RESET_OFFSETS`` is refused while the group has members.

Deletion (Kafka's DeleteGroups and offsets.retention.minutes): ``GROUP_DELETE`` of a group
with members is refused (GROUP_NOT_EMPTY); otherwise the group is forgotten and the answer
comes with ``PersistOffsets`` of tombstones (offset ``DELETED``) for every partition it
had an offset for: the shell makes them durable and gossips them like any commit, so the
deletion wins over every older commit everywhere (``mesh.groups.offsets``). A group that
has had no members and no commit for ``offsets_retention_ms`` (7 days) is deleted the
same way: ``expired`` names them, and the shell deletes each with a ``GroupDelete`` of its
own. A commit after a deletion starts the group again.

Pacing: every heartbeat answer says when to heartbeat next: ``heartbeat_interval_ms``
while the group is stable, ``reconcile_heartbeat_interval_ms`` (100 ms) while partitions
are waiting to move, so a hand-over takes a few round trips rather than a few intervals.

Public API (sans-I/O: time is ``now_ms``, randomness the injected ``rng``)::

    coord = GroupCoordinator(GroupConfig(), random.Random(seed), now_ms=now)
    coord.set_topic_partitions("orders", 12)           # from the metadata view
    coord.load_offsets("g", [("orders", 0, 42, "")])    # from gossip, on taking over
    response, effects = coord.handle(request, now_ms)   # any GROUP_* request (messages)
    effects = coord.tick(now_ms)                        # expire sessions, fence laggards
    coord.expired(now_ms)                               # empty groups past offsets retention
    coord.describe("g"), coord.list_groups(), coord.drop_group("g"), coord.begin_takeover(now)

The shell: routes GROUP_* requests for groups whose ``coordinator_for`` is this node to
``handle`` and answers the others with ``error_response(req, COORDINATOR_MOVED,
coordinator=node)``; answers GROUP_FIND_COORDINATOR itself; carries out ``PersistOffsets``
before sending the response; calls ``tick`` every loop turn and ``set_topic_partitions``
when metadata changes; when the live broker set changes, calls ``drop_group`` for groups
no longer hashed here and ``begin_takeover`` (then ``load_offsets`` for groups that are).
``mesh.groups.offsets`` makes those decisions for the node's shell (``mesh.node.groups.group_host``).

The client drives a ``mesh.groups.member.GroupMemberState`` (see its docstring).

Errors: UNKNOWN_MEMBER (the id is gone: drop everything, rejoin), FENCED_EPOCH (this
member is out: drop everything, rejoin), ILLEGAL_GENERATION on a commit (the epoch is
stale or the partition is not held: heartbeat, then retry what is still held),
INVALID_REQUEST / INVALID_CONFIG for bad input. COORDINATOR_MOVED and
COORDINATOR_NOT_AVAILABLE come from the shell (``error_response``).
"""
from __future__ import annotations

import random
from typing import Any, Iterable

from mesh.groups import rebalance
from mesh.groups.assignors import ASSIGNORS
from mesh.groups.messages import (
    JOIN_EPOCH, LEAVE_EPOCH, MAX_PARTITIONS_PER_TOPIC, GroupCommit, GroupCommitResponse,
    GroupDelete, GroupDeleteResponse, GroupDescribe, GroupDescribeResponse, GroupFetchOffsets, GroupFetchOffsetsResponse,
    GroupHeartbeat, GroupHeartbeatResponse, GroupList, GroupListResponse, GroupResetOffsets,
    GroupResetOffsetsResponse, check_group_id, check_int, check_list, check_offsets,
    check_partitions, check_topic, error_response, invalid, wire_partitions,
)
from mesh.groups.state import (
    DELETED, GroupConfig, GroupRecord, MemberRecord, MemberRemoved, PersistOffsets,
)
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.types import TopicPartition

__all__ = ["GroupCoordinator"]


class GroupCoordinator:
    """The coordinator for the groups hashed to this broker. See the module docstring."""

    def __init__(self, config: GroupConfig | None = None, rng: random.Random | None = None, *,
                 now_ms: int = 0):
        if rng is None:
            raise ValueError("GroupCoordinator needs an injected random.Random (member ids)")
        self.config = config or GroupConfig()
        self._rng = rng
        self._groups: dict[str, GroupRecord] = {}
        self._topic_partitions: dict[str, int] = {}
        self._takeover_until_ms = now_ms + self.config.grace_ms
        self._handlers = {
            GroupHeartbeat: self._heartbeat,
            GroupCommit: self._commit,
            GroupFetchOffsets: self._fetch_offsets,
            GroupResetOffsets: self._reset_offsets,
            GroupDelete: self._delete,
            GroupDescribe: lambda req, now_ms: (self.describe(req.group_id), []),
            GroupList: lambda req, now_ms: (self.list_groups(), []),
        }

    # -- inputs from the shell ----------------------------------------------------------

    def handle(self, request: Any, now_ms: int) -> tuple[Any, list]:
        """Answer one GROUP_* request (not FIND_COORDINATOR: the shell answers that).
        Returns (response, effects); carry out the effects before sending the response."""
        handler = self._handlers.get(type(request))
        if handler is None:
            raise TypeError(f"not a group coordinator request: {type(request).__name__}")
        try:
            return handler(request, now_ms)
        except MeshError as exc:
            return error_response(request, exc.code, exc.message), []

    def tick(self, now_ms: int) -> list:
        """Remove members whose session ended, fence those that did not revoke in time."""
        effects: list = []
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            for member_id in sorted(group.members):
                was_fenced = group.members[member_id].fenced
                outcome = rebalance.expire(group, group.members[member_id], now_ms,
                                           self._topic_partitions)
                if outcome == "removed":
                    effects.append(MemberRemoved(group_id, member_id,
                                                 "fenced member's session ended" if was_fenced
                                                 else "session timeout"))
                elif outcome == "fenced":
                    effects.append(MemberRemoved(group_id, member_id, "fenced: rebalance timeout"))
            if group.members:
                group.idle_since_ms = None
            elif group.idle_since_ms is None:
                group.idle_since_ms = now_ms
            self._maybe_forget(group)
        return effects

    def expired(self, now_ms: int, limit: int = 1_000) -> list[str]:
        """Groups (at most ``limit``, sorted) that have had no members and no commit for
        ``offsets_retention_ms``: the shell deletes each (``GroupDelete``)."""
        retention = self.config.offsets_retention_ms
        if retention <= 0 or now_ms < self._takeover_until_ms:
            return []   # (members of the old coordinator may still come: not empty for sure)
        out = []
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            if not group.members and group.idle_since_ms is not None \
                    and now_ms - group.idle_since_ms >= retention:
                out.append(group_id)
                if len(out) >= limit:
                    break
        return out

    def set_topic_partitions(self, topic: str, partitions: int) -> None:
        """The partition count of ``topic`` (0: the topic is gone). Groups subscribed to it
        get a new epoch and target when it changes."""
        check_topic(topic)
        check_int(partitions, 0, MAX_PARTITIONS_PER_TOPIC, "partitions")
        if self._topic_partitions.get(topic, 0) == partitions:
            return
        if partitions == 0:
            del self._topic_partitions[topic]
        else:
            if topic not in self._topic_partitions and len(self._topic_partitions) >= self.config.max_topics:
                raise MeshError(ErrorCode.INVALID_CONFIG, f"more than {self.config.max_topics} topics")
            self._topic_partitions[topic] = partitions
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            if any(topic in m.topics for m in group.members.values() if not m.fenced):
                rebalance.bump(group, self._topic_partitions)

    def load_offsets(self, group_id: str, offsets: Iterable[tuple[str, int, int, str]],
                     replace: bool = False, newest_ms: int = -1) -> list[tuple[str, int, int, str]]:
        """Committed offsets from gossip (the shell picks the winners), when taking a group
        over. By default only partitions with no offset here are filled: while this node
        coordinates the group its own commits are the newest, and gossip may lag behind
        them. ``replace``: the shell knows these are newer (a later commit made through
        another broker, e.g. the previous coordinator's last ones arriving late). An offset of
        ``DELETED`` (a tombstone: the group was deleted through another broker) takes the
        partition's offset away, unless the group has members here: then that broker
        deleted a group it did not know was alive (it was cut off, or coordinated it for a
        moment), and the offsets held here are returned, for the shell to commit again with
        a newer stamp. ``newest_ms``: the group's newest commit stamp; offsets retention
        counts from it (not from this load) if the group has no members."""
        group = self._group(group_id, create=True, capped=False)   # acknowledged commits: never refused
        reassert = []
        for topic, partition, offset, metadata in offsets:
            tp = (topic, partition)
            if offset < 0:
                if group.members and tp in group.offsets:
                    reassert.append((topic, partition, *group.offsets[tp]))
                elif replace:
                    group.offsets.pop(tp, None)
            elif replace:
                group.offsets[tp] = (offset, metadata)
            else:
                group.offsets.setdefault(tp, (offset, metadata))
        if not group.members and newest_ms >= 0:
            group.idle_since_ms = max(newest_ms, group.idle_since_ms if group.idle_since_ms is not None else -1)
        self._maybe_forget(group)
        return reassert

    def discard_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Forget committed offsets (the shell could not make a commit durable and restores
        what it had: it discards, then ``load_offsets(replace=True)`` the old values)."""
        group = self._groups.get(group_id)
        if group is None:
            return
        for tp in partitions:
            group.offsets.pop((tp[0], tp[1]), None)
        self._maybe_forget(group)

    def begin_takeover(self, now_ms: int) -> None:
        """Groups may have moved here (the live broker set changed): groups that get their
        first member in the next ``takeover_grace_ms`` are given no partitions before then."""
        self._takeover_until_ms = max(self._takeover_until_ms, now_ms + self.config.grace_ms)

    def drop_group(self, group_id: str, deleted: Iterable[TopicPartition] = ()) -> list[tuple[str, int, int, str]]:
        """Forget a group entirely (this broker stopped coordinating it). If it comes back,
        it starts empty and its members rejoin. ``deleted``: partitions whose newest entry
        in gossip is a tombstone; if the group had members here, the offsets it holds for
        them are returned, to be committed again (as ``load_offsets`` does: the broker that
        deleted it did not know its members, and is where they go now)."""
        group = self._groups.pop(group_id, None)
        if group is None or not group.members:
            return []
        return [(t, p, *group.offsets[(t, p)]) for t, p in sorted(deleted) if (t, p) in group.offsets]

    # -- queries --------------------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescribeResponse:
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescribeResponse(error=0, group_id=group_id, state="dead")
        members = []
        for member_id in sorted(group.members):
            m = group.members[member_id]
            members.append({
                "member_id": member_id, "member_epoch": m.epoch, "topics": sorted(m.topics),
                "assignor": m.assignor, "assigned": wire_partitions(m.assigned),
                "revoking": wire_partitions(m.revoking),
                "target": wire_partitions(group.target.get(member_id, ())),
                "fenced": m.fenced, "session_timeout_ms": m.session_timeout_ms,
                "last_heartbeat_ms": m.last_heartbeat_ms,
            })
        offsets = [[t, p, off, meta] for (t, p), (off, meta) in sorted(group.offsets.items())]
        return GroupDescribeResponse(error=0, group_id=group_id, state=group.state(),
                                     group_epoch=group.epoch, assignor=group.assignor,
                                     members=members, offsets=offsets)

    def list_groups(self) -> GroupListResponse:
        return GroupListResponse(error=0, groups=[
            {"group_id": g.group_id, "state": g.state(), "members": len(g.members),
             "group_epoch": g.epoch}
            for g in (self._groups[gid] for gid in sorted(self._groups))])

    def has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and bool(group.members)

    def has_group(self, group_id: str) -> bool:
        """True while the group has members or committed offsets here."""
        return group_id in self._groups

    def committed(self, group_id: str) -> dict[TopicPartition, tuple[int, str]]:
        group = self._groups.get(group_id)
        return dict(group.offsets) if group else {}

    def check_invariants(self) -> None:
        """Assert the ownership invariants (tests call it after every step)."""
        for group in self._groups.values():
            seen: dict[TopicPartition, str] = {}
            for member_id, m in group.members.items():
                assert not (m.assigned & m.revoking), (group.group_id, member_id)
                for tp in m.assigned | m.revoking:
                    assert tp not in seen, f"{tp} held by {seen[tp]} and {member_id}"
                    seen[tp] = member_id
                assert (m.revoke_since_ms is None) == (not m.revoking)
                assert not m.fenced or member_id not in group.target
            assert seen == group.owners, "owners map out of date"

    # -- heartbeats -----------------------------------------------------------------------

    def _heartbeat(self, req: GroupHeartbeat, now_ms: int) -> tuple[GroupHeartbeatResponse, list]:
        cfg = self.config
        group_id = check_group_id(req.group_id)
        if req.member_epoch == LEAVE_EPOCH:
            return self._leave(group_id, req.member_id), []
        topics = frozenset(check_topic(t) for t in
                           check_list(req.topics, cfg.max_topics_per_member, "topics"))
        owned = check_partitions(req.owned, cfg.max_partitions_per_request, "owned")
        assignor = req.assignor or cfg.default_assignor
        if assignor not in ASSIGNORS:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"unknown assignor {assignor!r}; known: {', '.join(sorted(ASSIGNORS))}")
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"session_timeout_ms must be in [{cfg.min_session_timeout_ms}, "
                            f"{cfg.max_session_timeout_ms}]")
        if not 0 < req.rebalance_timeout_ms <= cfg.max_rebalance_timeout_ms:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"rebalance_timeout_ms must be in [1, {cfg.max_rebalance_timeout_ms}]")
        if req.member_id == "":
            if req.member_epoch != JOIN_EPOCH or owned:
                raise invalid("a joining member sends member epoch 0 and owns nothing")
            group = self._group(group_id, create=True)
            member = self._join(group, topics, assignor, req, now_ms)
        else:
            group = self._groups.get(group_id)
            member = group.members.get(req.member_id) if group else None
            if member is not None and \
                    rebalance.expire(group, member, now_ms, self._topic_partitions) == "removed":
                member = None
            if member is None:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER,
                                f"member {req.member_id!r:.80} is not in group {group_id!r}: rejoin")
            if member.fenced:
                raise MeshError(ErrorCode.FENCED_EPOCH, f"member {req.member_id} was fenced: rejoin")
            if req.member_epoch > member.epoch or (req.member_epoch == member.epoch
                                                    and not owned <= member.assigned | member.revoking):
                rebalance.fence(group, member, self._topic_partitions)
                raise MeshError(ErrorCode.FENCED_EPOCH,
                                f"member {req.member_id} sent epoch {req.member_epoch} or partitions "
                                f"it was never given (epoch {member.epoch}): rejoin")
            member.last_heartbeat_ms = now_ms
            if req.member_epoch == member.epoch:  # only a current request may change things
                member.session_timeout_ms = req.session_timeout_ms
                member.rebalance_timeout_ms = req.rebalance_timeout_ms
                if member.topics != topics or member.assignor != assignor:
                    member.topics, member.assignor = topics, assignor
                    rebalance.bump(group, self._topic_partitions)
                rebalance.reconcile(group, member, owned, now_ms)
            else:  # a late or repeated request: its `owned` may be stale, believe nothing
                rebalance.reconcile(group, member, None, now_ms)
        return GroupHeartbeatResponse(
            error=0, member_id=member.member_id, member_epoch=member.epoch,
            assignment=wire_partitions(member.assigned),
            heartbeat_interval_ms=self._heartbeat_interval_ms(group), group_epoch=group.epoch), []

    def _heartbeat_interval_ms(self, group: GroupRecord) -> int:
        cfg = self.config
        if group.state() == "stable":
            return cfg.heartbeat_interval_ms
        return min(cfg.heartbeat_interval_ms, cfg.reconcile_heartbeat_interval_ms)

    def _join(self, group: GroupRecord, topics: frozenset[str], assignor: str, req: GroupHeartbeat,
              now_ms: int) -> MemberRecord:
        if len(group.members) >= self.config.max_members_per_group:
            raise invalid(f"group {group.group_id!r} is full ({len(group.members)} members)")
        member_id = f"{self._rng.getrandbits(64):016x}"
        while member_id in group.members:  # pragma: no cover - 64 random bits
            member_id = f"{self._rng.getrandbits(64):016x}"
        if not group.members and now_ms < self._takeover_until_ms:
            group.hold_until_ms = self._takeover_until_ms
        member = MemberRecord(member_id, topics, assignor, req.session_timeout_ms,
                         req.rebalance_timeout_ms, last_heartbeat_ms=now_ms)
        group.members[member_id] = member
        rebalance.bump(group, self._topic_partitions)
        rebalance.reconcile(group, member, set(), now_ms)
        return member

    def _leave(self, group_id: str, member_id: Any) -> GroupHeartbeatResponse:
        """A leaving id holds nothing and never will again, so its partitions are free now."""
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group and isinstance(member_id, str) else None
        if member is not None:
            rebalance.remove(group, member, self._topic_partitions)
            self._maybe_forget(group)
        return GroupHeartbeatResponse(error=0, member_id=member_id if isinstance(member_id, str) else "",
                                      member_epoch=LEAVE_EPOCH)

    # -- offsets --------------------------------------------------------------------------

    def _commit(self, req: GroupCommit, now_ms: int) -> tuple[GroupCommitResponse, list]:
        group_id = check_group_id(req.group_id)
        offsets = check_offsets(req.offsets, self.config.max_partitions_per_request,
                                 self.config.max_metadata_chars, with_metadata=True)
        group = self._groups.get(group_id)
        if req.member_id == "" and req.member_epoch == LEAVE_EPOCH:
            if group is not None and group.members:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER,
                                f"group {group_id!r} has {len(group.members)} members; "
                                "a simple consumer may commit only to a group without members")
            self._check_exist(offsets)   # (a member commits only what it was assigned)
        else:
            member = group.members.get(req.member_id) if group else None
            if member is None:
                raise MeshError(ErrorCode.UNKNOWN_MEMBER, f"member {req.member_id!r:.80} is not in "
                                                          f"group {group_id!r}: rejoin")
            if member.fenced or req.member_epoch > member.epoch:
                raise MeshError(ErrorCode.FENCED_EPOCH, f"member {req.member_id} is fenced")
            if req.member_epoch < member.epoch:
                raise MeshError(ErrorCode.ILLEGAL_GENERATION,
                                f"stale member epoch {req.member_epoch} (current {member.epoch}): "
                                "heartbeat, then commit again")
            for topic, partition, _, _ in offsets:
                if group.owners.get((topic, partition)) != member.member_id:
                    raise MeshError(ErrorCode.ILLEGAL_GENERATION,
                                    f"member {req.member_id} does not hold {topic}/{partition}")
        return self._write_offsets(group_id, offsets, now_ms)

    def _reset_offsets(self, req: GroupResetOffsets, now_ms: int) -> tuple[GroupResetOffsetsResponse, list]:
        group_id = check_group_id(req.group_id)
        offsets = check_offsets(req.offsets, self.config.max_partitions_per_request,
                                 self.config.max_metadata_chars, with_metadata=False)
        group = self._groups.get(group_id)
        if group is not None and group.members:
            raise invalid(f"group {group_id!r} has {len(group.members)} members: offsets can be "
                           "reset only when it has none (stop its consumers first)")
        self._check_settled(now_ms, "offsets can be reset")
        self._check_exist(offsets)
        response, effects = self._write_offsets(group_id, offsets, now_ms)
        return GroupResetOffsetsResponse(error=response.error, message=response.message), effects

    def _delete(self, req: GroupDelete, now_ms: int) -> tuple[GroupDeleteResponse, list]:
        group_id = check_group_id(req.group_id)
        group = self._groups.get(group_id)
        if group is None or not (group.members or group.offsets):
            raise MeshError(ErrorCode.UNKNOWN_GROUP, f"no group {group_id!r}")
        if group.members:
            raise MeshError(ErrorCode.GROUP_NOT_EMPTY,
                            f"group {group_id!r} has {len(group.members)} members: it can be deleted "
                            "only when it has none (stop its consumers first)")
        self._check_settled(now_ms, "it can be deleted")
        del self._groups[group_id]
        # every partition of its topics: also a commit made elsewhere that never reached here
        tps = set(group.offsets) | {(t, p) for t in {t for t, _ in group.offsets}
                                    for p in range(self._topic_partitions.get(t, 0))}
        tombstones = tuple((t, p, DELETED, "") for t, p in sorted(tps))
        return GroupDeleteResponse(error=0), [PersistOffsets(group_id, tombstones)]

    def _check_settled(self, now_ms: int, what: str) -> None:
        """A coordinator that just took groups over (or started) does not know their members
        yet (they rejoin within a session): "no members" is not yet true. Retriable."""
        if now_ms < self._takeover_until_ms:
            raise MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"this coordinator took its groups over {self.config.grace_ms // 1000} s ago or "
                            f"less: their members may still rejoin; {what} in "
                            f"{(self._takeover_until_ms - now_ms + 999) // 1000} s")

    def _write_offsets(self, group_id: str, offsets: list, now_ms: int) -> tuple[GroupCommitResponse, list]:
        group = self._group(group_id, create=True)
        new = sum(1 for t, p, _, _ in offsets if (t, p) not in group.offsets)
        if len(group.offsets) + new > self.config.max_offsets_per_group:
            raise invalid(f"group {group_id!r} would hold more than "
                           f"{self.config.max_offsets_per_group} committed offsets")
        for topic, partition, offset, metadata in offsets:
            group.offsets[(topic, partition)] = (offset, metadata)
        if not group.members:
            group.idle_since_ms = now_ms   # (a simple consumer's commit keeps its group)
        return GroupCommitResponse(error=0), [PersistOffsets(group_id, tuple(offsets))]

    def _fetch_offsets(self, req: GroupFetchOffsets, now_ms: int) -> tuple[GroupFetchOffsetsResponse, list]:
        group_id = check_group_id(req.group_id)
        group = self._groups.get(group_id)
        stored = group.offsets if group else {}
        if req.partitions is None:
            wanted = sorted(stored)
        else:
            wanted = sorted(check_partitions(req.partitions, self.config.max_partitions_per_request,
                                              "partitions"))
        out = []
        for tp in wanted:
            offset, metadata = stored.get(tp, (-1, ""))
            out.append([tp[0], tp[1], offset, metadata])
        return GroupFetchOffsetsResponse(error=0, offsets=out), []

    # -- group table ----------------------------------------------------------------------

    def _check_exist(self, offsets) -> None:
        """Offsets name partitions of topics this coordinator knows (made-up topics were
        stored, and gossiped to every broker, without bound). UNKNOWN_TOPIC is retriable: a
        topic just created may not have reached this broker yet."""
        known = self._topic_partitions
        for topic, partition, *_ in offsets:
            count = known.get(topic, 0)
            if not count:
                raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"no topic {topic!r:.80}")
            if partition >= count:
                raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"{topic} has partitions 0..{count - 1}")

    def _group(self, group_id: str, create: bool, capped: bool = True) -> GroupRecord:
        """``capped``: a new group counts against ``max_groups`` (a client's join or commit);
        a group that moves here with its committed offsets is never refused."""
        group = self._groups.get(group_id)
        if group is None and create:
            if capped and len(self._groups) >= self.config.max_groups:
                raise invalid(f"this coordinator already holds {self.config.max_groups} groups")
            group = self._groups[group_id] = GroupRecord(group_id)
        return group

    def _maybe_forget(self, group: GroupRecord) -> None:
        if not group.members and not group.offsets:
            self._groups.pop(group.group_id, None)
