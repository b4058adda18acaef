"""Replica placement: which brokers hold each partition, and who is preferred leader.

A pure function of the live brokers and the current load, so any broker computes the same
kind of layout. Preferred leaders (the first replica) go round-robin over the brokers in
sorted id order, starting at the broker that currently prefers-leads the fewest partitions,
so no broker prefers-leads more than its share (±1) of a topic. Followers are the brokers
holding the fewest replicas of the topic so far (ties: the next ones after the leader in
ring order), so replica counts are balanced (±1) too.
"""
from __future__ import annotations

__all__ = ["place_replicas"]


def place_replicas(num_partitions: int, replication_factor: int, live_nodes: list[str],
                   leader_load: dict[str, int] | None = None) -> list[list[str]]:
    nodes = sorted(set(live_nodes))
    if replication_factor < 1:
        raise ValueError("replication factor must be at least 1")
    if replication_factor > len(nodes):
        raise ValueError(f"replication factor {replication_factor} is larger than the "
                         f"{len(nodes)} live broker{'s' if len(nodes) != 1 else ''}")
    load = leader_load or {}
    start = min(range(len(nodes)), key=lambda i: (load.get(nodes[i], 0), i))
    n = len(nodes)
    leaders = [(start + p) % n for p in range(num_partitions)]
    count = {x: 0 for x in nodes}
    for li in leaders:  # a broker's leaderships count first, so followers even out the rest
        count[nodes[li]] += 1
    layout = []
    for li in leaders:
        ring = [nodes[(li + j) % n] for j in range(1, n)]
        order = sorted(range(n - 1), key=lambda j: (count[ring[j]], j))   # no ring.index: O(n log n)
        followers = [ring[j] for j in order[:replication_factor - 1]]
        for x in followers:
            count[x] += 1
        layout.append([nodes[li]] + followers)
    return layout
