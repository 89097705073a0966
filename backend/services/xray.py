"""GOES XRS time series: ingest (idempotent, by sha256), window queries, coverage.

Commands
    :func:`ingest_xray_file` (one file; a broken one is quarantined with its reason, never
    raised), :func:`import_xray_dir` (every file of a folder, each committed on its own).
Queries
    :func:`xray_window` (samples of a UTC window, per series, gaps as None),
    :func:`xray_coverage` (the spans per satellite, for the coverage API).

Samples are stored one row per sample (``xray_samples``), keyed by (series, TAI seconds):
astropy's ``unix_tai`` counts leap seconds, so a sample inside a leap second keeps its own
time and the window query is a plain range scan on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from astropy.time import Time
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.models import XRaySample, XRaySeries
from backend.services.ingest import quarantine
from backend.settings import Settings
from pipelines.errors import failure_reason
from pipelines.fitsio import sha256_file
from pipelines.timeseries.goes_xrs import XRSReadError, read_goes_xrs
from pipelines.utc import as_utc

__all__ = [
    "XRayIngestOutcome",
    "ingest_xray_file",
    "import_xray_dir",
    "XRayWindow",
    "XRaySeriesSamples",
    "xray_window",
    "xray_coverage",
    "tai_to_utc_iso",
    "tai_to_datetime",
    "MAX_WINDOW",
    "MAX_SAMPLES",
    "XRAY_SUFFIXES",
]

#: Longest window :func:`xray_window` serves (2 days: 172,800 samples of a 1-s series).
MAX_WINDOW = dt.timedelta(days=2)
#: Most samples one window returns, over all series: 100,000 (a day of GOES-15's 2-s samples
#: is 42,176 and was served as JSON in 0.33 s on the 2-core CI machine; 100,000 stays well
#: inside the API's 1.8 s deadline). A longer 1-s window is a 422 asking for a shorter one.
MAX_SAMPLES = 100_000
#: File names :func:`import_xray_dir` reads.
XRAY_SUFFIXES = (".nc", ".fits", ".fts", ".fit")
_CHUNK = 5000


@dataclass
class XRayIngestOutcome:
    """What ingesting one file did: ``ingested``, ``duplicate`` or ``rejected`` (with the reason)."""

    path: str
    status: str
    reason: str = ""
    series_id: int | None = None
    satellite: str | None = None
    n_samples: int = 0
    stored_path: str | None = None

    def line(self) -> str:
        what = f" series {self.series_id} {self.satellite} {self.n_samples} samples" if self.series_id else ""
        tail = f": {self.reason}" if self.reason else ""
        return f"{self.status}{what} {Path(self.path).name}{tail}"


def _none_if_nan(v: float) -> float | None:
    return None if not math.isfinite(v) else float(v)


def _utc_fields(t_tai, digits: int) -> list[tuple[int, int, int, int, int, int, int]]:
    """(year, month, day, hour, minute, second, fraction in units of 10**-digits s) in UTC of
    ``unix_tai`` seconds: ``erfa.d2dtf`` on astropy's UTC two-part JD, rounded to ``digits``
    decimals, the call and rounding that astropy's ``Time.isot`` makes (a leap second has
    second 60), without its per-element formatting (it was most of the event figure's time)."""
    import erfa

    t = Time(np.atleast_1d(np.asarray(t_tai, dtype=np.float64)), format="unix_tai").utc
    iy, im, iday, hmsf = erfa.d2dtf(b"UTC", digits, t.jd1, t.jd2)
    return list(zip(iy.tolist(), im.tolist(), iday.tolist(), hmsf["h"].tolist(), hmsf["m"].tolist(),
                    hmsf["s"].tolist(), hmsf["f"].tolist()))


def tai_to_datetime(t_tai) -> list[dt.datetime]:
    """Aware UTC datetimes of ``unix_tai`` seconds; a time inside a leap second (23:59:60.x,
    which ``datetime`` cannot hold) becomes 23:59:59.999999 of that day: still after the sample
    before it and before the next day's first; the exact time is in :func:`tai_to_utc_iso`.
    (Microseconds as ``Time(...).utc.isot`` at precision 6 writes them.)"""
    utc = dt.UTC
    return [dt.datetime(y, mo, d, h, mi, 59, 999999, tzinfo=utc) if s == 60 else
            dt.datetime(y, mo, d, h, mi, s, f, tzinfo=utc) for y, mo, d, h, mi, s, f in _utc_fields(t_tai, 6)]


def tai_to_utc_iso(t_tai) -> list[str]:
    """ISO 8601 UTC strings (``...Z``, millisecond precision) of ``unix_tai`` seconds; a leap
    second reads ``23:59:60.xxx`` (the strings of ``Time(...).utc.isot`` at precision 3)."""
    return [f"{y:d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}.{f:03d}Z"
            for y, mo, d, h, mi, s, f in _utc_fields(t_tai, 3)]


def _utc_to_tai(t: dt.datetime) -> float:
    import warnings

    from erfa import ErfaWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ErfaWarning)  # "dubious year" for windows centuries away: no data there
        return float(Time(as_utc(t)).unix_tai)


def ingest_xray_file(session: Session, path: str | os.PathLike, settings: Settings) -> XRayIngestOutcome:
    """Read one GOES XRS file and store its series and samples. Never raises for bad data.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        The caller commits.
    path : path-like
        A GOES XRS netCDF or FITS file (:func:`pipelines.timeseries.goes_xrs.read_goes_xrs`).
    settings : Settings
        For the quarantine folder (``<quarantine>/xray``).

    Returns
    -------
    XRayIngestOutcome
        ``duplicate`` when a series of the same sha256 is stored (nothing added), ``rejected``
        with the one-line reason when the file cannot be read (a copy goes to the quarantine
        with a ``.reason`` file; the source stays), else ``ingested``.
    """
    src = Path(path)
    if not src.is_file():
        return XRayIngestOutcome(str(src), "rejected", f"no such file: {src}")
    try:
        sha = sha256_file(src)
    except OSError as exc:
        return XRayIngestOutcome(str(src), "rejected", f"cannot read the file: {exc.strerror or exc}")
    have = session.scalar(select(XRaySeries).where(XRaySeries.sha256 == sha))
    if have is not None:
        return XRayIngestOutcome(str(src), "duplicate", "same SHA-256 as an ingested X-ray series",
                                 series_id=have.id, satellite=have.satellite, n_samples=have.n_samples)
    try:
        s = read_goes_xrs(src)
        if len(s) == 0:
            raise XRSReadError("no sample in the file")
        tai = s.unix_tai
        ends = tai_to_datetime([tai[0], tai[-1]])
        row = XRaySeries(
            satellite=s.satellite, layout=s.layout, original_name=src.name[:255], path=str(src.resolve()),
            sha256=sha, size_bytes=src.stat().st_size, start_time=ends[0], end_time=ends[1],
            cadence_s=float(s.cadence_s), n_samples=len(s), n_gaps_xrsa=int(np.isnan(s.xrsa).sum()),
            n_gaps_xrsb=int(np.isnan(s.xrsb).sum()), quality_rule=s.quality_rule, notes=list(s.notes),
        )
        with session.begin_nested():
            session.add(row)
            session.flush()
            qa = [None if q < 0 else int(q) for q in s.xrsa_quality.tolist()]
            qb = [None if q < 0 else int(q) for q in s.xrsb_quality.tolist()]
            rows = [{"series_id": row.id, "t_tai": t, "xrsa": _none_if_nan(a), "xrsb": _none_if_nan(b),
                     "xrsa_quality": x, "xrsb_quality": y}
                    for t, a, b, x, y in zip(tai.tolist(), s.xrsa.tolist(), s.xrsb.tolist(), qa, qb)]
            for i in range(0, len(rows), _CHUNK):
                session.execute(insert(XRaySample.__table__), rows[i:i + _CHUNK])
        return XRayIngestOutcome(str(src), "ingested", series_id=row.id, satellite=row.satellite,
                                 n_samples=row.n_samples)
    except IntegrityError:
        return XRayIngestOutcome(str(src), "duplicate", "stored concurrently by another process")
    except XRSReadError as exc:
        reason = failure_reason(exc)
    except Exception as exc:  # noqa: BLE001 - one file's fault must not stop the folder
        reason = f"unexpected {failure_reason(exc)}"
    where = quarantine(src, reason, settings, False, sha, folder=settings.quarantine / "xray")
    return XRayIngestOutcome(str(src), "rejected", reason, stored_path=str(where))


def import_xray_dir(session: Session, folder: str | os.PathLike, settings: Settings) -> list[XRayIngestOutcome]:
    """:func:`ingest_xray_file` for every ``.nc``/``.fits``/``.fts`` file of ``folder`` (not
    recursive, name order), each committed on its own.

    Raises
    ------
    FileNotFoundError
        If ``folder`` is not a folder.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"no such folder: {root}")
    out = []
    for f in sorted(root.iterdir()):
        if f.name.startswith(".") or f.suffix.lower() not in XRAY_SUFFIXES:
            continue
        o = ingest_xray_file(session, f, settings)
        session.commit()
        out.append(o)
    return out


@dataclass
class XRaySeriesSamples:
    """The samples of one stored series inside a window.

    ``t_tai`` are astropy ``unix_tai`` seconds; ``xrsa``/``xrsb`` in W m-2, None for a gap.
    """

    series: XRaySeries
    t_tai: list[float] = field(default_factory=list)
    xrsa: list[float | None] = field(default_factory=list)
    xrsb: list[float | None] = field(default_factory=list)
    xrsa_quality: list[int | None] = field(default_factory=list)
    xrsb_quality: list[int | None] = field(default_factory=list)

    @property
    def times_iso(self) -> list[str]:
        return tai_to_utc_iso(self.t_tai) if self.t_tai else []

    @property
    def times(self) -> list[dt.datetime]:
        return tai_to_datetime(self.t_tai) if self.t_tai else []


@dataclass
class XRayWindow:
    """What :func:`xray_window` found: the window and, per stored series with samples in it, the samples."""

    start: dt.datetime
    end: dt.datetime
    series: list[XRaySeriesSamples] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return sum(len(s.t_tai) for s in self.series)

    def best(self) -> XRaySeriesSamples | None:
        """The series to draw: the most non-gap XRS-B samples, then the finer cadence, then the
        lower satellite number (one satellite on a figure, never two interleaved)."""
        if not self.series:
            return None
        return min(self.series, key=lambda s: (-sum(v is not None for v in s.xrsb), s.series.cadence_s,
                                               s.series.satellite, s.series.id))


def xray_window(session: Session, start: dt.datetime, end: dt.datetime, *, satellite: str | None = None) -> XRayWindow:
    """The stored XRS samples with times in [``start``, ``end``] (UTC), per series.

    Parameters
    ----------
    start, end : datetime
        Aware UTC (naive ones are taken as UTC).
    satellite : str, optional
        ``GOES-15`` etc. (case-insensitive; ``g15``, ``15`` accepted).

    Returns
    -------
    XRayWindow
        Series ordered by satellite then start; samples in time order.

    Raises
    ------
    ValueError
        If ``end`` is not after ``start``, the window is longer than :data:`MAX_WINDOW`, the
        satellite is not a GOES name, or more than :data:`MAX_SAMPLES` samples fall in it.
    """
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    if end - start > MAX_WINDOW:
        raise ValueError(f"window of {(end - start).total_seconds() / 86400:.2f} days is longer than the "
                         f"{MAX_WINDOW.days} days served at once")
    sat = normalise_satellite(satellite) if satellite else None
    t0, t1 = _utc_to_tai(start), _utc_to_tai(end)
    conds = [XRaySample.t_tai >= t0, XRaySample.t_tai <= t1]
    if sat:
        conds.append(XRaySeries.satellite == sat)
    n = session.scalar(select(func.count()).select_from(XRaySample).join(XRaySeries).where(*conds)) or 0
    if n > MAX_SAMPLES:
        raise ValueError(f"{n} samples in the window, more than {MAX_SAMPLES}: ask for a shorter window or one satellite")
    q = (select(XRaySample.series_id, XRaySample.t_tai, XRaySample.xrsa, XRaySample.xrsb,
                XRaySample.xrsa_quality, XRaySample.xrsb_quality)
         .join(XRaySeries).where(*conds).order_by(XRaySample.series_id, XRaySample.t_tai))
    by_id: dict[int, XRaySeriesSamples] = {}
    for sid, t, a, b, qa, qb in session.execute(q):
        s = by_id.get(sid)
        if s is None:
            s = by_id[sid] = XRaySeriesSamples(series=session.get(XRaySeries, sid))
        s.t_tai.append(float(t))
        s.xrsa.append(None if a is None else float(a))
        s.xrsb.append(None if b is None else float(b))
        s.xrsa_quality.append(qa)
        s.xrsb_quality.append(qb)
    out = XRayWindow(start=start, end=end)
    out.series = sorted(by_id.values(), key=lambda s: (s.series.satellite, as_utc(s.series.start_time), s.series.id))
    return out


def normalise_satellite(name: str) -> str:
    """``GOES-15`` for ``goes-15``, ``GOES15``, ``g15``, ``15``.

    Raises
    ------
    ValueError
        If ``name`` does not name a GOES satellite by number.
    """
    import re

    m = re.fullmatch(r"\s*(?:goes[-_ ]?|g)?(\d{1,2})\s*", str(name), re.I)
    if not m:
        raise ValueError(f"satellite {str(name)[:40]!r} is not a GOES satellite (e.g. GOES-15)")
    return f"GOES-{int(m.group(1))}"


def xray_coverage(session: Session) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """The time spans the stored XRS series cover, per satellite.

    Series of one satellite that overlap or touch (the next starts within two cadences of the
    last end) are merged into one span.

    Returns
    -------
    list of (satellite, start, end)
        Aware UTC datetimes, ordered by satellite then start.
    """
    rows = session.execute(select(XRaySeries.satellite, XRaySeries.start_time, XRaySeries.end_time,
                                  XRaySeries.cadence_s).order_by(XRaySeries.satellite, XRaySeries.start_time))
    spans: list[list] = []
    for sat, t0, t1, cad in rows:
        t0, t1 = as_utc(t0), as_utc(t1)
        slack = dt.timedelta(seconds=2 * float(cad or 0))
        if spans and spans[-1][0] == sat and t0 <= spans[-1][2] + slack:
            spans[-1][2] = max(spans[-1][2], t1)
        else:
            spans.append([sat, t0, t1])
    return [(s, a, b) for s, a, b in spans]
