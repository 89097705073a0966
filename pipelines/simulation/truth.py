"""The truth of each frame: its scene band-limited to the channel's resolution, written to ``truth/``.

Float32 on the L2 grid with a helioprojective WCS, plus HDU ``STRAY`` (SCI: the injected
stray light, MSB) and HDU ``FLARE`` (SDI series: the injected flare component).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from astropy import units as u
from astropy.io import fits
from astropy.time import Time
from scipy import ndimage

from pipelines.calibration.l2.steps import RADIANCE_UNIT, StrayLightModel
from pipelines.calibration.masters.radiometry import IRRADIANCE_RADIUS_RSUN
from pipelines.channels import CHANNELS, ChannelSpec
from pipelines.simulation.forward import INSTRUMENT, _aperture
from pipelines.simulation.grid import _apparent_rsun_arcsec, _rho_grid
from pipelines.simulation.models import LYA_GAMMA, UV_MSB_AT_1P5, WL_K_FACTOR
from pipelines.simulation.output import SOFTWARE, _iso, _write
from pipelines.simulation.scenes import _scale_to_irradiance, _sci_scene, _sdi_scene, _wst_scene
from pipelines.simulation.series import _FramePlan, _inject_flare


def _smooth_sigma_px(spec: ChannelSpec, scale: float) -> float:
    """Gaussian sigma [pixel] for the channel's on-orbit resolution (FWHM), at least 1 px."""
    return max(1.0, spec.resolution / (2.0 * math.sqrt(2.0 * math.log(2.0))) / scale)


def _truth_header(spec: ChannelSpec, t: Time, n: int, scale: float, rsun_arcsec: float, obs: fits.Header,
                  bunit: str, raw_name: str, scene: str, sigma_px: float) -> fits.Header:
    """Header of a truth: helioprojective WCS of the L2 grid, observer keywords, the raw file and band limit."""
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


def _write_truth(plan: _FramePlan, chan: str, n: int, scale: float, stray: StrayLightModel | None,
                 out: Path, corona_factor=None) -> float:
    """Build, band-limit and write the truth of one frame; return its brightest signal.

    The signal includes the stray light behind the aperture (what reaches the detector),
    so that the radiometric coefficient can keep every raw pixel below the target.
    ``corona_factor`` (SCI): a radial factor ``f(r)`` on the K corona (``None``: 1).
    """
    spec, model = CHANNELS[chan], INSTRUMENT[chan]
    rsun_arcsec, obs = _apparent_rsun_arcsec(plan.t)
    rsun_px = rsun_arcsec / scale
    sigma = _smooth_sigma_px(spec, scale)
    flare_img = None
    if plan.kind == "sdi":
        # the whole Sun to 1.2 Rsun (IRRADIANCE_RADIUS_RSUN) holds the LASP irradiance, as in the
        # radiometric campaign and the chain's integral (before: the disk alone, 3 % less)
        scene = _sdi_scene(plan.src, n, scale, rsun_arcsec, plan.sdi_ref, 1.0)
        _scale_to_irradiance(scene, rsun_px, scale, plan.lya_irradiance,
                             float(obs["DSUN_OBS"]) / float(u.au.to(u.m)))
        disk = _rho_grid(n, rsun_px) <= 1.0
        radiance_mean = float(scene[disk].mean())
        plan.notes.append(f"Ly-alpha proxy (EUV/quiet)^{LYA_GAMMA}; irradiance within "
                          f"{IRRADIANCE_RADIUS_RSUN:g} Rsun at 1 au = LASP composite "
                          f"{plan.lya_irradiance:.4g} photons cm-2 s-1 (disk-average radiance {radiance_mean:.4g} "
                          f"{RADIANCE_UNIT})")
        if plan.flare_amp > 0:
            flare_img = _inject_flare(scene, scale, plan.flare_amp, plan.notes, plan.flare_spec)
    elif plan.kind == "wst":
        scene, notes = _wst_scene(plan.src, n, scale, rsun_arcsec)
        plan.notes.extend(notes)
    else:
        scene = _sci_scene(chan, plan.src, n, scale, rsun_arcsec, corona_factor=corona_factor)
        if corona_factor is not None:
            plan.notes.append("coronal radial shape: the K corona times a drawn radial factor (validation family)")
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
    for key, (value, comment) in plan.keywords.items():
        th[key] = (value, comment)
    _write(fits.HDUList([fits.PrimaryHDU(truth, header=th), *hdus_extra]), plan.truth_path, _iso(plan.t))
    return peak
