"""Membership change in one partition replica (``Configuring``, held by
``mesh.raft.partition.Partition`` as ``members``): which config is in force, the leader's
config changes and when a config is committed.
Configs, histories and the allowed steps are ``mesh.raft.membership``.

Rules (the partition's rule 9):

- A replica uses the latest config in its log. Its voters make every quorum: commit,
  check-quorum, ``append_position``, the ISR and elections (votes are asked of them, and
  only theirs count). Learners get appends (probe / replicate like followers, catch-up
  bounded by the node-wide ``learner_bytes_per_tick``) but never count, never campaign and
  are never transfer targets. A replica whose latest config does not name it as a voter
  never campaigns (it is a learner, or being removed: the shell drops it). Any replica
  may grant a vote; the log comparison is (last epoch, end offset, config version).
  Rows from nodes outside our config are stepped: our config may lag the sender's.
- Followers: an accepted append's carried markers replace ours in its window; a
  truncation drops markers past the cut. They learn which config is committed from the
  leader's rows (``cfg_commit``: a config id, taken only if our history holds that one).
- Leader: ``propose_config`` records the next config at its log end, once its epoch
  marker is committed (a quorum holds it: Ongaro's fix) and its latest config is; its
  progress entries follow its latest config's members. Append and heartbeat answers carry
  each follower's latest config id; the latest config is committed once a majority of ITS
  voters (the leader included) report it and the commit offset is at or past its marker.
  A follower reporting another id gets the markers carried (and, idle, a probe), so an
  idle partition converges. The preferred leader is ``voters[0]``.
- Joining: a replica added with a config and no persisted state starts *recovering* (the
  partition's rule 6): it may have been a member before, removed and dropped, and voted
  in terms it no longer remembers; it grants no vote until a leader refilled it, then
  records a vote for that leader (found by the reconfiguration simulator: a re-added
  replica voting twice in one term elected two leaders).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft.membership import Config, History, check_step
from mesh.raft.progress import REPLICATE, Progress
from mesh.raft.quorum import majority
from mesh.raft.roles import Role

if TYPE_CHECKING:
    from mesh.raft.partition import Partition

__all__ = ["Configuring"]


class Configuring:
    """The membership of one replica (``Partition.members``; ``p``: the partition): which
    config is in force, which one is known to be committed, and the leader's changes. It
    sets the partition's ``voters``, ``replicas``, ``peers`` and ``quorum``, which every
    role reads."""

    def __init__(self, p: Partition, history: History) -> None:
        self.p = p
        self.history = history
        markers = history.markers()
        latest = history.latest()
        # configs before the latest are committed (one change at a time); the latest is
        # known to be once a leader says so (or it is the initial one)
        self.cfg_commit_version = markers[-2][1].version if len(markers) > 1 else max(0, latest.version - 1)

    @property
    def role(self) -> Role:
        return self.p.role

    @property
    def commit(self) -> int:
        return self.p.commit

    def use_config(self) -> None:
        """Adopt the latest config of the history (a leader adds and drops progress)."""
        p = self.p
        c = self.history.latest()
        p.voters = c.voters
        p.replicas = c.members
        p.peers = tuple(r for r in c.members if r != p.node)
        p.quorum = majority(len(c.voters))
        if self.role.value == "leader":
            self.sync_progress()
        p.host.config_changed(p)

    def config_updated(self) -> None:
        p = self.p
        self.use_config()
        p._state_changed()

    def committed_config(self) -> Config:
        return self.history.committed(self.cfg_commit_version)

    def config_committed(self) -> bool:
        """The latest config is known to be committed."""
        return self.history.latest().version <= self.cfg_commit_version

    def _cfg_committed_now(self, version: int) -> None:
        p = self.p
        self.cfg_commit_version = version
        if self.history.trim(version):
            p._state_changed()
        p.host.config_changed(p)

    def note_cfg_commit(self, version: int, term: int) -> None:
        """The leader says config (version, term) is committed: so is ours, if it is that one."""
        if version > self.cfg_commit_version:
            for _, c in self.history.markers():
                if c.ident == (version, term):
                    self._cfg_committed_now(version)
                    return

    # -- leader ------------------------------------------------------------------------------
    def sync_progress(self) -> None:
        """Progress entries for exactly the latest config's members but us."""
        p = self.p
        now = p.host.now_tick
        for peer in p.peers:
            if peer not in p.progress:
                pr = p.progress[peer] = Progress(p.end, now)
                pr.store = p.host.peer_stores.get(peer)
        for peer in [x for x in p.progress if x not in p.peers]:
            del p.progress[peer]
        if p.transfer_to is not None and p.transfer_to not in p.voters:
            p.lead.transfer_to = None

    def note_config_id(self, pr: Progress, version: int, term: int) -> None:
        ident = (version, term)
        if pr.config_id != ident:
            pr.config_id = ident
            self._check_config_commit()

    def _check_config_commit(self) -> None:
        p = self.p
        c = self.history.latest()
        if (c.version <= self.cfg_commit_version or self.role != "leader"
                or self.commit < self.history.latest_offset()):
            return
        have = 0
        for v in c.voters:
            pr = p.progress.get(v)
            if v == p.node or (pr is not None and pr.config_id == c.ident and pr.counted()):
                have += 1
        if have >= majority(len(c.voters)):
            self._cfg_committed_now(c.version)

    def cfg_commit_ident(self) -> tuple[int, int]:
        """The committed config's id for our rows; (0, 0), which no follower takes, when the
        history holds no marker known to be committed (a joiner's single, uncommitted one)."""
        c = self.committed_config()
        return c.ident if c.version <= self.cfg_commit_version else (0, 0)

    def propose_config(self, voters: tuple[str, ...], learners: tuple[str, ...]) -> None:
        """Record the next config (one single-server step) at our log end."""
        p = self.p
        if self.role.value != "leader":
            raise MeshError(ErrorCode.NOT_LEADER, f"partition {p.pid}: not the leader", leader=p.leader)
        p.wake()
        latest = self.history.latest()
        why = None
        if not self.config_committed():
            why = f"config version {latest.version} is not committed yet (one change at a time)"
        elif not p.epoch_committed:
            why = "the leader's epoch marker is not committed yet"
        elif p.transfer_to is not None:
            why = f"a leadership transfer to {p.transfer_to} is in progress"
        elif len(voters) + len(learners) > p.cfg.max_replicas:
            why = f"at most {p.cfg.max_replicas} replicas"
        elif any(not isinstance(n, str) or not 0 < len(n) <= 255 for n in voters + learners):
            why = "node ids are strings of 1..255 characters"
        else:
            why = check_step(latest, voters, learners, p.node)
        if why is not None:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"partition {p.pid}: {why}")
        self.history.append(p.end, Config(latest.version + 1, p.term, voters, learners))
        self.config_updated()
        for pr in p.progress.values():
            if pr.state == REPLICATE and not pr.inflight:
                pr.become_probe(min(pr.match, p.end))  # carries the new marker now, even when idle
        p.host.want_flush(p)
        # the quorum may have shrunk with nothing left to ack (a voter removed from two, the
        # marker at a log end we synced already): count again now, or the config stays
        # uncommitted until the next write
        p._maybe_commit()
