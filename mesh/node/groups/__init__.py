"""Consumer groups in the shell: the coordinator host (`group_host`) and durable commits on a majority of the group's replicas (`offset_replication`)."""
