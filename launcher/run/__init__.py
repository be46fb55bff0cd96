"""Submitting, supervising and cancelling a job: the supervisor, its verdicts, preflight checks.
It drives a backend and writes the store."""
