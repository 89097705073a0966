"""Who a worker process is, and its heartbeat.

**Identity.** :func:`worker_id` is a UUID made when this process starts (again in every
forked child: ``os.register_at_fork``), never reused: two hosts with one name, a host
restarted with the same name, or two namespaces where the task processes have the same pid
cannot share it (issue 28: ``host:pid`` could). :func:`display` adds the host and pid for
people to read.

**Heartbeat.** :func:`start_heartbeat` registers the process in ``worker_heartbeats`` and
starts a daemon thread that writes the database's time (:mod:`backend.clock`) into its row
every :func:`heartbeat_interval_s` (a third of ``RECONCILE_INTERVAL_S``, at least 0.2 s) on a
connection of its own, also while the task thread calibrates (NumPy releases the GIL; pure
Python is preempted every 5 ms). A claim holder whose row was not renewed within
``Settings.heartbeat_timeout_s`` (one reconcile interval: three missed beats) is dead on every
host: a killed, frozen or partitioned worker's claims are taken back at the reconciler's next
pass, within about two reconcile intervals of its last beat. The thread stops at a fork (the
child has none and starts its own with a new id) and with the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

log = logging.getLogger(__name__)

__all__ = ["worker_id", "display", "heartbeat_interval_s", "start_heartbeat", "stop_heartbeat", "beat",
           "heartbeat_running"]

_ID: str | None = None
_THREAD: threading.Thread | None = None
_STOP = threading.Event()
_LOCK = threading.Lock()


def _reset_after_fork() -> None:
    global _ID, _THREAD, _LOCK, _STOP
    _ID, _THREAD, _LOCK, _STOP = None, None, threading.Lock(), threading.Event()


os.register_at_fork(after_in_child=_reset_after_fork)


def worker_id() -> str:
    """This process start's id: 32 hex digits of a random UUID (``uuid.uuid4``), made on first
    use in this process (a forked child makes its own)."""
    global _ID
    if _ID is None:
        _ID = uuid.uuid4().hex
    return _ID


def display() -> str:
    """``host:pid worker=<id>``: how a claim names its holder (:func:`backend.state.this_process`)."""
    return f"{socket.gethostname()}:{os.getpid()} worker={worker_id()}"


def heartbeat_interval_s(settings) -> float:
    """Seconds between beats: a third of ``RECONCILE_INTERVAL_S``, at least 0.2 s (so a holder
    is declared dead only after three missed beats, :attr:`Settings.heartbeat_timeout_s`)."""
    return max(0.2, settings.reconcile_interval_s / 3)


def beat(bind, role: str = "worker") -> None:
    """Write this process's heartbeat (insert its row the first time) with the database's
    time, on ``bind`` (a Connection in a transaction, or a Session; the caller commits)."""
    from sqlalchemy import insert, update

    from backend.clock import db_now
    from backend.models import WorkerHeartbeat as W

    now = db_now(bind)
    done = bind.execute(update(W).where(W.id == worker_id()).values(heartbeat_at=now)
                        .execution_options(synchronize_session=False))
    if done.rowcount == 0:
        bind.execute(insert(W).values(id=worker_id(), host=socket.gethostname()[:200], pid=os.getpid(),
                                      role=role[:20], started_at=now, heartbeat_at=now))


def heartbeat_running() -> bool:
    """Whether this process's heartbeat thread is alive."""
    return _THREAD is not None and _THREAD.is_alive()


def start_heartbeat(settings=None, *, role: str = "worker", engine=None) -> None:
    """Register this process and beat until it ends (idempotent; a no-op when already
    beating). The first beat is written before this returns, so a claim taken afterwards is
    never judged by a missing row.

    Raises
    ------
    sqlalchemy.exc.OperationalError
        If the first beat cannot be written (the database is down: the caller's retry applies).
    """
    global _THREAD
    from backend.db import get_engine
    from backend.settings import get_settings

    settings = settings or get_settings()
    with _LOCK:
        if heartbeat_running():
            return
        eng = engine or get_engine()
        with eng.begin() as conn:
            beat(conn, role)
        me = worker_id()
        every = heartbeat_interval_s(settings)

        stop = _STOP

        def run() -> None:
            while not stop.wait(every):
                if worker_id() != me:  # forked: not ours any more
                    return
                try:
                    with eng.begin() as conn:
                        beat(conn, role)
                except Exception:  # noqa: BLE001 - the database is away: beat again next time
                    log.warning("heartbeat of worker %s failed; trying again in %.1f s", me, every, exc_info=True)

        _THREAD = threading.Thread(target=run, name=f"lstdp-heartbeat-{me[:8]}", daemon=True)
        _THREAD.start()


def stop_heartbeat(timeout_s: float = 5.0) -> None:
    """Stop this process's heartbeat thread (its row stays, and goes stale: the process's
    claims are then dead after ``Settings.heartbeat_timeout_s``). For tests and shutdown."""
    global _THREAD, _STOP
    with _LOCK:
        thread, _THREAD = _THREAD, None
        _STOP.set()
        _STOP = threading.Event()
    if thread is not None:
        thread.join(timeout_s)
