"""The Kafka listener's security, in one object the server builds at start.

    sec = ListenerSecurity.start(node_address, secrets_dir=..., tls_cert=..., tls_key=...)
    sec.ssl_context            # None: plaintext; else wrap each accepted socket with it
    sec.authorizer             # RequestContext.authorizer (mesh.kafka.authorizer)
    session = sec.new_session(tls=...)   # per connection: None on an open node (no SASL)
    ...
    sec.close()

- open node (no ``--secrets``): no SASL (``new_session`` is None, every principal None,
  everything allowed); the node starts such a listener on loopback only, unless
  ``--insecure`` (``mesh.kafka.process.kafka_listener_of``, as its native port);
- secured node: every connection must authenticate (``mesh.kafka.sasl``) before anything
  but ApiVersions/SaslHandshake/SaslAuthenticate; the listener's native client connects
  to its node with the cluster keypair from the secrets directory (principal ``broker``)
  and authorizes every Kafka request itself with the same ACLs
  (``mesh.kafka.authorizer``: a view of users and ACLs polled from the node every second);
- TLS (``--kafka-tls-cert/--kafka-tls-key``) on either: ``mesh.kafka.tls``; PLAIN is then
  offered beside SCRAM.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mesh.kafka.authorizer import DEFAULT_REFRESH_S, KafkaAuthorizer, SecurityView, fetch_from_node
from mesh.kafka.sasl import SaslSession
from mesh.kafka.tls import check_tls_options, server_ssl_context

__all__ = ["ListenerSecurity"]


@dataclass
class ListenerSecurity:
    secured: bool
    view: SecurityView
    authorizer: KafkaAuthorizer
    ssl_context: Any = None          # ssl.SSLContext | None

    @classmethod
    def start(cls, node_address: str, *, secrets_dir: str | os.PathLike | None = None,
              tls_cert: str | None = None, tls_key: str | None = None,
              refresh_s: float = DEFAULT_REFRESH_S) -> "ListenerSecurity":
        """Raises ``CredsError`` (a bad secrets directory) or ``TlsError`` (a bad
        certificate or key) before anything listens."""
        tls = check_tls_options(tls_cert, tls_key)
        ssl_context = server_ssl_context(*tls) if tls is not None else None
        if secrets_dir is None:
            view = SecurityView()
            return cls(False, view, KafkaAuthorizer(view), ssl_context)
        from mesh.security.creds import Secrets
        creds = Secrets.load(secrets_dir).creds()          # principal broker: the cluster keypair
        view = SecurityView(fetch_from_node(node_address, creds), refresh_s=refresh_s).start()
        return cls(True, view, KafkaAuthorizer(view), ssl_context)

    def new_session(self, tls: bool | None = None) -> SaslSession | None:
        """The SASL state of a new connection (None: an open node asks for no SASL);
        ``tls``: whether the connection is TLS (default: whether this listener is)."""
        if not self.secured:
            return None
        return SaslSession(self.view.lookup, tls=self.ssl_context is not None if tls is None else tls)

    def node_creds(self, secrets_dir: str | os.PathLike | None):
        """The credentials of the listener's native client: the cluster keypair on a
        secured node (principal broker: it authorizes Kafka requests itself), else None."""
        from mesh.security.creds import Secrets
        return Secrets.load(secrets_dir).creds() if self.secured and secrets_dir is not None else None

    def wait_ready(self, timeout_s: float = 10.0) -> bool:
        """Whether the first view of users and ACLs arrived (an open node: at once). Not
        before the listener said it is ready: its node answers only once its loop runs,
        after the listener started (until the view comes, every login fails, closed)."""
        return not self.secured or self.view.ready.wait(timeout_s)

    def close(self) -> None:
        if self.secured:
            self.view.stop()
