"""Validation of the L2 chain against the simulator's truth: the measurements and the gates.

Used by ``benchmarks/validate_calibration.py`` (full or large size, report and figures) and
by ``tests/validation/test_calibration_gates.py`` (small size). Every number compares a calibrated
frame with the band-limited truth the raw frame was made from (:func:`pipelines.simulation.simulate`
writes both, from real solar scenes: SOHO/EIT and SWAP for SDI, SOHO/MDI for WST, STEREO/COR1
structure for SCI).

Gates (:data:`GATES`):

* ``median_rel_error``: noise off, median ``|L2 - truth| / truth`` < 0.1 % on the good
  pixels (DQ 0) that carry signal *and that the 16-bit ADC resolves to 0.02 %* (its
  rounding, 0.29 DN RMS, below 0.02 % of the pixel's signal). In SCI the corona beyond
  ~1.8 Rsun is 50-150 times fainter than the stray light the detector also records, so a
  coronal pixel holds a few tens of DN and the ADC's rounding alone is 0.3-1 % of it: no
  calibration can do better there, and the all-pixel median (reported beside it) measures
  the ADC, not the pipeline. The signed median (bias) over all signal pixels is gated too.
* ``flat_rms``: KLL flat recovered from a dithered set within 0.5 % RMS of the injected flat
  (noise off), on the pixels KLL measures.
* ``stray_residual``: SCI, ``|mean(L2 - truth)| / mean(injected stray)`` in annuli of
  0.05 Rsun from 1.1 to 2.5 Rsun, the worst annulus < 1 %; for the default power-law master
  and for a map measured from a sequence (:mod:`pipelines.calibration.masters.stray_light`).
* ``sun_centre_px``: disk imagers, the limb-fitted disk centre of the L2 image within
  0.25 px of the truth's (same fit on both, :func:`pipelines.simulation.fit_solar_limb`).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.calibration.l2.flow import CalibrationInput, calibrate_frame, load_calibration_master
from pipelines.calibration.l2.options import CalibrationOptions
from pipelines.fitsio import read_image

__all__ = ["GATES", "ADC_RMS_DN", "load_masters", "frame_metrics", "validate_simulation", "stray_map_check",
           "kll_flat_check", "ANNULI"]

#: Gate thresholds (see the module docstring).
GATES = {"median_rel_error": 1e-3, "median_bias": 1e-3, "flat_rms": 5e-3, "stray_residual": 1e-2,
         "sun_centre_px": 0.25}

#: RMS of the ADC's rounding to whole DN [DN]: 1/sqrt(12).
ADC_RMS_DN = 1.0 / np.sqrt(12.0)

#: Pixels whose ADC rounding exceeds this fraction of their signal are "not resolved".
ADC_RESOLVED = 2e-4

#: Annulus edges [Rsun] of the stray-light residual.
ANNULI = np.round(np.arange(1.10, 2.5001, 0.05), 3)


def load_masters(calibration_files) -> dict[str, dict[str, CalibrationInput]]:
    """Masters of a :class:`pipelines.simulation.SimulationResult` by channel and kind (ids 1, 2, ...).

    The bad-pixel map of each dark master is derived here, once, as a worker keeps its
    masters resident (so that the calibration times measured later are per frame).
    """
    from pipelines.calibration.l2.flow import bad_pixel_map

    cals: dict[str, dict[str, CalibrationInput]] = {}
    for i, c in enumerate(calibration_files):
        ci = load_calibration_master(c.path)
        ci.id = i + 1
        cals.setdefault(c.channel, {})[c.kind] = ci
        if c.kind == "dark":
            bad_pixel_map(ci)
    return cals


def _read_truth(path) -> tuple[np.ndarray, np.ndarray | None, fits.Header]:
    with fits.open(path, memmap=False) as h:
        truth = np.asarray(h[0].data, dtype=np.float64)
        stray = np.asarray(h["STRAY"].data, dtype=np.float64) if "STRAY" in h else None
        return truth, stray, h[0].header.copy()


def _rho(n: int, header: fits.Header) -> np.ndarray:
    c = (n - 1) / 2.0
    g = (np.arange(n) - c) * float(header["CDELT1"]) / float(header["RSUN_OBS"])
    return np.hypot(g[None, :], g[:, None])


def _limb_centre(img: np.ndarray) -> tuple[float, float]:
    from pipelines.simulation import fit_solar_limb

    fit = fit_solar_limb(np.where(np.isfinite(img), img, 0.0))
    return fit.x0, fit.y0


def _block(a: np.ndarray, size: int = 512) -> np.ndarray:
    f = max(1, int(np.ceil(a.shape[0] / size)))
    n = (a.shape[0] // f) * f
    return np.nanmean(a[:n, :n].reshape(n // f, f, n // f, f), axis=(1, 3)) if f > 1 else a.copy()


def frame_metrics(l2, truth: np.ndarray, stray: np.ndarray | None, truth_header: fits.Header, *,
                  coef: float, exptime: float, channel: str, keep_maps: bool = False) -> dict[str, Any]:
    """Compare one L2 result with its truth.

    Parameters
    ----------
    l2 : pipelines.calibration.l2.flow.L2Result
    truth : numpy.ndarray, shape (n, n) [product unit]
        The simulator's truth on the L2 grid (north up, disk centre on the frame centre).
    stray : numpy.ndarray or None
        The injected stray light on the L2 grid [MSB] (SCI), for the residual ratio.
    truth_header : astropy.io.fits.Header
        ``CDELT1`` [arcsec/px], ``RSUN_OBS`` [arcsec].
    coef : float
        Radiometric coefficient [unit per DN/s] (for the ADC floor).
    exptime : float
        Exposure [s].
    channel : str
    keep_maps : bool
        Also return block-averaged residual maps and profiles for the figures.

    Returns
    -------
    dict
        ``median_rel_error`` (resolved pixels), ``median_rel_error_all``, ``median_bias``,
        ``resolved_fraction``, ``n_signal``; SCI: ``stray_residual`` (worst annulus) and
        ``stray_profile`` (per annulus); disk imagers: ``centre_dx``/``centre_dy``/
        ``centre_offset_px`` (L2 limb fit minus truth limb fit) and ``centre_from_frame_px``.
    """
    n = truth.shape[0]
    data = l2.data.astype(np.float64)
    good = (l2.dq == 0) & np.isfinite(data)
    sig = good & (truth > 1e-2 * np.median(truth[good]))
    rel = (data[sig] - truth[sig]) / truth[sig]
    floor = ADC_RMS_DN * coef / (exptime * truth[sig])  # ADC rounding relative to the signal
    resolved = floor < ADC_RESOLVED
    out: dict[str, Any] = {
        "channel": channel,
        "n_signal": int(sig.sum()),
        "median_rel_error_all": float(np.median(np.abs(rel))),
        "median_rel_error": float(np.median(np.abs(rel[resolved]))) if resolved.any() else float("nan"),
        "resolved_fraction": float(resolved.mean()),
        "median_bias": float(np.median(rel)),
        "adc_floor_median": float(np.median(floor)),
    }
    rho = _rho(n, truth_header)
    if stray is not None:
        rows = []
        for lo, hi in zip(ANNULI[:-1], ANNULI[1:]):
            sel = good & (rho >= lo) & (rho < hi)
            inj = float(np.mean(stray[sel]))
            res = float(np.mean(data[sel] - truth[sel]))
            rows.append({"r_lo": float(lo), "r_hi": float(hi), "stray": inj, "residual": res,
                         "corona": float(np.mean(truth[sel])), "ratio": abs(res) / inj})
        out["stray_profile"] = rows
        out["stray_residual"] = max(r["ratio"] for r in rows)
    else:
        lx, ly = _limb_centre(data)
        tx, ty = _limb_centre(truth)
        c = (n - 1) / 2.0
        out.update(centre_dx=lx - tx, centre_dy=ly - ty, centre_offset_px=float(np.hypot(lx - tx, ly - ty)),
                   centre_from_frame_px=float(np.hypot(lx - c, ly - c)),
                   truth_centre_from_frame_px=float(np.hypot(tx - c, ty - c)))
    if keep_maps:
        with np.errstate(invalid="ignore", divide="ignore"):
            relmap = np.where(sig, (data - truth) / np.where(sig, truth, 1.0), np.nan)
        out["_relmap"] = _block(relmap)
    return out


def validate_simulation(sim, *, options: CalibrationOptions | None = None, keep_maps: bool = False,
                        stray_overrides: dict[str, CalibrationInput] | None = None,
                        masters: dict[str, dict[str, CalibrationInput]] | None = None) -> list[dict[str, Any]]:
    """Calibrate every frame of a simulation and compare it with its truth.

    Parameters
    ----------
    sim : pipelines.simulation.SimulationResult
    options : CalibrationOptions, optional
        Options of :func:`calibrate_frame` (default: the defaults).
    keep_maps : bool
        Keep block-averaged residual maps (figures).
    stray_overrides : dict, optional
        ``{channel: CalibrationInput}`` replacing the channel's stray-light master (a
        measured map).
    masters : dict, optional
        :func:`load_masters` of ``sim`` (loaded here if not given).

    Returns
    -------
    list of dict
        :func:`frame_metrics` per frame, plus ``date_obs``, ``seconds`` (calibration time
        of the frame, masters resident).
    """
    cals = masters if masters is not None else load_masters(sim.calibration_files)
    rows = []
    for f in sim.frames:
        raw = read_image(f.raw_path)
        c = dict(cals[f.channel])
        if stray_overrides and f.channel in stray_overrides:
            c["stray_light"] = stray_overrides[f.channel]
        t0 = time.perf_counter()
        l2 = calibrate_frame(raw.data, raw.header, c, options)
        dt_s = time.perf_counter() - t0
        del raw
        truth, stray, th = _read_truth(f.truth_path)
        m = frame_metrics(l2, truth, stray, th, coef=c["radiometric"].param("RADCOEF"), exptime=f.exptime_s,
                          channel=f.channel, keep_maps=keep_maps)
        m.update(date_obs=f.date_obs, seconds=dt_s, naxis=f.naxis)
        rows.append(m)
        del l2, truth, stray
    return rows


def stray_map_check(sim, *, corona: str | None = "model", percentile: float = 0.0, version: int = 2,
                    out_dir: str | Path | None = None, variants: list[tuple[str | None, float, int]] | None = None,
                    masters: dict[str, dict[str, CalibrationInput]] | None = None) -> Any:
    """Measure a stray-light map from an SCI sequence, write it as a master, recalibrate with it.

    Parameters
    ----------
    sim : pipelines.simulation.SimulationResult
        SCI frames (several per channel: ``frames_per_channel``) with their masters.
    corona : {'model', None}
        ``'model'``: subtract the simulator's radial coronal model (Baumbach K + F for WL,
        the Ly-alpha K-shaped model for UV) from the background: the best case, a coronal
        model without error in the azimuthal median. ``None``: subtract nothing.
    percentile : float
        Per-pixel temporal percentile (0 = minimum).
    version : int
        ``CALVER`` of the new stray-light master.
    out_dir : path-like, optional
        Where the new master is written (default: the simulation's calibration folder).
    variants : list of (corona, percentile, version), optional
        Several measurements from one calibration of the sequence; the result is then a
        list with one dict (as below) per variant.
    masters : dict, optional
        :func:`load_masters` of ``sim``.

    Returns
    -------
    dict (or list of dict with ``variants``)
        Per channel: ``stray_residual`` (worst annulus, recalibrated with the measured map),
        ``stray_profile``, ``map_vs_injected`` (median |map / injected - 1| from 1.15 to
        2.45 Rsun on the detector), ``n_frames``, ``path`` (the master), ``method``.
    """
    from pipelines import simulation as simmod
    from pipelines.calibration.l2.steps import StrayLightModel
    from pipelines.calibration.masters.stray_light import measure_stray_light_map, stray_light_map_hdul
    from pipelines.fitsio import write_fits_atomic
    from pipelines.sun import radius_map, sun_geometry

    cals = masters if masters is not None else load_masters(sim.calibration_files)
    todo = variants if variants is not None else [(corona, percentile, version)]
    outs: list[dict[str, dict[str, Any]]] = [{} for _ in todo]
    chans = sorted({f.channel for f in sim.frames if f.channel.startswith("SCI")})
    for ch in chans:
        frames = [f for f in sim.frames if f.channel == ch]
        msb, dqs, header = [], [], None
        for f in frames:
            raw = read_image(f.raw_path)
            l1 = calibrate_frame(raw.data, raw.header, cals[ch],
                                 CalibrationOptions(subtract_stray_light=False, rotate_north_up=False))
            msb.append(l1.data)
            dqs.append(l1.dq)
            if header is None:
                header = l1.header
        valid = np.all(np.stack(dqs) == 0, axis=0)
        del dqs
        geom = sun_geometry(header)
        header_shape = msb[0].shape
        r = radius_map(header_shape, geom)
        inj = simmod.stray_light_model(ch).brightness(r)
        ring = (r > 1.15) & (r < 2.45)
        folder = Path(out_dir) if out_dir is not None else Path(frames[0].raw_path).parent.parent / "calibration"
        n = header_shape[0]
        first = next(c for c in sim.calibration_files if c.channel == ch and c.kind == "stray_light")
        for out, (cor, pct, ver) in zip(outs, todo):
            model = None
            if cor == "model":
                model = simmod.sci_wl_corona if ch == "SCI-WL" else simmod.lyman_alpha_corona
            meas = measure_stray_light_map(msb, header, corona=model, percentile=pct, valid=valid)
            map_err = float(np.median(np.abs(meas.map[ring] / inj[ring] - 1.0)))
            path = folder / f"lst_{ch.lower()}_stray_light_{n}_v{ver:02d}.fits"
            write_fits_atomic(stray_light_map_hdul(meas, ch, ver, first.valid_from, first.valid_to), path)
            master = load_calibration_master(path)
            master.id = 1000 + ver
            rows = validate_simulation(_only(sim, ch), stray_overrides={ch: master}, masters=cals)
            worst = max(rows, key=lambda m: m["stray_residual"])
            pl = meas.power_law if isinstance(meas.power_law, StrayLightModel) else None
            out[ch] = {"stray_residual": worst["stray_residual"], "stray_profile": worst["stray_profile"],
                       "map_vs_injected": map_err, "n_frames": len(frames), "path": str(path),
                       "method": meas.method, "power_law_index": pl.index if pl else None,
                       "injected_index": simmod.stray_light_model(ch).index,
                       "profile_r": meas.radii.tolist(), "profile": meas.profile.tolist()}
        del msb
    return outs if variants is not None else outs[0]


def _only(sim, channel: str):
    import copy

    s = copy.copy(sim)
    s.frames = [f for f in sim.frames if f.channel == channel]
    s.calibration_files = [c for c in sim.calibration_files if c.channel == channel]
    return s


#: Dither pattern (dy, dx) [pixel at 256 px] of the KLL check: non-collinear, mixed parity.
DITHERS = np.array([(0, 0), (7, 18), (-12, 5), (23, -10), (-5, -17), (14, 9), (-20, -3), (3, 22), (11, -21)])
#: Unscaled offsets added to the scaled pattern so the differences still generate Z^2.
_NUDGE = np.array([(0, 0), (1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (0, 2), (2, 0), (3, 1)])


def kll_flat_check(sim, channel: str, *, noise: bool, seed: int = 0, peak_electrons: float = 3.0e4,
                   keep_maps: bool = False) -> dict[str, Any]:
    """Recover the simulator's injected flat of ``channel`` by KLL from a dithered set.

    The scene is the channel's truth (a real solar image, band-limited), scaled to
    ``peak_electrons`` at its brightest; nine images shifted by :data:`DITHERS` (scaled with
    the frame size) multiplied by the injected flat (the channel's flat master),
    optionally with Poisson noise; :func:`pipelines.calibration.masters.flatfield.derive_flat_master`
    makes a flat master version from them.

    Returns
    -------
    dict
        :func:`pipelines.calibration.masters.flatfield.compare_flats` numbers (``rms``, ``p99``,
        ``max``, ``injected_rms``, ``n``), ``valid_fraction``, ``converged``, ``n_iter``,
        ``seconds``, ``shift_scale``.
    """
    from pipelines.calibration.masters.flatfield import compare_flats, derive_flat_master
    from pipelines.calibration.masters.kll import make_dithered_set

    frame = next(f for f in sim.frames if f.channel == channel)
    cal = next(c for c in sim.calibration_files if c.channel == channel and c.kind == "flat")
    flat = load_calibration_master(cal.path).data["flat"].astype(np.float64)
    truth, _, _ = _read_truth(frame.truth_path)
    n = truth.shape[0]
    scene = np.clip(truth, 0.0, None) * (peak_electrons / float(np.max(truth)))
    k = max(1, int(round(n / 256)))
    shifts = DITHERS * k + (_NUDGE if k > 1 else 0)
    images = make_dithered_set(scene, flat, shifts, rng=seed, noise="poisson" if noise else None, fill_value=0.0)
    del scene, truth
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dither pattern that leaves gain patterns free is a failure here
        der = derive_flat_master(images, shifts, channel, 2, cal.valid_from, cal.valid_to)
    secs = time.perf_counter() - t0
    del images
    res = compare_flats(der.result.flat, flat, der.result.valid_mask)
    res.update(valid_fraction=float(der.result.valid_mask.mean()), converged=bool(der.result.converged),
               n_iter=int(der.result.n_iter), seconds=secs, shift_scale=k, channel=channel, noise=noise)
    if keep_maps:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(der.result.valid_mask, der.result.flat / flat, np.nan)
        ratio /= np.nanmean(ratio)
        res["_ratio"] = _block(ratio)
        res["_ratio_hist"] = np.histogram(ratio[np.isfinite(ratio)] - 1.0, bins=80, range=(-0.01, 0.01))
        res["_injected"] = _block(flat)
    return res
