"""L2 product files: the FITS layout and the quicklook PNG.

FITS layout (:func:`build_product_hdul`):

* HDU 0 (primary): float32 data in physical units (``BUNIT``), the full L2 header
  (helioprojective WCS, observer keywords, ``LEVEL='L2'``, ``CAL*`` provenance keywords,
  HISTORY per step), software name and version.
* HDU 1, ``EXTNAME='UNCERT'``: float32 image, the standard deviation of every pixel of
  HDU 0 in the same ``BUNIT`` (:mod:`pipelines.calibration.l2.uncertainty`), as PUNCH's
  products carry theirs; the WCS and observer keywords of HDU 0.
* HDU 2, ``EXTNAME='DQ'``: uint8 image, the data-quality bits (meanings in COMMENT cards
  and in :mod:`pipelines.calibration.l2.steps`), ``BUNIT=''``; the WCS of HDU 0.

Both extensions are images so that DS9, JHelioviewer and fitsverify show them. Every
product passes HEASARC's ``fitsverify`` with no error and no warning
(``tests/test_fitsverify.py``: each channel, each option); ``WCSAXES`` is moved ahead of the
other WCS keywords by the writer.
Open one as one map with ``mask`` (DQ != 0) and ``uncertainty`` (``StdDevUncertainty``):
:func:`pipelines.io.load_l2`, or ``lstdp_client.open_l2`` of the Python client;
``sunpy.map.Map(path, hdus=0)`` is the data map alone (without ``hdus=0`` sunpy makes a map
of every 2-D image HDU: three).

The error to compare a product with anything else is :func:`total_uncertainty` (``UNCERT`` with
the frame-wide errors the header states: ``RADUNC``, and ``CRDERia``/``CSYERia`` through the
image gradient), not ``UNCERT`` alone.

Products written before these extensions (DQ as a one-row binary table whose column
``DQ`` holds the 2-D mask, ``TDIM1 = '(nx,ny)'``, no ``UNCERT``) are still read:
:func:`read_product` returns ``(data, dq, header)`` for both, :func:`read_uncertainty`
``None`` for the older ones.

Write the list with :func:`pipelines.fitsio.write_fits_atomic`, which adds
``CHECKSUM``/``DATASUM`` to both HDUs.
With ``PRODUCT_COMPRESSION`` ``lossless`` or ``noise`` the list is first tile-compressed
(:func:`pipelines.compression.compress_product_hdul`): a header-only HDU 0 with the same
header, then ``SCI`` (the data; ``sunpy.map.Map(path, hdus=1)``), ``UNCERT`` and ``DQ``;
:func:`read_product` and :func:`read_uncertainty` read both layouts.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.calibration.l2.flow import L2Result
from pipelines.calibration.l2.steps import dq_description
from pipelines.channels import get_channel
from pipelines.fitsio import write_atomic
from pipelines.provenance import stamp_provenance

__all__ = ["build_product_hdul", "dq_image_hdu", "dq_table_hdu", "read_product", "read_uncertainty",
           "total_uncertainty", "total_uncertainty_from", "FRAME_WIDE_RELATIVE_KEYS",
           "write_quicklook_png", "quicklook_image", "quicklook_stretch", "QUICKLOOK_SIZE"]

#: Largest side of the quicklook PNG [pixel] (:func:`write_quicklook_png`'s default; the GPU
#: worker's executor makes the block average for this size on the device).
QUICKLOOK_SIZE = 512

#: EXTNAME of the uncertainty (standard deviation) image extension.
UNCERT_EXTNAME = "UNCERT"

_WCS_AND_OBSERVER = ("WCSAXES", "CTYPE1", "CTYPE2", "CUNIT1", "CUNIT2", "CRPIX1", "CRPIX2", "CRVAL1", "CRVAL2",
                     "CDELT1", "CDELT2", "PC1_1", "PC1_2", "PC2_1", "PC2_2", "CRDER1", "CRDER2", "CSYER1", "CSYER2",
                     "DATE-OBS", "DATE_OBS",
                     "TIMESYS", "DATE-BEG", "DATE-AVG", "DATE-END",
                     "HGLN_OBS", "HGLT_OBS", "DSUN_OBS", "RSUN_REF", "RSUN_OBS", "TELESCOP", "INSTRUME",
                     "DETECTOR", "CHANNEL", "WAVELNTH", "WAVEUNIT")


#: Keywords of image HDUs that a table HDU may not carry (fitsverify: "not allowed in the
#: Bin/ASCII table").
_IMAGE_ONLY = ("BUNIT", "BSCALE", "BZERO", "BLANK", "DATAMIN", "DATAMAX")


def build_product_hdul(result: L2Result, software_version: str) -> fits.HDUList:
    """The L2 product as an HDU list (primary data, ``UNCERT`` and ``DQ`` image extensions).

    Parameters
    ----------
    result : L2Result
        From :func:`pipelines.calibration.l2.flow.calibrate_frame`.
    software_version : str
        Version of the platform that made the product (``SOFTVERS``).

    Returns
    -------
    astropy.io.fits.HDUList
        Not yet written: pass it to :func:`pipelines.fitsio.write_fits_atomic`.

    Raises
    ------
    ValueError
        If data, uncertainty and DQ differ in shape.

    Notes
    -----
    A result without ``uncertainty`` (made outside :func:`calibrate_frame`) gets no
    ``UNCERT`` extension.
    """
    data = np.asarray(result.data, dtype=np.float32)
    dq = np.asarray(result.dq, dtype=np.uint8)
    if data.shape != dq.shape or data.ndim != 2:
        raise ValueError(f"data {data.shape} and DQ {dq.shape} must be 2-D arrays of one shape")
    sigma = getattr(result, "uncertainty", None)
    if sigma is not None:
        sigma = np.asarray(sigma, dtype=np.float32)
        if sigma.shape != data.shape:
            raise ValueError(f"uncertainty {sigma.shape} and data {data.shape} must have one shape")
    header = result.header.copy()
    for key in ("SIMPLE", "BITPIX", "NAXIS", "NAXIS1", "NAXIS2", "EXTEND", "BZERO", "BSCALE", "BLANK",
                "CHECKSUM", "DATASUM"):
        header.remove(key, ignore_missing=True, remove_all=True)
    _wcsaxes_first(header)
    stamp_provenance(header, {"SOFTNAME": "lstdp", "SOFTVERS": str(software_version),
                              "DATE": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"), "FILETYPE": "L2"})
    primary = fits.PrimaryHDU(data=data, header=header)
    hdus: list[Any] = [primary]
    if sigma is not None:
        uh = _extension_header(header)
        uh["BUNIT"] = (str(header.get("BUNIT", "")), "as HDU 0")
        for key in ("BUNITNAM", "MSBVALUE"):
            if key in header:
                uh[key] = (header[key], header.comments[key])
        uh.add_comment("1-sigma uncertainty of HDU 0 per pixel (pipelines.calibration.uncertainty):")
        uh.add_comment("Poisson, read noise, ADC, dark, flat and stray-light terms, resampled with the")
        uh.add_comment("squared interpolation weights; NaN where HDU 0 is NaN")
        hdus.append(fits.ImageHDU(data=sigma, header=uh, name=UNCERT_EXTNAME))
    dq_header = _extension_header(header)
    dq_header["BUNIT"] = ("", "bit mask (0 = good)")
    for line in dq_description():
        dq_header.add_comment(line)
    hdus.append(dq_image_hdu(dq, dq_header))
    return fits.HDUList(hdus)


def _wcsaxes_first(header: fits.Header) -> None:
    """Move ``WCSAXES`` in place to the head of ``header`` (mandatory keywords removed), so
    that it precedes every other WCS keyword, as the FITS standard 4.0 (sect. 8.2) requires
    and HEASARC's ``fitsverify`` checks ("WCSAXES keyword appears after other WCS keyword").
    The calibration chain sets it after the ``CTYPEi`` it inherits from the raw header."""
    if "WCSAXES" in header:
        card = header.cards["WCSAXES"]
        value, comment = card.value, card.comment
        header.remove("WCSAXES", remove_all=True)
        header.insert(0, ("WCSAXES", value, comment))


def _extension_header(header: fits.Header) -> fits.Header:
    """The WCS, time and observer keywords of HDU 0, for an extension on the same grid."""
    out = fits.Header()
    for key in _WCS_AND_OBSERVER:
        if key in header:
            out[key] = (header[key], header.comments[key])
    return out


def dq_image_hdu(dq: np.ndarray, header: fits.Header | None = None) -> fits.ImageHDU:
    """The ``DQ`` extension: a uint8 image of the data-quality bits (0 = good).

    Parameters
    ----------
    dq : numpy.ndarray, shape (ny, nx)
        Data-quality bits (cast to uint8; BITPIX 8, no scaling).
    header : astropy.io.fits.Header, optional
        Extra keywords (WCS, bit meanings in COMMENT cards).
    """
    return fits.ImageHDU(data=np.asarray(dq, dtype=np.uint8), header=header, name="DQ")


def dq_table_hdu(dq: np.ndarray, header: fits.Header | None = None) -> fits.BinTableHDU:
    """The older ``DQ`` layout: a one-row table whose column ``DQ`` holds the 2-D uint8 mask.

    Products are now written with :func:`dq_image_hdu`; this one stays for tests and
    benchmarks that make products of the older layout (still read by :func:`read_product`).

    Parameters
    ----------
    dq : numpy.ndarray, shape (ny, nx)
        Data-quality bits (cast to uint8).
    header : astropy.io.fits.Header, optional
        Extra keywords (WCS, bit meanings in COMMENT cards).
    """
    dq = np.asarray(dq, dtype=np.uint8)
    ny, nx = dq.shape
    col = fits.Column(name="DQ", format=f"{ny * nx}B", dim=f"({nx},{ny})", array=dq[np.newaxis])
    if header is not None:  # image-only keywords are not allowed in a table (FITS 4.0 sect. 7.3; fitsverify)
        header = header.copy()
        for key in _IMAGE_ONLY:
            header.remove(key, ignore_missing=True, remove_all=True)
    return fits.BinTableHDU.from_columns([col], header=header, name="DQ")


def read_product(path: str | os.PathLike, *, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray, fits.Header]:
    """Read an L2 product written by :func:`build_product_hdul`: the one reader of L2 files.

    Parameters
    ----------
    path : path-like
        The product FITS file.
    dtype : numpy dtype
        Of the returned image: ``float32`` (the file's own) by default; the light curves
        ask for ``float64``.

    Returns
    -------
    data : numpy.ndarray, shape (ny, nx), ``dtype``
        The first 2-D image HDU not named ``DQ`` or ``UNCERT`` (the primary HDU of an L2
        product), in ``header['BUNIT']``.
    dq : numpy.ndarray, shape (ny, nx), uint8
        Data-quality bits, 0 = good. Both layouts are read: the ``DQ`` image extension
        (current) and the older one-row table whose column ``DQ`` holds the 2-D mask.
        Without a ``DQ`` extension every pixel is good (zeros).
    header : astropy.io.fits.Header
        A copy of the image HDU's header.

    Raises
    ------
    pipelines.errors.FitsReadError
        If the file cannot be opened or read (``'<name>: unreadable product FITS (...)'``),
        has no 2-D image HDU, or its DQ mask differs in shape from the image. The message
        starts with the file's name (not its folder: messages reach API responses).
    """
    from pipelines.errors import FitsReadError

    name = os.path.basename(os.fspath(path))
    try:
        with fits.open(path, memmap=False) as hdul:
            hdu = next((h for h in hdul if h.name not in ("DQ", UNCERT_EXTNAME) and h.data is not None
                        and getattr(h.data, "ndim", 0) == 2), None)
            if hdu is None:
                raise FitsReadError(f"{name}: no 2-D image HDU")
            data = np.asarray(hdu.data, dtype=dtype)
            header = hdu.header.copy()
            if "DQ" in hdul:
                dq_hdu = hdul["DQ"]
                dq = dq_hdu.data["DQ"][0] if isinstance(dq_hdu, fits.BinTableHDU) else dq_hdu.data
                dq = np.asarray(dq, dtype=np.uint8)
            else:
                dq = np.zeros(data.shape, np.uint8)
    except FitsReadError:
        raise
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise FitsReadError(f"{name}: unreadable product FITS ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if dq.shape != data.shape:
        raise FitsReadError(f"{name}: DQ shape {dq.shape} differs from image shape {data.shape}")
    return data, dq, header


def read_uncertainty(path: str | os.PathLike, *, dtype: Any = np.float32) -> np.ndarray | None:
    """The ``UNCERT`` extension of an L2 product (1-sigma per pixel, in ``BUNIT``), or ``None``.

    ``None`` for products written before the extension existed.

    Raises
    ------
    pipelines.errors.FitsReadError
        If the file cannot be read, or its ``UNCERT`` is not a 2-D image.
    """
    from pipelines.errors import FitsReadError

    name = os.path.basename(os.fspath(path))
    try:
        with fits.open(path, memmap=False) as hdul:
            if UNCERT_EXTNAME not in hdul:
                return None
            u = hdul[UNCERT_EXTNAME].data
            if u is None or getattr(u, "ndim", 0) != 2:
                raise FitsReadError(f"{name}: {UNCERT_EXTNAME} extension is not a 2-D image")
            return np.asarray(u, dtype=dtype)
    except FitsReadError:
        raise
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise FitsReadError(f"{name}: unreadable product FITS ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


#: Header keywords stating a *relative* 1-sigma error common to every pixel of the frame
#: (one draw for the whole frame, so not in ``UNCERT``): ``RADUNC``, the radiometric scale's
#: error (:func:`pipelines.calibration.masters.radiometry.radiometric_uncertainty_at`: the
#: cross-calibration fit's error at DATE-OBS and the reference series' stated scale error).
#: The stray-light and flat-plane terms the chain states are per-pixel planes already in
#: ``UNCERT`` (:mod:`pipelines.calibration.l2.uncertainty`), so they are not added again.
FRAME_WIDE_RELATIVE_KEYS = ("RADUNC",)


def _finite_gradient(a: np.ndarray, ok: np.ndarray, axis: int) -> np.ndarray:
    """d a / d index along ``axis`` [a per pixel]: central difference where both neighbours are
    usable (``ok``), one-sided where one is, 0 where neither is."""
    a = np.where(ok, a, 0.0)
    fwd = np.zeros_like(a)
    bwd = np.zeros_like(a)
    okf = np.zeros_like(ok)
    okb = np.zeros_like(ok)
    sl = [slice(None)] * 2
    lo, hi = list(sl), list(sl)
    lo[axis], hi[axis] = slice(None, -1), slice(1, None)
    lo, hi = tuple(lo), tuple(hi)
    fwd[lo] = a[hi] - a[lo]
    okf[lo] = ok[hi] & ok[lo]
    bwd[hi] = a[hi] - a[lo]
    okb[hi] = ok[hi] & ok[lo]
    return np.where(okf & okb, 0.5 * (fwd + bwd), np.where(okf, fwd, np.where(okb, bwd, 0.0)))


def total_uncertainty_from(data: np.ndarray, uncert: np.ndarray | None, header: fits.Header,
                           dq: np.ndarray | None = None, *, parts: bool = False):
    """The total 1-sigma error of every pixel that a user can read from an L2 product (arrays in hand).

    ``sigma_total**2 = UNCERT**2 + sum_k (K_k |L2|)**2 + (dL2/dx sigma_x)**2 + (dL2/dy sigma_y)**2``

    * ``UNCERT``: the per-pixel random and per-pixel systematic terms the chain propagated
      (Poisson, read noise, ADC, dark, flat, stray light, flat plane;
      :mod:`pipelines.calibration.l2.uncertainty`);
    * ``K_k``: each frame-wide relative error of :data:`FRAME_WIDE_RELATIVE_KEYS` found in
      the header (``RADUNC``: the absolute scale), times the pixel's own value;
    * the disk centre's error propagated through the image gradient: the FITS WCS error
      keywords (FITS Standard 4.0, sect. 8.2) ``CRDERia`` (random) and ``CSYERia``
      (systematic), in ``CUNITia`` like ``CDELTi``, so ``sigma_x = hypot(CRDER1, CSYER1) / |CDELT1|``
      [pixel] (``sigma_y`` likewise with axis 2); a centre wrong by ``e`` pixels moves every
      value by ``-e . grad L2`` to first order. The gradient is the product's own (central
      differences over good pixels, one-sided next to masked ones).

    Every term is treated as independent of the others (added in quadrature). A frame-wide term
    (``RADUNC``, the centre) is *one* draw for the whole frame: the pixels of one frame share
    it, so their pulls are shifted together; the total is the error of a pixel of a product
    taken at random, not of a difference of two pixels of one frame.

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx)
        The L2 image (``BUNIT``).
    uncert : numpy.ndarray, shape (ny, nx), or None
        The ``UNCERT`` plane (same unit); None (a product without it): 0.
    header : astropy.io.fits.Header
        The L2 header (``RADUNC``, ``CRDERia``, ``CSYERia``, ``CDELTi``; missing keywords add nothing).
    dq : numpy.ndarray, shape (ny, nx), optional
        Data-quality bits: pixels with ``dq != 0`` are not used for the gradient.
    parts : bool
        Also return each term.

    Returns
    -------
    numpy.ndarray, shape (ny, nx), float64
        ``sigma_total`` in ``BUNIT`` (NaN where ``data`` is not finite). With ``parts``:
        ``(sigma_total, {"uncert": ..., "RADUNC": ..., "centre": ...})``, each a 1-sigma plane.

    Raises
    ------
    ValueError
        If the arrays differ in shape or are not 2-D.
    """
    d = np.asarray(data, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"data must be a 2-D image, got shape {d.shape}")
    u = np.zeros_like(d) if uncert is None else np.asarray(uncert, dtype=np.float64)
    if u.shape != d.shape or (dq is not None and np.shape(dq) != d.shape):
        raise ValueError(f"data {d.shape}, UNCERT {u.shape} and DQ {np.shape(dq)} must have one shape")
    ok = np.isfinite(d) if dq is None else np.isfinite(d) & (np.asarray(dq) == 0)
    terms = {"uncert": u}
    var = u ** 2
    for key in FRAME_WIDE_RELATIVE_KEYS:
        k = header.get(key)
        if k is not None and np.isfinite(float(k)):
            terms[key] = abs(float(k)) * np.abs(d)
            var = var + terms[key] ** 2
    cvar = np.zeros_like(d)
    for axis, img_axis in ((1, 1), (2, 0)):  # FITS axis 1 is x (numpy axis 1), axis 2 is y (numpy axis 0)
        err = math.hypot(float(header.get(f"CRDER{axis}", 0.0) or 0.0), float(header.get(f"CSYER{axis}", 0.0) or 0.0))
        scale = abs(float(header.get(f"CDELT{axis}", 0.0) or 0.0))
        if err > 0 and scale > 0:
            cvar += (_finite_gradient(d, ok, img_axis) * (err / scale)) ** 2
    terms["centre"] = np.sqrt(cvar)
    total = np.sqrt(var + cvar)
    total[~np.isfinite(d)] = np.nan
    return (total, terms) if parts else total


def total_uncertainty(hdul: fits.HDUList | str | os.PathLike, *, parts: bool = False):
    """The total 1-sigma error per pixel of an L2 product: ``UNCERT`` with the header's frame-wide errors.

    What :func:`total_uncertainty_from` computes, from a product as written by
    :func:`build_product_hdul` (HDU 0 data and header, the ``UNCERT`` and ``DQ`` extensions),
    given open or as a path. Compare an L2 value with another measurement with this error, not
    with ``UNCERT`` alone: ``UNCERT`` leaves out the errors that are one number for the whole
    frame (the radiometric scale ``RADUNC``, the disk centre ``CRDERia``/``CSYERia``).

    Example: ``pull = (L2 - reference) / total_uncertainty(path)``.

    Returns
    -------
    numpy.ndarray, shape (ny, nx), float64
        In the product's ``BUNIT``; with ``parts`` also the terms (:func:`total_uncertainty_from`).

    Raises
    ------
    pipelines.errors.FitsReadError
        If a path cannot be read as an L2 product.
    ValueError
        If the HDUs differ in shape.
    """
    if not isinstance(hdul, fits.HDUList):
        data, dq, header = read_product(hdul, dtype=np.float64)
        return total_uncertainty_from(data, read_uncertainty(hdul, dtype=np.float64), header, dq, parts=parts)
    img = next(h for h in hdul if getattr(h, "data", None) is not None and getattr(h.data, "ndim", 0) == 2
               and h.name not in ("DQ", UNCERT_EXTNAME))
    unc = hdul[UNCERT_EXTNAME].data if UNCERT_EXTNAME in hdul else None
    dq = hdul["DQ"].data if "DQ" in hdul and getattr(hdul["DQ"].data, "ndim", 0) == 2 else None
    return total_uncertainty_from(img.data, unc, img.header, dq, parts=parts)


def quicklook_image(data: np.ndarray, dq: np.ndarray, channel_code: str, size: int = 512) -> np.ndarray:
    """The quicklook as values in [0, 1] (NaN for masked pixels), at most ``size`` pixels a side.

    :func:`quicklook_stretch` of the block average
    :func:`pipelines.calibration.l2.device.quicklook_reduce` (which a GPU worker computes on
    the device: ``L2Result.quicklook``).
    """
    from pipelines.calibration.l2.device import quicklook_reduce

    return quicklook_stretch(quicklook_reduce(data, dq, size), channel_code)


def quicklook_stretch(a: np.ndarray, channel_code: str) -> np.ndarray:
    """Values in [0, 1] (NaN kept) of a block-averaged L2 frame
    (:func:`pipelines.calibration.l2.device.quicklook_reduce`, float64, NaN = masked).

    Stretch between the 0.5 and 99.9 percentiles of the good pixels: SDI asinh (plage,
    network and the limb readable together), WST linear (limb darkening and spots); the
    coronagraph (SCI) a log stretch between the 1 and 99.5 percentiles (the corona falls
    by orders of magnitude from 1.1 to 2.5 Rsun).
    """
    spec = get_channel(channel_code)
    a = np.asarray(a, dtype=np.float64)
    vals = a[np.isfinite(a)]
    if vals.size == 0:
        return np.full(a.shape, np.nan)
    if spec.is_coronagraph:
        lo, hi = np.percentile(vals, [1.0, 99.5])
        lo = max(lo, hi * 1e-3) if hi > 0 else lo
        if hi <= 0 or lo <= 0:
            out = (a - vals.min()) / max(np.ptp(vals), 1e-30)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                out = (np.log10(np.clip(a, lo, hi)) - np.log10(lo)) / max(np.log10(hi / lo), 1e-12)
    elif spec.code == "WST":  # photosphere: linear, the limb darkening and spots readable
        lo, hi = np.percentile(vals, [0.5, 99.9])
        out = (a - lo) / max(hi - lo, 1e-30)
    else:  # SDI: asinh, plage and network readable next to the quiet Sun and the limb
        lo, hi = np.percentile(vals, [0.5, 99.9])
        soft = 0.1
        x = np.clip((a - lo) / max(hi - lo, 1e-30), 0, 1)
        out = np.arcsinh(x / soft) / np.arcsinh(1 / soft)
    return np.where(np.isfinite(a), np.clip(out, 0, 1), np.nan)


_CMAPS = {"SDI": "inferno", "WST": "gray", "SCI-UV": "viridis", "SCI-WL": "bone"}


def write_quicklook_png(data: np.ndarray, dq: np.ndarray, path: str | os.PathLike, channel_code: str,
                        size: int = QUICKLOOK_SIZE, *, tmp_dir: str | os.PathLike | None = None,
                        reduced: np.ndarray | None = None, defer: bool = False):
    """Write a small PNG quicklook of an L2 frame (atomically, :func:`pipelines.fitsio.write_atomic`).

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx)
        L2 data, north up (row 0 at the bottom, as FITS).
    dq : numpy.ndarray of uint8, shape (ny, nx)
        Masked pixels (DQ != 0) are drawn black.
    path : path-like
        Output ``.png``.
    channel_code : str
        ``SDI``, ``WST``, ``SCI-UV`` or ``SCI-WL``: chooses the stretch and colour map.
    size : int
        Largest side in pixels (block-averaged down to it).
    tmp_dir : path-like, optional
        Folder of the temporary file during the write, on the file system of ``path``
        (products give the store's :func:`pipelines.fitsio.store_tmp_dir`). Default: beside
        ``path`` under a hidden ``.part.png`` name.
    reduced : numpy.ndarray, optional
        The block average already made (``L2Result.quicklook``: on the device, by
        :func:`pipelines.calibration.l2.device.quicklook_reduce` with this ``size``); then
        ``data`` and ``dq`` are not read.
    defer : bool
        Leave the file under its temporary name: return a
        :class:`pipelines.fitsio.PendingFile` to commit or discard.

    Returns
    -------
    pathlib.Path or pipelines.fitsio.PendingFile
        ``path`` (with ``defer``, the pending file).

    Raises
    ------
    ValueError
        If ``tmp_dir`` is on another file system than ``path``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import colormaps
    from matplotlib.image import imsave

    if reduced is not None:  # made for this size? (block f = ceil(max side / size), ny // f x nx // f)
        f = max(1, int(np.ceil(max(np.shape(data)) / size)))
        if tuple(np.shape(reduced)) != (np.shape(data)[0] // f, np.shape(data)[1] // f):
            reduced = None
    img = quicklook_image(data, dq, channel_code, size) if reduced is None else quicklook_stretch(reduced, channel_code)
    cmap = colormaps[_CMAPS.get(get_channel(channel_code).code, "gray")].with_extremes(bad="black")
    rgba = cmap(np.ma.masked_invalid(img), bytes=True)
    return write_atomic(path, lambda f: imsave(f, rgba, origin="lower", format="png"), tmp_dir=tmp_dir,
                        suffix=".part.png", defer=defer)

