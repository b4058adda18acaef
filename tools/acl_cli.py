"""``mesh user`` and ``mesh acl``: principals and Kafka-style ACLs (registered in tools/cli.py).

    mesh user add alice --out alice.creds --creds secrets/admin.creds [--kafka-password]
    mesh user kafka-password alice [--kafka-password-file FILE]   (set or change it)
    mesh user list / mesh user remove alice
    mesh acl add --principal alice --allow write,describe --topic orders [--prefix]
    mesh acl add --principal bob --deny read --group billing
    mesh acl list [--principal alice] / mesh acl remove ID

Every command takes ``--creds FILE`` (default: $MESH_CREDS; none: an open cluster) and
``--bootstrap``. ``user add --out`` makes the user's keypair here (the secret key never
travels), writes the creds file (mode 0600, ``mesh.security.creds``) with the cluster's
public key taken from the admin's creds, then registers the public key; if registering
fails the new file is removed again. The rules of ACLs are ``mesh.security.acl``'s.
"""
from __future__ import annotations

import json
import os
import sys

import click

from tools.common import bootstrap_option, friendly

__all__ = ["user", "acl"]


_client_options = bootstrap_option
_friendly = friendly


def _admin(bootstrap: str):
    from mesh.client import Admin
    return Admin(bootstrap)   # creds: $MESH_CREDS (set by --creds)


# -- users -----------------------------------------------------------------------------
@click.group()
def user() -> None:
    """Principals: users who connect with a creds file (CURVE keypair)."""


@user.command("add")
@click.argument("name")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="make a keypair here and write NAME's creds file to this path (mode 0600)")
@click.option("--public-key", default=None, help="register this CURVE public key (Z85) instead of making one")
@click.option("--force", is_flag=True, help="with --out: overwrite an existing file")
@click.option("--kafka-password", "kafka_prompt", is_flag=True,
              help="also give NAME a Kafka password (SASL SCRAM), asked for here (hidden, twice)")
@click.option("--kafka-password-file", type=click.File("r"), default=None,
              help="the Kafka password: the first line of this file ('-': stdin)")
@click.option("--kafka-iterations", type=click.IntRange(4096, 16384), default=None,
              help="SCRAM iterations (4096..16384; default 8192)")
@_client_options
@_friendly
def user_add(name, out, public_key, force, kafka_prompt, kafka_password_file, kafka_iterations, bootstrap) -> None:
    """Add user NAME (then grant it ACLs with `mesh acl add --principal NAME`).

    With --kafka-password(-file) NAME can also log in to the Kafka port (SASL
    SCRAM-SHA-256/512): only SCRAM credentials are stored, never the password. Adding an
    existing user again with its --public-key and a Kafka password changes the password."""
    from mesh.security.acl import check_user_name
    from mesh.security.creds import Creds, load_creds, new_keypair
    from mesh.security.registry import check_public_key
    check_user_name(name)
    if (out is None) == (public_key is None):
        raise click.UsageError("give exactly one of --out FILE (make a keypair) or --public-key KEY")
    kafka_password = _kafka_password(kafka_prompt, kafka_password_file)
    new_file = None
    if out is not None:
        admin_creds = load_creds()
        if admin_creds is None:
            raise click.UsageError("--out needs the cluster's public key: give --creds (an admin's creds file)")
        if os.path.exists(out) and not force:
            raise click.UsageError(f"{out} exists (use --force to overwrite it)")
        public_key, secret = new_keypair()
        Creds(name, public_key, secret, admin_creds.cluster_public_key).save(out)
        new_file = out
    else:
        check_public_key(public_key)
    try:
        with _admin(bootstrap) as admin:
            admin.add_user(name, public_key, kafka_password=kafka_password, kafka_iterations=kafka_iterations)
    except BaseException:
        if new_file is not None:
            os.unlink(new_file)
        raise
    click.echo(f"added user {name}" + (f"; creds in {new_file} (mode 0600)" if new_file else "")
               + ("; Kafka password set (SCRAM-SHA-256, SCRAM-SHA-512)" if kafka_password is not None else ""))


def _kafka_password(prompt: bool, file) -> str | None:
    if prompt and file is not None:
        raise click.UsageError("give at most one of --kafka-password (asked for) or --kafka-password-file FILE")
    if file is not None:
        password = file.readline().rstrip("\r\n")
    elif prompt:
        password = click.prompt("Kafka password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        return None
    if not 1 <= len(password) <= 1024:
        raise click.UsageError("a Kafka password is 1-1024 characters")
    return password


@user.command("kafka-password")
@click.argument("name")
@click.option("--kafka-password-file", type=click.File("r"), default=None,
              help="the new password: the first line of this file ('-': stdin); default: asked for")
@click.option("--kafka-iterations", type=click.IntRange(4096, 16384), default=None,
              help="SCRAM iterations (4096..16384; default 8192)")
@_client_options
@_friendly
def user_kafka_password(name, kafka_password_file, kafka_iterations, bootstrap) -> None:
    """Set or change user NAME's Kafka password (SASL SCRAM; only credentials are stored)."""
    password = _kafka_password(kafka_password_file is None, kafka_password_file)
    with _admin(bootstrap) as admin:
        key = next((u["public_key"] for u in admin.list_users() if u["name"] == name and not u.get("static")), None)
        if key is None:
            raise click.UsageError(f"no user named {name} (add it with: mesh user add {name} ...)")
        admin.add_user(name, key, kafka_password=password, kafka_iterations=kafka_iterations)
    click.echo(f"Kafka password of {name} set (SCRAM-SHA-256, SCRAM-SHA-512)")


@user.command("remove")
@click.argument("name")
@_client_options
@_friendly
def user_remove(name, bootstrap) -> None:
    """Remove user NAME: its requests are refused everywhere within seconds (its ACLs stay)."""
    with _admin(bootstrap) as admin:
        admin.remove_user(name)
    click.echo(f"removed user {name}")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_client_options
@_friendly
def user_list(as_json, bootstrap) -> None:
    """Users: gossip ones, then the answering broker's superusers from its secrets."""
    with _admin(bootstrap) as admin:
        users = admin.list_users()
    if as_json:
        click.echo(json.dumps(users, indent=2, sort_keys=True))
        return
    for u in users:
        click.echo(f"{u['name']:<24} {u['public_key']}" + ("  (superuser, from the secrets)" if u.get("static") else "")
                   + (f"  kafka: {','.join(u['kafka'])}" if u.get("kafka") else ""))


# -- ACLs ------------------------------------------------------------------------------
@click.group()
def acl() -> None:
    """ACLs (Kafka's): allow or deny operations on topics, groups, the cluster; deny wins."""


def _resource(topic, group, cluster) -> tuple[str, str]:
    given = [(r, n) for r, n in (("topic", topic), ("group", group)) if n is not None]
    if cluster:
        given.append(("cluster", "cluster"))
    if len(given) != 1:
        raise click.UsageError("give exactly one of --topic NAME, --group NAME, --cluster")
    return given[0]


def _row(a: dict) -> str:
    how = "prefixed " if a["pattern"] == "prefixed" else ""
    return (f"{a['id']}  {a['principal']:<16} {a['permission']:<5} {','.join(a['operations']):<22} "
            f"{a['resource']:<7} {how}{a['name']}")


@acl.command("add")
@click.option("--principal", required=True, help="a user name, or '*' for everyone")
@click.option("--allow", "allow", default=None, metavar="OPS",
              help="operations to allow: read,write,create,delete,describe,alter,all")
@click.option("--deny", "deny", default=None, metavar="OPS", help="operations to deny (deny wins)")
@click.option("--topic", default=None, help="a topic name ('*': every topic)")
@click.option("--group", default=None, help="a consumer group name ('*': every group)")
@click.option("--cluster", is_flag=True, help="the cluster (create topics, users and ACLs, list groups)")
@click.option("--prefix", is_flag=True, help="the name is a prefix: every topic or group starting with it")
@_client_options
@_friendly
def acl_add(principal, allow, deny, topic, group, cluster, prefix, bootstrap) -> None:
    """Add one ACL row (the same row added twice is one row)."""
    if (allow is None) == (deny is None):
        raise click.UsageError("give exactly one of --allow OPS or --deny OPS")
    resource, name = _resource(topic, group, cluster)
    with _admin(bootstrap) as admin:
        acl_id = admin.add_acl(principal, allow or deny, resource, name,
                               permission="allow" if allow else "deny",
                               pattern="prefixed" if prefix else "literal")
    click.echo(f"added ACL {acl_id}")


@acl.command("list")
@click.option("--principal", default=None)
@click.option("--topic", default=None)
@click.option("--group", default=None)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_client_options
@_friendly
def acl_list(principal, topic, group, as_json, bootstrap) -> None:
    """ACL rows, by id (filters: all must match)."""
    if topic is not None and group is not None:
        raise click.UsageError("give at most one of --topic, --group")
    resource = "topic" if topic is not None else "group" if group is not None else None
    with _admin(bootstrap) as admin:
        rows = admin.list_acls(principal=principal, resource=resource,
                               name=topic if topic is not None else group)
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for a in rows:
        click.echo(_row(a))


@acl.command("remove")
@click.argument("acl_id", metavar="ID")
@_client_options
@_friendly
def acl_remove(acl_id, bootstrap) -> None:
    """Remove ACL row ID (see `mesh acl list`)."""
    with _admin(bootstrap) as admin:
        removed = admin.remove_acl(acl_id)
    if not removed:
        click.echo(f"error: no ACL with id {acl_id}", err=True)
        sys.exit(1)
    click.echo(f"removed ACL {_row(removed[0])}")
