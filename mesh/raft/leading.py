"""The leader half of one partition replica (a mixin of ``mesh.raft.partition.Partition``):
replication to followers, the commit offset, leadership transfer and local appends.

What a leader knows of each follower is a ``mesh.raft.progress.Progress``; the rules it
follows (see ``mesh.raft.manager``, "Lost state", for why):

- it believes a follower's reports: a rejection that places the point of agreement below
  the follower's ``match`` lowers ``match`` at once (``Progress.lower``), so a follower
  that forgot counts toward neither commit nor the in-sync set until it acks again;
- an answer from another store, or from a new life of the same store, voids what it knew
  (``peer_restarted``: ``match`` back to 0; from another store the probe starts over at
  our log end, from a new life at the old ``match``, which a follower that kept its disk
  acks at once);
- a follower that says it is recovering counts toward neither commit nor the in-sync set
  and is never a transfer target (``Progress.recovering``);
- only the latest config's voters count (commit, in-sync set, write admission, transfer
  targets); learners are replicated to within the node-wide catch-up budget
  (``mesh.raft.configuring``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft.messages import AppendRespRow, AppendRow, HeartbeatRespRow, HeartbeatRow, TimeoutNowRow
from mesh.raft.progress import PROBE, REPLICATE, Progress
from mesh.raft.quorum import committed_offset

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["Leading"]


class Leading:
    """Leader-side methods of ``Partition`` (they use its state: ``self`` is a Partition)."""

    # -- replication -------------------------------------------------------------------------
    def _handle_append_resp(self: Partition, src: str, row: AppendRespRow) -> None:
        pr = self.progress.get(src)
        if pr is None:
            return
        now = self.host.now_tick
        pr.last_resp_tick = now
        pr.heard = True
        self._note_recovering(pr, row.recovering)
        self._note_config_id(pr, row.cfg_version, row.cfg_term)
        if row.ok:
            m = row.offset
            if m > self.end:
                return  # cannot be an answer to this leader
            if pr.maybe_update(m):
                self._maybe_commit()
            if pr.state == PROBE:
                pr.become_replicate()
                if not self.epoch_committed:
                    self._maybe_commit()
            elif m < row.hint_end and m == pr.match:
                pr.become_probe(m)  # a partial ack: resend from where its log stops
            if pr.match >= self.end:
                pr.caught_up_tick = now
                if self.transfer_to == src:
                    self._maybe_send_timeout_now()
        else:
            rejected = row.offset
            nxt = min(row.hint_end, self.cache.end_for_epoch(row.hint_epoch, self.end))
            if nxt >= rejected:
                # No progress (exact epoch caches always make some): the disagreement is at
                # our log start. Probe below it, which restarts the follower's log there.
                nxt = -1
            if nxt < pr.match:
                # The follower's log agrees with ours only below what it acked: it forgot
                # (a lost or rolled-back disk). Believe it, whatever the probe state.
                pr.lower(nxt)
            elif pr.stale_rejection(rejected):
                return
            else:
                pr.become_probe(min(max(nxt, pr.match), self.end))
        self.host.want_flush(self)

    def _handle_heartbeat_resp(self: Partition, src: str, row: HeartbeatRespRow) -> None:
        pr = self.progress.get(src)
        if pr is None:
            return
        now = self.host.now_tick
        pr.last_resp_tick = now
        pr.heard = True
        self._note_recovering(pr, row.recovering)
        self._note_config_id(pr, row.cfg_version, row.cfg_term)
        if pr.state == PROBE:
            pr.probe_sent = False  # the probe or its answer may be lost: retry
        elif (pr.recovering or pr.config_id != self.history.latest().ident) and not pr.inflight:
            # it waits for an append to show it caught up, or to carry our config markers
            # (an idle partition sends none)
            pr.become_probe(min(pr.match, self.end))
        elif (oldest := pr.oldest_sent_tick()) is not None and now - oldest >= self.cfg.retransmit_ticks:
            pr.become_probe(pr.match)  # lost in flight: resend from what it acknowledged
        else:
            return
        self.wake()   # (it needs something: a quiet leader wakes)
        self.host.want_flush(self)

    def _note_recovering(self: Partition, pr: Progress, flag: int) -> None:
        recovering = bool(flag)
        if recovering != pr.recovering:
            pr.recovering = recovering
            if recovering:
                pr.caught_up_tick = -(1 << 62)
            else:
                self._maybe_commit()

    def peer_restarted(self: Partition, peer: str, store: str, new_store: bool) -> None:
        """``peer`` answered from another store (``new_store``) or a new life of its store."""
        pr = self.progress.get(peer) if self.role.value == "leader" else None
        if pr is None:
            return
        pr.forget(self.end if new_store else min(pr.match, self.end))
        pr.store = store
        self.host.want_flush(self)

    def _maybe_commit(self: Partition) -> None:
        if self.role != "leader":
            return
        held = [self.synced] if self.node in self.voters else []
        progress = self.progress
        for v in self.voters:
            pr = progress.get(v)
            if pr is not None and not pr.recovering:   # (Progress.counted)
                held.append(pr.match)
        commit = committed_offset(held, self.epoch_start, self.quorum)
        if commit is not None:
            self._set_commit(commit)
        if not self.epoch_committed:  # a quorum acked our marker in this term (config changes wait for it)
            acked = sum(1 for v in self.voters if v != self.node and (pr := self.progress.get(v)) is not None
                        and pr.counted() and pr.state == REPLICATE and pr.match >= self.epoch_start)
            self.epoch_committed = acked + (self.node in self.voters) >= self.quorum
        self._check_config_commit()

    def send_appends(self: Partition) -> None:
        """Called by the manager's flush: fill every follower's pipeline."""
        if self.role != "leader":
            return
        cfg, host = self.cfg, self.host
        ctx = None   # what every row of this call shares, looked up once (when a row is due)
        for peer in self.peers:
            pr = self.progress[peer]
            learner = peer not in self.voters and cfg.learner_bytes_per_tick > 0   # throttled
            if pr.state == REPLICATE:
                while pr.next < self.end and pr.can_send(cfg.max_inflight_msgs, cfg.max_inflight_bytes):
                    if learner and host.learner_budget <= 0:
                        host.starved(self)  # catch-up waits for the next tick's budget
                        break
                    if ctx is None:
                        ctx = self._append_ctx()
                    if self._send_append(peer, pr, True, ctx) < 0:
                        break  # fell behind our log start: now probing
            if pr.state == PROBE and not pr.probe_sent:
                data = pr.next == pr.match and not (learner and host.learner_budget <= 0)
                if ctx is None:
                    ctx = self._append_ctx()
                pr.probe_prev = self._send_append(peer, pr, data, ctx)
                pr.probe_sent = True

    def _append_ctx(self: Partition) -> tuple[int, tuple[int, int], tuple[int, int]]:
        """(log start, committed config id, latest config id): the same for every append
        row of one ``send_appends``."""
        return self.host.reader.start_offset(self.pid), self.cfg_commit_ident(), self.history.latest().ident

    def _send_append(self: Partition, peer: str, pr: Progress, data: bool,
                     ctx: tuple[int, tuple[int, int], tuple[int, int]]) -> int:
        """Send one append row from ``pr.next`` (``ctx``: ``_append_ctx()``); returns its
        prev_offset, or -1 when nothing was sent (switched to probing, or the reader cannot
        see the data yet)."""
        start, (cv, ct), latest = ctx
        prev = pr.next
        if prev < start:
            if pr.state != PROBE:
                pr.become_probe(prev)
                return -1
            row = AppendRow(self.pid, self.term, start, self.cache.epoch_at(start - 1), start, 0,
                            self.epoch_start, self.commit, 0, 1, cv, ct, self.history.window(start, start),
                            min(start, self.commit))
            self._send(peer, row)
            return start
        prev_epoch = self.cache.epoch_at(prev - 1) if prev > 0 else 0
        payload, end, epoch = b"", prev, 0
        if data and prev < self.end:
            epoch = self.cache.epoch_at(prev)
            to = self.cache.end_for_epoch(epoch, self.end)
            limit = self.cfg.max_append_bytes
            if self.cfg.learner_bytes_per_tick > 0 and peer not in self.voters:
                limit = max(1, min(limit, self.host.learner_budget))   # at least one batch: the rest is debt
            payload, end = self.host.reader.read(self.pid, prev, to, limit)
            assert prev <= end <= to and (end > prev) == (len(payload) > 0), (self.pid, prev, end, to)
            if end == prev:  # staged where the reader cannot see it yet: the next flush sends it
                self.host.want_flush(self)
                if pr.state == REPLICATE:
                    return -1
                epoch = 0
            payload = bytes(payload)
        row = AppendRow(self.pid, self.term, prev, prev_epoch, end, epoch, self.epoch_start,
                        self.commit, len(payload), 0, cv, ct,
                        self.history.window(prev, end) if pr.config_id != latest else [], min(start, self.commit))
        self._send(peer, row, payload)
        if payload and self.cfg.learner_bytes_per_tick > 0 and peer not in self.voters:
            self.host.learner_budget -= len(payload)   # may go below 0: repaid by the next ticks
        if pr.state == REPLICATE:
            pr.sent(end, len(payload), self.host.now_tick)
        return prev

    def heartbeat(self: Partition) -> None:
        """The node-wide beat; the last one before going quiet says so (rule 10)."""
        cv, ct = self.cfg_commit_ident()
        quiesce = self._may_quiesce()
        start = self.host.reader.start_offset(self.pid)
        for peer in self.peers:
            pr = self.progress[peer]
            self._send(peer, HeartbeatRow(self.pid, self.term, min(self.commit, pr.match), cv, ct, int(quiesce),
                                          start))
        if quiesce:
            self._quiesce()

    def _may_quiesce(self: Partition) -> bool:
        """Rule 10 of ``mesh.raft.partition``: idle for ``quiesce_after_beats`` beats and
        nothing a tick would do (catch-up, commit, transfer, config change, hand-back)."""
        if not self.cfg.quiesce_after_beats:
            return False
        start = self.host.reader.start_offset(self.pid)
        if self.end != self.beat_end or start != self.beat_start:
            self.beat_end, self.beat_start, self.idle_beats = self.end, start, 0
            return False   # (a moved log start too: the followers hear it for a few beats)
        self.idle_beats += 1
        if (self.idle_beats < self.cfg.quiesce_after_beats or self.transfer_to is not None
                or self.commit != self.end or self.synced != self.end or not self.epoch_committed
                or not self.config_committed() or self.history.latest().learners or self.node not in self.voters):
            return False
        now, window, latest = self.host.now_tick, self.cfg.election_ticks, self.history.latest().ident
        heard = self.host.heard_tick
        caught_up = 1
        for peer, pr in self.progress.items():
            if not pr.active(now, window) and now - heard(peer) >= window:
                continue   # its node is silent: left behind (woken when it is heard again)
            # its node is alive: its replica must hold everything (else it may be waiting for
            # a probe that got lost, which only a ticking leader resends)
            if (pr.match < self.end or pr.recovering or pr.state != REPLICATE or pr.inflight
                    or pr.config_id != latest):
                return False
            caught_up += 1
        if caught_up < self.quorum:
            return False   # check-quorum must be able to act
        preferred = self.voters[0]
        if self.cfg.auto_rebalance and preferred != self.node:
            pr = self.progress[preferred]
            if not pr.recovering and (pr.active(now, window) or now - heard(preferred) < window):
                return False   # a hand-back will be due (_tick_leader); quiet only while it is away
        return True

    # -- leadership transfer ---------------------------------------------------------------------
    def transfer_leadership(self: Partition, target: str) -> None:
        """Stop taking appends; once ``target`` holds our whole log, tell it to campaign
        (TimeoutNow). Abandoned after an election timeout. Never to a recovering replica."""
        if (self.role.value != "leader" or target == self.node or target not in self.voters
                or self.progress[target].recovering):
            return
        self.wake()
        self.transfer_to = target
        self.transfer_elapsed_ticks = 0
        self._maybe_send_timeout_now()

    def hand_over(self: Partition, exclude: frozenset[str] | set[str] = frozenset(),
                  new: frozenset[str] | set[str] = frozenset()) -> None:
        """Controlled shutdown: hand leadership to the best successor (``_best_successor``)
        among the voters that answered within the last two heartbeats, none in ``exclude``,
        those in ``new`` (lives just begun) last; a no-op if there is none, if we do not
        lead, or while a handover is in progress."""
        if self.role.value != "leader" or self.transfer_to is not None:
            return
        self.wake()
        target = self._best_successor(2 * self.cfg.heartbeat_ticks + 1, exclude, new)
        if target is not None:
            self.transfer_leadership(target)

    def _maybe_send_timeout_now(self: Partition) -> None:
        target = self.transfer_to
        if target is not None and self.progress[target].match >= self.end:
            self._send(target, TimeoutNowRow(self.pid, self.term))

    def _best_successor(self: Partition, window: int | None = None, exclude: frozenset[str] | set[str] = frozenset(),
                        new: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The most caught-up voter that answered within ``window`` ticks (an election
        timeout by default) and is not recovering, none in ``exclude``, those in ``new``
        last (corruption hand-over, controlled shutdown)."""
        now, window = self.host.now_tick, window or self.cfg.election_ticks
        best = [(peer not in new, pr.match, peer) for peer, pr in self.progress.items()
                if not pr.recovering and pr.active(now, window) and peer in self.voters and peer not in exclude]
        return max(best)[2] if best else None

    # -- local appends ---------------------------------------------------------------------------
    def append_position(self: Partition) -> tuple[int, int]:
        if self.role != "leader" or self.transfer_to is not None:
            # a hint names an elected leader only: clients retry at a hint at once (a transfer
            # target that has not won yet would answer NOT_LEADER again, and back them off)
            hint = None if self.role == "leader" else self.leader
            raise MeshError(ErrorCode.NOT_LEADER, f"partition {self.pid}: not the leader", leader=hint)
        self.wake()   # a write is coming
        now, window = self.host.now_tick, 3 * self.cfg.heartbeat_ticks + 1
        voters = [self.progress[v] for v in self.voters if v != self.node]
        if 1 + sum(1 for pr in voters if pr.counted() and pr.active(now, window)) < self.quorum:
            raise MeshError(ErrorCode.NOT_ENOUGH_REPLICAS,
                            f"partition {self.pid}: the leader has not heard from a quorum of "
                            f"{self.quorum} replicas (not recovering) recently")
        return self.end, self.term

    def leader_append(self: Partition, end_offset: int, epoch: int) -> None:
        leading = self.role == "leader"
        if not leading or epoch != self.term:
            raise MeshError(ErrorCode.FENCED_EPOCH if leading else ErrorCode.NOT_LEADER,
                            f"partition {self.pid}: append for epoch {epoch}, leader epoch is "
                            f"{self.term if leading else 'not here'}", leader=self.leader)
        if end_offset <= self.end:
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"partition {self.pid}: append ends at {end_offset}, log end is {self.end}")
        self.end = end_offset   # (append_position, asked first in the same turn, woke a quiet leader)
        self.host.want_flush(self)

    def mark_synced(self: Partition, end_offset: int) -> None:
        if end_offset > self.synced:
            self.synced = min(end_offset, self.end)
            self._maybe_commit()
