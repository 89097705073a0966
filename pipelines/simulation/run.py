"""The entry point :func:`simulate`: plan the frames, write truths, masters, raw frames, manifest."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from astropy.io import fits

from pipelines.calibration.l2.steps import StrayLightModel
from pipelines.channels import CHANNELS, MIN_FRAME_SIDE, get_channel
from pipelines.errors import DataError
from pipelines.simulation.forward import (INSTRUMENT, _dark_planes, _detector_geometry, _flat_field, _forward_model,
                                          _raw_header, stray_light_model)
from pipelines.simulation.masters import _radiometric_coefficient, _validity, _write_masters
from pipelines.simulation.models import (COR1_CONTRAST_GAIN, IRRADIANCE_360NM, LYA_GAMMA, LYA_LIMB_SCALE_RSUN,
                                         UV_MSB_AT_1P5, WL_K_FACTOR)
from pipelines.simulation.output import SOFTWARE, _iso, _write
from pipelines.simulation.results import CalibrationFileInfo, InjectedFlare, SimulatedFrame, SimulationResult
from pipelines.simulation.series import FLARE, _FramePlan, _plan_frames
from pipelines.simulation.sources import SAMPLE_DIR
from pipelines.simulation.truth import _write_truth
from pipelines.simulation.variants import ChannelVariant


_CHANNEL_INDEX = {c: i for i, c in enumerate(CHANNELS)}


def _rng(seed: int, *keys: int) -> np.random.Generator:
    """The random stream of ``seed`` and ``keys`` (channel index, frame or master key)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *keys]))


def _sizes(channels: tuple[str, ...], naxis: dict[str, int] | int | None) -> dict[str, int]:
    """Frame side [pixel] per channel from ``simulate``'s ``naxis``; ValueError outside what ingest accepts."""
    out = {}
    for c in channels:
        spec = CHANNELS[c]
        if naxis is None:
            n = spec.naxis
        elif isinstance(naxis, int):  # one size for all: capped at each channel's detector (SCI 2048)
            n = min(int(naxis), spec.naxis)
        else:
            key = next((k for k in naxis if get_channel(k).code == c), None)
            n = int(naxis[key]) if key is not None else spec.naxis
        if not MIN_FRAME_SIDE <= n <= spec.naxis:  # what ingest accepts for this channel
            raise ValueError(f"naxis for {c} must be between {MIN_FRAME_SIDE} and {spec.naxis} pixels "
                             f"(the detector), got {n}")
        out[c] = int(n)
    return out


def _clean(out_dir: Path) -> None:
    """Remove earlier ``lst_*.fits`` files from ``raw/``, ``calibration/`` and ``truth/``."""
    for sub in ("raw", "calibration", "truth"):
        d = out_dir / sub
        if d.is_dir():
            for p in d.glob("lst_*.fits"):
                p.unlink()


def simulate(out_dir: str | os.PathLike, channels: Iterable[str] = ("SDI", "WST", "SCI-UV", "SCI-WL"),
             naxis: dict[str, int] | int | None = None, noise: bool = True, seed: int = 0,
             sdi_sequence: bool = True, frames_per_channel: int = 1, *,
             sample_dir: str | os.PathLike | None = None, xrs_day: bool = False,
             wst_helioviewer: bool = False, sci_roll_deg: Sequence[float] | None = None,
             pointing_error_px: float = 0.0,
             variants: Mapping[str, ChannelVariant] | None = None) -> SimulationResult:
    """Simulate raw LST frames, their calibration masters and their truth.

    Parameters
    ----------
    out_dir : path-like
        Written: ``raw/``, ``calibration/``, ``truth/`` and ``manifest.json`` (earlier
        ``lst_*.fits`` files in those folders are removed first).
    channels : iterable of str
        Any of ``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``.
    naxis : dict, int or None
        Frame size [pixel] per channel, one size for all, or ``None`` for the full sizes
        (4608 for SDI/WST, 2048 for SCI). Binned sizes keep the field of view (the plate
        scale grows with the binning).
    noise : bool
        Poisson noise on the photo-electrons and Gaussian read noise; ``False`` leaves only
        the ADC rounding.
    seed : int
        Everything random (flats, darks, pointing jitter, noise) derives from it: one seed,
        byte-identical files.
    sdi_sequence : bool
        SDI frames are the 13-frame EIT-based series with the injected flare (True), or
        ``frames_per_channel`` frames from the SWAP scene (False).
    frames_per_channel : int
        Frames of each non-series channel (one cadence apart; the scene does not evolve,
        the pointing jitters and the noise differs).
    sample_dir : path-like, optional
        The real data (default ``sample-data/real`` of the repository).
    xrs_day : bool
        Also the SDI series of the XRS day (:data:`~pipelines.simulation.series.XRS_DAY`:
        25 frames 2011-06-07 05:20-07:44 every 6 min around the GOES M2.5 flare, a second
        injected flare; the scene is the SWAP image of 2012-01-01, not of that day).
    wst_helioviewer : bool
        Also a WST frame of 2023-01-31 03:39:23 from the Helioviewer JPEG 2000 of SDO/HMI
        continuum (:data:`~pipelines.simulation.sources.HMI_JP2_FILE`).
    sci_roll_deg : sequence of float, optional
        A roll sequence for SCI [deg]: frame ``k`` of each SCI channel is rolled by
        ``sci_roll_deg[k]`` on top of its nominal roll and jitter (``CROTA2`` says so), as a
        spacecraft roll manoeuvre does (SOHO and STEREO roll about the Sun-pointed axis for
        calibration). The corona turns with the roll in the detector frame, the stray light
        stays (it follows the occulter). Sets the SCI frame count to ``len(sci_roll_deg)``
        (other channels keep ``frames_per_channel``). ``None`` (default): no roll sequence,
        output unchanged.
    pointing_error_px : float
        Pointing error written into each raw header [pixel of the simulated frame, 0-10]:
        ``CRPIX1/2`` are the true disk centre plus a vector of this length in a random
        direction (stream ``(seed, channel, 2000 + frame)``, so the frames and noise are
        those of ``pointing_error_px=0``); the truth stays on the true centre, recorded in
        each frame's ``crpix`` (``header_crpix`` holds what the header says). The chain
        must find the centre from the data (issue 14: "pointing errors of up to 2 px in
        the headers").
    variants : mapping of str to ChannelVariant, optional
        Per channel code (``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``), departures from the
        simulator's own shapes (:class:`pipelines.simulation.variants.ChannelVariant`: stray
        light, coronal radial shape, occulter offset, header roll error). ``None`` or a
        channel left out: the simulator's shapes, output unchanged.

    Returns
    -------
    SimulationResult

    Raises
    ------
    ValueError
        On unknown channels or sizes outside 32 px to the channel's detector size
        (4608 SDI/WST, 2048 SCI); an ``int`` size is capped at each detector.
    DataError
        If a real input file is missing or unusable.
    """
    out = Path(out_dir)
    sample = Path(sample_dir) if sample_dir is not None else SAMPLE_DIR
    if not sample.is_dir():
        raise DataError(f"sample data folder not found: {sample}")
    try:
        chans = tuple(dict.fromkeys(get_channel(c).code for c in channels))
    except KeyError as exc:
        raise ValueError(str(exc).strip("'\"")) from None
    if not chans:
        raise ValueError("no channel to simulate")
    if frames_per_channel < 1:
        raise ValueError("frames_per_channel must be at least 1")
    rolls = None if sci_roll_deg is None else [float(a) for a in sci_roll_deg]
    if rolls is not None and (not rolls or not all(np.isfinite(rolls))):
        raise ValueError("sci_roll_deg must hold at least one finite angle")
    if not 0.0 <= float(pointing_error_px) <= 10.0:
        raise ValueError(f"pointing_error_px must be between 0 and 10 pixels, got {pointing_error_px}")
    sizes = _sizes(chans, naxis)
    for sub in ("raw", "calibration", "truth"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    _clean(out)

    frames: list[SimulatedFrame] = []
    cal_infos: list[CalibrationFileInfo] = []
    limb_fits: list[dict[str, Any]] = []
    radiometric: dict[str, float] = {}
    flares: list[InjectedFlare] = []
    cache: dict[str, Any] = {}
    for chan in chans:
        done = _simulate_channel(chan, sizes[chan], out, sample, seed=seed, noise=noise, sdi_sequence=sdi_sequence,
                                 frames_per_channel=frames_per_channel, cache=cache, xrs_day=xrs_day,
                                 wst_helioviewer=wst_helioviewer, sci_roll_deg=rolls,
                                 pointing_error_px=float(pointing_error_px),
                                 variant=(variants or {}).get(chan))
        flares.extend(done.flares)
        limb_fits.extend(done.limb_fits)
        radiometric[chan] = done.radiometric_coef
        cal_infos.extend(done.calibration_files)
        frames.extend(done.frames)

    manifest = out / "manifest.json"
    result = SimulationResult(out_dir=out, raw_files=[f.raw_path for f in frames],
                              truth_files=[f.truth_path for f in frames], calibration_files=cal_infos,
                              manifest_path=manifest, flare=flares[0] if flares else None, frames=frames,
                              limb_fits=limb_fits, radiometric=radiometric, flares=flares)
    _write_manifest(result, seed=seed, noise=noise, sizes=sizes)
    return result


@dataclass
class _ChannelOutput:
    """What :func:`_simulate_channel` wrote for one channel."""

    frames: list[SimulatedFrame]
    calibration_files: list[CalibrationFileInfo]
    radiometric_coef: float
    flares: list[InjectedFlare]
    limb_fits: list[dict[str, Any]]


def _simulate_channel(chan: str, n: int, out: Path, sample: Path, *, seed: int, noise: bool, sdi_sequence: bool,
                      frames_per_channel: int, cache: dict[str, Any], xrs_day: bool = False,
                      wst_helioviewer: bool = False, sci_roll_deg: list[float] | None = None,
                      pointing_error_px: float = 0.0, variant: ChannelVariant | None = None) -> _ChannelOutput:
    """Truths, masters and raw frames of one channel, in that order.

    Pass 1 writes every truth and finds the channel's brightest signal, which fixes the
    radiometric coefficient; the masters come next (their random planes from the stream
    ``(seed, channel, 1000 + n)``), then pass 2 the raw frames (frame ``k`` from the
    stream ``(seed, channel, k)``).
    """
    spec, model = CHANNELS[chan], INSTRUMENT[chan]
    scale = spec.plate_scale_for(n)
    ci = _CHANNEL_INDEX[chan]
    roll_seq = sci_roll_deg if (sci_roll_deg is not None and spec.is_coronagraph) else None
    plans, flares, fits_info = _plan_frames(chan, sample, sdi_sequence,
                                            len(roll_seq) if roll_seq is not None else frames_per_channel, cache,
                                            xrs_day=xrs_day, wst_helioviewer=wst_helioviewer)
    if roll_seq is not None:
        for plan, extra in zip(plans, roll_seq):
            plan.roll_offset_deg = extra
            plan.notes.append(f"roll sequence: {extra:+.3f} deg on top of the nominal roll")
    stray = stray_light_model(chan) if spec.is_coronagraph else None
    given_stray = stray  # the given master is the nominal law, whatever is injected
    if variant is not None and variant.stray is not None and spec.is_coronagraph:
        stray = variant.stray
    corona_factor = variant.corona_factor if variant is not None else None

    # pass 1: the truths (written to disk) and the brightest signal of the channel
    peak_signal = max(_write_truth(plan, chan, n, scale, stray, out, corona_factor=corona_factor) for plan in plans)

    # the channel's calibration masters; C puts the brightest pixel below target_peak_dn
    rng_cal = _rng(seed, ci, 1000 + n)
    flat = _flat_field(n, spec.naxis, model, rng_cal)
    bias, dark_rate = _dark_planes(n, model, rng_cal)
    coef = _radiometric_coefficient(peak_signal, flat, bias, dark_rate, model)
    t_first, t_last = min(p.t for p in plans), max(p.t for p in plans)
    valid_from, valid_to = _validity(t_first, t_last)
    cal_infos = _write_masters(out, chan, spec, model, n, flat, bias, dark_rate, coef, given_stray, valid_from,
                               valid_to, _iso(t_first))

    # pass 2: the raw frames
    frames = [_write_raw_frame(plan, chan, n, out, _rng(seed, ci, k), stray, flat, bias, dark_rate, coef, noise,
                               _pointing_error(pointing_error_px, _rng(seed, ci, 2000 + k)), variant=variant)
              for k, plan in enumerate(plans)]
    return _ChannelOutput(frames=frames, calibration_files=cal_infos, radiometric_coef=coef, flares=flares,
                          limb_fits=fits_info)


def _pointing_error(length_px: float, rng: np.random.Generator) -> tuple[float, float]:
    """Header-minus-true disk centre (dx, dy) [pixel]: ``length_px`` in a direction drawn from ``rng``."""
    if length_px <= 0.0:
        return 0.0, 0.0
    a = float(rng.uniform(0.0, 2.0 * math.pi))
    return length_px * math.cos(a), length_px * math.sin(a)


def _write_raw_frame(plan: _FramePlan, chan: str, n: int, out: Path, rng: np.random.Generator,
                     stray: StrayLightModel | None, flat: np.ndarray, bias: np.ndarray, dark_rate: np.ndarray,
                     coef: float, noise: bool, header_error: tuple[float, float] = (0.0, 0.0),
                     variant: ChannelVariant | None = None) -> SimulatedFrame:
    """Point the detector, run the forward model on the frame's truth and write ``raw/``.

    ``rng`` draws the pointing jitter first, then the noise. ``header_error`` (dx, dy)
    [pixel] is added to the disk centre written in the header (``CRPIX``), not to the
    pointing the frame is made with; the header does not say so (the truth is in the
    returned frame and the manifest only). ``variant`` offsets the occulter from the Sun
    centre and writes a wrong roll into the header (``crota2`` of the result is the true roll).
    """
    spec, model = CHANNELS[chan], INSTRUMENT[chan]
    scale = spec.plate_scale_for(n)
    x0, y0, roll = _detector_geometry(model, n, rng)
    roll += plan.roll_offset_deg
    with fits.open(plan.truth_path, memmap=False) as hd:
        truth = np.asarray(hd[0].data, dtype=np.float32)
    occ = variant.occulter_offset_px if variant is not None else (0.0, 0.0)
    raw = _forward_model(truth, spec, model, n, x0, y0, roll, plan.rsun_arcsec / scale, stray, flat, bias,
                         dark_rate, coef, noise, rng, aperture_offset_px=occ)
    del truth
    raw_path = out / "raw" / plan.raw_name
    hx, hy = x0 + header_error[0], y0 + header_error[1]
    h_roll = roll + (variant.roll_error_deg if variant is not None else 0.0)
    rh = _raw_header(spec, plan.t, model, scale, hx, hy, h_roll, plan.scene, plan.raw_name, plan.notes,
                     keywords=plan.keywords)
    _write(fits.HDUList([fits.PrimaryHDU(raw, header=rh)]), raw_path, _iso(plan.t))
    return SimulatedFrame(channel=chan, raw_path=raw_path, truth_path=plan.truth_path, date_obs=_iso(plan.t),
                          exptime_s=model.exptime_s, naxis=n, plate_scale=scale, crpix=(x0 + 1.0, y0 + 1.0),
                          crota2=roll, rsun_arcsec=plan.rsun_arcsec, scene=plan.scene, peak_dn=int(raw.max()),
                          notes=list(plan.notes), header_crpix=(hx + 1.0, hy + 1.0))


def _jsonable(v: Any) -> Any:
    """``v`` with paths as str and numpy scalars as Python numbers, recursively."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _write_manifest(result: SimulationResult, *, seed: int, noise: bool, sizes: dict[str, int]) -> None:
    """Write ``manifest.json`` atomically: the frames, masters, flare, limb fits and every model parameter."""
    out = result.out_dir
    rel = lambda p: str(Path(p).relative_to(out))  # noqa: E731
    doc = {
        "software": SOFTWARE,
        "seed": seed,
        "noise": noise,
        "naxis": sizes,
        "frames": [dict(_jsonable(dataclasses.asdict(f)), raw_path=rel(f.raw_path), truth_path=rel(f.truth_path))
                   for f in result.frames],
        "calibration_files": [dict(_jsonable(dataclasses.asdict(c)), path=rel(c.path))
                              for c in result.calibration_files],
        "flare": _jsonable(dataclasses.asdict(result.flare)) if result.flare else None,
        "flares": [_jsonable(dataclasses.asdict(f)) for f in result.flares],
        "limb_fits": _jsonable(result.limb_fits),
        "radiometric_coefficients": result.radiometric,
        "models": {
            "sdi_lya_gamma": LYA_GAMMA,
            "sdi_limb_scale_rsun": LYA_LIMB_SCALE_RSUN,
            "wst_irradiance_360nm_W_m2_nm": IRRADIANCE_360NM,
            "wst_limb_darkening": "Neckel 2005 (Sol. Phys. 229, 13)",
            "sci_wl": f"Baumbach 1937 F + {WL_K_FACTOR} x K corona",
            "sci_uv": f"K-corona shape, {UV_MSB_AT_1P5:.3g} MSB at 1.5 Rsun",
            "cor1_contrast_gain": COR1_CONTRAST_GAIN,
            "flare": FLARE,
            "stray_light": {c: dataclasses.asdict(stray_light_model(c)) for c in ("SCI-UV", "SCI-WL")},
            "instrument": {c: dataclasses.asdict(m) for c, m in INSTRUMENT.items()},
        },
    }
    tmp = out / ".manifest.json.part"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, result.manifest_path)
