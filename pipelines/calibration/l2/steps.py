"""The L2 calibration steps of LST, one pure function each.

Every step takes arrays and an :class:`astropy.io.fits.Header` and returns new arrays and a
new header (the inputs are never modified). Every step appends one ``HISTORY`` line naming
itself, also when it does nothing (for example stray light on a disk imager). No step
touches a database, a broker or global settings.

Order (``pipelines.calibration.l2.flow.calibrate_frame``)::

    flag_invalid_pixels -> flag_bad_pixels -> subtract_dark (exposure, temperature)
    -> clean_cosmic_rays -> correct_flat -> normalize_exposure -> convert_units
    -> subtract_stray_light (power law or measured map) -> mask_occulter
    -> mask_field_of_view -> deconvolve_psf (SDI, on request) -> rotate_north_up

The last, ``rotate_north_up``, lives in :mod:`pipelines.calibration.l2.resample` with the
threads it runs on.

The arithmetic steps (dark, flat, exposure, units, stray light) and the masks are written
against the Array API namespace of their input (:mod:`pipelines.array_backend`): they run
on NumPy or CuPy arrays alike. ``rotate_north_up`` uses ``scipy.ndimage`` or
``cupyx.scipy.ndimage`` (same API) for the spline resampling.

Data-quality (DQ) bits, one ``uint8`` per pixel (:class:`DQ`):

=====  ==============  ============================================================
bit    name            meaning
=====  ==============  ============================================================
1      SATURATED       raw value at or above the saturation level (default 65535 DN)
2      NOT_FINITE      NaN or infinite value (in the raw frame or after a step, e.g.
                       a flat-field value <= 0)
4      OCCULTED        behind the SCI occulter, r < occulter radius (1.1 Rsun)
8      OUTSIDE_FOV     beyond the field stop (SCI: 2.5 Rsun) or the disk imagers'
                       useful field (1.2 Rsun)
16     NO_DATA         L2 pixel whose source falls outside the detector after the
                       north-up rotation and re-centring
32     BAD_PIXEL       hot or dead pixel of the detector (bad-pixel map of the dark
                       master, or hot pixels found in its dark-rate plane)
64     COSMIC_RAY      cosmic-ray hit found and replaced by :func:`clean_cosmic_rays`
=====  ==============  ============================================================

A pixel with DQ == 0 is good. The DQ array travels with the frame through
:func:`pipelines.calibration.l2.resample.rotate_north_up` (region bits by nearest neighbour,
so bits are never mixed; defect bits, BAD_PIXEL and COSMIC_RAY to every output pixel they
touch).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.array_backend import namespace_of, to_numpy
from pipelines.channels import SATURATION_DN, channel_from_header, get_channel
from pipelines.errors import DataError
from pipelines.fitsio import exposure_seconds
from pipelines.sun import radius_map, sun_geometry

__all__ = [
    "DQ",
    "StrayLightModel",
    "StrayLightProfile",
    "flag_invalid_pixels",
    "flag_bad_pixels",
    "dark_temperature_factor",
    "dark_curve_factor",
    "dark_curve_from_header",
    "detector_temperature",
    "subtract_dark",
    "clean_cosmic_rays",
    "correct_flat",
    "normalize_exposure",
    "convert_units",
    "correct_detector_signal",
    "subtract_stray_light",
    "mask_occulter",
    "mask_field_of_view",
    "deconvolve_psf",
]


RADIANCE_UNIT = "erg cm-2 s-1 sr-1"


class DQ(enum.IntFlag):
    """Bits of the L2 data-quality array (see the module docstring)."""

    SATURATED = 1
    NOT_FINITE = 2
    OCCULTED = 4
    OUTSIDE_FOV = 8
    NO_DATA = 16
    BAD_PIXEL = 32
    COSMIC_RAY = 64


#: DQ bits that mark a defect of one pixel (spread to every L2 pixel they touch by the
#: north-up resampling), as opposed to region bits (occulter, field of view, no data).
DEFECT_BITS = (DQ.SATURATED, DQ.NOT_FINITE, DQ.BAD_PIXEL, DQ.COSMIC_RAY)

#: Header keywords read, in this order, for the detector temperature [deg C].
TEMPERATURE_KEYWORDS = ("DET_TEMP", "CCDTEMP", "TEMPCCD", "SENSTEMP", "DETTEMP")


# --------------------------------------------------------------------------- helpers


def _history(header: fits.Header, step: str, text: str) -> None:
    header.add_history(f"{step}: {text}")


def _copy(header: fits.Header) -> fits.Header:
    if not isinstance(header, fits.Header):
        raise TypeError(f"header must be an astropy.io.fits.Header, got {type(header).__name__}")
    return header.copy()


def _exptime(header: fits.Header) -> float:
    """The exposure [s]: :func:`pipelines.fitsio.exposure_seconds` (``EXPTIME``, ``XPOSURE``, ``EXPOSURE``)."""
    return exposure_seconds(header)


def _check_2d(name: str, a: Any, shape: tuple[int, ...] | None = None) -> None:
    if getattr(a, "ndim", None) != 2:
        raise DataError(f"{name} must be a 2-D array, got shape {getattr(a, 'shape', None)}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise DataError(f"{name} has shape {tuple(a.shape)}, the frame has {tuple(shape)}")


def _new_dq(data: Any, dq: Any | None) -> Any:
    xp = namespace_of(data)
    if dq is None:
        return xp.zeros(data.shape, dtype=xp.uint8)
    _check_2d("dq", dq, data.shape)
    return xp.asarray(dq, dtype=xp.uint8, copy=True)


def _float_dtype(a: Any) -> Any:
    """float32 for float32 (and integer) data, else float64: the radius map's precision."""
    xp = namespace_of(a)
    return xp.float32 if a.dtype == xp.float32 or not xp.isdtype(a.dtype, "real floating") else xp.float64


def _bunit(header: fits.Header) -> str:
    return str(header.get("BUNIT", "")).strip()


def _channel_code(header: fits.Header) -> str | None:
    code = channel_from_header(header)
    if code is None:
        c = str(header.get("CHANNEL", "")).strip()
        try:
            code = get_channel(c).code if c else None
        except KeyError:
            code = None
    return code


# --------------------------------------------------------------------------- steps


def flag_invalid_pixels(data: Any, dq: Any | None, header: fits.Header, *,
                        saturation_dn: float = SATURATION_DN) -> tuple[Any, fits.Header]:
    """Flag saturated and non-finite pixels of a raw frame.

    Parameters
    ----------
    data : array, shape (ny, nx) [DN]
        The raw frame, before any arithmetic.
    dq : array of uint8, shape (ny, nx), or None
        DQ bits so far (``None``: a new all-zero array).
    header : astropy.io.fits.Header
    saturation_dn : float
        Values at or above this are saturated [DN]. Default 65535 (16-bit sensors).

    Returns
    -------
    dq : array of uint8, shape (ny, nx)
        With :attr:`DQ.SATURATED` and :attr:`DQ.NOT_FINITE` set.
    header : astropy.io.fits.Header
        With a HISTORY line (the counts).

    Raises
    ------
    DataError
        If ``data`` is not 2-D or ``dq`` has another shape.

    Notes
    -----
    Run on the raw frame: after the flat and the exposure normalisation a saturated pixel
    no longer sits at a recognisable value.

    References
    ----------
    LST.md: WST and SDI use 16-bit CMOS sensors (0-65535 DN).
    """
    _check_2d("data", data)
    xp = namespace_of(data)
    finite = xp.isfinite(data)
    n_nan = int(data.size - xp.count_nonzero(finite))
    sat = data >= saturation_dn  # False at NaN; +inf is excluded below
    if n_nan:
        sat &= finite
    if dq is None:  # the usual case (a raw frame): the DQ is the saturation mask itself (bit 1)
        out = xp.astype(sat, xp.uint8)
    else:
        out = _new_dq(data, dq)
        out |= xp.astype(sat, xp.uint8)
    if n_nan:
        out = xp.where(finite, out, out | xp.asarray(int(DQ.NOT_FINITE), dtype=xp.uint8))
    del finite
    h = _copy(header)
    n_sat = int(xp.count_nonzero(sat))
    _history(h, "flag_invalid_pixels", f"{n_sat} saturated (>= {saturation_dn:g} DN), {n_nan} non-finite")
    return out, h


def detector_temperature(header: fits.Header) -> float | None:
    """Detector temperature [deg C] from the first of :data:`TEMPERATURE_KEYWORDS` present.

    Returns ``None`` when the header has none (or only non-finite values): the dark is
    then scaled by exposure time only.
    """
    for key in TEMPERATURE_KEYWORDS:
        try:
            v = float(header[key])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(v):
            return v
    return None


def dark_temperature_factor(temperature_c: float, reference_c: float, doubling_c: float) -> float:
    """Dark-current scale factor between two detector temperatures.

    ``f = 2 ** ((T - T_ref) / T_double)``

    Parameters
    ----------
    temperature_c : float
        Detector temperature of the frame [deg C].
    reference_c : float
        Temperature at which the master's dark-rate plane was measured [deg C]
        (``DARKTREF`` of the dark master).
    doubling_c : float
        Temperature rise that doubles the dark current [deg C] (``DARKTDBL`` of the dark
        master), > 0.

    Returns
    -------
    float
        Dimensionless factor on the dark-rate plane.

    Raises
    ------
    DataError
        If ``doubling_c`` is not a positive finite number.

    Notes
    -----
    Thermally generated dark current in silicon follows ``T^3/2 exp(-E_g / 2kT)``; over the
    few tens of degrees a space detector sees this is close to an exponential, usually
    quoted as a doubling temperature of 5-9 deg C for CMOS sensors (Janesick 2001,
    *Scientific Charge-Coupled Devices*, SPIE, ch. 5; Widenhorn et al. 2002, Proc. SPIE
    4669, 193). LST's own value is not public (LST.md: dark "per exposure time and
    temperature"), so it is a parameter of each dark master, never a constant here.
    """
    d = float(doubling_c)
    if not math.isfinite(d) or d <= 0:
        raise DataError(f"dark doubling temperature must be a positive number of deg C, got {doubling_c!r}")
    return float(2.0 ** ((float(temperature_c) - float(reference_c)) / d))


#: Header keywords of a dark master's measured temperature curve: ``DARKNT`` points,
#: ``DARKTn`` [deg C] and ``DARKFn`` (median dark rate at ``DARKTn`` over the ``DARKRATE``
#: plane's, dimensionless), n = 1..DARKNT.
DARK_CURVE_KEYS = ("DARKNT", "DARKT", "DARKF")


def dark_curve_from_header(params: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The measured temperature curve of a dark master (:data:`DARK_CURVE_KEYS`), or ``None``.

    Parameters
    ----------
    params : mapping
        The master's header or parameters (``DARKNT``, ``DARKT1..n``, ``DARKF1..n``).

    Returns
    -------
    (temperatures [deg C], factors [1]) or None
        ``None`` when the master has no curve (``DARKNT`` absent, below 2, or a value missing).
    """
    try:
        n = int(params.get("DARKNT") or 0)
        if n < 2:
            return None
        temps = tuple(float(params[f"DARKT{i}"]) for i in range(1, n + 1))
        facs = tuple(float(params[f"DARKF{i}"]) for i in range(1, n + 1))
    except (KeyError, TypeError, ValueError):
        return None
    return temps, facs


def dark_curve_factor(temperature_c: float, temperatures_c: Any, factors: Any) -> tuple[float, bool]:
    """Dark-current factor at a detector temperature from the master's measured curve.

    ``ln f(T)`` is interpolated through the measured points ``(T_k, ln F_k)`` by a cubic
    spline (not-a-knot: with four points the cubic through them; three, the parabola; two, the
    line: :class:`scipy.interpolate.CubicSpline`); outside the measured range it is continued
    as a straight line with the spline's end slope (a local doubling law).

    Parameters
    ----------
    temperature_c : float
        Detector temperature of the frame [deg C].
    temperatures_c : sequence of float
        Temperatures of the dark exposures [deg C] (``DARKTn``), >= 2, distinct.
    factors : sequence of float
        Median dark rate at each over the master's ``DARKRATE`` plane (``DARKFn``), > 0.

    Returns
    -------
    (float, bool)
        The factor on the dark-rate plane and whether ``temperature_c`` lies outside the
        measured range (extrapolated).

    Raises
    ------
    DataError
        Fewer than two points, repeated temperatures, a non-positive or non-finite factor.

    Notes
    -----
    Why not one law: silicon's dark current is the sum of a depletion term
    ``T^1.5 exp(-Eg/2kT)`` and a diffusion term ``T^3 exp(-Eg/kT)`` (Janesick 2001, *Scientific
    Charge-Coupled Devices*, ch. 5; Widenhorn et al. 2002, Proc. SPIE 4669, 193) with
    detector-dependent weights, so a doubling law fitted over 18 C misses the rate between
    the points by up to ~3 %; the interpolating cubic in ``ln`` follows any smooth law
    through the measured temperatures (0.1 % for those two terms, any weight, Eg 1.08-1.16 eV,
    points every 6 C) without assuming its form.
    """
    from scipy.interpolate import CubicSpline

    tk = np.asarray(temperatures_c, dtype=np.float64)
    fk = np.asarray(factors, dtype=np.float64)
    if tk.ndim != 1 or tk.size < 2 or fk.shape != tk.shape:
        raise DataError("a dark temperature curve needs two or more (temperature, factor) points")
    if not (np.all(np.isfinite(tk)) and np.all(np.isfinite(fk)) and np.all(fk > 0)):
        raise DataError("dark temperature curve: temperatures must be finite and factors positive")
    order = np.argsort(tk)
    tk, fk = tk[order], fk[order]
    if np.any(np.diff(tk) <= 0):
        raise DataError("dark temperature curve: repeated temperatures")
    cs = CubicSpline(tk, np.log(fk))
    t = float(temperature_c)
    if t < tk[0]:
        return float(np.exp(cs(tk[0]) + cs(tk[0], 1) * (t - tk[0]))), True
    if t > tk[-1]:
        return float(np.exp(cs(tk[-1]) + cs(tk[-1], 1) * (t - tk[-1]))), True
    return float(np.exp(cs(t))), False


def subtract_dark(data: Any, header: fits.Header, bias: Any, dark_rate: Any, *,
                  reference_temperature_c: float | None = None,
                  doubling_temperature_c: float | None = None,
                  temperature_curve: tuple[Any, Any] | None = None) -> tuple[Any, fits.Header]:
    """Subtract the bias and the dark current scaled to exposure time and temperature.

    ``out = data - (bias + f(T) * dark_rate * EXPTIME)``, with
    ``f(T) = 2 ** ((T - reference_temperature_c) / doubling_temperature_c)``
    (:func:`dark_temperature_factor`) when the header gives the detector temperature
    ``T`` (:func:`detector_temperature`) and the master gives both temperatures, else 1.

    Parameters
    ----------
    data : array, shape (ny, nx) [DN]
        Raw frame.
    header : astropy.io.fits.Header
        Needs ``EXPTIME`` [s].
    bias : array, shape (ny, nx) [DN]
        Zero-exposure offset (master bias plane of the dark calibration).
    dark_rate : array, shape (ny, nx) [DN/s]
        Dark-current rate (master dark-rate plane) at ``reference_temperature_c``.
    reference_temperature_c : float, optional
        Detector temperature of the dark-rate plane [deg C] (master keyword ``DARKTREF``).
    doubling_temperature_c : float, optional
        Temperature rise doubling the dark current [deg C] (master keyword ``DARKTDBL``).
    temperature_curve : (temperatures, factors), optional
        The master's measured curve (:func:`dark_curve_from_header`): when given it replaces
        the doubling law, ``f(T)`` from :func:`dark_curve_factor`.

    Returns
    -------
    data : array, shape (ny, nx), float [DN]
    header : astropy.io.fits.Header
        ``BUNIT='DN'``, ``DARKTFAC`` (the temperature factor applied) and a HISTORY line
        that says whether and why the temperature scaling was applied or skipped.

    Raises
    ------
    DataError
        On a missing or non-positive ``EXPTIME`` or mismatched shapes.

    Notes
    -----
    The dark current of a CMOS sensor grows linearly with exposure time at a fixed
    temperature; a master with a rate plane lets one master serve every exposure
    (LST.md: dark subtraction per exposure time and temperature).
    """
    _check_2d("data", data)
    _check_2d("bias", bias, data.shape)
    _check_2d("dark_rate", dark_rate, data.shape)
    t, factor, why = _dark_scaling(header, reference_temperature_c, doubling_temperature_c, temperature_curve)
    xp = namespace_of(data)
    scale = xp.asarray(t * factor, dtype=dark_rate.dtype)
    out = data - bias  # new array (the input is not modified); the dark current in place
    out -= dark_rate * scale
    return out, _dark_header(header, dark_rate, t, factor, why)


def _dark_scaling(header: fits.Header, reference_temperature_c: float | None,
                  doubling_temperature_c: float | None,
                  temperature_curve: tuple[Any, Any] | None = None) -> tuple[float, float, str]:
    """Exposure [s], temperature factor and the HISTORY phrase of :func:`subtract_dark`."""
    t = _exptime(header)
    temp = detector_temperature(header)
    if temp is None:
        factor, why = 1.0, "no detector temperature in the header: exposure scaling only"
    elif temperature_curve is not None:
        factor, outside = dark_curve_factor(temp, *temperature_curve)
        temps = ", ".join(f"{float(x):g}" for x in sorted(temperature_curve[0]))
        why = (f"dark rate x {factor:.4f} for {temp:g} C from the master's measured curve (darks at {temps} C"
               + (", extrapolated at the end slope)" if outside else ", interpolated)"))
    elif reference_temperature_c is None or doubling_temperature_c is None:
        factor, why = 1.0, f"detector at {temp:g} C but the master has no DARKTREF/DARKTDBL: exposure scaling only"
    else:
        factor = dark_temperature_factor(temp, reference_temperature_c, doubling_temperature_c)
        why = (f"dark rate x {factor:.4f} for {temp:g} C (master at {float(reference_temperature_c):g} C, "
               f"doubling every {float(doubling_temperature_c):g} C)")
    return t, factor, why


def _dark_header(header: fits.Header, dark_rate: Any, t: float, factor: float, why: str) -> fits.Header:
    xp = namespace_of(dark_rate)
    h = _copy(header)
    h["BUNIT"] = "DN"
    h["DARKTFAC"] = (factor, "dark-current temperature factor applied")
    mean_dark = float(xp.mean(dark_rate)) * t * factor
    _history(h, "subtract_dark", f"bias + dark rate x {t:g} s subtracted (mean dark {mean_dark:.3g} DN); {why}")
    return h


def flag_bad_pixels(dq: Any, header: fits.Header, bad: Any | None, *, source: str = "") -> tuple[Any, fits.Header]:
    """Flag the detector's known bad (hot, dead) pixels in the DQ (bit 32, BAD_PIXEL).

    Parameters
    ----------
    dq : array of uint8, shape (ny, nx)
    header : astropy.io.fits.Header
    bad : array of bool, shape (ny, nx), or None
        True at bad pixels (detector frame). ``None`` skips the step (HISTORY says so).
    source : str
        Where the map comes from, for the HISTORY line (e.g. the dark master's name).

    Returns
    -------
    dq : array of uint8
    header : astropy.io.fits.Header

    Notes
    -----
    A hot pixel's dark signal is subtracted with the dark master, but its noise and its
    drift between dark campaigns are not: the pixel is kept and flagged, not trusted.
    The map comes from the dark master (a ``BADPIX`` plane, or hot pixels found in its
    dark-rate plane by :func:`pipelines.calibration.l2.cosmics.find_hot_pixels`).
    """
    _check_2d("dq", dq)
    h = _copy(header)
    if bad is None:
        _history(h, "flag_bad_pixels", "skipped: no bad-pixel map given")
        return dq, h
    _check_2d("bad", bad, dq.shape)
    xp = namespace_of(dq)
    badb = xp.asarray(bad, dtype=xp.bool)
    out = xp.where(badb, dq | xp.asarray(int(DQ.BAD_PIXEL), dtype=xp.uint8), dq)
    n = int(xp.count_nonzero(badb))
    _history(h, "flag_bad_pixels", f"{n} bad pixels flagged BAD_PIXEL (DQ bit {int(DQ.BAD_PIXEL)})"
             + (f" from {source}" if source else ""))
    return out, h


def clean_cosmic_rays(data: Any, dq: Any, header: fits.Header, *, enabled: bool = True, gain: float = 1.0,
                      read_noise: float = 0.0, sigma_clip: float = 4.5) -> tuple[Any, Any, fits.Header]:
    """Find and replace cosmic-ray hits (L.A.Cosmic, :mod:`pipelines.calibration.l2.cosmics`).

    Parameters
    ----------
    data : array, shape (ny, nx) [DN]
        Dark-subtracted frame (before the flat: the noise model is in detector DN).
    dq : array of uint8, shape (ny, nx)
        Pixels with a non-zero DQ are excluded (never flagged, never used as replacements).
    header : astropy.io.fits.Header
    enabled : bool
        False skips the step with a HISTORY line (the flow's default; see Notes).
    gain : float
        Detector gain [electron/DN] for the Poisson part of the noise model.
    read_noise : float
        Read noise [electron RMS].
    sigma_clip : float
        Detection limit on the noise-normalised Laplacian.

    Returns
    -------
    data : array, shape (ny, nx), same dtype
        Hits replaced by the median of good neighbours.
    dq : array of uint8
        COSMIC_RAY (bit 64) set at replaced pixels.
    header : astropy.io.fits.Header

    Notes
    -----
    Runs on the host (``scipy.ndimage`` median filters): a device array is copied to the
    host and back. L.A.Cosmic costs about 0.3 s per 512 x 512 frame on one core, so about
    25 s at 4608 x 4608: the flow runs it only on request (option ``remove_cosmic_rays``).

    References
    ----------
    van Dokkum, P. G. 2001, PASP 113, 1420.
    """
    _check_2d("data", data)
    _check_2d("dq", dq, data.shape)
    h = _copy(header)
    if not enabled:
        _history(h, "clean_cosmic_rays", "skipped (not requested: option remove_cosmic_rays=false)")
        return data, dq, h
    from pipelines.array_backend import to_device
    from pipelines.calibration.l2 import cosmics

    xp = namespace_of(data)
    host = to_numpy(data)
    mask = to_numpy(dq) != 0
    cleaned, hits = cosmics.remove_cosmic_rays(host, mask=mask | ~np.isfinite(host), gain=gain, read_noise=read_noise,
                                               sigma_clip=sigma_clip)
    out = to_device(cleaned.astype(host.dtype, copy=False), xp)
    hits_dev = to_device(hits, xp)
    dq_out = xp.where(hits_dev, dq | xp.asarray(int(DQ.COSMIC_RAY), dtype=xp.uint8), dq)
    _history(h, "clean_cosmic_rays", f"L.A.Cosmic (van Dokkum 2001): {int(hits.sum())} pixels replaced, "
             f"flagged COSMIC_RAY (DQ bit {int(DQ.COSMIC_RAY)}); sigma_clip {sigma_clip:g}, gain {gain:g} e/DN")
    return out, dq_out, h


def correct_flat(data: Any, header: fits.Header, flat: Any) -> tuple[Any, fits.Header]:
    """Divide by the flat field.

    Parameters
    ----------
    data : array, shape (ny, nx) [DN]
        Dark-subtracted frame.
    header : astropy.io.fits.Header
    flat : array, shape (ny, nx) [dimensionless]
        Relative pixel response, mean 1 (with the CMOS laser-annealing stripes).

    Returns
    -------
    data : array, shape (ny, nx) [DN]
        NaN where the flat is not finite or not positive (flagged later as NOT_FINITE).
    header : astropy.io.fits.Header

    Raises
    ------
    DataError
        If shapes differ.

    References
    ----------
    Kuhn, Lin & Loranz 1991, PASP 103, 1097 (the KLL flat method used for WST and SDI);
    Li J.-W. et al. 2025, Acta Astron. Sinica 66, 10 (LST in-flight flats).
    """
    _check_2d("data", data)
    _check_2d("flat", flat, data.shape)
    xp = namespace_of(data, flat)
    good = xp.isfinite(flat) & (flat > 0)
    n_bad = int(xp.count_nonzero(~good))
    if n_bad:
        safe = xp.where(good, flat, xp.ones_like(flat))
        out = data / safe
        out[~good] = float("nan")
    else:  # the usual case: no copy of the flat, one output frame
        safe = flat
        out = data / flat
    return out, _flat_header(header, float(xp.mean(safe)), n_bad)


def _flat_header(header: fits.Header, mean_flat: float, n_bad: int) -> fits.Header:
    h = _copy(header)
    _history(h, "correct_flat", f"divided by the flat field (mean {mean_flat:.4f}; {n_bad} pixels "
             "with flat <= 0 set to NaN)")
    return h


def normalize_exposure(data: Any, header: fits.Header) -> tuple[Any, fits.Header]:
    """Divide by the exposure time: DN to DN/s.

    Parameters
    ----------
    data : array, shape (ny, nx) [DN]
    header : astropy.io.fits.Header
        ``EXPTIME`` [s]; ``BUNIT`` must be ``DN`` (or absent).

    Returns
    -------
    data : array [DN/s]
    header : astropy.io.fits.Header
        ``BUNIT='DN/s'``.

    Raises
    ------
    DataError
        On a bad ``EXPTIME`` or if the data are not in DN (the step ran twice).

    Notes
    -----
    ``EXPTIME`` is the exposure [s] of the frame header (LST.md: up to 20 s; burst modes of
    1-6 s cadence): frames of different exposures become comparable.
    """
    _check_2d("data", data)
    t = _exposure_check(header)
    out = data / t
    return out, _exposure_header(header, t)


def _exposure_check(header: fits.Header) -> float:
    unit = _bunit(header)
    if unit not in ("", "DN", "ADU", "COUNTS"):
        raise DataError(f"normalize_exposure expects data in DN, got BUNIT={unit!r}")
    return _exptime(header)


def _exposure_header(header: fits.Header, t: float) -> fits.Header:
    h = _copy(header)
    h["BUNIT"] = "DN/s"
    _history(h, "normalize_exposure", f"divided by EXPTIME = {t:g} s; BUNIT DN -> DN/s")
    return h


def convert_units(data: Any, header: fits.Header, coefficient: float, unit: str) -> tuple[Any, fits.Header]:
    """Radiometric calibration: DN/s to physical units.

    ``out = data * coefficient``

    Parameters
    ----------
    data : array, shape (ny, nx) [DN/s]
    header : astropy.io.fits.Header
        ``BUNIT`` must be ``DN/s`` (set by :func:`normalize_exposure`).
    coefficient : float
        Radiometric coefficient C [``unit`` per DN/s], > 0.
    unit : str
        ``'erg cm-2 s-1 sr-1'`` (SDI, WST) or ``'MSB'`` (SCI: mean solar brightness of the
        channel's passband).

    Returns
    -------
    data : array [unit]
    header : astropy.io.fits.Header
        ``BUNIT=unit``.

    Raises
    ------
    DataError
        If the data are not in DN/s or ``coefficient`` is not a positive number.

    References
    ----------
    LST.md: WST against the ASTM 2020 solar spectrum, SDI against GOES-R EUVS, SCI in MSB.
    """
    _check_2d("data", data)
    if _bunit(header) != "DN/s":
        raise DataError(f"convert_units expects data in DN/s, got BUNIT={_bunit(header)!r}")
    c = _units_check(coefficient, unit)
    out = data * c
    return out, _units_header(header, c, unit)


def _units_check(coefficient: float, unit: str) -> float:
    c = float(coefficient)
    if not math.isfinite(c) or c <= 0:
        raise DataError(f"radiometric coefficient must be a positive number, got {coefficient!r}")
    if unit not in (RADIANCE_UNIT, "MSB"):
        raise DataError(f"unknown physical unit {unit!r}; expected {RADIANCE_UNIT!r} or 'MSB'")
    return c


def _units_header(header: fits.Header, c: float, unit: str) -> fits.Header:
    h = _copy(header)
    h["BUNIT"] = unit
    _history(h, "convert_units", f"x {c:.6g} {unit} per DN/s; BUNIT DN/s -> {unit}")
    return h



def correct_detector_signal(data: Any, header: fits.Header, bias: Any, dark_rate: Any, flat: Any,
                            coefficient: float, unit: str, *, reference_temperature_c: float | None = None,
                            doubling_temperature_c: float | None = None,
                            temperature_curve: tuple[Any, Any] | None = None) -> tuple[Any, fits.Header]:
    """:func:`subtract_dark`, :func:`correct_flat`, :func:`normalize_exposure` and
    :func:`convert_units` in one pass over the frame.

    ``out = (data - bias - f(T) * EXPTIME * dark_rate) / flat / EXPTIME * C``, evaluated in
    float32 in one pass with no frame-sized temporaries on NumPy arrays: by the compiled kernel
    :func:`pipelines.calibration.l2.fused.detector_signal` (Numba) where it is enabled, else by
    :func:`pipelines.calibration.l2.kernels.evaluate` (numexpr, the same expression and the same
    bytes); on other arrays by the four steps one after the other. The operations and their
    order are those of the four steps, so the paths agree to float32 rounding
    (``tests/test_calibration_steps.py`` checks it on a random frame, and the compiled pass
    against numexpr byte for byte).

    Parameters
    ----------
    data : array, shape (ny, nx), float32 [DN]
        Raw frame (not modified).
    header : astropy.io.fits.Header
        ``EXPTIME`` [s], ``BUNIT`` absent or DN; the detector temperature if any.
    bias, dark_rate, flat : array, shape (ny, nx)
        As for :func:`subtract_dark` [DN], [DN/s] and :func:`correct_flat` [1].
    coefficient : float
        Radiometric coefficient [``unit`` per DN/s], > 0 (:func:`convert_units`).
    unit : str
        ``'erg cm-2 s-1 sr-1'`` or ``'MSB'``.
    reference_temperature_c, doubling_temperature_c : float, optional
        ``DARKTREF``, ``DARKTDBL`` of the dark master (:func:`subtract_dark`).
    temperature_curve : (temperatures, factors), optional
        The master's measured curve (:func:`subtract_dark`).

    Returns
    -------
    data : array, shape (ny, nx), float32 [unit]
        NaN where the flat is not finite or not positive.
    header : astropy.io.fits.Header
        The keywords (``BUNIT``, ``DARKTFAC``) and the four HISTORY lines, word for word,
        of the four steps run one after the other.

    Raises
    ------
    DataError
        As the four steps do (shapes, ``EXPTIME``, ``BUNIT``, coefficient, unit).
    """
    _check_2d("data", data)
    _check_2d("bias", bias, data.shape)
    _check_2d("dark_rate", dark_rate, data.shape)
    _check_2d("flat", flat, data.shape)
    from pipelines.calibration.l2 import kernels

    c = _units_check(coefficient, unit)
    _exposure_check(header)
    if not (kernels.available(data, bias, dark_rate, flat) and data.dtype == np.float32
            and bias.dtype == dark_rate.dtype == flat.dtype == np.float32):
        img, h = subtract_dark(data, header, bias, dark_rate, reference_temperature_c=reference_temperature_c,
                               doubling_temperature_c=doubling_temperature_c, temperature_curve=temperature_curve)
        img, h = correct_flat(img, h, flat)
        img, h = normalize_exposure(img, h)
        img, h = convert_units(img, h, c, unit)
        return img, h
    t, factor, why = _dark_scaling(header, reference_temperature_c, doubling_temperature_c, temperature_curve)
    h = _dark_header(header, dark_rate, t, factor, why)
    from pipelines.calibration.l2 import fused

    if fused.enabled():  # the same expression compiled (one pass at memory speed)
        out, n_bad = fused.detector_signal(data, bias, dark_rate, flat, t * factor, t, c)
        if n_bad:
            good = np.isfinite(flat)
            good &= flat > 0
            mean_flat = float(np.mean(np.where(good, flat, np.float32(1.0))))
            del good
        else:
            mean_flat = float(np.mean(flat))
        h = _flat_header(h, mean_flat, n_bad)
        h = _exposure_header(h, t)
        return out, _units_header(h, c, unit)
    good = np.isfinite(flat)
    good &= flat > 0
    n_bad = int(good.size - np.count_nonzero(good))
    env = {"d": data, "b": bias, "r": dark_rate, "f": flat, "s": np.float32(t * factor), "t": np.float32(t),
           "c": np.float32(c)}
    if n_bad:
        env.update(g=good, nan=np.float32(np.nan))
        out = kernels.evaluate("where(g, (d - b - r * s) / f / t * c, nan)", env)
        mean_flat = float(np.mean(np.where(good, flat, np.float32(1.0))))
    else:
        out = kernels.evaluate("(d - b - r * s) / f / t * c", env)
        mean_flat = float(np.mean(flat))
    del good
    h = _flat_header(h, mean_flat, n_bad)
    h = _exposure_header(h, t)
    return out, _units_header(h, c, unit)


@dataclass(frozen=True)
class StrayLightModel:
    """Radial power law of SCI stray light in MSB.

    ``B(r) = b_ref * (clip(r, r_min, r_max) / r_ref) ** (-index)``, r in Rsun from the disk
    centre in the detector frame (stray light follows the occulter, which tracks the Sun).

    The default construction (:meth:`through_points`) passes through the two on-orbit
    measurements of LST.md (SCI-WL: 7.8e-6 MSB at 1.1 Rsun, 7.6e-7 at 2.5; SCI-UV: 4.3e-3
    and 4.1e-4).
    """

    b_ref: float
    r_ref: float
    index: float
    r_min: float = 1.0
    r_max: float = 3.0

    @classmethod
    def through_points(cls, r1: float, b1: float, r2: float, b2: float, *, r_min: float = 1.0,
                       r_max: float = 3.0) -> StrayLightModel:
        """The power law through (r1, b1) and (r2, b2) [Rsun, MSB]."""
        if not (r1 > 0 and r2 > 0 and b1 > 0 and b2 > 0 and r1 != r2):
            raise ValueError("two distinct positive radii and brightnesses are needed")
        return cls(b_ref=float(b1), r_ref=float(r1), index=float(math.log(b1 / b2) / math.log(r2 / r1)),
                   r_min=float(r_min), r_max=float(r_max))

    def brightness(self, r: Any) -> Any:
        """Stray light [MSB] at heliocentric distance(s) ``r`` [Rsun] (array or float)."""
        if isinstance(r, (int, float)):
            rc = min(max(float(r), self.r_min), self.r_max)
            return self.b_ref * (rc / self.r_ref) ** (-self.index)
        xp = namespace_of(r)
        rc = xp.clip(r, self.r_min, self.r_max)  # a new array: the rest is done in place on it
        rc /= self.r_ref
        rc **= -self.index
        rc *= self.b_ref
        return rc


@dataclass(frozen=True)
class StrayLightProfile:
    """A measured radial stray-light profile [MSB] about the disk centre.

    ``B(r)`` is linear interpolation of ``values`` at ``radii`` [Rsun], constant beyond the
    ends (``numpy.interp``). Made by
    :func:`pipelines.calibration.masters.stray_light.measure_stray_light_map` (azimuthal median
    of a time-minimum background) and stored in the ``PROFILE`` table of a stray-light
    master with ``STRAYTYP='PROFILE'``; evaluated, like the power law, about each frame's
    own disk centre.
    """

    radii: tuple[float, ...]
    values: tuple[float, ...]

    def brightness(self, r: Any) -> Any:
        """Stray light [MSB] at ``r`` [Rsun] (array or float)."""
        if isinstance(r, (int, float)):
            return float(np.interp(float(r), self.radii, self.values))
        xp = namespace_of(r)
        return xp.interp(r, xp.asarray(self.radii, dtype=r.dtype), xp.asarray(self.values, dtype=r.dtype))


def subtract_stray_light(data: Any, header: fits.Header, model: StrayLightModel | StrayLightProfile | Any | None, *,
                         source: str = "") -> tuple[Any, fits.Header]:
    """Subtract the SCI instrumental stray light (a no-op, with HISTORY, for SDI and WST).

    Parameters
    ----------
    data : array, shape (ny, nx) [MSB]
        Radiometrically calibrated SCI frame.
    header : astropy.io.fits.Header
        WCS and observer keywords (the Sun's centre and radius locate the model).
    model : StrayLightModel, StrayLightProfile, array of shape (ny, nx) [MSB], or None
        The radial power law (default master, LST.md's on-orbit values); a *measured*
        radial profile (:class:`StrayLightProfile`), evaluated about the frame's disk
        centre like the power law; or a measured per-pixel map on the detector grid
        (:mod:`pipelines.calibration.masters.stray_light`, for stray light fixed to the instrument
        and not radially symmetric), subtracted pixel for pixel before any resampling.
        ``None`` skips the step (HISTORY says why).
    source : str
        Name of the calibration file, for the HISTORY line.

    Returns
    -------
    data : array [MSB]
    header : astropy.io.fits.Header

    Raises
    ------
    DataError
        If a model is given for data that are not in MSB.

    Notes
    -----
    In the WL channel the stray light exceeds the coronal signal near 2.5 Rsun (LST.md),
    so the subtraction decides the science; the model is a versioned calibration product.

    References
    ----------
    LST on-orbit tests and calibrations, Solar Physics (ASO-S topical collection): SCI
    stray light 7.8e-6 / 7.6e-7 MSB (WL) and 4.3e-3 / 4.1e-4 MSB (UV) at 1.1 / 2.5 Rsun.
    """
    _check_2d("data", data)
    h = _copy(header)
    code = _channel_code(header)
    if code is not None and not get_channel(code).is_coronagraph:
        _history(h, "subtract_stray_light", f"skipped: {code} is a disk imager (no stray-light model applies)")
        return data, h
    if model is None:
        _history(h, "subtract_stray_light", "skipped: no stray-light model given")
        return data, h
    if _bunit(header) != "MSB":
        raise DataError(f"subtract_stray_light expects data in MSB, got BUNIT={_bunit(header)!r}")
    xp = namespace_of(data)
    if isinstance(model, StrayLightProfile):
        geom = sun_geometry(header)
        r = radius_map(data.shape, geom, xp, dtype=_float_dtype(data))
        out = data - xp.astype(model.brightness(r), data.dtype)
        _history(h, "subtract_stray_light", f"measured radial profile{' (' + source + ')' if source else ''}, "
                 f"{len(model.radii)} radii {model.radii[0]:.3g}-{model.radii[-1]:.3g} Rsun; "
                 f"{model.brightness(1.1):.3g} MSB at 1.1 Rsun, {model.brightness(2.5):.3g} at 2.5")
        return out, h
    if not isinstance(model, StrayLightModel):
        _check_2d("stray-light map", model, data.shape)
        out = data - xp.astype(model, data.dtype)
        geom = sun_geometry(header)
        r = radius_map(data.shape, geom, xp, dtype=_float_dtype(data))
        at = []
        for r0 in (1.1, 2.5):
            ring = (r >= r0 - 0.02) & (r <= r0 + 0.02) & xp.isfinite(model)
            n = int(xp.count_nonzero(ring))
            at.append(float(xp.sum(xp.where(ring, model, xp.zeros_like(model)))) / n if n else float("nan"))
        _history(h, "subtract_stray_light", f"measured stray-light map subtracted{' (' + source + ')' if source else ''}; "
                 f"{at[0]:.3g} MSB at 1.1 Rsun, {at[1]:.3g} at 2.5")
        return out, h
    geom = sun_geometry(header)
    r = radius_map(data.shape, geom, xp, dtype=_float_dtype(data))
    stray = model.brightness(r)
    del r  # at most two frame-sized temporaries at once (radius, then model)
    out = data - xp.astype(stray, data.dtype, copy=False)
    del stray
    _history(h, "subtract_stray_light",
             f"power law {model.b_ref:.3g} MSB x (r/{model.r_ref:g} Rsun)^-{model.index:.4f}, r clipped to "
             f"[{model.r_min:g}, {model.r_max:g}] Rsun; {model.brightness(1.1):.3g} MSB at 1.1 Rsun, "
             f"{model.brightness(2.5):.3g} at 2.5")
    return out, h


def _mask_radius(dq: Any, header: fits.Header, radius_rsun: float, *, inside: bool, bit: DQ,
                 step: str) -> tuple[Any, fits.Header]:
    xp = namespace_of(dq)
    geom = sun_geometry(header)
    from pipelines.calibration.l2 import kernels

    from pipelines.calibration.l2 import fused

    n = None
    if isinstance(dq, np.ndarray) and dq.dtype == np.uint8 and fused.enabled():  # one compiled pass
        out = np.empty_like(dq, order="C")
        n = fused.radius_flag(np.ascontiguousarray(dq), _radius_terms(dq.shape, geom), radius_rsun, inside, int(bit),
                              out)
    elif kernels.available(dq):
        sel = _radius_select(dq.shape, geom, radius_rsun, inside)
        out = dq.copy()
        np.bitwise_or(out, np.uint8(int(bit)), out=out, where=sel)
    else:
        r = radius_map(dq.shape, geom, xp, dtype=xp.float32)
        sel = (r < radius_rsun) if inside else (r > radius_rsun)
        del r
        out = xp.where(sel, dq | xp.asarray(int(bit), dtype=xp.uint8), dq)
    h = _copy(header)
    if n is None:
        n = int(xp.count_nonzero(sel))
    side = "inside" if inside else "outside"
    _history(h, step, f"{n} pixels {side} r = {radius_rsun:g} Rsun ({radius_rsun * geom.rsun_px:.2f} px) "
             f"flagged {bit.name} (DQ bit {int(bit)})")
    return out, h


def _radius_terms(shape: tuple[int, int], geom: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The float32 column and row terms of :func:`pipelines.sun.radius_map` [Rsun]: ``(ax, ay, bx, by)``,
    ``ax``, ``bx`` of shape ``(nx,)`` and ``ay``, ``by`` of shape ``(ny,)`` (each rounded from float64);
    a pixel's radius is ``sqrt((ax + ay)**2 + (bx + by)**2)`` in float32."""
    ny, nx = shape
    m = geom.matrix / geom.rsun_arcsec
    dx = np.arange(nx, dtype=np.float64) - geom.x0
    dy = np.arange(ny, dtype=np.float64) - geom.y0
    return ((m[0, 0] * dx).astype(np.float32), (m[0, 1] * dy).astype(np.float32),
            (m[1, 0] * dx).astype(np.float32), (m[1, 1] * dy).astype(np.float32))


def _radius_select(shape: tuple[int, int], geom: Any, radius_rsun: float, inside: bool) -> np.ndarray:
    """``radius_map(shape, geom, dtype=float32) < radius_rsun`` (or ``>``) in one fused pass.

    The same float32 operations as :func:`pipelines.sun.radius_map` (row and column terms
    in float64, rounded to float32, summed, squared, square root), evaluated by numexpr on
    the broadcast row and column vectors: no frame-sized float temporaries, only the
    boolean result (a quarter of one float32 frame).
    """
    from pipelines.calibration.l2 import kernels

    ny, nx = shape
    ax, ay, bx, by = _radius_terms(shape, geom)
    env = {"ax": ax.reshape(1, nx), "ay": ay.reshape(ny, 1), "bx": bx.reshape(1, nx), "by": by.reshape(ny, 1),
           "R": np.float32(radius_rsun)}
    op = "<" if inside else ">"
    return kernels.evaluate(f"sqrt((ax + ay) * (ax + ay) + (bx + by) * (bx + by)) {op} R", env)


def mask_occulter(dq: Any, header: fits.Header, radius_rsun: float | None) -> tuple[Any, fits.Header]:
    """Flag the pixels behind the SCI occulter (DQ bit 4, OCCULTED).

    Parameters
    ----------
    dq : array of uint8, shape (ny, nx)
    header : astropy.io.fits.Header
        WCS and observer keywords.
    radius_rsun : float or None
        Occulter radius [Rsun] (SCI: 1.1, from the mask-geometry calibration). ``None``, or
        a disk imager, skips the step.

    Returns
    -------
    dq : array of uint8
    header : astropy.io.fits.Header

    References
    ----------
    Chen B. et al. 2019, RAA 19, 159: SCI field of view 1.1-2.5 Rsun.
    """
    _check_2d("dq", dq)
    code = _channel_code(header)
    if radius_rsun is None or (code is not None and not get_channel(code).is_coronagraph):
        h = _copy(header)
        _history(h, "mask_occulter", f"skipped: {code or 'this frame'} has no occulter")
        return dq, h
    return _mask_radius(dq, header, float(radius_rsun), inside=True, bit=DQ.OCCULTED, step="mask_occulter")


def mask_field_of_view(dq: Any, header: fits.Header, radius_rsun: float | None) -> tuple[Any, fits.Header]:
    """Flag the pixels beyond the useful field of view (DQ bit 8, OUTSIDE_FOV).

    Parameters
    ----------
    dq : array of uint8, shape (ny, nx)
    header : astropy.io.fits.Header
    radius_rsun : float or None
        Outer radius [Rsun]: SCI field stop 2.5, SDI/WST 1.2 (LST.md). ``None`` skips.

    Returns
    -------
    dq : array of uint8
    header : astropy.io.fits.Header

    Raises
    ------
    DataError
        If the header does not locate the Sun.

    References
    ----------
    Chen B. et al. 2019, RAA 19, 159 (LST design: SDI/WST to 1.2 Rsun, SCI 1.1-2.5 Rsun).
    """
    _check_2d("dq", dq)
    if radius_rsun is None:
        h = _copy(header)
        _history(h, "mask_field_of_view", "skipped: no field-of-view radius given")
        return dq, h
    return _mask_radius(dq, header, float(radius_rsun), inside=False, bit=DQ.OUTSIDE_FOV, step="mask_field_of_view")


def deconvolve_psf(data: Any, dq: Any, header: fits.Header, psf: np.ndarray | None, *, n_iter: int = 30,
                   source: str = "") -> tuple[Any, fits.Header]:
    """Richardson-Lucy deconvolution by the channel's PSF (SDI routine processing).

    Parameters
    ----------
    data : array, shape (ny, nx) [erg cm-2 s-1 sr-1]
        Radiometrically calibrated frame on the detector grid (before the north-up
        resampling: the PSF is the instrument's, fixed to the detector).
    dq : array of uint8, shape (ny, nx)
        Pixels with a non-zero DQ are masked during the iteration and keep their values.
    header : astropy.io.fits.Header
    psf : numpy.ndarray, shape (k, k), or None
        The PSF master's kernel at the frame's sampling (odd sides, unit sum). ``None``
        skips the step with a HISTORY line.
    n_iter : int
        Richardson-Lucy iterations (the regularisation).
    source : str
        Name of the PSF calibration file, for the HISTORY line.

    Returns
    -------
    data : array, shape (ny, nx), float32
    header : astropy.io.fits.Header
        HISTORY names the file and the iterations; ``PSFDECON = True``.

    Notes
    -----
    Runs on the host (:func:`pipelines.calibration.masters.psf.deconvolve_richardson_lucy`,
    scikit-image): a device array goes to the host and back.

    References
    ----------
    Richardson 1972, JOSA 62, 55; Lucy 1974, AJ 79, 745; Liu H. et al. 2025, RAA (SDI PSF:
    deconvolution improves the resolution by more than 3x).
    """
    _check_2d("data", data)
    _check_2d("dq", dq, data.shape)
    h = _copy(header)
    if psf is None:
        _history(h, "deconvolve_psf", "skipped: not requested (option deconvolve_psf=false)")
        return data, h
    from pipelines.array_backend import to_device
    from pipelines.calibration.masters import psf as psfmod  # scipy.signal, skimage: imported only when used

    xp = namespace_of(data)
    host = to_numpy(data)
    mask = to_numpy(dq) != 0
    try:
        dec = psfmod.deconvolve_richardson_lucy(host, np.asarray(psf, dtype=np.float64), n_iter=int(n_iter),
                                                mask=mask)
    except ValueError as exc:
        raise DataError(f"PSF deconvolution failed: {exc}") from None
    out = to_device(dec.astype(np.float32), xp)
    h["PSFDECON"] = (True, "Richardson-Lucy PSF deconvolution applied")
    _history(h, "deconvolve_psf", f"Richardson-Lucy, {int(n_iter)} iterations, PSF {psf.shape[1]}x{psf.shape[0]}"
             + (f" from {source}" if source else "") + "; DQ pixels masked")
    return out, h


def dq_description() -> list[str]:
    """One line per DQ bit (``'bit 1 SATURATED: ...'``), for FITS COMMENT cards."""
    text = {
        DQ.SATURATED: "raw value at or above the saturation level",
        DQ.NOT_FINITE: "NaN or infinite value",
        DQ.OCCULTED: "behind the SCI occulter",
        DQ.OUTSIDE_FOV: "outside the useful field of view",
        DQ.NO_DATA: "no detector data after north-up rotation",
        DQ.BAD_PIXEL: "hot or dead detector pixel",
        DQ.COSMIC_RAY: "cosmic-ray hit, replaced by the median of its neighbours",
    }
    return [f"DQ bit {int(b)} {b.name}: {t}" for b, t in text.items()]


def as_numpy(a: Any) -> np.ndarray:
    """Host copy of an array of any backend (for writing and statistics)."""
    return to_numpy(a)
