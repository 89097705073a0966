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
           "annotate_frame", "hpc_to_fraction", "quicklook_unit_image", "diff_label", "MIN_MOVIE_SIDE",
           "MAX_MOVIE_SIDE", "POINT_BOX_ARCSEC", "CROP_MARGIN_ARCSEC", "MARKER_RGB", "event_box", "product_map",
           "hpc_pixel", "crop_shape", "crop_to_box", "movie_shape", "movie_frame"]

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


# --------------------------------------------------------------- MP4 frames at product size
#: Bounds [pixel] of a chosen MP4 size (its larger side): the smallest LST frame ingest
#: accepts (``pipelines.channels.MIN_FRAME_SIDE``) to the largest detector (SDI/WST, 4608).
MIN_MOVIE_SIDE, MAX_MOVIE_SIDE = 32, 4608
#: Side [arcsec] of the box of an event that has a position but no ``hpc_bbox`` (a choice:
#: about an active region, 5 arcmin).
POINT_BOX_ARCSEC = 300.0
#: Margin [arcsec] added on each side of an event's box when a movie is cropped to it.
CROP_MARGIN_ARCSEC = 100.0
#: Colour of an event's marker ring in an MP4 (cyan: no quicklook colour map of the
#: channels, nor grey, has it).
MARKER_RGB = (0, 255, 255)


def event_box(hpc_x: float, hpc_y: float, hpc_bbox=None,
              margin: float = CROP_MARGIN_ARCSEC) -> tuple[float, float, float, float]:
    """The crop box of an event [arcsec]: ``(x0, y0, x1, y1)`` helioprojective.

    Its ``hpc_bbox`` (``[x0, y0, x1, y1]`` arcsec, as the detector and HEK give it) widened
    to hold its position, else (no box, or one that is not four finite numbers: a catalogue's
    WKT text, a null) a square of :data:`POINT_BOX_ARCSEC` around the position; then
    ``margin`` on each side.
    """
    if (isinstance(hpc_bbox, list | tuple) and len(hpc_bbox) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in hpc_bbox)):
        x0, y0, x1, y1 = (float(v) for v in hpc_bbox)
        x0, x1 = min(x0, x1, hpc_x), max(x0, x1, hpc_x)
        y0, y1 = min(y0, y1, hpc_y), max(y0, y1, hpc_y)
    else:
        h = POINT_BOX_ARCSEC / 2
        x0, y0, x1, y1 = hpc_x - h, hpc_y - h, hpc_x + h, hpc_y + h
    return x0 - margin, y0 - margin, x1 + margin, y1 + margin


def product_map(data: np.ndarray, header: fits.Header):
    """A ``sunpy.map.Map`` of an L2 image and its header (the product's helioprojective WCS)."""
    import sunpy.map

    return sunpy.map.Map(np.asarray(data), header)


def hpc_pixel(smap, hpc_x: float, hpc_y: float) -> tuple[float, float]:
    """Pixel ``(x, y)`` (0-based, row 0 at the bottom as in the FITS) of a helioprojective
    position [arcsec] in ``smap``'s frame (``GenericMap.world_to_pixel``)."""
    import astropy.units as u
    from astropy.coordinates import SkyCoord

    px, py = smap.world_to_pixel(SkyCoord(hpc_x * u.arcsec, hpc_y * u.arcsec, frame=smap.coordinate_frame))
    return float(px.to_value(u.pix)), float(py.to_value(u.pix))


def crop_shape(smap, box: tuple[float, float, float, float]) -> tuple[int, int]:
    """``(ny, nx)`` [pixel] of a crop of ``smap`` that covers ``box`` [arcsec]: the span of
    its corners through the WCS, rounded up to even (H.264 in yuv420p needs even sides),
    at most the image."""
    x0, y0, x1, y1 = box
    corners = np.array([hpc_pixel(smap, x, y) for x, y in ((x0, y0), (x1, y0), (x0, y1), (x1, y1))])
    span = np.ceil(np.ptp(corners, axis=0)).astype(int)
    ny_img, nx_img = smap.data.shape
    nx = min(int(span[0]) + int(span[0]) % 2, nx_img - nx_img % 2)
    ny = min(int(span[1]) + int(span[1]) % 2, ny_img - ny_img % 2)
    return max(ny, 2), max(nx, 2)


def crop_to_box(image: np.ndarray, smap, box: tuple[float, float, float, float], shape: tuple[int, int],
                mark: tuple[float, float] | None = None) -> tuple[np.ndarray, tuple[float, float] | None]:
    """The part of ``image`` (on ``smap``'s pixel grid) of ``shape`` centred on ``box``'s
    centre through ``smap``'s WCS (``astropy.nddata.Cutout2D``, NaN outside the image).

    Returns
    -------
    cut : numpy.ndarray, shape ``shape``
    mark : (x, y) or None
        The helioprojective position ``mark`` [arcsec] as a pixel of ``cut`` (0-based,
        row 0 at the bottom).

    Raises
    ------
    pipelines.errors.DataError
        If the box does not overlap the image.
    """
    from astropy.nddata import Cutout2D, NoOverlapError

    centre = hpc_pixel(smap, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    try:
        cut = Cutout2D(np.asarray(image, dtype=np.float64), centre, shape, mode="partial", fill_value=np.nan)
    except NoOverlapError:
        raise DataError(f"the event's box {tuple(round(v) for v in box)} arcsec is off the image") from None
    where = None
    if mark is not None:
        x, y = cut.to_cutout_position(hpc_pixel(smap, *mark))
        where = (float(x), float(y))
    return cut.data, where


def movie_shape(shape: tuple[int, int], size: int | None) -> tuple[int, int]:
    """``(H, W)`` [pixel] of the MP4 of images of ``shape`` (ny, nx): the images' own
    (``size`` None: full resolution, rounded up to even), else the larger side ``size``
    and the other in proportion, rounded to even."""
    ny, nx = shape
    if size is None:
        return ny + ny % 2, nx + nx % 2
    s = size / max(ny, nx)
    def even(v: float) -> int:
        return max(2, 2 * int(round(v / 2)))
    return (size, even(nx * s)) if ny >= nx else (even(ny * s), size)


def movie_frame(rgb: np.ndarray, shape: tuple[int, int], caption: tuple[str, str],
                mark: tuple[float, float] | None = None) -> np.ndarray:
    """An MP4 frame: ``rgb`` resampled to ``shape``, the marker ring and the caption drawn on it.

    Parameters
    ----------
    rgb : numpy.ndarray, shape (ny, nx, 3), uint8
        From :func:`rgb_frame` (row 0 at the top).
    shape : (H, W)
        Of the frame (:func:`movie_shape`); enlarged nearest neighbour (pixels stay pixels),
        reduced by area averaging (PIL ``BOX``); a frame of the image's own size + 1 (odd
        sides) is padded black at the right or bottom.
    caption : (str, str)
        Two lines written at the top left, white with a black outline.
    mark : (x, y), optional
        A pixel of ``rgb``'s image (0-based, row 0 at the **bottom**, FITS) where a ring of
        :data:`MARKER_RGB` is drawn.

    Returns
    -------
    numpy.ndarray, shape (H, W, 3), uint8
    """
    from PIL import Image, ImageDraw, ImageFont

    H, W = shape
    ny, nx = rgb.shape[:2]
    img = Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB")
    if 0 <= H - ny <= 1 and 0 <= W - nx <= 1:  # full resolution
        sx = sy = 1.0
        canvas = Image.new("RGB", (W, H), "black")
        canvas.paste(img, (0, 0))
    else:
        method = Image.Resampling.NEAREST if W >= nx and H >= ny else Image.Resampling.BOX
        canvas = img.resize((W, H), method)
        sx, sy = W / nx, H / ny
    draw = ImageDraw.Draw(canvas)
    side = min(W, H)
    if mark is not None:
        # PIL draws on whole pixels: the ring is centred on the pixel nearest the position
        ox, oy = round((mark[0] + 0.5) * sx - 0.5), round((ny - 0.5 - mark[1]) * sy - 0.5)
        r, w = max(6, side // 25), max(2, side // 200)
        draw.ellipse((ox - r, oy - r, ox + r, oy + r), outline=MARKER_RGB, width=w)
    font = ImageFont.load_default(size=max(8, min(28, side // 28)))
    y = 2
    for line in caption:
        if line:
            draw.text((3, y), line, fill="white", font=font, stroke_width=1, stroke_fill="black")
            y += font.size + 2
    return np.asarray(canvas, dtype=np.uint8)
