"""Physical units of the L2 products: the radiance unit and the MSB of each SCI passband.

SDI and WST products are in spectral-band radiance, ``BUNIT = 'erg cm-2 s-1 sr-1'``
(LST.md: radiometric calibration against GOES-R EUVS and the ASTM solar spectrum).

SCI products are in **MSB** (mean solar brightness, LST.md), the radiance of the corona
divided by the mean radiance of the solar disk *in the same passband*. An MSB is therefore
a different radiance in each channel; this module defines both, with their sources:

==========  =====================  ==============================  =================================
channel     passband (LST.md)      1 MSB [erg cm-2 s-1 sr-1]       from
==========  =====================  ==============================  =================================
SCI-UV      121.6 nm (+-10 nm)     1.024e5 (:data:`MSB_UV`)        Lyman-alpha irradiance 6.96e-3
                                                                   W m-2 (mean of the LASP composite
                                                                   1997-2013, 4.258e11 ph cm-2 s-1)
                                                                   over the disk's solid angle
SCI-WL      700 nm (+-40 nm)       1.679e9 (:data:`MSB_WL`)        ASTM G173-03 extraterrestrial
                                                                   spectrum (Gueymard 2004)
                                                                   integrated over 660-740 nm,
                                                                   114.10 W m-2, over the disk's
                                                                   solid angle
==========  =====================  ==============================  =================================

``MSB = E_band / Omega_sun`` with ``E_band`` the band irradiance at 1 au and
``Omega_sun = pi * asin(R_sun / 1 au)**2 = 6.794e-5 sr`` (IAU 2015 nominal solar radius):
the disk-averaged radiance, limb darkening included (Lyman-alpha is limb-*brightened*; the
mean over the disk is what an irradiance measures either way).

FITS keywords written on SCI products (:func:`stamp_units`):

* ``BUNIT = ''``: the data are in MSB, a ratio of two radiances in one passband, so their FITS
  unit is dimensionless (the empty string of the FITS 4.0 unit grammar, sect. 4.3). Strict FITS
  allows only powers of ten as a unit factor, so 1 MSB cannot be written as a scaled radiance:
  ``astropy.units.Unit(bunit, format='fits', parse_strict='raise')`` refused the
  ``'1.024078E+05 erg cm-2 s-1 sr-1'`` that products carried before issue 27 (item 8),
  and reads ``''``. ``sunpy.map.Map(path, hdus=0).unit`` is
  ``dimensionless_unscaled``; :func:`header_unit` (and :func:`pipelines.io.load_l2`, whose map
  is in that unit) gives 1 MSB as a radiance from ``MSBVALUE``. ``BUNITNAM = 'MSB'`` keeps the
  name;
* ``MSBVALUE`` [erg cm-2 s-1 sr-1]: 1 MSB of this passband (data x MSBVALUE = radiance);
* ``MSBWAVE1``/``MSBWAVE2`` [nm]: the passband over which the disk radiance is taken;
* ``MSBSRC``: the source of the value.

Sources
-------
Machol J. et al. 2019, Earth and Space Science 6, 2263 (the LASP composite Lyman-alpha
series; the copy used is ``sample-data/real/lyman-alpha/lymanalpha_composite_1997-2013.txt``,
MANIFEST.md); Woods T. N. et al. 2000, JGR 105, 27195 (the composite's method).
Gueymard C. A. 2004, Solar Energy 76, 423 (the extraterrestrial spectrum of ASTM G173-03;
the 655-745 nm rows are ``sample-data/real/spectra/astm_g173_etr_655-745nm.csv``).
Prsa A. et al. 2016, AJ 152, 41 (IAU 2015 nominal solar radius, 6.957e8 m).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from astropy import constants as const
from astropy import units as u
from astropy.io import fits

from pipelines.channels import get_channel
from pipelines.sun import RSUN_REF_M

__all__ = ["RADIANCE_UNIT", "OMEGA_SUN_1AU", "MSBDefinition", "MSB_UV", "MSB_WL", "MSB_DEFINITIONS",
           "msb_definition", "msb_unit", "product_bunit", "stamp_units", "header_unit", "display_unit"]

RADIANCE_UNIT = "erg cm-2 s-1 sr-1"

#: Solid angle of the solar disk from 1 au [sr] (IAU 2015 nominal radius): 6.794e-5.
OMEGA_SUN_1AU = float(math.pi * math.asin(RSUN_REF_M / const.au.to_value(u.m)) ** 2)

#: Mean of the LASP composite solar Lyman-alpha irradiance over 1997-2013 [1e11 ph cm-2 s-1]
#: (6209 daily values of ``lymanalpha_composite_1997-2013.txt``; range 3.38-6.23: solar
#: cycle 23 and the rise of 24). ``tests/test_units.py`` recomputes it from the file.
LYA_COMPOSITE_MEAN_1E11 = 4.258122

#: Energy of one Lyman-alpha photon (121.567 nm) [J].
_LYA_PHOTON_J = float((const.h * const.c / (121.567 * u.nm)).to_value(u.J))

#: Lyman-alpha irradiance at 1 au [W m-2]: 4.258e11 ph cm-2 s-1 x 1.634e-18 J = 6.96e-3.
LYA_IRRADIANCE_W_M2 = LYA_COMPOSITE_MEAN_1E11 * 1e11 * 1e4 * _LYA_PHOTON_J

#: Extraterrestrial solar irradiance in 660-740 nm [W m-2]: trapezoidal integral of the
#: ASTM G173-03 ETR spectrum (Gueymard 2004) at 1 nm steps; ``tests/test_units.py``
#: recomputes it from the sample file.
WL_BAND_IRRADIANCE_W_M2 = 114.1007

_W_M2_SR_TO_ERG = 1e3  # 1 W m-2 sr-1 = 1e3 erg cm-2 s-1 sr-1


@dataclass(frozen=True)
class MSBDefinition:
    """One channel's mean solar brightness.

    Attributes
    ----------
    channel : str
    band_nm : (float, float)
        Passband [nm] over which the disk radiance is taken.
    irradiance_w_m2 : float
        Band irradiance of the whole disk at 1 au [W m-2].
    radiance : float
        1 MSB [erg cm-2 s-1 sr-1] = irradiance / Omega_sun (x 1e3 for the unit).
    source : str
        Short citation (``MSBSRC``).
    """

    channel: str
    band_nm: tuple[float, float]
    irradiance_w_m2: float
    source: str

    @property
    def radiance(self) -> float:
        return self.irradiance_w_m2 / OMEGA_SUN_1AU * _W_M2_SR_TO_ERG


MSB_DEFINITIONS: dict[str, MSBDefinition] = {
    "SCI-UV": MSBDefinition("SCI-UV", (121.567, 121.567), LYA_IRRADIANCE_W_M2,
                            "LASP Ly-a composite 1997-2013 (Machol+2019)"),
    "SCI-WL": MSBDefinition("SCI-WL", (660.0, 740.0), WL_BAND_IRRADIANCE_W_M2,
                            "ASTM G173-03 ETR 660-740 nm (Gueymard 2004)"),
}

#: 1 MSB of SCI-UV [erg cm-2 s-1 sr-1] (~1.024e5): the Lyman-alpha line; the rest of the
#: +-10 nm passband (Si III 120.6 nm, the far-UV continuum) adds a few per cent, not counted.
MSB_UV = MSB_DEFINITIONS["SCI-UV"].radiance

#: 1 MSB of SCI-WL [erg cm-2 s-1 sr-1] (~1.679e9), band-integrated over 660-740 nm.
MSB_WL = MSB_DEFINITIONS["SCI-WL"].radiance


def msb_definition(channel: str) -> MSBDefinition:
    """The MSB of an SCI channel.

    Raises
    ------
    KeyError
        If ``channel`` is not an LST channel, or is a disk imager (SDI, WST: no MSB; their
        products are in erg cm-2 s-1 sr-1).
    """
    code = get_channel(channel).code
    if code not in MSB_DEFINITIONS:
        raise KeyError(f"{code} products are in {RADIANCE_UNIT}; MSB is defined for SCI-UV and SCI-WL only")
    return MSB_DEFINITIONS[code]


def product_bunit(channel: str) -> str:
    """``BUNIT`` of an L2 product of ``channel``, readable by strict FITS unit parsing
    (``astropy.units.Unit(bunit, format="fits", parse_strict="raise")``): the radiance unit,
    or ``''`` (dimensionless: the data are in MSB, 1 MSB = ``MSBVALUE``) for SCI.

    >>> product_bunit("SDI")
    'erg cm-2 s-1 sr-1'
    >>> product_bunit("SCI-WL")
    ''
    """
    code = get_channel(channel).code
    if code not in MSB_DEFINITIONS:
        return RADIANCE_UNIT
    return ""


def msb_unit(channel: str) -> u.UnitBase:
    """1 MSB of an SCI channel as an astropy unit: the radiance ``MSBVALUE`` erg cm-2 s-1 sr-1.

    Raises
    ------
    KeyError
        If ``channel`` is not an SCI channel (:func:`msb_definition`).
    """
    return u.Unit(msb_definition(channel).radiance * u.Unit(RADIANCE_UNIT))


def stamp_units(header: fits.Header, channel: str) -> None:
    """Write ``BUNIT`` (strict FITS) and, for SCI, ``BUNITNAM``/``MSBVALUE``/``MSBWAVE1``/``MSBWAVE2``/``MSBSRC``.

    Parameters
    ----------
    header : astropy.io.fits.Header
        Modified in place.
    channel : str
        LST channel code.
    """
    code = get_channel(channel).code
    if code not in MSB_DEFINITIONS:
        header["BUNIT"] = (RADIANCE_UNIT, "spectral-band radiance")
        return
    d = MSB_DEFINITIONS[code]
    header["BUNIT"] = (product_bunit(code), "MSB: ratio to mean disk radiance (MSBVALUE)")
    header.set("BUNITNAM", "MSB", "data in mean solar brightness", after="BUNIT")
    header.set("MSBVALUE", float(f"{d.radiance:.6E}"), "[erg cm-2 s-1 sr-1] data x MSBVALUE = radiance",
               after="BUNITNAM")
    header.set("MSBWAVE1", d.band_nm[0], "[nm] MSB passband start", after="MSBVALUE")
    header.set("MSBWAVE2", d.band_nm[1], "[nm] MSB passband end", after="MSBWAVE1")
    header.set("MSBSRC", d.source, "MSBVALUE source", after="MSBWAVE2")


def display_unit(header) -> str:
    """The unit's name for people (labels, API fields): ``BUNITNAM`` (``'MSB'``) when the
    header has one, else ``BUNIT``; ``''`` without either. ``header`` is a FITS header or a dict."""
    name = str(header.get("BUNITNAM", "") or "").strip()
    return name or str(header.get("BUNIT", "") or "").strip()


def header_unit(header: fits.Header) -> u.UnitBase | None:
    """The astropy unit of a product header's ``BUNIT`` (``None`` if absent or unreadable).

    Reads the units :func:`stamp_units` writes (an SCI product's dimensionless ``BUNIT`` with
    ``BUNITNAM = 'MSB'``: 1 MSB as a radiance, ``MSBVALUE`` erg cm-2 s-1 sr-1), products made
    before issue 27 (``BUNIT`` 1 MSB written as a scaled radiance) and older products'
    ``BUNIT = 'MSB'``, both through their channel's :data:`MSB_DEFINITIONS` (``MSBVALUE``
    when the header has one).
    """
    raw = str(header.get("BUNIT", "") or "").strip()
    if not raw and str(header.get("BUNITNAM", "") or "").strip().upper() == "MSB":
        raw = "MSB"
    if not raw:
        return None
    if raw.upper() == "MSB":
        value = header.get("MSBVALUE")
        if value is None:
            chan = str(header.get("CHANNEL", "")).strip()
            try:
                value = msb_definition(chan).radiance
            except KeyError:
                return None
        return u.Unit(float(value) * u.Unit(RADIANCE_UNIT))
    try:
        unit = u.Unit(raw)
    except ValueError:
        return None
    if any(isinstance(b, u.UnrecognizedUnit) for b in unit.bases):
        return None
    return unit
