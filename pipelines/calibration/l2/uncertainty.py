"""Per-pixel uncertainty of the L2 chain: a variance frame carried beside the data.

Every step of :func:`pipelines.calibration.l2.flow.calibrate_frame` that changes the data
changes the variance by first-order (linear) error propagation (Bevington & Robinson 2003,
*Data Reduction and Error Analysis for the Physical Sciences*, 3rd ed., ch. 3), the terms independent:

=======================  ============================================================
step                     variance after the step
=======================  ============================================================
raw frame [DN]           ``max(R - bias, 0) / g + sigma_read**2 + 1/12``: Poisson on the
                         photo- and dark electrons (``g`` electrons per DN), Gaussian read
                         noise [DN], ADC rounding (uniform, 1/12 DN**2)
subtract_dark            ``+ var(bias) + (f t)**2 var(dark_rate)``: the master's
                         ``BIASERR`` [DN] and ``DARKERR`` [DN/s] planes (standard errors of
                         the mean of the frames it was made from); 0 when it has none
correct_flat             ``var_D / F**2 + (D / F)**2 (sigma_F / F)**2``: ``FLATERR`` plane
normalize_exposure       ``/ t**2``
convert_units            ``x C**2`` (the coefficient's own error is one number for the whole
                         frame, a systematic, not a per-pixel term: the L2 keyword ``RADUNC``,
                         :func:`pipelines.calibration.masters.radiometry.radiometric_uncertainty_at`,
                         the fit's error at DATE-OBS and the reference's scale, or the
                         master's own ``RADUNC``; absent when the master states none)
subtract_stray_light     ``+ (u S_stray)**2``: ``u`` the master's fractional uncertainty
                         ``STRAYUNC`` (or its ``STRAYERR`` plane [MSB], or the ``SIGMA`` column of its
                         ``PROFILE`` table [MSB] about the disk centre); 0 when it states none
deconvolve_psf           not propagated (Richardson-Lucy is non-linear): the pre-
                         deconvolution variance is kept and ``UNCPSF = F`` says so
rotate_north_up          :func:`resample_variance`: squared interpolation weights; a
                         frame-wide, smooth error (the flat's stated plane, the stated
                         stray-light profile) is added on the output grid instead, where
                         the squared weights would shrink it as if it were pixel noise
=======================  ============================================================

The product carries the standard deviation (``UNCERT`` image HDU, the data's ``BUNIT``),
as PUNCH's L2/L3 products carry theirs (punchbowl; read back as ``astropy.nddata``
``StdDevUncertainty``).

Gain and read noise come from the dark master (``GAIN`` [e/DN], ``RDNOISE`` [DN]: a photon
transfer measurement: Janesick 2007, *Photon Transfer*, SPIE Press) or else from the raw
header (``GAIN``, ``RDNOISE``); LST.md gives neither. Without both the Poisson term uses
1 e/DN and no read noise, and ``UNCGAIN`` says the gain was assumed.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.array_backend import namespace_of, ndimage_for, to_device
from pipelines.sun import radius_map, sun_geometry

__all__ = ["detector_noise", "raw_variance", "dark_variance", "flat_variance", "detector_variance",
           "stray_light_variance", "resample_variance", "interpolation_variance_factor"]

#: Variance of uniform rounding to integer DN [DN**2]: q**2 / 12 for a step q = 1 DN
#: (Widrow & Kollar 2008, *Quantization Noise*, Cambridge University Press).
ADC_VARIANCE_DN2 = 1.0 / 12.0


def detector_noise(header: fits.Header, dark_parameters: dict[str, Any]) -> tuple[float, float, str]:
    """Gain [e/DN], read noise [DN] and where they came from.

    The dark master's measured values first (``GAIN``, ``RDNOISE``), then the raw header's.

    Returns
    -------
    gain, read_noise, source : float, float, str
        ``source`` is ``'dark master'``, ``'raw header'`` or ``'assumed'`` (gain 1, read noise 0).
    """
    for where, src in (("dark master", dark_parameters), ("raw header", header)):
        try:
            g = float(src.get("GAIN"))
            rn = float(src.get("RDNOISE"))
        except (TypeError, ValueError):
            continue
        if math.isfinite(g) and g > 0 and math.isfinite(rn) and rn >= 0:
            return g, rn, where
    return 1.0, 0.0, "assumed"


def raw_variance(raw: Any, bias: Any, gain: float, read_noise: float) -> Any:
    """Variance [DN**2] of a raw frame, from the frame itself.

    ``var = max(R - bias, 0) / gain + read_noise**2 + 1/12``

    Parameters
    ----------
    raw : array, shape (ny, nx) [DN]
    bias : array, shape (ny, nx) [DN]
    gain : float
        [electrons/DN].
    read_noise : float
        [DN] RMS.

    Notes
    -----
    The Poisson variance is estimated from the observed value (an unbiased estimate of the
    expected count; its own noise enters the variance at order 1/sqrt(N), negligible above
    a few tens of electrons). Janesick 2007, *Photon Transfer*, SPIE Press.
    """
    xp = namespace_of(raw)
    sig = raw - bias
    sig = xp.where(sig > 0, sig, xp.zeros_like(sig))
    sig /= xp.asarray(gain, dtype=sig.dtype)
    sig += xp.asarray(read_noise ** 2 + ADC_VARIANCE_DN2, dtype=sig.dtype)
    return sig


def dark_variance(var: Any, planes: dict[str, Any], scale: float, xp: Any) -> tuple[Any, bool]:
    """``var + var(bias) + scale**2 var(dark_rate)`` from the master's ``biaserr``/``darkerr`` planes.

    ``scale`` is ``f(T) * EXPTIME`` [s] (``DARKTFAC`` x exposure). Returns the new variance
    and whether the master had any uncertainty plane.
    """
    had = False
    out = var
    if "biaserr" in planes:
        e = to_device(planes["biaserr"], xp, xp.float32)
        out = out + e * e
        had = True
    if "darkerr" in planes:
        e = to_device(planes["darkerr"], xp, xp.float32) * xp.asarray(scale, dtype=xp.float32)
        out = out + e * e
        had = True
    return out, had


def flat_variance(var: Any, data_after_flat: Any, flat: Any, flat_err: Any | None) -> Any:
    """Variance after dividing by the flat: ``var / F**2 + (D/F)**2 (sigma_F / F)**2``."""
    xp = namespace_of(var)
    good = xp.isfinite(flat) & (flat > 0)
    safe = xp.where(good, flat, xp.ones_like(flat))
    out = var / (safe * safe)
    if flat_err is not None:
        rel = flat_err / safe
        d = xp.where(xp.isfinite(data_after_flat), data_after_flat, xp.zeros_like(data_after_flat))
        out = out + (d * rel) ** 2
    return xp.where(good, out, xp.asarray(float("nan"), dtype=out.dtype))


def detector_variance(raw: Any, bias: Any, gain: float, read_noise: float, planes: dict[str, Any], dark_scale: float,
                      flat: Any, flat_err: Any | None, dark_rate: Any, exposure_s: float,
                      coefficient: float) -> Any:
    """The variance [unit**2] after dark, flat, exposure and units, in one pass.

    :func:`raw_variance`, :func:`dark_variance`, :func:`flat_variance`, ``/ t**2`` and
    ``x C**2`` fused into one numexpr expression (:mod:`pipelines.calibration.l2.kernels`) on
    NumPy float32 arrays, with the same float32 operations in the same order (the data
    after the flat, ``D = (R - bias - dark_scale * dark_rate) / F``, is recomputed inside
    the expression, as :func:`pipelines.calibration.l2.steps.correct_detector_signal` computes
    it); else those functions one after the other.

    Parameters
    ----------
    raw, bias : array, shape (ny, nx) [DN]
    gain : float
        [electrons/DN].
    read_noise : float
        [DN] RMS.
    planes : dict of str to array
        The dark master's planes (``biaserr`` [DN], ``darkerr`` [DN/s] if it has them).
    dark_scale : float
        ``f(T) * EXPTIME`` [s].
    flat : array, shape (ny, nx) [1]
    flat_err : array, shape (ny, nx), or None
        ``FLATERR`` plane [1].
    dark_rate : array, shape (ny, nx) [DN/s]
    exposure_s : float
        ``EXPTIME`` [s].
    coefficient : float
        Radiometric coefficient C.

    Returns
    -------
    array, shape (ny, nx), float32
        NaN where the flat is not finite or not positive.
    """
    from pipelines.calibration.l2 import kernels

    xp = namespace_of(raw)
    arrays = [raw, bias, flat, dark_rate] + [planes[k] for k in ("biaserr", "darkerr") if k in planes]
    arrays += [flat_err] if flat_err is not None else []
    if not (kernels.available(*arrays) and all(a.dtype == np.float32 for a in arrays)):
        var = raw_variance(raw, bias, gain, read_noise)
        var, _ = dark_variance(var, planes, dark_scale, xp)
        img = (raw - bias - dark_rate * xp.asarray(dark_scale, dtype=raw.dtype)) / flat
        var = flat_variance(var, img, flat, flat_err)
        del img
        var = var / xp.asarray(exposure_s * exposure_s, dtype=var.dtype)
        return var * xp.asarray(coefficient * coefficient, dtype=var.dtype)
    from pipelines.calibration.l2 import fused

    if fused.enabled():  # the same expression compiled (one pass at memory speed)
        return fused.detector_variance(raw, bias, flat, dark_rate, planes.get("biaserr"), planes.get("darkerr"),
                                       flat_err, gain=gain, k=read_noise ** 2 + ADC_VARIANCE_DN2,
                                       dark_scale=dark_scale, tt=exposure_s * exposure_s,
                                       cc=coefficient * coefficient)
    f32 = np.float32
    env = {"R": raw, "B": bias, "F": flat, "Dr": dark_rate, "g": f32(gain), "k": f32(read_noise ** 2 + ADC_VARIANCE_DN2),
           "s": f32(dark_scale), "tt": f32(exposure_s * exposure_s), "cc": f32(coefficient * coefficient),
           "nan": f32(np.nan)}
    expr = "where(R - B > 0, R - B, 0) / g + k"
    if "biaserr" in planes:
        env["Be"] = planes["biaserr"]
        expr = f"({expr}) + Be * Be"
    if "darkerr" in planes:
        env["De"] = planes["darkerr"]
        expr = f"({expr}) + (De * s) * (De * s)"
    expr = f"({expr}) / (F * F)"
    if flat_err is not None:
        env["Fe"] = flat_err
        d = "(R - B - Dr * s) / F"
        expr = f"{expr} + (where(isfinite({d}), {d}, 0) * (Fe / F)) ** 2"
    return kernels.evaluate(f"where(isfinite(F) & (F > 0), ({expr}) / tt * cc, nan)", env)


def stray_light_variance(var: Any, header: fits.Header, model: Any, fraction: float | None,
                         err_map: Any | None, *, sigma_profile: Any | None = None) -> tuple[Any, str]:
    """Add the stray-light model's variance: ``sigma(r)**2``, ``err_map**2`` or ``(fraction * S_stray)**2`` [MSB**2].

    ``model`` is what :func:`pipelines.calibration.l2.steps.subtract_stray_light` was given (power
    law, profile, map or None). ``sigma_profile`` (a
    :class:`~pipelines.calibration.l2.steps.StrayLightProfile` of the 1-sigma [MSB], the master's
    ``PROFILE`` ``SIGMA`` column), evaluated about the frame's disk centre like the profile,
    comes first; then an error plane; then the fraction ``STRAYUNC``. Returns the variance
    (shape of ``var``) and a HISTORY phrase.
    """
    from pipelines.calibration.l2.steps import StrayLightModel, StrayLightProfile

    xp = namespace_of(var)
    if model is None:
        return var, "no stray light subtracted"
    if sigma_profile is not None:
        r = radius_map(var.shape, sun_geometry(header), xp, dtype=xp.float32)
        e = xp.astype(sigma_profile.brightness(r), xp.float32)
        return var + e * e, "stray-light 1-sigma profile of the master (PROFILE SIGMA, in quadrature)"
    if err_map is not None:
        e = to_device(err_map, xp, xp.float32)
        return var + e * e, "stray-light error plane of the master"
    if fraction is None or fraction <= 0:
        return var, "stray-light master states no uncertainty (STRAYUNC): 0"
    if isinstance(model, (StrayLightModel, StrayLightProfile)):
        r = radius_map(var.shape, sun_geometry(header), xp, dtype=xp.float32)
        s = xp.astype(model.brightness(r), xp.float32)
    else:
        s = xp.astype(model, xp.float32)
    s = s * xp.asarray(fraction, dtype=xp.float32)
    return var + s * s, f"stray light x {fraction:g} (STRAYUNC)"


def _keys_cubic(x: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys (1981, IEEE Trans. ASSP 29, 1153) cubic-convolution kernel; ``a = -0.75`` as OpenCV's INTER_CUBIC."""
    x = np.abs(x)
    inner = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    outer = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x <= 1.0, inner, np.where(x < 2.0, outer, 0.0))


def _lanczos4_weights(f: np.ndarray) -> np.ndarray:
    """OpenCV's INTER_LANCZOS4 weights of the 8 samples ``k = -3..4`` at fraction ``f`` (sum 1).

    ``L(x) = sinc(x) sinc(x / 4)`` for ``|x| < 4`` (Duchon 1979, J. Appl. Meteor. 18, 1016),
    normalised per position as OpenCV does.
    """
    ks = np.arange(-3, 5)
    x = f[:, None] - ks[None, :]
    w = np.sinc(x) * np.sinc(x / 4.0)
    return w / w.sum(axis=1, keepdims=True)


@lru_cache(maxsize=8)
def _factor_table(order: int, n: int = 257, method: str = "spline") -> tuple[np.ndarray, np.ndarray]:
    """``g(f) = sum_k K(f + k)**2`` on ``n`` points of f in [0, 1]: K the interpolating kernel of ``order``
    (``method="spline"``) or of the OpenCV back end ``method`` (``opencv-cubic``, ``opencv-lanczos4``)."""
    from scipy import ndimage

    f = np.linspace(0.0, 1.0, n)
    if method == "opencv-cubic":
        ks = np.arange(-2, 3)
        return f, (_keys_cubic(f[:, None] - ks[None, :]) ** 2).sum(axis=1)
    if method == "opencv-lanczos4":
        return f, (_lanczos4_weights(f) ** 2).sum(axis=1)
    if method != "spline":
        raise ValueError(f"unknown resampling method {method!r}")
    if order <= 0:
        return f, np.ones_like(f)
    m = 24
    impulse = np.zeros(2 * m + 1)
    impulse[m] = 1.0
    coeffs = ndimage.spline_filter1d(impulse, order=order, mode="mirror") if order > 1 else impulse
    ks = np.arange(-m + order + 1, m - order)
    pos = m + f[:, None] + ks[None, :]
    kern = ndimage.map_coordinates(coeffs, [pos.ravel()], order=order, prefilter=False, mode="mirror")
    return f, (kern.reshape(pos.shape) ** 2).sum(axis=1)


def interpolation_variance_factor(frac: Any, order: int, method: str = "spline") -> Any:
    """``g(f)``: variance of a spline-interpolated value over the (constant) variance of its inputs.

    For interpolation of ``order`` (3: cubic B-spline with its prefilter, i.e. the cardinal
    cubic spline; 1: linear) at a fractional offset ``f`` from the grid, the value is
    ``sum_k K(f + k) d_k`` with ``K`` the interpolating (cardinal) spline kernel (Unser 1999,
    IEEE Signal Proc. Mag. 16(6), 22), so for independent inputs of equal variance
    ``var_out = var * sum_k K(f + k)**2``. ``g(0) = 1``; cubic ``g(0.5) = 0.756``, linear 0.5.
    In 2-D the kernel is separable: ``g(fx) g(fy)``. ``method`` names the OpenCV kernels of
    :mod:`pipelines.calibration.l2.resample` instead (``opencv-cubic``: Keys cubic convolution,
    ``a = -0.75``, ``g(0.5) = 0.723``; ``opencv-lanczos4``: 0.829), ``order`` then unused.
    """
    xp = namespace_of(frac)
    f, g = _factor_table(int(order), 257, method)
    return xp.interp(frac, xp.asarray(f, dtype=frac.dtype), xp.asarray(g, dtype=frac.dtype))


def resample_variance(var: Any, header: fits.Header, *, order: int = 3, tolerance_px: float = 1e-3,
                      threads: int = 1, method: str = "spline", correlated: bool = False) -> Any:
    """The variance on the north-up grid of :func:`pipelines.calibration.l2.resample.rotate_north_up`.

    Same affine map as the data (``header`` is the one *before* the rotation). The variance
    field is moved with bilinear weights (it is smooth on the kernel's scale) and multiplied
    by the squared-weight factor ``g(fx) g(fy)`` of the data's interpolation at the
    fractional source position of every output pixel (:func:`interpolation_variance_factor`):
    exact for a variance constant over the kernel's support (4 x 4 px for the cubic).
    Correlations between neighbouring output pixels (which the resampling creates) are not
    represented: the frame holds marginal variances, as PUNCH's do. ``method``: the data's
    resampling back end (``rotate_north_up``'s), whose kernel gives ``g``.

    ``correlated=True``: ``var`` is the variance of an error that is one draw for the whole
    frame and smooth on the kernel's scale (a stated flat plane): the interpolated value's
    error is then the interpolation of the error itself (the weights sum to 1), not the
    squared-weight sum, so the field is only moved (bilinear), ``g`` is not applied (it would
    shrink a 1-sigma by ``sqrt(g(fx) g(fy))``, down to 0.57 for the cubic spline).

    Returns
    -------
    array, shape (ny, nx), float32
        NaN where the source falls outside the detector or the input variance is not finite.
    """
    from pipelines.calibration.l2.affine import _affine

    xp = namespace_of(var)
    geom = sun_geometry(header)
    ny, nx = var.shape
    cx, cy = (nx - 1) / 2.0, (ny - 1) / 2.0
    k_xy = np.linalg.inv(geom.matrix) * geom.scale
    shift = math.hypot(geom.x0 - cx, geom.y0 - cy)
    rot_err = float(np.abs(k_xy - np.eye(2)).max()) * max(nx, ny)
    if shift < tolerance_px and rot_err < tolerance_px:
        return xp.astype(var, xp.float32)
    k_yx = np.array([[k_xy[1, 1], k_xy[1, 0]], [k_xy[0, 1], k_xy[0, 0]]])
    offset = np.array([geom.y0, geom.x0]) - k_yx @ np.array([cy, cx])
    if correlated:  # g = 1: order 0's factor table is ones (NaN outside the detector still set)
        order, method = 0, "spline"
    nd = ndimage_for(xp)
    finite = xp.isfinite(var)
    if bool(xp.all(finite)):  # the usual case: no filled copy (the input is read, not modified)
        filled = xp.astype(var, xp.float32, copy=False)
    else:  # neighbours' mean, as the data (NaN pixels are flagged)
        filled = xp.where(finite, var, xp.zeros_like(var))
        w = xp.astype(finite, xp.float32)
        num = nd.uniform_filter(xp.astype(filled, xp.float32), size=5, mode="nearest")
        den = nd.uniform_filter(w, size=5, mode="nearest")
        filled = xp.where(finite, filled, num / xp.where(den > 0, den, xp.ones_like(den)))
    del finite
    out = _affine(nd, xp.astype(filled, xp.float32, copy=False), xp.asarray(k_yx), xp.asarray(offset), (ny, nx),
                  order=1, mode="nearest", dtype=xp.float32, threads=threads)
    # fractional source positions of every output pixel: p_in = offset + k_yx @ p_out
    if isinstance(out, np.ndarray):
        _apply_factor_numpy(out, k_yx, offset, order, threads, method)
        return out
    rows = xp.arange(ny, dtype=xp.float64)[:, None]
    cols = xp.arange(nx, dtype=xp.float64)[None, :]
    outside = None
    for axis, size in ((0, ny), (1, nx)):
        c = offset[axis] + k_yx[axis, 0] * rows + k_yx[axis, 1] * cols
        frac = xp.astype(c - xp.floor(c), xp.float32)
        out *= interpolation_variance_factor(frac, order, method)
        off = (c < -0.5) | (c > size - 0.5)
        outside = off if outside is None else (outside | off)
        del c, frac, off
    out[outside] = float("nan")
    return out


def _apply_factor_numpy(out: np.ndarray, k_yx: np.ndarray, offset: np.ndarray, order: int, threads: int,
                        method: str = "spline") -> None:
    """``out *= g(fy) g(fx)`` and NaN outside the detector, in place, by row blocks on threads.

    Source coordinates in float32 (2.7e-4 px resolution at 4608 px, far finer than g
    varies); ``g`` from a 1025-point table by nearest index (error < 1e-3 of g).
    """
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.calibration.l2.affine import _blocks

    ny, nx = out.shape
    f, g = _factor_table(int(order), 1025, method)
    g32 = g.astype(np.float32)
    cols = np.arange(nx, dtype=np.float32)[None, :]

    def block(rows_range: tuple[int, int]) -> None:
        r0, r1 = rows_range
        rows = np.arange(r0, r1, dtype=np.float32)[:, None]
        seg = out[r0:r1]
        for axis, size in ((0, ny), (1, nx)):
            c = rows * np.float32(k_yx[axis, 0]) + (cols * np.float32(k_yx[axis, 1]) + np.float32(offset[axis]))
            bad = (c < -0.5) | (c > size - 0.5)
            frac = c - np.floor(c)
            frac *= np.float32(len(f) - 1)
            frac += np.float32(0.5)
            seg *= g32[frac.astype(np.int32)]
            seg[bad] = np.nan

    parts = _blocks(ny, max(1, int(threads)) * 4)
    if threads <= 1:
        for b in parts:
            block(b)
    else:
        with ThreadPoolExecutor(int(threads)) as pool:
            list(pool.map(block, parts))
