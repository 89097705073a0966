"""Event-filter parsing: the one reader of the event search's filters, for the API
(``GET /api/v1/events`` and the figures built on it), the browser's events page and saved
searches (:mod:`backend.services.saved_searches`).

:func:`parse_event_filters` reads every filter (HEK type, source, time range, channel,
helioprojective box [arcsec], position angle [deg], minimum GOES class, NOAA region,
associated event type, detector, calibration set or file, angular width [deg]) from parsed
values (the API's query parameters) or from a form's text, and reports each refused value
as a :class:`FilterProblem` naming the parameter, with the message the API answers and the
note the events page shows. :func:`check_event_filters` raises the first problem, in the
order the API has always checked them, as an :class:`EventFilterError` (a ``ValueError``);
the API layer answers it 422 with the parameter named
(:func:`backend.api.params.event_search`), saved searches refuse the query.

Nothing here knows HTTP: no FastAPI, no request objects.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.services.event_search import EventFilters
from pipelines.catalogues import SOURCES
from pipelines.channels import CHANNELS, get_channel
from pipelines.utc import parse_utc_text

__all__ = [
    "MAX_ID",
    "SAFE_KEY_PATTERN",
    "is_safe_key",
    "canonical_channel",
    "canonical_event_type",
    "PLUS_AS_SPACE",
    "PLUS_AS_SPACE_MESSAGE",
    "MAX_HPC_ARCSEC",
    "NUMERIC_FILTERS",
    "FilterProblem",
    "ParsedEventFilters",
    "EventFilterError",
    "filter_time",
    "time_order_problem",
    "parse_event_filters",
    "API_CHECK_ORDER",
    "check_event_filters",
    "for_viewer",
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
    from backend.render.figures import HEK_EVENT_TYPES

    if value is None or value == "":
        return None
    code = value.strip().upper()
    if code not in HEK_EVENT_TYPES:
        raise ValueError(f"unknown HEK event type {value!r}; expected one of {', '.join(sorted(HEK_EVENT_TYPES))}")
    return code


#: What a job id or an event source may contain (they go into SQL string comparisons;
#: PostgreSQL refuses NUL characters, so such values are answered before the query).
SAFE_KEY_PATTERN = r"^[A-Za-z0-9_.\-]*$"


def is_safe_key(value: str, max_length: int = 64) -> bool:
    """True for a short token of letters, digits, ``_``, ``.`` and ``-`` (a job id, a source name)."""
    return len(value) <= max_length and re.fullmatch(SAFE_KEY_PATTERN, value) is not None


#: ``2024-05-10T00:00:00 00:00``: an ISO time whose ``+`` offset arrived as a space (a raw
#: ``+`` in a URL query string means a space).
PLUS_AS_SPACE = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)? \d{2}(:?\d{2})?\s*$")
PLUS_AS_SPACE_MESSAGE = ("{value!r} has a space where its UTC offset's '+' should be: a raw '+' in a URL query "
                         "is read as a space; encode it as %2B (e.g. 2024-05-10T00:00:00%2B00:00) or use Z")


#: Largest |hpc_x|, |hpc_y| accepted [arcsec] (SCI's field reaches ~2.5 Rsun, ~2400 arcsec).
MAX_HPC_ARCSEC = 10_000.0

#: The numeric event filters: (query parameter, label on the events page, lowest, highest).
NUMERIC_FILTERS: tuple[tuple[str, str, float, float], ...] = (
    ("pa_min", "PA from", 0, 360),
    ("pa_max", "PA to", 0, 360),
    ("hpc_x_min", "Solar X from", -MAX_HPC_ARCSEC, MAX_HPC_ARCSEC),
    ("hpc_x_max", "Solar X to", -MAX_HPC_ARCSEC, MAX_HPC_ARCSEC),
    ("hpc_y_min", "Solar Y from", -MAX_HPC_ARCSEC, MAX_HPC_ARCSEC),
    ("hpc_y_max", "Solar Y to", -MAX_HPC_ARCSEC, MAX_HPC_ARCSEC),
)
_BOXES = (("hpc_x_min", "hpc_x_max"), ("hpc_y_min", "hpc_y_max"))


@dataclass(frozen=True)
class FilterProblem:
    """An event-filter value that :func:`parse_event_filters` refused.

    Attributes
    ----------
    param : str
        The query parameter (``type``, ``source``, ``end``, ``hpc_x_max``...).
    message : str
        What the API answers (the 422 ``detail`` after ``query.<param>:``).
    note : str
        What the events page shows (the filter is then not applied).
    value : object
        The value as given (the 422 body's ``input``).
    """

    param: str
    message: str
    note: str
    value: Any


@dataclass(frozen=True)
class ParsedEventFilters:
    """What :func:`parse_event_filters` read.

    Attributes
    ----------
    filters : EventFilters
        The filters without the refused values.
    problems : tuple of FilterProblem
        The refused values, in the order of the events page's form.
    min_goes_class : str or None
        The minimum GOES class as applied (trimmed and upper-cased for a form), None when
        absent or refused.
    """

    filters: EventFilters
    problems: tuple[FilterProblem, ...] = ()
    min_goes_class: str | None = None


def _values(values: str | Sequence[str] | None, split: bool) -> list[str]:
    """The values of a repeatable filter; with ``split``, comma-separated lists are split."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part for v in values for part in (v.split(",") if split else [v])]


def time_order_problem(start: dt.datetime, end: dt.datetime) -> FilterProblem:
    """The problem of a time range whose ``end`` is before its ``start`` (both aware UTC)."""
    return FilterProblem("end", f"end ({end.isoformat()}) is before start ({start.isoformat()})",
                         "end is before start: the time range was not applied", end.isoformat())


def filter_time(name: str, value: str | dt.datetime | None, problems: list[FilterProblem]) -> dt.datetime | None:
    """Aware UTC time of a datetime or of a form's text (``YYYY-MM-DDTHH:MM[:SS]``, UTC if no
    offset; :func:`pipelines.utc.parse_utc_text`), or None when absent or refused: a refused
    value is appended to ``problems`` as a :class:`FilterProblem` of parameter ``name``."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and PLUS_AS_SPACE.match(value):
        msg = PLUS_AS_SPACE_MESSAGE.format(value=value)
        problems.append(FilterProblem(name, msg, f"{name}: {msg}", value))
        return None
    try:
        return parse_utc_text(value)
    except ValueError as exc:
        msg = str(exc)
        problems.append(FilterProblem(name, msg, f"{name}: {msg}", value))
        return None


def _filter_number(name: str, label: str, value: str | float | None, lo: float, hi: float,
                   problems: list[FilterProblem]) -> float | None:
    """A number in [lo, hi] (a form's text or an already parsed number), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        v = float(value)
    except ValueError:
        msg = f"{value[:40]!r} is not a number"
        problems.append(FilterProblem(name, msg, f"{label}: {msg}", value))
        return None
    if not (lo <= v <= hi):
        msg = f"{v:g} is outside {lo:g}..{hi:g}"
        problems.append(FilterProblem(name, msg, f"{label}: {msg}", value))
        return None
    return v


#: A calibration set key (``backend.services.registry``: ``kind:id`` pairs sorted by kind).
_CALIBRATION_SET = re.compile(r"[a-z_]{1,20}:\d{1,10}(,[a-z_]{1,20}:\d{1,10}){0,15}")


def _filter_int(name: str, label: str, value: str | int | None, lo: int, hi: int,
                problems: list[FilterProblem]) -> int | None:
    """A whole number in [lo, hi] (a form's text or an int), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        v = int(str(value).strip())
    except ValueError:
        msg = f"{str(value)[:40]!r} is not a whole number"
        problems.append(FilterProblem(name, msg, f"{label}: {msg}", value))
        return None
    if not lo <= v <= hi:
        msg = f"{v} is outside {lo}..{hi}"
        problems.append(FilterProblem(name, msg, f"{label}: {msg}", value))
        return None
    return v


def _link_filters(noaa_ar, associated_type, calibration_set, calibration_file,
                  problems: list[FilterProblem]) -> dict[str, Any]:
    """The region, associated-type and calibration filters of :func:`parse_event_filters`
    (``EventFilters`` keyword arguments; refused values reported in ``problems``)."""
    region = _filter_int("noaa_ar", "NOAA region", noaa_ar, 1, 99_999, problems)
    assoc = None
    if associated_type:
        try:
            assoc = canonical_event_type(associated_type)
        except ValueError as exc:
            problems.append(FilterProblem("associated_type", str(exc), f"associated event type: {exc}",
                                          associated_type))
    cal_set = (calibration_set or "").strip() or None
    if cal_set is not None and (cal_set.isascii() and cal_set.isdigit()):  # a calibration set id (GET /calibration-sets)
        if not 1 <= int(cal_set) <= MAX_ID:
            msg = f"calibration set id {cal_set[:20]} is outside 1..{MAX_ID}"
            problems.append(FilterProblem("calibration_set", msg, f"calibration set: {msg}", calibration_set))
            cal_set = None
        return {"noaa_ar": region, "associated_type": assoc, "calibration_set": cal_set,
                "calibration_file": _filter_int("calibration_file", "calibration file", calibration_file, 1, MAX_ID,
                                                problems)}
    if cal_set is not None and not _CALIBRATION_SET.fullmatch(cal_set):
        msg = (f"{cal_set[:60]!r} is not a calibration set (a set id, or kind:id pairs joined by commas, "
               "e.g. dark:3,flat:5)")
        problems.append(FilterProblem("calibration_set", msg, f"calibration set: {msg}", calibration_set))
        cal_set = None
    if cal_set is not None:
        from backend.models import CalibrationKind

        kinds = {k.value for k in CalibrationKind}
        unknown = sorted({part.split(":", 1)[0].strip() for part in cal_set.split(",")} - kinds)
        if unknown:
            msg = (f"unknown calibration kind {', '.join(map(repr, unknown))}; expected "
                   f"{', '.join(sorted(kinds))}")
            problems.append(FilterProblem("calibration_set", msg, f"calibration set: {msg}", calibration_set))
            cal_set = None
    cal_file = _filter_int("calibration_file", "calibration file", calibration_file, 1, MAX_ID, problems)
    return {"noaa_ar": region, "associated_type": assoc, "calibration_set": cal_set, "calibration_file": cal_file}


def parse_event_filters(
    *,
    types: str | Sequence[str] | None = None,
    sources: str | Sequence[str] | None = None,
    start: str | dt.datetime | None = None,
    end: str | dt.datetime | None = None,
    channel: str | None = None,
    pa_min: str | float | None = None,
    pa_max: str | float | None = None,
    hpc_x_min: str | float | None = None,
    hpc_x_max: str | float | None = None,
    hpc_y_min: str | float | None = None,
    hpc_y_max: str | float | None = None,
    min_goes_class: str | None = None,
    min_peak_value: float | None = None,
    frm_name: str | None = None,
    frm_version: str | None = None,
    noaa_ar: str | int | None = None, associated_type: str | None = None,
    calibration_set: str | None = None, calibration_file: str | int | None = None,
    min_angular_width: str | float | None = None,
    form: bool = False,
) -> ParsedEventFilters:
    # Long: every filter of the event search parsed in one place, so the API, the pages and the
    # saved searches refuse the same values with the same messages
    """Read the event filters of the API (:func:`backend.api.params.event_search`), of the events
    page or of a saved search.

    Every value may be absent (None or empty). A refused value is left out of the filters
    and reported as a :class:`FilterProblem`; an ``end`` before ``start`` drops both, and so
    does a ``*_max`` below its ``*_min`` (both bounds of that axis).

    Parameters
    ----------
    types : str or sequence of str
        HEK event codes (any case); with ``form=False`` each value may be a comma-separated list.
    sources : str or sequence of str
        ``detected`` or catalogue names (:data:`pipelines.catalogues.SOURCES`; any other
        name is refused, as an unknown type is); split on commas like ``types``; blanks
        are ignored.
    start, end : str or datetime.datetime
        Aware or naive (UTC) datetimes, or ISO 8601 text (``Z`` accepted; UTC if no offset).
    channel : str
        An LST channel in any accepted spelling.
    pa_min, pa_max, hpc_x_min, hpc_x_max, hpc_y_min, hpc_y_max : str or float
        Numbers (or their text) within the bounds of :data:`NUMERIC_FILTERS`.
    min_goes_class : str
        A GOES class (``M1``, ``X10+``...).
    min_peak_value : float
        Must be finite.
    frm_name, frm_version : str
        Exact detector name and version; empty means absent.
    noaa_ar, associated_type, calibration_set, calibration_file : str or int
        NOAA region (1..99999), HEK code of an associated event, calibration set key
        (``dark:3,flat:5``), calibration file id (:func:`_link_filters`).
    min_angular_width : str or float
        Smallest angular width [deg], 0..360 (a CME wider than 60 deg: 60).
    form : bool
        The values come from the events page's form: one type and one source (no
        comma-separated lists), and the GOES class is trimmed and upper-cased (blank: absent).

    Returns
    -------
    ParsedEventFilters
        The filters, the problems in the order of the page's form (type, source, start, end,
        time order, GOES class, numbers, box order, channel, peak value) and the GOES class.
    """
    from pipelines.catalogues.records import goes_class_to_flux

    problems: list[FilterProblem] = []

    event_types: list[str] = []
    for part in _values(types, split=not form):
        try:
            code = canonical_event_type(part)
        except ValueError as exc:
            problems.append(FilterProblem("type", str(exc), f"type: {exc}", types))
            event_types = []
            break
        if code and code not in event_types:
            event_types.append(code)

    names: list[str] = []
    for part in _values(sources, split=not form):
        part = part.strip()
        if not part:
            continue
        if not is_safe_key(part, 32):
            problems.append(FilterProblem(
                "source", f"{part[:40]!r} is not a source name (letters, digits, _ . -; at most 32)",
                f"source: {part[:40]!r} is not a source name (letters, digits, _ . -)", sources))
            names = []
            break
        if part not in SOURCES:
            msg = f"unknown event source {part!r}; expected one of {', '.join(SOURCES)}"
            problems.append(FilterProblem("source", msg, f"source: {msg}", sources))
            names = []
            break
        if part not in names:
            names.append(part)

    t0 = filter_time("start", start, problems)
    t1 = filter_time("end", end, problems)
    if t0 is not None and t1 is not None and t1 < t0:
        problems.append(time_order_problem(t0, t1))
        t0 = t1 = None

    goes_class = ((min_goes_class or "").strip().upper() or None) if form else min_goes_class
    flux = None
    if goes_class:
        try:
            flux = goes_class_to_flux(goes_class)
        except ValueError as exc:
            problems.append(FilterProblem("min_goes_class", str(exc), f"minimum GOES class: {exc}", min_goes_class))
            goes_class = None

    given = {"pa_min": pa_min, "pa_max": pa_max, "hpc_x_min": hpc_x_min, "hpc_x_max": hpc_x_max,
             "hpc_y_min": hpc_y_min, "hpc_y_max": hpc_y_max}
    num = {name: _filter_number(name, label, given[name], lo, hi, problems) for name, label, lo, hi in NUMERIC_FILTERS}
    for lo, hi in _BOXES:
        if num[lo] is not None and num[hi] is not None and num[lo] > num[hi]:
            problems.append(FilterProblem(hi, f"{hi} ({num[hi]}) is smaller than {lo} ({num[lo]})",
                                          f"{hi} is smaller than {lo}: that bound was not applied", num[hi]))
            num[lo] = num[hi] = None

    code = None
    if channel:
        try:
            code = canonical_channel(channel)
        except ValueError as exc:
            problems.append(FilterProblem("channel", str(exc), f"channel: {exc}", channel))

    if min_peak_value is not None and not math.isfinite(min_peak_value):
        problems.append(FilterProblem("min_peak_value", "must be a finite number",
                                      "minimum peak value: must be a finite number", min_peak_value))
        min_peak_value = None

    links = _link_filters(noaa_ar, associated_type, calibration_set, calibration_file, problems)
    width = _filter_number("min_angular_width", "minimum angular width", min_angular_width, 0, 360, problems)
    filters = EventFilters(
        event_types=tuple(event_types), start=t0, end=t1, sources=tuple(names), channel=code,
        min_goes_flux=flux, min_peak_value=min_peak_value,
        frm_name=frm_name or None, frm_version=frm_version or None, **num,
        **links, min_angular_width=width,
    )
    return ParsedEventFilters(filters, tuple(problems), goes_class)


#: The order in which the API has always checked the event filters: a request with several
#: bad values is answered with the first of them.
API_CHECK_ORDER = ("start", "end", "type", "source", "channel", *(name for name, *_ in NUMERIC_FILTERS),
                   "min_goes_class", "min_peak_value", "noaa_ar", "associated_type", "calibration_set",
                   "calibration_file", "min_angular_width")


class EventFilterError(ValueError):
    """An event-filter value refused (:func:`check_event_filters`).

    Attributes
    ----------
    param : str
        The query parameter (``type``, ``end``, ``hpc_x_max``...).
    message : str
        Why, in one line (the API's 422 answers ``query.<param>: <message>``).
    value : object
        The value as given.
    """

    def __init__(self, param: str, message: str, value: Any = None) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message, self.value = param, message, value


def check_event_filters(parsed: ParsedEventFilters) -> EventFilters:
    """The filters of ``parsed`` when it refused nothing.

    Raises
    ------
    EventFilterError
        The first of ``parsed.problems`` in :data:`API_CHECK_ORDER` (a request with several
        bad values is answered with the same one as always).
    """
    if parsed.problems:
        p = min(parsed.problems, key=lambda p: API_CHECK_ORDER.index(p.param))
        raise EventFilterError(p.param, p.message, p.value)
    return parsed.filters


def for_viewer(filters: EventFilters, principal) -> EventFilters:
    """``filters`` limited to the events ``principal`` may see (None: anonymous, the public
    catalogue; :mod:`backend.services.event_visibility`)."""
    from backend.services.event_visibility import viewer_of

    user, sees_all = viewer_of(principal)
    if filters.viewer == user and filters.sees_all is sees_all:
        return filters  # already so (an anonymous request: the defaults); the filters are frozen
    return dataclasses.replace(filters, viewer=user, sees_all=sees_all)
