"""SCI stray light measured from the data: a time-minimum background of a sequence.

LST.md gives SCI's stray light at two radii (on-orbit tests); the default stray-light
master is the power law through them (:class:`pipelines.calibration.l2.steps.StrayLightModel`).
It must be replaceable by a *measured* map, because in SCI-WL the stray light exceeds the
corona near 2.5 Rsun and its subtraction decides the science. This module measures one
and writes it as a new stray-light master version.

Method (:func:`measure_stray_light_map`), as coronagraph pipelines build their
"minimum backgrounds" (LASCO: Morrill et al. 2006, Sol. Phys. 233, 331; STEREO/COR:
Howard et al. 2008, Space Sci. Rev. 136, 67):

1. Calibrate a sequence of SCI frames up to MSB *without* stray-light subtraction and
   *without* the north-up resampling (stray light is fixed to the instrument: occulter,
   field stop and optics; it is measured and subtracted on the detector grid).
2. Per pixel, a low percentile over time (``percentile=0``: the minimum). Transient and
   moving coronal structure (CMEs, streamers that rotate over days) is removed; what
   remains is stray light + the steady corona (K and F) + a noise bias.
3. Subtract a model of the steady corona (``corona``, a function of r in Rsun returning
   MSB, e.g. Baumbach's K + F corona scaled to the channel, or ``None``).
4. Optionally (``azimuthal='median'``, default) replace the map by its azimuthal median
   in thin annuli about the Sun centre: stray light from a circular occulter is close to
   radially symmetric, structured corona is not, and the median rejects streamers that a
   minimum over a short sequence cannot. The master then carries the radial profile and
   the flow evaluates it about each frame's disk centre (``STRAYTYP='PROFILE'``). ``azimuthal=None`` keeps every pixel (for
   non-radial stray light, e.g. from a pylon or a ghost).

Limits, to state with every map made this way:

* The steady corona cannot be told from stray light by a background of the data alone:
  any error of the coronal model goes one for one into the map and is subtracted from
  every frame calibrated with it. Where the corona is faint compared with the stray
  light (SCI-WL near 2.5 Rsun: corona ~1 % of stray light) the error is small; near
  1.1 Rsun (corona ~30 % of the WL stray light) a 3 % coronal-model error is a 1 %
  stray-light error.
* A sequence shorter than the life of coronal structures (days) leaves streamers in a
  per-pixel minimum; the azimuthal median removes them only where they cover less than
  half of an annulus.
* With noise, the minimum of N frames is biased low by about ``sigma * E[min of N
  normals]`` (-1.16 sigma for N = 5); a static scene is better served by
  ``percentile=50``, a real sequence with CMEs by a low percentile over many frames.
* A per-pixel minimum over frames whose pointing jitters picks, at every pixel, the
  frame where the steep radial fall-off is farthest out: the background is biased low by
  about ``1.2 * jitter * |dB/dr|`` (0.15 px of jitter at 50 px per Rsun: ~1 % of the stray
  light at 1.1 Rsun, 4-8 times less at full size). A median over time has no such bias
  for a static scene.
* Stray light that changes with time (pointing, contamination) needs a map per period:
  the master carries a validity interval like every calibration file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.calibration.l2.steps import StrayLightModel
from pipelines.sun import radius_map, sun_geometry

__all__ = ["StrayLightMeasurement", "measure_stray_light_map", "stray_light_map_hdul", "radial_profile"]


@dataclass
class StrayLightMeasurement:
    """Outcome of :func:`measure_stray_light_map`.

    Attributes
    ----------
    map : numpy.ndarray, shape (ny, nx), float32 [MSB]
        Stray light on the detector grid; NaN where not measured (outside ``r_range``).
    radii : numpy.ndarray, shape (m,) [Rsun]
        Annulus centres of the radial profile.
    profile : numpy.ndarray, shape (m,) [MSB]
        Azimuthal median of the background minus the coronal model in each annulus.
    power_law : StrayLightModel or None
        Least-squares power law through the profile (log-log), for comparison with the
        default master; ``None`` if the profile has fewer than 3 positive points.
    n_frames : int
    radial : bool
        True if ``map`` is the radial profile on the grid (``azimuthal='median'``): the
        master is then applied as a profile about each frame's disk centre.
    method : str
        One line for ``CALDESC``/HISTORY.
    notes : list of str
    sigma : numpy.ndarray, shape (m,) [MSB], optional
        Stated 1-sigma of ``profile`` (written as the ``PROFILE`` table's ``SIGMA`` column; the
        calibration flow adds it to ``UNCERT`` in quadrature).
    chi2_red : float, optional
        Reduced chi-square of the fit that made ``profile`` (``STRYCHI2``).
    residual : (r, resid, sigma) of numpy.ndarray, optional
        The fit's residual profile: radii [Rsun], profile minus model [MSB] and the profile's
        1-sigma [MSB] (extension ``RESIDUAL``).
    fit_model : str
        The adopted model in words (``STRYMODL``).
    refused : str
        Why the fit was refused ('' if it was not; ``STRYREFU``/``STRYWHY``).
    runs_z : float, optional
        Wald-Wolfowitz runs statistic of the fit's residual signs (``STRYRUNZ``; strongly negative:
        the residuals are structured, the profile has a shape the models lack).
    structured : bool
        The fit's residuals were called structured and its stated 1-sigma widened (``STRYSTRC``).
    influence : float, optional
        [MSB] The part of the stated 1-sigma at 1.1 Rsun that is the structure's influence (the
        adopted law re-fitted without the residuals' most significant run; ``STRYINFL``); None when
        none was stated.
    """

    map: np.ndarray
    radii: np.ndarray
    profile: np.ndarray
    power_law: StrayLightModel | None
    n_frames: int
    radial: bool
    method: str
    notes: list[str] = field(default_factory=list)
    sigma: np.ndarray | None = None
    chi2_red: float | None = None
    residual: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    fit_model: str = ""
    refused: str = ""
    runs_z: float | None = None
    structured: bool = False
    influence: float | None = None


def radial_profile(image: np.ndarray, r: np.ndarray, edges: np.ndarray, *, statistic: str = "median",
                   valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Azimuthal statistic of ``image`` in annuli.

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
    r : numpy.ndarray, shape (ny, nx) [Rsun]
        Heliocentric distance of each pixel.
    edges : numpy.ndarray, shape (m + 1,) [Rsun]
        Annulus edges, increasing.
    statistic : {'median', 'mean'}
    valid : numpy.ndarray of bool, shape (ny, nx), optional
        Pixels to use (default: the finite ones).

    Returns
    -------
    centres : numpy.ndarray, shape (m,) [Rsun]
    values : numpy.ndarray, shape (m,)
        NaN in an annulus without valid pixels.
    """
    ok = np.isfinite(image) if valid is None else (valid & np.isfinite(image))
    rr, vv = r[ok].ravel(), image[ok].ravel()
    order = np.argsort(rr, kind="stable")
    rr, vv = rr[order], vv[order]
    cuts = np.searchsorted(rr, edges)
    out = np.full(len(edges) - 1, np.nan)
    for i in range(len(edges) - 1):
        seg = vv[cuts[i]:cuts[i + 1]]
        if seg.size:
            out[i] = float(np.median(seg) if statistic == "median" else np.mean(seg))
    return 0.5 * (edges[:-1] + edges[1:]), out


def _fit_power_law(radii: np.ndarray, profile: np.ndarray) -> StrayLightModel | None:
    ok = np.isfinite(profile) & (profile > 0)
    if ok.sum() < 3:
        return None
    slope, icpt = np.polyfit(np.log(radii[ok]), np.log(profile[ok]), 1)
    r_ref = 1.1
    return StrayLightModel(b_ref=float(np.exp(icpt + slope * np.log(r_ref))), r_ref=r_ref, index=float(-slope),
                           r_min=1.0, r_max=3.0)


def measure_stray_light_map(frames_in_msb: Sequence[np.ndarray], header: fits.Header, *,
                            corona: Callable[[np.ndarray], np.ndarray] | None = None, percentile: float = 0.0,
                            azimuthal: str | None = "median", r_range: tuple[float, float] = (1.05, 2.6),
                            dr: float = 0.01, valid: np.ndarray | None = None) -> StrayLightMeasurement:
    """Measure a stray-light map from a sequence of SCI frames (time-minimum background).

    Parameters
    ----------
    frames_in_msb : sequence of N numpy.ndarray, each shape (ny, nx) [MSB]
        SCI frames calibrated to MSB on the detector grid, without stray-light subtraction
        and without north-up rotation (``calibrate_frame(..., CalibrationOptions(subtract_stray_light=False,
        rotate_north_up=False))``). N >= 1; several days of frames are best
        (module notes).
    header : astropy.io.fits.Header
        WCS and observer keywords of one frame of the sequence (the Sun centre and radius
        on the detector; the jitter between frames, ~0.2 px, is far below the scale of the
        stray light's variation).
    corona : callable, optional
        Steady-corona model ``B(r)`` [MSB] for r [Rsun] (array), subtracted from the
        background; ``None`` subtracts nothing (the map then holds the steady corona too).
    percentile : float
        Per-pixel percentile over time, 0 (minimum) to 100.
    azimuthal : {'median', None}
        ``'median'``: the map is the azimuthal median profile in annuli of width ``dr``,
        interpolated in r. ``None``: the per-pixel background minus the corona model.
    r_range : (float, float) [Rsun]
        Radii measured; NaN outside (the occulter and field stop hide the rest).
    dr : float [Rsun]
        Annulus width of the radial profile.
    valid : numpy.ndarray of bool, shape (ny, nx), optional
        Pixels to use (e.g. DQ == 0 of the frames); default: finite background.

    Returns
    -------
    StrayLightMeasurement

    Raises
    ------
    ValueError
        No frame, frames of different shapes, or a percentile outside [0, 100].
    """
    frames = [np.asarray(f, dtype=np.float32) for f in frames_in_msb]
    if not frames:
        raise ValueError("no frame to measure stray light from")
    shape = frames[0].shape
    if any(f.shape != shape for f in frames) or len(shape) != 2:
        raise ValueError("all frames must be 2-D images of one shape")
    if not 0.0 <= float(percentile) <= 100.0:
        raise ValueError(f"percentile must lie in [0, 100], got {percentile}")
    stack = np.stack(frames)
    if percentile == 0.0:
        background = np.nanmin(stack, axis=0)
    else:
        background = np.nanpercentile(stack, float(percentile), axis=0).astype(np.float32)
    del stack
    geom = sun_geometry(header)
    r = radius_map(shape, geom)
    model = corona(r) if corona is not None else 0.0
    residual = (background.astype(np.float64) - model)
    inside = (r >= r_range[0]) & (r <= r_range[1])
    use = inside & np.isfinite(residual) & (valid if valid is not None else True)
    edges = np.arange(r_range[0], r_range[1] + dr / 2, dr)
    radii, prof = radial_profile(residual, r, edges, statistic="median", valid=use)
    if azimuthal == "median":
        ok = np.isfinite(prof)
        m = np.interp(r, radii[ok], prof[ok]).astype(np.float32)
        how = "azimuthal median"
    elif azimuthal is None:
        m = residual.astype(np.float32)
        how = "per pixel"
    else:
        raise ValueError(f"azimuthal must be 'median' or None, got {azimuthal!r}")
    m[~inside] = np.nan
    stat = "minimum" if percentile == 0.0 else f"{percentile:g}th percentile"
    method = (f"time {stat} of {len(frames)} frames" + (" minus a coronal model" if corona is not None else "")
              + f", {how}")
    notes = ["the steady corona is indistinguishable from stray light in a background: the coronal model's error "
             "enters the map one for one"]
    if corona is None:
        notes.append("no coronal model subtracted: the map includes the steady corona")
    return StrayLightMeasurement(map=m, radii=radii, profile=prof, power_law=_fit_power_law(radii, prof),
                                 n_frames=len(frames), radial=azimuthal == "median", method=method, notes=notes)


def stray_light_map_hdul(measurement: StrayLightMeasurement, channel: str, version: int, valid_from: Any,
                         valid_to: Any = None, *, fill_value: float = 0.0) -> fits.HDUList:
    """A stray-light master holding a measured map (the form the calibration flow reads).

    Parameters
    ----------
    measurement : StrayLightMeasurement
    channel : str
        ``SCI-UV`` or ``SCI-WL``.
    version : int
        ``CALVER`` (a new version of the channel's stray-light calibration).
    valid_from, valid_to : str, datetime.datetime or astropy.time.Time
        Validity interval; ``valid_to=None`` leaves it open.
    fill_value : float [MSB]
        Map value where nothing was measured (behind the occulter, beyond the field stop:
        those pixels are masked in the DQ anyway).

    Returns
    -------
    astropy.io.fits.HDUList
        Primary HDU ``STRAYMAP`` (float32, MSB, detector grid) with ``CALKIND='stray_light'``,
        ``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``FRMNAXIS``, ``STRAYTYP``
        (``'PROFILE'`` for an azimuthal-median measurement: the flow evaluates the
        ``PROFILE`` table about each frame's disk centre, as it does the power law, so the
        pointing jitter between frames does not move it; ``'MAP'``: the flow subtracts the
        image pixel for pixel),
        ``STRAYNFR``, ``STRAYB11``/``STRAYB25`` and the power-law fit (``STRAYB0``,
        ``STRAYR0``, ``STRAYIDX``; informative); extension ``PROFILE`` (the radial profile,
        columns ``R`` [Rsun], ``STRAY`` [MSB] and, when the measurement states one, ``SIGMA``
        [MSB]: the 1-sigma the flow adds to ``UNCERT``). A fitted measurement (issue 27) also
        records its fit: ``STRYCHI2`` (reduced chi-square of the adopted fit on the profile's
        own 1-sigma), ``STRYMODL`` (the adopted model), ``STRYREFU`` (True: the fit was refused
        and the law is the fallback; the flow then sets the product's ``QUALITY`` bit 4 and
        ``STRYFAIL``), ``STRYWHY`` (why), ``STRYRUNZ`` (the runs statistic of the residual signs),
        ``STRYSTRC`` (True: the residuals are structured and the stated 1-sigma was widened),
        ``STRYINFL`` (the part of the 1-sigma at 1.1 Rsun that is the structure's influence), and
        extension ``RESIDUAL`` (the residual profile:
        ``R`` [Rsun], ``RESID`` = profile minus model [MSB], ``SIGMA`` the profile's 1-sigma [MSB]).
        Write it with :func:`pipelines.fitsio.write_fits_atomic`; ingest registers it.
    """
    from pipelines.calibration.masters.psf import calibration_header

    m = np.where(np.isfinite(measurement.map), measurement.map, fill_value).astype(np.float32)
    h = calibration_header("stray_light", channel, version, valid_from, valid_to,
                           f"measured stray-light map, {measurement.n_frames} frames", m.shape[0])
    h.add_history(f"measure_stray_light_map: {measurement.method}")
    h["EXTNAME"] = "STRAYMAP"
    h["BUNIT"] = "MSB"
    if measurement.radial:
        h["STRAYTYP"] = ("PROFILE", "radial profile (PROFILE table) about the disk")
    else:
        h["STRAYTYP"] = ("MAP", "per-pixel map on the detector grid")
    h["STRAYNFR"] = (int(measurement.n_frames), "frames in the background")
    h["STRAYUNT"] = ("MSB", "unit")
    for r0, key in ((1.1, "STRAYB11"), (2.5, "STRAYB25")):
        v = float(np.interp(r0, measurement.radii, np.nan_to_num(measurement.profile, nan=0.0)))
        h[key] = (v, f"[MSB] measured at {r0} Rsun")
    if measurement.power_law is not None:
        pl = measurement.power_law
        h["STRAYB0"] = (pl.b_ref, "[MSB] power-law fit at STRAYR0 (informative)")
        h["STRAYR0"] = (pl.r_ref, "[Rsun] reference radius")
        h["STRAYIDX"] = (pl.index, "power-law index of the fit")
    if measurement.chi2_red is not None:
        h["STRYCHI2"] = (float(measurement.chi2_red), "reduced chi2 of the stray-light fit")
        h["STRYMODL"] = (measurement.fit_model[:40], "adopted stray-light model")
        h["STRYREFU"] = (bool(measurement.refused), "fit refused: the law is the fallback")
        if measurement.runs_z is not None and np.isfinite(measurement.runs_z):
            h["STRYRUNZ"] = (float(measurement.runs_z), "runs statistic of the fit residuals")
            h["STRYSTRC"] = (bool(measurement.structured), "residuals structured: 1-sigma widened")
        if measurement.influence is not None and np.isfinite(measurement.influence):
            h["STRYINFL"] = (float(measurement.influence), "[MSB] stray 1-sigma from structure, 1.1 Rsun")
        if measurement.refused:
            h["STRYWHY"] = (" ".join(measurement.refused.split())[:45], "why the fit was refused")
    for note in measurement.notes:
        h.add_comment(note)
    cols = [fits.Column(name="R", format="D", unit="Rsun", array=measurement.radii),
            fits.Column(name="STRAY", format="D", unit="MSB", array=measurement.profile)]
    if measurement.sigma is not None:
        cols.append(fits.Column(name="SIGMA", format="D", unit="MSB", array=np.asarray(measurement.sigma)))
    hdus = [fits.PrimaryHDU(m, h), fits.BinTableHDU.from_columns(fits.ColDefs(cols), name="PROFILE")]
    if measurement.residual is not None:
        rr, res, sig = (np.asarray(a, dtype=np.float64) for a in measurement.residual)
        hdus.append(fits.BinTableHDU.from_columns(fits.ColDefs([
            fits.Column(name="R", format="D", unit="Rsun", array=rr),
            fits.Column(name="RESID", format="D", unit="MSB", array=res),
            fits.Column(name="SIGMA", format="D", unit="MSB", array=sig)]), name="RESIDUAL"))
    return fits.HDUList(hdus)
