"""Physical constants and analytic brightness models of the simulated scenes.

Radiometry of the Ly-alpha and 360 nm disks, the Neckel (2005) continuum limb darkening,
the Baumbach (1937) K and F coronae and the Ly-alpha streamer corona. The simulator's own
modelling choices (``LYA_GAMMA``, ``LYA_LIMB_SCALE_RSUN``, ``COR1_CONTRAST_GAIN``,
``WL_K_FACTOR``) are marked as such where they are defined.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from astropy import constants as const
from astropy import units as u

from pipelines.sun import RSUN_REF_M


#: Energy of a Lyman-alpha photon (121.567 nm) [erg].
LYA_PHOTON_ERG = float((const.h * const.c / (121.567 * u.nm)).to_value(u.erg))

#: Solid angle of the solar disk seen from 1 au [sr] (IAU 2015 nominal radius).
OMEGA_SUN_1AU = float(math.pi * math.asin(RSUN_REF_M / const.au.to_value(u.m)) ** 2)

#: Solar spectral irradiance near 360 nm at 1 au [W m-2 nm-1] (ASTM E-490 AM0 spectrum,
#: about 1.0 averaged over 358-362 nm; LST.md: WST is calibrated against the ASTM solar
#: spectrum). Used for the WST disk-average radiance.
IRRADIANCE_360NM = 1.0

#: Ly-alpha contrast exponent: the SDI proxy is ``(EUV / EUV_quiet) ** LYA_GAMMA``. Plage
#: in Ly-alpha is 2-4 times the quiet Sun where 174/195 A active regions are 10-30 times:
#: a square-root-like compression (choice of this simulator).
LYA_GAMMA = 0.45

#: Height of the Ly-alpha limb fall-off above the photosphere [Rsun] (~7000 km:
#: chromosphere and spicules), choice of this simulator.
LYA_LIMB_SCALE_RSUN = 0.01

#: Contrast gain applied to COR1's coronal structure: its raw DN are dominated by
#: instrumental scatter, which dilutes the coronal contrast (choice of this simulator).
COR1_CONTRAST_GAIN = 2.0

#: Factor on Baumbach's K corona for the SCI-WL scene: the bright (solar-maximum,
#: equatorial streamer) end; Baumbach's formula is a cycle-average mean corona (Allen's
#: Astrophysical Quantities, Cox 2000, sect. 14.4, tabulates the maximum-minimum range).
WL_K_FACTOR = 2.0

#: Ly-alpha coronal brightness at 1.5 Rsun in a bright solar-maximum streamer [MSB of the
#: Ly-alpha disk]: 5e11 ph cm-2 s-1 sr-1 (streamer intensities from the Spartan 201 and
#: SOHO/UVCS measurements are 1e11-1e12 at 1.5 Rsun: Kohl et al. 1994, Space Sci. Rev. 70,
#: 253; Kohl et al. 1995, Sol. Phys. 162, 313) over a disk-average Ly-alpha radiance of
#: ~5.9e15 ph cm-2 s-1 sr-1 (LASP composite irradiance 4e11 ph cm-2 s-1 over the disk's
#: solid angle).
UV_MSB_AT_1P5 = 5e11 / 5.9e15


def baumbach_k_corona(r: Any) -> Any:
    """K corona brightness [MSB] at ``r`` [Rsun] (Baumbach 1937, the two K terms).

    ``1e-6 * (1.425 r**-7 + 2.565 r**-17)``

    Parameters
    ----------
    r : array-like
        Heliocentric distance in the plane of the sky [Rsun], > 0.

    Returns
    -------
    numpy.ndarray
        Brightness [MSB], float64, the shape of ``r``.

    References
    ----------
    Baumbach S. 1937, Astron. Nachr. 263, 121; Allen's Astrophysical Quantities (Cox 2000).
    """
    r = np.asarray(r, dtype=np.float64)
    return 1e-6 * (1.425 * r ** -7.0 + 2.565 * r ** -17.0)


def baumbach_f_corona(r: Any) -> Any:
    """F (dust) corona brightness [MSB] at ``r`` [Rsun] (Baumbach 1937): ``1e-6 * 0.0532 r**-2.5``.

    Parameters
    ----------
    r : array-like
        Heliocentric distance in the plane of the sky [Rsun], > 0.

    Returns
    -------
    numpy.ndarray
        Brightness [MSB], float64, the shape of ``r``.

    References
    ----------
    Baumbach S. 1937, Astron. Nachr. 263, 121.
    """
    r = np.asarray(r, dtype=np.float64)
    return 1e-6 * 0.0532 * r ** -2.5


def lyman_alpha_corona(r: Any) -> Any:
    """Coronal Ly-alpha brightness [MSB of the Ly-alpha disk] of a bright streamer at ``r`` [Rsun].

    Resonant scattering of the disk's Ly-alpha by coronal neutral hydrogen scales with the
    electron density (n_H / n_p depends on T only), like Thomson scattering: the radial
    shape of Baumbach's K corona, normalised to :data:`UV_MSB_AT_1P5` at 1.5 Rsun. Doppler
    dimming is neglected (small in streamers below 3 Rsun).

    References
    ----------
    Gabriel A. H. 1971, Sol. Phys. 21, 392; Withbroe G. L. et al. 1982, Space Sci. Rev. 33,
    17; Kohl J. L. et al. 1995, Sol. Phys. 162, 313.
    """
    return UV_MSB_AT_1P5 * baumbach_k_corona(r) / float(baumbach_k_corona(1.5))


def sci_wl_corona(r: Any) -> Any:
    """SCI-WL radial model [MSB] at 700 nm: F corona + WL_K_FACTOR x Baumbach K corona.

    Parameters
    ----------
    r : array-like
        Heliocentric distance in the plane of the sky [Rsun], > 0.

    Returns
    -------
    numpy.ndarray
        Brightness [MSB], float64, the shape of ``r``: :func:`baumbach_f_corona` plus
        :data:`WL_K_FACTOR` times :func:`baumbach_k_corona`.
    """
    return baumbach_f_corona(r) + WL_K_FACTOR * baumbach_k_corona(r)


# Neckel (2005, Sol. Phys. 229, 13) analytic limb-darkening coefficients (lambda in um):
# A0 = a00 + a01/l, A1 = a10 + a11/l + a15/l^5, Ak = ak0 + ak5/l^5 (k = 2..5), with a10, a11,
# a15 fixed by sum(A) = 1. Three wavelength ranges.
_NECKEL_2005 = (
    (300.00, 372.98, (0.35601, -0.085217, -0.67237, 0.18696, 0.00038, 0.01373, 0.003589, -0.002415, 0.000897,
                      -0.000200)),
    (385.00, 422.57, (0.09900, 0.010643, -2.80511, 3.32780, -2.17878, 0.58825, 0.024873, -0.029317, 0.018273,
                      -0.004663)),
    (422.57, 1100.0, (0.75267, -0.265577, -1.89287, 2.42234, -1.71150, 0.49062, 0.012582, -0.017117, 0.011977,
                      0.003347)),
)


def limb_darkening_neckel2005(wavelength_nm: float, mu: Any) -> Any:
    """Continuum limb darkening I(mu)/I(1) at ``wavelength_nm`` (300-372.98, 385-1100 nm).

    Parameters
    ----------
    wavelength_nm : float
    mu : array-like
        cos of the heliocentric angle, in [0, 1].

    Returns
    -------
    array-like
        Fifth-order polynomial in mu, 1 at disk centre.

    Raises
    ------
    ValueError
        Outside the formula's wavelength ranges.

    Notes
    -----
    LST.md quotes Makarova et al. 1991 (u=0.2887, v=2.2194, w=-5.6933) for 360 nm; the
    functional form those three coefficients belong to could not be confirmed from a
    public source, so this simulator uses Neckel's published analytic fit, which covers
    360 nm (and MDI's 676.8 nm) with one formula.

    References
    ----------
    Neckel H. 2005, Sol. Phys. 229, 13; Neckel H. & Labs D. 1994, Sol. Phys. 153, 91.
    """
    for lo, hi, a in _NECKEL_2005:
        if lo <= wavelength_nm < hi:
            break
    else:
        raise ValueError(f"Neckel (2005) limb darkening covers 300-372.98 and 385-1100 nm, not {wavelength_nm} nm")
    a00, a01, a20, a30, a40, a50, a25, a35, a45, a55 = a
    lam = wavelength_nm / 1000.0
    l1, l5 = 1.0 / lam, lam ** -5
    a10 = 1.0 - (a00 + a20 + a30 + a40 + a50)
    coef = [a00 + a01 * l1, a10 - a01 * l1 - (a25 + a35 + a45 + a55) * l5, a20 + a25 * l5, a30 + a35 * l5,
            a40 + a45 * l5, a50 + a55 * l5]
    mu = np.asarray(mu, dtype=np.float64) if not isinstance(mu, np.ndarray) else mu
    out = coef[5]
    for c in coef[4::-1]:
        out = out * mu + c
    return out


def _disk_average_factor(wavelength_nm: float) -> float:
    """<I>/I(1) over the disk: 2 * integral of I(mu)/I(1) mu dmu."""
    mu = np.linspace(0.0, 1.0, 20001)
    return float(2.0 * np.trapezoid(limb_darkening_neckel2005(wavelength_nm, mu) * mu, mu))
