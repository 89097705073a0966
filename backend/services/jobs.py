"""Recalibration jobs: validate, store, enqueue, follow.

A job row is committed first and only then sent to the broker (Celery guide: enqueue after
the DB commit), so a worker never sees a job id that is not yet visible.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, CalibrationKind, Job, JobState
from pipelines.calibration import CalibrationOptions
from pipelines.channels import CHANNELS, get_channel
from pipelines.errors import DataError
from pipelines.utc import as_utc, parse_utc_text

if TYPE_CHECKING:
    from backend.auth import Principal

__all__ = ["CalibrationOptions", "JobRequest", "JobRequestError", "submit_job", "get_job", "list_jobs", "enqueue_job",
           "fail_if_queued"]

#: Largest calibration version number accepted (a 32-bit signed integer column).
MAX_VERSION = 2**31 - 1


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unusable_value(value: Any, where: str = "") -> str | None:
    """Where in a decoded JSON body a value is that no job can carry, and why; None if none.

    JSON has no NaN or infinity (Python's decoder still reads ``NaN``, ``Infinity`` and
    ``1e400``), PostgreSQL text cannot hold a NUL character and UTF-8 has no lone surrogate
    (a JSON ``\\ud800`` decodes to one): such a value is refused
    wherever it is, before any field is read.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'body'}: {value!r} is not a finite number (NaN, Infinity and numbers beyond " \
               "1.8e308 are not accepted)"
    if isinstance(value, str) and "\x00" in value:
        return f"{where or 'body'}: text must not contain a NUL character (\\u0000)"
    if isinstance(value, str) and not _encodes(value):
        return f"{where or 'body'}: text must not contain a lone surrogate (\\ud800-\\udfff): not UTF-8"
    if isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            if "\x00" in key or not _encodes(key):
                return f"{where or 'body'}: a key must not contain a NUL character or a lone surrogate"
            if (why := _unusable_value(v, f"{where}.{key}" if where else key)) is not None:
                return why
    if isinstance(value, list):
        for i, v in enumerate(value):
            if (why := _unusable_value(v, f"{where}[{i}]" if where else f"[{i}]")) is not None:
                return why
    return None


class JobRequestError(DataError):
    """A job request that cannot be run (unknown channel, pinned version that does not exist...)."""


class JobRequest(BaseModel):
    """What a user asks for: recalibrate these channels over this DATE-OBS range.

    ``pinned_calibrations`` maps a calibration kind (dark, flat, stray_light, radiometric,
    mask_geometry, psf) to a version number, applied to every requested channel that has
    it; unpinned kinds use the newest version valid at each frame's DATE-OBS.
    """

    model_config = ConfigDict(extra="forbid")  # a misplaced key ("device" outside options) is a 422

    channels: list[str] = Field(min_length=1, description="LST channels: SDI, WST, SCI-UV, SCI-WL")
    start: dt.datetime = Field(description="DATE-OBS range start (UTC, ISO 8601)")
    end: dt.datetime = Field(description="DATE-OBS range end (UTC, ISO 8601)")
    pinned_calibrations: dict[str, int] = Field(default_factory=dict)
    options: CalibrationOptions = Field(default_factory=CalibrationOptions,
                                        description="calibration options, each with its default and limits")
    webhook_url: str | None = Field(None, max_length=2000, description=(
        "optional: POSTed a signed job.ended message when the job ends (https:// or http://, no credentials; "
        "the secret is in the answer, once)"))

    @model_validator(mode="before")
    @classmethod
    def _no_unusable_values(cls, data: Any) -> Any:
        if (why := _unusable_value(data)) is not None:
            raise ValueError(why)
        if isinstance(data, dict) and "owner" in data:
            raise ValueError("owner: a job's owner is the user of the API token that submits it; do not send it")
        return data

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, v: str | None) -> str | None:
        from backend.services.notify import check_webhook_url

        return None if v is None else check_webhook_url(v)

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: list[str]) -> list[str]:
        out = []
        for c in v:
            try:
                out.append(get_channel(c).code)
            except KeyError:
                raise ValueError(f"unknown channel {c!r}; expected one of {', '.join(CHANNELS)}") from None
        return sorted(set(out))

    @field_validator("start", "end", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        """ISO 8601 extended or basic, leap seconds through astropy ``Time``; a number is refused
        (never Unix seconds): :func:`pipelines.utc.parse_utc_text`."""
        return v if v is None else parse_utc_text(v)

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, v: dt.datetime) -> dt.datetime:
        try:
            return as_utc(v)
        except OverflowError:
            raise ValueError("date out of range once converted to UTC") from None

    @field_validator("pinned_calibrations")
    @classmethod
    def _kinds(cls, v: dict[str, int]) -> dict[str, int]:
        kinds = {k.value for k in CalibrationKind}
        for k, ver in v.items():
            if k not in kinds:
                raise ValueError(f"unknown calibration kind {k!r}; expected one of {', '.join(sorted(kinds))}")
            if not 1 <= ver <= MAX_VERSION:
                raise ValueError(f"calibration version must be between 1 and {MAX_VERSION}, got {ver} for {k}")
        return v

    @model_validator(mode="after")
    def _range(self) -> JobRequest:
        if self.end < self.start:
            raise ValueError("end is before start")
        return self


def enqueue_job(job_id: str) -> None:
    """Send the job to the broker (task ``run_job`` by name, queue ``cpu``: planning runs on the
    CPU workers for either lane); returns at once."""
    from backend.broker import TaskName, send

    send(TaskName.run_job, args=[job_id], queue="cpu")


def fail_if_queued(session: Session, job: Job, reason: str) -> None:
    """Mark ``job`` failed with ``reason`` and commit, unless a worker has taken it meanwhile
    (its message arrived after all: the row, locked and read again, says ``running``); for a
    job stored but not sent (the broker unreachable, the request given up)."""
    from backend.state import move_job

    session.refresh(job, with_for_update=True)
    if job.state == JobState.queued:
        move_job(job, JobState.failed, reason)
    session.commit()


def submit_job(session: Session, req: JobRequest, *, owner: str = "system", publishes: bool = True,
               enqueue: bool = True, rerun_of: str | None = None, quota_for: Principal | None = None) -> Job:
    """Validate ``req`` against the database, store a ``queued`` job, commit, enqueue it.

    ``owner``: the user of the token that submits it (``system``: the CLI, the demo);
    ``publishes``: whether its detections may enter the public catalogue (an admin's or the
    platform's job, on public calibration sets only); ``quota_for``: the principal whose
    quotas the job counts against (:func:`backend.services.quotas.admit_job`: checked under
    the user's lock, the job's frames charged in the same commit); None (the CLI, the demo):
    no quota.

    Raises
    ------
    JobRequestError
        If a pinned calibration version does not exist for any requested channel.
    backend.services.quotas.QuotaExceeded
        429 over a quota of ``quota_for`` (nothing is stored).
    """
    if req.options.device == "gpu":
        from backend.settings import get_settings

        if get_settings().embedded:
            raise JobRequestError("device 'gpu' needs GPU workers (production mode); the embedded mode has a CPU worker only")
    if req.options.deconvolve_psf and "SDI" in req.channels:
        n = session.scalar(select(func.count()).select_from(CalibrationFile).where(
            CalibrationFile.kind == CalibrationKind.psf, CalibrationFile.channel_code == "SDI"))
        if not n:
            raise JobRequestError("deconvolve_psf needs an SDI psf calibration file; none is registered")
    _check_stray_light_source(session, req)
    for kind, version in req.pinned_calibrations.items():
        n = session.scalar(
            select(func.count()).select_from(CalibrationFile).where(
                CalibrationFile.kind == CalibrationKind(kind),
                CalibrationFile.version == version,
                CalibrationFile.channel_code.in_(req.channels),
            )
        )
        if not n:
            raise JobRequestError(
                f"no {kind} calibration file version {version} for channel(s) {', '.join(req.channels)}"
            )
    frames = None
    if quota_for is not None:
        from backend.services.quotas import admit_job

        frames = admit_job(session, quota_for, req.channels, req.start, req.end)
    job = Job(
        owner=owner,
        kind="calibrate",
        parameters=req.model_dump(mode="json", exclude={"webhook_url"}),  # its webhook is a row of its own
        state=JobState.queued,
        publishes=publishes,
        lane=req.options.device,
        rerun_of=rerun_of,
    )
    session.add(job)
    if frames is not None:
        from backend.services.quotas import charge_job

        session.flush()
        charge_job(session, job, frames)
    if req.webhook_url:
        from backend.services.notify import register_webhook

        session.flush()
        register_webhook(session, owner, req.webhook_url, job_id=job.id)
    session.commit()
    if enqueue:
        enqueue_job(job.id)
    return job


def get_job(session: Session, job_id: str, principal: Any) -> Job:
    """Job ``job_id`` if ``principal`` (None: anonymous) may see it
    (:func:`backend.services.visibility.job_rule`: public jobs and their own; admins all).

    Raises
    ------
    backend.services.visibility.NotVisible
        No such job, or another user's (a 404 either way).
    """
    from backend.services.visibility import get_visible

    return get_visible(session, Job, job_id, principal)


def list_jobs(session: Session, principal: Any, *, limit: int = 50, offset: int = 0) -> tuple[list[Job], int]:
    """The jobs ``principal`` may see (public jobs and their own; an admin all; anonymous the
    public ones), newest first: one page and the total."""
    from backend.services.visibility import visible

    q = visible(select(Job), Job, principal)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)))
    return rows, total


#: ``CalibrationOptions.stray_light_source`` -> the ``STRAYTYP`` a stray-light master must carry
#: to have that representation (written by :func:`pipelines.calibration.masters.stray_light` and
#: :func:`validation.blind_stray.blind_stray_master`).
_STRAYTYP_FOR_SOURCE = {"profile": "PROFILE", "map": "MAP"}


def _check_stray_light_source(session: Session, req: JobRequest) -> None:
    """Refuse (:class:`JobRequestError`, a 4xx) a ``stray_light_source`` of ``profile`` or ``map``
    when a requested SCI channel has no registered stray-light master of that ``STRAYTYP`` (the
    pinned version where one is pinned): every product would otherwise fail at run time."""
    want = _STRAYTYP_FOR_SOURCE.get(req.options.stray_light_source)
    if want is None or not req.options.subtract_stray_light:
        return
    for channel in (c for c in req.channels if c.startswith("SCI")):
        q = select(CalibrationFile).where(CalibrationFile.kind == CalibrationKind.stray_light,
                                          CalibrationFile.channel_code == channel)
        if "stray_light" in req.pinned_calibrations:
            q = q.where(CalibrationFile.version == req.pinned_calibrations["stray_light"])
        types = {str((row.parameters or {}).get("STRAYTYP", "")).strip().upper() for row in session.scalars(q)}
        if want not in types:
            raise JobRequestError(
                f"stray_light_source={req.options.stray_light_source} needs a {channel} stray_light calibration "
                f"file with STRAYTYP='{want}'; the registered ones have {sorted(t or 'none' for t in types) or 'none'}")
