"""Benchmark of the landing timeline (``GET /api/v1/events/histogram``) on PostgreSQL.

Creates its own database (dropped at the end unless ``--keep``), migrates it with Alembic,
imports every real sample catalogue of ``sample-data/real/events`` (about 73,000 events:
GOES XRS 1990-2014, CDAW 1996-2013, DONKI 2010-2021, HEK, NOAA SRS, LST/WST) with
``lstdp import-events``' service, runs ``VACUUM ANALYZE``, then times the histogram service
(the SQL aggregation and the Python around it) and the API route (in process, FastAPI's
TestClient), ``--repeat`` times each after 3 warm-ups, for:

1. all events, 120 bins (the landing page: 35 years in yearly bins);
2. flares only (``type=FL``);
3. one year (2003) of every type, in weekly bins;
4. CMEs of 2012-2013 with a position-angle range (``pa_min=60&pa_max=120``);
5. flares of M1 and above with an associated CME (``associated_type=CE``).

Each case checks that the counts add up to ``count(*)`` of the same filters. Last line::

    RESULT events=<n> p50_ms=<worst p50 of the service> p99_ms=<worst p99> api_p50_ms=<worst API p50> sums_ok=<0|1>

Target: p50 <= 100 ms per call of the service on 73k events (the page draws it on load; p99 is
printed too, and follows the load of the machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PG_ADMIN = os.environ.get("LSTDP_BENCH_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
UTC = dt.UTC


def _admin():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")


def create_database() -> str:
    from sqlalchemy import text

    name = f"lstdp_bench_hist_{os.getpid()}_{uuid.uuid4().hex[:6]}"
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


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


CASES = [
    ("all", {}),
    ("flares", {"type": "FL"}),
    ("year 2003 weekly", {"start": "2003-01-01T00:00:00Z", "end": "2003-12-31T23:59:59Z"}),
    ("CMEs PA 60-120", {"type": "CE", "start": "2012-01-01T00:00:00Z", "end": "2013-12-31T00:00:00Z",
                        "pa_min": 60, "pa_max": 120}),
    ("M1+ flares with a CME", {"type": "FL", "min_goes_class": "M1", "associated_type": "CE"}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--keep", action="store_true", help="keep the database (its URL is printed)")
    ap.add_argument("--database", help="an already imported database to measure")
    args = ap.parse_args()

    url = args.database or create_database()
    os.environ["DATABASE_URL"] = url
    try:
        from fastapi.testclient import TestClient
        from sqlalchemy import func, select, text

        from backend import db as dbmod
        from backend.api.app import create_app
        from backend.services.event_filters import parse_event_filters
        from backend.migrate import upgrade
        from backend.models import Event
        from backend.services.event_histogram import event_histogram
        from backend.services.event_search import filter_conditions
        from backend.services.events import associate_events, import_all
        from backend.settings import get_settings

        get_settings.cache_clear()
        dbmod.reset_caches()
        if not args.database:
            upgrade(url)
            t = time.perf_counter()
            with dbmod.session_scope() as s:
                run = import_all(s, ROOT / "sample-data" / "real" / "events")
                print("imported:", ", ".join(f"{r.source} {r.stored}" for r in run), f"in {time.perf_counter() - t:.1f} s")
            t = time.perf_counter()
            with dbmod.session_scope() as s:
                links = associate_events(s)
            print(f"associations made: {links} in {time.perf_counter() - t:.1f} s")
            with dbmod.get_engine().connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(text("VACUUM ANALYZE"))
        client = TestClient(create_app())
        worst50 = worst99 = api50 = 0.0
        sums_ok = True
        with dbmod.session_scope() as s:
            n_events = int(s.scalar(select(func.count()).select_from(Event)))
            for name, params in CASES:
                parsed = parse_event_filters(types=params.get("type"), start=params.get("start"), end=params.get("end"),
                                             pa_min=params.get("pa_min"), pa_max=params.get("pa_max"),
                                             min_goes_class=params.get("min_goes_class"),
                                             associated_type=params.get("associated_type"))
                assert not parsed.problems, parsed.problems
                f = parsed.filters
                times = []
                for i in range(args.repeat + 3):
                    t = time.perf_counter()
                    h = event_histogram(s, f, bins=120)
                    if i >= 3:
                        times.append((time.perf_counter() - t) * 1000)
                conds = filter_conditions(s, f)
                q = select(func.count()).select_from(Event.__table__)
                exact = int(s.scalar(q.where(*conds) if conds else q))
                ok = h.total == exact == sum(sum(c) for c in h.counts.values())
                sums_ok &= ok
                api = []
                for i in range(max(5, args.repeat // 3) + 2):
                    t = time.perf_counter()
                    r = client.get("/api/v1/events/histogram", params=params)
                    if i >= 2:
                        api.append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200 and r.json()["total"] == exact, r.text
                p50, p99 = statistics.median(times), pct(times, 0.99)
                worst50, worst99, api50 = max(worst50, p50), max(worst99, p99), max(api50, statistics.median(api))
                print(f"{name:24s} total {h.total:6d} (count(*) {exact:6d}, {'ok' if ok else 'MISMATCH'}) "
                      f"bins {len(h.edges) - 1:4d} x {h.bin_s:9d} s  service p50 {p50:7.1f} ms p99 {p99:7.1f} ms  "
                      f"API p50 {statistics.median(api):7.1f} ms")
            plan = s.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + str(
                select(Event.event_type, func.count()).group_by(Event.event_type)
                .compile(s.get_bind(), compile_kwargs={"literal_binds": True})))).scalars().all()
            print("plan of a full GROUP BY over events (for scale):", *plan[:6], sep="\n  ")
        print(f"RESULT events={n_events} p50_ms={worst50:.1f} p99_ms={worst99:.1f} api_p50_ms={api50:.1f} "
              f"sums_ok={int(sums_ok)}")
        return 0 if sums_ok else 1
    finally:
        if not args.database and not args.keep:
            dbmod.reset_caches()
            drop_database(url)
        elif args.keep:
            print("kept:", url)


if __name__ == "__main__":
    raise SystemExit(main())
