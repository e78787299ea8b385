"""The job runtime, the Engine, the replication sender, and the server."""
