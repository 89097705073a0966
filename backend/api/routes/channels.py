"""``/channels``: LST's four channels (SDI, WST, SCI-UV, SCI-WL)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from backend.api.deps import SessionDep
from backend.api.params import canonical_channel
from backend.api.schemas import ChannelPublic, ChannelsPublic
from backend.models import Channel
from backend.services.channels import list_channels

router = APIRouter(prefix="/channels", tags=["channels"])


@router.get("", response_model=ChannelsPublic, summary="List the channels")
def read_channels(session: SessionDep) -> ChannelsPublic:
    """Every channel with its passband, field of view, L2 unit and cadence."""
    rows = list_channels(session)
    return ChannelsPublic(items=[ChannelPublic.model_validate(r) for r in rows], total=len(rows))


@router.get("/{code}", response_model=ChannelPublic, summary="One channel")
def read_channel(code: str, session: SessionDep) -> ChannelPublic:
    """One channel by code (case-insensitive; ``SCI_UV`` is accepted for ``SCI-UV``)."""
    try:
        canon = canonical_channel(code)
    except ValueError as exc:
        raise HTTPException(404, detail=str(exc)) from None
    row = session.get(Channel, canon)
    if row is None:
        raise HTTPException(404, detail=f"channel {canon} is not in the database (run the migrations)")
    return ChannelPublic.model_validate(row)
