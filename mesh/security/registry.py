"""The registry of users: which CURVE public key speaks for which principal (pure).

Users are cluster-wide gossip registers ``user/<name>`` holding ``{"name", "public_key"}``
(the 40-character Z85 text of a CURVE public key), written by the user admin requests
(``mesh.node.requests.security_handlers``). The node calls ``update`` with those register values
whenever the gossip state moved; the ZAP handler asks ``principal_for_key`` for every new
connection, and the authorizer asks ``knows`` for every request, so a removed user loses
access at once, on connections already open too.

Rules:
- static users (the node's own superusers with keys from its secrets directory) are always
  present and win over gossip users of the same name or key;
- a malformed value is skipped (gossip values are validated before they are applied, this
  is defense in depth); a key claimed by two gossip users (concurrent adds on two brokers)
  belongs to the smaller name, deterministically on every broker;
- the principal ``broker`` is reserved for the cluster's own brokers and is never a user.
"""
from __future__ import annotations

from typing import Any, Mapping

from mesh.security.acl import check_user_name

__all__ = ["Registry", "check_public_key", "RESERVED_NAMES", "Z85_CHARS"]

Z85_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
RESERVED_NAMES = frozenset({"broker"})


def check_public_key(key: Any) -> str:
    """A CURVE public key as Z85 text: 40 characters of the Z85 alphabet; else ValueError."""
    if not isinstance(key, str) or len(key) != 40 or not Z85_CHARS.issuperset(key):
        raise ValueError("a public key is the 40-character Z85 text of a CURVE key")
    return key


class Registry:
    def __init__(self, static_users: Mapping[str, str] | None = None) -> None:
        """``static_users``: name -> Z85 public key, always present (superusers whose key
        the node was started with)."""
        self.static: dict[str, str] = {check_user_name(n): check_public_key(k)
                                       for n, k in (static_users or {}).items()}
        self.users: dict[str, str] = dict(self.static)     # name -> public key
        self._by_key: dict[str, str] = {k: n for n, k in sorted(self.static.items(), reverse=True)}
        self.skipped = 0                                     # malformed values seen by update

    def update(self, users: Mapping[str, Any]) -> None:
        """Replace the gossip users with ``users`` (``user/<name>`` key -> value)."""
        found: dict[str, str] = {}
        skipped = 0
        for _, value in sorted(users.items()):
            try:
                name = check_user_name(value["name"])
                key = check_public_key(value["public_key"])
            except (KeyError, TypeError, ValueError):
                skipped += 1
                continue
            if name in RESERVED_NAMES or name in self.static:
                continue
            found[name] = key
        by_key = {k: n for n, k in sorted(found.items(), reverse=True)}   # the smaller name wins
        by_key.update({k: n for n, k in sorted(self.static.items(), reverse=True)})
        self.users = {**found, **self.static}
        self._by_key = by_key
        self.skipped = skipped

    def principal_for_key(self, public_key_z85: str) -> str | None:
        """The registered user whose public key this is, or None."""
        return self._by_key.get(public_key_z85)

    def knows(self, principal: str) -> bool:
        """Whether ``principal`` is a user now (its key may be reused by no one else)."""
        key = self.users.get(principal)
        return key is not None and self._by_key.get(key) == principal

    def __contains__(self, principal: str) -> bool:
        return self.knows(principal)

    def names(self) -> list[str]:
        return sorted(self.users)
