"""Open an LST L2 product as one sunpy map with its uncertainty and mask: :func:`open_l2`.

An L2 product file holds three images (the platform's ``pipelines.products``): HDU 0 the
data (float32, ``BUNIT``), ``UNCERT`` the 1-sigma uncertainty of each pixel (same unit) and
``DQ`` the uint8 data-quality bits (0 = good). They are image extensions so that DS9,
JHelioviewer and ``fitsverify`` show them; ``sunpy.map.Map`` makes a map of *every* 2-D
image HDU, so ``sunpy.map.Map(path)`` alone gives three maps. Open a product with:

* :func:`open_l2` (this module): **one** ``GenericMap`` whose ``uncertainty`` is the
  ``UNCERT`` image (``astropy.nddata.StdDevUncertainty``) and whose ``mask`` is True where
  ``DQ`` is non-zero or the data are not finite;
* ``sunpy.map.Map(path, hdus=0)``: the data map alone, with neither.

Products written before ``UNCERT`` existed (``DQ`` as a one-row binary table) are read too
(``uncertainty`` is then ``None``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["open_l2", "UNCERT_EXTNAME", "DQ_EXTNAME"]

#: EXTNAME of the uncertainty image and of the data-quality bits of an L2 product.
UNCERT_EXTNAME = "UNCERT"
DQ_EXTNAME = "DQ"


def open_l2(path: str | os.PathLike) -> Any:
    """One L2 product as a :class:`sunpy.map.GenericMap` with its uncertainty and mask attached.

    Parameters
    ----------
    path : path-like
        An L2 product FITS file of the platform (e.g. from :meth:`lstdp_client.Client.download`).

    Returns
    -------
    sunpy.map.GenericMap
        ``data`` float32, shape (ny, nx), in ``map.unit`` (``BUNIT``); ``uncertainty`` an
        ``astropy.nddata.StdDevUncertainty`` of shape (ny, nx) in the same unit (``None`` for
        a product without ``UNCERT``); ``mask`` bool, shape (ny, nx), True where ``DQ != 0``
        or the data are NaN/inf (the DQ bits themselves are in ``map.meta`` COMMENT cards and
        on the platform's product page). ``map.meta`` is HDU 0's header. SCI data are in MSB
        (mean solar brightness): ``BUNIT`` is dimensionless (strict FITS) and
        ``map.meta['msbvalue']`` is 1 MSB in erg cm-2 s-1 sr-1; ``map.meta['quality']`` is the
        frame-wide quality word (0: no systematic flagged; its reasons in ``centfail``,
        ``stryfail``, ``flatplan``).

    Raises
    ------
    OSError
        If the file cannot be read as FITS.
    ValueError
        If it holds no 2-D data image, or ``UNCERT``/``DQ`` differ in shape from the data.

    Examples
    --------
    >>> from lstdp_client import open_l2
    >>> m = open_l2("lst_sdi_l2_20040301T030000_f12_v1.fits")     # doctest: +SKIP
    >>> snr = m.data / m.uncertainty.array                          # doctest: +SKIP
    >>> good = m.data[~m.mask]                                      # doctest: +SKIP
    """
    import sunpy.map
    from astropy.io import fits
    from astropy.nddata import StdDevUncertainty

    name = os.path.basename(os.fspath(path))
    with fits.open(path, memmap=False) as hdul:
        image = next((h for h in hdul if h.name not in (DQ_EXTNAME, UNCERT_EXTNAME) and h.is_image
                      and h.data is not None and h.data.ndim == 2), None)
        if image is None:
            raise ValueError(f"{name}: no 2-D data image: not an L2 product")
        data = np.asarray(image.data, dtype=np.float32)
        header = image.header.copy()
        sigma = None
        if UNCERT_EXTNAME in hdul:
            sigma = np.asarray(hdul[UNCERT_EXTNAME].data, dtype=np.float32)
        dq = np.zeros(data.shape, np.uint8)
        if DQ_EXTNAME in hdul:
            dq_hdu = hdul[DQ_EXTNAME]
            dq = np.asarray(dq_hdu.data["DQ"][0] if isinstance(dq_hdu, fits.BinTableHDU) else dq_hdu.data,
                            dtype=np.uint8)
    for what, arr in ((UNCERT_EXTNAME, sigma), (DQ_EXTNAME, dq)):
        if arr is not None and arr.shape != data.shape:
            raise ValueError(f"{name}: {what} shape {arr.shape} differs from the data's {data.shape}")
    kwargs: dict[str, Any] = {"mask": (dq != 0) | ~np.isfinite(data)}
    if sigma is not None:
        kwargs["uncertainty"] = StdDevUncertainty(sigma)
    return sunpy.map.Map(data, header, **kwargs)
