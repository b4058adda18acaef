"""The data path: produce, fetch, long polls and retention (`datapath`), idempotent-producer dedup (`producer_state`), acknowledgements waiting on the commit index (`ack_waiters`)."""
