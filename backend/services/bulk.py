"""Bulk download of L2 products: a streamed tar archive with a manifest, or a shell script.

What is downloaded is a list of products chosen by a search (:func:`search_products`: the
filters of ``GET /products``) or by an event (:func:`event_products`: the products linked to
it and the newest product of every frame in its time window). Each product becomes an
:class:`ArchiveEntry`: the file to send, or the reason there is none (not written, no file
in the product store...). A product without a file is never dropped silently: the
manifest lists it with ``status: "missing"`` and the reason.

The archive (:func:`stream_tar`) is a POSIX tar (pax headers) written member by member as
its bytes are produced: the tar headers are made with :class:`tarfile.TarInfo`, each file
is read in chunks of :data:`CHUNK_BYTES` and sent as it is read, so the memory used does
not depend on the size of the archive. ``tar.gz`` passes the same bytes through zlib in
gzip framing; ``zip`` writes a ZIP archive instead (stored members, data descriptors:
:mod:`zipfile` on a stream it cannot seek). The SHA-256 and size of each file are those
of the bytes actually sent (hashed while sending); they are compared with the checksum stored at writing
(``Product.sha256``) and the manifest says whether they agree. Because the checksums are
known only once the files are sent, the manifest comes last: ``MANIFEST.json`` (every
product, sent or missing) and ``SHA256SUMS`` (``sha256sum -c SHA256SUMS`` checks the
extracted files).

The script (:func:`download_script`) fetches the same files one per line from
``GET /api/v1/products/{id}/fits`` with curl (wget when curl is absent) and checks them
with ``sha256sum -c`` against the stored checksums.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shlex
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload, selectinload

from backend import __version__
from backend.models import Event, Frame, Product, ProductState
from backend.services import products as products_service
from backend.store import StoreError, is_object_ref, product_name, product_store
from pipelines.errors import DataError
from pipelines.utc import as_utc

__all__ = [
    "MAX_ARCHIVE_FILES",
    "CHUNK_BYTES",
    "ArchiveTooLarge",
    "ArchiveEntry",
    "ProductSelection",
    "search_products",
    "event_products",
    "archive_entries",
    "stream_tar",
    "manifest",
    "download_script",
]

#: Most products one archive or script may hold: a larger search is refused (422) with its
#: count, to be narrowed (DATE-OBS range, channel) or paged with ``limit``/``offset``. 500 SDI
#: products of 4608^2 float32 with DQ are about 50 GB: a day of one channel at full cadence.
MAX_ARCHIVE_FILES = 500
#: Bytes read from a product file and sent at a time [bytes].
CHUNK_BYTES = 1 << 20
_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # 10240: tar(1) pads an archive to whole records


class ArchiveTooLarge(DataError):
    """A selection of more products than an archive may hold (:data:`MAX_ARCHIVE_FILES`)."""


@dataclass
class ArchiveEntry:
    """One product of a bulk download.

    Attributes
    ----------
    product_id, frame_id : int
    channel : str
    date_obs : str
        DATE-OBS of the frame, ISO 8601 UTC.
    version : int
        Product version (one per calibration set of the frame).
    state : str
        planned, writing, written or failed.
    software_version, calibration_key : str
    calibrations : list of dict
        The calibration files the product was made with: ``id``, ``kind``, ``version``.
    job_id : str or None
        The job that last planned it.
    name : str
        Member name in the archive and file name of the script: ``<channel>/<file name>``.
    stored_sha256 : str or None
        SHA-256 recorded when the file was written.
    path : Path or None
        The file in the product store; None when missing (``reason`` says why).
    reason : str or None
        Why there is no file to send.
    sha256, size : str or None, int or None
        Of the bytes sent (filled while streaming).
    """

    product_id: int
    frame_id: int
    channel: str
    date_obs: str
    version: int
    state: str
    software_version: str
    calibration_key: str
    calibrations: list[dict[str, Any]]
    job_id: str | None
    name: str
    stored_sha256: str | None
    path: Path | None = None
    reason: str | None = None
    sha256: str | None = None
    size: int | None = None
    status: str = "pending"
    #: the object's URL when the product store is an object store (``path`` is then only
    #: a name; the bytes are fetched when the entry is reached, :func:`_open_entry`)
    object_ref: str | None = None

    def manifest_row(self) -> dict[str, Any]:
        """The entry as a ``MANIFEST.json`` row (JSON-ready; the store path is not shown)."""
        row = asdict(self)
        row.pop("path")
        row["sha256_matches_stored"] = (None if self.sha256 is None or self.stored_sha256 is None
                                        else self.sha256 == self.stored_sha256)
        return row


@dataclass
class ProductSelection:
    """Products chosen for a bulk download, and what chose them.

    Attributes
    ----------
    products : list of Product
        Ordered by DATE-OBS, version, id; frame and calibration files loaded.
    total : int
        Products matching the query, all pages.
    query : dict
        The query, JSON-ready (written into the manifest).
    """

    products: list[Product]
    total: int
    query: dict[str, Any] = field(default_factory=dict)


def _check_count(total: int, limit: int | None, offset: int, what: str) -> None:
    if limit is None and total - offset > MAX_ARCHIVE_FILES:
        raise ArchiveTooLarge(
            f"{what} matches {total - offset} products; an archive holds at most {MAX_ARCHIVE_FILES}: narrow the "
            f"search (DATE-OBS range, channel, state) or take it in parts with limit (at most "
            f"{MAX_ARCHIVE_FILES}) and offset")


def _loaded(stmt):
    return stmt.options(joinedload(Product.frame), selectinload(Product.calibration_files))


def search_products(
    session: Session,
    *,
    channel: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    state: ProductState | None = ProductState.written,
    frame_id: int | None = None,
    job_id: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    conditions: tuple = (),
) -> ProductSelection:
    """The products of a search with the filters of ``GET /products`` (every version), and
    further SQL ``conditions`` on products (who may see them:
    :func:`backend.services.set_access.product_condition`).

    Parameters
    ----------
    channel, start, end, state, frame_id, job_id
        As :func:`backend.services.products.list_products` (``start``/``end``: aware UTC
        bounds on DATE-OBS, inclusive). ``state`` defaults to written (the products that
        have a file); ``None`` takes every state (those without a file are listed missing).
    limit : int, optional
        At most this many (1..:data:`MAX_ARCHIVE_FILES`); without it the whole search,
        refused when larger than :data:`MAX_ARCHIVE_FILES`.
    offset : int
        Products skipped first (paging through a large search with ``limit``).

    Raises
    ------
    ArchiveTooLarge
        The search matches more than :data:`MAX_ARCHIVE_FILES` products and no ``limit``
        was given (the message says the count and the limit).
    """
    kw = dict(channel=channel, start=start, end=end, state=state, frame_id=frame_id, job_id=job_id)
    total = session.scalar(products_service._filtered(select(func.count(Product.id)).join(Product.frame), **kw)
                           .where(*conditions)) or 0
    _check_count(total, limit, offset, "the search")
    stmt = (_loaded(products_service._filtered(select(Product).join(Product.frame), **kw).where(*conditions))
            .order_by(Frame.date_obs, Product.version, Product.id)
            .limit(limit or MAX_ARCHIVE_FILES).offset(offset))
    query = {k: (v.isoformat() if isinstance(v, dt.datetime) else getattr(v, "value", v))
             for k, v in {**kw, "limit": limit, "offset": offset or None}.items() if v is not None}
    return ProductSelection(list(session.scalars(stmt).unique()), total, query)


def event_products(session: Session, event: Event, *, margin: dt.timedelta = dt.timedelta(minutes=30),
                   linked_only: bool = False) -> ProductSelection:
    """The products of an event: those linked to it (``event_products``, any version) and,
    unless ``linked_only``, the newest written product of every frame with DATE-OBS in
    the event's window widened by ``margin`` (:func:`backend.services.products.event_window`).

    Raises
    ------
    ArchiveTooLarge
        More than :data:`MAX_ARCHIVE_FILES` products (narrow ``margin`` or take ``linked_only``).
    """
    ids = set(products_service.product_ids_for_event(session, event.id))
    start, end = products_service.event_window(event, margin)
    if not linked_only:
        window = products_service.latest_products_in_window(session, start, end, limit=MAX_ARCHIVE_FILES + 1)
        ids.update(p.id for p in window)
    query: dict[str, Any] = {"event_id": event.id, "linked_only": linked_only}
    if not linked_only:
        query.update(window_start=start.isoformat(), window_end=end.isoformat(),
                     margin_min=margin.total_seconds() / 60)
    if len(ids) > MAX_ARCHIVE_FILES:
        raise ArchiveTooLarge(
            f"event {event.id} has {len(ids)}{'+' if len(ids) > MAX_ARCHIVE_FILES + 1 else ''} products in "
            f"[{start:%Y-%m-%dT%H:%M:%SZ}, {end:%Y-%m-%dT%H:%M:%SZ}]; an archive holds at most "
            f"{MAX_ARCHIVE_FILES}: use a smaller margin or linked_only=true")
    rows = list(session.scalars(_loaded(select(Product).join(Product.frame).where(Product.id.in_(ids)))
                                .order_by(Frame.date_obs, Product.version, Product.id)).unique()) if ids else []
    return ProductSelection(rows, len(rows), query)


def _missing_reason(p: Product, root: Path) -> tuple[Path | None, str | None]:
    """The file of ``p`` to send, or why there is none."""
    if p.state != ProductState.written:
        why = f"product is {p.state.value}, its file is not written"
        return None, why + (f" ({p.error.splitlines()[0][:300]})" if p.error else "")
    if not p.path:
        return None, "the product row names no file"
    if is_object_ref(p.path):  # an object store: present now, fetched when its turn comes
        store = product_store()
        key = store.key_of(p.path)
        if key is None or store.head(key) is None:
            return None, f"object missing from the product store: {p.path}"
        return Path(product_name(key)), None
    served = products_service.served_store_path(p.path, root)
    if served is not None:
        return served, None
    resolved = products_service.resolve_store_path(p.path, root)
    if not resolved.resolve().is_relative_to(Path(root).resolve()):
        return None, "its stored path lies outside the product store (never served)"
    return None, f"file missing from the product store: {p.path}"


def archive_entries(products: list[Product], root: Path) -> list[ArchiveEntry]:
    """One :class:`ArchiveEntry` per product, each with its file or the reason it has none.

    Member names are ``<channel>/<file name>``; a file name met twice is prefixed with the
    product id (``<channel>/p<id>_<file name>``) so no member hides another.
    """
    out: list[ArchiveEntry] = []
    seen: set[str] = set()
    for p in products:
        path, reason = _missing_reason(p, root)
        base = (product_name(p.path) if is_object_ref(p.path) else PurePosixPath(p.path.replace("\\", "/")).name
                if p.path else f"product_{p.id}.fits")
        name = f"{p.frame.channel_code}/{base}"
        if name in seen:
            name = f"{p.frame.channel_code}/p{p.id}_{base}"
        seen.add(name)
        out.append(ArchiveEntry(
            product_id=p.id, frame_id=p.frame_id, channel=p.frame.channel_code,
            date_obs=as_utc(p.frame.date_obs).isoformat().replace("+00:00", "Z"), version=p.version,
            state=p.state.value, software_version=p.software_version, calibration_key=p.calibration_key,
            calibrations=[{"id": c.id, "kind": c.kind.value, "version": c.version}
                          for c in sorted(p.calibration_files, key=lambda c: (c.kind.value, c.id))],
            job_id=p.job_id, name=name, stored_sha256=p.sha256, path=path, reason=reason,
            status="missing" if path is None else "pending",
            object_ref=p.path if path is not None and is_object_ref(p.path) else None))
    return out


def manifest(entries: list[ArchiveEntry], query: dict[str, Any], *, total: int, created: dt.datetime) -> dict[str, Any]:
    """The ``MANIFEST.json`` document of a bulk download (JSON-ready).

    ``products`` has one row per entry (:meth:`ArchiveEntry.manifest_row`): ``status`` is
    ``sent`` (in the archive, with the ``sha256``/``size`` of the bytes sent and whether
    they match the stored checksum), ``missing`` (not in the archive; ``reason``) or
    ``damaged`` (sent, but the file changed while it was read; ``reason``).
    """
    return {
        "title": "LST L2 products (ASO-S Lyman-alpha Solar Telescope)",
        "created": created.isoformat().replace("+00:00", "Z"),
        "software_version": __version__,
        "query": query,
        "total_matching": total,
        "files": sum(e.status != "missing" for e in entries),
        "missing": sum(e.status == "missing" for e in entries),
        "checksum": "sha256 of the bytes sent, compared with the checksum stored when the file was written",
        "products": [e.manifest_row() for e in entries],
    }


def _open_entry(e: ArchiveEntry):
    """The open file of an entry: the product store's file, or, for an object, its copy in the
    bounded local cache fetched now and checked against the row's SHA-256
    (:meth:`backend.store.ProductStore.local_file`). A store fault is an ``OSError`` here (the
    entry is then ``missing`` with the reason, and the archive goes on)."""
    if e.object_ref is None:
        return open(e.path, "rb")  # noqa: SIM115 - the caller closes it
    store = product_store()
    try:
        return open(store.local_file(store.key_of(e.object_ref), e.stored_sha256), "rb")  # noqa: SIM115
    except StoreError as exc:
        raise OSError(str(exc)) from exc


def _member(name: str, size: int, mtime: float) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.type = size, int(mtime), 0o644, tarfile.REGTYPE
    ti.uname = ti.gname = "lst"
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _tar_bytes(entries: list[ArchiveEntry], query: dict[str, Any], total: int,
               created: dt.datetime, chunk: int) -> Iterator[bytes]:
    written = 0
    for e in entries:
        if e.path is None:
            continue
        try:
            f = _open_entry(e)  # held open so a rename (or the cache's eviction) cannot swap it
        except OSError as exc:
            e.path, e.status, e.reason = None, "missing", f"file could not be opened: {exc.strerror or exc}"
            continue
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size
            header = _member(e.name, size, st.st_mtime)
            written += len(header)
            yield header
            h, sent = hashlib.sha256(), 0
            while sent < size:
                buf = f.read(min(chunk, size - sent))
                if not buf:  # the file shrank while it was read: keep the archive whole
                    pad = b"\0" * (size - sent)
                    e.status = "damaged"
                    e.reason = f"file shrank to {sent} of {size} bytes while it was sent; the rest is NUL-padded"
                    h.update(pad)
                    sent += len(pad)
                    yield pad
                    break
                h.update(buf)
                sent += len(buf)
                yield buf
            written += size
            e.sha256, e.size = h.hexdigest(), size
            if e.status == "pending":
                e.status = "sent"
            if (pad := -size % _BLOCK):
                written += pad
                yield b"\0" * pad
    doc = json.dumps(manifest(entries, query, total=total, created=created), indent=1).encode()
    sums = "".join(f"{e.sha256}  {e.name}\n" for e in entries if e.sha256).encode()
    for name, data in (("MANIFEST.json", doc), ("SHA256SUMS", sums)):
        block = _member(name, len(data), created.timestamp()) + data + b"\0" * (-len(data) % _BLOCK)
        written += len(block)
        yield block
    end = b"\0" * (2 * _BLOCK)  # end-of-archive: two zero blocks, then whole records
    written += len(end)
    yield end + b"\0" * (-written % _RECORD)


class _Sink:
    """A write-only file for :class:`zipfile.ZipFile` (no ``seek``: it then writes data
    descriptors after each member) whose bytes are taken out as they come."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, b) -> int:
        self._parts.append(bytes(b))
        return len(b)

    def flush(self) -> None:
        pass

    def drain(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def _zip_time(ts: float) -> tuple[int, int, int, int, int, int]:
    t = time.gmtime(max(ts, 315532800))  # ZIP times start in 1980 (UTC, as the manifest)
    return t[:6]


def _zip_bytes(entries: list[ArchiveEntry], query: dict[str, Any], total: int,
               created: dt.datetime, chunk: int) -> Iterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for e in entries:
            if e.path is None:
                continue
            try:
                f = _open_entry(e)  # closed below
            except OSError as exc:
                e.path, e.status, e.reason = None, "missing", f"file could not be opened: {exc.strerror or exc}"
                continue
            with f:
                st = os.fstat(f.fileno())
                info = zipfile.ZipInfo(e.name, date_time=_zip_time(st.st_mtime))
                info.compress_type, info.file_size = zipfile.ZIP_STORED, st.st_size
                h, sent = hashlib.sha256(), 0
                with zf.open(info, "w", force_zip64=st.st_size >= 1 << 31) as w:
                    yield sink.drain()
                    for buf in iter(lambda: f.read(chunk), b""):
                        h.update(buf)
                        w.write(buf)
                        sent += len(buf)
                        yield sink.drain()
                if sent != st.st_size:
                    e.status = "damaged"
                    e.reason = f"file changed size while it was sent: {sent} bytes sent, {st.st_size} at the start"
                e.sha256, e.size = h.hexdigest(), sent
                if e.status == "pending":
                    e.status = "sent"
            yield sink.drain()
        doc = json.dumps(manifest(entries, query, total=total, created=created), indent=1).encode()
        sums = "".join(f"{e.sha256}  {e.name}\n" for e in entries if e.sha256).encode()
        for name, data in (("MANIFEST.json", doc), ("SHA256SUMS", sums)):
            zf.writestr(zipfile.ZipInfo(name, date_time=_zip_time(created.timestamp())), data)
    yield sink.drain()


def stream_tar(entries: list[ArchiveEntry], query: dict[str, Any], *, total: int,
               compression: Literal["none", "gzip", "zip"] = "none", created: dt.datetime | None = None,
               chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The archive of ``entries``, produced piece by piece (a generator of bytes).

    Parameters
    ----------
    entries : list of ArchiveEntry
        Updated in place as the files are sent (``sha256``, ``size``, ``status``).
    query : dict
        Written into the manifest.
    total : int
        Products matching the query (written into the manifest).
    compression : {"none", "gzip", "zip"}
        ``gzip``: a ``.tar.gz`` (zlib, level 6); ``zip``: a ZIP archive instead of a tar
        (members stored, ZIP64 where needed, data descriptors after each member as it is
        streamed), for those whose tools read ZIP only.
    created : datetime, optional
        Time stamp of the manifest (default: now, UTC).
    chunk : int
        Bytes read and sent at a time.

    Yields
    ------
    bytes
        Pieces of the archive: tar headers, file chunks of at most ``chunk`` bytes, the
        manifest. At most about ``chunk`` bytes are held at once (plus zlib's window).
    """
    created = created or dt.datetime.now(dt.UTC)
    if compression == "zip":
        yield from (b for b in _zip_bytes(entries, query, total, created, chunk) if b)
        return
    pieces = _tar_bytes(entries, query, total, created, chunk)
    if compression == "none":
        yield from pieces
        return
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    for piece in pieces:
        if (out := z.compress(piece)):
            yield out
    yield z.flush()


def _stored_or_computed_sha256(e: ArchiveEntry) -> str | None:
    if e.stored_sha256:
        return e.stored_sha256
    if e.path is None:
        return None
    h = hashlib.sha256()
    with open(e.path, "rb") as f:
        for buf in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(buf)
    return h.hexdigest()


def download_script(entries: list[ArchiveEntry], base_url: str, *, query: dict[str, Any], total: int,
                    created: dt.datetime | None = None) -> str:
    """A POSIX shell script that downloads the files of ``entries`` and checks them.

    One ``fetch <name> <url>`` line per file (curl, or wget where curl is absent; the URL is
    ``<base_url>/api/v1/products/<id>/fits``), a comment line per missing product with its
    reason, then ``sha256sum -c`` against the checksums stored at writing (computed from the
    file where none was stored). ``base_url`` is the API's origin (``http://host:port``).
    """
    created = created or dt.datetime.now(dt.UTC)
    base = base_url.rstrip("/")
    files = [e for e in entries if e.path is not None]
    lines = [
        "#!/bin/sh",
        "# LST L2 products (ASO-S Lyman-alpha Solar Telescope): download and check",
        f"# generated {created.isoformat(timespec='seconds').replace('+00:00', 'Z')} by the LST data platform "
        f"{__version__}",
        f"# query: {json.dumps(query, sort_keys=True)}",
        f"# {len(files)} files, {len(entries) - len(files)} missing, {total} products match",
        "# run: sh download.sh   (needs curl or wget, and sha256sum from GNU coreutils)",
        "set -eu",
        "fetch() {  # fetch NAME URL",
        '  mkdir -p "$(dirname "$1")"',
        "  if command -v curl >/dev/null 2>&1; then",
        '    curl -fsSL --retry 3 -o "$1" "$2"',
        "  else",
        '    wget -q --tries=3 -O "$1" "$2"',
        "  fi",
        "}",
    ]
    sums = []
    for e in entries:
        if e.path is None:
            lines.append(f"# missing: product {e.product_id} ({e.channel}, DATE-OBS {e.date_obs}): {e.reason}")
            continue
        lines.append(f"fetch {shlex.quote(e.name)} {shlex.quote(f'{base}/api/v1/products/{e.product_id}/fits')}")
        sums.append(f"{_stored_or_computed_sha256(e)}  {e.name}")
    lines += ["sha256sum -c <<'SHA256SUMS'", *sums, "SHA256SUMS", ""]
    return "\n".join(lines)
