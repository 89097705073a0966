"""Where the Sun is on a frame, and how large: the solar radius constant, the apparent
radius from a header, the disk centre and plate scale from the WCS, and the radius map.

The one home of these for the pipelines (calibration steps, resampling, stray light,
detectors) and the backend.

References
----------
Prsa A. et al. 2016, AJ 152, 41 (IAU 2015 Resolution B3: nominal solar radius
R_sun = 695,700 km).
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from astropy import units as u
from astropy.io import fits

from pipelines.array_backend import namespace_of
from pipelines.errors import DataError

__all__ = [
    "RSUN_REF_M",
    "RSUN_KM",
    "SunGeometry",
    "apparent_rsun_arcsec",
    "sun_geometry",
    "radius_map",
]

#: Photospheric radius [m] used to turn DSUN_OBS into an apparent radius, IAU 2015
#: nominal value (Prsa et al. 2016, AJ 152, 41), the value sunpy uses.
RSUN_REF_M = 695_700_000.0

#: The same radius [km] (speeds in km/s from heights in Rsun).
RSUN_KM = RSUN_REF_M / 1e3


@dataclass(frozen=True)
class SunGeometry:
    """Where the Sun is on a frame, from its WCS and observer keywords.

    Attributes
    ----------
    x0, y0 : float
        Pixel of the disk centre (helioprojective 0, 0), 0-based (array column, row).
    matrix : numpy.ndarray, shape (2, 2)
        ``CDELTi * PCi_j`` in arcsec/pixel: ``(Tx, Ty) = matrix @ (x - x0, y - y0)``.
    rsun_arcsec : float
        Apparent solar radius [arcsec].
    """

    x0: float
    y0: float
    matrix: np.ndarray
    rsun_arcsec: float

    @property
    def scale(self) -> float:
        """Mean plate scale [arcsec/pixel] (square root of the Jacobian)."""
        return float(math.sqrt(abs(np.linalg.det(self.matrix))))

    @property
    def rsun_px(self) -> float:
        """Apparent solar radius [pixel]."""
        return self.rsun_arcsec / self.scale

    @property
    def roll_deg(self) -> float:
        """Roll angle [deg] (CROTA2 convention: PC = [[cos, -sin], [sin, cos]])."""
        m = self.matrix
        return float(math.degrees(math.atan2(m[1, 0] - m[0, 1], m[0, 0] + m[1, 1])))


def apparent_rsun_arcsec(header: fits.Header | None, *, when: dt.datetime | None = None,
                         keys: tuple[str, ...] = ("RSUN_OBS", "RSUN_ARC")) -> float:
    """Apparent solar radius [arcsec] of a frame.

    The first that is usable of: the radius keywords ``keys`` (default ``RSUN_OBS``,
    ``RSUN_ARC``; other missions' headers also say ``RSUN``), a finite positive number;
    ``asin(RSUN_REF / DSUN_OBS)`` as sunpy computes ``rsun_obs`` (``RSUN_REF`` defaults to
    :data:`RSUN_REF_M`; a finite ``DSUN_OBS > RSUN_REF > 0``); with ``when``, the radius
    seen from Earth at that time.

    Parameters
    ----------
    header : astropy.io.fits.Header or None
        Observer keywords. ``None``: only ``when`` can tell.
    when : datetime.datetime, optional
        Observation time (naive or aware, its wall-clock time is taken as UTC). Given, a
        header that cannot tell falls back to Earth's view
        (:func:`sunpy.coordinates.sun.angular_radius`) instead of raising: the flare
        detector does so, the calibration steps do not.
    keys : tuple of str
        Radius keywords [arcsec] read first, in this order.

    Returns
    -------
    float
        Radius [arcsec].

    Raises
    ------
    DataError
        If ``when`` is ``None`` and the header has neither a usable ``RSUN_OBS``/``RSUN_ARC``
        nor a usable ``DSUN_OBS``.
    """
    problem = "cannot tell the solar radius: no header"
    if header is not None:
        for key in keys:
            try:
                v = float(header[key])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(v) and v > 0:
                return v
        try:
            dsun = float(header["DSUN_OBS"])
            rref = float(header.get("RSUN_REF", RSUN_REF_M))
        except (KeyError, TypeError, ValueError):
            problem = "cannot tell the solar radius: no RSUN_OBS and no usable DSUN_OBS"
        else:
            if math.isfinite(dsun) and dsun > rref > 0:
                return float((math.asin(rref / dsun) * u.rad).to_value(u.arcsec))
            problem = f"DSUN_OBS={dsun} m is not a distance outside the Sun"
    if when is None:
        raise DataError(problem)
    from astropy.time import Time
    from sunpy.coordinates import sun

    return float(sun.angular_radius(Time(when.replace(tzinfo=None), scale="utc")).to_value("arcsec"))


def sun_geometry(header: fits.Header) -> SunGeometry:
    """The Sun's centre, the pixel-to-helioprojective matrix and the radius of a frame.

    Parameters
    ----------
    header : astropy.io.fits.Header
        With a helioprojective WCS (``CTYPE = HPLN-TAN/HPLT-TAN``; ``read_image`` maps
        ASO-S's ``solar_x``/``solar_y`` to these) and observer keywords.

    Returns
    -------
    SunGeometry

    Raises
    ------
    DataError
        If the header has no usable celestial WCS or no distance to the Sun.
    """
    from astropy.wcs import WCS, FITSFixedWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FITSFixedWarning)
            w = WCS(header, naxis=2)
        if not w.has_celestial:
            raise DataError("the header has no helioprojective WCS (CTYPE1/2)")
        x0, y0 = (float(v) for v in w.world_to_pixel_values(0.0, 0.0))
        m = np.asarray(w.pixel_scale_matrix, dtype=float) * 3600.0  # wcslib normalises to deg
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any WCS the library rejects is bad input
        raise DataError(f"unusable WCS in the header ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if not (np.all(np.isfinite(m)) and math.isfinite(x0) and math.isfinite(y0)) or abs(np.linalg.det(m)) == 0:
        raise DataError("the WCS does not locate the Sun (non-finite or singular)")
    return SunGeometry(x0=x0, y0=y0, matrix=m, rsun_arcsec=apparent_rsun_arcsec(header))


def radius_map(shape: tuple[int, int], geometry: SunGeometry, xp: Any = None, dtype: Any = None) -> Any:
    """Heliocentric distance in the plane of the sky [Rsun] of every pixel.

    Parameters
    ----------
    shape : (ny, nx)
    geometry : SunGeometry
    xp : array namespace, optional
        NumPy's by default.
    dtype : dtype, optional
        ``xp.float64`` by default; the calibration steps use ``xp.float32`` (relative
        error ~1e-7, two frames of memory instead of about ten).

    Returns
    -------
    array, shape (ny, nx)
    """
    xp = xp if xp is not None else namespace_of()
    dtype = dtype if dtype is not None else xp.float64
    ny, nx = shape
    m = geometry.matrix / geometry.rsun_arcsec
    dx = xp.reshape(xp.arange(nx, dtype=xp.float64) - geometry.x0, (1, nx))
    dy = xp.reshape(xp.arange(ny, dtype=xp.float64) - geometry.y0, (ny, 1))
    # row and column terms in float64 (small), the frame-sized sums in ``dtype``, in place
    tx = xp.astype(m[0, 0] * dx, dtype) + xp.astype(m[0, 1] * dy, dtype)
    ty = xp.astype(m[1, 0] * dx, dtype) + xp.astype(m[1, 1] * dy, dtype)
    tx *= tx
    ty *= ty
    tx += ty
    del ty
    return xp.sqrt(tx)
