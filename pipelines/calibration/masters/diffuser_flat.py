"""SCI diffuser flat: the diffuser's large-scale non-uniformity, stated (issue 27).

SCI's flat comes from frames through its transmissive diffuser (LST.md). The frames measure
``G(x, y) * D(x, y)``: the detector gain ``G`` times the diffuser's illumination ``D``. Their
small scales are ``G``'s (a diffuser has no pixel-scale structure), but a large-scale
``D`` (a tilt, a radial bowl) cannot be told from ``G``'s large scale with diffuser
frames alone. It is not solved here; it is **stated**: the flat master carries
``FLATDFSG`` (:data:`DIFFUSER_SIGMA_KEY`), a per-pixel 1-sigma fraction of the flat, and
the L2 flow adds ``FLATDFSG * flat`` in quadrature to ``FLATERR`` in ``UNCERT``
(:func:`pipelines.calibration.l2.flow._stated_diffuser_error`) and copies the keyword to
the product. The error is one smooth pattern for the whole frame (correlated between
pixels), carried per pixel so that a pixel's total error is in ``UNCERT``.

**The tilt is measured in flight** (:func:`remove_roll_tilt`). The diffuser is fixed to the
detector, the Sun's corona turns with the roll: the roll sequence's average, fitted by
:func:`pipelines.calibration.masters.occulter.measure_occulter_offset` as a radial profile about
the Sun times a detector-fixed gain gradient, measures the flat's linear error (``OCCGRAD1/2``
of the stray-light master). On the validation's tuning seeds 1000-1039 it matches the injected
diffuser tilt to 1.4e-4 / 1.0e-4 per Rsun RMS (x / y; 2.0e-3 per Rsun RMS injected;
``benchmarks/sci_diffuser_flat_seeds.py --roll-tilt``). The flat is multiplied by
``exp(g . (x - c) / Rsun)``, and what is left, the diffuser's radial part (a bowl about the detector centre, which the roll cannot tell from the
corona's own radial fall-off), is stated by :data:`DIFFUSER_BOWL_SIGMA` instead of
:data:`DIFFUSER_NONUNIFORMITY_SIGMA`; the master records :data:`ROLL_TILT_KEYWORDS`.
**Assumed**, as by the offset fit: whatever turns with the roll is radially symmetric about the
Sun once averaged, and whatever is fixed to the detector is gain. Light fixed to the instrument
and uneven across it (stray light from the occulter or its pylon, a ghost) would be read as a
gain gradient and put into the flat; no validation family tests that yet, and the tilt's stated
error (``FLATTLE1/2``) is the fit's formal one, which does not cover it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DIFFUSER_NONUNIFORMITY_SIGMA", "DIFFUSER_BOWL_SIGMA", "DIFFUSER_SIGMA_KEY", "ROLL_TILT_KEYWORDS",
           "diffuser_flat_keywords", "remove_roll_tilt", "roll_tilt_gain", "roll_tilt_keywords"]

#: Flat-master keyword: the stated 1-sigma of the diffuser's large-scale non-uniformity,
#: per pixel, as a fraction of the flat [1].
DIFFUSER_SIGMA_KEY = "FLATDFSG"

#: Stated 1-sigma per pixel [fraction of the flat] of the SCI diffuser's large-scale
#: illumination left in a diffuser flat. LST.md states no ground value. Tuned on the
#: validation's seeds 1000-1039 (SCI-UV and SCI-WL, 256 px, noise on, ``--mismatch on``:
#: ``benchmarks/sci_diffuser_flat_seeds.py``, the value for which the RMS over those 80
#: flats of the robust pull width of (flat / hidden - 1) over ``hypot(FLATERR / flat, sigma)``
#: is 1: 0.00592; seeds 1000-1011 alone gave 0.00575; without the term the RMS over
#: 1000-1011 is 4.31), never on the reported seeds 0-9. The
#: simulated diffusers are a tilt plus a radial bowl of 0.5-2 % amplitude
#: (:class:`validation.families.DiffuserMap`), whose shape and amplitude are not used here.
#: For flight it must be replaced by a laboratory
#: measurement of LST's diffuser (its illumination map, or its spread across the field).
DIFFUSER_NONUNIFORMITY_SIGMA = 0.00592


#: Stated 1-sigma per pixel [fraction of the flat] of the diffuser's large-scale illumination
#: left in a diffuser flat once the roll sequence's tilt is removed (:func:`remove_roll_tilt`):
#: its radial part. Tuned like :data:`DIFFUSER_NONUNIFORMITY_SIGMA`, with the tilt each seed's
#: own roll sequence measured removed first (``benchmarks/sci_diffuser_flat_seeds.py --roll-tilt
#: --tune --seeds 1000-1039``, SCI-UV and SCI-WL, 256 px, noise on, ``--mismatch on``: 0.00350;
#: the tilt found there was off the injected one by 1.4e-4 / 1.0e-4 per Rsun RMS (x / y) against
#: 2.0e-3 injected, at most 3.9e-4); never on the reported seeds 0-9. For flight it must come
#: from a laboratory map of LST's diffuser.
DIFFUSER_BOWL_SIGMA = 0.00350

#: Flat-master keywords of the tilt removed with :func:`remove_roll_tilt`.
ROLL_TILT_KEYWORDS = {
    "FLATTLT1": "[1/Rsun] gain tilt removed (roll sequence), x",
    "FLATTLT2": "[1/Rsun] gain tilt removed (roll sequence), y",
    "FLATTLE1": "[1/Rsun] formal 1-sigma of FLATTLT1",
    "FLATTLE2": "[1/Rsun] formal 1-sigma of FLATTLT2",
    "FLATTLRS": "[pixel] solar radius FLATTLT1/2 are per",
    "FLATTLSR": "what measured the tilt removed",
}


def roll_tilt_gain(shape: tuple[int, int], gradient: tuple[float, float], rsun_px: float) -> np.ndarray:
    """The detector-fixed gain ``exp(g . (x - c) / Rsun)`` a roll sequence measures, on the detector grid.

    ``c`` is the detector centre ``((nx - 1) / 2, (ny - 1) / 2)`` in 0-based pixels, ``x`` the
    pixel's 0-based (column, row), as :func:`pipelines.calibration.masters.occulter.measure_occulter_offset`
    defines its ``gradient``; the gain is exactly 1 at ``c``.

    Parameters
    ----------
    shape : tuple of int
        ``(ny, nx)``.
    gradient : tuple of float
        ``(gx, gy)`` [1/Rsun] along detector x (columns) and y (rows).
    rsun_px : float
        The solar radius [pixel].

    Returns
    -------
    numpy.ndarray, shape (ny, nx), float64

    Raises
    ------
    ValueError
        If the gradient is not finite, ``rsun_px`` is not positive and finite or ``shape`` is
        not two positive sizes.
    """
    ny, nx = (int(v) for v in shape)
    gx, gy = (float(g) for g in gradient)
    if not (math.isfinite(gx) and math.isfinite(gy)):
        raise ValueError(f"the gradient must be finite, got {gradient!r}")
    rs = float(rsun_px)
    if not (math.isfinite(rs) and rs > 0):
        raise ValueError(f"rsun_px must be a positive number, got {rsun_px!r}")
    if ny < 1 or nx < 1:
        raise ValueError(f"shape must be two positive sizes, got {shape!r}")
    ux = (np.arange(nx, dtype=np.float64) - (nx - 1) / 2.0) / rs
    uy = (np.arange(ny, dtype=np.float64) - (ny - 1) / 2.0) / rs
    return np.exp(gy * uy[:, None] + gx * ux[None, :])


def remove_roll_tilt(flat: np.ndarray, gradient: tuple[float, float], rsun_px: float,
                     valid: np.ndarray | None = None) -> np.ndarray:
    """The diffuser flat with the gain tilt that a roll sequence measured taken out.

    A roll sequence calibrated with ``flat`` has a detector-fixed gain ``exp(g . (x - c) / Rsun)``
    left in it (:func:`pipelines.calibration.masters.occulter.measure_occulter_offset`'s
    ``gradient``: ``c`` the detector centre, ``((nx - 1) / 2, (ny - 1) / 2)`` 0-based); dividing
    by ``flat * exp(g . (x - c) / Rsun)`` removes it. The result keeps ``flat``'s mean over the
    valid pixels (the flat's normalisation, and so the radiometric level, does not move).

    Parameters
    ----------
    flat : numpy.ndarray, shape (ny, nx)
        The diffuser flat [1].
    gradient : tuple of float
        ``(gx, gy)`` [1/Rsun]: the gain gradient found along detector x (columns) and y (rows).
    rsun_px : float
        The solar radius [pixel] on this detector (the roll sequence's ``RSUN_OBS / CDELT``).
    valid : numpy.ndarray of bool, shape (ny, nx), optional
        The pixels the flat measured; the mean is kept over those that are also finite and
        > 0 (default: all finite and > 0). Every pixel is corrected, valid or not.

    Returns
    -------
    numpy.ndarray, shape (ny, nx), float64
        The corrected flat (non-finite where ``flat`` is).

    Raises
    ------
    ValueError
        If ``flat`` is not 2-D, ``valid`` differs in shape, ``rsun_px`` is not positive and
        finite, the gradient is not finite, or no pixel is valid.
    """
    f = np.asarray(flat, dtype=np.float64)
    if f.ndim != 2:
        raise ValueError(f"flat must be a 2-D image, got shape {f.shape}")
    gain = roll_tilt_gain(f.shape, gradient, rsun_px)
    ok = np.isfinite(f) & (f > 0)
    if valid is not None:
        if np.shape(valid) != f.shape:
            raise ValueError(f"valid {np.shape(valid)} and flat {f.shape} must have one shape")
        ok &= np.asarray(valid, dtype=bool)
    if not ok.any():
        raise ValueError("the flat has no valid pixel")
    out = f * gain
    return out * (f[ok].mean() / out[ok].mean())


def roll_tilt_keywords(gradient: tuple[float, float], source: str, *, sigma: tuple[float, float],
                       rsun_px: float) -> dict[str, tuple[float | str, str]]:
    """:data:`ROLL_TILT_KEYWORDS` with values, for a flat corrected by :func:`remove_roll_tilt`.

    Parameters
    ----------
    gradient : tuple of float
        ``(gx, gy)`` [1/Rsun] removed.
    source : str
        What measured it (cut to 40 characters).
    sigma : tuple of float
        Its formal 1-sigma per axis [1/Rsun] (``OcculterOffset.gradient_sigma``), >= 0.
    rsun_px : float
        The solar radius [pixel] the gradient is per.

    Returns
    -------
    dict of str to (value, comment)

    Raises
    ------
    ValueError
        If a value is not finite (or negative, for ``sigma`` and ``rsun_px``), or ``source`` is empty.
    """
    gx, gy = (float(g) for g in gradient)
    ex, ey = (float(e) for e in sigma)
    rs = float(rsun_px)
    if not all(math.isfinite(v) for v in (gx, gy, ex, ey, rs)) or min(ex, ey) < 0 or rs <= 0 \
            or not str(source).strip():
        raise ValueError(f"need a finite gradient, 1-sigma >= 0, Rsun > 0 and a source, got {gradient!r}, "
                         f"{sigma!r}, {rsun_px!r}, {source!r}")
    vals = (float(f"{gx:.5g}"), float(f"{gy:.5g}"), float(f"{ex:.3g}"), float(f"{ey:.3g}"), round(rs, 4),
            str(source)[:40])
    return {k: (v, c) for (k, c), v in zip(ROLL_TILT_KEYWORDS.items(), vals)}


def diffuser_flat_keywords(sigma: float = DIFFUSER_NONUNIFORMITY_SIGMA) -> dict[str, tuple[float, str]]:
    """The header cards a diffuser flat master carries: ``{FLATDFSG: (sigma, comment)}``.

    Parameters
    ----------
    sigma : float
        Per-pixel 1-sigma fraction of the flat [1], >= 0 and finite
        (default :data:`DIFFUSER_NONUNIFORMITY_SIGMA`).

    Raises
    ------
    ValueError
        If ``sigma`` is negative or not finite.
    """
    s = float(sigma)
    if not math.isfinite(s) or s < 0.0:
        raise ValueError(f"the diffuser sigma must be a finite fraction >= 0, got {sigma!r}")
    return {DIFFUSER_SIGMA_KEY: (s, "[1] diffuser non-uniformity 1-sigma per pixel")}
