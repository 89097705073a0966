"""What a catalogue parser returns: event records, refused rows, associations.

An :class:`EventRecord` mirrors the columns of ``backend.models.Event`` (HEK-style
names: ``event_type`` is the HEK code, ``hpc_x``/``hpc_y`` helioprojective arcsec,
``position_angle`` degrees counter-clockwise from solar north) so that the import service
can insert it as it is. Parsers are pure functions of a file: no database, no settings.

Every data row of a catalogue ends up either as an event or as a refused row with a
reason: ``ParseResult.rows_in == len(events) + len(refused)`` (checked by
:meth:`ParseResult.check`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import DataError
from pipelines.utc import assume_utc

__all__ = [
    "CatalogueError",
    "EventRecord",
    "AssociationRecord",
    "ParseResult",
    "json_safe",
    "full_noaa_number",
    "EVENT_COLUMNS",
    "refuse_duplicates",
    "normalise_goes_class",
    "refusal_summary",
]


class CatalogueError(DataError):
    """A whole catalogue file cannot be read (missing, wrong format); the message says why."""


#: Columns of ``backend.models.Event`` that a record fills (everything but id/created_at).
EVENT_COLUMNS = (
    "event_type", "source", "source_key", "start_time", "peak_time", "end_time", "channels",
    "hpc_x", "hpc_y", "hgs_lat", "hgs_lon", "position_angle", "angular_width", "speed_km_s",
    "goes_class", "peak_value", "peak_unit", "noaa_ar", "frm_name", "frm_version", "description",
    "attributes",
)

_STR_LIMITS = {"event_type": 4, "source": 32, "source_key": 200, "channels": 64, "goes_class": 8,
               "peak_unit": 40, "frm_name": 100, "frm_version": 40}


#: Lower edge of each GOES X-ray class in the 0.1-0.8 nm band [W m-2] (NOAA SWPC).
GOES_CLASS_FLUX = {"A": 1e-8, "B": 1e-7, "C": 1e-6, "M": 1e-5, "X": 1e-4}
_GOES_CLASS = re.compile(r"\s*([ABCMX])\s*(\d+(?:\.\d*)?)\s*\+?\s*", re.IGNORECASE)


def goes_class_to_flux(goes_class: str) -> float:
    """Peak 0.1-0.8 nm flux [W m-2] of a GOES class: ``M5.2`` -> 5.2e-5, ``X28`` -> 2.8e-3.

    The letter gives the decade (A 1e-8, B 1e-7, C 1e-6, M 1e-5, X 1e-4 W m-2), the number
    the multiplier. Letters B to M take a multiplier from 1.0 to 9.9 (ten times the lower
    edge is the next letter: 'M10' is X1.0 and 'M0.5' is C5.0, no GOES report writes
    either; 'M0.0' is no flux at all). The scale is open at both ends: X-class numbers
    above 10 continue it (X10 = 1e-3 W m-2, X28 the largest reported) and A-class numbers
    below 1 write fluxes under 1e-8 W m-2 (``A0.6``, as sunpy's ``flux_to_flareclass``
    writes them); zero is never a class. A trailing ``+`` (``X10+``) is accepted
    and means the class itself; the letter may be lower case (``m1.5``).

    Raises
    ------
    ValueError
        For a string that is not a GOES class, or a multiplier the class scale does not allow.
    """
    m = _GOES_CLASS.fullmatch(goes_class or "")
    if not m:
        raise ValueError(f"not a GOES class: {goes_class!r} (expected e.g. C5.0, M1, X10)")
    letter, mult = m.group(1).upper(), float(m.group(2))
    above_floor = mult > 0.0 if letter == "A" else mult >= 1.0
    if not (above_floor and (mult < 10.0 or letter == "X")):
        raise ValueError(f"impossible GOES class {goes_class!r}: {letter} takes a multiplier "
                         f"{'above 0' if letter == 'A' else 'from 1.0'} to {'any' if letter == 'X' else '9.9'}")
    return mult * GOES_CLASS_FLUX[letter]


def normalise_goes_class(goes_class: str | None) -> str | None:
    """``goes_class`` stripped and upper-cased (``' m1.5 '`` -> ``'M1.5'``); None if empty."""
    if goes_class is None:
        return None
    text = str(goes_class).strip().upper()
    return text or None


def goes_flux_or_none(goes_class: str | None) -> float | None:
    """:func:`goes_class_to_flux`, or None for a missing or unreadable class [W m-2]."""
    if not goes_class:
        return None
    try:
        return goes_class_to_flux(goes_class)
    except ValueError:
        return None


def event_duration_s(start: dt.datetime | None, peak: dt.datetime | None, end: dt.datetime | None) -> float:
    """Seconds from ``start`` to the event's last known time (end, else peak; 0 when neither).

    A negative span (a catalogue row with its end before its start) counts as 0. Naive
    datetimes are taken as UTC.
    """
    if start is None:
        return 0.0
    last = end if end is not None else peak
    if last is None:
        return 0.0

    return max(0.0, (assume_utc(last) - assume_utc(start)).total_seconds())


def json_safe(value: Any) -> Any:
    """``value`` made storable in a JSON column: NaN/inf become None, datetimes ISO strings.

    Dicts, lists and tuples are converted recursively; NumPy scalars become Python numbers.
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _finite_or_none(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def full_noaa_number(number: int | None, when: dt.datetime) -> int | None:
    """The full NOAA active-region number from the 4-digit form some reports print.

    NOAA numbered region 10000 on 2002-06-14 and kept printing four digits (``0001`` for
    10001) in SRS and other operational products; "for historical purposes all regions
    beyond Region 9999 will be understood to be in a series of region numbers 10000 and
    higher" (SWPC notice printed in the SRS of 2002-06-24). Numbers below 5000 seen after
    that date are therefore lifted by 10000 (``0000`` is region 10000); older regions still on the disk in June 2002
    (9xxx) are kept. HEK's SSW Latest Events also reports 4-digit numbers (3664 for 13664).

    Parameters
    ----------
    number : int or None
        The number as printed.
    when : datetime.datetime
        Time of the report (aware UTC).

    Returns
    -------
    int or None
    """
    if number is None:
        return None
    n = int(number)
    if n < 0:
        return None
    after = when >= dt.datetime(2002, 6, 14, tzinfo=dt.UTC)
    if n == 0:  # '0000' is region 10000 once the series passed 9999; before that no region
        return 10000 if after else None
    if n < 5000 and after:
        return n + 10000
    return n


@dataclass
class EventRecord:
    """One catalogue row as an event (mirrors ``backend.models.Event``).

    Attributes
    ----------
    event_type : str
        HEK event code: ``FL`` flare, ``CE`` CME, ``PR`` prominence, ``AR`` active region,
        ``CH`` coronal hole, ...
    source : str
        Catalogue name (``lst_wst``, ``goes_xrs``, ``cdaw``, ``hek``, ``donki``,
        ``noaa_srs``) or ``detected``.
    source_key : str
        Identifies the row within its source; stable across re-imports of the same file.
    start_time, peak_time, end_time : datetime.datetime
        Aware UTC. ``peak_time``/``end_time`` may be None.
    channels : str or None
        Comma-separated observing channel(s): LST channel codes for LST events, the
        catalogue's own instrument/channel label otherwise.
    hpc_x, hpc_y : float or None
        Helioprojective longitude/latitude (Solar X/Y) [arcsec], Earth observer unless the
        catalogue says otherwise.
    hgs_lat, hgs_lon : float or None
        Stonyhurst heliographic latitude/longitude [deg] (east negative).
    position_angle : float or None
        [deg] counter-clockwise from solar north (CMEs); None for halo CMEs.
    angular_width : float or None
        [deg]; 360 for full halo CMEs.
    speed_km_s : float or None
        [km/s].
    goes_class : str or None
        e.g. ``M5.2``.
    peak_value, peak_unit : float, str or None
        The catalogue's peak measure and its unit (GOES 1-8 A flux in ``W m-2``, WST peak
        relative enhancement in ``%``, HEK ``fl_peakflux``...).
    noaa_ar : int or None
        Full NOAA active-region number (see :func:`full_noaa_number`).
    frm_name, frm_version : str or None
        Feature recognition method, as HEK's FRM_NAME / FRM_VERSIONNUMBER.
    description : str or None
    attributes : dict
        Everything else the row says, plus quality flags under ``"flags"``.
    """

    event_type: str
    source: str
    source_key: str
    start_time: dt.datetime
    peak_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    channels: str | None = None
    hpc_x: float | None = None
    hpc_y: float | None = None
    hgs_lat: float | None = None
    hgs_lon: float | None = None
    position_angle: float | None = None
    angular_width: float | None = None
    speed_km_s: float | None = None
    goes_class: str | None = None
    peak_value: float | None = None
    peak_unit: str | None = None
    noaa_ar: int | None = None
    frm_name: str | None = None
    frm_version: str | None = None
    description: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("start_time", "peak_time", "end_time"):
            t = getattr(self, name)
            if t is None:
                if name == "start_time":
                    raise ValueError("an event needs a start time")
                continue
            if t.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware (UTC), got {t!r}")
            setattr(self, name, t.astimezone(dt.UTC))
        for name in ("hpc_x", "hpc_y", "hgs_lat", "hgs_lon", "position_angle", "angular_width",
                     "speed_km_s", "peak_value"):
            setattr(self, name, _finite_or_none(getattr(self, name)))
        for name, limit in _STR_LIMITS.items():
            v = getattr(self, name)
            if v is not None and len(v) > limit:
                if name in ("event_type", "source", "source_key"):
                    raise ValueError(f"{name} longer than {limit} characters: {v!r}")
                setattr(self, name, v[:limit])

    def flag(self, text: str) -> None:
        """Add a quality flag (kept in ``attributes['flags']``)."""
        self.attributes.setdefault("flags", []).append(text)

    @property
    def flags(self) -> list[str]:
        return list(self.attributes.get("flags", []))

    def as_row(self) -> dict[str, Any]:
        """The record as a dict of ``Event`` column values (attributes JSON-safe)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        row["attributes"] = json_safe(self.attributes)
        return row


@dataclass(frozen=True)
class AssociationRecord:
    """A link a catalogue states between two of its events (HEK ``association`` list).

    ``key``/``other_key`` are source keys within ``source``; ``kind`` is the catalogue's
    edge type (e.g. HEK ``is_followed_by``).
    """

    source: str
    key: str
    other_key: str
    kind: str
    attributes: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class ParseResult:
    """What a parser made of one catalogue file.

    Attributes
    ----------
    source : str
        The catalogue name.
    path : str
        The file read.
    events : list of EventRecord
        Rows kept.
    refused : list of (str, str)
        ``(row id, reason)`` for every row not kept; the row id is ``file:line`` for text
        files and the record id (or index) for JSON.
    rows_in : int
        Data rows read (headers, blank lines, section titles and end-of-file markers are not
        rows).
    associations : list of AssociationRecord
        Links between events the catalogue states.
    truncated : list of str
        One line per file that says it holds only part of its answer (a HEK response with
        ``overmax: true``): the events read are not all the catalogue has.
    repairs : list of str
        One line per file read with a repair (e.g. bytes that are not UTF-8 decoded as
        Latin-1); the same text is emitted as a ``CatalogueWarning``.
    """

    source: str
    path: str
    events: list[EventRecord] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    rows_in: int = 0
    associations: list[AssociationRecord] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)

    def check(self) -> ParseResult:
        """Assert that every row was either kept or refused; returns self."""
        if self.rows_in != len(self.events) + len(self.refused):
            raise AssertionError(
                f"{self.source}: {self.rows_in} rows in but {len(self.events)} kept + "
                f"{len(self.refused)} refused"
            )
        return self

    def extend(self, other: ParseResult) -> None:
        """Append another file's result of the same catalogue."""
        self.events.extend(other.events)
        self.refused.extend(other.refused)
        self.rows_in += other.rows_in
        self.associations.extend(other.associations)
        self.truncated.extend(other.truncated)
        self.repairs.extend(other.repairs)


_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"|-?\d+(?:\.\d+)?")


def refusal_summary(refused: list[tuple[str, str]], n: int = 5) -> list[tuple[str, int, str]]:
    """The ``n`` commonest refusal reasons: ``(reason, count, example row id)``, commonest first.

    Reasons that differ only in the values they quote (``unreadable location 'N9X'``,
    ``invalid date '940231'``) count as one; the reason shown is the first one met.
    """
    groups: dict[str, list] = {}
    for rid, why in refused:
        key = _LITERAL.sub("#", why)
        g = groups.setdefault(key, [why, 0, rid])
        g[1] += 1
    ranked = sorted(groups.values(), key=lambda g: -g[1])
    return [(why, count, rid) for why, count, rid in ranked[:n]]


def refuse_duplicates(
    result: ParseResult,
    row_ids: list[str],
    texts: list[str] | None = None,
    score: Callable[[EventRecord], float] | None = None,
) -> None:
    """Keep one event per ``source_key``; move the others to ``refused`` with the reason.

    Parameters
    ----------
    result : ParseResult
        Modified in place (event order is kept).
    row_ids : list of str
        ``row_ids[i]`` names the row of ``result.events[i]``.
    texts : list of str, optional
        The rows' text, so that a verbatim repeat is told apart from a different row with
        the same key.
    score : callable, optional
        Among rows with one key, the highest score is kept (the first on ties); default:
        the first.
    """
    groups: dict[str, list[int]] = {}
    for i, rec in enumerate(result.events):
        groups.setdefault(rec.source_key, []).append(i)
    drop: dict[int, str] = {}
    for key, idx in groups.items():
        if len(idx) == 1:
            continue
        keep = max(idx, key=lambda i: (score(result.events[i]) if score else 0.0, -i))
        for i in idx:
            if i == keep:
                continue
            if texts is not None and texts[i] == texts[keep]:
                drop[i] = f"repeats {row_ids[keep]} verbatim"
            else:
                drop[i] = f"same event as {row_ids[keep]} (source key {key!r}); that row was kept"
    result.refused.extend((row_ids[i], why) for i, why in sorted(drop.items()))
    result.events = [rec for i, rec in enumerate(result.events) if i not in drop]
