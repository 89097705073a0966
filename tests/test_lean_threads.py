"""The lean events path runs at most ``LEAN_EVENTS_THREADS`` searches against the database at
once (``backend.api.lean_events.lean_threads``; why: ``backend.settings.Settings``): a third
search waits until one of the first two is done, and every one is answered."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from pydantic import ValidationError

from backend.api import lean_events
from backend.db import API_POOL
from backend.settings import Settings


@pytest.fixture
def fresh_executor(monkeypatch):
    """The module's executor made anew for the test (from the test's settings), and shut after."""
    monkeypatch.setattr(lean_events, "_EXECUTOR", None)
    yield
    if lean_events._EXECUTOR is not None:
        lean_events._EXECUTOR.shutdown(wait=True)


def test_default_is_the_cpus_plus_one_within_the_pool(settings_env, monkeypatch):
    monkeypatch.delenv("LEAN_EVENTS_THREADS", raising=False)
    settings_env()
    assert lean_events.lean_threads() == min((os.cpu_count() or 1) + 1, sum(API_POOL))
    settings_env(LEAN_EVENTS_THREADS="4")
    assert lean_events.lean_threads() == 4
    settings_env(LEAN_EVENTS_THREADS="500")  # more than the pool's connections: each thread holds one
    assert lean_events.lean_threads() == sum(API_POOL)
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("LEAN_EVENTS_THREADS", bad)
        with pytest.raises(ValidationError, match="LEAN_EVENTS_THREADS"):
            Settings()


def test_at_most_the_set_number_run_at_once_and_the_rest_wait(settings_env, fresh_executor):
    """Searches 0 and 1 hold their threads (both inside at once, then until released, half a
    second later); none of the six others may start before that, and all eight are answered."""
    settings_env(LEAN_EVENTS_THREADS="2")
    both_in = threading.Barrier(2, timeout=30)  # passes only when two run at the same time
    release = threading.Event()
    lock = threading.Lock()
    running, most, early = 0, 0, []

    def search(i, deadline):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            if i >= 2 and not release.is_set():
                early.append(i)
        try:
            if i < 2:
                both_in.wait()
                release.wait(30)
            return i * 10
        finally:
            with lock:
                running -= 1

    async def main():
        asyncio.get_running_loop().call_later(0.5, release.set)
        return await asyncio.gather(*(lean_events._in_thread(search, i, None) for i in range(8)))

    assert asyncio.run(main()) == [i * 10 for i in range(8)]
    assert early == [], f"searches {early} started while two held the threads"
    assert most == 2, most
