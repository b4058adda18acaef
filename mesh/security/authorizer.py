"""Which operation on which resource each client request needs, and the decision (pure).

``Authorizer.authorize(principal, request)`` returns the request (narrowed where Kafka
narrows: a MetadataRequest for every topic becomes one for the topics the principal may
describe) or raises ``MeshError(UNAUTHORIZED, "<principal> may not <op> <resource> <name>")`` (for the cluster:
"<principal> may not <op> cluster").
The principal must be a user of the registry *now* (a removed user's open connections get
UNAUTHORIZED for everything), then superusers pass, then the ACLs decide (``mesh.security.acl``:
deny wins, default deny). A request type missing from the table below is refused. The peer
principal ``broker`` never reaches the authorizer (peers are not clients).

================================  ==================================================  ====================
request                           needs (every line; "or": either suffices)           as Kafka's
================================  ==================================================  ====================
ProduceRequest                    write topic                                         Produce
FetchRequest                      read each topic                                     Fetch (consumer)
ListOffsetsRequest                describe each topic                                 ListOffsets
MetadataRequest (named topics)    describe each topic                                 Metadata
MetadataRequest (all topics)      nothing: narrowed to the describable topics         Metadata
MetadataRequest ([] : brokers)    nothing                                             Metadata
CreateTopicRequest                create topic <name> or create cluster               CreateTopics
DeleteTopicRequest                delete topic                                        DeleteTopics
GroupHeartbeat                    read group; describe each subscribed topic          ConsumerGroupHeartbeat
GroupCommit                       read group; read each topic                         OffsetCommit
GroupResetOffsets                 read group; read each topic                         OffsetCommit (the
                                                                                      reset tool commits)
GroupDelete                       delete group                                        DeleteGroups
GroupFetchOffsets                 describe group; describe each named topic           OffsetFetch
GroupDescribe                     describe group                                      DescribeGroups
GroupFindCoordinator              describe group                                      FindCoordinator
GroupList                         describe cluster                                    ListGroups (all)
AddUserRequest, RemoveUserRequest alter cluster                                       AlterUserScram...
ListUsersRequest                  describe cluster                                    DescribeUserScram...
AddAclRequest, RemoveAclRequest   alter cluster                                       CreateAcls/DeleteAcls
ListAclsRequest                   describe cluster                                    DescribeAcls
KafkaSecurityRequest              refused to every user, superusers too (brokers      (none: it carries
                                  only: the Kafka listener's SCRAM credentials)       SCRAM keys)
AlterTopicRequest                 alter topic                                         CreatePartitions
BrokerStateRequest                alter cluster                                       (broker decommission)
ReassignRequest                   alter cluster                                       AlterPartitionReassignments
ListMovesRequest                  describe cluster                                    ListPartitionReassignments
================================  ==================================================  ====================

Kafka filters some answers instead (ListGroups without describe cluster lists the groups
the principal may describe; OffsetFetch of every offset hides undescribable topics): here a
GroupFetchOffsets for every committed offset, like GroupDescribe, shows the group's offsets
to whoever may describe the group, and GroupList needs describe cluster.

Per request the work is one table lookup and one ACL evaluation per distinct resource
(fetch and list offsets name few topics); records are never looked at.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from mesh.groups import messages as g
from mesh.security.acl import CLUSTER_NAME, AclTable
from mesh.security.registry import Registry
from mesh.wire import messages as m
from mesh.wire.codec import REGISTRY
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["Authorizer", "REQUIREMENTS", "requirements"]

_MISSING = object()
_CACHE_ENTRIES = 100_000   # remembered decisions (principal, operation, resource, name)

# A need is a tuple of alternatives (operation, resource, name); any one satisfies it.
Need = tuple[tuple[str, str, str], ...]


def _one(op: str, resource: str, name: Any) -> Need:
    return ((op, resource, name if isinstance(name, str) else repr(name)),)


def _topics_of(parts: Any, index: int = 0) -> list[str]:
    """Distinct topic names of [[topic, ...], ...] (malformed entries: the handler refuses them)."""
    seen: dict[str, None] = {}
    if isinstance(parts, (list, tuple)):
        for p in parts:
            if isinstance(p, (list, tuple)) and len(p) > index and isinstance(p[index], str):
                seen[p[index]] = None
    return list(seen)


def _names(items: Any, what: str) -> list[str]:
    """Distinct names of a list of names; INVALID_REQUEST if one is not a string."""
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{what} must be a list of names")
    return list(dict.fromkeys(items))


def _group_and_topics(group_op: str, topic_op: str, topics: Callable[[Any], list[str]]):
    def needs(msg) -> list[Need]:
        return [_one(group_op, "group", msg.group_id)] + [_one(topic_op, "topic", t) for t in topics(msg)]
    return needs


_CLUSTER_ALTER = lambda msg: [_one("alter", "cluster", CLUSTER_NAME)]       # noqa: E731
_CLUSTER_DESCRIBE = lambda msg: [_one("describe", "cluster", CLUSTER_NAME)]  # noqa: E731

def _brokers_only(msg) -> list[Need]:
    """No user may have it (it is computed before the superuser pass): brokers never reach
    the authorizer."""
    raise MeshError(ErrorCode.UNAUTHORIZED, f"only brokers may send {type(msg).__name__}")


REQUIREMENTS: dict[type, Callable[[Any], list[Need]]] = {
    m.ProduceRequest: lambda msg: [_one("write", "topic", msg.topic)],
    m.FetchRequest: lambda msg: [_one("read", "topic", t) for t in _topics_of(msg.parts)],
    m.ListOffsetsRequest: lambda msg: [_one("describe", "topic", t) for t in _topics_of(msg.parts)],
    m.MetadataRequest: lambda msg: [_one("describe", "topic", t) for t in _names(msg.topics or [], "topics")],
    m.CreateTopicRequest: lambda msg: [(("create", "topic", str(msg.name)), ("create", "cluster", CLUSTER_NAME))],
    m.DeleteTopicRequest: lambda msg: [_one("delete", "topic", msg.name)],
    g.GroupHeartbeat: _group_and_topics("read", "describe",
                                        lambda msg: _names(msg.topics, "topics")),
    g.GroupCommit: _group_and_topics("read", "read", lambda msg: _topics_of(msg.offsets)),
    g.GroupResetOffsets: _group_and_topics("read", "read", lambda msg: _topics_of(msg.offsets)),
    g.GroupFetchOffsets: _group_and_topics("describe", "describe", lambda msg: _topics_of(msg.partitions)),
    g.GroupDelete: lambda msg: [_one("delete", "group", msg.group_id)],
    g.GroupDescribe: lambda msg: [_one("describe", "group", msg.group_id)],
    g.GroupFindCoordinator: lambda msg: [_one("describe", "group", msg.group_id)],
    g.GroupList: _CLUSTER_DESCRIBE,
    m.AddUserRequest: _CLUSTER_ALTER,
    m.RemoveUserRequest: _CLUSTER_ALTER,
    m.ListUsersRequest: _CLUSTER_DESCRIBE,
    m.AddAclRequest: _CLUSTER_ALTER,
    m.RemoveAclRequest: _CLUSTER_ALTER,
    m.ListAclsRequest: _CLUSTER_DESCRIBE,
    m.KafkaSecurityRequest: _brokers_only,
    m.AlterTopicRequest: lambda msg: [_one("alter", "topic", msg.name)],
    m.BrokerStateRequest: _CLUSTER_ALTER,
    m.ReassignRequest: _CLUSTER_ALTER,
    m.ListMovesRequest: _CLUSTER_DESCRIBE,
}


def requirements(msg: Any) -> list[Need] | None:
    """What ``msg`` needs, or None if its type is not in the table (then it is refused)."""
    fn = REQUIREMENTS.get(type(msg))
    return None if fn is None else fn(msg)


class Authorizer:
    def __init__(self, registry: Registry, superusers: Iterable[str] = (), *,
                 topic_names: Callable[[], Iterable[str]] | None = None) -> None:
        """``topic_names()``: every topic this node knows (the catalog's), to narrow a
        metadata request for all topics; without it such a request is narrowed to none."""
        self.registry = registry
        self.superusers = frozenset(superusers)
        self.topic_names = topic_names
        self.table = AclTable()
        self.skipped: list[str] = []   # keys of malformed ACL values at the last update
        self.refused = 0
        self._cache: dict[tuple[str, str, str, str], bool] = {}   # decisions since the last update
        self._registers: dict[str, Any] = {}   # the registers of the last update (key -> value)

    def update_acls(self, acls: dict[str, dict]) -> None:
        """Replace the rows with the ``acl/<id>`` registers (key -> value). Rows whose
        register did not change are kept as they were parsed (the table is indexed again,
        which is cheap; parsing and checking every row on every change was not)."""
        old = self._registers
        gone = [k for k, v in old.items() if acls.get(k, _MISSING) != v]
        fresh = {k: v for k, v in acls.items() if old.get(k, _MISSING) != v}
        if not gone and not fresh:
            return
        if len(gone) + len(fresh) > max(64, len(acls) // 2):   # mostly new: build it again
            self.table, self.skipped = AclTable.from_registers(acls)
        else:   # a few rows changed (an add, a removal): only those are parsed
            for k in gone:
                self.table.remove(k.rpartition("/")[2])
            parsed, skipped = AclTable.from_registers(fresh)
            for rid, rule in parsed.rules.items():
                self.table.add(rule, rid)
            self.skipped = [k for k in self.skipped if k in acls and k not in fresh] + skipped
        self._registers = dict(acls)
        self._cache = {}

    def allowed(self, principal: str, operation: str, resource: str, name: str) -> bool:
        """The ACLs' decision (superusers: always), remembered until the next update."""
        if principal in self.superusers:
            return True
        key = (principal, operation, resource, name)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            got = self._cache[key] = self.table.decide(principal, operation, resource, name)[0]
        return got

    def preauthorize(self, principal: str, op: bytes) -> None:
        """Before the body of a request ``op`` is decoded (decoding costs the loop): refuse
        a principal that is not a user, a request type missing from the table, and a
        cluster operation the principal may not do (those needs do not depend on the body).
        ``authorize`` decides the rest once the body is decoded."""
        if not self.registry.knows(principal):
            self.refused += 1
            raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} is not a user (any more)")
        if principal in self.superusers:
            return
        cls = REGISTRY.get(bytes(op))
        fn = REQUIREMENTS.get(cls) if cls is not None else None
        if fn is None:
            if cls is None:
                return   # an unknown operation: decode_body says so
            self.refused += 1
            raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} may not send {cls.__name__}")
        if fn is _CLUSTER_ALTER or fn is _CLUSTER_DESCRIBE:
            op_name = "alter" if fn is _CLUSTER_ALTER else "describe"
            if not self.allowed(principal, op_name, "cluster", CLUSTER_NAME):
                self.refused += 1
                raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} may not {op_name} cluster")

    def authorize(self, principal: str, msg: Any) -> Any:
        if not self.registry.knows(principal):
            self.refused += 1
            raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} is not a user (any more)")
        needs = requirements(msg)
        if needs is None:
            self.refused += 1
            raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} may not send {type(msg).__name__}")
        if principal in self.superusers:
            return msg
        for need in needs:
            if not any(self.allowed(principal, *alt) for alt in need):
                op, resource, name = need[0]
                self.refused += 1
                what = resource if resource == "cluster" else f"{resource} {name}"
                raise MeshError(ErrorCode.UNAUTHORIZED, f"{principal} may not {op} {what}")
        if isinstance(msg, m.MetadataRequest) and msg.topics is None:
            names = self.topic_names() if self.topic_names is not None else ()
            return m.MetadataRequest([t for t in sorted(names)
                                      if self.allowed(principal, "describe", "topic", t)])
        return msg
