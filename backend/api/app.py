"""The FastAPI application: REST API under ``/api/v1``, event browser pages, static files.

Run it with ``uvicorn backend.api.app:app`` (or ``lstdp serve``). Every error is JSON
``{"detail": "<one clear line>"}`` on the API (validation errors add ``errors``, one
entry per bad field) and an HTML page on the browser's pages; a bad request is a 4xx,
never a 500:

* request validation (bad channel, bad time string, end before start, limit out of
  1..500, unknown calibration kind...): 422;
* unknown ids: 404;
* over a quota or the write rate limit (:class:`backend.services.quotas.QuotaExceeded`): 429
  with ``Retry-After``;
* :class:`pipelines.errors.DataError` (and its :class:`~backend.services.jobs.JobRequestError`,
  e.g. a pinned calibration version that does not exist): 422;
* a value the database cannot store or compare (a NUL character, a number out of the
  column's range) that got past the checks: 422;
* database unreachable, every pooled connection busy, or a statement past its timeout: 503;
* no answer within ``API_DEADLINE_S`` (1.8 s; a frozen database or broker): 503
  (:class:`DeadlineMiddleware`).

No error body names a host, port, URL, user or password: the reasons of infrastructure
faults come from :func:`backend.faults.public_reason`; the full error is logged. No error
body echoes an API token either (a token pasted in the wrong field, or in a path): the
handlers pass details and echoed inputs through :func:`backend.auth.redact_tokens`.

``HEAD`` is answered on every ``GET`` route (API, pages, downloads) by
:class:`HeadAsGetMiddleware`: the ``GET`` response's status and headers, no body.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine, text
from sqlalchemy.exc import DataError as DatabaseDataError
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend import __version__
from backend.store import StoreError
from backend.api.deps import SessionDep
from backend.api.idempotency import IdempotencyMiddleware, document_idempotency
from backend.api.routes import bulk, calibrations, channels, events, frames, job_form, jobs, movies, products
from backend.api.routes import viewer as viewer_routes
from backend.api.routes import event_curves as event_curves_routes
from backend.api.routes import hek as hek_routes
from backend.api.routes import me as me_routes, queue as queue_routes
from backend.api.routes import xray as xray_routes
from backend.api.routes import coverage, event_histogram
from backend.api.routes import session as session_routes, tokens as tokens_routes
from backend.api.routes import job_control as job_control_routes
from backend.api.routes import calibration_sets as calibration_sets_routes
from backend.api.routes import reproducibility
from backend.api.routes import notifications
from backend.api.schemas import ErrorPublic, HealthPublic
from backend.api.static import VersionedStaticFiles, add_text_compression
from backend.auth import install_log_redaction, redact_tokens
from backend.faults import public_reason
from backend.settings import get_settings
from frontend import STATIC_DIR, TEMPLATE_DIR
from pipelines.errors import DataError
from backend.services.quotas import QuotaExceeded
from backend.services.visibility import NotVisible

__all__ = ["create_app", "app", "API_PREFIX", "STATIC_DIR", "TEMPLATE_DIR", "DeadlineMiddleware", "RequestDeadline"]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"

_ERRORS = {404: {"model": ErrorPublic}, 422: {"model": ErrorPublic}}


def _resolve_anyio_names() -> None:
    """Import every name anyio exports now, in the importing thread.

    anyio (4.13 on) imports most of its public names on first use, through a module
    ``__getattr__`` (PEP 562). Starlette's ``FileResponse`` first touches ``anyio.open_file``
    while a response is being sent, so without this the first file served imports a module
    in the middle of answering; a CI run lost a quicklook that way (the browser saw
    ``ERR_CONTENT_LENGTH_MISMATCH``). Resolving the names once at start-up takes ~10 ms."""
    import anyio
    import anyio.abc

    for module in (anyio, anyio.abc):
        for name in dir(module):
            getattr(module, name)


_resolve_anyio_names()


def _is_api(request: Request) -> bool:
    return request.url.path.startswith(API_PREFIX) or request.url.path.startswith("/static")


def _jsonable_input(value: Any) -> Any:
    """The offending value as JSON can carry it: NaN and infinities (which JSON has no
    number for) as their text, long text cut to 200 characters."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    s = _utf8_safe(value if isinstance(value, str) else repr(value))
    return s if len(s) <= 200 else s[:200] + "..."


def _utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (a JSON ``\\ud800`` decodes to one; UTF-8 has none) as
    ``\\ud800`` escapes, so that the answer can be encoded."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean_validation_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI error entries as plain JSON: ``loc``, ``msg``, ``type``, ``input``."""
    out = []
    for e in errors:
        msg = _utf8_safe(str(e.get("msg", "invalid value")))
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
        value = _jsonable_input(e.get("input"))
        out.append({
            "loc": [redact_tokens(_utf8_safe(str(x))) for x in e.get("loc", ())],
            "msg": redact_tokens(msg),
            "type": str(e.get("type", "value_error")),
            "input": redact_tokens(value) if isinstance(value, str) else value,
        })
    return out


def validation_message(errors: list[dict[str, Any]]) -> str:
    """One line for the errors: ``query.limit: Input should be greater than or equal to 1; ...``."""
    parts = []
    for e in errors:
        loc = ".".join(e["loc"]) or "request"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts) or "invalid request"


def _error_page(request: Request, status: int, detail: str) -> HTMLResponse:
    from backend.api.pages.templating import templates

    return templates.TemplateResponse(request, "error.html", {"status": status, "detail": detail}, status_code=status)


async def _validation_handler(request: Request, exc: RequestValidationError):
    errors = clean_validation_errors(list(exc.errors()))
    detail = validation_message(errors)
    if not _is_api(request):
        return _error_page(request, 422, detail)
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


async def _http_handler(request: Request, exc: StarletteHTTPException | QuotaExceeded):
    detail = redact_tokens(exc.detail if isinstance(exc.detail, str) else str(exc.detail))
    if not _is_api(request) and exc.status_code >= 400:
        return _error_page(request, exc.status_code, detail)
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _data_error_handler(request: Request, exc: DataError):
    detail = redact_tokens(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if not _is_api(request):
        return _error_page(request, 422, detail)
    return JSONResponse({"detail": detail}, status_code=422)


async def _not_visible_handler(request: Request, exc: Exception):
    """An unknown id, or an object the caller may not see (:mod:`backend.services.visibility`):
    404 either way, so a private object's id is not confirmed."""
    detail = redact_tokens(str(exc).splitlines()[0] if str(exc) else "not found")
    if not _is_api(request):
        return _error_page(request, 404, detail)
    return JSONResponse({"detail": detail}, status_code=404)


async def _db_data_error_handler(request: Request, exc: DatabaseDataError):
    # PostgreSQL refused a value (NUL character, integer out of range...): a bad request
    # that got past the parameter checks, not a server failure
    log.warning("database refused a value on %s %s: %s", request.method, request.url.path,
                str(exc.orig).splitlines()[0] if exc.orig else exc)
    reason = str(exc.orig).splitlines()[0] if exc.orig is not None and str(exc.orig) else "invalid value"
    detail = f"a value of the request cannot be used: {reason}"
    if not _is_api(request):
        return _error_page(request, 422, detail)
    return JSONResponse({"detail": detail}, status_code=422)


def is_slow_query(exc: BaseException) -> bool:
    """Whether a database error is a statement stopped for passing its budget (the server
    answered: a slow query, not an outage): psycopg's ``QueryCanceled`` (PostgreSQL's
    ``statement_timeout``, SQLSTATE 57014) or SQLite's ``interrupted`` (the API's budget,
    :func:`backend.db.make_engine`)."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    if type(orig).__name__ == "QueryCanceled" or getattr(orig, "sqlstate", None) == "57014":
        return True
    return type(orig).__module__ == "sqlite3" and str(orig).strip().lower() == "interrupted"


def _query_summary(statement: str | None) -> str:
    """The statement's kind and first table, e.g. ``SELECT ... FROM events``: enough to say
    which query, no parameter values (they are bound, never in the text)."""
    if not statement:
        return "a query"
    words = statement.split()
    verb = words[0].upper() if words else "query"
    table = next((words[i + 1].strip('"(),') for i, w in enumerate(words[:-1])
                  if w.upper() in ("FROM", "INTO", "UPDATE")), None)
    return f"{verb} on {table}" if table else verb


#: ``Retry-After`` of a 503 the server expects to pass soon (a slow query, a busy pool) [s].
RETRY_AFTER_S = 2


async def _store_unavailable_handler(request: Request, exc: Exception):
    """503 when the product store (an object store, :mod:`backend.store`) fails or answers
    with other bytes than were written: the product is there, this answer is not."""
    log.error("product store fault on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": f"the product store could not serve this: {exc}"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


async def _db_unavailable_handler(request: Request, exc: Exception):
    """503 for database faults, saying which: a slow query (the server cancelled it at its
    budget), every pooled connection busy (both: ``Retry-After``, the server is up), the
    schema missing, or the database unreachable (refused, dropped, not answering)."""
    from backend.db import SCHEMA_MISSING, is_schema_missing

    headers = None
    if is_schema_missing(exc):
        log.error("database has no schema: %s", str(exc).splitlines()[0])
        detail = SCHEMA_MISSING
    elif isinstance(exc, ProgrammingError):
        return await _unexpected_handler(request, exc)
    elif is_slow_query(exc):
        budget = get_settings().api_statement_s
        query = _query_summary(getattr(exc, "statement", None))
        log.error("slow query on %s %s (%s) cancelled at its budget of %g s", request.method, request.url.path,
                  query, budget)
        detail = (f"the database query took too long: {query} of {request.method} {request.url.path} passed "
                  f"its budget of {budget:g} s and was cancelled (the database is up); try again later or "
                  "narrow the request")
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    elif isinstance(exc, PoolTimeoutError):
        log.error("no free database connection on %s %s: %s", request.method, request.url.path, exc)
        detail = "the server is busy: every database connection is in use (the database is up); try again shortly"
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    else:
        log.error("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        detail = f"the database is unavailable ({public_reason(exc)}); try again later"
    if not _is_api(request):
        page = _error_page(request, 503, detail)
        page.headers.update(headers or {})
        return page
    return JSONResponse({"detail": detail}, status_code=503, headers=headers)


async def _unexpected_handler(request: Request, exc: Exception):
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    detail = "internal server error (logged on the server)"
    if not _is_api(request):
        return _error_page(request, 500, detail)
    return JSONResponse({"detail": detail}, status_code=500)


class HeadAsGetMiddleware:
    """Answer ``HEAD`` on every ``GET`` route: run the request as ``GET`` and send the
    status and headers (``Content-Length`` included) without the body.

    Starlette adds ``HEAD`` to its own ``Route`` objects but FastAPI's ``APIRoute`` only
    answers the methods it is declared with, so ``HEAD`` was a 405 on the API.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_no_body(message):
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_no_body)


#: Largest request body the API reads [bytes]: a job request is well under 10 kB; a body
#: of many megabytes is a mistake or an attack, answered 413 before it is read in full.
MAX_BODY_BYTES = 1 << 20


class BodySizeLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413 and a message, by ``Content-Length``
    before anything is read. A body sent without it (chunked) stops being read at the limit:
    FastAPI then answers its own 400 "error parsing the body" (it wraps errors of the read),
    or this middleware 413 where nothing was answered yet."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send) -> None:
        body = json.dumps({"detail": f"request body over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        try:
            declared = int(length) if length is not None else None
        except ValueError:
            declared = None
        if declared is not None and declared > self.max_bytes:
            await self._too_large(send)
            return
        seen = 0
        started = False

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._too_large(send)


class _BodyTooLarge(Exception):
    pass


class DeadlinePassed(Exception):
    """A request tried to commit after its deadline: refused, so that a write answered 503
    has not happened (:func:`_refuse_late_commit`)."""


#: The deadline of the request this code runs for (set by :class:`DeadlineMiddleware`; the
#: route's worker thread sees it too, AnyIO copies the context).
current_deadline: ContextVar["RequestDeadline | None"] = ContextVar("current_deadline", default=None)


class RequestDeadline:
    """The deadline of one request, shared by :class:`DeadlineMiddleware` and the route
    (``request.state.deadline``, :data:`current_deadline`).

    Attributes
    ----------
    limit_s : float
        The deadline, from the request's arrival [s].
    answered : bool
        True once the middleware has answered 503: whatever the route does afterwards is not
        seen by the client; a commit is then refused (:class:`DeadlinePassed`).
    wrote : bool
        True once the request has begun a commit in time: the middleware then waits for the
        route's own answer (one more ``limit_s``) instead of saying the write did not happen.
    query : str or None
        The database statement running now (``SELECT on events``), for the 503's message.
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.answered = False
        self.wrote = False
        self.query: str | None = None
        self.query_started = 0.0
        self._lock = threading.Lock()

    def remaining_s(self) -> float:
        """Seconds left before the deadline (negative once past) [s]."""
        return self.limit_s - (time.monotonic() - self.started)

    def begin_write(self) -> bool:
        """Claim the right to commit: False when the deadline has passed or the client was
        answered 503 (the commit must not happen), else True and :attr:`wrote` is set."""
        with self._lock:
            if self.wrote:
                return True
            if self.answered or self.remaining_s() <= 0:
                return False
            self.wrote = True
            return True

    def give_up(self) -> bool:
        """The middleware's side: mark the request answered 503 unless a commit has begun
        (then False: the route's own answer is awaited)."""
        with self._lock:
            if self.wrote:
                return False
            self.answered = True
            return True


def _refuse_late_commit(session) -> None:
    """SQLAlchemy ``before_commit`` of every session: within a request past its deadline (or
    already answered 503) the commit is refused with :class:`DeadlinePassed`, so the write
    does not happen. Sessions with ``info["after_deadline"]`` (the idempotency store's) are
    exempt."""
    deadline = current_deadline.get()
    if deadline is None or session.info.get("after_deadline"):
        return
    if not session.new and not session.dirty and not session.deleted and not session.in_transaction():
        return
    if not deadline.begin_write():
        raise DeadlinePassed(f"the request passed its deadline of {deadline.limit_s:g} s before its commit: "
                             "nothing was written")


def _track_statement(conn, _cursor, statement, _params, _context, _many) -> None:
    deadline = current_deadline.get()
    if deadline is not None:
        deadline.query, deadline.query_started = _query_summary(statement), time.monotonic()


def _statement_done(conn, _cursor, _statement, _params, _context, _many) -> None:
    deadline = current_deadline.get()
    if deadline is not None:
        deadline.query = None


def _install_deadline_hooks() -> None:
    """Register :func:`_refuse_late_commit` and the statement tracking once per process."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    if not event.contains(Session, "before_commit", _refuse_late_commit):
        event.listen(Session, "before_commit", _refuse_late_commit)
        event.listen(Engine, "before_cursor_execute", _track_statement)
        event.listen(Engine, "after_cursor_execute", _statement_done)


async def _deadline_passed_handler(request: Request, exc: DeadlinePassed):
    detail = f"{exc}; try again"
    if not _is_api(request):
        return _error_page(request, 503, detail)
    return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


class DeadlineMiddleware:
    """Answer 503 ``{"detail": ...}`` with ``Retry-After`` when a request has not started its
    response within ``API_DEADLINE_S`` (1.8 s by default), so the API answers within 2 s even
    when PostgreSQL or Redis is frozen.

    A frozen server (SIGSTOP, a hung host behind a live kernel) accepts TCP connections and
    acknowledges what is sent, and never answers: the server-side ``statement_timeout`` is
    never applied, a pooled connection's ``pool_pre_ping`` waits forever. Only the client
    can give up, and psycopg has no timeout for a statement, so the request is given up
    here, around the application. A slow query on a server that answers is cancelled at its
    budget first (``API_STATEMENT_TIMEOUT_S``, two thirds of the deadline) and answered as
    such; the deadline's 503 says what the request was waiting for when it knows (a query
    still running), and never claims an outage it has not seen.

    Writes: a commit is refused once the deadline has passed (:func:`_refuse_late_commit`),
    so a write answered 503 here has not happened. A request whose commit began in time is
    given one more deadline for its own answer; past that, the 503 says its write may have
    happened and to repeat it with the same ``Idempotency-Key`` (which then gets its answer).

    What happens to the work still running: a synchronous route runs in a thread, which
    cannot be interrupted; it stays blocked until the server answers again (or the kernel
    gives up on the connection: the keepalives and ``tcp_user_timeout`` of
    :mod:`backend.db`), then finishes, and its answer is dropped. Such threads are bounded:
    each holds a pooled connection (15 at most), a checkout past those fails after the
    pool timeout (the deadline), a thread of the pool (40, AnyIO's default) is held per
    stuck request. A process that stops while a server is frozen waits for such threads
    (or is killed by its supervisor).

    A response that has started in time (a FITS download, a CSV export streaming) is not
    cut. ``API_DEADLINE_S=0`` turns the deadline off.
    """

    def __init__(self, app, deadline_s: float | None = None) -> None:
        self.app = app
        self.deadline_s = deadline_s
        self._orphans: set[asyncio.Task] = set()  # a reference to each running late request

    async def __call__(self, scope, receive, send):
        limit = self.deadline_s if self.deadline_s is not None else get_settings().api_deadline_s
        if scope["type"] != "http" or limit <= 0:
            await self.app(scope, receive, send)
            return
        deadline = RequestDeadline(limit)
        scope.setdefault("state", {})["deadline"] = deadline
        started = False

        async def guarded_send(message):
            nonlocal started
            if deadline.answered:  # the client has its 503: the late answer is dropped
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        token = current_deadline.set(deadline)
        try:
            task = asyncio.ensure_future(self.app(scope, receive, guarded_send))  # copies the context
        finally:
            current_deadline.reset(token)
        done, _ = await asyncio.wait({task}, timeout=limit)
        if done or started:
            await task  # finished, or a response under way: let it end (and raise as it does)
            return
        in_doubt = False
        if not deadline.give_up():  # its commit began in time: wait for its own answer
            done, _ = await asyncio.wait({task}, timeout=limit)
            if done or started:
                await task
                return
            deadline.answered = in_doubt = True
        self._orphans.add(task)
        task.add_done_callback(self._forget)
        if in_doubt:
            detail = (f"the request's write began in time but its answer did not come within {2 * limit:g} s: it "
                      "may have happened; repeat the request with the same Idempotency-Key to get its answer")
        elif deadline.query is not None:
            detail = (f"the database has not finished a query ({deadline.query}) for "
                      f"{time.monotonic() - deadline.query_started:.1f} s: it is slow or not answering; the request "
                      f"was given up at its deadline of {limit:g} s and wrote nothing; try again later")
        else:
            detail = (f"the server could not answer within {limit:g} s (busy, or the database or the broker is not "
                      "answering); the request wrote nothing; try again later")
        log.error("%s %s: no answer within %.1f s; answered 503 (%s), the request goes on in the background",
                  scope.get("method"), scope.get("path"), limit, detail)
        request = Request(scope)
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        response = JSONResponse({"detail": detail}, status_code=503, headers=headers) if _is_api(request) \
            else _error_page(request, 503, detail)
        response.headers.update(headers)
        await response(scope, receive, send)

    def _forget(self, task: asyncio.Task) -> None:
        self._orphans.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("a request answered 503 at its deadline then failed: %s: %s", type(exc).__name__, exc)


class _SharedProbe:
    """Probe one dependency in a daemon thread, one probe at a time per target: a health check
    that comes while a probe is in flight waits for that probe's answer (each caller up to its
    own timeout) instead of starting another. A dependency is reported down only when its probe
    fails or does not answer in time, never because other checks or requests are in progress;
    a probe stuck on a frozen server holds one thread, however many checks come meanwhile.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._in_flight: dict[Any, concurrent.futures.Future] = {}

    def _work(self, target: Any, future: concurrent.futures.Future, fn: Callable[..., str], args: tuple) -> None:
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - a probe reports, never raises
            log.warning("%s probe failed: %s: %s", self.name, type(exc).__name__, exc)
            value = f"{self.name} unreachable: {public_reason(exc)}"
        with self._lock:
            if self._in_flight.get(target) is future:
                del self._in_flight[target]
        future.set_result(value)

    async def run(self, fn: Callable[..., str], timeout_s: float, *args: Any, target: Any = None) -> str:
        """``fn(*args)`` (``"ok"`` or the reason), shared with the probe of ``target`` already in
        flight; ``"<name> unreachable: no answer within <timeout_s> s"`` past ``timeout_s``."""
        with self._lock:
            future = self._in_flight.get(target)
            if future is None:
                future = self._in_flight[target] = concurrent.futures.Future()
                threading.Thread(target=self._work, args=(target, future, fn, args), name=f"health-{self.name}",
                                 daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
        except TimeoutError:
            return f"{self.name} unreachable: no answer within {timeout_s:.2g} s"


#: The health probes' own engines, one per database URL: one connection, short timeouts, so a
#: probe never waits behind the API's requests for a pooled connection.
_PROBE_ENGINES: dict[str, Engine] = {}
_PROBE_ENGINES_LOCK = threading.Lock()


def _probe_engine(engine: Engine) -> Engine:
    from backend.db import DbTimeouts, make_engine

    url = engine.url.render_as_string(hide_password=False)
    with _PROBE_ENGINES_LOCK:
        probe = _PROBE_ENGINES.get(url)
        if probe is None:
            limit = get_settings().health_probe_s
            probe = _PROBE_ENGINES[url] = make_engine(
                url, DbTimeouts(connect_s=max(2, math.ceil(limit)), statement_s=limit, pool_s=limit), pool=(1, 0))
        return probe


def _database_status(bind) -> str:
    """``"ok"`` after a ``SELECT 1`` on ``bind`` (an engine: on a connection of the probe's own
    engine for its URL, :func:`_probe_engine`; a connection: on it)."""
    if isinstance(bind, Engine):
        with _probe_engine(bind).connect() as conn:
            conn.execute(text("SELECT 1"))
    else:
        bind.execute(text("SELECT 1"))
    return "ok"


def _probe_target(bind) -> Any:
    return bind.url.render_as_string(hide_password=False) if isinstance(bind, Engine) else id(bind)


_DATABASE_CHECK = _SharedProbe("database")
_BROKER_CHECK = _SharedProbe("broker")


def health_check_timeout_s() -> float:
    """How long ``/health`` waits for each probe [s]: ``HEALTH_PROBE_TIMEOUT_S``, by default half
    of ``API_DEADLINE_S`` (0.9 s; both are probed at once, so the answer comes before the
    deadline), 1 s without a deadline."""
    return get_settings().health_probe_s


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/health", response_model=HealthPublic, responses={503: {"model": HealthPublic}})
    async def health(session: SessionDep):
        """Each dependency separately: ``database`` and ``broker`` are ``ok`` or the reason they
        are not (never their address); 503 when any is not. A dependency is down only when its
        probe fails: a ``SELECT 1`` on a connection of the probe's own (not the API's busy
        pool), a broker ping; never because requests are in progress. Both are probed at once,
        each given up after ``HEALTH_PROBE_TIMEOUT_S`` (half of ``API_DEADLINE_S``, 0.9 s, by
        default), also when a server is frozen; checks that come while a probe is in flight
        share its answer."""
        from backend.broker import broker_status

        limit = health_check_timeout_s()
        bind = session.get_bind()
        database, broker = await asyncio.gather(
            _DATABASE_CHECK.run(_database_status, limit, bind, target=_probe_target(bind)),
            _BROKER_CHECK.run(broker_status, limit, limit / 2, target=get_settings().celery_broker_url))
        ok = database == "ok" and broker == "ok"
        body = HealthPublic(status="ok" if ok else "error", database=database, broker=broker, version=__version__)
        return body if ok else JSONResponse(body.model_dump(), status_code=503)

    return router


_HEAP_FROZEN = False


def freeze_startup_heap() -> bool:
    """Move every object alive now (the app, its routes, numpy, astropy, sunpy, plotly: about
    300,000 tracked objects) into the garbage collector's permanent generation
    (:func:`gc.freeze`), once per process; True the first time.

    A full collection walked them all: about 130 ms of one CPU on this 2-core machine (measured
    with ``gc.collect()`` after ``create_app()``), a pause that fell on whichever request set it
    off and made the p99 of the event search (``benchmarks/embedded_search.py``) 200 ms where its
    median is 20. Frozen, a full collection walks only what requests made. Objects made at
    start-up live as long as the process, so nothing that should be freed is kept. Once per
    process: a process that builds many apps (the tests) would otherwise keep each one's
    leftovers.
    """
    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        return False
    _HEAP_FROZEN = True
    gc.collect()
    gc.freeze()
    return True


@contextlib.asynccontextmanager
async def _lifespan(_app):
    """The app's start-up: :func:`freeze_startup_heap` once the app and its imports are made."""
    freeze_startup_heap()
    yield


def create_app() -> FastAPI:
    """Build the application: API routers under ``/api/v1``, pages at ``/``, ``/static``."""
    from backend.api import pages

    # FastAPIOffline serves Swagger UI and ReDoc from packaged files: /docs works offline
    app = FastAPIOffline(
        lifespan=_lifespan,
        title="LST data platform",
        version=__version__,
        description=(
            "REST API of the ASO-S Lyman-alpha Solar Telescope (LST) data platform: channels, "
            "raw frames (L0/L1), L2 products, calibration files, solar events (HEK codes) with "
            "light curves, and recalibration jobs.\n\n"
            "**Writes are safe to repeat**: send an `Idempotency-Key` header (any unique string, e.g. a UUID) "
            "with a POST; a repeat with the same key and request gets the first answer, the same key with "
            "another request is 422, a key whose first request is still in progress is 409. Keys are kept 24 h "
            "(`IDEMPOTENCY_TTL_S`). A write answered 503 has not happened, or its repeat with the same key gets "
            "its answer.\n\n"
            "**503** always says why and carries `Retry-After` where the server is up: a slow query (passed its "
            "budget, `API_STATEMENT_TIMEOUT_S`), every database connection busy, the deadline "
            "(`API_DEADLINE_S`) passed, or the database or broker unreachable. `/api/v1/health` reports a "
            "dependency down only when its probe fails."
        ),
        docs_url="/docs",
        redoc_url="/redoc",
        openapi_url=f"{API_PREFIX}/openapi.json",
    )
    api = APIRouter(prefix=API_PREFIX, responses=_ERRORS)
    api.include_router(_health_router())
    # bulk and job_form first: their /products/archive and /jobs/estimate are not /{id}
    for module in (bulk, job_form, channels, frames, products, calibrations, event_histogram, events, jobs,
                   movies, coverage):
        api.include_router(module.router)
    api.include_router(job_control_routes.router)  # /jobs/{id}/cancel, /jobs/{id}/retry
    api.include_router(viewer_routes.router)  # /products/{id}/region.png, wcs, pixel, overlays
    api.include_router(xray_routes.router)
    api.include_router(event_curves_routes.router)
    api.include_router(hek_routes.router)  # /hek: HEK-compatible search (sunpy's HEKClient)
    api.include_router(session_routes.router)  # browser sign-in (the session cookie)
    api.include_router(tokens_routes.router)  # token management
    api.include_router(calibration_sets_routes.router)
    api.include_router(me_routes.router)  # /me: the token's user, quotas, rate limit
    api.include_router(queue_routes.router)  # /queue: the lanes, their throughput
    api.include_router(reproducibility.router)  # manifests, re-runs, version diffs
    api.include_router(notifications.router)  # /jobs/{id}/events (SSE), /webhooks, /saved-searches
    app.include_router(api)
    app.include_router(pages.router)  # every page (backend/api/pages/: a module per page family)
    app.mount("/static", VersionedStaticFiles(directory=STATIC_DIR), name="static")  # gzip, cached by version
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(QuotaExceeded, _http_handler)  # 429 with Retry-After (backend.services.quotas)
    app.add_exception_handler(DataError, _data_error_handler)
    app.add_exception_handler(NotVisible, _not_visible_handler)  # a subclass of DataError: 404, not 422
    app.add_exception_handler(DatabaseDataError, _db_data_error_handler)
    app.add_exception_handler(OperationalError, _db_unavailable_handler)
    app.add_exception_handler(StoreError, _store_unavailable_handler)
    app.add_exception_handler(InterfaceError, _db_unavailable_handler)  # a connection closed under us
    app.add_exception_handler(PoolTimeoutError, _db_unavailable_handler)  # every pooled connection busy
    app.add_exception_handler(ProgrammingError, _db_unavailable_handler)  # PostgreSQL: a missing table
    app.add_exception_handler(DeadlinePassed, _deadline_passed_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
    from backend.api.lean_events import install as install_lean_events

    install_lean_events(app)  # GET /events and /events/{id}: the same answers, far less CPU; innermost
    add_text_compression(app)  # gzip for text answers; innermost of ours (after the lean events path)
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(IdempotencyMiddleware)  # Idempotency-Key on every POST; inside the body limit
    app.add_middleware(BodySizeLimitMiddleware)
    app.add_middleware(DeadlineMiddleware)  # outermost of ours: covers the others' work too
    _install_deadline_hooks()
    from backend.api.openapi_security import document_security

    install_log_redaction()  # no token in the access log, even one put in a URL

    return document_idempotency(document_security(app))  # securitySchemes; 401/403 on every write; the key


app = create_app()
