"""``GET /queue``: the worker lanes (cpu, gpu) separately, with their measured throughput."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.schemas import UTCDateTime
from backend.services import quotas

router = APIRouter(tags=["jobs"])


class ThroughputPublic(BaseModel):
    """A lane's measured throughput: ``(products - 1) / (last - first)`` over the ``updated_at``
    of the products its jobs wrote in the last ``window_s`` seconds; null below two."""

    frames_per_s: float | None = Field(description="frames written per second [1/s]; null: not measured")
    products: int = Field(description="products written by the lane's jobs in the window")
    first: UTCDateTime | None
    last: UTCDateTime | None
    window_s: float = Field(description="how far back it looks [s] (THROUGHPUT_WINDOW_S)")
    basis: str = Field(description="the measurement in words, or why there is none")


class WaitingJobPublic(BaseModel):
    job_id: str | None = Field(description="null when it is a job the caller may not see (another user's)")
    created_at: UTCDateTime
    waiting_s: float = Field(description="time since it was submitted [s]")


class LanePublic(BaseModel):
    """One worker lane now."""

    lane: str = Field(description="cpu or gpu")
    queued: int
    running: int
    frames_pending: int = Field(description="frames of its queued and running jobs not yet settled")
    throughput: ThroughputPublic | None
    oldest_waiting: WaitingJobPublic | None = Field(description="the earliest queued job; null when none waits")


class QueuePublic(BaseModel):
    measured_at: UTCDateTime
    lanes: list[LanePublic]


@router.get("/queue", response_model=QueuePublic,
            summary="Each lane's jobs, pending frames, measured throughput and oldest waiting job")
def read_queue(session: SessionDep, principal: OptionalPrincipal) -> QueuePublic:
    """Per lane (``cpu``, ``gpu``): ``queued`` and ``running`` jobs, ``frames_pending`` (their
    frames not yet settled; a job not yet planned counts the frames it covered at submit
    time), ``throughput`` (``frames_per_s`` written by the lane's jobs over the last
    ``THROUGHPUT_WINDOW_S``, and its ``basis``: how many products from when to when, or why
    nothing is measured) and ``oldest_waiting`` (the earliest queued job, how long it has
    waited [s]; its ``job_id`` only when the caller may see that job: their own or a public
    one). Anonymous, like every read."""
    return QueuePublic.model_validate(quotas.queue_snapshot(session, viewer=principal).as_dict())
