"""Effects shared by the sans-I/O cores.

A core never performs I/O: it returns effects and the node shell carries them out, persist
first, then send (the etcd-raft ``Ready`` contract). Cores with richer needs (replication)
define their own effect types next to their state machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Send"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` (a registered wire message) to ``dest`` (a node id or an address)."""
    dest: str
    msg: Any
    payload: bytes | None = None
