"""A broker's security: secured (``--secrets DIR``) or open, as the node loop sees it.

``BrokerSecurity`` gathers what the node needs: the ZAP handler (``mesh.security.zap``,
polled by the loop), the ROUTER's settings (``configure_router``, before it binds), the
credentials of the node's peer links (the cluster keypair), the registry of users and the
authorizer (``mesh.security.registry`` / ``authorizer``, fed from gossip by
``mesh.node.requests.security_handlers.SecuritySync``), and ``principal_of``, which maps the ZAP
User-Id of a message (the sender's public key) to a principal: ``broker`` for the cluster
key, a user's name for a key the registry knows now, None otherwise.

Rules:
- secured: CURVE server on the ROUTER (server secret = the cluster secret key), ZAP
  decides every connection, ROUTER_HANDOVER as in open mode (see ``mesh.security.zap``); superusers are
  those of ``superusers.json`` (known by key) and the ``--superuser`` names (users added
  by an admin);
- open: allowed only when every address the broker binds (the ROUTER; the text gateway
  binds the same host) is loopback, unless ``insecure`` (then a warning at start). The ZAP
  handler runs in open mode too, for the connection cap.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Callable, Iterable

import zmq

from mesh.security.authorizer import Authorizer
from mesh.security.creds import BROKER_PRINCIPAL, Creds, CredsError, Secrets
from mesh.security.registry import Registry
from mesh.security.zap import DEFAULT_MAX_CONNECTIONS, HANDSHAKE_IVL_MS, ZAP_DOMAIN, ZapHandler

__all__ = ["BrokerSecurity", "is_loopback", "check_open_bind", "check_text_gateway", "warn_superuser_gateway"]

log = logging.getLogger("mesh.security")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves only to loopback addresses."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_open_bind(binds: Iterable[str], insecure: bool) -> None:
    """Refuse to run open on a non-loopback address unless ``insecure`` (then warn)."""
    exposed = [b for b in binds if not is_loopback(b.rpartition(":")[0])]
    if not exposed:
        return
    if not insecure:
        raise CredsError(f"refusing to serve without authentication on {', '.join(exposed)} (not loopback): "
                         f"start with --secrets DIR (create one with: mesh security init --dir DIR), or bind "
                         f"127.0.0.1, or pass --insecure to run open on purpose")
    log.warning("SECURITY: serving WITHOUT authentication on %s (--insecure): anyone who can reach it can "
                "read, write and delete every topic, and pose as a broker", ", ".join(exposed))


def check_text_gateway(security: "BrokerSecurity", bind: str, text_port: int | None,
                       text_creds: str | None) -> Creds | None:
    """The credentials the text gateway's clients use (None: open, or no gateway).

    The text protocol has no authentication of its own: in a secured cluster the gateway
    runs only on loopback (it binds the node's host), as the principal of ``text_creds``
    (every text client is that principal: its ACLs bound what they can do). A superuser's
    creds are accepted with a loud warning (``warn_superuser_gateway``)."""
    if text_port is None or not security.secured:
        return None
    if not is_loopback(bind.rpartition(":")[0]):
        raise CredsError(f"the text gateway has no authentication: in a secured cluster it runs only on a "
                         f"loopback bind (this node binds {bind}); drop --text-port or bind 127.0.0.1")
    if not text_creds:
        raise CredsError("a secured node with --text-port needs --text-creds FILE: the creds file of the "
                         "principal the text gateway acts as (mesh user add NAME --out FILE)")
    creds = Creds.load(text_creds)
    warn_superuser_gateway(security, creds)
    return creds


def warn_superuser_gateway(security: "BrokerSecurity", creds: Creds) -> bool:
    """Warn (loudly, at start) when the text gateway's principal is a superuser: every text
    client on this host can then do everything (read, write, delete every topic, add users
    and ACLs). It is allowed (a single-operator test box), never silent. True if warned."""
    static = security.secrets.superusers if security.secrets else {}
    superuser = creds.public_key in static.values() or creds.principal in security.superusers
    if superuser:
        log.warning("SECURITY: the text gateway acts as %r, a SUPERUSER: every text client that reaches "
                    "this host's text port may read, write and delete every topic and change users and "
                    "ACLs. Give it a user of its own with only the ACLs it needs: mesh user add text "
                    "--out text.creds, mesh acl add ..., then --text-creds text.creds", creds.principal)
    return superuser


class BrokerSecurity:
    def __init__(self, ctx: zmq.Context, *, secrets_dir: str | None, superusers: Iterable[str] = (),
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, binds: Iterable[str] = (),
                 insecure: bool = False, max_connections_per_ip: int = 0, topic_names: Callable[[], Iterable[str]] | None = None) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.secrets = Secrets.load(secrets_dir) if secrets_dir else None
        self.secured = self.secrets is not None
        if not self.secured:
            check_open_bind(binds, insecure)
        static = dict(self.secrets.superusers) if self.secured else {}
        self.registry = Registry(static_users=static)
        self.superusers = frozenset(static) | frozenset(superusers)
        self.authorizer = Authorizer(self.registry, self.superusers, topic_names=topic_names)
        self.cluster_key = self.secrets.cluster.public_key if self.secured else None
        self.peer_creds: Creds | None = self.secrets.creds() if self.secured else None
        registry = self.registry
        self.zap = ZapHandler(ctx, cluster_key=self.cluster_key,
                              known_key=lambda k: registry.principal_for_key(k) is not None,
                              max_connections=max_connections, max_connections_per_ip=max_connections_per_ip)

    def configure_router(self, router: zmq.Socket) -> None:
        """Before the ROUTER binds: ZAP (and CURVE when secured), the connection monitor."""
        self.zap.watch(router, str(id(router)))
        router.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        router.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)   # raw connections hold a slot 10 s at most
        if self.secured:
            router.setsockopt(zmq.CURVE_SERVER, 1)
            router.setsockopt(zmq.CURVE_SECRETKEY, self.secrets.cluster.secret_key.encode("ascii"))

    def principal_of(self, user_id: str) -> str | None:
        """The principal behind a message's ZAP User-Id (a public key in Z85), now."""
        if user_id == self.cluster_key:
            return BROKER_PRINCIPAL
        return self.registry.principal_for_key(user_id)

    def close(self, router: zmq.Socket | None = None) -> None:
        if router is not None and self.zap.monitor is not None:
            try:
                router.disable_monitor()
            except zmq.ZMQError:
                pass
        self.zap.close()
