"""What a run keeps: the manifest and its schema, the chunk index, the run lock, the spool of
deferred work, the shard a run owns, the task log and the status read from them. The driver is
their only writer."""
