"""SCRAM (RFC 5802, RFC 7677) for the Kafka listener: credentials and the server's side of
one exchange (pure: stdlib only, no I/O; nonces and salts from ``secrets``).

Credentials (``make_credentials``) are what Kafka stores for a SCRAM user, per mechanism:
a random salt, an iteration count (4096..16384, Kafka's bounds), StoredKey = H(ClientKey)
and ServerKey, where ClientKey = HMAC(SaltedPassword, "Client Key"), ServerKey =
HMAC(SaltedPassword, "Server Key") and SaltedPassword = PBKDF2-HMAC-H(password, salt,
iterations). The password itself is never kept: whoever holds the credentials can check
a client's proof and prove the server knows them, not log in. They travel as the
``scram`` map of a ``user/<name>`` gossip register, base64 text (``to_register`` /
``from_register``; the bounds are ``mesh.cluster.schema``'s).

``ScramServer`` runs one exchange: client-first (``n,,n=<user>,r=<nonce>``; channel
binding, authzid other than the user, and extensions such as ``tokenauth`` are refused) ->
server-first (``r=<nonce+ours>,s=<salt>,i=<iterations>``) -> client-final
(``c=biws,r=<nonce>,p=<proof>``; librdkafka before 2.6.1 sends its own nonce twice, and
that exact form is accepted, as Kafka 3.8.1 does) -> server-final (``v=<signature>``). The proof is checked
with ``hmac.compare_digest``. An unknown user gets a server-first made from a fake salt
derived from the name with a per-process secret (so a client cannot tell unknown users
from wrong passwords) and fails at the proof like a wrong password. Any malformed message,
a nonce that is not the one of this exchange, or a message over ``MAX_MESSAGE_BYTES``
raises ``ScramError``.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["MECHANISMS", "MIN_ITERATIONS", "MAX_ITERATIONS", "DEFAULT_ITERATIONS", "MAX_MESSAGE_BYTES",
           "ScramCredential", "ScramError", "ScramServer", "make_credentials", "credentials_to_register",
           "credentials_from_register", "salted_password"]

MECHANISMS: dict[str, Callable] = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
_HASH_NAMES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096           # Kafka's ScramMechanism bounds
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192
SALT_BYTES = 32
MIN_SALT_BYTES, MAX_SALT_BYTES = 16, 64
MAX_MESSAGE_BYTES = 1024        # a client-first or client-final message (user <= 64 chars)
MAX_PASSWORD_CHARS = 1024
NONCE_BYTES = 24
_PRINTABLE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")    # RFC 5802 "printable": no comma
_FAKE_KEY = secrets.token_bytes(32)                   # this process's: fake salts of unknown users


class ScramError(Exception):
    """The exchange failed (the text is safe to send the client: it names no secret)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_HASH_NAMES[mechanism], password.encode("utf-8"), salt, iterations)


def _hmac(mechanism: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, MECHANISMS[mechanism]).digest()


def make_credentials(password: str, mechanisms: tuple[str, ...] = tuple(MECHANISMS),
                     iterations: int = DEFAULT_ITERATIONS) -> dict[str, ScramCredential]:
    """Credentials for ``password`` (a fresh salt per mechanism); ValueError on bad input."""
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD_CHARS:
        raise ValueError(f"a Kafka password is 1-{MAX_PASSWORD_CHARS} characters")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    out = {}
    for mech in mechanisms:
        if mech not in MECHANISMS:
            raise ValueError(f"unknown SCRAM mechanism {mech!r:.40}")
        salt = secrets.token_bytes(SALT_BYTES)
        sp = salted_password(mech, password, salt, iterations)
        client_key = _hmac(mech, sp, b"Client Key")
        out[mech] = ScramCredential(mech, salt, iterations, MECHANISMS[mech](client_key).digest(),
                                    _hmac(mech, sp, b"Server Key"))
    return out


def credentials_to_register(creds: Mapping[str, ScramCredential]) -> dict:
    """The ``scram`` map of a ``user/<name>`` register: mechanism -> {salt, iterations,
    stored_key, server_key} (bytes as base64 text)."""
    b64 = lambda b: base64.b64encode(b).decode("ascii")   # noqa: E731
    return {m: {"salt": b64(c.salt), "iterations": c.iterations, "stored_key": b64(c.stored_key),
                "server_key": b64(c.server_key)} for m, c in sorted(creds.items())}


def credentials_from_register(value: object) -> dict[str, ScramCredential]:
    """The credentials of a ``scram`` map; ValueError if malformed or out of bounds."""
    if type(value) is not dict or not value or not set(value) <= set(MECHANISMS):
        raise ValueError(f"scram: a non-empty map keyed by {', '.join(MECHANISMS)}")
    out = {}
    for mech, c in value.items():
        if type(c) is not dict or set(c) != {"salt", "iterations", "stored_key", "server_key"}:
            raise ValueError("scram: each mechanism has exactly salt, iterations, stored_key, server_key")
        it = c["iterations"]
        if type(it) is not int or not MIN_ITERATIONS <= it <= MAX_ITERATIONS:
            raise ValueError(f"scram: iterations in {MIN_ITERATIONS}..{MAX_ITERATIONS}")
        size = MECHANISMS[mech]().digest_size
        raw = {}
        for f, lo, hi in (("salt", MIN_SALT_BYTES, MAX_SALT_BYTES), ("stored_key", size, size),
                          ("server_key", size, size)):
            v = c[f]
            if type(v) is not str or len(v) > 4 * hi:
                raise ValueError(f"scram: {f} is base64 text")
            try:
                raw[f] = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"scram: {f} is base64 text") from None
            if not lo <= len(raw[f]) <= hi:
                raise ValueError(f"scram: {f} has {lo}..{hi} bytes")
        out[mech] = ScramCredential(mech, raw["salt"], it, raw["stored_key"], raw["server_key"])
    return out


def _saslname(s: str) -> str:
    """RFC 5802 saslname: "=2C" is ",", "=3D" is "="; any other "=" is malformed."""
    if "=" in s.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed user name")
    return s.replace("=2C", ",").replace("=3D", "=")


def _attrs(msg: str, names: str) -> list[str]:
    """The values of the comma-separated ``x=value`` attributes, which must be ``names``
    in that order (and nothing else)."""
    parts = msg.split(",")
    if len(parts) != len(names):
        raise ScramError("malformed SCRAM message")
    out = []
    for part, name in zip(parts, names):
        if len(part) < 2 or part[0] != name or part[1] != "=":
            raise ScramError("malformed SCRAM message")
        out.append(part[2:])
    return out


class ScramServer:
    """One SCRAM exchange, server side. ``lookup(user)`` -> the user's credential for this
    mechanism, or None (unknown user, or no Kafka password for this mechanism)."""

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential | None]) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r:.40}")
        self.mechanism = mechanism
        self.lookup = lookup
        self.state = "first"          # first -> final -> done | failed
        self.user: str | None = None
        self._cred: ScramCredential | None = None
        self._nonce = ""
        self._client_nonce = ""
        self._gs2 = ""
        self._first_bare = ""
        self._server_first = ""

    def _fail(self, text: str) -> ScramError:
        self.state = "failed"
        return ScramError(text)

    def step(self, data: bytes) -> bytes:
        """The answer to the client's next message; ScramError if the exchange failed."""
        if self.state not in ("first", "final"):
            raise self._fail("the SCRAM exchange is over")
        if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_MESSAGE_BYTES:
            raise self._fail(f"SCRAM message over {MAX_MESSAGE_BYTES} bytes")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("SCRAM message is not UTF-8") from None
        try:
            return self._client_first(text) if self.state == "first" else self._client_final(text)
        except ScramError as exc:
            self.state = "failed"
            raise exc

    def _client_first(self, text: str) -> bytes:
        # gs2-header: "n," (no channel binding) or "y," (client could but thinks we cannot);
        # "p=" (channel binding required) is refused: the listener offers none
        flag, sep, rest = text.partition(",")
        if not sep or flag not in ("n", "y"):
            raise ScramError("channel binding is not supported" if flag.startswith("p=") else "malformed SCRAM message")
        authzid, sep, bare = rest.partition(",")
        if not sep or (authzid and not authzid.startswith("a=")):
            raise ScramError("malformed SCRAM message")
        parts = bare.split(",")
        if len(parts) != 2:   # extensions (tokenauth=...) are not supported
            raise ScramError("SCRAM extensions are not supported")
        user_raw, nonce = _attrs(bare, "nr")
        user = _saslname(user_raw)
        if not user or not _PRINTABLE.fullmatch(nonce) or len(nonce) > 256:
            raise ScramError("malformed SCRAM message")
        if authzid and _saslname(authzid[2:]) != user:
            raise ScramError("authorization id differs from the user name")
        self.user = user
        self._gs2 = f"{flag},{authzid},"
        self._first_bare = bare
        cred = self.lookup(user)
        if cred is not None and cred.mechanism != self.mechanism:
            cred = None
        self._cred = cred
        if cred is None:   # a fake, stable salt: unknown users look like wrong passwords
            salt = hmac.new(_FAKE_KEY, f"{self.mechanism}\0{user}".encode(), hashlib.sha256).digest()
            iterations = DEFAULT_ITERATIONS
        else:
            salt, iterations = cred.salt, cred.iterations
        self._client_nonce = nonce
        self._nonce = nonce + base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode("ascii")
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode('ascii')},i={iterations}"
        self.state = "final"
        return self._server_first.encode("ascii")

    def _client_final(self, text: str) -> bytes:
        without_proof, sep, proof_attr = text.rpartition(",")
        if not sep:
            raise ScramError("malformed SCRAM message")
        channel, nonce = _attrs(without_proof, "cr")
        (proof_b64,) = _attrs(proof_attr, "p")
        try:
            gs2 = base64.b64decode(channel, validate=True).decode("utf-8")
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ScramError("malformed SCRAM message") from None
        if gs2 != self._gs2:
            raise ScramError("channel binding differs from the client's first message")
        # librdkafka before 2.6.1 (kcat's today) sends its own nonce again in front of the
        # whole nonce (confluentinc/librdkafka#4895; Kafka 3.8.1 accepts it): that exact
        # form is taken too, it still carries this exchange's fresh part
        if not (hmac.compare_digest(nonce.encode(), self._nonce.encode())
                or hmac.compare_digest(nonce.encode(), (self._client_nonce + self._nonce).encode())):
            raise ScramError("the nonce is not this exchange's")
        mech = self.mechanism
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode("utf-8")
        cred = self._cred
        stored = cred.stored_key if cred is not None else MECHANISMS[mech](b"").digest()
        signature = _hmac(mech, stored, auth_message)
        if len(proof) != len(signature):
            raise ScramError("authentication failed: invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        ok = hmac.compare_digest(MECHANISMS[mech](client_key).digest(), stored)
        if cred is None or not ok:
            raise ScramError("authentication failed: invalid credentials")
        self.state = "done"
        return b"v=" + base64.b64encode(_hmac(mech, cred.server_key, auth_message))
