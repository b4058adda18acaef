"""Partition replication: Raft per partition, coalesced per broker pair (MultiRaft).

A pure, sans-I/O core (no clock, socket, thread or global random): the node's raft host
(``mesh.node.replication.raft_host``) feeds it peer messages and ticks and carries out the ``Ready``
it returns, persisting before it sends. Read ``mesh.raft.manager`` first (theory of
operation and the shell contract), then:

    manager.py    ReplicaManager: every replica one broker hosts; coalescing; the Ready
    partition.py  Partition: one replica's Raft state machine (roles as step functions)
    leading.py    its leader half: replication, commit, transfer, local appends
    progress.py   the leader's view of each follower (probe / replicate, inflight window)
    quorum.py     majorities, the commit offset (high watermark), vote tallies
    log.py        the epoch cache, the storage effects, the LogReader protocol
    messages.py   the peer protocol: one row per partition, one message per kind and peer
    config.py     ReplicationConfig
    membership.py Config, the config history (markers in the log), the allowed steps
    configuring.py  its use in a replica: who counts, config changes and their commit
    outbox.py     coalescing: one message per peer and kind
"""
from mesh.raft.config import ReplicationConfig
from mesh.raft.log import Append, CleanTo, CutHead, EpochCache, LogOp, LogReader, PersistState, ResetLog, Truncate
from mesh.raft.manager import Ready, ReplicaManager
from mesh.raft.membership import Config, check_step
from mesh.raft.messages import (
    PEER_MESSAGES, PeerMessage, ReplAppend, ReplAppendResp, ReplHeartbeat, ReplHeartbeatResp,
    ReplTimeoutNow, ReplVote, ReplVoteResp,
)
from mesh.raft.partition import Role

__all__ = [
    "ReplicaManager", "ReplicationConfig", "Ready", "Role", "Config", "check_step",
    "Append", "Truncate", "ResetLog", "CutHead", "CleanTo", "LogOp", "PersistState", "EpochCache", "LogReader",
    "PEER_MESSAGES", "PeerMessage", "ReplAppend", "ReplAppendResp", "ReplHeartbeat",
    "ReplHeartbeatResp", "ReplVote", "ReplVoteResp", "ReplTimeoutNow",
]
