"""Small value types shared by the wire messages, the cores and the client.

``TopicPartition`` names one partition of one topic. It is a ``NamedTuple``, so it equals
(and hashes like) the plain ``(topic, partition)`` tuple the cores build and the
``[topic, partition]`` pairs that travel on the wire once converted back to a tuple.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int
