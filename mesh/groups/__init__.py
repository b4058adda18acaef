"""Consumer groups: server-side assignment, incremental rebalancing, committed offsets.

Pure cores (no clock, no socket, randomness injected), by concern:

* ``messages``: the GROUP_* wire messages, ``error_response`` and the checks of wire input;
* ``state``: ``GroupConfig``, the coordinator's per-group records, its effects;
* ``rebalance``: the pure transitions of a group's assignment (bump, reconcile, fence...);
* ``coordinator``: ``GroupCoordinator``, the broker side (its docstring states the rules);
* ``member``: ``GroupMemberState``, the client side of the heartbeat protocol;
* ``assignors``: range, round-robin, cooperative-sticky;
* which broker coordinates a group: ``mesh.cluster.ownership`` (re-exported here);
* ``offsets``: the committed-offsets view the node's group host keeps (last writer wins),
  takeover, adoption and rehoming.

The shells: ``mesh.node.groups.group_host`` (broker) and ``mesh.client.group`` (client).
"""
from mesh.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, assign
from mesh.groups.coordinator import GroupCoordinator
from mesh.groups.member import GroupMemberState, MemberChanges
from mesh.groups.messages import (
    GROUP_REQUESTS, JOIN_EPOCH, LEAVE_EPOCH, GroupCommit, GroupCommitResponse, GroupDelete,
    GroupDeleteResponse, GroupDescribe,
    GroupDescribeResponse, GroupFetchOffsets, GroupFetchOffsetsResponse, GroupFindCoordinator,
    GroupFindCoordinatorResponse, GroupHeartbeat, GroupHeartbeatResponse, GroupList,
    GroupListResponse, GroupResetOffsets, GroupResetOffsetsResponse, check_group_id,
    error_response,
)
from mesh.cluster.ownership import coordinator_for, ranked_nodes
from mesh.groups.state import GroupConfig, MemberRemoved, PersistOffsets

__all__ = [
    "GroupCoordinator", "GroupConfig", "PersistOffsets", "MemberRemoved",
    "GroupMemberState", "MemberChanges",
    "GroupHeartbeat", "GroupHeartbeatResponse", "GroupCommit", "GroupCommitResponse",
    "GroupFetchOffsets", "GroupFetchOffsetsResponse", "GroupResetOffsets",
    "GroupResetOffsetsResponse", "GroupDelete", "GroupDeleteResponse", "GroupDescribe",
    "GroupDescribeResponse", "GroupList",
    "GroupListResponse", "GroupFindCoordinator", "GroupFindCoordinatorResponse",
    "GROUP_REQUESTS", "JOIN_EPOCH", "LEAVE_EPOCH", "error_response", "check_group_id",
    "ASSIGNORS", "DEFAULT_ASSIGNOR", "assign", "coordinator_for", "ranked_nodes",
]
