"""Solar events: catalogue import, queries, associations.

Commands
    :func:`import_catalogue` (one catalogue, idempotent), :func:`import_all` (every
    catalogue found in an events folder), :func:`link_wst_goes` (LST/WST white-light flares
    to their GOES flares).
Queries
    :func:`list_events`, :func:`get_event`, :func:`associated_events`.

Import is idempotent: events are unique on (source, source_key); the keys already stored
for a source are loaded once, and only new rows are inserted, in bulk (``INSERT`` with many
parameter sets, which SQLAlchemy sends as multi-row ``INSERT ... VALUES`` on PostgreSQL
and SQLite alike). A second import of the same file adds nothing.

Associations are stored both ways (``EventAssociation(a, b)`` and ``(b, a)``), so
:func:`associated_events` needs one lookup. Kinds: HEK ``edge_type`` (``is_followed_by``,
its reverse ``is_preceded_by``), ``same_flare`` for WST-GOES pairs.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlalchemy import Text, cast, func, insert, select, text
from sqlalchemy.orm import Session

from backend.models import Event, EventAssociation, utcnow
from pipelines.catalogues import (
    CATALOGUES,
    DETECTED_SOURCE,
    AssociationRecord,
    CatalogueError,
    association_label,
    catalogue_files,
    parse_catalogue,
    refusal_summary,
)
from pipelines.errors import failure_reason
from pipelines.utc import as_utc

__all__ = [
    "ImportReport",
    "ImportRun",
    "import_catalogue",
    "import_all",
    "insert_ignoring_conflicts",
    "link_wst_goes",
    "associate_events",
    "associate_around",
    "refresh_statistics",
    "FLARE_CME",
    "PROMINENCE_CME",
    "list_events",
    "get_event",
    "associated_events",
    "associated_events_with_reasons",
    "SAME_FLARE",
    "WST_GOES_MAX_OFFSET",
]

#: Association kind of an LST/WST white-light flare and its GOES X-ray flare.
SAME_FLARE = "same_flare"
#: Association kind from a flare to the CME it launched (reverse: ``cme_flare``).
FLARE_CME = "flare_cme"
#: Association kind from a prominence eruption to its CME (reverse: ``cme_prominence``).
PROMINENCE_CME = "prominence_cme"
#: Farthest a GOES peak may lie from the WST peak when it is outside the WST window.
WST_GOES_MAX_OFFSET = dt.timedelta(minutes=30)
#: Rows per INSERT statement.
_CHUNK = 2000
#: The reverse of a directed association kind (HEK edge types); others are symmetric.
_REVERSE_KIND = {
    "is_followed_by": "is_preceded_by",
    "is_preceded_by": "is_followed_by",
    "causes": "is_caused_by",
    "is_caused_by": "causes",
    FLARE_CME: "cme_flare",
    "cme_flare": FLARE_CME,
    PROMINENCE_CME: "cme_prominence",
    "cme_prominence": PROMINENCE_CME,
}


@dataclass
class ImportReport:
    """What one catalogue import did.

    Attributes
    ----------
    source : str
    rows_in : int
        Data rows read from the files.
    stored : int
        Events inserted now.
    skipped_existing : int
        Rows whose (source, source_key) was already stored (a re-import).
    refused : list of (str, str)
        (row id, reason) of every row not stored for another reason.
    files : list of str
    associations_added : int
        Association rows inserted (each link counts twice: both directions).
    associations_unresolved : list of (str, str)
        Associations the catalogue states whose other end is not stored, and why.
    truncated : list of str
        Files that say they hold only part of their answer (HEK ``overmax``), one line each.
    repairs : list of str
        Files read with a repair (bytes that are not UTF-8), one line each.
    error : str or None
        Why the catalogue was not imported (:func:`import_all` only; nothing of it is stored).
    """

    source: str
    rows_in: int = 0
    stored: int = 0
    skipped_existing: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    associations_added: int = 0
    associations_unresolved: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    error: str | None = None

    def refusal_sample(self, n: int = 5) -> list[tuple[str, int, str]]:
        """The ``n`` commonest refusal reasons: (reason, count, example row id)."""
        return refusal_summary(self.refused, n)

    def lines(self) -> list[str]:
        """The report as text lines (the CLI prints them): counts, then the commonest refusal
        reasons with their counts, truncations, repairs; or the error."""
        if self.error is not None:
            return [f"{self.source:10s} FAILED, nothing stored: {self.error}"]
        out = [f"{self.source:10s} rows in {self.rows_in:6d}  stored {self.stored:6d}  already there "
               f"{self.skipped_existing:6d}  refused {len(self.refused)}"]
        for why, n, rid in self.refusal_sample():
            out.append(f"{'':10s}   refused {n:6d} x {why} (e.g. {rid})")
        out += [f"{'':10s}   TRUNCATED: {t}" for t in self.truncated]
        out += [f"{'':10s}   repaired: {r}" for r in self.repairs]
        return out

    def check(self) -> ImportReport:
        """Assert ``rows_in == stored + skipped_existing + len(refused)``; returns self."""
        if self.rows_in != self.stored + self.skipped_existing + len(self.refused):
            raise AssertionError(f"{self.source}: {self.rows_in} rows in, {self.stored} stored, "
                                 f"{self.skipped_existing} already there, {len(self.refused)} refused")
        return self


def insert_ignoring_conflicts(session: Session, table, rows: list[dict], conflict_columns: list[str]) -> None:
    """Bulk INSERT of ``rows`` into ``table``, skipping rows that hit a unique constraint.

    ``INSERT ... ON CONFLICT (cols) DO NOTHING`` on PostgreSQL and SQLite (another process
    importing or detecting the same events at the same time, e.g. the demo's CLI and its
    worker, must not fail the transaction); a plain INSERT on other databases. Core, not ORM,
    executemany: half the time of the ORM bulk path for 47k rows.
    """
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    else:
        dialect_insert = None
    if dialect_insert is not None:
        stmt = dialect_insert(table).on_conflict_do_nothing(index_elements=conflict_columns)
    else:  # pragma: no cover - the platform runs on PostgreSQL or SQLite
        stmt = insert(table)
    for i in range(0, len(rows), _CHUNK):
        session.execute(stmt, rows[i:i + _CHUNK])


def _count(session: Session, source: str) -> int:
    return int(session.scalar(select(func.count()).select_from(Event).where(Event.source == source)) or 0)


def import_catalogue(session: Session, source: str, path: str | os.PathLike) -> ImportReport:
    """Parse catalogue ``source`` at ``path`` and store its new events (idempotent).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed: the caller owns the transaction.
    source : str
        ``lst_wst``, ``goes_xrs``, ``cdaw``, ``hek``, ``donki``, ``noaa_srs`` or ``stix``.
    path : path-like
        A catalogue file, the catalogue's folder or an events folder
        (:func:`pipelines.catalogues.catalogue_files`).

    Returns
    -------
    ImportReport
        Counts, refusals (parser refusals plus rows repeating a key of the same import) and
        association results.

    Raises
    ------
    KeyError
        For an unknown source.
    pipelines.catalogues.CatalogueError
        If no file is found or one cannot be read.

    Notes
    -----
    After a ``hek`` import the catalogue's associations are stored for every pair whose
    two ends are stored (of this or an earlier import); after an ``lst_wst`` or
    ``goes_xrs`` import, :func:`link_wst_goes` links WST flares to GOES flares. What each
    file says it covers is recorded (``catalogue_coverage``,
    :func:`backend.services.coverage.record_catalogue_coverage`), on a re-import too.
    """
    result = parse_catalogue(source, path)
    report = ImportReport(source=source, rows_in=result.rows_in, refused=list(result.refused),
                          files=[str(f) for f in catalogue_files(source, path)],
                          truncated=list(result.truncated), repairs=list(result.repairs))
    existing = set(session.scalars(select(Event.source_key).where(Event.source == source)))
    now = utcnow()
    rows: list[dict] = []
    batch: set[str] = set()
    for rec in result.events:
        if rec.source_key in existing:
            report.skipped_existing += 1
            continue
        if rec.source_key in batch:
            report.refused.append((rec.source_key, "same source key as another row of this import"))
            continue
        batch.add(rec.source_key)
        row = rec.as_row()
        row["created_at"] = now
        rows.append(row)
    before = _count(session, source) if rows else 0
    insert_ignoring_conflicts(session, Event.__table__, rows, ["source", "source_key"])
    report.stored = (_count(session, source) - before) if rows else 0
    report.skipped_existing += len(rows) - report.stored  # stored meanwhile by another process
    session.flush()
    if result.associations:
        added, unresolved = _store_associations(session, result.associations)
        report.associations_added += added
        report.associations_unresolved.extend(unresolved)
    if source in ("lst_wst", "goes_xrs"):
        report.associations_added += 2 * link_wst_goes(session)
    from backend.services.coverage import record_catalogue_coverage  # what each file says it covers

    record_catalogue_coverage(session, source, report.files)
    return report.check()


class ImportRun(list):
    """What :func:`import_all` did: a list of :class:`ImportReport` (one per catalogue found,
    failed ones included, with ``error`` set), plus ``skipped``: ``(name, why)`` of each
    entry of the events folder that no parser reads."""

    def __init__(self, reports=(), skipped=()):
        super().__init__(reports)
        self.skipped: list[tuple[str, str]] = list(skipped)

    @property
    def failed(self) -> list[ImportReport]:
        return [r for r in self if r.error is not None]

    def lines(self) -> list[str]:
        out = [line for r in self for line in r.lines()]
        out += [f"skipped {name}: {why}" for name, why in self.skipped]
        return out


def import_all(session: Session, events_dir: str | os.PathLike) -> ImportRun:
    """Import every catalogue found in ``events_dir`` (the sample-data ``events`` layout),
    each in its own transaction.

    Each catalogue is committed on its own (``session.commit()`` after it; what the session
    held before is committed first): one that cannot be read (a :class:`CatalogueError`, a
    file of which every row is refused, a parser fault) is rolled back and reported with
    ``error`` set, and the others are stored. Folders and files of ``events_dir`` that no
    parser reads are named in ``skipped``, never passed over silently.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    events_dir : path-like
        A folder holding some of ``aso-s_lst_wst/``, ``goes_xrs_reports/``, ``cdaw/``,
        ``hek/``, ``donki/``, ``noaa_srs/``.

    Returns
    -------
    ImportRun
        One ImportReport per catalogue found, in :data:`pipelines.catalogues.CATALOGUES`
        order, and the skipped entries.

    Raises
    ------
    pipelines.catalogues.CatalogueError
        If ``events_dir`` is not a folder or holds none of the catalogues.
    """
    root = Path(events_dir)
    if not root.is_dir():
        raise CatalogueError(f"no such folder: {root}")
    known = {cat.folder: source for source, cat in CATALOGUES.items()}
    run = ImportRun()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and entry.name not in known:
            run.skipped.append((f"{entry.name}/", "no parser for this catalogue"))
        elif not entry.is_dir():
            run.skipped.append((entry.name, "not a catalogue folder"))
    session.commit()
    for source, cat in CATALOGUES.items():
        folder = root / cat.folder
        if not folder.is_dir():
            continue
        if not catalogue_files(source, folder):
            run.skipped.append((f"{cat.folder}/", f"no {cat.pattern} file in it"))
            continue
        try:
            report = import_catalogue(session, source, folder)
            session.commit()
        except (sa_exc.OperationalError, sa_exc.InterfaceError):
            session.rollback()
            raise  # the database, not the catalogue: the other catalogues would fail the same way
        except Exception as exc:  # noqa: BLE001 - one catalogue's fault must not lose the others
            session.rollback()
            report = ImportReport(source=source, files=[str(f) for f in catalogue_files(source, folder)],
                                  error=failure_reason(exc))
        run.append(report)
    if not run:
        raise CatalogueError(f"{root} holds none of the catalogue folders "
                             f"({', '.join(c.folder for c in CATALOGUES.values())})"
                             + (f"; skipped: {', '.join(n for n, _ in run.skipped)}" if run.skipped else ""))
    return run


def _existing_pairs(session: Session, ids: set[int]) -> set[tuple[int, int]]:
    if not ids:
        return set()
    q = select(EventAssociation.event_id, EventAssociation.other_event_id).where(EventAssociation.event_id.in_(ids))
    return {(a, b) for a, b in session.execute(q)}


def _add_pairs(session: Session, links: list[tuple]) -> int:
    """Insert each (a, b, kind[, reason]) both ways unless present (a present pair without a
    reason gets this one); returns the rows inserted."""
    if not links:
        return 0
    have = _existing_pairs(session, {t[0] for t in links} | {t[1] for t in links})
    new, fill = [], []
    # each link row carries its other event's type and owner (EventAssociation's columns)
    ids = sorted({t[0] for t in links} | {t[1] for t in links})
    other = {}
    for i in range(0, len(ids), 5000):
        other.update({r.id: (r.event_type, r.owner) for r in session.execute(
            select(Event.id, Event.event_type, Event.owner).where(Event.id.in_(ids[i:i + 5000])))})
    for a, b, kind, *rest in links:
        reason = rest[0] if rest else None
        for x, y, k in ((a, b, kind), (b, a, _REVERSE_KIND.get(kind, kind))):
            if x == y:
                continue
            if (x, y) not in have:
                have.add((x, y))
                new.append({"event_id": x, "other_event_id": y, "kind": k, "reason": reason,
                            "other_event_type": other[y][0], "other_owner": other[y][1]})
            elif reason:
                fill.append((x, y, reason))
    if new:
        insert_ignoring_conflicts(session, EventAssociation.__table__, new, ["event_id", "other_event_id"])
        session.flush()
    _fill_reasons(session, fill)
    return len(new)


def _fill_reasons(session: Session, links: list[tuple[int, int, str]]) -> None:
    """Store the reason of links made before reasons were stored (``reason`` NULL); others are kept."""
    if not links:
        return
    from sqlalchemy import bindparam, update

    stmt = (update(EventAssociation.__table__)
            .where(EventAssociation.__table__.c.event_id == bindparam("a"),
                   EventAssociation.__table__.c.other_event_id == bindparam("b"),
                   EventAssociation.__table__.c.reason.is_(None))
            .values(reason=bindparam("r")))
    session.connection().execute(stmt, [{"a": a, "b": b, "r": r} for a, b, r in links])


def _store_associations(session: Session, assocs: list[AssociationRecord]) -> tuple[int, list[tuple[str, str]]]:
    keys_by_source: dict[str, set[str]] = {}
    for a in assocs:
        keys_by_source.setdefault(a.source, set()).update((a.key, a.other_key))
    ids: dict[tuple[str, str], int] = {}
    for src, keys in keys_by_source.items():
        for key, eid in session.execute(
            select(Event.source_key, Event.id).where(Event.source == src, Event.source_key.in_(keys))
        ):
            ids[(src, key)] = eid
    links, unresolved = [], []
    for a in assocs:
        ia, ib = ids.get((a.source, a.key)), ids.get((a.source, a.other_key))
        if ia is None or ib is None:
            missing = [k for k, i in ((a.key, ia), (a.other_key, ib)) if i is None]
            unresolved.append((f"{a.key} {a.kind} {a.other_key}", "not stored: " + ", ".join(missing)))
            continue
        links.append((ia, ib, a.kind, f"stated by {association_label(a.source)}: {a.kind.replace('_', ' ')}"))
    return _add_pairs(session, links), unresolved


def _goes_match(wst: Event, candidates: list[Event]) -> Event | None:
    """The GOES flare of a WST flare among GOES flares of the same day (see link_wst_goes)."""
    times = [as_utc(t) for t in (wst.start_time, wst.peak_time, wst.end_time) if t is not None]
    lo, hi = min(times), max(times)
    ref = as_utc(wst.peak_time or wst.start_time)
    best, best_key = None, None
    for g in candidates:
        gp = as_utc(g.peak_time or g.start_time)
        in_window = lo <= gp <= hi
        offset = abs(gp - ref)
        if not in_window and offset > WST_GOES_MAX_OFFSET:
            continue
        key = (g.goes_class != wst.goes_class, not in_window, offset, g.id)
        if best_key is None or key < best_key:
            best, best_key = g, key
    return best


def _wst_goes_reason(wst: Event, g: Event) -> str:
    """The reason of a WST-GOES link (the :func:`_goes_match` evidence)."""
    from pipelines.detect.associate import association_reason

    times = [as_utc(t) for t in (wst.start_time, wst.peak_time, wst.end_time) if t is not None]
    gp = as_utc(g.peak_time or g.start_time)
    text = association_reason(SAME_FLARE, wst, g)
    if min(times) <= gp <= max(times):
        text += ", GOES peak inside the WST window"
    if g.goes_class and g.goes_class == wst.goes_class and "both GOES" not in text:
        text += f", both GOES {g.goes_class}"
    return text


def link_wst_goes(session: Session) -> int:
    """Link each LST/WST white-light flare to its GOES X-ray flare (``same_flare``, both ways).

    Candidates are GOES XRS flares (``source='goes_xrs'``) whose peak (start when no peak)
    falls on the same UTC day as the WST peak and either lies in the WST window (from the
    earliest to the latest of its start, peak and end: one published row has its end before
    its peak) or within 30 min of the WST peak. Among candidates, the one with the GOES class
    the WST table gives comes first (the table took class and location from the GOES
    catalogue), then one in the window, then the nearest peak. WST flares already linked to
    a GOES flare are left as they are.

    Returns
    -------
    int
        Links made (each stored in both directions).
    """
    wst_rows = list(session.scalars(select(Event).where(Event.source == "lst_wst", Event.event_type == "FL")))
    if not wst_rows:
        return 0
    linked = set(session.scalars(
        select(EventAssociation.event_id)
        .join(Event, Event.id == EventAssociation.other_event_id)
        .where(EventAssociation.event_id.in_([w.id for w in wst_rows]), EventAssociation.kind == SAME_FLARE,
               Event.source == "goes_xrs")
    ))
    links = []
    for w in wst_rows:
        if w.id in linked:
            continue
        ref = as_utc(w.peak_time or w.start_time)
        day0 = dt.datetime(ref.year, ref.month, ref.day, tzinfo=dt.UTC)
        day1 = day0 + dt.timedelta(days=1)
        gp = func.coalesce(Event.peak_time, Event.start_time)
        cands = list(session.scalars(
            select(Event).where(Event.source == "goes_xrs", Event.event_type == "FL", gp >= day0, gp < day1)
        ))
        g = _goes_match(w, cands)
        if g is not None:
            links.append((w.id, g.id, SAME_FLARE, _wst_goes_reason(w, g)))
    _add_pairs(session, links)
    return len(links)


def refresh_statistics(session: Session) -> None:
    """Refresh the query planner's statistics of the event tables after a bulk import.

    SQLite keeps none until ``ANALYZE`` runs (https://sqlite.org/lang_analyze.html): without
    them it took the ``frm_name`` index for a value that 47,000 of the demo's 79,000 events
    share and sorted them all for one page (0.16 s instead of 0.02 s,
    ``benchmarks/embedded_search.py``). PostgreSQL's autovacuum would get there later; an
    explicit ``ANALYZE`` makes the first searches after an import planned on the data.
    """
    name = session.get_bind().dialect.name
    if name == "sqlite":
        session.execute(text("ANALYZE"))
    elif name == "postgresql":
        session.execute(text("ANALYZE events, event_associations"))


#: What :func:`associate_events` reads of each event: the columns its rules
#: (:mod:`pipelines.detect.associate`) and reasons use, not whole ORM objects; of
#: ``attributes`` it needs only ``visible_from_earth`` (:func:`_hidden_from_earth_ids`).
#: Over the sample catalogues (79,424 events) loading whole objects, each with its decoded
#: ``attributes``, made a full pass 10.0 CPU-s on SQLite (``benchmarks/embedded_search.py``'s
#: build) and 9.9 on PostgreSQL (client side); these columns 5.6 and 4.0, same links.
_LINK_COLUMNS = (Event.id, Event.event_type, Event.source, Event.owner, Event.frm_name, Event.start_time,
                 Event.peak_time, Event.end_time, Event.hpc_x, Event.hpc_y, Event.noaa_ar, Event.goes_class,
                 Event.position_angle, Event.angular_width)


def associate_events(session: Session, *, start: dt.datetime | None = None, end: dt.datetime | None = None) -> int:
    """Link stored events across sources and types by time and place (both ways); idempotent.

    Run after catalogue imports and detections. The public catalogue (``owner`` None) is
    linked among itself; each owner's private detections are linked to public events and to
    that owner's own only (never to another owner's), in a pass of their own, so that a
    private event never takes a public event's place in a link between public events.
    Rules (:mod:`pipelines.detect.associate`):

    * ``same_flare``: an LST/WST white-light flare and its GOES flare
      (:func:`link_wst_goes`); a flare detected on LST products (``source='detected'``) or
      a WST flare and a flare of another source whose peak falls in its window (10 min
      slack) within 150 arcsec or in the same NOAA region. Flares of two catalogues (or of
      two methods within HEK, e.g. SWPC and SSW Latest Events) overlapping so in time are
      linked when they name the same NOAA region (full numbers: 3664 and 13664 are one) or
      lie within 150 arcsec. For each flare, the nearest peak of each other source. A flare
      its catalogue marks as not visible from Earth (STIX, ``visible_from_earth`` False) is
      linked only to flares so marked.
    * ``flare_cme`` / ``cme_flare``: a CME appearing from 10 min before to 90 min after a
      flare's start, in a direction consistent with the flare's position angle on the disk
      (within the CME's span + 20 deg; halo CMEs accept any). For each CME the best flare
      of each source (time offset, then PA offset).
    * ``prominence_cme`` / ``cme_prominence``: the same window, the eruption's position
      angle within the CME's span + 20 deg; the best eruption of each source.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed.
    start, end : datetime.datetime, optional
        Only events starting in [start - 2 h, end + 2 h] are considered (aware UTC).

    Returns
    -------
    int
        Links made now (each stored both ways); links already stored are not counted.
    """
    from pipelines.detect.associate import association_reason

    made = link_wst_goes(session)
    margin = dt.timedelta(hours=2)
    conds = [Event.event_type.in_(("FL", "CE", "PR"))]
    if start is not None:
        conds.append(Event.start_time >= as_utc(start) - margin)
    if end is not None:
        conds.append(Event.start_time <= as_utc(end) + margin)
    rows = list(session.execute(select(*_LINK_COLUMNS).where(*conds).order_by(Event.start_time, Event.id)))
    # one pass over the public catalogue, then one per owner of private events over the public
    # events and theirs, keeping only links that touch theirs: a private event is never linked
    # to another owner's, and never takes a public event's place in a public-public link
    by_id = {e.id: e for e in rows}
    hidden = _hidden_from_earth_ids(session, conds)
    links = _propose_links([e for e in rows if e.owner is None], hidden)
    for owner in sorted({e.owner for e in rows if e.owner is not None}):
        mine = [e for e in rows if e.owner is None or e.owner == owner]
        links += [lk for lk in _propose_links(mine, hidden) if owner in (by_id[lk[0]].owner, by_id[lk[1]].owner)]
    have = _existing_pairs(session, {a for a, _, _ in links})
    # drop pairs already linked, and a pair proposed from both ends (detected -> WST, WST -> detected)
    seen: set[frozenset[int]] = set()
    unique, known = [], []
    for a, b, kind in links:
        k = frozenset((a, b))
        reason = association_reason(kind, by_id[a], by_id[b])
        if k in seen:
            continue
        seen.add(k)
        if (a, b) not in have:
            unique.append((a, b, kind, reason))
        else:
            known.append((a, b, kind, reason))
    _add_pairs(session, unique + known)  # known pairs only get a reason where they have none
    return made + len(unique)


#: Padding around each found event when :func:`associate_around` links it [h]: the longest
#: flare window :func:`_propose_links` looks at around a peak (12 h); :func:`associate_events`
#: adds its own 2 h.
AROUND_PAD = dt.timedelta(hours=12)


def associate_around(session: Session, events: Iterable[Event]) -> int:
    """:func:`associate_events` only where ``events`` (just detected or imported) are: once
    per run of events whose padded spans (start - :data:`AROUND_PAD` to end +
    :data:`AROUND_PAD`) touch, instead of over the whole stored catalogue.

    A detection over a job's span (years, for the demo's job) used to re-propose every link
    of the catalogue (~80 000 events, 7-12 s each time, six follow-up detections per job);
    a link always joins events within hours of each other, so the links of ``events`` are
    all proposed in their own windows. No events: nothing to link, 0.

    Returns
    -------
    int
        Links made now (as :func:`associate_events`).
    """
    spans = sorted((as_utc(e.start_time), as_utc(e.end_time or e.peak_time or e.start_time)) for e in events)
    windows: list[list[dt.datetime]] = []
    for start, end in spans:
        lo, hi = start - AROUND_PAD, max(start, end) + AROUND_PAD
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    return sum(associate_events(session, start=lo, end=hi) for lo, hi in windows)


def _propose_links(rows: list, hidden: set[int]) -> list[tuple[int, int, str]]:
    """The links :func:`associate_events` proposes among ``rows`` (events by start time, rows
    of :data:`_LINK_COLUMNS`; ``hidden``: the ids of :func:`_hidden_from_earth_ids`):
    ``(event id, other id, kind)``, each pair possibly proposed from both ends."""
    from pipelines.detect.associate import CME_AFTER_FLARE, CME_BEFORE_FLARE, FLARE_TIME_SLACK, cme_follows, same_flare

    flares = [e for e in rows if e.event_type == "FL"]
    cmes = [e for e in rows if e.event_type == "CE"]
    proms = [e for e in rows if e.event_type == "PR"]
    links: list[tuple[int, int, str]] = []

    # same flare: LST flares (detected, WST) against flares of other sources
    lst = [f for f in flares if f.source in (DETECTED_SOURCE, "lst_wst")]
    slack = dt.timedelta(hours=12)  # longest flare window considered around a peak
    starts = [as_utc(f.start_time) for f in flares]
    for a in lst:
        ap = as_utc(a.peak_time or a.start_time)
        lo = bisect.bisect_left(starts, ap - slack)
        hi = bisect.bisect_right(starts, ap + slack)
        best: dict[str, tuple[float, int]] = {}
        for b in flares[lo:hi]:
            if b.id == a.id or b.source == a.source or {a.source, b.source} == {"lst_wst", "goes_xrs"}:
                continue
            if (a.id in hidden) != (b.id in hidden):
                continue
            if not same_flare(a, b):
                continue
            off = abs((as_utc(b.peak_time or b.start_time) - ap).total_seconds())
            if b.source not in best or (off, b.id) < best[b.source]:
                best[b.source] = (off, b.id)
        links += [(a.id, bid, SAME_FLARE) for _, bid in best.values()]

    # same flare across catalogues: each pair looked at once, from the flare that starts first
    others = [f for f in flares if f.source not in (DETECTED_SOURCE, "lst_wst")]
    ostarts = [as_utc(f.start_time) for f in others]
    for i, a in enumerate(others):
        a0 = ostarts[i]
        a_last = max(as_utc(t) for t in (a.start_time, a.peak_time, a.end_time) if t is not None)
        ap = as_utc(a.peak_time or a.start_time)
        hi = bisect.bisect_right(ostarts, min(a_last, a0 + slack) + FLARE_TIME_SLACK)
        best = {}
        for b in others[i + 1:hi]:
            if _origin(a) == _origin(b) or {a.source, b.source} == {"lst_wst", "goes_xrs"}:
                continue
            if (a.id in hidden) != (b.id in hidden):
                continue
            if not same_flare(a, b, require_place=True):
                continue
            off = abs((as_utc(b.peak_time or b.start_time) - ap).total_seconds())
            if _origin(b) not in best or (off, b.id) < best[_origin(b)]:
                best[_origin(b)] = (off, b.id)
        links += [(a.id, bid, SAME_FLARE) for _, bid in best.values()]

    # CMEs: the flare and the prominence eruption they follow
    pstarts = [as_utc(p.start_time) for p in proms]
    for c in cmes:
        c0 = as_utc(c.start_time)
        for pool, pool_starts, kind in ((flares, starts, FLARE_CME), (proms, pstarts, PROMINENCE_CME)):
            lo = bisect.bisect_left(pool_starts, c0 - CME_AFTER_FLARE)
            hi = bisect.bisect_right(pool_starts, c0 + CME_BEFORE_FLARE)
            best = {}
            for src in pool[lo:hi]:
                ok, score = cme_follows(src, c)
                if ok and (src.source not in best or (score, src.id) < best[src.source]):
                    best[src.source] = (score, src.id)
            links += [(sid, c.id, kind) for _, sid in best.values()]
    return links


def _hidden_from_earth_ids(session: Session, conds: list) -> set[int]:
    """The ids of the events matching ``conds`` that their catalogue says Earth could not see
    (``attributes`` ``visible_from_earth`` False: STIX flares behind the limb as seen from
    Earth): such a flare is never the same flare as one seen from Earth or Earth orbit (LST,
    GOES, SDO/HEK), whatever the times say.

    Only rows whose stored ``attributes`` text holds ``false`` are read and decoded (a
    ``LIKE`` on the JSON text): JSON writes the literal false one way only, whereas a key may
    be written with ``\\u`` escapes, so every row whose value is false is among them (6,293
    of the sample catalogues' 79,424 events), and the value is then read exactly as the ORM
    reads it (JSON ``false``, not ``0`` or ``"false"``; the key at the top level only).
    """
    q = select(Event.id, Event.attributes).where(*conds, cast(Event.attributes, Text).contains("false"))
    return {i for i, attrs in session.execute(q) if (attrs or {}).get("visible_from_earth") is False}


def _origin(e: Event) -> str:
    """Who reported a row: its source, and within HEK its method (SWPC, SSW Latest Events,
    Flare Detective are different reporters of one flare)."""
    return f"hek:{e.frm_name}" if e.source == "hek" else e.source


def list_events(
    session: Session,
    *,
    event_type: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    source: str | None = None,
    channel: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Event], int]:
    """Events matching the filters, ordered by start time, and how many match in all.

    The offset-paged form of :func:`backend.services.event_search.search_events` (which has
    every filter, any sort and cursors); ``total`` is exact up to 10,000 matches and the
    planner's estimate above (on PostgreSQL).

    Parameters
    ----------
    event_type : str, optional
        HEK code (``FL``, ``CE``, ``AR``, ...).
    start, end : datetime.datetime, optional
        Aware UTC; an event matches when [start_time, end_time] overlaps [start, end] (an
        event without end time lasts until its peak, else is instantaneous).
    source : str, optional
        ``detected`` or a catalogue name.
    channel : str, optional
        One channel code; matches an event whose comma-separated ``channels`` holds it.
    limit, offset : int
        Page size and offset.

    Returns
    -------
    rows : list of Event
    total : int
        Number of matching events (all pages).
    """
    from backend.services.event_search import EventFilters, search_events

    filters = EventFilters(event_types=(event_type,) if event_type else (), start=start, end=end,
                           sources=(source,) if source else (), channel=channel)
    page = search_events(session, filters, sort="start_time", limit=limit, offset=offset)
    return page.items, page.total


def get_event(session: Session, event_id: int, principal=None) -> Event | None:
    """The event with this id if ``principal`` may see it (None: anonymous, the public
    catalogue only; :mod:`backend.services.event_visibility`), else None (a 404: a private
    event's id is not revealed)."""
    from backend.services import visibility

    try:
        return visibility.get_visible(session, Event, event_id, principal)
    except visibility.NotVisible:
        return None


def associated_events_with_reasons(session: Session, event_id: int,
                                   principal=None) -> list[tuple[Event, str, str | None]]:
    """:func:`associated_events` with each link's stored reason (None for a link made before
    reasons were stored): ``(event, kind, reason)`` by start time; only the linked events
    ``principal`` may see (None: anonymous, public ones)."""
    from backend.services.event_visibility import visible

    q = (
        select(Event, EventAssociation.kind, EventAssociation.reason)
        .join(EventAssociation, EventAssociation.other_event_id == Event.id)
        .where(EventAssociation.event_id == event_id)
        .order_by(Event.start_time, Event.id)
    )
    return [(e, k, r) for e, k, r in session.execute(visible(q, principal, Event.owner))]


def associated_events(session: Session, event_id: int, principal=None) -> list[tuple[Event, str]]:
    """The events linked to event ``event_id`` that ``principal`` may see (None: anonymous,
    public ones), each with the kind of link, by start time.

    Returns
    -------
    list of (Event, str)
        E.g. ``(goes_flare, 'same_flare')`` for a WST white-light flare.
    """
    return [(e, k) for e, k, _r in associated_events_with_reasons(session, event_id, principal)]
