"""The gossip core of a starting node, from the snapshot its store holds (or none).

``open_gossip`` decides whether the node relearns the cluster from its peers instead of
trusting its snapshot (--reset-gossip, or partitions on disk and no snapshot: an empty view
would drop every one of them at the first reconcile, and the replicas would then vote with
raft state for logs they deleted), and turns a snapshot that does not load into one
``StartupError`` saying the way out. ``make_gossip`` builds the core (at start, and to check
that a snapshot loads after an internal error).
"""
from __future__ import annotations

import logging
import os
import random

import msgpack

from mesh.cluster import keys, schema
from mesh.gossip import Gossip, GossipConfig
from mesh.gossip.snapshot import ForeignSnapshot
from mesh.node.limits.bounds import StartupError
from storage.datadir import refuse_from_now_on

log = logging.getLogger("mesh.node.loop")   # the start-up messages are the node's


def seeded_rng() -> random.Random:
    return random.Random(int.from_bytes(os.urandom(8), "big"))


def make_gossip(config, address: str, generation: int, seeds: list[str], snapshot: dict | None,
                wall_ms: int) -> Gossip:
    return Gossip(config.node_id, address, generation, seeds, seeded_rng(),
                  GossipConfig.lan(interval_ms=config.gossip_interval_ms), wall_ms,
                  snapshot=snapshot, validate_entry=schema.validate_entry, register_prefixes=keys.REGISTER_PREFIXES)


def open_gossip(config, address: str, store, generation: int, seeds: list[str], wall_ms: int) -> tuple[Gossip, bool]:
    """The gossip core and whether the node relearns the cluster from ``seeds``."""
    relearning = config.reset_gossip
    if config.reset_gossip:
        if not seeds:
            raise StartupError("--reset-gossip needs --seed: this node relearns the cluster from its peers")
        log.warning("starting without the gossip snapshot (--reset-gossip): relearning the cluster from "
                    "peers %s; raft state and logs are kept", ",".join(seeds))
    try:
        raw = None if config.reset_gossip else store.get("gossip", b"snapshot")
        if raw is None and not config.reset_gossip and store.items("meta", b"pid:"):
            if not seeds:
                why = (f"the store in {config.data_dir} holds partitions but no gossip snapshot, and there "
                       f"is no peer to relearn the cluster from. The way out: restart with --seed of a live "
                       f"broker (raft state and logs are kept), or with --rejoin-empty, which moves the "
                       f"directory aside (renamed, not deleted) and starts empty")
                refuse_from_now_on(config.data_dir, why)   # so that --rejoin-empty moves it aside
                raise StartupError(why)
            log.warning("the store holds partitions but no gossip snapshot: relearning the cluster from "
                        "peers %s before anything is dropped (as --reset-gossip)", ",".join(seeds))
            relearning = True
        snapshot = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None
        return make_gossip(config, address, generation, seeds, snapshot, wall_ms), relearning
    except StartupError:
        raise
    except Exception as exc:
        if isinstance(exc, ForeignSnapshot):   # another broker's store under this name
            raise StartupError(
                f"the gossip snapshot in {config.data_dir} belongs to another node: this store is not "
                f"{config.node_id}'s. Check --id and --data, or restart with --rejoin-empty (the "
                f"directory is moved aside); never --reset-gossip, which would keep its raft state") from exc
        raise StartupError(
            f"the gossip snapshot in {config.data_dir} cannot be loaded ({type(exc).__name__}: {exc}). "
            "Restart with --reset-gossip (and --seed of a live broker) to start without it and relearn "
            "the cluster from peers; raft state and logs are kept") from exc
