"""Offsets and group listings for classic Kafka clients: OffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, on the mesh's GROUP_COMMIT, GROUP_FETCH_OFFSETS, GROUP_LIST and
GROUP_DESCRIBE (``mesh.kafka.groups`` explains the mapping; this is its second half).

* A member's commit is checked here against its Kafka generation and against what its
  native member holds (a partition it does not hold is ILLEGAL_GENERATION, as the mesh's
  coordinator would answer), then sent under the native member's id and epoch; an epoch
  that moved meanwhile (a grant) is read again and the commit retried once.
* A commit with generation -1 is a simple (assign()-mode) commit: the mesh accepts it
  only for a group without members (else UNKNOWN_MEMBER_ID), as Kafka does.
* Authorization, as Kafka's: OffsetCommit READ on the group and on each topic;
  OffsetFetch, ListGroups and DescribeGroups DESCRIBE (implied by READ). A fetch of every
  committed offset leaves out the topics the principal may not describe.
"""
from __future__ import annotations

from kio.schema.errors import ErrorCode as K

from mesh.groups import GroupCommit, GroupDescribe, GroupFetchOffsets, GroupList
from mesh.kafka.context import RequestContext
from mesh.kafka.group_codec import (
    KAFKA_NAME_OF, build, encode_assignment, encode_subscription, kafka_error, kafka_state, sibling,
)
from mesh.wire.errors import ErrorCode as M, MeshError

__all__ = ["OffsetHandlers"]

MAX_PARTITIONS = 100_000      # per request (the mesh's max_partitions_per_request)
MAX_METADATA_CHARS = 4_096    # the mesh's max_metadata_chars
MAX_GROUPS_PER_REQUEST = 1_000
_NO_AUTHORIZED_OPERATIONS = -(1 << 31)


def _valid_partition(topic, partition) -> bool:
    return isinstance(topic, str) and 0 < len(topic) <= 249 and 0 <= partition < (1 << 31)


class OffsetHandlers:
    """Mixed into ``ClassicGroups`` (it provides ``link``, ``_group_error``, ``_session``)."""

    # -- OffsetCommit ---------------------------------------------------------------------
    def offset_commit(self, ctx: RequestContext, req):
        group_error = self._group_error(ctx, req.group_id)
        results: dict[tuple[str, int], K] = {}
        entries: list[list] = []
        for topic in req.topics:
            topic_ok = group_error is None and ctx.authorizer.allowed(ctx.principal, "READ", "TOPIC", topic.name)
            for part in topic.partitions:
                key = (topic.name, part.partition_index)
                meta = part.committed_metadata or ""
                if group_error is not None:
                    results[key] = group_error
                elif not topic_ok:
                    results[key] = K.topic_authorization_failed
                elif not _valid_partition(*key):
                    results[key] = K.unknown_topic_or_partition
                elif len(meta) > MAX_METADATA_CHARS:
                    results[key] = K.offset_metadata_too_large
                elif part.committed_offset < 0 or len(entries) >= MAX_PARTITIONS:
                    results[key] = K.invalid_commit_offset_size
                else:
                    entries.append([key[0], key[1], int(part.committed_offset), meta])
        if entries:
            results.update(self._commit(req, entries))
        Topic, Part = sibling(req, "OffsetCommitResponseTopic"), sibling(req, "OffsetCommitResponsePartition")
        return build(sibling(req, "OffsetCommitResponse"), topics=tuple(
            build(Topic, name=t.name, partitions=tuple(
                build(Part, partition_index=p.partition_index, error_code=results[(t.name, p.partition_index)])
                for p in t.partitions))
            for t in req.topics))

    def _commit(self, req, entries: list[list]) -> dict[tuple[str, int], K]:
        group_id = req.group_id
        out: dict[tuple[str, int], K] = {}
        if req.generation_id_or_member_epoch < 0:
            code = self._send_commit(GroupCommit(group_id, "", -1, entries))
            return {(t, p): code for t, p, _, _ in entries}
        keep = []
        with self.link.cond:
            s = self._session(group_id, req.member_id)
            if s is None or req.generation_id_or_member_epoch != s.generation:
                code = K.unknown_member_id if s is None else K.illegal_generation
                return {(t, p): code for t, p, _, _ in entries}
            for entry in entries:
                if (entry[0], entry[1]) in s.state.owned:
                    keep.append(entry)
                else:
                    out[(entry[0], entry[1])] = K.illegal_generation
        for attempt in range(2):
            if not keep:
                break
            with self.link.cond:
                native_id, epoch = s.state.member_id, s.state.member_epoch
            if not native_id:
                code = K.unknown_member_id
                break
            code = self._send_commit(GroupCommit(group_id, native_id, epoch, keep))
            if code != K.illegal_generation or attempt == 1:
                break
            with self.link.cond:   # the pump may have learned a newer epoch since
                if s.state.member_epoch == epoch:
                    break
        for t, p, _, _ in keep:
            out[(t, p)] = code
        return out

    def _send_commit(self, msg: GroupCommit) -> K:
        try:
            resp = self.link.call(msg, group=msg.group_id)
        except MeshError as exc:
            return kafka_error(exc.code)
        return kafka_error(resp.error)

    # -- OffsetFetch ----------------------------------------------------------------------
    def offset_fetch(self, ctx: RequestContext, req):
        v = ctx.api_version
        if v >= 8:
            Group = sibling(req, "OffsetFetchResponseGroup")
            Topic, Part = sibling(req, "OffsetFetchResponseTopics"), sibling(req, "OffsetFetchResponsePartitions")
            groups = []
            for g in list(req.groups)[:MAX_GROUPS_PER_REQUEST]:
                error, topics = self._fetch_group(ctx, g.group_id, g.topics, Topic, Part)
                groups.append(build(Group, group_id=g.group_id, topics=topics, error_code=error))
            return build(sibling(req, "OffsetFetchResponse"), groups=tuple(groups))
        Topic, Part = sibling(req, "OffsetFetchResponseTopic"), sibling(req, "OffsetFetchResponsePartition")
        error, topics = self._fetch_group(ctx, req.group_id, req.topics, Topic, Part, per_partition=v < 2)
        return build(sibling(req, "OffsetFetchResponse"), topics=topics, error_code=error)

    def _fetch_group(self, ctx, group_id, topics, Topic, Part, per_partition: bool = False):
        """(group error, response topics) for one group."""
        def part(p, offset=-1, meta="", code=K.none):
            return build(Part, partition_index=p, committed_offset=offset, committed_leader_epoch=-1,
                         metadata=meta, error_code=code)

        def every(code):
            return tuple(build(Topic, name=t.name, partitions=tuple(part(p, code=code) for p in t.partition_indexes))
                         for t in topics or ())
        error = self._group_error(ctx, group_id, "DESCRIBE")
        if error is None and topics is not None and sum(len(t.partition_indexes) for t in topics) > MAX_PARTITIONS:
            error = K.invalid_request
        if error is not None:
            return error, (every(error) if per_partition else ())

        def allowed(topic):
            return ctx.authorizer.allowed(ctx.principal, "DESCRIBE", "TOPIC", topic)
        wanted = None
        if topics is not None:
            wanted = [[t.name, p] for t in topics if allowed(t.name) for p in t.partition_indexes
                      if _valid_partition(t.name, p)]
        found: dict[tuple[str, int], tuple[int, str]] = {}
        if wanted is None or wanted:
            try:
                resp = self.link.call(GroupFetchOffsets(group_id, wanted), group=group_id)
                code = M.NONE if resp.error in (M.NONE, M.COORDINATOR_MOVED) else resp.error
            except MeshError as exc:
                resp, code = None, exc.code
            if code != M.NONE:
                error = kafka_error(code)
                return error, (every(error) if per_partition else ())
            for t, p, off, meta in resp.offsets:   # (moved: the gossiped view of any broker)
                found[(t, p)] = (off, meta if off >= 0 else "")
        if topics is None:
            by_topic: dict[str, list] = {}
            for (t, p), (off, meta) in sorted(found.items()):
                if off >= 0 and allowed(t):
                    by_topic.setdefault(t, []).append(part(p, off, meta))
            return K.none, tuple(build(Topic, name=t, partitions=tuple(ps)) for t, ps in by_topic.items())
        out = []
        for t in topics:
            ok = allowed(t.name)
            out.append(build(Topic, name=t.name, partitions=tuple(
                part(p, *found.get((t.name, p), (-1, ""))) if ok else part(p, code=K.topic_authorization_failed)
                for p in t.partition_indexes)))
        return K.none, tuple(out)

    # -- ListGroups, DescribeGroups -------------------------------------------------------
    def list_groups(self, ctx: RequestContext, req):
        Response, Listed = sibling(req, "ListGroupsResponse"), sibling(req, "ListedGroup")
        try:
            resp = self.link.call(GroupList(), group=None)
        except MeshError as exc:
            return build(Response, error_code=kafka_error(exc.code), groups=())
        if resp.error:
            return build(Response, error_code=kafka_error(resp.error), groups=())
        me = ctx.cluster.self_broker().mesh_id
        wanted = {s.lower() for s in getattr(req, "states_filter", ()) or ()}
        listed = []
        for g in resp.groups[:100_000]:
            if not isinstance(g, dict) or g.get("coordinator") != me or not isinstance(g.get("group_id"), str):
                continue
            state = kafka_state(g.get("state", ""))
            if wanted and state.lower() not in wanted:
                continue
            if ctx.authorizer.allowed(ctx.principal, "DESCRIBE", "GROUP", g["group_id"]):
                listed.append(build(Listed, group_id=g["group_id"], protocol_type="consumer", group_state=state))
        return build(Response, error_code=K.none, groups=tuple(listed))

    def describe_groups(self, ctx: RequestContext, req):
        Described = sibling(req, "DescribedGroup")
        Member = sibling(req, "DescribedGroupMember")
        out = []
        for group_id in list(req.groups)[:MAX_GROUPS_PER_REQUEST]:
            fields = self._describe(ctx, group_id, Member)
            out.append(build(Described, group_id=group_id, authorized_operations=_NO_AUTHORIZED_OPERATIONS, **fields))
        return build(sibling(req, "DescribeGroupsResponse"), groups=tuple(out))

    def _describe(self, ctx, group_id, Member) -> dict:
        error = self._group_error(ctx, group_id, "DESCRIBE")
        if error is None:
            try:
                resp = self.link.call(GroupDescribe(group_id), group=group_id)
                if resp.error:
                    error = kafka_error(M.COORDINATOR_NOT_AVAILABLE if resp.error == M.COORDINATOR_MOVED
                                        else resp.error)
            except MeshError as exc:
                error = kafka_error(exc.code)
        if error is not None:
            return {"error_code": error, "group_state": "", "protocol_type": "", "protocol_data": "", "members": ()}
        with self.link.cond:
            local = {s.native_id: s for s in self.link.sessions.values() if s.native_id}
        members = []
        for m in resp.members[:10_000]:
            s = local.get(m.get("member_id"))
            sub_version = s.sub_version if s else 0
            members.append(build(
                Member, member_id=s.kafka_id if s else str(m.get("member_id", "")),
                group_instance_id=None, client_id=s.client_id if s else "",
                client_host=s.client_host if s else "",
                member_metadata=encode_subscription(m.get("topics", []), version=min(sub_version, 1)),
                member_assignment=encode_assignment([tuple(tp) for tp in m.get("assigned", [])], sub_version)))
        state = kafka_state(resp.state)
        return {"error_code": K.none, "group_state": state,
                "protocol_type": "consumer" if state != "Dead" else "",
                "protocol_data": KAFKA_NAME_OF.get(resp.assignor, resp.assignor) if members else "",
                "members": tuple(members)}
