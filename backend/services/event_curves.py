"""The curves of an event page: the LST light curves (ROI and disk, one calibration set) and the
GOES XRS curve of the same window, and the event's linked data.

:func:`event_curves` gathers them (queries only; the figure is
:func:`backend.render.event_figures.event_curves_figure`); :func:`curves_csv` and :func:`curves_fits`
write them for download; :func:`linked_data` says which frames and products belong to the event.

One calibration set
    The light curve of ``GET /events/{id}/lightcurve`` takes the newest written product of each
    frame, which can mix calibration sets (a recalibration job that reached only some frames).
    Here the products of the window are grouped by calibration set (``Product.calibration_set_id``;
    for products without a set row, ``calibration_key`` and ``params_hash``) and the public set
    that covers the most frames is drawn (ties: the set promoted or made last, the newest product
    version, the higher product id), or the set asked for (``calibration_set``); frames of
    the window without a product of that set are counted in ``frames_other_sets`` and named in
    the figure, never mixed in. Both curves (the ROI box of ±60″ about the event's
    helioprojective position, :data:`backend.services.products.ROI_HALF_WIDTH`, and the
    disk-integrated mean) come from the same products.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from backend.models import CalibrationFile, Event, EventFrame, EventProduct, Frame, Product, ProductState
from backend.services import products as products_service
from backend.services.xray import XRaySeriesSamples, xray_coverage, xray_window
from pipelines.channels import get_channel
from pipelines.errors import FitsReadError
from pipelines.provenance import stamp_provenance
from pipelines.utc import as_utc

__all__ = [
    "CalibrationSetUsed",
    "EventCurves",
    "event_curves",
    "curves_csv",
    "curves_fits",
    "LinkedData",
    "linked_data",
    "CURVES_MARGIN",
]

#: Time added before the start and after the end of the event for its curves.
CURVES_MARGIN = dt.timedelta(minutes=30)
#: Longest window drawn (the X-ray samples served at once, :data:`backend.services.xray.MAX_WINDOW`):
#: a longer event (an active region's 12 days) gets the window of this length centred on its
#: peak (its start when it has none), and the curves say so.
MAX_CURVES_WINDOW = dt.timedelta(days=2)
#: Seconds of product reading one request may spend under the API's default 1.8 s deadline
#: (``Settings.api_deadline_s``), with room for the query and the figure; scaled with a
#: deployment's own deadline, unlimited without one (:func:`read_budget_s`). Products not
#: measured in time are listed in ``skipped`` with that reason; the means are cached per file,
#: so the next request goes on from there.
CURVES_READ_BUDGET_S = 1.0


def read_budget_s() -> float:
    """Seconds of product reading one curves request may spend: :data:`CURVES_READ_BUDGET_S`
    times ``API_DEADLINE_S / 1.8`` (1 s at the default deadline, 11.1 s at 20 s), or infinity
    where the deployment has no deadline (``API_DEADLINE_S=0``)."""
    from backend.settings import Settings, get_settings

    deadline = get_settings().api_deadline_s
    at = Settings.model_fields["api_deadline_s"].default  # the deadline the constant is the budget of
    return CURVES_READ_BUDGET_S * deadline / at if deadline > 0 else math.inf


@dataclass
class CalibrationSetUsed:
    """The calibration set of the LST curves: its id (None for products without a set row),
    whether it is public and whose it is, its key, parameters hash and files (kind, id, version)."""

    key: str
    params_hash: str
    files: list[tuple[str, int, int]] = field(default_factory=list)
    software_versions: list[str] = field(default_factory=list)
    set_id: int | None = None
    public: bool = True
    owner: str | None = None

    @property
    def whose(self) -> str:
        """``public`` or ``private (alice)``."""
        return "public" if self.public else f"private ({self.owner or 'the platform'})"

    @property
    def label(self) -> str:
        """e.g. ``set #7 (public): dark #3 v1, flat #4 v2, radiometric #5 v1 (options 1a2b3c4d)``."""
        files = ", ".join(f"{k} #{i} v{v}" for k, i, v in self.files) or f"key {self.key!r} (no calibration file row)"
        head = f"set #{self.set_id} ({self.whose}): " if self.set_id is not None else ""
        return f"{head}{files} (options {self.params_hash[:8]})"

    @property
    def ids(self) -> str:
        """Comma-separated calibration file ids with versions, for a FITS keyword: ``3v1,4v2``."""
        return ",".join(f"{i}v{v}" for _, i, v in self.files)


@dataclass
class EventCurves:
    """The LST and GOES curves of one event window.

    Attributes
    ----------
    event : Event
    channel : str
        LST channel of the light curves.
    start, end : datetime
        The window (aware UTC).
    unit : str
        ``BUNIT`` of the LST products.
    calibration : CalibrationSetUsed or None
        None when no written product is in the window.
    lst_times : list of datetime
        DATE-OBS of each product of the set.
    roi, disk : list of float or None
        ROI-box and disk-integrated means; None is a gap (all pixels masked). ``roi`` is empty
        when the event has no helioprojective position (or the channel is a coronagraph).
    roi_sigma, disk_sigma : list of float or None
        1-sigma uncertainty of each mean, in ``unit``, from the products' ``UNCERT``
        extension (:func:`backend.services.products.mean_uncertainty`); None where a product
        has none (written before ``UNCERT``) or the mean is a gap.
    roi_box : (x, y, half_width) or None
        The box [arcsec].
    product_ids : list of int
    frames_other_sets : int
        Frames of the window that have products of other calibration sets only.
    skipped : list of dict
        Products that could not be read, with the reason.
    xray : XRaySeriesSamples or None
        The GOES series drawn (:meth:`backend.services.xray.XRayWindow.best`), None when no stored
        series covers the window.
    xray_others : list of str
        Other satellites with samples in the window (not drawn).
    xray_coverage : list of (satellite, start, end)
        What the stored XRS series cover (said when none covers the window).
    """

    event: Event
    channel: str
    start: dt.datetime
    end: dt.datetime
    unit: str = ""
    calibration: CalibrationSetUsed | None = None
    lst_times: list[dt.datetime] = field(default_factory=list)
    roi: list[float | None] = field(default_factory=list)
    disk: list[float | None] = field(default_factory=list)
    roi_sigma: list[float | None] = field(default_factory=list)
    disk_sigma: list[float | None] = field(default_factory=list)
    roi_box: tuple[float, float, float] | None = None
    product_ids: list[int] = field(default_factory=list)
    frames_other_sets: int = 0
    skipped: list[dict] = field(default_factory=list)
    xray: XRaySeriesSamples | None = None
    xray_others: list[str] = field(default_factory=list)
    xray_coverage: list[tuple[str, dt.datetime, dt.datetime]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _curves_window(event: Event, margin: dt.timedelta) -> tuple[dt.datetime, dt.datetime, list[str]]:
    """The event's window ± ``margin``, at most :data:`MAX_CURVES_WINDOW` long; notes say why
    it differs from the catalogue's times."""
    notes = []
    start = as_utc(event.start_time)
    last = as_utc(event.end_time or event.peak_time or event.start_time)
    if last < start:
        notes.append(f"the catalogue's end ({last:%Y-%m-%d %H:%M} UTC) is before its start: the window uses the start")
        last = start
    a, b = start - margin, last + margin
    if b - a > MAX_CURVES_WINDOW:
        centre = as_utc(event.peak_time) if event.peak_time and start <= as_utc(event.peak_time) <= last else start
        a = max(a, centre - MAX_CURVES_WINDOW / 2)
        b = a + MAX_CURVES_WINDOW
        notes.append(f"the event lasts {(last - start).total_seconds() / 86400:.1f} days: the curves show the "
                     f"{MAX_CURVES_WINDOW.days} days from {a:%Y-%m-%d %H:%M} UTC")
    return a, b, notes


def _written_in_window(session: Session, channel: str, start: dt.datetime, end: dt.datetime) -> list[Product]:
    return list(session.scalars(
        select(Product).join(Product.frame)
        .where(Product.state == ProductState.written, Frame.channel_code == channel,
               Frame.date_obs >= start, Frame.date_obs <= end)
        .options(joinedload(Product.frame), joinedload(Product.calibration_set))
        .order_by(Frame.date_obs, Product.id)
    ))


def _set_key(p: Product) -> tuple:
    """What groups products into one calibration set: the set id, or for a product without a
    set row its (calibration_key, params_hash)."""
    return (p.calibration_set_id,) if p.calibration_set_id is not None else (p.calibration_key, p.params_hash)


def _choose_set(products: list[Product], calibration_set: int | None = None) -> tuple | None:
    """The set drawn (a :func:`_set_key`): ``calibration_set`` when asked (None if it has no
    product here); else the public set covering the most frames of the window (products of
    private sets are never drawn unless asked), ties: the set promoted (or made) last, then the
    newest product version and higher id. Products without a set row count as public."""
    if calibration_set is not None:
        return (calibration_set,) if any(p.calibration_set_id == calibration_set for p in products) else None
    score: dict[tuple, tuple] = {}
    frames: dict[tuple, set[int]] = {}
    for p in products:
        cs = p.calibration_set
        if cs is not None and not cs.public:
            continue
        k = _set_key(p)
        frames.setdefault(k, set()).add(p.frame_id)
        made = (cs.promoted_at or cs.created_at) if cs is not None else None
        when = as_utc(made).timestamp() if made is not None else 0.0
        _, _, v, i = score.get(k, (0, 0.0, 0, 0))
        score[k] = (len(frames[k]), when, max(v, p.version), max(i, p.id))
    if not score:
        return None
    return max(score, key=lambda k: score[k])


def _calibration_used(session: Session, key: str, params_hash: str, products: list[Product]) -> CalibrationSetUsed:
    used = _calibration_files_used(session, key, params_hash, products)
    cs = products[0].calibration_set if products else None
    if cs is not None:
        used.set_id, used.public, used.owner = cs.id, bool(cs.public), cs.owner
    return used


def _calibration_files_used(session: Session, key: str, params_hash: str,
                            products: list[Product]) -> CalibrationSetUsed:
    ids = []
    for part in key.split(","):
        _, _, fid = part.partition(":")
        if (fid.strip().isascii() and fid.strip().isdigit()):
            ids.append(int(fid))
    rows = {c.id: c for c in session.scalars(select(CalibrationFile).where(CalibrationFile.id.in_(ids)))} if ids else {}
    files = [(rows[i].kind.value, i, rows[i].version) for i in ids if i in rows]
    files.sort()
    return CalibrationSetUsed(key=key, params_hash=params_hash, files=files,
                              software_versions=sorted({p.software_version for p in products}))


def event_curves(session: Session, event: Event, *, product_root: Path, channel: str = "SDI",
                 margin: dt.timedelta = CURVES_MARGIN, calibration_set: int | None = None,
                 principal=None) -> EventCurves:
    """The LST light curves (ROI and disk, one calibration set) and the GOES XRS curve of an event.

    Parameters
    ----------
    event : Event
    product_root : Path
        The product store (relative ``Product.path`` values).
    channel : str
        LST channel (default SDI).
    margin : timedelta
        Added before the start and after the end (the window also widens to 3 frames of the
        channel on each side, by at most 6 h, as the light-curve API does).
    calibration_set : int, optional
        Draw the products of this calibration set (the caller checks that it may be seen);
        default: the public set covering most frames of the window (:func:`_choose_set`).
    principal : backend.auth.Principal, optional
        Who asks: only events they may see place the ROI of an event without a position
        (None: anonymous, public events).

    Returns
    -------
    EventCurves
    """
    import time

    spec = get_channel(channel)
    start, end, notes = _curves_window(event, margin)
    if end - start < MAX_CURVES_WINDOW:
        start, end = products_service._context_window(session, spec.code, start, end, products_service.CONTEXT_FRAMES)
    out = EventCurves(event=event, channel=spec.code, start=start, end=end, unit=spec.bunit, notes=notes)
    deadline = time.monotonic() + read_budget_s()
    written = _written_in_window(session, spec.code, start, end)
    chosen = _choose_set(written, calibration_set)
    if chosen is None and calibration_set is not None:
        out.notes.append(f"calibration set #{calibration_set} has no written {spec.code} product in this window")
    if chosen is not None:
        used = [p for p in written if _set_key(p) == chosen]
        out.calibration = _calibration_used(session, used[0].calibration_key, used[0].params_hash, used)
        out.frames_other_sets = len({p.frame_id for p in written} - {p.frame_id for p in used})
        placed = event
        if event.hpc_x is None or event.hpc_y is None:  # e.g. a GOES report row: its same flare elsewhere
            from backend.services.imaging import located_events

            partner = located_events(session, [event], principal).get(event.id)
            if partner is not None and partner.hpc_x is not None and partner.hpc_y is not None:
                placed = partner
                out.notes.append(f"ROI at the position of the same flare in {partner.source} (event #{partner.id}): "
                                 "this event has none of its own")
        has_pos = placed.hpc_x is not None and placed.hpc_y is not None and not spec.is_coronagraph
        out.roi_box = (float(placed.hpc_x), float(placed.hpc_y), products_service.ROI_HALF_WIDTH) if has_pos else None
        units = set()
        late = 0
        for p in used:
            if time.monotonic() > deadline and not products_service.curve_values_cached(
                    products_service.resolve_store_path(p.path, product_root), out.roi_box, spec.is_coronagraph):
                late += 1
                out.skipped.append({"product_id": p.id, "reason": "not measured within this request's time budget"})
                continue
            path = products_service.resolve_store_path(p.path, product_root)
            if path is None:
                out.skipped.append({"product_id": p.id, "reason": "no file recorded"})
                continue
            try:
                disk = products_service.disk_integrated_mean(path, on_disk_only=not spec.is_coronagraph)
                roi = products_service.region_mean(path, *out.roi_box) if out.roi_box else None
            except FitsReadError as exc:
                out.skipped.append({"product_id": p.id, "reason": str(exc)})
                continue
            out.lst_times.append(as_utc(p.frame.date_obs))
            out.product_ids.append(p.id)
            out.disk.append(_value(disk))
            out.disk_sigma.append(_sigma(disk))
            if out.roi_box:
                out.roi.append(_value(roi))
                out.roi_sigma.append(_sigma(roi))
            for m in (disk, roi):
                if m is not None and m.unit:
                    units.add(m.unit)
        if units:
            out.unit = ", ".join(sorted(units))
        if late:
            out.notes.append(f"{late} of {len(used)} products not measured yet (first reading of their files): "
                             "reload for the rest")
    try:
        win = xray_window(session, start, end)
    except ValueError as exc:  # more samples than one answer holds
        out.notes.append(f"GOES XRS not drawn: {exc}")
        out.xray_coverage = xray_coverage(session)
        return out
    out.xray = win.best()
    out.xray_others = sorted({s.series.satellite for s in win.series} - ({out.xray.series.satellite} if out.xray else set()))
    if out.xray is None:
        out.xray_coverage = xray_coverage(session)
    return out


def _value(m) -> float | None:
    return None if m is None or m.value is None or not math.isfinite(m.value) else float(m.value)


def _sigma(m) -> float | None:
    """The uncertainty of a mean, None when unknown or the mean is a gap."""
    if _value(m) is None or m.sigma is None or not math.isfinite(m.sigma):
        return None
    return float(m.sigma)


def _iso(t: dt.datetime) -> str:
    return as_utc(t).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def curves_csv(c: EventCurves) -> str:
    """The curves as CSV: one row per sample, ``curve`` naming it (``lst_roi``, ``lst_disk``,
    ``goes_xrsb``, ``goes_xrsa``), an empty ``value`` for a gap, ``uncertainty`` the 1-sigma
    uncertainty of an LST mean in ``unit`` (from the products' ``UNCERT``; empty when unknown,
    and for GOES, whose files give none); header comments give the event, the calibration set
    and the window."""
    import csv

    buf = io.StringIO()
    e = c.event
    buf.write(f"# event {e.id} {e.event_type} ({e.source}) start {_iso(e.start_time)}"
              + (f" peak {_iso(e.peak_time)}" if e.peak_time else "") + (f" end {_iso(e.end_time)}" if e.end_time else "")
              + "\n")
    buf.write(f"# window {_iso(c.start)} .. {_iso(c.end)} UTC\n")
    if c.calibration:
        buf.write(f"# LST {c.channel} calibration set: {c.calibration.label}; key {c.calibration.key}\n")
        if c.calibration.set_id is not None:
            buf.write(f"# calibration_set_id: {c.calibration.set_id} ({c.calibration.whose})\n")
    if c.roi_box:
        buf.write(f"# lst_roi: mean over helioprojective ({c.roi_box[0]:.1f}, {c.roi_box[1]:.1f}) +-{c.roi_box[2]:.0f} arcsec\n")
    if c.xray:
        buf.write(f"# GOES: {c.xray.series.satellite} {c.xray.series.original_name} (cadence {c.xray.series.cadence_s:.3f} s); "
                  "xrsb 1-8 A, xrsa 0.5-4 A\n")
    else:
        buf.write("# GOES: no stored XRS series covers this window\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["curve", "time_utc", "value", "uncertainty", "unit", "source"])
    for name, vals, sigmas in (("lst_roi", c.roi, c.roi_sigma), ("lst_disk", c.disk, c.disk_sigma)):
        for t, v, sig, pid in zip(c.lst_times, vals, sigmas or [None] * len(vals), c.product_ids):
            w.writerow([name, _iso(t), "" if v is None else f"{v:.7g}", "" if sig is None else f"{sig:.3g}",
                        c.unit, f"product {pid}"])
    if c.xray:
        for name, vals in (("goes_xrsb", c.xray.xrsb), ("goes_xrsa", c.xray.xrsa)):
            for t, v in zip(c.xray.times_iso, vals):
                w.writerow([name, t, "" if v is None else f"{v:.6e}", "", "W m-2", c.xray.series.satellite])
    return buf.getvalue()


def curves_fits(c: EventCurves) -> bytes:
    """The curves as a FITS file: primary header (event, calibration set, DATE-OBS range) and two
    binary tables, ``LST`` (TIME, PRODUCT_ID, ROI_MEAN, DISK_MEAN and their 1-sigma
    uncertainties ROI_ERR, DISK_ERR, in the products' BUNIT; NaN = unknown) and
    ``GOES_XRS`` (TIME, XRSB, XRSA in W m-2, quality words); NaN is a gap. TIME columns are
    astropy ``Time`` (UTC), written as FITS time columns."""
    import astropy.units as u
    from astropy.io import fits
    from astropy.table import Table
    from astropy.time import Time

    from backend import __version__

    e = c.event
    unit = u.Unit(c.unit, parse_strict="silent") if c.unit else None
    hdr = fits.Header()
    hdr["ORIGIN"] = ("LST data platform", "ASO-S/LST event browser")
    hdr["EVENT_ID"] = (e.id, "event id in the platform")
    hdr["EVTYPE"] = (e.event_type, "HEK event type")
    hdr["EVSOURCE"] = (e.source[:68], "event source")
    hdr["EVSTART"] = (_iso(e.start_time), "event start (UTC)")
    if e.peak_time:
        hdr["EVPEAK"] = (_iso(e.peak_time), "event peak (UTC)")
    if e.end_time:
        hdr["EVEND"] = (_iso(e.end_time), "event end (UTC)")
    hdr["TIMESYS"] = "UTC"
    if c.lst_times:
        hdr["DATE-OBS"] = (_iso(c.lst_times[0])[:-1], "first LST sample (UTC)")
        hdr["DATE-END"] = (_iso(c.lst_times[-1])[:-1], "last LST sample (UTC)")
    hdr["WINSTART"] = (_iso(c.start), "window start (UTC)")
    hdr["WINEND"] = (_iso(c.end), "window end (UTC)")
    hdr["CHANNEL"] = (c.channel, "LST channel of the light curves")
    if c.calibration:
        if c.calibration.set_id is not None:
            stamp_provenance(hdr, {"CALSET": c.calibration.set_id})  # the products' keyword, one meaning
            hdr["CALSETPB"] = (bool(c.calibration.public), "calibration set is public")
            if c.calibration.owner:
                hdr["CALSETOW"] = (c.calibration.owner[:68], "owner of the private calibration set")
        hdr["CALKEY"] = (c.calibration.key[:68], "calibration set: kind:file id")
        hdr["CALIDS"] = (c.calibration.ids[:68], "calibration file ids and versions")
        hdr["CALPARAM"] = (c.calibration.params_hash[:16], "calibration options hash")
        for k, i, v in c.calibration.files[:20]:
            hdr.add_history(f"calibration {k} file {i} version {v}")
    if c.roi_box:
        hdr["ROI_X"] = (c.roi_box[0], "[arcsec] ROI centre, helioprojective x")
        hdr["ROI_Y"] = (c.roi_box[1], "[arcsec] ROI centre, helioprojective y")
        hdr["ROI_HW"] = (c.roi_box[2], "[arcsec] ROI half width")
    if c.xray:
        hdr["XRS_SAT"] = (c.xray.series.satellite, "GOES satellite of the XRS curve")
        hdr["XRS_FILE"] = (c.xray.series.original_name[:68], "GOES XRS source file")
    hdr["CREATOR"] = (f"lstdp {__version__}", "software that wrote this file")

    def col(vals):
        return np.array([np.nan if v is None else v for v in vals], dtype=np.float64)

    lst = Table()
    lst["TIME"] = Time([as_utc(t) for t in c.lst_times], scale="utc") if c.lst_times else Time([], format="isot", scale="utc")
    lst["PRODUCT_ID"] = np.array(c.product_ids, dtype=np.int64)
    lst["ROI_MEAN"] = col(c.roi) if c.roi_box else np.full(len(c.lst_times), np.nan)
    lst["DISK_MEAN"] = col(c.disk)
    lst["ROI_ERR"] = col(c.roi_sigma) if c.roi_box else np.full(len(c.lst_times), np.nan)
    lst["DISK_ERR"] = col(c.disk_sigma)
    lst["ROI_ERR"].description = "1-sigma uncertainty of ROI_MEAN (from UNCERT); NaN: unknown"
    lst["DISK_ERR"].description = "1-sigma uncertainty of DISK_MEAN (from UNCERT); NaN: unknown"
    if unit is not None:
        for name in ("ROI_MEAN", "DISK_MEAN", "ROI_ERR", "DISK_ERR"):
            lst[name].unit = unit
    xr = Table()
    if c.xray:
        xr["TIME"] = Time(np.asarray(c.xray.t_tai, dtype=np.float64), format="unix_tai").utc
        xr["XRSB"] = col(c.xray.xrsb) * u.W / u.m**2
        xr["XRSA"] = col(c.xray.xrsa) * u.W / u.m**2
        xr["XRSB_Q"] = np.array([-1 if q is None else q for q in c.xray.xrsb_quality], dtype=np.int64)
        xr["XRSA_Q"] = np.array([-1 if q is None else q for q in c.xray.xrsa_quality], dtype=np.int64)
    else:
        xr["TIME"] = Time([], format="isot", scale="utc")
        xr["XRSB"] = np.zeros(0) * u.W / u.m**2
        xr["XRSA"] = np.zeros(0) * u.W / u.m**2
    h_lst = fits.table_to_hdu(lst)
    h_lst.name = "LST"
    h_xr = fits.table_to_hdu(xr)
    h_xr.name = "GOES_XRS"
    h_xr.header["COMMENT"] = "XRSB 1-8 A (0.1-0.8 nm), XRSA 0.5-4 A (0.05-0.4 nm); NaN = gap (flagged or fill sample)"
    hdul = fits.HDUList([fits.PrimaryHDU(header=hdr), h_lst, h_xr])
    for h in hdul:
        h.add_checksum()
    buf = io.BytesIO()
    hdul.writeto(buf)
    return buf.getvalue()


# -- linked data -------------------------------------------------------------------------------


@dataclass
class LinkedData:
    """What LST data belong to an event.

    ``frame_ids``/``product_ids``: linked explicitly (``event_frames``/``event_products``: the
    frames a detector found the event in, the products it used). ``in_window``: per channel,
    (frames with DATE-OBS in the window, the newest written product of each, as ids).
    """

    start: dt.datetime
    end: dt.datetime
    frame_ids: list[int] = field(default_factory=list)
    product_ids: list[int] = field(default_factory=list)
    in_window: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.frame_ids or self.product_ids or self.in_window)


def linked_data(session: Session, event: Event, margin: dt.timedelta) -> LinkedData:
    """The frames and products linked to ``event`` and those of its window (± ``margin``)."""
    start, end = products_service.event_window(event, margin)
    out = LinkedData(start=start, end=end)
    out.frame_ids = list(session.scalars(select(EventFrame.frame_id).where(EventFrame.event_id == event.id)
                                         .order_by(EventFrame.frame_id)))
    out.product_ids = list(session.scalars(select(EventProduct.product_id).where(EventProduct.event_id == event.id)
                                           .order_by(EventProduct.product_id)))
    frames = dict(session.execute(
        select(Frame.channel_code, func.count()).where(Frame.date_obs >= start, Frame.date_obs <= end)
        .group_by(Frame.channel_code)).all())
    prods: dict[str, list[int]] = {}
    for p in products_service.latest_products_in_window(session, start, end):
        prods.setdefault(p.frame.channel_code, []).append(p.id)
    for ch in sorted(set(frames) | set(prods)):
        out.in_window[ch] = (frames.get(ch, 0), prods.get(ch, []))
    return out
