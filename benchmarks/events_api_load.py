"""Load test of the event search API: a real uvicorn server, 16 concurrent clients over TCP.

Method
------
The server is the project's app (``backend.api.app``) run by uvicorn as ``lstdp serve`` runs it
(``backend.cli.serve_options``: httptools with the header timeout, ``log_level="info"`` so the
access log is on, written to a file, proxy headers; uvicorn picks uvloop; both come with
``uvicorn[standard]``), in a subprocess of this script (``--workers 1`` by default; ``--workers 2``
runs ``uvicorn backend.api.app:app --workers 2``, the compose file's plain uvicorn), its database the benchmark's
(``DATABASE_URL``). The seeding is that of :mod:`benchmarks.events_api` (imported, not copied).
The five kinds of query are those of :func:`benchmarks.events_api.queries`, with their
parameters drawn at random for every request (:class:`RandomQueries`; issue 29 item 4: no cache
of answers can help): a day of flares (a random day and hour of the ten seeded years), a year of
CMEs in a position-angle range (random start, random range of 20-120 deg, wrapping through 0
when it passes 360), a helioprojective box over a month (random month, random box of 100-400
arcsec a side within +-900 arcsec), the detail of a linked GOES flare (a random one of those with
links, M1 and above), the newest 100 at or above a random GOES class (B5 to M5).
``--fixed`` sends the five fixed queries of :func:`~benchmarks.events_api.queries` instead.

The load generator is this process: ``--clients`` (16) asyncio tasks, each with its own
keep-alive HTTP/1.1 connection (asyncio streams on uvloop, a minimal client: a request line and a
``Host`` header out, status line, headers and a ``Content-Length`` body in; ``--client httpx``
uses one ``httpx.AsyncClient`` with a 16-connection pool instead, which costs the client about
three times the CPU). Each task sends the five queries in turn (starting at a different one), the
next as soon as the previous answer is in (closed loop: a new request per finished one, so the
load is what the server sustains with 16 requests in flight). The latency of a request is from
writing the request to the end of its body. A request counts as an error when the status is not
200, the body is not JSON, or the connection fails or takes over 10 s.

Bounds: ``--warmup`` seconds (2) not recorded, then ``--duration`` seconds (20) or
``--max-requests`` (100,000) recorded, whichever comes first; the server is stopped by its PID
(SIGTERM, then SIGKILL after 10 s) whatever happens.

CPU split: user + system CPU seconds of the server (its process tree, from ``/proc``) and of this
process (``os.times``) over the recorded window, as a share of one core. With ``--pin`` (default
on a machine of 2 or more cores) the server runs on core 0 (``os.sched_setaffinity`` before
``exec``) and the client on core 1, so the client does not take the server's CPU; ``--no-pin``
leaves both to the scheduler.

Layers (``--layers``, workers=1 only): the server is started with an ASGI middleware that times
each request inside the app (first byte of the request to the last byte of the answer inside
the ASGI app) and a SQLAlchemy ``before/after_cursor_execute`` hook (on the API engine) that
counts and times the statements each request sends, per route; the client's latency minus the
in-app time is uvicorn (HTTP parsing, sockets), the event loop's queue and the client. The
load generator reads the figures from the server (``GET /__bench_layers``) before stopping it.
The PostgreSQL CPU is that of the backends connected to the database when the recording starts.
The lean events path (``backend/api/lean_events.py``, the default since issue 29) sends its
statements on the psycopg cursor, past SQLAlchemy's hooks: its routes show 0 statements and 0 ms
of SQL here (``LEAN_EVENTS=0`` in the environment serves the routes' own handlers).

The last line::

    RESULT clients=<n> p50_ms=<a> p99_ms=<b> rps=<r> errors=<e> server_cpu_ms=<c> seeded=<m>

(p50/p99 over all recorded requests; per-query figures above it; ``server_cpu_ms``: user +
system CPU of the server's process tree over the recorded window per request [ms]). Targets
(issue 15 item 6, issue 29): p99 <= 25 ms, 0 errors, server_cpu_ms <= 1.0.

Run (seed once, keep, reuse, drop at the end)::

    nice -n 10 .venv/bin/python benchmarks/events_api_load.py --keep            # seeds 1M events, prints the URL
    nice -n 10 .venv/bin/python benchmarks/events_api_load.py --database URL [--layers] [--report PATH]
    .venv/bin/python benchmarks/events_api_load.py --database URL --drop        # drop it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.events_api import (  # noqa: E402 - after the path
    create_database,
    drop_database,
    pct,
    queries,
    seed_database,
    x_flare_of,
)

TIMEOUT_S = 10.0
#: Where the ``--layers`` server answers its figures (outside the API's paths).
STATS_PATH = "/__bench_layers"


# -- the server ------------------------------------------------------------------------------


def serve(port: int, layers: bool) -> None:
    """Run the app under uvicorn as ``lstdp serve`` does; with ``layers``, time each request
    inside the app and its statements, per route, answered as JSON at :data:`STATS_PATH`."""
    import uvicorn

    from backend import db as dbmod
    from backend.api.app import app

    target = app
    if layers:
        import contextvars

        from sqlalchemy import event

        per_route: dict[str, dict[str, list]] = {}
        # the request's record, found in the worker thread that runs the handler's statements
        # (anyio copies the context into it)
        rec_var: contextvars.ContextVar[dict | None] = contextvars.ContextVar("bench_rec", default=None)
        engine = dbmod.get_engine("api")

        opened = {"connections": 0}

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, record):
            opened["connections"] += 1

        @event.listens_for(engine, "before_cursor_execute")
        def _before(conn, cursor, statement, parameters, context, executemany):
            rec = rec_var.get()
            if rec is not None:
                rec["t0"] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _after(conn, cursor, statement, parameters, context, executemany):
            rec = rec_var.get()
            if rec is not None and "t0" in rec:
                rec["sql_s"] += time.perf_counter() - rec.pop("t0")
                rec["statements"] += 1

        async def timed(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if scope["path"] == STATS_PATH:  # the figures so far, for the load generator
                body = json.dumps({"routes": per_route, **opened}).encode()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            rec = {"sql_s": 0.0, "statements": 0}
            token = rec_var.set(rec)
            t0 = time.perf_counter()
            try:
                await app(scope, receive, send)
            finally:
                rec_var.reset(token)
                d = per_route.setdefault(_route_key(scope), {"app_ms": [], "sql_ms": [], "statements": []})
                d["app_ms"].append(1e3 * (time.perf_counter() - t0))
                d["sql_ms"].append(1e3 * rec["sql_s"])
                d["statements"].append(rec["statements"])

        target = timed
    from backend.cli import serve_options
    from backend.settings import get_settings

    # lstdp serve's own options: its HTTP protocol (httptools with the header timer), access log
    # on (log_level info), proxy headers from FORWARDED_ALLOW_IPS; uvicorn picks uvloop
    config = uvicorn.Config(target, host="127.0.0.1", port=port, workers=1, **serve_options(get_settings()))
    server = uvicorn.Server(config)
    server.run()


def _route_key(scope) -> str:
    path = scope.get("path", "")
    return "/api/v1/events/{id}" if path.startswith("/api/v1/events/") else path


def start_server(url: str, port: int, workers: int, pin: bool, layers: bool, log_path: str, app_root: Path = ROOT):
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(app_root)}
    if workers == 1:
        cmd = [sys.executable, __file__, "--serve", str(port), "--app-root", str(app_root)] \
            + (["--layers"] if layers else [])
    else:
        cmd = [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(workers), "--log-level", "info"]
    log = open(log_path, "wb")
    pre = (lambda: os.sched_setaffinity(0, {0})) if pin else None
    proc = subprocess.Popen(cmd, env=env, cwd=str(app_root), stdout=log, stderr=subprocess.STDOUT, preexec_fn=pre)
    return proc, log


def stop_server(proc) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def cpu_s(pids: list[int]) -> dict[int, float]:
    """``{pid: user + system CPU seconds}`` of the processes of ``pids`` that are alive."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            out[p] = (int(fields[11]) + int(fields[12])) / tick
    return out


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live children (from ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            pids.append(int(child))
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def database_backends(url: str) -> list[int]:
    """PIDs of the PostgreSQL backends connected to the benchmark's database (the server's
    pooled connections, once the warm-up has opened them)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        me = conn.info.backend_pid
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                                           (name, me))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the clients -----------------------------------------------------------------------------


def request_targets(x_flare_id: int) -> list[tuple[str, str]]:
    """``(name, path?query)`` of the five queries of :func:`benchmarks.events_api.queries`."""
    from urllib.parse import urlencode

    return [(name, path + ("?" + urlencode(params) if params else "")) for name, path, params in queries(x_flare_id)]


def linked_flares(url: str) -> list[int]:
    """Ids of the GOES flares of M1 and above that have links (the detail query draws from them)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        return [r[0] for r in conn.execute(
            "SELECT id FROM events e WHERE source = 'goes_xrs' AND goes_flux >= 1e-5 AND EXISTS "
            "(SELECT 1 FROM event_associations a WHERE a.event_id = e.id) ORDER BY id")]


class RandomQueries:
    """The five kinds of query with parameters drawn at random per request (module docstring).

    Times are drawn over the seeded span (:data:`benchmarks.events_api.EPOCH`, ten years), boxes
    within +-900 arcsec (the seeded positions lie within 960 arcsec of the centre)."""

    NAMES = ("day of flares (random day)", "year of CMEs, random PA range", "random bbox over a random month",
             "detail of a random linked flare", "newest 100 >= random GOES class")
    CLASSES = ("B5", "C1", "C5", "M1", "M5")

    def __init__(self, linked: list[int]):
        from benchmarks.events_api import EPOCH, SPAN_S

        self.linked = linked or [1]
        self.epoch, self.span_s = EPOCH, SPAN_S

    def _t(self, rng: random.Random, room_s: float):
        import datetime as dt

        t = self.epoch + dt.timedelta(seconds=rng.uniform(0, self.span_s - room_s))
        return t.replace(second=0, microsecond=0)

    def draw(self, qi: int, rng: random.Random) -> str:
        """``path?query`` of query kind ``qi`` with fresh random parameters."""
        import datetime as dt
        from urllib.parse import urlencode

        def iso(t):
            return t.strftime("%Y-%m-%dT%H:%M:%SZ")

        if qi == 0:
            t = self._t(rng, 86400).replace(minute=0)
            p = {"type": "FL", "start": iso(t), "end": iso(t + dt.timedelta(seconds=86399)), "limit": 100}
        elif qi == 1:
            t = self._t(rng, 366 * 86400)
            lo = round(rng.uniform(0, 360), 1)
            hi = round((lo + rng.uniform(20, 120)) % 360, 1)
            p = {"type": "CE", "start": iso(t), "end": iso(t + dt.timedelta(days=365)), "pa_min": lo, "pa_max": hi,
                 "limit": 100}
        elif qi == 2:
            t = self._t(rng, 31 * 86400)
            x0, y0 = round(rng.uniform(-900, 500), 1), round(rng.uniform(-900, 500), 1)
            p = {"start": iso(t), "end": iso(t + dt.timedelta(days=30)), "hpc_x_min": x0,
                 "hpc_x_max": round(x0 + rng.uniform(100, 400), 1), "hpc_y_min": y0,
                 "hpc_y_max": round(y0 + rng.uniform(100, 400), 1), "limit": 100}
        elif qi == 3:
            return f"/api/v1/events/{rng.choice(self.linked)}"
        else:
            p = {"limit": 100, "min_goes_class": rng.choice(self.CLASSES)}
        return "/api/v1/events?" + urlencode(p)


class RawConnection:
    """One keep-alive HTTP/1.1 connection: ``GET`` and read a ``Content-Length`` answer."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def get(self, target: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(f"GET {target} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = None
        close = False
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"connection" and v.strip().lower() == b"close":
                close = True
        if length is None:
            raise RuntimeError("answer without Content-Length")
        body = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, body

    async def close(self):
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


async def run_load(port: int, targets: list[tuple[str, str]], clients: int, warmup_s: float, duration_s: float,
                   max_requests: int, client_kind: str, server_pid: int, url: str,
                   draw=None, seed: int = 2024) -> dict:
    """Closed-loop load; returns per-query latencies [ms], errors and the CPU split."""
    import httpx

    records: list[tuple[int, float, bool]] = []  # (query index, ms, ok)
    errors_seen: list[str] = []
    state = {"record": False, "stop": False}
    pool = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT_S,
                             limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients)) \
        if client_kind == "httpx" else None

    async def one_client(k: int):
        conn = RawConnection(port) if pool is None else None
        rng = random.Random(seed * 1000 + k)
        i = k
        while not state["stop"]:
            qi = i % len(targets)
            i += 1
            target = targets[qi][1] if draw is None else draw(qi, rng)
            t0 = time.perf_counter()
            ok = False
            try:
                if pool is None:
                    status, body = await asyncio.wait_for(conn.get(target), TIMEOUT_S)
                else:
                    r = await pool.get(target)
                    status, body = r.status_code, r.content
                ok = status == 200
                if ok:
                    json.loads(body)
                elif state["record"] and len(errors_seen) < 5:
                    errors_seen.append(f"{targets[qi][0]} ({target}): HTTP {status} {body[:200]!r}")
            except Exception as exc:  # noqa: BLE001 - every failure is an error of the run
                ok = False
                if state["record"] and len(errors_seen) < 5:
                    errors_seen.append(f"{targets[qi][0]}: {type(exc).__name__}: {exc}")
                if conn is not None:
                    await conn.close()
            ms = 1e3 * (time.perf_counter() - t0)
            if state["record"]:
                records.append((qi, ms, ok))
                if len(records) >= max_requests:
                    state["stop"] = True
        if conn is not None:
            await conn.close()

    tasks = [asyncio.create_task(one_client(k)) for k in range(clients)]
    await asyncio.sleep(warmup_s)
    state["record"] = True
    backends = database_backends(url)
    c0, s0, d0, w0 = os.times(), tree_cpu_s(server_pid), cpu_s(backends), time.perf_counter()
    while not state["stop"] and time.perf_counter() - w0 < duration_s:
        await asyncio.sleep(0.05)
    state["stop"] = True
    state["record"] = False
    wall = time.perf_counter() - w0
    c1, s1, d1 = os.times(), tree_cpu_s(server_pid), cpu_s(backends)
    await asyncio.gather(*tasks)
    if pool is not None:
        await pool.aclose()
    return {"records": records, "wall_s": wall, "errors_seen": errors_seen,
            "client_cpu": (c1.user - c0.user + c1.system - c0.system) / wall, "server_cpu": (s1 - s0) / wall,
            # backends alive at both ends (those of an earlier server may still be exiting)
            "db_cpu": sum(d1[p] - d0[p] for p in d1 if p in d0) / wall, "backends": len(set(d0) & set(d1))}


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server subprocess
    ap.add_argument("--database", default=None, help="an already seeded database (a URL printed by --keep)")
    ap.add_argument("--keep", action="store_true", help="seed a new database and keep it (its URL is printed)")
    ap.add_argument("--drop", action="store_true", help="drop --database and exit")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--frames", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load not recorded")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds recorded at most")
    ap.add_argument("--max-requests", type=int, default=100_000, help="requests recorded at most")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (1 or 2 on this machine)")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                    help="server on core 0, client on core 1")
    ap.add_argument("--layers", action="store_true", help="time the app and its SQL inside the server (workers=1)")
    ap.add_argument("--fixed", action="store_true",
                    help="the five fixed queries of benchmarks.events_api.queries (default: random parameters)")
    ap.add_argument("--report", type=Path, default=None, help="also write the output (Markdown) here")
    ap.add_argument("--app-root", type=Path, default=ROOT,
                    help="serve the app of this checkout (another commit, for before/after comparisons)")
    args = ap.parse_args(argv)

    if args.serve is not None:
        sys.path.insert(0, str(args.app_root))
        for name in [m for m in sys.modules if m == "backend" or m.startswith("backend.")]:
            del sys.modules[name]  # none imported yet; the app comes from --app-root
        serve(args.serve, args.layers)
        return 0
    if args.drop:
        drop_database(args.database)
        print(f"dropped {args.database}")
        return 0
    if args.layers and args.workers != 1:
        ap.error("--layers needs --workers 1")

    buf = io.StringIO()

    def say(line: str = "") -> None:
        print(line)
        buf.write(line + "\n")

    url = args.database
    if url is None:
        url = create_database()
        try:
            info = seed_database(url, args.events, args.frames, args.seed)
        except BaseException:
            drop_database(url)
            raise
        say(info["summary"])
    x_flare_id, n_events = x_flare_of(url)
    targets = request_targets(x_flare_id)
    draw = None
    if not args.fixed:
        randomq = RandomQueries(linked_flares(url))
        draw = randomq.draw
        targets = [(name, "/api/v1/events/{id}" if i == 3 else "/api/v1/events")
                   for i, name in enumerate(RandomQueries.NAMES)]
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="events_api_load_")
    log_path = os.path.join(tmp, "server.log")
    proc, log = start_server(url, port, args.workers, args.pin, args.layers, log_path, args.app_root.resolve())
    try:
        if args.pin:
            os.sched_setaffinity(0, {1})
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited ({proc.returncode}); its log: {log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.time() > deadline:
                raise SystemExit(f"the server did not listen within 60 s; its log: {log_path}")
            time.sleep(0.2)
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:  # pragma: no cover
            runner = asyncio.run
        res = runner(run_load(port, targets, args.clients, args.warmup, args.duration, args.max_requests,
                              args.client, proc.pid, url, draw=draw, seed=args.seed))
        stats = None
        if args.layers:
            async def fetch_stats():
                conn = RawConnection(port)
                try:
                    return json.loads((await conn.get(STATS_PATH))[1])
                finally:
                    await conn.close()

            stats = asyncio.run(fetch_stats())
    finally:
        stop_server(proc)
        log.close()
    shutil.rmtree(tmp, ignore_errors=True)  # the server's log (kept when it failed)
    records = res["records"]
    n = len(records)
    errors = sum(1 for _q, _ms, ok in records if not ok)
    all_ms = [ms for _q, ms, _ok in records]
    rps = n / res["wall_s"]
    say(f"# Event search API under load\n\n{n_events:,} events; uvicorn, {args.workers} worker(s), access log on "
        f"(as `lstdp serve`); {args.clients} clients ({args.client} HTTP/1.1 keep-alive, closed loop), "
        f"{args.warmup:g} s warm-up, {res['wall_s']:.1f} s recorded; "
        + (f"app of {args.app_root}; " if args.app_root.resolve() != ROOT else "")
        + ("server pinned to core 0, client to core 1" if args.pin else "not pinned") + ".\n")
    say("| query | requests | p50 ms | p99 ms | errors |\n|---|---|---|---|---|")
    for qi, (name, target) in enumerate(targets):
        ms = [m for q, m, _ok in records if q == qi]
        err = sum(1 for q, _m, ok in records if q == qi and not ok)
        if ms:
            say(f"| {name} | {len(ms)} | {pct(ms, 0.5):.2f} | {pct(ms, 0.99):.2f} | {err} |")
    say(f"\nAll: {n} requests, {rps:.1f} requests/s, p50 {pct(all_ms, 0.5):.2f} ms, p99 {pct(all_ms, 0.99):.2f} ms, "
        f"{errors} errors. Server CPU per request {1e3 * res['server_cpu'] / rps:.2f} ms, PostgreSQL CPU per request "
        f"{1e3 * res['db_cpu'] / rps:.2f} ms. CPU over the recorded window (share of one core): server "
        f"{100 * res['server_cpu']:.0f} %, "
        f"client {100 * res['client_cpu']:.0f} %, "
        f"PostgreSQL {100 * res['db_cpu']:.0f} % ({res['backends']} backends of the server's pool).")
    for e in res["errors_seen"]:
        say(f"- error: {e}")
    if stats:
        say("\nInside the server (`--layers`; medians per request): *app* = the ASGI app from the request's "
            "arrival in the app to its last byte (middleware, routing, validation, dependencies, thread "
            "hand-offs, SQLAlchemy, JSON); *SQL* = time inside psycopg's `execute` of the request's statements "
            "(round trip and server time); *outside the app* = client p50 minus app p50 (uvicorn's HTTP "
            "parsing and sockets, waiting in the event loop's queue behind other requests, the client).\n")
        say("| route | requests | app p50 ms | app p99 ms | SQL p50 ms | statements | app - SQL p50 ms | "
            "outside the app p50 ms |\n|---|---|---|---|---|---|---|---|")
        for route, d in stats["routes"].items():
            if not d["app_ms"]:
                continue
            if route == "/api/v1/events/{id}":
                client = [m for q, m, _ok in records if targets[q][1].startswith("/api/v1/events/")]
            else:
                client = [m for q, m, _ok in records if not targets[q][1].startswith("/api/v1/events/")]
            app50, sql50 = pct(d["app_ms"], 0.5), pct(d["sql_ms"], 0.5)
            say(f"| {route} | {len(d['app_ms'])} | {app50:.2f} | {pct(d['app_ms'], 0.99):.2f} | {sql50:.2f} | "
                f"{pct(d['statements'], 0.5):.0f} | {app50 - sql50:.2f} | "
                f"{(pct(client, 0.5) - app50) if client else float('nan'):.2f} |")
        say(f"\nConnections opened by the API engine's pool: {stats['connections']} (warm-up requests included "
            "in the server's figures).")
    load1, load5, _ = os.getloadavg()
    say(f"\nQueries: {'fixed' if args.fixed else 'random parameters per request'}; load average at the end "
        f"{load1:.2f} (1 min), {load5:.2f} (5 min).")
    say(f"\nRESULT clients={args.clients} p50_ms={pct(all_ms, 0.5):.2f} p99_ms={pct(all_ms, 0.99):.2f} rps={rps:.1f} "
        f"errors={errors} server_cpu_ms={1e3 * res['server_cpu'] / rps:.2f} seeded={n_events}")
    if args.keep and args.database is None:
        print(f"database kept: {url}", file=sys.stderr)
    elif args.database is None:
        drop_database(url)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(buf.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
