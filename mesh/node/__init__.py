"""The broker: the shell that runs the cores over ZeroMQ and LMDB.

``loop`` (``Node``, ``NodeConfig``: the one-thread event loop, group commit, persist then
send), ``handlers`` (admin, metadata, list-offsets answers), ``datapath`` (produce, fetch,
long polls, retention), ``raft_host`` (the replication core in the shell),
``group_host`` (the consumer-group cores in the shell), ``producer_state``
(idempotent-producer dedup), ``peers`` (links to other brokers), ``directory`` (who is
where, from gossip); time comes from ``mesh.clock`` (the one time source). Shells decide nothing a peer could
disagree about: that is the cores' job.
"""
