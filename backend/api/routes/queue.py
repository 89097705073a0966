"""``GET /queue``: the worker lanes (cpu, gpu) separately, with their measured throughput."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from backend.api.deps import SessionDep
from backend.services import quotas

router = APIRouter(tags=["jobs"])


@router.get("/queue", summary="Each lane's jobs, pending frames, measured throughput and oldest waiting job")
def read_queue(session: SessionDep) -> dict[str, Any]:
    """Per lane (``cpu``, ``gpu``): ``queued`` and ``running`` jobs, ``frames_pending`` (their
    frames not yet settled; a job not yet planned counts the frames it covered at submit
    time), ``throughput`` (``frames_per_s`` written by the lane's jobs over the last
    ``THROUGHPUT_WINDOW_S``, and its ``basis``: how many products from when to when, or why
    nothing is measured) and ``oldest_waiting`` (the earliest queued job, how long it has
    waited [s]). Anonymous, like every read."""
    return quotas.queue_snapshot(session).as_dict()
