"""The Kafka listener in a process of its own, beside its node (as the text gateway).

Why a process: a Kafka client's records are converted one by one (Kafka v2 batches to the
mesh's columns and back), Python work that in the node's process would hold the GIL the
node loop needs (``mesh.gateway.process`` measured what that costs). The listener is one
more client of its node: it needs the node's address, its Kafka host, port and node id.

- ``KafkaProcess.start`` runs ``python -m mesh.kafka.process`` and waits (at most
  ``START_WAIT_S``) for its first line on stdout: ``ready`` once it listens, else the
  reason it could not (a port in use), raised as ``KafkaError``. Its log lines go to the
  node's stderr, named ``[<node>/kafka]``.
- The child ends on SIGTERM/SIGINT, and on its own when its parent is gone (``getppid``
  every ``mesh.gateway.process.PARENT_POLL_S``), so a node killed with -9 leaves no listener
  on its port. The child's life (its arguments, ``ready``, stop) is the text gateway's
  (``mesh.gateway.process.run_child``); only what it serves differs (``_serve``).
- ``close``: SIGTERM, then SIGKILL after ``CLOSE_WAIT_S``. Idempotent.
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys

from mesh.gateway.process import GatewayProcess, child_args, run_child

__all__ = ["KafkaProcess", "KafkaError", "kafka_listener_of", "main", "security_argv"]

log = logging.getLogger("mesh.kafka.process")

START_WAIT_S = 20.0
CLOSE_WAIT_S = 3.0
GC_GEN0_THRESHOLD = 100_000   # container allocations between young collections (CPython's default: 700)


def tune_gc() -> None:
    """The collector for a process that makes thousands of short-lived objects per request
    (``convert``: aiokafka's record objects, one per Kafka record) and keeps few cycles.
    At CPython's default threshold a young collection ran every 700 allocations, in the
    middle of each conversion, walking and promoting the batch's live records (and every
    tenth of those an older generation; every hundredth all 50,000 startup objects): a
    quarter of the listener's CPU under ``bench run --scenario kafka``. Here the startup
    objects are frozen (``gc.freeze``: never walked again) and a young collection waits
    until ``GC_GEN0_THRESHOLD`` more tracked objects were made than freed (a request's
    records are freed by reference counting as soon as it is converted); the rare cycles
    are still collected, and the garbage they hold is bounded by the threshold."""
    gc.collect()
    gc.freeze()
    _g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, g1, g2)


class KafkaError(Exception):
    """The Kafka listener process could not start (the reason is the message)."""


class KafkaProcess(GatewayProcess):
    WHAT = "the Kafka listener process"
    ERROR = KafkaError
    CLOSE_WAIT_S = CLOSE_WAIT_S

    @classmethod
    def start(cls, address: str, host: str, port: int, kafka_id: int, *, node_id: str,
              creds_path: str | None = None, extra: list[str] | None = None,
              start_wait_s: float = START_WAIT_S, config=None) -> "KafkaProcess":
        """``config``: the node's ``NodeConfig``, for the listener's security (``security_argv``)."""
        argv = [sys.executable, "-m", "mesh.kafka.process", "--node", node_id, "--address", address,
                "--host", host, "--port", str(port), "--kafka-id", str(kafka_id),
                "--log-level", str(logging.getLogger().getEffectiveLevel())] + list(extra or [])
        if creds_path:
            argv += ["--creds", creds_path]
        if config is not None:
            argv += security_argv(config)
            if config.max_connections_per_ip:   # the node's bound holds on its Kafka port too
                argv += ["--max-connections-per-ip", str(config.max_connections_per_ip)]
        return cls.spawn(argv, start_wait_s)


def security_argv(config) -> list[str]:
    """The listener's security arguments from its node's ``NodeConfig``: the secrets
    directory (SASL with the mesh's users; ``mesh.kafka.security``) and the TLS files."""
    argv = ["--secrets", str(config.secrets_dir)] if config.secrets_dir else []
    if config.kafka_tls_cert:
        argv += ["--tls-cert", str(config.kafka_tls_cert), "--tls-key", str(config.kafka_tls_key)]
    return argv


def kafka_listener_of(config, secured: bool, insecure: bool) -> tuple[str, int, int] | None:
    """(host, port, Kafka node id) of a node's Kafka listener (``NodeConfig``), or None (no
    --kafka-port). An open node serves Kafka clients on loopback only, as its own port
    (unless --insecure); a secured one requires SASL on it (mesh.kafka.security). A
    listener that may not run is a KafkaError (the node stops at start with it)."""
    from mesh.kafka.ids import derive_node_id
    from mesh.security.broker import is_loopback
    if config.kafka_port is None:
        return None
    host = config.kafka_host or config.bind.rpartition(":")[0]
    if not secured and not insecure and not is_loopback(host):
        raise KafkaError(f"the Kafka listener of an open node binds loopback only, not {host}: bind "
                           f"127.0.0.1 (--kafka-host), or pass --insecure to run open on purpose")
    kid = config.kafka_node_id if config.kafka_node_id is not None else derive_node_id(config.node_id)
    return host, config.kafka_port, kid


def main(argv: list[str] | None = None) -> int:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--kafka-id", type=int, required=True)
        p.add_argument("--secrets", help="the node's secrets directory: SASL required (mesh.kafka.security)")
        p.add_argument("--tls-cert", help="PEM certificate chain: the port speaks TLS (mesh.kafka.tls)")
        p.add_argument("--tls-key", help="PEM private key of --tls-cert")
        p.add_argument("--max-request-bytes", type=int, default=100 << 20)
        p.add_argument("--max-connections-per-ip", type=int, default=0,
                       help="open connections from one source address (max.connections.per.ip); 0 = off")

    args = child_args("python -m mesh.kafka.process", "The Kafka wire-protocol listener of one node (started by "
                      "the node).", argv, more)
    return run_child(args, "kafka", "the Kafka listener", f"Kafka listener on {args.host}:{args.port}",
                     lambda: _serve(args), log)


def _serve(args: argparse.Namespace):
    """Start the listener (``main``'s arguments); how to stop it."""
    from mesh.kafka.handlers import core_registry
    from mesh.kafka.link import MeshLinks, MetaCache
    from mesh.kafka.server import KafkaServer, ServerLimits
    from mesh.kafka import sasl
    from mesh.kafka.security import ListenerSecurity
    # security (mesh.kafka.security): on a secured node SASL with the mesh's users, every
    # request authorized by its ACLs here, the native client with the cluster keypair
    sec = ListenerSecurity.start(args.address, secrets_dir=args.secrets, tls_cert=args.tls_cert,
                                 tls_key=args.tls_key)
    creds = sec.node_creds(args.secrets)
    if creds is None and args.creds:
        from mesh.security.creds import Creds
        creds = Creds.load(args.creds)
    links = MeshLinks(args.address, creds)
    cache = MetaCache(links, args.node, args.host, args.port, args.kafka_id)
    reg = core_registry()
    if sec.secured:
        sasl.register(reg)
    from mesh.client.transport import Transport
    from mesh.kafka.groups import ClassicGroups
    # classic consumer groups on the mesh's server-side assignor (mesh.kafka.groups)
    groups = ClassicGroups(Transport(creds=creds), [args.address])
    versions = groups.versions()
    for key, fn in groups.handlers().items():
        reg.register(key, *versions[key], fn)
    server = KafkaServer(args.host, args.port, reg, cache, links, authorizer=sec.authorizer,
                         limits=ServerLimits(max_request_bytes=args.max_request_bytes,
                                             max_connections_per_ip=max(0, args.max_connections_per_ip)),
                         auth=(lambda conn: sec.new_session()) if sec.secured else None,
                         ssl_context=sec.ssl_context)
    tune_gc()
    log.info("Kafka listener of %s on %s:%d (Kafka node id %d)", args.node, args.host, server.port, args.kafka_id)

    def close() -> None:
        server.close()
        groups.close()
        links.close_all()
        sec.close()
    return close


if __name__ == "__main__":
    sys.exit(main())
