"""Quiescence in one ``mesh.raft.partition.Partition`` replica (its rule 10; the manager's
docstring has the node-wide half): going quiet, waking, and the beats a replica that is not
leading still sends. Functions of the partition (``p``).

The partition's rule, in full:

10. Quiescence (CockroachDB's; the manager's docstring has the node-wide half). A leader
   whose partition was idle for ``quiesce_after_beats`` beats, with a committed config, no
   learners, no transfer, commit = synced = log end, a quorum caught up and every follower
   that answered within an election timeout caught up (silent ones are left behind), and
   no hand-back to a live preferred replica due, sends one heartbeat with ``quiesce`` set
   and goes quiet: no ticks, no heartbeats. A follower that gets it from its leader, holds
   the leader's commit and is not recovering goes quiet too: no election timer, and its
   leader's lease holds for as long as the leader's node is heard (the manager wakes it
   otherwise). A quiet leader wakes on anything that needs it (a write, a config change, a
   transfer, any row but a heartbeat answer that needs nothing); a quiet follower on any
   row from its leader but a quiesce heartbeat; its election timer then stands where it
   would had it kept ticking (since the leader's last append or heartbeat), so quiescence
   never ends a lease sooner than ticking would (a replica whose disk rolled back can vote
   in a term it forgot: see "Known gap" in the manager). Followers never speak
   first otherwise, so two replicas do on every beat (``follower_beat``): a leader that
   stepped down within its term (check-quorum, a corrupt batch) tells its peers for an
   election timeout, and a recovering replica whose leader has been silent for a beat
   tells its leader, which wakes and refills it. Safety never depends on quiescence:
   quiet replicas only skip timers and keep a lease their leader's broker still holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.wire.errors import ErrorCode
from mesh.raft.messages import HeartbeatRespRow
from mesh.raft.roles import Role

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["quiesce", "wake", "refresh_heard", "follower_beat"]

_NONE = int(ErrorCode.NONE)


def quiesce(p: Partition) -> None:
    if not p.quiesced:
        p.quiesced = True
        p.host.quiesced(p)


def wake(p: Partition) -> None:
    """Tick again (rule 10; also the manager's way in: a node went silent, restarted or
    came back). A follower's election timer stands where it would had it kept ticking
    (the ticks since its leader's last append or heartbeat reached it, which a quiesce
    heartbeat set), so waking never ends a lease sooner than ticking would have; an
    append or heartbeat that wakes it restarts the timer anyway. It stands at most at
    1.5E: the successors of a dead leader then still campaign in their rank order. A
    leader counts its followers as last heard when their nodes were (so a write right
    after waking is not refused for lack of answers)."""
    if not p.quiesced:
        return
    p.quiesced = False
    if p.lead is not None:
        p.lead.idle_beats = 0
    p.host.unquiesced(p)
    if p.role is Role.LEADER:
        refresh_heard(p)
    else:
        # ... but no further than the start of the upper half of [E, 2E): past it, every
        # successor would campaign on its first tick, whatever its rank (_rank_timeout)
        p.election_elapsed_ticks = min(max(p.host.now_tick - p.leader_tick, p.election_elapsed_ticks),
                                          p._upper_half())


def refresh_heard(p: Partition) -> None:
    heard = p.host.heard_tick
    for peer, pr in p.progress.items():
        t = heard(peer)
        if t > pr.last_resp_tick:
            pr.last_resp_tick = t
            pr.heard = True


def follower_beat(p: Partition) -> None:
    """The node-wide beat, for a replica that is not leading (rule 10): a leader that
    stepped down within its term tells its followers for an election timeout (a quiet
    follower would keep its lease otherwise), and a recovering replica whose leader has
    not been heard for a beat tells the leader (a quiet leader would not refill it)."""
    if not p.cfg.quiesce_after_beats:
        return
    row = HeartbeatRespRow(p.pid, p.term, _NONE, int(p.recovering), *p.history.latest().ident)
    if p.stepdown_beats:
        p.state.stepdown_beats -= 1
        for peer in p.peers:
            p._send(peer, row)
    elif (p.recovering and p.leader is not None
          and p.host.now_tick - p.leader_tick > p.cfg.heartbeat_ticks):
        p._send(p.leader, row)
    elif p.recovering and p.leader is None:
        # (a replica dropped and hosted again forgot the term too: whoever leads a
        # quiet partition wakes on it and heartbeats, and so tells it who leads)
        for peer in p.peers:
            p._send(peer, row)
