"""``/movies``: the frame player's frames and difference images, and MP4 movies made by a worker.

* ``GET /movies/frames?channel=&start=&end=&diff=`` (or ``?event=<id>``): the frames of a
  window (each with its image URL and the events' markers) and the events of the window;
* ``GET /movies/frames/{product_id}.png?ref=<product_id>``: the signed difference of two
  products of one channel, symmetric about zero (grey: zero; white: brighter);
* ``POST /movies``: store and send a movie job (202; 422 on bad input or an empty window,
  the answer saying how many frames the movie would have);
* ``GET /movies/{id}``: its state and progress; ``GET /movies/{id}/file``: the MP4.

The page ``/movies`` (:mod:`backend.api.pages.movies`) holds the player (``frontend/templates/movie.html``).
"""

from __future__ import annotations

import datetime as dt
import io
import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep, SubmitLimited
from backend.api.conditional import file_response
from backend.api.params import MAX_ID, ChannelQuery, IdPath, TimeRangeDep
from backend.api.presenters import movie_window
from backend.faults import public_reason
from backend.models import Movie, MovieState, ProductState
from backend.services import movies as movies_service
from backend.services import products as products_service
from backend.services.movies import MovieRequest, MovieRequestError
from backend.state import move_movie
from pipelines.errors import DataError

router = APIRouter(prefix="/movies", tags=["movies"])
log = logging.getLogger(__name__)

DiffQuery = Annotated[str, Query(pattern="^(none|running|base)$",
                                 description="none, running (minus the previous frame) or base (minus the first)")]


class MoviePublic(BaseModel):
    """A movie job: state (queued, running, succeeded, failed), progress, and its file once made."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    channel: str = Field(validation_alias="channel_code")
    start: dt.datetime = Field(validation_alias="start_time")
    end: dt.datetime = Field(validation_alias="end_time")
    diff: str
    fps: float
    state: MovieState
    frames_total: int
    frames_done: int
    error: str | None = None
    size_bytes: int | None = None
    width: int | None = None
    height: int | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    file_url: str | None = None
    progress: float = 0.0
    size: int | None = Field(default=None, description="larger side asked for [pixel]; None: full resolution")
    event: int | None = Field(default=None, validation_alias="event_id",
                              description="the event marked; None: none, or the event was deleted")
    crop: bool = Field(default=False, description="cropped to the event's box")
    crop_box: list[float] | None = Field(default=None, description="the box cropped to, helioprojective "
                                                                   "[x0, y0, x1, y1] arcsec, from the event's row; "
                                                                   "None: the whole image, or the event is gone")

    @classmethod
    def of(cls, movie: Movie, spec: movies_service.MovieSpec | None = None) -> MoviePublic:
        """The movie's row (its options included); ``spec``
        (:func:`backend.services.movies.movie_spec`) gives the crop box."""
        out = cls.model_validate(movie)
        if spec is not None and spec.box is not None:
            out.crop_box = list(spec.box)
        out.progress = round(movie.frames_done / movie.frames_total, 4) if movie.frames_total else 0.0
        if movie.state == MovieState.succeeded:
            out.file_url = f"/api/v1/movies/{movie.id}/file"
            out.progress = 1.0
        return out


@router.get("/frames", summary="Frames of a player: channel and window, or an event's window")
def read_movie_frames(
    session: SessionDep,
    span: TimeRangeDep,
    principal: OptionalPrincipal,
    channel: ChannelQuery = None,
    diff: DiffQuery = "none",
    event: Annotated[int | None, Query(ge=1, le=MAX_ID, description="An event: its window ± 30 min")] = None,
) -> dict:
    """The frames (oldest first) with ``date_obs`` (DATE-OBS, UTC), ``url`` of the image and
    ``markers`` (``{event id: [fx, fy]}``, the event's helioprojective position as fractions
    of the image from the top left, through the product's WCS), and the window's events."""
    code, lo, hi, ev = movie_window(session, channel, span.start, span.end, event, principal)
    out = movies_service.player_frames(session, code, lo, hi, diff, principal=principal).as_dict()
    out["event"] = ev
    return out


@router.get(
    "/frames/{product_id}.png",
    response_class=Response,
    summary="Difference image of two products (PNG)",
    responses={200: {"content": {"image/png": {}}, "description": "product minus ref, signed, symmetric scale"},
               404: {"description": "No such product, or its file is missing"},
               422: {"description": "Products of different channels or sizes"}},
)
def read_difference_png(
    product_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    principal: OptionalPrincipal,
    ref: Annotated[int, Query(ge=1, le=MAX_ID, description="The reference product (subtracted)")],
) -> Response:
    """``product - ref`` block-averaged to at most 512 pixels a side, scaled symmetrically
    about zero (±the 99.5th percentile of ``|difference|``; ``astropy.visualization``),
    grey, north up."""
    from backend.models import Product
    from backend.services import visibility
    from pipelines.movies import difference_image, rgb_frame, signed_unit_image

    rows = []
    for pid in (product_id, ref):
        row = visibility.get_visible(session, Product, pid, principal)  # a private set's: 404
        if row.state != ProductState.written:
            raise HTTPException(404, detail=f"product {pid} is {row.state.value}, its FITS file is not written")
        path = products_service.served_store_path(row.path, settings.products)
        if path is None:
            raise HTTPException(404, detail=f"the FITS file of product {pid} is missing from the product store")
        rows.append((row, path))
    (cur, cur_path), (base, base_path) = rows
    if cur.frame.channel_code != base.frame.channel_code:
        raise HTTPException(422, detail=f"product {product_id} is {cur.frame.channel_code}, product {ref} "
                                        f"{base.frame.channel_code}: a difference needs one channel")
    try:
        diff = difference_image(movies_service.cached_display_array(cur_path),
                                movies_service.cached_display_array(base_path))
    except DataError as exc:
        raise HTTPException(422, detail=str(exc).splitlines()[0]) from None
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb_frame(signed_unit_image(diff)[0], cur.frame.channel_code, difference=True)).save(buf, "PNG")
    return Response(buf.getvalue(), media_type="image/png", headers={"Cache-Control": "max-age=3600"})


@router.post(
    "",
    response_model=MoviePublic,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Ask for an MP4 movie (made by a worker)",
    responses={202: {"description": "Stored and queued; follow it at the Location URL"},
               401: {"description": "No API token, or an unknown, revoked or expired one"},
               403: {"description": "The token lacks scope jobs:submit"},
               422: {"description": "Invalid request, or a window without frames (the answer says how many)"},
               429: {"description": "Over the concurrent-jobs quota or the write rate limit; see Retry-After"},
               503: {"description": "Stored, but the broker could not be reached: the movie is marked failed"}},
)
def create_movie(req: MovieRequest, session: SessionDep, response: Response, principal: SubmitLimited):
    """Count the window's frames, store a ``queued`` movie, commit, send it and return at once;
    poll ``GET /api/v1/movies/{id}`` for its progress.

    A movie is a job: it needs a token with scope ``jobs:submit`` (its owner is the token's
    user) and counts against the concurrent-jobs quota and the write rate (429 with
    ``Retry-After`` over either, nothing stored; admins are exempt).

    ``size`` (even, 32 to 4608) sets the MP4's larger side; without it the MP4 has the
    products' own resolution (of the crop). ``event`` marks an event (a cyan ring at its
    helioprojective position, through each product's WCS); ``crop`` cuts each frame to the
    event's box (422 without ``event``, for an unknown event or one without a position)."""
    try:
        movie = movies_service.submit_movie(session, req, owner=principal.user, quota_for=principal)
    except MovieRequestError as exc:
        return JSONResponse({"detail": str(exc), "frames": exc.frames}, status_code=422)
    try:
        movies_service.enqueue_movie(movie.id)
    except Exception as exc:  # broker down: the movie must not stay queued for ever
        log.exception("could not send movie %s", movie.id)
        reason = f"broker unreachable: {public_reason(exc)}"
        session.refresh(movie, with_for_update=True)
        if movie.state == MovieState.queued:
            move_movie(movie, MovieState.failed, f"could not send the movie: {reason}")
        session.commit()
        raise HTTPException(503, detail=f"movie {movie.id} was stored but could not be sent to the broker ({reason}); "
                                        "it is marked failed: ask again later") from None
    response.headers["Location"] = f"/api/v1/movies/{movie.id}"
    return MoviePublic.of(movie, movies_service.movie_spec(session, movie))


def _movie_or_404(session: Session, movie_id: str, principal) -> Movie:
    """The movie if ``principal`` may see it (its own, or the platform's); else 404."""
    from backend.services import visibility

    return visibility.get_visible(session, Movie, movie_id, principal)


@router.get("/{movie_id}", response_model=MoviePublic, summary="One movie and its progress")
def read_movie(movie_id: str, session: SessionDep, principal: OptionalPrincipal) -> MoviePublic:
    """State (queued, running, succeeded, failed), frames done of total, the reason of a failure.
    Another user's movie is 404."""
    movie = _movie_or_404(session, movie_id, principal)
    return MoviePublic.of(movie, movies_service.movie_spec(session, movie))


@router.get(
    "/{movie_id}/file",
    response_class=FileResponse,
    summary="Download the MP4",
    responses={200: {"content": {"video/mp4": {}}, "description": "The movie (H.264)"},
               404: {"description": "No such movie, or it is not made (yet)"}},
)
def read_movie_file(request: Request, movie_id: str, session: SessionDep, settings: SettingsDep,
                    principal: OptionalPrincipal) -> Response:
    """The MP4 of a succeeded movie, as an attachment (another user's movie: 404); conditional
    requests are honoured (304, :mod:`backend.api.conditional`)."""
    movie = _movie_or_404(session, movie_id, principal)
    if movie.state != MovieState.succeeded:
        raise HTTPException(404, detail=f"movie {movie_id} is {movie.state.value}: it has no file"
                                        + (f" ({movie.error})" if movie.error else ""))
    path = products_service.served_store_path(movie.path, movies_service.movie_dir(settings.root))
    if path is None:
        raise HTTPException(404, detail=f"the file of movie {movie_id} is missing from the movie store")
    return file_response(request, path, media_type="video/mp4", filename=path.name)
