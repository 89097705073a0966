"""The FastAPI application: REST API under ``/api/v1``, event browser pages, static files.

Run it with ``uvicorn backend.api.app:app`` (or ``lstdp serve``). Every error is JSON
``{"detail": "<one clear line>"}`` on the API (validation errors add ``errors``, one
entry per bad field) and an HTML page on the browser's pages; a bad request is a 4xx,
never a 500:

* request validation (bad channel, bad time string, end before start, limit out of
  1..500, unknown calibration kind...): 422;
* unknown ids: 404;
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
import json
import logging
import math
import threading
import time
from collections.abc import Callable
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
from backend.api.deps import SessionDep
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
from backend.services.visibility import NotVisible

__all__ = ["create_app", "app", "API_PREFIX", "STATIC_DIR", "TEMPLATE_DIR", "DeadlineMiddleware", "RequestDeadline"]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"

_ERRORS = {404: {"model": ErrorPublic}, 422: {"model": ErrorPublic}}


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
    from backend.api.pages import templates

    return templates.TemplateResponse(request, "error.html", {"status": status, "detail": detail}, status_code=status)


async def _validation_handler(request: Request, exc: RequestValidationError):
    errors = clean_validation_errors(list(exc.errors()))
    detail = validation_message(errors)
    if not _is_api(request):
        return _error_page(request, 422, detail)
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


async def _http_handler(request: Request, exc: StarletteHTTPException):
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


async def _db_unavailable_handler(request: Request, exc: Exception):
    from backend.db import SCHEMA_MISSING, is_schema_missing

    if is_schema_missing(exc):
        log.error("database has no schema: %s", str(exc).splitlines()[0])
        detail = SCHEMA_MISSING
    elif isinstance(exc, ProgrammingError):
        return await _unexpected_handler(request, exc)
    elif type(getattr(exc, "orig", None)).__name__ == "QueryCanceled":
        log.error("database statement cancelled on %s %s: %s", request.method, request.url.path, exc)
        detail = "the database did not finish in time (statement timeout); try again later or narrow the request"
    else:
        log.error("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        detail = f"the database is unavailable ({public_reason(exc)}); try again later"
    if not _is_api(request):
        return _error_page(request, 503, detail)
    return JSONResponse({"detail": detail}, status_code=503)


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


class RequestDeadline:
    """The deadline of one request, shared by :class:`DeadlineMiddleware` and the route
    (``request.state.deadline``).

    Attributes
    ----------
    limit_s : float
        The deadline, from the request's arrival [s].
    answered : bool
        True once the middleware has answered 503: whatever the route does afterwards is not
        seen by the client (a route that writes can undo or mark its work, as
        ``POST /jobs`` does).
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.answered = False

    def remaining_s(self) -> float:
        """Seconds left before the deadline (negative once past) [s]."""
        return self.limit_s - (time.monotonic() - self.started)


class DeadlineMiddleware:
    """Answer 503 ``{"detail": ...}`` when a request has not started its response within
    ``API_DEADLINE_S`` (1.8 s by default), so the API answers within 2 s even when
    PostgreSQL or Redis is frozen.

    A frozen server (SIGSTOP, a hung host behind a live kernel) accepts TCP connections and
    acknowledges what is sent, and never answers: the server-side ``statement_timeout`` is
    never applied, a pooled connection's ``pool_pre_ping`` waits forever. Only the client
    can give up, and psycopg has no timeout for a statement, so the request is given up
    here, around the application.

    What happens to the work still running: a synchronous route runs in a thread, which
    cannot be interrupted; it stays blocked until the server answers again (or the kernel
    gives up on the connection: the keepalives and ``tcp_user_timeout`` of
    :mod:`backend.db`), then finishes, and its answer is dropped. Such threads are bounded:
    each holds a pooled connection (15 at most), a checkout past those fails after the
    pool timeout (the deadline), a thread of the pool (40, AnyIO's default) is held per
    stuck request. The route is told through ``request.state.deadline``
    (:class:`RequestDeadline`): ``POST /jobs`` fails a job the client was told nothing
    about. A process that stops while a server is frozen waits for such threads (or is
    killed by its supervisor).

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

        task = asyncio.ensure_future(self.app(scope, receive, guarded_send))
        done, _ = await asyncio.wait({task}, timeout=limit)
        if done or started:
            await task  # finished, or a response under way: let it end (and raise as it does)
            return
        deadline.answered = True
        self._orphans.add(task)
        task.add_done_callback(self._forget)
        log.error("%s %s: no answer within %.1f s (a database or broker that does not answer); answered 503, "
                  "the request goes on in the background", scope.get("method"), scope.get("path"), limit)
        detail = f"the server could not answer within {limit:g} s (the database or the broker is not answering); " \
                 "try again later"
        request = Request(scope)
        response = JSONResponse({"detail": detail}, status_code=503) if _is_api(request) \
            else _error_page(request, 503, detail)
        await response(scope, receive, send)

    def _forget(self, task: asyncio.Task) -> None:
        self._orphans.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("a request answered 503 at its deadline then failed: %s: %s", type(exc).__name__, exc)


class _BoundedCheck:
    """Run a blocking health check in a daemon thread and give up on it after a timeout.

    A check stuck on a frozen server keeps its thread until the server answers; at most
    ``max_stuck`` (2) are let wait at once, later checks are reported as not answering
    without starting another thread, so a frozen server cannot multiply them.
    """

    def __init__(self, name: str, max_stuck: int = 2) -> None:
        self.name = name
        self.slots = threading.BoundedSemaphore(max_stuck)

    async def run(self, fn: Callable[..., str], timeout_s: float, *args: Any) -> str:
        if not self.slots.acquire(blocking=False):
            return f"{self.name} unreachable: earlier checks still wait for an answer"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def settle(value: str) -> None:
            if not future.done():
                future.set_result(value)

        def work() -> None:
            try:
                value = fn(*args)
            except Exception as exc:  # noqa: BLE001 - a check reports, never raises
                log.warning("%s check failed: %s: %s", self.name, type(exc).__name__, exc)
                value = f"{self.name} unreachable: {public_reason(exc)}"
            finally:
                self.slots.release()
            try:
                loop.call_soon_threadsafe(settle, value)
            except RuntimeError:  # the loop has closed meanwhile: nobody waits
                pass

        threading.Thread(target=work, name=f"health-{self.name}", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            return f"{self.name} unreachable: no answer within {timeout_s:.2g} s"


def _database_status(bind) -> str:
    """``"ok"`` after a ``SELECT 1`` on ``bind`` (an engine: one pooled connection; a
    connection: on it)."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            conn.execute(text("SELECT 1"))
    else:
        bind.execute(text("SELECT 1"))
    return "ok"


_DATABASE_CHECK = _BoundedCheck("database")
_BROKER_CHECK = _BoundedCheck("broker")


def health_check_timeout_s() -> float:
    """How long ``/health`` waits for each dependency [s]: half of ``API_DEADLINE_S`` (0.9 s by
    default; both are checked at once, so the answer comes before the deadline), 1 s
    without a deadline."""
    deadline = get_settings().api_deadline_s
    return deadline / 2 if deadline > 0 else 1.0


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/health", response_model=HealthPublic, responses={503: {"model": HealthPublic}})
    async def health(session: SessionDep):
        """Each dependency separately: ``database`` and ``broker`` are ``ok`` or the reason they
        are not (never their address); 503 when any is not. Both are checked at once, each
        given up after half of ``API_DEADLINE_S`` (0.9 s by default), also when a server is
        frozen."""
        from backend.broker import broker_status

        limit = health_check_timeout_s()
        database, broker = await asyncio.gather(
            _DATABASE_CHECK.run(_database_status, limit, session.get_bind()),
            _BROKER_CHECK.run(broker_status, limit, limit / 2))
        ok = database == "ok" and broker == "ok"
        body = HealthPublic(status="ok" if ok else "error", database=database, broker=broker, version=__version__)
        return body if ok else JSONResponse(body.model_dump(), status_code=503)

    return router


def create_app() -> FastAPI:
    """Build the application: API routers under ``/api/v1``, pages at ``/``, ``/static``."""
    from backend.api import coverage_page, pages

    # FastAPIOffline serves Swagger UI and ReDoc from packaged files: /docs works offline
    app = FastAPIOffline(
        title="LST data platform",
        version=__version__,
        description=(
            "REST API of the ASO-S Lyman-alpha Solar Telescope (LST) data platform: channels, "
            "raw frames (L0/L1), L2 products, calibration files, solar events (HEK codes) with "
            "light curves, and recalibration jobs."
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
    app.include_router(pages.router)
    app.include_router(movies.page_router)
    app.include_router(coverage_page.router)
    app.include_router(reproducibility.page_router)
    app.mount("/static", VersionedStaticFiles(directory=STATIC_DIR), name="static")  # gzip, cached by version
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(DataError, _data_error_handler)
    app.add_exception_handler(NotVisible, _not_visible_handler)  # a subclass of DataError: 404, not 422
    app.add_exception_handler(DatabaseDataError, _db_data_error_handler)
    app.add_exception_handler(OperationalError, _db_unavailable_handler)
    app.add_exception_handler(InterfaceError, _db_unavailable_handler)  # a connection closed under us
    app.add_exception_handler(PoolTimeoutError, _db_unavailable_handler)  # every pooled connection busy
    app.add_exception_handler(ProgrammingError, _db_unavailable_handler)  # PostgreSQL: a missing table
    app.add_exception_handler(Exception, _unexpected_handler)
    add_text_compression(app)  # gzip for text answers; innermost of ours
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(BodySizeLimitMiddleware)
    app.add_middleware(DeadlineMiddleware)  # outermost of ours: covers the others' work too
    from backend.api.openapi_security import document_security

    install_log_redaction()  # no token in the access log, even one put in a URL

    return document_security(app)  # securitySchemes; 401/403 on every write


app = create_app()
