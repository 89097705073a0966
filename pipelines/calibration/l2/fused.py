"""One compiled resampling pass of the north-up step (data, DQ, variance, sigma), with Numba.

:func:`pipelines.calibration.l2.resample.rotate_north_up_full` resamples the data, the DQ and
the variance of a frame onto the north-up grid. On the host, with Numba installed (and not
disabled: :func:`enabled`), it runs here in two compiled steps:

1. :func:`spline_prefilter` -- the cubic B-spline prefilter (Unser 1999, IEEE Signal Proc.
   Mag. 16(6), 22), in place on a float32 frame, equal bit for bit to
   ``scipy.ndimage.spline_filter(a, 3, output=numpy.float32, mode="nearest")`` of SciPy 1.17:
   the pass along axis 0 runs on strips of :data:`STRIP` columns (the recursion goes down the
   rows of a strip held in a float64 buffer, the 32 columns side by side, so it vectorises
   and the strip stays in cache), the pass along axis 1 the same way on blocks of 32 rows
   transposed into the buffer; both in parallel (``numba.prange``). The recursion is SciPy's
   (``ni_splines.c``): the gain ``(1 - z)(1 - 1/z)``, the causal start of the half-sample
   ("reflect") rule ``_init_causal_reflect``, the anticausal start ``c[n-1] *= z / (z - 1)``,
   the pole ``z = sqrt(3) - 2``.
2. :func:`resample_pass` -- a pre-pass over the input DQ (``dq_prepass``: per source pixel the
   value the nearest neighbour takes, grown defects included, and whether the pixel itself
   holds a defect, in one uint8 plane), then one pass over the output, parallel over rows: per
   output pixel the source position ``(offset + r k00) + c k01`` (SciPy 1.17's order of the
   float64 sums). Along an output row ``floor(y)`` and ``floor(x) - c`` stay constant for
   about ``1 / |k01|`` pixels: over such a run the 16 taps of consecutive pixels are
   consecutive coefficients of 4 rows, so the run is one loop of contiguous loads without
   index clamping that LLVM vectorises (``_spline_run``; the nearest-neighbour DQ and the
   variance likewise, ``_dq_run``, ``_sigma_run``); the pixels whose taps reach past an edge
   are done one by one with clamped indices. The operations per pixel are the same either way:

   * data: the 16 taps of the cubic spline, SciPy's weights
     (``get_spline_interpolation_weights``) and SciPy's order of the float64 sum (row of taps
     outer, column inner, each tap ``(coef * wy) * wx``); the position is not clamped, each
     tap index is clamped to the edge coefficient (``mode="nearest"``). Equal bit for bit to
     one call of ``scipy.ndimage.affine_transform(coef, k, offset, order=3, mode="nearest",
     prefilter=False, output=numpy.float32)``.
   * DQ: the nearest pixel's region bits and the OR of the defect bits of its clipped 3 x 3
     neighbourhood (``_or_dilate3``); defect bits kept only where the bilinear weight of "any
     defect" (255 or 0, SciPy's order-1 sum, rounded as SciPy rounds to uint8) is >= 0.5;
     ``NO_DATA`` where the source lies more than half a pixel outside the detector.
   * variance: bilinear (order 1, ``mode="nearest"``, SciPy's sum), times the squared-weight
     factors ``g(fy) g(fx)`` read from the table of
     :func:`pipelines.calibration.l2.uncertainty._factor_table` at float32 positions (as
     ``_apply_factor_numpy``), NaN more than half a pixel outside; sigma = sqrt(max(v, 0)).
   * NaN where the DQ has ``NO_DATA`` or ``NOT_FINITE`` (data and sigma).

The pure NumPy/SciPy path of :mod:`pipelines.calibration.l2.resample` computes the same
frames with ``scipy.ndimage`` and is what the tests compare this module with
(``tests/test_fused_resample.py``). Functions are compiled on first use and cached on disk
(``cache=True``, numba's ``__pycache__``).

Setting: ``LSTDP_NUMBA=0`` (environment) or :func:`set_enabled` (``False``) turns this path
off (the NumPy/SciPy path runs); it is also off when Numba is not importable.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

__all__ = ["STRIP", "available", "enabled", "set_enabled", "spline_prefilter", "resample_pass", "frame_statistics",
           "radius_flag", "ray_profiles", "detector_signal", "detector_variance"]

#: Columns of one strip of the axis-0 prefilter: 32 float64 columns are 256 bytes a row, so a
#: strip of 4608 rows (1.2 MB) stays in L2 cache while the recursion runs down it and back.
STRIP = 32

#: The cubic B-spline's pole ``sqrt(3) - 2`` as SciPy writes it (``ni_splines.c``, ``get_filter_poles``).
POLE3 = -0.267949192431122706472553658494127633

_FORCED: bool | None = None
_KERNELS: Any = None


def set_enabled(flag: bool | None) -> None:
    """Force this path on (``True``, if Numba is importable) or off (``False``); ``None``:
    the environment decides (``LSTDP_NUMBA``, default on)."""
    global _FORCED
    _FORCED = None if flag is None else bool(flag)


def available() -> bool:
    """Whether Numba can be imported (the compiled kernels can be built)."""
    try:
        importlib.import_module("numba")
    except ImportError:
        return False
    return True


def enabled() -> bool:
    """Whether :func:`pipelines.calibration.l2.resample.rotate_north_up_full` uses the compiled
    pass: Numba importable and not turned off (:func:`set_enabled`, ``LSTDP_NUMBA=0``)."""
    if _FORCED is not None:
        want = _FORCED
    else:
        want = os.environ.get("LSTDP_NUMBA", "1").strip().lower() not in ("0", "false", "no", "off")
    return want and available()


def _kernels() -> Any:
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = importlib.import_module("pipelines.calibration.l2._fused_numba")
    return _KERNELS


def spline_prefilter(a: np.ndarray) -> None:
    """Cubic B-spline prefilter of a C-contiguous float32 frame, in place (see module docstring).

    Raises
    ------
    ValueError
        If ``a`` is not a 2-D C-contiguous float32 array.
    """
    if a.ndim != 2 or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError("spline_prefilter needs a 2-D C-contiguous float32 array")
    _kernels().prefilter(a, POLE3, STRIP)


def resample_pass(coef: np.ndarray, data: np.ndarray, dq: np.ndarray, var: np.ndarray | None, k_yx: np.ndarray,
                  offset: np.ndarray, g_table: np.ndarray, *, defect_bits: int, not_finite: int,
                  no_data: int, overwrite_dq: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The fused resampling pass (module docstring): ``(data, dq, sigma)`` on the output grid.

    Parameters
    ----------
    coef : float32 (ny, nx)
        Spline coefficients (:func:`spline_prefilter` of the filled frame).
    data : float32 (ny, nx)
        The frame before filling (its non-finite pixels set ``NOT_FINITE``).
    dq : uint8 (ny, nx)
        The input DQ.
    var : float32 (ny, nx) or None
        The variance, non-finite pixels filled; None: no sigma.
    k_yx, offset : float64 (2, 2), (2,)
        The map ``p_in = offset + k_yx @ p_out`` in (row, column) order.
    g_table : float32 (n,)
        Squared-weight factor table on ``n`` equally spaced fractions 0..1.
    defect_bits, not_finite, no_data : int
        DQ bit values (:class:`pipelines.calibration.l2.steps.DQ`).
    overwrite_dq : bool
        ``dq`` (C-contiguous uint8) may be overwritten by the sampled DQ plane (no extra plane).
    """
    ny, nx = coef.shape
    out = np.empty((ny, nx), np.float32)
    dq_out = np.empty((ny, nx), np.uint8)
    if var is None:
        var_in = np.empty((0, 0), np.float32)
        sig = np.empty((0, 0), np.float32)
    else:
        var_in = np.ascontiguousarray(var, dtype=np.float32)
        sig = np.empty((ny, nx), np.float32)
    kern = _kernels()
    dq_in = np.ascontiguousarray(dq, dtype=np.uint8)
    in_place = overwrite_dq and dq_in is dq
    plane = dq_in if in_place else np.empty_like(dq_in)
    # the DQ plane the pass samples (dq_out holds the pre-pass's row ORs until the pass writes it)
    kern.dq_prepass(np.ascontiguousarray(data), dq_in, int(defect_bits), int(not_finite), dq_out, plane)
    kern.resample(coef, plane, var_in, np.ascontiguousarray(k_yx, dtype=np.float64),
                  np.ascontiguousarray(offset, dtype=np.float64), int(defect_bits), int(not_finite), int(no_data),
                  np.ascontiguousarray(g_table, np.float32), out, dq_out, sig)
    return out, dq_out, (sig if var is not None else None)


def frame_statistics(x: np.ndarray, q: np.ndarray, thresholds: np.ndarray
                     ) -> tuple[int, np.ndarray, float, float, np.ndarray, np.ndarray]:
    """One compiled pass over a flat float32 frame and its flat uint8 DQ (parallel chunks).

    Good pixels: DQ 0 and finite. Returns ``(n_good, counts, min, max, below, buf)``:
    ``counts`` the DQ histogram (int64, 256), ``min``/``max`` of the good values (``inf`` /
    ``-inf`` if none), ``below[t]`` the good pixels ``< thresholds[t]`` (float32 comparison),
    ``buf`` float32 = the value where good, 0 elsewhere (for NumPy's float64 sum).
    """
    import numba

    x = np.ascontiguousarray(x, dtype=np.float32)
    q = np.ascontiguousarray(q, dtype=np.uint8)
    th = np.ascontiguousarray(thresholds, dtype=np.float32)
    buf = np.empty_like(x)
    hist = np.zeros(256, np.int64)
    below = np.zeros(max(th.size, 1), np.int64)
    lo_hi = np.zeros(2, np.float32)
    nchunks = max(1, min(64, numba.get_num_threads() * 4))
    n_good = _kernels().stats_pass(x, q, th, nchunks, buf, hist, below, lo_hi)
    return int(n_good), hist, float(lo_hi[0]), float(lo_hi[1]), below[:th.size], buf


def radius_flag(dq: np.ndarray, terms: tuple[np.ndarray, ...], radius_rsun: float, inside: bool, bit: int,
                out: np.ndarray) -> int:
    """``out = dq | bit`` on the pixels whose radius [Rsun] is below ``radius_rsun`` (``inside``) or
    above it, ``dq`` elsewhere, in one compiled pass; returns how many pixels were flagged.

    ``terms``: ``(ax, ay, bx, by)`` of :func:`pipelines.calibration.l2.steps._radius_terms`; the
    radius is ``sqrt((ax + ay)**2 + (bx + by)**2)`` in float32, the operations of
    :func:`pipelines.sun.radius_map` (``tests/test_calibration_steps.py`` compares the two).
    ``dq`` and ``out``: C-contiguous uint8 of one shape.
    """
    ax, ay, bx, by = (np.ascontiguousarray(t, dtype=np.float32) for t in terms)
    return int(_kernels().radius_flag(dq, ax, ay, bx, by, np.float32(radius_rsun), bool(inside), int(bit), out))


def _flat32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)


def detector_signal(data: np.ndarray, bias: np.ndarray, dark_rate: np.ndarray, flat: np.ndarray, dark_scale: float,
                    exposure_s: float, coefficient: float) -> tuple[np.ndarray, int]:
    """:func:`pipelines.calibration.l2.steps.correct_detector_signal`'s one pass, compiled: the frame
    ``(data - bias - dark_rate * s) / flat / t * C`` (float32 operations in numexpr's order; NaN where
    the flat is not finite or not > 0) and the number of such pixels. Float32 (ny, nx) arrays; the
    scalars are rounded to float32 as numexpr is given them."""
    out = np.empty(data.shape, np.float32)
    n_bad = _kernels().detector_signal(_flat32(data), _flat32(bias), _flat32(dark_rate), _flat32(flat),
                                       np.float32(dark_scale), np.float32(exposure_s), np.float32(coefficient),
                                       out.reshape(-1))
    return out, int(n_bad)


def detector_variance(raw: np.ndarray, bias: np.ndarray, flat: np.ndarray, dark_rate: np.ndarray,
                      bias_err: np.ndarray | None, dark_err: np.ndarray | None, flat_err: np.ndarray | None, *,
                      gain: float, k: float, dark_scale: float, tt: float, cc: float) -> np.ndarray:
    """:func:`pipelines.calibration.l2.uncertainty.detector_variance`'s one pass, compiled (its numexpr
    expression's float32 operations in the same order; None: the plane is absent). Float32 (ny, nx)
    arrays; ``gain``, ``k`` (read noise**2 + ADC), ``dark_scale``, ``tt`` (t**2), ``cc`` (C**2) rounded
    to float32 as numexpr is given them. Returns the variance, float32 (ny, nx)."""
    out = np.empty(raw.shape, np.float32)
    none = np.empty(0, np.float32)
    f32 = np.float32
    _kernels().detector_variance(_flat32(raw), _flat32(bias), _flat32(flat), _flat32(dark_rate),
                                 none if bias_err is None else _flat32(bias_err),
                                 none if dark_err is None else _flat32(dark_err),
                                 none if flat_err is None else _flat32(flat_err), f32(gain), f32(k), f32(dark_scale),
                                 f32(tt), f32(cc), out.reshape(-1))
    return out


def ray_profiles(image: np.ndarray, x0: float, y0: float, theta: np.ndarray, radii: np.ndarray,
                 offsets: tuple[float, ...]) -> np.ndarray:
    """Radial profiles of :func:`pipelines.calibration.l2.centre.edge_points`, compiled.

    ``prof[i, j]`` (float64, shape ``(theta.size, radii.size)``) is the mean over the
    tangential ``offsets`` [pixel] of the bilinear sample at radius ``radii[j]`` along
    position angle ``theta[i]`` from ``(x0, y0)``: the sum of ``scipy.ndimage.map_coordinates(
    image, ..., order=1, mode="nearest")`` of each offset (in the image's dtype), divided by
    their number -- the same values, bit for bit (``tests/test_fused_resample.py``).
    """
    img = np.ascontiguousarray(image)
    if img.dtype not in (np.float32, np.float64):
        img = img.astype(np.float64)
    prof = np.empty((theta.size, radii.size))
    _kernels().ray_profiles(img, float(x0), float(y0), np.ascontiguousarray(np.cos(theta)),
                            np.ascontiguousarray(np.sin(theta)), np.ascontiguousarray(radii, dtype=np.float64),
                            np.asarray(offsets, dtype=np.float64), img.dtype == np.float32, prof)
    return prof
