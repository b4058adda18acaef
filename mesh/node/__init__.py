"""The broker: the shell that runs the cores over ZeroMQ and LMDB.

At the top: ``loop`` (``Node``: sockets, signals, threads, start-up checks), ``turn``
(``BrokerTurn``: one loop turn in its fixed order, the periodic tasks as a table; the
simulator runs the same class), ``wiring`` (builds the hosts a turn drives, shared with
the simulator), ``config`` (``NodeConfig``). Below, one folder per concern:
``lifecycle/`` (data directory, identity, start and stop, sidecars), ``requests/``
(dispatch and answers), ``limits/`` (bounds and quotas), ``data/`` (produce, fetch,
retention, producer dedup), ``replication/`` (Raft per partition in the shell),
``groups/`` (consumer groups in the shell), ``peers/`` (links to brokers, their clocks,
leadership announcements), ``ops/`` (metrics, partition moves). Time comes from
``mesh.clock`` (the one time source). Shells decide nothing a peer could disagree about:
that is the cores' job.
"""
