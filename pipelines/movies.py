"""Movie frames of L2 products: display arrays, running and base differences, annotation.

Pure functions (arrays and headers in, arrays out): the worker (``backend.worker.movies``)
and the frame endpoint of the player (``backend.api.routes.movies``) compose them.

* :func:`display_array`: an L2 image block-averaged to at most ``size`` pixels a side
  (``astropy.nddata.block_reduce``), masked pixels (DQ != 0, NaN) as NaN;
* :func:`difference_image`: a frame minus a reference frame (running difference: the
  previous frame of the channel; base difference: the first frame of the window);
* :func:`signed_unit_image`: a difference scaled symmetrically about zero into [0, 1]
  (``astropy.visualization``: zero is 0.5, ±the 99.5th percentile of ``|diff|`` the ends);
* :func:`rgb_frame`: a [0, 1] image coloured (quicklook colour maps, or grey for
  differences), north up, as uint8 RGB;
* :func:`annotate_frame`: the frame enlarged to the movie size, padded to the H.264
  macroblock and captioned with the channel and DATE-OBS;
* :func:`hpc_to_fraction`: a helioprojective position [arcsec] to its place on a display
  image (fractions of its width and height from the top left), through the product's WCS.
"""

from __future__ import annotations

import numpy as np
from astropy.io import fits
from astropy.nddata import block_reduce
from astropy.visualization import ImageNormalize, LinearStretch, ManualInterval
from astropy.wcs import WCS

from pipelines.channels import get_channel
from pipelines.errors import DataError
from pipelines.products import _CMAPS, quicklook_image

__all__ = ["DIFF_MODES", "DISPLAY_SIZE", "MOVIE_SIDE", "MACRO_BLOCK", "CAPTION_PX", "DIFF_PERCENTILE",
           "display_factor", "display_array", "difference_image", "signed_unit_image", "rgb_frame",
           "annotate_frame", "hpc_to_fraction", "quicklook_unit_image", "diff_label"]

#: Difference modes of a movie: none (the quicklook stretch), running (each frame minus the
#: previous frame), base (each frame minus the first frame of the window).
DIFF_MODES = ("none", "running", "base")
#: Largest side [pixel] of a display image: the quicklook size (``pipelines.products``).
DISPLAY_SIZE = 512
#: Side [pixel] a smaller display image is enlarged towards (integer factor, nearest
#: neighbour) in a movie, so that its caption is readable.
MOVIE_SIDE = 512
#: H.264 in yuv420p needs even sizes; 16 (a macroblock) is what players handle everywhere.
MACRO_BLOCK = 16
#: Height [pixel] of the caption band under each movie frame.
CAPTION_PX = 32
#: Percentile of ``|difference|`` that maps to the ends of the signed scale (a choice: the
#: flare kernel saturates, the rest of the disk keeps its contrast).
DIFF_PERCENTILE = 99.5


def display_factor(shape: tuple[int, int], size: int = DISPLAY_SIZE) -> int:
    """Block-averaging factor that brings ``shape`` to at most ``size`` pixels a side (as
    :func:`pipelines.products.quicklook_image`)."""
    return max(1, int(np.ceil(max(shape) / size)))


def display_array(data: np.ndarray, dq: np.ndarray, size: int = DISPLAY_SIZE) -> np.ndarray:
    """An L2 image block-averaged for display, masked pixels NaN.

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx)
        L2 data in its physical unit (``BUNIT``), row 0 at the bottom (FITS).
    dq : numpy.ndarray, shape (ny, nx)
        Data-quality bits; pixels with DQ != 0 (and non-finite ones) are not used.
    size : int
        Largest side of the result [pixel].

    Returns
    -------
    numpy.ndarray, shape (ny // f, nx // f), float64
        The mean of the good pixels of each f x f block (f = :func:`display_factor`; a
        partial block at the edge is trimmed, as the quicklook does); NaN where fewer than
        half of a block's pixels are good.

    Raises
    ------
    pipelines.errors.DataError
        If ``data`` is not 2-D or ``dq`` differs from it in shape.
    """
    a = np.asarray(data, dtype=np.float64)
    if a.ndim != 2 or np.shape(dq) != a.shape:
        raise DataError(f"display image needs 2-D data and a DQ mask of its shape, got {a.shape} and {np.shape(dq)}")
    bad = (np.asarray(dq) != 0) | ~np.isfinite(a)
    f = display_factor(a.shape, size)
    if f == 1:
        return np.where(bad, np.nan, a)
    good = block_reduce((~bad).astype(np.float64), f, func=np.mean)
    total = block_reduce(np.where(bad, 0.0, a), f, func=np.sum)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / (good * f * f)
    return np.where(good >= 0.5, mean, np.nan)


def difference_image(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``current - reference`` (display arrays of the same channel), NaN where either is.

    Raises
    ------
    pipelines.errors.DataError
        If the shapes differ (frames of different sizes cannot be differenced).
    """
    if np.shape(current) != np.shape(reference):
        raise DataError(f"cannot difference frames of shapes {np.shape(current)} and {np.shape(reference)}")
    return np.asarray(current, dtype=np.float64) - np.asarray(reference, dtype=np.float64)


def signed_unit_image(diff: np.ndarray, percentile: float = DIFF_PERCENTILE,
                      limit: float | None = None) -> tuple[np.ndarray, float]:
    """A signed difference scaled symmetrically about zero into [0, 1].

    Parameters
    ----------
    diff : numpy.ndarray, shape (ny, nx)
        In the product's unit; NaN where masked.
    percentile : float
        Percentile of ``|diff|`` over the finite pixels that maps to 0 and 1.
    limit : float, optional
        The scale's half range in the unit of ``diff`` instead (one scale for every frame
        of a movie).

    Returns
    -------
    image : numpy.ndarray, shape (ny, nx)
        0.5 where the difference is zero, 0 at ``-limit``, 1 at ``+limit`` (clipped);
        NaN where ``diff`` is NaN.
    limit : float
        The half range used (> 0).
    """
    d = np.asarray(diff, dtype=np.float64)
    finite = d[np.isfinite(d)]
    if limit is None:
        limit = float(np.percentile(np.abs(finite), percentile)) if finite.size else 0.0
    if not np.isfinite(limit) or limit <= 0:
        limit = 1e-30  # a flat difference (two identical frames): all mid-grey
    norm = ImageNormalize(vmin=-limit, vmax=limit, interval=ManualInterval(-limit, limit),
                          stretch=LinearStretch(), clip=True)
    out = np.asarray(norm(np.nan_to_num(d, nan=0.0)), dtype=np.float64)
    return np.where(np.isfinite(d), out, np.nan), limit


def quicklook_unit_image(data: np.ndarray, dq: np.ndarray, channel_code: str,
                         size: int = DISPLAY_SIZE) -> np.ndarray:
    """The quicklook stretch of the channel (:func:`pipelines.products.quicklook_image`)."""
    return quicklook_image(data, dq, channel_code, size)


def rgb_frame(image: np.ndarray, channel_code: str, *, difference: bool) -> np.ndarray:
    """Colour a [0, 1] image (NaN: masked, drawn black), north up.

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
        Row 0 at the bottom (FITS); values in [0, 1].
    channel_code : str
        Chooses the quicklook colour map; differences are grey (black negative, white
        positive, mid-grey zero), as running differences are shown in the field.
    difference : bool

    Returns
    -------
    numpy.ndarray, shape (ny, nx, 3), uint8
        Row 0 at the top (as an image file or a screen).
    """
    from matplotlib import colormaps

    name = "gray" if difference else _CMAPS.get(get_channel(channel_code).code, "gray")
    cmap = colormaps[name].with_extremes(bad="black")
    rgba = cmap(np.ma.masked_invalid(np.asarray(image)), bytes=True)
    return np.ascontiguousarray(rgba[::-1, :, :3])


def diff_label(diff: str) -> str:
    """Caption of a difference mode."""
    return {"none": "", "running": "running difference", "base": "base difference"}.get(diff, diff)


def annotate_frame(rgb: np.ndarray, channel_code: str, date_obs: str, diff: str = "none",
                   side: int = MOVIE_SIDE) -> np.ndarray:
    """A movie frame: ``rgb`` enlarged towards ``side``, captioned, padded for H.264.

    Parameters
    ----------
    rgb : numpy.ndarray, shape (ny, nx, 3), uint8
        From :func:`rgb_frame`.
    channel_code, date_obs : str
        Written in the caption band under the image (``SDI  running difference`` on the
        left, ``DATE-OBS <value> UTC`` on the right).
    diff : str
        One of :data:`DIFF_MODES`.
    side : int
        Images smaller than this are enlarged by the largest integer factor that keeps
        them within it (nearest neighbour: pixels stay pixels).

    Returns
    -------
    numpy.ndarray, shape (H, W, 3), uint8
        H and W multiples of :data:`MACRO_BLOCK`; the image at the top left, black padding.
    """
    from PIL import Image, ImageDraw, ImageFont

    ny, nx = rgb.shape[:2]
    k = max(1, side // max(ny, nx))
    img = Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB")
    if k > 1:
        img = img.resize((nx * k, ny * k), Image.Resampling.NEAREST)
    w = -(-img.width // MACRO_BLOCK) * MACRO_BLOCK
    h = -(-(img.height + CAPTION_PX) // MACRO_BLOCK) * MACRO_BLOCK
    canvas = Image.new("RGB", (w, h), "black")
    canvas.paste(img, (0, 0))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=15)
    y = img.height + (h - img.height - 16) // 2
    left = f"LST {get_channel(channel_code).code}" + (f"  {diff_label(diff)}" if diff != "none" else "")
    draw.text((6, y), left, fill="white", font=font)
    right = f"DATE-OBS {date_obs} UTC"
    draw.text((w - 6 - draw.textlength(right, font=font), y), right, fill="white", font=font)
    return np.asarray(canvas, dtype=np.uint8)


def hpc_to_fraction(header: fits.Header, hpc_x: float, hpc_y: float,
                    size: int = DISPLAY_SIZE) -> tuple[float, float] | None:
    """Where a helioprojective position falls on a product's display image.

    Parameters
    ----------
    header : astropy.io.fits.Header
        The L2 product's header (its helioprojective WCS: ``HPLN-TAN``/``HPLT-TAN``).
    hpc_x, hpc_y : float
        Helioprojective longitude and latitude [arcsec].
    size : int
        Largest side of the display image (:func:`display_array`, the quicklook).

    Returns
    -------
    (fx, fy) or None
        Fractions of the display image's width (from the left) and height (from the top:
        the image is shown north up, row 0 of the FITS at the bottom), or ``None`` when
        the position falls outside the image or the header has no celestial WCS.
    """
    nx, ny = int(header.get("NAXIS1", 0)), int(header.get("NAXIS2", 0))
    if nx <= 0 or ny <= 0:
        return None
    try:
        w = WCS(header, naxis=2)
    except Exception:  # noqa: BLE001 - a header astropy cannot read has no position to give
        return None
    if not w.has_celestial:
        return None
    scale = [1.0 / 3600.0 if str(u) == "deg" else 1.0 for u in w.wcs.cunit]  # arcsec -> the WCS's unit
    px, py = w.wcs_world2pix([[hpc_x * scale[0], hpc_y * scale[1]]], 0)[0]
    f = display_factor((ny, nx), size)
    cover_x, cover_y = (nx // f) * f, (ny // f) * f
    fx, fy = (px + 0.5) / cover_x, 1.0 - (py + 0.5) / cover_y
    if not (0.0 <= fx <= 1.0 and 0.0 <= fy <= 1.0) or not (np.isfinite(fx) and np.isfinite(fy)):
        return None
    return float(fx), float(fy)
