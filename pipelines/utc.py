"""Aware UTC datetimes: the platform's one rule, a naive datetime is UTC.

Databases hand back naive datetimes (SQLite) or aware ones (PostgreSQL), users type either;
everything the platform compares, stores or prints goes through :func:`as_utc` first.
Both ``pipelines`` and ``backend`` may import it (astropy is imported only where a leap
second is met).

Times users type (query parameters, job and movie requests, the pages' forms) are read by
:func:`parse_utc_text`: ISO 8601 in its extended (``2011-06-07T12:30:00Z``) and basic
(``20110607``, ``20110607T123000Z``) formats, and the leap second ``23:59:60.x`` (ISO 8601
and FITS 4.0 sect. 9.1.1 allow second 60 in UTC). A bare number is refused: it is never
read as Unix seconds.

Leap seconds in a ``datetime`` (:func:`datetime_from_time`): ``datetime`` has no second 60,
so the last millisecond before the midnight that ends a day with a leap second,
23:59:59.999 to 24:00:00 + the leap second (1.001 s of real time), is stored compressed into
23:59:59.999..23:59:59.999999 (1 ms): times keep their order and stay distinct (to 1 ms of
real time apart there), a time inside the leap second is stored at most 1 s early, and the
exact time stays in the row's FITS header (``DATE-OBS``, ISO 8601 with second 60).
Everywhere else a stored datetime is the UTC time itself.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from typing import Any, overload

__all__ = ["as_utc", "assume_utc", "parse_utc_text", "datetime_from_time", "TIME_FORMS"]

#: How to write a time, for messages (ISO 8601 extended and basic formats, UTC).
TIME_FORMS = "ISO 8601 UTC, e.g. 2011-06-07, 2011-06-07T12:30:00Z, 20110607 or 20110607T123000Z"

_NUMBER = re.compile(r"^[+-]?\d+(\.\d*)?([eE][+-]?\d+)?$")
_BASIC_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_BASIC_DATETIME = re.compile(r"^(\d{4})(\d{2})(\d{2})[Tt](\d{2})(\d{2})(\d{2})?([.,]\d+)?([Zz]|[+-]\d{2}:?\d{2})?$")
_LEAP = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}):60([.,]\d+)?([Zz]|[+-]\d{2}:?\d{2})?$")
#: Start of the compressed window before a leap second (see the module docstring) [s past 23:59:59].
_WINDOW_S = 0.999


def _extended(s: str) -> str:
    """ISO 8601 basic format (``20110607``, ``20110607T1230``, ``20110607T123000.5Z``) as extended."""
    m = _BASIC_DATE.match(s)
    if m:
        return "-".join(m.groups())
    m = _BASIC_DATETIME.match(s)
    if m:
        y, mo, d, hh, mm, ss, frac, zone = m.groups()
        return (f"{y}-{mo}-{d}T{hh}:{mm}" + (f":{ss}" if ss else "") + (frac or "").replace(",", ".")
                + (zone or ""))
    return s


def _leap_time(text: str, m: re.Match) -> dt.datetime:
    from astropy.time import Time

    head, frac, zone = m.groups()
    frac = (frac or "").replace(",", ".")
    zone = "+00:00" if zone in (None, "Z", "z") else zone
    before = as_utc(dt.datetime.fromisoformat(f"{head.replace(' ', 'T')}:59{zone}"))  # the second before
    if (before.hour, before.minute, before.second) != (23, 59, 59):
        raise ValueError(f"{text!r}: second 60 exists only in a leap second, 23:59:60 UTC "
                         f"(here {before:%H:%M}:60 UTC); write {TIME_FORMS}")
    with warnings.catch_warnings():  # erfa warns 'time is after end of day' on a day without one
        warnings.simplefilter("ignore")
        t = Time(f"{before:%Y-%m-%d}T23:59:60{frac}", scale="utc", precision=6)
    if not t.isot.startswith(f"{before:%Y-%m-%d}T23:59:60"):  # erfa carried it into the next day
        raise ValueError(f"{text!r}: {before:%Y-%m-%d} has no leap second (IERS adds them at the end of some "
                         "days only, e.g. 2016-12-31); write a time with seconds 00-59")
    return datetime_from_time(t)


def parse_utc_text(value: Any) -> dt.datetime:
    """An aware UTC datetime from a time a user typed.

    Parameters
    ----------
    value : str or datetime.datetime
        ISO 8601: extended (``2011-06-07``, ``2011-06-07T12:30``, ``2011-06-07T12:30:00.5Z``,
        an offset ``+08:00``) or basic format (``20110607``, ``20110607T123000Z``); a date
        alone is its 00:00 UTC; no offset means UTC. A time inside a leap second
        (``2016-12-31T23:59:60.5Z``) is read through astropy ``Time`` and stored as
        :func:`datetime_from_time` says (so is a text time in the last millisecond before
        a leap second). A ``datetime`` is taken as a stored time: returned as :func:`as_utc`.

    Returns
    -------
    datetime.datetime
        Aware, UTC.

    Raises
    ------
    ValueError
        With a message that says how to write a time: for a number (``1307404800``,
        ``2011``: never read as Unix seconds), an 8-digit date that is not a date, second 60
        outside a leap second, or any other text; "out of range once in UTC" for a time that
        leaves ``datetime``'s range when its offset is applied (``0001-01-01T00:00+05:00``).
    """
    if isinstance(value, dt.datetime):
        try:  # already a stored time (a datetime cannot say second 60): not mapped again
            return as_utc(value)
        except OverflowError:
            raise ValueError(f"{value.isoformat()} is out of range once in UTC") from None
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{value!r} is not a time; write {TIME_FORMS}")
    text = str(value).strip()
    shown = text[:40]
    if not isinstance(value, str) or (_NUMBER.match(text) and not _BASIC_DATE.match(text)):
        raise ValueError(f"{shown!r} is a number, not a date and time (Unix seconds are not read); write {TIME_FORMS}")
    s = _extended(text)
    m = _LEAP.match(s)
    if m:
        try:
            return _leap_time(shown, m)
        except OverflowError:  # the offset moves it out of datetime's range (0001 or 9999)
            raise ValueError(f"{shown!r} is out of range once in UTC") from None
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
            return dt.datetime.fromisoformat(s).replace(tzinfo=dt.UTC)
        if not re.match(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", s):
            raise ValueError(s)
        t = as_utc(dt.datetime.fromisoformat(s))
    except OverflowError:
        raise ValueError(f"{shown!r} is out of range once in UTC") from None
    except ValueError:
        raise ValueError(f"{shown!r} is not a date and time; write {TIME_FORMS}") from None
    try:
        return _before_leap(t)
    except OverflowError:  # the last millisecond of 9999-12-31: its next midnight is out of range
        raise ValueError(f"{shown!r} is out of range once in UTC") from None


def _before_leap(t: dt.datetime) -> dt.datetime:
    """``t`` as :func:`datetime_from_time` stores it (only the last millisecond of a day moves)."""
    if (t.hour, t.minute, t.second) != (23, 59, 59) or t.microsecond < _WINDOW_S * 1e6:
        return t
    from astropy.time import Time

    return datetime_from_time(Time(t.replace(tzinfo=None), scale="utc"))


def datetime_from_time(t: Any) -> dt.datetime:
    """An aware UTC ``datetime`` from an astropy ``Time``, leap seconds kept in order.

    A time in the last millisecond before a midnight that ends with a leap second, or inside
    the leap second (``23:59:60.x``), is compressed into the last millisecond of 23:59:59
    (module docstring): ``2016-12-31T23:59:60.5`` is stored as ``23:59:59.999500``, distinct
    from and before ``2017-01-01T00:00:00.5``, after ``23:59:59.5``. Microsecond resolution
    (``datetime``'s).

    Parameters
    ----------
    t : astropy.time.Time
        A scalar time, any scale.

    Returns
    -------
    datetime.datetime
        Aware, UTC.
    """
    from astropy.time import Time, TimeDelta

    utc = t.utc
    iso = Time(utc, precision=6).isot
    if iso[11:17] != "23:59:" or float(iso[17:]) < 59.0 + _WINDOW_S:
        return utc.to_datetime(timezone=dt.UTC)
    day = iso[:10]
    if day == "9999-12-31":  # no next midnight in datetime's range (and no leap second known)
        return utc.to_datetime(timezone=dt.UTC)
    start = Time(f"{day}T23:59:59", scale="utc") + TimeDelta(_WINDOW_S, format="sec")
    # real seconds to the next midnight (TAI differences): 0.001, or 1.001 across a leap second
    window = (Time(f"{dt.date.fromisoformat(day) + dt.timedelta(days=1)}T00:00:00", scale="utc") - start).to_value("s")
    if window < 1.5 * (1 - _WINDOW_S):  # no leap second that day: the time itself
        return utc.to_datetime(timezone=dt.UTC)
    elapsed = (utc - start).to_value("s")
    micro = min(999_999, round(_WINDOW_S * 1e6 + elapsed / window * (1e6 * (1 - _WINDOW_S))))
    base = dt.datetime.fromisoformat(f"{day}T23:59:59").replace(tzinfo=dt.UTC)
    return base.replace(microsecond=micro)


@overload
def as_utc(t: dt.datetime) -> dt.datetime: ...


@overload
def as_utc(t: None) -> None: ...


def as_utc(t: dt.datetime | None) -> dt.datetime | None:
    """``t`` as an aware UTC datetime: a naive ``t`` is taken as UTC, an aware one converted.

    Parameters
    ----------
    t : datetime.datetime or None

    Returns
    -------
    datetime.datetime or None
        ``tzinfo`` is :data:`datetime.UTC`; ``None`` for ``None``.

    Raises
    ------
    OverflowError
        If converting an aware ``t`` to UTC leaves the datetime range (e.g.
        ``datetime.max`` with a negative offset). Pydantic validators turn it into a
        ``ValueError`` themselves.
    """
    if t is None:
        return None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def assume_utc(t: dt.datetime) -> dt.datetime:
    """``t`` made aware: a naive ``t`` is taken as UTC, an aware one is returned unchanged.

    For callers that keep the caller's own offset (it is printed back as given, or only
    differences are taken); :func:`as_utc` otherwise.
    """
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t
