"""``/xray``: GOES XRS X-ray flux time series (ingested with ``lstdp import-xray``) and their coverage."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import AfterValidator, BeforeValidator

from backend.api.deps import SessionDep
from backend.api.params import as_utc, time_input
from backend.api.presenters import window_public
from backend.api.schemas import XRayCoveragePublic, XRayCoverageSpan, XRayWindowPublic
from backend.services import xray as xray_service

router = APIRouter(prefix="/xray", tags=["xray"])

_Time = Annotated[dt.datetime, BeforeValidator(time_input), AfterValidator(as_utc)]
SatelliteQuery = Annotated[
    str | None,
    Query(max_length=12, pattern=r"^[A-Za-z0-9_\- ]*$", description="GOES satellite (GOES-15, g15 or 15); default: all"),
]


def window_csv(win: xray_service.XRayWindow) -> str:
    """CSV of a window: one row per sample; an empty flux cell is a gap."""
    buf = io.StringIO()
    buf.write(f"# GOES XRS flux [W m-2], window {win.start.isoformat()} .. {win.end.isoformat()} (UTC); "
              "xrsb = 1-8 A (0.1-0.8 nm), xrsa = 0.5-4 A (0.05-0.4 nm); empty flux = gap (flagged or fill sample)\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["time_utc", "satellite", "xrsb_w_m2", "xrsa_w_m2", "xrsb_quality", "xrsa_quality", "source_file",
                "series_id", "cadence_s"])
    for s in win.series:
        for t, a, b, qa, qb in zip(s.times_iso, s.xrsa, s.xrsb, s.xrsa_quality, s.xrsb_quality):
            w.writerow([t, s.series.satellite, "" if b is None else f"{b:.6e}", "" if a is None else f"{a:.6e}",
                        "" if qb is None else qb, "" if qa is None else qa, s.series.original_name, s.series.id,
                        f"{s.series.cadence_s:.3f}"])
    return buf.getvalue()


@router.get(
    "",
    response_model=XRayWindowPublic,
    summary="GOES XRS flux samples of a UTC window",
    responses={200: {"content": {"text/csv": {}}, "description": "JSON (default) or CSV (format=csv)"}},
)
def read_xray(
    session: SessionDep,
    start: Annotated[_Time, Query(description="Window start, ISO 8601 (UTC if no offset)")],
    end: Annotated[_Time, Query(description="Window end, ISO 8601 (UTC if no offset)")],
    satellite: SatelliteQuery = None,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv")] = "json",  # noqa: A002
):
    """The stored GOES XRS samples with times in [start, end], per series (satellite, layout,
    cadence, source file, the quality rule applied). Flagged and fill samples are ``null`` (gaps).
    422 when end is not after start, the window is longer than 2 days, the satellite is not a
    GOES name, or too many samples fall in it. An empty ``series`` list: no stored series covers
    the window (see ``/xray/coverage``)."""
    try:
        win = xray_service.xray_window(session, start, end, satellite=satellite or None)
    except ValueError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    if format == "csv":
        return Response(window_csv(win), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": 'inline; filename="goes-xrs.csv"'})
    return Response(window_public(win).model_dump_json(), media_type="application/json")


@router.get("/coverage", response_model=XRayCoveragePublic, summary="Time spans covered by the stored GOES XRS series")
def read_xray_coverage(session: SessionDep) -> XRayCoveragePublic:
    """Per satellite, the spans of the stored series (series that overlap or touch are merged)."""
    return XRayCoveragePublic(items=[XRayCoverageSpan(satellite=s, start=a, end=b)
                                     for s, a, b in xray_service.xray_coverage(session)])
