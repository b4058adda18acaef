"""Controlled shutdown (Kafka's), then a lame-duck spell (NATS's): a stopping broker's turns.

After the first stop signal, each turn starts a handover of every partition led here that
has a caught-up, answering replica on a live broker (``ReplicaHost.hand_over_all``, at
most 3 per partition: an abandoned one is tried again), until none is led or in progress,
or ``handover_ms`` has passed. Producers meanwhile are held and then sent to the new
leader (``DataPath._hold``). Then the broker serves ``LAME_DUCK_MS`` more (at most
``handover_ms``), so clients that come to it meanwhile are pointed to the new leaders (at
once: KIP-951) rather than finding it gone: a rolling restart costs them milliseconds, not
an election timeout. A second signal, or ``handover_ms`` 0, stops at the end of the turn.
"""
from __future__ import annotations

import logging

log = logging.getLogger("mesh.node.lifecycle.shutdown")

LAME_DUCK_MS = 500     # leaderships handed over: clients redirected this long
LINGER_MS = 200        # the answers of the last turn still go out


class Shutdown:
    def __init__(self, node_id: str, replicas, handover_ms: int) -> None:
        self.node_id, self.replicas, self.handover_ms = node_id, replicas, handover_ms
        self.asked = 0                      # signals seen
        self.handovers: dict[int, int] = {}   # pid -> handovers started while stopping
        self.linger_ms = 0
        self._since_ms: int | None = None
        self._lame_duck_until_ms: int | None = None

    def ask(self) -> bool:
        """A stop signal: True if the broker stops at the end of this turn."""
        self.asked += 1
        return self.asked > 1 or self.handover_ms <= 0

    def turn(self, now_ms: int, gone: set[str]) -> bool:
        """One stopping turn (``gone``: brokers not alive); True once the broker may stop."""
        if self._since_ms is None:
            self._since_ms = now_ms
            log.info("node %s stopping: handing over the %d partitions it leads (at most %d ms)",
                     self.node_id, len(self.replicas.leaders()), self.handover_ms)
        if self._lame_duck_until_ms is not None:   # handed over: redirecting clients a little longer
            if now_ms >= self._lame_duck_until_ms:
                self.linger_ms = LINGER_MS
                return True
            return False
        busy = self.replicas.hand_over_all(gone, self.handovers)
        if not busy or now_ms - self._since_ms >= self.handover_ms:
            still = self.replicas.leaders()
            log.log(logging.WARNING if busy else logging.INFO,
                    "node %s handed over %d partitions in %d ms; still leading %d", self.node_id,
                    sum(1 for pid in self.handovers if pid not in still), now_ms - self._since_ms, len(still))
            self._lame_duck_until_ms = now_ms + min(LAME_DUCK_MS, self.handover_ms)
        return False
