"""Fitting the solar disk's centre and radius from an image alone (no WCS, no first guess).

Used by the sub-pixel flat derivation (:mod:`pipelines.calibration.masters.subpixel_flat`)
to register its dithered images, by the simulator on the EIT series (whose header WCS is
wrong by a factor 8; :mod:`pipelines.simulation` imports it from here), and by the
calibration validation (:mod:`validation.gates`), which fits the same limb on the calibrated
frame and on its truth.

Why the science has two limb fitters
------------------------------------
:func:`fit_solar_limb` (here) and :func:`pipelines.calibration.l2.centre.fit_disk_centre`
(the L2 chain's) answer different questions:

* :func:`fit_solar_limb` needs nothing but the image: it finds the disk by thresholding, then
  the steepest fall (or, ``edge="peak"``, the EUV limb-brightening maximum) along radial rays,
  and fits an algebraic circle. The flat's dithered images carry no header pointing to start
  from (the commanded offsets are what the registration checks), and what the flat needs is
  the *relative* shift between the images of one sequence, where a bias of the edge common
  to all of them cancels.
* :func:`~pipelines.calibration.l2.centre.fit_disk_centre` starts from the header's centre
  and radius, fits the limb *or the SCI occulter's edge*, with a robust geometric circle fit
  and a 1-sigma uncertainty that goes into the product's WCS error keywords: the absolute
  centre of one frame, for a calibrated product.

Replacing either by the other changes the products (flats, L2 frames) bit for bit, so both
stay; a change to either is a science change (``docs/science-changelog.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from pipelines.errors import DataError


@dataclass
class LimbFit:
    """Disk centre (0-based pixel) and radius [pixel] fitted to the limb of an image."""

    x0: float
    y0: float
    radius: float
    rms: float
    n_points: int


def fit_solar_limb(image: np.ndarray, *, n_rays: int = 360, smooth_px: float = 1.0,
                   edge: str = "steepest") -> LimbFit:
    """Fit the solar disk's centre and radius from the image itself.

    The initial disk is the region above half the contrast between the background and the
    bright disk; along ``n_rays`` radial rays from its centre the limb is where the radial
    intensity falls most steeply (sub-pixel, parabolic peak); a least-squares circle
    (Kasa's algebraic fit) through those points, with points beyond 3 median absolute
    deviations rejected, refined once from the new centre.

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
        Full-disk image (EUV or white light); NaN/inf are treated as background.
    n_rays : int
    smooth_px : float
        Gaussian sigma [pixel] applied before differentiating.

    Returns
    -------
    LimbFit

    Raises
    ------
    DataError
        If no disk is found.
    """
    img = np.asarray(image, dtype=np.float64)
    img = np.where(np.isfinite(img), img, np.nan)
    bg = np.nanpercentile(img, 1.0)
    img = np.nan_to_num(img - bg, nan=0.0)
    sm = ndimage.gaussian_filter(img, smooth_px) if smooth_px > 0 else img
    hi = np.percentile(sm, 90.0)
    if not hi > 0:
        raise DataError("no solar disk found (image has no contrast)")
    mask = sm > 0.25 * np.median(sm[sm > 0.5 * hi]) if np.any(sm > 0.5 * hi) else sm > 0.5 * hi
    lab, nlab = ndimage.label(mask)
    if nlab == 0:
        raise DataError("no solar disk found")
    sizes = ndimage.sum(mask, lab, index=np.arange(1, nlab + 1))
    disk = lab == (int(np.argmax(sizes)) + 1)
    disk = ndimage.binary_fill_holes(disk)
    y0, x0 = ndimage.center_of_mass(disk)
    r0 = math.sqrt(disk.sum() / math.pi)
    if r0 < 5:
        raise DataError("solar disk too small to fit a limb")
    theta = np.linspace(0.0, 2 * math.pi, n_rays, endpoint=False)
    fit = (x0, y0, r0)
    used = 0
    rms = float("nan")
    for _ in range(3):
        x0, y0, r0 = fit
        radii = np.arange(0.6 * r0, 1.4 * r0, 0.05)
        xs = x0 + np.outer(np.cos(theta), radii)
        ys = y0 + np.outer(np.sin(theta), radii)
        prof = ndimage.map_coordinates(sm, [ys, xs], order=1, mode="nearest")
        if edge == "peak":  # EUV: the limb-brightening maximum of optically thin emission
            deriv = -prof
        else:  # white light: where the intensity falls most steeply
            deriv = np.gradient(prof, radii, axis=1)
        k = np.argmin(deriv, axis=1)
        k = np.clip(k, 1, len(radii) - 2)
        rows = np.arange(n_rays)
        ym, y_0, yp = deriv[rows, k - 1], deriv[rows, k], deriv[rows, k + 1]
        denom = ym - 2 * y_0 + yp
        frac = np.where(np.abs(denom) > 0, 0.5 * (ym - yp) / np.where(denom == 0, 1, denom), 0.0)
        r_edge = radii[k] + np.clip(frac, -1, 1) * (radii[1] - radii[0])
        px, py = x0 + r_edge * np.cos(theta), y0 + r_edge * np.sin(theta)
        keep = np.ones(n_rays, dtype=bool)
        for _ in range(4):
            a = np.column_stack([px[keep], py[keep], np.ones(keep.sum())])
            b = px[keep] ** 2 + py[keep] ** 2
            sol, *_ = np.linalg.lstsq(a, b, rcond=None)
            cx, cy = sol[0] / 2, sol[1] / 2
            rad = math.sqrt(sol[2] + cx * cx + cy * cy)
            res = np.hypot(px - cx, py - cy) - rad
            mad = np.median(np.abs(res[keep] - np.median(res[keep]))) * 1.4826
            new_keep = np.abs(res) < max(3 * mad, 0.05)
            if new_keep.sum() < 0.3 * n_rays or np.array_equal(new_keep, keep):
                break
            keep = new_keep
        fit = (cx, cy, rad)
        used = int(keep.sum())
        rms = float(np.sqrt(np.mean(res[keep] ** 2)))
    return LimbFit(x0=float(fit[0]), y0=float(fit[1]), radius=float(fit[2]), rms=rms, n_points=used)
