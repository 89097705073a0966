"""Which frames each channel gets, and the SDI time series with its injected flare.

SDI is either the 13-frame hourly EIT-based series (2004-03-01 00:00-12:00) with the flare
:data:`FLARE` injected, or repeated frames of the SWAP scene; WST and SCI get
``frames_per_channel`` frames one cadence apart (the scene does not evolve).

Two optional additions for the demo (``simulate(xrs_day=True, wst_helioviewer=True)``):

* the **XRS day** (:data:`XRS_DAY`): a short SDI series around the GOES-15 M2.5 flare of
  2011-06-07, the day of a real GOES XRS time series in the sample data, timed by the
  flare's line in the NOAA GOES XRS report and injected at its published location. The
  scene is the SWAP image of 2012-01-01, **not** of that day (no EUV image of 2011-06-07 is
  in the sample data): every frame says so in HISTORY and in ``SCENEFIL``/``SCENEOBS``.
* a WST frame of 2023-01-31 03:39:23 (ASO-S era) from the Helioviewer JPEG 2000 of SDO/HMI
  continuum (:data:`~pipelines.simulation.sources.HMI_JP2_FILE`), at the JP2's DATE-OBS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from astropy import units as u
from astropy.time import Time

from pipelines.channels import CHANNELS
from pipelines.simulation.grid import _grid_offsets
from pipelines.simulation.output import _iso
from pipelines.simulation.results import InjectedFlare
from pipelines.simulation.scenes import _sdi_reference
from pipelines.simulation.sources import (GOES_REPORT_DIR, HMI_JP2_FILE, MDI_FILE, SWAP_FILE, _cor1_texture,
                                          _eit_sources, _helioviewer_source, _lyman_alpha_irradiance,
                                          _sunpy_source)


#: The flare injected into the SDI series: helioprojective position [arcsec], Gaussian
#: sigma [arcsec], peak enhancement over the pre-flare level at the kernel, e-folding decay
#: [s], and the series frames (0-based) of its start, peak and end. A strong (X-class-like)
#: Ly-alpha kernel, placed in a quiet part of the disk where the EIT series varies by ~5 %.
FLARE = dict(hpc_x=-400.0, hpc_y=-350.0, sigma_arcsec=30.0, peak_enhancement=2.0, decay_time_s=5400.0,
             start_frame=3, peak_frame=5, end_frame=9)


#: The SDI series of the XRS day: the GOES flare it is built around (found by its peak and
#: class in the NOAA GOES XRS report of that year, which gives start, peak, end and the NOAA
#: region 11226 but no location), the flare's location, the frames (``n_frames`` from
#: ``first_frame`` every ``cadence_s`` [s]: 6 min, so the detector's sparse-cadence rule of
#: 5 sigma and 20 % applies; 25 frames, 05:20-07:44, so that most frame-to-frame changes are
#: quiet: with 13 frames the flare's own rise and decay made 7 of the 12 changes and the
#: detector's robust noise (a MAD of those changes) rose with it, hiding a +63 % kernel
#: below 5 sigma) and the injected kernel (sigma [arcsec], peak enhancement,
#: e-folding decay [s] = the GOES peak-to-end time). The location S21W54 is the published
#: one of this flare (the brief of issue 11; the SWPC/HEK flare reports of 2011-06-07);
#: **no record in sample-data/real gives it** (the GOES report row has none, DONKI's CME
#: 2011-06-07T06:50 has an empty ``sourceLocation``, no SRS of 2011 is in the sample). It is
#: consistent with the report's region: 11226 flared "from behind the southwest limb" on
#: 2011-06-10 17:51 (solen.info report of 2011-06-11), W54 + 13.2 deg/day x 3.5 days = W100.
#: The kernel stays at its helioprojective position of the GOES peak (rotation during the
#: 144-min series: 1.3 deg, ~15 arcsec).
XRS_DAY = dict(goes_report="goes-xrs-report_2011.txt", goes_peak="2011-06-07T06:41", goes_class="M2.5",
               noaa_ar=11226, location="S21W54", hgs_lat=-21.0, hgs_lon=54.0,
               first_frame="2011-06-07T05:20:00", cadence_s=360.0, n_frames=25,
               sigma_arcsec=30.0, peak_enhancement=1.0, decay_time_s=1080.0, scene=SWAP_FILE)


def _xrs_day_flare(sample: Path) -> dict[str, Any]:
    """The :data:`XRS_DAY` flare: GOES start/peak/end from the report and the helioprojective position.

    Returns a dict with the keys of :data:`FLARE` used by :func:`_inject_flare`
    (``hpc_x``/``hpc_y`` [arcsec] seen from Earth at the GOES peak, ``sigma_arcsec``,
    ``peak_enhancement``, ``decay_time_s``) and ``start``/``peak``/``end`` (:class:`Time`).

    Raises
    ------
    DataError
        If the report is missing or has no row of that peak and class.
    """
    from pipelines.catalogues.coords import heliographic_to_helioprojective
    from pipelines.catalogues.goes_xrs import parse_goes_xrs
    from pipelines.errors import DataError

    path = sample / GOES_REPORT_DIR / XRS_DAY["goes_report"]
    if not path.is_file():
        raise DataError(f"GOES XRS report not found: {path}")
    peak = Time(XRS_DAY["goes_peak"], scale="utc")
    rows = [e for e in parse_goes_xrs(path).events
            if e.goes_class == XRS_DAY["goes_class"] and abs((Time(e.peak_time) - peak).to_value(u.s)) < 60]
    if len(rows) != 1:
        raise DataError(f"{path.name}: expected one {XRS_DAY['goes_class']} row peaking at {XRS_DAY['goes_peak']}, "
                        f"found {len(rows)}")
    row = rows[0]
    x, y, visible = heliographic_to_helioprojective([XRS_DAY["hgs_lat"]], [XRS_DAY["hgs_lon"]], Time([row.peak_time]))
    if not visible[0]:
        raise DataError(f"{XRS_DAY['location']} is behind the limb at {row.peak_time}")
    return dict(hpc_x=float(x[0]), hpc_y=float(y[0]), sigma_arcsec=XRS_DAY["sigma_arcsec"],
                peak_enhancement=XRS_DAY["peak_enhancement"], decay_time_s=XRS_DAY["decay_time_s"],
                start=Time(row.start_time).utc, peak=Time(row.peak_time).utc, end=Time(row.end_time).utc,
                noaa_ar=row.noaa_ar, goes_class=row.goes_class, report=f"{GOES_REPORT_DIR}/{path.name}")


def _xrs_day_plans(chan: str, sample: Path) -> tuple[list[_FramePlan], InjectedFlare]:
    """The :data:`XRS_DAY` SDI frames (SWAP scene, flare injected) and the flare's record."""
    fl = _xrs_day_flare(sample)
    s = _sunpy_source(sample / XRS_DAY["scene"])
    ref = _sdi_reference(s)
    t0 = Time(XRS_DAY["first_frame"], scale="utc")
    times = [t0 + k * XRS_DAY["cadence_s"] * u.s for k in range(XRS_DAY["n_frames"])]
    lya = _lyman_alpha_irradiance(sample, times[0])  # of the simulated day, not of the scene's
    flare = InjectedFlare(channel=chan, start=_iso(fl["start"]), peak=_iso(fl["peak"]), end=_iso(fl["end"]),
                          hpc_x=fl["hpc_x"], hpc_y=fl["hpc_y"], peak_enhancement=fl["peak_enhancement"],
                          sigma_arcsec=fl["sigma_arcsec"], decay_time_s=fl["decay_time_s"])
    scene_obs = _iso(s.date_obs)
    keywords = {"SCENEFIL": (XRS_DAY["scene"], "scene source"),
                "SCENEOBS": (scene_obs, "its DATE-OBS: not this day")}
    note = (f"scene NOT of this day: solar structure from {XRS_DAY['scene']} (PROBA2/SWAP 174 A, DATE-OBS "
            f"{scene_obs}); no EUV image of {t0.strftime('%Y-%m-%d')} is in the sample data. Flare injected at "
            f"{XRS_DAY['location']} (NOAA {fl['noaa_ar']}, published location) timed by the GOES "
            f"{fl['goes_class']} report row ({fl['report']}): start {_iso(fl['start'])}, peak {_iso(fl['peak'])}, "
            f"end {_iso(fl['end'])}")
    plans = []
    for t in times:
        amp = fl["peak_enhancement"] * _flare_profile(t, fl["start"], fl["peak"], fl["end"], fl["decay_time_s"])
        flare.profile.append((_iso(t), amp))
        plans.append(_FramePlan(t=t, kind="sdi", src=s, scene=s.name, notes=[note], sdi_ref=ref, lya_irradiance=lya,
                                flare_amp=amp, flare_spec=fl, keywords=dict(keywords)))
    return plans, flare


def _helioviewer_wst_plan(sample: Path) -> _FramePlan:
    """One WST frame at the DATE-OBS of the Helioviewer HMI continuum JP2, from its image."""
    s = _helioviewer_source(sample / HMI_JP2_FILE)
    keywords = {"SCENEFIL": (Path(HMI_JP2_FILE).name, "scene source"),
                "SCENEOBS": (_iso(s.date_obs), "its DATE-OBS")}
    return _FramePlan(t=s.date_obs, kind="wst", src=s, scene=s.name, notes=list(s.notes), keywords=keywords)


def _flare_profile(t: Time, start: Time, peak: Time, end: Time, tau_s: float) -> float:
    """Normalised flare light curve: linear rise, exponential decay reaching 0 at ``end``."""
    if t <= start or t >= end:
        return 0.0
    if t <= peak:
        return float((t - start).to_value(u.s) / (peak - start).to_value(u.s))
    x = (t - peak).to_value(u.s)
    e_end = math.exp(-(end - peak).to_value(u.s) / tau_s)
    return float((math.exp(-x / tau_s) - e_end) / (1.0 - e_end))


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
    flare_spec: dict[str, Any] | None = None  # the injected flare (default FLARE)
    keywords: dict[str, tuple[Any, str]] = field(default_factory=dict)  # extra raw/truth header cards
    roll_offset_deg: float = 0.0  # SCI roll sequence: added to the frame's roll (simulate(sci_roll_deg=...))


def _plan_frames(chan: str, sample: Path, sdi_sequence: bool, frames_per_channel: int,
                 cache: dict[str, Any], *, xrs_day: bool = False, wst_helioviewer: bool = False
                 ) -> tuple[list[_FramePlan], list[InjectedFlare], list[dict[str, Any]]]:
    """The frames of one channel, the flares injected in them (SDI series) and limb fits.

    ``xrs_day`` adds the :data:`XRS_DAY` SDI series, ``wst_helioviewer`` the WST frame of
    the Helioviewer HMI JP2 (each only to its channel).
    """
    plans, flares, fits_info = _base_plans(chan, sample, sdi_sequence, frames_per_channel, cache)
    if chan == "SDI" and xrs_day:
        more, flare = _xrs_day_plans(chan, sample)
        plans.extend(more)
        flares.append(flare)
    if chan == "WST" and wst_helioviewer:
        plans.append(_helioviewer_wst_plan(sample))
    plans.sort(key=lambda p: p.t)
    return plans, flares, fits_info


def _base_plans(chan: str, sample: Path, sdi_sequence: bool, frames_per_channel: int,
                cache: dict[str, Any]) -> tuple[list[_FramePlan], list[InjectedFlare], list[dict[str, Any]]]:
    """The channel's standard frames (the EIT series or SWAP for SDI, MDI for WST, COR1 for SCI)."""
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
        return plans, [flare], fits_info
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
    return plans, [], []


def _inject_flare(scene: np.ndarray, scale: float, amp: float, notes: list[str],
                  flare: dict[str, Any] | None = None) -> np.ndarray:
    """Add a flare kernel (default :data:`FLARE`) at enhancement ``amp`` to an SDI scene, in place.

    Parameters
    ----------
    scene : numpy.ndarray, shape (n, n), float32
        Ly-alpha radiance on the L2 grid [erg cm-2 s-1 sr-1], disk centre on the frame centre.
    scale : float
        Plate scale [arcsec / pixel].
    amp : float
        Enhancement at the kernel over the pre-flare level (the mean of ``scene`` within
        one sigma of the kernel), this frame's point of the light curve.
    notes : list of str
        A line describing the injection is appended (the raw header's HISTORY).
    flare : dict, optional
        ``hpc_x``, ``hpc_y``, ``sigma_arcsec`` of the kernel [arcsec]; default :data:`FLARE`.

    Returns
    -------
    numpy.ndarray, shape (n, n), float32
        The flare component added (a Gaussian of ``FLARE["sigma_arcsec"]``).
    """
    f = FLARE if flare is None else flare
    g = _grid_offsets(scene.shape[0]) * np.float32(scale)
    d2 = (g[None, :] - f["hpc_x"]) ** 2 + (g[:, None] - f["hpc_y"]) ** 2
    gauss = np.exp(-d2 / (2 * f["sigma_arcsec"] ** 2)).astype(np.float32)
    base = float(np.mean(scene[d2 <= f["sigma_arcsec"] ** 2]))  # pre-flare level at the kernel
    flare_img = gauss * np.float32(amp * base)
    scene += flare_img
    notes.append(f"flare injected: +{amp:.3f} x the pre-flare level ({base:.4g}) at "
                 f"({f['hpc_x']:g}, {f['hpc_y']:g}) arcsec, sigma {f['sigma_arcsec']:g} arcsec")
    return flare_img
