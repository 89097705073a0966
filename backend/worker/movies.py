"""Making a movie (task ``make_movie``): claim it, render its frames, write the MP4.

A delivery first **claims** the movie (:func:`claim_movie`, committed before any work):
``queued -> running`` (or it takes over a ``running`` movie whose claim is dead or past its
lease: its worker died), with one more ``deliveries`` and the holder recorded. A delivery
that finds the movie ended, or held by a live claim, does nothing; one that finds it past
``MAX_DELIVERIES`` fails it with the reason (a movie that kills its worker stops).

The frames are rendered in DATE-OBS order (:mod:`pipelines.movies`: display arrays, the
running or base difference on one symmetric scale for the whole movie, the channel and
DATE-OBS in a caption) and piped to ffmpeg (``imageio-ffmpeg``, whose wheel ships the
binary: H.264, yuv420p, ``+faststart``) into a temporary file of the movie store, renamed
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

from backend.models import Movie, MovieState, utcnow
from backend.services import products as products_service
from backend.services.movies import movie_dir, movie_products
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


def _frame_images(paths: list[Path], diff: str, channel: str):
    """Yield (index, unit image [0, 1], is_difference) per movie frame (see the module docstring)."""
    from backend.services.movies import cached_display_array
    from pipelines.movies import difference_image, quicklook_unit_image, signed_unit_image
    from pipelines.products import read_product

    if diff == "none":
        for i, p in enumerate(paths):
            data, dq, _ = read_product(p)
            yield i, quicklook_unit_image(data, dq, channel), False
        return
    arrays = [cached_display_array(p) for p in paths]
    ref = (lambda i: arrays[i - 1]) if diff == "running" else (lambda i: arrays[0])
    diffs = [difference_image(arrays[i], ref(i)) for i in range(1, len(arrays))]
    finite = [np.abs(d[np.isfinite(d)]) for d in diffs]
    allv = np.concatenate(finite) if finite else np.empty(0)
    # one scale for the whole movie: a frame's contrast means the same in every frame
    limit = float(np.percentile(allv, 99.5)) if allv.size else None
    for i, d in enumerate(diffs, start=1):
        yield i, signed_unit_image(d, limit=limit)[0], True


def render_movie(session: Session, movie: Movie, settings: Settings, holder: str) -> tuple[Path, tuple[int, int]]:
    """Render ``movie``'s frames into its MP4 (atomically); returns its path and (width, height) [pixel].

    Raises
    ------
    pipelines.errors.DataError
        If its frames are gone or unreadable, or the window now holds too few.
    TakenOver
        If another delivery took the movie over meanwhile.
    """
    import imageio_ffmpeg

    from pipelines.movies import annotate_frame, rgb_frame

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
    out_dir = movie_dir(settings.root)
    tmp_dir = out_dir / ".tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    for old in tmp_dir.glob(f"{movie_id}.*.part.mp4"):  # a killed delivery's partial file
        old.unlink(missing_ok=True)
    tmp = tmp_dir / f"{movie_id}.{os.getpid()}.part.mp4"
    final = out_dir / f"lst_{channel.lower().replace('-', '')}_{diff}_{movie_id}.mp4"
    writer, size, done, last = None, None, 0, time.monotonic()
    session.execute(update(Movie).where(Movie.id == movie_id).values(frames_total=total)
                    .execution_options(synchronize_session=False))
    session.commit()
    try:
        for i, unit, is_diff in _frame_images(paths, diff, channel):
            frame = annotate_frame(rgb_frame(unit, channel, difference=is_diff), channel, dates[i], diff)
            if writer is None:
                size = (frame.shape[1], frame.shape[0])
                writer = imageio_ffmpeg.write_frames(
                    str(tmp), size, fps=fps, codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
                    macro_block_size=16, ffmpeg_log_level="error", output_params=["-movflags", "+faststart"])
                writer.send(None)
            if (frame.shape[1], frame.shape[0]) != size:
                raise DataError(f"frame {i + 1} of the movie is {frame.shape[1]}x{frame.shape[0]} pixels, the first "
                                f"{size[0]}x{size[1]}: products of one movie must have one size")
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
    return final, size


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
