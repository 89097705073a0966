"""Which frames each channel gets, and the SDI time series with its injected flare.

SDI is either the 13-frame hourly EIT-based series (2004-03-01 00:00-12:00) with the flare
:data:`FLARE` injected, or repeated frames of the SWAP scene; WST and SCI get
``frames_per_channel`` frames one cadence apart (the scene does not evolve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from pipelines.simulation.sources import (MDI_FILE, SWAP_FILE, _cor1_texture, _eit_sources,
                                          _lyman_alpha_irradiance, _sunpy_source)


#: The flare injected into the SDI series: helioprojective position [arcsec], Gaussian
#: sigma [arcsec], peak enhancement over the pre-flare level at the kernel, e-folding decay
#: [s], and the series frames (0-based) of its start, peak and end. A strong (X-class-like)
#: Ly-alpha kernel, placed in a quiet part of the disk where the EIT series varies by ~5 %.
FLARE = dict(hpc_x=-400.0, hpc_y=-350.0, sigma_arcsec=30.0, peak_enhancement=2.0, decay_time_s=5400.0,
             start_frame=3, peak_frame=5, end_frame=9)


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


def _inject_flare(scene: np.ndarray, scale: float, amp: float, notes: list[str]) -> np.ndarray:
    """Add the :data:`FLARE` kernel at enhancement ``amp`` to an SDI scene, in place.

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

    Returns
    -------
    numpy.ndarray, shape (n, n), float32
        The flare component added (a Gaussian of ``FLARE["sigma_arcsec"]``).
    """
    g = _grid_offsets(scene.shape[0]) * np.float32(scale)
    d2 = (g[None, :] - FLARE["hpc_x"]) ** 2 + (g[:, None] - FLARE["hpc_y"]) ** 2
    gauss = np.exp(-d2 / (2 * FLARE["sigma_arcsec"] ** 2)).astype(np.float32)
    base = float(np.mean(scene[d2 <= FLARE["sigma_arcsec"] ** 2]))  # pre-flare level at the kernel
    flare_img = gauss * np.float32(amp * base)
    scene += flare_img
    notes.append(f"flare injected: +{amp:.3f} x the pre-flare level ({base:.4g}) at "
                 f"({FLARE['hpc_x']:g}, {FLARE['hpc_y']:g}) arcsec, sigma {FLARE['sigma_arcsec']:g} arcsec")
    return flare_img
