"""``mesh security ...``, the node's security options, and ``--creds`` for client commands.

- ``mesh security init --dir secrets``: a new cluster keypair (``secrets/cluster.key``), a
  first superuser ``admin`` (``secrets/admin.creds``, its key in ``secrets/superusers.json``);
  every file written 0600.
- ``node_security_options``: ``mesh node --secrets DIR --superuser NAME --insecure
  --max-connections N --text-creds FILE --kafka-tls-cert FILE --kafka-tls-key FILE``, handed
  to the node function as one ``security`` dict of NodeConfig fields (the Kafka listener
  loads the TLS files when it starts: a bad one stops the node's start with the reason).
- ``creds_option``: ``--creds FILE`` (default $MESH_CREDS) on every client command; the file
  is checked at once (a missing, malformed or group/world-readable one is one clear error)
  and passed on through $MESH_CREDS, which every client (``mesh.security.load_creds``) reads.
"""
from __future__ import annotations

import functools
import os
import sys

import click

from mesh.security.creds import CREDS_ENV, Creds, CredsError, init_secrets
from mesh.security.zap import DEFAULT_MAX_CONNECTIONS

__all__ = ["security", "node_security_options", "creds_option"]


def _use_creds(ctx, param, value):
    if value:
        try:
            Creds.load(value)
        except CredsError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        os.environ[CREDS_ENV] = value
    return value


def creds_option(f):
    """``--creds FILE``: the principal this command acts as (a secured cluster)."""
    return click.option("--creds", type=click.Path(dir_okay=False), default=None, expose_value=False,
                        callback=_use_creds, is_eager=True,
                        help=f"credentials file (mesh security init / mesh user add); default ${CREDS_ENV}")(f)


def node_security_options(f):
    """The security options of ``mesh node``, passed to ``f`` as ``security=dict(...)``."""
    @click.option("--secrets", "secrets_dir", type=click.Path(file_okay=False), default=None,
                  help="secrets directory (mesh security init): CURVE and authentication on every "
                       "connection. Without it the node runs open, and only on loopback")
    @click.option("--superuser", "superusers", multiple=True,
                  help="a user (mesh user add) allowed everything, like the admin of init (repeatable)")
    @click.option("--insecure", is_flag=True,
                  help="allow running open (no --secrets) on a non-loopback address; logs a warning")
    @click.option("--max-connections", type=click.IntRange(min=1), default=DEFAULT_MAX_CONNECTIONS,
                  show_default=True, help="open connections at once (clients and peers); new handshakes "
                                          "beyond it are refused until some close")
    @click.option("--max-connections-per-ip", type=click.IntRange(min=0), default=0, show_default=True,
                  help="open connections at once from one source IP address (Kafka max.connections.per.ip); "
                       "beyond it new handshakes from that address are refused until some close; 0 = no "
                       "bound. Secured: brokers (the cluster key) are not held back. The Kafka port "
                       "(--kafka-port) has the same bound")
    @click.option("--text-creds", type=click.Path(dir_okay=False), default=None,
                  help="secured node with --text-port: the creds file of the principal the text gateway "
                       "acts as (the gateway has no authentication of its own: loopback only)")
    @click.option("--kafka-tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="the Kafka port speaks TLS with this PEM certificate (chain); with --kafka-tls-key")
    @click.option("--kafka-tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="the PEM private key of --kafka-tls-cert (mode 0600)")
    @functools.wraps(f)
    def wrapper(*args, secrets_dir, superusers, insecure, max_connections, max_connections_per_ip, text_creds, kafka_tls_cert,
                kafka_tls_key, **kwargs):
        # (the listener loads them when it starts, and the node refuses to start if it cannot)
        if (kafka_tls_cert is None) != (kafka_tls_key is None):
            raise click.UsageError("give both --kafka-tls-cert FILE and --kafka-tls-key FILE (or neither)")
        if kafka_tls_cert is not None and kwargs.get("kafka_port", 0) is None:
            raise click.UsageError("--kafka-tls-cert is for the Kafka port: give --kafka-port too")
        security = {"secrets_dir": secrets_dir, "superusers": list(superusers), "insecure": insecure,
                    "max_connections": max_connections,
                    "max_connections_per_ip": max_connections_per_ip, "text_creds": text_creds,
                    "kafka_tls_cert": kafka_tls_cert, "kafka_tls_key": kafka_tls_key}
        return f(*args, security=security, **kwargs)
    return wrapper


@click.group()
def security() -> None:
    """Cluster keys and credentials files (CurveZMQ)."""


@security.command("init")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="the secrets directory to create (give it to every broker: mesh node --secrets DIR)")
@click.option("--admin", default="admin", show_default=True, help="name of the first superuser")
@click.option("--force", is_flag=True, help="replace an existing cluster key (old creds stop working)")
def security_init(directory, admin, force) -> None:
    """Create a cluster keypair and a first superuser's credentials file."""
    try:
        _, creds_path = init_secrets(directory, admin=admin, force=force)
    except (CredsError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"cluster key:   {os.path.join(directory, 'cluster.key')} (every broker: mesh node --secrets "
               f"{directory})")
    click.echo(f"superuser:     {admin}, credentials in {creds_path} (mesh ... --creds {creds_path})")
    click.echo("keep both secret: they are written with mode 0600")
