"""Brokers for a benchmark: start our own in a temporary directory, or check a running one.

``LocalCluster(n)`` is the shared launcher's ``Cluster`` (``mesh.testing.launcher``): ``n``
broker processes on free 127.0.0.1 ports, broker 2..n seeding from broker 1 (as the
Procfile does), started until every broker answers and lists all n alive. Here their
data is in a fresh temporary directory, deleted on ``stop()``; logs go to
``<log_dir>/<id>.log``; failures are ``BenchError``s.

Topics are created through ``Admin`` with the requested replication factor; a broker
that cannot place that many replicas answers with its own error, which is passed on.
"""
from __future__ import annotations

import shutil
import tempfile
import time

from bench.scenarios import BenchError
from mesh.testing.launcher import BrokerExited, Cluster

__all__ = ["LocalCluster", "check_reachable", "create_topic", "delete_topic"]


def check_reachable(bootstrap: str, timeout_s: float = 5.0) -> list[dict]:
    """The brokers the cluster reports, or BenchError saying none answered."""
    from mesh.wire.errors import MeshError
    try:
        from mesh.client.transport import parse_address
        for a in bootstrap.split(","):
            if a.strip():
                parse_address(a.strip())
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    from mesh.client import Admin
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            left_ms = max(200, int((deadline - time.monotonic()) * 1000))
            with Admin(bootstrap, request_timeout_ms=min(left_ms, 2000)) as a:
                return a.brokers()
        except MeshError as exc:
            last = exc
    raise BenchError(f"no broker answered at {bootstrap} within {timeout_s:.0f} s ({last}); "
                     f"is the cluster running? (start one with `make run`, or omit --bootstrap "
                     f"to let bench start its own)")


def create_topic(bootstrap: str, name: str, partitions: int, replication_factor: int,
                 config: dict | None = None, timeout_s: float = 20.0) -> None:
    from mesh.client import Admin
    from mesh.wire.errors import MeshError
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as a:
        while True:
            try:
                a.create_topic(name, partitions, replication_factor, config or {})
                break
            except MeshError as exc:
                # a loaded host: a broker just started may look down to gossip for a moment
                if "live broker" in (exc.message or "") and time.monotonic() < deadline:
                    time.sleep(0.2)  # polling interval of a deadline loop
                    continue
                raise BenchError(f"cannot create topic {name} ({partitions} partitions, replication factor "
                                 f"{replication_factor}): broker says {exc.code.name}: {exc.message}") from None
        # wait until leaders are known (immediate on one broker; a gossip round or two on many)
        while True:
            try:
                t = a.describe_topic(name)
                if all(p.get("leader_address") for p in t["partitions"]):
                    return
            except MeshError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"topic {name} has partitions without a leader after {timeout_s:.0f} s")
            time.sleep(0.05)  # polling interval of a deadline loop


def delete_topic(bootstrap: str, name: str) -> None:
    from mesh.client import Admin
    from mesh.wire.errors import MeshError
    try:
        with Admin(bootstrap, request_timeout_ms=10_000) as a:
            a.delete_topic(name)
    except MeshError:
        pass  # best effort: a leftover topic costs disk, not correctness


class LocalCluster(Cluster):
    """``n`` brokers started by bench: data in a fresh temporary directory (deleted on
    ``stop()``), logs in ``log_dir``, each broker in its own session (a Ctrl-C reaches
    bench, which stops them). Failures to come up are ``BenchError``s."""

    def __init__(self, n: int, log_dir: str, extra_args: list[str] | None = None, kafka: bool = False):
        if n < 1:
            raise BenchError("--brokers must be at least 1")
        self.n = n
        self.log_dir = log_dir
        self.data_root: str | None = tempfile.mkdtemp(prefix="mesh-bench-")
        super().__init__(self.data_root, n, extra_args, log_dir=log_dir, new_session=True, kafka=kafka)

    def start(self, timeout_s: float = 30.0) -> "LocalCluster":
        try:
            super().start(timeout_s)
        except BrokerExited as exc:
            self.stop()
            raise BenchError(str(exc)) from None
        except AssertionError as exc:  # a deadline passed
            self.stop()
            hint = ""
            if self.n > 1:
                hint = (" (multi-broker clusters need gossip; this build may serve single brokers only: "
                        "use --brokers 1)")
            raise BenchError(f"brokers not ready: {exc}{hint}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        super().stop(timeout_s)
        if self.data_root:
            shutil.rmtree(self.data_root, ignore_errors=True)
            self.data_root = None
