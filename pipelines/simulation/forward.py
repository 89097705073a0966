"""The instrument forward model: from a truth on the L2 grid to a raw uint16 frame.

Per channel an :class:`InstrumentModel` (exposure, bias, dark current, gain, read noise,
pointing); the detector's flat field (CMOS laser-annealing stripes), bias and dark-rate
planes; the SCI stray light (:func:`stray_light_model`) and aperture; the resampling to
the pointed and rolled detector; the DN, the noise and the ASO-S style raw header::

    raw = bias + dark_rate * t + flat * t * aperture * (S_true + S_stray) / C
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from astropy.io import fits
from astropy.time import Time
from scipy import ndimage

from pipelines.calibration.l2.steps import StrayLightModel
from pipelines.channels import ChannelSpec, get_channel
from pipelines.simulation.output import SOFTWARE


@dataclass(frozen=True)
class InstrumentModel:
    """Detector and pointing parameters of one channel's simulation (choices, not LST facts).

    Attributes
    ----------
    exptime_s : float
        Exposure time [s] (LST.md: up to 20 s).
    bias_dn : float
        Mean zero-exposure offset [DN].
    dark_rate_dn_s : float
        Mean dark-current rate [DN/s] (hot pixels on top).
    gain_e_per_dn : float
        Conversion gain [electrons/DN] for the Poisson noise.
    read_noise_dn : float
        Gaussian read noise [DN].
    target_peak_dn : float
        The radiometric coefficient is chosen so that the brightest pixel of the channel's
        frames sits at or below this [DN] (uint16 head-room).
    offset_px : (float, float)
        Disk centre minus frame centre [pixel of the simulated frame] (a few pixels).
    roll_deg : float
        CROTA2 [deg].
    stripe_amplitude : float
        RMS of the laser-annealing stripes of the flat field.
    stripe_period_full : float
        Stripe period at full frame size [pixel].
    aperture_ramp_rsun : float
        Width of the SCI occulter / field-stop vignetting ramps [Rsun].
    """

    exptime_s: float
    bias_dn: float
    dark_rate_dn_s: float
    gain_e_per_dn: float
    read_noise_dn: float
    target_peak_dn: float
    offset_px: tuple[float, float]
    roll_deg: float
    stripe_amplitude: float = 0.012
    stripe_period_full: float = 96.0
    aperture_ramp_rsun: float = 0.04


INSTRUMENT: dict[str, InstrumentModel] = {
    "SDI": InstrumentModel(exptime_s=1.0, bias_dn=100.0, dark_rate_dn_s=2.0, gain_e_per_dn=1.6, read_noise_dn=2.5,
                           target_peak_dn=56000.0, offset_px=(3.2, -2.4), roll_deg=0.65),
    "WST": InstrumentModel(exptime_s=0.02, bias_dn=100.0, dark_rate_dn_s=20.0, gain_e_per_dn=1.6,
                           read_noise_dn=2.5, target_peak_dn=56000.0, offset_px=(-2.7, 2.0), roll_deg=-1.35),
    "SCI-UV": InstrumentModel(exptime_s=10.0, bias_dn=100.0, dark_rate_dn_s=1.0, gain_e_per_dn=1.6,
                              read_noise_dn=2.5, target_peak_dn=58000.0, offset_px=(2.6, -1.9), roll_deg=0.42),
    "SCI-WL": InstrumentModel(exptime_s=2.0, bias_dn=100.0, dark_rate_dn_s=1.0, gain_e_per_dn=1.6,
                              read_noise_dn=2.5, target_peak_dn=58000.0, offset_px=(-2.2, 1.6), roll_deg=-1.9),
}


def stray_light_model(channel: str) -> StrayLightModel:
    """The SCI stray-light power law of ``channel`` through LST.md's on-orbit points.

    SCI-WL: 7.8e-6 MSB at 1.1 Rsun, 7.6e-7 at 2.5; SCI-UV: 4.3e-3 and 4.1e-4 (LST on-orbit
    tests and calibrations, Solar Physics, ASO-S topical collection).

    Parameters
    ----------
    channel : str
        ``SCI-UV`` or ``SCI-WL`` (any spelling :func:`pipelines.channels.get_channel` takes).

    Returns
    -------
    pipelines.calibration.l2.steps.StrayLightModel
        Brightness [MSB] as a power law in r [Rsun], r clipped to 1-3 Rsun.

    Raises
    ------
    ValueError
        For a disk imager (SDI, WST).
    KeyError
        For an unknown channel.
    """
    points = {"SCI-WL": (1.1, 7.8e-6, 2.5, 7.6e-7), "SCI-UV": (1.1, 4.3e-3, 2.5, 4.1e-4)}
    code = get_channel(channel).code
    if code not in points:
        raise ValueError(f"{code} has no stray-light model (disk imager)")
    r1, b1, r2, b2 = points[code]
    return StrayLightModel.through_points(r1, b1, r2, b2, r_min=1.0, r_max=3.0)


def _flat_field(n: int, full: int, model: InstrumentModel, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative flat with CMOS laser-annealing stripes, mean 1 (float32).

    Stripes along columns (period ``stripe_period_full`` at full size, scaled with the
    binning, at least 4 px, random phase and per-stripe amplitude), a gentle large-scale
    gradient (+-1.5 %) and 0.3 % pixel-to-pixel response non-uniformity.
    """
    period = max(4.0, model.stripe_period_full * n / full)
    x = np.arange(n, dtype=np.float64)
    n_stripes = int(math.ceil(n / period)) + 2
    amps = rng.normal(0.0, 1.0, n_stripes)
    phase = rng.uniform(0, period)
    k = np.floor((x + phase) / period).astype(int)
    frac = (x + phase) / period - k
    stripes = amps[k] * np.sin(math.pi * frac) ** 2 + 0.35 * np.sin(2 * math.pi * x / (period * 0.37) + phase)
    stripes = stripes / max(stripes.std(), 1e-12) * model.stripe_amplitude
    g = np.linspace(-1.0, 1.0, n)
    a, b = rng.uniform(-0.015, 0.015, 2)
    col = ((1.0 + stripes) * (1.0 + a * g + 0.01 * (g ** 2 - 1 / 3))).astype(np.float32)
    row = (1.0 + b * g + 0.01 * (g ** 2 - 1 / 3)).astype(np.float32)
    flat = row[:, None] * col[None, :]
    prnu = rng.standard_normal((n, n), dtype=np.float32)
    prnu *= np.float32(0.003)
    prnu += np.float32(1.0)
    flat *= prnu
    del prnu
    flat /= np.float32(flat.mean(dtype=np.float64))
    return flat


def _dark_planes(n: int, model: InstrumentModel, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Bias [DN] (column fixed-pattern offsets) and dark rate [DN/s] (with 0.1 % hot pixels), float32."""
    bias = rng.standard_normal((n, n), dtype=np.float32)
    bias *= np.float32(0.4)
    bias += (model.bias_dn + rng.normal(0.0, 1.5, (1, n))).astype(np.float32)
    rate = rng.standard_normal((n, n), dtype=np.float32)
    rate *= np.float32(0.25)
    np.exp(rate, out=rate)
    rate *= np.float32(model.dark_rate_dn_s)
    hot = rng.random((n, n), dtype=np.float32) < 1e-3
    rate[hot] *= rng.uniform(10, 60, int(hot.sum())).astype(np.float32)
    return bias, rate


def _aperture(rho: np.ndarray, spec: ChannelSpec, model: InstrumentModel, rsun_px: float) -> np.ndarray | None:
    """SCI occulter and field-stop transmission (cosine ramps just outside 1.1 and 2.5 Rsun)."""
    if not spec.is_coronagraph:
        return None
    w = max(model.aperture_ramp_rsun, 3.0 / rsun_px)
    r_in, r_out = spec.fov_rsun_min, spec.fov_rsun_max
    inner = np.clip((rho - (r_in - w)) / w, 0.0, 1.0)
    outer = np.clip(((r_out + w) - rho) / w, 0.0, 1.0)
    return (np.sin(0.5 * math.pi * inner) ** 2 * np.sin(0.5 * math.pi * outer) ** 2).astype(np.float32)


def _detector_geometry(model: InstrumentModel, n: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Disk centre (0-based x, y) and roll [deg] of one frame (nominal + small jitter)."""
    c = (n - 1) / 2.0
    jx, jy = rng.normal(0.0, 0.15, 2)
    x0 = c + model.offset_px[0] + jx
    y0 = c + model.offset_px[1] + jy
    roll = model.roll_deg + float(rng.normal(0.0, 0.01))
    return float(x0), float(y0), float(roll)


def _to_detector(grid_image: np.ndarray, n: int, x0: float, y0: float, roll_deg: float,
                 order: int = 3) -> np.ndarray:
    """Sample an L2-grid image at the detector pixels: grid = c + R(roll) @ (det - s)."""
    c = (n - 1) / 2.0
    a = math.radians(roll_deg)
    r_xy = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    r_yx = np.array([[r_xy[1, 1], r_xy[1, 0]], [r_xy[0, 1], r_xy[0, 0]]])
    offset = np.array([c, c]) - r_yx @ np.array([y0, x0])
    # spline coefficients kept in float32 (relative error ~1e-7, far below what is measured)
    coeffs = ndimage.spline_filter(np.asarray(grid_image, dtype=np.float32), order=order, output=np.float32,
                                   mode="nearest") if order > 1 else np.asarray(grid_image, dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    ndimage.affine_transform(coeffs, r_yx, offset=offset, output_shape=(n, n), output=out, order=order,
                             mode="nearest", prefilter=False)
    return out


def _detector_rho(n: int, x0: float, y0: float, rsun_px: float) -> np.ndarray:
    """Heliocentric distance [Rsun] of every detector pixel, disk centre at (``x0``, ``y0``), float32."""
    dx = (np.arange(n, dtype=np.float32) - np.float32(x0)) / np.float32(rsun_px)
    dy = (np.arange(n, dtype=np.float32) - np.float32(y0)) / np.float32(rsun_px)
    return np.sqrt(dx[None, :] ** 2 + dy[:, None] ** 2, dtype=np.float32)


def _forward_model(truth: np.ndarray, spec: ChannelSpec, model: InstrumentModel, n: int, x0: float, y0: float,
                   roll: float, rsun_px: float, stray: StrayLightModel | None, flat: np.ndarray, bias: np.ndarray,
                   dark_rate: np.ndarray, coef: float, noise: bool, rng: np.random.Generator,
                   aperture_offset_px: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Raw DN of one frame: ``bias + dark_rate t + flat t aperture (S + S_stray) / C``, noise, uint16.

    ``aperture_offset_px`` (dx, dy) [pixel]: the occulter / field-stop aperture's centre minus
    the Sun centre (0: centred on the Sun, the simulator's own shape).
    """
    t_exp = model.exptime_s
    s_det = _to_detector(truth, n, x0, y0, roll)
    if stray is not None:
        rho = _detector_rho(n, x0, y0, rsun_px)
        s_det += stray.brightness(rho.astype(np.float64)).astype(np.float32)
        if aperture_offset_px[0] or aperture_offset_px[1]:
            rho = _detector_rho(n, x0 + aperture_offset_px[0], y0 + aperture_offset_px[1], rsun_px)
        s_det *= _aperture(rho, spec, model, rsun_px)
        del rho
    signal_dn = flat * (s_det * np.float32(t_exp / coef))  # DN from the Sun (and the stray light)
    del s_det
    dark_dn = dark_rate * np.float32(t_exp)
    raw = np.empty((n, n), dtype=np.uint16)
    for j0 in range(0, n, 512):  # row blocks keep the float64 Poisson temporaries small
        sl = slice(j0, j0 + 512)
        if noise:
            electrons = (np.maximum(signal_dn[sl], 0) + dark_dn[sl]).astype(np.float64)
            electrons *= model.gain_e_per_dn
            counts = rng.poisson(electrons).astype(np.float32) / np.float32(model.gain_e_per_dn)
            counts += rng.standard_normal(counts.shape, dtype=np.float32) * np.float32(model.read_noise_dn)
            blk = bias[sl] + counts
        else:
            blk = bias[sl] + dark_dn[sl] + signal_dn[sl]
        raw[sl] = np.clip(np.rint(blk), 0, 65535)
    return raw


def ssw_date(t: Time) -> str:
    """DATE-OBS in the SSW/ASO-S style ``'01-Mar-04 00:00:10.515'`` (two-digit year).

    Parameters
    ----------
    t : astropy.time.Time
        Any scale; written in UTC, rounded to the millisecond.

    Returns
    -------
    str
        ``DD-Mon-YY hh:mm:ss.sss``.
    """
    d = t.utc.to_datetime()
    ms = int(round(d.microsecond / 1000.0))
    sec = d.second + ms / 1000.0
    if ms == 1000:  # rounding up to the next second
        d = d.replace(microsecond=0) + dt.timedelta(seconds=1)
        sec = float(d.second)
    return f"{d.day:02d}-{d.strftime('%b')}-{d.year % 100:02d} {d.hour:02d}:{d.minute:02d}:{sec:06.3f}"


def _raw_header(spec: ChannelSpec, t: Time, model: InstrumentModel, scale: float, x0: float, y0: float,
                roll: float, scene: str, name: str, notes: Iterable[str],
                keywords: dict | None = None) -> fits.Header:
    """The ASO-S style raw header: two-digit-year DATE-OBS, ``solar_x``/``arcsecs``, CROTA, no observer keywords.

    ``keywords`` (name -> (value, comment)) are added before the HISTORY (the scene's
    source file and real DATE-OBS, ``SCENEFIL``/``SCENEOBS``, where they are stamped).
    """
    h = fits.Header()
    h["TELESCOP"] = ("ASO-S", "Advanced Space-based Solar Observatory")
    h["INSTRUME"] = ("LST", "Lyman-alpha Solar Telescope")
    h["DETECTOR"] = (spec.instrument, "LST instrument")
    h["CHANNEL"] = (spec.code, "LST channel")
    h["WAVELNTH"] = (spec.wavelength_nm, "passband centre")
    h["WAVEUNIT"] = ("nm", "unit of WAVELNTH")
    h["DATE_OBS"] = (ssw_date(t), "Observation date")
    h["DATE-OBS"] = (ssw_date(t), "Observation date")
    h["EXPTIME"] = (model.exptime_s, "Exposure duration [s]")
    h["CTYPE1"] = ("solar_x", "Solar X (cartesian west) axis")
    h["CTYPE2"] = ("solar_y", "Solar Y (cartesian north) axis")
    h["CUNIT1"] = ("arcsecs", "Arcseconds from center of Sun")
    h["CUNIT2"] = ("arcsecs", "Arcseconds from center of Sun")
    h["CRPIX1"] = (x0 + 1.0, "Reference pixel along X dimension")
    h["CRPIX2"] = (y0 + 1.0, "Reference pixel along Y dimension")
    h["CRVAL1"] = (0.0, "Reference position along X dimension")
    h["CRVAL2"] = (0.0, "Reference position along Y dimension")
    h["CDELT1"] = (scale, "Increments along X dimension")
    h["CDELT2"] = (scale, "Increments along Y dimension")
    h["CROTA1"] = (roll, "Rotation angle (degrees)")
    h["CROTA2"] = (roll, "Rotation angle (degrees)")
    h["LEVEL"] = ("L1", "LST raw level")
    h["BUNIT"] = ("DN", "data unit")
    h["OBJECT"] = ("Sun", "")
    h["ORIGIN"] = ("lstdp simulator", "simulated frame, not flight data")
    h["FILENAME"] = (name, "")
    h["SATURATE"] = (65535, "[DN] saturation level")
    h["GAIN"] = (model.gain_e_per_dn, "[electron/DN] conversion gain")
    h["RDNOISE"] = (model.read_noise_dn, "[DN] read noise RMS")
    for key, (value, comment) in (keywords or {}).items():
        h[key] = (value, comment)
    h.add_history(f"Simulated by {SOFTWARE} from {scene} (real data; sample-data/real/MANIFEST.md)")
    for line in notes:
        h.add_history(line)
    return h
