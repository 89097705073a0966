"""Store consistency: the database and the files on disk compared both ways (``lstdp fsck``).

:func:`check_store` finds, :func:`repair_store` repairs what is safe to repair and says
what it did (and why it left the rest); :func:`run_fsck` does both. Each finding is a
:class:`Finding` of one kind, and what ``--repair`` does with it:

* ``missing_file``: a ``written`` product whose FITS is not on disk (or whose row names no
  file). Repair: the product -> ``failed`` with :data:`MISSING_REASON` (the move
  ``written -> failed`` of :mod:`backend.state`), so the next job re-plans it; its quicklook,
  if still there, quarantined. Not while the store holds no product file at all (an
  unmounted store would otherwise fail every product).
* ``checksum_mismatch``: a ``written`` product whose FITS's SHA-256 differs from the row's.
  Repair: the product -> ``failed`` with the reason; the FITS and its quicklook quarantined.
* ``missing_quicklook``: a ``written`` product whose FITS is sound but whose PNG quicklook
  is not on disk. Repair: the quicklook made again from the FITS (the same pixels and DQ
  mask as the worker's; the same bytes).
* ``outside_store``: a ``written`` product whose FITS or quicklook path lies outside the
  product store (links and ``..`` resolved, as downloads do: such a file is never served).
  Reported only: a moved or mistyped ``PRODUCT_DIR`` would otherwise fail every product.
* ``orphan_file``: a FITS or PNG in the store that no product row names (by path, nor by its
  name ``lst_<channel>_l2_<time>_f<frame>_v<version>``: :data:`PRODUCT_NAME`), or whose
  product is written under another path. Repair: quarantined.
* ``unwritten_file``: a FITS or PNG of a product that is ``planned``, ``failed``, or
  ``writing`` for longer than the lease. Repair: quarantined, unless the file or the product
  changed within the lease (then reported: a worker may be writing it).
* ``partial_file``: a temporary file of a write (in the store's ``.tmp/``, or an older
  ``.part`` name beside the products) older than the partial threshold. Repair: removed.
* ``frame_missing``, ``frame_mismatch``, ``calibration_missing``, ``calibration_mismatch``:
  a raw frame's or a calibration master's file missing, or differing from its row's SHA-256.
  Reported only: there is no copy to restore it from.
* With an object store (``PRODUCT_STORE=s3://...``, :mod:`backend.store`) the product rows
  are compared with the objects under the store's prefix, both ways: ``missing_file``,
  ``checksum_mismatch`` (streamed, against the row's SHA-256) and ``missing_quicklook`` as
  above (repair: the first two fail the product and remove what is left of its objects,
  which are no product any more; the third is reported), and
* ``attempt_object``: an object of a calibration attempt (its key carries the attempt,
  :func:`backend.store.attempt_tag`) that the product's row does not name: the attempt lost
  its claim, or failed after placing it. Only the attempt that settles the row is the
  product. Repair: removed. An object of the attempt that holds the product's live claim
  (``writing``, same attempt and holder) is ``in_progress``.
* ``orphan_object``: an object under the prefix that carries no attempt. Reported only
  (the prefix may be shared with something else).
* ``incomplete_upload``: a multipart upload begun under the prefix and never completed (the
  platform's writers never start one: a create-once write is one PUT). Repair: aborted.
* ``in_progress`` (not a problem): a temporary file younger than the threshold, or a file of
  a product ``writing`` within the lease. Nothing is done.

Writers record what they are about to place before placing it (``placed_objects``,
:mod:`backend.worker.placements`); the reconciler removes, every pass, what a writer that
stopped between placing and committing left (a file or object its row does not name, once
the attempt's claim is no longer live), so after a kill, a soft time limit or a full disk
``lstdp fsck`` is clean without ``--repair`` once the reconciler has run. ``--repair``
settles those records first too (the same rule), then repairs what the check finds.

Thresholds: a product ``writing`` (or a file) changed within ``Settings.lease_s`` (the hard
task time limit plus 60 s, 960 s by default) may belong to a live worker and is never
repaired; a temporary file is removed when older than the larger of
:data:`pipelines.fitsio.PARTIAL_MAX_AGE_S` (one hour) and the lease.

Quarantined files go to ``<QUARANTINE_DIR>/fsck/<first 12 hex of SHA-256>_<name>`` with the
reason in ``<that name>.reason`` (:func:`backend.services.ingest.quarantine`): a science
file is never deleted.

The checksum pass reads every product, frame and master file once, streaming
(:func:`pipelines.fitsio.sha256_file`, 1 MiB chunks: memory does not grow with the file).
Measured on the development machine (a Xeon virtual machine, OpenSSL 3.0, one core; a
2.15 GB file, three runs): 1.1 s per GB from the page cache, 1.3 s per GB with the file
evicted from it (``posix_fadvise DONTNEED``; a virtual disk, which its host may cache).
On a real store the disk's or the network file system's read rate bounds it: plan on
hours for tens of TB. ``checksums=False`` (``lstdp fsck --no-checksums``) checks presence
only.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, Frame, Product, ProductState, utcnow
from backend.services.ingest import quarantine
from backend.services.products import resolve_store_path
from backend.settings import Settings
from backend.state import move_product
from backend.store import StoreError, attempt_of_key, attempt_tag, is_object_ref, product_store
from pipelines.fitsio import PARTIAL_MAX_AGE_S, partial_files, sha256_file, store_tmp_dir
from pipelines.utc import as_utc

__all__ = ["Finding", "FsckReport", "check_store", "repair_store", "run_fsck", "PROBLEM_KINDS",
           "PRODUCT_NAME", "MISSING_REASON"]

#: Finding kinds that are problems (exit code 1 while one is left unrepaired); see the module
#: docstring. ``in_progress`` is the one kind that is not.
PROBLEM_KINDS = frozenset({
    "missing_file", "checksum_mismatch", "missing_quicklook", "outside_store", "orphan_file",
    "unwritten_file", "partial_file", "frame_missing", "frame_mismatch", "calibration_missing",
    "calibration_mismatch", "attempt_object", "orphan_object", "incomplete_upload",
})

#: Name of a product file as ``backend.worker.processing`` writes it:
#: ``lst_<channel>_l2_<DATE-OBS YYYYmmddTHHMMSS>_f<frame id>_v<version>.fits`` (and ``.png``).
PRODUCT_NAME = re.compile(r"^lst_[a-z0-9]+_l2_\d{8}T\d{6}_f(\d+)_v(\d+)\.(fits|png)$")

#: Reason a product gets when its FITS is missing on disk.
MISSING_REASON = "file missing on disk (found by lstdp fsck)"

_PRODUCT_SUFFIXES = (".fits", ".png")


@dataclass
class Finding:
    """One inconsistency between the database and the disk (or one write in progress).

    Attributes
    ----------
    kind : str
        One of :data:`PROBLEM_KINDS`, or ``in_progress``.
    path : str or None
        The file concerned (absolute).
    detail : str
        One line saying what is wrong.
    row : str or None
        The row concerned: ``product 12``, ``frame 3``, ``calibration file 4``.
    product_id : int or None
    sha256 : str or None
        The file's SHA-256 when the check computed it.
    action : str or None
        What ``--repair`` did, or why it did nothing; ``None`` before a repair.
    repaired : bool
    """

    kind: str
    path: str | None
    detail: str
    row: str | None = None
    product_id: int | None = None
    sha256: str | None = None
    action: str | None = None
    repaired: bool = False

    @property
    def problem(self) -> bool:
        return self.kind in PROBLEM_KINDS

    def line(self) -> str:
        who = f"{self.row}: " if self.row else ""
        where = f" ({self.path})" if self.path and self.path not in self.detail else ""
        done = f" -> {self.action}" if self.action else ""
        return f"{self.kind}: {who}{self.detail}{where}{done}"


@dataclass
class FsckReport:
    """What :func:`check_store` found (and :func:`repair_store` did).

    Attributes
    ----------
    findings : list of Finding
    checked : dict of str to int
        Rows and files looked at: ``products``, ``product_files``, ``temporary_files``,
        ``frames``, ``calibration_files``.
    bytes_hashed : int
        Bytes read by the checksum pass [byte].
    seconds : float
        Wall time of the check [s].
    checksums : bool
        Whether the SHA-256 of every file was compared.
    repaired : bool
        Whether :func:`repair_store` ran.
    """

    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    bytes_hashed: int = 0
    seconds: float = 0.0
    checksums: bool = True
    repaired: bool = False

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    @property
    def remaining(self) -> list[Finding]:
        """Problems not repaired."""
        return [f for f in self.problems if not f.repaired]

    @property
    def clean(self) -> bool:
        """No problem is left (``lstdp fsck`` exits 0)."""
        return not self.remaining

    def as_dict(self) -> dict:
        """JSON-ready: every attribute, ``clean`` and per finding ``problem``."""
        return {"clean": self.clean, "repaired": self.repaired, "checksums": self.checksums,
                "checked": dict(self.checked), "bytes_hashed": self.bytes_hashed,
                "seconds": round(self.seconds, 3),
                "problems": len(self.problems), "remaining": len(self.remaining),
                "findings": [{**asdict(f), "problem": f.problem} for f in self.findings]}

    def lines(self) -> list[str]:
        """The report as text: one line per finding, then a summary."""
        out = [f.line() for f in self.findings]
        c = self.checked
        size = (f"{self.bytes_hashed / 1e9:.2f} GB" if self.bytes_hashed >= 1e9 else f"{self.bytes_hashed / 1e6:.1f} MB")
        hashed = f"; {size} hashed" if self.checksums else "; checksums not compared"
        out.append(f"checked {c.get('products', 0)} products, {c.get('product_files', 0)} product files, "
                   f"{c.get('temporary_files', 0)} temporary files, "
                   + (f"{c['product_objects']} product objects, " if "product_objects" in c else "")
                   + f"{c.get('frames', 0)} frames, "
                   f"{c.get('calibration_files', 0)} calibration files{hashed} in {self.seconds:.1f} s")
        n, left = len(self.problems), len(self.remaining)
        if not n:
            out.append("clean: the database and the disk agree" if "product_objects" not in c
                       else "clean: the database and the object store agree")
        elif self.repaired:
            out.append(f"{n} problem(s): {n - left} repaired, {left} remain")
        else:
            out.append(f"{n} problem(s); `lstdp fsck --repair` repairs the safe ones")
        return out


@dataclass
class _Row:
    id: int
    state: ProductState
    path: str | None
    sha256: str | None
    quicklook_path: str | None
    frame_id: int
    version: int
    updated_at: dt.datetime | None


class _Ctx:
    """What one check needs: settings, clock, thresholds, the hash counter."""

    def __init__(self, settings: Settings, checksums: bool, now: dt.datetime | None):
        self.settings = settings
        self.store = settings.products.resolve()
        self.checksums = checksums
        self.now = as_utc(now) if now is not None else utcnow()
        self.lease_s = settings.lease_s
        self.partial_age_s = max(PARTIAL_MAX_AGE_S, settings.lease_s)
        self.bytes_hashed = 0

    def age_s(self, t: dt.datetime | float | None) -> float:
        """Seconds from ``t`` (a datetime, or a POSIX mtime) to now; infinite for ``None``."""
        if t is None:
            return float("inf")
        ts = t if isinstance(t, float) else as_utc(t).timestamp()
        return self.now.timestamp() - ts

    def sha(self, p: Path) -> str:
        self.bytes_hashed += p.stat().st_size
        return sha256_file(p)

    def inside(self, p: Path) -> bool:
        return p.resolve().is_relative_to(self.store)


def _product_rows(session: Session) -> list[_Row]:
    cols = (Product.id, Product.state, Product.path, Product.sha256, Product.quicklook_path,
            Product.frame_id, Product.version, Product.updated_at)
    return [_Row(*r) for r in session.execute(select(*cols).order_by(Product.id))]


def _check_written(ctx: _Ctx, r: _Row) -> list[Finding]:
    """The findings of one ``written`` product row: its FITS and its quicklook."""
    row = f"product {r.id}"
    fits_path = resolve_store_path(r.path, ctx.store)
    ql_path = resolve_store_path(r.quicklook_path, ctx.store)
    out: list[Finding] = []
    fits_ok = False
    if fits_path is None:
        out.append(Finding("missing_file", None, "written, but the row names no file", row, r.id))
    elif not ctx.inside(fits_path):
        out.append(Finding("outside_store", str(fits_path),
                           f"FITS path {fits_path} is outside the product store {ctx.store}", row, r.id))
    elif not fits_path.is_file():
        out.append(Finding("missing_file", str(fits_path), f"FITS missing on disk: {fits_path}", row, r.id))
    elif ctx.checksums and (sha := ctx.sha(fits_path)) != r.sha256:
        out.append(Finding("checksum_mismatch", str(fits_path),
                           f"FITS differs from the row: SHA-256 {sha[:12]}... on disk, "
                           f"{(r.sha256 or 'none')[:12]}... in the row", row, r.id, sha256=sha))
    else:
        fits_ok = True
    if ql_path is not None and not ctx.inside(ql_path):
        out.append(Finding("outside_store", str(ql_path),
                           f"quicklook path {ql_path} is outside the product store {ctx.store}", row, r.id))
    elif fits_ok and (ql_path is None or not ql_path.is_file()):
        where = ql_path or fits_path.with_suffix(".png")
        out.append(Finding("missing_quicklook", str(where), f"quicklook missing on disk: {where}", row, r.id))
    return out


def _owner(ctx: _Ctx, f: Path, by_path: dict[Path, _Row],
           by_name: dict[tuple[int, int], _Row]) -> tuple[_Row | None, bool]:
    """The product row a store file belongs to, and whether that row names it by path."""
    r = by_path.get(f.resolve())
    if r is not None:
        return r, True
    m = PRODUCT_NAME.match(f.name)
    return (by_name.get((int(m.group(1)), int(m.group(2)))) if m else None), False


def _check_store_file(ctx: _Ctx, f: Path, r: _Row | None, named: bool) -> Finding | None:
    """The finding of one FITS or PNG file in the store (``None`` when a written row names it)."""
    if r is not None and named and r.state == ProductState.written:
        return None
    if r is None:
        return Finding("orphan_file", str(f), "no product row names this file")
    row = f"product {r.id}"
    if r.state == ProductState.written:
        return Finding("orphan_file", str(f), f"product {r.id} is written as {r.path}, not as this file",
                       row, r.id)
    if r.state == ProductState.writing and ctx.age_s(r.updated_at) < ctx.lease_s:
        return Finding("in_progress", str(f), f"product {r.id} is being written "
                       f"(writing for {ctx.age_s(r.updated_at):.0f} s, lease {ctx.lease_s:.0f} s)", row, r.id)
    return Finding("unwritten_file", str(f), f"file of product {r.id}, which is {r.state.value}", row, r.id)


def _check_products(session: Session, ctx: _Ctx) -> tuple[list[Finding], dict[str, int]]:
    rows = _product_rows(session)
    findings: list[Finding] = []
    for r in rows:
        if r.state == ProductState.written and not is_object_ref(r.path):
            findings += _check_written(ctx, r)
    by_path: dict[Path, _Row] = {}
    for r in sorted(rows, key=lambda r: r.state != ProductState.written):  # a written row's name first
        for p in (r.path, r.quicklook_path):
            if is_object_ref(p):
                continue
            q = resolve_store_path(p, ctx.store)
            if q is not None:
                by_path.setdefault(q.resolve(), r)
    by_name = {(r.frame_id, r.version): r for r in rows}
    tmp = store_tmp_dir(ctx.store)
    quarantine_dir = ctx.settings.quarantine.resolve()
    skip_quarantine = quarantine_dir.is_relative_to(ctx.store)  # QUARANTINE_DIR inside PRODUCT_DIR
    partials = set(partial_files(ctx.store))
    n_files = 0
    for f in sorted(ctx.store.rglob("*")) if ctx.store.is_dir() else []:
        if (f in partials or f.suffix.lower() not in _PRODUCT_SUFFIXES or not f.is_file()
                or f.is_relative_to(tmp) or (skip_quarantine and f.is_relative_to(quarantine_dir))):
            continue
        n_files += 1
        finding = _check_store_file(ctx, f, *_owner(ctx, f, by_path, by_name))
        if finding is not None:
            findings.append(finding)
    for f in sorted(partials):
        try:
            age = ctx.age_s(f.stat().st_mtime)
        except FileNotFoundError:  # its write ended meanwhile
            continue
        kind = "partial_file" if age > ctx.partial_age_s else "in_progress"
        findings.append(Finding(kind, str(f), f"temporary file of a write, {age:.0f} s old "
                                f"(removed after {ctx.partial_age_s:.0f} s)"))
    return findings, {"products": len(rows), "product_files": n_files, "temporary_files": len(partials)}


def _check_objects(session: Session, ctx: _Ctx) -> tuple[list[Finding], dict[str, int]]:
    """The product rows and the object store compared both ways (the module docstring)."""
    store = product_store(ctx.settings)
    rows = _product_rows(session)
    claims = {pid: (att, by) for pid, att, by in session.execute(
        select(Product.id, Product.attempts, Product.claimed_by).where(Product.state == ProductState.writing))}
    objects = {o.key: o for o in store.list()}
    named: set[str] = set()
    out: list[Finding] = []
    for r in rows:
        if r.state != ProductState.written or not is_object_ref(r.path):
            continue
        row = f"product {r.id}"
        key, ql = store.key_of(r.path), store.key_of(r.quicklook_path)
        named.update(k for k in (key, ql) if k)
        if key is None:
            out.append(Finding("outside_store", r.path, f"FITS {r.path} is not in the product store {store.url}",
                               row, r.id))
            continue
        if key not in objects:
            out.append(Finding("missing_file", r.path, f"FITS object missing from the store: {r.path}", row, r.id))
            continue
        if ctx.checksums:
            import hashlib

            h = hashlib.sha256()
            for chunk in store.iter_bytes(key):
                h.update(chunk)
            ctx.bytes_hashed += objects[key].size
            if (sha := h.hexdigest()) != r.sha256:
                out.append(Finding("checksum_mismatch", r.path, f"FITS object differs from the row: SHA-256 "
                                   f"{sha[:12]}... stored, {(r.sha256 or 'none')[:12]}... in the row", row, r.id,
                                   sha256=sha))
                continue
        if ql is None or ql not in objects:
            out.append(Finding("missing_quicklook", r.quicklook_path, f"quicklook object missing: {r.quicklook_path}",
                               row, r.id))
    for key, obj in sorted(objects.items()):
        if key in named:
            continue
        ref = store.ref(key)
        who = attempt_of_key(key)
        if who is None:
            out.append(Finding("orphan_object", ref, "an object without an attempt in its key; no row names it"))
            continue
        pid, attempt, tag = who
        live = claims.get(pid)
        if live is not None and live[0] == attempt and attempt_tag(pid, attempt, live[1]).endswith(tag):
            out.append(Finding("in_progress", ref, f"object of attempt {attempt} of product {pid}, which holds "
                               "the product's claim now (its row is not yet committed)", f"product {pid}", pid))
            continue
        out.append(Finding("attempt_object", ref, f"object of attempt {attempt} of product {pid}, which the "
                           "product's row does not name (not the product)", f"product {pid}", pid))
    for key, upload in store.incomplete_uploads():
        out.append(Finding("incomplete_upload", store.ref(key), f"multipart upload {upload} never completed"))
    return out, {"product_objects": len(objects)}


def _check_registered(ctx: _Ctx, label: str, prefix: str, rows, root: Path) -> list[Finding]:
    """Frames or calibration files: each row's file present and (with checksums) unchanged."""
    out = []
    for rid, path, sha in rows:
        p = resolve_store_path(path, root)
        row = f"{label} {rid}"
        if p is None or not p.is_file():
            out.append(Finding(f"{prefix}_missing", path, f"file missing on disk: {path}", row))
        elif ctx.checksums and (got := ctx.sha(p)) != sha:
            out.append(Finding(f"{prefix}_mismatch", str(p), f"file differs from the row: SHA-256 {got[:12]}... "
                               f"on disk, {(sha or 'none')[:12]}... in the row", row, sha256=got))
    return out


def check_store(session: Session, settings: Settings, *, checksums: bool = True,
                now: dt.datetime | None = None) -> FsckReport:
    """Compare the database with the files on disk, both ways; change nothing.

    Parameters
    ----------
    session : Session
        Read only.
    settings : Settings
        ``products`` (the product store), ``raw`` and ``calibration`` (for relative frame
        and master paths), ``quarantine`` (skipped if inside the store), ``lease_s``.
    checksums : bool
        Compare the SHA-256 of every product, frame and master file with its row (reads
        every byte); ``False`` checks presence only.
    now : datetime, optional
        The clock (aware, or naive UTC); default now.

    Returns
    -------
    FsckReport
        One :class:`Finding` per inconsistency (kinds in the module docstring).
    """
    t0 = time.perf_counter()
    ctx = _Ctx(settings, checksums, now)
    findings, checked = _check_products(session, ctx)
    if settings.product_store:
        more, n = _check_objects(session, ctx)
        findings += more
        checked.update(n)
    frames = list(session.execute(select(Frame.id, Frame.path, Frame.sha256).order_by(Frame.id)))
    findings += _check_registered(ctx, "frame", "frame", frames, settings.raw)
    cals = list(session.execute(select(CalibrationFile.id, CalibrationFile.path, CalibrationFile.sha256)
                                .order_by(CalibrationFile.id)))
    findings += _check_registered(ctx, "calibration file", "calibration", cals, settings.calibration)
    checked.update(frames=len(frames), calibration_files=len(cals))
    return FsckReport(findings=findings, checked=checked, bytes_hashed=ctx.bytes_hashed,
                      seconds=time.perf_counter() - t0, checksums=checksums)


# -- repair ------------------------------------------------------------------------------------


def _quarantine(settings: Settings, path: Path, reason: str, sha: str | None = None) -> Path:
    """Move ``path`` to ``<QUARANTINE_DIR>/fsck/`` with its reason (never deleted)."""
    when = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    return quarantine(path, f"{reason}; was {path} (lstdp fsck, {when})", settings, move=True, sha=sha,
                      folder=settings.quarantine / "fsck")


def _fail_written(session: Session, settings: Settings, f: Finding, reason: str,
                  files: tuple[str | None, ...]) -> str:
    """A written product -> ``failed``; its files still on disk quarantined. Returns the action."""
    prod = session.get(Product, f.product_id)
    if prod is None or prod.state != ProductState.written:
        return f"left alone: product is {prod.state.value if prod else 'gone'} now"
    store = settings.products.resolve()
    move_product(prod, ProductState.failed, reason)
    session.flush()
    moved = []
    for p in files:
        q = resolve_store_path(p, store)
        if q is not None and q.is_file() and q.resolve().is_relative_to(store):
            moved.append(str(_quarantine(settings, q, f"product {prod.id} failed: {prod.error}",
                                         f.sha256 if str(q) == f.path else None)))
    said = "moved to failed (the next job re-plans it)"
    return said + (f"; quarantined {', '.join(moved)}" if moved else "")


def _rebuild_quicklook(session: Session, settings: Settings, f: Finding) -> str:
    """The missing quicklook of a written product made again from its FITS."""
    from pipelines.errors import FitsReadError
    from pipelines.products import read_product, write_quicklook_png

    prod = session.get(Product, f.product_id)
    if prod is None or prod.state != ProductState.written:
        return f"left alone: product is {prod.state.value if prod else 'gone'} now"
    ql = Path(f.path)
    try:
        data, dq, _ = read_product(resolve_store_path(prod.path, settings.products))
    except FitsReadError as exc:
        return _fail_written(session, settings, f, f"quicklook missing and the FITS unreadable ({exc}); "
                             "found by lstdp fsck", (prod.path,))
    write_quicklook_png(data, dq, ql, prod.frame.channel_code, tmp_dir=store_tmp_dir(settings.products))
    prod.quicklook_path = str(ql)
    return "quicklook made again from the FITS"


def _quarantine_file(session: Session, settings: Settings, ctx: _Ctx, f: Finding) -> str:
    """An orphan or unwritten file quarantined, unless a worker may be writing it."""
    p = Path(f.path)
    if not p.is_file():
        return "left alone: the file is gone"
    if f.product_id is not None:  # a file of a product row: its worker may be writing it now
        age = ctx.age_s(p.stat().st_mtime)
        if age < ctx.lease_s:
            return f"left alone: modified {age:.0f} s ago (a worker may be writing it); run fsck again later"
        prod = session.get(Product, f.product_id)
        if prod is not None:
            session.refresh(prod)
            if prod.state == ProductState.writing and ctx.age_s(prod.updated_at) < ctx.lease_s:
                return "left alone: its product is being written now"
    # a file no row names is no live write: a worker writes only for a committed row
    return f"quarantined to {_quarantine(settings, p, f.detail)}"


def _repair_one(session: Session, settings: Settings, ctx: _Ctx, f: Finding,
                store_empty: bool) -> tuple[str, bool]:
    """Repair one finding: ``(action, repaired)``."""
    if is_object_ref(f.path):
        return _repair_object(session, settings, f, store_empty)
    if f.kind == "missing_file" and store_empty:
        return (f"left alone: the product store {ctx.store} holds no product file at all; is it mounted "
                "(PRODUCT_DIR)? Failing every product would recompute them all"), False
    if f.kind == "missing_file":
        prod = session.get(Product, f.product_id)
        action = _fail_written(session, settings, f, MISSING_REASON, (prod.quicklook_path,) if prod else ())
        return action, action.startswith("moved")
    if f.kind == "checksum_mismatch":
        prod = session.get(Product, f.product_id)
        reason = (f"file differs from its SHA-256 ({(f.sha256 or '')[:12]}... on disk, "
                  f"{((prod.sha256 if prod else None) or 'none')[:12]}... in the row; found by lstdp fsck)")
        action = _fail_written(session, settings, f, reason, (prod.path, prod.quicklook_path) if prod else ())
        return action, action.startswith("moved")
    if f.kind == "missing_quicklook":
        action = _rebuild_quicklook(session, settings, f)
        return action, action.startswith(("quicklook made", "moved"))
    if f.kind in ("orphan_file", "unwritten_file"):
        action = _quarantine_file(session, settings, ctx, f)
        return action, action.startswith("quarantined")
    if f.kind == "partial_file":
        p = Path(f.path)
        try:
            if ctx.age_s(p.stat().st_mtime) <= ctx.partial_age_s:
                return "left alone: written to since the check", False
            p.unlink()
        except FileNotFoundError:
            pass
        return "removed", True
    why = {"outside_store": "reported only: move the file into the store or fix PRODUCT_DIR"}.get(
        f.kind, "reported only: restore the file from a copy" if f.problem else "")
    return why, False


def _repair_object(session: Session, settings: Settings, f: Finding, store_empty: bool) -> tuple[str, bool]:
    """Repair one finding of the object store pass: ``(action, repaired)``."""
    store = product_store(settings)
    if f.kind in ("missing_file", "checksum_mismatch"):
        if f.kind == "missing_file" and store_empty:
            return (f"left alone: the object store {store.url} holds no object at all; is PRODUCT_STORE "
                    "right? Failing every product would recompute them all"), False
        prod = session.get(Product, f.product_id)
        if prod is None or prod.state != ProductState.written or prod.path != f.path:
            return f"left alone: product is {prod.state.value if prod else 'gone'} now", False
        move_product(prod, ProductState.failed, MISSING_REASON if f.kind == "missing_file" else
                     f"object differs from its SHA-256 ({(f.sha256 or '')[:12]}... stored; found by lstdp fsck)")
        session.flush()
        gone = [k for k in (store.key_of(prod.path), store.key_of(prod.quicklook_path)) if k]
        for k in gone:  # no longer a product: what is left of it would be an attempt object
            store.delete(k)
        return "moved to failed (the next job re-plans it); its objects removed", True
    if f.kind == "attempt_object":
        key = store.key_of(f.path)
        pid, attempt, tag = attempt_of_key(key)
        prod = session.get(Product, pid)
        if prod is not None:
            session.refresh(prod)
            if store.ref(key) in (prod.path, prod.quicklook_path):
                return "left alone: its row names it now", False
            if (prod.state == ProductState.writing and prod.attempts == attempt
                    and attempt_tag(pid, attempt, prod.claimed_by).endswith(tag)):
                return "left alone: its attempt holds the claim now", False
        store.delete(key)
        return "removed (not the product)", True
    if f.kind == "incomplete_upload":
        key = store.key_of(f.path)
        upload = f.detail.split()[2]
        store.abort_upload(key, upload)
        return "aborted", True
    return ("reported only: an object no row names and no attempt wrote" if f.kind == "orphan_object"
            else "reported only"), False


def repair_store(session: Session, settings: Settings, report: FsckReport, *,
                 now: dt.datetime | None = None) -> FsckReport:
    """Repair the safe findings of ``report`` in place (the module docstring says which, and how).

    Each problem gets its ``action`` (what was done, or why nothing was) and ``repaired``.
    A failure to repair one finding (e.g. the quarantine folder not writable) is its action
    and the others go on. When the store holds no product file at all (an unmounted
    ``PRODUCT_DIR`` looks like that) no product is failed for a missing file. The caller
    commits (state moves are flushed).

    Parameters
    ----------
    session : Session
    settings : Settings
    report : FsckReport
        From :func:`check_store`; its findings are re-checked where a worker may have moved on
        (a product's state, a file's age) before anything is changed.
    now : datetime, optional
        The clock (aware, or naive UTC); default now.

    Returns
    -------
    FsckReport
        ``report``, with ``repaired`` set.
    """
    ctx = _Ctx(settings, report.checksums, now)
    store_empty = report.checked.get("product_objects" if settings.product_store else "product_files", 0) == 0
    for f in report.problems:
        if f.repaired:  # settled before the check (run_fsck's sweep of placed objects)
            continue
        try:
            f.action, f.repaired = _repair_one(session, settings, ctx, f, store_empty)
        except (OSError, StoreError, RuntimeError) as exc:
            f.action, f.repaired = f"could not repair: {exc}", False
    report.repaired = True
    return report


def run_fsck(session: Session, settings: Settings, *, repair: bool = False, checksums: bool = True,
             now: dt.datetime | None = None) -> FsckReport:
    """:func:`check_store`, then :func:`repair_store` when ``repair``; the caller commits.

    With ``repair``, the write-ahead records of placed objects are settled first, as the
    reconciler does every pass (:func:`backend.worker.placements.sweep_placements`, which
    commits as it goes): what a writer that stopped between placing and committing left is
    removed before the check looks, once its attempt's claim is no longer live."""
    swept: list[Finding] = []
    if repair:
        from backend.worker.placements import sweep_placements

        for pid, attempt, holder, ref in sweep_placements(session, settings):
            local = not is_object_ref(ref)
            kind = "attempt_object" if not local else (
                "unwritten_file" if session.get(Product, pid) is not None else "orphan_file")
            swept.append(Finding(kind, ref, f"placed by attempt {attempt} of product {pid} ({holder}), whose row "
                                 "never committed", f"product {pid}", pid,
                                 action="removed (its write-ahead record: the attempt's claim is no longer live)",
                                 repaired=True))
    report = check_store(session, settings, checksums=checksums, now=now)
    report.findings[:0] = swept
    return repair_store(session, settings, report, now=now) if repair else report
