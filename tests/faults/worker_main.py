"""``lstdp`` with test-only hooks: ``python -m tests.faults.worker_main worker ...``.

The fault tests start their workers through this module instead of ``python -m
backend.cli``: it imports :mod:`backend.cli`, connects the hooks below and runs
:func:`backend.cli.main` with the same arguments, so the product code carries no test hook.
Every hook is off unless its environment variable is set.

Observation (journal)
    ``LSTDP_FAULTS_JOURNAL``: a JSON-lines file every worker process (main and pool
    children, every restart) appends to, one line per event: ``prerun``/``postrun`` of a
    task (name, id, arguments, delivery flags, state), ``publish`` of a message (its task
    name and id, in the process that sends it), ``write_start``/``write`` of a product FITS
    (``pipelines.fitsio.write_fits_pending`` and ``PendingFile.commit`` wrapped: the path
    when its writing starts, and with the SHA-256 once renamed), ``child`` when a pool process starts, ``ready`` when the worker is. Each line
    has the process id and the wall time. A killed process loses nothing already written
    (``O_APPEND``, one ``write`` per line).

Faults
    ``LSTDP_FAULTS_POISON``: comma-separated raw file names (the frame header's
    ``FILENAME``); the calibration of such a frame kills its own process with SIGKILL, every
    time, from inside the science step (``pipelines.calibration.l2.flow.calibrate_frame``),
    that is after the task has taken its product (state ``writing``), as a frame that
    crashes the calibration would. A kill in ``task_prerun`` would come before the task
    could know it had started (``MAX_DELIVERIES`` counts calibrations that start without
    finishing), so no implementation could count it.
    ``LSTDP_FAULTS_FRAME_DELAY_S``: every calibration first sleeps this long (a job then lasts
    long enough for faults at random moments whatever the machine's speed).
    ``LSTDP_FAULTS_FRAME_DELAY_FILE``: a file holding that delay [s] instead, read at every
    calibration and every 0.1 s of its wait (a missing or empty file: no delay), so that a test
    can slow the calibrations only while it needs them slow (a job to be cancelled half-way),
    hold them until it is ready (a large number, then a small one) and let the rest of it run
    at the machine's speed.
    ``LSTDP_FAULTS_SLOW``: ``NAME:SECONDS``: the first calibration of raw file ``NAME``
    (in any process; a marker file beside the journal says it happened) sleeps this long
    inside the science step, after its product is ``writing``.
    ``LSTDP_FAULTS_VISIBILITY_S``: the Redis transport redelivers a delivered,
    unacknowledged message after this many seconds, whatever ``BROKER_VISIBILITY_TIMEOUT_S``
    says (kombu's ``QoS.visibility_timeout`` replaced in this process, and its restore sweep
    run every second): a broker whose visibility timeout is shorter than a running task,
    with the worker's own settings (and any start-up check of them) left consistent.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

JOURNAL = os.environ.get("LSTDP_FAULTS_JOURNAL")


def journal(event: str, **fields) -> None:
    """Append one event line to the journal (no-op without ``LSTDP_FAULTS_JOURNAL``)."""
    if not JOURNAL:
        return
    line = json.dumps({"ev": event, "pid": os.getpid(), "t": time.time(), **fields}, default=str) + "\n"
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _poison_names() -> set[str]:
    return {n.strip() for n in os.environ.get("LSTDP_FAULTS_POISON", "").split(",") if n.strip()}


def _slow_spec() -> tuple[str, float] | None:
    spec = os.environ.get("LSTDP_FAULTS_SLOW", "")
    if not spec:
        return None
    name, _, seconds = spec.rpartition(":")
    return name, float(seconds)


def _first_time(marker: str) -> bool:
    """True once per marker across every process (an ``O_EXCL`` file beside the journal)."""
    folder = Path(JOURNAL).parent if JOURNAL else Path("/tmp")
    try:
        fd = os.open(folder / f".faults-{marker}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _install_hooks() -> None:
    from celery.signals import (
        before_task_publish,
        task_postrun,
        task_prerun,
        worker_process_init,
        worker_ready,
    )

    import pipelines.calibration as calibration
    import pipelines.calibration.l2.flow as flow
    import pipelines.fitsio as fitsio

    @task_prerun.connect(weak=False)
    def _prerun(task_id=None, task=None, args=None, kwargs=None, **_):
        req = task.request
        info = req.delivery_info or {}
        journal("prerun", task=task.name, id=task_id, args=list(args or ()), kwargs=dict(kwargs or {}),
                redelivered=bool(info.get("redelivered")), retries=req.retries, hostname=req.hostname)

    @task_postrun.connect(weak=False)
    def _postrun(task_id=None, task=None, args=None, retval=None, state=None, **_):
        journal("postrun", task=task.name, id=task_id, args=list(args or ()), state=state,
                retval=retval if isinstance(retval, dict | str | int | float | type(None)) else repr(retval))

    @before_task_publish.connect(weak=False)
    def _publish(sender=None, headers=None, body=None, **_):
        headers = headers or {}
        args = body[0] if isinstance(body, list | tuple) and body else None
        kwargs = body[1] if isinstance(body, list | tuple) and len(body) > 1 else None
        journal("publish", task=sender or headers.get("task"), id=headers.get("id"), args=args, kwargs=kwargs)

    @worker_process_init.connect(weak=False)
    def _child(**_):
        journal("child", ppid=os.getppid())

    @worker_ready.connect(weak=False)
    def _ready(sender=None, **_):
        journal("ready", hostname=getattr(sender, "hostname", None))

    # a product's FITS is written under a temporary name (write_fits_pending, also inside
    # write_fits_atomic) and becomes the file when renamed (PendingFile.commit, which the
    # claim's holder calls in backend.worker.processing.write_product): a completed write is the rename
    real_pending, real_commit = fitsio.write_fits_pending, fitsio.PendingFile.commit

    def write_fits_pending(hdul, path, *args, **kwargs):
        journal("write_start", path=str(path))
        sha, pending = real_pending(hdul, path, *args, **kwargs)
        pending.journal_sha256 = sha
        return sha, pending

    def commit(self):
        done = real_commit(self)
        if str(self.path).endswith(".fits"):
            journal("write", path=str(self.path), sha256=getattr(self, "journal_sha256", None))
        return done

    fitsio.write_fits_pending = write_fits_pending
    fitsio.PendingFile.commit = commit

    poison = _poison_names()
    slow = _slow_spec()
    delay = float(os.environ.get("LSTDP_FAULTS_FRAME_DELAY_S", "0") or 0)
    delay_file = os.environ.get("LSTDP_FAULTS_FRAME_DELAY_FILE")

    def frame_delay() -> float:
        if not delay_file:
            return delay
        try:
            return float(Path(delay_file).read_text().strip() or 0)
        except FileNotFoundError:
            return 0.0

    if poison or slow or delay or delay_file:
        real_calibrate = flow.calibrate_frame

        def calibrate_frame(data, header, *args, **kwargs):
            name = str(header.get("FILENAME", "")).strip()
            t0 = time.monotonic()
            while True:  # the file is read again while waiting: a test may shorten a wait under way
                left = frame_delay() - (time.monotonic() - t0)
                if left <= 0:
                    break
                time.sleep(min(left, 0.1))
            if name in poison:
                journal("poison_kill", frame=name)
                os.kill(os.getpid(), signal.SIGKILL)
            if slow and name == slow[0] and _first_time(f"slow-{name}"):
                journal("slow_start", frame=name, seconds=slow[1])
                time.sleep(slow[1])
                journal("slow_end", frame=name)
            return real_calibrate(data, header, *args, **kwargs)

        flow.calibrate_frame = calibrate_frame
        calibration.calibrate_frame = calibrate_frame  # the name backend/worker imports (the package's re-export)

    visibility = os.environ.get("LSTDP_FAULTS_VISIBILITY_S")
    if visibility:
        from kombu.transport import redis as kredis

        seconds = float(visibility)
        kredis.QoS.visibility_timeout = property(lambda self: seconds)
        kredis.Channel.unacked_restore_interval = 1
        kredis.Channel.unacked_restore_throttle = 1


def main(argv: list[str] | None = None) -> int:
    import backend.cli

    _install_hooks()
    return backend.cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
