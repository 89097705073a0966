"""Storage faults are faults, not frame failures (issue 28, item 4).

A full disk, a read-only store or an unreachable store breaks every frame of a lane at once,
and says nothing about the frames. Before this module 67 of 68 failure reasons of a full
disk read ``AttributeError: 'list' object has no attribute '_file'``: astropy's
``HDUList.writeto`` fails again while cleaning up after the ``OSError`` and hides it.

* :func:`storage_fault` finds the real ``OSError`` in an exception's chain (``__cause__``,
  ``__context__``): an errno of :data:`STORAGE_ERRNOS`, or a ``ConnectionError`` /
  ``TimeoutError`` (an object store that does not answer; a store client should raise or
  chain one of these, or an ``OSError`` with such an errno).
* A calibration that meets one gives its claim back (the product is ``planned`` again, the
  start not counted) and **pauses its lane** (:func:`record_fault`: a ``lane_faults`` row with
  the true reason, e.g. ``[Errno 28] No space left on device``, and when the lane is tried
  again: backoff from ``STORAGE_RETRY_S``, doubled after each failed try, at most
  :data:`MAX_BACKOFF_S`).
* While the lane is paused, deliveries of its products do nothing (:func:`lane_paused`); the
  reconciler re-sends them once ``retry_at`` has passed (one frame then tries the store
  first: the others wait for its outcome, a pass later).
* A write that succeeds clears the pause (:func:`clear_fault`).
* Celery's soft time limit struck while the calibration waited on storage (its traceback in
  the store's client or the file I/O: :func:`backend.worker.processing.blocked_in`) pauses the
  lane too, with an ``ETIMEDOUT`` reason naming the limit; that start is counted towards
  ``MAX_DELIVERIES`` (:func:`backend.worker.processing.give_back_after_time_limit`), so a frame
  whose own write always outlasts the limit still ends.
* Only when the fault has lasted ``STORAGE_FAULT_BOUND_S`` (default 1800 s) are the lane's
  frames failed, each with the fault's reason (:func:`outlasted_reason`).

All times are the database's (:mod:`backend.clock`).
"""

from __future__ import annotations

import datetime as dt
import errno
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.clock import db_now
from backend.models import LaneFault
from backend.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["lane_of", "STORAGE_ERRNOS", "MAX_BACKOFF_S", "storage_fault", "fault_text", "record_fault", "clear_fault",
           "lane_paused", "lane_fault", "outlasted_reason"]

#: errno values that are the store's fault, not the frame's: full (ENOSPC, EDQUOT), read-only
#: or refused (EROFS, EACCES, EPERM), broken (EIO), or not reachable (a network store:
#: ENOTCONN, ETIMEDOUT, ECONNREFUSED, ECONNRESET, EHOSTUNREACH, ENETUNREACH, ESTALE of NFS).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                            errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET,
                            errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ESTALE})

#: Longest wait between two tries of a paused lane [s] (a choice: a freed disk is noticed
#: within 5 min).
MAX_BACKOFF_S = 300.0


def lane_of(parameters: dict | None) -> str:
    """The lane (queue) of a product with ``parameters``: its options' device, ``cpu`` when its
    options are ones no worker would take (as ``backend.worker.reconcile`` routes it)."""
    from pipelines.calibration import as_options
    from pipelines.errors import DataError

    try:
        return as_options((parameters or {}).get("options")).device
    except DataError:
        return "cpu"


def storage_fault(exc: BaseException | None) -> OSError | None:
    """The storage ``OSError`` behind ``exc`` (itself, or in its ``__cause__``/``__context__``
    chain; a failed object-store call, :class:`backend.store.StoreError` other than a taken key
    or changed bytes, as ``EIO`` with its message), or None when ``exc`` is not a storage fault. Database errors are not storage
    faults (their own retries apply)."""
    from sqlalchemy.exc import SQLAlchemyError

    from backend.store import AlreadyExists, IntegrityMismatch, StoreError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, SQLAlchemyError):
            return None
        if isinstance(exc, OSError) and (exc.errno in STORAGE_ERRNOS
                                         or isinstance(exc, (ConnectionError, TimeoutError))):
            return exc
        if isinstance(exc, StoreError) and not isinstance(exc, (AlreadyExists, IntegrityMismatch)):
            # the object store's client failed (unreachable, refused, timed out): obstore raises its
            # own types, not OSError; a taken key or changed bytes are not faults of the store
            return OSError(errno.EIO, str(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def fault_text(err: OSError) -> str:
    """One line naming the fault: ``storage fault: [Errno 28] No space left on device: '<file>'``."""
    return f"storage fault: {err}".splitlines()[0]


def lane_fault(session: Session, lane: str) -> LaneFault | None:
    """The fault row of ``lane`` (``cpu``/``gpu``), or None when the lane is not paused."""
    return session.scalar(select(LaneFault).where(LaneFault.lane == lane).execution_options(populate_existing=True))


def _aware(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


def lane_paused(session: Session, lane: str, now: dt.datetime | None = None) -> LaneFault | None:
    """The fault row of ``lane`` while the lane waits (``retry_at`` not reached), else None."""
    row = lane_fault(session, lane)
    if row is None:
        return None
    now = now or db_now(session)
    return row if _aware(row.retry_at) > now else None


def record_fault(session: Session, lane: str, err: OSError, settings: Settings,
                 now: dt.datetime | None = None) -> LaneFault:
    """Pause ``lane`` for storage fault ``err`` (the caller commits): the row gets the reason,
    one more failed try, and ``retry_at`` = now + ``STORAGE_RETRY_S`` x 2^(tries-1), at most
    :data:`MAX_BACKOFF_S`. Returns the row."""
    now = now or db_now(session)
    row = lane_fault(session, lane)
    if row is None:
        row = LaneFault(lane=lane, reason=fault_text(err), failures=0, first_at=now, last_at=now, retry_at=now)
        session.add(row)
    row.failures = (row.failures or 0) + 1
    row.reason = fault_text(err)
    row.last_at = now
    wait = min(MAX_BACKOFF_S, settings.storage_retry_s * 2 ** (row.failures - 1))
    row.retry_at = now + dt.timedelta(seconds=wait)
    log.warning("lane %s paused by a storage fault (try %d, again in %.0f s): %s", lane, row.failures, wait,
                row.reason)
    return row


def clear_fault(session: Session, lane: str) -> bool:
    """End the pause of ``lane`` (a write succeeded; the caller commits). Returns whether it was paused."""
    row = lane_fault(session, lane)
    if row is None:
        return False
    session.delete(row)
    log.warning("lane %s: storage works again after %d failed tries (%s)", lane, row.failures, row.reason)
    return True


def outlasted_reason(row: LaneFault, settings: Settings, now: dt.datetime) -> str | None:
    """Why a frame of a paused lane fails, once the fault has lasted ``STORAGE_FAULT_BOUND_S``
    (None before that)."""
    lasted = (now - _aware(row.first_at)).total_seconds()
    if lasted < settings.storage_fault_bound_s:
        return None
    return (f"{row.reason} (the store failed for {lasted:.0f} s, {row.failures} tries, longer than "
            f"STORAGE_FAULT_BOUND_S = {settings.storage_fault_bound_s:.0f} s)")
