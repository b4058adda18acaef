"""SASL for the Kafka listener: SaslHandshake (API 17, v0-1) and SaslAuthenticate (API 36,
v0-2), sans I/O: one ``SaslSession`` per connection, which the server owns.

The server registers the session's bound methods as the handlers of APIs 17 and 36
(``handler(ctx, request) -> response``, ``mesh.kafka.context``'s contract), serves nothing
but ``allowed_before_auth`` APIs until ``session.done``, then uses ``session.principal``
(the mesh user name) as ``RequestContext.principal``; it closes the connection once the
answer is written when ``session.failed`` (Kafka closes a connection whose authentication
failed, or which broke the order of the SASL requests). A handshake of version 0 means the
client sends the SASL tokens as bare size-prefixed frames, not in SaslAuthenticate: then
``session.raw_tokens`` is True and the server hands each frame to ``authenticate(bytes)``
and writes the reply as a bare frame (no client today needs it; advertising only
SaslHandshake v1 is also right).

Rules (as Kafka's ``SaslServerAuthenticator``):
- the order is: ApiVersions (any number), one SaslHandshake, then SaslAuthenticate until
  the mechanism is done; anything else first, a second handshake, or authenticate before
  a handshake: ILLEGAL_SASL_STATE and the connection is closed;
- mechanisms: SCRAM-SHA-256 and SCRAM-SHA-512 (``mesh.security.scram``), PLAIN only when the
  connection is TLS (it sends the password itself); the PLAIN password is checked against
  the user's SCRAM credentials (the mesh keeps no password). An unknown mechanism:
  UNSUPPORTED_SASL_MECHANISM with the enabled ones, then closed;
- one exchange per connection, each message at most ``MAX_AUTH_BYTES``; any failure
  (unknown user, wrong password, malformed or oversize message, a nonce not of this
  exchange): SASL_AUTHENTICATION_FAILED, then closed. The server also closes a connection
  not authenticated within ``AUTH_TIMEOUT_S``.
"""
from __future__ import annotations

import hmac
import importlib
import time
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from mesh.security.scram import MECHANISMS, ScramCredential, ScramError, ScramServer, salted_password, _hmac

__all__ = ["SaslSession", "allowed_before_auth", "register", "BEFORE_AUTH_APIS", "AUTH_TIMEOUT_S", "MAX_AUTH_BYTES",
           "API_SASL_HANDSHAKE", "API_SASL_AUTHENTICATE", "API_VERSIONS", "VERSIONS"]

API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36
API_VERSIONS = 18
BEFORE_AUTH_APIS = frozenset({API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE})
VERSIONS = {API_SASL_HANDSHAKE: (0, 1), API_SASL_AUTHENTICATE: (0, 2)}   # what the listener advertises
AUTH_TIMEOUT_S = 10.0
MAX_AUTH_BYTES = 2048          # one SCRAM message (1 KiB), or PLAIN's authzid\0user\0password
PLAIN = "PLAIN"

# lookup(user, mechanism) -> that user's SCRAM credential for the mechanism, or None
Lookup = Callable[[str, str], "ScramCredential | None"]


def allowed_before_auth(api_key: int) -> bool:
    """Whether the listener may serve ``api_key`` on a connection not yet authenticated."""
    return api_key in BEFORE_AUTH_APIS


def register(registry) -> None:
    """Advertise SaslHandshake and SaslAuthenticate in the listener's API table (secured
    listeners only). The handlers registered here answer ILLEGAL_SASL_STATE: the server
    serves these APIs with each connection's own session (``SaslSession.handlers``)."""
    def no_session(ctx, request):
        s = SaslSession(lambda user, mechanism: None)
        s.failed = True
        return s.on_handshake(ctx, request) if ctx.api_key == API_SASL_HANDSHAKE else s.on_authenticate(ctx, request)
    for key, (lo, hi) in VERSIONS.items():
        registry.register(key, lo, hi, no_session)


def _response(api_key: int, version: int):
    mod = "sasl_handshake" if api_key == API_SASL_HANDSHAKE else "sasl_authenticate"
    lo, hi = VERSIONS[api_key]
    return importlib.import_module(f"kio.schema.{mod}.v{min(max(version, lo), hi)}.response")


class SaslSession:
    """The SASL state of one connection: handshake -> authenticate* -> done | failed."""

    def __init__(self, lookup: Lookup, *, tls: bool = False) -> None:
        self.lookup = lookup
        self.tls = tls
        self.mechanisms = tuple(MECHANISMS) + ((PLAIN,) if tls else ())
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.done = False
        self.failed = False            # the server closes the connection after this answer
        self.raw_tokens = False        # handshake v0: tokens come as bare frames
        self.error_message: str | None = None
        self._scram: ScramServer | None = None
        self.started = time.monotonic()

    def expired(self, now: float | None = None) -> bool:
        """Whether the connection is still not authenticated ``AUTH_TIMEOUT_S`` after it
        opened (the server closes it then)."""
        return not self.done and (time.monotonic() if now is None else now) - self.started > AUTH_TIMEOUT_S

    # -- the sans-I/O core --------------------------------------------------------------
    def handshake(self, mechanism: Any, version: int = 1) -> ErrorCode:
        if self.mechanism is not None or self.done or self.failed:
            return self._failing(ErrorCode.illegal_sasl_state, "one SASL handshake per connection")
        if not isinstance(mechanism, str) or mechanism not in self.mechanisms:
            why = " (PLAIN only over TLS)" if mechanism == PLAIN else ""
            return self._failing(ErrorCode.unsupported_sasl_mechanism,
                                 f"unsupported SASL mechanism {str(mechanism)[:40]!r}{why}")
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        if mechanism in MECHANISMS:
            self._scram = ScramServer(mechanism, lambda user: self.lookup(user, mechanism))
        return ErrorCode.none

    def authenticate(self, data: Any) -> tuple[bytes, ErrorCode, str | None]:
        """(reply bytes, error, principal once done)."""
        if self.mechanism is None or self.done or self.failed:
            return b"", self._failing(ErrorCode.illegal_sasl_state, "SaslAuthenticate out of order"), None
        if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_AUTH_BYTES:
            return b"", self._failing(ErrorCode.sasl_authentication_failed,
                                      f"authentication failed: message over {MAX_AUTH_BYTES} bytes"), None
        if self.mechanism == PLAIN:
            return self._plain(bytes(data))
        scram = self._scram
        try:
            reply = scram.step(bytes(data))
        except ScramError as exc:
            return b"", self._failing(ErrorCode.sasl_authentication_failed, f"authentication failed: {exc}"
                                      if not str(exc).startswith("authentication failed") else str(exc)), None
        if scram.state == "done":
            self.done, self.principal = True, scram.user
        return reply, ErrorCode.none, self.principal

    def _plain(self, data: bytes) -> tuple[bytes, ErrorCode, str | None]:
        def bad() -> tuple[bytes, ErrorCode, None]:
            return b"", self._failing(ErrorCode.sasl_authentication_failed,
                                      "authentication failed: invalid credentials"), None
        parts = data.split(b"\0")
        if len(parts) != 3:
            return bad()
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            return bad()
        if not user or not password or (authzid and authzid != user):
            return bad()
        for mech in MECHANISMS:   # the first mechanism the user has credentials for
            cred = self.lookup(user, mech)
            if cred is None:
                continue
            client_key = _hmac(mech, salted_password(mech, password, cred.salt, cred.iterations), b"Client Key")
            if hmac.compare_digest(MECHANISMS[mech](client_key).digest(), cred.stored_key):
                self.done, self.principal = True, user
                return b"", ErrorCode.none, user
            return bad()
        return bad()

    def _failing(self, code: ErrorCode, text: str) -> ErrorCode:
        self.failed = True
        self.error_message = text
        return code

    # -- the handlers of the context.py contract ----------------------------------------
    def on_handshake(self, ctx, request):
        """SaslHandshake (API 17): the mechanism's error, and the enabled mechanisms."""
        code = self.handshake(getattr(request, "mechanism", None), ctx.api_version)
        return _response(API_SASL_HANDSHAKE, ctx.api_version).SaslHandshakeResponse(
            error_code=code, mechanisms=self.mechanisms)

    def on_authenticate(self, ctx, request):
        """SaslAuthenticate (API 36): the mechanism's next reply, or the failure."""
        reply, code, _ = self.authenticate(getattr(request, "auth_bytes", None))
        return _response(API_SASL_AUTHENTICATE, ctx.api_version).SaslAuthenticateResponse(
            error_code=code, error_message=None if code == ErrorCode.none else self.error_message,
            auth_bytes=reply)

    def handlers(self) -> dict[int, Callable]:
        """API key -> handler, for the server's per-connection table."""
        return {API_SASL_HANDSHAKE: self.on_handshake, API_SASL_AUTHENTICATE: self.on_authenticate}
