"""Differences between two product versions of one frame (issue 12, item 6).

``a`` is the reference, ``b`` the other version: the image difference is ``b - a`` and the
ratio ``b / a``, in the products' ``BUNIT``, over the pixels good in both DQ masks (DQ 0 in
``a`` and in ``b``, finite in both; for the ratio also ``a != 0``). The header diff compares
the primary headers keyword by keyword (``HISTORY``/``COMMENT`` as lines added and
removed); keywords that differ between any two writes of one product (:data:`VOLATILE`)
are marked so.

Read from the product files (:func:`pipelines.products.read_product`), not the database
copies, so the diff is of what users download.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from astropy.io import fits
from sqlalchemy.orm import Session

from backend.models import Frame, Product, ProductState
from backend.services import visibility
from pipelines.errors import DataError
from pipelines.units import display_unit

__all__ = ["VOLATILE", "DiffError", "DiffNotFound", "DiffNotOfFrame", "DiffNotWritten", "ProductPair",
           "load_pair", "header_diff", "image_stats", "diff_report", "difference_png", "ratio_png",
           "versions_of_frame"]

#: Keywords that differ between two writes of the same data (time of writing, checksums,
#: the product's own ids and file name): marked ``volatile`` in the header diff.
VOLATILE = frozenset({"DATE", "CHECKSUM", "DATASUM", "PRODID", "PRODVER", "CALSET", "FILENAME"})
_LINES = ("HISTORY", "COMMENT")


class DiffError(DataError):
    """Base of the diff's errors."""


class DiffNotFound(DiffError):
    """An unknown frame or product (HTTP 404)."""


class DiffNotOfFrame(DiffError):
    """A product that is not one of the frame's (HTTP 422)."""


class DiffNotWritten(DiffError):
    """A product that is not ``written`` (HTTP 409)."""


@dataclass
class ProductPair:
    """Two written products of one frame and their arrays (``data`` float32 in BUNIT, ``dq`` uint8)."""

    frame: Frame
    a: Product
    b: Product
    a_data: np.ndarray
    a_dq: np.ndarray
    a_header: fits.Header
    b_data: np.ndarray
    b_dq: np.ndarray
    b_header: fits.Header


def load_pair(session: Session, frame_id: int, a_id: int, b_id: int, principal: Any = None) -> ProductPair:
    """Products ``a_id`` and ``b_id`` of frame ``frame_id``, read from their files, if
    ``principal`` (None: anonymous) may see both (:func:`backend.services.visibility.product_rule`).

    Raises
    ------
    DiffNotFound
        Unknown frame or product, or a product the principal may not see.
    DiffNotOfFrame
        A product of another frame.
    DiffNotWritten
        A product not ``written`` (planned, writing or failed).
    pipelines.errors.FitsReadError
        A product file that cannot be read; or the two images differ in shape (DiffError).
    """
    from pipelines.products import read_product

    frame = session.get(Frame, frame_id)
    if frame is None:
        raise DiffNotFound(f"no frame with id {frame_id}")
    prods = []
    for name, pid in (("a", a_id), ("b", b_id)):
        p = session.get(Product, pid)
        if p is None or not visibility.allows(session, Product, p, principal):  # a private set's: unknown
            raise DiffNotFound(f"no product with id {pid} ({name})")
        if p.frame_id != frame_id:
            raise DiffNotOfFrame(f"product {pid} ({name}) is a product of frame {p.frame_id}, not of frame {frame_id}")
        prods.append(p)
    for name, p in zip(("a", "b"), prods, strict=True):
        if p.state != ProductState.written or not p.path:
            raise DiffNotWritten(f"product {p.id} ({name}) is {p.state.value}, not written: nothing to compare")
    a, b = prods
    a_data, a_dq, a_header = read_product(a.path)
    b_data, b_dq, b_header = read_product(b.path)
    if a_data.shape != b_data.shape:
        raise DiffError(f"products {a.id} {a_data.shape} and {b.id} {b_data.shape} differ in shape")
    return ProductPair(frame, a, b, a_data, a_dq, a_header, b_data, b_dq, b_header)


def _value(v: Any) -> Any:
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return v if np.isfinite(v) else str(v)
    return str(v)


def _same(x: Any, y: Any) -> bool:
    """Equal FITS values (NaN equals NaN; a bool is not the number 1)."""
    if type(x) is bool or type(y) is bool:
        return type(x) is type(y) and x == y
    if isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y):
        return True
    return x == y


def header_diff(a: fits.Header, b: fits.Header) -> dict[str, Any]:
    """Keyword diff of two FITS headers.

    Returns
    -------
    dict
        ``added`` (in ``b`` only), ``removed`` (in ``a`` only), ``changed`` (both, other
        value): lists of ``{keyword, a, b, volatile}`` sorted by keyword (values JSON-ready);
        ``history`` and ``comment``: ``{added, removed}`` lines; ``n_volatile``, ``n_other``:
        how many of the keyword differences are volatile (:data:`VOLATILE`) or not.
    """
    ka = [k for k in dict.fromkeys(a.keys()) if k and k not in _LINES]
    kb = [k for k in dict.fromkeys(b.keys()) if k and k not in _LINES]
    in_a, in_b = set(ka), set(kb)
    added = [{"keyword": k, "a": None, "b": _value(b[k]), "volatile": k in VOLATILE} for k in sorted(in_b - in_a)]
    removed = [{"keyword": k, "a": _value(a[k]), "b": None, "volatile": k in VOLATILE} for k in sorted(in_a - in_b)]
    changed = [{"keyword": k, "a": _value(a[k]), "b": _value(b[k]), "volatile": k in VOLATILE}
               for k in sorted(in_a & in_b) if not _same(a[k], b[k])]
    out: dict[str, Any] = {"added": added, "removed": removed, "changed": changed}
    for key in _LINES:
        la = [str(x) for x in a.get(key, [])] if key in a else []
        lb = [str(x) for x in b.get(key, [])] if key in b else []
        out[key.lower()] = {"added": [x for x in lb if x not in set(la)], "removed": [x for x in la if x not in set(lb)]}
    rows = added + removed + changed
    out["n_volatile"] = sum(r["volatile"] for r in rows)
    out["n_other"] = sum(not r["volatile"] for r in rows)
    return out


def _stats(values: np.ndarray) -> dict[str, float | int | None]:
    if values.size == 0:
        return {"count": 0, "mean": None, "median": None, "std": None, "min": None, "max": None, "p01": None,
                "p99": None}
    p01, p50, p99 = np.percentile(values, [1, 50, 99])
    return {"count": int(values.size), "mean": float(values.mean()), "median": float(p50), "std": float(values.std()),
            "min": float(values.min()), "max": float(values.max()), "p01": float(p01), "p99": float(p99)}


def _masks(a_data, a_dq, b_data, b_dq) -> tuple[np.ndarray, np.ndarray]:
    good = (np.asarray(a_dq) == 0) & (np.asarray(b_dq) == 0) & np.isfinite(a_data) & np.isfinite(b_data)
    return good, good & (np.asarray(a_data) != 0)


def image_stats(a_data: np.ndarray, a_dq: np.ndarray, b_data: np.ndarray, b_dq: np.ndarray) -> dict[str, Any]:
    """Statistics of ``b - a`` and ``b / a`` over the pixels good in both.

    Parameters
    ----------
    a_data, b_data : numpy.ndarray, shape (ny, nx)
        The two images [BUNIT]; computed in float64.
    a_dq, b_dq : numpy.ndarray, shape (ny, nx)
        Their DQ bits (0 = good).

    Returns
    -------
    dict
        ``difference`` and ``ratio``: ``count``, ``mean``, ``median``, ``std`` (population),
        ``min``, ``max``, ``p01``, ``p99`` (percentiles, linear interpolation; ``None`` when
        no pixel counts); ``difference`` also ``n_differing`` (pixels where ``b != a``) and
        ``max_abs_diff``; ``ratio`` also ``n_zero_reference`` (good pixels left out as
        ``a == 0``); ``n_pixels``, ``n_good_both``, ``dq_differs`` (pixels whose DQ differ).
    """
    a = np.asarray(a_data, dtype=np.float64)
    b = np.asarray(b_data, dtype=np.float64)
    good, ratio_ok = _masks(a, a_dq, b, b_dq)
    d = (b - a)[good]
    diff = _stats(d)
    diff["n_differing"] = int(np.count_nonzero(d))
    diff["max_abs_diff"] = float(np.abs(d).max()) if d.size else None
    ratio = _stats(b[ratio_ok] / a[ratio_ok])
    ratio["n_zero_reference"] = int(good.sum() - ratio_ok.sum())
    return {"difference": diff, "ratio": ratio, "n_pixels": int(a.size), "n_good_both": int(good.sum()),
            "dq_differs": int(np.count_nonzero(np.asarray(a_dq) != np.asarray(b_dq)))}


def _describe(p: Product) -> dict[str, Any]:
    return {"id": p.id, "version": p.version, "calibration_set_id": p.calibration_set_id,
            "options": (p.parameters or {}).get("options") or {}, "sha256": p.sha256,
            "data_sha256": ((p.manifest or {}).get("product") or {}).get("data_sha256"),
            "bunit": (p.header or {}).get("BUNIT")}


def diff_report(pair: ProductPair) -> dict[str, Any]:
    """The JSON diff of a pair: products, header diff, image statistics, PNG links."""
    q = f"a={pair.a.id}&b={pair.b.id}"
    base = f"/api/v1/frames/{pair.frame.id}/diff"
    return {"frame_id": pair.frame.id, "a": _describe(pair.a), "b": _describe(pair.b),
            "bunit": display_unit(pair.a_header),  # 'MSB' for SCI (BUNITNAM; BUNIT is dimensionless)
            "header": header_diff(pair.a_header, pair.b_header),
            "image": image_stats(pair.a_data, pair.a_dq, pair.b_data, pair.b_dq),
            "difference_png": f"{base}/difference.png?{q}", "ratio_png": f"{base}/ratio.png?{q}",
            "page": f"/frames/{pair.frame.id}/diff?{q}"}


def _png(img: np.ndarray, vmin: float, vmax: float, cmap_name: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import colormaps
    from matplotlib.image import imsave

    cmap = colormaps[cmap_name].with_extremes(bad="#808080")
    buf = io.BytesIO()
    imsave(buf, np.ma.masked_invalid(img), cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", format="png")
    return buf.getvalue()


def _symmetric(values: np.ndarray, centre: float) -> float:
    """Half-width of symmetric limits about ``centre``: the 99th percentile of ``|v - centre|``
    (so a few outliers do not wash the image out); a tiny positive number when all equal."""
    if values.size == 0:
        return 1.0
    half = float(np.percentile(np.abs(values - centre), 99))
    return half if half > 0 else max(abs(centre) * 1e-6, 1e-30)


def difference_png(pair: ProductPair) -> tuple[bytes, float]:
    """PNG of ``b - a`` (diverging colormap ``RdBu_r``, limits symmetric about 0; grey where
    a pixel is not good in both). Returns ``(png bytes, half-width of the limits [BUNIT])``."""
    a = pair.a_data.astype(np.float64)
    b = pair.b_data.astype(np.float64)
    good, _ = _masks(a, pair.a_dq, b, pair.b_dq)
    img = np.where(good, b - a, np.nan)
    half = _symmetric(img[good], 0.0)
    return _png(img, -half, half, "RdBu_r"), half


def ratio_png(pair: ProductPair) -> tuple[bytes, float]:
    """PNG of ``b / a`` (``RdBu_r``, limits symmetric about 1; grey where not good in both or
    ``a == 0``). Returns ``(png bytes, half-width of the limits)``."""
    a = pair.a_data.astype(np.float64)
    b = pair.b_data.astype(np.float64)
    _, ok = _masks(a, pair.a_dq, b, pair.b_dq)
    img = np.full(a.shape, np.nan)
    img[ok] = b[ok] / a[ok]
    half = _symmetric(img[ok], 1.0)
    return _png(img, 1.0 - half, 1.0 + half, "RdBu_r"), half


def versions_of_frame(session: Session, frame_id: int, principal: Any = None) -> list[Product]:
    """The written products of a frame that ``principal`` (None: anonymous) may see, oldest
    first (for "compare versions" links)."""
    from sqlalchemy import select

    q = select(Product).where(Product.frame_id == frame_id, Product.state == ProductState.written)
    return list(session.scalars(visibility.visible(q, Product, principal).order_by(Product.created_at, Product.id)))
