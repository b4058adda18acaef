"""CURVE keys on disk: a principal's credentials file and a broker's secrets directory.

A *creds file* (``alice.creds``, like a NATS creds file) holds one principal's CURVE keypair
and the cluster's public key (the key every broker's ROUTER serves with), as JSON::

    {"mesh_creds": 1, "principal": "alice", "public_key": "<z85>", "secret_key": "<z85>",
     "cluster_public_key": "<z85>"}

A *secrets directory* (``mesh security init --dir secrets``) is what a broker starts with
(``mesh node --secrets DIR``):

- ``cluster.key``: the cluster keypair (``{"mesh_cluster_key": 1, "public_key", "secret_key"}``);
  every broker of the cluster has the same one: it is how brokers know each other;
- ``superusers.json``: ``{name: public_key}``: principals every broker knows by key and
  allows everything (``init`` records its ``admin``);
- ``admin.creds``: the first superuser's creds file (hand it to the operator; a broker does
  not need it).

Rules: every file holding a secret key is written with mode 0600, atomically (a temporary
file in the same directory, fsynced, renamed), and refused when it is readable by group or
others (``chmod 600 FILE`` is the way out, and the error says so). Keys are 40-character
Z85 text (``zmq.curve_keypair``).
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

__all__ = ["Creds", "ClusterKey", "Secrets", "load_creds", "new_keypair", "init_secrets",
           "write_private", "check_private", "CredsError", "CREDS_ENV", "BROKER_PRINCIPAL"]

CREDS_ENV = "MESH_CREDS"
BROKER_PRINCIPAL = "broker"     # what ZAP calls a peer that proved it holds the cluster key
_Z85_LEN = 40


class CredsError(ValueError):
    """A credentials or secrets file that cannot be used; the message says why and what to do."""


def new_keypair() -> tuple[str, str]:
    """A fresh CURVE keypair as Z85 text: (public, secret)."""
    import zmq
    pub, sec = zmq.curve_keypair()
    return pub.decode("ascii"), sec.decode("ascii")


def check_private(path: str | os.PathLike) -> None:
    """Refuse a secret file that group or others may read (or write)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CredsError(f"{os.fspath(path)}: no such file") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredsError(f"{os.fspath(path)} holds a secret key but is readable by others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}): run chmod 600 {os.fspath(path)}")


def write_private(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` with mode 0600, atomically (never a partial or a
    world-readable file, even for an instant)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)   # whatever the umask
        os.write(fd, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_json(path: str | os.PathLike, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise CredsError(f"{what} {os.fspath(path)}: no such file") from None
    except (OSError, ValueError) as exc:
        raise CredsError(f"{what} {os.fspath(path)} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise CredsError(f"{what} {os.fspath(path)} is not a JSON object")
    return data


def _key(data: dict, name: str, path) -> str:
    v = data.get(name)
    if not isinstance(v, str) or len(v) != _Z85_LEN:
        raise CredsError(f"{os.fspath(path)}: {name} is missing or not a 40-character Z85 key")
    return v


@dataclass(frozen=True, slots=True)
class Creds:
    """A principal's CURVE keypair and the cluster's public key (Z85 text)."""
    principal: str
    public_key: str
    secret_key: str
    cluster_public_key: str

    def __repr__(self) -> str:   # never print a secret key
        return f"Creds(principal={self.principal!r}, public_key={self.public_key!r})"

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Creds":
        check_private(path)
        data = _read_json(path, "credentials file")
        if data.get("mesh_creds") != 1:
            raise CredsError(f"{os.fspath(path)} is not a mesh credentials file (no \"mesh_creds\": 1)")
        principal = data.get("principal")
        if not isinstance(principal, str) or not principal:
            raise CredsError(f"{os.fspath(path)}: principal is missing")
        return cls(principal, _key(data, "public_key", path), _key(data, "secret_key", path),
                   _key(data, "cluster_public_key", path))

    def save(self, path: str | os.PathLike) -> None:
        write_private(path, {"mesh_creds": 1, "principal": self.principal, "public_key": self.public_key,
                             "secret_key": self.secret_key, "cluster_public_key": self.cluster_public_key})

    def apply(self, sock) -> None:
        """Make ``sock`` (a DEALER about to connect) a CURVE client with these credentials."""
        sock.curve_publickey = self.public_key.encode("ascii")
        sock.curve_secretkey = self.secret_key.encode("ascii")
        sock.curve_serverkey = self.cluster_public_key.encode("ascii")


def load_creds(creds: "str | os.PathLike | Creds | None" = None) -> Creds | None:
    """``creds`` as given (a Creds, or the path of a creds file); None: the file named by
    $MESH_CREDS; else None (an open cluster)."""
    if isinstance(creds, Creds):
        return creds
    if creds is None:
        creds = os.environ.get(CREDS_ENV) or None
        if creds is None:
            return None
    return Creds.load(creds)


@dataclass(frozen=True, slots=True)
class ClusterKey:
    public_key: str
    secret_key: str


@dataclass(frozen=True, slots=True)
class Secrets:
    """What a broker reads from its secrets directory."""
    cluster: ClusterKey
    superusers: dict          # name -> public key (Z85)

    def creds(self, principal: str = BROKER_PRINCIPAL) -> Creds:
        """The broker's own credentials: it connects to its peers with the cluster keypair."""
        c = self.cluster
        return Creds(principal, c.public_key, c.secret_key, c.public_key)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Secrets":
        d = os.fspath(directory)
        if not os.path.isdir(d):
            raise CredsError(f"secrets directory {d}: no such directory (create one with: "
                             f"mesh security init --dir {d})")
        kpath = os.path.join(d, "cluster.key")
        check_private(kpath)
        data = _read_json(kpath, "cluster key file")
        cluster = ClusterKey(_key(data, "public_key", kpath), _key(data, "secret_key", kpath))
        supers: dict[str, str] = {}
        spath = os.path.join(d, "superusers.json")
        if os.path.exists(spath):
            mode = stat.S_IMODE(os.stat(spath).st_mode)
            if mode & (stat.S_IWGRP | stat.S_IWOTH):   # whoever may write it may make themselves a superuser
                raise CredsError(f"{spath} names the superusers but others may write it (mode {mode:04o}): "
                                 f"anyone who can write it can make themselves a superuser; run chmod go-w {spath}")
            raw = _read_json(spath, "superusers file")
            for name, key in sorted(raw.items()):
                if not isinstance(key, str) or len(key) != _Z85_LEN:
                    raise CredsError(f"{spath}: the key of superuser {name!r} is not a 40-character Z85 key")
                supers[str(name)] = key
        return cls(cluster, supers)


def init_secrets(directory: str | os.PathLike, admin: str = "admin", force: bool = False) -> tuple[Secrets, str]:
    """Create a secrets directory: a new cluster keypair, a superuser ``admin`` (its creds
    file ``<dir>/<admin>.creds`` and its key in ``superusers.json``). Refuses to overwrite
    an existing cluster key unless ``force``. Returns (secrets, creds file path)."""
    d = os.fspath(directory)
    os.makedirs(d, mode=0o700, exist_ok=True)
    kpath = os.path.join(d, "cluster.key")
    if os.path.exists(kpath) and not force:
        raise CredsError(f"{kpath} exists: this directory already holds a cluster key (--force replaces it, "
                         f"and every broker and creds file of the old key stops working)")
    pub, sec = new_keypair()
    write_private(kpath, {"mesh_cluster_key": 1, "public_key": pub, "secret_key": sec})
    apub, asec = new_keypair()
    creds = Creds(admin, apub, asec, pub)
    cpath = os.path.join(d, f"{admin}.creds")
    creds.save(cpath)
    write_private(os.path.join(d, "superusers.json"), {admin: apub})
    return Secrets(ClusterKey(pub, sec), {admin: apub}), cpath
