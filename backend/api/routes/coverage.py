"""``/coverage``: the time spans each event source and LST channel covers, and the gaps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from backend.api.deps import SessionDep, SettingsDep
from backend.api.params import TimeRangeDep
from backend.api.schemas import CoverageGapPublic, CoveragePublic, CoverageSpanPublic, SourceCoveragePublic
from backend.services import coverage as coverage_service

router = APIRouter(prefix="/coverage", tags=["coverage"])


def coverage_public(session, settings, span, names: list[str] | None = None) -> CoveragePublic:
    """The coverage report as its public schema (shared by the API and the /coverage page)."""
    try:
        report = coverage_service.coverage_report(session, span.start, span.end, settings, names=names)
    except KeyError as exc:
        raise HTTPException(422, detail=str(exc.args[0])) from None
    return CoveragePublic(start=span.start, end=span.end, sources=[
        SourceCoveragePublic(
            name=c.name, kind=c.kind, title=c.title, basis=c.basis,
            spans=[CoverageSpanPublic(start=s.start, end=s.end, complete=s.complete) for s in c.spans],
            gaps=[CoverageGapPublic(start=g.start, end=g.end, reason=g.reason) for g in c.gaps],
        ) for c in report])


@router.get("", response_model=CoveragePublic, summary="Coverage of every event source and LST channel")
def read_coverage(
    session: SessionDep,
    settings: SettingsDep,
    span: TimeRangeDep,
    name: Annotated[list[str] | None, Query(max_length=32, description=(
        "Only these sources/channels (detected, a catalogue, or SDI, WST, SCI-UV, SCI-WL); repeatable"))] = None,
) -> CoveragePublic:
    """Per catalogue (what its imported files say they cover, recorded at import), the platform's
    detections (where written L2 products exist) and each LST channel (written L2 products;
    a break of more than 5 nominal cadences is a gap): the covered spans within [start, end]
    and the gaps, each with its reason where known (catalogue begins/ends, no catalogue file,
    not imported, no frames, failed products, frames not calibrated, quarantined files).
    Open ends: each source's own extent."""
    return coverage_public(session, settings, span, name)
