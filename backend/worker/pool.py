"""The worker's process pool: Celery's prefork pool, less one way to die.

Celery checks once, when its consumer starts, that no pool child has exited yet
(``asynloop``: ``pool.did_start_ok()``), and otherwise stops the whole worker with
``WorkerLostError('Could not start worker processes')``. A child killed in the first second
(the out-of-memory killer, an operator, a host fault) then took ``lstdp worker`` down
(issue 28: reproduced with ``kill -9`` of a child 0, 0.5 and 1 s after it appeared, on the
Redis broker). Here a child found dead at that check is replaced as after any later death
(billiard's ``maintain_pool``), and the worker runs on. A child that dies at every start is
still stopped by billiard's restart limit (``RestartFreqExceeded``), not looped for ever.

``lstdp worker`` uses it for the prefork pool (the ``worker_pool`` setting names the class;
Celery's ``-P`` option takes aliases only).
"""

from __future__ import annotations

import logging

from celery.concurrency.prefork import TaskPool as PreforkTaskPool

log = logging.getLogger(__name__)

__all__ = ["TaskPool", "POOL"]

#: The ``worker_pool`` setting that selects this pool.
POOL = "backend.worker.pool:TaskPool"


class TaskPool(PreforkTaskPool):
    """Celery's prefork pool whose start-up check replaces dead children instead of failing."""

    def did_start_ok(self) -> bool:
        pool = self._pool
        dead = [p for p in list(pool._pool) if p.exitcode is not None]
        if dead:
            log.warning("pool: %d child process(es) died while the worker started (%s); replacing them",
                        len(dead), ", ".join(f"pid {p.pid} exit {p.exitcode}" for p in dead))
            pool.maintain_pool()
        return True
