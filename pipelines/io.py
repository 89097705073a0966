"""Loading LST L2 products for science: :func:`load_l2`.

``lstdp`` (the distribution's name) is not an importable package; the platform's Python
packages are ``pipelines`` and ``backend``, so the loader is ``pipelines.io.load_l2``.

What a product file holds (:mod:`pipelines.products`): HDU 0 the data (float32, ``BUNIT``),
``UNCERT`` the 1-sigma uncertainty per pixel (same unit), ``DQ`` the uint8 quality bits
(0 = good). What the usual readers return for it:

* :func:`load_l2` (and, without the platform installed, ``lstdp_client.open_l2`` of the
  Python client): one map with ``mask`` and ``uncertainty`` set;
* ``sunpy.map.Map(path, hdus=0)``: the data map alone, with ``.unit`` from ``BUNIT``
  (``erg / (s sr cm2)`` for SDI/WST; for SCI ``dimensionless``: the data are in MSB, and
  ``MSBVALUE`` is 1 MSB in erg cm-2 s-1 sr-1) but no mask and no uncertainty. Without
  ``hdus=0`` sunpy makes a map of every 2-D image HDU: a list of three (data, uncertainty, DQ).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["load_l2"]


def load_l2(path: str | os.PathLike) -> Any:
    """One L2 product as a ``sunpy.map.GenericMap`` with its mask and uncertainty.

    Parameters
    ----------
    path : path-like
        An L2 product FITS file (:func:`pipelines.products.build_product_hdul`); products of
        the older layout (DQ as a binary table, no ``UNCERT``) are read too.

    Returns
    -------
    sunpy.map.GenericMap
        ``data`` float32 (ny, nx) in ``map.unit``; ``mask`` bool (ny, nx), True where the DQ
        is non-zero or the data are not finite; ``uncertainty`` an
        ``astropy.nddata.StdDevUncertainty`` (ny, nx) in the data's unit, or ``None`` for a
        product without ``UNCERT``. ``map.meta['bunit']`` is always astropy-readable and,
        for SCI, 1 MSB as a radiance: the file's dimensionless ``BUNIT`` (or an older
        product's ``'MSB'``) is rewritten as ``MSBVALUE`` erg cm-2 s-1 sr-1
        (:func:`pipelines.units.header_unit`).

    Raises
    ------
    pipelines.errors.FitsReadError
        If the file cannot be read or is not an L2 product (no 2-D image, shapes differ).

    Examples
    --------
    >>> m = load_l2("lst_sci-wl_20230501T000000_l2.fits")  # doctest: +SKIP
    >>> m.quantity.to("erg cm-2 s-1 sr-1")                   # doctest: +SKIP
    >>> snr = m.data / m.uncertainty.array                  # doctest: +SKIP
    """
    import sunpy.map
    from astropy.nddata import StdDevUncertainty

    from pipelines.errors import FitsReadError
    from pipelines.products import read_product, read_uncertainty
    from pipelines.units import RADIANCE_UNIT, header_unit

    data, dq, header = read_product(path)
    sigma = read_uncertainty(path)
    if sigma is not None and sigma.shape != data.shape:
        raise FitsReadError(f"{os.path.basename(os.fspath(path))}: UNCERT shape {sigma.shape} differs from "
                            f"image shape {data.shape}")
    unit = header_unit(header)
    if unit is not None and str(header.get("BUNIT", "") or "").strip().upper() in ("MSB", ""):
        # SCI: the file's BUNIT is dimensionless (MSB, strict FITS) or an older 'MSB'; the map
        # gets 1 MSB as a radiance, so that map.quantity converts to erg cm-2 s-1 sr-1
        header["BUNITNAM"] = ("MSB", "data in mean solar brightness")
        scale = (1 * unit).to_value(RADIANCE_UNIT)
        header["BUNIT"] = (f"{scale:.9E} {RADIANCE_UNIT}", "1 MSB as a radiance")
    mask = (dq != 0) | ~np.isfinite(data)
    kwargs: dict[str, Any] = {"mask": mask}
    if sigma is not None:
        kwargs["uncertainty"] = StdDevUncertainty(sigma)
    return sunpy.map.Map(data, header, **kwargs)
