"""The real solar images the scenes are built from, read and cleaned (``sample-data/real``).

PROBA2/SWAP 174 A and the SOHO/EIT 13-frame series (SDI), SOHO/MDI continuum (WST),
STEREO/COR1-A (SCI structure) and the LASP composite Ly-alpha irradiance
(``sample-data/real/MANIFEST.md`` lists their origin and licences).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from astropy import units as u
from astropy.time import Time
from scipy import ndimage

from pipelines.errors import DataError
from pipelines.fitsio import read_image
from pipelines.simulation.grid import _apparent_rsun_arcsec
from pipelines.calibration.masters.limb import fit_solar_limb
from pipelines.simulation.models import COR1_CONTRAST_GAIN
from pipelines.simulation.output import _iso


#: The real solar files shipped with the project.
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "sample-data" / "real"

SWAP_FILE = "full-disk/swap_lv1_20120101_001607.fits"
EIT_DIR = "full-disk/eit_sequence"
MDI_FILE = "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits"
COR1_FILE = "coronagraph/20070503_102018_s4c1a.fts"
LYA_INDEX_FILE = "lyman-alpha/lymanalpha_composite_1997-2013.txt"
#: SDO/HMI continuum (617.3 nm) of 2023-01-31 03:39:23 as Helioviewer serves it (JPEG 2000,
#: 512 x 512, 8-bit display values, FITS header in the XML box): the ASO-S era WST scene.
HMI_JP2_FILE = "helioviewer-jp2/2023_01_31__03_39_23_200__SDO_HMI_HMI_continuum.jp2"
GOES_REPORT_DIR = "events/goes_xrs_reports"


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
    wavelength_nm: float = 676.8  # white-light sources: the continuum wavelength (MDI Ic 676.8 nm)

    @property
    def rsun_px(self) -> float:
        """Apparent solar radius [pixel of the source]."""
        return self.rsun_arcsec / math.sqrt(abs(np.linalg.det(self.matrix)))


def _sunpy_source(path: Path) -> _DiskSource:
    """A full-disk FITS file read with sunpy (its WCS gives the disk centre and orientation)."""
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


def _helioviewer_source(path: Path) -> _DiskSource:
    """A white-light full disk from a Helioviewer JPEG 2000 (:mod:`pipelines.helioviewer_jp2`).

    The geometry (disk centre, orientation, ``RSUN_OBS``, DATE-OBS) comes from the XML
    box's FITS header through sunpy. The values are Helioviewer's 8-bit display scaling of
    the DN: the WST scene takes only their *relative* structure (contrast to the fitted
    limb darkening and large-scale trend, :func:`~pipelines.simulation.scenes._mdi_contrast`),
    and its absolute radiance from the 360 nm model; a note says so.

    Raises
    ------
    pipelines.helioviewer_jp2.Jp2ReadError
        If the file is not a readable Helioviewer JP2.
    """
    import sunpy.map  # noqa: F401  (the map sources register on import)
    from astropy.coordinates import SkyCoord

    from pipelines.helioviewer_jp2 import helioviewer_map
    from sunpy import log as sunpy_log

    level = sunpy_log.level
    sunpy_log.setLevel("WARNING")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = helioviewer_map(path)
            c = m.world_to_pixel(SkyCoord(0 * u.arcsec, 0 * u.arcsec, frame=m.coordinate_frame))
            scale = np.diag([m.scale[0].to_value(u.arcsec / u.pix), m.scale[1].to_value(u.arcsec / u.pix)])
            matrix = scale @ np.asarray(m.rotation_matrix, dtype=float)
            rsun = float(m.rsun_obs.to_value(u.arcsec))
            t = Time(m.date).utc
            wave = float(m.wavelength.to_value(u.nm)) if m.wavelength is not None else 617.3
            data = np.asarray(m.data, dtype=np.float64)
    finally:
        sunpy_log.setLevel(level)
    name = str(path.relative_to(path.parents[1]))
    notes = [f"WST scene from the Helioviewer JPEG 2000 {name} ({m.instrument}, {wave:g} nm, DATE-OBS {_iso(t)}): "
             "its pixel values are Helioviewer's 8-bit display scaling, not DN; only their relative structure "
             "is used, the 360 nm radiance is the model's"]
    return _DiskSource(image=data, x0=float(c.x.to_value(u.pix)), y0=float(c.y.to_value(u.pix)), matrix=matrix,
                       rsun_arcsec=rsun, date_obs=t, name=name, notes=notes, wavelength_nm=wave)


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
    """LASP composite Ly-alpha irradiance at 1 au on the day of ``t``, or the nearest day with a
    value within a year [photons cm-2 s-1], read by the chain's own reader
    (:func:`pipelines.calibration.masters.radiometry.read_lasp_composite`).

    Raises
    ------
    DataError
        If the file is missing or has no value within 366 days of ``t``.
    """
    from pipelines.calibration.masters.radiometry import read_lasp_composite

    days = read_lasp_composite(sample_dir / LYA_INDEX_FILE).days
    day = t.utc.to_datetime().date()
    best = min(days, key=lambda d: abs((d - day).days), default=None)
    if best is None or abs((best - day).days) > 366:
        raise DataError(f"no LASP Ly-alpha composite value near {t.isot}")
    return float(days[best])


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
    """COR1-A's structure: bias-subtracted image over its radial median profile, contrast x COR1_CONTRAST_GAIN."""
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
