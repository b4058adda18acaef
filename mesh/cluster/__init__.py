"""Cluster metadata as every broker sees it, derived from gossip (pure, no I/O).

``keys`` (the gossip key schema: every key, chunked so no value outgrows a message),
``schema`` (the shape of every value, checked before gossip applies it), ``catalog`` (the
typed topic table and the local partitions it implies), ``leaders`` (who leads each
partition, from leadership claims), ``placement`` (replica sets and preferred leaders for
new topics).
"""
