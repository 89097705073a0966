"""Synthetic LST scenes with injected events, for tests and detector validation.

Independent of :func:`pipelines.simulation.simulate` (no instrument model, no files
written): in-memory image sequences whose event truth is known exactly.

No LST (SCI or SDI) image was found publicly (``sample-data/real/MANIFEST.md``) and no SCI
CME catalogue exists (``LST.md``), so the event detectors are validated on sequences built
here: a realistic static scene plus an injected event whose truth (time, position angle,
width, speed) is known exactly.

Scenes
------
:func:`coronal_background`
    An SCI-like coronagraph frame in MSB: the azimuthal structure of a real STEREO/COR1-A
    frame (shipped in ``sample-data/real/coronagraph``) times the Baumbach (1937) radial
    brightness model, zero inside the occulter (1.1 Rsun) and beyond the field stop
    (2.5 Rsun).
:func:`limb_background`
    An SDI-like full-disk Lyman-alpha frame (relative units, disk centre = 1): a textured
    disk, a steep off-limb fall-off, optional static (quiescent) prominences, blurred to the
    SDI resolution.

Events
------
:func:`inject_cme_sequence`
    A CME as a bright expanding loop (the projected rim of a self-similarly expanding
    bubble) whose leading edge moves radially at a given speed.
:func:`inject_prominence_eruption`
    A bright limb structure that sits still and then rises (constant speed, optional
    acceleration, or any height-time curve such as the real tie-points of Sahade et al.
    2025 in ``sample-data/real/events/prominence_eruptions_sahade2025``, read by
    :func:`sahade2025_height_time`).

Nuisances
---------
:func:`add_photon_noise` (Poisson + read noise) and :func:`perturb_sequence` (per-frame
gain jitter, pointing jitter, cosmic-ray hits): what a quiet real sequence also has.

Conventions (followed by the detectors too)
-------------------------------------------
* Images are ``(ny, nx)`` arrays indexed ``[y, x]``, solar north up (image +y), east to
  the left (image -x), as a Level-2 product seen from Earth.
* Position angle (PA) is measured counter-clockwise from solar north, in degrees in
  [0, 360): PA 0 = north, PA 90 = east limb, PA 180 = south, PA 270 = west limb (the CDAW
  and CACTus convention). The unit vector of PA is ``(x, y) = (-sin PA, cos PA)``.
* ``sun_center_px`` is ``(x, y)`` in 0-based pixel coordinates (FITS ``CRPIX - 1`` when
  ``CRVAL`` is 0); by default the array centre ``((nx - 1) / 2, (ny - 1) / 2)``.
* The solar radius used to convert speeds is the IAU 2015 nominal value
  ``R_sun = 695,700 km`` (Prsa et al. 2016, AJ 152, 41).

References
----------
Baumbach S. 1937, Astron. Nachr. 263, 121 (the K + F coronal brightness model).
Thompson W. T. et al. 2003, Proc. SPIE 4853, 1 (STEREO/SECCHI COR1).
Labrosse N. et al. 2010, Space Sci. Rev. 151, 243 (physics of solar prominences).
Prsa A. et al. 2016, AJ 152, 41 (IAU 2015 nominal solar radius).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from astropy.io import fits
from scipy import ndimage

from pipelines.sun import RSUN_KM
from pipelines.detect.cme import as_utc_datetimes
from pipelines.simulation.sources import COR1_FILE, SAMPLE_DIR

__all__ = [
    "DEFAULT_COR1_TEXTURE",
    "baumbach_brightness",
    "coronal_background",
    "limb_background",
    "add_photon_noise",
    "perturb_sequence",
    "InjectedCME",
    "InjectedProminence",
    "inject_cme_sequence",
    "inject_prominence_eruption",
    "make_times",
    "sahade2025_height_time",
]


#: The real STEREO/COR1-A frame whose azimuthal structure textures :func:`coronal_background`.
DEFAULT_COR1_TEXTURE = SAMPLE_DIR / COR1_FILE
_SAHADE = SAMPLE_DIR / "events" / "prominence_eruptions_sahade2025"


# --------------------------------------------------------------------------------------
# helpers


def make_times(start: dt.datetime | str, n: int, cadence_s: float) -> list[dt.datetime]:
    """``n`` aware UTC datetimes from ``start`` every ``cadence_s`` seconds."""
    t0 = _to_datetime(start)
    return [t0 + dt.timedelta(seconds=i * cadence_s) for i in range(n)]


def _to_datetime(t) -> dt.datetime:
    return as_utc_datetimes([t])[0]


def _seconds(times, ref) -> np.ndarray:
    r = _to_datetime(ref)
    return np.array([(t - r).total_seconds() for t in as_utc_datetimes(times)], dtype=float)


def _grid(shape: tuple[int, int], sun_center_px, plate_scale_arcsec: float, rsun_arcsec: float):
    """Heliocentric ``x, y`` [Rsun] of every pixel (x west, y north), and ``r``."""
    ny, nx = shape
    if sun_center_px is None:
        sun_center_px = ((nx - 1) / 2.0, (ny - 1) / 2.0)
    cx, cy = sun_center_px
    s = plate_scale_arcsec / rsun_arcsec
    x = (np.arange(nx) - cx) * s
    y = (np.arange(ny) - cy) * s
    xx, yy = np.meshgrid(x, y)
    return xx, yy, np.hypot(xx, yy)


def _pa_deg(xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """Position angle [deg, CCW from north] of image offsets (east = -x)."""
    return np.degrees(np.arctan2(-xx, yy)) % 360.0


def _dpa(a, b):
    """Signed smallest difference ``a - b`` of angles [deg], in (-180, 180]."""
    return (np.asarray(a) - np.asarray(b) + 180.0) % 360.0 - 180.0


def _as_stack(background: np.ndarray, n: int) -> np.ndarray:
    bg = np.asarray(background, dtype=np.float64)
    if bg.ndim == 2:
        return np.broadcast_to(bg, (n, *bg.shape)).copy()
    if bg.ndim == 3 and bg.shape[0] == n:
        return bg.copy()
    raise ValueError(f"background must be (ny, nx) or ({n}, ny, nx), got {bg.shape}")


# --------------------------------------------------------------------------------------
# scenes


def baumbach_brightness(r_rsun) -> np.ndarray:
    """Baumbach (1937) white-light coronal brightness [MSB] at heliocentric distance.

    ``I(r) = 1e-6 (0.0532 r^-2.5 + 1.425 r^-7 + 2.565 r^-17)`` in units of the mean solar
    brightness; the ``r^-2.5`` term stands for the F corona, the other two for the K corona
    near solar-cycle mean conditions.

    Parameters
    ----------
    r_rsun : array_like
        Heliocentric distance in the plane of the sky [Rsun], > 0.

    Returns
    -------
    numpy.ndarray
        Brightness [MSB], same shape as ``r_rsun``.

    References
    ----------
    Baumbach S. 1937, Astron. Nachr. 263, 121.
    """
    r = np.asarray(r_rsun, dtype=np.float64)
    return 1e-6 * (0.0532 * r**-2.5 + 1.425 * r**-7 + 2.565 * r**-17)


def _radial_median_profile(data: np.ndarray, rpix: np.ndarray) -> np.ndarray:
    """Median of ``data`` in 1-pixel rings, indexed by integer radius."""
    ri = np.floor(rpix).astype(np.int64)
    good = np.isfinite(data)
    order = np.argsort(ri[good], kind="stable")
    rs = ri[good][order]
    vs = data[good][order]
    prof = np.full(ri.max() + 1, np.nan)
    edges = np.flatnonzero(np.diff(rs)) + 1
    for seg_r, seg_v in zip(np.split(rs, edges), np.split(vs, edges)):
        if seg_r.size:
            prof[seg_r[0]] = np.median(seg_v)
    return prof


def coronal_background(
    naxis: int,
    plate_scale_arcsec: float,
    *,
    rsun_arcsec: float = 960.0,
    texture_path: str | Path | None = None,
    sun_center_px: tuple[float, float] | None = None,
    fov_rsun: tuple[float, float] = (1.1, 2.5),
    texture_annulus_rsun: tuple[float, float] = (1.9, 3.8),
    texture_gamma: float = 3.0,
    scale: float = 1.0,
) -> np.ndarray:
    """An SCI-like coronal frame in MSB: real COR1 structure times the Baumbach model.

    The real STEREO/COR1-A frame (raw DN, its own occulter near 1.4 Rsun) is divided by its
    azimuthal-median radial profile, leaving the relative azimuthal structure (streamers,
    instrumental ghosts). Radius is mapped linearly so that the SCI field ``fov_rsun``
    samples COR1's useful annulus ``texture_annulus_rsun``; the texture is then raised to
    ``texture_gamma`` (the raw frame is dominated by stray light, which dilutes the coronal
    contrast to ~10 % rms; the default exponent 3 restores a streamer contrast of ~30 %)
    and multiplied by :func:`baumbach_brightness`. The COR1 roll (CROTA ~7 deg) is ignored:
    the texture is a realistic pattern, not a reconstruction of 2007-05-03.

    Parameters
    ----------
    naxis : int
        Frame size [pixel] (square); 2048 for a full SCI frame.
    plate_scale_arcsec : float
        [arcsec / pixel]; 2.4 for a full SCI frame (``LST.md``).
    rsun_arcsec : float
        Apparent solar radius [arcsec].
    texture_path : path-like, optional
        A coronagraph FITS frame with ``CRPIX1/2``, ``CDELT1`` and ``RSUN`` (or
        ``RSUN_OBS``) keywords; default :data:`DEFAULT_COR1_TEXTURE`.
    sun_center_px : (float, float), optional
        ``(x, y)`` 0-based; default the array centre.
    fov_rsun : (float, float)
        Occulter and field-stop radii [Rsun]; pixels outside are 0.
    texture_annulus_rsun : (float, float)
        The annulus of the texture frame mapped onto ``fov_rsun`` [Rsun of that frame].
    texture_gamma : float
        Exponent applied to the relative texture (1 keeps the raw modulation).
    scale : float
        Multiplies the result (e.g. to mimic the Lyman-alpha channel's level).

    Returns
    -------
    numpy.ndarray
        ``(naxis, naxis)`` float64 brightness [MSB].
    """
    path = Path(texture_path) if texture_path is not None else DEFAULT_COR1_TEXTURE
    with fits.open(path, memmap=False) as hdul:
        hdu = next(h for h in hdul if h.header.get("NAXIS", 0) == 2)
        tex = np.asarray(hdu.data, dtype=np.float64)
        th = hdu.header
    tcx, tcy = th["CRPIX1"] - 1.0, th["CRPIX2"] - 1.0
    t_rsun_px = float(th.get("RSUN", th.get("RSUN_OBS", 960.0))) / float(th["CDELT1"])
    ty, tx = np.indices(tex.shape)
    trpix = np.hypot(tx - tcx, ty - tcy)
    prof = _radial_median_profile(tex, trpix)
    rel = tex / prof[np.floor(trpix).astype(np.int64)]

    xx, yy, r = _grid((naxis, naxis), sun_center_px, plate_scale_arcsec, rsun_arcsec)
    (f0, f1), (a0, a1) = fov_rsun, texture_annulus_rsun
    r_tex = a0 + (np.clip(r, f0, f1) - f0) * (a1 - a0) / (f1 - f0)
    ang = np.arctan2(yy, xx)
    sx = tcx + r_tex * t_rsun_px * np.cos(ang)
    sy = tcy + r_tex * t_rsun_px * np.sin(ang)
    t = ndimage.map_coordinates(rel, [sy, sx], order=1, mode="nearest")
    t = np.clip(np.nan_to_num(t, nan=1.0), 0.2, 5.0) ** texture_gamma
    img = scale * baumbach_brightness(np.maximum(r, 1.0)) * t
    img[(r < f0) | (r > f1)] = 0.0
    return img


def limb_background(
    naxis: int,
    plate_scale_arcsec: float,
    *,
    rsun_arcsec: float = 960.0,
    sun_center_px: tuple[float, float] | None = None,
    limb_scale_height_rsun: float = 0.012,
    corona_level: float = 2e-3,
    network_contrast: float = 0.25,
    network_scale_arcsec: float = 30.0,
    static_prominences: Sequence[tuple[float, float, float, float]] = (),
    resolution_arcsec: float = 9.5,
    seed: int = 0,
) -> np.ndarray:
    """An SDI-like full-disk Lyman-alpha frame, relative units (disk centre ~ 1).

    Disk: a log-normal random network (correlation length ``network_scale_arcsec``, rms
    contrast ``network_contrast``, a stand-in for the chromospheric network). Off limb:
    ``exp(-(r - 1) / H)`` from the limb level plus a faint corona
    ``corona_level * r**-6``. Static prominences, each ``(pa_deg, height_rsun, width_deg,
    brightness)``, are bright off-limb blobs from the limb to ``height_rsun``. The frame is
    convolved with a Gaussian of FWHM ``resolution_arcsec`` (SDI on-orbit ~9.5 arcsec,
    ``LST.md``).

    Parameters
    ----------
    naxis : int
        Frame size [pixel] (square).
    plate_scale_arcsec : float
        [arcsec / pixel].
    rsun_arcsec : float
        Apparent solar radius [arcsec].
    sun_center_px : (float, float), optional
        ``(x, y)`` 0-based; default the array centre.
    limb_scale_height_rsun : float
        e-folding height of the off-limb Lyman-alpha emission [Rsun] (a modelling choice).
    corona_level : float
        Coronal level just above the limb, relative to disk centre.
    network_contrast, network_scale_arcsec : float
        rms contrast and correlation length of the disk texture.
    static_prominences : sequence of (pa_deg, height_rsun, width_deg, brightness)
        Quiescent prominences (they never move).
    resolution_arcsec : float
        FWHM of the Gaussian PSF [arcsec]; 0 for none.
    seed : int
        Seed of the texture.

    Returns
    -------
    numpy.ndarray
        ``(naxis, naxis)`` float64, relative brightness.
    """
    rng = np.random.default_rng(seed)
    xx, yy, r = _grid((naxis, naxis), sun_center_px, plate_scale_arcsec, rsun_arcsec)
    sig = network_scale_arcsec / plate_scale_arcsec / 2.0
    noise = ndimage.gaussian_filter(rng.standard_normal((naxis, naxis)), sig, mode="wrap")
    noise /= noise.std() if noise.std() > 0 else 1.0
    disk = np.exp(network_contrast * noise - 0.5 * network_contrast**2)
    mu = np.sqrt(np.clip(1.0 - r**2, 0.0, 1.0))
    disk *= 0.9 + 0.1 * (1.0 - mu)  # mild limb brightening of the optically thick line
    limb_level = 1.0
    off = limb_level * np.exp(-(np.maximum(r, 1.0) - 1.0) / limb_scale_height_rsun)
    off += corona_level * np.maximum(r, 1.0) ** -6
    img = np.where(r <= 1.0, disk, off)
    pa = _pa_deg(xx, yy)
    for p_pa, p_h, p_w, p_b in static_prominences:
        img += _prominence_blob(r, pa, p_pa, 1.0, p_h, p_w, p_b)
    if resolution_arcsec > 0:
        img = ndimage.gaussian_filter(img, resolution_arcsec / 2.3548 / plate_scale_arcsec)
    return img


def add_photon_noise(
    images: np.ndarray,
    electrons_per_unit: float,
    *,
    read_noise_e: float = 0.0,
    rng: np.random.Generator | int | None = None,
) -> np.ndarray:
    """Poisson photon noise (and Gaussian read noise) on images in physical units.

    ``counts = Poisson(image * electrons_per_unit) + N(0, read_noise_e)``, returned in the
    image's units.

    Parameters
    ----------
    images : numpy.ndarray
        Any shape; non-negative values [image units, e.g. MSB].
    electrons_per_unit : float
        Detected photo-electrons per image unit [e- / unit].
    read_noise_e : float
        rms read noise [e-].
    rng : numpy.random.Generator or int, optional

    Returns
    -------
    numpy.ndarray
        Float64, same shape.
    """
    rng = np.random.default_rng(rng)
    lam = np.clip(np.asarray(images, dtype=np.float64), 0.0, None) * electrons_per_unit
    out = rng.poisson(lam).astype(np.float64)
    if read_noise_e > 0:
        out += rng.normal(0.0, read_noise_e, size=out.shape)
    return out / electrons_per_unit


def perturb_sequence(
    images: np.ndarray,
    *,
    brightness_jitter: float = 0.0,
    pointing_jitter_px: float = 0.0,
    cosmic_rays_per_frame: int = 0,
    cosmic_ray_level: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> np.ndarray:
    """Instrumental nuisances a quiet sequence really has, applied frame by frame.

    Parameters
    ----------
    images : numpy.ndarray
        ``(nt, ny, nx)``.
    brightness_jitter : float
        rms of a multiplicative per-frame gain error (exposure time, stray-light level).
    pointing_jitter_px : float
        rms of a random per-frame shift in x and y [pixel] (bilinear resampling).
    cosmic_rays_per_frame : int
        Cosmic-ray hits per frame (short random streaks, 1-4 pixels long).
    cosmic_ray_level : float, optional
        Brightness added by a hit [image units]; default 20 x the frame's 99th percentile.
    rng : numpy.random.Generator or int, optional

    Returns
    -------
    numpy.ndarray
        A perturbed copy, float64.
    """
    rng = np.random.default_rng(rng)
    out = np.array(images, dtype=np.float64, copy=True)
    nt, ny, nx = out.shape
    for i in range(nt):
        if pointing_jitter_px > 0:
            shift = rng.normal(0.0, pointing_jitter_px, size=2)
            out[i] = ndimage.shift(out[i], shift, order=1, mode="nearest")
        if brightness_jitter > 0:
            out[i] *= 1.0 + rng.normal(0.0, brightness_jitter)
        if cosmic_rays_per_frame > 0:
            level = cosmic_ray_level if cosmic_ray_level is not None else 20.0 * float(np.percentile(out[i], 99))
            for _ in range(cosmic_rays_per_frame):
                y, x = rng.integers(0, ny), rng.integers(0, nx)
                length = int(rng.integers(1, 5))
                dy, dx = rng.choice([-1, 0, 1], size=2)
                for s in range(length):
                    yy, xx = y + s * dy, x + s * dx
                    if 0 <= yy < ny and 0 <= xx < nx:
                        out[i, yy, xx] += level
    return out


# --------------------------------------------------------------------------------------
# CMEs


@dataclass(frozen=True)
class InjectedCME:
    """The truth of one injected CME.

    Attributes
    ----------
    pa_deg : float
        Central position angle [deg CCW from north].
    width_deg : float
        Projected angular width [deg].
    speed_km_s : float
        Plane-of-sky speed of the leading edge [km/s] (at ``t0``, if accelerated).
    acceleration_m_s2 : float
        [m/s^2].
    t0 : datetime
        Time the leading edge crosses ``r_fov_min`` (the occulter edge).
    first_appearance : datetime or None
        First frame time at or after ``t0`` (the first frame with the front in the field);
        None when the front never enters the field during the sequence.
    heights_rsun : tuple of float
        Leading-edge height at each frame time [Rsun] (may be < 1.1 or > 2.5).
    """

    pa_deg: float
    width_deg: float
    speed_km_s: float
    acceleration_m_s2: float
    t0: dt.datetime
    first_appearance: dt.datetime | None
    heights_rsun: tuple[float, ...]


def _kinematic_heights(sec: np.ndarray, h0: float, speed_km_s: float, acceleration_m_s2: float) -> np.ndarray:
    """``h0 + v t + a t^2 / 2`` [Rsun] at ``sec`` [s]; ``v`` [km/s] and ``a`` [m/s^2] via :data:`RSUN_KM`."""
    v = speed_km_s / RSUN_KM  # Rsun / s
    a = acceleration_m_s2 / 1e3 / RSUN_KM  # Rsun / s^2
    return h0 + v * sec + 0.5 * a * sec**2


def _cme_enhancement(xx: np.ndarray, yy: np.ndarray, r: np.ndarray, h: float, *, pa_deg: float, width_deg: float,
                     contrast: float, interior_fill: float, front_thickness_rsun: float) -> np.ndarray:
    """Fractional brightness enhancement of a CME whose leading edge is at ``h`` [Rsun].

    The projected bubble (see :func:`inject_cme_sequence`): a circle of radius ``rho``
    centred ``d`` from Sun centre along ``pa_deg``, ``h = d + rho``, ``rho / d =
    sin(width / 2)``; a Gaussian rim plus ``interior_fill`` times a soft-edged interior,
    zero on the disk. ``xx``, ``yy``, ``r``: heliocentric pixel coordinates [Rsun].
    """
    ax, ay = -np.sin(np.radians(pa_deg)), np.cos(np.radians(pa_deg))
    s = np.sin(np.radians(width_deg / 2.0))
    sigma = front_thickness_rsun / 2.0
    d = h / (1.0 + s)
    rho = h * s / (1.0 + s)
    q = np.hypot(xx - d * ax, yy - d * ay)
    rim = np.exp(-0.5 * ((q - rho) / sigma) ** 2)
    interior = 0.5 * (1.0 - np.tanh((q - rho) / sigma))
    enh = contrast * (rim + interior_fill * interior)
    enh[r < 1.0] = 0.0
    return enh


def _first_appearance(times: Sequence[dt.datetime], sec: np.ndarray, heights: np.ndarray,
                      r_fov_min: float) -> dt.datetime | None:
    """The first frame time at or after ``t0`` whose leading edge is in the field, or None."""
    for t, s, h in zip(times, sec, heights):
        if s >= 0 and h >= r_fov_min:
            return t
    return None


def inject_cme_sequence(
    background: np.ndarray,
    times,
    *,
    pa_deg: float,
    width_deg: float,
    speed_km_s: float,
    t0,
    plate_scale_arcsec: float,
    rsun_arcsec: float = 960.0,
    sun_center_px: tuple[float, float] | None = None,
    acceleration_m_s2: float = 0.0,
    r_fov_min: float = 1.1,
    contrast: float = 0.8,
    interior_fill: float = 0.25,
    front_thickness_rsun: float = 0.06,
    electrons_per_unit: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> tuple[np.ndarray, InjectedCME]:
    """Inject a CME, a bright expanding loop, into a static or evolving background.

    Geometry: the projected rim of a bubble (circle of radius ``rho`` centred at distance
    ``d`` from Sun centre along ``pa_deg``) expanding self-similarly: ``rho / d =
    sin(width / 2)`` so the tangent lines from Sun centre span ``width_deg``, and the
    leading edge ``h = d + rho`` moves radially as ``h(t) = r_fov_min + v (t - t0) +
    a (t - t0)^2 / 2`` (``v`` in Rsun/s from ``speed_km_s / RSUN_KM``). Brightness: the
    background is multiplied by ``1 + contrast * (rim + interior_fill * interior)``, a
    density enhancement of the local corona; the rim is Gaussian in distance from the
    circle with sigma ``front_thickness_rsun / 2``. Pixels outside the original field
    (background 0) stay 0.

    Parameters
    ----------
    background : numpy.ndarray
        ``(ny, nx)`` static scene, or ``(nt, ny, nx)`` sequence (to add a second CME to a
        sequence that already holds one) [MSB].
    times : sequence of datetime, astropy Time or ISO str
        ``nt`` frame times (UTC).
    pa_deg : float
        Central position angle [deg CCW from north; 90 = east limb].
    width_deg : float
        Angular width [deg], 0 < width < 170.
    speed_km_s : float
        Leading-edge speed [km/s], > 0.
    t0 : datetime, Time or str
        Time the leading edge crosses ``r_fov_min``.
    plate_scale_arcsec, rsun_arcsec : float
        [arcsec / pixel], [arcsec].
    sun_center_px : (float, float), optional
        ``(x, y)`` 0-based; default the array centre.
    acceleration_m_s2 : float
        Constant acceleration [m/s^2].
    r_fov_min : float
        Occulter radius [Rsun].
    contrast, interior_fill, front_thickness_rsun : float
        Brightness enhancement of the rim, relative fill of the interior, rim thickness.
    electrons_per_unit : float, optional
        If given, :func:`add_photon_noise` is applied with this gain [e- / MSB].
    rng : numpy.random.Generator or int, optional

    Returns
    -------
    images : numpy.ndarray
        ``(nt, ny, nx)`` float64 [MSB].
    truth : InjectedCME
    """
    if not 0.0 < width_deg < 170.0:
        raise ValueError("width_deg must be in (0, 170)")
    if speed_km_s <= 0:
        raise ValueError("speed_km_s must be > 0")
    n = len(times)
    stack = _as_stack(background, n)
    sec = _seconds(times, t0)
    heights = _kinematic_heights(sec, r_fov_min, speed_km_s, acceleration_m_s2)
    xx, yy, r = _grid(stack.shape[1:], sun_center_px, plate_scale_arcsec, rsun_arcsec)
    for i, h in enumerate(heights):
        if h <= 0.5:
            continue
        stack[i] *= 1.0 + _cme_enhancement(xx, yy, r, h, pa_deg=pa_deg, width_deg=width_deg, contrast=contrast,
                                           interior_fill=interior_fill, front_thickness_rsun=front_thickness_rsun)
    if electrons_per_unit is not None:
        stack = add_photon_noise(stack, electrons_per_unit, rng=rng)
    first = _first_appearance(as_utc_datetimes(times), sec, heights, r_fov_min)
    truth = InjectedCME(
        pa_deg=float(pa_deg) % 360.0,
        width_deg=float(width_deg),
        speed_km_s=float(speed_km_s),
        acceleration_m_s2=float(acceleration_m_s2),
        t0=_to_datetime(t0),
        first_appearance=first,
        heights_rsun=tuple(float(h) for h in heights),
    )
    return stack, truth


# --------------------------------------------------------------------------------------
# prominences


def _prominence_blob(r, pa, pa0, r_bot, r_top, width_deg, brightness):
    """A bright off-limb structure: Gaussian in PA (FWHM ``width_deg``), flat-topped in
    radius between ``r_bot`` and ``r_top`` with soft edges, zero on the disk."""
    sig_pa = width_deg / 2.3548
    ang = np.exp(-0.5 * (_dpa(pa, pa0) / sig_pa) ** 2)
    edge = 0.004 + 0.03 * (r_top - r_bot)
    rad = 0.5 * (np.tanh((r - r_bot) / edge) - np.tanh((r - r_top) / edge))
    out = brightness * ang * np.clip(rad, 0.0, None)
    out[r < 1.0] = 0.0
    return out


@dataclass(frozen=True)
class InjectedProminence:
    """The truth of one injected prominence eruption.

    Attributes
    ----------
    pa_deg : float
        Position angle of the prominence [deg CCW from north].
    width_deg : float
        FWHM angular size [deg].
    t_start : datetime
        Time the top starts to rise.
    h0_rsun : float
        Top height before the rise [Rsun].
    speed_km_s : float
        Rise speed just after ``t_start`` [km/s] (NaN when a height-time curve was given).
    heights_rsun : tuple of float
        Top height at each frame time [Rsun].
    """

    pa_deg: float
    width_deg: float
    t_start: dt.datetime
    h0_rsun: float
    speed_km_s: float
    heights_rsun: tuple[float, ...] = field(default=())


def _prominence_heights(sec: np.ndarray, h0_rsun: float, height_time: Callable[[np.ndarray], np.ndarray] | None,
                        speed_km_s: float, acceleration_m_s2: float) -> tuple[np.ndarray, float]:
    """Top height [Rsun] at ``sec`` [s from the start of the rise], and the truth's speed.

    ``h0_rsun`` before the rise; after, ``height_time(t)`` if given (the speed is then NaN),
    else constant-acceleration kinematics (:func:`_kinematic_heights`).
    """
    rising = np.clip(sec, 0.0, None)
    if height_time is not None:
        return np.where(sec > 0, np.asarray(height_time(rising), dtype=float), h0_rsun), float("nan")
    return _kinematic_heights(rising, h0_rsun, speed_km_s, acceleration_m_s2), float(speed_km_s)


def _erupting_prominence(r: np.ndarray, pa: np.ndarray, h: float, *, pa_deg: float, h0_rsun: float,
                         width_deg: float, brightness: float, dimming_exponent: float,
                         psf_sigma_px: float) -> np.ndarray:
    """The prominence with its top at ``h`` [Rsun] (see :func:`inject_prominence_eruption`).

    The foot lifts off the limb to half the rise, the brightness falls as
    ``((h0 - 1) / (h - 1)) ** dimming_exponent``; blurred by a Gaussian of
    ``psf_sigma_px`` [pixel] when > 0. ``r`` [Rsun], ``pa`` [deg]: per pixel.
    """
    r_bot = 1.0 + 0.5 * max(h - h0_rsun, 0.0)
    dim = ((h0_rsun - 1.0) / max(h - 1.0, h0_rsun - 1.0)) ** dimming_exponent
    blob = _prominence_blob(r, pa, pa_deg, r_bot, h, width_deg, brightness * dim)
    if psf_sigma_px > 0:
        blob = ndimage.gaussian_filter(blob, psf_sigma_px)
    return blob


def inject_prominence_eruption(
    background: np.ndarray,
    times,
    *,
    pa_deg: float,
    t_start,
    plate_scale_arcsec: float,
    rsun_arcsec: float = 960.0,
    sun_center_px: tuple[float, float] | None = None,
    speed_km_s: float = 100.0,
    acceleration_m_s2: float = 0.0,
    height_time: Callable[[np.ndarray], np.ndarray] | None = None,
    h0_rsun: float = 1.06,
    width_deg: float = 10.0,
    brightness: float | None = None,
    contrast: float = 4.0,
    dimming_exponent: float = 0.5,
    resolution_arcsec: float = 0.0,
    electrons_per_unit: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> tuple[np.ndarray, InjectedProminence]:
    """Inject a limb prominence that sits still and then erupts (rises radially).

    The prominence is a bright structure at ``pa_deg`` (Gaussian in PA with FWHM
    ``width_deg``) from its foot to its top ``h``. Before ``t_start`` the top is at
    ``h0_rsun``; after, ``h = h0 + v (t - t_start) + a (t - t_start)^2 / 2``, or
    ``h = height_time(t - t_start)`` if a callable is given (seconds -> Rsun; e.g.
    :func:`sahade2025_height_time`). While rising, the foot lifts off the limb (to half the
    rise) and the brightness falls as ``((h0 - 1) / (h - 1)) ** dimming_exponent`` (the
    material spreads over a larger volume). Prominences are bright in Lyman-alpha above the
    dark off-limb corona (Labrosse et al. 2010); the default brightness is ``contrast``
    times the azimuthal median of the background at ``h0`` (a modelling choice).

    Parameters
    ----------
    background : numpy.ndarray
        ``(ny, nx)`` or ``(nt, ny, nx)`` scene (SDI limb or SCI-UV corona).
    times : sequence of datetime, astropy Time or ISO str
        ``nt`` frame times (UTC).
    pa_deg : float
        [deg CCW from north].
    t_start : datetime, Time or str
        Start of the rise.
    plate_scale_arcsec, rsun_arcsec : float
        [arcsec / pixel], [arcsec].
    sun_center_px : (float, float), optional
        ``(x, y)`` 0-based; default the array centre.
    speed_km_s, acceleration_m_s2 : float
        Rise kinematics [km/s], [m/s^2]; ignored when ``height_time`` is given.
    height_time : callable, optional
        Top height [Rsun] as a function of seconds since ``t_start`` (used for t >= 0).
    h0_rsun : float
        Top height before the rise [Rsun].
    width_deg : float
        FWHM angular size [deg].
    brightness : float, optional
        Peak brightness [image units]; default ``contrast`` x the background at ``h0``.
    contrast, dimming_exponent : float
        See above.
    resolution_arcsec : float
        FWHM of a Gaussian PSF applied to the injected structure only [arcsec]; 0 for none.
    electrons_per_unit : float, optional
        If given, :func:`add_photon_noise` is applied with this gain [e- / unit].
    rng : numpy.random.Generator or int, optional

    Returns
    -------
    images : numpy.ndarray
        ``(nt, ny, nx)`` float64.
    truth : InjectedProminence
    """
    n = len(times)
    stack = _as_stack(background, n)
    sec = _seconds(times, t_start)
    xx, yy, r = _grid(stack.shape[1:], sun_center_px, plate_scale_arcsec, rsun_arcsec)
    pa = _pa_deg(xx, yy)
    if brightness is None:
        ring = np.abs(r - h0_rsun) < max(2.0 * plate_scale_arcsec / rsun_arcsec, 0.003)
        brightness = contrast * float(np.median(stack[0][ring]))
    heights, v_truth = _prominence_heights(sec, h0_rsun, height_time, speed_km_s, acceleration_m_s2)
    psf = resolution_arcsec / 2.3548 / plate_scale_arcsec if resolution_arcsec > 0 else 0.0
    for i, h in enumerate(heights):
        stack[i] += _erupting_prominence(r, pa, h, pa_deg=pa_deg, h0_rsun=h0_rsun, width_deg=width_deg,
                                         brightness=brightness, dimming_exponent=dimming_exponent, psf_sigma_px=psf)
    if electrons_per_unit is not None:
        stack = add_photon_noise(stack, electrons_per_unit, rng=rng)
    truth = InjectedProminence(
        pa_deg=float(pa_deg) % 360.0,
        width_deg=float(width_deg),
        t_start=_to_datetime(t_start),
        h0_rsun=float(h0_rsun),
        speed_km_s=v_truth,
        heights_rsun=tuple(float(h) for h in heights),
    )
    return stack, truth


def sahade2025_height_time(event: str = "20101216_scc2_304") -> tuple[np.ndarray, np.ndarray]:
    """A real prominence-eruption height-time curve: the top of the 3-D tie-points.

    Reads ``<event>.csv`` from ``sample-data/real/events/prominence_eruptions_sahade2025``
    (STEREO/EUVI 304 tie-point reconstructions of Sahade et al. 2025, ApJ,
    doi:10.3847/1538-4357/ad96ba; CC-BY-4.0) and returns, per observation time, the
    largest heliocentric distance ``R`` of the tie-points. ``R`` is a 3-D distance: it is
    the height a limb observer would see if the prominence erupted in the plane of the sky.

    Returns
    -------
    hours : numpy.ndarray
        Observation times [hours of the day, UT].
    r_top : numpy.ndarray
        Top height [Rsun].
    """
    import csv

    path = _SAHADE / f"{event}.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    t = np.array([float(row["T"]) for row in rows])
    rr = np.array([float(row["R"]) for row in rows])
    hours = np.unique(t)
    return hours, np.array([rr[t == h].max() for h in hours])
