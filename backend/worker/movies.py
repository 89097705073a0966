"""Making a movie (task ``make_movie``): claim it, render its frames, write the MP4.

A delivery first **claims** the movie (:func:`claim_movie`, committed before any work):
``queued -> running`` (or it takes over a ``running`` movie whose claim is dead or past its
lease: its worker died), with one more ``deliveries`` and the holder recorded. A delivery
that finds the movie ended, or held by a live claim, does nothing; one that finds it past
``MAX_DELIVERIES`` fails it with the reason (a movie that kills its worker stops).

The frames are rendered in DATE-OBS order (:mod:`pipelines.movies`: the quicklook stretch,
or the running or base difference on one symmetric scale for the whole movie, the channel
and DATE-OBS in a caption; at the products' resolution or a chosen size, optionally cut to
an event's box and with its marker: the options of the movie's row, :func:`~backend.services.movies.movie_spec`)
and piped to ffmpeg (``imageio-ffmpeg``, whose wheel ships the binary: H.264, yuv420p,
``+faststart``) into a temporary file of the movie store, renamed
into place once complete. Progress (``frames_done``) is committed as frames are written, by
an UPDATE conditioned on the claim: a holder whose movie was taken over stops at its next
frame and writes nothing. Any failure moves the movie to ``failed`` with the reason.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.models import Event, Movie, MovieState, utcnow
from backend.settings import Settings
from backend.state import MOVIE_FINAL, claim_is_dead, is_retry_of, move_movie, this_process
from pipelines.errors import DataError, failure_reason
from pipelines.utc import as_utc

log = logging.getLogger(__name__)

__all__ = ["MovieClaim", "claim_movie", "make_movie", "render_movie", "movie_give_up_reason", "PROGRESS_EVERY_S",
           "TakenOver"]

#: Progress is committed at most this often [s] (and after the last frame).
PROGRESS_EVERY_S = 0.5


class TakenOver(RuntimeError):
    """The movie's claim was taken by another delivery while this one rendered."""


@dataclass(frozen=True)
class MovieClaim:
    """``status``: ``claimed`` (this delivery renders), ``finished`` (ended already),
    ``busy`` (a live claim holds it), ``exhausted`` (failed now: too many deliveries),
    ``missing`` (no such movie)."""

    status: str
    holder: str | None = None


def movie_give_up_reason(deliveries: int) -> str:
    """Why a movie delivered ``deliveries`` times without finishing is failed."""
    return (f"gave up after {deliveries} deliveries: each started rendering this movie and none finished "
            "(its worker process died or passed the hard time limit each time)")


def _aware(t: dt.datetime | None) -> dt.datetime | None:
    return t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t


def claim_lost(movie: Movie, now: dt.datetime, lease_s: float) -> bool:
    """Whether a ``running`` movie's claim is past its lease or its process is gone."""
    claimed_at = _aware(movie.claimed_at)
    return claimed_at is None or claimed_at < now - dt.timedelta(seconds=lease_s) or claim_is_dead(movie.claimed_by)


def claim_movie(session: Session, movie_id: str, *, lease_s: float, max_deliveries: int,
                holder: str | None = None, now: dt.datetime | None = None) -> MovieClaim:
    """Claim movie ``movie_id`` for one rendering; commits.

    Parameters
    ----------
    lease_s : float
        A ``running`` claim older than this [s] is taken back (``Settings.lease_s``).
    max_deliveries : int
        Deliveries a movie may take without finishing (``Settings.max_deliveries``).
    holder : str, optional
        Who claims (default :func:`backend.state.this_process`).
    """
    now = now or utcnow()
    holder = holder or this_process()
    movie = session.scalar(select(Movie).where(Movie.id == movie_id).with_for_update()
                           .execution_options(populate_existing=True))
    if movie is None:
        session.commit()
        return MovieClaim("missing")
    if movie.state in MOVIE_FINAL:
        session.commit()
        return MovieClaim("finished")
    again = movie.state == MovieState.running and is_retry_of(holder, movie.claimed_by)
    if movie.state == MovieState.running and not again and not claim_lost(movie, now, lease_s):
        session.commit()
        return MovieClaim("busy")
    if not again and (movie.deliveries or 0) >= max_deliveries:
        move_movie(movie, MovieState.failed, movie_give_up_reason(movie.deliveries or 0))
        session.commit()
        return MovieClaim("exhausted")
    if not again:
        movie.deliveries = (movie.deliveries or 0) + 1
    movie.claimed_by, movie.claimed_at, movie.frames_done = holder, now, 0
    move_movie(movie, MovieState.running)
    session.commit()
    return MovieClaim("claimed", holder)


def _progress(session: Session, movie_id: str, holder: str, done: int) -> None:
    """Record ``done`` frames, if the claim is still ``holder``'s; commits.

    Raises
    ------
    TakenOver
        If another delivery holds the movie now (or it ended meanwhile).
    """
    res = session.execute(update(Movie).where(Movie.id == movie_id, Movie.claimed_by == holder,
                                              Movie.state == MovieState.running)
                          .values(frames_done=done).execution_options(synchronize_session=False))
    session.commit()
    if res.rowcount != 1:
        raise TakenOver(f"movie {movie_id} was taken over by another delivery")


def _sources(paths: list[Path], spec):
    """Yield (index, image, mark) per product: the L2 image at full resolution (float64,
    NaN where DQ != 0 or not finite, row 0 at the bottom), cut to ``spec.box`` when it has
    one (one pixel shape for the movie, from its first product's WCS; each frame centred on
    the box through its own WCS), and the pixel of ``spec.hpc`` on it (None: no marker)."""
    from pipelines.movies import crop_shape, crop_to_box, hpc_pixel, product_map
    from pipelines.products import read_product

    shape = None
    for i, p in enumerate(paths):
        data, dq, header = read_product(p, dtype=np.float64)
        img = np.where((np.asarray(dq) != 0) | ~np.isfinite(data), np.nan, data)
        if spec.hpc is None and spec.box is None:
            yield i, img, None
            continue
        smap = product_map(img, header)
        if spec.box is None:
            yield i, img, hpc_pixel(smap, *spec.hpc)
            continue
        shape = shape or crop_shape(smap, spec.box)
        try:
            cut, mark = crop_to_box(img, smap, spec.box, shape, spec.hpc)
        except DataError as exc:
            raise DataError(f"frame {i + 1} of the movie: {exc}") from None
        yield i, cut, mark


#: Most values of ``|difference|`` per frame that the movie's difference scale is taken
#: from (a strided subsample of each frame at full resolution: the percentile of the pooled
#: values, without holding every frame).
SCALE_SAMPLES = 65536


def _frame_images(paths: list[Path], diff: str, channel: str, spec):
    """Yield (index, unit image [0, 1] at full resolution, mark, is_difference) per movie frame.

    Without a difference, each product's quicklook stretch (of the crop); with one, the
    difference on one symmetric scale for the whole movie: the :data:`~pipelines.movies.DIFF_PERCENTILE`
    of ``|difference|`` pooled over every frame (subsampled, :data:`SCALE_SAMPLES` a frame),
    so a frame's contrast means the same in every frame. The products are read twice then
    (the scale, then the frames), never all held at once.
    """
    from pipelines.movies import DIFF_PERCENTILE, difference_image, quicklook_unit_image, signed_unit_image

    if diff == "none":
        for i, img, mark in _sources(paths, spec):
            yield i, quicklook_unit_image(img, np.zeros(img.shape, np.uint8), channel, size=max(img.shape)), mark, False
        return

    def diffs():
        ref = None
        for i, img, mark in _sources(paths, spec):
            if ref is not None:
                yield i, difference_image(img, ref), mark
            if ref is None or diff == "running":
                ref = img

    samples = []
    for _, d, _ in diffs():
        step = max(1, int(np.ceil(np.sqrt(d.size / SCALE_SAMPLES))))
        v = np.abs(d[::step, ::step])
        samples.append(v[np.isfinite(v)])
    allv = np.concatenate(samples) if samples else np.empty(0)
    limit = float(np.percentile(allv, DIFF_PERCENTILE)) if allv.size else None
    for i, d, mark in diffs():
        yield i, signed_unit_image(d, limit=limit)[0], mark, True


def render_movie(session: Session, movie: Movie, settings: Settings, holder: str) -> tuple[Path, tuple[int, int]]:
    """Render ``movie``'s frames into its MP4 (atomically); returns its path and (width, height) [pixel].

    The frames are drawn as its :class:`~backend.services.movies.MovieSpec` says: at the
    products' own resolution (of the crop) or with the larger side ``size``, cut to the
    event's box, with the event's marker ring (:func:`pipelines.movies.movie_frame`; every
    frame, at the event's helioprojective position through that frame's WCS), the channel
    and DATE-OBS written at the top left.

    Raises
    ------
    pipelines.errors.DataError
        If its frames are gone or unreadable, differ in size, the event's box is off a
        frame, or the window now holds too few.
    TakenOver
        If another delivery took the movie over meanwhile.
    """
    import imageio_ffmpeg

    from backend.services import products as products_service
    from backend.services.movies import movie_dir, movie_products, movie_spec
    from pipelines.movies import diff_label, movie_frame, movie_shape, rgb_frame

    prods = movie_products(session, movie.channel_code, movie.start_time, movie.end_time)
    paths = []
    for p in prods:
        path = products_service.served_store_path(p.path, settings.products)
        if path is None:
            raise DataError(f"the FITS file of product {p.id} (DATE-OBS {p.frame.date_obs:%Y-%m-%dT%H:%M:%S}) is "
                            "missing from the product store")
        paths.append(path)
    dates = [as_utc(p.frame.date_obs).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] for p in prods]
    total = len(paths) - (0 if movie.diff == "none" else 1)
    if total <= 0:
        raise DataError(f"empty movie: the window holds {len(paths)} written product(s) of {movie.channel_code} now")
    movie_id, channel, diff, fps = movie.id, movie.channel_code, movie.diff, float(movie.fps)
    spec = movie_spec(session, movie)
    if (movie.crop and spec.box is None) or (movie.event_id is not None and spec.hpc is None):
        role = "crops to" if movie.crop else "marks"
        if movie.event_id is None or session.get(Event, movie.event_id) is None:
            raise DataError(f"the event this movie {role} was deleted")
        raise DataError(f"event {movie.event_id}, which this movie {role}, has no helioprojective position any more")
    out_dir = movie_dir(settings.root)
    tmp_dir = out_dir / ".tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    for old in tmp_dir.glob(f"{movie_id}.*.part.mp4"):  # a killed delivery's partial file
        old.unlink(missing_ok=True)
    tmp = tmp_dir / f"{movie_id}.{os.getpid()}.part.mp4"
    final = out_dir / f"lst_{channel.lower().replace('-', '')}_{diff}_{movie_id}.mp4"
    writer, source, shape, done, last = None, None, None, 0, time.monotonic()
    session.execute(update(Movie).where(Movie.id == movie_id).values(frames_total=total)
                    .execution_options(synchronize_session=False))
    session.commit()
    head = f"LST {channel}" + (f"  {diff_label(diff)}" if diff != "none" else "")
    try:
        for i, unit, mark, is_diff in _frame_images(paths, diff, channel, spec):
            if source is None:
                source, shape = unit.shape, movie_shape(unit.shape, spec.size)
                writer = imageio_ffmpeg.write_frames(
                    str(tmp), (shape[1], shape[0]), fps=fps, codec="libx264", pix_fmt_in="rgb24",
                    pix_fmt_out="yuv420p", macro_block_size=2, ffmpeg_log_level="error",
                    output_params=["-movflags", "+faststart"])
                writer.send(None)
            if unit.shape != source:
                raise DataError(f"frame {i + 1} of the movie is {unit.shape[1]}x{unit.shape[0]} pixels, the first "
                                f"{source[1]}x{source[0]}: products of one movie must have one size")
            frame = movie_frame(rgb_frame(unit, channel, difference=is_diff), shape, (head, f"{dates[i]} UTC"), mark)
            writer.send(np.ascontiguousarray(frame))
            done += 1
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                _progress(session, movie_id, holder, done)
                last = time.monotonic()
        writer.close()
        writer = None
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _progress(session, movie_id, holder, done)
        os.replace(tmp, final)
    finally:
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the failure that got us here is the one to report
                pass
        tmp.unlink(missing_ok=True)
    return final, (shape[1], shape[0])


def make_movie(session: Session, movie_id: str, settings: Settings, *, holder: str | None = None) -> Movie | None:
    """Claim and render one movie; its row ends ``succeeded`` (path, size) or ``failed`` (reason).

    Database faults (``OperationalError``) are raised for the task to retry; every other
    exception fails the movie with its reason (:func:`pipelines.errors.failure_reason`),
    and a soft time limit says so. Returns the movie, ``None`` if there is none.
    """
    from celery.exceptions import SoftTimeLimitExceeded
    from sqlalchemy.exc import OperationalError

    holder = holder or this_process()
    claim = claim_movie(session, movie_id, lease_s=settings.lease_s, max_deliveries=settings.max_deliveries,
                        holder=holder)
    movie = session.get(Movie, movie_id)
    if claim.status != "claimed":
        if claim.status == "busy":
            log.info("movie %s is being rendered by %s: this delivery does nothing", movie_id, movie.claimed_by)
        return movie
    try:
        final, size = render_movie(session, movie, settings, holder)
    except TakenOver:
        session.rollback()
        log.warning("movie %s was taken over while this delivery rendered it: not written", movie_id)
        return session.get(Movie, movie_id)
    except OperationalError:
        session.rollback()
        raise
    except SoftTimeLimitExceeded:
        reason = (f"rendering passed the soft time limit of {settings.task_soft_time_limit_s:.0f} s "
                  "(TASK_SOFT_TIME_LIMIT_S): ask for a shorter window")
        _fail_held(session, movie_id, holder, reason)
        return session.get(Movie, movie_id)
    except Exception as exc:  # noqa: BLE001 - a movie must end failed with the reason, never stay running
        log.exception("movie %s failed", movie_id)
        _fail_held(session, movie_id, holder, failure_reason(exc))
        return session.get(Movie, movie_id)
    movie = session.scalar(select(Movie).where(Movie.id == movie_id).with_for_update()
                           .execution_options(populate_existing=True))
    if movie.claimed_by != holder or movie.state != MovieState.running:
        session.commit()
        return movie
    movie.path, movie.size_bytes = str(final), final.stat().st_size
    movie.width, movie.height = size
    move_movie(movie, MovieState.succeeded)
    session.commit()
    return movie


def _fail_held(session: Session, movie_id: str, holder: str, reason: str) -> None:
    """Fail the movie with ``reason`` if this delivery still holds it; commits."""
    session.rollback()
    movie = session.scalar(select(Movie).where(Movie.id == movie_id).with_for_update()
                           .execution_options(populate_existing=True))
    if movie is not None and movie.state == MovieState.running and movie.claimed_by == holder:
        move_movie(movie, MovieState.failed, reason)
    session.commit()
