"""The two state machines, product and job: the only place a state changes.

Product (one L2 file of one frame under one calibration set)::

    planned -> planned | writing | failed
    writing -> writing | written | failed | planned   (redelivered; re-planned by a new run)
    failed  -> planned | writing | written | failed   (re-planned; or its message ran after the
                                                        reaper gave it up: the file it then
                                                        wrote is sound; a new reason replaces
                                                        the old)
    written -> failed                                 (only ``lstdp fsck --repair``: its file is
                                                        missing on disk or differs from its SHA-256;
                                                        failed, the next job re-plans it)

Job (a recalibration request)::

    queued  -> running | failed               (failed: could not be sent or planned)
    running -> running | succeeded | failed   (running again: a redelivered plan message)
    succeeded, failed -> (final: a late plan message for an ended job is not acted on,
                          ``backend.worker.processing.plan_job``)

:func:`move_product` and :func:`move_job` refuse any other move (:class:`IllegalTransition`)
and record the reason of a failure with one rule: the text as given (callers pass
:func:`pipelines.errors.failure_reason` of an exception: its first line), cut to
:data:`MAX_REASON_CHARS`. A product's reason is cleared when it goes back to work; a job
gets ``started_at`` when it starts running and ``finished_at`` when it ends. No other
module assigns ``.state`` (a test walks the code).
"""

from __future__ import annotations

from backend.models import Job, JobState, Product, ProductState, utcnow

__all__ = ["IllegalTransition", "MAX_REASON_CHARS", "PRODUCT_MOVES", "JOB_MOVES", "reason_text",
           "move_product", "move_job", "JOB_FINAL"]

#: Longest error text stored on a product or a job [characters]; longer text is cut.
MAX_REASON_CHARS = 4000

P, J = ProductState, JobState

#: Legal product moves: state -> the states it may go to.
PRODUCT_MOVES: dict[ProductState, frozenset[ProductState]] = {
    P.planned: frozenset({P.planned, P.writing, P.failed}),
    P.writing: frozenset({P.writing, P.written, P.failed, P.planned}),
    P.failed: frozenset({P.planned, P.writing, P.written, P.failed}),
    # a written product stays written (a new calibration makes a new version), unless its
    # file is lost or damaged on disk: backend.services.fsck fails it so it is made again
    P.written: frozenset({P.failed}),
}

#: Legal job moves (``running -> running``: a redelivered plan message re-plans the job).
JOB_MOVES: dict[JobState, frozenset[JobState]] = {
    J.queued: frozenset({J.running, J.failed}),
    J.running: frozenset({J.running, J.succeeded, J.failed}),
    J.succeeded: frozenset(),
    J.failed: frozenset(),
}

#: Job states that end a job.
JOB_FINAL = frozenset({J.succeeded, J.failed})


class IllegalTransition(RuntimeError):
    """A state change that the state machine does not allow (the message says which): a bug
    in the caller, not bad data, so it is reported with its type."""


def reason_text(reason: str | None) -> str | None:
    """``reason`` cut to :data:`MAX_REASON_CHARS` (``None`` and ``''`` stay ``None``)."""
    if not reason:
        return None
    return reason[:MAX_REASON_CHARS]


def move_product(product: Product, to: ProductState, reason: str | None = None) -> Product:
    """Move ``product`` to state ``to``; the caller flushes or commits.

    Parameters
    ----------
    product : backend.models.Product
    to : ProductState
    reason : str, optional
        Why it failed (required for ``failed``; stored cut to :data:`MAX_REASON_CHARS`).
        Moving to any other state clears the product's error.

    Raises
    ------
    IllegalTransition
        If the machine does not allow ``product.state -> to``, or ``failed`` has no reason.
    """
    was = product.state
    if was is not None and to not in PRODUCT_MOVES[ProductState(was)]:
        raise IllegalTransition(f"product {product.id}: {ProductState(was).value} -> {to.value} is not allowed")
    if to == ProductState.failed and not reason:
        raise IllegalTransition(f"product {product.id}: failed needs a reason")
    product.state = to
    product.error = reason_text(reason) if to == ProductState.failed else None
    return product


def move_job(job: Job, to: JobState, reason: str | None = None) -> Job:
    """Move ``job`` to state ``to`` (setting ``started_at``/``finished_at``); the caller commits.

    Parameters
    ----------
    job : backend.models.Job
    to : JobState
    reason : str, optional
        Stored as the job's error (cut to :data:`MAX_REASON_CHARS`) when given; a job that
        ends ``failed`` without one keeps the error its products gave it, or else says how
        many frames failed.

    Raises
    ------
    IllegalTransition
        If the machine does not allow ``job.state -> to``.
    """
    was = JobState(job.state) if job.state is not None else JobState.queued
    if to not in JOB_MOVES[was]:
        raise IllegalTransition(f"job {job.id}: {was.value} -> {to.value} is not allowed")
    job.state = to
    now = utcnow()
    if to == JobState.running:
        job.started_at = now
    if to in JOB_FINAL:
        job.finished_at = now
    if reason:
        job.error = reason_text(reason)
    elif to == JobState.failed and not job.error:
        job.error = f"{job.failed or 0} of {job.total or 0} frames failed"
    return job
