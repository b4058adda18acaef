"""The node-level simulation's clients (a mixin of ``NodeSim``, tests/sim/node_sim.py).

Producers drive the real sans-I/O ``Sequencer`` (acks=all, a producer id: retries are the
idempotent producer's) and send to the broker they believe leads, learning from NOT_LEADER
hints; a request unanswered for ``REQUEST_TIMEOUT_MS`` is retried. One consumer per
partition long-polls its leader from the offset it reached and checks what it reads.
Every frame is built with ``mesh.wire.codec.pack`` and travels the simulated network.
"""
from __future__ import annotations

from mesh.client.sequencer import RETRY
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, pack, unpack
from mesh.wire.records import encode_batch, iter_batches
from tests.sim.node_parts import REQUEST_TIMEOUT_MS, TOPIC, Consumer, Producer, SimBatch

__all__ = ["NodeClients"]


class NodeClients:
    """Client behaviour; the simulation provides ``net``, ``rng``, ``brokers``, ``replicas``,
    ``canon``, ``requests``, ``counts``, ``fail`` and ``_acked`` (a checker)."""

    # -- producers -------------------------------------------------------------------------
    def _new_batch(self, c: Producer, p: int) -> None:
        n = c.appended.get(p, 0)
        c.appended[p] = n + 1
        label = f"{c.id}/p{p}/n{n}"
        values = [f"{label}/r{i}".encode() for i in range(self.rng.randint(1, 4))]
        c.seq.append((TOPIC, p), SimBatch(label, values, self.net.now))
        self.counts["produced"] += 1
        self._pump_producer(c)

    def _guess(self, current: str | None, p: int) -> str:
        if current is not None:
            return current
        return self.rng.choice(self.replicas[p])

    def _pump_producer(self, c: Producer) -> None:
        now = self.net.now
        for (_, p), _, _ in c.seq.expire(now, REQUEST_TIMEOUT_MS):
            c.leader.pop(p, None)
            self.counts["retries"] += 1
        for tp in c.seq.partitions():
            p = tp[1]
            while (batch := c.seq.next_to_send(tp, now)) is not None:
                dest = c.leader[p] = self._guess(c.leader.get(p), p)
                c.seq.assign(tp, batch)
                batch.raw = encode_batch(batch.values, timestamps_ms=batch.ts, producer_id=batch.producer_id,
                                         base_sequence=batch.seq)
                c.rid += 1
                self.requests[(c.id, c.rid)] = (p, batch.raw, batch.label)
                c.seq.sent(tp, batch, c.rid, now, dest)
                self.net.send(c.id, dest, pack(PROTOCOL_CLIENT, c.rid, m.ProduceRequest(TOPIC, p, -1, 1_000),
                                               batch.raw), once=True)   # (see the module doc of node_sim)
        for done in c.seq.take_done():
            p = done.tp[1]
            if done.error is None:
                self._acked(c, p, done.batch, done.base_offset)
            else:
                c.failed.append((p, done.batch, str(done.error)))

    def _producer_reply(self, c: Producer, frames: list) -> None:
        _, rid, msg, _ = unpack(frames)
        out = c.seq.on_reply(rid, msg.error, self.net.now, base_offset=getattr(msg, "base_offset", -1),
                             message=msg.message, leader=msg.leader,
                             rejected=isinstance(msg, m.ErrorResponse))   # as the Producer does (rule 8)
        if out is not None and out.action == RETRY:
            p = out.tp[1]
            self.counts["retries"] += 1
            if msg.leader is not None and msg.leader in self.brokers:
                c.leader[p] = msg.leader
            else:
                c.leader.pop(p, None)
        if out is not None:
            self._pump_producer(c)

    # -- consumers -------------------------------------------------------------------------
    def _pump_consumer(self, k: Consumer) -> None:
        now = self.net.now
        if k.waiting is not None and now - k.waiting[1] < REQUEST_TIMEOUT_MS:
            return
        if k.waiting is not None:
            k.leader = None
        k.leader = self._guess(k.leader, k.partition)
        k.rid += 1
        k.waiting = (k.rid, now)
        req = m.FetchRequest([[TOPIC, k.partition, k.offset, 1500]], max_wait_ms=self.rng.choice((0, 40, 200)))
        self.net.send(k.id, k.leader, pack(PROTOCOL_CLIENT, k.rid, req), once=True)

    def _consumer_reply(self, k: Consumer, frames: list) -> None:
        _, rid, msg, payload = unpack(frames)
        if k.waiting is None or rid != k.waiting[0]:
            return  # a late or duplicated answer
        k.waiting = None
        if isinstance(msg, m.ErrorResponse):
            k.leader = msg.leader if msg.leader in self.brokers else None
            return
        (_, _, error, hw, _, nbytes, leader), = msg.parts
        if error:
            k.leader = leader if leader in self.brokers else None
            return
        canon = self.canon[k.partition]
        for h, mv in iter_batches(payload or b""):
            raw = bytes(mv)
            if h.base_offset != k.offset:
                self.fail(f"{k.id}: fetched a batch at {h.base_offset}, expected {k.offset}")
            if h.next_offset > hw:
                self.fail(f"{k.id}: fetched {h.base_offset}..{h.next_offset} past the high watermark {hw}")
            if canon.setdefault(h.base_offset, raw) != raw:
                self.fail(f"{k.id}: offset {h.base_offset} of partition {k.partition} changed after commit")
            k.seen[h.base_offset] = raw
            k.offset = h.next_offset
            self.counts["fetched"] += 1
        self._pump_consumer(k)
