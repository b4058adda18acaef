"""The leader's view of each follower's log (etcd-raft's ``tracker/progress.go`` and
``inflights.go``). Pure bookkeeping: ``mesh.raft.partition`` decides, this records.

Theory of operation
===================

A leader keeps one ``Progress`` per follower, for its own term only (a new leader starts
afresh). It holds:

- ``match``: the logs agree on ``[0, match)`` and the follower has it durably (acks leave
  a follower only after it persisted). It is what the follower counts with toward commit
  (``mesh.raft.quorum``) and the in-sync set. Acks only raise it. It is *lowered* when the
  follower reports less (``lower``: a rejection below it, since disks can forget) and
  reset when the follower answers from another store or a new life (``forget``: back to
  unknown, 0): a leader believes its followers' reports, never its own memory of them.
- ``config_id``: the follower's latest config ``(version, term)`` as last reported (None:
  not yet); the leader carries its config markers to it until it reports the leader's.
- ``store``: the follower's store id as last heard (None before its first answer) and
  ``recovering``: the follower said it lost state and is refilling; it then counts toward
  neither commit nor the in-sync set, and is no transfer target.
- ``next``: the offset the next append starts from (its ``prev_offset``).
- a state, one of two:

  * ``PROBE``: the leader does not know where the follower's log agrees with its own.
    At most one append is outstanding (``probe_sent``; ``probe_prev`` is its
    ``prev_offset``, so an answer to an older probe is recognised and ignored). A
    rejection carries a hint from the follower's epoch cache and moves ``next`` straight
    to the point of agreement; an ack moves the follower to ``REPLICATE``. A heartbeat
    response clears ``probe_sent`` (the probe or its answer may have been lost).
  * ``REPLICATE``: agreement is known. Batches stream from ``next`` with up to
    ``max_inflight_msgs`` messages and ``max_inflight_bytes`` bytes unacknowledged
    (the *inflight* window: ``(end_offset, bytes, sent tick)`` per append, oldest first).
    An ack frees every append it covers. A loss shows as a rejection (a gap) or as the
    oldest inflight append staying unacknowledged for ``retransmit_ticks``: back to
    ``PROBE`` from ``match``.

- liveness: ``last_resp_tick`` (any answer from the follower; check-quorum, write
  admission and the ISR use it) and ``caught_up_tick`` (when it last held the leader's
  whole log; the ISR uses it).
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

__all__ = ["PROBE", "REPLICATE", "NEVER_HEARD", "Progress", "count_active"]

PROBE = "probe"          # one message in flight; find where the follower's log agrees
REPLICATE = "replicate"  # agreement known: pipeline batches, bounded in messages and bytes


NEVER_HEARD = 1 << 30   # follower_silence of a follower not heard since this leadership began


class Progress:
    """The leader's view of one follower (this term only)."""
    __slots__ = ("match", "next", "state", "probe_sent", "probe_prev", "inflight",
                 "inflight_bytes", "last_resp_tick", "heard", "caught_up_tick", "store", "recovering", "config_id")

    def __init__(self, next_offset: int, now_tick: int) -> None:
        self.match = 0                 # logs agree on [0, match) and the follower synced it
        self.next = next_offset        # next offset to send from
        self.state = PROBE
        self.probe_sent = False
        self.probe_prev = -1
        self.inflight: deque[tuple[int, int, int]] = deque()  # (end_offset, bytes, sent tick)
        self.inflight_bytes = 0
        self.last_resp_tick = now_tick  # a grace period of one election timeout
        self.heard = False             # the follower answered this leader (or its node spoke) since then
        self.caught_up_tick = -(1 << 62)
        self.store: str | None = None  # the follower's store id, once it answered
        self.recovering = False        # the follower lost state: not counted, not a transfer target
        self.config_id: tuple[int, int] | None = None  # the follower's latest config (version, term), as reported

    # -- state changes -----------------------------------------------------------------
    def become_probe(self, next_offset: int) -> None:
        self.state = PROBE
        self.next = next_offset
        self.probe_sent = False
        self.inflight.clear()
        self.inflight_bytes = 0

    def become_replicate(self) -> None:
        self.state = REPLICATE
        self.next = self.match
        self.probe_sent = False
        self.inflight.clear()
        self.inflight_bytes = 0

    def maybe_update(self, acked: int) -> bool:
        """An ack: the logs agree on ``[0, acked)``. Returns whether ``match`` advanced."""
        if acked <= self.match:
            return False
        self.match = acked
        self.free_to(acked)
        return True

    def lower(self, offset: int) -> bool:
        """The follower reported a log that agrees with ours only below ``offset``: believe
        it (it may have lost its disk). Probes from there (-1: below the leader's log start);
        returns whether ``match`` fell."""
        fell = offset < self.match
        if fell:
            self.match = max(offset, 0)
            self.caught_up_tick = -(1 << 62)
        self.become_probe(offset)
        return fell

    def forget(self, probe_from: int) -> None:
        """The follower answered from another store or a new life: what we knew of its log
        is void. ``match`` back to unknown (0); probe from ``probe_from``."""
        self.match = 0
        self.caught_up_tick = -(1 << 62)
        self.config_id = None
        self.become_probe(probe_from)

    def counted(self) -> bool:
        """Whether this follower's ``match`` counts toward commit and the in-sync set."""
        return not self.recovering

    def stale_rejection(self, rejected: int) -> bool:
        """A rejection of ``prev_offset == rejected`` that is out of date: below what the
        follower already acked, or an answer to an older probe than the outstanding one."""
        if rejected < self.match:
            return True
        return self.state == PROBE and (not self.probe_sent or rejected != self.probe_prev)

    # -- the inflight window -------------------------------------------------------------
    def can_send(self, max_msgs: int, max_bytes: int) -> bool:
        """Room in the inflight window for one more append."""
        return len(self.inflight) < max_msgs and self.inflight_bytes < max_bytes

    def sent(self, end_offset: int, nbytes: int, now_tick: int) -> None:
        """An append up to ``end_offset`` left (replicate state): it is now inflight."""
        self.inflight.append((end_offset, nbytes, now_tick))
        self.inflight_bytes += nbytes
        self.next = end_offset

    def free_to(self, offset: int) -> None:
        """Acked up to ``offset``: every append ending at or before it left the window."""
        while self.inflight and self.inflight[0][0] <= offset:
            self.inflight_bytes -= self.inflight.popleft()[1]

    def oldest_sent_tick(self) -> int | None:
        """When the oldest unacknowledged append left (None if nothing is inflight)."""
        return self.inflight[0][2] if self.inflight else None

    # -- queries -------------------------------------------------------------------------
    def active(self, now_tick: int, window_ticks: int) -> bool:
        """The follower answered within the last ``window_ticks`` (or this leadership is
        younger than that: the grace period)."""
        return now_tick - self.last_resp_tick < window_ticks

    def in_sync(self, now_tick: int, lag_ticks: int, log_end: int) -> bool:
        """In the ISR: answered within ``lag_ticks`` and holds the leader's whole log, or
        held it within ``lag_ticks``."""
        return not self.recovering and now_tick - self.last_resp_tick <= lag_ticks and (
            self.match >= log_end or now_tick - self.caught_up_tick <= lag_ticks)

    def describe(self) -> dict:
        return {"match": self.match, "next": self.next, "state": self.state,
                "inflight": len(self.inflight), "inflight_bytes": self.inflight_bytes,
                "store": self.store, "recovering": self.recovering, "config_id": self.config_id}


def count_active(progress: Iterable[Progress], now_tick: int, window_ticks: int) -> int:
    """Replicas heard from within ``window_ticks``, the leader itself included."""
    return 1 + sum(1 for pr in progress if pr.active(now_tick, window_ticks))
