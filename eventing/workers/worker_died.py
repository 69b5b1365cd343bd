"""How a worker's process ending shows to those who call it: WorkerDied (its own module: the hosts, the
sandbox and the executors all raise it, and none of them imports another for it)."""

from __future__ import annotations


class WorkerDied(Exception):
    """The worker process is gone (killed, crashed); the supervisor restarts it from its checkpoints."""
