"""``/frames``: raw observations (L0/L1) as ingested."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from backend.api.deps import SessionDep
from backend.api.params import ChannelQuery, IdPath, PaginationDep, TimeRangeDep
from backend.api.schemas import FrameDetail, FramePublic, FramesPublic
from backend.services import frames as frames_service

router = APIRouter(prefix="/frames", tags=["frames"])


@router.get("", response_model=FramesPublic, summary="List frames")
def read_frames(session: SessionDep, page: PaginationDep, span: TimeRangeDep, channel: ChannelQuery = None) -> FramesPublic:
    """Frames of a channel with DATE-OBS in [start, end], oldest first."""
    rows, total = frames_service.list_frames(
        session, channel=channel, start=span.start, end=span.end, limit=page.limit, offset=page.offset
    )
    return FramesPublic(items=[FramePublic.model_validate(r) for r in rows], total=total,
                        limit=page.limit, offset=page.offset)


@router.get("/{frame_id}", response_model=FrameDetail, summary="One frame with its header")
def read_frame(frame_id: IdPath, session: SessionDep) -> FrameDetail:
    """One frame with its full FITS header as JSON."""
    row = frames_service.get_frame(session, frame_id)
    if row is None:
        raise HTTPException(404, detail=f"no frame with id {frame_id}")
    return FrameDetail.model_validate(row)
