"""Who may see which calibration sets and products, and what a set holds.

The rule (:func:`backend.services.calibration_sets.visible_to`): public sets are everyone's;
a set a user made is theirs (and admins') until promoted. A product is visible when its set
is (products without a set, made before sets existed, are public). A product or set asked
for by someone who may not see it is answered 404, as if it did not exist.

Also here: the products of one set as one paginated query (:func:`set_products_page`), the
DATE-OBS span a set covers (:func:`set_span`), the set ids of jobs (:func:`job_set_ids`), and
the public detections a promotion queues (:func:`queue_public_detections`).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from backend.models import CalibrationSet, Frame, JobItem, Product, ProductState
from backend.services import visibility

__all__ = ["public_series_ids", "may_see_set", "visible_set", "product_condition", "may_see_product",
           "set_products_page", "set_span", "SetSpan", "job_set_ids", "queue_public_detections"]

log = logging.getLogger(__name__)


def public_series_ids(session: Session | None, channel: str | None, start: dt.datetime | None = None,
                      end: dt.datetime | None = None):
    """A select of ``(product_id, frame_id)``: the public product of each frame of ``channel``
    (None: every channel) with DATE-OBS in [start, end] (what public detections, light curves,
    quicklooks and movies read; ``session`` is not used, the select is built only).

    The written product of the frame's public calibration set promoted (or made) last, as
    :func:`backend.services.calibration_sets.public_product_ids` ranks them; a frame with no
    product of a public set but with products that have no set at all (made before sets
    existed and not backfilled, or by tools that write products directly) takes its newest
    such product. Products of private sets are never in it."""
    rank = func.row_number().over(
        partition_by=Product.frame_id,
        order_by=(Product.calibration_set_id.is_(None).asc(),
                  func.coalesce(CalibrationSet.promoted_at, CalibrationSet.created_at).desc(),
                  CalibrationSet.id.desc(), Product.version.desc(), Product.id.desc())).label("rank")
    conds = [Product.state == ProductState.written,
             (CalibrationSet.public.is_(True)) | (Product.calibration_set_id.is_(None))]
    if channel is not None:
        conds.append(Frame.channel_code == channel)
    if start is not None:
        conds.append(Frame.date_obs >= start)
    if end is not None:
        conds.append(Frame.date_obs <= end)
    inner = (select(Product.id.label("product_id"), Product.frame_id.label("frame_id"), rank)
             .join(Frame, Frame.id == Product.frame_id)
             .outerjoin(CalibrationSet, CalibrationSet.id == Product.calibration_set_id)
             .where(*conds).subquery())
    return select(inner.c.product_id, inner.c.frame_id).where(inner.c.rank == 1)


def may_see_set(session: Session, principal: Any, row: CalibrationSet) -> bool:
    """Whether ``principal`` (None: anonymous) may see set ``row`` (a loaded row), by
    :func:`backend.services.visibility.set_rule` itself (:func:`~backend.services.visibility.allows`)."""
    return visibility.allows(session, CalibrationSet, row, principal)


def visible_set(session: Session, set_id: int, principal: Any) -> CalibrationSet | None:
    """Set ``set_id`` if it exists and ``principal`` may see it, else None (a 404)."""
    try:
        return visibility.get_visible(session, CalibrationSet, set_id, principal)
    except visibility.NotVisible:
        return None


def product_condition(principal: Any):
    """SQL condition on ``products`` for the products ``principal`` may see (None: an admin,
    all): :func:`backend.services.visibility.product_rule`."""
    return visibility.condition(Product, principal)


def may_see_product(session: Session, principal: Any, row: Product) -> bool:
    """Whether ``principal`` may see product ``row`` (its set's visibility)."""
    return visibility.allows(session, Product, row, principal)


def set_products_page(session: Session, set_id: int, *, state: ProductState | None = None, limit: int = 50,
                      offset: int = 0) -> tuple[list[Product], int]:
    """The products of set ``set_id`` (by DATE-OBS, then id; frame loaded) and how many there
    are in all, in one query (the total is a window count over the same rows).

    Returns
    -------
    rows : list of Product
        One page (``limit`` rows from ``offset``).
    total : int
        Matches over all pages (a page past the end is counted by a second query, as the
        window count has no row to ride on there).
    """
    total_col = func.count().over().label("total")
    q = (select(Product, total_col).join(Frame, Frame.id == Product.frame_id)
         .where(Product.calibration_set_id == set_id).options(joinedload(Product.frame)))
    if state is not None:
        q = q.where(Product.state == state)
    rows = session.execute(q.order_by(Frame.date_obs, Product.id).limit(limit).offset(offset)).all()
    if rows:
        return [r[0] for r in rows], int(rows[0][1])
    if offset == 0:
        return [], 0
    # a page past the end: the window count has no row to ride on; count alone
    cq = select(func.count(Product.id)).where(Product.calibration_set_id == set_id)
    if state is not None:
        cq = cq.where(Product.state == state)
    return [], int(session.scalar(cq) or 0)


@dataclass(frozen=True)
class SetSpan:
    """What a set covers: products (all states), written ones, distinct frames, and the
    first and last DATE-OBS of its frames (None without products)."""

    products: int
    written: int
    frames: int
    first_date_obs: dt.datetime | None
    last_date_obs: dt.datetime | None


def set_span(session: Session, set_id: int, *, written_only: bool = False) -> SetSpan:
    """Counts and DATE-OBS span of set ``set_id``'s products (one aggregate query)."""
    written = func.count(Product.id).filter(Product.state == ProductState.written)
    q = (select(func.count(Product.id), written, func.count(func.distinct(Product.frame_id)),
                func.min(Frame.date_obs), func.max(Frame.date_obs))
         .join(Frame, Frame.id == Product.frame_id).where(Product.calibration_set_id == set_id))
    if written_only:
        q = q.where(Product.state == ProductState.written)
    n, w, f, lo, hi = session.execute(q).one()
    return SetSpan(int(n or 0), int(w or 0), int(f or 0), lo, hi)


def job_set_ids(session: Session, job_ids: list[str]) -> dict[str, list[int]]:
    """``{job id: sorted calibration set ids its items' products use}`` (one query; a job
    without products maps to [])."""
    out: dict[str, list[int]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    rows = session.execute(
        select(JobItem.job_id, Product.calibration_set_id).distinct()
        .join(Product, Product.id == JobItem.product_id)
        .where(JobItem.job_id.in_(job_ids), Product.calibration_set_id.is_not(None))).all()
    for job_id, set_id in rows:
        out[job_id].append(set_id)
    for v in out.values():
        v.sort()
    return out


def queue_public_detections(session: Session, row: CalibrationSet) -> list[dict[str, Any]]:
    """Send the public detections (as the platform: no job, so the public scope) of the
    detectors that follow a calibration of ``row``'s channel
    (:func:`pipelines.detect.follow_ups.follow_ups`), over the DATE-OBS span of the set's
    written products. Returns what was sent (``[{detector, channel, start, end}]``; [] when
    the set has no written product).

    Raises
    ------
    kombu.exceptions.OperationalError
        The broker cannot be reached (the caller answers 503; the promotion itself stands).
    """
    from backend.broker import TaskName, send
    from pipelines.detect.follow_ups import follow_ups
    from pipelines.utc import as_utc

    span = set_span(session, row.id, written_only=True)
    if not span.written:
        return []
    start, end = as_utc(span.first_date_obs).isoformat(), as_utc(span.last_date_obs).isoformat()
    sent = []
    for detector, channel in follow_ups([row.channel_code]):
        kwargs = {"detector": detector, "channel": channel, "start": start, "end": end}
        send(TaskName.detect_events, kwargs=kwargs)
        sent.append(kwargs)
    log.info("calibration set %d promoted: %d public detection(s) queued over %s..%s", row.id, len(sent), start, end)
    return sent
