"""Evolving full-disk scenes for detector validation: rotation, red noise, real flare shapes.

A series starts from a real full-disk frame of the sample data and changes the way the Sun
does between frames, so that a detector is tested against what it meets in flight and not
against a static image plus white noise:

* **differential rotation**: frame ``k`` shows the base scene rotated by the time since the
  base frame, with the synodic rate of Howard et al. (1990) from
  ``sunpy.sun.models.differential_rotation`` applied per latitude: each pixel's
  heliographic (Stonyhurst) longitude and latitude come from sunpy's coordinate frames,
  the source longitude is ``lon - drot(t, lat)``, and the scene is resampled there (cubic
  spline). The mapping is computed on a coarse grid (every ``coarse_px`` pixels) and
  interpolated; the observer is kept at the base frame's position (over a few hours the
  observer's B0 and distance change by < 0.1 deg and < 1e-4). Off the disk the scene stays
  put. Injected flares do not move (a flare lasts less than an hour; ~8 arcsec of rotation).
* **red-noise brightness fluctuations**: the scene is multiplied by ``1 + a(x) f_k(x)``:
  ``f_k`` a unit-variance field, spatially smooth (Gaussian white noise smoothed over
  ``scale_arcsec``) and an AR(1) process in time with e-folding time ``tau_s``
  (``f_k = phi f_{k-1} + sqrt(1 - phi^2) w_k``, ``phi = exp(-dt / tau)``): a power spectrum
  flat below ``1 / (2 pi tau)`` and falling as ``f^-2`` above, the red-noise form of UV/EUV
  intensity time series (power-law indices of 1.5-3 in AIA quiet Sun and active regions,
  Ireland et al. 2015, ApJ 798, 1). The amplitude ``a`` is ``quiet_rms`` on the quiet
  disk and ``active_rms`` in active regions (where the smoothed scene departs from its
  local quiet level by more than ``active_contrast``), rotating with the scene. The
  amplitudes are **assumptions** (:data:`SDI_RED_NOISE`, :data:`WST_RED_NOISE` say which);
  no SDI variability figure is public.
* **photon-like noise**: Gaussian with variance ``I / g`` (the Poisson variance of ``I g``
  photo-electrons), ``g`` set so that a pixel at the disk median has ``rel_noise_ref``
  relative noise at ``ref_scale_arcsec`` per pixel and the same number of photons per unit
  solar area at other plate scales.
* **flares** shaped like real ones: :func:`goes_flare_profiles` takes the GOES-15 XRS
  series of 2011-06-07 (``sample-data/real/xray-timeseries/go1520110607.fits``, the M2.5
  flare of NOAA 11226, 06:16-06:59 UT by its GOES report) and returns its XRS-B (1-8 A) and
  XRS-A (0.5-4 A) curves and the time derivative of XRS-B, background-subtracted and
  normalised to a peak of 1. The derivative is the impulsive-phase shape: white-light
  emission at 360 nm peaks with the SXR derivative and the HXR (Neupert effect; Jing et al.
  2024), and Lyman-alpha flare emission is impulsive too (Milligan et al. 2014, Sol. Phys.
  289, 1). Profiles are stretched in time by ``stretch`` to give durations of several
  minutes to an hour. A flare is a Gaussian stamp (``sigma_arcsec``) times the profile times
  an amplitude relative to the local scene (SDI) or to the local quiet-Sun level (WST).

The generator is a lazy :class:`collections.abc.Sequence` of frames (made on request, the
last few cached) so that a detector reads it like a list of arrays. Nothing of the truth
is passed to a detector: :attr:`EvolvingSeries.flares` is only for scoring.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from astropy.io import fits
from scipy import ndimage

__all__ = [
    "RedNoise",
    "SDI_RED_NOISE",
    "WST_RED_NOISE",
    "SDI_SLOW_EVOLUTION",
    "FlareProfile",
    "InjectedFlare",
    "EvolvingSeries",
    "goes_flare_profiles",
    "rotation_displacement",
    "sdi_lya_scene",
    "wst_continuum_scene",
]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample-data" / "real"
GOES_2011 = SAMPLE / "xray-timeseries" / "go1520110607.fits"
#: The GOES report row of the M2.5 flare in GOES_2011 (goes-xrs-report_2011.txt): start, peak, end.
GOES_2011_FLARE = ("2011-06-07T06:16:00", "2011-06-07T06:41:00", "2011-06-07T06:59:00")
SWAP = SAMPLE / "full-disk" / "swap_lv1_20120101_001607.fits"
MDI = SAMPLE / "full-disk" / "mdi.fd_Ic.20101015_230100_TAI.data.fits"


@dataclass(frozen=True)
class RedNoise:
    """Red-noise brightness fluctuations (see the module notes).

    Attributes
    ----------
    quiet_rms, active_rms : float
        Relative rms of the fluctuation on the quiet disk and in active regions.
    tau_s : float
        AR(1) e-folding time [s].
    scale_arcsec : float
        Spatial correlation length (sigma of the smoothing) [arcsec].
    active_contrast : float
        ``|I_smooth / I_quiet - 1|`` at which a place counts fully as active (linear ramp from 0).
    """

    quiet_rms: float
    active_rms: float
    tau_s: float
    scale_arcsec: float = 10.0
    active_contrast: float = 0.5


#: Lyman-alpha (SDI) assumption: 3 % rms on the quiet disk, 6 % in active regions, 10-arcsec
#: structures, 10-min coherence. Ours: chromospheric network and plage fluctuate by a few
#: per cent on minutes (Lyman-alpha is optically thick and formed higher than 160 nm, whose
#: network varies by ~5-10 % per pixel in TRACE data); stated as an assumption, not measured.
SDI_RED_NOISE = RedNoise(quiet_rms=0.03, active_rms=0.06, tau_s=600.0, scale_arcsec=10.0, active_contrast=0.5)
#: 360 nm (WST) assumption: 1.5 % rms on the quiet disk (the mean quiet-Sun fluctuation that
#: Jing et al. 2024 measured in WST 20 x 20 arcsec boxes, ~1.5 %, within +-2 %), 3 % in active
#: regions (penumbrae, faculae; ours), 5-min coherence (p modes and granulation lifetimes of
#: ~5-10 min), 3-arcsec structures (the WST resolution).
WST_RED_NOISE = RedNoise(quiet_rms=0.015, active_rms=0.03, tau_s=300.0, scale_arcsec=3.0, active_contrast=0.1)
#: Hour-scale evolution of the Lyman-alpha disk (SDI), the slow component of
#: :class:`EvolvingSeries` for hourly series (issue 27 item 7): 5 % rms on the quiet disk, 15 %
#: in active regions, 20-arcsec patches, 3-h coherence. Ours, an assumption: the power-law
#: spectra of UV/EUV intensity reach periods of hours (Ireland et al. 2015 fit 1e-4 to 1e-2 Hz)
#: and plage and loops brighten and fade by tens of per cent in EUV over hours (in Lyman-alpha,
#: formed lower, less); not measured, and the real EIT series is not used to set it.
SDI_SLOW_EVOLUTION = RedNoise(quiet_rms=0.05, active_rms=0.15, tau_s=3 * 3600.0, scale_arcsec=20.0,
                              active_contrast=0.5)


@dataclass(frozen=True)
class FlareProfile:
    """A normalised real flare light curve.

    Attributes
    ----------
    name : str
        ``xrsb``, ``xrsa`` or ``dxrsb`` (time derivative of XRS-B).
    t_s : numpy.ndarray
        Time from the GOES start [s], increasing.
    value : numpy.ndarray
        Background-subtracted flux divided by its peak (0..1).
    """

    name: str
    t_s: np.ndarray
    value: np.ndarray

    @property
    def peak_s(self) -> float:
        return float(self.t_s[int(np.argmax(self.value))])

    def __call__(self, t_s, stretch: float = 1.0) -> np.ndarray:
        """Profile at ``t_s`` seconds after the (stretched) GOES start; 0 outside."""
        return np.interp(np.asarray(t_s, dtype=float) / stretch, self.t_s, self.value, left=0.0, right=0.0)


@functools.lru_cache(maxsize=1)
def goes_flare_profiles() -> dict[str, FlareProfile]:
    """The M2.5 flare of 2011-06-07 from the real GOES-15 XRS series (see the module notes).

    Flux averaged in 30-s bins (XRS-B derivative: 60-s bins, then a 3-bin running mean),
    the pre-flare level (median of the 10 min before the GOES start) subtracted, divided by
    the peak, negative values set to 0; from 5 min before the start to 30 min after the end.

    Raises
    ------
    pipelines.timeseries.goes_xrs.XRSReadError
        If the sample file is missing or unreadable.
    """
    from astropy.time import Time

    from pipelines.timeseries.goes_xrs import read_goes_xrs

    s = read_goes_xrs(GOES_2011)
    t = np.asarray((s.time - Time(GOES_2011_FLARE[0], scale="utc")).to_value("s"), dtype=float)
    t_end = float((Time(GOES_2011_FLARE[2], scale="utc") - Time(GOES_2011_FLARE[0], scale="utc")).to_value("s"))
    out = {}
    for name, flux, width in (("xrsb", s.xrsb, 30.0), ("xrsa", s.xrsa, 30.0), ("dxrsb", s.xrsb, 60.0)):
        edges = np.arange(-900.0, t_end + 1800.0 + width, width)
        idx = np.digitize(t, edges) - 1
        ok = (idx >= 0) & (idx < edges.size - 1) & np.isfinite(flux)
        sums = np.bincount(idx[ok], weights=flux[ok], minlength=edges.size - 1)
        counts = np.bincount(idx[ok], minlength=edges.size - 1)
        with np.errstate(invalid="ignore"):
            binned = sums / counts
        centres = 0.5 * (edges[:-1] + edges[1:])
        good = np.isfinite(binned)
        binned = np.interp(centres, centres[good], binned[good])
        if name == "dxrsb":
            binned = np.gradient(binned, centres)
            binned = np.convolve(binned, np.ones(3) / 3.0, mode="same")
        pre = (centres < 0) & (centres >= -600.0)
        v = binned - np.median(binned[pre])
        keep = centres >= -300.0
        v = np.clip(v[keep] / np.max(v[keep]), 0.0, None)
        out[name] = FlareProfile(name, centres[keep], v)
    return out


# -- scenes ---------------------------------------------------------------------------------------


def _observer_header(naxis: int, scale: float, rsun_arcsec: float, date_obs: str, hgln: float, hglt: float,
                     dsun_m: float) -> fits.Header:
    h = fits.Header()
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"] = h["CUNIT2"] = "arcsec"
    h["CDELT1"] = h["CDELT2"] = scale
    h["CRPIX1"] = h["CRPIX2"] = (naxis + 1) / 2.0  # the Sun at the frame centre, (n - 1) / 2 0-based
    h["CRVAL1"] = h["CRVAL2"] = 0.0
    h["PC1_1"], h["PC1_2"], h["PC2_1"], h["PC2_2"] = 1.0, 0.0, 0.0, 1.0
    h["HGLN_OBS"], h["HGLT_OBS"], h["DSUN_OBS"] = hgln, hglt, dsun_m
    h["RSUN_ARC"] = rsun_arcsec
    h["DATE-OBS"] = date_obs
    return h


def _earth_header(naxis: int, scale: float, when) -> fits.Header:
    from astropy.time import Time
    from sunpy.coordinates import get_earth
    from sunpy.sun import constants

    t = Time(when)
    e = get_earth(t)
    dsun = float(e.radius.to_value("m"))
    rsun = math.degrees(math.asin(float(constants.radius.to_value("m")) / dsun)) * 3600.0
    return _observer_header(naxis, scale, rsun, t.utc.isot, float(e.lon.to_value("deg")), float(e.lat.to_value("deg")),
                            dsun)


def sdi_lya_scene(naxis: int, scale: float | None = None) -> tuple[np.ndarray, fits.Header]:
    """An SDI-like Lyman-alpha scene from the real SWAP 17.4 nm frame of 2012-01-01 00:16 UT.

    The project's Lyman-alpha proxy (:func:`pipelines.simulation.scenes._sdi_scene`:
    ``(EUV / EUV_quiet) ** 0.45`` on the disk, the limb and corona model off it) on a
    ``naxis``^2 grid; ``scale`` [arcsec/px] defaults to SDI's field, 4608 x 0.5 arcsec. Returns
    float32 radiance (arbitrary linear unit, disk mean ~1) and an L2-like header (WCS,
    observer of the SWAP frame's date seen from Earth)."""
    from pipelines.simulation.scenes import _sdi_reference, _sdi_scene
    from pipelines.simulation.sources import _sunpy_source

    scale = scale or 4608 * 0.5 / naxis
    src = _sunpy_source(SWAP)
    h = _earth_header(naxis, scale, src.date_obs)
    img = _sdi_scene(src, naxis, scale, float(h["RSUN_ARC"]), _sdi_reference(src), 1.0)
    return np.asarray(img, dtype=np.float32), h


def wst_continuum_scene(naxis: int, scale: float | None = None) -> tuple[np.ndarray, fits.Header]:
    """A 360 nm-like continuum scene from the real SOHO/MDI continuum of 2010-10-15 23:01 UT.

    :func:`pipelines.simulation.scenes._wst_scene` (MDI contrasts scaled to 360 nm, Neckel
    2005 limb darkening) on a ``naxis``^2 grid (default scale: 4608 x 0.5 arcsec / naxis).
    Returns float32 radiance [erg cm-2 s-1 sr-1] and an L2-like header."""
    from pipelines.simulation.scenes import _wst_scene
    from pipelines.simulation.sources import _sunpy_source

    scale = scale or 4608 * 0.5 / naxis
    src = _sunpy_source(MDI)
    h = _earth_header(naxis, scale, src.date_obs)
    img, _ = _wst_scene(src, naxis, scale, float(h["RSUN_ARC"]))
    return np.asarray(img, dtype=np.float32), h


def quiet_level(base: np.ndarray, scale: float, box_arcsec: float = 100.0) -> np.ndarray:
    """Local quiet-Sun level of a scene: median over ``box_arcsec`` boxes (on a 4x reduced
    copy when the box is large), a smooth map of the image's shape (limb darkening kept)."""
    k = max(1, int(round(box_arcsec / scale / 16)))
    small = base[: base.shape[0] // k * k, : base.shape[1] // k * k]
    small = small.reshape(small.shape[0] // k, k, small.shape[1] // k, k).mean(axis=(1, 3))
    size = max(3, int(round(box_arcsec / (scale * k))) | 1)
    q = ndimage.median_filter(small, size=size, mode="nearest")
    q = ndimage.zoom(q, (base.shape[0] / q.shape[0], base.shape[1] / q.shape[1]), order=1)
    return q[: base.shape[0], : base.shape[1]].astype(np.float32)


# -- rotation ---------------------------------------------------------------------------------------


def rotation_displacement(header: fits.Header, shape: tuple[int, int], duration_s: float,
                          coarse_px: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Where each pixel's content was ``duration_s`` seconds earlier (differential rotation).

    Returns ``(dy, dx)`` [pixel] of ``shape``: the source of pixel (y, x) is
    (y + dy, x + dx). Howard et al. (1990) synodic rates (sunpy
    ``differential_rotation(..., model='howard', frame_time='synodic')``); coordinates
    through sunpy's Helioprojective and HeliographicStonyhurst frames with the header's
    observer. Off the disk, and where the source is behind the limb, 0."""
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from astropy.wcs import WCS
    from sunpy.coordinates import HeliographicStonyhurst
    from sunpy.sun.models import differential_rotation

    ny, nx = shape
    ys = np.arange(0, ny + coarse_px, coarse_px, dtype=float)
    xs = np.arange(0, nx + coarse_px, coarse_px, dtype=float)
    gx, gy = np.meshgrid(xs, ys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = WCS(header, naxis=2)
        hpc = w.pixel_to_world(gx.ravel(), gy.ravel())
        hgs = hpc.transform_to(HeliographicStonyhurst(obstime=hpc.obstime))
        lat = hgs.lat
        dlon = differential_rotation(duration_s * u.s, lat, model="howard", frame_time="synodic")
        src = SkyCoord(hgs.lon - dlon, lat, frame=HeliographicStonyhurst(obstime=hpc.obstime),
                       radius=hgs.radius)
        src_hpc = src.transform_to(hpc.frame)
        # behind the limb: the source is not visible (Tz < 0 in heliocentric terms)
        sx, sy = w.world_to_pixel(src_hpc)
        from sunpy.coordinates import Heliocentric

        z = src.transform_to(Heliocentric(observer=hpc.frame.observer, obstime=hpc.obstime)).z.to_value("m")
    sx, sy = np.asarray(sx, float).reshape(gx.shape), np.asarray(sy, float).reshape(gx.shape)
    dx, dy = sx - gx, sy - gy
    bad = ~np.isfinite(dx) | ~np.isfinite(dy) | (np.asarray(z).reshape(gx.shape) < 0)
    dx[bad] = 0.0
    dy[bad] = 0.0
    coords = np.mgrid[0:ny, 0:nx].astype(np.float32) / np.float32(coarse_px)
    dyf = ndimage.map_coordinates(dy, coords, order=1, mode="nearest").astype(np.float32)
    dxf = ndimage.map_coordinates(dx, coords, order=1, mode="nearest").astype(np.float32)
    return dyf, dxf


# -- the series -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InjectedFlare:
    """Truth of one injected flare (for scoring only).

    Attributes
    ----------
    x, y : float
        Helioprojective position [arcsec].
    amplitude : float
        Peak excess at the centre relative to the reference (scene or quiet level).
    t_start : datetime.datetime
        Time of the (stretched) GOES start of the profile.
    profile : str
        Profile name (:func:`goes_flare_profiles`).
    stretch : float
        Time stretch of the profile.
    t_peak : datetime.datetime
        Time of the profile's peak.
    """

    x: float
    y: float
    amplitude: float
    t_start: dt.datetime
    profile: str
    stretch: float
    t_peak: dt.datetime


@dataclass
class EvolvingSeries(Sequence):
    """Lazy series of an evolving scene (module notes). Frame ``k`` is a float32 array.

    Parameters
    ----------
    base, header : numpy.ndarray, astropy.io.fits.Header
        The scene at ``times[0]`` and its WCS/observer header.
    times : list of datetime.datetime
        Aware UTC frame times.
    red : RedNoise
    rel_noise_ref, ref_scale_arcsec : float
        Photon noise: relative per-pixel noise at the disk median at ``ref_scale_arcsec``.
    seed : int
    rotate : bool
        Apply differential rotation.
    reference : {'scene', 'quiet'}
        What the flare amplitude is relative to: the local (rotated) scene, or the local
        quiet-Sun level (:func:`quiet_level`).
    slow : RedNoise, optional
        A second, slow fluctuation (hour-scale evolution of active regions and network, e.g.
        :data:`SDI_SLOW_EVOLUTION`), added to the first: the scene is multiplied by
        ``1 + a f_k + a_s g_k`` with ``g_k`` its own AR(1) field (random stream
        ``(seed, 3)``) and ``a_s`` its amplitude map (same active-region weighting). None
        (default): no slow component, frames as before it existed.
    """

    base: np.ndarray
    header: fits.Header
    times: list
    red: RedNoise
    rel_noise_ref: float = 0.02
    ref_scale_arcsec: float = 6.32
    seed: int = 0
    rotate: bool = True
    reference: str = "scene"
    coarse_px: int = 8
    cache: int = 6
    slow: RedNoise | None = None
    flares: list = field(default_factory=list)
    _stamps: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.scale = abs(float(self.header["CDELT1"]))
        self.base = np.asarray(self.base, dtype=np.float32)
        disk_vals = self.base[self.base > np.percentile(self.base, 60)]
        self._median = float(np.median(disk_vals))
        # photo-electrons per image unit, per pixel: same photons per solar area at any scale
        g_ref = 1.0 / (self.rel_noise_ref ** 2 * self._median)
        self._gain = g_ref * (self.scale / self.ref_scale_arcsec) ** 2
        self._quiet = quiet_level(self.base, self.scale)
        with np.errstate(invalid="ignore", divide="ignore"):
            smooth = ndimage.gaussian_filter(self.base, sigma=max(1.0, 10.0 / self.scale))
            c = np.abs(smooth / np.maximum(self._quiet, 1e-12 * self._median) - 1.0)
        act = np.clip(np.nan_to_num(c) / self.red.active_contrast, 0.0, 1.0)
        self._amp = (self.red.quiet_rms + (self.red.active_rms - self.red.quiet_rms) * act).astype(np.float32)
        self._amp[self.base < 0.05 * self._median] = 0.0
        if self.slow is not None:
            act_s = np.clip(np.nan_to_num(c) / self.slow.active_contrast, 0.0, 1.0)
            self._amp_slow = (self.slow.quiet_rms + (self.slow.active_rms - self.slow.quiet_rms) * act_s
                              ).astype(np.float32)
            self._amp_slow[self.base < 0.05 * self._median] = 0.0
        # red-noise fields on a coarse grid, made sequentially (AR(1) needs the past)
        step = max(1.0, self.red.scale_arcsec / self.scale)
        self._rn_step = step
        shape_c = (int(math.ceil(self.base.shape[0] / step)) + 1, int(math.ceil(self.base.shape[1] / step)) + 1)
        rng = np.random.default_rng((self.seed, 1))
        sec = np.array([(t - self.times[0]).total_seconds() for t in self.times])

        def unit_field() -> np.ndarray:
            f = ndimage.gaussian_filter(rng.standard_normal(shape_c), sigma=1.0, mode="wrap")
            return f / (1.0 / (2.0 * math.sqrt(math.pi)))  # unit variance after a sigma-1 Gaussian

        fields = [unit_field()]
        for k in range(1, len(self.times)):
            phi = math.exp(-(sec[k] - sec[k - 1]) / self.red.tau_s)
            fields.append(phi * fields[-1] + math.sqrt(1.0 - phi * phi) * unit_field())
        self._fields = [f.astype(np.float32) for f in fields]
        self._sec = sec
        if self.slow is not None:  # its own stream and grid, so the fast fields stay as they were
            step_s = max(1.0, self.slow.scale_arcsec / self.scale)
            self._slow_step = step_s
            shape_c = (int(math.ceil(self.base.shape[0] / step_s)) + 1,
                       int(math.ceil(self.base.shape[1] / step_s)) + 1)
            rng = np.random.default_rng((self.seed, 3))
            slow = [unit_field()]
            for k in range(1, len(self.times)):
                phi = math.exp(-(sec[k] - sec[k - 1]) / self.slow.tau_s)
                slow.append(phi * slow[-1] + math.sqrt(1.0 - phi * phi) * unit_field())
            self._slow_fields = [f.astype(np.float32) for f in slow]
        self._frame = functools.lru_cache(maxsize=self.cache)(self._make)

    # -- injections ----------------------------------------------------------------------
    def inject(self, x: float, y: float, amplitude: float, t_start: dt.datetime, profile: str = "xrsb",
               stretch: float = 1.0, sigma_arcsec: float = 15.0) -> InjectedFlare:
        """Add a flare at helioprojective (x, y) [arcsec] (see :class:`InjectedFlare`)."""
        from astropy.wcs import WCS

        prof = goes_flare_profiles()[profile]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            px, py = (float(v) for v in WCS(self.header, naxis=2).world_to_pixel_values(x / 3600.0, y / 3600.0))
        half = int(math.ceil(4.0 * sigma_arcsec / self.scale))
        y0, x0 = max(0, int(py) - half), max(0, int(px) - half)
        y1, x1 = min(self.base.shape[0], int(py) + half + 1), min(self.base.shape[1], int(px) + half + 1)
        yy, xx = np.mgrid[y0:y1, x0:x1]
        g = np.exp(-((xx - px) ** 2 + (yy - py) ** 2) / (2 * (sigma_arcsec / self.scale) ** 2))
        ref = self._quiet if self.reference == "quiet" else self.base
        stamp = (amplitude * ref[y0:y1, x0:x1] * g).astype(np.float32)
        t0 = (t_start - self.times[0]).total_seconds()
        self._stamps.append((y0, x0, stamp, prof, t0, stretch))
        truth = InjectedFlare(x, y, amplitude, t_start, profile, stretch,
                              t_start + dt.timedelta(seconds=prof.peak_s * stretch))
        self.flares.append(truth)
        self._frame.cache_clear()
        return truth

    # -- frames --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.times)

    @functools.cached_property
    def _rates(self):
        # displacement per second of rotation is linear in time to < 1e-3 over hours: the
        # mapping for 1 h, scaled to each frame's time (one sunpy evaluation per series)
        return rotation_displacement(self.header, self.base.shape, 3600.0, self.coarse_px)

    def _rotated(self, arr: np.ndarray, t_s: float) -> np.ndarray:
        if not self.rotate or t_s == 0:
            return arr
        dy, dx = self._rates
        f = np.float32(t_s / 3600.0)
        yy, xx = np.mgrid[0:arr.shape[0], 0:arr.shape[1]].astype(np.float32)
        return ndimage.map_coordinates(arr, [yy + f * dy, xx + f * dx], order=3, mode="nearest").astype(np.float32)

    def quiet(self, k: int) -> np.ndarray:
        """Frame ``k`` without flares and without photon noise."""
        t = float(self._sec[k])
        scene = self._rotated(self.base, t)
        amp = self._rotated(self._amp, t)
        fld = self._fields[k]
        coords = np.mgrid[0:scene.shape[0], 0:scene.shape[1]].astype(np.float32) / np.float32(self._rn_step)
        rn = ndimage.map_coordinates(fld, coords, order=1, mode="nearest").astype(np.float32)
        if self.slow is None:
            return scene * (1.0 + amp * rn)
        coords = np.mgrid[0:scene.shape[0], 0:scene.shape[1]].astype(np.float32) / np.float32(self._slow_step)
        sn = ndimage.map_coordinates(self._slow_fields[k], coords, order=1, mode="nearest").astype(np.float32)
        return scene * (1.0 + amp * rn + self._rotated(self._amp_slow, t) * sn)

    def _make(self, k: int) -> np.ndarray:
        frame = self.quiet(k)
        t = float(self._sec[k])
        for y0, x0, stamp, prof, t0, stretch in self._stamps:
            w = float(prof(t - t0, stretch))
            if w > 0:
                frame[y0:y0 + stamp.shape[0], x0:x0 + stamp.shape[1]] += w * stamp
        rng = np.random.default_rng((self.seed, 2, k))
        sigma = np.sqrt(np.maximum(frame, 0.0) / self._gain).astype(np.float32)
        frame += sigma * rng.standard_normal(frame.shape, dtype=np.float32)
        return frame

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self._frame(k)
