"""Brokers in network namespaces, so the nemesis can cut broker-to-broker links while
clients still reach every broker.

Theory of operation
-------------------
``NetnsNet(n).setup()`` builds, in the root namespace, one Linux bridge with the address
``10.<a>.<b>.1/24`` and, per broker i, a namespace joined to the bridge by a veth pair,
with the address ``10.<a>.<b>.<i+1>`` and its loopback up. The brokers run under
``ip netns exec <ns>`` (``prefixes``) and listen on their namespace's address (``hosts``);
clients in the root namespace reach them through the bridge.

``cut(i, j)`` adds a blackhole route to j's address inside i's namespace and the reverse:
every packet between the two brokers is dropped, in both directions, while both keep
talking to clients and to the other brokers. ``heal()`` removes every such route.
``teardown()`` deletes the namespaces (their veth ends go with them) and the bridge.

It needs root and ``ip`` (iproute2); ``netns_available()`` says why not otherwise. Names
carry a random tag and the subnet is chosen free, so two runs on one machine do not
collide. A run killed with SIGKILL leaves its namespaces (``ip netns list``: ``mj<tag>n<i>``)
and bridge (``mjb<tag>``) behind: ``ip netns del`` / ``ip link del`` them.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess

__all__ = ["NetnsNet", "netns_available"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def netns_available() -> tuple[bool, str]:
    """(True, "") when network namespaces can be built here, else (False, why not)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "network partitions need root (network namespaces): not root, skipped"
    if shutil.which("ip") is None:
        return False, "network partitions need iproute2's `ip`: not found, skipped"
    name = f"mjprobe{os.getpid() % 100000}"
    try:
        r = _ip("netns", "add", name, check=False)
        if r.returncode != 0:
            return False, f"`ip netns add` failed ({r.stderr.strip()}): network partitions skipped"
    finally:
        _ip("netns", "del", name, check=False)
    return True, ""


class NetnsNet:
    def __init__(self, n: int, rng: random.Random | None = None):
        rng = rng or random.Random()
        self.n = n
        self.tag = f"{rng.randrange(16 ** 4):04x}"
        self.bridge = f"mjb{self.tag}"
        self.namespaces = [f"mj{self.tag}n{i + 1}" for i in range(n)]
        self.subnet = self._free_subnet(rng)
        self.hosts = [f"{self.subnet}.{i + 2}" for i in range(n)]
        self.cuts: set[tuple[int, int]] = set()
        self._built = False

    @staticmethod
    def _free_subnet(rng: random.Random) -> str:
        used = _ip("-o", "-4", "addr", "show").stdout
        for _ in range(100):
            s = f"10.{rng.randrange(200, 250)}.{rng.randrange(1, 255)}"
            if f" {s}." not in used:
                return s
        raise RuntimeError("no free 10.x.y.0/24 subnet for the test network")

    @property
    def prefixes(self) -> list[list[str]]:
        return [["ip", "netns", "exec", ns] for ns in self.namespaces]

    def setup(self) -> "NetnsNet":
        try:
            self._built = True
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                host_end, ns_end = f"mj{self.tag}h{i + 1}", f"mj{self.tag}v{i + 1}"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                _ip("link", "set", ns_end, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge)
                _ip("link", "set", host_end, "up")
                _ip("-n", ns, "addr", "add", f"{self.hosts[i]}/24", "dev", ns_end)
                _ip("-n", ns, "link", "set", ns_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def cut(self, i: int, j: int) -> None:
        """Drop every packet between broker i and broker j (0-based), both directions."""
        if i == j or (min(i, j), max(i, j)) in self.cuts:
            return
        _ip("-n", self.namespaces[i], "route", "add", "blackhole", f"{self.hosts[j]}/32")
        _ip("-n", self.namespaces[j], "route", "add", "blackhole", f"{self.hosts[i]}/32")
        self.cuts.add((min(i, j), max(i, j)))

    def split(self, side: list[int]) -> None:
        """Cut every link between ``side`` and the other brokers."""
        other = [j for j in range(self.n) if j not in side]
        for i in side:
            for j in other:
                self.cut(i, j)

    def heal(self) -> None:
        for i, j in sorted(self.cuts):
            _ip("-n", self.namespaces[i], "route", "del", "blackhole", f"{self.hosts[j]}/32", check=False)
            _ip("-n", self.namespaces[j], "route", "del", "blackhole", f"{self.hosts[i]}/32", check=False)
        self.cuts.clear()

    def teardown(self) -> None:
        if not self._built:
            return
        self.cuts.clear()
        for i, ns in enumerate(self.namespaces):
            _ip("link", "del", f"mj{self.tag}h{i + 1}", check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        self._built = False

    def __enter__(self) -> "NetnsNet":
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()
