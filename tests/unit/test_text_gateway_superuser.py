"""The text gateway acting as a superuser is allowed, never silent (issue 39, finding 10)."""
from __future__ import annotations

import logging

import pytest
import zmq

from mesh.security import Creds, init_secrets
from mesh.security.broker import BrokerSecurity, check_text_gateway
from mesh.security.creds import new_keypair


@pytest.fixture
def secured(tmp_path):
    secrets, admin_path = init_secrets(tmp_path / "secrets")
    ctx = zmq.Context()
    sec = BrokerSecurity(ctx, secrets_dir=str(tmp_path / "secrets"), superusers=["ops"], binds=["127.0.0.1:1"])
    yield sec, admin_path, secrets.cluster.public_key
    sec.close()
    ctx.term()


def _user(tmp_path, name: str, cluster_key: str) -> str:
    pub, sec = new_keypair()
    path = tmp_path / f"{name}.creds"
    Creds(name, pub, sec, cluster_key).save(path)
    return str(path)


def test_the_admins_creds_as_the_text_principal_warn_loudly(secured, caplog):
    sec, admin_path, _ = secured
    with caplog.at_level(logging.WARNING, logger="mesh.security"):
        creds = check_text_gateway(sec, "127.0.0.1:7101", 7102, admin_path)
    assert creds.principal == "admin"
    warned = [r.getMessage() for r in caplog.records if "SUPERUSER" in r.getMessage()]
    assert warned and "'admin'" in warned[0], caplog.text


def test_a_superuser_by_name_warns_and_a_plain_user_does_not(secured, tmp_path, caplog):
    sec, _, cluster_key = secured
    with caplog.at_level(logging.WARNING, logger="mesh.security"):
        check_text_gateway(sec, "127.0.0.1:7101", 7102, _user(tmp_path, "ops", cluster_key))
    assert "SUPERUSER" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mesh.security"):
        check_text_gateway(sec, "127.0.0.1:7101", 7102, _user(tmp_path, "text", cluster_key))
    assert "SUPERUSER" not in caplog.text
