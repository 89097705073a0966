"""Ingest: register raw LST frames and calibration masters; quarantine what cannot be used.

``ingest_path`` is the one entry point (the CLI and the Celery task call it). Outcomes:

``ingested``     a new frame row, the file stored under ``RAW_DIR/<channel>/<yyyy>/<mm>/<dd>/``;
``calibration``  a new calibration file row (a FITS whose header has ``CALKIND``);
``duplicate``    a file with the same SHA-256 is already registered: nothing changes;
``rejected``     the file cannot be used: it goes to ``QUARANTINE_DIR`` with a ``.reason``
                 file beside it, and the one-line reason is returned (never raised).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astropy.io import fits
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, CalibrationKind, Frame
from backend.settings import Settings
from pipelines.channels import CHANNELS, MIN_FRAME_SIDE, channel_from_header
from pipelines.errors import DataError, FitsReadError, NotLSTFrameError
from pipelines.fitsio import (exposure_seconds, parse_date_obs, read_image, read_primary_header, sha256_file,
                              utc_datetime, verify_checksums)

__all__ = ["IngestOutcome", "ingest_path", "header_to_json", "check_frame_shape", "LINES_KEPT"]


@dataclass
class IngestOutcome:
    path: str
    status: str
    reason: str = ""
    frame_id: int | None = None
    calibration_file_id: int | None = None
    stored_path: str | None = None

    def line(self) -> str:
        tail = f": {self.reason}" if self.reason else ""
        ident = f" frame {self.frame_id}" if self.frame_id else (
            f" calibration file {self.calibration_file_id}" if self.calibration_file_id else "")
        return f"{self.status}{ident} {Path(self.path).name}{tail}"


def _json_value(v: Any) -> Any:
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return str(v)


#: HISTORY and COMMENT lines a stored header keeps [lines]: the first and the last
#: ``LINES_KEPT`` of each (a choice: a row holds at most about 10 kB of them; the file keeps
#: every card).
LINES_KEPT = 50


def header_to_json(header: fits.Header, *, lines_kept: int = LINES_KEPT) -> dict[str, Any]:
    """A JSON-safe dict of a FITS header, its HISTORY and COMMENT bounded.

    HISTORY and COMMENT are lists of strings holding at most the first and the last
    ``lines_kept`` lines; when lines are left out, ``"_lines"`` gives the count of each, e.g.
    ``{"HISTORY": {"total": 20013, "kept": 40}}``. Other keywords map to their values (NaN
    and infinities to None, other types to ``str``).
    """
    out: dict[str, Any] = {}
    lines: dict[str, list[int]] = {}
    commentary = []
    for n, card in enumerate(header.cards):
        key = card.keyword
        if key in ("HISTORY", "COMMENT"):
            lines.setdefault(key, []).append(n)
        elif key:
            out[key] = _json_value(card.value)
    cards = header.cards
    for key, where in lines.items():
        kept = where if len(where) <= 2 * lines_kept else where[:lines_kept] + where[-lines_kept:]
        out[key] = [str(cards[n].value) for n in kept]
        if len(kept) < len(where):
            commentary.append((key, {"total": len(where), "kept": len(kept)}))
    if commentary:
        out["_lines"] = dict(commentary)
    return out


def _move_or_copy(src: Path, dst: Path, move: bool) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst = dst.with_name(f"{dst.stem}.{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S%f')}{dst.suffix}")
    if move:
        shutil.move(str(src), dst)
    else:
        shutil.copy2(src, dst)
    return dst


def quarantine(src: Path, reason: str, settings: Settings, move: bool, sha: str | None = None, *,
               folder: Path | None = None) -> Path:
    """Keep a rejected file for inspection, with its reason in ``<name>.reason``.

    Files are kept under ``<first 12 hex of SHA-256>_<name>`` in ``folder`` (default
    ``settings.quarantine``; ``lstdp fsck`` uses its ``fsck/`` subfolder): the same bytes
    rejected again are not stored twice (with ``move`` the source is then removed, its copy
    being kept).
    """
    sha = sha or sha256_file(src)
    dst = (folder or settings.quarantine) / f"{sha[:12]}_{src.name}"
    if dst.exists():
        if move:
            src.unlink()
        return dst
    dst = _move_or_copy(src, dst, move)
    tmp = dst.with_name(dst.name + ".reason.part")
    tmp.write_text(reason + "\n")
    os.replace(tmp, dst.with_name(dst.name + ".reason"))
    return dst


def _register_calibration(session: Session, src: Path, sha: str, header: fits.Header,
                          settings: Settings, move: bool) -> IngestOutcome:
    try:
        kind = CalibrationKind(str(header["CALKIND"]).strip().lower())
    except ValueError:
        raise DataError(f"unknown CALKIND {header['CALKIND']!r}") from None
    channel = str(header.get("CHANNEL", "")).strip().upper()
    from pipelines.channels import CHANNELS

    if channel not in CHANNELS:
        raise DataError(f"calibration file names no LST channel (CHANNEL={channel!r})")
    try:
        version = int(header["CALVER"])
        valid_from = utc_datetime(parse_date_obs(str(header["VALIDFRM"])))
        valid_to = utc_datetime(parse_date_obs(str(header["VALIDTO"]))) if str(header.get("VALIDTO", "")).strip() else None
    except (KeyError, ValueError) as exc:
        raise DataError(f"calibration header incomplete or invalid ({exc})") from None
    existing = session.scalar(select(CalibrationFile).where(
        CalibrationFile.channel_code == channel, CalibrationFile.kind == kind, CalibrationFile.version == version))
    if existing is not None:
        raise DataError(f"{channel} {kind.value} version {version} is already registered with other content "
                        f"(calibration file {existing.id}); give the new file a new CALVER")
    stored = _move_or_copy(src, settings.calibration / channel / kind.value / src.name, move)
    params = {k: _json_value(v) for k, v in header.items()
              if k not in ("SIMPLE", "BITPIX", "NAXIS", "NAXIS1", "NAXIS2", "EXTEND", "COMMENT", "HISTORY", "")}
    row = CalibrationFile(channel_code=channel, kind=kind, version=version, valid_from=valid_from,
                          valid_to=valid_to, path=str(stored), sha256=sha, parameters=params,
                          description=str(header.get("CALDESC", ""))[:400])
    session.add(row)
    session.flush()
    return IngestOutcome(str(src), "calibration", calibration_file_id=row.id, stored_path=str(stored))


def check_frame_shape(shape: tuple[int, ...], channel: str) -> None:
    """Refuse an image whose shape cannot be a raw frame of ``channel``.

    Parameters
    ----------
    shape : tuple of int
        ``data.shape`` of the image, (NAXIS2, NAXIS1) [pixel].
    channel : str
        An LST channel code (a key of :data:`pipelines.channels.CHANNELS`).

    Raises
    ------
    DataError
        With a one-line reason when the image is not 2-D, has a side shorter than
        :data:`pipelines.channels.MIN_FRAME_SIDE` (32 px), or a side longer than the
        channel's detector (``ChannelSpec.naxis``: 4608 px for SDI and WST, 2048 px for
        SCI-UV and SCI-WL, LST.md), or is not square (the detectors are square and a binned
        frame keeps the field of view; LST.md lists no windowed read-out, and the calibration
        masters are matched by frame size, so a non-square frame could not be calibrated).
    """
    if len(shape) != 2:
        raise DataError(f"image has {len(shape)} dimensions, expected a 2-D {channel} frame")
    ny, nx = (int(n) for n in shape)
    full = CHANNELS[channel].naxis
    if min(nx, ny) < MIN_FRAME_SIDE:
        raise DataError(f"{nx}x{ny} px image is too small for an LST {channel} frame "
                        f"(at least {MIN_FRAME_SIDE} px a side)")
    if max(nx, ny) > full:
        raise DataError(f"{nx}x{ny} px image is larger than the {channel} detector ({full}x{full} px)")
    if nx != ny:
        raise DataError(f"{nx}x{ny} px image is not square; LST {channel} frames are (full or binned detector)")


def _primary_header(path: Path) -> fits.Header | None:
    """The primary header (its HISTORY bounded: :func:`pipelines.fitsio.read_primary_header`),
    None if it cannot be read (the full reader then gives the reason)."""
    try:
        return read_primary_header(path)
    except Exception:  # noqa: BLE001 - the full reader gives the reason below
        return None


def ingest_path(session: Session, path: str | Path, settings: Settings, *, move: bool = True) -> IngestOutcome:
    """Ingest one file. Never raises for bad data: returns a ``rejected`` outcome instead.

    The caller commits. ``move=False`` copies instead of moving (the source stays).
    """
    src = Path(path)
    if not src.is_file():
        why = "a symbolic link that leads nowhere" if src.is_symlink() else "no such file"
        return IngestOutcome(str(src), "rejected", f"{why}: {src}")
    try:
        sha = sha256_file(src)
    except OSError as exc:  # unreadable: nothing can be moved either; say why and carry on
        return IngestOutcome(str(src), "rejected", f"cannot read the file: {exc.strerror or exc}")
    if session.scalar(select(Frame.id).where(Frame.sha256 == sha)) is not None:
        fid = session.scalar(select(Frame.id).where(Frame.sha256 == sha))
        return IngestOutcome(str(src), "duplicate", "same SHA-256 as an ingested frame", frame_id=fid)
    cid = session.scalar(select(CalibrationFile.id).where(CalibrationFile.sha256 == sha))
    if cid is not None:
        return IngestOutcome(str(src), "duplicate", "same SHA-256 as a registered calibration file",
                             calibration_file_id=cid)
    try:
        primary = _primary_header(src)
        if primary is not None and "CALKIND" in primary:
            verify_checksums(src)  # a master is checked on ingest too, not only when it is used
            with session.begin_nested():
                return _register_calibration(session, src, sha, primary, settings, move)
        raw = read_image(src)
        channel = channel_from_header(raw.header)
        if channel is None:
            raise NotLSTFrameError(
                "not an LST frame (TELESCOP={!r}, INSTRUME={!r}, DETECTOR={!r})".format(
                    str(raw.header.get("TELESCOP", "")).strip(), str(raw.header.get("INSTRUME", "")).strip(),
                    str(raw.header.get("DETECTOR", "")).strip()))
        check_frame_shape(raw.data.shape, channel)
        exposure = exposure_seconds(raw.header)  # EXPTIME, XPOSURE or EXPOSURE, as calibration reads it
        date_obs = utc_datetime(raw.date_obs)
        dest = settings.raw / channel / date_obs.strftime("%Y/%m/%d") / src.name
        header_json = header_to_json(raw.header)
        header_json["_fixes"] = raw.fixes
        header_json["_raw_history_cards"] = raw.history_cards  # the raw file's, also those not read
        frame = Frame(channel_code=channel, date_obs=date_obs, exposure_s=exposure,
                      level=str(raw.header.get("LEVEL", "L1")).strip()[:8] or "L1",
                      naxis1=int(raw.data.shape[1]), naxis2=int(raw.data.shape[0]), path=str(dest),
                      original_name=src.name[:255], sha256=sha, size_bytes=src.stat().st_size,
                      header=header_json, quality_flags=1 if raw.nan_fraction > 0 else 0)
        with session.begin_nested():
            session.add(frame)
            session.flush()
            stored = _move_or_copy(src, dest, move)  # a failed move rolls the row back
            frame.path = str(stored)
        return IngestOutcome(str(src), "ingested", frame_id=frame.id, stored_path=str(stored))
    except IntegrityError:
        return IngestOutcome(str(src), "duplicate", "registered concurrently by another worker")
    except (FitsReadError, DataError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - any other failure on one file must not stop the batch
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")  # a VerifyError starts blank
        reason = f"unexpected {type(exc).__name__}: {first}".strip()
    where = quarantine(src, reason, settings, move, sha)
    return IngestOutcome(str(src), "rejected", reason, stored_path=str(where))
