"""Cluster metadata as every broker sees it, derived from gossip (pure, no I/O).

``keys`` (the gossip key schema: every key, chunked so no value outgrows a message),
``schema`` (the shape of every value, checked before gossip applies it), ``catalog`` (the
typed topic table and the local partitions it implies), ``leaders`` (who leads each
partition, from leadership claims), ``placement`` (replica sets and preferred leaders for
new topics), ``configs`` (each partition's current replica set from ``pconf/`` registers;
where replicas are hosted and when a stray may go), ``balance`` (the deterministic target
replica list of every partition) and ``balance_steps`` (a leader's one next single-server
step toward it, and admission of moves per broker).
"""
