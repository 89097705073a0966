"""``/events/{id}/curves``: an event's LST light curves (ROI and disk, one calibration set) and GOES
XRS curve, as a figure (Plotly JSON) and for download (JSON, CSV, FITS binary tables)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response

from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep
from backend.api.params import MAX_ID, IdPath, canonical_channel
from backend.api.presenters import visible_set_or_404, window_public
from backend.render.event_figures import event_curves_figure_json
from backend.services import event_curves as curves_service
from backend.services import events as events_service

router = APIRouter(prefix="/events", tags=["events"])

ChannelQuery = Annotated[str, Query(max_length=8, description="LST channel of the light curves (default SDI)")]


SetQuery = Annotated[int | None, Query(ge=1, le=MAX_ID, description=(
    "Calibration set id of the LST products drawn (GET /calibration-sets); default: the public set"))]


def _curves(session, settings, event_id: int, channel: str, principal=None, calibration_set: int | None = None):
    """The curves of a visible event (404 otherwise, also for a calibration set the caller may not see)."""
    row = events_service.get_event(session, event_id, principal)
    if row is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    set_id = visible_set_or_404(session, calibration_set, principal)
    try:
        code = canonical_channel(channel) or "SDI"
    except ValueError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    return curves_service.event_curves(session, row, product_root=settings.products, channel=code,
                                       calibration_set=set_id, principal=principal)


@router.get(
    "/{event_id}/curves/figure",
    summary="LST light curves and GOES XRS curve of an event on one UTC axis (Plotly JSON)",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_event_curves_figure(event_id: IdPath, session: SessionDep, settings: SettingsDep,
                             principal: OptionalPrincipal, channel: ChannelQuery = "SDI",
                             calibration_set: SetQuery = None) -> Response:
    """Top: the ROI (±60″ about the event's position) and disk-integrated means of the written L2
    products of one calibration set (named in the figure); bottom: GOES XRS 1-8 Å and 0.5-4 Å
    (log W m-2, class bands A..X); the event's start, peak and end as lines; gaps are gaps."""
    c = _curves(session, settings, event_id, channel, principal, calibration_set)
    return Response(event_curves_figure_json(c), media_type="application/json")


@router.get(
    "/{event_id}/curves",
    summary="LST light curves and GOES XRS curve of an event (JSON, CSV or FITS)",
    responses={200: {"content": {"text/csv": {}, "application/fits": {}},
                     "description": "JSON (default), CSV or FITS binary tables (format=...)"}},
)
def read_event_curves(event_id: IdPath, session: SessionDep, settings: SettingsDep, principal: OptionalPrincipal,
                      channel: ChannelQuery = "SDI",
                      format: Annotated[Literal["json", "csv", "fits"], Query(description="json, csv or fits")] = "json",  # noqa: A002
                      calibration_set: SetQuery = None) -> Response:
    """The curves of ``/curves/figure`` as data: CSV (one row per sample, empty value = gap) or FITS
    (primary header with the event id, calibration ids and DATE-OBS range; binary tables ``LST``
    and ``GOES_XRS`` with units, NaN = gap)."""
    c = _curves(session, settings, event_id, channel, principal, calibration_set)
    if format == "csv":
        return Response(curves_service.curves_csv(c), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="event-{event_id}-curves.csv"'})
    if format == "fits":
        return Response(curves_service.curves_fits(c), media_type="application/fits",
                        headers={"Content-Disposition": f'attachment; filename="event-{event_id}-curves.fits"'})
    from backend.services.xray import XRayWindow

    xr = window_public(XRayWindow(start=c.start, end=c.end, series=[c.xray] if c.xray else []))
    body = {
        "event_id": c.event.id, "channel": c.channel, "unit": c.unit,
        "window_start": c.start.isoformat(), "window_end": c.end.isoformat(),
        "calibration": None if c.calibration is None else {
            "set_id": c.calibration.set_id, "public": c.calibration.public, "owner": c.calibration.owner,
            "key": c.calibration.key, "params_hash": c.calibration.params_hash, "label": c.calibration.label,
            "files": [{"kind": k, "id": i, "version": v} for k, i, v in c.calibration.files],
            "software_versions": c.calibration.software_versions},
        "roi_box_arcsec": c.roi_box, "times": [t.isoformat() for t in c.lst_times], "roi": c.roi, "disk": c.disk,
        "roi_sigma": c.roi_sigma, "disk_sigma": c.disk_sigma,
        "product_ids": c.product_ids, "frames_other_sets": c.frames_other_sets, "skipped": c.skipped,
        "notes": c.notes, "xray": xr.model_dump(mode="json"),
    }
    import json

    return Response(json.dumps(body), media_type="application/json")
