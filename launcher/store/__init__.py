"""The SQLite job store (WAL): jobs and their state machine, nodes, events, metrics.
The supervisor writes it; every view reads it."""
