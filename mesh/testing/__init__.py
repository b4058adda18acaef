"""Test and benchmark support shipped with the package.

- ``mesh.testing.launcher``: real broker processes on 127.0.0.1 (``BrokerProcess``,
  ``Cluster``), used by the integration tests and by every benchmark that starts brokers.
- ``mesh.testing.simnet``: the seeded simulated network every simulation runs on.
- ``mesh.testing.gossip_sim`` / ``gossip_scenarios``: the gossip simulator and its
  scenarios (tests/sim and bench/gossip_scale.py both run them).
- ``mesh.testing.jepsen``: Jepsen-style runs against real brokers (``history``: producer
  processes that record every send; ``nemesis``: seeded kills, pauses and, with
  ``netns``, network partitions; ``checker``: read back and check). The integration test
  runs a short one, ``bench soak`` long ones.
- ``mesh.testing.diskfaults``: damaging one broker's data directory (wipe, rollback,
  truncate, flip) for the disk-loss tests and ``bench diskfaults``.
- ``mesh.testing.seeds``: the seed sweep every simulator's command line runs.

Nothing here is imported by the broker or the client; import the module you need.
"""
