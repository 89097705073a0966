"""Limb prominence-eruption detection (``lst-prominence-eruption``).

A pure function, :func:`detect_prominence_eruptions`, finds prominences that rise above
the limb in a time-ordered sequence of Level-2 images, either SDI full-disk Lyman-alpha
frames (limb region 1.0-1.2 Rsun, the edge of SDI's field) or SCI-UV coronagraph frames
(1.1-2.5 Rsun), and reports for each eruption its start time, position angle, angular
size, pre-eruption and maximum heights, and rise speed.

Prominences are cool, dense structures that are bright above the limb in Lyman-alpha,
against a dark off-limb background (Labrosse et al. 2010 review their Lyman-alpha
properties); an eruption is the loss of equilibrium of such a structure, seen at the limb as
a bright feature that first sits still or rises slowly and then rises at tens to hundreds of
km/s (e.g. the height-time curves of Sahade et al. 2025, shipped in
``sample-data/real/events/prominence_eruptions_sahade2025``).

Method
------
1. **Working resolution and cosmic rays.** As in :mod:`pipelines.detect.cme`: block
   average to at most ``max_working_naxis``, replace isolated spikes by their 3x3 median.
2. **Polar unwrapping** around Sun centre over ``r_range_rsun`` (default 1.02-1.2 Rsun,
   clear of the limb's PSF wing), 1-degree PA bins, one working pixel in radius.
3. **Bright off-limb features.** In each frame a quiet-limb model is subtracted: at each
   radius a low-order Fourier series in PA fitted with bright outliers clipped
   (:func:`quiet_limb`; it follows the off-limb fall-off, the corona, and the dipole a
   small Sun-centre error leaves on the steep limb). The noise per radius is
   estimated from frame-to-frame differences (1.4826 x MAD / sqrt 2), so static structure
   does not inflate it. Pixels that are ``threshold_sigma`` above the noise *and*
   ``min_contrast`` above the quiet limb (relative) form features: connected
   regions (periodic in PA) of at least ``min_area_bins`` bins. A feature's top is, in
   the PA column that reaches highest, the outermost radius where the excess is half of
   that column's peak (interpolated between bins); its PA is the significance-weighted
   circular mean.
4. **Tracking.** Features are linked from frame to frame by PA (nearest within
   ``max_pa_jump_deg``, gaps of ``max_missing_frames`` frames allowed).
5. **Eruption test.** A track's top height ``h(t)`` is fitted with a two-segment
   ("hinge") model, constant ``h0`` before ``t_s`` and ``h0 + v (t - t_s)`` after, by
   least squares over a fine grid of ``t_s`` (the rise onset). The track is an eruption if
   the rise ``max(h) - h0`` is at least ``min_rise_rsun``, the rise speed ``v`` is at
   least ``min_speed_km_s`` and ``min_speed_snr`` times its standard error. Tops within
   ``edge_margin_rsun`` of the outer edge of the field end the track (the prominence has
   left the field).

Reported: ``start_time`` = ``t_s`` (between frames when the data say so; the first frame
of the track when it rises from the start, flagged ``rising_at_first_frame``), the PA and
angular size at the last pre-rise frame (or the first frame), ``h0`` and the largest
observed top height, the rise speed ``v`` [km/s] with its standard error.

References
----------
Labrosse N. et al. 2010, Space Sci. Rev. 151, 243 (physics of solar prominences I:
spectral diagnostics and non-LTE modelling; Lyman-alpha emission of prominences).
Sahade A. et al. 2025, ApJ, doi:10.3847/1538-4357/ad96ba (prominence-eruption
trajectories).
Robbrecht E. & Berghmans D. 2004, A&A 425, 1097; Olmedo O. et al. 2008, Sol. Phys. 248,
485 (polar unwrapping and tracking of off-limb features).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize

from pipelines.detect.cme import (
    _block_reduce,
    _circular_span,
    _label_periodic,
    _nanmedian,
    _ring_index,
    _smooth_nan,
    checked_sequence,
    despike,
    polar_unwrap,
)
from pipelines.errors import DataError
from pipelines.sun import RSUN_KM

__all__ = [
    "FRM_NAME",
    "FRM_VERSION",
    "ProminenceParams",
    "DetectedProminenceEruption",
    "detect_prominence_eruptions",
    "SDI_RANGE_RSUN",
    "SCI_RANGE_RSUN",
    "DETECTOR_NAME",
    "DETECTOR_VERSION",
    "hinge_fit",
    "quiet_limb",
]

FRM_NAME = "lst-prominence-eruption"
FRM_VERSION = "0.1.0"
#: Aliases matching :mod:`pipelines.detect.flares` (HEK ``frm_name``/``frm_version``).
DETECTOR_NAME, DETECTOR_VERSION = FRM_NAME, FRM_VERSION

#: Default analysis annulus for SDI full-disk frames [Rsun] (field edge at 1.2 Rsun).
SDI_RANGE_RSUN = (1.02, 1.2)
#: Default analysis annulus for SCI-UV frames [Rsun] (field 1.1-2.5 Rsun).
SCI_RANGE_RSUN = (1.15, 2.45)


@dataclass(frozen=True)
class ProminenceParams:
    """Tunable parameters of :func:`detect_prominence_eruptions` (recorded with every
    detection).

    Attributes
    ----------
    r_range_rsun : (float, float)
        Analysis annulus [Rsun]; :data:`SDI_RANGE_RSUN` or :data:`SCI_RANGE_RSUN`.
    pa_bin_deg : float
        PA bin [deg]; 360 / pa_bin_deg must be an integer.
    max_working_naxis : int
        Frames are block-averaged to at most this size [pixel].
    oversample : (int, int)
        Polar sub-samples per bin (PA, radius).
    despike_sigma : float
        Cosmic-ray rejection threshold [robust sigma]; 0 turns it off.
    smooth_pa_deg, smooth_r_rsun : float
        Gaussian smoothing of the polar frames [deg], [Rsun].
    threshold_sigma : float
        Significance of a feature pixel over the noise [sigma].
    min_contrast : float
        Relative excess over the quiet limb a feature pixel needs.
    min_area_bins : int
        Smallest feature [polar bins].
    max_pa_jump_deg : float
        Largest PA change between linked features [deg].
    max_missing_frames : int
        Frames a track may skip.
    min_track_points : int
        Height-time points needed.
    min_rise_rsun : float
        Smallest rise of the top above ``h0`` [Rsun].
    min_speed_km_s : float
        Slowest accepted rise speed [km/s].
    min_speed_snr : float
        Rise speed / its standard error needed.
    edge_margin_rsun : float
        Tops this close to the outer edge end the track [Rsun].
    limb_trend_order : int
        Highest PA harmonic of the quiet-limb model (:func:`quiet_limb`); 0 = azimuthal
        median.
    """

    r_range_rsun: tuple[float, float] = SDI_RANGE_RSUN
    pa_bin_deg: float = 1.0
    max_working_naxis: int = 1024
    oversample: tuple[int, int] = (3, 2)
    despike_sigma: float = 6.0
    smooth_pa_deg: float = 1.0
    smooth_r_rsun: float = 0.004
    threshold_sigma: float = 5.0
    min_contrast: float = 0.25
    min_area_bins: int = 10
    max_pa_jump_deg: float = 10.0
    max_missing_frames: int = 1
    min_track_points: int = 4
    min_rise_rsun: float = 0.03
    min_speed_km_s: float = 5.0
    min_speed_snr: float = 4.0
    edge_margin_rsun: float = 0.01
    limb_trend_order: int = 2

    @classmethod
    def sdi(cls, **changes: Any) -> ProminenceParams:
        """Defaults for SDI full-disk frames (limb region 1.02-1.2 Rsun)."""
        return dataclasses.replace(cls(), **changes)

    @classmethod
    def sci_uv(cls, **changes: Any) -> ProminenceParams:
        """Defaults for SCI-UV frames (1.15-2.45 Rsun): a higher contrast floor keeps
        streamers (~30 % above the quiet corona) out of the features."""
        base = cls(r_range_rsun=SCI_RANGE_RSUN, max_working_naxis=512, min_contrast=0.6,
                   min_area_bins=15, smooth_r_rsun=0.01)
        return dataclasses.replace(base, **changes)


@dataclass(frozen=True)
class DetectedProminenceEruption:
    """One prominence eruption found by :func:`detect_prominence_eruptions`.

    Attributes
    ----------
    start_time : datetime
        Onset of the rise (UTC), from the two-segment fit.
    rising_at_first_frame : bool
        True when the feature was already rising when first seen (``start_time`` is then
        that frame's time, an upper bound).
    first_seen, last_seen : datetime
        First and last frames of the track.
    pa_deg : float
        Position angle [deg CCW from north] before the rise.
    width_deg : float
        Angular size [deg] before the rise.
    h0_rsun : float
        Top height before the rise [Rsun].
    max_height_rsun : float
        Largest observed top height [Rsun] (a lower limit if ``left_fov``).
    left_fov : bool
        True when the top reached the outer edge of the analysed field.
    rise_speed_km_s, rise_speed_err_km_s : float
        Rise speed after the onset and its standard error [km/s].
    height_time : tuple of (datetime, float, float)
        ``(time, top height [Rsun], PA [deg])`` of every linked frame.
    peak_significance : float
        Largest significance in the track [sigma].
    params : dict
        The :class:`ProminenceParams` used.
    """

    start_time: dt.datetime
    rising_at_first_frame: bool
    first_seen: dt.datetime
    last_seen: dt.datetime
    pa_deg: float
    width_deg: float
    h0_rsun: float
    max_height_rsun: float
    left_fov: bool
    rise_speed_km_s: float
    rise_speed_err_km_s: float
    height_time: tuple[tuple[dt.datetime, float, float], ...]
    peak_significance: float
    params: dict[str, Any] = field(default_factory=dict)
    frm_name: str = FRM_NAME
    frm_version: str = FRM_VERSION

    def to_event_row(self, *, rsun_arcsec: float, channel: str = "SDI") -> dict[str, Any]:
        """Column values for a ``backend.models.Event`` row (``event_type='PR'``).

        ``hpc_x``/``hpc_y`` [arcsec] locate the top before the rise (east = -x);
        ``speed_km_s`` is the rise speed. ``source``/``source_key`` are left to the caller.
        """
        pa = math.radians(self.pa_deg)
        return {
            "event_type": "PR",
            "start_time": self.start_time,
            "peak_time": None,
            "end_time": self.last_seen,
            "channels": channel,
            "position_angle": self.pa_deg,
            "angular_width": self.width_deg,
            "speed_km_s": self.rise_speed_km_s,
            "hpc_x": -self.h0_rsun * rsun_arcsec * math.sin(pa),
            "hpc_y": self.h0_rsun * rsun_arcsec * math.cos(pa),
            "frm_name": self.frm_name,
            "frm_version": self.frm_version,
            "attributes": {
                "rise_speed_err_km_s": self.rise_speed_err_km_s,
                "h0_rsun": self.h0_rsun,
                "max_height_rsun": self.max_height_rsun,
                "left_fov": self.left_fov,
                "rising_at_first_frame": self.rising_at_first_frame,
                "first_seen": self.first_seen.isoformat(),
                "peak_significance": self.peak_significance,
                "height_time": [[t.isoformat(), h, p] for t, h, p in self.height_time],
                "params": self.params,
            },
        }


@dataclass
class _Feature:
    k: int  # frame index
    pa: float  # deg, intensity-weighted circular mean
    start: float  # span start edge [deg]
    width: float  # [deg]
    top: float  # [Rsun]
    zpeak: float


def _features(z: np.ndarray, rel: np.ndarray, excess: np.ndarray, p: ProminenceParams,
              r_cent: np.ndarray, pa_cent: np.ndarray, k: int) -> list[_Feature]:
    """Bright connected regions of one polar frame."""
    sel = (np.nan_to_num(z, nan=-np.inf) > p.threshold_sigma) & (np.nan_to_num(rel, nan=-np.inf) > p.min_contrast)
    lab, n = _label_periodic(sel)
    out = []
    if n == 0:
        return out
    area = np.bincount(lab.ravel(), minlength=n + 1)
    bin_deg = 360.0 / z.shape[0]
    for lbl in np.flatnonzero(area >= p.min_area_bins):
        if lbl == 0:
            continue
        m = lab == lbl
        w = np.where(m, np.clip(z, 0.0, None), 0.0).sum(axis=1)
        ang = np.radians(pa_cent)
        pa = math.degrees(math.atan2((w * np.sin(ang)).sum(), (w * np.cos(ang)).sum())) % 360.0
        pa = 0.0 if pa >= 360.0 - 1e-9 else pa
        start, _, width = _circular_span(m.any(axis=1), bin_deg)
        # top: in the column reaching highest, the outermost point where the excess is
        # half the column's peak (a half-maximum edge: it does not drift outwards as the
        # background and its noise fall with height)
        jmax = np.where(m, np.arange(m.shape[1])[None, :], -1).max(axis=1)
        q = int(np.argmax(jmax))
        col = np.where(np.isfinite(excess[q]), excess[q], -np.inf)
        # the outermost bump: walk inwards from the outer edge while the excess keeps
        # rising (within 1 sigma), so a brighter structure below does not set the level
        zq = np.where(np.isfinite(z[q]), z[q], -np.inf)
        j_pk = int(jmax[q])
        while j_pk > 0 and m[q, j_pk - 1]:
            if zq[j_pk - 1] >= zq[j_pk]:
                j_pk -= 1  # still rising inwards
            elif j_pk > 1 and m[q, j_pk - 2] and zq[j_pk - 1] > zq[j_pk] - 1.0 and zq[j_pk - 2] > zq[j_pk]:
                j_pk -= 2  # a dip within 1 sigma, and the rise resumes below it
            else:
                break
        half = 0.5 * float(col[j_pk:jmax[q] + 1].max())
        above = np.flatnonzero(m[q] & (col >= half) & (np.arange(col.size) >= j_pk))
        j = int(above.max())
        top = float(r_cent[j])
        if j + 1 < r_cent.size and np.isfinite(col[j + 1]) and col[j] > col[j + 1]:
            frac = float(np.clip((col[j] - half) / (col[j] - col[j + 1]), 0.0, 1.0))
            top += frac * float(r_cent[1] - r_cent[0])
        out.append(_Feature(k, pa, start, width, top, float(np.nanmax(np.where(m, z, np.nan)))))
    return out


def _dpa(a: float, b: float) -> float:
    return abs((a - b + 180.0) % 360.0 - 180.0)


def quiet_limb(polar: np.ndarray, pa_deg: np.ndarray, *, order: int = 2, n_iter: int = 3,
               clip: float = 3.0) -> np.ndarray:
    """The quiet limb of one polar frame: a robust low-order Fourier series in PA per radius.

    At each radius ``I(PA) ~ a0 + sum_m (a_m cos m PA + b_m sin m PA)``, ``m <= order``,
    fitted by least squares with bright outliers (prominences: residual > ``clip`` x
    1.4826 MAD) excluded over ``n_iter`` passes. Order 1 absorbs the dipole a Sun-centre
    error of a pixel or two makes on the steep off-limb fall-off, order 2 an ellipticity
    (e.g. a plate-scale error); order 0 is the azimuthal median.

    Parameters
    ----------
    polar : numpy.ndarray
        ``(n_pa, n_r)``, NaN where masked.
    pa_deg : numpy.ndarray
        ``(n_pa,)`` bin centres [deg].
    order : int
        Highest harmonic.
    n_iter, clip : int, float
        Clipping passes and threshold.

    Returns
    -------
    numpy.ndarray
        ``(n_pa, n_r)`` quiet-limb model (NaN at radii without data).
    """
    if order <= 0:
        return np.broadcast_to(_nanmedian(polar, axis=0)[None, :], polar.shape).copy()
    th = np.radians(pa_deg)
    cols = [np.ones_like(th)]
    for m in range(1, order + 1):
        cols += [np.cos(m * th), np.sin(m * th)]
    a = np.column_stack(cols)  # (n_pa, n_c)
    good = np.isfinite(polar)
    y = np.where(good, polar, 0.0)
    w = good.astype(np.float64)
    model = np.broadcast_to(_nanmedian(polar, axis=0)[None, :], polar.shape)
    for _ in range(n_iter + 1):
        ata = np.einsum("pi,pr,pj->rij", a, w, a)  # (n_r, n_c, n_c)
        aty = np.einsum("pi,pr->ri", a, w * y)
        ok = np.linalg.matrix_rank(ata) == a.shape[1]
        coef = np.zeros((polar.shape[1], a.shape[1]))
        coef[ok] = np.linalg.solve(ata[ok], aty[ok][..., None])[..., 0]
        fit = a @ coef.T
        model = np.where(ok[None, :], fit, model)
        res = np.where(good, polar - model, np.nan)
        mad = 1.4826 * _nanmedian(np.abs(res - _nanmedian(res, axis=0)[None, :]), axis=0)
        w = (good & (np.nan_to_num(res, nan=np.inf) <= clip * mad[None, :])).astype(np.float64)
    return np.where(np.isfinite(_nanmedian(polar, axis=0))[None, :], model, np.nan)


def hinge_fit(t: np.ndarray, h: np.ndarray) -> tuple[float, float, float, float, float]:
    """Two-segment least-squares fit ``h = h0 + v max(0, t - ts)``.

    ``ts`` is searched on a grid of 400 values from ``t[0]`` to ``t[-3]`` (at least two
    points after the onset), then refined between the neighbours of the best grid value
    (:func:`scipy.optimize.minimize_scalar`); ``h0`` and ``v`` are linear least squares at
    each ``ts``.

    Parameters
    ----------
    t : numpy.ndarray
        Times, increasing (e.g. seconds).
    h : numpy.ndarray
        Heights (e.g. Rsun), same length, >= 3 points.

    Returns
    -------
    tuple
        ``(ts, h0, v, sigma_v, rss)``: onset, height before it, slope after it (units of
        ``h`` per unit of ``t``), standard error of the slope at the chosen ``ts`` (3
        fitted parameters), residual sum of squares.
    """
    n = t.size
    lo, hi = float(t[0]), float(t[max(n - 3, 0)])

    def solve(ts: float):
        a = np.column_stack([np.ones(n), np.clip(t - ts, 0.0, None)])
        coef, _, rank, _ = np.linalg.lstsq(a, h, rcond=None)
        rss = float(((h - a @ coef) ** 2).sum()) if rank == 2 else float("inf")
        return rss, coef, a

    grid = np.linspace(lo, hi, 400)
    rss_grid = np.array([solve(ts)[0] for ts in grid])
    if not np.isfinite(rss_grid).any():
        return lo, float(h.mean()), 0.0, float("inf"), float("inf")
    i = int(np.argmin(rss_grid))
    ts = float(grid[i])
    if hi > lo:  # refine between the neighbouring grid points
        step = grid[1] - grid[0]
        res = optimize.minimize_scalar(lambda x: solve(x)[0], bounds=(max(lo, ts - step), min(hi, ts + step)),
                                       method="bounded", options={"xatol": 1e-6 * max(step, 1e-12)})
        if res.success and res.fun <= rss_grid[i]:
            ts = float(res.x)
    rss, coef, a = solve(ts)
    dof = max(n - 3, 1)  # h0, v and ts fitted
    cov = np.linalg.pinv(a.T @ a) * (rss / dof)
    return ts, float(coef[0]), float(coef[1]), math.sqrt(max(cov[1, 1], 0.0)), rss


def detect_prominence_eruptions(
    times,
    images,
    *,
    sun_center_px: tuple[float, float],
    plate_scale_arcsec: float,
    rsun_arcsec: float,
    mask: np.ndarray | None = None,
    params: ProminenceParams | None = None,
) -> list[DetectedProminenceEruption]:
    """Find prominences rising above the limb in a time-ordered image sequence.

    Parameters
    ----------
    times : sequence of datetime, astropy Time or ISO str
        ``nt`` observation times (UTC; naive = UTC), strictly increasing.
    images : array_like
        ``(nt, ny, nx)``, solar north up, east left: SDI full-disk frames (any linear
        brightness unit) or SCI-UV frames [MSB].
    sun_center_px : (float, float)
        ``(x, y)`` of Sun centre, 0-based pixels.
    plate_scale_arcsec : float
        [arcsec / pixel].
    rsun_arcsec : float
        Apparent solar radius [arcsec].
    mask : array_like of bool, optional
        ``(ny, nx)`` or ``(nt, ny, nx)``; True marks pixels to ignore (``DQ != 0``).
    params : ProminenceParams
        ``ProminenceParams.sdi()`` (the default) or ``ProminenceParams.sci_uv()``.

    Returns
    -------
    list of DetectedProminenceEruption
        Sorted by start time.

    Raises
    ------
    DataError
        Fewer than 3 frames, shapes that disagree, times not increasing, or an annulus
        outside the image.
    """
    p = params if params is not None else ProminenceParams.sdi()
    dts, arr, sec = checked_sequence(times, images, mask)
    nt = arr.shape[0]

    f = max(1, math.ceil(max(arr.shape[1:]) / p.max_working_naxis))
    work = _block_reduce(arr, f)
    cx, cy = sun_center_px
    wc = ((cx + 0.5) / f - 0.5, (cy + 0.5) / f - 0.5)
    rsun_px = rsun_arcsec / (plate_scale_arcsec * f)
    ny, nx = work.shape[1:]
    r_lo, r_hi = p.r_range_rsun
    reach = min(wc[0], wc[1], nx - 1 - wc[0], ny - 1 - wc[1])
    if reach < r_lo * rsun_px + 2:
        raise DataError("the analysis annulus lies outside the image; check the geometry")
    r_hi = min(r_hi, reach / rsun_px)  # a frame may not reach r_hi on all sides
    if p.despike_sigma > 0:
        ring = _ring_index(work.shape[1:], wc)
        work = np.stack([despike(w, sun_center_px=wc, k=p.despike_sigma, ring_index=ring) for w in work])

    dr = 1.0 / rsun_px
    n_r = max(6, int(round((r_hi - r_lo) / dr)))
    r_edges = np.linspace(r_lo, r_hi, n_r + 1)
    r_cent = 0.5 * (r_edges[:-1] + r_edges[1:])
    n_pa = int(round(360.0 / p.pa_bin_deg))
    pa_cent = (np.arange(n_pa) + 0.5) * p.pa_bin_deg
    sig = (p.smooth_pa_deg / p.pa_bin_deg, p.smooth_r_rsun / (r_edges[1] - r_edges[0]))
    polar = np.stack([
        _smooth_nan(polar_unwrap(work[k], sun_center_px=wc, rsun_px=rsun_px, r_edges_rsun=r_edges,
                                 n_pa=n_pa, oversample=p.oversample), sig)
        for k in range(nt)
    ])

    quiet = np.stack([quiet_limb(polar[k], pa_cent, order=p.limb_trend_order) for k in range(nt)])
    excess = polar - quiet
    dif = np.diff(polar, axis=0)
    dif = dif - _nanmedian(dif, axis=1)[:, None, :]
    noise = 1.4826 * _nanmedian(np.abs(dif), axis=(0, 1)) / math.sqrt(2.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = excess / noise[None, None, :]
        rel = excess / np.abs(quiet)

    feats = [_features(z[k], rel[k], excess[k], p, r_cent, pa_cent, k) for k in range(nt)]

    # link features into tracks by PA
    tracks: list[list[_Feature]] = []
    open_tracks: list[list[_Feature]] = []
    for k in range(nt):
        cand = sorted(feats[k], key=lambda ft: -ft.zpeak)
        claimed: set[int] = set()
        still_open = []
        for ft in cand:
            best, best_d = None, None
            for ti, tr in enumerate(open_tracks):
                if ti in claimed or k - tr[-1].k > p.max_missing_frames + 1:
                    continue
                d = _dpa(ft.pa, tr[-1].pa)
                if d <= p.max_pa_jump_deg and (best_d is None or d < best_d):
                    best, best_d = ti, d
            if best is None:
                new = [ft]
                tracks.append(new)
                still_open.append(new)
            else:
                claimed.add(best)
                open_tracks[best].append(ft)
        open_tracks = [tr for tr in open_tracks if k - tr[-1].k <= p.max_missing_frames] + still_open

    out = []
    edge = r_hi - p.edge_margin_rsun
    for tr in tracks:
        det = _eruption(tr, sec, dts, edge, p)
        if det is not None:
            out.append(det)
    out.sort(key=lambda e: e.start_time)
    return out


def _eruption(tr: list[_Feature], sec, dts, edge: float, p: ProminenceParams) -> DetectedProminenceEruption | None:
    """Hinge fit and acceptance of one track."""
    pts = []
    left = False
    for ft in tr:
        if ft.top >= edge:
            left = True
            break
        pts.append(ft)
    if len(pts) < p.min_track_points:
        return None
    t = np.array([sec[ft.k] for ft in pts])
    h = np.array([ft.top for ft in pts])
    ts, h0, v, ev, _ = hinge_fit(t, h)
    speed = v * RSUN_KM
    speed_err = ev * RSUN_KM
    hmax = float(max(ft.top for ft in tr))
    if speed < p.min_speed_km_s or not (speed >= p.min_speed_snr * speed_err):
        return None
    if max(h.max(), hmax) - h0 < p.min_rise_rsun:
        return None
    rising_first = ts <= t[0] + 1e-6
    pre = [ft for ft in pts if sec[ft.k] <= ts] or [pts[0]]
    ref = pre[-1]
    t_start = dts[0] + dt.timedelta(seconds=float(ts))
    return DetectedProminenceEruption(
        start_time=t_start,
        rising_at_first_frame=bool(rising_first),
        first_seen=dts[tr[0].k],
        last_seen=dts[tr[-1].k],
        pa_deg=float(ref.pa),
        width_deg=float(ref.width),
        h0_rsun=float(h0),
        max_height_rsun=hmax,
        left_fov=left,
        rise_speed_km_s=float(speed),
        rise_speed_err_km_s=float(speed_err),
        height_time=tuple((dts[ft.k], float(ft.top), float(ft.pa)) for ft in tr),
        peak_significance=float(max(ft.zpeak for ft in tr)),
        params=dataclasses.asdict(p),
    )
