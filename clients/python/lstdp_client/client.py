"""The HTTP client of the LST data platform API (``/api/v1``).

>>> from lstdp_client import Client
>>> c = Client("http://127.0.0.1:8000", token="lst_...")          # doctest: +SKIP
>>> flares = c.search_events(type="FL", start="2004-03-01", end="2004-03-02")  # doctest: +SKIP
>>> products = c.search_products(channel="SDI", start="2004-03-01", end="2004-03-02")  # doctest: +SKIP
>>> maps = c.maps(products, path="downloads")                     # doctest: +SKIP

Reads need no token; submitting and cancelling jobs need one (``Authorization: Bearer
lst_...``, made with ``lstdp token create``). Every error answer raises an exception of
:mod:`lstdp_client.errors` carrying the API's ``detail`` message.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import astropy.units as u
import httpx
import numpy as np
from astropy.table import QTable, Row
from astropy.time import Time

from lstdp_client.errors import LSTDPError, NotFoundError, StreamError, raise_for_response
from lstdp_client.tables import EVENT_COLUMNS, PRODUCT_COLUMNS, rows_to_qtable

__all__ = ["Client", "DEFAULT_URL", "URL_ENV", "TOKEN_ENV", "API_PREFIX", "FINAL_JOB_STATES"]

#: The server's address when neither an argument nor ``LSTDP_URL`` gives one (``lstdp serve``'s default).
DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "LSTDP_URL"
TOKEN_ENV = "LSTDP_TOKEN"
API_PREFIX = "/api/v1"
#: Job states after which a job changes no more (``backend.models.JobState``).
FINAL_JOB_STATES = frozenset({"succeeded", "failed", "cancelled"})

#: Largest page the API serves (``limit`` 1..500, ``backend/api/params.py``).
MAX_PAGE = 500

#: Parameters of ``GET /events`` that take a time, an angle [deg] or a helioprojective
#: coordinate [arcsec] (a Quantity is converted; a number is taken in that unit).
_TIME_PARAMS = ("start", "end")
_DEG_PARAMS = ("pa_min", "pa_max", "min_angular_width")
_ARCSEC_PARAMS = ("hpc_x_min", "hpc_x_max", "hpc_y_min", "hpc_y_max")
#: Paging is the client's: these are refused as filters.
_PAGING = ("limit", "offset", "cursor", "format")


def api_time(value: Any) -> str:
    """An ISO 8601 UTC time for a query: from a ``str`` (sent as given), an
    :class:`astropy.time.Time` or a :class:`datetime.datetime` (naive: UTC, as the API reads it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Time):
        return value.utc.isot + "Z"
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return value.isoformat() + "Z"
        return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"expected a time (str, datetime or astropy Time), got {type(value).__name__}")


def _number(name: str, value: Any, unit: u.Unit) -> float:
    if isinstance(value, u.Quantity):
        try:
            return float(value.to_value(unit))
        except u.UnitConversionError:
            raise ValueError(f"{name}: {value} cannot be converted to {unit}") from None
    return float(value)


def query_params(filters: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Filters as query parameters: times as ISO 8601, Quantities in the API's units,
    lists as repeated parameters (``type=["FL", "CE"]``), None dropped.

    Raises
    ------
    ValueError
        For a paging parameter (``limit``, ``offset``, ``cursor``, ``format``: the client pages)
        or a Quantity in a unit that does not convert.
    """
    out: list[tuple[str, str]] = []
    for name, value in filters.items():
        if name in _PAGING:
            raise ValueError(f"{name!r} is not a filter: the client pages through every result itself "
                             "(page_size sets the page size)")
        if value is None:
            continue
        values = value if isinstance(value, list | tuple | set) else [value]
        for v in values:
            if name in _TIME_PARAMS:
                out.append((name, api_time(v)))
            elif name in _DEG_PARAMS:
                out.append((name, repr(_number(name, v, u.deg))))
            elif name in _ARCSEC_PARAMS:
                out.append((name, repr(_number(name, v, u.arcsec))))
            elif isinstance(v, bool):
                out.append((name, "true" if v else "false"))
            else:
                out.append((name, str(v)))
    return out


def _product_items(products: Any) -> list[dict[str, Any]]:
    """``{"id", "sha256", ...}`` of products given as a QTable/Row of :meth:`Client.search_products`,
    dicts of the API or product ids."""
    if isinstance(products, Row):
        products = [products]
    if isinstance(products, int | str):
        products = [products]
    out = []
    for p in products:
        if isinstance(p, Row):
            out.append({k: p[k] for k in p.colnames if k in ("id", "sha256", "state", "fits_url")})
        elif isinstance(p, Mapping):
            out.append(dict(p))
        else:
            out.append({"id": int(p)})
    for p in out:
        sha = p.get("sha256")
        p["sha256"] = None if sha is None or np.ma.is_masked(sha) or sha == "" else str(sha)
        p["id"] = int(p["id"])
    return out


class Client:
    """A connection to the LST data platform API.

    Parameters
    ----------
    base_url : str, optional
        The server (``http://host:port``; a trailing ``/api/v1`` is accepted). Default: the
        ``LSTDP_URL`` environment variable, else :data:`DEFAULT_URL`.
    token : str, optional
        An API token (``lst_...``, from ``lstdp token create``); default ``LSTDP_TOKEN``.
        Sent as ``Authorization: Bearer <token>``; needed to submit and cancel jobs and to
        see products of private calibration sets.
    timeout : float
        Seconds per request (connect, read); streams use it for connecting only.
    transport : httpx.BaseTransport, optional
        Passed to :class:`httpx.Client` (e.g. a proxy or retry transport).
    """

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        if url.endswith(API_PREFIX):
            url = url[: -len(API_PREFIX)]
        self.base_url = url
        self.api_url = url + API_PREFIX
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "lstdp-client/0.1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout, transport=transport)

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, token={'set' if self.token else None})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def auth_headers(self) -> dict[str, str]:
        """``{"Authorization": "Bearer <token>"}``, or ``{}`` without a token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One API request (``path`` under ``/api/v1``); raises :mod:`lstdp_client.errors` for 4xx/5xx."""
        return raise_for_response(self._http.request(method, path, **kw))

    def get_json(self, path: str, params: Any = None) -> Any:
        """The decoded JSON of ``GET /api/v1<path>``."""
        return self.request("GET", path, params=params).json()

    # -- events ----------------------------------------------------------------------------------

    def iter_event_pages(self, *, page_size: int = MAX_PAGE, **filters: Any) -> Iterator[dict[str, Any]]:
        """The pages (``EventsPublic`` JSON) of ``GET /events`` with ``filters``, following
        ``next_cursor`` (keyset paging) until the last page."""
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE}, got {page_size}")
        params = query_params(filters)
        cursor = None
        while True:
            page = self.get_json("/events", params + [("limit", str(page_size))]
                                 + ([("cursor", cursor)] if cursor else []))
            yield page
            cursor = page.get("next_cursor")
            if not cursor or not page.get("items"):
                return

    def search_events(self, *, page_size: int = MAX_PAGE, **filters: Any) -> QTable:
        """Every event matching ``filters`` (all pages), as a QTable with units.

        Parameters
        ----------
        page_size : int
            Events per request (1..500).
        **filters
            The query parameters of ``GET /api/v1/events``: ``type`` (HEK code, or a list),
            ``source`` (or a list), ``start``/``end`` (str, datetime or Time; UTC),
            ``channel``, ``hpc_x_min``/``hpc_x_max``/``hpc_y_min``/``hpc_y_max`` (arcsec, or
            a Quantity), ``pa_min``/``pa_max`` and ``min_angular_width`` (deg, or a
            Quantity), ``min_goes_class``, ``min_peak_value``, ``frm_name``, ``frm_version``,
            ``noaa_ar``, ``associated_type``, ``calibration_set``, ``calibration_file``, ``sort``.

        Returns
        -------
        astropy.table.QTable
            One row per event in the API's order: ``start_time``/``peak_time``/``end_time``
            as :class:`~astropy.time.Time` (UTC, masked where unknown), ``hpc_x``/``hpc_y``
            [arcsec], ``hgs_lat``/``hgs_lon``/``position_angle``/``angular_width`` [deg],
            ``speed_km_s`` [km/s], ``goes_flux`` [W m-2] (NaN where unknown); ``meta`` holds
            ``total``, ``pages``, ``sort`` and the last page's ``coverage``.

        Raises
        ------
        ValidationError
            A filter value the API refused (its message names the parameter).
        LSTDPError
            Any other error answer.
        """
        items: list[dict[str, Any]] = []
        pages, last = 0, {}
        for page in self.iter_event_pages(page_size=page_size, **filters):
            items += page.get("items", [])
            pages += 1
            last = page
        meta = {"total": last.get("total"), "total_is_estimate": last.get("total_is_estimate"),
                "sort": last.get("sort"), "pages": pages, "coverage": last.get("coverage")}
        return rows_to_qtable(items, EVENT_COLUMNS, meta)

    def event(self, event_id: int) -> dict[str, Any]:
        """One event with its associations (``GET /events/{id}``, ``EventDetail`` JSON)."""
        return self.get_json(f"/events/{int(event_id)}")

    # -- products --------------------------------------------------------------------------------

    def iter_products(self, *, page_size: int = MAX_PAGE, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every ``ProductPublic`` of ``GET /products`` with ``filters`` (offset pages: the
        route orders by DATE-OBS, version and id)."""
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE}, got {page_size}")
        params = query_params(filters)
        offset = 0
        while True:
            page = self.get_json("/products", params + [("limit", str(page_size)), ("offset", str(offset))])
            items = page.get("items", [])
            yield from items
            offset += len(items)
            if not items or offset >= page.get("total", 0):
                return

    def search_products(self, *, page_size: int = MAX_PAGE, **filters: Any) -> QTable:
        """Every L2 product matching ``filters`` (all pages), as a QTable.

        Parameters
        ----------
        page_size : int
            Products per request (1..500).
        **filters
            The query parameters of ``GET /api/v1/products``: ``channel`` (SDI, WST, SCI-UV,
            SCI-WL), ``start``/``end`` (DATE-OBS range; str, datetime or Time, UTC),
            ``state`` (planned, writing, written, failed), ``frame_id``, ``job_id``,
            ``calibration_set`` (a set id).

        Returns
        -------
        astropy.table.QTable
            One row per product version: ``date_obs``, ``created_at``, ``updated_at`` as
            UTC :class:`~astropy.time.Time`; ``version`` (= ``calibration_set_id``),
            ``sha256`` of the FITS file, ``fits_url`` (absolute; masked unless written).
        """
        rows = []
        for p in self.iter_products(page_size=page_size, **filters):
            for k in ("fits_url", "quicklook_url"):
                if p.get(k):
                    p[k] = self.base_url + p[k]
            rows.append(p)
        return rows_to_qtable(rows, PRODUCT_COLUMNS, {"total": len(rows)})

    def product(self, product_id: int) -> dict[str, Any]:
        """One product with its header, statistics and calibration lineage (``ProductDetail``)."""
        return self.get_json(f"/products/{int(product_id)}")

    def fits_url(self, product_id: int) -> str:
        """The download URL of a product's L2 FITS file (``GET /api/v1/products/{id}/fits``)."""
        return f"{self.api_url}/products/{int(product_id)}/fits"

    def enqueue_downloads(self, products: Any, path: str | os.PathLike, downloader) -> int:
        """Add the FITS files of ``products`` to a :class:`parfive.Downloader`; returns how many.

        Files go to ``path`` (a folder, or a pattern with ``{file}``) under the server's file
        name. Each is checked against the product's SHA-256 (``checksum="sha256=..."``): an
        existing complete file is skipped, a partial one is downloaded again. The token, if
        any, travels in the downloader's session headers (:meth:`downloader`), not here.
        """
        n = 0
        for p in _product_items(products):
            kw: dict[str, Any] = {}
            if p.get("sha256"):
                kw["checksum"] = f"sha256={p['sha256']}"
            target = str(path)
            if "{file}" in target:
                folder = Path(target).parent
                kw["path"] = str(folder)
            else:
                kw["path"] = target
            downloader.enqueue_file(self.fits_url(p["id"]), **kw)
            n += 1
        return n

    def downloader(self, *, max_conn: int = 5, progress: bool = True, overwrite: bool = False):
        """A :class:`parfive.Downloader` whose session sends this client's token (if any), so
        that products of a private calibration set download too (also for ``Fido.fetch(...,
        downloader=client.downloader())``)."""
        import parfive
        from parfive import Downloader, SessionConfig

        headers = {"User-Agent": f"lstdp-client/0.1 parfive/{parfive.__version__}", **self.auth_headers}
        return Downloader(max_conn=max_conn, progress=progress, overwrite=overwrite,
                          config=SessionConfig(headers=headers))

    def download(self, products: Any, path: str | os.PathLike = ".", *, max_conn: int = 5, progress: bool = True,
                 overwrite: bool = False, retries: int = 1, downloader=None):
        """Download the L2 FITS files of ``products`` in parallel (parfive), with progress bars.

        Parameters
        ----------
        products : QTable, Row, iterable of dict or of int
            Rows of :meth:`search_products`, ``ProductPublic`` dicts, or product ids (ids
            alone carry no checksum: an existing file of the same name is kept as is).
        path : str or path-like
            Download folder (created if missing).
        max_conn : int
            Parallel connections.
        progress : bool
            Show parfive's progress bars.
        overwrite : bool
            False (default) resumes: a file already there whose SHA-256 matches the
            product's is not downloaded again; a partial or corrupt one is.
        retries : int
            Times the failed downloads are tried again (``Downloader.retry``).
        downloader : parfive.Downloader, optional
            Use this one instead of a new one.

        Returns
        -------
        parfive.Results
            The paths of the files (a list of str); ``.errors`` lists the downloads that failed.
        """
        from parfive import Results

        if "{" not in str(path):  # a folder (a pattern's folders are made by parfive per file)
            Path(path).mkdir(parents=True, exist_ok=True)
        items = _product_items(products)
        dl = downloader or self.downloader(max_conn=max_conn, progress=progress, overwrite=overwrite)
        self.enqueue_downloads(items, path, dl)
        results = dl.download()
        by_url = {self.fits_url(p["id"]): p for p in items}
        for _ in range(max(0, retries)):
            if not results.errors:
                break
            # again with their checksums and token (Downloader.retry re-queues the URL alone)
            failed = [by_url[e.url] for e in results.errors if e.url in by_url]
            again = self.downloader(max_conn=max_conn, progress=progress, overwrite=overwrite)
            self.enqueue_downloads(failed, path, again)
            more = again.download()
            merged = Results(list(results) + list(more), errors=list(more.errors),
                             urls=list(results.urls) + list(more.urls))
            results = merged
        return results

    def maps(self, products: Any, path: str | os.PathLike = ".", **download_kw: Any) -> list:
        """The products as :class:`sunpy.map.GenericMap` objects (downloaded first, see :meth:`download`).

        Returns
        -------
        list of sunpy.map.GenericMap
            One per file, in the order of ``products``, opened by :func:`lstdp_client.open_l2`:
            the data with ``uncertainty`` (the ``UNCERT`` image) and ``mask`` (``DQ != 0`` or
            not finite) attached.

        Raises
        ------
        LSTDPError
            When a download failed (its URL and parfive's reason in the message).
        """
        from lstdp_client.l2 import open_l2

        items = _product_items(products)
        results = self.download(items, path, **download_kw)
        if results.errors:
            e = results.errors[0]
            raise LSTDPError(f"{len(results.errors)} download(s) failed; first: {e.url}: {e.exception}")
        by_url = dict(zip(results.urls, results, strict=False)) if getattr(results, "urls", None) else {}
        files = [by_url.get(self.fits_url(p["id"])) for p in items]
        if any(f is None for f in files):
            files = list(results)
        return [open_l2(f) for f in files]

    # -- jobs ------------------------------------------------------------------------------------

    def submit_job(self, channels: str | Iterable[str], start: Any, end: Any, *,
                   pinned_calibrations: Mapping[str, int] | None = None, options: Mapping[str, Any] | None = None,
                   webhook_url: str | None = None) -> dict[str, Any]:
        """Submit a recalibration job (``POST /jobs``; token with scope ``jobs:submit``).

        Parameters
        ----------
        channels : str or list of str
            LST channels (SDI, WST, SCI-UV, SCI-WL).
        start, end : str, datetime or Time
            DATE-OBS range (UTC).
        pinned_calibrations : dict, optional
            Calibration kind (dark, flat, ...) to version.
        options : dict, optional
            Calibration options (``GET /api/v1/jobs`` docs list them with their limits).
        webhook_url : str, optional
            POSTed a signed ``job.ended`` message when the job ends.

        Returns
        -------
        dict
            The job (``JobCreatedPublic``: id, state, total, queue position...).

        Raises
        ------
        AuthenticationError, PermissionDeniedError, ValidationError, RateLimitedError, ServerError
        """
        body: dict[str, Any] = {"channels": [channels] if isinstance(channels, str) else list(channels),
                                "start": api_time(start), "end": api_time(end)}
        if pinned_calibrations:
            body["pinned_calibrations"] = dict(pinned_calibrations)
        if options:
            body["options"] = dict(options)
        if webhook_url:
            body["webhook_url"] = webhook_url
        return self.request("POST", "/jobs", json=body).json()

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's state and progress (``GET /jobs/{id}``)."""
        return self.get_json(f"/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job at the next frame boundary (``POST /jobs/{id}/cancel``; scope ``jobs:cancel``).

        Returns the job: ``state`` is ``cancelled`` when it ended at once, else it still
        runs with ``cancel_requested_at`` set (follow it with :meth:`follow_job`).

        Raises
        ------
        ConflictError
            409: the job had already ended.
        """
        return self.request("POST", f"/jobs/{job_id}/cancel").json()

    def follow_job(self, job_id: str, *, timeout: float | None = None, reconnects: int = 5) -> Iterator[dict[str, Any]]:
        """The progress of a job as it happens: the server-sent events of ``GET /jobs/{id}/events``.

        Yields one dict per ``progress`` event (id, state, total, done, failed, skipped,
        cancelled, progress fraction 0..1, error) and, last, the ``end`` event's, each with
        ``"event"`` set to ``"progress"`` or ``"end"``. A dropped stream (or the server's
        ``error`` event, "reconnecting") is resumed with ``Last-Event-ID``, as a browser's
        ``EventSource`` does, up to ``reconnects`` times in a row.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait in all; None waits until the job ends.

        Raises
        ------
        NotFoundError
            No such job (or it was deleted while followed).
        StreamError
            The stream could not be resumed, or ``timeout`` passed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id: str | None = None
        retry_s, failures = 3.0, 0
        while True:
            headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_id} if last_id else {})}
            read_timeout = None if deadline is None else max(1.0, deadline - time.monotonic())
            try:
                with self._http.stream("GET", f"/jobs/{job_id}/events", headers=headers,
                                       timeout=httpx.Timeout(self.timeout, read=read_timeout)) as r:
                    raise_for_response(r)
                    for kind, eid, data, retry in _sse_events(r.iter_lines()):
                        if retry is not None:
                            retry_s = retry / 1000.0
                        if kind is None:
                            continue
                        if eid:
                            last_id = eid
                        if kind == "error":
                            detail = str((data or {}).get("detail", "error event"))
                            if "no longer exists" in detail:
                                raise NotFoundError(detail, status=404, url=str(r.request.url))
                            raise StreamError(detail)
                        if kind in ("progress", "end"):
                            failures = 0
                            yield {"event": kind, **(data or {})}
                            if kind == "end":
                                return
                    raise StreamError("the stream closed before its end event")
            except (StreamError, httpx.TransportError) as exc:
                failures += 1
                if failures > reconnects or (deadline is not None and time.monotonic() >= deadline):
                    raise StreamError(f"job {job_id}: progress stream lost ({exc}); gave up after "
                                      f"{failures} tries") from exc
                time.sleep(min(retry_s, 10.0))

    def wait_job(self, job_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Follow the job until it ends; returns its final state (``GET /jobs/{id}``)."""
        for _ in self.follow_job(job_id, timeout=timeout):
            pass
        return self.job(job_id)


def _sse_events(lines: Iterable[str]) -> Iterator[tuple[str | None, str | None, Any, int | None]]:
    """``(event, id, data, retry)`` of a ``text/event-stream`` (WHATWG HTML, "server-sent
    events": fields ``event``, ``id``, ``data`` (lines joined), ``retry``; ``:`` comments
    ignored; an event ends at a blank line). ``data`` is decoded as JSON when it parses."""
    kind = eid = None
    data: list[str] = []
    retry: int | None = None
    for line in lines:
        if line == "":
            if data or kind or retry is not None:
                text = "\n".join(data)
                try:
                    payload = json.loads(text) if text else None
                except ValueError:
                    payload = text
                yield (kind or ("message" if data else None)), eid, payload, retry
            kind, data, retry = None, [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            eid = value
        elif field == "retry" and value.isdigit():
            retry = int(value)
