"""The SSH backend: paramiko connections, host-key trust, code sync, host surveys and
the cluster files `launch init` writes."""
