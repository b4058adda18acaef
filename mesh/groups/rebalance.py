"""Consumer groups: the pure transitions of one group's assignment (sans-I/O).

These functions change a ``GroupRecord`` (``mesh.groups.state``) and nothing else; the
coordinator (``mesh.groups.coordinator``, whose docstring states the rules) calls them from
its request handlers and its ``tick``.

* ``bump``: membership, subscriptions, assignor or a partition count changed: the group
  epoch goes up and the assignor computes a new *target* (``mesh.groups.assignors``) from
  the members that are not fenced, the most voted assignor winning (ties: the smaller name).
* ``reconcile``: one member's heartbeat. Partitions missing from a *current* ``owned``
  list are released; given partitions no longer in its target move to ``revoking``; only
  when nothing is left revoking (and the takeover hold is over) target partitions that no
  member holds are given, and the member epoch goes up by one.
* ``fence``: out of the target now; its partitions stay held until its session ends.
* ``remove``: gone; its partitions are free at once.
* ``expire``: the session and rebalance timeouts of one member.
"""
from __future__ import annotations

import collections
from typing import Mapping

from mesh.groups.assignors import assign
from mesh.groups.state import GroupRecord, MemberRecord
from mesh.wire.types import TopicPartition

__all__ = ["bump", "reconcile", "fence", "remove", "expire"]


def bump(group: GroupRecord, topic_partitions: Mapping[str, int]) -> None:
    """Membership or subscriptions changed: new group epoch, new target assignment."""
    group.epoch += 1
    active = {mid: m for mid, m in group.members.items() if not m.fenced}
    if not active:
        group.target = {}
        return
    votes = collections.Counter(m.assignor for m in active.values())
    group.assignor = min(votes, key=lambda name: (-votes[name], name))
    group.target = assign(group.assignor, {mid: m.topics for mid, m in active.items()},
                          topic_partitions,
                          {mid: group.target.get(mid, frozenset()) for mid in active})


def reconcile(group: GroupRecord, m: MemberRecord, owned: set[TopicPartition] | None,
              now_ms: int) -> None:
    """Move member ``m`` toward its target. ``owned``: what a request of its current epoch
    says it holds (None: a late or repeated request, believe nothing)."""
    if owned is not None:
        for tp in sorted(m.revoking - owned):
            m.revoking.discard(tp)
            del group.owners[tp]
    target = group.target.get(m.member_id, frozenset())
    drop = m.assigned - target
    if drop:
        m.assigned -= drop
        m.revoking |= drop
    if not m.revoking:
        m.revoke_since_ms = None
        if now_ms >= group.hold_until_ms:
            grant = [tp for tp in sorted(target - m.assigned) if tp not in group.owners]
            if grant:
                m.assigned.update(grant)
                for tp in grant:
                    group.owners[tp] = m.member_id
                m.epoch += 1
    elif m.revoke_since_ms is None:
        m.revoke_since_ms = now_ms


def fence(group: GroupRecord, m: MemberRecord, topic_partitions: Mapping[str, int]) -> None:
    """Out of the assignment now; its partitions stay held until its session ends."""
    if not m.fenced:
        m.fenced = True
        bump(group, topic_partitions)


def remove(group: GroupRecord, m: MemberRecord, topic_partitions: Mapping[str, int]) -> None:
    """The member is gone: everything it held is free at once."""
    for tp in m.assigned | m.revoking:
        del group.owners[tp]
    del group.members[m.member_id]
    if not m.fenced:
        bump(group, topic_partitions)


def expire(group: GroupRecord, m: MemberRecord, now_ms: int,
           topic_partitions: Mapping[str, int]) -> str | None:
    """Apply the session and rebalance timeouts to one member: "removed", "fenced" or None."""
    if now_ms - m.last_heartbeat_ms > m.session_timeout_ms:
        remove(group, m, topic_partitions)
        return "removed"
    if (not m.fenced and m.revoke_since_ms is not None
            and now_ms - m.revoke_since_ms > m.rebalance_timeout_ms):
        fence(group, m, topic_partitions)
        return "fenced"
    return None
