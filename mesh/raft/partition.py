"""One partition's Raft state machine (one replica). Driven by ``mesh.raft.manager``.

Each role is a state object (``mesh.raft.roles``; the leader's is ``mesh.raft.leading``),
made new by every transition (``_enter``), and its step functions (``_step``, ``_tick``) are
swapped with it (etcd-raft). Every input is a row (see ``mesh.raft.messages``) already
routed to this partition; every output goes through ``host`` (a ``PartitionHost``: the ``ReplicaManager``),
which coalesces rows per peer and collects storage effects into the ``Ready``. A leader
keeps what it knows of each follower in ``mesh.raft.progress`` (probe / replicate, the
inflight window); majorities, the commit offset and vote tallies are ``mesh.raft.quorum``.

Rules, in the order ``step`` applies them:

1. Terms. A row from a higher term makes us a follower of that term (its sender is the
   leader if it is an append, heartbeat or TimeoutNow), except a (pre-)vote request that
   arrives while we are in a leader's lease (heard from a leader within an election
   timeout) and is not a transfer: that one is ignored, so a node returning from a
   partition cannot depose a healthy leader. Pre-vote requests and granted pre-vote
   responses never change our term. A row from a lower term is dropped; if it was an
   append or heartbeat we answer FENCED_EPOCH with our term, so a stale leader steps down;
   a leader woken by a recovering replica's heartbeat answer of a lower term (a replica
   dropped and hosted again knows no term or leader: it tells every peer on each beat)
   heartbeats again, which tells it who leads.
2. Votes. Grant if we have not voted for someone else this term (or it is a pre-vote for a
   later term) and the candidate's log is at least as up to date: (last epoch, end offset)
   compared as a pair. A vote is persisted (PersistState) in the same Ready as the grant,
   and the shell persists before it sends. A pre-candidate that grants a pre-vote to a
   voter placed before it in the replica list stops its own campaign (a follower again,
   same term), so two successors that time out close together do not both go on to a
   real election and split it (liveness only: a pre-vote changes no persisted state).
3. Appends (follower; ``mesh.raft.follower_log``): accepted where the logs agree, else a
   rejection with a hint; a conflicting suffix is truncated (never below commit).
4. Commit (leader; ``mesh.raft.leading``): the largest offset a quorum holds durably in
   logs holding this leader's epoch marker (Raft 5.4.2).
5. Replication (leader; ``mesh.raft.leading``): probe, then pipeline within the inflight
   bounds.
6. Eligibility (``mesh.raft.recovery``). A replica of a partition with more than one
   replica neither votes nor campaigns while its node is unconfirmed or it is recovering
   (lost state, a corrupt batch); it still follows and acks.
7. Heartbeat commit (follower): taken only up to ``agreed`` (``mesh.raft.follower_log``).
8. Refusals (defense in depth; ``mesh.raft.refusals``): rows that contradict our state
   are counted with their reason (``host.refuse``) and change nothing.
9. Membership: the latest config in our log decides who counts (``mesh.raft.configuring``:
   ``membership``, a ``Configuring`` object).
10. Quiescence (CockroachDB's; ``mesh.raft.quiescence``): an idle partition's leader and
   followers stop ticking; safety never depends on it.
11. Log start (retention; ``mesh.raft.follower_log``): only the leader decides it; followers
   cut to it.
"""
from __future__ import annotations

import random
from typing import Protocol

from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft.config import ReplicationConfig
from mesh.raft import follower_log, quiescence, recovery
from mesh.raft.configuring import Configuring
from mesh.raft.leading import LeaderState
from mesh.raft.log import EpochCache, LogOp, LogReader
from mesh.raft.membership import History
from mesh.raft.messages import (
    AppendRespRow, AppendRow, HeartbeatRespRow, HeartbeatRow, PeerRow, TimeoutNowRow, VoteRespRow,
    VoteRow,
)
from mesh.raft.progress import NEVER_HEARD, Progress
from mesh.raft.quorum import VoteResult, vote_result
from mesh.raft.refusals import refusal
from mesh.raft.roles import CandidateState, FollowerState, Role


__all__ = ["Role", "Partition", "PartitionHost"]

_NONE = int(ErrorCode.NONE)
_FENCED = int(ErrorCode.FENCED_EPOCH)


class PartitionHost(Protocol):
    """What a ``Partition`` needs from the node-wide core that hosts it (the
    ``ReplicaManager``): shared settings, time and randomness, the log reader, and sinks
    for its outputs, which the host coalesces into the next ``Ready``."""
    node_id: str
    cfg: ReplicationConfig
    rng: random.Random
    now_tick: int
    reader: LogReader
    confirmed: bool                 # the node knows it did not lose state (see rule 6)
    peer_stores: dict[str, str]     # peer -> store id as last heard
    learner_budget: int             # catch-up bytes to learners left (a token bucket; <= 0: wait)

    # Queue ``row`` for peer ``dest`` (with its batch bytes, for an ``AppendRow``).
    def send(self, dest: str, row: PeerRow, payload: bytes = b"") -> None: ...
    # A storage effect (Append, Truncate, ResetLog), in order.
    def log_op(self, op: LogOp) -> None: ...
    # Term, vote, commit or epoch cache changed: persist the partition's state.
    def state_changed(self, p: Partition) -> None: ...
    # The commit offset advanced.
    def commit_changed(self, p: Partition) -> None: ...
    # The leader or the term may have changed.
    def leader_changed(self, p: Partition) -> None: ...
    # There is data to send to followers on the next flush.
    def want_flush(self, p: Partition) -> None: ...
    # A row from ``src`` was refused (rule 8): count it.
    def refuse(self, src: str, reason: str) -> None: ...
    # The latest config or its committed flag may have changed.
    def config_changed(self, p: Partition) -> None: ...
    # Learners wait for the next tick's catch-up budget.
    def starved(self, p: Partition) -> None: ...
    # The partition went quiet (rule 10): stop ticking it / tick it again.
    def quiesced(self, p: Partition) -> None: ...
    def unquiesced(self, p: Partition) -> None: ...
    # When the node ``peer`` was last heard (any message; a very old tick if never).
    def heard_tick(self, peer: str) -> int: ...


class Partition:
    """One replica of one partition. Its role is a state object (``mesh.raft.roles``):
    ``state`` (with ``role``, and ``lead``: the ``LeaderState`` while it leads, else None)."""

    def __init__(self, host: PartitionHost, pid: int, history: History, term: int,
                 vote: str | None, commit: int, cache: EpochCache, end_offset: int,
                 recovering: bool = False) -> None:
        self.host = host
        self.cfg = host.cfg
        self.node = host.node_id
        self.pid = pid
        self._enter(FollowerState())
        self.history = history
        self.membership = Configuring(self, history)   # who counts (mesh.raft.configuring)
        self.membership.use_config()
        self.term = term
        self.vote = vote
        self.cache = cache
        self.end = end_offset
        self.synced = end_offset       # what the shell synced (leader_append data lags until synced())
        self.commit = min(commit, end_offset)
        self.agreed = self.commit      # our log equals this term's leader's below here (rule 7)
        self.recovering = recovering and self.voters != (self.node,)
        self.recover_to: int | None = None   # refilled once our log agrees with the leader's up to here
        self.recover_term = -1                # the term recover_to was set in
        self.recover_floor = 0                # our own commit before a corrupt range was cut
        self.corrupt_at: int | None = None  # last corrupt batch reported (status)
        self.vouch: tuple[str, int] | None = None  # (successor, term): our vote while recovering (report_corrupt)
        self.confirming: tuple[int, str, set[str], int] | None = None  # (term, leader, answered, sent tick)
        self.leader: str | None = None
        self.election_elapsed_ticks = 0
        self.leader_tick = -1          # when a leader's append or heartbeat last reached us (status)
        self.timeout_ticks = 0
        self._drawn = 0                     # the last timeout draw (_rank_timeout moves it into a rank)
        self.quiesced = False               # rule 10 (the manager keeps who is quiet)
        self.quiet_peers: tuple[str, ...] = ()   # quiet leader: its followers, as the manager indexed them
        self.quiet_leader: str | None = None     # quiet follower: its leader, as the manager indexed it
        self._step = self._step_follower
        self._tick = self._tick_election
        self._reset_timeout()

    # -- the role (mesh.raft.roles; the leader's: mesh.raft.leading) --------------------------
    def _enter(self, state: FollowerState | CandidateState | LeaderState) -> None:
        """Every role change ends here: the old role's state goes with it."""
        self.state = state
        self.role = state.role
        self.lead = state if state.role is Role.LEADER else None

    @property
    def progress(self) -> dict[str, Progress]:
        return self.lead.progress if self.lead is not None else {}

    @property
    def transfer_to(self) -> str | None:
        return self.lead.transfer_to if self.lead is not None else None

    @property
    def epoch_start(self) -> int:
        return self.lead.epoch_start if self.lead is not None else 0

    @property
    def epoch_committed(self) -> bool:
        return self.lead is not None and self.lead.epoch_committed

    @property
    def votes(self) -> dict[str, bool]:
        return self.state.votes if type(self.state) is CandidateState else {}

    @property
    def handed_to(self) -> str | None:
        return self.state.handed_to if self.role is Role.FOLLOWER else None

    @property
    def stepdown_beats(self) -> int:
        return self.state.stepdown_beats if self.role is Role.FOLLOWER else 0

    def _maybe_commit(self) -> None:
        if self.lead is not None:
            self.lead.maybe_commit()

    def send_appends(self) -> None:
        """Called by the manager's flush: fill every follower's pipeline."""
        if self.lead is not None:
            self.lead.send_appends()

    def heartbeat(self) -> None:
        if self.lead is not None:
            self.lead.heartbeat()

    def peer_restarted(self, peer: str, store: str, new_store: bool) -> None:
        if self.lead is not None:
            self.lead.peer_restarted(peer, store, new_store)

    def transfer_leadership(self, target: str) -> None:
        if self.lead is not None:
            self.lead.transfer_leadership(target)

    def hand_over(self, exclude: frozenset[str] | set[str] = frozenset(),
                  new: frozenset[str] | set[str] = frozenset()) -> None:
        if self.lead is not None:
            self.lead.hand_over(exclude, new)

    def append_position(self) -> tuple[int, int]:
        if self.lead is None:
            raise MeshError(ErrorCode.NOT_LEADER, f"partition {self.pid}: not the leader", leader=self.leader)
        return self.lead.append_position()

    def leader_append(self, end_offset: int, epoch: int) -> None:
        if self.lead is None:
            raise MeshError(ErrorCode.NOT_LEADER, f"partition {self.pid}: append for epoch {epoch}, leader "
                                                  f"epoch is not here", leader=self.leader)
        self.lead.leader_append(end_offset, epoch)

    def mark_synced(self, end_offset: int) -> None:
        if end_offset > self.synced:
            self.synced = min(end_offset, self.end)
            self._maybe_commit()

    # -- outputs -----------------------------------------------------------------------
    def _send(self, dest: str, row: PeerRow, payload: bytes = b"") -> None:
        self.host.send(dest, row, payload)

    def _state_changed(self) -> None:
        self.host.state_changed(self)

    def _set_commit(self, commit: int) -> None:
        assert commit <= self.end, (self.pid, commit, self.end)
        if commit > self.commit:
            self.commit = commit
            self.host.commit_changed(self)
            self._state_changed()

    def _set_leader(self, leader: str | None) -> None:
        if leader is not None and self.role is Role.FOLLOWER:
            self.state.handed_to = None
        if leader != self.leader:
            self.leader = leader
            if leader is not None and leader != self.node:
                self._rank_timeout()
            self.host.leader_changed(self)

    # -- timers ------------------------------------------------------------------------
    def _reset_timeout(self) -> None:
        """Randomized in [E, 2E); the preferred replica draws from the lower half, so after
        a failure it usually campaigns first and no transfer is needed later. The others
        draw from the upper half, and once they know a leader they take their draw into
        their own share of it, in placement order (``_rank_timeout``)."""
        e, upper = self.cfg.election_ticks, self._upper_half()
        if self.voters[0] == self.node:
            self._drawn = self.timeout_ticks = self.host.rng.randrange(e, upper)
        else:
            self._drawn = self.timeout_ticks = self.host.rng.randrange(upper, 2 * e)
        self.election_elapsed_ticks = 0

    def _upper_half(self) -> int:
        """Where the upper half of [E, 2E) starts (the non-preferred voters' timeouts)."""
        return self.cfg.election_ticks + max(1, self.cfg.election_ticks // 2)

    def _rank_timeout(self) -> None:
        """A follower that knows its leader: the upper half of [E, 2E) is split among the
        voters after the preferred one in placement order, and this replica's draw moves
        into its share (no new draw). So when the leader that dies is the preferred replica,
        its successors do not time out together and split the vote (with two survivors of
        three sharing one window, up to 64 of 3,333 partitions needed another election).
        Without a known leader (after a lost or split election, a vote for a newer term,
        our own campaign) the draw stays over the whole upper half, so a successor that
        cannot win does not keep the next one from trying."""
        voters = self.voters
        if len(voters) < 3 or voters[0] == self.node or self.node not in voters:
            return
        lo, hi = self._upper_half(), 2 * self.cfg.election_ticks
        width = max(1, (hi - lo) // (len(voters) - 1))
        self.timeout_ticks = min(hi - 1, lo + (voters.index(self.node) - 1) * width + (self._drawn - lo) % width)

    def tick(self) -> None:
        self._tick()

    # -- quiescence (mesh.raft.quiescence) ----------------------------------------------------
    def wake(self) -> None:
        quiescence.wake(self)

    def follower_beat(self) -> None:
        quiescence.follower_beat(self)

    def _tick_election(self) -> None:
        self.election_elapsed_ticks += 1
        if self.election_elapsed_ticks >= self.timeout_ticks and self.may_campaign():
            self._campaign(pre=self.cfg.pre_vote)

    def eligible(self) -> bool:
        """May vote and campaign (rule 6)."""
        return self.voters == (self.node,) or (self.host.confirmed and not self.recovering)

    def may_campaign(self) -> bool:
        """Eligible and a voter of our latest config (rule 9)."""
        return self.node in self.voters and self.eligible()

    # -- role changes -------------------------------------------------------------------
    def _become_follower(self, term: int, leader: str | None) -> None:
        # a leader handing over steps down when its target campaigns (a higher term); not
        # when it loses its quorum or its state (the same term)
        handed_to = self.transfer_to if self.role is Role.LEADER and term > self.term else None
        self.wake()
        # stepping down within our term (check-quorum, a corrupt batch): quiet followers keep
        # our lease until told; a newer term's rows tell them anyway
        stepdown_beats = (self.cfg.election_ticks // self.cfg.heartbeat_ticks + 1
                          if self.role is Role.LEADER and term == self.term and self.cfg.quiesce_after_beats else 0)
        if term > self.term:
            self.term = term
            self.vote = None
            self.agreed = self.commit  # agreement was with an older term's leader
            self._state_changed()
        self._enter(FollowerState(handed_to, stepdown_beats))
        self._step = self._step_follower
        self._tick = self._tick_election
        self._reset_timeout()
        if leader is not None:
            self._rank_timeout()   # (also when the leader is the one we knew, in a newer term)
        self.synced = self.end
        self._set_leader(leader)

    def _campaign(self, pre: bool, transfer: bool = False) -> None:
        self.wake()
        self._reset_timeout()
        self._enter(CandidateState(pre, self.node))
        if pre:
            vote_term = self.term + 1
        else:
            self.term += 1
            self.vote = self.node
            self.agreed = self.commit
            self._state_changed()
            vote_term = self.term
        self._step = self._step_candidate
        self._tick = self._tick_election
        self._set_leader(None)
        self.host.leader_changed(self)  # the term may have moved
        if self._poll():
            return
        row = VoteRow(self.pid, vote_term, self.cache.last_epoch(), self.end, int(pre), int(transfer),
                      self.history.latest().version)
        for peer in self.voters:
            if peer != self.node:
                self._send(peer, row)

    def _poll(self) -> bool:
        """Count votes; act if the election is decided. True if it was."""
        result = vote_result(self.votes, len(self.voters), self.quorum)
        if result is VoteResult.WON:
            if self.role is Role.PRE_CANDIDATE:
                self._campaign(pre=False)
            else:
                self._become_leader()
            return True
        if result is VoteResult.LOST:
            self._become_follower(self.term, None)
            return True
        return False

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE and not self.quiesced
        lead = LeaderState(self)
        self._enter(lead)
        self._step = self._step_leader
        self._tick = lead.tick
        self.cache.assign(self.term, self.end)  # the epoch marker, in place of a no-op batch
        self._state_changed()
        self.membership.sync_progress()
        self._set_leader(self.node)
        self.host.want_flush(self)
        self._maybe_commit()

    # -- input ---------------------------------------------------------------------------
    def step(self, src: str, row: PeerRow, payload: bytes) -> None:
        if src == self.node:
            self.host.refuse(src, "a row from ourselves")
            return
        kind = type(row)
        why = refusal(self, src, row, kind)
        if why is not None:
            self.host.refuse(src, why)
            return
        if self.quiesced:
            if self.role is Role.LEADER:
                if kind is not HeartbeatRespRow:   # (an answer to our quiesce heartbeat wakes us only if it needs something)
                    self.wake()
            elif src == self.leader and not (kind is HeartbeatRow and row.quiesce):
                # anything else from our leader: an append or heartbeat (it leads on), or a vote
                # request or an answer (it stopped leading: a restart, check-quorum, a corrupt
                # batch): tick again, the lease ending when ticking would have ended it
                self.wake()
        if row.term > self.term:
            if kind is VoteRow:
                transfer = row.transfer and row.term == self.term + 1
                if row.transfer and not transfer:
                    self.host.refuse(src, "a transfer vote not for the term after ours (taken as a plain vote)")
                if not transfer and self._in_lease():
                    return
                if not row.pre_vote:
                    self._become_follower(row.term, None)
            elif kind is VoteRespRow and row.pre_vote and row.granted:
                pass  # counted below at our term + 1
            elif kind in (AppendRow, HeartbeatRow, TimeoutNowRow):
                self._become_follower(row.term, src)
            else:
                self._become_follower(row.term, None)
        elif row.term < self.term:
            if kind is AppendRow:
                self._send(src, AppendRespRow(self.pid, self.term, _FENCED, 0, row.prev_offset, 0, 0,
                                              int(self.recovering), *self.history.latest().ident))
            elif kind is HeartbeatRow:
                self._send(src, HeartbeatRespRow(self.pid, self.term, _FENCED, int(self.recovering),
                                                 *self.history.latest().ident))
            elif kind is VoteRow:
                self._send(src, VoteRespRow(self.pid, self.term, _FENCED, 0, row.pre_vote))
            elif kind is HeartbeatRespRow and row.recovering and self.role is Role.LEADER:
                self.wake()   # a replica that forgot our term asks to be refilled: heartbeat it
            return
        if kind is VoteRow:
            self._handle_vote(src, row)
        else:
            self._step(src, row, payload)

    def _in_lease(self) -> bool:
        if not self.cfg.check_quorum:
            return False
        if self.role is Role.LEADER:
            return True  # check-quorum deposes us if the lease is really gone
        return self.leader is not None and self.election_elapsed_ticks < self.cfg.election_ticks

    def _handle_vote(self, src: str, row: VoteRow) -> None:
        up_to_date = ((row.last_epoch, row.end_offset, row.cfg_version)
                      >= (self.cache.last_epoch(), self.end, self.history.latest().version))
        can_vote = (self.vote == src or (self.vote is None and self.leader is None)
                    or (row.pre_vote and row.term > self.term))
        if not self.eligible():
            # RF 2: the candidate is the only other replica and holds every committed entry (a
            # commit needs both), and any term we forgot it knows: safe, whatever our log says.
            # Or the successor a corrupt leader handed over to, in the term after ours: it
            # held everything committed, by our own count (report_corrupt).
            up_to_date = ((len(self.voters) == 2 and src in self.voters)
                          or (self.vouch == (src, row.term) and self.host.confirmed))
        if can_vote and up_to_date:
            if not row.pre_vote:
                self.vote = src
                self._state_changed()
                self.election_elapsed_ticks = 0
            elif self.role is Role.PRE_CANDIDATE and self._placed_before(src):
                self._become_follower(self.term, None)   # rule 2: yield to the voter placed first
            self._send(src, VoteRespRow(self.pid, row.term, _NONE, 1, row.pre_vote))
        else:
            self._send(src, VoteRespRow(self.pid, self.term, _NONE, 0, row.pre_vote))

    def _placed_before(self, peer: str) -> bool:
        voters = self.voters
        return peer in voters and self.node in voters and voters.index(peer) < voters.index(self.node)

    def _step_follower(self, src: str, row: PeerRow, payload: bytes) -> None:
        kind = type(row)
        if kind is AppendRow or kind is HeartbeatRow:
            self.election_elapsed_ticks, self.leader_tick = 0, self.host.now_tick
            self._set_leader(src)
        if kind is AppendRow:
            self._handle_append(src, row, payload)
        elif kind is HeartbeatRow:
            self._set_commit(min(row.commit, self.end, self.agreed))
            self.membership.note_cfg_commit(row.cfg_commit, row.cfg_commit_term)
            follower_log.follow_start(self, row.log_start)
            follower_log.follow_clean(self, row.clean_end, row.clean_horizon)
            self._send(src, HeartbeatRespRow(self.pid, self.term, _NONE, int(self.recovering),
                                             *self.history.latest().ident))
            if row.quiesce and self.commit >= row.commit and not self.recovering and self.cfg.quiesce_after_beats:
                quiescence.quiesce(self)   # rule 10
        elif kind is TimeoutNowRow and self.may_campaign():  # from our leader (rule 8)
            self._campaign(pre=False, transfer=True)
        elif kind is VoteRespRow and self.recovering:
            recovery.confirm_answer(self, src, row)

    def _step_candidate(self, src: str, row: PeerRow, payload: bytes) -> None:
        kind = type(row)
        if kind is AppendRow or kind is HeartbeatRow:
            self._become_follower(self.term, src)  # a leader of our term exists
            self._step_follower(src, row, payload)
        elif kind is VoteRespRow:
            pre = self.role is Role.PRE_CANDIDATE
            if bool(row.pre_vote) != pre:
                return
            if (row.granted and row.term != self.term + (1 if pre else 0)) or src not in self.voters:
                return
            self.votes.setdefault(src, bool(row.granted))
            self._poll()

    def _step_leader(self, src: str, row: PeerRow, payload: bytes) -> None:
        kind = type(row)
        if kind is AppendRespRow:
            self.lead.handle_append_resp(src, row)
        elif kind is HeartbeatRespRow:
            self.lead.handle_heartbeat_resp(src, row)

    # -- the log (mesh.raft.follower_log) and lost state (mesh.raft.recovery) --------------
    def _handle_append(self, src: str, row: AppendRow, payload: bytes) -> None:
        follower_log.handle_append(self, src, row, payload)

    def become_recovering(self, recover_to: int | None = None) -> None:
        recovery.become_recovering(self, recover_to)

    def report_corrupt(self, offset: int) -> None:
        recovery.report_corrupt(self, offset)

    def drop_vouch(self) -> None:
        recovery.drop_vouch(self)

    def trim_cache(self) -> None:
        if self.cache.trim_before(self.host.reader.start_offset(self.pid)):
            self._state_changed()

    def campaign(self) -> None:
        if self.role is not Role.LEADER and self.may_campaign():   # (_campaign wakes a quiet replica)
            self._campaign(pre=self.cfg.pre_vote)

    # -- queries ----------------------------------------------------------------------------
    def isr(self) -> list[str]:
        if self.role is not Role.LEADER:
            return []
        if self.quiesced:
            quiescence.refresh_heard(self)   # a quiet leader's followers are as live as their nodes
        now, lag = self.host.now_tick, self.cfg.isr_lag_ticks
        return [r for r in self.voters if r == self.node or self.progress[r].in_sync(now, lag, self.end)]

    def follower_silence(self) -> dict[str, int]:
        """Leader only ({} elsewhere): ticks since each follower and learner last answered
        (or its node spoke), ``NEVER_HEARD`` if it has not since this leadership began (the
        grace period of check-quorum does not count here) or if it says it is recovering (it
        lost state, or joined and is not refilled yet: it may not vote)."""
        if self.role is not Role.LEADER:
            return {}
        if self.quiesced:
            quiescence.refresh_heard(self)   # as in isr()
        now = self.host.now_tick
        return {n: now - pr.last_resp_tick if pr.heard and not pr.recovering else NEVER_HEARD
                for n, pr in sorted(self.progress.items())}

    def describe(self) -> dict:
        d = {
            "pid": self.pid, "role": self.role.value, "term": self.term, "leader": self.leader,
            "vote": self.vote, "replicas": list(self.replicas), "commit": self.commit,
            "end": self.end, "synced": self.synced, "epoch_cache": [list(e) for e in self.cache.entries()],
            "isr": self.isr(), "recovering": self.recovering, "recover_to": self.recover_to,
            "corrupt_at": self.corrupt_at, "config": self.history.latest().describe(),
            "config_committed": self.membership.config_committed(),
            "leader_tick": self.leader_tick, "quiesced": self.quiesced}
        if self.role is Role.LEADER:
            d["epoch_start"] = self.epoch_start
            d["transfer_to"] = self.transfer_to
            d["followers"] = {peer: self.progress[peer].describe() for peer in self.peers}
        return d
