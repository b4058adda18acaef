"""Raft per partition in the shell: the replication core's host (`raft_host`), its durable state in LMDB (`raft_store`), coalesced peer messages (`outbox`), snapshot pacing (`snapshot_pace`)."""
