"""Query and path parameters shared by the API's routers: ids, channel, HEK type, time range,
paging, product filters, and the event filters as a dependency.

Bad values raise 422 with a message that names the parameter and says what is expected
(see ``backend.api.app`` for the error body).

The event filters (type, source, time range, channel, helioprojective box, position angle,
minimum GOES class...) are read by one parser, :func:`backend.services.event_filters.parse_event_filters`,
for the API (:func:`event_search`: the first refused value is a 422), the browser's events page
(``backend.api.pages.events``: a refused value is shown as a note and that filter not applied)
and saved searches.

The dependencies that only check parameters are ``async def``: FastAPI calls them in the
event loop instead of handing each to a worker thread (no I/O happens in them; about
0.35 ms less per event search in a scratch measurement with ``benchmarks/events_api.py``).
"""

from __future__ import annotations

import datetime as dt
import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BeforeValidator

from backend.api.deps import OptionalPrincipal
from backend.services.event_filters import (
    MAX_HPC_ARCSEC,
    MAX_ID,
    NUMERIC_FILTERS,
    PLUS_AS_SPACE,
    PLUS_AS_SPACE_MESSAGE,
    SAFE_KEY_PATTERN,
    EventFilterError,
    FilterProblem,
    ParsedEventFilters,
    canonical_channel,
    canonical_event_type,
    check_event_filters,
    for_viewer,
    is_safe_key,
    parse_event_filters,
    time_order_problem,
)
from backend.services.event_search import EventFilters
from pipelines.catalogues import CATALOGUES, DETECTED_SOURCE
from pipelines.utc import as_utc as _as_utc
from pipelines.utc import parse_utc_text

__all__ = [
    "MAX_ID",
    "SAFE_KEY_PATTERN",
    "is_safe_key",
    "IdPath",
    "ChannelQuery",
    "LevelQuery",
    "CalibrationSetQuery",
    "Systematic",
    "SystematicsQuery",
    "EventTypeQuery",
    "JobIdQuery",
    "VersionQuery",
    "TimeRange",
    "TimeRangeDep",
    "Pagination",
    "PaginationDep",
    "canonical_channel",
    "canonical_event_type",
    "as_utc",
    "time_input",
    "EVENT_FORMATS",
    "FilterProblem",
    "ParsedEventFilters",
    "NUMERIC_FILTERS",
    "parse_event_filters",
    "for_viewer",
    "query_error",
    "EventSearchDep",
    "event_search",
]


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """Aware UTC time; a naive time is taken as UTC (:func:`pipelines.utc.as_utc`).

    A query-parameter validator: a time out of range once in UTC is a ``ValueError``.
    """
    try:
        return _as_utc(value)
    except OverflowError:
        raise ValueError(f"time {value.isoformat()} is out of range in UTC") from None


IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="Row id")]
#: A product's processing level (``products.level``, the FITS ``LEVEL`` keyword: ``L2`` for
#: every calibrated product today).
LevelQuery = Annotated[
    str | None,
    Query(max_length=8, pattern=r"^L[0-9][A-Za-z0-9.]{0,6}$", description="Product level (LEVEL keyword), e.g. L2"),
]
#: Only the products of one calibration set (its id).
CalibrationSetQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_ID, description="Only products of this calibration set (its id: GET /calibration-sets)"),
]
#: A frame-wide systematic the calibration flagged (``products.quality_flags``, the product's
#: ``QUALITY`` bits: ``pipelines.calibration.l2.quality.SYSTEMATICS``), or ``any`` of them.
Systematic = Literal["any", "centre_refused", "centre_failed", "stray_light_refused", "flat_plane_stated"]
SystematicsQuery = Annotated[
    Systematic | None,
    Query(description="Frame-wide systematic flagged on the L2 product (QUALITY bits): centre_refused (a centre "
                      "fit refused: header's centre kept, unverified), centre_failed (no centre fit), "
                      "stray_light_refused, flat_plane_stated, or any"),
]
ChannelQuery = Annotated[
    str | None,
    Query(description="LST channel: SDI, WST, SCI-UV or SCI-WL (case-insensitive)"),
    AfterValidator(canonical_channel),
]
EventTypeQuery = Annotated[
    str | None,
    Query(alias="type", description="HEK event code: FL (flare), CE (CME), PR (prominence), ..."),
    AfterValidator(canonical_event_type),
]
#: One product version of a frame (a product id), as the diff of two versions takes them.
VersionQuery = Annotated[int, Query(ge=1, le=MAX_ID, description="Product id (a written product of this frame)")]
#: Only the products of one job (its id).
JobIdQuery = Annotated[
    str | None,
    Query(max_length=36, pattern=SAFE_KEY_PATTERN, description="Only the products of this job (its frames' products)"),
]


def reject_plus_as_space(value: Any) -> Any:
    """A BeforeValidator of query times: ValueError for a time whose ``+`` came as a space."""
    if isinstance(value, str) and PLUS_AS_SPACE.match(value):
        raise ValueError(PLUS_AS_SPACE_MESSAGE.format(value=value))
    return value


def time_input(value: Any) -> Any:
    """The BeforeValidator of every time the API reads (:func:`pipelines.utc.parse_utc_text`):
    ISO 8601 extended or basic (``20110607``), leap seconds through astropy ``Time``; a
    number is a ValueError (never Unix seconds), as is a ``+`` offset that came as a space.
    None passes (an open bound)."""
    if value is None:
        return None
    return parse_utc_text(reject_plus_as_space(value))


_TimeQuery = Annotated[dt.datetime | None, BeforeValidator(time_input), AfterValidator(as_utc)]


@dataclass(frozen=True)
class TimeRange:
    """Aware UTC bounds (inclusive); either may be open."""

    start: dt.datetime | None
    end: dt.datetime | None


async def time_range(
    start: Annotated[_TimeQuery, Query(description="Range start, ISO 8601 (UTC if no offset)")] = None,
    end: Annotated[_TimeQuery, Query(description="Range end, ISO 8601 (UTC if no offset)")] = None,
) -> TimeRange:
    """The ``start``/``end`` query parameters; 422 when ``end`` is before ``start``."""
    if start is not None and end is not None and end < start:
        p = time_order_problem(start, end)
        raise query_error(p.param, p.message, p.value)
    return TimeRange(start, end)


TimeRangeDep = Annotated[TimeRange, Depends(time_range)]


@dataclass(frozen=True)
class Pagination:
    limit: int
    offset: int


async def pagination(
    limit: Annotated[int, Query(ge=1, le=500, description="Page size (1..500)")] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="Rows to skip")] = 0,
) -> Pagination:
    """``limit`` (1..500, default 50) and ``offset`` (>= 0)."""
    return Pagination(limit, offset)


PaginationDep = Annotated[Pagination, Depends(pagination)]


# -- event filters ------------------------------------------------------------------------------

EVENT_FORMATS = ("json", "csv", "votable", "hek")


def query_error(name: str, msg: str, value) -> RequestValidationError:
    """The 422 of a refused query parameter ``name`` (``query.<name>: <msg>``, ``input``: the value as text)."""
    return RequestValidationError([{"type": "value_error", "loc": ("query", name), "msg": msg,
                                    "input": None if value is None else str(value)}])


_Hpc = Annotated[float | None, Query(ge=-MAX_HPC_ARCSEC, le=MAX_HPC_ARCSEC, allow_inf_nan=False)]
_Pa = Annotated[float | None, Query(ge=0, le=360, allow_inf_nan=False)]


async def event_search(
    span: TimeRangeDep,
    principal: OptionalPrincipal,
    type: Annotated[list[str] | None, Query(  # noqa: A002 - the HEK name of the filter
        description="HEK event code(s): FL, CE, PR, ...; repeat the parameter or separate with commas")] = None,
    source: Annotated[list[str] | None, Query(
        description=f"{DETECTED_SOURCE}, or a catalogue ({', '.join(CATALOGUES)}); repeatable")] = None,
    channel: ChannelQuery = None,
    hpc_x_min: Annotated[_Hpc, Query(description="Bounding box: smallest Solar X [arcsec]")] = None,
    hpc_x_max: Annotated[_Hpc, Query(description="Bounding box: largest Solar X [arcsec]")] = None,
    hpc_y_min: Annotated[_Hpc, Query(description="Bounding box: smallest Solar Y [arcsec]")] = None,
    hpc_y_max: Annotated[_Hpc, Query(description="Bounding box: largest Solar Y [arcsec]")] = None,
    pa_min: Annotated[_Pa, Query(description="Position angle from [deg, CCW from solar north]; "
                                             "pa_min > pa_max wraps through 0")] = None,
    pa_max: Annotated[_Pa, Query(description="Position angle to [deg]")] = None,
    min_goes_class: Annotated[str | None, Query(max_length=12, description="Smallest GOES class, e.g. M1.0 or X10")] = None,
    min_peak_value: Annotated[float | None, Query(description="Smallest peak_value (in the event's peak_unit)")] = None,
    frm_name: Annotated[str | None, Query(max_length=100, pattern=r"^[^\x00]*$",
                                          description="Detector / method name (HEK FRM_NAME), exact")] = None,
    frm_version: Annotated[str | None, Query(max_length=40, pattern=r"^[^\x00]*$",
                                             description="Detector version (HEK FRM_VERSION), exact")] = None,
    noaa_ar: Annotated[int | None, Query(ge=1, le=99_999, description=(
        "NOAA active region number; four digits also match 1xxxx (SRS/HEK print 13664 as 3664)"))] = None,
    associated_type: Annotated[str | None, Query(max_length=4, description=(
        "HEK code of an associated event: e.g. CE for flares with a CME (event_associations)"))] = None,
    calibration_set: Annotated[str | None, Query(max_length=400, description=(
        "Calibration set of the L2 products the event was detected from: a set id "
        "(GET /calibration-sets), or kind:id pairs (dark:3,flat:5)"))] = None,
    calibration_file: Annotated[int | None, Query(ge=1, le=MAX_ID, description=(
        "A calibration file id used by the L2 products the event was detected from"))] = None,
    min_angular_width: Annotated[float | None, Query(ge=0, le=360, allow_inf_nan=False, description=(
        "Smallest angular width [deg] (CMEs: 60 for wider than 60 deg, 360 for halo CMEs)"))] = None,
    systematics: Annotated[Systematic | None, Query(description=(
        "A frame-wide systematic flagged on an L2 product the event was detected from (its QUALITY bits): "
        "centre_refused, centre_failed, stray_light_refused, flat_plane_stated, or any"))] = None,
):
    """The filters of ``GET /events`` as :class:`backend.services.event_search.EventFilters`
    (:func:`backend.services.event_filters.parse_event_filters`); 422 with the parameter named
    for a bad value (the first in :data:`~backend.services.event_filters.API_CHECK_ORDER`)."""
    parsed = parse_event_filters(
        types=type, sources=source, start=span.start, end=span.end, channel=channel,
        pa_min=pa_min, pa_max=pa_max, hpc_x_min=hpc_x_min, hpc_x_max=hpc_x_max,
        hpc_y_min=hpc_y_min, hpc_y_max=hpc_y_max, min_goes_class=min_goes_class,
        min_peak_value=min_peak_value, frm_name=frm_name, frm_version=frm_version,
        noaa_ar=noaa_ar, associated_type=associated_type, calibration_set=calibration_set,
        calibration_file=calibration_file, min_angular_width=min_angular_width,
    )
    try:
        filters = check_event_filters(parsed)
    except EventFilterError as exc:
        raise query_error(exc.param, exc.message, exc.value) from None
    if systematics is not None:
        filters = dataclasses.replace(filters, systematics=systematics)
    return for_viewer(filters, principal)


EventSearchDep = Annotated[EventFilters, Depends(event_search)]
