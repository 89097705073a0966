"""The worker's process pool: Celery's prefork pool, less one way to die.

Celery checks once, when its consumer starts, that no pool child has exited yet
(``asynloop``: ``pool.did_start_ok()``), and otherwise stops the whole worker with
``WorkerLostError('Could not start worker processes')``. A child killed in the first second
(the out-of-memory killer, an operator, a host fault) then took ``lstdp worker`` down
(issue 28: reproduced with ``kill -9`` of a child 0, 0.5 and 1 s after it appeared, on the
Redis broker). Here a child found dead at that check is replaced as after any later death
(billiard's ``maintain_pool``), and the worker runs on. A child that dies at every start is
still stopped by billiard's restart limit (``RestartFreqExceeded``), not looped for ever.

On the embedded broker (Celery's blocking loop, where the pool is billiard's ``Pool`` with
its helper threads; tasks still run in forked children) the pool's time-limit thread looks at
whether the pool is stopping every 0.1 s, not every second: billiard's ``_terminate_pool``,
which runs when the worker's process ends, joined it for up to 1 s. It still checks the tasks'
time limits once a second, as billiard does.

``lstdp worker`` uses it for the prefork pool (the ``worker_pool`` setting names the class;
Celery's ``-P`` option takes aliases only).
"""

from __future__ import annotations

import logging
import time

from billiard.pool import RUN, CoroStop
from billiard.pool import Pool as BlockingPool
from billiard.pool import TimeoutHandler
from celery.concurrency.prefork import TaskPool as PreforkTaskPool

log = logging.getLogger(__name__)

# the call the tests intercept (here, not process-wide in ``time``)
_sleep = time.sleep

__all__ = ["TaskPool", "POOL"]

#: The ``worker_pool`` setting that selects this pool.
POOL = "backend.worker.pool:TaskPool"


#: How often [s] the time-limit thread checks the running tasks' limits (billiard's own pace).
LIMITS_EVERY_S = 1.0
#: How often [s] it looks at whether the pool is stopping.
STOP_EVERY_S = 0.1


class PromptTimeoutHandler(TimeoutHandler):
    """billiard's time-limit thread, which checks the limits every :data:`LIMITS_EVERY_S` and
    ends within :data:`STOP_EVERY_S` of the pool's stop (billiard's sleeps a whole second)."""

    def body(self):
        ticks = max(1, round(LIMITS_EVERY_S / STOP_EVERY_S))
        while self._state == RUN:
            try:
                for _ in self.handle_timeouts():
                    for _tick in range(ticks):
                        if self._state != RUN:
                            break
                        _sleep(STOP_EVERY_S)
            except CoroStop:
                break


class PromptBlockingPool(BlockingPool):
    """billiard's threaded pool with :class:`PromptTimeoutHandler`."""

    TimeoutHandler = PromptTimeoutHandler


class TaskPool(PreforkTaskPool):
    """Celery's prefork pool whose start-up check replaces dead children instead of failing,
    and whose threaded form (the blocking loop's) stops without billiard's 1 s wait."""

    BlockingPool = PromptBlockingPool

    def did_start_ok(self) -> bool:
        pool = self._pool
        dead = [p for p in list(pool._pool) if p.exitcode is not None]
        if dead:
            log.warning("pool: %d child process(es) died while the worker started (%s); replacing them",
                        len(dead), ", ".join(f"pid {p.pid} exit {p.exitcode}" for p in dead))
            pool.maintain_pool()
        return True
