"""Raw LST frames simulated from real solar images (no LST file is public).

What is built, per channel, from the real files in ``sample-data/real`` (MANIFEST.md):

* **SDI** (Lyman-alpha disk imager): single frames from PROBA2/SWAP 174 A
  (``full-disk/swap_lv1_20120101_001607.fits``), or a 13-frame hourly series from SOHO/EIT
  (``full-disk/eit_sequence``, 2004-03-01 00:00-12:00) with an injected flare. The EIT
  headers' WCS is wrong by a factor 8 (rebinned 8x, native CDELT kept): the disk centre and
  radius are fitted from each image (:func:`fit_solar_limb`), the CDELT is never used.
* **WST** (360 nm): SOHO/MDI continuum (``full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits``)
  turned into a 360 nm disk: MDI's own limb darkening removed, contrasts scaled to 360 nm,
  the 360 nm limb darkening applied.
* **SCI-UV / SCI-WL** (coronagraph, 1.1-2.5 Rsun): the coronal structure of STEREO/COR1-A
  (``coronagraph/20070503_102018_s4c1a.fts``) times radial brightness models in MSB.

The scene is built on the L2 grid (north up, disk centre on the frame centre, the
channel's plate scale), smoothed to the channel's on-orbit resolution (at least 1 pixel
sigma): that band-limited image is the *truth*. The detector frame samples the truth with
a cubic spline at the pointed and rolled geometry (disk centre a few pixels off the frame
centre, roll of a fraction of a degree to 2 degrees), and the forward model gives DN::

    raw = bias + dark_rate * t + flat * t * aperture * (S_true + S_stray) / C

then Poisson noise on the photo-electrons (``gain`` e-/DN) and Gaussian read noise
(``noise=True``), rounding and clipping to uint16. ``S`` is in erg cm-2 s-1 sr-1 (SDI,
WST) or MSB (SCI); ``C`` is the radiometric coefficient [unit per DN/s]; ``S_stray`` (SCI
only) is the power law through LST.md's two on-orbit points; ``aperture`` is 1 except
behind the SCI occulter and beyond its field stop (cosine ramps just outside 1.1 and
2.5 Rsun, so the masked edge carries no step into the useful field).

Outputs of :func:`simulate` under ``out_dir``:

* ``raw/lst_<chan>_<YYYYMMDDThhmmss>_raw.fits``: uint16, ASO-S style header (two-digit-year
  DATE-OBS, ``solar_x``/``arcsecs``, CROTA, no observer keywords);
* ``calibration/lst_<chan>_<kind>_<naxis>_v01.fits``: self-describing masters (``CALKIND``,
  ``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``CALDESC``, parameters);
* ``truth/lst_<chan>_<stamp>_truth.fits``: float32 truth on the L2 grid with a
  helioprojective WCS, plus HDU ``STRAY`` (SCI: the injected stray light, MSB) and HDU
  ``FLARE`` (SDI series: the injected flare component);
* ``manifest.json``: everything above, the limb fits and the injected flare.

Files are byte-identical for one seed (checksums stamped with the observation time).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from astropy import constants as const
from astropy import units as u
from astropy.io import fits
from astropy.time import Time
from scipy import ndimage

from pipelines.calibration.steps import RADIANCE_UNIT, RSUN_REF_M, StrayLightModel
from pipelines.channels import CHANNELS, MIN_FRAME_SIDE, ChannelSpec, get_channel
from pipelines.errors import DataError
from pipelines.fitsio import add_observer_keywords, read_image, write_fits_atomic

__all__ = [
    "SAMPLE_DIR",
    "SimulationResult",
    "SimulatedFrame",
    "CalibrationFileInfo",
    "InjectedFlare",
    "LimbFit",
    "InstrumentModel",
    "INSTRUMENT",
    "simulate",
    "load_simulated_masters",
    "fit_solar_limb",
    "limb_darkening_neckel2005",
    "baumbach_k_corona",
    "baumbach_f_corona",
    "lyman_alpha_corona",
    "stray_light_model",
    "ssw_date",
]

#: The real solar files shipped with the project.
SAMPLE_DIR = Path(__file__).resolve().parent.parent / "sample-data" / "real"

SWAP_FILE = "full-disk/swap_lv1_20120101_001607.fits"
EIT_DIR = "full-disk/eit_sequence"
MDI_FILE = "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits"
COR1_FILE = "coronagraph/20070503_102018_s4c1a.fts"
LYA_INDEX_FILE = "lyman-alpha/lymanalpha_composite_1997-2013.txt"

SOFTWARE = "lstdp pipelines.simulate 1"

# ----------------------------------------------------------------------------- physics

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

    References
    ----------
    Baumbach S. 1937, Astron. Nachr. 263, 121; Allen's Astrophysical Quantities (Cox 2000).
    """
    r = np.asarray(r, dtype=np.float64)
    return 1e-6 * (1.425 * r ** -7.0 + 2.565 * r ** -17.0)


def baumbach_f_corona(r: Any) -> Any:
    """F (dust) corona brightness [MSB] at ``r`` [Rsun] (Baumbach 1937): ``1e-6 * 0.0532 r**-2.5``."""
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
    """SCI-WL radial model [MSB] at 700 nm: F corona + WL_K_FACTOR x Baumbach K corona."""
    return baumbach_f_corona(r) + WL_K_FACTOR * baumbach_k_corona(r)


def stray_light_model(channel: str) -> StrayLightModel:
    """The SCI stray-light power law of ``channel`` through LST.md's on-orbit points.

    SCI-WL: 7.8e-6 MSB at 1.1 Rsun, 7.6e-7 at 2.5; SCI-UV: 4.3e-3 and 4.1e-4 (LST on-orbit
    tests and calibrations, Solar Physics, ASO-S topical collection).
    """
    points = {"SCI-WL": (1.1, 7.8e-6, 2.5, 7.6e-7), "SCI-UV": (1.1, 4.3e-3, 2.5, 4.1e-4)}
    code = get_channel(channel).code
    if code not in points:
        raise ValueError(f"{code} has no stray-light model (disk imager)")
    r1, b1, r2, b2 = points[code]
    return StrayLightModel.through_points(r1, b1, r2, b2, r_min=1.0, r_max=3.0)


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


# ----------------------------------------------------------------------------- instrument


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

_CHANNEL_INDEX = {c: i for i, c in enumerate(CHANNELS)}


# ----------------------------------------------------------------------------- results


@dataclass
class CalibrationFileInfo:
    """One calibration master written by :func:`simulate`."""

    path: Path
    kind: str
    channel: str
    version: int
    valid_from: str
    valid_to: str
    description: str
    sha256: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InjectedFlare:
    """The flare injected into the SDI series (times ISO 8601 UTC; position helioprojective).

    ``peak_enhancement`` is fractional: the flare multiplies the pre-flare brightness by
    ``1 + peak_enhancement * G`` at its peak, G a unit-height Gaussian of ``sigma_arcsec``.
    ``profile`` lists (DATE-OBS, enhancement at the kernel) for every frame of the series.
    """

    channel: str
    start: str
    peak: str
    end: str
    hpc_x: float
    hpc_y: float
    peak_enhancement: float
    sigma_arcsec: float
    decay_time_s: float
    profile: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class SimulatedFrame:
    """One raw frame and its truth."""

    channel: str
    raw_path: Path
    truth_path: Path
    date_obs: str
    exptime_s: float
    naxis: int
    plate_scale: float
    crpix: tuple[float, float]
    crota2: float
    rsun_arcsec: float
    scene: str
    peak_dn: int
    notes: list[str] = field(default_factory=list)


@dataclass
class SimulationResult:
    """What :func:`simulate` wrote."""

    out_dir: Path
    raw_files: list[Path]
    truth_files: list[Path]
    calibration_files: list[CalibrationFileInfo]
    manifest_path: Path
    flare: InjectedFlare | None
    frames: list[SimulatedFrame]
    limb_fits: list[dict[str, Any]] = field(default_factory=list)
    radiometric: dict[str, float] = field(default_factory=dict)

    @property
    def injected_flare(self) -> dict[str, Any] | None:
        """The injected flare as a JSON-ready dict (``start``/``peak``/``end`` ISO UTC,
        ``hpc_x``/``hpc_y`` [arcsec], ``peak_enhancement``, ...), or ``None``."""
        return dataclasses.asdict(self.flare) if self.flare is not None else None


@dataclass
class LimbFit:
    """Disk centre (0-based pixel) and radius [pixel] fitted to the limb of an image."""

    x0: float
    y0: float
    radius: float
    rms: float
    n_points: int


# ----------------------------------------------------------------------------- small helpers


def ssw_date(t: Time) -> str:
    """DATE-OBS in the SSW/ASO-S style ``'01-Mar-04 00:00:10.515'`` (two-digit year)."""
    d = t.utc.to_datetime()
    ms = int(round(d.microsecond / 1000.0))
    sec = d.second + ms / 1000.0
    if ms == 1000:  # rounding up to the next second
        d = d.replace(microsecond=0) + dt.timedelta(seconds=1)
        sec = float(d.second)
    return f"{d.day:02d}-{d.strftime('%b')}-{d.year % 100:02d} {d.hour:02d}:{d.minute:02d}:{sec:06.3f}"


def _iso(t: Time) -> str:
    return t.utc.isot


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *keys]))


def _apparent_rsun_arcsec(t: Time) -> tuple[float, fits.Header]:
    """Apparent radius [arcsec] seen from Earth at ``t`` and the observer keywords."""
    h = fits.Header()
    add_observer_keywords(h, t)
    h["RSUN_REF"] = RSUN_REF_M
    return float(math.degrees(math.asin(RSUN_REF_M / float(h["DSUN_OBS"]))) * 3600.0), h


def _grid_offsets(n: int) -> np.ndarray:
    """Pixel offsets from the frame centre, 0..n-1 minus (n-1)/2, as float32."""
    return (np.arange(n, dtype=np.float32) - np.float32((n - 1) / 2.0))


def _rho_grid(n: int, rsun_px: float) -> np.ndarray:
    """Heliocentric distance [Rsun] of every pixel of the L2 grid (disk centred), float32."""
    g = _grid_offsets(n) / np.float32(rsun_px)
    return np.sqrt(g[None, :] ** 2 + g[:, None] ** 2, dtype=np.float32)


def _affine_sample(src: np.ndarray, a_xy: np.ndarray, src_center_xy: tuple[float, float], n: int,
                   order: int = 3, cval: float = 0.0) -> np.ndarray:
    """Sample ``src`` on an n x n grid: ``src_px = src_center + a_xy @ (grid_px - grid_center)``.

    ``scipy.ndimage.affine_transform`` with a cubic spline; float32 out.
    """
    c = (n - 1) / 2.0
    a_yx = np.array([[a_xy[1, 1], a_xy[1, 0]], [a_xy[0, 1], a_xy[0, 0]]], dtype=np.float64)
    s_yx = np.array([src_center_xy[1], src_center_xy[0]], dtype=np.float64)
    offset = s_yx - a_yx @ np.array([c, c])
    out = np.empty((n, n), dtype=np.float32)
    ndimage.affine_transform(np.asarray(src, dtype=np.float64), a_yx, offset=offset, output_shape=(n, n),
                             output=out, order=order, mode="constant", cval=cval, prefilter=True)
    return out


def _ceil_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    if x <= 0:
        return x
    e = math.floor(math.log10(x)) - digits + 1
    return math.ceil(x / 10.0 ** e) * 10.0 ** e


def _stamp_checksums(hdul: fits.HDUList, when: str) -> None:
    """CHECKSUM/DATASUM with a fixed comment, so files are byte-identical for one seed."""
    for hdu in hdul:
        hdu.add_checksum(when=when)


def _write(hdul: fits.HDUList, path: Path, when: str) -> str:
    _stamp_checksums(hdul, when)
    return write_fits_atomic(hdul, path, checksum=False)


# ----------------------------------------------------------------------------- limb fit


def fit_solar_limb(image: np.ndarray, *, n_rays: int = 360, smooth_px: float = 1.0,
                   edge: str = "steepest") -> LimbFit:
    """Fit the solar disk's centre and radius from the image itself.

    The initial disk is the region above half the contrast between the background and the
    bright disk; along ``n_rays`` radial rays from its centre the limb is where the radial
    intensity falls most steeply (sub-pixel, parabolic peak); a least-squares circle
    (Kasa's algebraic fit) through those points, with points beyond 3 median absolute
    deviations rejected, refined once from the new centre.

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
        Full-disk image (EUV or white light); NaN/inf are treated as background.
    n_rays : int
    smooth_px : float
        Gaussian sigma [pixel] applied before differentiating.

    Returns
    -------
    LimbFit

    Raises
    ------
    DataError
        If no disk is found.
    """
    img = np.asarray(image, dtype=np.float64)
    img = np.where(np.isfinite(img), img, np.nan)
    bg = np.nanpercentile(img, 1.0)
    img = np.nan_to_num(img - bg, nan=0.0)
    sm = ndimage.gaussian_filter(img, smooth_px) if smooth_px > 0 else img
    hi = np.percentile(sm, 90.0)
    if not hi > 0:
        raise DataError("no solar disk found (image has no contrast)")
    mask = sm > 0.25 * np.median(sm[sm > 0.5 * hi]) if np.any(sm > 0.5 * hi) else sm > 0.5 * hi
    lab, nlab = ndimage.label(mask)
    if nlab == 0:
        raise DataError("no solar disk found")
    sizes = ndimage.sum(mask, lab, index=np.arange(1, nlab + 1))
    disk = lab == (int(np.argmax(sizes)) + 1)
    disk = ndimage.binary_fill_holes(disk)
    y0, x0 = ndimage.center_of_mass(disk)
    r0 = math.sqrt(disk.sum() / math.pi)
    if r0 < 5:
        raise DataError("solar disk too small to fit a limb")
    theta = np.linspace(0.0, 2 * math.pi, n_rays, endpoint=False)
    fit = (x0, y0, r0)
    used = 0
    rms = float("nan")
    for _ in range(3):
        x0, y0, r0 = fit
        radii = np.arange(0.6 * r0, 1.4 * r0, 0.05)
        xs = x0 + np.outer(np.cos(theta), radii)
        ys = y0 + np.outer(np.sin(theta), radii)
        prof = ndimage.map_coordinates(sm, [ys, xs], order=1, mode="nearest")
        if edge == "peak":  # EUV: the limb-brightening maximum of optically thin emission
            deriv = -prof
        else:  # white light: where the intensity falls most steeply
            deriv = np.gradient(prof, radii, axis=1)
        k = np.argmin(deriv, axis=1)
        k = np.clip(k, 1, len(radii) - 2)
        rows = np.arange(n_rays)
        ym, y_0, yp = deriv[rows, k - 1], deriv[rows, k], deriv[rows, k + 1]
        denom = ym - 2 * y_0 + yp
        frac = np.where(np.abs(denom) > 0, 0.5 * (ym - yp) / np.where(denom == 0, 1, denom), 0.0)
        r_edge = radii[k] + np.clip(frac, -1, 1) * (radii[1] - radii[0])
        px, py = x0 + r_edge * np.cos(theta), y0 + r_edge * np.sin(theta)
        keep = np.ones(n_rays, dtype=bool)
        for _ in range(4):
            a = np.column_stack([px[keep], py[keep], np.ones(keep.sum())])
            b = px[keep] ** 2 + py[keep] ** 2
            sol, *_ = np.linalg.lstsq(a, b, rcond=None)
            cx, cy = sol[0] / 2, sol[1] / 2
            rad = math.sqrt(sol[2] + cx * cx + cy * cy)
            res = np.hypot(px - cx, py - cy) - rad
            mad = np.median(np.abs(res[keep] - np.median(res[keep]))) * 1.4826
            new_keep = np.abs(res) < max(3 * mad, 0.05)
            if new_keep.sum() < 0.3 * n_rays or np.array_equal(new_keep, keep):
                break
            keep = new_keep
        fit = (cx, cy, rad)
        used = int(keep.sum())
        rms = float(np.sqrt(np.mean(res[keep] ** 2)))
    return LimbFit(x0=float(fit[0]), y0=float(fit[1]), radius=float(fit[2]), rms=rms, n_points=used)


# ----------------------------------------------------------------------------- scene sources


@dataclass
class _DiskSource:
    """A full-disk source image and where its Sun is."""

    image: np.ndarray
    x0: float
    y0: float
    matrix: np.ndarray  # pixel -> arcsec (world = matrix @ (p - s)), orientation of the source
    rsun_arcsec: float
    date_obs: Time
    name: str
    notes: list[str] = field(default_factory=list)

    @property
    def rsun_px(self) -> float:
        return self.rsun_arcsec / math.sqrt(abs(np.linalg.det(self.matrix)))


def _sunpy_source(path: Path) -> _DiskSource:
    import sunpy.map
    from astropy.coordinates import SkyCoord

    from sunpy import log as sunpy_log

    level = sunpy_log.level
    sunpy_log.setLevel("WARNING")  # sunpy logs INFO on the sources' missing RSUN_REF
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = sunpy.map.Map(path)
            c = m.world_to_pixel(SkyCoord(0 * u.arcsec, 0 * u.arcsec, frame=m.coordinate_frame))
            scale = np.diag([m.scale[0].to_value(u.arcsec / u.pix), m.scale[1].to_value(u.arcsec / u.pix)])
            matrix = scale @ np.asarray(m.rotation_matrix, dtype=float)
            rsun = float(m.rsun_obs.to_value(u.arcsec))
            data = np.asarray(m.data, dtype=np.float64)
            t = Time(m.date)
    finally:
        sunpy_log.setLevel(level)
    return _DiskSource(image=data, x0=float(c.x.to_value(u.pix)), y0=float(c.y.to_value(u.pix)), matrix=matrix,
                       rsun_arcsec=rsun, date_obs=t.utc, name=str(path.relative_to(path.parents[1])))


def _inpaint_missing(img: np.ndarray, missing: np.ndarray, sigma: float = 1.5) -> np.ndarray:
    """Fill ``missing`` pixels by normalised Gaussian convolution of the good ones."""
    if not missing.any():
        return img
    good = (~missing).astype(np.float64)
    num = ndimage.gaussian_filter(np.where(missing, 0.0, img), sigma)
    den = ndimage.gaussian_filter(good, sigma)
    out = img.copy()
    out[missing] = num[missing] / np.maximum(den[missing], 1e-6)
    return out


def _despike_series(frames: list[dict[str, Any]], threshold: float = 1.4) -> None:
    """Remove transient single-pixel spikes (cosmic-ray hits) from an image series in place.

    A pixel (on the disk or the bright corona) is a spike when it exceeds the median of its
    3x3 neighbourhood by the factor ``threshold`` *and* by ``threshold`` over its own ratio
    in the frames before and after (a persistent bright point is kept). It is replaced by
    the 3x3 median.
    """
    ratios = []
    for f in frames:
        med = ndimage.median_filter(f["data"], size=3, mode="nearest")
        bright = med > 0.3 * np.percentile(med, 75)  # the disk and the bright corona, not the noisy sky
        ratios.append((np.where(bright, f["data"] / np.where(med > 0, med, 1.0), 1.0), med))
    for k, f in enumerate(frames):
        r, med = ratios[k]
        nb = [ratios[j][0] for j in (k - 1, k + 1) if 0 <= j < len(frames)]
        spike = (r > threshold) & (r > threshold * np.maximum.reduce(nb))
        if spike.any():
            f["data"] = np.where(spike, med, f["data"])
            f["n_spikes"] = int(spike.sum())


def _eit_sources(sample_dir: Path) -> tuple[list[_DiskSource], list[dict[str, Any]]]:
    """The 13 EIT frames as exposure-normalised, bias-subtracted images with fitted limbs.

    The 171 A frames (two of 13) are replaced by the mean of their 195 A neighbours so
    that the Ly-alpha proxy series has no band-switch jumps; missing telemetry blocks
    (zeros) are in-painted.
    """
    files = sorted((sample_dir / EIT_DIR).glob("*.fits"))
    if len(files) != 13:
        raise DataError(f"expected the 13-frame EIT sequence in {sample_dir / EIT_DIR}, found {len(files)} files")
    frames: list[dict[str, Any]] = []
    for p in files:
        raw = read_image(p)
        d = raw.data.copy()
        missing = d <= 0
        bias = float(np.percentile(d[~missing], 0.5))
        d = _inpaint_missing(d, missing)
        d = (d - bias) / float(raw.header["EXPTIME"])
        frames.append(dict(path=p, data=d, t=raw.date_obs, wave=int(raw.header.get("WAVELNTH", 195)),
                           n_missing=int(missing.sum()), bias=bias, header=raw.header))
    _despike_series([f for f in frames if f["wave"] == 195])  # neighbours in time, one band
    sources: list[_DiskSource] = []
    fits_out: list[dict[str, Any]] = []
    for i, f in enumerate(frames):
        notes = []
        data = f["data"]
        if f["wave"] != 195:
            nb = [frames[j] for j in (i - 1, i + 1) if 0 <= j < len(frames) and frames[j]["wave"] == 195]
            if not nb:
                raise DataError(f"{f['path'].name}: {f['wave']} A frame without 195 A neighbours")
            data = sum(n["data"] for n in nb) / len(nb)
            notes.append(f"EIT {f['wave']} A frame replaced by the mean of its 195 A neighbours "
                         f"({', '.join(n['path'].name for n in nb)})")
        if f["n_missing"]:
            notes.append(f"{f['n_missing']} missing-block pixels in-painted")
        if f.get("n_spikes"):
            notes.append(f"{f['n_spikes']} transient single-pixel spikes (cosmic rays) removed")
        lf = fit_solar_limb(data, edge="peak")
        hdr = f["header"]
        hdr_r = float(hdr.get("SOLAR_R", float("nan")))
        notes.append(f"EIT limb fit (limb-brightening peak mapped to 1 Rsun): centre ({lf.x0:.2f}, {lf.y0:.2f}) px, "
                     f"radius {lf.radius:.2f} px; the header's SOLAR_R/CDELT imply {hdr_r:.1f} px "
                     f"(x{hdr_r / lf.radius:.2f}: rebinned 8x, WCS not used)")
        rs_arc, _ = _apparent_rsun_arcsec(f["t"])
        # orientation: the EIT frames are north up; the CDELT is never used, only the fitted radius
        matrix = np.eye(2) * (rs_arc / lf.radius)
        sources.append(_DiskSource(image=data, x0=lf.x0, y0=lf.y0, matrix=matrix, rsun_arcsec=rs_arc,
                                   date_obs=f["t"], name=f"{EIT_DIR}/{f['path'].name}", notes=notes))
        fits_out.append(dict(file=f"{EIT_DIR}/{f['path'].name}", date_obs=_iso(f["t"]), wavelength_A=f["wave"],
                             x0=lf.x0, y0=lf.y0, radius_px=lf.radius, rms_px=lf.rms, n_points=lf.n_points,
                             header_solar_r_px=hdr_r, header_cdelt=float(hdr.get("CDELT1", float("nan"))),
                             wcs_factor=hdr_r / lf.radius))
    return sources, fits_out


def _lyman_alpha_irradiance(sample_dir: Path, t: Time) -> float:
    """LASP composite Ly-alpha irradiance at 1 au on the day of ``t`` [photons cm-2 s-1]."""
    path = sample_dir / LYA_INDEX_FILE
    d = t.utc.to_datetime()
    key = d.year * 1000 + d.timetuple().tm_yday
    best, best_dist = None, None
    with open(path) as f:
        next(f)
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 2:
                continue
            try:
                day, val = int(parts[0]), float(parts[1])
            except ValueError:
                continue
            dist = abs(day - key)
            if best_dist is None or dist < best_dist:
                best, best_dist = val, dist
    if best is None or best_dist > 366:
        raise DataError(f"no LASP Ly-alpha composite value near {t.isot}")
    return best * 1e11


# ----------------------------------------------------------------------------- scenes on the L2 grid


def _smooth_sigma_px(spec: ChannelSpec, scale: float) -> float:
    """Gaussian sigma [pixel] for the channel's on-orbit resolution (FWHM), at least 1 px."""
    return max(1.0, spec.resolution / (2.0 * math.sqrt(2.0 * math.log(2.0))) / scale)


def _disk_mapping(src: _DiskSource, rsun_grid_px: float) -> np.ndarray:
    """``a_xy`` mapping grid pixel offsets to source pixel offsets (same position on the Sun)."""
    return np.linalg.inv(src.matrix) * (src.rsun_arcsec / rsun_grid_px)


def _sdi_scene(src: _DiskSource, n: int, scale: float, rsun_arcsec: float, ref: dict[str, float],
               radiance_mean: float) -> np.ndarray:
    """Ly-alpha radiance [erg cm-2 s-1 sr-1] on the L2 grid (unsmoothed).

    ``ref`` holds ``euv_quiet`` (EUV level of the quiet disk) and ``norm`` (mean of the
    proxy over the disk): fixed for a whole series so that real variations survive.
    """
    rsun_px = rsun_arcsec / scale
    # the proxy is exp(gamma * log(EUV / quiet)): the spline works on log(EUV), so the
    # up-sampling has no negative over-shoots next to bright points
    floor = 1e-3 * ref["euv_quiet"]
    log_euv = np.log(np.maximum(src.image, floor) / ref["euv_quiet"])
    proxy = _affine_sample(log_euv, _disk_mapping(src, rsun_px), (src.x0, src.y0), n, cval=float(np.log(1e-3)))
    proxy *= np.float32(LYA_GAMMA)
    np.exp(proxy, out=proxy)
    rho = _rho_grid(n, rsun_px)
    off = rho > 1.0
    w = np.exp(-(rho[off] - 1.0) / np.float32(LYA_LIMB_SCALE_RSUN)) + lyman_alpha_corona(rho[off]).astype(np.float32)
    proxy[off] *= w
    proxy *= np.float32(radiance_mean / ref["norm"])
    return proxy


def _sdi_reference(src: _DiskSource) -> dict[str, float]:
    """Quiet-disk EUV level and proxy normalisation from a source at its native sampling."""
    ny, nx = src.image.shape
    yy, xx = np.mgrid[0:ny, 0:nx]
    r = np.hypot(xx - src.x0, yy - src.y0) / src.rsun_px
    disk = r < 0.95
    euv_quiet = float(np.median(src.image[disk]))
    proxy = np.power(np.maximum(src.image[r < 1.0], 0) / euv_quiet, LYA_GAMMA)
    return {"euv_quiet": euv_quiet, "norm": float(proxy.mean())}


def _mdi_contrast(src: _DiskSource) -> np.ndarray:
    """Photospheric contrast map of MDI on its own grid (1 on the quiet disk and off the disk).

    MDI's continuum intensity divided by its limb darkening (Neckel 2005 at 676.8 nm) and
    by a robust second-order 2-D polynomial fitted over the disk: that removes the
    instrument's large-scale non-uniformity (an E-W gradient of ~14 % in this file, from
    the rotational Doppler shift of the filtergram-based Ic), leaving spots and faculae.
    The extreme limb (r > 0.95 Rsun) fades to 1: MDI's limb is not used.
    """
    img = np.nan_to_num(src.image, nan=0.0)
    ny, nx = img.shape
    yy, xx = np.mgrid[0:ny, 0:nx]
    x = (xx - src.x0) / src.rsun_px
    y = (yy - src.y0) / src.rsun_px
    rr = np.hypot(x, y)
    disk = rr < 0.99
    mu = np.sqrt(np.clip(1.0 - rr ** 2, 0.0, 1.0))
    ratio = np.ones_like(img)
    ratio[disk] = img[disk] / limb_darkening_neckel2005(676.8, mu[disk])
    fit_sel = (rr < 0.95) & ((xx % 3) == 0) & ((yy % 3) == 0)
    xs, ys, vs = x[fit_sel], y[fit_sel], ratio[fit_sel]
    keep = np.ones(vs.size, dtype=bool)
    for _ in range(4):
        a = np.column_stack([np.ones(keep.sum()), xs[keep], ys[keep], xs[keep] ** 2, xs[keep] * ys[keep], ys[keep] ** 2])
        coef, *_ = np.linalg.lstsq(a, vs[keep], rcond=None)
        model = coef[0] + coef[1] * xs + coef[2] * ys + coef[3] * xs ** 2 + coef[4] * xs * ys + coef[5] * ys ** 2
        res = vs / model - 1.0
        sig = 1.4826 * np.median(np.abs(res[keep]))
        keep = np.abs(res) < 3 * max(sig, 1e-4)
    poly = coef[0] + coef[1] * x + coef[2] * y + coef[3] * x ** 2 + coef[4] * x * y + coef[5] * y ** 2
    contrast = np.ones_like(img)
    contrast[disk] = np.clip(ratio[disk] / poly[disk], 0.05, 2.0)
    taper = np.clip((0.99 - rr) / 0.04, 0.0, 1.0) ** 2
    return 1.0 + (contrast - 1.0) * taper


def _wst_scene(src: _DiskSource, n: int, scale: float, rsun_arcsec: float,
               block: int = 512) -> tuple[np.ndarray, list[str]]:
    """360 nm radiance [erg cm-2 s-1 sr-1] on the L2 grid (unsmoothed), from MDI at 676.8 nm.

    The MDI contrasts (:func:`_mdi_contrast`) scale to 360 nm as ``C ** (676.8 / 360)``
    (Wien: the log of a brightness-temperature contrast scales as 1/lambda); the 360 nm
    limb darkening (Neckel 2005) and the disk-centre radiance are applied. Row blocks
    bound the memory.
    """
    rsun_px = rsun_arcsec / scale
    contrast_map = _affine_sample(_mdi_contrast(src), _disk_mapping(src, rsun_px), (src.x0, src.y0), n, cval=1.0)
    g = _grid_offsets(n).astype(np.float64) / rsun_px
    radiance_mean = IRRADIANCE_360NM * CHANNELS["WST"].bandwidth_nm * 1e3 / OMEGA_SUN_1AU  # W m-2 -> erg cm-2 s-1
    centre = radiance_mean / _disk_average_factor(360.0)
    out = np.zeros((n, n), dtype=np.float32)
    for j0 in range(0, n, block):
        rho = np.sqrt(g[None, :] ** 2 + g[j0:j0 + block, None] ** 2)
        disk = rho < 1.0
        if not disk.any():
            continue
        mu = np.sqrt(1.0 - rho[disk] ** 2)
        c = np.clip(contrast_map[j0:j0 + block][disk].astype(np.float64), 0.05, 2.0)
        blk = out[j0:j0 + block]
        blk[disk] = centre * limb_darkening_neckel2005(360.0, mu) * c ** (676.8 / 360.0)
    notes = [f"MDI 676.8 nm contrasts (limb darkening and large-scale trend removed) scaled to 360 nm as "
             f"C^(676.8/360); Neckel 2005 limb darkening; disk-centre radiance {centre:.4g} {RADIANCE_UNIT} "
             f"(ASTM E-490 {IRRADIANCE_360NM} W m-2 nm-1 x {CHANNELS['WST'].bandwidth_nm} nm)"]
    return out, notes


@dataclass
class _CoronaTexture:
    """COR1 coronal structure: image / azimuthal median, on COR1's pixel grid."""

    texture: np.ndarray
    x0: float
    y0: float
    matrix: np.ndarray
    rsun_px: float
    rsun_arcsec: float
    date_obs: Time
    name: str
    r_in: float = 2.0  # COR1 annulus sampled [Rsun]
    r_out: float = 3.8


def _cor1_texture(sample_dir: Path) -> _CoronaTexture:
    src = _sunpy_source(sample_dir / COR1_FILE)
    img = src.image
    bias = float(np.percentile(img, 0.5))
    img = img - bias
    ny, nx = img.shape
    yy, xx = np.mgrid[0:ny, 0:nx]
    r = np.hypot(xx - src.x0, yy - src.y0) / src.rsun_px
    edges = np.arange(1.5, 4.3, 0.02)
    idx = np.digitize(r, edges)
    centres, med = [], []
    for i in range(1, len(edges)):
        sel = idx == i
        if sel.sum() > 20:
            centres.append(0.5 * (edges[i - 1] + edges[i]))
            med.append(float(np.median(img[sel])))
    prof = np.interp(r, centres, med)
    tex = np.where(prof > 0, img / np.where(prof > 0, prof, 1.0), 1.0)
    tex = 1.0 + (tex - 1.0) * COR1_CONTRAST_GAIN
    tex = np.clip(tex, 0.2, 4.0)
    tex[(r < 1.9) | (r > 3.9)] = 1.0
    return _CoronaTexture(texture=tex, x0=src.x0, y0=src.y0, matrix=src.matrix, rsun_px=src.rsun_px,
                          rsun_arcsec=src.rsun_arcsec, date_obs=src.date_obs, name=src.name)


def _sci_scene(channel: str, tex: _CoronaTexture, n: int, scale: float, rsun_arcsec: float,
               block: int = 256) -> np.ndarray:
    """Coronal brightness [MSB] on the L2 grid (unsmoothed): radial model x COR1 structure.

    SCI's 1.1-2.5 Rsun maps linearly onto COR1's 2.0-3.8 Rsun annulus along the same
    position angle.
    """
    rsun_px = rsun_arcsec / scale
    inv = np.linalg.inv(tex.matrix) * tex.rsun_arcsec  # Rsun offsets (x, y) -> COR1 pixel offsets
    g = _grid_offsets(n).astype(np.float64) / rsun_px
    out = np.empty((n, n), dtype=np.float32)
    gain = (tex.r_out - tex.r_in) / (2.5 - 1.1)
    prefiltered = ndimage.spline_filter(tex.texture, order=3)
    for j0 in range(0, n, block):
        gy = g[j0:j0 + block, None]
        gx = g[None, :]
        rho = np.sqrt(gx * gx + gy * gy)
        rho_c = tex.r_in + (np.clip(rho, 0.9, 2.75) - 1.1) * gain
        with np.errstate(invalid="ignore", divide="ignore"):
            f = np.where(rho > 0, rho_c / np.where(rho > 0, rho, 1.0), 0.0)
        ux, uy = gx * f, gy * f  # Rsun, same position angle
        px = tex.x0 + inv[0, 0] * ux + inv[0, 1] * uy
        py = tex.y0 + inv[1, 0] * ux + inv[1, 1] * uy
        t = ndimage.map_coordinates(prefiltered, [py, px], order=3, mode="nearest", prefilter=False)
        rr = np.maximum(rho, 1.0)
        if channel == "SCI-WL":
            val = baumbach_f_corona(rr) + WL_K_FACTOR * baumbach_k_corona(rr) * t
        else:
            val = lyman_alpha_corona(rr) * t
        out[j0:j0 + block] = val
    return out


# ----------------------------------------------------------------------------- detector


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
    dx = (np.arange(n, dtype=np.float32) - np.float32(x0)) / np.float32(rsun_px)
    dy = (np.arange(n, dtype=np.float32) - np.float32(y0)) / np.float32(rsun_px)
    return np.sqrt(dx[None, :] ** 2 + dy[:, None] ** 2, dtype=np.float32)


# ----------------------------------------------------------------------------- headers


def _raw_header(spec: ChannelSpec, t: Time, model: InstrumentModel, scale: float, x0: float, y0: float,
                roll: float, scene: str, name: str, notes: Iterable[str]) -> fits.Header:
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
    h.add_history(f"Simulated by {SOFTWARE} from {scene} (real data; sample-data/real/MANIFEST.md)")
    for line in notes:
        h.add_history(line)
    return h


def _truth_header(spec: ChannelSpec, t: Time, n: int, scale: float, rsun_arcsec: float, obs: fits.Header,
                  bunit: str, raw_name: str, scene: str, sigma_px: float) -> fits.Header:
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"], h["DETECTOR"], h["CHANNEL"] = "ASO-S", "LST", spec.instrument, spec.code
    h["WAVELNTH"], h["WAVEUNIT"] = spec.wavelength_nm, "nm"
    h["DATE-OBS"] = _iso(t)
    h["WCSAXES"] = 2
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"] = ((n + 1) / 2.0, "[pix] disk centre (1-based)")
    h["CRPIX2"] = ((n + 1) / 2.0, "[pix] disk centre (1-based)")
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"], h["CDELT2"] = scale, scale
    h["PC1_1"], h["PC1_2"], h["PC2_1"], h["PC2_2"] = 1.0, 0.0, 0.0, 1.0
    for k in ("HGLN_OBS", "HGLT_OBS", "DSUN_OBS", "RSUN_REF"):
        h[k] = (obs[k], obs.comments[k])
    h["RSUN_OBS"] = (rsun_arcsec, "[arcsec] apparent photospheric radius")
    h["BUNIT"] = bunit
    h["LEVEL"] = ("TRUTH", "simulation truth on the L2 grid")
    h["RAWFILE"] = (raw_name, "raw frame made from this truth")
    h["SMOOTHPX"] = (sigma_px, "[pix] Gaussian sigma of the band limit")
    h.add_history(f"Truth of {SOFTWARE}: {scene}, north up, disk centre on the frame centre")
    return h


# ----------------------------------------------------------------------------- main entry


def _sizes(channels: tuple[str, ...], naxis: dict[str, int] | int | None) -> dict[str, int]:
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


def _flare_profile(t: Time, start: Time, peak: Time, end: Time, tau_s: float) -> float:
    """Normalised flare light curve: linear rise, exponential decay reaching 0 at ``end``."""
    if t <= start or t >= end:
        return 0.0
    if t <= peak:
        return float((t - start).to_value(u.s) / (peak - start).to_value(u.s))
    x = (t - peak).to_value(u.s)
    e_end = math.exp(-(end - peak).to_value(u.s) / tau_s)
    return float((math.exp(-x / tau_s) - e_end) / (1.0 - e_end))


def _clean(out_dir: Path) -> None:
    for sub in ("raw", "calibration", "truth"):
        d = out_dir / sub
        if d.is_dir():
            for p in d.glob("lst_*.fits"):
                p.unlink()


@dataclass
class _FramePlan:
    """One frame to simulate: when, from which scene, and (filled by pass 1) its truth."""

    t: Time
    kind: str  # "sdi", "wst" or "sci"
    src: Any
    scene: str
    notes: list[str]
    sdi_ref: dict[str, float] | None = None
    lya_irradiance: float | None = None  # [photons cm-2 s-1] at 1 au
    flare_amp: float = 0.0
    rsun_arcsec: float = float("nan")
    truth_path: Path | None = None
    raw_name: str = ""


#: The flare injected into the SDI series: helioprojective position [arcsec], Gaussian
#: sigma [arcsec], peak enhancement over the pre-flare level at the kernel, e-folding decay
#: [s], and the series frames (0-based) of its start, peak and end. A strong (X-class-like)
#: Ly-alpha kernel, placed in a quiet part of the disk where the EIT series varies by ~5 %.
FLARE = dict(hpc_x=-400.0, hpc_y=-350.0, sigma_arcsec=30.0, peak_enhancement=2.0, decay_time_s=5400.0,
             start_frame=3, peak_frame=5, end_frame=9)


def _plan_frames(chan: str, sample: Path, sdi_sequence: bool, frames_per_channel: int,
                 cache: dict[str, Any]) -> tuple[list[_FramePlan], InjectedFlare | None, list[dict[str, Any]]]:
    """The frames of one channel, the flare injected in them (SDI series) and limb fits."""
    spec = CHANNELS[chan]
    plans: list[_FramePlan] = []
    if chan == "SDI" and sdi_sequence:
        sources, fits_info = _eit_sources(sample)
        refs = [_sdi_reference(s) for s in sources]
        ref = {"euv_quiet": float(np.median([r["euv_quiet"] for r in refs])),
               "norm": float(np.median([r["norm"] for r in refs]))}
        times = [s.date_obs for s in sources]
        lya = _lyman_alpha_irradiance(sample, times[0])
        f_start, f_peak, f_end = (times[FLARE[k]] for k in ("start_frame", "peak_frame", "end_frame"))
        flare = InjectedFlare(channel="SDI", start=_iso(f_start), peak=_iso(f_peak), end=_iso(f_end),
                              hpc_x=FLARE["hpc_x"], hpc_y=FLARE["hpc_y"], peak_enhancement=FLARE["peak_enhancement"],
                              sigma_arcsec=FLARE["sigma_arcsec"], decay_time_s=FLARE["decay_time_s"])
        for s in sources:
            amp = FLARE["peak_enhancement"] * _flare_profile(s.date_obs, f_start, f_peak, f_end, FLARE["decay_time_s"])
            flare.profile.append((_iso(s.date_obs), amp))
            plans.append(_FramePlan(t=s.date_obs, kind="sdi", src=s, scene=s.name, notes=list(s.notes), sdi_ref=ref,
                                    lya_irradiance=lya, flare_amp=amp))
        return plans, flare, fits_info
    if chan == "SDI":
        s = _sunpy_source(sample / SWAP_FILE)
        ref, lya = _sdi_reference(s), _lyman_alpha_irradiance(sample, s.date_obs)
        plans = [_FramePlan(t=s.date_obs + k * spec.cadence_s * u.s, kind="sdi", src=s, scene=s.name, notes=[],
                            sdi_ref=ref, lya_irradiance=lya) for k in range(frames_per_channel)]
    elif chan == "WST":
        s = _sunpy_source(sample / MDI_FILE)
        plans = [_FramePlan(t=s.date_obs + k * spec.cadence_s * u.s, kind="wst", src=s, scene=s.name, notes=[])
                 for k in range(frames_per_channel)]
    else:
        if "cor1" not in cache:
            cache["cor1"] = _cor1_texture(sample)
        tex = cache["cor1"]
        note = f"coronal structure from {tex.name} ({tex.r_in}-{tex.r_out} Rsun mapped onto 1.1-2.5)"
        plans = [_FramePlan(t=tex.date_obs + k * spec.cadence_s * u.s, kind="sci", src=tex, scene=tex.name,
                            notes=[note]) for k in range(frames_per_channel)]
    return plans, None, []


def _write_truth(plan: _FramePlan, chan: str, n: int, scale: float, stray: StrayLightModel | None,
                 out: Path) -> float:
    """Build, band-limit and write the truth of one frame; return its brightest signal.

    The signal includes the stray light behind the aperture (what reaches the detector),
    so that the radiometric coefficient can keep every raw pixel below the target.
    """
    spec, model = CHANNELS[chan], INSTRUMENT[chan]
    rsun_arcsec, obs = _apparent_rsun_arcsec(plan.t)
    rsun_px = rsun_arcsec / scale
    sigma = _smooth_sigma_px(spec, scale)
    flare_img = None
    if plan.kind == "sdi":
        radiance_mean = plan.lya_irradiance * LYA_PHOTON_ERG / OMEGA_SUN_1AU
        scene = _sdi_scene(plan.src, n, scale, rsun_arcsec, plan.sdi_ref, radiance_mean)
        plan.notes.append(f"Ly-alpha proxy (EUV/quiet)^{LYA_GAMMA}; disk-average radiance {radiance_mean:.4g} "
                          f"{RADIANCE_UNIT} (LASP composite irradiance)")
        if plan.flare_amp > 0:
            g = _grid_offsets(n) * np.float32(scale)
            d2 = (g[None, :] - FLARE["hpc_x"]) ** 2 + (g[:, None] - FLARE["hpc_y"]) ** 2
            gauss = np.exp(-d2 / (2 * FLARE["sigma_arcsec"] ** 2)).astype(np.float32)
            base = float(np.mean(scene[d2 <= FLARE["sigma_arcsec"] ** 2]))  # pre-flare level at the kernel
            flare_img = gauss * np.float32(plan.flare_amp * base)
            scene += flare_img
            plan.notes.append(f"flare injected: +{plan.flare_amp:.3f} x the pre-flare level ({base:.4g}) at "
                              f"({FLARE['hpc_x']:g}, {FLARE['hpc_y']:g}) arcsec, sigma {FLARE['sigma_arcsec']:g} arcsec")
    elif plan.kind == "wst":
        scene, notes = _wst_scene(plan.src, n, scale, rsun_arcsec)
        plan.notes.extend(notes)
    else:
        scene = _sci_scene(chan, plan.src, n, scale, rsun_arcsec)
        plan.notes.append(f"radial model: Baumbach F + {WL_K_FACTOR:g} x K corona" if chan == "SCI-WL" else
                          f"radial model: Ly-alpha streamer corona (K shape, {UV_MSB_AT_1P5:.3g} MSB at 1.5 Rsun)")
    truth = ndimage.gaussian_filter(scene, sigma, mode="nearest").astype(np.float32)
    del scene
    hdus_extra = []
    if flare_img is not None:
        fh = fits.Header()
        fh["BUNIT"] = (spec.bunit, "injected flare (in the primary)")
        hdus_extra.append(fits.ImageHDU(ndimage.gaussian_filter(flare_img, sigma, mode="nearest"), header=fh,
                                        name="FLARE"))
    if stray is not None:
        rho = _rho_grid(n, rsun_px)
        ap = _aperture(rho, spec, model, rsun_px)
        stray_grid = (stray.brightness(rho.astype(np.float64)) * ap).astype(np.float32)
        peak = float(np.max((truth + stray_grid) * ap))
        sh = fits.Header()
        sh["BUNIT"] = ("MSB", "injected stray light (before the flat), L2 grid")
        hdus_extra.insert(0, fits.ImageHDU(stray_grid, header=sh, name="STRAY"))
        del rho, ap
    else:
        peak = float(np.max(truth))
    stamp = plan.t.utc.to_datetime().strftime("%Y%m%dT%H%M%S")
    code = chan.lower()
    plan.raw_name = f"lst_{code}_{stamp}_raw.fits"
    plan.truth_path = out / "truth" / f"lst_{code}_{stamp}_truth.fits"
    plan.rsun_arcsec = rsun_arcsec
    th = _truth_header(spec, plan.t, n, scale, rsun_arcsec, obs, spec.bunit, plan.raw_name, plan.scene, sigma)
    _write(fits.HDUList([fits.PrimaryHDU(truth, header=th), *hdus_extra]), plan.truth_path, _iso(plan.t))
    return peak


def _forward_model(truth: np.ndarray, spec: ChannelSpec, model: InstrumentModel, n: int, x0: float, y0: float,
                   roll: float, rsun_px: float, stray: StrayLightModel | None, flat: np.ndarray, bias: np.ndarray,
                   dark_rate: np.ndarray, coef: float, noise: bool, rng: np.random.Generator) -> np.ndarray:
    """Raw DN of one frame: ``bias + dark_rate t + flat t aperture (S + S_stray) / C``, noise, uint16."""
    t_exp = model.exptime_s
    s_det = _to_detector(truth, n, x0, y0, roll)
    if stray is not None:
        rho = _detector_rho(n, x0, y0, rsun_px)
        s_det += stray.brightness(rho.astype(np.float64)).astype(np.float32)
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


def simulate(out_dir: str | os.PathLike, channels: Iterable[str] = ("SDI", "WST", "SCI-UV", "SCI-WL"),
             naxis: dict[str, int] | int | None = None, noise: bool = True, seed: int = 0,
             sdi_sequence: bool = True, frames_per_channel: int = 1, *,
             sample_dir: str | os.PathLike | None = None) -> SimulationResult:
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
    sizes = _sizes(chans, naxis)
    for sub in ("raw", "calibration", "truth"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    _clean(out)

    frames: list[SimulatedFrame] = []
    cal_infos: list[CalibrationFileInfo] = []
    limb_fits: list[dict[str, Any]] = []
    radiometric: dict[str, float] = {}
    flare: InjectedFlare | None = None
    cache: dict[str, Any] = {}

    for chan in chans:
        spec, model, n = CHANNELS[chan], INSTRUMENT[chan], sizes[chan]
        scale = spec.plate_scale_for(n)
        ci = _CHANNEL_INDEX[chan]
        plans, chan_flare, fits_info = _plan_frames(chan, sample, sdi_sequence, frames_per_channel, cache)
        flare = chan_flare or flare
        limb_fits.extend(fits_info)
        stray = stray_light_model(chan) if spec.is_coronagraph else None

        # pass 1: the truths (written to disk) and the brightest signal of the channel
        peak_signal = max(_write_truth(plan, chan, n, scale, stray, out) for plan in plans)

        # the channel's calibration masters; C puts the brightest pixel below target_peak_dn
        rng_cal = _rng(seed, ci, 1000 + n)
        flat = _flat_field(n, spec.naxis, model, rng_cal)
        bias, dark_rate = _dark_planes(n, model, rng_cal)
        t_exp = model.exptime_s
        headroom = model.target_peak_dn - float(bias.max()) - float(np.percentile(dark_rate, 99.9)) * t_exp
        coef = _ceil_sig(peak_signal * float(flat.max()) * t_exp * 1.01 / headroom, 4)
        radiometric[chan] = coef
        t_first, t_last = min(p.t for p in plans), max(p.t for p in plans)
        valid_from = (t_first - 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
        valid_to = (t_last + 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
        cal_infos.extend(_write_masters(out, chan, spec, model, n, flat, bias, dark_rate, coef, stray,
                                        valid_from, valid_to, _iso(t_first)))

        # pass 2: the raw frames
        for k, plan in enumerate(plans):
            rng = _rng(seed, ci, k)
            x0, y0, roll = _detector_geometry(model, n, rng)
            with fits.open(plan.truth_path, memmap=False) as hd:
                truth = np.asarray(hd[0].data, dtype=np.float32)
            raw = _forward_model(truth, spec, model, n, x0, y0, roll, plan.rsun_arcsec / scale, stray, flat, bias,
                                 dark_rate, coef, noise, rng)
            del truth
            raw_path = out / "raw" / plan.raw_name
            rh = _raw_header(spec, plan.t, model, scale, x0, y0, roll, plan.scene, plan.raw_name, plan.notes)
            _write(fits.HDUList([fits.PrimaryHDU(raw, header=rh)]), raw_path, _iso(plan.t))
            frames.append(SimulatedFrame(channel=chan, raw_path=raw_path, truth_path=plan.truth_path,
                                         date_obs=_iso(plan.t), exptime_s=t_exp, naxis=n, plate_scale=scale,
                                         crpix=(x0 + 1.0, y0 + 1.0), crota2=roll, rsun_arcsec=plan.rsun_arcsec,
                                         scene=plan.scene, peak_dn=int(raw.max()), notes=list(plan.notes)))
            del raw

    manifest = out / "manifest.json"
    result = SimulationResult(out_dir=out, raw_files=[f.raw_path for f in frames],
                              truth_files=[f.truth_path for f in frames], calibration_files=cal_infos,
                              manifest_path=manifest, flare=flare, frames=frames, limb_fits=limb_fits,
                              radiometric=radiometric)
    _write_manifest(result, seed=seed, noise=noise, sizes=sizes)
    return result


def _master_header(kind: str, chan: str, version: int, valid_from: str, valid_to: str, desc: str,
                   n: int) -> fits.Header:
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"] = "ASO-S", "LST"
    h["CALKIND"] = (kind, "calibration kind")
    h["CHANNEL"] = (chan, "LST channel")
    h["FRMNAXIS"] = (n, "[pix] frame size it applies to")
    h["DETECTOR"] = (CHANNELS[chan].instrument, "LST instrument")
    h["CALVER"] = (version, "calibration version")
    h["VALIDFRM"] = (valid_from, "[UTC] valid from")
    h["VALIDTO"] = (valid_to, "[UTC] valid to")
    h["CALDESC"] = desc
    h["ORIGIN"] = ("lstdp simulator", "simulated calibration, not flight data")
    return h


def load_simulated_masters(out_dir: str | os.PathLike, channel: str, *, first_id: int = 1) -> dict[str, Any]:
    """The calibration masters :func:`simulate` wrote for ``channel``, as the calibration takes them.

    Parameters
    ----------
    out_dir : path-like
        The folder given to :func:`simulate` (masters in ``calibration/lst_<chan>_*.fits``).
    channel : str
        LST channel code (``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``).
    first_id : int
        Registry ids given to the masters in file-name order (``first_id``, ``first_id + 1``,
        ...), standing in for the database ids that ingest would give them.

    Returns
    -------
    dict of str to pipelines.calibration.flow.CalibrationInput
        By calibration kind (``dark``, ``flat``, ``radiometric``, ...): the mapping
        :func:`pipelines.calibration.flow.calibrate_frame` takes.

    Raises
    ------
    pipelines.errors.FitsReadError, pipelines.errors.DataError
        If a master cannot be read or does not describe itself.
    """
    from pipelines.calibration.flow import load_calibration_master

    cals: dict[str, Any] = {}
    for path in sorted((Path(out_dir) / "calibration").glob(f"lst_{channel.lower()}_*.fits")):
        cal = load_calibration_master(path)
        cal.id = first_id + len(cals)
        cals[cal.kind] = cal
    return cals


def _write_masters(out: Path, chan: str, spec: ChannelSpec, model: InstrumentModel, n: int,
                   flat: np.ndarray, bias: np.ndarray, dark_rate: np.ndarray, coef: float,
                   stray: StrayLightModel | None, valid_from: str, valid_to: str,
                   when: str) -> list[CalibrationFileInfo]:
    infos = []
    code = chan.lower()
    version = 1

    def emit(kind: str, hdus: list, desc: str, params: dict[str, Any]) -> None:
        path = out / "calibration" / f"lst_{code}_{kind}_{n}_v{version:02d}.fits"
        sha = _write(fits.HDUList(hdus), path, when)
        infos.append(CalibrationFileInfo(path=path, kind=kind, channel=chan, version=version, valid_from=valid_from,
                                         valid_to=valid_to, description=desc, sha256=sha, parameters=params))

    # dark: bias plane (primary) + dark-rate plane, so the dark scales with EXPTIME
    desc = f"{chan} master dark: bias [DN] (primary) and dark-current rate [DN/s] (DARKRATE), {n}x{n}"
    h = _master_header("dark", chan, version, valid_from, valid_to, desc, n)
    h["EXTNAME"] = "BIAS"
    h["BUNIT"] = "DN"
    h["BIASMEAN"] = (float(bias.mean()), "[DN] mean bias")
    h["DARKMEAN"] = (float(dark_rate.mean()), "[DN/s] mean dark-current rate")
    h["DARKUNIT"] = ("DN/s", "unit of the DARKRATE plane")
    dh = fits.Header()
    dh["BUNIT"] = "DN/s"
    emit("dark", [fits.PrimaryHDU(bias, header=h), fits.ImageHDU(dark_rate, header=dh, name="DARKRATE")], desc,
         {"BIASMEAN": float(bias.mean()), "DARKMEAN": float(dark_rate.mean())})

    desc = (f"{chan} flat field (mean 1) with CMOS laser-annealing stripes, {n}x{n}")
    h = _master_header("flat", chan, version, valid_from, valid_to, desc, n)
    h["EXTNAME"] = "FLAT"
    h["BUNIT"] = ""
    h["FLATMEAN"] = (float(flat.mean()), "mean of the flat")
    h["STRIPAMP"] = (model.stripe_amplitude, "RMS stripe amplitude")
    h["STRIPPER"] = (max(4.0, model.stripe_period_full * n / spec.naxis), "[pix] stripe period")
    emit("flat", [fits.PrimaryHDU(flat, header=h)], desc,
         {"FLATMEAN": float(flat.mean()), "STRIPAMP": model.stripe_amplitude})

    unit = spec.bunit
    desc = f"{chan} radiometric coefficient: {coef:.6g} {unit} per DN/s"
    h = _master_header("radiometric", chan, version, valid_from, valid_to, desc, n)
    h["RADCOEF"] = (coef, "radiometric coefficient, RADUNIT per DN/s")
    h["RADUNIT"] = (unit, "physical unit of the calibrated data")
    if unit == "MSB":
        h["MSBDEF"] = ("mean disk brightness in the channel passband", "MSB definition")
    emit("radiometric", [fits.PrimaryHDU(header=h)], desc, {"RADCOEF": coef, "RADUNIT": unit})

    if spec.is_coronagraph:
        desc = f"{chan} geometry: occulter {spec.fov_rsun_min} Rsun, field stop {spec.fov_rsun_max} Rsun"
        h = _master_header("mask_geometry", chan, version, valid_from, valid_to, desc, n)
        h["OCCRAD"] = (spec.fov_rsun_min, "[Rsun] occulter radius")
        h["FOVRAD"] = (spec.fov_rsun_max, "[Rsun] field-stop radius")
        params = {"OCCRAD": spec.fov_rsun_min, "FOVRAD": spec.fov_rsun_max}
    else:
        desc = f"{chan} geometry: useful field to {spec.fov_rsun_max} Rsun (no occulter)"
        h = _master_header("mask_geometry", chan, version, valid_from, valid_to, desc, n)
        h["FOVRAD"] = (spec.fov_rsun_max, "[Rsun] off-field-of-view radius")
        params = {"FOVRAD": spec.fov_rsun_max}
    emit("mask_geometry", [fits.PrimaryHDU(header=h)], desc, params)

    if stray is not None:
        b11, b25 = stray.brightness(1.1), stray.brightness(2.5)
        desc = (f"{chan} stray light: {stray.b_ref:.3g} MSB x (r/{stray.r_ref} Rsun)^-{stray.index:.4f} "
                f"({b11:.3g} MSB at 1.1 Rsun, {b25:.3g} at 2.5; LST on-orbit values)")
        h = _master_header("stray_light", chan, version, valid_from, valid_to, desc, n)
        h["STRAYB0"] = (stray.b_ref, "[MSB] stray light at STRAYR0")
        h["STRAYR0"] = (stray.r_ref, "[Rsun] reference radius")
        h["STRAYIDX"] = (stray.index, "power-law index (B ~ r^-STRAYIDX)")
        h["STRAYRMN"] = (stray.r_min, "[Rsun] r clipped below")
        h["STRAYRMX"] = (stray.r_max, "[Rsun] r clipped above")
        h["STRAYB11"] = (b11, "[MSB] at 1.1 Rsun")
        h["STRAYB25"] = (b25, "[MSB] at 2.5 Rsun")
        h["STRAYUNT"] = ("MSB", "unit")
        emit("stray_light", [fits.PrimaryHDU(header=h)], desc,
             {"STRAYB0": stray.b_ref, "STRAYR0": stray.r_ref, "STRAYIDX": stray.index})
    return infos


def _jsonable(v: Any) -> Any:
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
