"""Creds files, the secrets directory, the ZAP decision and the open-mode bind check."""
from __future__ import annotations

import os
import stat

import pytest

from mesh.security import CREDS_ENV, Creds, CredsError, Secrets, init_secrets, load_creds
from mesh.security.broker import check_open_bind, is_loopback
from mesh.security.creds import new_keypair
from mesh.security.zap import decide


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_init_writes_private_files_that_load(tmp_path):
    d = tmp_path / "secrets"
    secrets, creds_path = init_secrets(d)
    for name in ("cluster.key", "admin.creds", "superusers.json"):
        assert _mode(d / name) == 0o600, name
    assert _mode(d) == 0o700
    creds = Creds.load(creds_path)
    assert creds.principal == "admin"
    assert creds.cluster_public_key == secrets.cluster.public_key
    loaded = Secrets.load(d)
    assert loaded.cluster == secrets.cluster
    assert loaded.superusers == {"admin": creds.public_key}
    assert "secret" not in repr(creds) and creds.secret_key not in repr(creds)


def test_init_refuses_to_replace_a_cluster_key(tmp_path):
    init_secrets(tmp_path)
    with pytest.raises(CredsError, match="already holds a cluster key"):
        init_secrets(tmp_path)
    old = Secrets.load(tmp_path).cluster
    init_secrets(tmp_path, force=True)
    assert Secrets.load(tmp_path).cluster != old


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_group_or_world_readable_files_are_refused(tmp_path, mode):
    _, creds_path = init_secrets(tmp_path)
    os.chmod(creds_path, mode)
    with pytest.raises(CredsError, match="chmod 600"):
        Creds.load(creds_path)
    os.chmod(tmp_path / "cluster.key", mode)
    with pytest.raises(CredsError, match="chmod 600"):
        Secrets.load(tmp_path)


def test_save_is_0600_whatever_the_umask(tmp_path):
    pub, sec = new_keypair()
    old = os.umask(0)
    try:
        Creds("alice", pub, sec, pub).save(tmp_path / "alice.creds")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "alice.creds") == 0o600
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_malformed_files_are_clear_errors(tmp_path):
    p = tmp_path / "x.creds"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not json")
    os.close(fd)
    with pytest.raises(CredsError, match="cannot be read"):
        Creds.load(p)
    with open(p, "w") as f:
        f.write('{"mesh_creds": 1, "principal": "a", "public_key": "short"}')
    with pytest.raises(CredsError, match="public_key"):
        Creds.load(p)
    with pytest.raises(CredsError, match="no such file"):
        Creds.load(tmp_path / "missing.creds")
    with pytest.raises(CredsError, match="mesh security init"):
        Secrets.load(tmp_path / "nowhere")


def test_load_creds_order(tmp_path, monkeypatch):
    _, creds_path = init_secrets(tmp_path)
    creds = Creds.load(creds_path)
    monkeypatch.delenv(CREDS_ENV, raising=False)
    assert load_creds(None) is None
    assert load_creds(creds) is creds
    assert load_creds(creds_path) == creds
    monkeypatch.setenv(CREDS_ENV, str(creds_path))
    assert load_creds(None) == creds


def test_zap_decision():
    cluster, _ = new_keypair()
    alice, _ = new_keypair()
    stranger, _ = new_keypair()
    known = {alice}.__contains__

    def d(mech, key, secured=True, n=1, cap=10):
        return decide(mech, key, cluster_key=cluster if secured else None, known_key=known,
                      connections=n, max_connections=cap)
    assert d(b"CURVE", cluster) == (b"200", b"OK", cluster.encode())
    assert d(b"CURVE", alice) == (b"200", b"OK", alice.encode())
    assert d(b"CURVE", stranger)[0] == b"400"
    assert d(b"NULL", None)[0] == b"400"            # secured: no anonymous connections
    assert d(b"NULL", None, secured=False) == (b"200", b"OK", b"")
    assert d(b"CURVE", alice, secured=False)[0] == b"400"
    assert d(b"CURVE", alice, n=11)[0] == b"300"     # the cap: temporary
    # a broker is never held back: raw connections that never authenticate count toward the
    # cap, and they kept a restarted broker out of its cluster
    assert d(b"CURVE", cluster, n=11) == (b"200", b"OK", cluster.encode())
    assert d(b"NULL", None, secured=False, n=10)[0] == b"200"
    assert d(b"NULL", None, secured=False, n=11)[0] == b"300"


def test_zap_decision_per_ip():
    cluster, _ = new_keypair()
    alice, _ = new_keypair()

    def d(key, open_, admitted, bound=3):
        return decide(b"CURVE", key, cluster_key=cluster, known_key={alice}.__contains__, connections=1,
                      max_connections=100, ip_connections=open_, ip_admitted=admitted,
                      max_connections_per_ip=bound)[0]
    assert d(alice, 3, 2) == b"200"
    assert d(alice, 4, 3) == b"300"          # the bound's worth admitted
    assert d(alice, 6, 0) == b"200"          # a burst of connects: the first ones get in
    assert d(alice, 7, 0) == b"300"          # more than twice the bound open (raw ones count)
    assert d(cluster, 50, 40) == b"200"      # a broker is never held back
    assert d(alice, 50, 40, bound=0) == b"200"   # 0: no bound (the default)


def test_loopback_and_open_bind():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert is_loopback("127.3.4.5")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("*")
    check_open_bind(["127.0.0.1:7101"], insecure=False)
    with pytest.raises(CredsError, match="--insecure"):
        check_open_bind(["0.0.0.0:7101"], insecure=False)
    check_open_bind(["0.0.0.0:7101"], insecure=True)   # allowed, with a warning


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_a_superusers_file_others_may_write_is_refused(tmp_path, mode):
    """Issue 39 finding 10: a superusers.json anyone could write was accepted silently."""
    init_secrets(tmp_path)
    os.chmod(tmp_path / "superusers.json", mode)
    with pytest.raises(CredsError, match="chmod go-w"):
        Secrets.load(tmp_path)
    os.chmod(tmp_path / "superusers.json", 0o644)   # public keys only: readable is fine
    assert "admin" in Secrets.load(tmp_path).superusers
