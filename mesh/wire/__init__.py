"""The wire: what travels between clients and brokers, and how.

``codec`` (the message registry, frames, versioned msgpack), ``messages`` (the client
protocol), ``errors`` (one ``ErrorCode`` enum, ``MeshError``, ``retriable``), ``records``
(record batches: the unit that is sent, stored and served as the same bytes),
``partitioner`` (Kafka's murmur2), ``topic_config`` (names, configs, limits), ``types``
(``TopicPartition``), ``effects`` (``Send``, the effect every core returns).
Peer-protocol messages live beside their cores (``mesh.gossip.messages``,
``mesh.raft.messages``, ``mesh.groups.messages``) and register in the same codec.
"""
