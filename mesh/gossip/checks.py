"""What a peer may write into this node's gossip state, beyond well-formed shapes (R8).

``mesh.gossip.parsing`` checks shapes, types and numeric bounds; this module holds the
policy that depends on the application and on time, applied to every entry of a message
(and of a snapshot at load) *before* anything is applied or persisted:

- Key kinds. With ``register_prefixes`` (the node passes the cluster schema's), a node
  namespace entry may not use a register key and a cluster register must use one: a peer
  cannot slip a topic into a node namespace, nor a node's keys into the cluster store.
- Values. ``validate_entry(key, value, now_ms) -> str | None`` (the node passes
  ``mesh.cluster.schema.validate_entry``) judges every live entry; None means fine, a
  string is the reason it is not. A validator that raises is treated as a refusal. A
  tombstone carries no value (None) and is not given to the validator.
- Stamps. Register stamps come from a hybrid logical clock (``max(clock + 1, now_ms)``,
  comparable to wall-clock milliseconds), so a stamp or gc clock later than
  ``now_ms + max_clock_skew_ms`` cannot be honest: a forged ``2**62`` would otherwise win
  every register forever. A *kill* (R6) claims the sender collected the key's tombstone,
  which happens ``tombstone_gc_ms`` after it was written: a kill of a stamp younger than
  that (give or take two clock skews) is refused.
- Whose clock. Every limit above, and the ``now_ms`` handed to the validator, is this
  node's clock plus ``offset_ms``: the correction ``mesh.gossip.clock_offset`` estimated
  from the peers' stamps (0 while this clock agrees with theirs). A node whose clock is a
  day behind judges its peers' stamps by their time, not its own, and refuses nothing
  they all consider live (``Gossip.set_clock_offset``).

Without a validator and prefixes (the simulator, most unit tests), only the stamp bounds
apply. A failing entry fails its whole message (``Malformed``; counted, never applied).
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["EntryCheck", "Validator"]

Validator = Callable[[str, Any, int], "str | None"]


class EntryCheck:
    """The per-entry policy of one node (see the module docstring)."""

    __slots__ = ("validate_entry", "register_prefixes", "max_clock_skew_ms", "tombstone_gc_ms", "offset_ms")

    def __init__(self, validate_entry: Validator | None, register_prefixes: tuple[str, ...] | None,
                 max_clock_skew_ms: int, tombstone_gc_ms: int) -> None:
        if validate_entry is not None and not callable(validate_entry):
            raise ValueError("validate_entry must be callable")
        if register_prefixes is not None:
            register_prefixes = tuple(register_prefixes)
            if not register_prefixes or not all(type(p) is str and p for p in register_prefixes):
                raise ValueError("register_prefixes must be non-empty strings")
        self.validate_entry = validate_entry
        self.register_prefixes = register_prefixes
        self.max_clock_skew_ms = max_clock_skew_ms
        self.tombstone_gc_ms = tombstone_gc_ms
        self.offset_ms = 0          # peers' clock minus ours, when ours is off (see the docstring)

    def stamp_limit(self, now_ms: int) -> int:
        """The latest stamp (or gc clock) a peer may show at ``now_ms``."""
        return now_ms + self.offset_ms + self.max_clock_skew_ms

    def kill_limit(self, now_ms: int) -> int:
        """The latest stamp a kill may name: its tombstone was collected ``tombstone_gc_ms``
        after it was written (two skews of slack: the writer's and the collector's clocks)."""
        return now_ms + self.offset_ms - self.tombstone_gc_ms + 2 * self.max_clock_skew_ms

    def node_entry(self, key: str, value: Any, deleted: bool, now_ms: int) -> str | None:
        """Why a node namespace entry is refused (None: accepted)."""
        if self.register_prefixes is not None and key.startswith(self.register_prefixes):
            return f"{key[:80]!r} is a cluster register key, not a node's"
        return self._value(key, value, deleted, now_ms)

    def register_entry(self, key: str, value: Any, deleted: bool, now_ms: int) -> str | None:
        """Why a cluster register entry is refused (None: accepted)."""
        if self.register_prefixes is not None and not key.startswith(self.register_prefixes):
            return f"{key[:80]!r} is not a cluster register key"
        return self._value(key, value, deleted, now_ms)

    def _value(self, key: str, value: Any, deleted: bool, now_ms: int) -> str | None:
        if deleted:
            return None if value is None else f"tombstone {key[:80]!r} carries a value"
        if self.validate_entry is None:
            return None
        try:
            why = self.validate_entry(key, value, now_ms + self.offset_ms)
        except Exception as exc:  # a validator bug must not let the entry in, nor raise out
            return f"{key[:80]!r}: the validator failed: {exc!r}"[:300]
        if why is None:
            return None
        return f"{key[:80]!r}: {why}"[:300]
