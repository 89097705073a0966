"""The image renderer of L2 products: regions as PNG, the WCS for the browser, the pixel under
the cursor, and an event drawn where it is on a frame. Pure: files in, arrays, PNG bytes and
dicts out; no database (the events of a frame and the event page's context images are
queried by :mod:`backend.services.imaging`, which draws them with this module).

Regions (:func:`render_region`, :func:`render_dq`) come from a *dynamic pyramid*: the
product FITS is memory-mapped (:func:`open_product`), and a region wider than the requested
``size`` is read from a level block-averaged by a power of two (2, 4, 8, ...; each level
built once from the one below and kept with the open product), so a 4608² product never
ships its 85 MB: the browser asks for the visible region at the screen's resolution on every
zoom and pan. The display limits are percentiles of the whole image
(:func:`display_limits`, cached per product and percentile pair), never of one region, so
neighbouring regions match. Scaling is :mod:`astropy.visualization`
(:class:`~astropy.visualization.ImageNormalize`,
:class:`~astropy.visualization.AsymmetricPercentileInterval` and the stretches of
:data:`STRETCHES`).

Coordinates: pixel indices are 0-based, FITS row 0 at the bottom (``data[y, x]``), pixel
``i`` covers ``[i - 0.5, i + 0.5]`` (astropy's convention). World coordinates are
helioprojective Tx/Ty [arcsec] of the product's own observer (``HGLN_OBS``, ``HGLT_OBS``,
``DSUN_OBS``) at its DATE-OBS, through ``sunpy.map.Map`` (which places the Sun from those
keywords) and its WCS. The browser draws the image on linear arcsec axes
(:func:`wcs_description` gives the affine pixel -> arcsec map); the TAN projection departs
from it by < 0.2 arcsec within 2.5 Rsun (tan(0.67 deg) - 0.67 deg in radians), far below
one pixel of any LST channel.

Events (:func:`event_overlay`; :func:`backend.services.imaging.frame_overlays` picks those
of a frame's time window): point events (flares, any event with ``hpc_x``/``hpc_y`` or
Stonyhurst ``hgs_lat``/``hgs_lon``) are rotated from their own time (peak, else start) to the
frame's DATE-OBS with :func:`sunpy.coordinates.propagate_with_solar_surface` (Howard et al.
1990 differential rotation, sunpy's default); catalogue helioprojective positions are as seen
from Earth. CMEs (``position_angle`` with ``angular_width``, degrees counter-clockwise from
solar north) are wedges from the limb outwards (full-disk channels) or over the coronagraph's
field, 1.1-2.5 Rsun (SCI, LST.md).

Every bad parameter raises :class:`ViewerParamError`, a :class:`~pipelines.errors.DataError`
(the API answers 422 with its message).
"""

from __future__ import annotations

import datetime as dt
import io
import math
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits

import sunpy.coordinates  # noqa: F401 - 0.3 s; the helioprojective frames (sunpy.map is not imported: seconds)

from pipelines.calibration import DQ
from pipelines.channels import get_channel
from pipelines.errors import DataError, FitsReadError
from pipelines.utc import as_utc

__all__ = [
    "ViewerParamError",
    "STRETCHES",
    "DEFAULT_PERCENTILES",
    "MAX_REGION_SIZE",
    "DEFAULT_REGION_SIZE",
    "GRID_STEP_DEG",
    "CME_FIELD_RSUN",
    "DQ_COLOURS",
    "ProductImage",
    "RegionImage",
    "open_product",
    "display_limits",
    "render_region",
    "render_dq",
    "wcs_description",
    "pixel_info",
    "event_overlay",
    "wcs_extent",
    "hpc_affine",
    "default_cmap",
]


class ViewerParamError(DataError):
    """A viewer request the product cannot answer: unknown stretch, ``pmin >= pmax``, a
    region outside the image, ... (the API answers 422)."""


# -- constants -----------------------------------------------------------------------------

#: The stretches offered, by name: :mod:`astropy.visualization` classes. ``log`` with
#: ``a = 1000`` and ``asinh`` with ``a = 0.1`` are astropy's defaults.
STRETCHES = ("linear", "sqrt", "log", "asinh")

#: Default percentile limits per channel kind: those of the quicklook
#: (:func:`pipelines.products.quicklook_image`): disk imagers 0.5-99.9, coronagraph 1-99.5.
DEFAULT_PERCENTILES = {"disk": (0.5, 99.9), "coronagraph": (1.0, 99.5)}

#: Default stretch per channel (as the quicklook): SDI asinh, WST linear, SCI log.
_DEFAULT_STRETCH = {"SDI": "asinh", "WST": "linear", "SCI-UV": "log", "SCI-WL": "log"}

#: Colour maps per channel (as the quicklook, :data:`pipelines.products._CMAPS`).
_CMAPS = {"SDI": "inferno", "WST": "gray", "SCI-UV": "viridis", "SCI-WL": "bone"}

#: Largest side of a region PNG [pixel]: a 4K screen's width.
MAX_REGION_SIZE = 4096
#: Side of a region PNG when the request does not say [pixel].
DEFAULT_REGION_SIZE = 1024

#: Spacing of the Stonyhurst grid [deg] and the step along each grid line [deg].
GRID_STEP_DEG = 15.0
_GRID_SAMPLE_DEG = 2.0

#: Radial extent of a CME wedge on the coronagraph's frames [Rsun]: SCI's field, 1.1-2.5 Rsun (LST.md).
CME_FIELD_RSUN = (1.1, 2.5)

#: Display colour (RGBA) of each DQ bit in the mask layer; a pixel with several bits takes
#: the colour of its lowest bit.
DQ_COLOURS: dict[DQ, tuple[int, int, int, int]] = {
    DQ.SATURATED: (255, 0, 0, 200),
    DQ.NOT_FINITE: (255, 0, 255, 200),
    DQ.OCCULTED: (0, 128, 255, 110),
    DQ.OUTSIDE_FOV: (0, 200, 255, 90),
    DQ.NO_DATA: (128, 128, 128, 110),
    DQ.BAD_PIXEL: (255, 255, 0, 220),
    DQ.COSMIC_RAY: (0, 255, 0, 220),
}

#: Pixels sampled (about) for the whole-image percentile limits: the image is strided to
#: at least this many good pixels, so limits cost the same on a 4608² and a 512² product.
_LIMIT_SAMPLES = 1_000_000

#: Products kept open (memory maps and pyramid levels), least recently used dropped.
_OPEN_CACHE_SIZE = 4


def default_cmap(channel: str) -> str:
    """The channel's colour map name (matplotlib), as the quicklook uses."""
    return _CMAPS.get(get_channel(channel).code, "gray")


# -- the open product ------------------------------------------------------------------------


@dataclass
class FrameGeometry:
    """Where a frame looks, as sunpy's ``GenericMap`` says it (the same names), read from
    the header with astropy's WCS and sunpy's coordinate frames alone (``sunpy.map`` takes
    seconds to import, more than the API's deadline of a first request).

    Attributes
    ----------
    wcs : astropy.wcs.WCS
        The 2-D celestial WCS; ``world_to_pixel``/``pixel_to_world`` take and give
        helioprojective ``SkyCoord`` (sunpy registers the HPLN/HPLT frame with astropy).
    coordinate_frame : sunpy.coordinates.Helioprojective
        Observer from ``HGLN_OBS``/``HGLT_OBS``/``DSUN_OBS``, ``obstime`` the reference date.
    reference_date : astropy.time.Time
        ``DATE-AVG`` when given, else ``DATE-OBS`` (sunpy's ``reference_date`` rule): the
        time of the coordinates.
    date : astropy.time.Time
        ``DATE-OBS``.
    rsun_obs : astropy.units.Quantity
        Apparent solar radius [arcsec] (:func:`pipelines.sun.apparent_rsun_arcsec`).
    rsun_meters : astropy.units.Quantity
        ``RSUN_REF`` [m] (default :data:`pipelines.sun.RSUN_REF_M`, IAU 2015 nominal).
    """

    wcs: Any
    coordinate_frame: Any
    reference_date: Any
    date: Any
    rsun_obs: Any
    rsun_meters: Any

    @property
    def observer_coordinate(self):
        return self.coordinate_frame.observer

    def pixel_to_world(self, x, y):
        """Helioprojective ``SkyCoord`` of 0-based pixels (plain numbers or ``u.pix``)."""
        import astropy.units as u

        from astropy.coordinates import SkyCoord

        xv = x.to_value(u.pix) if hasattr(x, "unit") else x
        yv = y.to_value(u.pix) if hasattr(y, "unit") else y
        lon, lat = self.wcs.pixel_to_world_values(xv, yv)  # deg (wcslib normalises the units)
        return SkyCoord(lon * u.deg, lat * u.deg, frame=self.coordinate_frame)

    def world_to_pixel(self, tx_arcsec, ty_arcsec) -> tuple[np.ndarray, np.ndarray]:
        """0-based pixel of helioprojective Tx, Ty [arcsec] in this frame."""
        x, y = self.wcs.world_to_pixel_values(np.asarray(tx_arcsec) / 3600.0, np.asarray(ty_arcsec) / 3600.0)
        return np.asarray(x), np.asarray(y)

    @classmethod
    def from_header(cls, header: fits.Header) -> "FrameGeometry":
        """Raises :class:`ViewerParamError` when the header has no helioprojective WCS or observer."""
        import astropy.units as u
        import sunpy.coordinates  # noqa: F401 - registers the helioprojective frame with astropy.wcs
        from astropy.time import Time
        from astropy.wcs import WCS
        from astropy.wcs.utils import wcs_to_celestial_frame
        from sunpy.coordinates import Helioprojective

        from pipelines.sun import RSUN_REF_M, apparent_rsun_arcsec

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                w = WCS(header, naxis=2)
                hpc = wcs_to_celestial_frame(w)
        except Exception as exc:  # noqa: BLE001 - any WCS the libraries reject is bad input
            raise ViewerParamError(f"the product has no usable helioprojective WCS ({exc})") from None
        if not isinstance(hpc, Helioprojective):
            raise ViewerParamError(f"the product's WCS is not helioprojective ({type(hpc).__name__})")
        date_obs = Time(str(header.get("DATE-OBS") or header.get("DATE_OBS")).strip(), scale="utc")
        ref = Time(str(header["DATE-AVG"]).strip(), scale="utc") if str(header.get("DATE-AVG", "")).strip() \
            else date_obs
        rsun_m = float(header.get("RSUN_REF", RSUN_REF_M)) * u.m
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            observer = hpc.observer
            if observer is None or isinstance(observer, str):  # no observer keywords: Earth at DATE-OBS
                from sunpy.coordinates import get_earth

                observer = get_earth(ref)
            frame = Helioprojective(obstime=ref, observer=observer, rsun=rsun_m)
        rsun = apparent_rsun_arcsec(header, keys=("RSUN_OBS", "RSUN_ARC", "RSUN"), when=ref.to_datetime()) * u.arcsec
        return cls(wcs=w, coordinate_frame=frame, reference_date=ref, date=date_obs, rsun_obs=rsun,
                   rsun_meters=rsun_m)


@dataclass
class ProductImage:
    """An L2 product open for viewing.

    Attributes
    ----------
    path : str
    data : numpy.ndarray, shape (ny, nx), float32
        The image in ``bunit``, memory-mapped (not read into memory).
    dq : numpy.ndarray, shape (ny, nx), uint8
        Data-quality bits (0 = good), memory-mapped.
    header : astropy.io.fits.Header
    channel : str
        Canonical LST channel code from ``CHANNEL``/``DETECTOR`` (``SDI`` when neither says).
    """

    path: str
    data: np.ndarray
    dq: np.ndarray
    header: fits.Header
    channel: str
    _hdul: Any = None
    _levels: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _limits: dict[tuple[float, float], tuple[float, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _map: Any = None
    _description: dict[str, Any] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.data.shape[0]), int(self.data.shape[1])

    @property
    def bunit(self) -> str:
        from pipelines.units import display_unit

        return display_unit(self.header)  # 'MSB' for SCI (BUNITNAM; BUNIT is dimensionless)

    @property
    def smap(self) -> "FrameGeometry":
        """The frame's geometry (WCS, observer, DATE-OBS, Rsun; :class:`FrameGeometry`)."""
        with self._lock:
            if self._map is None:
                self._map = FrameGeometry.from_header(self.header)
            return self._map

    def level(self, factor: int) -> tuple[np.ndarray, np.ndarray]:
        """The image and DQ block-reduced by ``factor`` (a power of two; 1: the file's own).

        The image is the mean of the finite pixels of each block (NaN where none), the DQ
        the OR of the block's bits. Level ``2f`` is built from level ``f`` once and kept.

        Returns
        -------
        data : numpy.ndarray, shape (ceil(ny / factor), ceil(nx / factor)), float32
        dq : numpy.ndarray, same shape, uint8
        """
        if factor <= 1:
            return self.data, self.dq
        if factor & (factor - 1):
            raise ValueError(f"pyramid factor {factor} is not a power of two")
        with self._lock:
            if factor in self._levels:
                return self._levels[factor]
        below_data, below_dq = self.level(factor // 2)
        built = _halve(below_data, below_dq)
        with self._lock:
            self._levels.setdefault(factor, built)
            return self._levels[factor]

    def close(self) -> None:
        if self._hdul is not None:
            self._hdul.close()


def _halve(data: np.ndarray, dq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 block mean of the finite pixels (NaN where none) and OR of the DQ bits; an odd
    last row or column is its own (half-filled) block.

    Four strided views summed (one pass over the level, no 4-D reduction: a 4608² level
    halves in about a tenth of a second)."""
    ny, nx = data.shape
    py, px = ny % 2, nx % 2
    a = np.asarray(data, dtype=np.float32)  # native byte order (the file is big-endian)
    q = np.asarray(dq, dtype=np.uint8)
    if py or px:
        a = np.pad(a, ((0, py), (0, px)), constant_values=np.nan)
        q = np.pad(q, ((0, py), (0, px)))
    finite = np.isfinite(a)
    a = np.where(finite, a, np.float32(0))
    total = a[0::2, 0::2] + a[1::2, 0::2]
    total += a[0::2, 1::2]
    total += a[1::2, 1::2]
    f8 = finite.view(np.uint8)
    count = f8[0::2, 0::2] + f8[1::2, 0::2]
    count += f8[0::2, 1::2]
    count += f8[1::2, 1::2]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count.astype(np.float32)  # NaN where no finite pixel (0 / 0)
    dq_out = q[0::2, 0::2] | q[1::2, 0::2]
    dq_out |= q[0::2, 1::2]
    dq_out |= q[1::2, 1::2]
    return mean.astype(np.float32, copy=False), dq_out


_OPEN: OrderedDict[tuple[str, int, int], ProductImage] = OrderedDict()
_OPEN_LOCK = threading.Lock()


def _channel_of(header: fits.Header) -> str:
    for key in ("CHANNEL", "DETECTOR"):
        value = str(header.get(key, "")).strip()
        if value:
            try:
                return get_channel(value).code
            except KeyError:
                continue
    return "SDI"


def open_product(path: str | os.PathLike, channel: str | None = None) -> ProductImage:
    """Open an L2 product FITS memory-mapped, or return it from the cache of open products.

    Parameters
    ----------
    path : path-like
        An L2 product (:func:`pipelines.products.build_product_hdul` layout: image in the
        first 2-D HDU not named ``DQ``; ``DQ`` a one-row table column or an image HDU).
    channel : str, optional
        The product's channel (its frame's); default from the header's ``CHANNEL`` or
        ``DETECTOR`` (``SDI`` when neither says).

    Returns
    -------
    ProductImage
        Cached per (path, modification time, size): a rewritten file is opened afresh.

    Raises
    ------
    FitsReadError
        If the file is missing or not a readable L2 product (the message names the file,
        not its folder).
    """
    p = Path(path)
    name = p.name
    try:
        st = p.stat()
    except OSError:
        raise FitsReadError(f"{name}: no such product file") from None
    key = (str(p), st.st_mtime_ns, st.st_size)
    with _OPEN_LOCK:
        if key in _OPEN:
            _OPEN.move_to_end(key)
            img = _OPEN[key]
            if channel is not None:
                img.channel = get_channel(channel).code
            return img
    try:
        hdul = fits.open(p, memmap=True, lazy_load_hdus=False)
        hdu = next((h for h in hdul if h.name != "DQ" and h.is_image and h.header.get("NAXIS", 0) == 2), None)
        if hdu is None or hdu.data is None:
            hdul.close()
            raise FitsReadError(f"{name}: no 2-D image HDU")
        data = hdu.data
        if "DQ" in hdul:
            dq_hdu = hdul["DQ"]
            dq = dq_hdu.data["DQ"][0] if isinstance(dq_hdu, fits.BinTableHDU) else dq_hdu.data
        else:
            dq = np.zeros(data.shape, np.uint8)
        if dq.shape != data.shape:
            hdul.close()
            raise FitsReadError(f"{name}: DQ shape {dq.shape} differs from image shape {data.shape}")
        header = hdu.header.copy()
    except FitsReadError:
        raise
    except (OSError, KeyError, TypeError, ValueError, IndexError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FitsReadError(f"{name}: unreadable product FITS ({reason})") from None
    code = get_channel(channel).code if channel is not None else _channel_of(header)
    img = ProductImage(path=str(p), data=data, dq=dq, header=header, channel=code, _hdul=hdul)
    with _OPEN_LOCK:
        _OPEN[key] = img
        while len(_OPEN) > _OPEN_CACHE_SIZE:
            _OPEN.popitem(last=False)  # its memory maps close when the last reference goes
    return img


# -- scaling --------------------------------------------------------------------------------


def _check_scaling(stretch: str, pmin: float, pmax: float) -> None:
    if stretch not in STRETCHES:
        raise ViewerParamError(f"unknown stretch {stretch!r}; expected one of {', '.join(STRETCHES)}")
    for name, v in (("pmin", pmin), ("pmax", pmax)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 100.0):
            raise ViewerParamError(f"{name} must be a percentile between 0 and 100, got {v!r}")
    if pmin >= pmax:
        raise ViewerParamError(f"pmin ({pmin:g}) must be below pmax ({pmax:g})")


def default_scaling(channel: str) -> dict[str, Any]:
    """The channel's default ``stretch``, ``pmin``, ``pmax`` and ``cmap`` (those of the quicklook)."""
    spec = get_channel(channel)
    pmin, pmax = DEFAULT_PERCENTILES["coronagraph" if spec.is_coronagraph else "disk"]
    return {"stretch": _DEFAULT_STRETCH.get(spec.code, "linear"), "pmin": pmin, "pmax": pmax,
            "cmap": default_cmap(spec.code)}


#: Percentile pairs whose limits are kept per open product (the viewer's defaults and a few
#: the user tried); an older pair is computed again when asked.
_LIMITS_KEPT = 16


def display_limits(img: ProductImage, pmin: float, pmax: float) -> tuple[float, float]:
    """Display limits [``bunit``]: the ``pmin`` and ``pmax`` percentiles of the good pixels
    (finite, DQ 0; all finite pixels when none is good) of the whole image.

    The image is strided to about :data:`_LIMIT_SAMPLES` pixels first (every ``s``-th pixel
    in both axes), so a 4608² product costs as much as a 1024² one; the result is cached
    with the open product.

    Raises
    ------
    ViewerParamError
        If the percentiles are not 0 <= pmin < pmax <= 100.
    """
    from astropy.visualization import AsymmetricPercentileInterval

    _check_scaling("linear", pmin, pmax)
    key = (float(pmin), float(pmax))
    with img._lock:
        if key in img._limits:
            return img._limits[key]
    ny, nx = img.shape
    s = max(1, int(math.floor(math.sqrt(ny * nx / _LIMIT_SAMPLES))))
    a = np.asarray(img.data[::s, ::s], dtype=np.float64)
    good = np.isfinite(a) & (np.asarray(img.dq[::s, ::s]) == 0)
    vals = a[good] if good.any() else a[np.isfinite(a)]
    if vals.size == 0:
        lo, hi = 0.0, 1.0
    else:
        lo, hi = (float(v) for v in AsymmetricPercentileInterval(pmin, pmax).get_limits(vals))
        if not hi > lo:
            hi = lo + max(abs(lo) * 1e-6, 1e-30)
    with img._lock:
        while len(img._limits) >= _LIMITS_KEPT:  # any float pair may be asked: keep the newest few
            img._limits.pop(next(iter(img._limits)))
        img._limits[key] = (lo, hi)
    return lo, hi


def _stretch(name: str):
    from astropy.visualization import AsinhStretch, LinearStretch, LogStretch, SqrtStretch

    return {"linear": LinearStretch, "sqrt": SqrtStretch, "log": LogStretch, "asinh": AsinhStretch}[name]()


def _cmap(name: str):
    from matplotlib import colormaps

    try:
        return colormaps[name]
    except KeyError:
        raise ViewerParamError(f"unknown colour map {name!r} (a matplotlib colour map name, e.g. gray, "
                               "inferno, viridis)") from None


def _png(rgba: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


#: Levels of the stretch table: the input to the stretch is quantised to 1/65535 of the
#: display range (LogStretch's steepest slope, a/ln(a+1) = 145 at 0, turns that into 0.6 of
#: one of the PNG's 256 levels).
_LUT_STEPS = 65536
_LUTS: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()


#: Palette index of the transparent (non-finite) pixels of a region PNG; the colour map
#: takes the other 255 entries.
_TRANSPARENT = 255


def _colour_lut(stretch: str, cmap_name: str, cm) -> tuple[np.ndarray, np.ndarray]:
    """The palette of a region PNG and the palette index of each of :data:`_LUT_STEPS`
    levels of the display range: astropy's :class:`~astropy.visualization.ImageNormalize`
    (limits 0 and 1, the stretch, clipped) of the level, on the colour map resampled to 255
    colours. Cached per (stretch, colour map).

    Returns
    -------
    index : numpy.ndarray, shape (_LUT_STEPS,), uint8
    palette : numpy.ndarray, shape (256, 3), uint8
        Entry :data:`_TRANSPARENT` is for the transparent pixels.
    """
    from astropy.visualization import ImageNormalize

    key = (stretch, cmap_name)
    with _OPEN_LOCK:
        if key in _LUTS:
            return _LUTS[key]
    levels = np.linspace(0.0, 1.0, _LUT_STEPS)
    norm = ImageNormalize(vmin=0.0, vmax=1.0, stretch=_stretch(stretch), clip=True)
    index = np.rint(np.asarray(norm(levels), dtype=np.float64) * (_TRANSPARENT - 1)).astype(np.uint8)
    palette = np.zeros((256, 3), np.uint8)
    palette[:_TRANSPARENT] = cm.resampled(_TRANSPARENT)(np.arange(_TRANSPARENT), bytes=True)[:, :3]
    out = (index, palette)
    with _OPEN_LOCK:
        _LUTS[key] = out
        while len(_LUTS) > 16:
            _LUTS.popitem(last=False)
    return out


def _png_palette(index: np.ndarray, palette: np.ndarray) -> bytes:
    """A palette PNG (one byte a pixel: a quarter of RGBA's bytes to compress) whose entry
    :data:`_TRANSPARENT` is fully transparent."""
    from PIL import Image

    im = Image.fromarray(np.ascontiguousarray(index), mode="P")
    im.putpalette(palette.ravel().tolist())
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1, transparency=_TRANSPARENT)
    return buf.getvalue()


# -- regions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionImage:
    """A rendered region.

    Attributes
    ----------
    png : bytes
        RGBA PNG, north up (its first row is the region's top, ``y1 - 1``).
    x0, x1, y0, y1 : int
        The pixel region actually covered (0-based, end exclusive): the request widened to
        whole blocks of ``factor`` (and clipped to the image).
    factor : int
        Image pixels per PNG pixel along each axis (a power of two).
    width, height : int
        PNG size [pixel].
    vmin, vmax : float
        Display limits [``bunit``] (NaN for the DQ layer).
    """

    png: bytes
    x0: int
    x1: int
    y0: int
    y1: int
    factor: int
    width: int
    height: int
    vmin: float = float("nan")
    vmax: float = float("nan")

    def headers(self) -> dict[str, str]:
        """HTTP headers that say what the PNG covers (``X-Region``: ``x0,x1,y0,y1``)."""
        h = {"X-Region": f"{self.x0},{self.x1},{self.y0},{self.y1}", "X-Decimation": str(self.factor)}
        if math.isfinite(self.vmin):
            h["X-Display-Limits"] = f"{self.vmin:.7g},{self.vmax:.7g}"
        return h


def _region(img: ProductImage, x0: int | None, x1: int | None, y0: int | None, y1: int | None,
            size: int) -> tuple[int, int, int, int, int]:
    """Check and snap a region: (x0, x1, y0, y1, factor) on whole blocks of ``factor``."""
    ny, nx = img.shape
    if not (isinstance(size, int) and 16 <= size <= MAX_REGION_SIZE):
        raise ViewerParamError(f"size must be an integer from 16 to {MAX_REGION_SIZE} pixels, got {size!r}")
    x0 = 0 if x0 is None else x0
    y0 = 0 if y0 is None else y0
    x1 = nx if x1 is None else x1
    y1 = ny if y1 is None else y1
    for name, v in (("x0", x0), ("x1", x1), ("y0", y0), ("y1", y1)):
        if not isinstance(v, int):
            raise ViewerParamError(f"{name} must be an integer pixel index, got {v!r}")
    if x0 >= x1 or y0 >= y1:
        raise ViewerParamError(f"empty region: x0 < x1 and y0 < y1 are needed, got x {x0}..{x1}, y {y0}..{y1}")
    if x1 <= 0 or y1 <= 0 or x0 >= nx or y0 >= ny:
        raise ViewerParamError(f"region x {x0}..{x1}, y {y0}..{y1} lies outside the image "
                               f"(x 0..{nx}, y 0..{ny}, 0-based, end exclusive)")
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(nx, x1), min(ny, y1)
    need = max(x1 - x0, y1 - y0) / size
    factor = 1 if need <= 1 else 1 << int(math.ceil(math.log2(need)))
    # whole blocks of the level; a region off the block grid may need one block more than
    # fits: that block is left out (X-Region says what is covered, at most factor - 1 pixels less)
    sx0, sy0 = (x0 // factor) * factor, (y0 // factor) * factor
    sx1 = min(nx, -(-x1 // factor) * factor, sx0 + size * factor)
    sy1 = min(ny, -(-y1 // factor) * factor, sy0 + size * factor)
    return sx0, sx1, sy0, sy1, factor


def _level_slice(img: ProductImage, x0: int, x1: int, y0: int, y1: int, factor: int):
    data, dq = img.level(factor)
    sl = (slice(y0 // factor, -(-y1 // factor)), slice(x0 // factor, -(-x1 // factor)))
    return np.asarray(data[sl], dtype=np.float32), np.asarray(dq[sl], dtype=np.uint8)


def render_region(img: ProductImage, *, x0: int | None = None, x1: int | None = None, y0: int | None = None,
                  y1: int | None = None, size: int = DEFAULT_REGION_SIZE, stretch: str | None = None,
                  pmin: float | None = None, pmax: float | None = None, cmap: str | None = None) -> RegionImage:
    """A pixel region of the product as a PNG of at most ``size`` pixels a side.

    Parameters
    ----------
    img : ProductImage
    x0, x1, y0, y1 : int, optional
        Pixel region, 0-based, end exclusive (default: the whole image); clipped to the
        image, then widened to whole blocks of the pyramid level used (a region off the
        block grid that would need ``size + 1`` blocks loses its last one).
    size : int
        Largest side of the PNG [pixel], 16 to :data:`MAX_REGION_SIZE`. The level is the
        smallest power-of-two reduction that fits the region in it.
    stretch : str, optional
        One of :data:`STRETCHES` (default: the channel's, :func:`default_scaling`).
    pmin, pmax : float, optional
        Percentiles [0-100] of the whole image's good pixels mapped to the ends of the
        colour map (:func:`display_limits`).
    cmap : str, optional
        A matplotlib colour map (default: the channel's).

    Returns
    -------
    RegionImage
        Non-finite pixels are transparent.

    Raises
    ------
    ViewerParamError
        Unknown stretch or colour map, percentiles not 0 <= pmin < pmax <= 100, a region
        empty or outside the image, a size out of range.
    """
    d = default_scaling(img.channel)
    stretch = d["stretch"] if stretch is None else stretch
    pmin = d["pmin"] if pmin is None else pmin
    pmax = d["pmax"] if pmax is None else pmax
    _check_scaling(stretch, pmin, pmax)
    cm = _cmap(d["cmap"] if cmap is None else cmap)
    x0, x1, y0, y1, factor = _region(img, x0, x1, y0, y1, size)
    vmin, vmax = display_limits(img, pmin, pmax)
    a, _ = _level_slice(img, x0, x1, y0, y1, factor)
    index, palette = _colour_lut(stretch, cm.name, cm)
    # the linear part of ImageNormalize ((v - vmin) / (vmax - vmin), clipped) in float32 to
    # one of _LUT_STEPS levels; the stretch and colour map are applied through the table
    span = np.float32(vmax - vmin)
    with np.errstate(invalid="ignore"):
        lev = (a - np.float32(vmin)) * np.float32((_LUT_STEPS - 1) / span)
        np.clip(lev, 0, _LUT_STEPS - 1, out=lev)
    finite = np.isfinite(lev)
    lev = np.where(finite, lev + np.float32(0.5), np.float32(0)).astype(np.uint16)
    pix = index[lev]
    pix[~finite] = _TRANSPARENT
    png = _png_palette(pix[::-1], palette)
    return RegionImage(png=png, x0=x0, x1=x1, y0=y0, y1=y1, factor=factor, width=a.shape[1], height=a.shape[0],
                       vmin=vmin, vmax=vmax)


def parse_dq_bits(bits: str | None) -> int:
    """A DQ bit selection: ``None``/``''``/``all`` (every bit), names (``SATURATED,COSMIC_RAY``)
    or numbers (``1,64``) separated by commas, or one integer mask (``97``).

    Raises
    ------
    ViewerParamError
        For an unknown bit name or a number that is not a DQ bit.
    """
    every = 0
    for b in DQ:
        every |= int(b)
    if bits is None or bits.strip().lower() in ("", "all"):
        return every
    mask = 0
    for part in bits.split(","):
        token = part.strip()
        if not token:
            continue
        if (token.isascii() and token.isdigit()):
            value = int(token)
            if value <= 0 or value & ~every:
                raise ViewerParamError(f"DQ bits {token!r}: not a combination of the DQ bits "
                                       f"({', '.join(f'{int(b)} {b.name}' for b in DQ)})")
            mask |= value
        else:
            try:
                mask |= int(DQ[token.upper()])
            except KeyError:
                raise ViewerParamError(f"unknown DQ bit {token!r}; expected names among "
                                       f"{', '.join(b.name for b in DQ)} or their values") from None
    if mask == 0:
        raise ViewerParamError("no DQ bit selected")
    return mask


def render_dq(img: ProductImage, *, x0: int | None = None, x1: int | None = None, y0: int | None = None,
              y1: int | None = None, size: int = DEFAULT_REGION_SIZE, bits: str | None = None) -> RegionImage:
    """The DQ mask of a region as a transparent PNG: pixels with any of ``bits`` set in the
    colour of their lowest such bit (:data:`DQ_COLOURS`), the others fully transparent.

    A reduced level ORs the bits of each block, so a flagged pixel stays visible when
    zoomed out. Parameters and errors as :func:`render_region`; ``bits`` as
    :func:`parse_dq_bits`.
    """
    mask = parse_dq_bits(bits)
    x0, x1, y0, y1, factor = _region(img, x0, x1, y0, y1, size)
    _, q = _level_slice(img, x0, x1, y0, y1, factor)
    q = q & np.uint8(mask)
    rgba = np.zeros(q.shape + (4,), np.uint8)
    for bit in sorted(DQ, key=int, reverse=True):  # lowest bit painted last: it wins
        if int(bit) & mask:
            rgba[(q & np.uint8(int(bit))) != 0] = DQ_COLOURS[bit]
    return RegionImage(png=_png(np.ascontiguousarray(rgba[::-1])), x0=x0, x1=x1, y0=y0, y1=y1, factor=factor,
                       width=q.shape[1], height=q.shape[0])


# -- WCS, limb, grid ------------------------------------------------------------------------


def hpc_affine(img: ProductImage) -> dict[str, float]:
    """The linear pixel -> helioprojective map at the reference pixel [arcsec]:
    ``Tx = tx0 + m11 x + m12 y``, ``Ty = ty0 + m21 x + m22 y`` (0-based pixels)."""
    w = img.smap.wcs
    m = np.asarray(w.pixel_scale_matrix, dtype=float) * 3600.0  # deg -> arcsec (wcslib works in deg)
    crpix = np.asarray(w.wcs.crpix, dtype=float) - 1.0  # 0-based
    crval = np.asarray(w.wcs.crval, dtype=float)
    units = [str(u) for u in w.wcs.cunit]
    crval = crval * np.array([3600.0 if u == "deg" else 1.0 for u in units])
    tx0 = crval[0] - (m[0, 0] * crpix[0] + m[0, 1] * crpix[1])
    ty0 = crval[1] - (m[1, 0] * crpix[0] + m[1, 1] * crpix[1])
    return {"tx0": float(tx0), "ty0": float(ty0), "m11": float(m[0, 0]), "m12": float(m[0, 1]),
            "m21": float(m[1, 0]), "m22": float(m[1, 1])}


def _hpc_frame(img: ProductImage):
    m = img.smap
    from sunpy.coordinates import Helioprojective

    return Helioprojective(obstime=m.reference_date, observer=m.observer_coordinate, rsun=m.rsun_meters)


def _polyline(coords) -> tuple[list[float | None], list[float | None]]:
    """Tx, Ty [arcsec] of helioprojective coordinates, ``None`` where a point is hidden
    behind the Sun (Plotly breaks the line there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        visible = np.asarray(coords.is_visible(), dtype=bool)
        tx = coords.Tx.to_value("arcsec")
        ty = coords.Ty.to_value("arcsec")
    xs: list[float | None] = []
    ys: list[float | None] = []
    for x, y, v in zip(np.ravel(tx), np.ravel(ty), np.ravel(visible)):
        if v and math.isfinite(x) and math.isfinite(y):
            xs.append(round(float(x), 2))
            ys.append(round(float(y), 2))
        elif xs and xs[-1] is not None:
            xs.append(None)
            ys.append(None)
    while xs and xs[-1] is None:
        xs.pop()
        ys.pop()
    return xs, ys


def wcs_description(img: ProductImage) -> dict[str, Any]:
    """What the browser needs to draw the product on helioprojective axes.

    Returns
    -------
    dict
        ``shape`` [ny, nx]; ``channel``; ``bunit``; ``date_obs`` (ISO UTC);
        ``observer`` (Stonyhurst ``lon_deg``, ``lat_deg``, ``distance_m``); ``rsun_arcsec``;
        ``affine`` (0-based pixel -> arcsec, :func:`hpc_affine`); ``north_up`` (no rotation
        term: the image is drawn axis-aligned exactly); ``extent`` (``tx`` and ``ty`` of the
        outer pixel edges [arcsec]); ``limb`` (``x``, ``y`` [arcsec], closed);
        ``grid`` (``lat`` and ``lon`` lines every :data:`GRID_STEP_DEG` degrees, each
        ``{"value": deg, "x": [...], "y": [...]}`` with ``None`` where the line passes
        behind the Sun: only the visible hemisphere is drawn); ``defaults`` (stretch,
        percentiles, cmap); ``dq_bits`` (value, name, colour). Cached with the open product.
    """
    if img._description is not None:
        return img._description
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from sunpy.coordinates import HeliographicStonyhurst
    from sunpy.coordinates.utils import get_limb_coordinates

    m = img.smap
    ny, nx = img.shape
    aff = hpc_affine(img)
    obs = m.observer_coordinate
    frame = _hpc_frame(img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        limb = get_limb_coordinates(obs, rsun=m.rsun_meters, resolution=361).transform_to(frame)
    lx = [round(float(v), 2) for v in limb.Tx.to_value("arcsec")]
    ly = [round(float(v), 2) for v in limb.Ty.to_value("arcsec")]
    lx.append(lx[0])
    ly.append(ly[0])
    hgs = HeliographicStonyhurst(obstime=m.reference_date)
    grid: dict[str, list[dict[str, Any]]] = {"lat": [], "lon": []}
    samples = np.arange(-180.0, 180.0 + 1e-9, _GRID_SAMPLE_DEG)
    lat_samples = np.arange(-90.0, 90.0 + 1e-9, _GRID_SAMPLE_DEG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lat in np.arange(-90.0 + GRID_STEP_DEG, 90.0, GRID_STEP_DEG):
            c = SkyCoord(samples * u.deg, np.full(samples.shape, lat) * u.deg, m.rsun_meters, frame=hgs)
            x, y = _polyline(c.transform_to(frame))
            if x:
                grid["lat"].append({"value": float(lat), "x": x, "y": y})
        for lon in np.arange(-180.0, 180.0, GRID_STEP_DEG):
            c = SkyCoord(np.full(lat_samples.shape, lon) * u.deg, lat_samples * u.deg, m.rsun_meters, frame=hgs)
            x, y = _polyline(c.transform_to(frame))
            if x:
                grid["lon"].append({"value": float(lon), "x": x, "y": y})
    edges_x = [aff["tx0"] + aff["m11"] * (-0.5), aff["tx0"] + aff["m11"] * (nx - 0.5)]
    edges_y = [aff["ty0"] + aff["m22"] * (-0.5), aff["ty0"] + aff["m22"] * (ny - 0.5)]
    img._description = {
        "shape": [ny, nx],
        "channel": img.channel,
        "bunit": img.bunit,
        "date_obs": m.date.utc.isot,
        "observer": {"frame": "heliographic_stonyhurst", "lon_deg": float(obs.lon.to_value("deg")),
                     "lat_deg": float(obs.lat.to_value("deg")), "distance_m": float(obs.radius.to_value("m"))},
        "rsun_arcsec": float(m.rsun_obs.to_value("arcsec")),
        "affine": aff,
        "north_up": abs(aff["m12"]) < 1e-9 * abs(aff["m11"]) and abs(aff["m21"]) < 1e-9 * abs(aff["m22"]),
        "extent": {"tx": edges_x, "ty": edges_y},
        "limb": {"x": lx, "y": ly},
        "grid": grid,
        "grid_step_deg": GRID_STEP_DEG,
        "defaults": default_scaling(img.channel),
        "stretches": list(STRETCHES),
        "dq_bits": [{"value": int(b), "name": b.name, "colour": "rgba({},{},{},{:.2f})".format(*c[:3], c[3] / 255)}
                    for b, c in DQ_COLOURS.items()],
    }
    return img._description


def pixel_info(img: ProductImage, *, x: float | None = None, y: float | None = None, tx: float | None = None,
               ty: float | None = None) -> dict[str, Any]:
    """The pixel under the cursor, given by pixel (``x``, ``y``, 0-based) or helioprojective
    position (``tx``, ``ty`` [arcsec]).

    Returns
    -------
    dict
        ``x``, ``y`` (the pixel's integer indices), ``value`` (in ``bunit``; ``None`` for a
        NaN), ``bunit``, ``dq`` (the bits' integer) and ``dq_flags`` (their names),
        ``tx``, ``ty`` [arcsec] of the pixel centre, ``r_rsun`` (distance from disk centre
        [Rsun]), ``on_disk``, and ``hgs_lat``, ``hgs_lon`` [deg] (Stonyhurst) when on disk
        (``None`` off the disk).

    Raises
    ------
    ViewerParamError
        Neither or both of the pixel and world positions given, a non-finite value, or a
        position outside the image.
    """
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from sunpy.coordinates import HeliographicStonyhurst

    given_px, given_w = x is not None or y is not None, tx is not None or ty is not None
    if given_px == given_w:
        raise ViewerParamError("give the pixel either as x and y (0-based pixel) or as tx and ty (arcsec)")
    pair = (x, y) if given_px else (tx, ty)
    if any(v is None or not math.isfinite(v) for v in pair):
        names = "x and y" if given_px else "tx and ty"
        raise ViewerParamError(f"{names} must both be finite numbers, got {pair!r}")
    m = img.smap
    frame = _hpc_frame(img)
    if given_w:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            px, py = m.world_to_pixel(tx, ty)
        x, y = float(px), float(py)
    ny, nx = img.shape
    i, j = int(math.floor(y + 0.5)), int(math.floor(x + 0.5))
    if not (0 <= i < ny and 0 <= j < nx):
        raise ViewerParamError(f"position x={x:.1f}, y={y:.1f} (0-based pixel) lies outside the image "
                               f"({nx} x {ny} pixels)")
    value = float(img.data[i, j])
    bits = int(img.dq[i, j])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = m.pixel_to_world(j * u.pix, i * u.pix)
        r = math.hypot(c.Tx.to_value("arcsec"), c.Ty.to_value("arcsec"))
        rsun = float(m.rsun_obs.to_value("arcsec"))
        lat = lon = None
        if r <= rsun:
            h = c.transform_to(HeliographicStonyhurst(obstime=m.reference_date))
            lat, lon = float(h.lat.to_value("deg")), float(h.lon.wrap_at(180 * u.deg).to_value("deg"))
            if not (math.isfinite(lat) and math.isfinite(lon)):
                lat = lon = None
    return {
        "x": j, "y": i,
        "value": value if math.isfinite(value) else None,
        "bunit": img.bunit,
        "dq": bits,
        "dq_flags": [b.name for b in DQ if bits & int(b)],
        "tx": float(c.Tx.to_value("arcsec")), "ty": float(c.Ty.to_value("arcsec")),
        "r_rsun": r / rsun,
        "on_disk": lat is not None,
        "hgs_lat": lat, "hgs_lon": lon,
    }


# -- events ---------------------------------------------------------------------------------


def _event_time(event) -> dt.datetime:
    """The time an event's position refers to: its peak, else its start (aware UTC)."""
    return as_utc(event.peak_time or event.start_time)


def _label(event) -> str:
    from backend.render.figures import hek_label  # plotly: loaded when an event is drawn

    parts = [f"{hek_label(event.event_type)} #{event.id}"]
    if event.goes_class:
        parts.append(f"GOES {event.goes_class}")
    parts.append(as_utc(event.start_time).strftime("%Y-%m-%d %H:%M UTC"))
    parts.append(event.source)
    return " · ".join(parts)


def _wedge(pa_deg: float, width_deg: float | None, r_in: float, r_out: float) -> dict[str, list[float]]:
    """A position-angle wedge [arcsec]: PA counter-clockwise from solar north (+Ty), east
    (-Tx) at 90 deg; a width of 360 or more is a full ring (halo CME); no width is a radial line."""
    if width_deg is None or width_deg <= 0:
        angles = [pa_deg]
    else:
        w = min(float(width_deg), 360.0)
        n = max(2, int(math.ceil(w / 2.0)) + 1)
        angles = list(np.linspace(pa_deg - w / 2, pa_deg + w / 2, n))
    outer = [(-r_out * math.sin(math.radians(a)), r_out * math.cos(math.radians(a))) for a in angles]
    inner = [(-r_in * math.sin(math.radians(a)), r_in * math.cos(math.radians(a))) for a in reversed(angles)]
    pts = outer + inner + [outer[0]]
    return {"x": [round(p[0], 2) for p in pts], "y": [round(p[1], 2) for p in pts]}


def event_overlay(img: ProductImage, event, position_of=None) -> dict[str, Any]:
    """One event as drawn on the product's frame.

    ``position_of``: another event whose position (and time) stands in for this one's when
    it has none (:func:`backend.services.imaging.located_events`); the overlay then says so in ``position_from``.

    Point events (a helioprojective ``hpc_x``/``hpc_y`` as seen from Earth, else Stonyhurst
    ``hgs_lat``/``hgs_lon``, at the event's peak time, else its start) are rotated to the
    frame's DATE-OBS with sunpy's :func:`~sunpy.coordinates.propagate_with_solar_surface`
    and seen from the frame's observer. Events with a ``position_angle`` and no point
    position are wedges (:func:`_wedge`).

    Returns
    -------
    dict
        ``id``, ``type``, ``label``, ``url`` (the event page), ``start``, ``peak``, ``end``,
        ``kind`` (``point``, ``wedge`` or ``none``) and for a point: ``hpc_x``, ``hpc_y``
        (drawn position [arcsec]), ``pixel_x``, ``pixel_y`` (0-based), ``source_hpc``
        (the catalogue's position), ``rotated`` (True when the times differ by more than a
        minute), ``rotation_s`` (frame time minus event time [s]), ``visible`` (False: behind
        the limb at the frame's time, drawn on the limb), ``in_image``, ``note``; for a wedge:
        ``x``, ``y`` (the closed polygon [arcsec]), ``r_rsun`` (inner, outer), ``note``; for
        ``none``: ``note`` saying why it cannot be placed.
    """
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from sunpy.coordinates import HeliographicStonyhurst, Helioprojective, propagate_with_solar_surface

    m = img.smap
    frame = _hpc_frame(img)
    t_frame = as_utc(m.date.utc.to_datetime(timezone=dt.UTC))
    out: dict[str, Any] = {
        "id": event.id, "type": event.event_type, "label": _label(event), "url": f"/events/{event.id}",
        "start": as_utc(event.start_time).isoformat(),
        "peak": as_utc(event.peak_time).isoformat() if event.peak_time else None,
        "end": as_utc(event.end_time).isoformat() if event.end_time else None,
        "goes_class": event.goes_class, "source": event.source,
    }
    rsun = float(m.rsun_obs.to_value("arcsec"))
    has_hpc = event.hpc_x is not None and event.hpc_y is not None
    has_hgs = event.hgs_lat is not None and event.hgs_lon is not None
    borrowed = None
    if not (has_hpc or has_hgs) and position_of is not None:
        borrowed, event_pos = position_of, position_of
        has_hpc = event_pos.hpc_x is not None and event_pos.hpc_y is not None
        has_hgs = event_pos.hgs_lat is not None and event_pos.hgs_lon is not None
    else:
        event_pos = event
    if has_hpc or has_hgs:
        t_ev = _event_time(event_pos)
        from astropy.time import Time

        t_ev_astropy = Time(t_ev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if has_hpc:
                src = SkyCoord(float(event_pos.hpc_x) * u.arcsec, float(event_pos.hpc_y) * u.arcsec,
                               frame=Helioprojective(obstime=t_ev_astropy, observer="earth", rsun=m.rsun_meters))
                out["source_hpc"] = [float(event_pos.hpc_x), float(event_pos.hpc_y)]
                out["position_from"] = "hpc (as seen from Earth)"
            else:
                src = SkyCoord(float(event_pos.hgs_lon) * u.deg, float(event_pos.hgs_lat) * u.deg, m.rsun_meters,
                               frame=HeliographicStonyhurst(obstime=t_ev_astropy))
                out["position_from"] = "Stonyhurst lat/lon"
            dt_s = (t_frame - t_ev).total_seconds()
            out["rotation_s"] = dt_s
            with propagate_with_solar_surface():
                rot = src.transform_to(frame)
            tx, ty = float(rot.Tx.to_value("arcsec")), float(rot.Ty.to_value("arcsec"))
            if math.isfinite(tx) and math.isfinite(ty):
                out["rotated"] = abs(dt_s) > 60.0
                visible = bool(np.asarray(rot.is_visible()))
                out["visible"] = visible
                if visible:
                    note = (f"rotated {dt_s / 3600:+.2f} h to the frame's DATE-OBS (differential rotation)"
                            if out["rotated"] else "at the frame's DATE-OBS")
                else:
                    r = math.hypot(tx, ty)
                    out["rotated_hpc"] = [tx, ty]
                    tx, ty = (tx * rsun / r, ty * rsun / r) if r > 0 else (tx, ty)
                    note = (f"behind the limb at the frame's DATE-OBS (rotated {dt_s / 3600:+.2f} h): "
                            "drawn on the limb")
            else:  # beyond the limb at its own time: not on the surface, cannot be rotated
                tx, ty = (float(event_pos.hpc_x), float(event_pos.hpc_y)) if has_hpc else (math.nan, math.nan)
                out["rotated"] = False
                out["visible"] = has_hpc
                note = "off the disk at its own time: drawn where the catalogue puts it, not rotated"
            if borrowed is not None:
                out["position_from"] = (f"{out['position_from']} of the same flare in {borrowed.source} "
                                        f"(event #{borrowed.id}): this event has no position of its own")
                out["position_event"] = borrowed.id
                note = f"{note}; position of the same flare in {borrowed.source} (event #{borrowed.id})"
            if math.isfinite(tx) and math.isfinite(ty):
                px, py = m.world_to_pixel(tx, ty)
                ny, nx = img.shape
                out.update(kind="point", hpc_x=tx, hpc_y=ty, pixel_x=float(px), pixel_y=float(py),
                           in_image=bool(-0.5 <= px < nx - 0.5 and -0.5 <= py < ny - 0.5), note=note)
                return out
    if event.position_angle is not None:
        coronagraph = get_channel(img.channel).is_coronagraph
        if coronagraph:
            r_in, r_out = CME_FIELD_RSUN
            where = "over SCI's field, 1.1-2.5 Rsun"
        else:
            ext_x = [abs(v) for v in wcs_extent(img)["tx"]]
            ext_y = [abs(v) for v in wcs_extent(img)["ty"]]
            r_in, r_out = 1.0, max(1.05, math.hypot(max(ext_x), max(ext_y)) / rsun)
            where = "from the limb outwards"
        width = event.angular_width
        out.update(kind="wedge", r_rsun=[r_in, r_out], position_angle=float(event.position_angle),
                   angular_width=None if width is None else float(width),
                   note=(f"position angle {event.position_angle:.0f} deg"
                         + (f", width {width:.0f} deg" if width is not None else ", no angular width given: a line")
                         + f", {where}"),
                   **_wedge(float(event.position_angle), width, r_in * rsun, r_out * rsun))
        return out
    out.update(kind="none", note="no position in the catalogue (neither hpc, Stonyhurst lat/lon nor position angle)")
    return out


def wcs_extent(img: ProductImage) -> dict[str, list[float]]:
    """Helioprojective Tx and Ty [arcsec] of the image's outer pixel edges."""
    aff = hpc_affine(img)
    ny, nx = img.shape
    return {"tx": [aff["tx0"] - 0.5 * aff["m11"], aff["tx0"] + (nx - 0.5) * aff["m11"]],
            "ty": [aff["ty0"] - 0.5 * aff["m22"], aff["ty0"] + (ny - 0.5) * aff["m22"]]}
