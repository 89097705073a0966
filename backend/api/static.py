"""``/static``: the event browser's files, compressed and cached by version.

Templates link static files with :func:`backend.api.pages.templating.static_url`:
``/static/<path>?v=<first 12 hex digits of the file's SHA-256>``. :class:`VersionedStaticFiles`

* answers a request whose ``v`` is the file's current digest with
  ``Cache-Control: public, max-age=31536000, immutable`` (a changed file has another URL),
  and any other (no ``v``, or an old one) with :data:`SHORT_CACHE` and an ``ETag``, so a
  browser revalidates it (``If-None-Match`` -> 304);
* sends text files (JavaScript, CSS, JSON, SVG, HTML, plain text) of at least
  :data:`MIN_GZIP_BYTES` gzip-compressed to a client that accepts it (``Accept-Encoding``),
  with ``Vary: Accept-Encoding``. Each file is compressed once (level 9, in a worker
  thread) and kept in memory while its size and modification time stay the same: the
  vendored plotly-basic.min.js goes from 1.19 MB to about 0.4 MB.

The ETag is the content digest (``"<digest>"``, ``"<digest>-gzip"`` for the compressed
body), the same for every process serving the same file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import threading
from email.utils import formatdate

import anyio
from starlette.datastructures import Headers, QueryParams
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.responses import FileResponse, Response
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Scope

__all__ = ["VersionedStaticFiles", "IMMUTABLE", "SHORT_CACHE", "MIN_GZIP_BYTES", "file_digest", "UNCOMPRESSED_TYPES",
           "add_text_compression", "TextCompressionMiddleware"]

#: Cache-Control of a versioned URL (RFC 8246 ``immutable``; one year, the longest RFC 9111 advises).
IMMUTABLE = "public, max-age=31536000, immutable"
#: Cache-Control of an unversioned URL: kept 5 min, then revalidated by its ETag.
SHORT_CACHE = "public, max-age=300"
#: Files smaller than this are sent as they are (gzip's header and a round trip cost more).
MIN_GZIP_BYTES = 1024
_COMPRESSIBLE = {".js", ".css", ".json", ".svg", ".html", ".txt", ".map", ".md"}

_lock = threading.Lock()
_digests: dict[tuple[str, int, int], str] = {}
_gzipped: dict[tuple[str, int, int], bytes] = {}


def _key(path: str, st: os.stat_result) -> tuple[str, int, int]:
    return (path, st.st_mtime_ns, st.st_size)


def file_digest(path: str, st: os.stat_result) -> str:
    """First 12 hex digits of the SHA-256 of the file (as ``static_url`` computes it), cached
    while its size and modification time are unchanged."""
    key = _key(path, st)
    with _lock:
        if key in _digests:
            return _digests[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for buf in iter(lambda: f.read(1 << 20), b""):
            h.update(buf)
    digest = h.hexdigest()[:12]
    with _lock:
        for k in [k for k in _digests if k[0] == path]:  # an older version of the file
            _digests.pop(k, None)
            _gzipped.pop(k, None)
        _digests[key] = digest
    return digest


def _gzip_body(path: str, st: os.stat_result) -> bytes:
    key = _key(path, st)
    with _lock:
        if key in _gzipped:
            return _gzipped[key]
    with open(path, "rb") as f:
        body = gzip.compress(f.read(), compresslevel=9, mtime=0)
    with _lock:
        _gzipped[key] = body
    return body


def _accepts_gzip(headers: Headers) -> bool:
    for part in headers.get("accept-encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
            try:
                return float(q) > 0
            except ValueError:
                return True
    return False


class VersionedStaticFiles(StaticFiles):
    """:class:`starlette.staticfiles.StaticFiles` with versioned caching and gzip (module docstring)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if scope["method"] in ("GET", "HEAD"):
            try:
                full_path, st = await anyio.to_thread.run_sync(self.lookup_path, path)
            except (OSError, ValueError):
                full_path, st = "", None  # the parent answers these (401, 404) as it does
            if st is not None and stat.S_ISREG(st.st_mode):
                return await anyio.to_thread.run_sync(self._respond, str(full_path), st, scope)
        return await super().get_response(path, scope)

    def _respond(self, full_path: str, st: os.stat_result, scope: Scope) -> Response:
        request = Headers(scope=scope)
        digest = file_digest(full_path, st)
        versioned = QueryParams(scope.get("query_string", b"")).get("v") == digest
        cache = IMMUTABLE if versioned else SHORT_CACHE
        compress = (os.path.splitext(full_path)[1].lower() in _COMPRESSIBLE and st.st_size >= MIN_GZIP_BYTES
                    and _accepts_gzip(request))
        etag = f'"{digest}-gzip"' if compress else f'"{digest}"'
        headers = {"cache-control": cache, "etag": etag, "vary": "Accept-Encoding",
                   "last-modified": formatdate(st.st_mtime, usegmt=True)}
        if etag in [t.strip().removeprefix("W/") for t in request.get("if-none-match", "").split(",")]:
            return NotModifiedResponse(Headers(headers))
        if compress:
            media_type = FileResponse(full_path, stat_result=st).media_type
            return Response(_gzip_body(full_path, st), media_type=media_type,
                            headers={**headers, "content-encoding": "gzip"})
        response = FileResponse(full_path, stat_result=st)
        for k, v in headers.items():
            response.headers[k] = v
        return response


#: Responses never compressed on the fly: those Starlette leaves alone (images, archives...)
#: and the FITS files and product archives, binary float data that gzip hardly shrinks and
#: whose streaming it would slow (a tar.gz is asked for with ``format=tar.gz``).
UNCOMPRESSED_TYPES = (*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/fits", "application/x-tar",
                      "application/octet-stream")


def add_text_compression(app) -> None:
    """gzip the API's and the pages' text answers (JSON, HTML, CSV, VOTable, Plotly figures) of
    at least 1 kB for clients that accept it (Starlette's ``GZipMiddleware``, level 6), never
    the binary downloads (:data:`UNCOMPRESSED_TYPES`) nor the static files (compressed once by
    :class:`VersionedStaticFiles`: they carry ``Content-Encoding`` already)."""
    app.add_middleware(TextCompressionMiddleware)


class TextCompressionMiddleware:
    """Starlette's ``GZipMiddleware`` for the requests that accept gzip (``q`` > 0: Starlette
    only looks for the word), outside ``/static`` (compressed by :class:`VersionedStaticFiles`)."""

    def __init__(self, app) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=MIN_GZIP_BYTES, compresslevel=6,
                                   exclude_content_types=UNCOMPRESSED_TYPES)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/static/") \
                and _accepts_gzip(Headers(scope=scope)):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
