"""CME detection on Level-2 SCI coronagraph sequences (``lst-sci-cme``).

A pure function, :func:`detect_cmes`, takes a time-ordered sequence of L2 SCI images
(solar north up, Sun centred, brightness in MSB) and returns one :class:`DetectedCME` per
coronal mass ejection it finds, with what users of the CDAW and CACTus catalogues expect
of a CME row: first appearance in the field, central position angle, angular width,
linear speed (with its fit uncertainty) and the height-time points.

Method
------
The steps follow the running-difference + polar-unwrap design of SEEDS (Olmedo et al.
2008) and the height-time view of CACTus (Robbrecht & Berghmans 2004), simplified to the
SCI field of view (1.1-2.5 Rsun):

1. **Working resolution.** Frames larger than ``params.max_working_naxis`` are
   block-averaged (masked pixels excluded), which both speeds up and denoises; isolated
   bright pixels (cosmic-ray hits) are then replaced by their 3x3 median (:func:`despike`).
2. **Polar unwrapping.** Each frame is resampled onto a (position angle, radius) grid
   from ``r_min_rsun`` to ``r_max_rsun`` with :func:`scipy.ndimage.map_coordinates`
   (bilinear, ``oversample`` sub-samples per bin averaged); masked pixels (DQ, NaN) make
   their bins NaN.
3. **Running difference, relative.** ``D_k = (P_k - P_{k-1}) / B`` with ``B`` the
   per-bin temporal median of the sequence (the static corona), for consecutive frames no
   more than ``max_gap_s`` apart. The azimuthal median of ``D_k`` at each radius is
   subtracted (removes exposure and global brightness jitter).
4. **Significance.** ``D_k`` is smoothed (Gaussian, NaN-aware, periodic in PA) and
   divided by a robust noise level per radius (1.4826 x MAD over PA and frames), giving
   ``Z_k(PA, r)``.
5. **Thresholding in the polar frame.** Hysteresis: connected regions above
   ``threshold_low`` that hold a pixel above ``threshold_high`` and cover at least
   ``min_area_bins`` bins (PA is periodic: regions across PA 0/360 are joined).
6. **Leading edge per PA.** In each frame and PA bin the outermost radius of a kept region
   is the leading-edge height ``h_k(PA)``.
7. **Grouping.** The (time, PA) cells with a leading edge are grouped into connected
   events (PA gaps up to ``pa_gap_deg`` bridged, periodic in PA, consecutive frames
   joined).
8. **Kinematics.** Per frame, the event's leading edge is the largest ``h_k(PA)`` after a
   3-bin median along PA (the apex); points within ``edge_margin_rsun`` of the outer
   field edge are dropped (the front has left). A straight line ``h = h0 + v t`` is fitted
   by least squares (one pass of outlier rejection at >= 4 points); its slope, converted
   with ``R_sun = 695,700 km``, is the linear speed, with the standard error of the slope
   as uncertainty. A second-order fit gives the acceleration when there are >= 4 points.
   The median over PAs of per-PA linear speeds is also recorded (as CACTus reports).
9. **Acceptance.** An event needs ``min_track_points`` height-time points, a rise of at
   least ``min_rise_rsun``, a speed >= ``min_speed_km_s`` and, with >= 3 points, a speed at
   least ``min_speed_snr`` times its uncertainty. An event whose central PA lies inside
   the span of a more significant one and that overlaps it in time (or follows it within
   ``fragment_window_s`` while slower) is a fragment of it (a flank, trailing material)
   and is dropped.

Reported quantities (CDAW definitions, Yashiro et al. 2004): *first appearance* is the
time of the first frame in which the event's front exceeds the threshold inside the field;
*central PA* is the mid-point of the event's angular span, *angular width* that span
(a PA bin counts when it is active in at least two frames, or in one if the event has a
single frame); the *linear speed* is that of the fastest part (the apex).

Conventions: images are ``(ny, nx)``, north up (+y), east left (-x); PA in degrees
counter-clockwise from solar north (PA 90 = east limb); ``sun_center_px`` is ``(x, y)``
0-based (FITS ``CRPIX - 1`` when ``CRVAL`` is 0).

Running on L2 products: see :func:`geometry_from_header`, which turns an L2 SCI header
into the geometry keywords of :func:`detect_cmes`, and the module's README lines in the
docstring of :func:`detect_cmes`.

References
----------
Robbrecht E. & Berghmans D. 2004, A&A 425, 1097 (CACTus).
Olmedo O. et al. 2008, Sol. Phys. 248, 485 (SEEDS).
Yashiro S. et al. 2004, JGR 109, A07105 (CDAW catalogue: PA, width, linear speed).
Prsa A. et al. 2016, AJ 152, 41 (IAU 2015 nominal solar radius).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from astropy.time import Time
from scipy import ndimage

from pipelines.errors import DataError
from pipelines.sun import RSUN_KM, apparent_rsun_arcsec
from pipelines.utc import as_utc

__all__ = [
    "FRM_NAME",
    "FRM_VERSION",
    "DETECTOR_NAME",
    "DETECTOR_VERSION",
    "CMEParams",
    "HeightTimePoint",
    "DetectedCME",
    "detect_cmes",
    "geometry_from_header",
    "polar_unwrap",
    "despike",
    "as_utc_datetimes",
]

FRM_NAME = "lst-sci-cme"
FRM_VERSION = "0.1.0"
#: Aliases matching :mod:`pipelines.detect.flares` (HEK ``frm_name``/``frm_version``).
DETECTOR_NAME, DETECTOR_VERSION = FRM_NAME, FRM_VERSION



# --------------------------------------------------------------------------------------
# shared helpers (also used by pipelines.detect.prominence)


def as_utc_datetimes(times) -> list[dt.datetime]:
    """Aware UTC datetimes from datetimes (naive = UTC), astropy ``Time``, ISO strings or
    ``numpy.datetime64`` (mixed types allowed).

    Raises
    ------
    DataError
        If an element is not a time.
    """
    if isinstance(times, Time):
        return list(np.atleast_1d(times.utc.to_datetime(timezone=dt.UTC)))
    out = []
    for x in times:
        if isinstance(x, dt.datetime):
            out.append(as_utc(x))
            continue
        try:
            out.append(Time(x, scale="utc").to_datetime(timezone=dt.UTC))
        except (ValueError, TypeError) as exc:
            raise DataError(f"not a time: {x!r} ({exc})") from None
    return out


def _seconds(dts: Sequence[dt.datetime]) -> np.ndarray:
    return np.array([(d - dts[0]).total_seconds() for d in dts], dtype=np.float64)


def checked_sequence(times, images, mask=None) -> tuple[list[dt.datetime], np.ndarray, np.ndarray]:
    """A time series of frames, checked: aware UTC times, the stack, seconds from the first.

    Parameters
    ----------
    times : sequence of datetime, str or astropy Time
        DATE-OBS of each frame.
    images : sequence of 2-D arrays, shape (ny, nx) each
    mask : sequence of 2-D bool arrays, optional
        True where a pixel must not be used.

    Returns
    -------
    dts : list of datetime
    arr : numpy.ndarray, shape (nt, ny, nx), float
        As :func:`_stack` makes it (masked pixels NaN).
    sec : numpy.ndarray, shape (nt,)
        Seconds since the first frame.

    Raises
    ------
    DataError
        Times and images differ in number, fewer than 3 frames, or times not increasing.
    """
    dts = as_utc_datetimes(times)
    arr, _ = _stack(images, mask)
    nt = arr.shape[0]
    if len(dts) != nt:
        raise DataError(f"{len(dts)} times for {nt} images")
    if nt < 3:
        raise DataError("need at least 3 frames")
    sec = _seconds(dts)
    if np.any(np.diff(sec) <= 0):
        raise DataError("times must be strictly increasing")
    return dts, arr, sec


def _stack(images, mask) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``(nt, ny, nx)`` copy with NaN wherever masked or not finite."""
    arr = np.array(images, dtype=np.float64, copy=True)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise DataError(f"images must be (nt, ny, nx), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if mask is not None:
        m = np.asarray(mask).astype(bool)
        if m.shape not in (arr.shape, arr.shape[1:]):
            raise DataError(f"mask shape {m.shape} matches neither {arr.shape} nor {arr.shape[1:]}")
        bad |= np.broadcast_to(m, arr.shape)
    arr[bad] = np.nan
    return arr, bad


def _block_reduce(arr: np.ndarray, f: int) -> np.ndarray:
    """NaN-aware block mean of ``(nt, ny, nx)`` by ``f`` (edges padded with NaN)."""
    if f <= 1:
        return arr
    nt, ny, nx = arr.shape
    py, px = (-ny) % f, (-nx) % f
    if py or px:
        arr = np.pad(arr, ((0, 0), (0, py), (0, px)), constant_values=np.nan)
    nt, ny, nx = arr.shape
    blocks = arr.reshape(nt, ny // f, f, nx // f, f)
    good = np.isfinite(blocks)
    s = np.where(good, blocks, 0.0).sum(axis=(2, 4))
    c = good.sum(axis=(2, 4))
    out = np.full(s.shape, np.nan)
    ok = c >= (f * f) / 2.0
    out[ok] = s[ok] / c[ok]
    return out


def _ring_index(shape: tuple[int, int], sun_center_px: tuple[float, float]) -> np.ndarray:
    """Integer distance [pixel] of every pixel from Sun centre."""
    yy, xx = np.indices(shape)
    return np.hypot(xx - sun_center_px[0], yy - sun_center_px[1]).astype(np.int64)


def despike(frame: np.ndarray, *, sun_center_px: tuple[float, float], k: float = 6.0,
            ring_index: np.ndarray | None = None) -> np.ndarray:
    """Replace isolated bright pixels (cosmic-ray hits) by their 3x3 median.

    The noise is estimated per 1-pixel-wide ring about Sun centre (the noise of a
    coronagraph frame depends mostly on radius), as the clipped mean absolute residual
    from the mean of the 8 neighbours, scaled to a Gaussian sigma. Pixels more than
    ``k / 2`` sigma above their neighbours' mean are candidates; a candidate exceeding
    its 3x3 median by more than ``k`` sigma is replaced by that median. Structures wider
    than ~2 pixels (CME fronts at the working resolution) are left alone.

    Parameters
    ----------
    frame : numpy.ndarray
        ``(ny, nx)``, NaN where masked.
    sun_center_px : (float, float)
        ``(x, y)`` 0-based.
    k : float
        Threshold [robust sigma].
    ring_index : numpy.ndarray, optional
        ``(ny, nx)`` integer distance from Sun centre [pixel], to reuse across frames.

    Returns
    -------
    numpy.ndarray
        A despiked copy.
    """
    good = np.isfinite(frame)
    filled = np.where(good, frame, 0.0)
    ny, nx = frame.shape
    # residual from the mean of the 8 neighbours (cheap), robust sigma per 1-pixel ring
    nb = (9.0 * ndimage.uniform_filter(filled, 3, mode="nearest") - filled) / 8.0
    res = filled - nb
    ring = ring_index if ring_index is not None else _ring_index((ny, nx), sun_center_px)
    rv, absr = ring[good], np.abs(res[good])
    n = np.maximum(np.bincount(rv, minlength=ring.max() + 1), 1)
    cap = np.bincount(rv, weights=absr, minlength=n.size) / n
    clipped = np.minimum(absr, 3.0 * cap[rv])
    sig = 1.2533 * np.bincount(rv, weights=clipped, minlength=n.size) / n
    cand = np.flatnonzero((good & (res > 0.5 * k * sig[ring]) & (sig[ring] > 0)).ravel())
    out = frame.copy()
    if cand.size == 0:
        return out
    # exact 3x3 median only at the candidates
    cy, cx = np.unravel_index(cand, (ny, nx))
    offs = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    neigh = np.stack([filled[np.clip(cy + dy, 0, ny - 1), np.clip(cx + dx, 0, nx - 1)] for dy, dx in offs])
    med = np.median(neigh, axis=0)
    spike = filled[cy, cx] - med > k * sig[ring[cy, cx]] * math.sqrt(8.0 / 9.0)
    out[cy[spike], cx[spike]] = med[spike]
    return out


def polar_unwrap(
    image: np.ndarray,
    *,
    sun_center_px: tuple[float, float],
    rsun_px: float,
    r_edges_rsun: np.ndarray,
    n_pa: int = 360,
    oversample: tuple[int, int] = (3, 2),
) -> np.ndarray:
    """Resample an image onto a (position angle, radius) grid.

    Bin ``(i, j)`` covers PA ``[i, i + 1) * 360 / n_pa`` degrees (counter-clockwise from
    north = image +y, east = image -x) and radius ``[r_edges_rsun[j], r_edges_rsun[j+1])``.
    Each bin is the mean of ``oversample[0] x oversample[1]`` bilinear samples
    (:func:`scipy.ndimage.map_coordinates`); a bin with a NaN sample is NaN.

    Parameters
    ----------
    image : numpy.ndarray
        ``(ny, nx)``, NaN where masked.
    sun_center_px : (float, float)
        ``(x, y)`` 0-based pixel position of Sun centre.
    rsun_px : float
        Solar radius [pixel].
    r_edges_rsun : numpy.ndarray
        ``n_r + 1`` increasing radial bin edges [Rsun].
    n_pa : int
        Number of PA bins over 360 deg.
    oversample : (int, int)
        Sub-samples per bin in PA and in radius.

    Returns
    -------
    numpy.ndarray
        ``(n_pa, n_r)`` float64.
    """
    kp, kr = oversample
    r_edges = np.asarray(r_edges_rsun, dtype=np.float64)
    n_r = r_edges.size - 1
    pa_sub = (np.arange(n_pa * kp) + 0.5) * (360.0 / (n_pa * kp))
    frac = (np.arange(kr) + 0.5) / kr
    r_sub = (r_edges[:-1, None] + frac[None, :] * np.diff(r_edges)[:, None]).ravel()
    th = np.radians(pa_sub)[:, None]
    rr = r_sub[None, :] * rsun_px
    cx, cy = sun_center_px
    xs = cx - rr * np.sin(th)
    ys = cy + rr * np.cos(th)
    samp = ndimage.map_coordinates(image, [ys, xs], order=1, mode="constant", cval=np.nan)
    return samp.reshape(n_pa, kp, n_r, kr).mean(axis=(1, 3))


def _smooth_nan(a: np.ndarray, sigma: tuple[float, float]) -> np.ndarray:
    """NaN-aware Gaussian smoothing of ``(n_pa, n_r)``, periodic in PA."""
    good = np.isfinite(a)
    w = ndimage.gaussian_filter(good.astype(np.float64), sigma, mode=("wrap", "nearest"))
    s = ndimage.gaussian_filter(np.where(good, a, 0.0), sigma, mode=("wrap", "nearest"))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = s / w
    out[w < 0.3] = np.nan
    return out


def _nanmedian(a: np.ndarray, axis) -> np.ndarray:
    """``np.nanmedian`` without the all-NaN RuntimeWarning (all-NaN slices give NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=axis)


def _label_periodic(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected labels of a ``(n_pa, n_other)`` mask, periodic along axis 0 (PA)."""
    lab, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if n == 0:
        return lab, 0
    parent = np.arange(n + 1)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first, last = lab[0], lab[-1]
    m = first.size
    for j in range(m):
        if first[j] == 0:
            continue
        for dj in (-1, 0, 1):
            jj = j + dj
            if 0 <= jj < m and last[jj]:
                a, b = find(first[j]), find(last[jj])
                if a != b:
                    parent[max(a, b)] = min(a, b)
    roots = np.array([find(i) for i in range(n + 1)])
    uniq, new = np.unique(roots, return_inverse=True)
    # label 0 (background) maps to root 0, which is the smallest -> new id 0
    return new[lab], uniq.size - 1


def _hysteresis_periodic(z: np.ndarray, low: float, high: float, min_area: int) -> np.ndarray:
    """Regions of ``z > low`` that contain ``z > high`` and have >= ``min_area`` bins."""
    lowm = np.nan_to_num(z, nan=-np.inf) > low
    lab, n = _label_periodic(lowm)
    if n == 0:
        return np.zeros_like(lowm)
    highm = np.nan_to_num(z, nan=-np.inf) > high
    area = np.bincount(lab.ravel(), minlength=n + 1)
    has_high = np.bincount(lab.ravel(), weights=highm.ravel(), minlength=n + 1) > 0
    keep = has_high & (area >= min_area)
    keep[0] = False
    return keep[lab]


def _circular_span(active: np.ndarray, bin_deg: float) -> tuple[float, float, float]:
    """(start edge, end edge, width) [deg] of the arc covered by ``active`` PA bins,
    taken as the complement of the largest circular gap; a full circle gives width 360."""
    n = active.size
    if active.all():
        return 0.0, 360.0, 360.0
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return float("nan"), float("nan"), 0.0
    # largest run of inactive bins, circularly
    gaps = np.diff(np.concatenate([idx, [idx[0] + n]])) - 1
    g = int(np.argmax(gaps))
    start = idx[(g + 1) % idx.size]
    end = idx[g]  # last active bin before the largest gap
    width_bins = (end - start) % n + 1
    start_deg = start * bin_deg
    return start_deg, (start_deg + width_bins * bin_deg) % 360.0, width_bins * bin_deg


def _line_fit(t: np.ndarray, h: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``h = a + b t``: (a, b, standard error of b; NaN when n < 3)."""
    n = t.size
    tm = t.mean()
    sxx = float(((t - tm) ** 2).sum())
    b = float(((t - tm) * (h - h.mean())).sum() / sxx)
    a = float(h.mean() - b * tm)
    if n < 3:
        return a, b, float("nan")
    res = h - (a + b * t)
    s2 = float((res**2).sum() / (n - 2))
    return a, b, math.sqrt(s2 / sxx)


# --------------------------------------------------------------------------------------
# public types


@dataclass(frozen=True)
class CMEParams:
    """Tunable parameters of :func:`detect_cmes` (defaults tuned on synthetic SCI data;
    recorded in every detection's attributes).

    Attributes
    ----------
    r_min_rsun, r_max_rsun : float
        Analysis annulus [Rsun]; inside the SCI field 1.1-2.5 Rsun, clear of the occulter
        edge and the field stop.
    pa_bin_deg : float
        PA bin [deg]; 360 / pa_bin_deg must be an integer.
    max_working_naxis : int
        Frames are block-averaged to at most this size [pixel].
    oversample : (int, int)
        Sub-samples per polar bin (PA, radius).
    despike_sigma : float
        Cosmic-ray rejection threshold of :func:`despike` at the working resolution
        [robust sigma]; 0 turns it off.
    smooth_pa_deg, smooth_r_rsun : float
        Gaussian sigma of the smoothing of difference images in PA [deg] and radius [Rsun].
    threshold_low, threshold_high : float
        Hysteresis thresholds of the significance [robust sigma].
    min_area_bins : int
        Smallest region kept in a polar difference frame [bins].
    pa_gap_deg : float
        PA gaps up to this size are bridged when grouping [deg].
    max_gap_s : float
        Frames further apart than this are not differenced [s].
    min_track_points : int
        Height-time points needed for an event.
    min_rise_rsun : float
        Smallest leading-edge rise over the track [Rsun].
    min_speed_km_s : float
        Slowest accepted linear speed [km/s].
    min_speed_snr : float
        Speed / its standard error needed (when >= 3 points).
    edge_margin_rsun : float
        Leading edges closer than this to ``r_max_rsun`` end the track: the front has left
        the field [Rsun].
    width_rel_threshold : float
        A PA bin counts towards the angular width in a frame when its peak significance is
        at least this fraction of the frame's largest (the width then depends little on the
        event's brightness).
    fragment_window_s : float
        A slower event inside a stronger one's span that starts within this time after the
        stronger one was last seen is taken as its trailing material and dropped [s].
    """

    r_min_rsun: float = 1.15
    r_max_rsun: float = 2.45
    pa_bin_deg: float = 1.0
    max_working_naxis: int = 512
    oversample: tuple[int, int] = (3, 2)
    despike_sigma: float = 6.0
    smooth_pa_deg: float = 1.5
    smooth_r_rsun: float = 0.015
    threshold_low: float = 3.0
    threshold_high: float = 6.0
    min_area_bins: int = 60
    pa_gap_deg: float = 3.0
    max_gap_s: float = 1800.0
    min_track_points: int = 3
    min_rise_rsun: float = 0.15
    min_speed_km_s: float = 50.0
    min_speed_snr: float = 3.0
    edge_margin_rsun: float = 0.04
    width_rel_threshold: float = 0.2
    fragment_window_s: float = 1800.0


@dataclass(frozen=True)
class HeightTimePoint:
    """One leading-edge measurement: time (UTC), height [Rsun], PA [deg]."""

    time: dt.datetime
    height_rsun: float
    pa_deg: float


@dataclass(frozen=True)
class DetectedCME:
    """One CME found by :func:`detect_cmes`.

    Attributes
    ----------
    first_appearance : datetime
        Time (UTC) of the first frame whose front exceeds the threshold in the field.
    last_seen : datetime
        Time of the last frame in which the event is detected.
    pa_deg : float
        Central position angle [deg CCW from north]: mid-point of the angular span.
    width_deg : float
        Angular width [deg] (360 for a full halo).
    pa_start_deg, pa_end_deg : float
        Edges of the span, going counter-clockwise from start to end [deg].
    speed_km_s, speed_err_km_s : float
        Linear (first-order fit) speed of the apex and its standard error [km/s]
        (``speed_err_km_s`` is NaN with 2 points).
    acceleration_m_s2 : float
        From a second-order fit [m/s^2]; NaN with fewer than 4 points.
    median_pa_speed_km_s : float
        Median over PA bins of per-PA linear speeds (CACTus-style) [km/s]; NaN if no PA
        has 3 points.
    height_time : tuple of HeightTimePoint
        Apex leading edge per frame (points used by the fit).
    height_time_by_pa : dict
        ``{pa_deg: [(iso time, height_rsun), ...]}`` for every PA bin of the event.
    peak_significance : float
        Largest significance inside the event [robust sigma].
    n_frames : int
        Frames in which the event is detected.
    params : dict
        The :class:`CMEParams` used.
    """

    first_appearance: dt.datetime
    last_seen: dt.datetime
    pa_deg: float
    width_deg: float
    pa_start_deg: float
    pa_end_deg: float
    speed_km_s: float
    speed_err_km_s: float
    acceleration_m_s2: float
    median_pa_speed_km_s: float
    height_time: tuple[HeightTimePoint, ...]
    height_time_by_pa: dict[float, list[tuple[str, float]]]
    peak_significance: float
    n_frames: int
    params: dict[str, Any] = field(default_factory=dict)
    frm_name: str = FRM_NAME
    frm_version: str = FRM_VERSION

    @property
    def halo(self) -> bool:
        """True when the event covers all position angles."""
        return self.width_deg >= 360.0

    def to_event_row(self, *, rsun_arcsec: float, channel: str = "SCI") -> dict[str, Any]:
        """Column values for a ``backend.models.Event`` row (``event_type='CE'``).

        ``hpc_x``/``hpc_y`` [arcsec] locate the apex at first appearance (east = -x).
        ``source`` and ``source_key`` are left to the caller.
        """
        h = self.height_time[0].height_rsun if self.height_time else float("nan")
        pa = math.radians(self.pa_deg)
        return {
            "event_type": "CE",
            "start_time": self.first_appearance,
            "peak_time": None,
            "end_time": self.last_seen,
            "channels": channel,
            "position_angle": self.pa_deg,
            "angular_width": self.width_deg,
            "speed_km_s": self.speed_km_s,
            "hpc_x": -h * rsun_arcsec * math.sin(pa),
            "hpc_y": h * rsun_arcsec * math.cos(pa),
            "frm_name": self.frm_name,
            "frm_version": self.frm_version,
            "attributes": {
                "speed_err_km_s": self.speed_err_km_s,
                "acceleration_m_s2": self.acceleration_m_s2,
                "median_pa_speed_km_s": self.median_pa_speed_km_s,
                "pa_start_deg": self.pa_start_deg,
                "pa_end_deg": self.pa_end_deg,
                "halo": self.halo,
                "n_frames": self.n_frames,
                "peak_significance": self.peak_significance,
                "height_time": [
                    [p.time.isoformat(), p.height_rsun, p.pa_deg] for p in self.height_time
                ],
                "params": self.params,
            },
        }


# --------------------------------------------------------------------------------------
# geometry from an L2 header


def geometry_from_header(header, *, max_roll_deg: float = 0.5) -> dict[str, Any]:
    """The geometry keywords of :func:`detect_cmes` from an L2 helioprojective header.

    ``sun_center_px = (CRPIX1 - 1 - CRVAL1 / CDELT1, CRPIX2 - 1 - CRVAL2 / CDELT2)``
    (0-based; exact for a Sun at the reference pixel, a small-angle approximation
    otherwise), ``plate_scale_arcsec = |CDELT1|`` (``CUNIT1`` arcsec, deg or arcmin),
    ``rsun_arcsec`` from ``RSUN_OBS``, ``RSUN_ARC`` or ``RSUN``; else from ``DSUN_OBS``
    (``arcsin(695,700 km / DSUN_OBS)``); else from ``DATE-OBS`` with Earth's distance
    (:func:`sunpy.coordinates.sun.angular_radius`).

    Parameters
    ----------
    header : mapping
        A FITS header (``astropy.io.fits.Header`` or dict).
    max_roll_deg : float
        Largest accepted image roll (``CROTA2`` or the PC matrix) [deg].

    Returns
    -------
    dict
        ``sun_center_px``, ``plate_scale_arcsec``, ``rsun_arcsec``.

    Raises
    ------
    DataError
        If the scale is missing, non-square or negative (flipped axes), or the image is not
        north up.
    """
    units = {"arcsec": 1.0, "arcsecs": 1.0, "deg": 3600.0, "arcmin": 60.0}
    try:
        c1 = float(header["CDELT1"]) * units[str(header.get("CUNIT1", "arcsec")).strip().lower()]
        c2 = float(header["CDELT2"]) * units[str(header.get("CUNIT2", "arcsec")).strip().lower()]
        crpix1, crpix2 = float(header["CRPIX1"]), float(header["CRPIX2"])
    except (KeyError, ValueError, TypeError) as exc:
        raise DataError(f"header lacks a usable CDELT/CRPIX/CUNIT: {exc}") from None
    if abs(abs(c1) - abs(c2)) > 1e-3 * abs(c1):
        raise DataError(f"non-square pixels: CDELT1={c1} CDELT2={c2} arcsec")
    if c1 <= 0 or c2 <= 0:
        raise DataError(f"flipped axes (CDELT1={c1}, CDELT2={c2}): L2 SCI products have west = +x, north = +y")
    roll = float(header.get("CROTA2", header.get("CROTA", 0.0)) or 0.0)
    if "PC1_2" in header or "PC2_1" in header:
        roll = math.degrees(math.atan2(float(header.get("PC2_1", 0.0)), float(header.get("PC1_1", 1.0))))
    if abs((roll + 180.0) % 360.0 - 180.0) > max_roll_deg:
        raise DataError(f"image is rolled by {roll:.2f} deg; L2 SCI products are north up")
    crval1 = float(header.get("CRVAL1", 0.0)) * units[str(header.get("CUNIT1", "arcsec")).strip().lower()]
    crval2 = float(header.get("CRVAL2", 0.0)) * units[str(header.get("CUNIT2", "arcsec")).strip().lower()]
    cx = crpix1 - 1.0 - crval1 / c1
    cy = crpix2 - 1.0 - crval2 / c2
    date = header.get("DATE-OBS") or header.get("DATE_OBS")
    try:
        when = Time(date, scale="utc").to_datetime() if date else None
    except ValueError:
        when = None
    try:
        rsun = apparent_rsun_arcsec(header, when=when, keys=("RSUN_OBS", "RSUN_ARC", "RSUN"))
    except DataError:
        raise DataError("no RSUN_OBS, DSUN_OBS or DATE-OBS to get the solar radius from") from None
    return {"sun_center_px": (cx, cy), "plate_scale_arcsec": abs(c1), "rsun_arcsec": rsun}


# --------------------------------------------------------------------------------------
# the detector


def detect_cmes(
    times,
    images,
    *,
    sun_center_px: tuple[float, float],
    plate_scale_arcsec: float,
    rsun_arcsec: float,
    mask: np.ndarray | None = None,
    params: CMEParams = CMEParams(),
) -> list[DetectedCME]:
    """Find CMEs in a time-ordered sequence of L2 SCI images.

    Parameters
    ----------
    times : sequence of datetime, astropy Time or ISO str
        ``nt`` observation times (UTC; naive datetimes are taken as UTC), increasing.
    images : array_like
        ``(nt, ny, nx)`` brightness [MSB], solar north up, east left.
    sun_center_px : (float, float)
        ``(x, y)`` of Sun centre, 0-based pixels (all frames).
    plate_scale_arcsec : float
        [arcsec / pixel].
    rsun_arcsec : float
        Apparent solar radius [arcsec] (``RSUN_OBS``).
    mask : array_like of bool, optional
        ``(ny, nx)`` or ``(nt, ny, nx)``; True (e.g. ``DQ != 0``) marks pixels to ignore.
        NaN and infinite pixels are ignored too.
    params : CMEParams

    Returns
    -------
    list of DetectedCME
        Sorted by first appearance; empty when nothing moves outward coherently.

    Raises
    ------
    DataError
        Fewer than 3 frames, shapes that disagree, times not increasing, or a geometry
        that puts the analysis annulus outside the image.

    Notes
    -----
    On L2 products: read each product's primary HDU (float32, MSB) and its ``DQ``
    extension (``mask = DQ != 0``), take the geometry from :func:`geometry_from_header` of
    the first frame (and check the others agree), sort by ``DATE-OBS``, and pass the stack.
    One call holds ``nt`` frames in memory at the working resolution (512^2 by default).

    References
    ----------
    Robbrecht & Berghmans 2004, A&A 425, 1097; Olmedo et al. 2008, Sol. Phys. 248, 485;
    Yashiro et al. 2004, JGR 109, A07105.
    """
    # Long: the seven numbered steps of the detector (CACTus-like, Robbrecht & Berghmans 2004)
    # share the polar grid and the running-difference stack; each step is a few lines.
    p = params
    dts, arr, sec = checked_sequence(times, images, mask)
    nt = arr.shape[0]

    # 1. working resolution
    f = max(1, math.ceil(max(arr.shape[1:]) / p.max_working_naxis))
    work = _block_reduce(arr, f)
    cx, cy = sun_center_px
    wc = ((cx + 0.5) / f - 0.5, (cy + 0.5) / f - 0.5)
    if p.despike_sigma > 0:
        ring = _ring_index(work.shape[1:], wc)
        work = np.stack([despike(w, sun_center_px=wc, k=p.despike_sigma, ring_index=ring) for w in work])
    rsun_px = rsun_arcsec / (plate_scale_arcsec * f)
    ny, nx = work.shape[1:]
    reach = p.r_max_rsun * rsun_px
    if reach < 4 or min(wc[0], wc[1], nx - 1 - wc[0], ny - 1 - wc[1]) < p.r_min_rsun * rsun_px:
        raise DataError("the analysis annulus lies outside the image; check the geometry")

    # 2. polar grid: radial bins of one working pixel
    dr = 1.0 / rsun_px
    n_r = max(8, int(round((p.r_max_rsun - p.r_min_rsun) / dr)))
    r_edges = np.linspace(p.r_min_rsun, p.r_max_rsun, n_r + 1)
    r_cent = 0.5 * (r_edges[:-1] + r_edges[1:])
    n_pa = int(round(360.0 / p.pa_bin_deg))
    pa_cent = (np.arange(n_pa) + 0.5) * p.pa_bin_deg
    polar = np.stack([
        polar_unwrap(work[k], sun_center_px=wc, rsun_px=rsun_px, r_edges_rsun=r_edges,
                     n_pa=n_pa, oversample=p.oversample)
        for k in range(nt)
    ])

    # 3. relative running difference
    base = _nanmedian(polar, axis=0)
    ring_level = _nanmedian(base, axis=0)  # azimuthal median of the static corona, per radius
    floor = 0.05 * np.abs(ring_level)[None, :]
    with np.errstate(invalid="ignore"):
        base = np.where(np.abs(base) > floor, base, np.where(np.isfinite(ring_level), floor, np.nan))
    diffs, dk = [], []
    for k in range(1, nt):
        if sec[k] - sec[k - 1] > p.max_gap_s:
            continue
        d = (polar[k] - polar[k - 1]) / base
        d -= _nanmedian(d, axis=0)[None, :]
        diffs.append(d)
        dk.append(k)
    if not diffs:
        return []
    sig = (p.smooth_pa_deg / p.pa_bin_deg, p.smooth_r_rsun / dr)
    sm = np.stack([_smooth_nan(d, sig) for d in diffs])

    # 4. significance per radius
    med = _nanmedian(sm, axis=(0, 1))
    mad = 1.4826 * _nanmedian(np.abs(sm - med[None, None, :]), axis=(0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (sm - med[None, None, :]) / mad[None, None, :]

    # 5-6. threshold, leading edge per PA
    nd = len(dk)
    lead = np.full((nd, n_pa), np.nan)  # leading-edge radius index
    zmax = np.full((nd, n_pa), np.nan)
    for i in range(nd):
        kept = _hysteresis_periodic(z[i], p.threshold_low, p.threshold_high, p.min_area_bins)
        cols = kept.any(axis=1)
        if not cols.any():
            continue
        j_last = kept.shape[1] - 1 - np.argmax(kept[:, ::-1], axis=1)
        lead[i, cols] = j_last[cols]
        zmax[i, cols] = np.where(kept, z[i], -np.inf).max(axis=1)[cols]

    # 7. group in (PA, time), periodic in PA, bridging small PA gaps
    active = np.isfinite(lead).T  # (n_pa, nd)
    if not active.any():
        return []
    gap = int(round(p.pa_gap_deg / p.pa_bin_deg))
    bridged = ndimage.binary_closing(
        np.concatenate([active[-gap - 1:], active, active[: gap + 1]]) if gap > 0 else active,
        structure=np.ones((2 * gap + 1, 1), dtype=bool),
    )
    if gap > 0:
        bridged = bridged[gap + 1: gap + 1 + n_pa] | active
    labels, n_ev = _label_periodic(bridged)

    out: list[DetectedCME] = []
    for ev in range(1, n_ev + 1):
        cells = (labels == ev) & active
        if not cells.any():
            continue
        det = _characterise(cells, lead, zmax, r_cent, pa_cent, dk, dts, sec, p)
        if det is not None:
            out.append(det)
    out = _suppress_fragments(out, p.fragment_window_s)
    out.sort(key=lambda e: e.first_appearance)
    return out


def _in_span(pa: float, start: float, width: float) -> bool:
    return width >= 360.0 or (pa - start) % 360.0 <= width


def _suppress_fragments(events: list[DetectedCME], window_s: float) -> list[DetectedCME]:
    """Drop an event whose central PA lies inside the span of a more significant one and
    that overlaps it in time, or follows it within ``window_s`` while slower: a fragment
    (flank, trailing material) of the same CME."""
    kept: list[DetectedCME] = []
    for ev in sorted(events, key=lambda e: -e.peak_significance):
        def fragment_of(k: DetectedCME) -> bool:
            if not _in_span(ev.pa_deg, k.pa_start_deg, k.width_deg):
                return False
            if ev.first_appearance <= k.last_seen and k.first_appearance <= ev.last_seen:
                return True
            lag = (ev.first_appearance - k.last_seen).total_seconds()
            return 0 < lag <= window_s and ev.speed_km_s < k.speed_km_s

        if any(fragment_of(k) for k in kept):
            continue
        kept.append(ev)
    return kept


def _characterise(cells, lead, zmax, r_cent, pa_cent, dk, dts, sec, p: CMEParams) -> DetectedCME | None:
    """Kinematics, span and acceptance of one grouped event; None if rejected."""
    # Long: apex, angular span and per-PA speeds of one event read the same significance
    # cube slices; split, each part would recompute or pass them all.
    n_pa = cells.shape[0]
    frames = np.flatnonzero(cells.any(axis=0))
    if frames.size < p.min_track_points:
        return None
    edge_limit = p.r_max_rsun - p.edge_margin_rsun
    ht_t, ht_h, ht_pa, ht_idx = [], [], [], []
    for i in frames:
        col = np.where(cells[:, i], lead[i], np.nan)
        # 3-bin median along PA (periodic), NaN-aware: single-bin spikes cannot be the apex
        stack3 = np.stack([np.roll(col, -1), col, np.roll(col, 1)])
        n_ok = np.isfinite(stack3).sum(axis=0)
        filt = _nanmedian(stack3, axis=0)
        filt[(n_ok < 2) | ~np.isfinite(col)] = np.nan
        if not np.isfinite(filt).any():
            continue
        j = int(np.nanargmax(filt))
        h = float(np.interp(filt[j], np.arange(r_cent.size), r_cent))
        if h >= edge_limit:
            break  # the front has left the field: later frames show only flanks
        if ht_h and h < max(ht_h) - 2.0 * (r_cent[1] - r_cent[0]) and len(ht_h) >= p.min_track_points:
            break  # the apex fell back: the front is gone, what remains trails it
        ht_t.append(sec[dk[i]])
        ht_h.append(h)
        ht_pa.append(float(pa_cent[j]))
        ht_idx.append(i)
    t = np.array(ht_t)
    h = np.array(ht_h)
    if t.size < max(2, p.min_track_points):
        return None
    keep = np.ones(t.size, dtype=bool)
    a, b, eb = _line_fit(t, h)
    if t.size >= 4:
        res = h - (a + b * t)
        scale = max(1.4826 * float(np.median(np.abs(res - np.median(res)))), 2.0 * (r_cent[1] - r_cent[0]))
        keep = np.abs(res) <= 3.0 * scale
        if keep.sum() >= max(3, p.min_track_points) and not keep.all():
            a, b, eb = _line_fit(t[keep], h[keep])
        else:
            keep[:] = True
    tk, hk = t[keep], h[keep]
    speed = b * RSUN_KM
    speed_err = eb * RSUN_KM
    if speed < p.min_speed_km_s:
        return None
    if tk.size >= 3 and not (speed >= p.min_speed_snr * speed_err):
        return None
    if hk.max() - hk.min() < p.min_rise_rsun:
        return None
    acc = float("nan")
    if tk.size >= 4:
        c2 = np.polyfit(tk - tk.mean(), hk, 2)[0]
        acc = 2.0 * c2 * RSUN_KM * 1e3

    # angular span: PA bins whose significance reaches width_rel_threshold of the frame's
    # peak, in >= 2 frames (or 1 for a single-frame event)
    counts = cells.sum(axis=1)
    strong = np.zeros_like(cells)
    for i in frames:
        colz = np.where(cells[:, i], zmax[i], np.nan)
        strong[:, i] = np.nan_to_num(colz, nan=-np.inf) >= p.width_rel_threshold * np.nanmax(colz)
    need = 2 if frames.size >= 2 else 1
    span = strong.sum(axis=1) >= need
    if not span.any():
        span = counts >= 1
    bin_deg = 360.0 / n_pa
    start, end, width = _circular_span(span, bin_deg)
    if width >= 360.0:
        centre = ht_pa[int(np.argmax(h))]
    else:
        centre = (start + width / 2.0) % 360.0

    # per-PA speeds (CACTus-style median)
    by_pa: dict[float, list[tuple[str, float]]] = {}
    pa_speeds = []
    last_used = max(i for i, k in zip(ht_idx, keep) if k)
    for q in np.flatnonzero(counts > 0):
        ii = [i for i in frames if cells[q, i] and np.isfinite(lead[i, q]) and i <= last_used]
        pts = [(sec[dk[i]], float(r_cent[int(lead[i, q])])) for i in ii]
        pts = [(tt, hh) for tt, hh in pts if hh < edge_limit]
        by_pa[float(pa_cent[q])] = [(dts[dk[i]].isoformat(), float(r_cent[int(lead[i, q])])) for i in ii]
        if len(pts) >= 3:
            tt = np.array([x[0] for x in pts])
            hh = np.array([x[1] for x in pts])
            pa_speeds.append(_line_fit(tt, hh)[1] * RSUN_KM)
    med_speed = float(np.median(pa_speeds)) if pa_speeds else float("nan")

    used = [i for i, k in zip(ht_idx, keep) if k]
    return DetectedCME(
        first_appearance=dts[dk[frames[0]]],
        last_seen=dts[dk[frames[-1]]],
        pa_deg=float(centre),
        width_deg=float(width),
        pa_start_deg=float(start),
        pa_end_deg=float(end),
        speed_km_s=float(speed),
        speed_err_km_s=float(speed_err),
        acceleration_m_s2=acc,
        median_pa_speed_km_s=med_speed,
        height_time=tuple(
            HeightTimePoint(dts[dk[i]], float(hh), float(pp))
            for i, hh, pp, k in zip(ht_idx, h, ht_pa, keep) if k
        ),
        height_time_by_pa=by_pa,
        peak_significance=float(np.nanmax(np.where(cells.T, zmax, np.nan))),
        n_frames=int(frames.size),
        params=dataclasses.asdict(p) | {"used_frames": len(used)},
    )
