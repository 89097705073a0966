"""The worker's pool (backend/worker/pool.py): billiard's threaded pool, as the embedded
broker's blocking loop runs it, with a time-limit thread that ends promptly at a stop."""

from __future__ import annotations

from billiard.pool import CLOSE, RUN
from billiard.pool import TimeoutHandler as BilliardTimeoutHandler

from backend.worker import pool as pool_mod


def _run_body(monkeypatch, handler_cls, stop_after_sleeps: int) -> tuple[list[float], int]:
    """Run ``handler_cls``'s thread body in this thread: the pool is stopped (state CLOSE) at the
    ``stop_after_sleeps``-th sleep. Returns the sleeps' lengths [s] and how many times the
    tasks' time limits were checked. Only this thread's sleeps are intercepted."""
    import threading
    import time

    handler = handler_cls([], {}, None, None)
    sleeps: list[float] = []
    checks = 0
    real = handler.handle_timeouts
    real_sleep = time.sleep
    me = threading.get_ident()

    def counting():
        nonlocal checks
        for item in real():
            checks += 1
            yield item

    def fake_sleep(s):
        if threading.get_ident() != me:  # another thread of this process: a real sleep
            real_sleep(s)
            return
        sleeps.append(s)
        if len(sleeps) >= stop_after_sleeps:
            handler._state = CLOSE

    monkeypatch.setattr(handler, "handle_timeouts", counting)
    monkeypatch.setattr(pool_mod, "_sleep", fake_sleep)
    if handler_cls is BilliardTimeoutHandler:  # billiard calls time.sleep itself
        import billiard.pool as billiard_pool

        monkeypatch.setattr(billiard_pool.time, "sleep", fake_sleep)
    assert handler._state == RUN
    handler.body()
    return sleeps, checks


def test_the_time_limit_thread_looks_at_the_stop_every_tenth_of_a_second(monkeypatch):
    sleeps, checks = _run_body(monkeypatch, pool_mod.PromptTimeoutHandler, stop_after_sleeps=25)
    assert max(sleeps) <= pool_mod.STOP_EVERY_S
    assert len(sleeps) == 25, "it must end at the first look after the stop"
    # the limits are still checked once a second, as billiard does (25 tenths: at 0, 1 and 2 s)
    assert checks == 3


def test_billiards_own_thread_sleeps_a_whole_second(monkeypatch):
    """Why the subclass exists (pins billiard 4.3's behaviour)."""
    sleeps, _checks = _run_body(monkeypatch, BilliardTimeoutHandler, stop_after_sleeps=1)
    assert sleeps == [1.0]


def test_the_embedded_workers_pool_is_built_with_it():
    """The chain that picks it: the filesystem transport cannot be polled (not asynchronous), so
    Celery runs its blocking loop and starts the pool with threads, and ``TaskPool.on_start``
    then builds ``BlockingPool``: here a real one-process pool."""
    from backend import broker_fs

    assert broker_fs.Transport.implements.asynchronous is False
    pool = pool_mod.TaskPool(limit=1, threads=True, soft_timeout=60, timeout=120)
    pool.start()
    try:
        assert type(pool._pool) is pool_mod.PromptBlockingPool
        assert type(pool._pool._timeout_handler) is pool_mod.PromptTimeoutHandler
    finally:
        pool.terminate()
