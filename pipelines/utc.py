"""Aware UTC datetimes: the platform's one rule, a naive datetime is UTC.

Databases hand back naive datetimes (SQLite) or aware ones (PostgreSQL), users type either;
everything the platform compares, stores or prints goes through :func:`as_utc` first.
Pure standard library, so that both ``pipelines`` and ``backend`` may import it.
"""

from __future__ import annotations

import datetime as dt
from typing import overload

__all__ = ["as_utc", "assume_utc"]


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
