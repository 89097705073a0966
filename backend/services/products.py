"""L2 products: read-side queries, file locations, and the disk-integrated light curve.

Product FITS layout (written by the calibration tasks, read by
:func:`pipelines.products.read_product`): the image in physical units (``BUNIT``;
float32) in the first HDU with 2-D data that is not named ``DQ`` (normally the primary
HDU), and a data-quality mask ``DQ`` of the same shape (a one-row table column; an older
image-HDU layout is also read), where any non-zero value marks a pixel not to be used
(occulter, outside the field of view, saturated, cosmic ray...). ``Product.path`` and
``Product.quicklook_path`` are absolute, or relative to the product store
(``Settings.products``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, joinedload, selectinload

from backend.models import Event, EventProduct, Frame, JobItem, Product, ProductState
from pipelines.channels import CHANNELS, get_channel
from pipelines.errors import DataError, FitsReadError
from backend.store import is_object_ref, product_store
from pipelines.products import read_product, read_uncertainty
from pipelines.sun import apparent_rsun_arcsec
from pipelines.units import display_unit
from pipelines.utc import as_utc

__all__ = [
    "product_conditions",
    "list_products",
    "job_product_states",
    "quality_condition",
    "event_systematics",
    "get_product",
    "product_ids_for_event",
    "latest_products_in_window",
    "latest_quicklooks_by_channel",
    "resolve_store_path",
    "served_store_path",
    "DiskMean",
    "disk_integrated_mean",
    "LightCurve",
    "product_lightcurve",
    "event_lightcurve",
    "event_window",
    "sample_evenly",
]

log = logging.getLogger(__name__)


# -- queries ------------------------------------------------------------------------------


def _filtered(
    stmt: Select,
    *,
    channel: str | None,
    start: dt.datetime | None,
    end: dt.datetime | None,
    state: ProductState | None,
    frame_id: int | None,
    job_id: str | None = None,
) -> Select:
    if channel is not None:
        stmt = stmt.where(Frame.channel_code == channel)
    if start is not None:
        stmt = stmt.where(Frame.date_obs >= start)
    if end is not None:
        stmt = stmt.where(Frame.date_obs <= end)
    if state is not None:
        stmt = stmt.where(Product.state == state)
    if frame_id is not None:
        stmt = stmt.where(Product.frame_id == frame_id)
    if job_id is not None:  # exactly the job's products: those its items name (job_items.product_id)
        stmt = stmt.where(Product.id.in_(select(JobItem.product_id).where(JobItem.job_id == job_id)))
    return stmt


def product_conditions(principal: Any = None, *, calibration_set: int | None = None,
                       level: str | None = None, systematics: str | None = None) -> list:
    """SQL conditions on ``products`` of a product search: the products ``principal`` may see
    (:func:`backend.services.visibility.condition`: a private calibration set's only to its
    owner and admins), of calibration set ``calibration_set`` (its id), of ``level`` (``L2``)
    and flagged with the frame-wide systematic ``systematics`` (``any`` or a name of
    :data:`pipelines.calibration.l2.quality.SYSTEMATICS`: :func:`quality_condition` on
    ``products.quality_flags``) when given; for ``conditions=`` of :func:`list_products` and
    :func:`backend.services.bulk.search_products` (the API's list and archive, the product
    search page, saved searches).

    Raises
    ------
    KeyError
        ``systematics`` is neither ``any`` nor a known systematic (:func:`quality_condition`)."""
    from backend.services import visibility

    conds = [c for c in (visibility.condition(Product, principal),) if c is not None]
    if calibration_set is not None:
        conds.append(Product.calibration_set_id == calibration_set)
    if level is not None:
        conds.append(Product.level == level)
    if systematics is not None:
        conds.append(quality_condition(Product.quality_flags, systematics))
    return conds


def list_products(
    session: Session,
    *,
    channel: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    state: ProductState | None = None,
    frame_id: int | None = None,
    job_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
    conditions: Sequence = (),
) -> tuple[list[Product], int]:
    """Products filtered by their frame's channel and DATE-OBS, state, frame and job
    (``job_id``: the products of the job's items, ``job_items.product_id``), and by further
    SQL ``conditions`` on products (e.g. who may see them,
    :func:`backend.services.set_access.product_condition`).

    Every version of a product is listed (ordered by DATE-OBS, then version, then id).

    Returns
    -------
    rows : list of Product
        One page; ``Product.frame`` is loaded.
    total : int
        Number of products matching the filters (all pages).
    """
    kw = dict(channel=channel, start=start, end=end, state=state, frame_id=frame_id, job_id=job_id)
    total = session.scalar(_filtered(select(func.count(Product.id)).join(Product.frame), **kw)
                           .where(*conditions)) or 0
    stmt = (
        _filtered(select(Product).join(Product.frame), **kw).where(*conditions)
        .options(joinedload(Product.frame))
        .order_by(Frame.date_obs, Product.version, Product.id)
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(stmt)), total


def quality_condition(column: Any, systematic: str) -> Any:
    """SQL condition: the quality word ``column`` (``Product.quality_flags``) has ``systematic`` set.

    Parameters
    ----------
    column : SQLAlchemy column expression of integers
        Bits of :class:`pipelines.calibration.l2.quality.FrameQuality`.
    systematic : str
        A name of :data:`pipelines.calibration.l2.quality.SYSTEMATICS` (``centre_refused``, ...),
        or ``any`` (any bit set).

    Raises
    ------
    KeyError
        If ``systematic`` is neither.
    """
    from pipelines.calibration.l2.quality import SYSTEMATICS

    if systematic == "any":
        return column != 0
    return column.op("&")(int(SYSTEMATICS[systematic])) != 0


def event_systematics(session: Session, event_id: int) -> list[dict[str, Any]]:
    """The L2 products linked to an event (``event_products``) on which the calibration flagged a
    frame-wide systematic (``quality_flags`` != 0), by id.

    Returns
    -------
    list of dict
        ``product_id``, ``channel``, ``date_obs`` (aware UTC) and ``reasons``, ``{bit name:
        reason}`` (:func:`pipelines.calibration.l2.quality.quality_reasons` of the stored header).
    """
    from pipelines.calibration.l2.quality import quality_names, quality_reasons

    rows = session.execute(
        select(Product).join(EventProduct, EventProduct.product_id == Product.id)
        .where(EventProduct.event_id == event_id, Product.quality_flags != 0)
        .options(joinedload(Product.frame)).order_by(Product.id)).scalars().all()
    out = []
    for p in rows:
        reasons = quality_reasons({**(p.header or {}), "QUALITY": p.quality_flags})
        out.append({"product_id": p.id, "channel": p.frame.channel_code, "date_obs": as_utc(p.frame.date_obs),
                    "names": quality_names(p.quality_flags), "reasons": reasons})
    return out


def job_product_states(session: Session, job_id: str, conditions: Sequence = ()) -> dict[str, int]:
    """``{state: count}`` of the products of job ``job_id``'s items (``job_items.product_id``)
    that match the SQL ``conditions`` (e.g. who may see them), in one query; states without a
    product are left out. What the job page shows beside the job's own counts."""
    q = (select(Product.state, func.count(Product.id))
         .where(Product.id.in_(select(JobItem.product_id).where(JobItem.job_id == job_id)), *conditions)
         .group_by(Product.state))
    return {(st.value if hasattr(st, "value") else str(st)): int(n) for st, n in session.execute(q).all()}


def get_product(session: Session, product_id: int) -> Product | None:
    """The product with id ``product_id`` (frame and calibration files loaded) or ``None``."""
    return session.scalar(
        select(Product)
        .where(Product.id == product_id)
        .options(joinedload(Product.frame), selectinload(Product.calibration_files))
    )


def product_ids_for_event(session: Session, event_id: int) -> list[int]:
    """Ids of the products an event is linked to (``event_products``), ascending."""
    return list(session.scalars(
        select(EventProduct.product_id).where(EventProduct.event_id == event_id).order_by(EventProduct.product_id)
    ))


def _latest_per_frame(calibration_set: int | None = None) -> Select:
    """Ids of the product shown for every frame: its public product (the written product of
    its public calibration set promoted or made last,
    :func:`backend.services.set_access.public_series_ids`; never one of a private set), or,
    with ``calibration_set``, its written product of that set."""
    if calibration_set is not None:
        return select(Product.id).where(Product.state == ProductState.written,
                                        Product.calibration_set_id == calibration_set)
    from backend.services.set_access import public_series_ids

    sub = public_series_ids(None, None).subquery()
    return select(sub.c.product_id)


def latest_products_in_window(
    session: Session,
    start: dt.datetime,
    end: dt.datetime,
    *,
    channel: str | None = None,
    with_quicklook: bool = False,
    limit: int | None = None,
    calibration_set: int | None = None,
) -> list[Product]:
    """The public product of every frame with DATE-OBS in [``start``, ``end``] (one set per
    frame: :func:`_latest_per_frame`), or its product of ``calibration_set`` when given.

    Parameters
    ----------
    start, end : datetime
        Aware UTC bounds on DATE-OBS (inclusive).
    channel : str, optional
        Restrict to one channel.
    with_quicklook : bool
        Only products that have a quicklook image.
    limit : int, optional
        At most this many rows.

    Returns
    -------
    list of Product
        Ordered by DATE-OBS; ``Product.frame`` is loaded.
    """
    stmt = (
        select(Product)
        .join(Product.frame)
        .where(Product.id.in_(_latest_per_frame(calibration_set)), Frame.date_obs >= start, Frame.date_obs <= end)
        .options(joinedload(Product.frame))
        .order_by(Frame.date_obs, Product.id)
    )
    if channel is not None:
        stmt = stmt.where(Frame.channel_code == channel)
    if with_quicklook:
        stmt = stmt.where(Product.quicklook_path.is_not(None))
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(session.scalars(stmt))


def latest_quicklooks_by_channel(session: Session, per_channel: int = 6) -> dict[str, list[Product]]:
    """For each of LST's channels, its ``per_channel`` most recent products with a quicklook.

    Only the newest written version of each frame is considered. Every channel code is a
    key, with an empty list when the channel has no product yet.

    Returns
    -------
    dict of str to list of Product
        Newest DATE-OBS first; ``Product.frame`` is loaded.
    """
    out: dict[str, list[Product]] = {}
    for code in CHANNELS:
        stmt = (
            select(Product)
            .join(Product.frame)
            .where(
                Product.id.in_(_latest_per_frame()),
                Frame.channel_code == code,
                Product.quicklook_path.is_not(None),
            )
            .options(joinedload(Product.frame))
            .order_by(Frame.date_obs.desc(), Product.id.desc())
            .limit(per_channel)
        )
        out[code] = list(session.scalars(stmt))
    return out


def resolve_store_path(path: str | None, root: Path) -> Path | None:
    """The absolute location of a stored file (``path`` absolute, or relative to ``root``).

    An object of the object store (``s3://...``, :mod:`backend.store`) is fetched into the
    bounded local cache, checked against its SHA-256, and that file returned (``root`` is
    then not used); an object that is not there gives ``None``."""
    if not path:
        return None
    if is_object_ref(path):
        return _cached_object(path)
    p = Path(path)
    return p if p.is_absolute() else root / p


def _cached_object(ref: str) -> Path | None:
    store = product_store()
    key = store.key_of(ref)
    if key is None:
        log.warning("refused to serve %s: not in the product store %s", ref, store.url)
        return None
    try:
        return store.local_file(key)
    except FileNotFoundError:
        return None


def served_store_path(path: str | None, root: Path) -> Path | None:
    """:func:`resolve_store_path`, confined to the store: the file to serve, with links and
    ``..`` resolved, or ``None`` when the row names no file, no file is there, or it lies
    outside ``root`` (a path outside the store is never served, whatever the row says)."""
    if is_object_ref(path):
        return _cached_object(path)
    p = resolve_store_path(path, root)
    if p is None:
        return None
    real, store = p.resolve(), Path(root).resolve()
    if not real.is_relative_to(store):
        log.warning("refused to serve %s: outside the product store %s", real, store)
        return None
    return real if real.is_file() else None


# -- disk-integrated mean -------------------------------------------------------------------


@dataclass(frozen=True)
class DiskMean:
    """Mean of the usable pixels of one L2 image.

    Attributes
    ----------
    value : float
        Mean over the pixels used, in ``unit``.
    unit : str
        ``BUNIT`` of the product (empty if absent).
    n_pixels : int
        Number of pixels averaged.
    on_disk_only : bool
        True when the average was restricted to the solar disk (r <= Rsun).
    sigma : float or None
        1-sigma uncertainty of ``value`` in ``unit``, from the product's ``UNCERT``
        extension (:func:`mean_uncertainty`); None for a product without one.
    """

    value: float
    unit: str
    n_pixels: int
    on_disk_only: bool
    sigma: float | None = None


def mean_uncertainty(sigma: np.ndarray | None, used: np.ndarray) -> float | None:
    """1-sigma uncertainty of the mean of the pixels ``used`` of an L2 image, from its
    per-pixel ``UNCERT`` (``sigma``, in the image's unit): ``sqrt(sum sigma_i^2) / n``.

    The pixels' errors are taken as independent (propagation of the per-pixel standard
    deviations, :mod:`pipelines.calibration.l2.uncertainty`); the north-up resampling correlates
    neighbouring pixels over its kernel (a few pixels), so for a mean over many pixels this
    is a lower bound of the random error; systematic (calibration scale) errors are not in it.

    Parameters
    ----------
    sigma : numpy.ndarray, shape (ny, nx), or None
        The ``UNCERT`` image (None: a product without it).
    used : numpy.ndarray of bool, shape (ny, nx)
        The pixels averaged.

    Returns
    -------
    float or None
        None without ``UNCERT``, or when a pixel used has no finite uncertainty.
    """
    if sigma is None:
        return None
    s = np.asarray(sigma, dtype=np.float64)[used]
    n = s.size
    if n == 0 or not np.isfinite(s).all():
        return None
    return float(math.sqrt(float(np.sum(s * s))) / n)


def _apparent_rsun_arcsec(header: fits.Header) -> float | None:
    """:func:`pipelines.sun.apparent_rsun_arcsec` (also reading ``RSUN``), or ``None`` if the
    header cannot tell."""
    try:
        return apparent_rsun_arcsec(header, keys=("RSUN_OBS", "RSUN_ARC", "RSUN"))
    except DataError:
        return None


def _disk_mask(header: fits.Header, shape: tuple[int, int]) -> np.ndarray | None:
    """Boolean mask of on-disk pixels from the WCS, or ``None`` if the header cannot say."""
    from astropy.wcs import WCS, FITSFixedWarning
    from astropy.wcs.utils import proj_plane_pixel_scales
    import warnings

    rsun = _apparent_rsun_arcsec(header)
    if rsun is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FITSFixedWarning)
            w = WCS(header, naxis=2)
        if not w.has_celestial:
            return None
        x0, y0 = w.world_to_pixel_values(0.0, 0.0)  # disk centre: helioprojective (0, 0)
        scales = proj_plane_pixel_scales(w)  # [deg / pixel], wcslib normalises to deg
    except Exception:  # noqa: BLE001 - any WCS the library cannot use means "cannot say"
        return None
    sx, sy = float(scales[0]) * 3600.0, float(scales[1]) * 3600.0
    if not (np.isfinite([x0, y0, sx, sy]).all() and sx > 0 and sy > 0):
        return None
    ny, nx = shape
    yy, xx = np.ogrid[0:ny, 0:nx]
    r2 = ((xx - float(x0)) * sx) ** 2 + ((yy - float(y0)) * sy) ** 2
    return r2 <= rsun * rsun


@lru_cache(maxsize=4096)
def _disk_mean_cached(path: str, _mtime_ns: int, _size: int, on_disk_only: bool) -> DiskMean | None:
    data, dq, header = read_product(path, dtype=np.float64)
    good = np.isfinite(data) & (dq == 0)
    used_disk = False
    if on_disk_only:
        disk = _disk_mask(header, data.shape)
        if disk is not None:
            good &= disk
            used_disk = True
    n = int(good.sum())
    if n == 0:
        return None
    return DiskMean(value=float(data[good].mean()), unit=display_unit(header),
                    n_pixels=n, on_disk_only=used_disk,
                    sigma=mean_uncertainty(_uncertainty_of(path, data.shape), good))


def _uncertainty_of(path: str | os.PathLike, shape: tuple[int, int]) -> np.ndarray | None:
    """The ``UNCERT`` image of a product, or None (none, or not of the image's shape)."""
    sigma = read_uncertainty(path, dtype=np.float64)
    return sigma if sigma is not None and sigma.shape == shape else None


def curve_values_cached(path, roi_box, coronagraph: bool) -> bool:
    """Whether the disk mean (and the ROI mean of ``roi_box``) of the file at ``path`` are in the
    caches of :func:`disk_integrated_mean` and :func:`region_mean` (no file read needed)."""
    if path is None:
        return True
    try:
        st = Path(path).stat()
    except OSError:
        return True  # nothing to read: the caller reports the missing file
    key = (str(path), st.st_mtime_ns, st.st_size)
    if (*key, not coronagraph) not in _DISK_KEYS:
        return False
    return roi_box is None or (*key, *map(float, roi_box)) in _REGION_KEYS


_DISK_KEYS: set = set()
_REGION_KEYS: set = set()


def region_mean(path: str | os.PathLike, hpc_x: float, hpc_y: float, half_width: float) -> DiskMean | None:
    """Mean of the usable pixels of an L2 product in a helioprojective box (cached per file
    path, modification time, size and box).

    Parameters
    ----------
    path : path-like
        L2 product FITS (:func:`pipelines.products.read_product` layout).
    hpc_x, hpc_y : float
        Box centre, helioprojective [arcsec].
    half_width : float
        Half side of the box [arcsec].

    Returns
    -------
    DiskMean or None
        ``None`` when no usable pixel (finite, DQ 0) lies in the box.

    Raises
    ------
    FitsReadError
        If the file is not a readable L2 product.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise FitsReadError(f"no such product file: {p}") from None
    key = (str(p), st.st_mtime_ns, st.st_size, float(hpc_x), float(hpc_y), float(half_width))
    out = _region_mean_cached(*key)
    if len(_REGION_KEYS) > 8192:
        _REGION_KEYS.clear()
    _REGION_KEYS.add(key)
    return out


@lru_cache(maxsize=4096)
def _region_mean_cached(path: str, _mtime_ns: int, _size: int, hpc_x: float, hpc_y: float,
                        half_width: float) -> DiskMean | None:
    return _region_mean(path, hpc_x, hpc_y, half_width)


def _region_mean(path: str | os.PathLike, hpc_x: float, hpc_y: float, half_width: float) -> DiskMean | None:
    """Uncached :func:`region_mean`."""
    import warnings

    from astropy.wcs import WCS

    data, dq, header = read_product(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wcs = WCS(header, naxis=2)
    (x0, x1), (y0, y1) = wcs.world_to_pixel_values(
        [(hpc_x - half_width) / 3600.0, (hpc_x + half_width) / 3600.0],
        [(hpc_y - half_width) / 3600.0, (hpc_y + half_width) / 3600.0])
    ny, nx = data.shape
    i0, i1 = max(0, int(math.floor(min(y0, y1)))), min(ny, int(math.ceil(max(y0, y1))) + 1)
    j0, j1 = max(0, int(math.floor(min(x0, x1)))), min(nx, int(math.ceil(max(x0, x1))) + 1)
    if i0 >= i1 or j0 >= j1:
        return None
    box = data[i0:i1, j0:j1]
    good = np.isfinite(box) & (dq[i0:i1, j0:j1] == 0)
    n = int(good.sum())
    if n == 0:
        return None
    sigma = _uncertainty_of(path, data.shape)
    return DiskMean(value=float(box[good].mean()), unit=display_unit(header),
                    n_pixels=n, on_disk_only=False,
                    sigma=mean_uncertainty(None if sigma is None else sigma[i0:i1, j0:j1], good))


def disk_integrated_mean(path: str | os.PathLike, *, on_disk_only: bool = True) -> DiskMean | None:
    """Mean of the usable pixels of an L2 product FITS file.

    Pixels are used when they are finite and their ``DQ`` value is 0. For the disk
    imagers (``on_disk_only=True``: SDI, WST) the average is further restricted to the
    solar disk, r <= Rsun, with the disk centre and pixel scale taken from the
    helioprojective WCS and the apparent radius from ``RSUN_OBS``/``RSUN_ARC`` or
    ``RSUN_REF``/``DSUN_OBS``; without those keywords every usable pixel counts. For
    the coronagraph channels pass ``on_disk_only=False``: the mean MSB over the unmasked
    coronal field.

    Parameters
    ----------
    path : path-like
        Product FITS file (image HDU + ``DQ`` mask of the same shape).
    on_disk_only : bool
        Restrict to on-disk pixels when the header allows it.

    Returns
    -------
    DiskMean or None
        ``None`` when no pixel is usable.

    Raises
    ------
    FitsReadError
        If the file cannot be read or its DQ mask does not match the image.

    Notes
    -----
    Results are cached per (path, modification time, size).
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise FitsReadError(f"no such product file: {p}") from None
    out = _disk_mean_cached(str(p), st.st_mtime_ns, st.st_size, on_disk_only)
    if len(_DISK_KEYS) > 8192:
        _DISK_KEYS.clear()
    _DISK_KEYS.add((str(p), st.st_mtime_ns, st.st_size, on_disk_only))
    return out


# -- light curves ---------------------------------------------------------------------------


@dataclass
class LightCurve:
    """A disk-integrated light curve from L2 products.

    ``times`` are the DATE-OBS of the products (aware UTC), ``values`` the means in
    ``unit`` (None for a product whose region is all masked or NaN: a gap, not a value),
    ``product_ids`` the product of each point; ``skipped`` lists products that could not be
    read, with the reason.
    """

    channel: str
    start: dt.datetime
    end: dt.datetime
    unit: str
    region: str = "disk"
    roi: tuple[float, float, float] | None = None
    times: list[dt.datetime] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    #: 1-sigma uncertainty of each value in ``unit`` (from ``UNCERT``, :func:`mean_uncertainty`);
    #: None where unknown (a product without ``UNCERT``) or the value is a gap.
    sigmas: list[float | None] = field(default_factory=list)
    product_ids: list[int] = field(default_factory=list)
    skipped: list[dict[str, object]] = field(default_factory=list)
    #: Ids of the calibration sets of the products read (one per frame), in order of first use.
    calibration_sets: list[int] = field(default_factory=list)


def product_lightcurve(
    session: Session,
    *,
    channel: str,
    start: dt.datetime,
    end: dt.datetime,
    product_root: Path,
    max_points: int = 2000,
    roi: tuple[float, float, float] | None = None,
    calibration_set: int | None = None,
) -> LightCurve:
    """Disk-integrated (or region) mean of the public L2 product of every frame (its public
    calibration set's, :func:`latest_products_in_window`), or of its product of
    ``calibration_set`` when given: one calibration set per frame, never a private set's
    product unless asked for. ``LightCurve.calibration_sets`` lists the sets used.

    Parameters
    ----------
    channel : str
        Canonical channel code. SDI and WST are averaged over the solar disk; SCI-UV
        and SCI-WL over their unmasked coronal field (MSB).
    start, end : datetime
        Aware UTC bounds on DATE-OBS.
    product_root : Path
        The product store, for relative ``Product.path`` values.
    max_points : int
        At most this many products are read (the earliest ones).
    roi : (hpc_x, hpc_y, half_width), optional
        Average over this helioprojective box [arcsec] instead of the disk.

    Returns
    -------
    LightCurve
        Unit from the products' ``BUNIT`` (the channel's nominal unit if they have none).
    """
    spec = get_channel(channel)
    lc = LightCurve(channel=spec.code, start=start, end=end, unit="", region="roi" if roi else (
        "field" if spec.is_coronagraph else "disk"), roi=roi)
    units: set[str] = set()
    for p in latest_products_in_window(session, start, end, channel=spec.code, limit=max_points,
                                       calibration_set=calibration_set):
        if p.calibration_set_id is not None and p.calibration_set_id not in lc.calibration_sets:
            lc.calibration_sets.append(p.calibration_set_id)
        path = resolve_store_path(p.path, product_root)
        if path is None:
            lc.skipped.append({"product_id": p.id, "reason": "no file recorded"})
            continue
        try:
            m = region_mean(path, *roi) if roi else disk_integrated_mean(path, on_disk_only=not spec.is_coronagraph)
        except FitsReadError as exc:
            log.warning("light curve: product %s skipped: %s", p.id, exc)
            lc.skipped.append({"product_id": p.id, "reason": str(exc)})
            continue
        lc.times.append(as_utc(p.frame.date_obs))
        lc.product_ids.append(p.id)
        # no usable pixel (all masked or NaN): the sample is missing, a gap in the curve
        value = None if m is None or m.value is None or not math.isfinite(m.value) else float(m.value)
        lc.values.append(value)
        lc.sigmas.append(None if value is None or m.sigma is None or not math.isfinite(m.sigma) else float(m.sigma))
        if m is not None and m.unit:
            units.add(m.unit)
    if len(units) > 1:
        log.warning("light curve of %s mixes units %s", spec.code, sorted(units))
    lc.unit = ", ".join(sorted(units)) if units else spec.bunit
    return lc


def event_window(event: Event, margin: dt.timedelta) -> tuple[dt.datetime, dt.datetime]:
    """The time window of an event widened by ``margin`` on both sides.

    The event lasts from its start to its end time (peak time, then start time, when
    the catalogue gives no end); an end before the start (catalogue rows with such times
    exist, :mod:`pipelines.catalogues.records`) counts as no end, so the window is never
    reversed.
    """
    start = as_utc(event.start_time)
    last = as_utc(event.end_time or event.peak_time or event.start_time)
    if last < start:
        last = start
    return start - margin, last + margin


#: Half side [arcsec] of the region-of-interest box of an event light curve: a flare
#: kernel of SDI is a few tens of arcsec (on-orbit resolution ~9.5 arcsec, LST.md).
ROI_HALF_WIDTH = 60.0
#: Frames shown before the start and after the end of an event at least, whatever the
#: cadence (an hourly series would otherwise give one or two points in a 30-min margin).
CONTEXT_FRAMES = 3


#: Most the context frames may widen a light-curve window on each side, beyond the event's
#: start - margin and end + margin: a sparse series never pulls in frames from years away.
MAX_CONTEXT = dt.timedelta(hours=6)


def _context_window(session: Session, channel: str, start: dt.datetime, end: dt.datetime,
                    n: int) -> tuple[dt.datetime, dt.datetime]:
    """Widen ``[start, end]`` to take in ``n`` frames of ``channel`` on each side, by at
    most :data:`MAX_CONTEXT` on each side."""
    lo, hi = start - MAX_CONTEXT, end + MAX_CONTEXT
    before = session.scalars(select(Frame.date_obs).where(Frame.channel_code == channel, Frame.date_obs < start,
                                                          Frame.date_obs >= lo)
                             .order_by(Frame.date_obs.desc()).limit(n)).all()
    after = session.scalars(select(Frame.date_obs).where(Frame.channel_code == channel, Frame.date_obs > end,
                                                         Frame.date_obs <= hi)
                            .order_by(Frame.date_obs).limit(n)).all()
    if before:
        start = min(start, as_utc(before[-1]))
    if after:
        end = max(end, as_utc(after[-1]))
    return start, end


def event_lightcurve(
    session: Session,
    event: Event,
    *,
    channel: str = "SDI",
    margin: dt.timedelta = dt.timedelta(minutes=30),
    product_root: Path,
    region: str = "auto",
    context_frames: int = CONTEXT_FRAMES,
    calibration_set: int | None = None,
) -> LightCurve:
    """:func:`product_lightcurve` of ``channel`` around an event (the public set of each
    frame, or ``calibration_set`` when given: the caller checks that it may be seen).

    The window is the event's ± ``margin``, widened to hold ``context_frames`` frames of
    the channel before the start and after the end, by at most :data:`MAX_CONTEXT` (6 h)
    on each side. ``region``: ``disk`` (disk-integrated;
    SCI: the coronal field), ``roi`` (a box of ±:data:`ROI_HALF_WIDTH` arcsec about the
    event's helioprojective position: what shows a flare) or ``auto`` (``roi`` for a disk
    imager when the event has a position, else ``disk``).

    Raises
    ------
    ValueError
        If ``region='roi'`` and the event has no helioprojective position.
    """
    start, end = event_window(event, margin)
    spec = get_channel(channel)
    start, end = _context_window(session, spec.code, start, end, context_frames)
    has_pos = event.hpc_x is not None and event.hpc_y is not None
    if region == "roi" and not has_pos:
        raise ValueError(f"event {event.id} has no helioprojective position for a region light curve")
    use_roi = region == "roi" or (region == "auto" and has_pos and not spec.is_coronagraph)
    roi = (float(event.hpc_x), float(event.hpc_y), ROI_HALF_WIDTH) if use_roi else None
    return product_lightcurve(session, channel=channel, start=start, end=end, product_root=product_root, roi=roi,
                              calibration_set=calibration_set)


def sample_evenly(items: Sequence, n: int) -> list:
    """At most ``n`` items of ``items`` spread evenly (first and last kept)."""
    if n <= 0:
        return []
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[0]]
    idx = sorted({round(i * (len(items) - 1) / (n - 1)) for i in range(n)})
    return [items[i] for i in idx]
