"""Solar coordinates for catalogue rows: heliographic locations, helioprojective positions,
CME position angles. All transforms go through ``sunpy.coordinates`` with an Earth
observer (the observer of GOES, NOAA and LASCO-era catalogues, and near enough for ASO-S in
low Earth orbit, LST.md).

Earth's ephemeris (``sunpy.coordinates.get_earth``) costs ~0.3 ms per time; a catalogue of
25,000 rows would spend 7 s in it. :func:`earth_observer` therefore evaluates it on a
regular 4-day grid spanning the times and interpolates Earth's Stonyhurst latitude (B0) and
distance with cubic splines (Earth's Stonyhurst longitude is zero by definition of the
frame). Both vary with a one-year period, so the spline error is ~(2 pi h / 1 yr)^4 / 384
of their amplitudes: < 1e-5 deg in B0 and < 1e-6 relative in distance, i.e. < 0.001 arcsec
on the disk, far below the 1-degree precision of the catalogue locations
(``tests/test_catalogues.py`` checks against the direct ephemeris).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

import astropy.units as u
import numpy as np
from astropy.coordinates import SkyCoord
from astropy.time import Time

__all__ = [
    "parse_heliographic_location",
    "as_time",
    "earth_observer",
    "heliographic_to_helioprojective",
    "direction_position_angle",
]

_LOCATION = re.compile(r"^\s*([NS])\s*(\d{1,2})\s*([EW])\s*(\d{1,3})\s*$", re.IGNORECASE)

#: Below this many times, Earth's ephemeris is evaluated at each time directly.
_DIRECT_EPHEMERIS_MAX = 64
#: Spacing of the ephemeris grid [day].
_GRID_DAYS = 4.0


def parse_heliographic_location(text: str | None) -> tuple[float, float] | None:
    """Stonyhurst latitude and longitude [deg] from a NOAA-style location such as ``N16E91``.

    ``N``/``S`` give the latitude sign (north positive); ``E``/``W`` the longitude (central
    meridian distance) sign, east negative as in the Stonyhurst frame. Longitudes beyond
    90 deg (behind the limb) are valid.

    Returns None for an empty or unparseable string.
    """
    if text is None:
        return None
    m = _LOCATION.match(text)
    if not m:
        return None
    ns, lat, ew, lon = m.groups()
    lat_v = float(lat) * (1 if ns.upper() == "N" else -1)
    lon_v = float(lon) * (1 if ew.upper() == "W" else -1)
    if abs(lat_v) > 90 or abs(lon_v) > 180:
        return None
    return lat_v, lon_v


def as_time(times: Sequence[dt.datetime] | Time) -> Time:
    """An astropy ``Time`` (UTC) from aware UTC datetimes (or a Time, returned as is)."""
    if isinstance(times, Time):
        return times
    naive = np.array([t.astimezone(dt.UTC).replace(tzinfo=None) for t in times], dtype="datetime64[us]")
    return Time(naive, scale="utc")


def earth_observer(times: Time) -> SkyCoord:
    """Earth as a Stonyhurst observer at ``times`` (array), for helioprojective frames.

    Parameters
    ----------
    times : astropy.time.Time
        One or more times (UTC).

    Returns
    -------
    astropy.coordinates.SkyCoord
        ``HeliographicStonyhurst`` coordinates with ``obstime=times``: longitude 0 deg,
        latitude B0, radius the Sun-Earth distance (from ``sunpy.coordinates.get_earth``,
        directly for a few times, else on a 4-day grid with cubic-spline interpolation;
        see the module notes).
    """
    from sunpy.coordinates import HeliographicStonyhurst, get_earth

    times = Time(np.atleast_1d(times.utc.mjd), format="mjd", scale="utc")
    mjd = times.mjd
    if mjd.size <= _DIRECT_EPHEMERIS_MAX:
        earth = get_earth(times)
        lat = earth.lat.to_value(u.deg)
        radius = earth.radius.to_value(u.km)
    else:
        from scipy.interpolate import CubicSpline

        lo = np.floor(mjd.min()) - 2 * _GRID_DAYS
        nodes = np.arange(lo, mjd.max() + 3 * _GRID_DAYS, _GRID_DAYS)
        earth = get_earth(Time(nodes, format="mjd", scale="utc"))
        lat = CubicSpline(nodes, earth.lat.to_value(u.deg))(mjd)
        radius = CubicSpline(nodes, earth.radius.to_value(u.km))(mjd)
    return SkyCoord(np.zeros_like(mjd) * u.deg, lat * u.deg, radius * u.km,
                    frame=HeliographicStonyhurst, obstime=times)


def _valid_subset(lat, lon, times: Time):
    lat = np.atleast_1d(np.asarray(lat, dtype=float))
    lon = np.atleast_1d(np.asarray(lon, dtype=float))
    if lat.shape != lon.shape:
        raise ValueError("latitude and longitude arrays differ in shape")
    times = Time(np.broadcast_to(np.atleast_1d(times.utc.mjd), lat.shape), format="mjd", scale="utc")
    ok = np.isfinite(lat) & np.isfinite(lon)
    return lat, lon, ok, times


def heliographic_to_helioprojective(
    lat_deg: Sequence[float], lon_deg: Sequence[float], times: Time
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Helioprojective position seen from Earth of points on the photosphere.

    Parameters
    ----------
    lat_deg, lon_deg : array-like of float
        Stonyhurst heliographic latitude and longitude [deg]; NaN where unknown.
    times : astropy.time.Time
        Observation time of each point (same length).

    Returns
    -------
    hpc_x, hpc_y : numpy.ndarray
        Helioprojective longitude and latitude (Solar X/Y) [arcsec]; NaN where the input
        was NaN.
    visible : numpy.ndarray of bool
        True where the point is on the Earth-facing hemisphere (heliocentric z > 0); False
        for points behind the limb (their position is projected onto the disk) and NaNs.

    Notes
    -----
    The point lies at one solar radius (``sunpy.sun.constants.radius``); the observer is
    Earth (:func:`earth_observer`). The transform is ``sunpy.coordinates``'
    HeliographicStonyhurst -> Helioprojective (and -> Heliocentric for visibility).
    """
    from sunpy.coordinates import Heliocentric, HeliographicStonyhurst, Helioprojective
    from sunpy.sun import constants

    lat, lon, ok, times = _valid_subset(lat_deg, lon_deg, times)
    n = lat.size
    hx = np.full(n, np.nan)
    hy = np.full(n, np.nan)
    vis = np.zeros(n, dtype=bool)
    if not ok.any():
        return hx, hy, vis
    t = times[ok]
    observer = earth_observer(t)
    c = SkyCoord(lon[ok] * u.deg, lat[ok] * u.deg, constants.radius, frame=HeliographicStonyhurst, obstime=t)
    hpc = c.transform_to(Helioprojective(observer=observer, obstime=t))
    hcc = c.transform_to(Heliocentric(observer=observer, obstime=t))
    hx[ok] = hpc.Tx.to_value(u.arcsec)
    hy[ok] = hpc.Ty.to_value(u.arcsec)
    vis[ok] = hcc.z.to_value(u.km) > 0
    return hx, hy, vis


def direction_position_angle(
    lat_deg: Sequence[float], lon_deg: Sequence[float], times: Time
) -> tuple[np.ndarray, np.ndarray]:
    """Plane-of-sky position angle of a radial direction given in Stonyhurst coordinates.

    Used for CME cone-model directions (DONKI's analysis latitude/longitude).

    Parameters
    ----------
    lat_deg, lon_deg : array-like of float
        Stonyhurst latitude/longitude of the direction [deg]; NaN where unknown.
    times : astropy.time.Time

    Returns
    -------
    position_angle : numpy.ndarray
        [deg] counter-clockwise from solar north (east = 90 deg), in [0, 360); NaN where
        unknown.
    angle_from_sun_earth_line : numpy.ndarray
        [deg] between the direction and the Sun-Earth line: near 0 (Earth-directed) or 180
        (anti-Earth) the position angle is ill defined (a halo CME).

    Notes
    -----
    The unit vector is expressed in the ``Heliocentric`` (HCC) frame of an Earth observer:
    x towards solar west, y towards solar north, z towards the observer; the position angle
    is ``atan2(-x, y)``.
    """
    from sunpy.coordinates import Heliocentric, HeliographicStonyhurst

    lat, lon, ok, times = _valid_subset(lat_deg, lon_deg, times)
    n = lat.size
    pa = np.full(n, np.nan)
    sep = np.full(n, np.nan)
    if not ok.any():
        return pa, sep
    t = times[ok]
    observer = earth_observer(t)
    c = SkyCoord(lon[ok] * u.deg, lat[ok] * u.deg, 1 * u.km, frame=HeliographicStonyhurst, obstime=t)
    hcc = c.transform_to(Heliocentric(observer=observer, obstime=t))
    x, y, z = (hcc.x.to_value(u.km), hcc.y.to_value(u.km), hcc.z.to_value(u.km))
    pa[ok] = np.degrees(np.arctan2(-x, y)) % 360.0
    sep[ok] = np.degrees(np.arccos(np.clip(z / np.sqrt(x * x + y * y + z * z), -1, 1)))
    return pa, sep
