"""pipelines.sun: the apparent solar radius from a header, strict or with a date to fall back on."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from astropy.io import fits

from pipelines.errors import DataError
from pipelines.sun import RSUN_KM, RSUN_REF_M, apparent_rsun_arcsec

WHEN = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)


def test_the_radius_constant_is_the_iau_2015_nominal_value():
    assert RSUN_REF_M == 695_700_000.0 and RSUN_KM == 695_700.0


def test_keywords_in_order_rsun_obs_rsun_arc_then_dsun_obs():
    h = fits.Header({"RSUN_OBS": 970.0, "RSUN_ARC": 960.0, "DSUN_OBS": 1.5e11})
    assert apparent_rsun_arcsec(h) == 970.0
    del h["RSUN_OBS"]
    assert apparent_rsun_arcsec(h) == 960.0
    del h["RSUN_ARC"]
    assert apparent_rsun_arcsec(h) == pytest.approx(math.degrees(math.asin(RSUN_REF_M / 1.5e11)) * 3600.0, rel=1e-15)
    h["RSUN_REF"] = 7.0e8
    assert apparent_rsun_arcsec(h) == pytest.approx(math.degrees(math.asin(7.0e8 / 1.5e11)) * 3600.0, rel=1e-15)


def test_without_a_date_a_header_that_cannot_tell_raises():
    with pytest.raises(DataError, match="radius"):
        apparent_rsun_arcsec(fits.Header({"RSUN_OBS": -1.0}))
    with pytest.raises(DataError, match="outside the Sun"):
        apparent_rsun_arcsec(fits.Header({"DSUN_OBS": 1.0e8}))
    with pytest.raises(DataError):
        apparent_rsun_arcsec(None)


def test_with_a_date_a_header_that_cannot_tell_gives_earths_view():
    from astropy.time import Time
    from sunpy.coordinates import sun

    earth = float(sun.angular_radius(Time("2024-03-01T12:00:00", scale="utc")).to_value("arcsec"))
    for h in (None, fits.Header(), fits.Header({"DSUN_OBS": 1.0e8}), fits.Header({"RSUN_OBS": "nan"})):
        assert apparent_rsun_arcsec(h, when=WHEN) == earth
    assert apparent_rsun_arcsec(fits.Header({"RSUN_OBS": 970.0}), when=WHEN) == 970.0
