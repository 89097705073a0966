"""Flare detection on the written SDI L2 products, stored as events.

:func:`detect_sdi_flares` loads the newest written L2 product of every SDI frame in a
DATE-OBS range (ordered by ``Frame.date_obs``), runs the pure detector
:func:`pipelines.detect.flares.detect_flares` on them, and stores each flare as an
``Event`` (HEK type ``FL``, ``source='detected'``, ``channels='SDI'``, ``frm_name``
``lst-sdi-flare`` and its version) linked to the products and frames from its start to its
end (``EventProduct``/``EventFrame``).

Idempotent: the event's ``source_key`` is
``lst-sdi-flare/<version>/<peak DATE-OBS>/<round(x)>,<round(y)>``; a flare already stored
under its key is returned as it is, and existing links are not added again (inserts skip
conflicts, so a worker and the CLI detecting at the same time do not fail each other). A
new detector version makes new events and keeps the old ones.

Product files: image in the primary HDU (float32, ``BUNIT``), ``DQ`` mask (non-zero =
not to be used), helioprojective WCS and observer keywords in the primary header.
``Product.path`` is absolute or relative to the product store (``Settings.products``).
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import (
    Event,
    EventFrame,
    EventProduct,
    Frame,
    Product,
    ProductState,
    utcnow,
)
from backend.services.events import insert_ignoring_conflicts
from pipelines.catalogues.records import json_safe
from pipelines.detect.flares import (
    DETECTOR_NAME,
    DETECTOR_VERSION,
    DetectedFlare,
    FlareDetectionParams,
    detect_flares,
)
from pipelines.errors import FitsReadError
from pipelines.products import read_product

__all__ = ["detect_sdi_flares", "flare_source_key", "SOURCE", "CHANNEL"]

log = logging.getLogger(__name__)

SOURCE = "detected"
CHANNEL = "SDI"


def flare_source_key(flare: DetectedFlare, version: str = DETECTOR_VERSION) -> str:
    """``lst-sdi-flare/<version>/<peak ISO>/<round(x)>,<round(y)>`` of a detected flare."""
    peak = flare.peak_time.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{DETECTOR_NAME}/{version}/{peak}/{round(flare.hpc_x)},{round(flare.hpc_y)}"


class _ProductFiles:
    """Reads L2 product files on demand, keeping the last few (frames are large)."""

    def __init__(self, paths: list[Path], keep: int = 2) -> None:
        self.paths = paths
        self.keep = keep
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray | None]] = OrderedDict()

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        path = self.paths[i]
        try:
            data, dq, _ = read_product(path)
        except FitsReadError:
            raise
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise FitsReadError(f"{path}: unreadable product ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
        if data.ndim != 2 or (dq is not None and dq.shape != data.shape):
            raise FitsReadError(f"{path}: image {data.shape} and DQ {None if dq is None else dq.shape} unusable")
        self._cache[i] = (data, dq)
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return data, dq


class _View:
    """One frame's image (``part=0``) or DQ (``part=1``), read when first used."""

    def __init__(self, files: _ProductFiles, i: int, part: int) -> None:
        self.files, self.i, self.part = files, i, part

    def _array(self) -> np.ndarray:
        a = self.files.load(self.i)[self.part]
        if a is None:  # no DQ extension: every pixel usable
            a = np.zeros(self.files.load(self.i)[0].shape, dtype=np.uint8)
        return a

    def __array__(self, dtype=None, copy=None):
        a = self._array()
        return a if dtype is None else a.astype(dtype)

    def __getitem__(self, key):
        return self._array()[key]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array().shape


def _latest_written_sdi(session: Session, start: dt.datetime | None, end: dt.datetime | None) -> list[tuple[Product, Frame]]:
    rank = func.row_number().over(
        partition_by=Product.frame_id, order_by=(Product.version.desc(), Product.id.desc())
    ).label("rank")
    conds = [Frame.channel_code == CHANNEL, Product.state == ProductState.written, Product.path.is_not(None)]
    if start is not None:
        conds.append(Frame.date_obs >= start)
    if end is not None:
        conds.append(Frame.date_obs <= end)
    sub = select(Product.id.label("pid"), rank).join(Frame, Frame.id == Product.frame_id).where(*conds).subquery()
    q = (
        select(Product, Frame)
        .join(Frame, Frame.id == Product.frame_id)
        .join(sub, sub.c.pid == Product.id)
        .where(sub.c.rank == 1)
        .order_by(Frame.date_obs, Frame.id)
    )
    return [(p, f) for p, f in session.execute(q)]


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def _heliographic(flare: DetectedFlare, header: fits.Header) -> tuple[float | None, float | None]:
    """Stonyhurst lat/lon [deg] of the flare centroid (None off the disk), observer from the header."""
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from sunpy.coordinates import HeliographicStonyhurst, Helioprojective

    try:
        obstime = flare.peak_time.astimezone(dt.UTC).replace(tzinfo=None)
        observer = SkyCoord(float(header["HGLN_OBS"]) * u.deg, float(header["HGLT_OBS"]) * u.deg,
                            float(header["DSUN_OBS"]) * u.m, frame=HeliographicStonyhurst, obstime=obstime)
    except (KeyError, TypeError, ValueError):
        return None, None
    c = SkyCoord(flare.hpc_x * u.arcsec, flare.hpc_y * u.arcsec,
                 frame=Helioprojective(observer=observer, obstime=obstime))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hgs = c.transform_to(HeliographicStonyhurst(obstime=obstime))
    lat, lon = float(hgs.lat.to_value(u.deg)), float(hgs.lon.to_value(u.deg))
    if not (np.isfinite(lat) and np.isfinite(lon)):
        return None, None
    return lat, lon


def detect_sdi_flares(
    session: Session,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params: FlareDetectionParams | None = None,
    product_root: Path | None = None,
) -> list[Event]:
    """Run the SDI flare detector on the written L2 products and store the flares.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed: the caller owns the transaction.
    start, end : datetime.datetime, optional
        DATE-OBS range of the frames used (aware UTC; naive means UTC); open if None.
    params : FlareDetectionParams, optional
        Detector parameters (stored in each event's attributes).
    product_root : pathlib.Path, optional
        Store for relative ``Product.path`` values; default ``Settings.products``.

    Returns
    -------
    list of Event
        The flares found in the range, ordered by peak time: new events and those already
        stored by an earlier run (a re-run adds nothing).

    Raises
    ------
    pipelines.errors.FitsReadError
        If a product file cannot be read.
    pipelines.detect.flares.FlareDetectionError
        If the products cannot be used together (shapes, times, WCS).
    """
    p = params or FlareDetectionParams()
    start = _utc(start) if start is not None else None
    end = _utc(end) if end is not None else None
    rows = _latest_written_sdi(session, start, end)
    if len(rows) < p.min_background_frames + p.min_frames:
        log.info("flare detection: %d SDI products in range, too few", len(rows))
        return []
    root = product_root
    paths = []
    for prod, _ in rows:
        path = Path(prod.path)
        if not path.is_absolute():
            if root is None:
                from backend.settings import get_settings

                root = get_settings().products
            path = root / path
        paths.append(path)
    headers = []
    for path in paths:
        try:
            headers.append(fits.getheader(path, 0))
        except (OSError, ValueError) as exc:
            raise FitsReadError(f"{path}: unreadable product header ({exc})") from None
    files = _ProductFiles(paths)
    images = [_View(files, i, 0) for i in range(len(paths))]
    dqs = [_View(files, i, 1) for i in range(len(paths))]
    times = [_utc(f.date_obs) for _, f in rows]
    flares = detect_flares(times, images, headers, dq=dqs, params=p)

    events: list[Event] = []
    for fl in flares:
        key = flare_source_key(fl)
        ev = session.scalars(select(Event).where(Event.source == SOURCE, Event.source_key == key)).first()
        if ev is None:
            lat, lon = _heliographic(fl, headers[fl.peak_index])
            row = dict(
                event_type="FL", source=SOURCE, source_key=key,
                start_time=fl.start_time, peak_time=fl.peak_time, end_time=fl.end_time, channels=CHANNEL,
                hpc_x=fl.hpc_x, hpc_y=fl.hpc_y, hgs_lat=lat, hgs_lon=lon,
                position_angle=None, angular_width=None, speed_km_s=None, goes_class=None,
                peak_value=100.0 * fl.peak_enhancement, peak_unit="%", noaa_ar=None,
                frm_name=DETECTOR_NAME, frm_version=DETECTOR_VERSION,
                description=(f"Lyman-alpha brightening (SDI): peak enhancement {100 * fl.peak_enhancement:.0f} %, "
                             f"area {fl.area_arcsec2:.0f} arcsec2"),
                attributes=json_safe(_attributes(fl, rows, p)), created_at=utcnow(),
            )
            # another process (a worker and the CLI) may store the same flare at the same time
            insert_ignoring_conflicts(session, Event.__table__, [row], ["source", "source_key"])
            ev = session.scalars(select(Event).where(Event.source == SOURCE, Event.source_key == key)).one()
        span = list(fl.frame_indices)
        insert_ignoring_conflicts(session, EventProduct.__table__,
                                  [{"event_id": ev.id, "product_id": rows[i][0].id} for i in span],
                                  ["event_id", "product_id"])
        insert_ignoring_conflicts(session, EventFrame.__table__,
                                  [{"event_id": ev.id, "frame_id": rows[i][1].id} for i in span],
                                  ["event_id", "frame_id"])
        events.append(ev)
    session.flush()
    return events


def _attributes(fl: DetectedFlare, rows: list[tuple[Product, Frame]], p: FlareDetectionParams) -> dict[str, Any]:
    span = list(fl.frame_indices)
    margin = max(p.min_background_frames, fl.end_index - fl.start_index)
    lc_lo, lc_hi = max(0, fl.start_index - margin), min(len(rows) - 1, fl.end_index + margin)
    return {
        "peak_enhancement": fl.peak_enhancement,
        "mean_enhancement": fl.mean_enhancement,
        "area_arcsec2": fl.area_arcsec2,
        "footprint_arcsec2": fl.footprint_arcsec2,
        "hpc_bbox": list(fl.bbox_hpc),
        "product_ids": [rows[i][0].id for i in span],
        "product_versions": [rows[i][0].version for i in span],
        "frame_ids": [rows[i][1].id for i in span],
        "peak_product_id": rows[fl.peak_index][0].id,
        "detection_product_ids": [rows[i][0].id for i in fl.detection_frames],
        "light_curve": {
            "date_obs": [_utc(rows[i][1].date_obs).isoformat() for i in range(lc_lo, lc_hi + 1)],
            "relative_enhancement": [None if not np.isfinite(v) else v for v in fl.light_curve[lc_lo:lc_hi + 1]],
        },
        "flags": list(fl.flags),
        "params": p.as_dict(),
        "method": "Lu et al. 2024 (Sol. Phys.) style triple threshold on macropixels; see pipelines.detect.flares",
    }
