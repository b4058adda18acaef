"""TLS for the Kafka listener (``mesh node --kafka-tls-cert FILE --kafka-tls-key FILE``).

``server_ssl_context(cert, key)`` is the one ``ssl.SSLContext`` the listener wraps its
accepted sockets with: TLS 1.2 or later, the certificate chain and private key of the PEM
files given (a key readable by group or others is refused, like a creds file), no client
certificates asked for (clients authenticate with SASL). A Kafka client then connects with
``security.protocol=SASL_SSL`` (SSL on an open node) and PLAIN is offered beside SCRAM
(``mesh.kafka.sasl``). Loading fails at start with ``TlsError`` naming the file, never
later on a client's connection.
"""
from __future__ import annotations

import os
import ssl
import stat

__all__ = ["server_ssl_context", "check_tls_options", "TlsError"]


class TlsError(ValueError):
    """A certificate or key that cannot serve (missing, unreadable, not PEM, not a pair)."""


def check_tls_options(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """(cert, key), or None for no TLS; both or neither must be given."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise TlsError("give both --kafka-tls-cert FILE and --kafka-tls-key FILE (or neither)")
    return cert, key


def server_ssl_context(cert: str | os.PathLike, key: str | os.PathLike) -> ssl.SSLContext:
    cert, key = os.fspath(cert), os.fspath(key)
    for path, what in ((cert, "certificate"), (key, "private key")):
        if not os.path.isfile(path):
            raise TlsError(f"Kafka TLS {what} {path}: no such file")
    mode = os.stat(key).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TlsError(f"Kafka TLS private key {key} is readable by others (mode {stat.S_IMODE(mode):o}): "
                       f"chmod 600 {key}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_NONE          # clients authenticate with SASL, not certificates
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"Kafka TLS: cannot load {cert} with key {key}: {exc}") from None
    return ctx
