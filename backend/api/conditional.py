"""File downloads that honour conditional requests (RFC 9110 sect. 13).

Every route that sends a stored file (a product's FITS file and quicklook, a movie's MP4)
answers through :func:`file_response`: the answer carries ``ETag`` and ``Last-Modified``,
and a ``GET``/``HEAD`` whose ``If-None-Match`` names the file's current ETag, or, without
``If-None-Match``, whose ``If-Modified-Since`` is not older than the file, is answered
``304 Not Modified`` with no body (RFC 9110 sect. 13.1.2, 13.1.3 and 13.2.2: ``If-None-Match``
is compared weakly and takes precedence). The ETag is the content's SHA-256 where the row
holds it (the same on every API replica), else Starlette's (file size and mtime).

With an object store (``PRODUCT_STORE=s3://...``) a product's files are objects:
:func:`object_response` streams them from the store through the API, checked against their
SHA-256 as they go (:meth:`backend.store.ProductStore.iter_verified`: a mismatch ends the
transfer short, so a client never takes a wrong file as whole), with the same ETag and
``Last-Modified`` (the object's) and the same 304 answers. A request with ``Range`` (astropy
through fsspec reads FITS headers and sections so) is answered from the object's local copy in
the bounded cache (:meth:`backend.store.ProductStore.local_file`, checked whole when fetched),
with Starlette's range handling. The API does not redirect to presigned URLs: every byte it
serves is checked.

The product archives (``/products/archive``) are made on request, with their creation time
in the name and the manifest, and sent ``Cache-Control: no-store``: no validator applies.
"""

from __future__ import annotations

import datetime as dt
import os
from email.utils import parsedate_to_datetime
from pathlib import Path

from fastapi import Request
from fastapi.responses import FileResponse
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.staticfiles import NotModifiedResponse

__all__ = ["file_response", "object_response", "not_modified"]


def _etags(value: str) -> list[str]:
    """The entity tags of an ``If-None-Match`` value, weak prefixes removed (weak comparison)."""
    return [t.strip().removeprefix("W/") for t in value.split(",") if t.strip()]


def not_modified(request_headers: Headers, etag: str, last_modified: str) -> bool:
    """Whether a GET with these request headers may be answered 304 (module docstring).

    Parameters
    ----------
    request_headers : starlette.datastructures.Headers
    etag : str
        The file's current ETag, quoted (``'"abc"'``).
    last_modified : str
        Its ``Last-Modified`` (an HTTP date, whole seconds).
    """
    if_none_match = request_headers.get("if-none-match")
    if if_none_match is not None:
        tags = _etags(if_none_match)
        return "*" in tags or etag.removeprefix("W/") in tags
    since = request_headers.get("if-modified-since")
    if not since:
        return False
    try:
        asked, modified = parsedate_to_datetime(since), parsedate_to_datetime(last_modified)
    except (TypeError, ValueError, IndexError):
        return False  # an invalid date is ignored (RFC 9110 sect. 13.1.3)
    if asked.tzinfo is None:
        asked = asked.replace(tzinfo=dt.UTC)
    return modified <= asked


def file_response(request: Request, path: str | os.PathLike, *, media_type: str, filename: str | None = None,
                  sha256: str | None = None) -> Response:
    """A ``FileResponse`` of ``path`` with ETag and Last-Modified, or a 304 (module docstring).

    Parameters
    ----------
    request : fastapi.Request
    path : path-like
        The stored file (it exists).
    media_type : str
    filename : str, optional
        Sent as an attachment under this name.
    sha256 : str, optional
        The content's hex SHA-256 (a product's ``sha256``): the ETag is then ``"<sha256>"``.
    """
    p = Path(path)
    response = FileResponse(p, media_type=media_type, filename=filename, stat_result=p.stat())
    if sha256:
        response.headers["etag"] = f'"{sha256}"'
    if request.method in ("GET", "HEAD") and not_modified(request.headers, response.headers["etag"],
                                                          response.headers["last-modified"]):
        return NotModifiedResponse(response.headers)
    return response


def object_response(request: Request, ref: str, *, media_type: str, filename: str | None = None,
                    sha256: str | None = None) -> Response | None:
    """A streamed answer with the object ``ref`` (``s3://...``) of the product store, or a 304
    (module docstring); ``None`` when no such object is there.

    Parameters
    ----------
    ref : str
        The row's ``path`` (or ``quicklook_path``).
    media_type, filename, sha256
        As :func:`file_response`; the bytes are checked against ``sha256`` (and the object's
        own recorded SHA-256) while they are sent.

    Raises
    ------
    backend.store.StoreError
        The store could not be asked (the app answers 503).
    """
    from email.utils import formatdate

    from fastapi.responses import StreamingResponse

    from backend.store import product_store

    store = product_store()
    key = store.key_of(ref)
    obj = store.head(key) if key is not None else None
    if obj is None:
        return None
    if request.headers.get("range"):
        # a range (astropy through fsspec, a resumed download): from the checked local copy
        # (a part cannot be checked against the whole file's SHA-256), with Starlette's ranges
        try:
            cached = store.local_file(key, sha256)
        except FileNotFoundError:
            return None
        return file_response(request, cached, media_type=media_type, filename=filename, sha256=sha256)
    headers = {"content-length": str(obj.size), "last-modified": formatdate(obj.modified, usegmt=True),
               "etag": f'"{sha256}"' if sha256 else f'"{obj.size:x}-{int(obj.modified):x}"',
               "accept-ranges": "bytes"}
    if filename:
        headers["content-disposition"] = f'attachment; filename="{filename}"'
    if request.method in ("GET", "HEAD") and not_modified(request.headers, headers["etag"], headers["last-modified"]):
        return NotModifiedResponse(headers)
    if request.method == "HEAD":
        return Response(status_code=200, headers=headers, media_type=media_type)
    return StreamingResponse(store.iter_verified(key, sha256), media_type=media_type, headers=headers)
