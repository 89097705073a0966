"""The image viewer's queries: the events of a frame and the event page's context images.

The drawing is :mod:`backend.render.image` (pure: pyramid, PNG, WCS, an event placed on a
frame); this module chooses what is drawn: the events ``principal`` may see in a frame's
time window (:func:`frame_overlays`), a same-flare partner's position for an event without
one (:func:`located_events`), and the frames before, at and after an event on each channel
(:func:`event_context`).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from backend.models import Event, EventAssociation
from backend.render.image import ProductImage, ViewerParamError, event_overlay, hpc_affine, open_product
from backend.services import visibility
from backend.services.event_visibility import visible
from backend.services.events import SAME_FLARE
from backend.services.products import latest_products_in_window, served_store_path
from pipelines.channels import CHANNELS
from pipelines.utc import as_utc

__all__ = [
    "MAX_OVERLAY_EVENTS",
    "located_events",
    "frame_overlays",
    "CONTEXT_REACH",
    "CONTEXT_SIZE",
    "ContextFrame",
    "ChannelContext",
    "event_context",
]

log = logging.getLogger(__name__)


def located_events(session, events: list, principal=None) -> dict[int, Any]:
    """For each event without a position of its own, the associated ``same_flare`` event
    that has one (the GOES XRS reports give no location for many flares; the same flare seen
    by another source, e.g. the LST detection or HEK, places it). Only partners ``principal``
    may see stand in (None: anonymous, public events;
    :mod:`backend.services.event_visibility`).

    Returns
    -------
    dict
        ``{event id: the Event whose position stands in}``, only for events that need one
        and have such a partner (the partner with the smallest id when there are several).
    """
    need = [e.id for e in events
            if (e.hpc_x is None or e.hpc_y is None) and (e.hgs_lat is None or e.hgs_lon is None)]
    if not need:
        return {}
    rows = session.execute(visible(
        select(EventAssociation.event_id, Event)
        .join(Event, Event.id == EventAssociation.other_event_id)
        .where(EventAssociation.event_id.in_(need), EventAssociation.kind == SAME_FLARE,
               ((Event.hpc_x.is_not(None)) & (Event.hpc_y.is_not(None)))
               | ((Event.hgs_lat.is_not(None)) & (Event.hgs_lon.is_not(None)))), principal, Event.owner)
        .order_by(Event.id)).all()
    out: dict[int, Any] = {}
    for eid, other in rows:
        out.setdefault(eid, other)
    return out


def _events_overlapping(session, start: dt.datetime, end: dt.datetime, limit: int, principal=None) -> list:
    """Events ``principal`` may see (None: public ones) overlapping [start, end], earliest first."""
    last = func.coalesce(Event.end_time, Event.peak_time, Event.start_time)
    stmt = (visible(select(Event).where(Event.start_time <= end, last >= start), principal, Event.owner)
            .order_by(Event.start_time, Event.id).limit(limit))
    return list(session.scalars(stmt))


#: Most events drawn on one frame.
MAX_OVERLAY_EVENTS = 300


def frame_overlays(session, img: ProductImage, *, margin: dt.timedelta = dt.timedelta(hours=1),
                   event_id: int | None = None, limit: int = MAX_OVERLAY_EVENTS,
                   principal=None) -> dict[str, Any]:
    """The events of the frame's time window that ``principal`` may see (None: anonymous, the
    public catalogue), placed on the frame (:func:`event_overlay`).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    img : ProductImage
    margin : datetime.timedelta
        The window is the frame's DATE-OBS +- ``margin``; an event is in it when its
        [start, end] (end: end time, else peak, else start) overlaps the window.
    event_id : int, optional
        An event included whatever its time (the one highlighted by the viewer's
        ``?event=``); ``highlight`` says which.
    limit : int
        At most this many events (the earliest).

    Returns
    -------
    dict
        ``date_obs``, ``window`` (start, end ISO), ``events`` (list of
        :func:`event_overlay` dicts), ``highlight`` (the id or None), ``truncated``.

    Raises
    ------
    ViewerParamError
        If ``event_id`` names no event, or the margin is negative.
    """
    if margin < dt.timedelta(0):
        raise ViewerParamError("the time margin must not be negative")
    m = img.smap
    t = as_utc(m.date.utc.to_datetime(timezone=dt.UTC))
    start, end = t - margin, t + margin
    rows = _events_overlapping(session, start, end, limit + 1, principal)
    truncated = len(rows) > limit
    rows = rows[:limit]
    if event_id is not None and all(r.id != event_id for r in rows):
        try:  # the event rule of backend.services.visibility, as every event route
            extra = visibility.get_visible(session, Event, event_id, principal)
        except visibility.NotVisible:
            raise ViewerParamError(f"no event with id {event_id}") from None
        rows.append(extra)
    stand_in = located_events(session, rows, principal)
    return {"date_obs": m.date.utc.isot, "window": [start.isoformat(), end.isoformat()],
            "events": [event_overlay(img, e, stand_in.get(e.id)) for e in rows], "highlight": event_id,
            "truncated": truncated}


# -- event page: context images --------------------------------------------------------------


@dataclass
class ContextFrame:
    """One context image of an event on one channel.

    ``role`` is ``before`` (the last frame at or before the start), ``peak`` (the frame
    nearest the peak, else the start) or ``after`` (the first frame at or after the end);
    ``overlay`` the event as drawn on it (:func:`event_overlay`), ``marker`` its position as
    fractions of the image (``left``, ``top`` in 0..1) for a point, ``svg_points`` the
    wedge in image-pixel units of the thumbnail (``width`` x ``height``)."""

    role: str
    product_id: int
    date_obs: dt.datetime
    overlay: dict[str, Any]
    width: int
    height: int
    marker: dict[str, float] | None = None
    svg_points: str | None = None
    error: str | None = None


@dataclass
class ChannelContext:
    channel: str
    frames: list[ContextFrame]


#: How far from the event a context frame may be [h]: a sparse series never pulls in a frame
#: from days away (the light curve's bound, :data:`backend.services.products.MAX_CONTEXT`).
CONTEXT_REACH = dt.timedelta(hours=6)
#: Side of the context thumbnails [pixel].
CONTEXT_SIZE = 256


def _pick_context(products: list, event) -> list[tuple[str, Any]]:
    start = as_utc(event.start_time)
    peak = as_utc(event.peak_time) if event.peak_time else start
    end = as_utc(event.end_time or event.peak_time or event.start_time)
    times = [as_utc(p.frame.date_obs) for p in products]
    picks: list[tuple[str, Any]] = []
    before = [p for p, t in zip(products, times) if t <= start]
    if before:
        picks.append(("before", before[-1]))
    if products:
        nearest = min(zip(products, times), key=lambda pt: abs((pt[1] - peak).total_seconds()))[0]
        picks.append(("peak", nearest))
    after = [p for p, t in zip(products, times) if t >= end]
    if after:
        picks.append(("after", after[0]))
    seen: set[tuple[str, int]] = set()
    out = []
    for role, p in picks:
        if (role, p.id) not in seen:
            seen.add((role, p.id))
            out.append((role, p))
    return out


def event_context(session, event, product_root: Path, *, size: int = CONTEXT_SIZE,
                  principal=None) -> list[ChannelContext]:
    """Context images of an event: for every channel with written products within
    :data:`CONTEXT_REACH` of it, the frame before its start, at its peak and after its end
    (the public product of each frame), each with the event placed on it (at the position of
    a same-flare partner ``principal`` may see when it has none).

    Returns
    -------
    list of ChannelContext
        In the order of :data:`pipelines.channels.CHANNELS`; a frame whose file cannot be
        read carries ``error`` instead of a marker.
    """
    start = as_utc(event.start_time) - CONTEXT_REACH
    end = as_utc(event.end_time or event.peak_time or event.start_time) + CONTEXT_REACH
    by_channel: dict[str, list] = {}
    for p in latest_products_in_window(session, start, end, limit=5000):
        by_channel.setdefault(p.frame.channel_code, []).append(p)
    out = []
    stand_in = located_events(session, [event], principal).get(event.id)
    for code in CHANNELS:
        prods = by_channel.get(code)
        if not prods:
            continue
        frames = []
        for role, p in _pick_context(prods, event):
            path = served_store_path(p.path, product_root)
            cf = ContextFrame(role=role, product_id=p.id, date_obs=as_utc(p.frame.date_obs), overlay={},
                              width=size, height=size)
            if path is None:
                cf.error = "the product file is missing from the store"
                frames.append(cf)
                continue
            try:
                img = open_product(path, p.frame.channel_code)
                ov = event_overlay(img, event, stand_in)
            except Exception as exc:  # noqa: BLE001 - one unreadable product never breaks the event page
                log.warning("context image of event %s: product %s skipped: %s", event.id, p.id, exc)
                cf.error = (str(exc).splitlines() or [type(exc).__name__])[0]
                frames.append(cf)
                continue
            ny, nx = img.shape
            scale = size / max(ny, nx)
            cf.width, cf.height = max(1, round(nx * scale)), max(1, round(ny * scale))
            cf.overlay = ov
            if ov["kind"] == "point":
                cf.marker = {"left": (ov["pixel_x"] + 0.5) / nx, "top": 1.0 - (ov["pixel_y"] + 0.5) / ny}
            elif ov["kind"] == "wedge":
                aff = hpc_affine(img)
                det = aff["m11"] * aff["m22"] - aff["m12"] * aff["m21"]
                pts = []
                for tx, ty in zip(ov["x"], ov["y"]):
                    dx, dy = tx - aff["tx0"], ty - aff["ty0"]
                    px = (aff["m22"] * dx - aff["m12"] * dy) / det
                    py = (-aff["m21"] * dx + aff["m11"] * dy) / det
                    pts.append(f"{(px + 0.5) * scale:.1f},{(ny - 0.5 - py) * scale:.1f}")
                cf.svg_points = " ".join(pts)
            frames.append(cf)
        out.append(ChannelContext(channel=code, frames=frames))
    return out
