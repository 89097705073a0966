"""The L2 calibration flow of one LST frame: the steps of :mod:`.steps` composed.

:func:`calibrate_frame` takes a raw frame as :func:`pipelines.fitsio.read_image` returns it
(float data, header with the ASO-S quirks repaired and observer keywords filled) and the
calibration inputs chosen for it (:class:`CalibrationInput`, one per kind), and returns an
:class:`L2Result`: float32 data in physical units, a uint8 DQ array, a float32 per-pixel
standard deviation (:mod:`.uncertainty`), the L2 header (full
helioprojective WCS, observer keywords, ``LEVEL='L2'``, ``BUNIT``, ``CAL*`` provenance
keywords, one HISTORY line per step, ``DATE-BEG``/``DATE-AVG``/``DATE-END``/``TIMESYS`` from
``DATE-OBS`` and the exposure; ``BUNIT`` readable by astropy's strict FITS parser and, for
SCI, ``MSBVALUE``: :mod:`pipelines.units`; ``QUALITY``, the frame-wide systematics flagged, 0
when none, with a reason keyword per bit: :mod:`.quality`) and summary statistics.

Calibration masters are FITS files that describe themselves in their primary header
(``CALKIND``, ``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``CALDESC`` and the
parameters of the kind); :func:`load_calibration_master` reads one. The simulator
(:mod:`pipelines.simulation`) writes such masters.

Provenance keywords written on the product (name, version, database id, SHA-256 of each
calibration file in ``CAL*`` keywords, as punchbowl does; ``LEVEL``, ``BUNIT``, ``BACKEND``)
come from the spec :data:`pipelines.provenance.L2_PROVENANCE`, stamped by its one writer.

Every calibration file given to :func:`calibrate_frame` is recorded, also one that a step
did not apply (a PSF without ``deconvolve_psf``); HISTORY says which were applied.

Options: one :class:`~pipelines.calibration.l2.options.CalibrationOptions` (defined once, with
its defaults and limits; a recalibration job's request embeds the same object). The array
backend (NumPy or CuPy) is an execution choice, not an option: the ``backend`` argument, or
CuPy when the options say ``device='gpu'``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits
from astropy.io.fits.verify import VerifyWarning

from pipelines.array_backend import backend_name, resolve_namespace, to_device, to_numpy
from pipelines.calibration.l2 import device, resample, steps, uncertainty
from pipelines.calibration.l2.device import EXACT_PERCENTILE_PIXELS, stats_head as _stats_head
from pipelines.calibration.l2.centre import EDGE_SYSTEMATIC_ARCSEC, fit_and_apply_centre
from pipelines.calibration.l2.options import CalibrationOptions
from pipelines.calibration.l2.quality import FrameQuality, flag_frame, frame_quality, stamp_quality
from pipelines.calibration.masters.radiometry import coefficient_at, radiometric_uncertainty_at
from pipelines.calibration.l2.steps import DQ, StrayLightModel
from pipelines.channels import channel_from_header, get_channel
from pipelines.errors import CalibrationMissingError, DataError, FitsReadError, NotLSTFrameError
from pipelines.fitsio import exposure_seconds, sha256_file
from pipelines.provenance import CAL_KEYWORDS, calibration_values, stamp_provenance
from pipelines.sun import RSUN_REF_M, apparent_rsun_arcsec, sun_geometry
from pipelines.units import stamp_units

__all__ = [
    "CALIBRATION_KINDS",
    "CAL_KEYWORDS",
    "CalibrationInput",
    "L2Result",
    "load_calibration_master",
    "calibrate_frame",
    "required_kinds",
]

#: Kinds of calibration file the flow knows (``CALKIND`` values).
CALIBRATION_KINDS = ("dark", "flat", "radiometric", "stray_light", "mask_geometry", "psf")


@dataclass
class CalibrationInput:
    """One calibration file as the flow uses it.

    Attributes
    ----------
    kind : str
        ``dark``, ``flat``, ``radiometric``, ``stray_light``, ``mask_geometry`` (or ``psf``).
    id : int or None
        Database id of the calibration file (set by the caller; ``None`` outside the DB).
    version : int
        ``CALVER``.
    sha256 : str
        Hex SHA-256 of the file's bytes.
    name : str
        File name (recorded on the product).
    channel : str
        ``CHANNEL`` the file is for.
    data : dict of str to numpy.ndarray
        Arrays by role: dark ``bias`` [DN] and ``dark_rate`` [DN/s]; flat ``flat``; empty for
        the parameter-only kinds.
    parameters : dict
        The primary-header keywords (``RADCOEF``, ``RADUNIT``, ``OCCRAD``, ``FOVRAD``,
        ``STRAYB0``, ``STRAYR0``, ``STRAYIDX``, ...).
    path : str or None
        Where it was read from.
    """

    kind: str
    id: int | None
    version: int
    sha256: str
    name: str
    channel: str
    data: dict[str, np.ndarray] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    def param(self, key: str, cast=float) -> Any:
        """Parameter ``key`` cast by ``cast``; :class:`DataError` if missing or invalid."""
        try:
            return cast(self.parameters[key])
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{self.kind} calibration {self.name!r} lacks a valid {key} keyword") from None


@dataclass
class L2Result:
    """A calibrated frame.

    Attributes
    ----------
    data : numpy.ndarray, shape (ny, nx), float32
        Physical units (``header['BUNIT']``): erg cm-2 s-1 sr-1 (SDI, WST) or MSB (SCI).
        NaN where ``dq`` has NOT_FINITE or NO_DATA.
    dq : numpy.ndarray, shape (ny, nx), uint8
        DQ bits (:class:`pipelines.calibration.l2.steps.DQ`).
    header : astropy.io.fits.Header
        The L2 header.
    stats : dict
        JSON-ready summary: ``mean``, ``min``, ``max`` (exact) and ``median``, ``p01``, ``p99``
        (exact, or sampled on large frames: ``percentiles``, ``percentile_rank_error``;
        :func:`_stats`) of the good pixels (DQ 0), ``n_pixels``, ``n_good``, ``n_masked``,
        counts per DQ bit, ``rsun_px``, ``channel``, ``bunit``, ``backend``.
    uncertainty : numpy.ndarray, shape (ny, nx), float32, or None
        Standard deviation of ``data`` per pixel, in ``BUNIT``
        (:mod:`pipelines.calibration.l2.uncertainty`); NaN where ``data`` is NaN.
    """

    data: np.ndarray
    dq: np.ndarray
    header: fits.Header
    stats: dict[str, Any]
    uncertainty: np.ndarray | None = None
    #: The quicklook's block average (float64, NaN = masked), when ``calibrate_frame`` was asked
    #: for it (``quicklook_size``: made on the frame's device,
    #: :func:`pipelines.calibration.l2.device.quicklook_reduce`); else None.
    quicklook: np.ndarray | None = None


def _master_arrays(kind: str, hdul: fits.HDUList) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if kind == "stray_light" and "PROFILE" in hdul:
        tab = hdul["PROFILE"].data
        out["_profile_r"] = np.asarray(tab["R"], dtype=np.float64)
        out["_profile"] = np.asarray(tab["STRAY"], dtype=np.float64)
        if "SIGMA" in tab.columns.names:  # the profile's stated 1-sigma [MSB] (issue 27)
            out["_profile_sigma"] = np.asarray(tab["SIGMA"], dtype=np.float64)
    for i, hdu in enumerate(hdul):
        if hdu.data is None or getattr(hdu.data, "ndim", 0) != 2:
            continue
        name = str(hdu.header.get("EXTNAME", "")).strip().lower() or ("primary" if i == 0 else f"hdu{i}")
        out[name] = np.asarray(hdu.data, dtype=np.float32)
    if kind == "dark":
        if "bias" not in out and "primary" in out:
            out["bias"] = out.pop("primary")
        if "darkrate" in out:
            out["dark_rate"] = out.pop("darkrate")
        if "bias" not in out or "dark_rate" not in out:
            raise DataError("dark calibration needs a BIAS plane [DN] and a DARKRATE plane [DN/s]")
    if kind == "stray_light" and any(not k.startswith("_") for k in out):
        if "straymap" not in out:
            planes = [k for k in out if not k.startswith("_") and not k.endswith("err")]
            if planes:  # an error plane (STRAYERR) is never the map
                out["straymap"] = out.pop("primary") if "primary" in out else out[planes[0]]
    if kind == "flat":
        if "flat" not in out and "primary" in out:
            out["flat"] = out.pop("primary")
        if "flat" not in out:
            raise DataError("flat calibration holds no image")
    return out


def load_calibration_master(path: str | Path) -> CalibrationInput:
    """Read a calibration master written by :mod:`pipelines.simulation` (or any file of that form).

    Parameters
    ----------
    path : path-like
        FITS file whose primary header has ``CALKIND``, ``CHANNEL``, ``CALVER``.

    Returns
    -------
    CalibrationInput
        ``id`` is ``None``: the caller sets it from its registry.

    Raises
    ------
    FitsReadError
        If the file is missing, not FITS, or fails its CHECKSUM/DATASUM.
    DataError
        If the header does not describe a calibration file or the arrays are missing.
    """
    p = Path(path)
    if not p.is_file():
        raise FitsReadError(f"no such calibration file: {p}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fits.open(p, memmap=False, checksum=True) as hdul:
                hdul.verify("silentfix")
                primary = hdul[0].header.copy()
                bad_sum = any(
                    ("CHECKSUM" in h.header and not getattr(h, "_checksum_valid", True))
                    or ("DATASUM" in h.header and not getattr(h, "_datasum_valid", True))
                    for h in hdul)
                kind = str(primary.get("CALKIND", "")).strip().lower()
                arrays = _master_arrays(kind, hdul) if kind else {}
    except (OSError, ValueError, TypeError, IndexError, EOFError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FitsReadError(f"unreadable calibration file {p.name}: {msg}") from None
    if bad_sum or any("checksum" in str(w.message).lower() and issubclass(w.category, (UserWarning, VerifyWarning))
                      for w in caught):
        raise FitsReadError(f"calibration file {p.name} fails its CHECKSUM/DATASUM (corrupted)")
    if not kind:
        raise DataError(f"{p.name} is not a calibration file (no CALKIND in the primary header)")
    if kind not in CALIBRATION_KINDS:
        raise DataError(f"{p.name}: unknown CALKIND {kind!r}")
    try:
        version = int(primary["CALVER"])
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{p.name}: no integer CALVER") from None
    channel = str(primary.get("CHANNEL", "")).strip().upper()
    params = {k: primary[k] for k in primary if k not in ("", "COMMENT", "HISTORY")}
    return CalibrationInput(kind=kind, id=None, version=version, sha256=sha256_file(p), name=p.name,
                            channel=channel, data=arrays, parameters=params, path=str(p))


def required_kinds(channel: str, options: CalibrationOptions | None = None) -> tuple[str, ...]:
    """Calibration kinds :func:`calibrate_frame` needs for ``channel``.

    SCI channels also need ``stray_light`` unless ``options.subtract_stray_light`` is
    false; ``options.deconvolve_psf`` needs ``psf``. ``mask_geometry`` is optional:
    without it the channel's nominal field of view (:mod:`pipelines.channels`) is used. A
    ``psf`` given without ``deconvolve_psf`` is recorded, not applied.
    """
    opts = _options(options)
    kinds = ["dark", "flat", "radiometric"]
    if get_channel(channel).is_coronagraph and opts.subtract_stray_light:
        kinds.append("stray_light")
    if opts.deconvolve_psf:
        kinds.append("psf")
    return tuple(kinds)


def bad_pixel_map(dark: CalibrationInput, *, nsigma: float = 8.0) -> np.ndarray:
    """The bad-pixel map of a dark master (cached on it: a worker keeps its masters).

    The master's ``BADPIX`` plane (non-zero = bad) when it has one, else the hot pixels of
    its dark-rate plane by :func:`pipelines.calibration.l2.cosmics.find_hot_pixels`
    (``nsigma`` robust standard deviations above the 5 x 5 local median).

    Returns
    -------
    numpy.ndarray of bool, shape (ny, nx)
    """
    from pipelines.calibration.l2.cosmics import find_hot_pixels

    cached = dark.data.get("_bad_pixels")
    if cached is None:
        if "badpix" in dark.data:
            cached = dark.data["badpix"] != 0
        else:
            cached = find_hot_pixels(dark.data["dark_rate"], nsigma=nsigma, box=5)
        dark.data["_bad_pixels"] = cached
    return cached


def _stray_model(cal: CalibrationInput) -> StrayLightModel:
    return StrayLightModel(b_ref=cal.param("STRAYB0"), r_ref=cal.param("STRAYR0"), index=cal.param("STRAYIDX"),
                           r_min=float(cal.parameters.get("STRAYRMN", 1.0)),
                           r_max=float(cal.parameters.get("STRAYRMX", 3.0)))




def _stats(data: np.ndarray, dq: np.ndarray, header: fits.Header, channel: str, backend: str) -> dict[str, Any]:
    """The product's summary statistics of the good pixels (DQ 0 and finite).

    Exact: ``n_good``, ``mean`` (float64 accumulation), ``min``, ``max`` and the DQ counts.
    ``median``, ``p01``, ``p99``: exact (``numpy.percentile``, linear interpolation) up to
    :data:`EXACT_PERCENTILE_PIXELS` good pixels; above it, *sampled*: the percentiles of
    every k-th pixel in raster order (k = ceil(n_pixels / 2**20), about 2**20 pixels; the
    same pixels for the same frame size, so reruns agree). Their error is stated, not
    estimated: ``percentile_rank_error`` is the largest difference [percentage points]
    between the percentile asked for and the exact rank of the value returned among all
    good pixels (counted in one pass each); with ~1e6 samples it is of order 0.01-0.1
    points (binomial standard error sqrt(p (1 - p) / m): 0.01 points at p = 1 %, 0.05 at
    the median). ``percentiles`` says ``"exact"`` or ``"sampled: 1 pixel in k, raster order"``.
    """
    from pipelines.calibration.l2 import fused, kernels

    if fused.enabled() and isinstance(data, np.ndarray) and data.dtype == np.float32 and dq.dtype == np.uint8 \
            and data.size > EXACT_PERCENTILE_PIXELS:
        stats = _stats_two_passes(data, dq, header, channel, backend)
        if stats is not None:
            return stats
    flat_data, flat_dq = data.reshape(-1), dq.reshape(-1)
    if kernels.available(data, dq) and data.dtype == np.float32:
        good = kernels.evaluate("(q == 0) & isfinite(x)", {"q": flat_dq.view(np.uint8), "x": flat_data})
    else:
        good = (flat_dq == 0) & np.isfinite(flat_data)
    n_good = int(np.count_nonzero(good))
    counts = np.bincount(flat_dq, minlength=256)  # one pass over the DQ for every bit
    stats = _stats_head(data, header, channel, backend, n_good, counts)
    if n_good:
        mean, vmin, vmax = _exact_moments(flat_data, good, n_good)
        if n_good <= EXACT_PERCENTILE_PIXELS:
            vals = flat_data[good]
            p01, med, p99 = np.percentile(vals, [1, 50, 99], overwrite_input=True)
            how, rank_err = "exact", 0.0
        else:
            k = -(-data.size // EXACT_PERCENTILE_PIXELS)
            sub = flat_data[::k][good[::k]]  # a copy of ~1e6 values: reordered in place below
            p01, med, p99 = np.percentile(sub, [1, 50, 99], overwrite_input=True)
            del sub
            how = f"sampled: 1 pixel in {k}, raster order"
            rank_err = 0.0
            for want, got in ((1.0, p01), (50.0, med), (99.0, p99)):
                below = int(np.count_nonzero(kernels.evaluate("g & (x < v)", {"g": good, "x": flat_data,
                                                                             "v": np.float32(got)})
                                             if kernels.available(data) else good & (flat_data < np.float32(got))))
                rank_err = max(rank_err, abs(100.0 * below / n_good - want))
        stats.update(median=float(med), mean=mean, p01=float(p01), p99=float(p99), min=vmin, max=vmax,
                     percentiles=how, percentile_rank_error=round(rank_err, 4))
    del good
    return device.stats_tail(stats, header, n_good)


def _stats_two_passes(data: np.ndarray, dq: np.ndarray, header: fits.Header, channel: str,
                      backend: str) -> dict[str, Any] | None:
    """:func:`_stats` of a frame above :data:`EXACT_PERCENTILE_PIXELS` pixels in two passes, every
    field equal to it: the sampled percentiles first (from the ~2**20 sampled pixels alone),
    then one compiled pass (:func:`pipelines.calibration.l2.fused.frame_statistics`: good
    count, DQ histogram, min, max, the rank counts of the three percentiles, and the buffer of
    good values with 0 elsewhere), then NumPy's float64 sum of that buffer (the same sum, in
    the same order, as :func:`_exact_moments`). None if the frame has too few good pixels for
    sampled percentiles (then :func:`_stats` runs its exact branch).
    """
    from pipelines.calibration.l2 import fused

    flat_data, flat_dq = data.reshape(-1), dq.reshape(-1)
    k = -(-data.size // EXACT_PERCENTILE_PIXELS)
    sd, sq = flat_data[::k], flat_dq[::k]
    sub = sd[(sq == 0) & np.isfinite(sd)]
    pcts = np.percentile(sub, [1, 50, 99], overwrite_input=True) if sub.size else np.zeros(3)
    del sub
    thresholds = np.asarray([np.float32(v) for v in pcts], dtype=np.float32)
    n_good, counts, vmin, vmax, below, buf = fused.frame_statistics(flat_data, flat_dq, thresholds)
    if n_good <= EXACT_PERCENTILE_PIXELS:
        return None
    mean = float(np.add.reduce(buf, dtype=np.float64) / n_good)
    del buf
    stats = _stats_head(data, header, channel, backend, n_good, counts)
    p01, med, p99 = pcts
    rank_err = 0.0
    for want, cnt in zip((1.0, 50.0, 99.0), below):
        rank_err = max(rank_err, abs(100.0 * int(cnt) / n_good - want))
    stats.update(median=float(med), mean=mean, p01=float(p01), p99=float(p99), min=vmin, max=vmax,
                 percentiles=f"sampled: 1 pixel in {k}, raster order", percentile_rank_error=round(rank_err, 4))
    return device.stats_tail(stats, header, n_good)


def _exact_moments(x: np.ndarray, good: np.ndarray, n_good: int) -> tuple[float, float, float]:
    """Mean (float64 accumulation), min and max of ``x[good]`` without copying ``x[good]``:
    the bad pixels replaced by the neutral value in one reused buffer (numexpr), then the
    plain SIMD reductions (masked ``where=`` reductions are several times slower)."""
    from pipelines.calibration.l2 import kernels

    if not (kernels.available(x) and x.dtype == np.float32):
        return (float(np.add.reduce(x, where=good, dtype=np.float64) / n_good),
                float(np.min(x, where=good, initial=np.inf)), float(np.max(x, where=good, initial=-np.inf)))
    env = {"g": good, "x": x, "z": np.float32(0.0)}
    buf = kernels.evaluate("where(g, x, z)", env)
    mean = float(np.add.reduce(buf, dtype=np.float64) / n_good)
    env["z"] = np.float32(np.inf)
    vmin = float(np.min(kernels.evaluate("where(g, x, z)", env, out=buf)))
    env["z"] = np.float32(-np.inf)
    vmax = float(np.max(kernels.evaluate("where(g, x, z)", env, out=buf)))
    return mean, vmin, vmax


def _options(options: CalibrationOptions | None) -> CalibrationOptions:
    if options is None:
        return CalibrationOptions()
    if not isinstance(options, CalibrationOptions):
        raise TypeError(f"options must be CalibrationOptions (pipelines.calibration.l2.options.as_options "
                        f"validates a dict), got {type(options).__name__}")
    return options


def _add_frame_wide_errors(xp, img, var, sigma, h: fits.Header, plane_rel, stray_sigma):
    """Add the frame-wide stated errors to the uncertainty on the output grid: the flat's stated
    plane (``plane_rel``: its relative variance on the output grid, or None) and the stated
    stray-light 1-sigma profile (``stray_sigma``, or None). Each is one error of the whole frame,
    smooth (fully correlated over the interpolation kernel): a resampled pixel's error from it is
    the relative 1-sigma at its source position times its own value, added after the resampling,
    whose squared weights would shrink it as if it were pixel noise (by sqrt(g(fx) g(fy)) >= 0.57).

    ``var`` (the variance) or ``sigma`` (the resampling pass's 1-sigma; then ``var`` is None), both
    shaped as ``img``. Returns ``(var, sigma)``: the variance with the terms added and None, or, with
    nothing to add, both as given. HISTORY lines in ``h`` say what was added.
    """
    if plane_rel is None and stray_sigma is None:
        return var, sigma
    if sigma is not None:  # the resampling pass gave sigma: back to a variance for the sum
        var, sigma = xp.asarray(sigma) ** 2, None
    if plane_rel is not None:
        var = var + xp.asarray(plane_rel, dtype=xp.float32) * (img * img)
        h.add_history("uncertainty: stated flat plane (FLATPLSG) x value, added on the output grid")
    if stray_sigma is not None:
        with device.section("stray_light_sigma"):
            var, why = uncertainty.stray_light_variance(var, h, stray_sigma, None, None, sigma_profile=stray_sigma)
        h.add_history(f"uncertainty: {why}, added on the output grid")
    return var, sigma


def calibrate_frame(data: np.ndarray, header: fits.Header, calibrations: dict[str, CalibrationInput],
                    options: CalibrationOptions | None = None, *, backend: str | None = None,
                    quicklook_size: int | None = None) -> L2Result:
    """Calibrate one raw LST frame to L2.

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx) [DN]
        Raw frame as read by :func:`pipelines.fitsio.read_image`.
    header : astropy.io.fits.Header
        Its repaired header (``HPLN-TAN`` WCS, ISO ``DATE-OBS``, observer keywords,
        ``EXPTIME``, channel keywords).
    calibrations : dict of str to CalibrationInput
        By kind: ``dark``, ``flat``, ``radiometric``, for SCI ``stray_light``; optional
        ``mask_geometry`` (default: the channel's nominal field of view) and ``psf``
        (recorded in the header, noted as not applied).
    options : CalibrationOptions, optional
        The calibration options (default: all defaults).
    backend : {"numpy", "cupy"}, optional
        Array backend of the arithmetic; default CuPy if ``options.device == 'gpu'``, else NumPy.
    quicklook_size : int, optional
        Also make the quicklook's block average at this size (``L2Result.quicklook``), on the
        frame's device before the product comes back to the host (the GPU worker's batch).

    Returns
    -------
    L2Result
        Host arrays. On CuPy the statistics, the uncertainty plane and the quicklook's block
        average are computed on the device (:mod:`pipelines.calibration.l2.device`), only the
        product's planes and a few scalars are copied back.

    Raises
    ------
    TypeError
        If ``options`` is not a :class:`CalibrationOptions` (a dict goes through ``as_options``).
    NotLSTFrameError
        If the header names no LST channel.
    CalibrationMissingError
        If a needed kind of calibration is not given.
    DataError
        If a calibration is for another channel or another frame size, or the frame or
        its header is unusable (no EXPTIME, no WCS, ...).
    """
    opts = _options(options)
    channel, cals = _checked_inputs(data, header, calibrations, opts)
    spec = get_channel(channel)
    xp = resolve_namespace(backend or ("cupy" if opts.device == "gpu" else "numpy"))
    rad = cals["radiometric"]
    unit = str(rad.parameters.get("RADUNIT", spec.bunit)).strip() or spec.bunit
    if unit != spec.bunit:
        raise DataError(f"radiometric calibration {rad.name!r} gives {unit!r}; {channel} products are in {spec.bunit!r}")
    coef = rad.param("RADCOEF")
    law = rad.parameters.get("RADRATE") not in (None, "", 0, 0.0)  # a time-dependent law (calibration.radiometry)
    if law:
        coef = coefficient_at(rad.parameters, header.get("DATE-OBS"))
    with device.section("detector"):
        img, dq, h, var, plane_rel = _detector_steps(data, _l2_header(header), cals, opts, xp, coef, unit)
    if law:
        h.add_history(f"convert_units: RADCOEF {rad.param('RADCOEF'):.6g} at {rad.parameters.get('RADEPOCH')} x "
                      f"exp({rad.param('RADRATE'):.5f}/yr) = {coef:.6g} at DATE-OBS")
    # the scale's own uncertainty (one number for the frame: a keyword, not in UNCERT)
    h.remove("RADUNC", ignore_missing=True, remove_all=True)
    radunc = radiometric_uncertainty_at(rad.parameters, header.get("DATE-OBS"))
    if radunc is not None:
        h["RADUNC"] = (float(f"{radunc:.4g}"), "rel. 1-sigma error of the radiometric scale")
    # the master's degradation law refuted by its own residuals (radiometry.MISMATCH_P): said on the
    # product too (only then: products of an unflagged master keep their header)
    h.remove("RADMISFL", ignore_missing=True, remove_all=True)
    mis = str(rad.parameters.get("RADMISFL") or "NONE").strip().upper()
    if mis != "NONE":
        h["RADMISFL"] = (mis, "radiometric law's shape refuted by its fit")
    _flag_stated_flat_plane(h, cals["flat"])
    tol = opts.occulter_tolerance_px if spec.is_coronagraph else opts.centre_tolerance_px
    h, _ = fit_and_apply_centre(img, h, coronagraph=spec.is_coronagraph, occulter_rsun=_occulter_rsun(cals, spec),
                                tolerance_px=tol, systematic_arcsec=EDGE_SYSTEMATIC_ARCSEC.get(channel, 0.0),
                                enabled=opts.fit_centre, occulter_offset_arcsec=_occulter_offset(cals, spec))
    with device.section("stray_light_masks_psf"):
        img, h, var, stray_sigma = _stray_light_step(img, h, cals, opts, spec, xp, var)
        dq, h = _mask_steps(img, dq, h, cals, spec, xp)
        img, h = _psf_step(img, dq, h, cals, opts)
    if opts.deconvolve_psf:
        h["UNCPSF"] = (False, "uncertainty not propagated through the PSF deconvolution")
    sigma = None
    if opts.rotate_north_up:  # data, DQ and sigma in one resampling pass (resample.rotate_north_up_full)
        if plane_rel is not None:  # moved with the data's map (same header), without the squared weights
            plane_rel = uncertainty.resample_variance(plane_rel * plane_rel, h, order=opts.interpolation_order,
                                                      method=opts.resample, correlated=True,
                                                      threads=resample.default_threads())
        own = isinstance(img, np.ndarray) and not np.may_share_memory(img, data)  # the flow's frame, not the caller's
        with device.section("resample"):
            img, dq, sigma, h = resample.rotate_north_up_full(img, dq, var, h, order=opts.interpolation_order,
                                                              method=opts.resample, overwrite_input=own)
        var = None  # in sigma now
    else:
        img = xp.astype(img, xp.float32)
        h.add_history("rotate_north_up: skipped on request (option rotate_north_up=false)")
        if plane_rel is not None:
            plane_rel = plane_rel * plane_rel
    var, sigma = _add_frame_wide_errors(xp, img, var, sigma, h, plane_rel, stray_sigma)
    del plane_rel
    _stamp_l2(h, cals, unit, channel, backend_name(xp))
    _stamp_dates(h)
    h.add_history("uncertainty: standard deviation per pixel in HDU UNCERT (Poisson, read noise, ADC, dark, flat, "
                  "stray light; resampled with squared interpolation weights: pipelines.calibration.uncertainty)")
    with device.section("uncertainty"):
        img = xp.astype(img, xp.float32, copy=False)
        dq = xp.astype(dq, xp.uint8, copy=False)
        if sigma is None:  # on the frame's device: sqrt of the variance, NaN where the data are
            sigma = xp.sqrt(xp.maximum(xp.astype(var, xp.float32, copy=False), xp.float32(0.0)))
            sigma[~xp.isfinite(img)] = xp.nan
            del var
        else:
            sigma = xp.astype(sigma, xp.float32, copy=False)
    stats = ql = None
    if backend_name(xp) != "numpy":  # statistics on the device: scalars come back
        with device.section("statistics"):
            stats = device.frame_statistics(img, dq, h, channel, backend_name(xp))
    if quicklook_size is not None:
        with device.section("quicklook_reduce"):
            ql = device.quicklook_reduce(img, dq, quicklook_size)
    with device.section("download"):
        out, dq_np, sigma = to_numpy(img), to_numpy(dq), to_numpy(sigma)
    if stats is None:  # NumPy: the compiled two-pass statistics (equal fields)
        with device.section("statistics"):
            stats = _stats(out, dq_np, h, channel, backend_name(xp))
    return L2Result(data=out, dq=dq_np, header=h, stats=stats, uncertainty=sigma, quicklook=ql)


def _checked_inputs(data: Any, header: fits.Header, calibrations: dict[str, CalibrationInput] | None,
                    opts: CalibrationOptions) -> tuple[str, dict[str, CalibrationInput]]:
    """The frame's channel and its calibrations, checked (kinds, channel, frame size)."""
    if getattr(data, "ndim", None) != 2:
        raise DataError(f"a frame must be a 2-D image, got shape {getattr(data, 'shape', None)}")
    channel = channel_from_header(header)
    if channel is None:
        raise NotLSTFrameError("the header names no LST channel (TELESCOP/INSTRUME/DETECTOR/CHANNEL)")
    cals = dict(calibrations or {})
    missing = [k for k in required_kinds(channel, opts) if k not in cals]
    if missing:
        raise CalibrationMissingError(f"no {', '.join(missing)} calibration given for this {channel} frame")
    for kind, cal in cals.items():
        if cal.channel and cal.channel != channel:
            raise DataError(f"the {kind} calibration {cal.name!r} is for {cal.channel}, the frame is {channel}")
        if kind not in ("dark", "flat", "stray_light"):
            continue  # only these hold frame-shaped planes (a PSF holds a kernel)
        for name, arr in cal.data.items():
            if name.startswith("_"):
                continue
            if tuple(arr.shape) != tuple(data.shape):
                raise DataError(f"the {kind} calibration {cal.name!r} ({name}) is {arr.shape[1]}x{arr.shape[0]}, "
                                f"the frame is {data.shape[1]}x{data.shape[0]}")
    return channel, cals


def _l2_header(header: fits.Header) -> fits.Header:
    """The raw header as the start of the L2 one: scaling and checksums dropped, the raw
    file named in ``RAWFILE``, ``DATE_OBS`` kept equal to ``DATE-OBS``."""
    h = header.copy()
    for key in ("BZERO", "BSCALE", "BLANK", "CHECKSUM", "DATASUM"):
        h.remove(key, ignore_missing=True, remove_all=True)
    if "FILENAME" in h:
        stamp_provenance(h, {"RAWFILE": str(h["FILENAME"])})
        del h["FILENAME"]
    if "DATE_OBS" in h:
        h["DATE_OBS"] = (str(h["DATE-OBS"]), "[UTC] ISO 8601")
    return h


def _detector_steps(data: Any, h: fits.Header, cals: dict[str, CalibrationInput],
                    opts: CalibrationOptions, xp: Any, coef: float, unit: str
                    ) -> tuple[Any, Any, fits.Header, Any, Any | None]:
    """Invalid and bad pixels, dark (by exposure and temperature), cosmic rays, flat, DN/s,
    physical units; and the variance of the result [unit**2] (:mod:`pipelines.calibration.l2.uncertainty`).

    Returns ``(img, dq, h, var, plane_rel)``: ``plane_rel`` the flat's stated plane's relative
    1-sigma on the detector grid (float32, :func:`_stated_plane_error`) or None. It is *not* in
    ``var``: a frame-wide smooth error, the caller adds ``(value x plane_rel)**2`` on the output
    grid, after the resampling (whose squared weights are for pixel-independent errors).

    Without cosmic-ray cleaning (the default) on NumPy, the dark, flat, exposure and units
    run fused in one pass (:func:`pipelines.calibration.l2.steps.correct_detector_signal`), and
    so does their variance (:func:`pipelines.calibration.l2.uncertainty.detector_variance`);
    HISTORY has the same lines (the skipped cosmic-ray step's comes first). Otherwise the
    steps run one by one (cosmic rays are found on the dark-subtracted frame in DN).
    """
    # float32 arithmetic: raw DN (<= 65535) are exact, masters are stored as float32, and the
    # relative rounding (6e-8) is far below what the calibration can resolve
    raw = to_device(data, xp, dtype=xp.float32)
    dq, h = steps.flag_invalid_pixels(raw, None, h, saturation_dn=float(opts.saturation_dn))
    dark = cals["dark"]
    if opts.flag_bad_pixels:
        dq, h = steps.flag_bad_pixels(dq, h, to_device(bad_pixel_map(dark), xp), source=dark.name)
    else:
        dq, h = steps.flag_bad_pixels(dq, h, None)
    tref, tdbl = dark.parameters.get("DARKTREF"), dark.parameters.get("DARKTDBL")
    tref = float(tref) if tref not in (None, "") else None
    tdbl = float(tdbl) if tdbl not in (None, "") else None
    tcurve = steps.dark_curve_from_header(dark.parameters)  # measured curve, else the doubling law
    bias = to_device(dark.data["bias"], xp, xp.float32)
    dark_rate = to_device(dark.data["dark_rate"], xp, xp.float32)
    gain, read_noise, noise_src = uncertainty.detector_noise(h, dark.parameters)
    flat_cal = cals["flat"]
    flat = to_device(flat_cal.data["flat"], xp, xp.float32)
    flat_err = to_device(flat_cal.data["flaterr"], xp, xp.float32) if "flaterr" in flat_cal.data else None
    # the stated plane's per-pixel relative error: returned, added by the caller on the output grid
    # (a frame-wide error, not resampled as pixel noise)
    plane_err = _stated_plane_error(flat_cal, h)
    if plane_err is not None:
        plane_err = to_device(plane_err, xp, xp.float32)
    diff_err = _stated_diffuser_error(flat_cal, h)
    _copy_roll_tilt(flat_cal, h)
    if diff_err is not None:  # the stated diffuser non-uniformity (SCI), in quadrature with FLATERR [flat units]
        de = xp.asarray(diff_err, dtype=xp.float32) * flat
        flat_err = de if flat_err is None else xp.sqrt(flat_err * flat_err + de * de)
        del de
    dark_err = "biaserr" in dark.data or "darkerr" in dark.data
    if not opts.remove_cosmic_rays and backend_name(xp) == "numpy":
        _img, dq, h = steps.clean_cosmic_rays(raw, dq, h, enabled=False)
        img, h = steps.correct_detector_signal(raw, h, bias, dark_rate, flat, coef, unit,
                                               reference_temperature_c=tref, doubling_temperature_c=tdbl,
                                               temperature_curve=tcurve)
        t = exposure_seconds(h)
        planes = {k: to_device(dark.data[k], xp, xp.float32) for k in ("biaserr", "darkerr") if k in dark.data}
        var = uncertainty.detector_variance(raw, bias, gain, read_noise, planes, t * float(h.get("DARKTFAC", 1.0)),
                                            flat, flat_err, dark_rate, t, coef)
        del raw, bias, dark_rate, flat, flat_err, planes
    else:
        var = uncertainty.raw_variance(raw, bias, gain, read_noise)
        img, h = steps.subtract_dark(raw, h, bias, dark_rate, reference_temperature_c=tref,
                                     doubling_temperature_c=tdbl, temperature_curve=tcurve)
        del raw, bias
        t = exposure_seconds(h)
        var, dark_err = uncertainty.dark_variance(var, dark.data, t * float(h.get("DARKTFAC", 1.0)), xp)
        img, dq, h = steps.clean_cosmic_rays(img, dq, h, enabled=opts.remove_cosmic_rays,
                                             gain=float(h.get("GAIN", dark.parameters.get("GAIN", 1.0)) or 1.0))
        img, h = steps.correct_flat(img, h, flat)
        var = uncertainty.flat_variance(var, img, flat, flat_err)
        del flat, flat_err
        img, h = steps.normalize_exposure(img, h)
        var = var / xp.asarray(t * t, dtype=var.dtype)
        img, h = steps.convert_units(img, h, coef, unit)
        var = var * xp.asarray(coef * coef, dtype=var.dtype)
    h["UNCGAIN"] = (gain, f"[e/DN] Poisson gain ({noise_src})")
    h["UNCRDN"] = (read_noise, f"[DN] read noise ({noise_src})")
    h.add_history(f"uncertainty: Poisson (gain {gain:g} e/DN, {noise_src}), read noise {read_noise:g} DN, ADC 1/12 DN2; "
                  f"dark master {'error planes' if dark_err else 'states no uncertainty'}; flat master "
                  f"{'FLATERR plane' if 'flaterr' in flat_cal.data else 'states no uncertainty'}"
                  f"{'; stated flat plane (FLATPLSG) on the output grid' if plane_err is not None else ''}"
                  f"{'; stated diffuser non-uniformity (FLATDFSG) in quadrature' if diff_err is not None else ''}")
    return img, dq, h, var, plane_err


def _stray_representation(stray_cal: CalibrationInput, source: str, xp: Any) -> tuple[Any, str]:
    """The representation of a stray-light master chosen by ``CalibrationOptions.stray_light_source``.

    Returns the model for :func:`pipelines.calibration.l2.steps.subtract_stray_light` and a
    phrase for HISTORY. Raises :class:`~pipelines.errors.DataError` when the master lacks it.
    """
    stray_type = str(stray_cal.parameters.get("STRAYTYP", "")).strip().upper()
    has_profile = "_profile" in stray_cal.data
    has_map = "straymap" in stray_cal.data
    if source == "auto":
        source = "profile" if stray_type == "PROFILE" and has_profile else ("map" if has_map else "law")
        how = f"STRAYTYP={stray_type or 'none'} chose the {source}"
    else:
        how = "requested"
    if source == "profile":
        if not has_profile:
            raise DataError(f"stray_light_source=profile: master {stray_cal.name!r} has no PROFILE table")
        prof_r, prof = to_numpy(stray_cal.data["_profile_r"]), to_numpy(stray_cal.data["_profile"])
        ok = np.isfinite(prof)
        if ok.sum() < 2:
            raise DataError(f"stray_light_source=profile: master {stray_cal.name!r} has fewer than 2 finite radii")
        return (steps.StrayLightProfile(tuple(prof_r[ok].tolist()), tuple(prof[ok].tolist())),
                f"measured radial profile of {stray_cal.name} ({how})")
    if source == "map":
        if not has_map:
            raise DataError(f"stray_light_source=map: master {stray_cal.name!r} has no stray-light map plane")
        return to_device(stray_cal.data["straymap"], xp, xp.float32), f"measured map of {stray_cal.name} ({how})"
    try:
        model = _stray_model(stray_cal)
    except (KeyError, TypeError, ValueError, DataError) as exc:
        raise DataError(f"stray_light_source=law: master {stray_cal.name!r} has no power-law keywords "
                        f"(STRAYB0, STRAYR0, STRAYIDX): {exc}") from None
    return model, f"power law of {stray_cal.name} ({how})"


def _stray_light_step(img: Any, h: fits.Header, cals: dict[str, CalibrationInput], opts: CalibrationOptions,
                      spec: Any, xp: Any, var: Any) -> tuple[Any, fits.Header, Any, Any]:
    """SCI stray light: a measured radial profile, a measured map or the power-law model;
    the variance gets the model's stated uncertainty (``STRAYUNC`` or a ``STRAYERR`` plane).

    Returns ``(img, h, var, sigma_profile)``: ``sigma_profile`` the master's stated 1-sigma
    profile (:class:`~pipelines.calibration.l2.steps.StrayLightProfile` [MSB], its ``PROFILE``
    ``SIGMA`` column) when the profile is subtracted, else None; the caller adds it to the
    variance on the output grid (a frame-wide error, not shrunk by the resampling)."""
    if spec.is_coronagraph and not opts.subtract_stray_light:
        h.add_history("subtract_stray_light: skipped on request (option subtract_stray_light=false)")
        return img, h, var, None
    stray_cal = cals.get("stray_light") if spec.is_coronagraph else None
    model = None
    if stray_cal is not None:
        model, what = _stray_representation(stray_cal, opts.stray_light_source, xp)
        h.add_history(f"stray_light_source={opts.stray_light_source}: {what}")
    img, h = steps.subtract_stray_light(img, h, model, source=stray_cal.name if stray_cal is not None else "")
    if spec.is_coronagraph and stray_cal is not None:
        frac = stray_cal.parameters.get("STRAYUNC")
        sig_prof = None
        if isinstance(model, steps.StrayLightProfile) and "_profile_sigma" in stray_cal.data:
            r_p, s_p = to_numpy(stray_cal.data["_profile_r"]), to_numpy(stray_cal.data["_profile_sigma"])
            ok = np.isfinite(s_p) & np.isfinite(to_numpy(stray_cal.data["_profile"]))
            if ok.sum() >= 2:
                sig_prof = steps.StrayLightProfile(tuple(r_p[ok].tolist()), tuple(s_p[ok].tolist()))
        if sig_prof is None:
            var, why = uncertainty.stray_light_variance(var, h, model, float(frac) if frac not in (None, "") else None,
                                                        stray_cal.data.get("strayerr"))
            h.add_history(f"uncertainty: {why}")
        if sig_prof is not None:  # the stated stray-light 1-sigma, in UNCERT and in two keywords
            h["STRYUNC"] = (float(sig_prof.brightness(1.1)), "[MSB] stray-light 1-sigma at 1.1 Rsun")
            h["STRYUN25"] = (float(sig_prof.brightness(2.5)), "[MSB] stray-light 1-sigma at 2.5 Rsun")
            if "STRYINFL" in stray_cal.parameters:  # the part of STRYUNC that is the structure's influence
                h["STRYINFL"] = (float(stray_cal.parameters["STRYINFL"]), "[MSB] stray 1-sigma from structure, 1.1 Rsun")
        if "STRYCHI2" in stray_cal.parameters:
            h["STRYCHI2"] = (float(stray_cal.parameters["STRYCHI2"]), "reduced chi2 of the stray-light fit")
        if "STRYRUNZ" in stray_cal.parameters:
            h["STRYRUNZ"] = (float(stray_cal.parameters["STRYRUNZ"]), "runs statistic of the stray fit residuals")
            h["STRYSTRC"] = (bool(stray_cal.parameters.get("STRYSTRC", False)),
                             "stray fit residuals structured: 1-sigma widened")
        if bool(stray_cal.parameters.get("STRYREFU", False)):  # never silently: the product says so
            why = str(stray_cal.parameters.get("STRYWHY", "") or "stray-light fit refused")
            flag_frame(h, FrameQuality.STRAY_LIGHT_REFUSED, f"{why} ({stray_cal.name})")
        return img, h, var, sig_prof
    return img, h, var, None


def _occulter_offset(cals: dict, spec) -> tuple[float, float, float] | None:
    """SCI: the measured occulter-to-Sun offset (``OCCOFF1/2``, ``OCCOFERR`` [arcsec]) of the stray-light
    or mask-geometry master (:mod:`pipelines.calibration.masters.occulter`), else ``None``."""
    from pipelines.calibration.masters.occulter import offset_from_parameters

    if not spec.is_coronagraph:
        return None
    for kind in ("stray_light", "mask_geometry"):
        cal = cals.get(kind)
        off = offset_from_parameters(cal.parameters) if cal is not None else None
        if off is not None:
            return off
    return None


def _occulter_rsun(cals: dict[str, CalibrationInput], spec: Any) -> float | None:
    """SCI occulter radius [Rsun]: ``OCCRAD`` of the mask geometry, else the channel's."""
    if not spec.is_coronagraph:
        return None
    occ = cals["mask_geometry"].parameters.get("OCCRAD") if "mask_geometry" in cals else None
    return float(occ) if occ not in (None, "") else float(spec.fov_rsun_min)


def _mask_steps(img: Any, dq: Any, h: fits.Header, cals: dict[str, CalibrationInput], spec: Any,
                xp: Any) -> tuple[Any, fits.Header]:
    """Non-finite pixels, the occulter (SCI) and the field stop, from ``mask_geometry`` or
    the channel's nominal field of view."""
    if "mask_geometry" in cals:
        geo = cals["mask_geometry"].parameters
    else:
        geo = {"OCCRAD": spec.fov_rsun_min, "FOVRAD": spec.fov_rsun_max}
        h.add_history(f"calibrate_frame: no mask_geometry calibration; nominal {spec.code} field of view used "
                      f"(occulter {spec.fov_rsun_min} Rsun, outer {spec.fov_rsun_max} Rsun)")
    occ = geo.get("OCCRAD")
    occ = float(occ) if occ not in (None, "") else None
    fov = geo.get("FOVRAD", spec.fov_rsun_max)
    if isinstance(img, np.ndarray) and isinstance(dq, np.ndarray):  # in place on our own DQ: one pass, no temporaries
        bad = ~np.isfinite(img)
        if bad.any():
            np.bitwise_or(dq, np.uint8(int(DQ.NOT_FINITE)), out=dq, where=bad)
        del bad
    else:
        dq = xp.where(xp.isfinite(img), dq, dq | xp.asarray(int(DQ.NOT_FINITE), dtype=xp.uint8))
    dq, h = steps.mask_occulter(dq, h, occ if spec.is_coronagraph else None)
    return steps.mask_field_of_view(dq, h, float(fov) if fov not in (None, "") else None)


def _psf_step(img: Any, dq: Any, h: fits.Header, cals: dict[str, CalibrationInput],
              opts: CalibrationOptions) -> tuple[Any, fits.Header]:
    """SDI Richardson-Lucy deconvolution on request; a PSF file given but not applied is said so."""
    if opts.deconvolve_psf:
        psf_cal = cals["psf"]
        kernel = psf_cal.data.get("primary", psf_cal.data.get("psf"))
        if kernel is None:
            raise DataError(f"PSF calibration {psf_cal.name!r} holds no kernel")
        return steps.deconvolve_psf(img, dq, h, kernel, n_iter=opts.psf_iterations, source=psf_cal.name)
    img, h = steps.deconvolve_psf(img, dq, h, None)
    if "psf" in cals:
        h.add_history(f"deconvolve_psf: not applied (option deconvolve_psf=false); PSF file {cals['psf'].name} "
                      "recorded")
    return img, h


def _stamp_dates(h: fits.Header) -> None:
    """``DATE-BEG``, ``DATE-AVG``, ``DATE-END``, ``TIMESYS`` (and ``XPOSURE``) from ``DATE-OBS`` and the exposure.

    ``DATE-OBS`` is the start of the exposure (FITS 4.0 sect. 9.1.1; LST writes it so), the
    end is ``DATE-OBS`` + the exposure (:func:`pipelines.fitsio.exposure_seconds`), the mean
    their midpoint (what sunpy's ``Map.date_start``, ``date_end`` and ``date_average`` read).
    They describe the observation, not the making of the product, so they are stamped here
    and are not rows of :data:`pipelines.provenance.L2_PROVENANCE`. A date is never written
    empty: no valid ``DATE-OBS`` refuses the frame.
    """
    from astropy import units as u
    from astropy.time import Time

    raw = h.get("DATE-OBS")
    try:
        if raw is None or str(raw).strip() == "":
            raise ValueError("empty")
        start = Time(str(raw).strip(), format="isot", scale="utc")
    except ValueError:
        raise DataError(f"the frame has no valid ISO DATE-OBS ({raw!r}); read it with pipelines.fitsio.read_image") from None
    t = exposure_seconds(h)
    end = start + t * u.s
    mid = start + (t / 2.0) * u.s
    h.set("TIMESYS", "UTC", "time scale of the DATE-* keywords", after="DATE-OBS")
    h.set("DATE-BEG", start.isot, "[UTC] start of the exposure (DATE-OBS)", after="TIMESYS")
    h.set("DATE-AVG", mid.isot, "[UTC] middle of the exposure", after="DATE-BEG")
    h.set("DATE-END", end.isot, "[UTC] end of the exposure", after="DATE-AVG")
    h["DATE-OBS"] = (start.isot, "[UTC] start of the exposure")
    if "XPOSURE" not in h:  # the FITS 4.0 keyword, whichever the raw frame gave (sunpy's exposure_time)
        h.set("XPOSURE", t, "[s] exposure time", after="DATE-END")


def _stamp_l2(h: fits.Header, cals: dict[str, CalibrationInput], unit: str, channel: str, backend: str) -> None:
    """Calibration files, solar radius keywords, level, unit, channel and backend."""
    for cal in cals.values():
        if cal.kind in CAL_KEYWORDS:
            stamp_provenance(h, calibration_values(cal.kind, cal.name, cal.version, cal.id, cal.sha256))
    if "RSUN_REF" not in h:
        h["RSUN_REF"] = (RSUN_REF_M, "[m] solar radius (IAU 2015 nominal)")
    if "RSUN_OBS" not in h:
        h["RSUN_OBS"] = (apparent_rsun_arcsec(h), "[arcsec] apparent photospheric radius")
    stamp_provenance(h, {"LEVEL": "L2", "BUNIT": unit, "CHANNEL": channel, "BACKEND": backend})
    stamp_units(h, channel)  # BUNIT readable by astropy's strict FITS parser; SCI: MSBVALUE (pipelines.units)
    stamp_quality(h, frame_quality(h))  # QUALITY on every product, 0 when no frame-wide systematic was flagged


#: Flat-master keyword: where the flat's large-scale plane (gain gradient) comes from,
#: ``MEASURED`` or ``STATED`` (a prior, e.g. a symmetric disk); ``FLATPLWY`` may say why.
FLAT_PLANE_SOURCE_KEY = "FLATPLSR"


def _stated_plane_error(flat: CalibrationInput, h: fits.Header) -> np.ndarray | None:
    """The stated flat plane's per-pixel 1-sigma [fraction of the flat] on the detector grid, or ``None``.

    A flat master that states its plane (``FLATPLSR = 'STATED'`` with ``FLATPLSG``, the 1-sigma
    gain change across the frame width per axis [1], about the pivot ``FLATPLY0``/``FLATPLX0``
    [1-based pixel]; :func:`pipelines.calibration.masters.flatfield.derive_flat_master`) gives
    ``FLATPLSG / nx * hypot(y - y0, x - x0)``
    (:func:`pipelines.calibration.masters.subpixel_flat.plane_sigma_map`); ``FLATPLSG`` is
    copied to the L2 header. The error is one plane for the whole frame (fully correlated
    between pixels), carried per pixel in ``UNCERT`` so that a pixel's total error is there;
    :func:`calibrate_frame` adds it on the output grid, after the resampling (moved with the
    data, without the squared interpolation weights of pixel noise).
    """
    from pipelines.calibration.masters.subpixel_flat import plane_sigma_map

    p = flat.parameters
    if str(p.get(FLAT_PLANE_SOURCE_KEY, "") or "").strip().upper() != "STATED" or p.get("FLATPLSG") in (None, ""):
        return None
    sig = float(p["FLATPLSG"])
    shape = np.shape(flat.data["flat"])
    pivot = (float(p.get("FLATPLY0", (shape[0] + 1) / 2.0)) - 1.0, float(p.get("FLATPLX0", (shape[1] + 1) / 2.0)) - 1.0)
    h["FLATPLSG"] = (sig, "[1] flat plane 1-sigma across frame (in UNCERT)")
    return plane_sigma_map(shape, sig, pivot)


def _stated_diffuser_error(flat: CalibrationInput, h: fits.Header) -> float | None:
    """The stated diffuser non-uniformity's per-pixel 1-sigma [fraction of the flat], or ``None``.

    A diffuser flat master (SCI) states with ``FLATDFSG`` the large-scale illumination of the
    diffuser that diffuser frames cannot separate from the flat
    (:mod:`pipelines.calibration.masters.diffuser_flat`); it is copied to the L2 header and
    added, times the flat, in quadrature to ``FLATERR`` (the tilt a roll sequence took out of the
    flat is copied by :func:`_copy_roll_tilt`). Raises
    :class:`~pipelines.errors.DataError` for a negative or non-finite value.
    """
    from pipelines.calibration.masters.diffuser_flat import DIFFUSER_SIGMA_KEY

    raw = flat.parameters.get(DIFFUSER_SIGMA_KEY)
    if raw in (None, ""):
        return None
    try:
        sig = float(raw)
    except (TypeError, ValueError):
        raise DataError(f"flat master {flat.name}: {DIFFUSER_SIGMA_KEY}={raw!r} is not a number") from None
    if not np.isfinite(sig) or sig < 0.0:
        raise DataError(f"flat master {flat.name}: {DIFFUSER_SIGMA_KEY}={raw!r} must be a finite fraction >= 0")
    h[DIFFUSER_SIGMA_KEY] = (sig, "[1] diffuser non-uniformity 1-sigma (in UNCERT)")
    return sig


def _copy_roll_tilt(flat: CalibrationInput, h: fits.Header) -> None:
    """Copy the tilt a roll sequence took out of the flat (``FLATTLT1/2`` and the rest of
    :data:`~pipelines.calibration.masters.diffuser_flat.ROLL_TILT_KEYWORDS`) to the product.
    Raises :class:`~pipelines.errors.DataError` for a numeric keyword that is not a finite number."""
    from pipelines.calibration.masters.diffuser_flat import ROLL_TILT_KEYWORDS

    for key, comment in ROLL_TILT_KEYWORDS.items():
        raw = flat.parameters.get(key)
        if raw in (None, ""):
            continue
        if key == "FLATTLSR":
            h[key] = (str(raw), comment)
            continue
        try:
            val = float(raw)
        except (TypeError, ValueError):
            val = float("nan")
        if not np.isfinite(val):
            raise DataError(f"flat master {flat.name}: {key}={raw!r} is not a finite number")
        h[key] = (val, comment)


def _flag_stated_flat_plane(h: fits.Header, flat: CalibrationInput) -> None:
    """Flag the frame ``FLAT_PLANE_STATED`` when the flat master says its plane is stated, not measured."""
    src = str(flat.parameters.get(FLAT_PLANE_SOURCE_KEY, "") or "").strip().upper()
    if src == "STATED":
        why = str(flat.parameters.get("FLATPLWY", "") or "").strip() or "plane from a prior"
        flag_frame(h, FrameQuality.FLAT_PLANE_STATED, f"{why} ({flat.name})")
