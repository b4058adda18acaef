"""SASL on the Kafka listener (mesh/kafka/sasl.py, mesh/kafka/scram.py): the server side of
SCRAM-SHA-256/512 driven byte for byte by kafka-python's SCRAM client; wrong passwords,
unknown users, replayed and forged nonces, malformed and oversize messages, the order of
the SASL requests, PLAIN only over TLS; credentials as the gossip schema bounds them."""
from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import pytest
from kafka.net.sasl.scram import ScramClient
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from mesh.cluster.schema import validate_entry
from mesh.kafka import sasl
from mesh.kafka.sasl import MAX_AUTH_BYTES, SaslSession, allowed_before_auth
from mesh.security.scram import (MECHANISMS, credentials_from_register, credentials_to_register,
                              make_credentials)

CREDS = {"alice": make_credentials("s3cret pass"), "bob": make_credentials("other", ("SCRAM-SHA-512",))}
KEY_A = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def lookup(user, mechanism):
    return CREDS.get(user, {}).get(mechanism)


def session(mech="SCRAM-SHA-256", tls=False) -> SaslSession:
    s = SaslSession(lookup, tls=tls)
    assert s.handshake(mech) == ErrorCode.none
    return s


def exchange(s: SaslSession, client: ScramClient):
    """Run one exchange; returns (error of the last step, the client-final sent)."""
    reply, err, principal = s.authenticate(client.first_message())
    if err != ErrorCode.none:
        return err, None
    assert principal is None and not s.done
    client.process_server_first_message(reply)
    final = client.final_message()
    reply, err, principal = s.authenticate(final)
    if err == ErrorCode.none:
        client.process_server_final_message(reply)   # raises if the server's signature is wrong
        assert principal == client.user.decode()
    return err, final


@pytest.mark.parametrize("mech", sorted(MECHANISMS))
def test_scram_exchange_with_kafka_pythons_client(mech):
    s = session(mech)
    err, _ = exchange(s, ScramClient("alice", "s3cret pass", mech))
    assert err == ErrorCode.none
    assert s.done and s.principal == "alice" and not s.failed
    # the exchange is over: no more SaslAuthenticate on this connection
    assert s.authenticate(b"n,,n=alice,r=x")[1] == ErrorCode.illegal_sasl_state and s.failed


@pytest.mark.parametrize("user,password,mech", [("alice", "wrong", "SCRAM-SHA-256"),
                                                ("alice", "s3cret pass!", "SCRAM-SHA-512"),
                                                ("nobody", "s3cret pass", "SCRAM-SHA-256"),
                                                ("bob", "other", "SCRAM-SHA-256")])   # bob: 512 only
def test_wrong_password_and_unknown_user_fail_alike(user, password, mech):
    s = session(mech)
    err, _ = exchange(s, ScramClient(user, password, mech))
    assert err == ErrorCode.sasl_authentication_failed
    assert s.failed and not s.done and s.principal is None
    assert s.error_message == "authentication failed: invalid credentials"


def test_unknown_users_get_a_stable_fake_salt():
    def salt_of(user):
        s = session()
        reply, err, _ = s.authenticate(f"n,,n={user},r=abc".encode())
        assert err == ErrorCode.none
        return dict(p.split("=", 1) for p in reply.decode().split(","))["s"]
    assert salt_of("ghost") == salt_of("ghost") != salt_of("ghost2")
    assert len(base64.b64decode(salt_of("ghost"))) == 32


def test_a_replayed_client_final_fails():
    s = session()
    client = ScramClient("alice", "s3cret pass", "SCRAM-SHA-256")
    err, final = exchange(s, client)
    assert err == ErrorCode.none
    # an eavesdropper replays both client messages on a new connection: the server nonce differs
    s2 = session()
    first = b"n,,n=alice,r=" + final.split(b",r=")[1][:32]   # the client's nonce of the first exchange
    assert s2.authenticate(first)[1] == ErrorCode.none
    assert s2.authenticate(final)[1] == ErrorCode.sasl_authentication_failed
    assert "nonce" in s2.error_message and s2.failed


class OldLibrdkafkaClient(ScramClient):
    """librdkafka before 2.6.1 (kcat's): its client nonce again before the whole nonce."""

    def process_server_first_message(self, server_first_message):
        cnonce = self.nonce
        super().process_server_first_message(server_first_message)
        self.nonce = cnonce + self.nonce
        self.auth_message = self.auth_message.rsplit(b",r=", 1)[0] + b",r=" + self.nonce
        self.client_signature = self.hmac(self.stored_key, self.auth_message)
        self.client_proof = bytes(a ^ b for a, b in zip(self.client_key, self.client_signature))
        self.server_signature = self.hmac(self.server_key, self.auth_message)


@pytest.mark.parametrize("mech", sorted(MECHANISMS))
def test_old_librdkafkas_doubled_nonce_is_accepted_and_only_that(mech):
    s = session(mech)
    assert exchange(s, OldLibrdkafkaClient("alice", "s3cret pass", mech))[0] == ErrorCode.none and s.done
    s = session(mech)
    assert exchange(s, OldLibrdkafkaClient("alice", "wrong", mech))[0] == ErrorCode.sasl_authentication_failed

    class Tripled(OldLibrdkafkaClient):
        def process_server_first_message(self, m):
            cnonce = self.nonce
            super().process_server_first_message(m)
            self.nonce = cnonce + self.nonce
    s = session(mech)
    assert exchange(s, Tripled("alice", "s3cret pass", mech))[0] == ErrorCode.sasl_authentication_failed
    assert "nonce" in s.error_message


def test_a_forged_nonce_or_channel_binding_fails():
    for forge in (lambda f: f.replace(b"r=", b"r=x", 1), lambda f: f.replace(b"c=biws", b"c=eSws")):
        s = session()
        client = ScramClient("alice", "s3cret pass", "SCRAM-SHA-256")
        reply, err, _ = s.authenticate(client.first_message())
        client.process_server_first_message(reply)
        assert s.authenticate(forge(client.final_message()))[1] == ErrorCode.sasl_authentication_failed


@pytest.mark.parametrize("first", [
    b"", b"garbage", b"n,,", b"n,,n=alice", b"n,,r=abc,n=alice", b"p=tls-unique,,n=alice,r=abc",
    b"x,,n=alice,r=abc", b"n,,n=alice,r=abc,tokenauth=true", b"n,a=bob,n=alice,r=abc",
    b"n,,n=al=ice,r=abc", b"n,,n=,r=abc", b"n,,n=alice,r=", b"\xff\xfe", b"n,,n=alice,r=a b",
])
def test_malformed_client_first_fails_cleanly(first):
    s = session()
    reply, err, principal = s.authenticate(first)
    assert err == ErrorCode.sasl_authentication_failed and reply == b"" and principal is None and s.failed


@pytest.mark.parametrize("final", [
    b"", b"c=biws", b"c=biws,r=NONCE", b"r=NONCE,c=biws,p=AAAA", b"c=biws,r=NONCE,p=!!!",
    b"c=!!,r=NONCE,p=AAAA", b"c=biws,r=NONCE,p=AAAA", b"c=biws,r=NONCE,x=1,p=AAAA",
])
def test_malformed_client_final_fails_cleanly(final):
    s = session()
    reply, _, _ = s.authenticate(b"n,,n=alice,r=abc")
    nonce = dict(p.split("=", 1) for p in reply.decode().split(","))["r"]
    reply, err, _ = s.authenticate(final.replace(b"NONCE", nonce.encode()))
    assert err == ErrorCode.sasl_authentication_failed and reply == b"" and s.failed and not s.done


def test_oversize_messages_are_refused():
    s = session()
    assert s.authenticate(b"n,,n=alice,r=" + b"a" * MAX_AUTH_BYTES)[1] == ErrorCode.sasl_authentication_failed
    s = session()   # under the frame bound but over SCRAM's
    assert s.authenticate(b"n,,n=alice,r=" + b"a" * 1500)[1] == ErrorCode.sasl_authentication_failed
    assert "over" in s.error_message


def test_the_order_of_sasl_requests():
    s = SaslSession(lookup)
    assert s.authenticate(b"n,,n=alice,r=abc")[1] == ErrorCode.illegal_sasl_state and s.failed
    s = session()
    assert s.handshake("SCRAM-SHA-256") == ErrorCode.illegal_sasl_state and s.failed
    s = SaslSession(lookup)
    assert s.handshake("GSSAPI") == ErrorCode.unsupported_sasl_mechanism and s.failed
    assert s.handshake(None) == ErrorCode.illegal_sasl_state
    s = SaslSession(lookup)
    assert s.handshake("SCRAM-SHA-512", version=0) == ErrorCode.none and s.raw_tokens
    s = SaslSession(lookup)
    assert not s.expired() and s.expired(s.started + sasl.AUTH_TIMEOUT_S + 1)
    s = session()
    exchange(s, ScramClient("alice", "s3cret pass", "SCRAM-SHA-256"))
    assert s.done and not s.expired(s.started + 3600)
    for api, ok in ((18, True), (17, True), (36, True), (0, False), (1, False), (3, False), (19, False)):
        assert allowed_before_auth(api) is ok


def plain(user, password, authzid=""):
    return f"{authzid}\0{user}\0{password}".encode()


def test_plain_only_over_tls_and_checked_against_the_scram_credentials():
    s = SaslSession(lookup)
    assert "PLAIN" not in s.mechanisms
    assert s.handshake("PLAIN") == ErrorCode.unsupported_sasl_mechanism and "TLS" in s.error_message
    s = session("PLAIN", tls=True)
    assert s.authenticate(plain("alice", "s3cret pass")) == (b"", ErrorCode.none, "alice") and s.done
    assert not s.failed and s.error_message is None       # the server keeps the connection
    s = session("PLAIN", tls=True)
    assert s.authenticate(plain("bob", "other", authzid="bob"))[2] == "bob"      # SCRAM-SHA-512 only
    assert s.done and not s.failed
    for bad in (plain("alice", "wrong"), plain("ghost", "x"), plain("alice", "s3cret pass", "bob"),
                b"alice\0s3cret pass", b"\0\0", b"\xff\0alice\0x"):
        s = session("PLAIN", tls=True)
        assert s.authenticate(bad)[1] == ErrorCode.sasl_authentication_failed and s.failed and not s.done


def encode(resp) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(resp))(buf, resp)
    return buf.getvalue()


@pytest.mark.parametrize("hv,av", [(0, 0), (1, 0), (1, 1), (1, 2)])
def test_handlers_answer_kio_responses_of_the_requested_version(hv, av):
    s = SaslSession(lookup)
    table = s.handlers()
    ctx = SimpleNamespace(api_version=hv)
    resp = table[17](ctx, SimpleNamespace(mechanism="SCRAM-SHA-256"))
    assert type(resp).__version__ == hv and resp.error_code == ErrorCode.none
    assert resp.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    encode(resp)
    ctx = SimpleNamespace(api_version=av)
    client = ScramClient("alice", "s3cret pass", "SCRAM-SHA-256")
    resp = table[36](ctx, SimpleNamespace(auth_bytes=client.first_message()))
    assert type(resp).__version__ == av and resp.error_code == ErrorCode.none and resp.error_message is None
    encode(resp)
    client.process_server_first_message(resp.auth_bytes)
    resp = table[36](ctx, SimpleNamespace(auth_bytes=client.final_message()))
    client.process_server_final_message(resp.auth_bytes)
    assert s.done and s.principal == "alice"
    resp = table[36](ctx, SimpleNamespace(auth_bytes=b"again"))
    assert resp.error_code == ErrorCode.illegal_sasl_state and resp.error_message
    encode(resp)
    assert sasl.VERSIONS == {17: (0, 1), 36: (0, 2)}


def test_credentials_are_bounded_in_the_gossip_schema():
    password = "pw-not-base64!"   # "pw" alone turned up in a random salt's base64 now and then
    reg = credentials_to_register(make_credentials(password, iterations=4096))
    assert credentials_from_register(reg)["SCRAM-SHA-256"].iterations == 4096
    assert set(reg) == {"SCRAM-SHA-256", "SCRAM-SHA-512"} and password not in repr(reg)
    user = {"name": "alice", "public_key": KEY_A}
    assert validate_entry("user/alice", user, 0) is None                  # no Kafka password: as before
    assert validate_entry("user/alice", {**user, "scram": reg}, 0) is None

    def bad(**change):
        c = {**reg["SCRAM-SHA-256"], **change}
        for value in ({**user, "scram": {"SCRAM-SHA-256": c}},):
            assert validate_entry("user/alice", value, 0) is not None
            with pytest.raises(ValueError):
                credentials_from_register(value["scram"])
    bad(iterations=1000)
    bad(iterations=10 ** 9)
    bad(iterations=True)
    bad(salt="AAAA")                                   # 3 bytes
    bad(salt="not base64!")
    bad(stored_key=base64.b64encode(b"x" * 64).decode())   # a SHA-512 size for SHA-256
    bad(server_key="A" * 10_000)
    bad(extra=1)
    for scram in ({}, {"SCRAM-SHA-1": reg["SCRAM-SHA-256"]}, [], "x", None):
        assert validate_entry("user/alice", {**user, "scram": scram}, 0) is not None
    with pytest.raises(ValueError):
        make_credentials("pw", iterations=100)
    with pytest.raises(ValueError):
        make_credentials("")


def test_register_advertises_both_apis_with_a_refusing_fallback():
    got = {}

    class Reg:
        def register(self, key, lo, hi, handler):
            got[key] = (lo, hi, handler)
    sasl.register(Reg())
    assert {k: v[:2] for k, v in got.items()} == {17: (0, 1), 36: (0, 2)}
    resp = got[17][2](SimpleNamespace(api_key=17, api_version=1), SimpleNamespace(mechanism="SCRAM-SHA-256"))
    assert resp.error_code == ErrorCode.illegal_sasl_state
    resp = got[36][2](SimpleNamespace(api_key=36, api_version=2), SimpleNamespace(auth_bytes=b"x"))
    assert resp.error_code == ErrorCode.illegal_sasl_state
