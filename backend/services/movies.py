"""Movies of one channel over a DATE-OBS window: the frames, the events, the MP4 job.

The frames of a movie are the newest written L2 product of every frame of the channel with
DATE-OBS in the window (inclusive), oldest first
(:func:`backend.services.products.latest_products_in_window`). With a difference
(``running``: each frame minus the previous frame of the window; ``base``: each frame minus
the first frame of the window) the first frame is the reference only, so a difference movie
has one frame fewer than the window holds.

A movie request is stored ``queued`` and committed before it is sent (task ``make_movie``
by name, queue ``cpu``: the Celery guide's "enqueue after the commit"); the worker
(:mod:`backend.worker.movies`) renders it and records its progress; the reconciler
re-sends one whose message was lost (:mod:`backend.worker.reconcile`).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import Event, Movie, MovieState, Product
from backend.services import products as products_service
from pipelines.channels import CHANNELS, get_channel
from pipelines.errors import DataError
from pipelines.movies import DIFF_MODES, MAX_MOVIE_SIDE, MIN_MOVIE_SIDE, display_array, hpc_to_fraction
from pipelines.utc import as_utc, parse_utc_text

if TYPE_CHECKING:
    from backend.auth import Principal

__all__ = ["MovieRequest", "MovieRequestError", "MAX_FRAMES", "MAX_FPS", "EVENT_MARGIN", "movie_products",
           "frame_count", "window_events", "player_frames", "submit_movie", "enqueue_movie", "get_movie",
           "movie_dir", "cached_display_array", "event_movie_window", "MovieSpec", "movie_spec"]

#: Most frames one movie may hold (a day of SDI at its 1-min cadence is 1440 frames, 2.4 min
#: at 10 fps; beyond this, ask for a shorter window).
MAX_FRAMES = 3000
#: Frame rate limits [frames per second] of an MP4.
MIN_FPS, MAX_FPS = 1.0, 60.0
#: Margin around an event of the movie on its page: its start - margin to its end + margin.
EVENT_MARGIN = dt.timedelta(minutes=30)
#: Most events listed with a movie's frames.
MAX_EVENTS = 500


class MovieRequestError(DataError):
    """A movie that cannot be made (no frames in the window, too many frames)."""

    def __init__(self, message: str, frames: int) -> None:
        super().__init__(message)
        self.frames = frames


class MovieRequest(BaseModel):
    """What a user asks for: a movie of ``channel`` with DATE-OBS in [``start``, ``end``]."""

    model_config = ConfigDict(extra="forbid")

    channel: str = Field(description="LST channel: SDI, WST, SCI-UV or SCI-WL")
    start: dt.datetime = Field(description="DATE-OBS window start (UTC, ISO 8601)")
    end: dt.datetime = Field(description="DATE-OBS window end (UTC, ISO 8601), inclusive")
    diff: str = Field(default="none", description="none, running (minus the previous frame) or base "
                                                  "(minus the first frame of the window)")
    fps: float = Field(default=10.0, ge=MIN_FPS, le=MAX_FPS, description="frames per second of the MP4")
    size: int | None = Field(default=None, ge=MIN_MOVIE_SIDE, le=MAX_MOVIE_SIDE,
                             description="larger side of the MP4 [pixel], even; default: the products' own "
                                         "resolution (of the crop, with crop=true)")
    event: int | None = Field(default=None, ge=1, le=2_147_483_647,
                              description="an event to mark (a ring at its helioprojective position, through "
                                          "each product's WCS)")
    crop: bool = Field(default=False, description="crop to the event's box (its hpc_bbox, else a 300 arcsec "
                                                  "square around it) plus 100 arcsec a side; needs event")

    @model_validator(mode="before")
    @classmethod
    def _no_owner(cls, data: Any) -> Any:
        if isinstance(data, dict) and "owner" in data:
            raise ValueError("owner: a movie's owner is the user of the API token that asks for it; do not send it")
        return data

    @field_validator("channel")
    @classmethod
    def _channel(cls, v: str) -> str:
        try:
            return get_channel(v).code
        except KeyError:
            raise ValueError(f"unknown channel {v!r}; expected one of {', '.join(CHANNELS)}") from None

    @field_validator("diff")
    @classmethod
    def _diff(cls, v: str) -> str:
        if v not in DIFF_MODES:
            raise ValueError(f"unknown difference {v!r}; expected one of {', '.join(DIFF_MODES)}")
        return v

    @field_validator("start", "end", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        """ISO 8601 extended or basic, leap seconds through astropy ``Time``; a number is refused
        (never Unix seconds): :func:`pipelines.utc.parse_utc_text`."""
        return v if v is None else parse_utc_text(v)

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, v: dt.datetime) -> dt.datetime:
        try:
            return as_utc(v)
        except OverflowError:
            raise ValueError("date out of range once converted to UTC") from None

    @field_validator("fps")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not np.isfinite(v):
            raise ValueError("fps must be a finite number")
        return v

    @field_validator("size")
    @classmethod
    def _even(cls, v: int | None) -> int | None:
        if v is not None and v % 2:
            raise ValueError(f"size {v} is odd: H.264 in yuv420p needs even sides; ask for {v - 1} or {v + 1}")
        return v

    @model_validator(mode="after")
    def _range(self) -> MovieRequest:
        if self.end < self.start:
            raise ValueError("end is before start")
        if self.crop and self.event is None:
            raise ValueError("crop: cropping needs the event to crop to (event=<id>)")
        return self


@dataclass(frozen=True)
class MovieSpec:
    """How a movie's frames are drawn beyond its window: ``size`` (larger side [pixel],
    None: full resolution), the ``event`` marked (its ``hpc`` position [arcsec], the
    event's own or its same flare's) and the ``box`` [arcsec] ``(x0, y0, x1, y1)`` it is
    cropped to (None: the whole image).

    The options are the movie's row (``Movie.size``, ``Movie.event_id``, ``Movie.crop``,
    stored in the transaction that stores the movie); the position and box are resolved
    from the event's row when needed (:func:`movie_spec`).
    """

    size: int | None = None
    event: int | None = None
    hpc: tuple[float, float] | None = None
    box: tuple[float, float, float, float] | None = None


def _placed(session: Session, ev: Event, principal) -> tuple[float, float] | None:
    """``(hpc_x, hpc_y)`` [arcsec] of ``ev``: its own, else its same flare's that ``principal``
    may see (:func:`backend.services.imaging.located_events`); None when neither has one."""
    from backend.services.imaging import located_events

    pos = ev if ev.hpc_x is not None and ev.hpc_y is not None else located_events(session, [ev], principal).get(ev.id)
    if pos is None or pos.hpc_x is None or pos.hpc_y is None:
        return None
    return float(pos.hpc_x), float(pos.hpc_y)


def _box(session: Session, ev: Event, hpc: tuple[float, float]) -> tuple[float, float, float, float]:
    from pipelines.movies import event_box

    return event_box(*hpc, (ev.attributes or {}).get("hpc_bbox"))


def _owner_principal(owner: str):
    """The principal a movie's event is placed for: its owner (``system``: the platform)."""
    from backend.auth import SYSTEM, Principal

    return SYSTEM if owner == SYSTEM.user else Principal(owner, frozenset())


def movie_spec(session: Session, movie: Movie) -> MovieSpec:
    """The :class:`MovieSpec` of ``movie`` from its row: ``size``; with ``event_id``, the
    event's position now (its own, or its same flare's one the movie's owner may see) and,
    with ``crop``, its box (:func:`pipelines.movies.event_box`). ``hpc``/``box`` are None
    when the event is gone (``event_id`` set NULL) or has no position any more; the worker
    refuses to render such a movie (:func:`backend.worker.movies.render_movie`)."""
    if movie.event_id is None:
        return MovieSpec(size=movie.size)
    ev = session.get(Event, movie.event_id)
    hpc = None if ev is None else _placed(session, ev, _owner_principal(movie.owner))
    box = _box(session, ev, hpc) if movie.crop and hpc is not None else None
    return MovieSpec(size=movie.size, event=movie.event_id, hpc=hpc, box=box)


def _check_event(session: Session, req: MovieRequest, principal, n: int) -> None:
    """Refuse ``req``'s event unless ``principal`` may see it and it can be placed.

    Raises
    ------
    MovieRequestError
        If the event does not exist for ``principal`` or has no helioprojective position
        (of its own, or of a same flare ``principal`` may see).
    """
    if req.event is None:
        return
    from backend.services.events import get_event

    ev = get_event(session, req.event, principal)
    if ev is None:
        raise MovieRequestError(f"event: no event with id {req.event}", n)
    if _placed(session, ev, principal) is None:
        raise MovieRequestError(f"event: event {ev.id} has no helioprojective position (hpc_x, hpc_y) to mark "
                                "or crop to", n)


def movie_products(session: Session, channel: str, start: dt.datetime, end: dt.datetime,
                   *, limit: int = MAX_FRAMES + 1) -> list[Product]:
    """The products a movie of ``channel`` over [``start``, ``end``] shows, oldest first
    (``Product.frame`` loaded); at most ``limit``."""
    return products_service.latest_products_in_window(session, as_utc(start), as_utc(end), channel=channel,
                                                      limit=limit)


def frame_count(n_products: int, diff: str) -> int:
    """Frames of a movie over ``n_products`` products: one fewer with a difference (the first
    frame is the reference), never negative."""
    return max(0, n_products - (0 if diff == "none" else 1))


def _check_count(n_products: int, diff: str) -> int:
    n = frame_count(n_products, diff)
    if n_products > MAX_FRAMES:
        raise MovieRequestError(f"the window holds more than {MAX_FRAMES} frames: ask for a shorter one", n)
    if n == 0:
        need = "no written L2 product of the channel in the window" if n_products == 0 else \
            f"a {diff} difference needs at least two frames and the window holds one"
        raise MovieRequestError(f"empty movie: {need}", n)
    return n


def window_events(session: Session, start: dt.datetime, end: dt.datetime, *, limit: int = MAX_EVENTS,
                  principal=None) -> list[Event]:
    """Events overlapping [``start``, ``end``] (start at or before ``end``, end, peak or start
    at or after ``start``), by start time."""
    last = func.coalesce(Event.end_time, Event.peak_time, Event.start_time)
    from backend.services.event_visibility import visible

    return list(session.scalars(visible(select(Event).where(Event.start_time <= end, last >= start), principal,
                                        Event.owner).order_by(Event.start_time, Event.id).limit(limit)))


@functools.lru_cache(maxsize=64)
def _display_cached(path: str, _mtime_ns: int, _size: int) -> np.ndarray:
    from pipelines.products import read_product

    data, dq, _ = read_product(path)
    out = display_array(data, dq)
    out.setflags(write=False)
    return out


def cached_display_array(path: str | os.PathLike) -> np.ndarray:
    """:func:`pipelines.movies.display_array` of a product file, cached on (path, mtime, size).

    Raises
    ------
    pipelines.errors.FitsReadError
        If the file cannot be read.
    OSError
        If it is gone.
    """
    st = os.stat(path)
    return _display_cached(os.fspath(path), st.st_mtime_ns, st.st_size)


def _iso(t: dt.datetime | None) -> str | None:
    t = as_utc(t)
    return None if t is None else t.isoformat().replace("+00:00", "Z")


@dataclass
class PlayerFrames:
    """The frames of a player and the events of its window (JSON-ready through :meth:`as_dict`)."""

    channel: str
    diff: str
    start: dt.datetime
    end: dt.datetime
    frames: list[dict[str, Any]]
    events: list[dict[str, Any]]
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        return {"channel": self.channel, "diff": self.diff, "start": _iso(self.start), "end": _iso(self.end),
                "count": len(self.frames), "truncated": self.truncated, "frames": self.frames,
                "events": self.events}


def _event_dict(e: Event) -> dict[str, Any]:
    return {"id": e.id, "event_type": e.event_type, "source": e.source, "goes_class": e.goes_class,
            "start_time": _iso(e.start_time), "peak_time": _iso(e.peak_time), "end_time": _iso(e.end_time),
            "hpc_x": e.hpc_x, "hpc_y": e.hpc_y, "position_angle": e.position_angle, "url": f"/events/{e.id}"}


#: Header keywords that fix where a helioprojective position falls on a product's image.
WCS_KEYS = ("NAXIS1", "NAXIS2", "CTYPE1", "CTYPE2", "CUNIT1", "CUNIT2", "CRPIX1", "CRPIX2", "CRVAL1", "CRVAL2",
            "CDELT1", "CDELT2", "PC1_1", "PC1_2", "PC2_1", "PC2_2", "CROTA2", "LONPOLE", "LATPOLE")


@functools.lru_cache(maxsize=4096)
def _fractions(wcs_cards: tuple, positions: tuple) -> tuple:
    from astropy.io import fits

    header = fits.Header([(k, v) for k, v in wcs_cards if v is not None])
    header["NAXIS"] = 2
    return tuple(hpc_to_fraction(header, x, y) for x, y in positions)


def _markers(header: dict[str, Any] | None, events: list[Event]) -> dict[str, list[float]]:
    """``{event id: [fx, fy]}`` for the events whose position falls on the image (WCS of the
    product's stored header; frames that share a pointing share one computation)."""
    if not header:
        return {}
    cards = tuple((k, header.get(k)) for k in WCS_KEYS)
    where = _fractions(cards, tuple((float(e.hpc_x), float(e.hpc_y)) for e in events))
    return {str(e.id): [round(w[0], 5), round(w[1], 5)] for e, w in zip(events, where) if w is not None}


def player_frames(session: Session, channel: str, start: dt.datetime, end: dt.datetime, diff: str,
                  *, limit: int = MAX_FRAMES, principal=None) -> PlayerFrames:
    """The frames a player shows, each with its image URL and the markers of the events
    ``principal`` may see (None: anonymous, the public catalogue).

    Each frame: ``product_id``, ``date_obs`` (ISO 8601 UTC), ``url`` (the quicklook PNG, or
    the difference PNG ``/api/v1/movies/frames/{id}.png?ref={ref}``), ``ref`` (the
    reference product of a difference) and ``markers``: for each event of the window with
    a helioprojective position that falls on the image, ``[fx, fy]``, its place as
    fractions of the image's width and height from the top left, through the WCS of the
    product's header as stored with it (:func:`pipelines.movies.hpc_to_fraction`).
    """
    prods = movie_products(session, channel, start, end, limit=limit + 1)
    truncated = len(prods) > limit
    prods = prods[:limit]
    events = window_events(session, start, end, principal=principal)
    from types import SimpleNamespace

    from backend.services.imaging import located_events

    stand_in = {k: v for k, v in located_events(session, events, principal).items()
                if v.hpc_x is not None and v.hpc_y is not None}
    # an event with no position of its own (a GOES report row) is marked where its same flare is
    placed = [e if e.hpc_x is not None and e.hpc_y is not None else
              SimpleNamespace(id=e.id, hpc_x=stand_in[e.id].hpc_x, hpc_y=stand_in[e.id].hpc_y)
              for e in events if (e.hpc_x is not None and e.hpc_y is not None) or e.id in stand_in]
    frames = []
    for i, p in enumerate(prods):
        if diff != "none" and i == 0:
            continue
        ref = None if diff == "none" else (prods[i - 1] if diff == "running" else prods[0])
        url = (f"/api/v1/products/{p.id}/quicklook.png" if ref is None else
               f"/api/v1/movies/frames/{p.id}.png?ref={ref.id}")
        markers = _markers(p.header, placed) if placed else {}
        frames.append({"product_id": p.id, "ref": None if ref is None else ref.id,
                       "date_obs": _iso(p.frame.date_obs), "url": url, "markers": markers})
    return PlayerFrames(channel=channel, diff=diff, start=start, end=end, frames=frames,
                        events=[{**_event_dict(e), **({"position_event": stand_in[e.id].id} if e.id in stand_in else {})}
                                for e in events], truncated=truncated)


def event_movie_window(event: Event, margin: dt.timedelta = EVENT_MARGIN) -> tuple[dt.datetime, dt.datetime]:
    """The window of an event's movie: its start - ``margin`` to its end (peak, start) + ``margin``."""
    return products_service.event_window(event, margin)


def submit_movie(session: Session, req: MovieRequest, *, owner: str = "system",
                 quota_for: Principal | None = None) -> Movie:
    """Count the frames of ``req``, store a ``queued`` movie of ``owner`` (the token's user;
    ``system`` for the platform) with its options (``size``, ``event_id``, ``crop``) in its
    row, and commit (the caller sends it, :func:`enqueue_movie`). ``quota_for``: the
    principal whose concurrent-jobs quota it counts against
    (:func:`backend.services.quotas.admit_movie`; a movie is a job too) and who must be able
    to see the event.

    Raises
    ------
    backend.services.quotas.QuotaExceeded
        429 over the concurrent-jobs quota of ``quota_for`` (nothing is stored).
    MovieRequestError
        If the window holds no frame to show (or one only, with a difference), or more than
        :data:`MAX_FRAMES`, or its event is unknown or has no position; ``.frames`` is the
        count the movie would have had.
    """
    import uuid

    n = _check_count(len(movie_products(session, req.channel, req.start, req.end)), req.diff)
    _check_event(session, req, quota_for, n)
    if quota_for is not None:
        from backend.services.quotas import admit_movie

        admit_movie(session, quota_for)
    movie = Movie(id=str(uuid.uuid4()), owner=owner, channel_code=req.channel, start_time=req.start,
                  end_time=req.end, diff=req.diff, fps=req.fps, state=MovieState.queued, frames_total=n,
                  frames_done=0, sent_at=dt.datetime.now(dt.UTC), size=req.size, event_id=req.event,
                  crop=req.crop)
    session.add(movie)
    session.commit()
    return movie


def enqueue_movie(movie_id: str) -> None:
    """Send the movie to the broker (task ``make_movie`` by name, queue ``cpu``); returns at once."""
    from backend.broker import TaskName, send

    send(TaskName.make_movie, args=[movie_id], queue="cpu")


def get_movie(session: Session, movie_id: str) -> Movie | None:
    return session.get(Movie, movie_id)


def movie_dir(root: Path) -> Path:
    """The movie store: ``DATA_DIR/movies`` (beside the product store's root)."""
    return Path(root) / "movies"
