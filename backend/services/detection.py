"""Detection on the written L2 products, stored as events.

:func:`run_detector` runs a detector of :data:`pipelines.detect.registry.DETECTORS` by
name (``flares``, ``cmes``, ``prominences``, ``white-light``) on one of its channels: it
checks the channel and calls the service function the registry entry names
(:func:`detect_sdi_flares`, :func:`detect_sci_cmes`, :func:`detect_prominence_eruptions`,
:func:`detect_wst_white_light_flares`), each called as ``fn(session, *, channel, start,
end, params, product_root)``. Names, versions, channels and default parameters come from
the registry.

:func:`detect_sdi_flares` loads the newest written L2 product of every SDI frame in a
DATE-OBS range (ordered by ``Frame.date_obs``), runs the pure detector
:func:`pipelines.detect.flares.detect_flares` on them, and stores each flare as an
``Event`` (HEK type ``FL``, ``source='detected'``, ``channels='SDI'``, ``frm_name``
``lst-sdi-flare`` and its version) linked to the products and frames from its start to its
end (``EventProduct``/``EventFrame``). A range whose observing runs are all shorter than the
detector's background needs (``FlareDetectionParams.min_series_frames``, 8 frames) is
refused with :class:`pipelines.detect.flares.SeriesTooShortError`, not searched.

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
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.store import is_object_ref, product_store
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
from backend.services.set_access import public_series_ids
from pipelines.catalogues import DETECTED_SOURCE
from pipelines.catalogues.records import json_safe
from pipelines.detect.flares import (
    DETECTOR_NAME,
    DETECTOR_VERSION,
    DetectedFlare,
    FlareDetectionParams,
    SeriesTooShortError,
)
from pipelines.detect.registry import DETECTORS, get_detector
from pipelines.errors import FitsReadError
from pipelines.products import read_product
from pipelines.utc import as_utc

__all__ = [
    "run_detector",
    "detect_sdi_flares",
    "detect_sci_cmes",
    "detect_prominence_eruptions",
    "detect_wst_white_light_flares",
    "flare_source_key",
    "DetectionScope",
    "PUBLIC_SCOPE",
    "job_detection_scope",
    "observing_runs",
    "RUN_GAP_S",
    "SOURCE",
    "CHANNEL",
]

log = logging.getLogger(__name__)

SOURCE = DETECTED_SOURCE
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
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        data, dq, _ = read_product(self.paths[i])  # FitsReadError if unreadable or not an L2 product
        self._cache[i] = (data, dq)
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return data, dq


class _View:
    """One frame's image (``part=0``) or DQ (``part=1``), read when first used."""

    def __init__(self, files: _ProductFiles, i: int, part: int) -> None:
        self.files, self.i, self.part = files, i, part

    def _array(self) -> np.ndarray:
        return self.files.load(self.i)[self.part]  # no DQ extension: read_product's zeros, every pixel usable

    def __array__(self, dtype=None, copy=None):
        a = self._array()
        return a if dtype is None else a.astype(dtype)

    def __getitem__(self, key):
        return self._array()[key]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array().shape


@dataclass(frozen=True)
class DetectionScope:
    """Which products a detection reads and whom its events belong to.

    Attributes
    ----------
    set_ids : tuple of int or None
        None: the public calibration set of each frame
        (:func:`backend.services.calibration_sets.public_product_ids`), events in the public
        catalogue. Else the products of these calibration sets only (a job's own sets).
    owner : str or None
        The events' owner: None for the public catalogue, the job owner's name for a
        detection on sets of their own (visible to them and admins only).
    """

    set_ids: tuple[int, ...] | None = None
    owner: str | None = None

    @property
    def public(self) -> bool:
        return self.set_ids is None

    def key(self, base: str) -> str:
        """The event's ``source_key``: ``base`` for the public catalogue; ``base@set<ids>~<owner>``
        for a private detection (never the key of a public event, nor of another owner's)."""
        if self.public:
            return base
        return f"{base}@set{'+'.join(map(str, self.set_ids))}~{self.owner}"


#: The public catalogue's detection scope (CLI ``lstdp detect``, platform jobs, promotions).
PUBLIC_SCOPE = DetectionScope()


def job_detection_scope(session: Session, job_id: str, channel: str) -> DetectionScope:
    """The scope of the follow-up detection of job ``job_id`` on ``channel``: its own sets.

    :data:`PUBLIC_SCOPE` when the job ``publishes`` (an admin's or the platform's) and every
    calibration set its products of ``channel`` use is public: the public detection as
    ``lstdp detect`` runs it. Otherwise a private scope of the job's sets of ``channel`` and
    the job's owner: its events never enter, change or link inside the public catalogue.
    A job whose items have no product of the channel gets an empty private scope (nothing
    to detect).

    Raises
    ------
    ValueError
        No job ``job_id``.
    """
    from backend.models import CalibrationSet, Job, JobItem

    job = session.get(Job, job_id)
    if job is None:
        raise ValueError(f"no job {job_id}")
    sets = list(session.execute(
        select(CalibrationSet.id, CalibrationSet.public).distinct()
        .join(Product, Product.calibration_set_id == CalibrationSet.id)
        .join(JobItem, JobItem.product_id == Product.id)
        .join(Frame, Frame.id == Product.frame_id)
        .where(JobItem.job_id == job_id, Frame.channel_code == channel)).all())
    if job.publishes and sets and all(public for _, public in sets):
        return PUBLIC_SCOPE
    return DetectionScope(set_ids=tuple(sorted(i for i, _ in sets)), owner=job.owner)


def _latest_written_sdi(session: Session, start: dt.datetime | None, end: dt.datetime | None,
                        scope: DetectionScope = PUBLIC_SCOPE) -> list[tuple[Product, Frame]]:
    return _latest_written(session, CHANNEL, start, end, scope)


def _latest_written(session: Session, channel: str, start: dt.datetime | None,
                    end: dt.datetime | None, scope: DetectionScope = PUBLIC_SCOPE) -> list[tuple[Product, Frame]]:
    """(product, frame) of every frame of ``channel`` with DATE-OBS in [start, end] that has
    a written product in ``scope``, by DATE-OBS: the frame's public product (one calibration
    set at a time: :func:`public_series_ids`), or, for a private scope, its newest written
    product of the scope's sets."""
    if scope.public:
        sub = public_series_ids(session, channel, start, end).subquery()
        pid = sub.c.product_id
    else:
        rank = func.row_number().over(partition_by=Product.frame_id, order_by=Product.id.desc()).label("rank")
        conds = [Frame.channel_code == channel, Product.state == ProductState.written,
                 Product.calibration_set_id.in_(scope.set_ids)]
        if start is not None:
            conds.append(Frame.date_obs >= start)
        if end is not None:
            conds.append(Frame.date_obs <= end)
        inner = select(Product.id.label("pid"), rank).join(Frame, Frame.id == Product.frame_id).where(*conds).subquery()
        sub = select(inner.c.pid).where(inner.c.rank == 1).subquery()
        pid = sub.c.pid
    q = (
        select(Product, Frame)
        .join(Frame, Frame.id == Product.frame_id)
        .join(sub, pid == Product.id)
        .where(Product.path.is_not(None))
        .order_by(Frame.date_obs, Frame.id)
    )
    return [(p, f) for p, f in session.execute(q)]


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


def run_detector(
    session: Session,
    name: str,
    *,
    channel: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params: Any = None,
    product_root: Path | None = None,
    scope: DetectionScope = PUBLIC_SCOPE,
) -> list[Event]:
    """Run detector ``name`` of :data:`pipelines.detect.registry.DETECTORS` on the written L2
    products of ``channel`` in a DATE-OBS range and store what it finds.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed: the caller owns the transaction.
    name : str
        ``flares``, ``cmes``, ``prominences`` or ``white-light`` (``lstdp detect --kind``).
    channel : str, optional
        One of the detector's channels; default its ``default_channel``.
    start, end : datetime.datetime, optional
        DATE-OBS range of the products used (aware UTC; naive means UTC); open if None.
    params : optional
        The detector's parameters object; default the registry's for the channel.
    product_root : pathlib.Path, optional
        Store for relative ``Product.path`` values; default ``Settings.products``.
    scope : DetectionScope
        Default: the public set of each frame, events in the public catalogue. A private
        scope reads only the products of its calibration sets and stores events of its owner
        (keys that never collide with public ones, :meth:`DetectionScope.key`).

    Returns
    -------
    list of Event
        What the detector found in the range (new events and those an earlier run stored).

    Raises
    ------
    KeyError
        For an unknown detector name.
    ValueError
        For a channel the detector does not run on.
    pipelines.errors.DataError
        Unreadable products, or products that cannot be used together.
    """
    det = get_detector(name)
    channel = det.channel(channel)
    return SERVICES[det.name](session, channel=channel, start=start, end=end, params=params, product_root=product_root,
                              scope=scope)


def detect_sdi_flares(
    session: Session,
    *,
    channel: str = CHANNEL,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params: FlareDetectionParams | None = None,
    product_root: Path | None = None,
    scope: DetectionScope = PUBLIC_SCOPE,
) -> list[Event]:
    """Run the SDI flare detector on the written L2 products and store the flares.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed: the caller owns the transaction.
    channel : {'SDI'}
        The only channel of this detector (ValueError for another).
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
        stored by an earlier run (a re-run adds nothing). Empty when the range holds no
        written SDI product.

    Raises
    ------
    pipelines.errors.FitsReadError
        If a product file cannot be read.
    pipelines.detect.flares.SeriesTooShortError
        If no observing run (:func:`observing_runs`) in the range has the detector's
        ``min_series_frames`` (8 with the defaults): refused, with the reason, rather than
        searched (a job's follow-up detection stores it as its reason). Shorter runs beside
        a searched one are skipped (logged).
    pipelines.detect.flares.FlareDetectionError
        If the products cannot be used together (shapes, times, WCS).
    """
    det = DETECTORS["flares"]
    channel = det.channel(channel)
    p = params or det.params(channel)
    start, end = as_utc(start), as_utc(end)
    all_rows = _latest_written_sdi(session, start, end, scope)
    if not all_rows:
        log.info("flare detection: no written SDI product in range")
        return []
    runs = observing_runs(all_rows)
    searched = [rows for rows in runs if len(rows) >= p.min_series_frames]
    short = [rows for rows in runs if len(rows) < p.min_series_frames]
    if not searched:
        raise SeriesTooShortError(max(len(r) for r in runs), p.min_series_frames, what=_runs_text(short))
    if short:
        log.warning("flare detection: %d SDI observing run(s) of fewer than %d frames not searched: %s", len(short),
                    p.min_series_frames, _runs_text(short))
    events: list[Event] = []
    for rows in searched:
        events.extend(_detect_sdi_run(session, det, channel, p, rows, product_root, scope))
    session.flush()
    return sorted(events, key=lambda e: (e.peak_time or e.start_time, e.id or 0))


def _runs_text(runs: list[list[tuple[Product, Frame]]]) -> str:
    """What a refusal names: ``'the SDI series 2004-03-01 00:00-05:00 UTC'`` (one run), or
    ``'the longest of the 2 SDI observing runs (...: 3 frames; ...: 5 frames)'``."""
    def span(rows: list[tuple[Product, Frame]]) -> str:
        t0, t1 = as_utc(rows[0][1].date_obs), as_utc(rows[-1][1].date_obs)
        return f"{t0:%Y-%m-%d %H:%M}-{t1:%H:%M} UTC" if t0.date() == t1.date() else \
            f"{t0:%Y-%m-%d %H:%M} to {t1:%Y-%m-%d %H:%M} UTC"

    if len(runs) == 1:
        return f"the SDI series {span(runs[0])}"
    shown = "; ".join(f"{span(r)}: {len(r)} frames" for r in runs[:5]) + ("; ..." if len(runs) > 5 else "")
    return f"the longest of the {len(runs)} SDI observing runs ({shown})"


#: Frames further apart than this [s] belong to separate observing runs: the flare detector
#: runs on each run alone (a background taken hours or years earlier, from another scene,
#: is no background). 6 h: longer than any flare's rise and the detector's background
#: window (``background_lag_s + background_span_s`` = 30 min), shorter than the gaps
#: between the sample data's days.
RUN_GAP_S = 6 * 3600.0


def observing_runs(rows: list[tuple[Product, Frame]],
                   max_gap_s: float = RUN_GAP_S) -> list[list[tuple[Product, Frame]]]:
    """Split ``(product, frame)`` rows ordered by DATE-OBS where two successive frames are
    more than ``max_gap_s`` [s] apart (default :data:`RUN_GAP_S`); a gap of exactly
    ``max_gap_s`` keeps one run. Returns the runs in order, each non-empty."""
    runs: list[list[tuple[Product, Frame]]] = []
    for row in rows:
        if runs and (as_utc(row[1].date_obs) - as_utc(runs[-1][-1][1].date_obs)).total_seconds() <= max_gap_s:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _detect_sdi_run(session: Session, det, channel: str, p: FlareDetectionParams, rows: list[tuple[Product, Frame]],
                    product_root: Path | None, scope: DetectionScope = PUBLIC_SCOPE) -> list[Event]:
    """The flare detector on one observing run; the flares stored (as :func:`detect_sdi_flares`)."""
    times, images, dqs, headers = _lazy_series(rows, product_root)
    flares = det.detect(times, images, headers, dq=dqs, params=p)
    events: list[Event] = []
    for fl in flares:
        lat, lon = _heliographic(fl, headers[fl.peak_index])
        row = dict(
            event_type=det.event_type, start_time=fl.start_time, peak_time=fl.peak_time, end_time=fl.end_time,
            channels=channel, hpc_x=fl.hpc_x, hpc_y=fl.hpc_y, hgs_lat=lat, hgs_lon=lon,
            peak_value=100.0 * fl.peak_enhancement, peak_unit="%",
            frm_name=det.frm_name, frm_version=det.version,
            description=(f"Lyman-alpha brightening (SDI): peak enhancement {100 * fl.peak_enhancement:.0f} %, "
                         f"area {fl.area_arcsec2:.0f} arcsec2"),
            attributes=_attributes(fl, rows, p),
        )
        # another process (a worker and the CLI) may store the same flare at the same time:
        # _store_detection skips an existing key
        events.append(_store_detection(session, row, flare_source_key(fl), rows, list(fl.frame_indices), {}, scope))
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
            "date_obs": [as_utc(rows[i][1].date_obs).isoformat() for i in range(lc_lo, lc_hi + 1)],
            "relative_enhancement": [None if not np.isfinite(v) else v for v in fl.light_curve[lc_lo:lc_hi + 1]],
        },
        "flags": list(fl.flags),
        "params": p.as_dict(),
        "detector": {"frm_name": DETECTOR_NAME, "frm_version": DETECTOR_VERSION},
        "method": "Lu et al. 2024 (Sol. Phys.) style triple threshold on macropixels; see pipelines.detect.flares",
    }


# -- CMEs, prominence eruptions and white-light flares --------------------------------------------


def _product_paths(rows: list[tuple[Product, Frame]], product_root: Path | None) -> list[Path]:
    root = product_root
    paths = []
    for prod, _ in rows:
        if is_object_ref(prod.path):  # an object store: a checked copy in the bounded local cache
            paths.append(product_store().local_file(product_store().key_of(prod.path), prod.sha256))
            continue
        path = Path(prod.path)
        if not path.is_absolute():
            if root is None:
                from backend.settings import get_settings

                root = get_settings().products
            path = root / path
        paths.append(path)
    return paths


def _lazy_series(rows: list[tuple[Product, Frame]], product_root: Path | None):
    """The products of ``rows`` as a lazily read series for the flare detectors.

    Returns ``(times, images, dqs, headers)``: DATE-OBS (aware UTC), one array-like view per
    product of its image and of its DQ (each file read when a detector asks, at most two
    held at once: :class:`_ProductFiles`), and the primary headers (read now).

    Raises
    ------
    pipelines.errors.FitsReadError
        If a product's header cannot be read.
    """
    paths = _product_paths(rows, product_root)
    headers = []
    for path in paths:
        try:
            headers.append(fits.getheader(path, 0))
        except (OSError, ValueError) as exc:
            raise FitsReadError(f"{path}: unreadable product header ({exc})") from None
    files = _ProductFiles(paths)
    images = [_View(files, i, 0) for i in range(len(paths))]
    dqs = [_View(files, i, 1) for i in range(len(paths))]
    return [as_utc(f.date_obs) for _, f in rows], images, dqs, headers


def _reduced_stack(paths: list[Path], max_working_naxis: int) -> tuple[np.ndarray, dict[str, Any], list[fits.Header]]:
    """The products block-averaged to the detector's working size, one frame in memory at a time.

    Returns the ``(nt, ny, nx)`` float64 stack (NaN where the DQ mask is set or the data are
    not finite), the geometry of :func:`pipelines.detect.cme.geometry_from_header` at the
    working size (the detectors then use block factor 1, so the result is the same as
    passing the full frames), and the primary headers.

    Raises
    ------
    pipelines.errors.DataError
        If the frames differ in shape or in geometry by more than 1 working pixel.
    """
    import math

    from pipelines.detect.cme import _block_reduce, geometry_from_header
    from pipelines.errors import DataError

    frames, headers, geo0, shape0, f = [], [], None, None, 1
    for path in paths:
        data, dq, header = read_product(path)  # 2-D image, DQ of its shape
        if shape0 is None:
            shape0 = data.shape
            f = max(1, math.ceil(max(shape0) / max_working_naxis))
        elif data.shape != shape0:
            raise DataError(f"{path}: shape {data.shape} differs from the first product's {shape0}")
        arr = np.array(data, dtype=np.float64)
        arr[~np.isfinite(arr)] = np.nan
        arr[dq != 0] = np.nan
        frames.append(_block_reduce(arr[None], f)[0])
        geo = geometry_from_header(header)
        if geo0 is None:
            geo0 = geo
        else:
            dx = math.hypot(geo["sun_center_px"][0] - geo0["sun_center_px"][0],
                            geo["sun_center_px"][1] - geo0["sun_center_px"][1]) / f
            if dx > 1.0 or abs(geo["plate_scale_arcsec"] / geo0["plate_scale_arcsec"] - 1) > 1e-3:
                raise DataError(f"{path}: Sun centre or plate scale differ from the first product's "
                                f"({dx:.2f} working pixels); products of one sequence must share a geometry")
        headers.append(header)
    cx, cy = geo0["sun_center_px"]
    geometry = {"sun_center_px": ((cx + 0.5) / f - 0.5, (cy + 0.5) / f - 0.5),
                "plate_scale_arcsec": geo0["plate_scale_arcsec"] * f, "rsun_arcsec": geo0["rsun_arcsec"]}
    return np.stack(frames), geometry, headers


def _indices_between(times: list[dt.datetime], t0: dt.datetime, t1: dt.datetime) -> list[int]:
    return [i for i, t in enumerate(times) if t0 <= t <= t1]


def _store_detection(session: Session, row: dict[str, Any], key: str, rows: list[tuple[Product, Frame]],
                     span: list[int], provenance: dict[str, Any], scope: DetectionScope = PUBLIC_SCOPE) -> Event:
    """Insert a detected event (skipping an existing key) and link it to its products and frames.

    ``scope`` (:class:`DetectionScope`) sets the event's owner and turns ``key`` into its
    ``source_key`` (:meth:`DetectionScope.key`); ``calibration_set_id`` is the set of most of
    the products it spans (of all of them, as the detection reads one set per frame). An event
    already stored under the key is returned with its links completed, its columns unchanged."""
    key = scope.key(key)
    ev = session.scalars(select(Event).where(Event.source == SOURCE, Event.source_key == key)).first()
    if ev is None:
        sets = Counter(rows[i][0].calibration_set_id for i in span if rows[i][0].calibration_set_id is not None)
        row = {**row, "owner": scope.owner, "calibration_set_id": sets.most_common(1)[0][0] if sets else None}
        full = {c: None for c in ("peak_time", "end_time", "channels", "hpc_x", "hpc_y", "hgs_lat", "hgs_lon",
                                  "position_angle", "angular_width", "speed_km_s", "goes_class", "peak_value",
                                  "peak_unit", "noaa_ar", "description")}
        full.update(row)
        attrs = dict(row.get("attributes") or {})
        attrs.update(provenance)
        full.update(source=SOURCE, source_key=key, attributes=json_safe(attrs), created_at=utcnow())
        insert_ignoring_conflicts(session, Event.__table__, [full], ["source", "source_key"])
        ev = session.scalars(select(Event).where(Event.source == SOURCE, Event.source_key == key)).one()
    insert_ignoring_conflicts(session, EventProduct.__table__,
                              [{"event_id": ev.id, "product_id": rows[i][0].id} for i in span],
                              ["event_id", "product_id"])
    insert_ignoring_conflicts(session, EventFrame.__table__,
                              [{"event_id": ev.id, "frame_id": rows[i][1].id} for i in span],
                              ["event_id", "frame_id"])
    return ev


def _provenance(rows: list[tuple[Product, Frame]], span: list[int], frm_name: str, frm_version: str,
                params: dict[str, Any]) -> dict[str, Any]:
    return {
        "detector": {"frm_name": frm_name, "frm_version": frm_version},
        "product_ids": [rows[i][0].id for i in span],
        "product_versions": [rows[i][0].version for i in span],
        "frame_ids": [rows[i][1].id for i in span],
        "n_products_searched": len(rows),
        "params": params,
    }


def _iso_key(t: dt.datetime) -> str:
    return as_utc(t).strftime("%Y-%m-%dT%H:%M:%S")


def detect_sci_cmes(
    session: Session,
    *,
    channel: str = "SCI-UV",
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params=None,
    product_root: Path | None = None,
    scope: DetectionScope = PUBLIC_SCOPE,
) -> list[Event]:
    """Run the CME detector (:func:`pipelines.detect.cme.detect_cmes`) on the newest written
    L2 products of an SCI channel and store the CMEs (HEK ``CE``, ``source='detected'``).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed.
    channel : {'SCI-UV', 'SCI-WL'}
    start, end : datetime.datetime, optional
        DATE-OBS range of the products used (aware UTC).
    params : pipelines.detect.cme.CMEParams, optional
    product_root : pathlib.Path, optional
        Store for relative product paths; default ``Settings.products``.

    Returns
    -------
    list of Event
        The CMEs found, by first appearance (new ones and those stored by an earlier run:
        idempotent on ``lst-sci-cme/<version>/<channel>/<first appearance>/<round(PA)>``).
        Each event is linked to the products and frames from its first appearance to its
        last sighting; ``attributes`` hold the detector name/version, the product ids and
        versions, the parameters and the height-time track.

    Raises
    ------
    ValueError
        For a channel other than SCI-UV or SCI-WL.
    pipelines.errors.DataError
        Unreadable products, or products that do not share a geometry.
    """
    det = DETECTORS["cmes"]
    channel = det.channel(channel)
    p = params or det.params(channel)

    def describe(c):
        key = f"{det.frm_name}/{det.version}/{channel}/{_iso_key(c.first_appearance)}/{round(c.pa_deg) % 360}"
        text = (f"CME in {channel}: PA {c.pa_deg:.0f} deg, width {c.width_deg:.0f} deg, "
                f"{c.speed_km_s:.0f} km/s")
        return key, text, as_utc(c.first_appearance), as_utc(c.last_seen)

    return _run_sequence_detector(session, channel, start, end, p, product_root, det.detect, describe,
                                  min_frames=max(3, p.min_track_points), what="CME",
                                  frm=(det.frm_name, det.version), scope=scope)


def detect_prominence_eruptions(
    session: Session,
    *,
    channel: str = "SDI",
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params=None,
    product_root: Path | None = None,
    scope: DetectionScope = PUBLIC_SCOPE,
) -> list[Event]:
    """Run the prominence-eruption detector
    (:func:`pipelines.detect.prominence.detect_prominence_eruptions`) on the newest written
    L2 products of SDI (limb, 1.02-1.2 Rsun) or SCI-UV (1.15-2.45 Rsun) and store the
    eruptions (HEK ``PR``, ``source='detected'``).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    channel : {'SDI', 'SCI-UV'}
    start, end : datetime.datetime, optional
    params : pipelines.detect.prominence.ProminenceParams, optional
        Default ``ProminenceParams.sdi()`` or ``.sci_uv()`` for the channel.
    product_root : pathlib.Path, optional

    Returns
    -------
    list of Event
        By start time; idempotent on
        ``lst-prominence-eruption/<version>/<channel>/<start>/<round(PA)>``; linked to the
        products and frames from the start to the last sighting; attributes hold the
        detector name/version, product ids/versions, parameters and height-time track.

    Raises
    ------
    ValueError
        For a channel other than SDI or SCI-UV.
    pipelines.errors.DataError
        Unreadable products, or products that do not share a geometry.
    """
    det = DETECTORS["prominences"]
    channel = det.channel(channel)
    p = params or det.params(channel)

    def describe(e):
        key = f"{det.frm_name}/{det.version}/{channel}/{_iso_key(e.start_time)}/{round(e.pa_deg) % 360}"
        text = (f"Prominence eruption in {channel}: PA {e.pa_deg:.0f} deg, rise "
                f"{e.rise_speed_km_s:.0f} km/s to {e.max_height_rsun:.2f} Rsun")
        return key, text, min(as_utc(e.start_time), as_utc(e.first_seen)), as_utc(e.last_seen)

    return _run_sequence_detector(session, channel, start, end, p, product_root, det.detect, describe,
                                  min_frames=3, what="prominence", frm=(det.frm_name, det.version), scope=scope)


def _run_sequence_detector(session: Session, channel: str, start, end, params, product_root, detect, describe, *,
                           min_frames: int, what: str, frm: tuple[str, str],
                           scope: DetectionScope = PUBLIC_SCOPE) -> list[Event]:
    """Run a detector of limb/coronal sequences (CMEs, prominence eruptions) on the newest
    written L2 products of ``channel`` and store what it finds.

    ``detect(times, stack, params=..., **geometry)`` returns detections with
    ``to_event_row(rsun_arcsec=, channel=)``; ``describe(detection)`` gives its idempotency
    key, a description and the (first, last) times it was seen, which set the products and
    frames it is linked to.
    """
    import dataclasses

    rows = _latest_written(session, channel, as_utc(start), as_utc(end), scope)
    if len(rows) < min_frames:
        log.info("%s detection: %d %s products in range, too few", what, len(rows), channel)
        return []
    stack, geo, _ = _reduced_stack(_product_paths(rows, product_root), params.max_working_naxis)
    times = [as_utc(f.date_obs) for _, f in rows]
    events = []
    for det in detect(times, stack, params=params, **geo):
        key, text, first, last = describe(det)
        row = det.to_event_row(rsun_arcsec=geo["rsun_arcsec"], channel=channel)
        row["description"] = text
        span = _indices_between(times, first, last)
        prov = _provenance(rows, span, frm[0], frm[1], dataclasses.asdict(params))
        events.append(_store_detection(session, row, key, rows, span, prov, scope))
    session.flush()
    return events


def detect_wst_white_light_flares(
    session: Session,
    *,
    channel: str = "WST",
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    params=None,
    product_root: Path | None = None,
    scope: DetectionScope = PUBLIC_SCOPE,
) -> list[Event]:
    """Run the white-light flare detector (:mod:`pipelines.detect.whitelight`, 8 %
    enhancement over the pre-flare level, Jing et al. 2024) on the newest written WST L2
    products and store the flares (HEK ``FL``, ``channels='WST'``, ``source='detected'``).
    ``channel`` can only be ``WST`` (ValueError for another).

    Returns
    -------
    list of Event
        By peak time; idempotent on ``lst-wst-wlf/<version>/<peak>/<round(x)>,<round(y)>``.
        ``peak_value`` is the peak relative enhancement [%]; attributes hold the detector
        name/version, product ids/versions, parameters and the light curve.

    Raises
    ------
    pipelines.errors.FitsReadError, pipelines.detect.flares.FlareDetectionError
        Unreadable products, products that cannot be used together, or (``SeriesTooShortError``)
        fewer products than the flare detector's ``min_series_frames`` (refused, not searched).
    """
    det = DETECTORS["white-light"]
    channel = det.channel(channel)
    p = params or det.params(channel)
    fp = p.flare_params()
    rows = _latest_written(session, channel, as_utc(start), as_utc(end), scope)
    if not rows:
        log.info("white-light flare detection: no written WST product in range")
        return []
    if len(rows) < fp.min_series_frames:  # as detect_flares would, before any file is read
        raise SeriesTooShortError(len(rows), fp.min_series_frames, what="the WST series")
    times, images, dqs, headers = _lazy_series(rows, product_root)
    events = []
    for fl in det.detect(times, images, headers, dq=dqs, params=p):
        peak = _iso_key(fl.peak_time)
        key = f"{det.frm_name}/{det.version}/{peak}/{round(fl.hpc_x)},{round(fl.hpc_y)}"
        lat, lon = _heliographic(fl, headers[fl.peak_index])
        span = list(fl.frame_indices)
        attrs = _attributes(fl, rows, fp)
        attrs["method"] = "Jing et al. 2024 (Sol. Phys.): relative enhancement over the pre-flare level >= 8 %"
        attrs.update(_provenance(rows, span, det.frm_name, det.version, p.as_dict()))
        row = dict(
            event_type=det.event_type, start_time=fl.start_time, peak_time=fl.peak_time, end_time=fl.end_time,
            channels=channel, hpc_x=fl.hpc_x, hpc_y=fl.hpc_y, hgs_lat=lat, hgs_lon=lon,
            peak_value=100.0 * fl.peak_enhancement, peak_unit="%", frm_name=det.frm_name, frm_version=det.version,
            attributes=attrs,
            description=(f"White-light flare (WST 360 nm): peak enhancement {100 * fl.peak_enhancement:.1f} % "
                         f"over the pre-flare level, area {fl.area_arcsec2:.0f} arcsec2"),
        )
        events.append(_store_detection(session, row, key, rows, span, {}, scope))
    session.flush()
    return events


#: The service function of each registry detector (``pipelines.detect.registry.DETECTORS``),
#: by registry name: it loads the detector's input series from the written L2 products and
#: stores the events. A test checks that every detector has one.
SERVICES: dict[str, Callable[..., list[Event]]] = {
    "flares": detect_sdi_flares,
    "cmes": detect_sci_cmes,
    "prominences": detect_prominence_eruptions,
    "white-light": detect_wst_white_light_flares,
}
