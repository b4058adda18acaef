"""TLS for the Kafka listener (mesh/kafka/tls.py, mesh node --kafka-tls-cert/--kafka-tls-key):
a self-signed certificate made with the openssl CLI serves a real TLS handshake; bad files
fail at start with the file named."""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading

import pytest
from click.testing import CliRunner

from mesh.kafka.tls import TlsError, check_tls_options, server_ssl_context

try:
    from tests.tooling import need       # a missing tool skips, and fails under CI
except ImportError:                      # (before tests/tooling.py)
    def need(tool: str, how: str = "") -> str:
        path = shutil.which(tool)
        if path is None:
            pytest.skip(f"{tool} is not installed ({how or 'apt-get install ' + tool})")
        return path


def self_signed(d) -> tuple[str, str]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key (mode 0600)."""
    openssl = need("openssl", "apt-get install openssl")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    os.chmod(key, 0o600)
    return cert, key


def test_the_context_serves_a_tls_handshake(tmp_path):
    cert, key = self_signed(tmp_path)
    server_ctx = server_ssl_context(cert, key)
    assert server_ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    a, b = socket.socketpair()
    got = {}

    def serve():
        with server_ctx.wrap_socket(a, server_side=True) as s:
            got["data"] = s.recv(5)
            s.sendall(b"pong!")
    t = threading.Thread(target=serve)
    t.start()
    client_ctx = ssl.create_default_context(cafile=cert)
    with client_ctx.wrap_socket(b, server_hostname="localhost") as c:
        c.sendall(b"ping!")
        assert c.recv(5) == b"pong!"
        assert c.version() in ("TLSv1.2", "TLSv1.3")
    t.join(10)
    assert got["data"] == b"ping!"


def test_bad_files_fail_with_the_file_named(tmp_path):
    cert, key = self_signed(tmp_path)
    with pytest.raises(TlsError, match="no such file"):
        server_ssl_context(cert, tmp_path / "missing.pem")
    os.chmod(key, 0o644)
    with pytest.raises(TlsError, match="readable by others"):
        server_ssl_context(cert, key)
    os.chmod(key, 0o600)
    with pytest.raises(TlsError, match="cannot load"):
        server_ssl_context(key, key)                 # a key where the certificate belongs
    assert check_tls_options(None, None) is None and check_tls_options(cert, key) == (cert, key)
    with pytest.raises(TlsError, match="both"):
        check_tls_options(cert, None)


def test_node_options(tmp_path):
    from tools.cli import main as cli
    cert, key = self_signed(tmp_path)
    run = CliRunner().invoke
    base = ["node", "--id", "n1", "--data", str(tmp_path / "d")]
    r = run(cli, base + ["--kafka-port", "19092", "--kafka-tls-cert", cert])
    assert r.exit_code != 0 and "both --kafka-tls-cert" in r.output
    r = run(cli, base + ["--kafka-port", "19092", "--kafka-tls-cert", cert, "--kafka-tls-key", str(tmp_path / "nope.pem")])
    assert r.exit_code != 0 and "does not exist" in r.output
    r = run(cli, base + ["--kafka-tls-cert", cert, "--kafka-tls-key", key])
    assert r.exit_code != 0 and "give --kafka-port too" in r.output
    r = run(cli, ["node", "--help"])
    assert "--kafka-tls-cert" in r.output and "--kafka-tls-key" in r.output


def test_listener_security_open_and_tls(tmp_path):
    from mesh.kafka.security import ListenerSecurity
    from mesh.security.creds import CredsError
    open_ = ListenerSecurity.start("127.0.0.1:1")
    assert not open_.secured and open_.new_session() is None and open_.wait_ready(0) and open_.ssl_context is None
    assert open_.authorizer.allowed(None, "WRITE", "TOPIC", "t") and open_.node_creds(None) is None
    with pytest.raises(CredsError, match="no such directory"):
        ListenerSecurity.start("127.0.0.1:1", secrets_dir=tmp_path / "missing")
    cert, key = self_signed(tmp_path)
    sec = ListenerSecurity.start("127.0.0.1:1", tls_cert=cert, tls_key=key)
    assert isinstance(sec.ssl_context, ssl.SSLContext)
    from mesh.kafka.sasl import SaslSession
    assert "PLAIN" in SaslSession(sec.view.lookup, tls=True).mechanisms
