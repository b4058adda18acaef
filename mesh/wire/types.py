"""Small value types shared by the wire messages, the cores and the client.

``TopicPartition`` names one partition of one topic. It is a ``NamedTuple``, so it equals
(and hashes like) the plain ``(topic, partition)`` tuple the cores build and the
``[topic, partition]`` pairs that travel on the wire once converted back to a tuple.

``ALIVE``, ``SUSPECT``, ``DEAD``, ``LEFT``: a broker's status as gossip judges it
(``mesh.gossip.membership``, rule R4), as a metadata answer's broker rows carry it; which
of them count is ``mesh.cluster.liveness``.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition", "ALIVE", "SUSPECT", "DEAD", "LEFT"]

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"


class TopicPartition(NamedTuple):
    topic: str
    partition: int
