"""The Kafka wire-protocol listener (``mesh node --kafka-port``): a process beside each node,
one more client of it, that lets Kafka clients (kcat, librdkafka, kafka-python, aiokafka,
kafkajs...) produce and consume unmodified.

``process`` (the child process, started and ended by the node), ``server`` (sockets,
framing, order, bounds, the ``Registry`` of handlers), ``codec`` (kio), ``build`` (answers of
any version), ``context`` (the handler contract), ``link`` (native clients per thread, the
shared metadata cache), ``ids`` (Kafka node and topic ids), ``convert`` (record batches),
``meta``, ``produce``, ``fetch``, ``topics`` (the APIs), ``handlers`` (the core API table).
"""
