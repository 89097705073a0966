"""Validation of the event detectors against injected events of known truth.

Three parts, each a function returning a :class:`Result` (counts and errors) so that the
gates test (``tests/test_detection_gates.py``) runs the same code at a small size. Two sizes:

``full`` (the report's default)
    The instruments' frames (``/work/shared/LST.md``): SDI 4608 x 4608 at 0.5 arcsec/px
    (flares, prominence eruptions), SCI 2048 x 2048 at 2.4 arcsec/px (CMEs). Frames are
    made one at a time (flares: lazily, on the detector's request), so a sequence never
    holds more than a few full frames; CME and prominence frames are block-averaged to the
    detectors' working size as the detection service does
    (``backend.services.detection._reduced_stack``).
``small`` (``--quick`` and the tests)
    512 x 512: flares on the SWAP frame binned 2x (6.32 arcsec/px), CMEs at 9.6 arcsec/px,
    prominences at 4.5 arcsec/px.

The noise is drawn per pixel at the working size and scaled to the same photon count per
unit solar area at both sizes (per-pixel counts scale with the pixel area, so the per-pixel
noise grows as 1/plate scale): the noise of a 10-arcsec macropixel is then the same.

Flares (:func:`validate_flares`)
    The real SWAP 17.4 nm full-disk frame (``sample-data/real/full-disk/
    swap_lv1_20120101_001607.fits``, 1024^2, 3.16 arcsec/px): binned 2x (small) or
    resampled onto the SDI grid, 4608^2 at 0.5 arcsec/px (cubic spline,
    ``scipy.ndimage.affine_transform``; SWAP's 54-arcmin field covers SDI's 38.4). Gaussian
    noise per pixel: 2 % of the scene plus a floor of 2 % of the bright-disk median, at 6.32
    arcsec/px, scaled as above (ours: a photon-noise-like model; no SDI noise figure is
    public). 28 frames 2 min apart, several Gaussian enhancements (sigma 20 arcsec, Gaussian
    rise of 2 frames to the peak at frame 18, exponential decay of 3 frames) at random places
    on the disk. The amplitude of each is set in units of **sigma, the per-frame noise of the
    10-arcsec macropixel at its centre** as the detector measures it (robust scatter of
    frame-to-frame changes, from the same series without injections): 1.5, 2.5 (below 3
    sigma) and 4, 6, 10, 20 sigma (above). The detector runs with its **defaults** (those of
    the detection service) and, at the small size, with the former defaults (5 sigma and
    20 %) for comparison. A detection matches an injection within 30 arcsec and 2 frames of
    its peak. Recall: over injections above 3 sigma; precision: detections matching any
    injection. False detections per hour (:func:`flare_false_positives`): the same scene and
    noise at the SDI cadence (60 s), no injection; and on real evolving data
    (:func:`flare_real_sequence`: the SOHO/EIT 195 A hourly frames, compared with the GOES
    event list of that day).
CMEs (:func:`validate_cmes`)
    ``validation.synthetic``: a coronal background with real COR1 structure
    (``coronal_background``), CMEs injected with ``inject_cme_sequence`` (PA, width,
    speed, contrast, acceleration), brightness and pointing jitter, cosmic rays and photon
    noise. Found: PA within 10 deg and speed within 20 %. Timing error: first appearance
    minus the truth's (in seconds).
Prominence eruptions (:func:`validate_prominences`)
    ``limb_background`` (SDI, 60 s) with eruptions from ``inject_prominence_eruption``.
    Found: PA within 10 deg; errors of start time, PA and rise speed.

Evolving backgrounds (:func:`validate_evolving`, :func:`evolving_false_alarms`, issue 14
item 7; ``--evolving sdi,wst --cache DIR`` runs them, ``--evolving report --cache DIR``
appends their section to the report)
    :mod:`pipelines.simulation.evolving`: real SWAP (SDI-like Lyman-alpha) and MDI (360 nm)
    scenes rotating differentially (sunpy), red-noise brightness fluctuations of the quiet
    Sun and active regions, photon-like noise, cadences of 1, 2 and 4 min, flares shaped like
    the real GOES XRS M2.5 flare of 2011-06-07. Recall and precision with 95 %
    Clopper-Pearson intervals, false alarms per day with a 95 % Poisson upper limit, at the
    detectors' defaults.

Nuisances scale with the frame as the noise does: pointing jitter 0.1 px at 512 (the same
in arcsec at full size), cosmic-ray hits 30 per 512^2 frame (the same per detector pixel).

Run: ``.venv/bin/python benchmarks/validate_detection.py`` (full size; writes
``benchmarks/reports/detection_validation.md`` with the small-size figures as a second
section), ``--quick`` for the small size only; ``--parts`` and ``--cache`` run parts
separately (e.g. in two processes) and assemble the report from their saved results.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from astropy.io import fits
from astropy.wcs import WCS
from scipy import ndimage

from pipelines.detect.cme import _block_reduce, detect_cmes
from pipelines.detect.flares import (
    FlareDetectionParams,
    detect_flares,
    macropixel_factor,
)
from pipelines.detect.prominence import ProminenceParams, detect_prominence_eruptions
from pipelines.fitsio import read_image
from validation import synthetic as S

SWAP = ROOT / "sample-data" / "real" / "full-disk" / "swap_lv1_20120101_001607.fits"
REPORT = ROOT / "benchmarks" / "reports" / "detection_validation.md"
T0 = dt.datetime(2023, 3, 1, 0, 0, tzinfo=dt.UTC)
N_FRAMES = 28
T_PEAK = 18.0
#: Injected time profile [frames]: Gaussian rise, exponential decay. A flare is resolved in
#: time (several frames above half its peak), as at the SDI cadence of 60 s.
RISE_FRAMES, DECAY_FRAMES = 2.0, 3.0
#: Frame spacing [s]: 2 min (the WST cadence; SDI's is 60 s), so that the detector's
#: pre-flare window (10 to 30 min before) holds frames before the rise.
FLARE_CADENCE_S = 120.0
#: SDI cadence [s] (LST.md), for the false-detection rate on quiet series.
SDI_CADENCE_S = 60.0
#: Injected amplitudes [sigma]: two below the 3-sigma gate, four above.
FLARE_SIGMAS = (1.5, 2.5, 4.0, 6.0, 10.0, 20.0)
#: The former SDI defaults (detector 1.1.0), shown for comparison.
FLARE_PARAMS_OLD = FlareDetectionParams(noise_sigma=5.0, detection_threshold=0.2)
MATCH_ARCSEC = 30.0
MATCH_FRAMES = 2
#: SDI and WST frame and plate scale (LST.md; SDI's "unconfirmed" there) and SCI's.
SDI_NAXIS, SDI_SCALE = 4608, 0.5
SCI_NAXIS, SCI_SCALE = 2048, 2.4
SMALL = 512
#: Plate scale of the small flare scene (SWAP binned 2x) [arcsec/px]: the noise model's
#: reference (2 % + 2 % floor per pixel at this scale).
REF_SCALE = 2 * 3.16226783969


@dataclass
class Result:
    """Outcome of one validation part."""

    name: str
    n_truth: int = 0
    n_found: int = 0
    n_detections: int = 0
    n_true_detections: int = 0
    timing_err_s: list[float] = field(default_factory=list)
    pa_err_deg: list[float] = field(default_factory=list)
    speed_err_rel: list[float] = field(default_factory=list)
    position_err_arcsec: list[float] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def recall(self) -> float:
        return self.n_found / self.n_truth if self.n_truth else float("nan")

    @property
    def precision(self) -> float:
        return self.n_true_detections / self.n_detections if self.n_detections else 1.0


def _dpa(a: float, b: float) -> float:
    return abs((a - b + 180.0) % 360.0 - 180.0)


# -- flares ------------------------------------------------------------------------------------


def l2_header(header: fits.Header) -> fits.Header:
    """The WCS and observer keywords of an L2 product (``CDELT``/``PC`` form, identity ``PC``)
    from the header of a north-up real frame (SWAP's has a ``CD`` matrix and ``CROTA`` too)."""
    h = fits.Header()
    for key in ("CTYPE1", "CTYPE2", "CUNIT1", "CUNIT2", "CDELT1", "CDELT2", "CRPIX1", "CRPIX2", "CRVAL1",
                "CRVAL2", "HGLN_OBS", "HGLT_OBS", "DSUN_OBS", "RSUN_ARC", "DATE-OBS"):
        h[key] = header[key]
    h["PC1_1"], h["PC1_2"], h["PC2_1"], h["PC2_2"] = 1.0, 0.0, 0.0, 1.0
    return h


@functools.lru_cache(maxsize=1)
def _swap() -> tuple[np.ndarray, fits.Header]:
    img = read_image(SWAP)
    return (img.data * 100.0).astype(np.float32), img.header


def swap_scene(k: int = 2) -> tuple[np.ndarray, fits.Header]:
    """The real SWAP frame (radiance-like, x100) binned by ``k`` with its WCS fixed to match."""
    data, header = _swap()
    ny, nx = data.shape
    out = data[: ny // k * k, : nx // k * k].reshape(ny // k, k, nx // k, k).mean(axis=(1, 3))
    h = l2_header(header)
    for ax in ("1", "2"):
        h[f"CDELT{ax}"] = header[f"CDELT{ax}"] * k
        h[f"CRPIX{ax}"] = (header[f"CRPIX{ax}"] - 0.5) / k + 0.5
    return out.astype(np.float32), h


def sdi_scene(naxis: int = SDI_NAXIS, scale: float = SDI_SCALE) -> tuple[np.ndarray, fits.Header]:
    """The real SWAP frame resampled onto an SDI grid: ``naxis``^2 at ``scale`` arcsec/px, Sun
    centred (cubic spline; SWAP has no roll, CROTA2 = 0). Returns float32 data and its L2 header."""
    data, header = _swap()
    s_in = float(header["CDELT1"])
    c_in = float(header["CRPIX1"]) - 1.0, float(header["CRPIX2"]) - 1.0  # 0-based (x, y)
    c_out = (naxis - 1) / 2.0
    zoom = scale / s_in  # input pixels per output pixel
    out = ndimage.affine_transform(data, [zoom, zoom], offset=[c_in[1] - c_out * zoom, c_in[0] - c_out * zoom],
                                   output_shape=(naxis, naxis), order=3, output=np.float32, mode="nearest")
    h = l2_header(header)
    for ax in ("1", "2"):
        h[f"CDELT{ax}"] = scale
        h[f"CRPIX{ax}"] = c_out + 1.0
    return out, h


def flare_scene(full: bool) -> tuple[np.ndarray, fits.Header]:
    """SDI full frame (4608^2, 0.5 arcsec/px) or the small scene (SWAP binned 2x, 512^2)."""
    return sdi_scene() if full else swap_scene(2)


def noise_sigma_px(base: np.ndarray, scale: float) -> np.ndarray:
    """Per-pixel noise [image units]: ``(2 % of the scene + 2 % of the bright-disk median)``
    at :data:`REF_SCALE`, times ``REF_SCALE / scale`` (the same photons per unit solar area:
    per-pixel counts scale with the pixel area). The bright-disk median is that of the native
    SWAP frame above its 60th percentile. Ours, not an SDI figure (none is public)."""
    data, _ = _swap()
    floor = 0.02 * float(np.median(data[data > np.percentile(data, 60)]))
    out = np.abs(base, dtype=np.float32)
    out *= 0.02
    out += floor
    out *= REF_SCALE / scale
    return out


def _profile(h: float, rise: float = RISE_FRAMES, decay: float = DECAY_FRAMES) -> float:
    return math.exp(-0.5 * ((h - T_PEAK) / rise) ** 2) if h <= T_PEAK else math.exp(-(h - T_PEAK) / decay)


def _binned(frame: np.ndarray, f: int) -> np.ndarray:
    ny, nx = (frame.shape[0] // f) * f, (frame.shape[1] // f) * f
    return frame[:ny, :nx].reshape(ny // f, f, nx // f, f).mean(axis=(1, 3), dtype=np.float64)


def detector_noise(frames, f: int) -> np.ndarray:
    """Per-frame noise of each f x f macropixel as :func:`pipelines.detect.flares.detect_flares`
    measures it: robust scatter (1.4826 MAD) of the frame-to-frame changes / sqrt(2),
    floored by the median of its 5 x 5 neighbourhood [image units]. ``frames`` is any
    iterable of 2-D frames (read one at a time)."""
    cube = np.stack([_binned(np.asarray(fr), f) for fr in frames])
    d = np.diff(cube, axis=0)
    sigma = 1.4826 * np.median(np.abs(d - np.median(d, axis=0)), axis=0) / math.sqrt(2.0)
    return np.maximum(sigma, ndimage.median_filter(sigma, size=5, mode="nearest"))


class FlareSeries(Sequence):
    """A lazily made series: frame ``k`` is ``base + noise_k + injections * profile(k)``.

    The noise of frame ``k`` comes from its own seeded generator, so a frame asked for twice
    (the detector reads each once for its macropixels and again for the centroid) is the
    same; the last few frames are cached. Injections are stamps ``(y0, x0, array)`` of the
    excess at the peak, added in place.
    """

    def __init__(self, base: np.ndarray, sigma_px: np.ndarray, seed: tuple[int, ...], n: int,
                 profile=_profile, cache: int = 8):
        self.base, self.sigma_px, self.seed, self.n, self.profile = base, sigma_px, seed, n, profile
        self.stamps: list[tuple[int, int, np.ndarray]] = []
        self._frame = functools.lru_cache(maxsize=cache)(self._make)

    def __len__(self) -> int:
        return self.n

    def quiet(self, k: int) -> np.ndarray:
        """Frame ``k`` without the injections (float32)."""
        noise = np.random.default_rng((*self.seed, k)).standard_normal(self.base.shape, dtype=np.float32)
        noise *= self.sigma_px
        noise += self.base
        return noise

    def _make(self, k: int) -> np.ndarray:
        frame = self.quiet(k)
        w = self.profile(float(k))
        for y0, x0, stamp in self.stamps:
            frame[y0:y0 + stamp.shape[0], x0:x0 + stamp.shape[1]] += (w * stamp).astype(np.float32)
        return frame

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.n))]
        if k < 0:
            k += self.n
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self._frame(k)


def flare_sequence(base: np.ndarray, header: fits.Header, rng: np.random.Generator, n_inject: int,
                   sigmas=FLARE_SIGMAS, sigma_arcsec: float = 20.0, seed: tuple[int, ...] = (0,),
                   cadence_s: float = FLARE_CADENCE_S, n_frames: int = N_FRAMES):
    """A series with injections at random disk positions (r < 0.75 Rsun, >= 150 arcsec
    apart), each of a given number of sigmas: sigma is the per-frame noise of the macropixel
    at the injection centre as the detector measures it (:func:`detector_noise` of the same
    series without injections). Returns times, the lazy :class:`FlareSeries` and the truth
    ``[(x, y, k_sigma, relative amplitude), ...]``."""
    w = WCS(header, naxis=2)
    scale = abs(header["CDELT1"])
    f, _ = macropixel_factor(w, 10.0)
    rsun = float(header["RSUN_ARC"])
    times = [T0 + dt.timedelta(seconds=cadence_s * h) for h in range(n_frames)]
    series = FlareSeries(base, noise_sigma_px(base, scale), seed, n_frames)
    if n_inject == 0:
        return times, series, []
    noise = detector_noise((series.quiet(k) for k in range(n_frames)), f)
    truth, placed = [], []
    ks = [sigmas[i % len(sigmas)] for i in range(n_inject)]
    rng.shuffle(ks)
    half = int(math.ceil(5.0 * sigma_arcsec / scale))
    for k in ks:
        for _ in range(200):
            r, th = 0.75 * rsun * math.sqrt(rng.uniform()), rng.uniform(0, 2 * math.pi)
            x, y = r * math.cos(th), r * math.sin(th)
            if all(math.hypot(x - a, y - b) > 150.0 for a, b in placed):
                break
        placed.append((x, y))
        px, py = (float(v) for v in w.world_to_pixel_values(x / 3600.0, y / 3600.0))
        y0, x0 = max(0, int(py) - half), max(0, int(px) - half)
        y1, x1 = min(base.shape[0], int(py) + half + 1), min(base.shape[1], int(px) + half + 1)
        yy, xx = np.mgrid[y0:y1, x0:x1]
        g = np.exp(-((xx - px) ** 2 + (yy - py) ** 2) / (2 * (sigma_arcsec / scale) ** 2))
        iy, ix = int(py) // f, int(px) // f
        blk = (slice(iy * f - y0, iy * f + f - y0), slice(ix * f - x0, ix * f + f - x0))
        stamp_base = base[y0:y1, x0:x1].astype(np.float64)
        # peak excess of the macropixel = amp * mean(base * g) over it = k * its noise
        amp = k * float(noise[iy, ix]) / float(np.mean(stamp_base[blk] * g[blk]))
        series.stamps.append((y0, x0, (amp * stamp_base * g).astype(np.float32)))
        truth.append((x, y, k, amp))
    return times, series, truth


def validate_flares(n_sequences: int = 5, per_sequence: int = 6, seed: int = 2024,
                    params: FlareDetectionParams | None = None, name: str = "flares",
                    full: bool = False, log=None, scene: tuple[np.ndarray, fits.Header] | None = None) -> Result:
    """Recall (injections above 3 sigma), precision, timing and position errors.

    ``params`` None: the detector's defaults, as the detection service runs it. ``scene``
    (data, header) replaces :func:`flare_scene` (e.g. :func:`sdi_scene` at another size)."""
    base, header = scene if scene is not None else flare_scene(full)
    rng = np.random.default_rng(seed)
    res = Result(name)
    by_sigma: dict[float, list[int]] = {}
    t_start = time.perf_counter()
    for i_seq in range(n_sequences):
        times, frames, truth = flare_sequence(base, header, rng, per_sequence, seed=(seed, i_seq))
        dets = detect_flares(times, frames, header, params=params)
        res.n_detections += len(dets)
        matched_dets = set()
        for x, y, k, amp in truth:
            best = None
            for i, d in enumerate(dets):
                dist = math.hypot(d.hpc_x - x, d.hpc_y - y)
                if dist <= MATCH_ARCSEC and abs(d.peak_index - T_PEAK) <= MATCH_FRAMES:
                    if best is None or dist < best[1]:
                        best = (i, dist)
            hit = best is not None
            by_sigma.setdefault(k, [0, 0])
            by_sigma[k][0] += 1
            by_sigma[k][1] += hit
            if hit:
                matched_dets.add(best[0])
                d = dets[best[0]]
                if k > 3.0:
                    res.timing_err_s.append((d.peak_time - times[int(T_PEAK)]).total_seconds())
                    res.position_err_arcsec.append(best[1])
            if k > 3.0:
                res.n_truth += 1
                res.n_found += hit
        res.n_true_detections += len(matched_dets)
        if log:
            log(f"{name}: sequence {i_seq + 1}/{n_sequences}: {len(dets)} detections, {len(matched_dets)} true; "
                f"{time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    res.extra["recall_by_sigma"] = {k: (v[1], v[0]) for k, v in sorted(by_sigma.items())}
    res.extra["frame"] = f"{base.shape[1]}x{base.shape[0]} at {abs(header['CDELT1']):.2f} arcsec/px"
    return res


def flare_false_positives(n_sequences: int = 2, n_frames: int = 60, seed: int = 99, full: bool = False,
                          params: FlareDetectionParams | None = None, name: str = "flares, quiet",
                          log=None) -> Result:
    """Detections on the real scene with noise and no injection, at the SDI cadence (60 s):
    all are false. ``extra['hours']`` is the time searched: the span of the frames that can
    hold a detection (those with a full pre-flare background)."""
    base, header = flare_scene(full)
    res = Result(name)
    t_start = time.perf_counter()
    p = params or FlareDetectionParams()
    # frames before lag + min_background_frames cadences cannot hold a detection
    first_usable = int(math.ceil(p.background_lag_s / SDI_CADENCE_S)) + p.min_background_frames
    hours = 0.0
    for i_seq in range(n_sequences):
        times, frames, _ = flare_sequence(base, header, np.random.default_rng(seed), 0, seed=(seed, i_seq),
                                          cadence_s=SDI_CADENCE_S, n_frames=n_frames)
        dets = detect_flares(times, frames, header, params=params)
        res.n_detections += len(dets)
        hours += (n_frames - first_usable) * SDI_CADENCE_S / 3600.0
        res.rows += [f"| {i_seq} | {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | {d.peak_enhancement:.3f} "
                     f"| {len(d.detection_frames)} |" for d in dets]
        if log:
            log(f"{name}: sequence {i_seq + 1}/{n_sequences}: {len(dets)} detections; "
                f"{time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    res.extra["hours"] = hours
    res.extra["frame"] = f"{base.shape[1]}x{base.shape[0]} at {abs(header['CDELT1']):.2f} arcsec/px"
    # relative noise of the 10-arcsec macropixels on the disk (the quantity the relative
    # threshold is compared with)
    w = WCS(header, naxis=2)
    f, _ = macropixel_factor(w, 10.0)
    noise = detector_noise((frames.quiet(k) for k in range(min(n_frames, 28))), f)
    level = _binned(base, f)
    px0, py0 = (float(v) for v in w.world_to_pixel_values(0.0, 0.0))
    yy, xx = np.indices(level.shape)
    r = np.hypot((xx + 0.5) * f - 0.5 - px0, (yy + 0.5) * f - 0.5 - py0) * abs(header["CDELT1"])
    disk = r < 0.95 * float(header["RSUN_ARC"])
    rel = noise[disk] / level[disk]
    res.extra["rel_noise_pct"] = [float(v) for v in np.percentile(100 * rel, [1, 5, 50, 95])]
    return res


EIT_SEQUENCE = ROOT / "sample-data" / "real" / "full-disk" / "eit_sequence"
GOES_2004 = ROOT / "sample-data" / "real" / "events" / "goes_xrs_reports" / "goes-xrs-report_2004.txt"


def flare_real_sequence(params: FlareDetectionParams | None = None, name: str = "flares, real EIT") -> Result:
    """The detector on a real evolving sequence: the SOHO/EIT 195 A frames of 2004-03-01
    00-12 UT (``sample-data/real/full-disk/eit_sequence``; the two 171 A frames are left
    out), hourly, 128^2. Their header keeps the native CDELT (2.63 arcsec) although the
    frames are rebinned 8x (MANIFEST.md): the WCS is rebuilt at 21.04 arcsec/px, centre
    CRPIX 64.5, radius SOLAR_R x 2.63 arcsec. DN are divided by the exposure time. Nothing is
    injected: every detection is compared with the GOES XRS event list of that day
    (``goes-xrs-report_2004.txt``) in ``rows``; ``extra['hours']`` is the span searched."""
    frames, times, header = [], [], None
    for path in sorted(EIT_SEQUENCE.glob("efz*.fits")):
        with fits.open(path) as hdul:
            hd = hdul[0].header
            if int(hd["WAVELNTH"]) != 195:
                continue
            frames.append(np.asarray(hdul[0].data, dtype=np.float32) / np.float32(hd["EXPTIME"]))
        times.append(dt.datetime.fromisoformat(hd["DATE_OBS"].rstrip("Z")).replace(tzinfo=dt.UTC))
        if header is None:
            header = fits.Header()
            header["CTYPE1"], header["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
            header["CUNIT1"] = header["CUNIT2"] = "arcsec"
            header["CDELT1"] = header["CDELT2"] = float(hd["CDELT1"]) * 8
            header["CRPIX1"], header["CRPIX2"] = float(hd["CRPIX1"]), float(hd["CRPIX2"])
            header["CRVAL1"] = header["CRVAL2"] = 0.0
            header["RSUN_ARC"] = float(hd["SOLAR_R"]) * float(hd["CDELT1"])
    t_start = time.perf_counter()
    dets = detect_flares(times, frames, header, params=params)
    res = Result(name, n_detections=len(dets), seconds=time.perf_counter() - t_start)
    p = params or FlareDetectionParams()
    sec = np.array([(t - times[0]).total_seconds() for t in times])
    first = next(k for k in range(len(times))
                 if (sec[k] - sec[:k] >= p.background_lag_s).sum() >= p.min_background_frames)
    res.extra["hours"] = float(sec[-1] - sec[first]) / 3600.0
    res.extra["frame"] = f"128x128 at {header['CDELT1']:.2f} arcsec/px, {len(frames)} frames hourly"
    goes = [line for line in GOES_2004.read_text().splitlines() if line[5:11] == "040301"]
    res.extra["goes"] = []
    for g in goes:  # '31777YYMMDD  start end peak location ... class (letter, then 2 digits = x.y)'
        m = re.search(r"\s([ABCMX])\s?(\d)(\d)\s", g[34:])
        cls = f"{m.group(1)}{m.group(2)}.{m.group(3)}" if m else "?"
        res.extra["goes"].append(f"{g[13:17]}-{g[18:22]} UT, peak {g[23:27]}, {g[28:34]}, {cls}")
    res.extra["peak_enhancement"] = [d.peak_enhancement for d in dets]
    peaks = [dt.datetime(2004, 3, 1, int(g[23:25]), int(g[25:27]), tzinfo=dt.UTC) for g in goes]
    # a detection "is" a GOES event if its start-end span, widened by one frame, holds the GOES peak
    res.n_true_detections = sum(any(d.start_time - dt.timedelta(hours=1) <= t <= d.end_time + dt.timedelta(hours=1)
                                    for t in peaks) for d in dets)
    res.rows = [f"| {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | {d.peak_enhancement:.2f} | "
                f"{', '.join(times[k].strftime('%H:%M') for k in d.detection_frames)} |" for d in dets]
    return res


# -- evolving scenes (issue 14, item 7) ---------------------------------------------------------

#: Cadences of the evolving-scene validation [s]: LST's 1-4 min (SDI 1 min, WST 2 min routine).
EVOLVING_CADENCES = (60.0, 120.0, 240.0)
#: Series length [s]: 30 min of pre-flare background, then the flares (GOES start 35-60 min
#: in), 140 min in all (at 4 min, 36 frames: the detector's robust baseline needs 30 with a
#: background).
EVOLVING_SPAN_S = 140 * 60.0
#: SDI injections: peak excess relative to the local scene (the macropixel contrast at the
#: centre is ~0.8 of it for a 15-arcsec Gaussian); recall is scored over those >= SDI_GATE_AMP.
SDI_AMPS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
SDI_GATE_AMP = 0.2
#: WST injections: peak excess relative to the local quiet-Sun level, around Jing et al.'s 8 %;
#: a white-light flare by their criterion is an injection above it (>= WST_GATE_AMP scored).
WST_AMPS = (0.04, 0.06, 0.12, 0.2, 0.3)
WST_GATE_AMP = 0.12
#: (profile, stretch) drawn for each injection: real GOES shapes (pipelines.simulation.evolving).
SDI_PROFILES = (("dxrsb", 1.0), ("dxrsb", 2.0), ("xrsa", 0.5), ("xrsa", 1.0))
WST_PROFILES = (("dxrsb", 1.0), ("dxrsb", 2.0))


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Two-sided 95 % Clopper-Pearson interval of k successes in n (scipy ``binomtest``)."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def poisson_upper(k: int, exposure: float) -> float:
    """One-sided 95 % upper limit of a Poisson rate with k events in ``exposure`` (chi-square:
    ``chi2.ppf(0.95, 2 (k + 1)) / 2``; 3.0 events for k = 0)."""
    from scipy.stats import chi2

    return float(chi2.ppf(0.95, 2 * (k + 1)) / 2.0) / exposure


@functools.lru_cache(maxsize=4)
def evolving_base(kind: str, naxis: int) -> tuple[np.ndarray, fits.Header]:
    """The real base scene of the evolving series: SDI-like Lyman-alpha from SWAP, or a 360 nm
    continuum from MDI (:mod:`pipelines.simulation.evolving`), ``naxis``^2 over SDI's field."""
    from pipelines.simulation import evolving as EV

    return EV.sdi_lya_scene(naxis) if kind == "sdi" else EV.wst_continuum_scene(naxis)


def _evolving_series(kind: str, naxis: int, cadence_s: float, seed: int, rotate: bool = True,
                     red_scale: float = 1.0):
    """An evolving series; ``red_scale`` multiplies both red-noise amplitudes (sensitivity runs)."""
    from pipelines.simulation import evolving as EV

    base, header = evolving_base(kind, naxis)
    n = int(EVOLVING_SPAN_S // cadence_s) + 1
    times = [T0 + dt.timedelta(seconds=cadence_s * k) for k in range(n)]
    red = EV.SDI_RED_NOISE if kind == "sdi" else EV.WST_RED_NOISE
    if red_scale != 1.0:
        red = dataclasses.replace(red, quiet_rms=red.quiet_rms * red_scale, active_rms=red.active_rms * red_scale)
    return EV.EvolvingSeries(base, header, times, red, seed=seed, rotate=rotate,
                             reference="scene" if kind == "sdi" else "quiet")


def _place(series, rng: np.random.Generator, n: int, kind: str) -> list[tuple[float, float]]:
    """Random disk positions (r < 0.85 Rsun): SDI anywhere, >= 150 arcsec apart; WST in or next
    to active regions (white-light flares sit at spots), >= 60 arcsec apart."""
    h = series.header
    rsun = float(h["RSUN_ARC"])
    w = WCS(h, naxis=2)
    cands = None
    if kind == "wst":
        act = series._amp > 0.5 * (series.red.quiet_rms + series.red.active_rms)
        yy, xx = np.nonzero(act)
        lon, lat = w.pixel_to_world_values(xx.astype(float), yy.astype(float))
        cx, cy = lon * 3600.0, lat * 3600.0
        ok = np.hypot(cx, cy) < 0.85 * rsun
        cands = (cx[ok], cy[ok])
    placed: list[tuple[float, float]] = []
    sep = 150.0 if kind == "sdi" else 60.0
    for _ in range(n):
        for _ in range(500):
            if cands is not None and cands[0].size:
                i = int(rng.integers(cands[0].size))
                x, y = float(cands[0][i]) + rng.normal(0, 5.0), float(cands[1][i]) + rng.normal(0, 5.0)
            else:
                r, th = 0.85 * rsun * math.sqrt(rng.uniform()), rng.uniform(0, 2 * math.pi)
                x, y = r * math.cos(th), r * math.sin(th)
            if all(math.hypot(x - a, y - b) > sep for a, b in placed):
                break
        placed.append((x, y))
    return placed


def _detector(kind: str, params=None):
    from pipelines.detect.whitelight import detect_white_light_flares

    if kind == "sdi":
        return lambda times, frames, header: detect_flares(times, frames, header, params=params)
    return lambda times, frames, header: detect_white_light_flares(times, frames, header, params=params)


def validate_evolving(kind: str = "sdi", naxis: int = 256, cadence_s: float = 60.0, n_sequences: int = 2,
                      per_sequence: int = 6, seed: int = 14, params=None, name: str | None = None,
                      rotate: bool = True, log=None) -> Result:
    """Recall and precision on evolving scenes (:mod:`pipelines.simulation.evolving`).

    ``kind`` 'sdi': SDI flare detector (defaults when ``params`` is None) on the Lyman-alpha
    scene, amplitudes :data:`SDI_AMPS` relative to the local scene, 15-arcsec Gaussians;
    'wst': the white-light detector on the 360 nm scene, amplitudes :data:`WST_AMPS` relative
    to the local quiet-Sun level (Jing et al. 2024's normalisation), 8-arcsec Gaussians (WLF areas: median 225 arcsec2, Jing et al.), in
    active regions. A detection matches an injection within 30 arcsec (WST: 20) whose profile
    peak is within max(2 cadences, 5 min) of the detected peak. Recall: injections at or above
    the gate amplitude; precision: detections matching an injection at or above the detector's
    threshold (SDI: any injection; WST: >= 8 %, so detections of sub-threshold injections are
    false by Jing et al.'s criterion). ``extra``: counts by amplitude, 95 % Clopper-Pearson
    intervals."""
    name = name or f"{kind} evolving {cadence_s:.0f} s"
    amps, gate = (SDI_AMPS, SDI_GATE_AMP) if kind == "sdi" else (WST_AMPS, WST_GATE_AMP)
    profiles = SDI_PROFILES if kind == "sdi" else WST_PROFILES
    match_arcsec, sigma_arcsec = (30.0, 15.0) if kind == "sdi" else (20.0, 8.0)
    real_threshold = 0.0 if kind == "sdi" else 0.08
    rng = np.random.default_rng((seed, int(cadence_s)))
    res = Result(name)
    by_amp: dict[float, list[int]] = {}
    detect = _detector(kind, params)
    t_start = time.perf_counter()
    tol = dt.timedelta(seconds=max(2 * cadence_s, 300.0))
    for i_seq in range(n_sequences):
        series = _evolving_series(kind, naxis, cadence_s, seed=seed * 1000 + i_seq, rotate=rotate)
        ks = [amps[i % len(amps)] for i in range(per_sequence)]
        rng.shuffle(ks)
        for (x, y), a in zip(_place(series, rng, per_sequence, kind), ks, strict=True):
            prof, stretch = profiles[int(rng.integers(len(profiles)))]
            t0 = T0 + dt.timedelta(seconds=float(rng.uniform(35, 60)) * 60.0)
            series.inject(x, y, a, t0, prof, stretch, sigma_arcsec=sigma_arcsec)
        dets = detect(series.times, series, series.header)
        res.n_detections += len(dets)
        used: set[int] = set()
        true_dets: set[int] = set()
        for tr in series.flares:
            best = None
            for i, d in enumerate(dets):
                dist = math.hypot(d.hpc_x - tr.x, d.hpc_y - tr.y)
                if dist <= match_arcsec and abs(d.peak_time - tr.t_peak) <= tol and (best is None or dist < best[1]):
                    best = (i, dist)
            hit = best is not None
            by_amp.setdefault(tr.amplitude, [0, 0])
            by_amp[tr.amplitude][0] += 1
            by_amp[tr.amplitude][1] += hit
            if hit:
                used.add(best[0])
                if tr.amplitude >= real_threshold:
                    true_dets.add(best[0])
                if tr.amplitude >= gate:
                    res.timing_err_s.append((dets[best[0]].peak_time - tr.t_peak).total_seconds())
                    res.position_err_arcsec.append(best[1])
            if tr.amplitude >= gate:
                res.n_truth += 1
                res.n_found += hit
        res.n_true_detections += len(true_dets)
        res.rows += [f"| {name} | {i_seq} | {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | "
                     f"{d.peak_enhancement:.3f} |" for i, d in enumerate(dets) if i not in used]
        if log:
            log(f"{name}: sequence {i_seq + 1}/{n_sequences}: {len(dets)} detections, {len(true_dets)} true; "
                f"{time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    res.extra.update(
        kind=kind, cadence_s=cadence_s, naxis=naxis, gate=gate, rotate=rotate, n_sequences=n_sequences,
        frame=f"{naxis}x{naxis} at {abs(series.header['CDELT1']):.2f} arcsec/px",
        recall_by_amp=[[a, h, n] for a, (n, h) in sorted(by_amp.items())],
        recall_ci=clopper_pearson(res.n_found, res.n_truth),
        precision_ci=clopper_pearson(res.n_true_detections, res.n_detections))
    return res


def evolving_false_alarms(kind: str = "sdi", naxis: int = 256, cadence_s: float = 60.0, n_sequences: int = 2,
                          seed: int = 41, params=None, name: str | None = None, rotate: bool = True,
                          log=None, red_scale: float = 1.0) -> Result:
    """Detections on quiet evolving sequences (nothing injected): all false. ``extra['days']``:
    time searched (frames with a full pre-flare background); rate per day and its one-sided
    95 % Poisson upper limit. ``red_scale``: red-noise amplitudes x this (sensitivity)."""
    name = name or f"{kind} quiet {cadence_s:.0f} s"
    detect = _detector(kind, params)
    res = Result(name)
    t_start = time.perf_counter()
    lag = 600.0 + 3 * cadence_s  # frames before the lag plus 3 background frames cannot hold a detection
    days = 0.0
    for i_seq in range(n_sequences):
        series = _evolving_series(kind, naxis, cadence_s, seed=seed * 1000 + i_seq, rotate=rotate,
                                  red_scale=red_scale)
        dets = detect(series.times, series, series.header)
        res.n_detections += len(dets)
        days += max(0.0, EVOLVING_SPAN_S - lag) / 86400.0
        res.rows += [f"| {name} | {i_seq} | {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | "
                     f"{d.peak_enhancement:.3f} |" for d in dets]
        if log:
            log(f"{name}: sequence {i_seq + 1}/{n_sequences}: {len(dets)} detections; "
                f"{time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    base, header = evolving_base(kind, naxis)
    res.extra.update(kind=kind, cadence_s=cadence_s, naxis=naxis, days=days, rotate=rotate, red_scale=red_scale,
                     n_sequences=n_sequences,
                     frame=f"{naxis}x{naxis} at {abs(header['CDELT1']):.2f} arcsec/px",
                     per_day=res.n_detections / days if days else float("nan"),
                     per_day_upper95=poisson_upper(res.n_detections, days) if days else float("nan"))
    return res


# -- hourly series (issue 27, item 7) ------------------------------------------------------------

#: Hourly series: cadence [s], frames (the demo's EIT day: 13 hourly frames), working size [px]
#: (9 arcsec/px: one pixel per 10-arcsec macropixel).
HOURLY_CADENCE_S, HOURLY_FRAMES, HOURLY_NAXIS = 3600.0, 13, 256
#: Seeds of the simulated hourly series: those looked at while choosing the detector's sparse
#: settings, and the held-out ones whose rates are reported (never used to choose).
HOURLY_TUNING_SEEDS = (1, 2, 3, 4, 5, 6)
HOURLY_HELDOUT_SEEDS = (101, 102, 103, 104, 105, 106)
#: Hourly injections: peak excess relative to the local scene (the demo's flare: 2.0), recall
#: scored over those >= HOURLY_GATE_AMP; GOES shapes stretched to last 2-4 h (xrsb x4: rise
#: 100 min; xrsa x4 and x6), long enough to be sampled by two hourly frames. Longer ones (x8,
#: ~6 h in 13 frames) change half of a macropixel's frame-to-frame differences and raise the
#: detector's robust noise with them: a known limit of short sparse series (not scored).
HOURLY_AMPS = (0.5, 1.0, 1.5, 2.0, 3.0)
HOURLY_GATE_AMP = 1.0
HOURLY_PROFILES = (("xrsb", 4.0), ("xrsa", 4.0), ("xrsa", 6.0))
HOURLY_SIGMA_ARCSEC = 30.0  # the demo flare's kernel size
HOURLY_MATCH_ARCSEC = 40.0


def hourly_series(seed: int, naxis: int = HOURLY_NAXIS, n_frames: int = HOURLY_FRAMES):
    """A simulated hourly SDI series: the evolving Lyman-alpha scene
    (:mod:`pipelines.simulation.evolving`) with differential rotation, the fast red noise
    (:data:`~pipelines.simulation.evolving.SDI_RED_NOISE`, independent from hour to hour) and
    the hour-scale evolution (:data:`~pipelines.simulation.evolving.SDI_SLOW_EVOLUTION`)."""
    from pipelines.simulation import evolving as EV

    base, header = evolving_base("sdi", naxis)
    times = [T0 + dt.timedelta(seconds=HOURLY_CADENCE_S * k) for k in range(n_frames)]
    return EV.EvolvingSeries(base, header, times, EV.SDI_RED_NOISE, seed=seed, rotate=True, reference="scene",
                             slow=EV.SDI_SLOW_EVOLUTION)


def validate_hourly(seeds=HOURLY_HELDOUT_SEEDS, per_sequence: int = 5, params=None, naxis: int = HOURLY_NAXIS,
                    inject: bool = True, name: str | None = None, log=None) -> Result:
    """The SDI flare detector on simulated hourly series (:func:`hourly_series`), one per seed.

    ``inject``: ``per_sequence`` flares each (amplitudes :data:`HOURLY_AMPS`, shapes
    :data:`HOURLY_PROFILES`, GOES start 3-8 h into the series, >= 150 arcsec apart); a
    detection matches one within :data:`HOURLY_MATCH_ARCSEC` and 2 h of its profile peak.
    Recall: over injections >= :data:`HOURLY_GATE_AMP`; every detection matching none is a
    false alarm. Without injections all detections are false alarms. ``extra``: ``hours``
    searched (frames with a background), ``false_alarms``, ``per_hour`` and its one-sided 95 %
    Poisson upper limit, recall by amplitude and its 95 % Clopper-Pearson interval."""
    name = name or ("sdi hourly, injected" if inject else "sdi hourly, quiet")
    res = Result(name)
    t_start = time.perf_counter()
    by_amp: dict[float, list[int]] = {}
    false = 0
    hours = 0.0
    for seed in seeds:
        series = hourly_series(seed, naxis)
        rng = np.random.default_rng((seed, 27))
        if inject:
            amps = [HOURLY_AMPS[i % len(HOURLY_AMPS)] for i in range(per_sequence)]
            rng.shuffle(amps)
            for (x, y), a in zip(_place(series, rng, per_sequence, "sdi"), amps, strict=True):
                prof, stretch = HOURLY_PROFILES[int(rng.integers(len(HOURLY_PROFILES)))]
                t0 = T0 + dt.timedelta(hours=float(rng.uniform(3.0, 8.0)))
                series.inject(x, y, float(a), t0, prof, stretch, sigma_arcsec=HOURLY_SIGMA_ARCSEC)
        dets = detect_flares(series.times, series, series.header, params=params)
        res.n_detections += len(dets)
        used: set[int] = set()
        for tr in series.flares:
            hits = [i for i, d in enumerate(dets) if math.hypot(d.hpc_x - tr.x, d.hpc_y - tr.y) <= HOURLY_MATCH_ARCSEC
                    and abs((d.peak_time - tr.t_peak).total_seconds()) <= 7200.0]
            used |= set(hits)
            by_amp.setdefault(tr.amplitude, [0, 0])
            by_amp[tr.amplitude][0] += 1
            by_amp[tr.amplitude][1] += bool(hits)
            if tr.amplitude >= HOURLY_GATE_AMP:
                res.n_truth += 1
                res.n_found += bool(hits)
        res.n_true_detections += len(used)
        false += len(dets) - len(used)
        res.rows += [f"| {name} | {seed} | {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | "
                     f"{d.peak_enhancement:.2f} |" for i, d in enumerate(dets) if i not in used]
        # searched: frames with min_background_frames earlier frames at least the lag before
        hours += (HOURLY_FRAMES - 1 - (params or FlareDetectionParams()).min_background_frames) \
            * HOURLY_CADENCE_S / 3600.0
        if log:
            log(f"{name}: seed {seed}: {len(dets)} detections, {len(dets) - len(used)} false")
    res.seconds = time.perf_counter() - t_start
    res.extra.update(seeds=list(seeds), hours=hours, false_alarms=false,
                     per_hour=false / hours if hours else float("nan"),
                     per_hour_upper95=poisson_upper(false, hours) if hours else float("nan"),
                     recall_by_amp=[[a, h, n] for a, (n, h) in sorted(by_amp.items())],
                     recall_ci=clopper_pearson(res.n_found, res.n_truth))
    return res


def demo_eit_series(params=None, naxis: int = 1152, work: Path | None = None) -> Result:
    """The detector on the demo's SDI series: the simulator's 13 hourly frames of the real
    SOHO/EIT 2004-03-01 sequence with its injected flare (:data:`pipelines.simulation.series.FLARE`,
    03:00-09:00, peak 05:00 at (-400, -350) arcsec), simulated raw at the demo's size (1152 px,
    seed 0) and calibrated to L2 (:func:`pipelines.calibration.calibrate_frame`, default options,
    the simulator's masters), searched with the L2 DQ. ``n_true_detections``: detections within
    30 arcsec of the injected flare; every other detection is a false alarm (``extra['false_alarms']``)."""
    import tempfile

    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.simulation import simulate
    from pipelines.simulation.series import FLARE

    with tempfile.TemporaryDirectory(dir=work) as tmp:
        out = Path(tmp)
        simulate(out, channels=["SDI"], naxis=naxis, seed=0)
        cals = {}
        for path in sorted((out / "calibration").glob("*.fits")):
            cals[fits.getheader(path)["CALKIND"]] = load_calibration_master(path)
        times, frames, dqs, headers = [], [], [], []
        for path in sorted((out / "raw").glob("*.fits")):
            raw = read_image(path)
            l2 = calibrate_frame(raw.data, raw.header, cals)
            frames.append(l2.data)
            dqs.append(l2.dq)
            headers.append(l2.header)
            times.append(l2.header["DATE-OBS"])
    t_start = time.perf_counter()
    dets = detect_flares(times, frames, headers, dq=dqs, params=params)
    res = Result("demo EIT hourly series", n_truth=1, n_detections=len(dets), seconds=time.perf_counter() - t_start)
    real = [d for d in dets if math.hypot(d.hpc_x - FLARE["hpc_x"], d.hpc_y - FLARE["hpc_y"]) <= 30.0]
    res.n_found = res.n_true_detections = min(1, len(real))
    res.extra.update(false_alarms=len(dets) - len(real), naxis=naxis,
                     injected=[(d.start_time.strftime("%H:%M"), d.peak_time.strftime("%H:%M"),
                                d.end_time.strftime("%H:%M")) for d in real])
    res.rows = [f"| {d.peak_time:%H:%M} | {d.hpc_x:.0f}, {d.hpc_y:.0f} | {d.peak_enhancement:.2f} | "
                f"{', '.join(str(k) for k in d.detection_frames)} |" for d in dets]
    return res


def run_hourly(which: str = "heldout", params=None, log=None) -> list[Result]:
    """The hourly mode: the demo's EIT series, then quiet and injected simulated hourly series
    on the held-out (or, ``which='tuning'``, the tuning) seeds."""
    seeds = HOURLY_HELDOUT_SEEDS if which == "heldout" else HOURLY_TUNING_SEEDS
    return [demo_eit_series(params),
            validate_hourly(seeds, params=params, inject=False, log=log),
            validate_hourly(seeds, params=params, inject=True, log=log)]


#: Size of the evolving-scene report [px] (SDI's field, 4608 x 0.5 arcsec, resampled) and of
#: the gates test; sequences per cadence (injected and quiet).
EVOLVING_REPORT_NAXIS, EVOLVING_TEST_NAXIS = 512, 256
EVOLVING_REPORT_SEQUENCES = 2
#: Cadence [s] of the SDI sensitivity run with the red-noise amplitudes doubled (quiet only).
EVOLVING_RED2_CADENCE = 120.0


def run_evolving(kinds=("sdi", "wst"), naxis: int = EVOLVING_REPORT_NAXIS,
                 n_sequences: int = EVOLVING_REPORT_SEQUENCES, cache: Path | None = None, log=None) -> list[Result]:
    """All evolving-scene parts (defaults; for WST also the 1.1.0 ratio for comparison)."""
    from pipelines.detect.whitelight import WhiteLightParams

    out = []
    for kind in kinds:
        for cad in sorted(EVOLVING_CADENCES, reverse=True):  # the cheap sparse cadences first
            runs = [("inj", validate_evolving, {}), ("quiet", evolving_false_alarms, {})]
            if kind == "sdi" and cad == EVOLVING_RED2_CADENCE:
                runs.append(("quiet_red2", evolving_false_alarms,
                             dict(red_scale=2.0, name=f"sdi quiet {cad:.0f} s, red noise x2")))
            if kind == "wst":
                runs.append(("inj_pre", validate_evolving, dict(params=WhiteLightParams(normalisation="pre"),
                                                               name=f"wst evolving {cad:.0f} s, (I-I0)/I0")))
            for tag, fn, kw in runs:
                r = fn(kind, naxis, cad, n_sequences=n_sequences, log=log, **kw)
                r.extra["tag"] = tag
                out.append(r)
                if cache:
                    cache.mkdir(parents=True, exist_ok=True)
                    _save(r, cache / f"evolving_{kind}_{int(cad)}_{tag}.json")
    return out


def _ci(lo_hi) -> str:
    lo, hi = lo_hi
    return "—" if not np.isfinite(lo) else f"[{lo:.2f}, {hi:.2f}]"


def evolving_section(results: list[Result]) -> list[str]:
    """The report section of the evolving-scene validation."""
    from pipelines.detect import flares as FL
    from pipelines.detect import whitelight as WL

    p, w = FL.FlareDetectionParams(), WL.WhiteLightParams()
    quiet = {(r.extra["kind"], r.extra["cadence_s"]): r for r in results if r.extra.get("tag") == "quiet"}
    lines = ["## Evolving backgrounds (issue 14, item 7): supersedes the static-scene figures for realism", "",
             "Produced by `benchmarks/validate_detection.py --evolving` (frame sizes per row, over SDI's "
             "38.4-arcmin field, 4608 x 0.5 arcsec, resampled; the old sections above stay, on static scenes). "
             "Scenes (`pipelines/simulation/evolving.py`): the real SWAP 17.4 nm frame of 2012-01-01 as an SDI-like "
             "Lyman-alpha scene, the real MDI continuum of 2010-10-15 as a 360 nm scene; differential rotation "
             "(sunpy, Howard et al. 1990 synodic), red-noise (AR(1)) brightness fluctuations (SDI: 3 % quiet Sun, "
             "6 % active regions, 10 min, 10 arcsec; WST: 1.5 % / 3 %, 5 min, 3 arcsec; assumptions, see the "
             "module), photon-like noise (2 % per pixel at the disk median at 6.32 arcsec/px), 140-min series. "
             "Flares: the real GOES-15 XRS M2.5 flare of 2011-06-07 (XRS-A, and the XRS-B time derivative, the "
             "impulsive shape), stretched x0.5-2; SDI amplitudes relative to the local scene "
             f"{', '.join(f'{a:g}' for a in SDI_AMPS)} (recall over >= {SDI_GATE_AMP:g}), 15-arcsec Gaussians, anywhere "
             f"on the disk; WST amplitudes relative to the local quiet Sun {', '.join(f'{a:g}' for a in WST_AMPS)} "
             f"(recall over >= {WST_GATE_AMP:g}; detections of injections below 8 % count as false, Jing et al.'s "
             "criterion), 8-arcsec Gaussians in active regions. Intervals: two-sided 95 % Clopper-Pearson "
             "(`scipy.stats.binomtest`); false alarms: nothing injected, rate per day of searched time, one-sided "
             "95 % Poisson upper limit. Detector defaults as the detection service runs them.", "",
             "| detector | cadence | recall [95 % CI] | precision [95 % CI] | false alarms/day [95 % upper] | parameters |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if str(r.extra.get("tag")).startswith("quiet"):
            continue
        kind, cad = r.extra["kind"], r.extra["cadence_s"]
        q = quiet.get((kind, cad))
        fa = (f"{q.extra['per_day']:.0f} ({q.n_detections} in {24 * q.extra['days']:.1f} h) "
              f"[{q.extra['per_day_upper95']:.0f}]") if q and r.extra.get("tag") == "inj" else "—"
        if kind == "sdi":
            par = (f"SDI defaults {FL.DETECTOR_VERSION}: white {p.noise_sigma:g} sigma, red {p.red_noise_sigma:g} sigma, "
                   f"{100 * p.detection_threshold:g} %, robust baseline {p.robust_baseline}, corotate {p.corotate}")
        elif r.extra.get("tag") == "inj":
            par = (f"WST defaults {WL.FRM_VERSION}: (I - I0) / I_QS >= {w.threshold:g} (Jing et al. 2024), "
                   f"{w.noise_sigma:g} sigma")
        else:
            par = "WST, 1.1.0 ratio (I - I0) / I0 >= 0.08, otherwise defaults (comparison)"
        prec = (f"{r.precision:.2f} ({r.n_true_detections}/{r.n_detections}) {_ci(r.extra['precision_ci'])}"
                if r.n_detections else "— (0 detections)")
        lines.append(f"| {r.name} ({r.extra['frame']}) | {cad / 60:.0f} min | {r.recall:.2f} ({r.n_found}/{r.n_truth}) "
                     f"{_ci(r.extra['recall_ci'])} | {prec} "
                     f"| {fa} | {par} |")
    lines += ["", "Recall by injected amplitude (found/injected):", "",
              "| detector | " + " | ".join(f"{a:g}" for a in sorted(set(SDI_AMPS) | set(WST_AMPS))) + " |",
              "|---|" + "---|" * len(set(SDI_AMPS) | set(WST_AMPS))]
    for r in results:
        if str(r.extra.get("tag")).startswith("quiet"):
            continue
        d = {float(a): (h, n) for a, h, n in r.extra["recall_by_amp"]}
        lines.append(f"| {r.name} | " + " | ".join(f"{d[a][0]}/{d[a][1]}" if a in d else ""
                                                   for a in sorted(set(SDI_AMPS) | set(WST_AMPS))) + " |")
    def n_seq(r: Result) -> int:  # results saved before n_sequences was recorded: from the time searched
        if r.extra.get("n_sequences"):
            return int(r.extra["n_sequences"])
        per = (EVOLVING_SPAN_S - 600.0 - 3 * r.extra["cadence_s"]) / 86400.0
        return int(round(r.extra["days"] / per)) if "days" in r.extra else 0

    sdi_seq = max((n_seq(r) for r in results if r.extra["kind"] == "sdi"), default=0)
    lines += ["", f"Commands: `--evolving sdi --evolving-naxis 256 --evolving-sequences {sdi_seq or 'N'} --cache DIR`, "
              "`--evolving wst --evolving-naxis 384 --evolving-sequences 1 --cache DIR` (two processes, "
              "`nice -n 10`), then `--evolving report --cache DIR`."]
    red2 = [r for r in results if r.extra.get("tag") == "quiet_red2"]
    if red2:
        lines += ["", "Sensitivity to the red-noise assumption (SDI defaults, quiet sequences, red-noise amplitudes "
                  "doubled: 6 % quiet Sun, 12 % active regions, otherwise as above):", ""]
        lines += [f"* {r.name} ({r.extra['frame']}): {r.n_detections} false alarms in {24 * r.extra['days']:.1f} h, "
                  f"{r.extra['per_day']:.1f}/day [95 % upper {r.extra['per_day_upper95']:.1f}]" for r in red2]

    def sdi_pairs():
        for r in results:
            if r.extra["kind"] == "sdi" and r.extra.get("tag") == "inj":
                yield r, quiet.get(("sdi", r.extra["cadence_s"]))

    def ge(r, amp):  # found / injected at or above amp
        rows = [(h, n) for a, h, n in r.extra["recall_by_amp"] if a >= amp - 1e-9]
        return sum(h for h, _ in rows), sum(n for _, n in rows)

    fa_txt = "; ".join(f"{r.extra['cadence_s'] / 60:.0f} min: {q.n_detections} in {24 * q.extra['days']:.1f} h "
                       f"[95 % upper {q.extra['per_day_upper95']:.1f}/day]" for r, q in sdi_pairs() if q)
    rec_txt = "; ".join(f"{r.extra['cadence_s'] / 60:.0f} min: >= 0.3 {ge(r, 0.3)[0]}/{ge(r, 0.3)[1]} "
                        f"{_ci(clopper_pearson(*ge(r, 0.3)))}, >= 0.5 {ge(r, 0.5)[0]}/{ge(r, 0.5)[1]}"
                        for r, _ in sdi_pairs())
    lines += ["", f"What this says (runs of 2026-12-03 on a shared 2-core machine; SDI {sdi_seq} injected and "
              f"{sdi_seq} quiet sequences per cadence at 256 px, WST one of each at 384 px; the SDI defaults were "
              "chosen on the first 3-4 of these seeds at 2 and 4 min, so these runs are not an independent test "
              "set; the fast tests of `tests/test_detection_gates.py` use other seeds):", "",
              f"* **SDI {FL.DETECTOR_VERSION}: the catalogue no longer floods.** False alarms on quiet evolving "
              f"sequences: {fa_txt}. Detector 1.3.0 reported 14,479 / 5,191 / 1,318 per day at 1 / 2 / 4 min "
              "on the same kind of series. What did it (`pipelines/detect/flares.py`, module notes): the red-noise "
              "excursions are coherent over minutes and a macropixel, so the 2-frame and 2-macropixel rules do "
              "not reject them, and 3 sigma of a noise capped at 2x the frame-to-frame estimate let the "
              "active-region red noise through; a fixed background on the rotating Sun adds an excess at every "
              "structure. 1.4.0 co-moves the background with differential rotation (sunpy, Snodgrass 1983; only "
              "where the series shows rotation) and tests the red part of the excess scatter, measured on the "
              "series itself and no longer capped, at 5.5 sigma (a look-elsewhere count for SDI's ~3 x 10^4 "
              "macropixels, not a fit to the simulator). The white part keeps 3 sigma, so the static-scene "
              "gates of `tests/test_detection_gates.py` are unchanged and pass.",
              f"* **The price is recall of faint injections.** Recall by amplitude (relative to the local scene): "
              f"{rec_txt}. The target of recall >= 0.8 at >= 0.3 is not met (0.78 at 1 and 2 min, the "
              "intervals include 0.8; 0.56 at 4 min): the 1.0 and most 0.5 injections are found, the 0.3 ones in "
              "a third to two thirds of cases, none below, although all 0.3 injections of the 2-min run lie on the quiet "
              "disk (red-noise amplitude 3.1-3.5 % at their centres, checked by re-placing them). Our reading "
              "(an estimate, not measured per injection): the excess scatter of a quiet macropixel is ~4 % of the "
              "scene (photon noise ~1.4 %, the rest red noise and rotation residuals), so 5.5 sigma is ~0.22 of the "
              "scene, while a 0.3 injection (15-arcsec Gaussian on 9-arcsec macropixels) reaches a macropixel "
              "contrast of at most ~0.27 at its peak: little margin, and the event needs two frames above it. "
              "What is reachable here without flooding: ~0.5 of the local scene. "
              "Precision counts detections of any injection as true.",
              "* **Dependence on the assumption:** the noise is measured from the series, so doubling the red "
              "noise (line above) raises the threshold with it instead of flooding the catalogue (recall under "
              "the doubled red noise was not measured; a flare must stand 5.5 sigma above the Sun's own "
              "variability, so it must fall). Whether 5.5 is right for SDI depends "
              "on the real Lyman-alpha variability (distribution tails, coherence), which no public SDI series "
              "shows: retune `red_noise_sigma` on SDI data. The red-noise amplitudes are assumptions "
              "(`pipelines/simulation/evolving.py`).",
              "* **Known limitation:** a gradual flare (40-min linear rise to 0.6, static scene, 60-s cadence) "
              "widens its own series scatter and is missed by the 1.4.0 defaults in series of up to at least 4 "
              "h (100 min and 4 h with the rise at 100-140 min; 128 px seeds 6, 7, 256 px seed 6) and found in "
              "6-h (128 and 256 px), 12-h and 24-h series (128 px) and always with `robust_baseline=False` (review probe, "
              "2026-12-03). A one-sided 3-sigma clip of the series scatter found it in the 4-h series at 256 "
              "px but not at 128 px and raised the false alarms on held-out quiet sequences (seeds 7000-7001: 2 in "
              "3.9 h at 4 min and 2 in 4.1 h at 2 min, against 0 and 1 without it), so it was not adopted. Run "
              "the detector on day-long series.",
              "* **WST** (detector unchanged, it keeps the 1.3.0 significance test): no false alarm at any cadence "
              "(the 95 % upper limits are set by the ~2 h searched per cadence). Recall of the injected kernels "
              "(8 arcsec, in active regions, 6 arcsec/px frames) is low (not investigated; the coarse "
              "6-arcsec/px frame for 3-arcsec macropixels is a likely cause). The paper's ratio (I - I0) / I_QS "
              "and the former (I - I0) / I0 gave the same counts here, while the gate "
              "`test_wst_uses_the_quiet_sun_ratio_of_jing_2024` shows where they differ: in a penumbra at 0.6 of "
              "the quiet Sun.",
              "* The sections above were measured with flares 1.2.0 and WST 1.1.0 and were not re-run; with "
              f"{FL.DETECTOR_VERSION} / {WL.FRM_VERSION} the static-scene gates of `tests/test_detection_gates.py` "
              "still pass.",
              "* At 4 min a white-light flare of the derivative shape (FWHM 6 min) falls in one or two frames; "
              "the two-frame rule then misses it (Jing et al. list 3 of 39 WLFs in a single frame)."]
    return lines + [""]


# -- service-like reduction (CMEs and prominences) ---------------------------------------------


def _reduce(frame: np.ndarray, max_working_naxis: int) -> tuple[np.ndarray, int]:
    """Block-average one frame to the detector's working size, as the detection service does
    (``backend.services.detection._reduced_stack``)."""
    f = max(1, math.ceil(max(frame.shape) / max_working_naxis))
    return _block_reduce(np.asarray(frame, dtype=np.float64)[None], f)[0].astype(np.float32), f


def _reduced_geometry(naxis: int, scale: float, f: int) -> dict:
    c = (naxis - 1) / 2.0
    return {"sun_center_px": ((c + 0.5) / f - 0.5, (c + 0.5) / f - 0.5), "plate_scale_arcsec": scale * f}


# -- CMEs --------------------------------------------------------------------------------------

RSUN = 960.0
CME_START = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)
#: (label, [(pa, width, speed, contrast, acceleration, first frame)], cadence [s])
CME_CASES = [
    ("N", [(0.0, 60.0, 450.0, 0.30, 0.0, 2)], 180),
    ("NE-slow", [(45.0, 30.0, 300.0, 0.30, 10.0, 1)], 180),
    ("E-wide", [(90.0, 120.0, 600.0, 0.20, 0.0, 2)], 180),
    ("SE-fast", [(135.0, 50.0, 1500.0, 0.30, 0.0, 2)], 120),
    ("S-narrow", [(180.0, 25.0, 350.0, 0.40, 0.0, 2)], 180),
    ("W-faint", [(270.0, 45.0, 700.0, 0.15, 0.0, 2)], 180),
    ("NW", [(320.0, 80.0, 1500.0, 0.30, 0.0, 2)], 180),
    ("two", [(60.0, 40.0, 400.0, 0.30, 0.0, 1), (240.0, 50.0, 900.0, 0.25, 0.0, 8)], 180),
    ("faint-6pc", [(200.0, 50.0, 650.0, 0.06, 0.0, 2)], 180),
]
#: Photo-electrons per MSB per pixel at 9.6 arcsec/px (512^2 SCI); scaled with the pixel area.
CME_E_PER_MSB_512 = 1e10
#: Photo-electrons per unit (disk centre = 1) per pixel at 4.5 arcsec/px (512^2 SDI).
PR_E_PER_UNIT_512 = 2e4
#: Cosmic-ray hits per 512^2 frame (the same per detector pixel at full size); pointing
#: jitter [px] at 512^2 (the same in arcsec at full size).
CR_PER_512, JITTER_PX_512 = 30, 0.1


def _nuisances(frame: np.ndarray, naxis: int, e_per_unit_512: float, rng: np.random.Generator) -> np.ndarray:
    """Gain and pointing jitter, cosmic rays and photon noise on one frame, scaled to its size."""
    k = naxis / SMALL
    out = S.perturb_sequence(frame[None], brightness_jitter=0.01, pointing_jitter_px=JITTER_PX_512 * k,
                             cosmic_rays_per_frame=int(round(CR_PER_512 * k * k)), rng=rng)
    return S.add_photon_noise(out, e_per_unit_512 / (k * k), rng=rng)[0]


def validate_cmes(cases=CME_CASES, n_frames: int = 16, seed: int = 20240301, quiet: int = 2,
                  full: bool = False, log=None) -> Result:
    """Recall (PA within 10 deg and speed within 20 %), precision, PA/speed/timing errors.

    Frames are made one at a time (SCI 2048^2 at 2.4 arcsec/px when ``full``, else 512^2 at
    9.6) and reduced to the detector's working size as the detection service does."""
    naxis = SCI_NAXIS if full else SMALL
    ps = SCI_SCALE * SCI_NAXIS / naxis
    bg = S.coronal_background(naxis, ps, rsun_arcsec=RSUN)
    rng = np.random.default_rng(seed)
    res = Result("CMEs")
    res.extra["frame"] = f"{naxis}x{naxis} at {ps:.1f} arcsec/px"
    t_start = time.perf_counter()
    sequences = [(label, inj, cad) for label, inj, cad in cases] + [(f"quiet-{i}", [], 180) for i in range(quiet)]
    from pipelines.detect.cme import CMEParams

    max_naxis = CMEParams().max_working_naxis
    for label, injections, cadence in sequences:
        times = S.make_times(CME_START, n_frames, cadence)
        kin = []
        for pa, width, speed, contrast, acc, k0 in injections:
            t0 = times[k0] + dt.timedelta(seconds=float(rng.uniform(0, cadence)))
            kin.append(dict(pa_deg=pa, width_deg=width, speed_km_s=speed, t0=t0, rsun_arcsec=RSUN,
                            contrast=contrast, acceleration_m_s2=acc))
        # truth (heights, first appearance) does not depend on the frame: a tiny background
        truths = [S.inject_cme_sequence(np.ones((4, 4)), times, plate_scale_arcsec=ps * naxis / 4, **kw)[1]
                  for kw in kin]
        work, f = [], 1
        for i, t in enumerate(times):
            frame = bg
            for kw in kin:
                frame = S.inject_cme_sequence(frame, [t], plate_scale_arcsec=ps, **kw)[0][0]
            frame = _nuisances(frame, naxis, CME_E_PER_MSB_512, rng)
            red, f = _reduce(frame, max_naxis)
            work.append(red)
        dets = detect_cmes(times, np.stack(work), rsun_arcsec=RSUN, **_reduced_geometry(naxis, ps, f))
        res.n_detections += len(dets)
        res.n_true_detections += sum(any(_dpa(d.pa_deg, tr.pa_deg) <= 10.0 for tr in truths) for d in dets)
        for tr in truths:
            res.n_truth += 1
            best = min(dets, key=lambda d: _dpa(d.pa_deg, tr.pa_deg), default=None)
            ok = (best is not None and _dpa(best.pa_deg, tr.pa_deg) <= 10.0
                  and abs(best.speed_km_s - tr.speed_km_s) <= 0.2 * tr.speed_km_s)
            res.n_found += ok
            if best is not None and _dpa(best.pa_deg, tr.pa_deg) <= 10.0:
                res.pa_err_deg.append(_dpa(best.pa_deg, tr.pa_deg))
                res.speed_err_rel.append(abs(best.speed_km_s - tr.speed_km_s) / tr.speed_km_s)
                if tr.first_appearance is not None:
                    res.timing_err_s.append((best.first_appearance - tr.first_appearance).total_seconds())
                res.rows.append(f"| {label} | {tr.pa_deg:.0f} | {best.pa_deg:.1f} | {tr.speed_km_s:.0f} | "
                                f"{best.speed_km_s:.0f} | {tr.width_deg:.0f} | {best.width_deg:.0f} | "
                                f"{'found' if ok else 'speed off'} |")
            else:
                res.rows.append(f"| {label} | {tr.pa_deg:.0f} | — | {tr.speed_km_s:.0f} | — | {tr.width_deg:.0f} "
                                f"| — | missed |")
        if not injections:
            res.rows.append(f"| {label} | — | {len(dets)} detections | | | | | quiet |")
        if log:
            log(f"CMEs: {label}: {len(dets)} detections; {time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    return res


# -- prominence eruptions ------------------------------------------------------------------------

#: (pa, speed [km/s], contrast, width [deg], first rising frame)
PR_CASES = [(100.0, 40.0, 1.5, 10.0, 5), (300.0, 80.0, 1.0, 12.0, 4), (355.0, 200.0, 2.0, 8.0, 6),
            (200.0, 60.0, 1.5, 10.0, 7)]


def validate_prominences(cases=PR_CASES, seed: int = 11, full: bool = False, log=None) -> Result:
    """Recall (PA within 10 deg), precision, start-time, PA and rise-speed errors (SDI).

    SDI frames (4608^2 at 0.5 arcsec/px when ``full``, else 512^2 at 4.5) made one at a time
    and reduced to the detector's working size as the detection service does."""
    naxis = SDI_NAXIS if full else SMALL
    ps = SDI_SCALE * SDI_NAXIS / naxis
    limb = S.limb_background(naxis, ps, rsun_arcsec=RSUN,
                             static_prominences=[(45.0, 1.05, 8.0, 0.05), (160.0, 1.07, 12.0, 0.08)])
    rng = np.random.default_rng(seed)
    res = Result("prominence eruptions")
    res.extra["frame"] = f"{naxis}x{naxis} at {ps:.1f} arcsec/px"
    params = ProminenceParams.sdi()
    t_start = time.perf_counter()
    for pa, v, contrast, width, k0 in cases:
        times = S.make_times(CME_START, 20, 60.0)
        t0 = times[k0] + dt.timedelta(seconds=float(rng.uniform(0, 60.0)))
        work, f, tr = [], 1, None
        for t in times:
            ims, tr = S.inject_prominence_eruption(limb, [t], pa_deg=pa, t_start=t0, speed_km_s=v,
                                                   plate_scale_arcsec=ps, rsun_arcsec=RSUN, contrast=contrast,
                                                   width_deg=width, resolution_arcsec=9.5)
            frame = _nuisances(ims[0], naxis, PR_E_PER_UNIT_512, rng)
            del ims
            red, f = _reduce(frame, params.max_working_naxis)
            work.append(red)
        dets = detect_prominence_eruptions(times, np.stack(work), rsun_arcsec=RSUN, params=params,
                                           **_reduced_geometry(naxis, ps, f))
        res.n_truth += 1
        res.n_detections += len(dets)
        good = [d for d in dets if _dpa(d.pa_deg, pa) <= 10.0]
        res.n_true_detections += len(good)
        if good:
            d = good[0]
            res.n_found += 1
            res.pa_err_deg.append(_dpa(d.pa_deg, pa))
            res.timing_err_s.append((d.start_time - tr.t_start).total_seconds())
            res.speed_err_rel.append(abs(d.rise_speed_km_s - v) / v)
            res.rows.append(f"| {pa:.0f} | {d.pa_deg:.1f} | {v:.0f} | {d.rise_speed_km_s:.0f} | "
                            f"{(d.start_time - tr.t_start).total_seconds():+.0f} |")
        else:
            res.rows.append(f"| {pa:.0f} | missed ({len(dets)} detections) | {v:.0f} | — | — |")
        if log:
            log(f"prominences: PA {pa:.0f}: {len(dets)} detections; {time.perf_counter() - t_start:.0f} s")
    res.seconds = time.perf_counter() - t_start
    return res


# -- report ------------------------------------------------------------------------------------


def _stats(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "—"
    a = np.abs(np.asarray(values, dtype=float))
    return f"median {fmt.format(np.median(a))}, max {fmt.format(np.max(a))}"


def _row(r: Result, label: str) -> str:
    return (f"| {label} | {r.extra.get('frame', '')} | {r.recall:.2f} ({r.n_found}/{r.n_truth}) | {r.precision:.2f} "
            f"({r.n_true_detections}/{r.n_detections}) | {_stats(r.timing_err_s, '{:.0f} s')} | "
            f"{_stats(r.pa_err_deg, '{:.1f} deg')} | {_stats([100 * v for v in r.speed_err_rel], '{:.1f} %')} | "
            f"{_stats(r.position_err_arcsec, '{:.1f} arcsec')} | {r.seconds:.0f} s |")


def section(title: str, res: dict[str, Result]) -> list[str]:
    """One size's figures: ``res`` holds flares, flares_old (optional), quiet, cmes, proms."""
    p = FlareDetectionParams()
    lines = [f"## {title}", "",
             "| detector | frame | recall | precision | timing error | PA error | speed error | position error "
             "| run time |", "|---|---|---|---|---|---|---|---|---|"]
    if "flares" in res:
        lines.append(_row(res["flares"], f"flares, defaults ({p.noise_sigma:g} sigma, "
                                         f"{100 * p.detection_threshold:g} %), injections > 3 sigma"))
    if "flares_35" in res:
        lines.append(_row(res["flares_35"], "flares, 3.5 sigma and 2 % (for comparison)"))
    if "flares_old" in res:
        lines.append(_row(res["flares_old"], "flares, former defaults (5 sigma, 20 %)"))
    if "cmes" in res:
        lines.append(_row(res["cmes"], "CMEs (PA within 10 deg, speed within 20 %)"))
    if "proms" in res:
        lines.append(_row(res["proms"], "prominence eruptions (PA within 10 deg)"))
    if "quiet" in res:
        q = res["quiet"]
        h = q.extra["hours"]
        lo1, lo5, med, hi95 = q.extra["rel_noise_pct"]
        lines += ["", f"**False flare detections on quiet data** (the real SWAP scene with noise, no injection, "
                      f"{q.extra['frame']}, 60-s cadence, defaults): {q.n_detections} in {h:.1f} h searched = "
                      f"**{q.n_detections / h:.2f} per hour** ({q.seconds:.0f} s). Relative noise of the "
                      f"10-arcsec macropixels on the disk (r < 0.95 Rsun), per frame: 1st percentile "
                      f"{lo1:.2f} %, 5th {lo5:.2f} %, median {med:.2f} %, 95th {hi95:.2f} %."]
        if q.rows:
            lines += ["", "| sequence | peak | x, y [arcsec] | peak enhancement | frames with a kernel |",
                      "|---|---|---|---|---|"] + q.rows
    if "real" in res:
        q, qo, qd = res["real"], res.get("real_old"), res.get("real_dense")
        shown = qd if qd is not None and qd.rows else q
        lines += ["", f"**Real evolving data** (SOHO/EIT 195 A, 2004-03-01, {q.extra['frame']}; nothing "
                      f"injected; hourly, so a *sparse* series): defaults {q.n_detections} detections in "
                      f"{q.extra['hours']:.0f} h searched (sparse thresholds, 5 sigma and 20 %)"
                  + (f"; the dense thresholds forced (3 sigma and 2 %, `sparse_cadence_s=None`) "
                     f"{qd.n_detections}" if qd else "")
                  + (f"; former defaults {qo.n_detections}" if qo else "")
                  + f". GOES XRS events that day: {'; '.join(q.extra['goes']) or 'none'}; detections within an "
                    f"hour of a GOES peak: {shown.n_true_detections}. The others are EUV brightenings of "
                  + (f"{100 * min(shown.extra['peak_enhancement']):.0f}-"
                     f"{100 * max(shown.extra['peak_enhancement']):.0f} %" if shown.extra["peak_enhancement"] else "—")
                  + " between hourly frames, which the impulsive-phase and two-frame checks cannot tell from "
                    "flares at this cadence: the reason for the sparse-series thresholds (EIT 195 A is not "
                    "Lyman-alpha and an hour is not 60 s: an indication, not SDI's rate). The table lists "
                  + ("the dense-threshold detections." if shown is qd else "the default detections.")]
        q = shown
        if q.rows:
            lines += ["", "| peak | x, y [arcsec] | peak enhancement | frames with a kernel |", "|---|---|---|---|"]
            lines += q.rows
    if "flares" in res:
        fl = res["flares"]
        from scipy.stats import beta

        lo = float(beta.ppf(0.05, fl.n_found, fl.n_truth - fl.n_found + 1)) if fl.n_found else 0.0
        n_seq = PLAN["full" if "4608" in fl.extra.get("frame", "") else "small"]["flares"]["n_sequences"]
        lines += ["", f"Flare sample: {n_seq} sequences x 6 injections = {6 * n_seq}, of which {fl.n_truth} above "
                      f"3 sigma; recall {fl.n_found}/{fl.n_truth} has a one-sided 95 % lower bound of {lo:.2f} "
                      f"(Clopper-Pearson): the measured value {'meets' if fl.recall >= 0.9 else 'misses'} the "
                      "gate; the sample is too small to prove 0.9 at 95 %."]
        others = [(key, label) for key, label in (("flares_35", "3.5 sigma, 2 %"), ("flares_old", "former defaults"))
                  if key in res]
        lines += ["", f"### Flares: recall by injected amplitude ({title.split('(')[0].strip().lower()})", "",
                  "| amplitude [sigma] | found, defaults |" + "".join(f" found, {lab} |" for _, lab in others),
                  "|---|---|" + "---|" * len(others)]
        for k, (hit, n) in fl.extra["recall_by_sigma"].items():
            cells = "".join(" {}/{} |".format(*res[key].extra["recall_by_sigma"].get(k, (0, 0))) for key, _ in others)
            lines.append(f"| {k:g} | {hit}/{n} |{cells}")
    if "cmes" in res:
        lines += ["", "### CMEs", "", "| case | PA true | PA found | speed true | speed found | width true | "
                  "width found | result |", "|---|---|---|---|---|---|---|---|"] + res["cmes"].rows
    if "proms" in res:
        lines += ["", "### Prominence eruptions (SDI, 60 s)", "",
                  "| PA true | PA found | speed true [km/s] | speed found | start error [s] |",
                  "|---|---|---|---|---|"] + res["proms"].rows
    return lines + [""]


HEADER = """# Detection validation with injected events

Produced by `benchmarks/validate_detection.py` (its docstring says how the sequences are
built). Gates (asserted at the small size by `tests/test_detection_gates.py`, part of
`make test`): flare recall and precision >= 0.9 for injections above 3 sigma, **with the
detector's default parameters** (those the detection service and the Celery task
`detect_flares` use); CME recall >= 0.8 with PA within 10 deg and speed within 20 %.

Sigma is the per-frame noise of the 10-arcsec macropixel at the injection centre, as the
detector measures it. Timing error: flares, detected peak minus injected peak (frames 2 min
apart, 0 = the right frame); CMEs, first appearance minus the truth's first frame with the
front in the field; prominences, start minus the injected start of the rise. Speed error:
relative. Run times were measured on a shared 2-core machine (other jobs running): noisy.

How this file is made: each part's result is saved with `--cache DIR`; the full-size parts
ran as two background processes (`--parts full:flares,full:quiet` and
`--parts full:cmes,full:proms`), the small ones as a third (`--quick --parts small:...`),
and `--parts none --cache DIR` wrote this report. Full-size frames are made one at a time
(flares: on the detector's request, a few cached), never a whole 4608^2 sequence in memory.
"""


def flare_default_notes(res_full: dict[str, Result], res_small: dict[str, Result]) -> list[str]:
    p = FlareDetectionParams()
    lines = ["## The flare defaults", "",
             f"Detector {__import__('pipelines.detect.flares', fromlist=['x']).DETECTOR_VERSION}: "
             f"`noise_sigma = {p.noise_sigma:g}`, `detection_threshold = {p.detection_threshold:g}` "
             "(were 5 and 0.2 in 1.1.0). Both numbers are ours (Lu et al. 2024 give the method, "
             "not values we could reproduce). Why:", "",
             "* The gate is stated in sigma, so the significance test must sit at the gate: at 5 sigma the "
             "4- and 6-sigma injections are missed by construction (the former-defaults column); at 3.5 sigma "
             "part of the 4-sigma ones are (the 3.5-sigma column of the small size); at 3 sigma they are found. The excess is now compared with the noise of "
             "the *difference* I - B (the frame's noise and that of the background median, pi sigma^2 / 2n), "
             "so 3 sigma means 3 sigma also with a 3-frame background.",
             "* The relative threshold is a floor that must not bind where the noise test should decide: it "
             "has to stay below 3 sigma of the relative macropixel noise. With the noise model here that "
             "noise is above 1 % per frame on nearly all of the disk (the percentiles with the quiet runs above), so 2 % "
             "is below 3 sigma everywhere that matters, and it still rejects changes below 2 % that are "
             "significant only where the noise is low (gain drift, exposure errors). "
             "If SDI's real macropixel noise is well below 0.7 %, the floor binds and the 3-sigma gate does "
             "not hold there: retune on SDI data.",
             "* The impulsive-phase check (half the peak gained within 2 h; Veronig et al. 2002) and the "
             "two-frame, two-macropixel kernel rule are kept; with them the quiet runs (static real scene plus "
             "noise) gave no false detection at either size. Their effect alone was not measured (no run "
             "without them).",
             "* The full size found a bug, fixed in 1.2.0: the centroid weighted full-resolution pixels whose "
             "noise, at 0.5 arcsec/px, is 20x a macropixel's; the clipped noise pulled it (first full run: "
             "position error median 12.6, max 25.2 arcsec, one 20-sigma injection not matched within 30 arcsec, "
             "recall and precision 0.96). The excess is now smoothed at the macropixel scale first "
             "(`tests/test_detection_gates.py` checks positions at 1.5 arcsec/px).",
             "* Sparse series: on the EIT 195 A hourly sequence the 3-sigma, 2 % thresholds report EUV "
             "brightenings that are not in the GOES list (the real-data paragraph), and on the demo's hourly "
             "SDI series (`lstdp demo`, 1152 px) they reported 93 events for one injected flare. At an hourly "
             "cadence a flare lasts one or two frames, so the two-frame rule and the impulsive-phase check "
             "cannot reject evolution between frames. Series with a median cadence above 5 min "
             f"(`sparse_cadence_s = {p.sparse_cadence_s:g}`) therefore use at least "
             f"{p.sparse_noise_sigma:g} sigma and {100 * p.sparse_detection_threshold:g} % (the 1.1.0 "
             "values) and their events carry the flag `sparse_cadence`; the validation sequences (60 and 120 s) "
             "are dense and keep 3 sigma and 2 %. How many real Lyman-alpha brightenings pass 3 sigma at "
             "SDI's 60 s is unknown without SDI data: the quiet runs above are a static scene plus noise, "
             "not solar evolution. A deployment that wants fewer, larger events can raise "
             "`detection_threshold` and accept a lower recall for low-contrast events (not measured here).",
             ""]
    return lines


def report(res_full: dict[str, Result], res_small: dict[str, Result]) -> str:
    lines = [HEADER]
    if res_full:
        lines += section("Full size (SDI 4608 x 4608 at 0.5 arcsec/px, SCI 2048 x 2048 at 2.4 arcsec/px)",
                         res_full)
    if res_small:
        lines += section("Small size (512 x 512; what the gates test asserts)", res_small)
    lines += flare_default_notes(res_full, res_small)
    return "\n".join(lines).rstrip() + "\n"


# -- running -----------------------------------------------------------------------------------

#: Work per part and size: the small size is the gates test's scale; the full size uses
#: fewer flare sequences (each holds 28 frames of 4608^2) but 6 injections each.
PLAN = {
    "small": {"flares": dict(n_sequences=6), "flares_old": dict(n_sequences=6, params=FLARE_PARAMS_OLD),
              "flares_35": dict(n_sequences=6, params=FlareDetectionParams(noise_sigma=3.5)),
              "quiet": dict(n_sequences=10, n_frames=120), "cmes": dict(), "proms": dict(), "real": dict(),
              "real_old": dict(params=FLARE_PARAMS_OLD, name="flares, real EIT, former defaults"),
              "real_dense": dict(params=FlareDetectionParams(sparse_cadence_s=None),
                                 name="flares, real EIT, dense thresholds forced")},
    "full": {"flares": dict(n_sequences=6), "quiet": dict(n_sequences=4, n_frames=90), "cmes": dict(),
             "proms": dict()},
}


def run_part(part: str, full: bool, log=None) -> Result:
    kw = dict(PLAN["full" if full else "small"][part])
    if part == "flares":
        return validate_flares(full=full, log=log, **kw)
    if part in ("flares_old", "flares_35"):
        return validate_flares(full=full, log=log, name=f"flares ({part})", **kw)
    if part == "quiet":
        return flare_false_positives(full=full, log=log, **kw)
    if part in ("real", "real_old", "real_dense"):
        return flare_real_sequence(**kw)
    if part == "cmes":
        return validate_cmes(full=full, log=log, **kw)
    if part == "proms":
        return validate_prominences(full=full, log=log, **kw)
    raise ValueError(part)


def _save(r: Result, path: Path) -> None:
    d = asdict(r)
    d["extra"] = dict(r.extra)
    if "recall_by_sigma" in d["extra"]:
        d["extra"]["recall_by_sigma"] = [[k, h, n] for k, (h, n) in r.extra["recall_by_sigma"].items()]
    path.write_text(json.dumps(d))


def _load(path: Path) -> Result:
    d = json.loads(path.read_text())
    r = Result(**d)
    if "recall_by_sigma" in r.extra:
        r.extra["recall_by_sigma"] = {float(k): (h, n) for k, h, n in r.extra["recall_by_sigma"]}
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small size only (512^2)")
    ap.add_argument("--parts", default="all",
                    help="comma-separated parts to run now, each SIZE:NAME (see PLAN: full:flares, full:quiet, "
                         "full:cmes, full:proms, small:flares, small:flares_35, small:flares_old, small:quiet, "
                         "small:cmes, small:proms, small:real, small:real_old, small:real_dense); 'all' (default) or 'none' "
                         "(assemble the report from --cache)")
    ap.add_argument("--cache", type=Path, default=None, help="folder for each part's result (JSON)")
    ap.add_argument("--report", type=Path, default=REPORT)
    ap.add_argument("--evolving", default=None,
                    help="run the evolving-scene parts: 'sdi', 'wst' or 'sdi,wst' (saved in --cache); "
                         "'report' appends their section to --report from --cache")
    ap.add_argument("--evolving-naxis", type=int, default=EVOLVING_REPORT_NAXIS)
    ap.add_argument("--evolving-sequences", type=int, default=EVOLVING_REPORT_SEQUENCES)
    ap.add_argument("--hourly", default=None, choices=("heldout", "tuning"),
                    help="hourly series (issue 27 item 7): the demo's EIT series and simulated hourly series of "
                         "the held-out or the tuning seeds; prints RESULT lines")
    ap.add_argument("--no-decay-test", action="store_true",
                    help="with --hourly: the detector without its sparse-series decay test "
                         "(sparse_max_decay_s=None: the rules of 1.5.0), for before/after figures")
    args = ap.parse_args(argv)
    if args.hourly:
        t_h = time.perf_counter()
        hp = FlareDetectionParams(sparse_max_decay_s=None) if args.no_decay_test else None
        demo, quiet, inj = run_hourly(args.hourly, params=hp,
                                      log=lambda m: print(f"[{time.perf_counter() - t_h:5.0f} s] {m}"))
        print("\n".join(["demo EIT series detections:", *demo.rows, "false alarms, simulated:", *quiet.rows,
                         *inj.rows]))
        print(f"RESULT hourly demo_eit events={demo.n_detections} injected_found={demo.n_found} "
              f"false_alarms={demo.extra['false_alarms']}")
        # the injected series are the quiet ones plus flares (same seeds): their evolution's false
        # alarms are the quiet series', so the rate is the quiet series' alone
        fa, hours = quiet.extra["false_alarms"], quiet.extra["hours"]
        print(f"RESULT hourly seeds={args.hourly}:{','.join(map(str, quiet.extra['seeds']))} "
              f"false_alarms={fa} hours={hours:.0f} per_hour={fa / hours:.3f} "
              f"upper95={poisson_upper(fa, hours):.3f} false_in_injected={inj.extra['false_alarms']} "
              f"recall={inj.n_found}/{inj.n_truth} "
              f"by_amp={inj.extra['recall_by_amp']}")
        return 0
    if args.evolving:
        t_ev = time.perf_counter()
        if args.evolving != "report":
            rs = run_evolving(tuple(args.evolving.split(",")), naxis=args.evolving_naxis,
                              n_sequences=args.evolving_sequences, cache=args.cache,
                              log=lambda m: print(f"[{time.perf_counter() - t_ev:7.0f} s] {m}", flush=True))
        else:
            rs = [_load(pth) for pth in sorted(args.cache.glob("evolving_*.json"))]
            order = {"sdi": 0, "wst": 1}
            rs.sort(key=lambda r: (order[r.extra["kind"]], r.extra["cadence_s"], r.extra["tag"]))
            text = args.report.read_text() if args.report.exists() else ""
            cut = text.find("## Evolving backgrounds")
            if cut >= 0:
                text = text[:cut]
            args.report.write_text(text.rstrip() + "\n\n" + "\n".join(evolving_section(rs)))
        for r in rs:
            if str(r.extra.get("tag")).startswith("quiet"):
                print(f"RESULT evolving kind={r.extra['kind']} cadence_s={r.extra['cadence_s']:.0f} "
                      f"false_alarms_per_day={r.extra['per_day']:.1f} upper95={r.extra['per_day_upper95']:.1f}")
            else:
                print(f"RESULT evolving name={r.name.replace(' ', '_')} recall={r.recall:.2f} "
                      f"precision={r.precision:.2f}")
        return 0
    sizes = ["small"] if args.quick else ["full", "small"]
    wanted = [f"{s}:{p}" for s in sizes for p in PLAN[s]]
    todo = wanted if args.parts == "all" else [] if args.parts == "none" else args.parts.split(",")
    cache = args.cache
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.0f} s] {msg}", flush=True)

    results: dict[str, dict[str, Result]] = {"full": {}, "small": {}}
    for key in todo:
        size, part = key.split(":")
        r = run_part(part, size == "full", log=log)
        results[size][part] = r
        log(f"{key} done: recall {r.recall:.2f}, precision {r.precision:.2f}, {r.n_detections} detections")
        if cache:
            _save(r, cache / f"{size}_{part}.json")
    if cache:
        for key in wanted:
            size, part = key.split(":")
            path = cache / f"{size}_{part}.json"
            if part not in results[size] and path.exists():
                results[size][part] = _load(path)
    if args.parts not in ("all", "none") and not cache:
        return 0
    text = report(results["full"], results["small"])
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text)
    print(text)
    for size in ("full", "small"):
        r = results[size]
        if {"flares", "cmes", "proms"} <= set(r):
            print(f"RESULT size={size} flare_recall={r['flares'].recall:.2f} "
                  f"flare_precision={r['flares'].precision:.2f} cme_recall={r['cmes'].recall:.2f} "
                  f"cme_precision={r['cmes'].precision:.2f} prominence_recall={r['proms'].recall:.2f}"
                  + (f" false_flares_per_hour={r['quiet'].n_detections / r['quiet'].extra['hours']:.2f}"
                     if "quiet" in r else ""))
    log("total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
