"""Exceptions of the client: one per kind of answer the API gives, each carrying its ``detail``.

The API answers every error as ``{"detail": "<one line>"}`` (validation errors add
``errors``, the list of refused values; ``backend/api/app.py``). :func:`raise_for_response`
turns a 4xx/5xx answer into the matching exception below, with that message as its text.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx

__all__ = [
    "LSTDPError",
    "ClientError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "ValidationError",
    "RateLimitedError",
    "ServerError",
    "StreamError",
    "raise_for_response",
]


class LSTDPError(Exception):
    """An error answer of the LST data platform API.

    Attributes
    ----------
    status : int or None
        HTTP status (None for errors without one, e.g. an ``error`` event of a stream).
    detail : str
        The API's ``detail`` message (or the body's first 500 characters when it is not JSON).
    method, url : str
        The request that was refused.
    body : object
        The decoded JSON body (None when it was not JSON).
    """

    def __init__(self, detail: str, *, status: int | None = None, method: str = "", url: str = "",
                 body: Any = None) -> None:
        self.status, self.detail, self.method, self.url, self.body = status, detail, method, url, body
        where = f" ({method} {url})" if url else ""
        super().__init__(f"{status} {detail}{where}" if status is not None else f"{detail}{where}")


class ClientError(LSTDPError):
    """A 4xx answer: the request cannot be served as sent."""


class AuthenticationError(ClientError):
    """401: no API token, or an unknown, revoked or expired one (make one with ``lstdp token create``)."""


class PermissionDeniedError(ClientError):
    """403: the token lacks the scope, or the resource is another user's."""


class NotFoundError(ClientError):
    """404: no such product, job or event (or one the caller may not see)."""


class ConflictError(ClientError):
    """409: the request conflicts with the resource's state (e.g. cancelling a job that has ended)."""


class ValidationError(ClientError):
    """422: a parameter or body value was refused; ``errors`` lists them (``loc``, ``msg``, ``input``)."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list((self.body or {}).get("errors") or []) if isinstance(self.body, dict) else []


class RateLimitedError(ClientError):
    """429: over a quota or the write rate limit.

    Attributes
    ----------
    retry_after : float or None
        Seconds to wait before trying again (the ``Retry-After`` header, RFC 9110 section
        10.2.3: delay-seconds or an HTTP date), None when the answer had none.
    """

    def __init__(self, detail: str, *, retry_after: float | None = None, **kw: Any) -> None:
        self.retry_after = retry_after
        super().__init__(detail, **kw)


class ServerError(LSTDPError):
    """A 5xx answer (503: the database or broker is not answering; try again later)."""


class StreamError(LSTDPError):
    """A server-sent event stream ended without its ``end`` event and could not be resumed."""


_BY_STATUS: dict[int, type[ClientError]] = {
    401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError, 409: ConflictError,
    422: ValidationError, 429: RateLimitedError,
}


def _retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delay-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def raise_for_response(r: httpx.Response) -> httpx.Response:
    """``r`` if it is not an error (< 400); else raise the exception of its status.

    Raises
    ------
    AuthenticationError, PermissionDeniedError, NotFoundError, ConflictError, ValidationError,
    RateLimitedError, ClientError
        For 401, 403, 404, 409, 422, 429 and any other 4xx.
    ServerError
        For a 5xx.
    """
    if r.status_code < 400:
        return r
    if not r.is_closed:
        r.read()
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        detail = body["detail"]
    elif isinstance(body, dict) and "detail" in body:
        detail = str(body["detail"])
    else:
        detail = r.text[:500] or r.reason_phrase
    kw = dict(status=r.status_code, method=r.request.method, url=str(r.request.url), body=body)
    if r.status_code >= 500:
        raise ServerError(detail, **kw)
    cls = _BY_STATUS.get(r.status_code, ClientError)
    if cls is RateLimitedError:
        raise RateLimitedError(detail, retry_after=_retry_after(r.headers.get("Retry-After")), **kw)
    raise cls(detail, **kw)
