"""Query and path parameters shared by the routers: channel, HEK type, time range, paging.

Bad values raise 422 with a message that names the parameter and says what is expected
(see ``backend.api.app`` for the error body).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator

from backend.figures import HEK_EVENT_TYPES
from pipelines.channels import CHANNELS, get_channel

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
    """Aware UTC time; a naive time is taken as UTC."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
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


def time_range(
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


def pagination(
    limit: Annotated[int, Query(ge=1, le=500, description="Page size (1..500)")] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="Rows to skip")] = 0,
) -> Pagination:
    """``limit`` (1..500, default 50) and ``offset`` (>= 0)."""
    return Pagination(limit, offset)


PaginationDep = Annotated[Pagination, Depends(pagination)]
