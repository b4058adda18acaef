"""Test and benchmark support shipped with the package.

- ``mesh.testing.launcher``: real broker processes on 127.0.0.1 (``BrokerProcess``,
  ``Cluster``), used by the integration tests and by every benchmark that starts brokers.
- ``mesh.testing.simnet``: the seeded simulated network every simulation runs on.
- ``mesh.testing.gossip_sim`` / ``gossip_scenarios``: the gossip simulator and its
  scenarios (tests/sim and bench/gossip_scale.py both run them).

Nothing here is imported by the broker or the client; import the module you need.
"""
