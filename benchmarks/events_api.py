"""Scale benchmark of the event search API on PostgreSQL.

Creates its own database (dropped at the end), migrates it with Alembic (the indexes under
test are those of the migrations), seeds 1,000,000 events, 2,000,000 frames and links
between events with COPY, runs VACUUM ANALYZE, then measures five searches through the
API (in process: ``httpx.AsyncClient`` over ``httpx.ASGITransport``, the app's session
pointed at the benchmark database) against the same SQL statements run directly on the
database (the statements the API sent, captured with a SQLAlchemy ``before_cursor_execute``
hook and replayed with their parameters through psycopg):

1. a day of flares (``type=FL``, one UTC day, solar maximum);
2. a year of CMEs in a position-angle range (``type=CE``, 2024, PA 60-120 deg);
3. events in a helioprojective bounding box over a month;
4. the events linked to one GOES X flare (``GET /events/{id}``);
5. the newest 100 events of every type.

Each is repeated ``--repeat`` times (default 30, after 3 warm-ups). The replay runs the
statements as the API ran them (in autocommit when the API's session was, see
:func:`backend.db.autocommit_reads`), and, in turn before or after, once more inside a
transaction (psycopg's ``BEGIN`` first), which shows what autocommit saves. The EXPLAIN
(ANALYZE, BUFFERS) plan of every statement of each query is printed. The last line is::

    RESULT p50_ms=<worst p50 of the five> p99_ms=<worst p99> api_over_sql=<worst ratio of medians> seeded=<events>

Targets: p99 <= 50 ms for every query, API <= 2x the direct SQL.

Seeded distributions (10 years, 2016-2025, rate following an 11-year cycle with a
maximum in 2024.8 and a floor of 15 % of the peak):

* types: FL 55 % (goes_xrs, hek, detected), CE 15 % (cdaw, donki, detected), AR 12 %
  (noaa_srs), PR 8 % (detected), CH 5 % (hek), others 5 % (hek: CJ, FI, FE, CW);
* flares: durations log-normal (median 18 min), GOES flux power law dN/dF ~ F^-2 from
  B1 (1e-7 W m-2), cut at X30; positions uniform in latitude +-35 deg, longitude +-90 deg
  (Earth view, B0=0), converted to helioprojective arcsec with Rsun = 960 arcsec;
* CMEs: PA uniform, width log-normal (median 45 deg; 3 % halos of 360 deg), speed
  log-normal (median 420 km/s), no end time (like CDAW) or + 2-10 h;
* ARs last one day (an SRS row), coronal holes 1-8 days, prominences 30-240 min;
* frames: four channels at their share of the archive, uniform over the 10 years;
* links: 200,000 flare-CME pairs and 100,000 same-flare pairs, stored both ways.

Where the API time goes, without a profiler: ``--repeat`` more calls of each query with the
driver's calls (psycopg ``execute``, ``fetch*``, ``commit``, ``rollback``: round trips and
server time), the search or detail service, the JSON serialisation and the pool's pre-ping
timed by wrapping them (:func:`instrumented`); the rest of the call is FastAPI/Starlette
(routing, query validation, dependencies, worker-thread hand-offs) and the in-process
client. Floors are measured too (:func:`floors`): the client and ASGI transport with a bare
Starlette app, FastAPI with an async and with a synchronous endpoint, FastAPI with the
parameters and dependencies of ``GET /events`` but no database work, and one ``SELECT 1``
round trip.

With ``--profile N`` each query is then called N more times under :mod:`cProfile` (in the
event loop's thread and, through a wrapper of ``anyio.to_thread.run_sync``, in the worker
threads where FastAPI runs the synchronous dependencies and handlers), and for each query
the own time and the number of function calls per package are printed, with the top
functions of the query with the worst API/SQL ratio. Profiling slows Python down (each
function call is counted), so its times are shares, not latencies; the latencies are those
measured before it. The function-call counts hardly depend on the machine's load (only the
event loop's iterations vary).

``--keep`` keeps the seeded database (its URL is printed); ``--database URL`` measures an
already seeded one (no seeding, not dropped), for iterating on the code.

Run: ``.venv/bin/python benchmarks/events_api.py [--events N] [--frames N] [--repeat N]
[--profile N] [--report PATH] [--keep | --database URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN = os.environ.get("LSTDP_BENCH_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
EPOCH = dt.datetime(2016, 1, 1, tzinfo=dt.UTC)
YEARS = 10
SPAN_S = (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) - EPOCH).total_seconds()
RSUN_ARCSEC = 960.0
CLASS_LETTERS = np.array(["A", "B", "C", "M", "X"])


def _admin():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")


def create_database() -> str:
    from sqlalchemy import text

    name = f"lstdp_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    eng = _admin()
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


def drop_database(url: str) -> None:
    from sqlalchemy import text

    eng = _admin()
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    eng.dispose()


# -- seeding ---------------------------------------------------------------------------------


def _cycle_times(rng: np.random.Generator, n: int) -> np.ndarray:
    """Seconds since EPOCH, with a rate following an 11-year cycle peaking at 2024.8."""
    out = np.empty(0)
    while out.size < n:
        t = rng.uniform(0, SPAN_S, 2 * n)
        years = 2016 + t / (365.25 * 86400)
        rate = 0.15 + 0.85 * np.cos(np.pi * (years - 2024.8) / 11.0) ** 2
        out = np.concatenate([out, t[rng.uniform(0, 1, t.size) < rate]])
    return np.sort(out[:n])


def _iso(sec: np.ndarray) -> np.ndarray:
    base = np.datetime64("2016-01-01T00:00:00")
    t = base + (sec * 1e6).astype("timedelta64[us]")
    return np.char.add(np.datetime_as_string(t, unit="s"), "+00")


def _fmt(a: np.ndarray, mask: np.ndarray | None = None, fmt: str = "%.6g") -> np.ndarray:
    s = np.char.mod(fmt, a) if a.dtype.kind == "f" else a.astype(str)
    if mask is not None:
        s = np.where(mask, "\\N", s)
    return s


def seed_events(conn, n: int, rng: np.random.Generator) -> dict:
    """COPY ``n`` events; returns ids of interest (an X flare with links)."""
    kinds = rng.choice(["FL", "CE", "AR", "PR", "CH", "OT"], size=n, p=[0.55, 0.15, 0.12, 0.08, 0.05, 0.05])
    start = _cycle_times(rng, n)
    rng.shuffle(kinds)
    is_fl, is_ce, is_pr = kinds == "FL", kinds == "CE", kinds == "PR"
    other_types = rng.choice(["CJ", "FI", "FE", "CW"], size=n)
    kinds = np.where(kinds == "OT", other_types, kinds)
    source = np.full(n, "hek", dtype=object)
    source[is_fl] = rng.choice(["goes_xrs", "hek", "detected"], size=is_fl.sum(), p=[0.4, 0.3, 0.3])
    source[is_ce] = rng.choice(["cdaw", "donki", "detected"], size=is_ce.sum(), p=[0.5, 0.3, 0.2])
    source[kinds == "AR"] = "noaa_srs"
    source[is_pr] = "detected"
    dur = np.zeros(n)
    dur[is_fl] = 60 * np.exp(rng.normal(np.log(18), 0.6, is_fl.sum()))
    ce_end = rng.uniform(0, 1, n) < 0.4
    dur[is_ce & ce_end] = rng.uniform(2 * 3600, 10 * 3600, (is_ce & ce_end).sum())
    dur[kinds == "AR"] = 86400.0
    dur[kinds == "CH"] = rng.uniform(1, 8, (kinds == "CH").sum()) * 86400
    dur[is_pr] = rng.uniform(30, 240, is_pr.sum()) * 60
    oth = np.isin(kinds, ["CJ", "FI", "FE", "CW"])
    dur[oth] = rng.uniform(5, 180, oth.sum()) * 60
    no_end = is_ce & ~ce_end
    peak = start + np.where(is_fl, 0.4 * dur, 0.0)
    end = start + dur
    # GOES flux: dN/dF ~ F^-2 above 1e-7, cut at X30 (3e-3 W m-2)
    flux = np.minimum(1e-7 / rng.uniform(1e-7 / 3e-3, 1, n), 3e-3)
    has_cls = is_fl & (source != "detected")
    dec = np.clip(np.floor(np.log10(flux)).astype(int), -8, -4)
    mult = np.floor(flux / 10.0 ** dec * 10) / 10
    cls = np.char.add(CLASS_LETTERS[dec + 8], np.char.mod("%.1f", mult))
    flux = mult * 10.0 ** dec
    lat = np.radians(rng.uniform(-35, 35, n))
    lon = np.radians(rng.uniform(-90, 90, n))
    hpc_x = RSUN_ARCSEC * np.cos(lat) * np.sin(lon)
    hpc_y = RSUN_ARCSEC * np.sin(lat)
    has_pos = is_fl | (kinds == "AR") | oth | (kinds == "CH")
    pa = rng.uniform(0, 360, n)
    width = np.where(rng.uniform(0, 1, n) < 0.03, 360.0, np.minimum(np.exp(rng.normal(np.log(45), 0.5, n)), 359))
    speed = np.exp(rng.normal(np.log(420), 0.5, n))
    has_pa = is_ce | is_pr
    peak_value = np.where(source == "detected", rng.uniform(5, 300, n), np.nan)
    frm = np.where(source == "detected",
                   np.where(is_fl, "lst-sdi-flare", np.where(is_ce, "lst-sci-cme", "lst-prominence-eruption")),
                   np.where(source == "goes_xrs", "SWPC", "\\N"))
    frm_v = np.where(source == "detected", np.where(rng.uniform(0, 1, n) < 0.7, "1.0.0", "0.9.0"), "\\N")
    channels = np.where(source == "detected", np.where(is_fl, "SDI", "SCI-UV"), "\\N")
    ids = np.arange(1, n + 1)
    cols = [
        ids.astype(str), kinds.astype(str), source.astype(str), np.char.add("bench-", ids.astype(str)),
        _iso(start), np.where(is_fl, _iso(peak), "\\N"), np.where(no_end | (dur == 0), "\\N", _iso(end)),
        channels, _fmt(hpc_x, ~has_pos, "%.1f"), _fmt(hpc_y, ~has_pos, "%.1f"),
        _fmt(np.degrees(lat), ~has_pos, "%.1f"), _fmt(np.degrees(lon), ~has_pos, "%.1f"),
        _fmt(pa, ~has_pa, "%.1f"), _fmt(width, ~is_ce, "%.0f"), _fmt(speed, ~is_ce, "%.0f"),
        np.where(has_cls, cls, "\\N"), _fmt(flux, ~has_cls, "%.3e"), _fmt(peak_value, np.isnan(peak_value), "%.2f"),
        np.where(np.isnan(peak_value), "\\N", "%"), frm, frm_v, np.full(n, "{}"), np.full(n, "2026-01-01 00:00:00+00"),
        _fmt(np.where(no_end, 0.0, dur), None, "%.1f"),
    ]
    columns = ("id, event_type, source, source_key, start_time, peak_time, end_time, channels, hpc_x, hpc_y, "
               "hgs_lat, hgs_lon, position_angle, angular_width, speed_km_s, goes_class, goes_flux, peak_value, "
               "peak_unit, frm_name, frm_version, attributes, created_at, duration_s")
    _copy(conn, f"COPY events ({columns}) FROM STDIN", cols)
    conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), %s)", (n,))
    # links: flare -> CME (a CME 0-90 min after the flare), same-flare pairs
    fl_ids, ce_ids = ids[is_fl], ids[is_ce]
    ce_start = start[is_ce]
    a = rng.choice(fl_ids, size=min(200_000, fl_ids.size), replace=False)
    j = np.clip(np.searchsorted(ce_start, start[a - 1] + rng.uniform(0, 5400, a.size)), 0, ce_ids.size - 1)
    b = ce_ids[j]
    g = rng.choice(fl_ids, size=min(100_000, fl_ids.size), replace=False)
    h = np.clip(g + rng.integers(1, 5, g.size), 1, n)
    src = np.concatenate([a, b, g, h])
    dst = np.concatenate([b, a, h, g])
    kind = np.concatenate([np.full(a.size, "flare_cme"), np.full(a.size, "cme_flare"),
                           np.full(2 * g.size, "same_flare")])
    keep = src != dst
    pairs = {}
    for s_, d_, k_ in zip(src[keep].tolist(), dst[keep].tolist(), kind[keep].tolist()):
        pairs.setdefault((s_, d_), k_)
    arr = np.array(list(pairs.keys()))
    # each link carries its other event's type (the seeded events are all public: owner NULL)
    _copy(conn, "COPY event_associations (event_id, other_event_id, kind, other_event_type) FROM STDIN",
          [arr[:, 0].astype(str), arr[:, 1].astype(str), np.array(list(pairs.values())),
           kinds[arr[:, 1] - 1].astype(str)])
    # an X flare of the GOES source that has links
    linked = np.zeros(n + 1, bool)
    linked[arr[:, 0]] = True
    xs = ids[has_cls & (flux >= 1e-4) & (source == "goes_xrs") & linked[1:]]
    return {"x_flare_id": int(xs[len(xs) // 2]), "associations": len(pairs)}


def seed_frames(conn, n: int, rng: np.random.Generator) -> None:
    ch = rng.choice(["SDI", "WST", "SCI-UV", "SCI-WL"], size=n, p=[0.5, 0.25, 0.125, 0.125])
    t = np.sort(rng.uniform(0, SPAN_S, n))
    ids = np.arange(1, n + 1)
    naxis = np.where(np.isin(ch, ["SDI", "WST"]), "4608", "2048")
    sha = np.char.add(np.char.mod("%032x", ids), np.char.mod("%032x", ids * 2654435761 % (1 << 62)))
    name = np.char.add(np.char.add(np.char.add("lst_", ch), "_"), np.char.add(ids.astype(str), ".fits"))
    cols = [ids.astype(str), ch, _iso(t), np.char.mod("%.2f", rng.uniform(0.01, 20, n)), np.full(n, "L1"),
            naxis, naxis, np.char.add("/archive/", name), name, sha, np.full(n, "42467328"), np.full(n, "{}"),
            np.full(n, "0"), np.full(n, "2026-01-01 00:00:00+00")]
    _copy(conn, "COPY frames (id, channel_code, date_obs, exposure_s, level, naxis1, naxis2, path, original_name, "
                "sha256, size_bytes, header, quality_flags, ingested_at) FROM STDIN", cols)
    conn.execute("SELECT setval(pg_get_serial_sequence('frames', 'id'), %s)", (n,))


def _copy(conn, sql: str, cols: list[np.ndarray], chunk: int = 200_000) -> None:
    n = len(cols[0])
    with conn.cursor() as cur, cur.copy(sql) as cp:
        for i in range(0, n, chunk):
            parts = [np.asarray(c[i:i + chunk]).astype(str) for c in cols]
            line = parts[0]
            for p in parts[1:]:
                line = np.char.add(np.char.add(line, "\t"), p)
            cp.write("\n".join(line.tolist()) + "\n")


def seed_database(url: str, events: int, frames: int, seed: int) -> dict:
    """Migrate the empty database ``url`` (Alembic), seed ``events`` events and ``frames``
    frames with COPY (:func:`seed_events`, :func:`seed_frames`), VACUUM ANALYZE.

    Returns
    -------
    dict
        ``x_flare_id``, ``associations`` (rows) and ``summary`` (one sentence: counts, times,
        table sizes).
    """
    import psycopg

    from backend.migrate import upgrade

    t0 = time.perf_counter()
    upgrade(url)
    rng = np.random.default_rng(seed)
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        info = seed_events(conn, events, rng)
        seed_frames(conn, frames, rng)
        conn.commit()
    t1 = time.perf_counter()
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        sizes = conn.execute("SELECT relname, pg_size_pretty(pg_total_relation_size(oid)) FROM pg_class "
                             "WHERE relname IN ('events', 'frames', 'event_associations')").fetchall()
    t2 = time.perf_counter()
    info["summary"] = (f"Seeded {events:,} events, {frames:,} frames, {info['associations']:,} association "
                       f"rows by COPY in {t1 - t0:.0f} s (with migrations); VACUUM ANALYZE {t2 - t1:.0f} s. Sizes: "
                       + ", ".join(f"{a} {b}" for a, b in sizes) + ".")
    return info


# -- measuring -------------------------------------------------------------------------------


def queries(x_flare_id: int) -> list[tuple[str, str, dict]]:
    return [
        ("day of flares", "/api/v1/events",
         {"type": "FL", "start": "2024-10-03T00:00:00Z", "end": "2024-10-03T23:59:59Z", "limit": 100}),
        ("year of CMEs, PA 60-120", "/api/v1/events",
         {"type": "CE", "start": "2024-01-01T00:00:00Z", "end": "2024-12-31T23:59:59Z", "pa_min": 60,
          "pa_max": 120, "limit": 100}),
        ("bbox over a month", "/api/v1/events",
         {"start": "2024-06-01T00:00:00Z", "end": "2024-06-30T23:59:59Z", "hpc_x_min": 200, "hpc_x_max": 500,
          "hpc_y_min": -300, "hpc_y_max": 0, "limit": 100}),
        ("linked to a GOES X flare", f"/api/v1/events/{x_flare_id}", {}),
        ("newest 100", "/api/v1/events", {"limit": 100}),
    ]


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = int(np.floor(k))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def x_flare_of(url: str) -> tuple[int, int]:
    """The X flare of the GOES source with links that :func:`seed_events` picks (the middle
    one by id) and the number of events, in an already seeded database."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM events e WHERE source = 'goes_xrs' AND goes_flux >= 1e-4 AND EXISTS "
            "(SELECT 1 FROM event_associations a WHERE a.event_id = e.id) ORDER BY id")]
        n = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    return ids[len(ids) // 2], n


# -- profiling -------------------------------------------------------------------------------

#: Package of a profiled function, by its file path (the first match wins).
_PACKAGES = (("/psycopg", "psycopg (driver)"), ("/sqlalchemy/", "sqlalchemy"), ("/fastapi/", "fastapi"),
             ("/starlette/", "starlette"), ("/pydantic", "pydantic"), ("/anyio/", "anyio"),
             ("/httpx/", "httpx (benchmark client)"), ("/httpcore/", "httpx (benchmark client)"),
             ("/asyncio/", "asyncio"), ("/backend/", "backend (this project)"), ("/threading.py", "threading"))


def _package(key: tuple) -> str:
    path, _line, name = key
    if path == "~":
        if "epoll" in name or "select" in name:
            return "event loop waiting (epoll)"
        if "acquire" in name:
            return "threads waiting (locks)"
        return "builtins"
    for needle, label in _PACKAGES:
        if needle in path:
            return label
    return "other Python"


def _short(key: tuple) -> str:
    path, line, name = key
    if path == "~":
        return name
    for marker in ("site-packages/", "/lib/python3.11/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line}({name})"


@contextlib.contextmanager
def worker_thread_profiles(profiles: list):
    """Profile every function that FastAPI and Starlette run in worker threads: wrap
    ``anyio.to_thread.run_sync`` (which ``run_in_threadpool`` and FastAPI's synchronous
    dependencies call) so that each call runs under its own :class:`cProfile.Profile`,
    appended to ``profiles`` (cProfile hooks one thread only)."""
    import anyio.to_thread

    original = anyio.to_thread.run_sync

    async def run_sync(func, *args, **kwargs):
        def profiled(*a):
            prof = cProfile.Profile()
            prof.enable()
            try:
                return func(*a)
            finally:
                prof.disable()
                profiles.append(prof)

        return await original(profiled, *args, **kwargs)

    anyio.to_thread.run_sync = run_sync
    try:
        yield
    finally:
        anyio.to_thread.run_sync = original


class Breakdown:
    """Exclusive wall time [s] spent in labelled functions during one API call, by wrapping them
    (:func:`instrumented`); a function called inside another labelled one counts for itself
    only (the outer one gets the rest). One request at a time (the benchmark's case)."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.inclusive: dict[str, float] = {}
        self._stack: list[list] = []

    def wrap(self, label: str, func, inclusive: bool = False):
        """``func`` timed under ``label``; ``inclusive``: an "of which" figure, the whole time
        of the call (its labelled callees keep theirs), left out of the exclusive times."""
        if inclusive:
            def timed_inclusive(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return func(*args, **kwargs)
                finally:
                    self.inclusive[label] = self.inclusive.get(label, 0.0) + time.perf_counter() - t0

            return timed_inclusive

        def timed(*args, **kwargs):
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return func(*args, **kwargs)
            finally:
                self._stack.pop()
                elapsed = time.perf_counter() - frame[0]
                self.times[label] = self.times.get(label, 0.0) + elapsed - frame[1]
                self.calls[label] = self.calls.get(label, 0) + 1
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed

    def reset(self) -> None:
        self.times.clear()
        self.calls.clear()
        self.inclusive.clear()


#: (module, attribute, label) of the functions :func:`instrumented` times. Driver: every
#: psycopg call that talks to the server (``execute`` includes the BEGIN psycopg sends first
#: in a transaction, and the pool's pre-ping), the fetches and the transaction end.
_TIMED = (
    ("psycopg", "Cursor.execute", "driver"), ("psycopg", "Cursor.fetchall", "driver"),
    ("psycopg", "Cursor.fetchmany", "driver"), ("psycopg", "Cursor.fetchone", "driver"),
    ("psycopg", "Connection.rollback", "driver"), ("psycopg", "Connection.commit", "driver"),
    ("backend.services.event_search", "search_events", "search service (SQLAlchemy, Python)"),
    ("backend.api.routes.events", "_event_or_404", "detail service (SQLAlchemy, Python)"),
    ("backend.api.routes.events", "event_detail", "detail service (SQLAlchemy, Python)"),
    ("backend.api.routes.events", "detail_json", "serialisation"),
    ("backend.api.routes.events", "page_json", "serialisation"),
    ("sqlalchemy.engine.default", "DefaultDialect._do_ping_w_event",
     "of which pool pre-ping (its round trip included)"),
)
#: Labels of :data:`_TIMED` that are "of which" figures (see :meth:`Breakdown.wrap`).
_INCLUSIVE = {"of which pool pre-ping (its round trip included)"}


@contextlib.contextmanager
def instrumented(clock: Breakdown):
    """Wrap the functions of :data:`_TIMED` (those that exist) with ``clock`` while active."""
    import importlib

    undo = []
    for module, attr, label in _TIMED:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            continue
        original = owner.__dict__.get(name, getattr(owner, name))
        setattr(owner, name, clock.wrap(label, original, inclusive=label in _INCLUSIVE))
        undo.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


async def breakdown_query(client, path: str, params: dict, calls: int) -> dict:
    """Median wall time [ms] per API call in each labelled part (see :data:`_TIMED`), the rest
    (FastAPI/Starlette routing, parameter validation, dependencies, worker-thread hand-offs,
    the in-process httpx client) and the driver calls per API call."""
    clock = Breakdown()
    per: dict[str, list[float]] = {}
    ncalls = []
    with instrumented(clock):
        for _ in range(calls):
            clock.reset()
            t0 = time.perf_counter()
            r = await client.get(path, params=params)
            total = time.perf_counter() - t0
            assert r.status_code == 200
            for k, v in clock.times.items():
                per.setdefault(k, []).append(1e3 * v)
            for k in _INCLUSIVE:
                per.setdefault(k, []).append(1e3 * clock.inclusive.get(k, 0.0))
            per.setdefault("rest: routing, validation, threads, client", []).append(
                1e3 * (total - sum(clock.times.values())))
            per.setdefault("total", []).append(1e3 * total)
            ncalls.append(clock.calls.get("driver", 0))
    out = {k: pct(v, 0.5) for k, v in per.items()}
    out["driver calls"] = pct(ncalls, 0.5)
    return out


async def profile_query(client, path: str, params: dict, calls: int) -> dict:
    """``calls`` API calls of one query under cProfile (event-loop thread and worker threads).

    Returns the :class:`pstats.Stats` of the worker threads, of the event-loop thread and both
    merged, the profiled wall time per call [ms], the own time [ms] and primitive function calls
    per package per API call, and the cumulative time of psycopg's ``Cursor.execute`` [ms].
    """
    main = cProfile.Profile()
    workers: list[cProfile.Profile] = []
    with worker_thread_profiles(workers):
        t0 = time.perf_counter()
        main.enable()
        for _ in range(calls):
            r = await client.get(path, params=params)
            assert r.status_code == 200
        main.disable()
        wall = 1e3 * (time.perf_counter() - t0) / calls
    loop_stats = pstats.Stats(main)
    worker_stats = pstats.Stats(workers[0])
    for p in workers[1:]:
        worker_stats.add(p)
    stats = pstats.Stats(main)
    for p in workers:
        stats.add(p)
    by_pkg: dict[str, float] = {}
    calls_pkg: dict[str, float] = {}
    execute = 0.0
    # primitive calls (cc): a coroutine's resumptions are not counted as calls
    fcalls = sum(cc for cc, *_ in stats.stats.values()) / calls
    for key, (cc, _nc, tt, ct, _callers) in stats.stats.items():
        by_pkg[_package(key)] = by_pkg.get(_package(key), 0.0) + 1e3 * tt / calls
        calls_pkg[_package(key)] = calls_pkg.get(_package(key), 0.0) + cc / calls
        if "/psycopg/cursor.py" in key[0] and key[2] == "execute":
            execute += 1e3 * ct / calls
    return {"stats": stats, "loop": loop_stats, "workers": worker_stats, "wall": wall, "by_package": by_pkg,
            "execute": execute, "calls": calls, "function_calls": fcalls, "calls_by_package": calls_pkg,
            "hand_offs": len(workers) / calls}


def _top(st: dict, n: int, calls: int, idx: int, skip=lambda key: False) -> list[str]:
    rows = sorted(((k, v) for k, v in st.items() if not skip(k)), key=lambda kv: -kv[1][idx])[:n]
    return [f"{1e3 * tt / calls:6.3f} {1e3 * ct / calls:6.3f} {cc / calls:6.1f}  {_short(key)}"
            for key, (cc, _nc, tt, ct, _c) in rows]


def _benchmark_frame(key: tuple) -> bool:
    """The benchmark's own frames and the event loop's idle wait (not the app's work)."""
    return ("benchmarks/" in key[0] or "/asyncio/" in key[0] or "selectors.py" in key[0]
            or _package(key) == "event loop waiting (epoll)"
            or key[2] == "<method 'run' of '_contextvars.Context' objects>")


def print_profile(name: str, prof: dict, out, top: int = 0) -> None:
    """One query's profile: own time and function calls per package; with ``top``, the
    ``top`` functions of the worker threads by cumulative time, of the event-loop thread by
    cumulative time, and of both by own time (ms per call under the profiler)."""
    n = prof["calls"]
    idle = prof["by_package"].get("event loop waiting (epoll)", 0.0)
    pk = sorted(((k, v) for k, v in prof["by_package"].items() if k != "event loop waiting (epoll)"),
                key=lambda kv: -kv[1])
    print(f"\n**{name}**: {prof['function_calls']:,.0f} Python function calls per API call (a count that hardly "
          f"depends on the machine load), {prof['hand_offs']:.0f} hand-offs to a worker thread; {prof['wall']:.2f} ms "
          f"per call under the profiler, of which the event loop idles {idle:.2f} ms while a worker thread runs; "
          f"psycopg `Cursor.execute` (round trips and result transfer) {prof['execute']:.2f} ms cumulative. Own "
          "time per package (ms per call; function calls): "
          + ", ".join(f"{k} {v:.2f} ({prof['calls_by_package'][k]:,.0f})" for k, v in pk if v >= 0.005) + ".",
          file=out)
    if not top:
        return
    head = "```\n   own    cum  calls  function"
    lists = (
        ("worker threads (FastAPI's synchronous dependencies and the handler), by cumulative time",
         prof["workers"].stats, 3, lambda k: False),
        ("event-loop thread (routing, validation, the ASGI app, the httpx client), by cumulative time; the "
         "benchmark's frames and the idle wait left out", prof["loop"].stats, 3, _benchmark_frame),
        ("both threads, by own time; the idle wait left out", prof["stats"].stats, 2,
         lambda k: _package(k) == "event loop waiting (epoll)"),
    )
    for label, st, idx, skip in lists:
        print(f"\nTop {top}, {label} (ms per API call under the profiler; calls per API call, a coroutine "
              "counted once per call):\n", file=out)
        print(head, file=out)
        print("\n".join(_top(st, top, n, idx, skip)), file=out)
        print("```", file=out)


async def measure(url: str, x_flare_id: int, repeat: int, out, profile: int = 0) -> dict:
    import httpx
    from sqlalchemy import event

    from backend import db as dbmod
    from backend.api.app import create_app
    from backend.settings import get_settings

    # the app's own settings and engine, pointed at the benchmark database (no dependency
    # override: FastAPI analyses an override's signature on every request, ~10 ms)
    os.environ["DATABASE_URL"] = url
    get_settings.cache_clear()
    dbmod.reset_caches()
    engine = dbmod.get_engine("api")  # the engine of the API's sessions (backend.api.deps.get_session)
    # the routes' own handlers, whose statements go through SQLAlchemy and are captured below: the
    # lean events path (backend/api/lean_events.py, issue 29) sends its own on the psycopg cursor,
    # unseen by the capture; events_api_load.py measures it (LEAN_EVENTS=1 here runs it, without
    # the API/SQL comparison's meaning)
    os.environ.setdefault("LEAN_EVENTS", "0")
    app = create_app()
    captured: list[tuple[str, object]] = []
    capturing = {"on": False}

    autocommit = {"api": False}

    @event.listens_for(engine, "before_cursor_execute")
    def _capture(conn, cursor, statement, parameters, context, executemany):
        if capturing["on"]:
            captured.append((statement, parameters))
            autocommit["api"] = bool(conn.connection.dbapi_connection.autocommit)

    results = {}
    raw = engine.raw_connection()
    # a second connection for the replay in a transaction: its ROLLBACKs make psycopg drop the
    # connection's prepared statements, which the replay as the API ran it keeps (like the API)
    raw_tx = engine.raw_connection()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
        for name, path, params in queries(x_flare_id):
            captured.clear()
            capturing["on"] = True
            r = await client.get(path, params=params)
            capturing["on"] = False
            assert r.status_code == 200, r.text
            body = r.json()
            stmts = [(s, p) for s, p in captured if not s.lstrip().upper().startswith(("SELECT 1", "ROLLBACK"))]
            # replayed as the API ran them: in autocommit or in a transaction (psycopg's BEGIN first)
            raw.rollback()
            raw.driver_connection.autocommit = autocommit["api"]
            api_ms, sql_ms, tx_ms = [], [], []
            for i in range(repeat + 3):
                t0 = time.perf_counter()
                r = await client.get(path, params=params)
                t1 = time.perf_counter()
                assert r.status_code == 200
                # the replay as the API ran it, and the same statements in a transaction (psycopg's
                # BEGIN first; ROLLBACK untimed) for what autocommit saves; in turn first
                took = {}
                for which in ("api", "tx") if i % 2 == 0 else ("tx", "api"):
                    conn = raw if which == "api" else raw_tx
                    cur = conn.cursor()
                    t2 = time.perf_counter()
                    for s, p in stmts:
                        cur.execute(s, p)
                        cur.fetchall()
                    took[which] = time.perf_counter() - t2
                    cur.close()
                    conn.rollback()
                if i >= 3:
                    api_ms.append(1e3 * (t1 - t0))
                    sql_ms.append(1e3 * took["api"])
                    tx_ms.append(1e3 * took["tx"])
            res = {
                "api_p50": pct(api_ms, 0.5), "api_p99": pct(api_ms, 0.99),
                "sql_p50": pct(sql_ms, 0.5), "sql_p99": pct(sql_ms, 0.99), "tx_p50": pct(tx_ms, 0.5),
                "items": len(body.get("items", body.get("associated", []))),
                "total": body.get("total"), "estimate": body.get("total_is_estimate"),
                "truncated": body.get("truncated"), "statements": len(stmts),
            }
            res["ratio"] = res["api_p50"] / res["sql_p50"]
            results[name] = res
            print(f"\n### {name}\n", file=out)
            print(f"`GET {path}?{'&'.join(f'{k}={v}' for k, v in params.items())}`\n", file=out)
            print(f"API p50 {res['api_p50']:.2f} ms, p99 {res['api_p99']:.2f} ms; direct SQL p50 "
                  f"{res['sql_p50']:.2f} ms, p99 {res['sql_p99']:.2f} ms; API/SQL {res['ratio']:.2f}; "
                  f"{res['items']} rows returned, total {res['total']} (estimate: {res['estimate']}), "
                  f"truncated {res['truncated']}; {len(stmts)} SQL statements, "
                  f"{'in autocommit' if autocommit['api'] else 'in a transaction'} (the replay too); the same "
                  f"statements in a transaction (BEGIN first) p50 {res['tx_p50']:.2f} ms\n", file=out)
            cur = raw.cursor()
            for s, p in stmts:
                if s.lstrip().upper().startswith("EXPLAIN"):
                    print("```\n" + s.strip() + "\n-- (the planner's row estimate for total_is_estimate)\n```",
                          file=out)
                    continue
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + s, p)
                plan = "\n".join(row[0] for row in cur.fetchall())
                print("```\n" + s.strip() + "\n-- params: " + json.dumps(p, default=str) + "\n\n" + plan + "\n```",
                      file=out)
            cur.close()
            raw.rollback()
            out.flush()
        # the floor of any API call: routing, a session with its pool pre-ping, SELECT 1, JSON
        floor = []
        for i in range(repeat + 3):
            t0 = time.perf_counter()
            r = await client.get("/api/v1/health")
            if i >= 3:
                floor.append(1e3 * (time.perf_counter() - t0))
        results["_floor"] = {"p50": pct(floor, 0.5), "p99": pct(floor, 0.99)}
        raw.rollback()
        raw.driver_connection.autocommit = False
        results["_breakdown"] = {name: await breakdown_query(client, path, params, repeat)
                                 for name, path, params in queries(x_flare_id)}
        if profile:
            results["_profiles"] = {name: await profile_query(client, path, params, profile)
                                    for name, path, params in queries(x_flare_id)}
    results["_floors"] = await floors(raw, repeat)
    raw.close()
    raw_tx.close()
    engine.dispose()
    return results


def floor_apps():
    """ASGI apps for the floors of :func:`floors`, each answering ``{}`` at ``/floor``: a bare
    Starlette app; FastAPI with an ``async`` endpoint and with a synchronous one (run in a worker
    thread); FastAPI with the parameters and dependencies of ``GET /events`` (the project's own,
    from ``backend.api.routes``) and a synchronous endpoint, without session, search or JSON."""
    from fastapi import FastAPI, Response
    from starlette.applications import Starlette
    from starlette.routing import Route

    from backend.api.routes.events import CursorQuery, FormatQuery, SortQuery
    from backend.api.params import EventSearchDep, PaginationDep
    from backend.services.event_search import DEFAULT_SORT

    async def bare(request):
        return Response(b"{}", media_type="application/json")

    fa_async, fa_sync, fa_search = FastAPI(), FastAPI(), FastAPI()

    @fa_async.get("/floor")
    async def floor_async():
        return Response(b"{}", media_type="application/json")

    @fa_sync.get("/floor")
    def floor_sync():
        return Response(b"{}", media_type="application/json")

    def floor_search(page, filters, sort=DEFAULT_SORT, cursor=None, format="json"):  # noqa: A002
        return Response(b"{}", media_type="application/json")

    # the annotations as objects (this module's are strings, resolved in its globals by FastAPI)
    floor_search.__annotations__ = {"page": PaginationDep, "filters": EventSearchDep, "sort": SortQuery,
                                    "cursor": CursorQuery, "format": FormatQuery}
    fa_search.get("/floor")(floor_search)

    return {
        "client and ASGI transport (bare Starlette app)": Starlette(routes=[Route("/floor", bare)]),
        "FastAPI, async endpoint": fa_async,
        "FastAPI, synchronous endpoint (one worker-thread hand-off)": fa_sync,
        "FastAPI with the parameters and dependencies of GET /events": fa_search,
    }


async def floors(raw, repeat: int) -> dict:
    """p50 [ms] of what an API call cannot go below here: the apps of :func:`floor_apps` called
    with the parameters of the "day of flares" query, and one database round trip
    (``SELECT 1`` through psycopg)."""
    import httpx

    params = queries(0)[0][2]
    out = {}
    for name, app in floor_apps().items():
        ms = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
            for i in range(repeat + 3):
                t0 = time.perf_counter()
                r = await client.get("/floor", params=params)
                if i >= 3:
                    ms.append(1e3 * (time.perf_counter() - t0))
                assert r.status_code == 200, r.text
        out[name] = pct(ms, 0.5)
    rt_ms = []
    cur = raw.cursor()
    for i in range(repeat + 3):
        t0 = time.perf_counter()
        cur.execute("SELECT 1")
        cur.fetchall()
        if i >= 3:
            rt_ms.append(1e3 * (time.perf_counter() - t0))
    cur.close()
    raw.rollback()
    out["one database round trip (SELECT 1 through psycopg)"] = pct(rt_ms, 0.5)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--frames", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--report", type=Path, default=None, help="also write the output (Markdown) here")
    ap.add_argument("--keep", action="store_true", help="keep the database (its URL is printed)")
    ap.add_argument("--database", default=None,
                    help="measure this already seeded database (a URL printed by --keep): no seeding, not dropped")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then profile N API calls of each query with cProfile (0: no profile)")
    args = ap.parse_args(argv)

    import psycopg


    buf = io.StringIO()

    class Tee:
        def write(self, s):
            sys.stdout.write(s)
            buf.write(s)

        def flush(self):
            sys.stdout.flush()

    out = Tee()
    url = args.database or create_database()
    try:
        print("# Event search API at scale\n", file=out)
        if args.database:
            x_flare_id, n_events = x_flare_of(url)
            with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
                n_frames = conn.execute("SELECT count(*) FROM frames").fetchone()[0]
            print(f"Measured an already seeded database: {n_events:,} events, {n_frames:,} frames. "
                  f"{args.repeat} repetitions per query after 3 warm-ups; API in process (httpx ASGITransport), "
                  "direct SQL = the API's statements replayed through psycopg.", file=out)
        else:
            info = seed_database(url, args.events, args.frames, args.seed)
            x_flare_id, n_events = info["x_flare_id"], args.events
            print(info["summary"] + f" {args.repeat} repetitions per query after 3 "
                  "warm-ups; API in process (httpx ASGITransport), direct SQL = the API's statements replayed "
                  "through psycopg.", file=out)
        results = asyncio.run(measure(url, x_flare_id, args.repeat, out, args.profile))
        profiles = results.pop("_profiles", None)
        floor = results.pop("_floor")
        breakdown = results.pop("_breakdown")
        bare = results.pop("_floors")
        print("\n## Summary\n", file=out)
        print("| query | API p50 ms | API p99 ms | SQL p50 ms | SQL p99 ms | API/SQL | SQL in a transaction p50 ms |\n"
              "|---|---|---|---|---|---|---|", file=out)
        for name, r in results.items():
            print(f"| {name} | {r['api_p50']:.2f} | {r['api_p99']:.2f} | {r['sql_p50']:.2f} | {r['sql_p99']:.2f} "
                  f"| {r['ratio']:.2f} | {r['tx_p50']:.2f} |", file=out)
        print("\nFloor of an API call (`GET /api/v1/health`: routing, session with pool pre-ping, BEGIN, SELECT 1, "
              f"ROLLBACK, JSON): p50 {floor['p50']:.2f} ms, p99 {floor['p99']:.2f} ms. API minus direct SQL per query "
              "(p50): "
              + ", ".join(f"{n} {r['api_p50'] - r['sql_p50']:.1f} ms" for n, r in results.items()) + ".", file=out)
        print("\nFloors (p50 ms, the parameters of the day of flares): "
              + "; ".join(f"{k} {v:.2f}" for k, v in bare.items()) + ".", file=out)
        print("\n## Where the API time goes\n", file=out)
        print(f"Median wall time per call [ms] of {args.repeat} further calls per query, the parts timed by wrapping "
              "functions (no profiler): *driver* = psycopg calls that talk to the server (statements, the BEGIN "
              "psycopg sends first, pool pre-ping, transaction end; server time included); *service* = the search "
              "or detail service minus its driver calls (SQLAlchemy statement building, compilation cache, "
              "execution, row handling); *serialisation* = building the JSON; *rest* = the call minus all that "
              "(FastAPI/Starlette routing, query validation, dependencies, worker-thread hand-offs, the "
              "in-process httpx client). Medians of parts do not add up exactly to the median total.\n", file=out)
        labels = []
        for b in breakdown.values():
            labels += [k for k in b if k not in labels and k not in ("total", "driver calls")]
        print("| query | total | driver calls | " + " | ".join(labels) + " |", file=out)
        print("|---" * (len(labels) + 3) + "|", file=out)
        for name, b in breakdown.items():
            print(f"| {name} | {b['total']:.2f} | {b['driver calls']:.0f} | "
                  + " | ".join(f"{b[k]:.2f}" if k in b else "-" for k in labels) + " |", file=out)
        if profiles:
            worst = max(results, key=lambda n: results[n]["ratio"])
            print("\n## Profile\n", file=out)
            print(f"cProfile of {args.profile} API calls per query, in process (see the module docstring); times "
                  "are per call and inflated by the profiler (shares, not latencies). Worst API/SQL ratio: "
                  f"{worst}; its top functions follow its per-package summary.", file=out)
            for name, prof in profiles.items():
                print_profile(name, prof, out, top=25 if name == worst else 0)
        p50 = max(r["api_p50"] for r in results.values())
        p99 = max(r["api_p99"] for r in results.values())
        ratio = max(r["ratio"] for r in results.values())
        print(f"\nRESULT p50_ms={p50:.2f} p99_ms={p99:.2f} api_over_sql={ratio:.2f} seeded={n_events}", file=out)
    finally:
        if args.keep or args.database:
            print(f"database kept: {url}", file=sys.stderr)
        else:
            drop_database(url)
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(buf.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
