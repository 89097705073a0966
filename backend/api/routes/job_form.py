"""``/jobs/estimate`` and ``/jobs/options``: what the job form shows before a job is submitted
(:mod:`backend.services.job_form`). Included before ``/jobs/{job_id}``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from backend.api.deps import SessionDep
from backend.api.params import TimeRangeDep, canonical_channel
from backend.api.schemas import UTCDateTime
from backend.services import job_form

router = APIRouter(prefix="/jobs", tags=["jobs"])


class JobEstimatePublic(BaseModel):
    channels: list[str] = Field(description="The channels asked for, canonical codes")
    start: UTCDateTime
    end: UTCDateTime
    frames: int = Field(description="Frames the job would plan (its items)")
    per_channel: dict[str, int]
    with_products: int = Field(description="Of those, frames that already have a written product")
    first_date_obs: UTCDateTime | None
    last_date_obs: UTCDateTime | None


class OptionFieldPublic(BaseModel):
    name: str
    kind: str = Field(description="bool, int, float or choice")
    default: Any
    description: str
    unit: str | None
    minimum: float | None
    maximum: float | None
    exclusive_minimum: float | None
    exclusive_maximum: float | None
    choices: list[str]


class CalibrationChoicePublic(BaseModel):
    version: int
    channels: list[str]
    valid_from: UTCDateTime | None
    valid_to: UTCDateTime | None
    description: str


class JobOptionsPublic(BaseModel):
    options: list[OptionFieldPublic] = Field(description="CalibrationOptions fields: defaults, limits, units")
    calibrations: dict[str, list[CalibrationChoicePublic]] = Field(
        description="Per calibration kind, the versions the registry holds, newest first")


def _channels(values: list[str]) -> list[str]:
    out = []
    for v in values:
        for part in v.split(","):
            if not part.strip():
                continue
            try:
                out.append(canonical_channel(part.strip()))
            except ValueError as exc:
                raise RequestValidationError([{"type": "value_error", "loc": ("query", "channels"),
                                               "msg": str(exc), "input": part}]) from None
    if not out:
        raise RequestValidationError([{"type": "missing", "loc": ("query", "channels"),
                                       "msg": "at least one channel is needed (SDI, WST, SCI-UV, SCI-WL)",
                                       "input": None}])
    return sorted(set(out))


@router.get("/estimate", response_model=JobEstimatePublic, summary="Frames a job would recalibrate")
def read_job_estimate(
    session: SessionDep,
    span: TimeRangeDep,
    channels: Annotated[list[str], Query(max_length=8, description="LST channels (repeated or comma-separated)")],
) -> JobEstimatePublic:
    """How many frames a job over ``channels`` and DATE-OBS in [``start``, ``end``] would plan,
    per channel, and how many already have a written product; 422 for a missing or unknown
    channel, a missing time or an end before the start (the job form calls it as its fields
    change)."""
    chans = _channels(channels)
    for name in ("start", "end"):
        if getattr(span, name) is None:
            raise RequestValidationError([{"type": "missing", "loc": ("query", name),
                                           "msg": f"{name} is needed (ISO 8601, UTC)", "input": None}])
    est = job_form.estimate_job(session, chans, span.start, span.end)
    return JobEstimatePublic(channels=chans, start=span.start, end=span.end, frames=est.frames,
                             per_channel=est.per_channel, with_products=est.with_products,
                             first_date_obs=est.first, last_date_obs=est.last)


@router.get("/options", response_model=JobOptionsPublic, summary="Calibration options and registry versions")
def read_job_options(session: SessionDep) -> JobOptionsPublic:
    """The calibration options a job accepts (defaults, limits, units) and the calibration
    versions the registry holds, per kind, for pinning."""
    return JobOptionsPublic(
        options=[OptionFieldPublic(**{**f.__dict__, "choices": list(f.choices)}) for f in job_form.option_fields()],
        calibrations={k: [CalibrationChoicePublic(version=c.version, channels=c.channels, valid_from=c.valid_from,
                                                  valid_to=c.valid_to, description=c.description) for c in v]
                      for k, v in job_form.calibration_choices(session).items()})
