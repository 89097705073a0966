"""Geometry shared by the scenes and the truth: the Sun seen from Earth and the L2 grid.

The L2 grid is north up with the disk centre on the frame centre ((n - 1) / 2 in 0-based
pixels) at the channel's plate scale.
"""

from __future__ import annotations

import math

import numpy as np
from astropy.io import fits
from astropy.time import Time
from scipy import ndimage

from pipelines.sun import RSUN_REF_M
from pipelines.fitsio import add_observer_keywords


def _apparent_rsun_arcsec(t: Time) -> tuple[float, fits.Header]:
    """Apparent radius [arcsec] seen from Earth at ``t`` and the observer keywords.

    The simulator's truth side keeps its own arcsine (``math.degrees``): it differs from
    :func:`pipelines.sun.apparent_rsun_arcsec` (astropy units) by at most 1 ulp, and the
    simulated files, which tests and the demo compare bit for bit, were made with it.
    """
    h = fits.Header()
    add_observer_keywords(h, t)
    h["RSUN_REF"] = RSUN_REF_M
    return float(math.degrees(math.asin(RSUN_REF_M / float(h["DSUN_OBS"]))) * 3600.0), h


def _grid_offsets(n: int) -> np.ndarray:
    """Pixel offsets from the frame centre, 0..n-1 minus (n-1)/2, as float32."""
    return (np.arange(n, dtype=np.float32) - np.float32((n - 1) / 2.0))


def _rho_grid(n: int, rsun_px: float) -> np.ndarray:
    """Heliocentric distance [Rsun] of every pixel of the L2 grid (disk centred), float32."""
    g = _grid_offsets(n) / np.float32(rsun_px)
    return np.sqrt(g[None, :] ** 2 + g[:, None] ** 2, dtype=np.float32)


def _affine_sample(src: np.ndarray, a_xy: np.ndarray, src_center_xy: tuple[float, float], n: int,
                   order: int = 3, cval: float = 0.0) -> np.ndarray:
    """Sample ``src`` on an n x n grid: ``src_px = src_center + a_xy @ (grid_px - grid_center)``.

    ``scipy.ndimage.affine_transform`` with a cubic spline; float32 out.
    """
    c = (n - 1) / 2.0
    a_yx = np.array([[a_xy[1, 1], a_xy[1, 0]], [a_xy[0, 1], a_xy[0, 0]]], dtype=np.float64)
    s_yx = np.array([src_center_xy[1], src_center_xy[0]], dtype=np.float64)
    offset = s_yx - a_yx @ np.array([c, c])
    out = np.empty((n, n), dtype=np.float32)
    ndimage.affine_transform(np.asarray(src, dtype=np.float64), a_yx, offset=offset, output_shape=(n, n),
                             output=out, order=order, mode="constant", cval=cval, prefilter=True)
    return out
