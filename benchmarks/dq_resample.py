"""Benchmark: the DQ pass of the north-up resampling, scipy against OpenCV (issue 15).

One frame of ``--size`` (default 4608, the WST detector) with a DQ plane of every bit: an
occulted disk (OCCULTED), a field-of-view edge (OUTSIDE_FOV), 0.1 % bad pixels, 0.01 %
cosmic rays, 0.01 % saturated pixels and 0.01 % non-finite flags (random, seed 0). It is
resampled through a roll of ``--roll`` degrees and an off-centre shift (+13.37, -22.81) px by
:func:`pipelines.calibration.l2.resample._resample_dq`, once with the scipy passes
(``use_opencv=False``, the path before this change) and once with the OpenCV passes (the
CPU default now), on ``--threads`` threads; best of ``--repeat``. The outputs are compared:
pixels that differ must all have a source position on a rounding tie (a half-integer within
1e-9 px), else ``identical_except_ties=0``. Also timed: the whole
:func:`~pipelines.calibration.l2.resample.rotate_north_up` with ``method="opencv-cubic"``.

Prints ``RESULT scipy_dq_s=<a> opencv_dq_s=<b> speedup=<a/b> differing=<n> ties=<m>
identical_except_ties=<0|1> rotate_opencv_cubic_s=<c> rotate_opencv_cubic_scipy_dq_s=<d>``
(``d``: the same step with the scipy DQ passes, as before this change).

Timings on a shared machine are noisy (run it with ``nice``; the lead re-measures).

Usage: ``python benchmarks/dq_resample.py [--size 4608] [--roll 17.3] [--threads 2] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
from astropy.io import fits

from pipelines.array_backend import ndimage_for
from pipelines.calibration.l2 import resample
from pipelines.calibration.l2.steps import DQ


def _scene(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data float32, dq uint8, finite bool) of an ``n`` x ``n`` frame with every DQ bit.

    ``finite`` (0.01 % False) goes to the DQ pass only; the data stay finite, so that the
    timed ``rotate_north_up`` does not include the NaN fill of ``_filled`` (two full-frame
    ``uniform_filter`` passes, ~3 s at 4608 px here, whatever the back end).
    """
    rng = np.random.default_rng(0)
    yy, xx = np.ogrid[0:n, 0:n]
    r = np.hypot(yy - n / 2, xx - n / 2)
    dq = np.zeros((n, n), np.uint8)
    dq[r < 0.2 * n] |= np.uint8(DQ.OCCULTED)
    dq[r > 0.49 * n] |= np.uint8(DQ.OUTSIDE_FOV)
    for bit, p in ((DQ.BAD_PIXEL, 1e-3), (DQ.COSMIC_RAY, 1e-4), (DQ.SATURATED, 1e-4)):
        dq[rng.random((n, n)) < p] |= np.uint8(bit)
    data = (1000.0 + rng.standard_normal((n, n))).astype(np.float32)
    return data, dq, rng.random((n, n)) >= 1e-4


def _header(n: int, roll: float) -> fits.Header:
    """A WST-like helioprojective header: 0.6 "/px, roll ``roll`` [deg], disk centre off by (13.37, -22.81) px."""
    h = fits.Header()
    h["DATE-OBS"] = "2023-05-01T13:07:58.713"
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"], h["CRPIX2"] = (n - 1) / 2 + 13.37 + 1.0, (n - 1) / 2 - 22.81 + 1.0
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"], h["CDELT2"] = 0.6, 0.6
    h["CROTA2"] = roll
    h["HGLN_OBS"], h["HGLT_OBS"], h["DSUN_OBS"] = 0.0, -4.0, 1.5e11
    h["RSUN_OBS"] = 955.0
    return h


def _best(f, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4608)
    ap.add_argument("--roll", type=float, default=17.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    n = a.size
    data, dq, finite = _scene(n)
    t = np.deg2rad(a.roll)
    k = np.array([[np.cos(t), np.sin(t)], [-np.sin(t), np.cos(t)]])
    c = np.full(2, (n - 1) / 2.0)
    off = c + np.array([13.37, -22.81]) - k @ c
    nd = ndimage_for(np)
    t_scipy, ref = _best(lambda: resample._resample_dq(nd, dq, finite, k, off, threads=a.threads,
                                                       use_opencv=False), a.repeat)
    t_cv, out = _best(lambda: resample._resample_dq(nd, dq, finite, k, off, threads=a.threads), a.repeat)
    rr, cc = np.nonzero(out != ref)
    y = resample._source_coordinate(k, off, 0, rr.astype(float), cc.astype(float))
    x = resample._source_coordinate(k, off, 1, rr.astype(float), cc.astype(float))
    tie = (np.abs(y - np.floor(y) - 0.5) < 1e-9) | (np.abs(x - np.floor(x) - 0.5) < 1e-9)
    print(f"size {n}, roll {a.roll} deg, threads {a.threads}: scipy DQ {t_scipy:.3f} s, OpenCV DQ {t_cv:.3f} s "
          f"(best of {a.repeat}); {rr.size} pixels differ, {int(tie.sum())} of them on ties")
    h = _header(n, a.roll)
    t_rot, _ = _best(lambda: resample.rotate_north_up(data, dq, h, method="opencv-cubic", threads=a.threads),
                     a.repeat)
    real = resample._resample_dq
    resample._resample_dq = functools.partial(real, use_opencv=False)  # the step as it was: scipy's DQ
    try:
        t_rot0, _ = _best(lambda: resample.rotate_north_up(data, dq, h, method="opencv-cubic", threads=a.threads),
                          a.repeat)
    finally:
        resample._resample_dq = real
    print(f"rotate_north_up(method='opencv-cubic'): {t_rot:.3f} s with the OpenCV DQ, {t_rot0:.3f} s with "
          f"scipy's (best of {a.repeat})")
    print(f"RESULT scipy_dq_s={t_scipy:.3f} opencv_dq_s={t_cv:.3f} speedup={t_scipy / t_cv:.1f} "
          f"differing={rr.size} ties={int(tie.sum())} identical_except_ties={int(bool(tie.all()))} "
          f"rotate_opencv_cubic_s={t_rot:.3f} rotate_opencv_cubic_scipy_dq_s={t_rot0:.3f}")


if __name__ == "__main__":
    main()
