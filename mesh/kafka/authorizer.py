"""The Kafka listener's security view: SCRAM credentials for SASL, and the ``Authorizer``
(``mesh.kafka.context``'s protocol) that evaluates the mesh's own ACLs for a SASL principal.

Where the state comes from: the listener is a client of its node, connected with the
cluster keypair (principal ``broker``, like the node's peer links). It polls the node with
``KAFKA_SECURITY`` (``mesh.node.requests.security_handlers``; the node's authorizer refuses it to
every user, superusers included, since it carries SCRAM keys) every ``refresh_s`` (1 s):
a poll that finds nothing new is answered with a version and no payload, so a quiet
cluster costs one small round trip a second. Users and ACLs are gossip registers, so the
node answers from memory what every broker already agrees on; a change made anywhere
reaches the listener within a few gossip rounds plus one poll; a login or a decision that
misses (an unknown user, a denial) asks for a poll at once and waits for it, once per
name or principal and view (``SecurityView.refresh_once``), so a password or an ACL just set on this
broker works for the very next request. Until the first answer
the view is empty: every SASL login fails and every request of a principal is denied
(fail closed); if the node stops answering the last view stays (the listener ends with
its node).

Decisions (``KafkaAuthorizer.allowed``), Kafka's rules on the mesh's vocabulary
(``mesh.security.acl``):
- principal None (an open listener, no SASL): everything allowed;
- a principal that is no user with Kafka credentials now (removed since it logged in):
  nothing; a superuser of the node (``--superuser`` names; the secrets' superusers have no
  Kafka password): everything;
- operations READ, WRITE, CREATE, DELETE, DESCRIBE, ALTER, ALL map to the mesh's read,
  write, ... all; DESCRIBE_CONFIGS to describe and ALTER_CONFIGS to alter; resources
  TOPIC, GROUP, CLUSTER (any cluster name, e.g. Kafka's ``kafka-cluster``, is the mesh's one
  cluster resource). Deny wins, default deny, literal and prefixed names, implied describe:
  ``AclTable``'s evaluation;
- CREATE on a TOPIC is also allowed by create on the cluster (Kafka's CreateTopics);
- IDEMPOTENT_WRITE (on the cluster) as Kafka 3 grants it: write on the cluster, or write
  on some topic (an allow row not covered by a deny of the same or a wider name);
- CLUSTER_ACTION (broker to broker), other resource types (TRANSACTIONAL_ID, USER,
  DELEGATION_TOKEN) and unknown operations: denied.
Decisions are cached per view (bounded), so a request costs a dict lookup per resource.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from mesh.security.scram import ScramCredential, credentials_from_register
from mesh.security.acl import ANY_PRINCIPAL, CLUSTER_NAME, AclTable

__all__ = ["SecurityView", "SecurityState", "KafkaAuthorizer", "OPERATION_MAP", "denied_error",
           "fetch_from_node", "DEFAULT_REFRESH_S"]

log = logging.getLogger("mesh.kafka.security")

DEFAULT_REFRESH_S = 1.0
_MIN_POLL_GAP_S = 0.05       # polls asked for by misses: at most 20 a second
_ASK_WAIT_S = 1.0            # a miss waits at most this long for its poll
_MAX_ASKED = 10_000          # misses remembered per view (a client spraying names: forgotten)
_CACHE_ENTRIES = 100_000
OPERATION_MAP = {"READ": "read", "WRITE": "write", "CREATE": "create", "DELETE": "delete",
                 "DESCRIBE": "describe", "ALTER": "alter", "ALL": "all",
                 "DESCRIBE_CONFIGS": "describe", "ALTER_CONFIGS": "alter"}
_RESOURCES = {"TOPIC": "topic", "GROUP": "group", "CLUSTER": "cluster"}


def denied_error(resource_type: str) -> int:
    """The Kafka error code of a refusal on ``resource_type``: TOPIC_AUTHORIZATION_FAILED
    (29), GROUP_AUTHORIZATION_FAILED (30), CLUSTER_AUTHORIZATION_FAILED (31; also the
    answer for other resource types)."""
    return {"TOPIC": 29, "GROUP": 30}.get(str(resource_type).upper(), 31)


@dataclass(frozen=True, slots=True)
class SecurityState:
    """One immutable view: swapped whole, so handler threads never see half an update."""
    version: str = ""
    credentials: dict = field(default_factory=dict)      # user -> {mechanism: ScramCredential}
    table: AclTable = field(default_factory=AclTable)
    superusers: frozenset = frozenset()

    @classmethod
    def from_response(cls, resp: Any) -> "SecurityState":
        """From a ``KafkaSecurityResponse`` with its payload; malformed entries are skipped."""
        creds: dict[str, dict[str, ScramCredential]] = {}
        for name, value in (resp.users or {}).items():
            try:
                if isinstance(name, str):
                    creds[name] = credentials_from_register(value)
            except ValueError:
                log.warning("skipped the malformed Kafka credentials of user %.64r", name)
        table, bad = AclTable.from_registers(resp.acls or {})
        if bad:
            log.warning("skipped %d malformed ACL value(s)", len(bad))
        supers = frozenset(s for s in (resp.superusers or ()) if isinstance(s, str))
        return cls(resp.version, creds, table, supers)


def fetch_from_node(address: str, creds: Any = None, timeout_ms: int = 2000) -> Callable[[str], Any]:
    """A ``fetch(since) -> KafkaSecurityResponse`` over a native transport of its own
    (``creds``: the broker's, from its secrets directory; None on an open node). Call it
    from one thread only (the poller's)."""
    from mesh.client.transport import Transport
    from mesh.wire.errors import MeshError
    from mesh.wire.messages import KafkaSecurityRequest
    transport = Transport(creds=creds)

    def fetch(since: str):
        try:
            return transport.call(address, KafkaSecurityRequest(since), timeout_ms=timeout_ms)[0]
        except MeshError:
            transport.forget(address)
            raise
    fetch.close = transport.close   # type: ignore[attr-defined]
    return fetch


class SecurityView:
    """The listener's current users, credentials and ACLs, refreshed from the node."""

    def __init__(self, fetch: Callable[[str], Any] | None = None, refresh_s: float = DEFAULT_REFRESH_S) -> None:
        self.fetch = fetch
        self.refresh_s = refresh_s
        self.state = SecurityState()
        self.ready = threading.Event()        # set by the first view received
        self.polls = 0
        self.failures = 0
        self.asked = 0                         # polls asked for by a miss (``refresh_once``)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._polled = threading.Condition()
        self._started = self._done = 0         # polls begun, polls finished (the poller's thread)
        self._asked_for: set = set()           # misses already refreshed for, in this state
        self._asked_state: SecurityState | None = None

    def apply(self, resp: Any) -> bool:
        """Take a ``KafkaSecurityResponse``; True if the view changed."""
        if resp.users is None and resp.acls is None:
            if resp.version == self.state.version:
                self.ready.set()
                return False
            return False      # "unchanged" for a version we do not hold: the next poll asks again
        self.state = SecurityState.from_response(resp)
        self.ready.set()
        log.info("Kafka security: %d user(s) with Kafka credentials, %d ACL row(s)",
                 len(self.state.credentials), len(self.state.table))
        return True

    def poll(self) -> bool:
        """Ask the node once (True if the view changed); errors are counted, never raised."""
        self.polls += 1
        try:
            resp = self.fetch(self.state.version)
        except Exception as exc:   # a node restarting, a timeout: keep the last view
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning("Kafka security view not refreshed (%d failures): %s", self.failures, exc)
            return False
        if getattr(resp, "error", 0):
            self.failures += 1
            return False
        return self.apply(resp)

    def start(self) -> "SecurityView":
        """Poll every ``refresh_s`` on a daemon thread until ``stop()``, and at once (at most
        every ``_MIN_POLL_GAP_S``) when a miss asks for it (``refresh_once``)."""
        def run() -> None:
            while not self._stop.is_set():
                with self._polled:
                    self._started += 1
                self.poll()
                with self._polled:
                    self._done += 1
                    self._polled.notify_all()
                if self._stop.wait(_MIN_POLL_GAP_S):
                    break
                self._wake.wait(max(0.0, self.refresh_s - _MIN_POLL_GAP_S))
                self._wake.clear()
            close = getattr(self.fetch, "close", None)
            if close is not None:
                close()
        self._thread = threading.Thread(target=run, name="kafka-security-view", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- for SASL (mesh.kafka.sasl.SaslSession's lookup) --------------------------------
    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        cred = self.state.credentials.get(user, {}).get(mechanism)
        if cred is None and self.refresh_once(("user", user, mechanism)):
            cred = self.state.credentials.get(user, {}).get(mechanism)
        return cred

    def refresh_once(self, miss: Any, timeout_s: float = _ASK_WAIT_S) -> bool:
        """A lookup or a decision missed in this view: it may be a change the poll has not
        brought yet (a user just given a Kafka password, an ACL just added: the README's
        next command uses it at once). Ask for a poll that begins now and wait for it, once
        per ``miss`` and view, at most ``timeout_s``: a denial asks once per principal (a
        Metadata request denied 500 topics waits once, and a client repeating a refused
        request does not wait again), a login once per name. True if the view may have
        changed. (Trade-off: an unknown name's first login waits for a poll, a known one's
        does not, so timing tells which names exist, as Kafka's SCRAM answer does outright;
        the fake salt still hides it from the answers themselves.)"""
        if self._thread is None or self._stop.is_set() or not self._thread.is_alive():
            return False
        with self._polled:
            if self._asked_state is not self.state or len(self._asked_for) >= _MAX_ASKED:
                self._asked_state, self._asked_for = self.state, set()
            if miss in self._asked_for:
                return False
            self._asked_for.add(miss)
            want = self._started + 1           # a poll that begins after the miss
            self.asked += 1
        self._wake.set()
        with self._polled:
            return self._polled.wait_for(lambda: self._done >= want, timeout_s)


class KafkaAuthorizer:
    """``mesh.kafka.context.Authorizer`` over a ``SecurityView`` (or a fixed state)."""

    def __init__(self, view: SecurityView) -> None:
        self.view = view
        self._cache_state: SecurityState | None = None
        self._cache: dict[tuple[str, str, str, str], bool] = {}
        self._lock = threading.Lock()
        self.refused = 0

    def allowed(self, principal: str | None, operation: str, resource_type: str, name: str) -> bool:
        if principal is None:
            return True
        state = self.view.state
        op = str(operation).upper()
        rtype = str(resource_type).upper()
        key = (principal, op, rtype, name)
        with self._lock:
            if self._cache_state is not state:
                self._cache_state, self._cache = state, {}
            got = self._cache.get(key)
        if got is None:
            got = self._decide(state, principal, op, rtype, name)
            if not got and self.view.refresh_once(("principal", principal)):   # a grant not polled yet?
                state = self.view.state
                got = self._decide(state, principal, op, rtype, name)
            with self._lock:
                if self._cache_state is state:
                    if len(self._cache) >= _CACHE_ENTRIES:
                        self._cache.clear()
                    self._cache[key] = got
        if not got:
            self.refused += 1
        return got

    @staticmethod
    def _decide(state: SecurityState, principal: str, op: str, rtype: str, name: Any) -> bool:
        if principal not in state.credentials:
            return False            # no user (any more): nothing, superuser or not
        if principal in state.superusers:
            return True
        table = state.table
        if op == "IDEMPOTENT_WRITE":
            return rtype == "CLUSTER" and (table.decide(principal, "write", "cluster", CLUSTER_NAME)[0]
                                           or _writes_some_topic(table, principal))
        mesh_op, resource = OPERATION_MAP.get(op), _RESOURCES.get(rtype)
        if mesh_op is None or resource is None or not isinstance(name, str):
            return False
        if resource == "cluster":
            name = CLUSTER_NAME
        if table.decide(principal, mesh_op, resource, name)[0]:
            return True
        # Kafka's CreateTopics (and auto-create) accepts create on the cluster instead
        return (mesh_op, resource) == ("create", "topic") and table.decide(principal, "create", "cluster",
                                                                            CLUSTER_NAME)[0]


def _writes_some_topic(table: AclTable, principal: str) -> bool:
    """Whether some allow row lets ``principal`` write some topic (Kafka 3: that implies
    IDEMPOTENT_WRITE), not undone by a deny of the same or a wider name."""
    rows = [r for r in table.rules.values() if r.resource == "topic" and r.principal in (principal, ANY_PRINCIPAL)
            and r.covers("write")]
    denies = [r for r in rows if r.permission == "deny"]
    for r in rows:
        if r.permission != "allow":
            continue
        if r.pattern == "literal" and r.name != "*":
            if table.decide(principal, "write", "topic", r.name)[0]:
                return True
            continue
        # a prefix (or every name): undone by a deny of every name or of a shorter prefix
        wide = "" if r.name == "*" else r.name
        if not any((d.pattern == "literal" and d.name == "*") or
                   (d.pattern == "prefixed" and wide.startswith(d.name))
                   for d in denies):
            return True
    return False
