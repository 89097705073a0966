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
"""

from __future__ import annotations

__all__ = ["DIFFUSER_NONUNIFORMITY_SIGMA", "DIFFUSER_SIGMA_KEY", "diffuser_flat_keywords"]

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
    import math

    s = float(sigma)
    if not math.isfinite(s) or s < 0.0:
        raise ValueError(f"the diffuser sigma must be a finite fraction >= 0, got {sigma!r}")
    return {DIFFUSER_SIGMA_KEY: (s, "[1] diffuser non-uniformity 1-sigma per pixel")}
