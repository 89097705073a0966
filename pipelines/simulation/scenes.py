"""The solar scenes on the L2 grid, in physical units, from the real sources (unsmoothed).

SDI: Ly-alpha radiance from an EUV proxy; WST: 360 nm radiance from MDI's contrasts;
SCI-UV / SCI-WL: radial coronal models times COR1's azimuthal structure. The band limit
(the channel's resolution) is applied by :mod:`pipelines.simulation.truth`.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from pipelines.calibration.l2.steps import RADIANCE_UNIT
from pipelines.channels import CHANNELS
from pipelines.simulation.grid import _affine_sample, _grid_offsets, _rho_grid
from pipelines.simulation.models import (IRRADIANCE_360NM, LYA_GAMMA, LYA_LIMB_SCALE_RSUN, LYA_PHOTON_ERG, OMEGA_SUN_1AU,
                                         WL_K_FACTOR, _disk_average_factor, baumbach_f_corona,
                                         baumbach_k_corona, limb_darkening_neckel2005, lyman_alpha_corona)
from pipelines.simulation.sources import _CoronaTexture, _DiskSource


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


def _scale_to_irradiance(img: np.ndarray, rsun_px: float, scale_arcsec: float, e_1au_ph: float,
                         dsun_au: float) -> np.ndarray:
    """Scale a Lyman-alpha radiance image (L2 grid, disk centred) in place to an irradiance.

    The project's one irradiance convention
    (:data:`pipelines.calibration.masters.radiometry.IRRADIANCE_RADIUS_RSUN`): the irradiance
    is the radiance integrated over the solid angle within 1.2 Rsun of the disk centre (the
    disk, the limb-brightened chromosphere and the inner corona out to SDI's field stop; the
    part of that circle on the frame), which is what the chain's
    :func:`~pipelines.calibration.masters.radiometry.disk_integrated_irradiance` measures.

    Parameters
    ----------
    img : numpy.ndarray, shape (n, n) [erg cm-2 s-1 sr-1, any scale]
    rsun_px : float
        Solar radius on the grid [pixel].
    scale_arcsec : float
        Plate scale [arcsec/pixel].
    e_1au_ph : float
        Target irradiance at 1 au [photons cm-2 s-1] (the LASP composite's quantity).
    dsun_au : float
        Observer distance [au]: the irradiance at the observer is ``e_1au / dsun_au**2``.

    Returns
    -------
    numpy.ndarray
        ``img``, scaled.

    Raises
    ------
    ValueError
        If the image holds no positive radiance within the radius.
    """
    from pipelines.calibration.masters.radiometry import IRRADIANCE_RADIUS_RSUN

    inside = _rho_grid(img.shape[0], rsun_px) <= np.float32(IRRADIANCE_RADIUS_RSUN)
    total = float(img[inside].sum(dtype=np.float64))
    if not total > 0:
        raise ValueError("no radiance within the irradiance radius")
    omega_pix = (scale_arcsec * np.pi / (180.0 * 3600.0)) ** 2  # sr
    target = float(e_1au_ph) * LYA_PHOTON_ERG / float(dsun_au) ** 2  # erg cm-2 s-1 at the observer
    img *= np.asarray(target / (total * omega_pix), dtype=img.dtype)
    return img


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
    """Photospheric contrast map of a white-light source on its own grid (1 on the quiet disk and off it).

    The source's continuum intensity (MDI's, or HMI's from a Helioviewer JP2) divided by its
    limb darkening (Neckel 2005 at ``src.wavelength_nm``: 676.8 nm for MDI) and
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
    ratio[disk] = img[disk] / limb_darkening_neckel2005(src.wavelength_nm, mu[disk])
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
    """360 nm radiance [erg cm-2 s-1 sr-1] on the L2 grid (unsmoothed), from a white-light source.

    The source's contrasts (:func:`_mdi_contrast`, MDI at 676.8 nm or HMI at 617.3 nm)
    scale to 360 nm as ``C ** (lambda_src / 360)``
    (Wien: the log of a brightness-temperature contrast scales as 1/lambda); the 360 nm
    limb darkening (Neckel 2005) and the disk-centre radiance are applied. Row blocks
    bound the memory.
    """
    rsun_px = rsun_arcsec / scale
    lam = float(src.wavelength_nm)
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
        blk[disk] = centre * limb_darkening_neckel2005(360.0, mu) * c ** (lam / 360.0)
    who = "MDI" if lam == 676.8 else src.name
    notes = [f"{who} {lam:g} nm contrasts (limb darkening and large-scale trend removed) scaled to 360 nm as "
             f"C^({lam:g}/360); Neckel 2005 limb darkening; disk-centre radiance {centre:.4g} {RADIANCE_UNIT} "
             f"(ASTM E-490 {IRRADIANCE_360NM} W m-2 nm-1 x {CHANNELS['WST'].bandwidth_nm} nm)"]
    return out, notes


def _sci_scene(channel: str, tex: _CoronaTexture, n: int, scale: float, rsun_arcsec: float,
               block: int = 256, corona_factor=None) -> np.ndarray:
    """Coronal brightness [MSB] on the L2 grid (unsmoothed): radial model x COR1 structure.

    ``corona_factor``: ``f(r)`` [dimensionless] multiplying the K corona (WL) or the Ly-alpha
    corona (UV), ``r`` [Rsun] >= 1; ``None``: the radial models as they are.

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
        kf = 1.0 if corona_factor is None else corona_factor(rr)
        if channel == "SCI-WL":
            val = baumbach_f_corona(rr) + WL_K_FACTOR * baumbach_k_corona(rr) * t * kf
        else:
            val = lyman_alpha_corona(rr) * t * kf
        out[j0:j0 + block] = val
    return out
