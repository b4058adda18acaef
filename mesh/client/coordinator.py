"""Finding a consumer group's coordinator, and following it when it moves.

Any broker answers ``GROUP_FIND_COORDINATOR``; the answer is remembered until the
coordinator says COORDINATOR_MOVED (with a hint) or stops answering. Used by the member
(``mesh.client.group``) and by ``GroupAdmin`` (``mesh.client.group_admin``).
"""
from __future__ import annotations

import logging
import time

from mesh.client.cluster import ClusterView
from mesh.client.transport import Transport
from mesh.cluster.liveness import row_is_up
from mesh.groups import GroupFindCoordinator
from mesh.wire.errors import ErrorCode, MeshError, retriable

__all__ = ["Coordinator", "MOVED"]

log = logging.getLogger("mesh.group")

MOVED = (ErrorCode.COORDINATOR_MOVED, ErrorCode.COORDINATOR_NOT_AVAILABLE)
_FIND_TIMEOUT_MS = 1_000
_FIND_BACKOFF_MAX_MS = 1_000


def _ms() -> int:
    return int(time.monotonic() * 1000)


class Coordinator:
    """Finds the group's coordinator and remembers it until it moves or stops answering."""

    def __init__(self, transport: Transport, cluster: ClusterView, group_id: str):
        self.transport = transport
        self.cluster = cluster
        self.group_id = group_id
        self.node_id: str | None = None
        self.address: str | None = None
        self._next_try_ms = 0
        self._backoff_ms = 50

    def get(self, now_ms: int | None = None, wait: bool = False) -> str | None:
        """The coordinator's address, asking the brokers if unknown (rate-limited unless
        ``wait``); None if no broker could say."""
        if self.address is not None:
            return self.address
        now_ms = _ms() if now_ms is None else now_ms
        if not wait and now_ms < self._next_try_ms:
            return None
        last = None
        for addr in self.cluster.addresses():
            try:
                resp, _ = self.transport.call(addr, GroupFindCoordinator(self.group_id), timeout_ms=_FIND_TIMEOUT_MS)
            except MeshError as exc:
                if not exc.retriable:   # e.g. UNAUTHORIZED (no describe on the group): the caller
                    raise               # must hear it, not poll empty-handed for ever
                last = exc
                continue
            if resp.error == ErrorCode.NONE:
                self.node_id, self.address = resp.node_id, resp.address
                self._backoff_ms = 50
                return self.address
            last = MeshError(resp.error, resp.message)
            if not retriable(resp.error):
                raise last
        log.debug("group %s: no coordinator found yet: %s", self.group_id, last)
        self._next_try_ms = _ms() + self._backoff_ms
        self._backoff_ms = min(2 * self._backoff_ms, _FIND_BACKOFF_MAX_MS)
        try:
            self.cluster.refresh()
        except MeshError:
            pass
        return None

    def moved(self, hint: str | None) -> None:
        """COORDINATORMOVED (with the new coordinator's node id) or no answer."""
        self.node_id = self.address = None
        broker = self.cluster.brokers.get(hint) if hint else None
        if broker and broker.get("address") and row_is_up(broker):
            self.node_id, self.address = hint, broker["address"]

    def call(self, msg, timeout_ms: int, attempts: int = 3, patient: bool = False):
        """Send to the coordinator, following COORDINATORMOVED; the typed response.
        ``patient`` (an admin's request): after ``attempts``, go on asking with a backoff
        (50 ms doubling to 500 ms) until ``timeout_ms`` has passed since the first, as
        Kafka's admin client retries COORDINATOR_LOAD_IN_PROGRESS: a coordinator that took
        a group over answers "loading" until its replicas answered its pull, which takes
        longer than three quick tries on a loaded host."""
        last: MeshError | None = None
        deadline = _ms() + timeout_ms
        backoff_ms = 50
        tries = 0
        while True:
            if tries >= attempts:
                left = deadline - _ms()
                if not patient or left <= 0:
                    break
                time.sleep(min(backoff_ms, left) / 1000)   # a client's backoff, not a test's wait
                backoff_ms = min(2 * backoff_ms, 500)
            tries += 1
            addr = self.get(wait=True)
            if addr is None:
                last = MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"no coordinator for group {self.group_id!r}")
                continue
            try:
                resp, _ = self.transport.call(addr, msg, timeout_ms=timeout_ms)
            except MeshError as exc:
                if not exc.retriable:
                    raise
                last = exc
                self.moved(None)
                continue
            if resp.error in MOVED:
                last = MeshError(resp.error, resp.message)
                self.moved(getattr(resp, "coordinator", None))
                continue
            return resp
        raise last or MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no coordinator")
