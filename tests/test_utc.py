"""pipelines.utc: naive datetimes are UTC; aware ones are converted (as_utc) or kept (assume_utc)."""

from __future__ import annotations

import datetime as dt

import pytest

from pipelines.utc import as_utc, assume_utc

PLUS8 = dt.timezone(dt.timedelta(hours=8))


def test_as_utc():
    assert as_utc(None) is None
    assert as_utc(dt.datetime(2024, 3, 1, 12)) == dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    t = as_utc(dt.datetime(2024, 3, 1, 20, tzinfo=PLUS8))
    assert t.tzinfo is dt.UTC and (t.hour, t.day) == (12, 1)
    with pytest.raises(OverflowError):
        as_utc(dt.datetime.min.replace(tzinfo=PLUS8))


def test_assume_utc_keeps_an_aware_offset():
    assert assume_utc(dt.datetime(2024, 3, 1, 12)).tzinfo is dt.UTC
    t = dt.datetime(2024, 3, 1, 20, tzinfo=PLUS8)
    assert assume_utc(t) is t
