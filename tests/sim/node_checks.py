"""The node-level simulation's checkers (a mixin of ``NodeSim``, tests/sim/node_sim.py).

Called as things happen: ``_check_send`` on every peer message as it leaves a broker (the
shell contract: after the turn's successful commit, claiming only what is durable; a
leader's appends alone may leave before it, ``_check_early_append``),
``_check_rebuilt`` after a failed commit, ``_published`` on every leadership a host
publishes (election safety), ``_check_ack`` when a broker answers a produce request with
success (the batch is on a quorum, durably, at that offset; checked as the answer leaves:
a disk lost while it travels does not make it wrong), ``_acked`` when the producer takes it. At the end, ``_check_final_logs``: identical replicas,
every acknowledged batch present and read by the consumer, no batch twice, send order.
"""
from __future__ import annotations

from mesh.raft.messages import AppendRespRow, ReplAppend, VoteRespRow, VoteRow, parse_rows
from mesh.wire.messages import ProduceResponse
from mesh.wire.records import decode_batch, iter_batches
from tests.sim.node_parts import Broker, Producer, SimBatch, SimStore

__all__ = ["NodeChecks"]


class NodeChecks:
    """Checkers; the simulation provides ``fail``, ``brokers``, ``replicas``, ``pid_of``,
    ``quorum``, ``canon``, ``requests``, ``leader_of_epoch``, ``producers``, ``consumers``, ``counts``."""

    # -- as things happen ------------------------------------------------------------------
    def _published(self, b: Broker, pid: int, leader: str | None, epoch: int) -> None:
        if leader == b.id:
            other = self.leader_of_epoch.setdefault((pid, epoch), b.id)
            if other != b.id:
                self.fail(f"election safety: partition {pid} epoch {epoch} has leaders {other} and {b.id}")

    def _check_send(self, b: Broker, dest: str, msg, payload: bytes | None) -> None:
        st = b.store
        ok_before, failed_before = b.turn_commits
        what = f"shell contract: {b.id} sent {type(msg).__name__} to {dest}"
        if not b.in_turn:
            self.fail(f"{what} outside a turn")
        if st.commits_ok == ok_before and st.commits_failed == failed_before:
            if isinstance(msg, ReplAppend):   # a leader's appends may leave before the turn's commit
                self._check_early_append(b, what, msg, payload)
                return
            self.fail(f"{what} before the turn's commit")
        if st.commits_failed != failed_before:
            self.fail(f"{what} in a turn whose commit failed")
        for row in parse_rows(msg):
            term, vote = st.state(row.pid)
            pre = isinstance(row, (VoteRow, VoteRespRow)) and row.pre_vote
            if not pre and row.term > term:
                self.fail(f"{what}: partition {row.pid} term {row.term}, but term {term} is durable")
            if row.term < term:
                continue  # the same turn durably moved to a newer term: nothing more happens in this one
            if isinstance(row, VoteRespRow) and row.granted and not pre and (term, vote) != (row.term, dest):
                self.fail(f"{what}: a vote for {dest} in term {row.term}, durable: term {term} vote {vote}")
            if isinstance(row, VoteRow) and not pre and (term, vote) != (row.term, b.id):
                self.fail(f"{what}: asks votes for term {row.term}, durable: term {term} vote {vote}")
            if isinstance(row, AppendRespRow) and row.ok and row.offset > st.durable_end.get(row.pid, 0):
                self.fail(f"{what}: acks partition {row.pid} up to {row.offset}, "
                          f"durable up to {st.durable_end.get(row.pid, 0)}")
        if isinstance(msg, ReplAppend):
            at = 0
            for row in parse_rows(msg):   # the payload holds each row's batches, in row order
                for h, mv in iter_batches(payload[at:at + row.payload_bytes]):
                    if st.durable_batch(row.pid, h.base_offset) != bytes(mv):
                        self.fail(f"{what}: carries partition {row.pid}'s batch at {h.base_offset}, "
                                  f"which is not durable there")
                at += row.payload_bytes

    def _check_early_append(self, b: Broker, what: str, msg, payload: bytes | None) -> None:
        """An append leaving before the turn's commit: from the leader of a durable term
        (durably voted for itself in it), with the batches this broker holds now (staged
        this turn or durable). It claims nothing durable of the leader: the leader counts
        its own copy only after its sync, so a commit never rests on these bytes alone."""
        st, at = b.store, 0
        for row in parse_rows(msg):
            if st.state(row.pid) != (row.term, b.id):
                self.fail(f"{what} before the turn's commit: partition {row.pid} term {row.term}, but "
                          f"durable (term, vote) is {st.state(row.pid)}")
            if [row.term, row.epoch_start] not in st.epoch_cache(row.pid):
                self.fail(f"{what} before the turn's commit: partition {row.pid} epoch {row.term} from "
                          f"{row.epoch_start}, not in the durable epoch cache {st.epoch_cache(row.pid)}")
            for h, mv in iter_batches(payload[at:at + row.payload_bytes]):
                if st.held_batch(row.pid, h.base_offset) != bytes(mv):
                    self.fail(f"{what} before the turn's commit: carries partition {row.pid}'s batch at "
                              f"{h.base_offset}, which this broker does not hold")
            at += row.payload_bytes
        self.counts["early_appends"] += 1

    def _check_rebuilt(self, b: Broker, old_core) -> None:
        h, st = b.host, b.store
        if h.core is old_core:
            self.fail(f"{b.id}: the commit failed but the replication core was not rebuilt")
        for pid in st.pids:
            s = h.core.state(pid)
            if (s.term, s.vote) != st.state(pid) or h.core.end_offset(pid) != st.durable_end[pid]:
                self.fail(f"{b.id}: after a failed commit partition {pid} has term {s.term} vote {s.vote} "
                          f"end {h.core.end_offset(pid)}; the store: {st.state(pid)} end {st.durable_end[pid]}")

    def _check_ack(self, b: Broker, cid: str, rid: int, msg) -> None:
        """A broker answers a produce request (always acks=all here) with success: the batch
        must be durable on a quorum of replicas, at the offset the answer names. A replica
        whose disk was lost since counts if the lost disk had it (its ack may have reached
        the leader's inbox before the loss: no protocol can take that back)."""
        if not isinstance(msg, ProduceResponse) or msg.error or msg.base_offset < 0:
            return
        p, raw, label = self.requests[(cid, rid)]
        pid, base = self.pid_of[p], msg.base_offset
        holders = [nid for nid in self.replicas[p]
                   if any((got := store.durable_batch(pid, base)) is not None and got[12:] == raw[12:]
                          for store in [self.brokers[nid].store] + self.brokers[nid].lost_stores)]
        if len(holders) < self.quorum:
            self.fail(f"{b.id} acknowledged {label} at {p}:{base}, but it is durable only on {holders}")

    def _acked(self, c: Producer, p: int, batch: SimBatch, base: int) -> None:
        """The producer's sequencer finished a batch (base -1: the broker said it was stored
        before but no longer knew where; the final check finds it)."""
        batch.acked_at = base
        c.acked.append((p, batch, base))
        self.counts["acked"] += 1
        seen = self.canon[p].get(base)
        if seen is not None and seen[12:] != batch.raw[12:]:
            self.fail(f"{c.id}: {batch.label} acknowledged at {p}:{base}, where a fetch read another batch")

    # -- the final logs --------------------------------------------------------------------
    def _check_final_logs(self) -> None:
        for p in range(self.cfg.partitions):
            pid = self.pid_of[p]
            logs = {nid: self._read_all(self.brokers[nid].store, pid) for nid in self.replicas[p]}
            first = logs[self.replicas[p][0]]
            for nid, log in logs.items():
                if log != first:
                    self.fail(f"partition {p}: replica {nid}'s log differs from {self.replicas[p][0]}'s")
            where: dict[str, int] = {}
            last_n: dict[str, int] = {}
            for base, raw in first:
                _, values, _, _, _ = decode_batch(raw)
                label = values[0].decode().rpartition("/r")[0]
                if label in where:
                    self.fail(f"partition {p}: {label} is in the log twice, at {where[label]} and {base}")
                where[label] = base
                client, _, n = label.rpartition("/n")
                if int(n) <= last_n.get(client, -1):
                    self.fail(f"partition {p}: {label} at {base} is after batch n{last_n[client]} (order)")
                last_n[client] = int(n)
            consumer = self.consumers[f"k{p}"]
            for c in self.producers.values():
                for q, batch, base in c.acked:
                    at = where.get(batch.label, -2) if base < 0 else base
                    if q == p and (where.get(batch.label) != at or consumer.seen.get(at, b"")[12:] != batch.raw[12:]):
                        self.fail(f"partition {p}: acknowledged {batch.label} at {base} is not in the final "
                                  f"log there, or the consumer did not read it")

    @staticmethod
    def _read_all(store: SimStore, pid: int) -> list[tuple[int, bytes]]:
        out, at, end = [], store.log_start(pid), store.durable_end[pid]
        while at < end:
            chunks = store.read(pid, at, 1 << 16, end)
            for c in chunks:
                h = next(iter_batches(c))[0]
                out.append((h.base_offset, bytes(c)))
                at = h.next_offset
        return out
