"""Every filter of the event search API on the embedded default (SQLite) and on PostgreSQL at scale.

Two databases, both migrated with Alembic (the indexes measured are the migrations'):

* **SQLite, the demo's**: a fresh file filled as ``lstdp demo`` fills it, with the real
  catalogues of ``sample-data/real/events`` (``import_all``) and their links
  (``associate_events``): about 79,000 events and 5,400 association rows (flare-CME pairs
  both ways, same-flare pairs). The demo's few detected events are not added (they need the
  simulated frames and the pipeline).
* **PostgreSQL**: a database this script creates and drops, seeded by COPY with
  ``--pg-events`` synthetic events (default 1,000,000) and their links (200,000 flare-CME
  pairs both ways, 100,000 same-flare pairs) by ``benchmarks/events_api.py``'s
  :func:`seed_events` (distributions described there), then ``VACUUM ANALYZE``.

The filters are the query parameters of ``GET /api/v1/events`` as the app's OpenAPI schema
lists them (not a list kept here): each parameter is searched alone with values taken from
the database measured (a frequent and a rare or absent value where that differs, e.g. a
NOAA region with events and one without), then again inside a one-day window (``start`` and
``end``), plus the combinations named in issue 25 (``type=FL&associated_type=CE``,
``source=lst_wst&associated_type=FL``). ``sort`` runs with every sort key both ways,
``cursor`` is the second page of the default search and ``format`` each output format. A
parameter of the API for which this script has no value stops it (exit 2): a new filter
must be measured too.

Each search goes through the API in process (``fastapi.testclient.TestClient`` of
``backend.api.app.create_app``, the app's own engine, deadline and SQLite statement
interrupt), ``--repeat`` times after one warm-up. Per filter the p99 of its calls (with a
few calls, about their maximum) is printed with the HTTP statuses; an answer other than 200
is reported. The last line::

    RESULT sqlite_p99_ms=<worst filter's p99 on SQLite> pg_p99_ms=<worst on PostgreSQL> slowest=<that filter>

where ``slowest`` names the filter (``param=value[&...]``) with the largest p99 of the two
databases. Target: <= 200 ms for every filter on both (issue 25).

Run (it takes minutes; the PostgreSQL seeding dominates)::

    nice -n 19 .venv/bin/python benchmarks/embedded_search.py [--pg-events N] [--repeat R]
        [--sqlite PATH] [--skip-pg | --pg-url URL | --keep]

``--sqlite PATH`` reuses (or, when absent, builds and keeps) that SQLite file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Parameters of ``GET /events`` that are not filters but are measured too (see the module docstring).
PAGING = {"limit", "offset"}


def _events_api():
    """``benchmarks/events_api.py`` as a module (its database helpers and seeding)."""
    spec = importlib.util.spec_from_file_location("events_api_bench", ROOT / "benchmarks" / "events_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _point_settings_at(url: str, data_dir: Path) -> None:
    from backend import db as dbmod
    from backend.settings import get_settings

    os.environ["DATABASE_URL"] = url
    os.environ["DATA_DIR"] = str(data_dir)
    get_settings.cache_clear()
    dbmod.reset_caches()
    get_settings().ensure_dirs()


# -- building ---------------------------------------------------------------------------------


def build_sqlite(path: Path) -> str:
    """The demo's event catalogue in a new SQLite file at ``path``; returns its URL."""
    from sqlalchemy.orm import Session

    from backend import db as dbmod
    from backend.migrate import upgrade
    from backend.services.events import associate_events, import_all, refresh_statistics
    from backend.settings import get_settings

    url = f"sqlite:///{path}"
    t0 = time.perf_counter()
    upgrade(url)
    engine = dbmod.make_engine(url)
    with Session(engine) as s:
        c0 = time.process_time()
        run = import_all(s, get_settings().sample_data_dir / "events")
        s.commit()
        c1 = time.process_time()
        links = associate_events(s)
        c2 = time.process_time()
        refresh_statistics(s)  # as `lstdp import-events` (the demo's step) does
        s.commit()
    engine.dispose()
    failed = [line for line in run.lines() if "error" in line.lower()]
    print(f"SQLite built in {time.perf_counter() - t0:.0f} s ({links} links made; CPU: import_all {c1 - c0:.1f} s, "
          f"associate_events {c2 - c1:.1f} s)" + (f"; import problems: {failed}" if failed else ""), flush=True)
    return url


def build_pg(n: int, seed: int) -> str:
    """A new PostgreSQL database with ``n`` seeded events and their links; returns its URL."""
    import psycopg

    from backend.migrate import upgrade

    bench = _events_api()
    url = bench.create_database()
    t0 = time.perf_counter()
    upgrade(url)
    raw = url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(raw) as conn:
        info = bench.seed_events(conn, n, np.random.default_rng(seed))
        conn.commit()
    t1 = time.perf_counter()
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"PostgreSQL: {n:,} events and {info['associations']:,} link rows by COPY in {t1 - t0:.0f} s, "
          f"VACUUM ANALYZE {time.perf_counter() - t1:.0f} s", flush=True)
    return url


# -- the filters ------------------------------------------------------------------------------


def api_parameters(app) -> list[str]:
    """Names of the query parameters of ``GET /api/v1/events`` (the app's OpenAPI schema)."""
    op = app.openapi()["paths"]["/api/v1/events"]["get"]
    return [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]


def _values(url: str) -> dict[str, list]:
    """Per parameter, the values searched, taken from the database at ``url``."""
    from sqlalchemy import create_engine, func, select

    from backend.models import Event, EventAssociation
    from backend.services.event_search import SORT_KEYS

    engine = create_engine(url)
    E = Event
    with engine.connect() as c:
        def top(col, n=1, where=None):
            q = select(col, func.count()).where(col.is_not(None))
            if where is not None:
                q = q.where(where)
            return [r[0] for r in c.execute(q.group_by(col).order_by(func.count().desc()).limit(n))]

        def rare(col, where=None):
            q = select(col, func.count()).where(col.is_not(None))
            if where is not None:
                q = q.where(where)
            r = c.execute(q.group_by(col).order_by(func.count().asc()).limit(1)).first()
            return r[0] if r else None

        types = top(E.event_type, 3)
        sources = [r[0] for r in c.execute(select(E.source).distinct().order_by(E.source))]
        other = Event.__table__.alias("o")
        linked = [r[0] for r in c.execute(select(other.c.event_type).select_from(EventAssociation)
                                          .join(other, other.c.id == EventAssociation.other_event_id)
                                          .distinct())]
        unlinked = [t for t in ("AR", "CH", "PR", "FI", "CJ") if t not in linked][:1]
        busiest = c.execute(select(func.max(E.start_time))).scalar()
        frm = top(E.frm_name, 1)
        frm_v = top(E.frm_version, 1)
        ars = top(E.noaa_ar, 1)
        # a busy day: the day with the most flares of the newest thousand starts
        recent = [r[0] for r in c.execute(select(E.start_time).order_by(E.start_time.desc()).limit(1000))]
    engine.dispose()
    day = (statistics.mode([t.date() for t in recent]) if recent else busiest.date())
    d0 = dt.datetime.combine(day, dt.time(0))
    iso = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    vals = {
        "type": types + ["CE,AR"],
        "start": [iso(d0), iso(d0 - dt.timedelta(days=3650))],
        "end": [iso(d0), iso(dt.datetime(1990, 6, 1))],
        "source": sources,
        "channel": ["SDI", "SCI-UV"],  # LST channels (catalogue rows name other instruments' bands)
        "pa_min": [60.0, 300.0],
        "pa_max": [120.0, 30.0],
        "hpc_x_min": [250.0], "hpc_x_max": [350.0], "hpc_y_min": [-120.0], "hpc_y_max": [-80.0],
        "min_goes_class": ["C1", "M1", "X5"],
        "min_peak_value": [0.0, 1e6],
        "frm_name": frm + ["no-such-detector"],
        "frm_version": frm_v + ["0.0.0"],
        "noaa_ar": ars + [99999],
        "associated_type": linked + unlinked,
        "calibration_set": ["1", "dark:1"],
        "calibration_file": [1],
        "min_angular_width": [120.0, 360.0],
        "systematics": ["any", "centre_refused"],  # events on products with a frame-wide flag (issue 27)
        "sort": [("-" if d else "") + k for k in SORT_KEYS for d in (False, True)],
        "format": ["csv", "votable", "hek"],
        "cursor": ["<second page>"],
    }
    vals["_day"] = (iso(d0), iso(d0 + dt.timedelta(days=1)))
    return vals


def cases(names: list[str], vals: dict) -> list[dict]:
    """The searches: each parameter alone, each in the busy day, the issue's combinations.
    ``SystemExit(2)`` for a parameter without values here."""
    missing = [n for n in names if n not in vals and n not in PAGING]
    if missing:
        print(f"no values for the API parameter(s) {missing}: add them to _values()", file=sys.stderr)
        raise SystemExit(2)
    out: list[dict] = []
    t0, t1 = vals["_day"]
    pairs = {("pa_min", "pa_max"), ("hpc_x_min", "hpc_x_max"), ("hpc_y_min", "hpc_y_max")}
    for n in names:
        if n in PAGING or n in {"pa_max", "hpc_x_max", "hpc_y_max"}:
            continue
        for i, v in enumerate(vals[n]):
            p = {n: v}
            for a, b in pairs:  # a range: both bounds (each bound alone is a case too)
                if n == a and i < len(vals[b]):
                    out.append({n: v})
                    p = {a: v, b: vals[b][i]}
            out.append(p)
            if n not in {"start", "end", "cursor", "format"}:
                out.append({**p, "start": t0, "end": t1})
    out += [{"type": "FL", "associated_type": "CE"}, {"source": "lst_wst", "associated_type": "FL"},
            {"type": "FL", "associated_type": "CE", "start": t0, "end": t1}]
    for n in ("pa_max", "hpc_x_max", "hpc_y_max"):
        out.append({n: vals[n][0]})
    return out


def label(p: dict) -> str:
    return "&".join(f"{k}={v}" for k, v in p.items())


def measure(url: str, data_dir: Path, repeat: int) -> dict[str, tuple[float, list[int], float]]:
    """Per case through the API on the database at ``url``: p99 of the wall time [ms], the
    HTTP statuses, p99 of this process's CPU time per call [ms] (``time.process_time``)."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    _point_settings_at(url, data_dir)
    app = create_app()
    names = api_parameters(app)
    todo = cases(names, _values(url))
    print(f"{len(names)} query parameters of GET /api/v1/events: {', '.join(names)}; {len(todo)} searches",
          flush=True)
    results: dict[str, tuple[float, list[int], float]] = {}
    with TestClient(app, raise_server_exceptions=False) as client:
        first = client.get("/api/v1/events").json()
        second = first.get("next_cursor")
        for p in todo:
            if p.get("cursor") == "<second page>":
                p = {**p, "cursor": second}
            times, cpu, statuses = [], [], []
            for i in range(repeat + 1):
                t, c = time.perf_counter(), time.process_time()
                r = client.get("/api/v1/events", params=p)
                ms, cpu_ms = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
                if i:
                    times.append(ms)
                    cpu.append(cpu_ms)
                    statuses.append(r.status_code)
            p99, cpu99 = float(np.percentile(times, 99)), float(np.percentile(cpu, 99))
            name = label(p) if "cursor" not in p else "cursor=<second page>"
            results[name] = (p99, statuses, cpu99)
            bad = [s for s in statuses if s != 200]
            print(f"  {p99:8.1f} ms  (CPU of this process {cpu99:7.1f} ms)  {name}"
                  + (f"  HTTP {sorted(set(bad))}" if bad else ""), flush=True)
    return results


def _count_events(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as c:
        n = int(c.execute(text("SELECT count(*) FROM events")).scalar())
    engine.dispose()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-events", type=int, default=1_000_000, help="events seeded in PostgreSQL")
    ap.add_argument("--repeat", type=int, default=5, help="calls per search after one warm-up")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--sqlite", type=Path, default=None, help="reuse (or build and keep) this SQLite file")
    ap.add_argument("--skip-pg", action="store_true", help="SQLite only (pg_p99_ms=nan)")
    ap.add_argument("--pg-url", default=None,
                    help="measure this already seeded PostgreSQL database (migrated to head here), not dropped")
    ap.add_argument("--keep", action="store_true", help="keep the PostgreSQL database it seeds (URL printed)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="lstdp_embedded_search_"))
    db_path = args.sqlite or tmp / "demo.sqlite3"
    sqlite_url = f"sqlite:///{db_path}" if db_path.exists() else build_sqlite(db_path)
    print("SQLite (the demo's catalogue):", flush=True)
    res = {"sqlite": measure(sqlite_url, tmp / "data-sqlite", args.repeat)}
    if not args.skip_pg:
        if args.pg_url:
            from backend.migrate import upgrade

            pg_url = args.pg_url
            upgrade(pg_url)
        else:
            pg_url = build_pg(args.pg_events, args.seed)
        try:
            print(f"PostgreSQL ({_count_events(pg_url):,} events):", flush=True)
            res["pg"] = measure(pg_url, tmp / "data-pg", args.repeat)
        finally:
            from backend import db as dbmod

            dbmod.reset_caches()
            if args.pg_url is None and not args.keep:
                _events_api().drop_database(pg_url)
            elif args.keep:
                print(f"kept {pg_url}")
    worst = {db: max(r.items(), key=lambda kv: kv[1][0]) for db, r in res.items()}
    slowest = max(worst.values(), key=lambda kv: kv[1][0])[0]
    errors = sum(s != 200 for r in res.values() for _, st, _ in r.values() for s in st)
    if errors:
        print(f"{errors} call(s) answered other than 200 (listed above)")
    for db, r in res.items():
        name, (_, _, cpu99) = max(r.items(), key=lambda kv: kv[1][2])
        print(f"{db}: largest p99 of this process's CPU time per call {cpu99:.1f} ms ({name}); on SQLite the "
              "whole search runs in this process, so that is its time on an idle core; on PostgreSQL the "
              "server's time is not in it")
    print(f"load average over the run's last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    pg = f"{worst['pg'][1][0]:.1f}" if "pg" in worst else "nan"
    print(f"RESULT sqlite_p99_ms={worst['sqlite'][1][0]:.1f} pg_p99_ms={pg} slowest={slowest}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
