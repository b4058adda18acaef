"""Cluster metadata as every broker sees it, derived from gossip (pure, no I/O).

``keys`` (the gossip key schema), ``catalog`` (the typed topic table and the local
partitions it implies), ``leaders`` (who leads each partition, from leadership claims),
``placement`` (replica sets and preferred leaders for new topics).
"""
