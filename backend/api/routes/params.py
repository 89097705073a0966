"""Query and path parameters shared by the routers: channel, HEK type, time range, paging.

Bad values raise 422 with a message that names the parameter and says what is expected
(see ``backend.api.app`` for the error body).

The dependencies that only check parameters are ``async def``: FastAPI calls them in the
event loop instead of handing each to a worker thread (no I/O happens in them; about
0.35 ms less per event search in a scratch measurement with ``benchmarks/events_api.py``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator

from backend.figures import HEK_EVENT_TYPES
from backend.services.event_search import EventFilters
from pipelines.channels import CHANNELS, get_channel
from pipelines.utc import as_utc as _as_utc

__all__ = [
    "MAX_ID",
    "SAFE_KEY_PATTERN",
    "is_safe_key",
    "IdPath",
    "ChannelQuery",
    "EventTypeQuery",
    "TimeRange",
    "TimeRangeDep",
    "Pagination",
    "PaginationDep",
    "canonical_channel",
    "canonical_event_type",
    "as_utc",
    "EVENT_FORMATS",
    "EventSearchDep",
    "event_search",
]

#: Largest id a row can have (PostgreSQL ``integer``): bigger ids are 422, not a database error.
MAX_ID = 2_147_483_647


def canonical_channel(value: str | None) -> str | None:
    """``'SDI'``, ``'WST'``, ``'SCI-UV'`` or ``'SCI-WL'`` for any accepted spelling; ValueError else."""
    if value is None or value == "":
        return None
    try:
        return get_channel(value).code
    except KeyError:
        raise ValueError(f"unknown LST channel {value!r}; expected one of {', '.join(CHANNELS)}") from None


def canonical_event_type(value: str | None) -> str | None:
    """The upper-case HEK event code (``FL``, ``CE``, ``PR``...); ValueError for unknown codes."""
    if value is None or value == "":
        return None
    code = value.strip().upper()
    if code not in HEK_EVENT_TYPES:
        raise ValueError(f"unknown HEK event type {value!r}; expected one of {', '.join(sorted(HEK_EVENT_TYPES))}")
    return code


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """Aware UTC time; a naive time is taken as UTC (:func:`pipelines.utc.as_utc`).

    A query-parameter validator: a time out of range once in UTC is a ``ValueError``.
    """
    try:
        return _as_utc(value)
    except OverflowError:
        raise ValueError(f"time {value.isoformat()} is out of range in UTC") from None


#: What a job id or an event source may contain (they go into SQL string comparisons;
#: PostgreSQL refuses NUL characters, so such values are answered before the query).
SAFE_KEY_PATTERN = r"^[A-Za-z0-9_.\-]*$"


def is_safe_key(value: str, max_length: int = 64) -> bool:
    """True for a short token of letters, digits, ``_``, ``.`` and ``-`` (a job id, a source name)."""
    import re

    return len(value) <= max_length and re.fullmatch(SAFE_KEY_PATTERN, value) is not None


IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="Row id")]
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
_TimeQuery = Annotated[dt.datetime | None, AfterValidator(as_utc)]


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
        raise RequestValidationError([{
            "type": "value_error",
            "loc": ("query", "end"),
            "msg": f"end ({end.isoformat()}) is before start ({start.isoformat()})",
            "input": end.isoformat(),
        }])
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


# -- event search ------------------------------------------------------------------------------

#: Largest |hpc_x|, |hpc_y| accepted [arcsec] (SCI's field reaches ~2.5 Rsun, ~2400 arcsec).
MAX_HPC_ARCSEC = 10_000.0
EVENT_FORMATS = ("json", "csv", "votable", "hek")


def _query_error(name: str, msg: str, value) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("query", name), "msg": msg,
                                    "input": None if value is None else str(value)}])


def _event_types(values: list[str] | None) -> tuple[str, ...]:
    out: list[str] = []
    for v in values or []:
        for part in v.split(","):
            code = canonical_event_type(part)
            if code and code not in out:
                out.append(code)
    return tuple(out)


def _sources(values: list[str] | None) -> tuple[str, ...]:
    import re

    out: list[str] = []
    for v in values or []:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if len(part) > 32 or not re.fullmatch(SAFE_KEY_PATTERN, part):
                raise ValueError(f"{part[:40]!r} is not a source name (letters, digits, _ . -; at most 32)")
            if part not in out:
                out.append(part)
    return tuple(out)


_Hpc = Annotated[float | None, Query(ge=-MAX_HPC_ARCSEC, le=MAX_HPC_ARCSEC)]
_Pa = Annotated[float | None, Query(ge=0, le=360)]


async def event_search(
    span: TimeRangeDep,
    type: Annotated[list[str] | None, Query(  # noqa: A002 - the HEK name of the filter
        description="HEK event code(s): FL, CE, PR, ...; repeat the parameter or separate with commas")] = None,
    source: Annotated[list[str] | None, Query(
        description="detected, or a catalogue (goes_xrs, cdaw, hek, donki, lst_wst, noaa_srs); repeatable")] = None,
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
):
    """The filters of ``GET /events`` as :class:`backend.services.event_search.EventFilters`; 422 with
    the parameter named for a bad value."""
    import math

    from pipelines.catalogues.records import goes_class_to_flux

    try:
        types = _event_types(type)
    except ValueError as exc:
        raise _query_error("type", str(exc), type) from None
    try:
        sources = _sources(source)
    except ValueError as exc:
        raise _query_error("source", str(exc), source) from None
    for lo_name, lo, hi_name, hi in (("hpc_x_min", hpc_x_min, "hpc_x_max", hpc_x_max),
                                     ("hpc_y_min", hpc_y_min, "hpc_y_max", hpc_y_max)):
        if lo is not None and hi is not None and lo > hi:
            raise _query_error(hi_name, f"{hi_name} ({hi}) is smaller than {lo_name} ({lo})", hi)
    flux = None
    if min_goes_class:
        try:
            flux = goes_class_to_flux(min_goes_class)
        except ValueError as exc:
            raise _query_error("min_goes_class", str(exc), min_goes_class) from None
    if min_peak_value is not None and not math.isfinite(min_peak_value):
        raise _query_error("min_peak_value", "must be a finite number", min_peak_value)
    return EventFilters(
        event_types=types, start=span.start, end=span.end, sources=sources, channel=channel,
        hpc_x_min=hpc_x_min, hpc_x_max=hpc_x_max, hpc_y_min=hpc_y_min, hpc_y_max=hpc_y_max,
        pa_min=pa_min, pa_max=pa_max, min_goes_flux=flux, min_peak_value=min_peak_value,
        frm_name=frm_name or None, frm_version=frm_version or None,
    )


EventSearchDep = Annotated[EventFilters, Depends(event_search)]
