"""Measure GOES XRS ingest and the event curves' X-ray query on the real sample files.

Ingests every file of ``sample-data/real/xray-timeseries`` (the 42,177-sample GOES-15 FITS of
2011-06-07 among them) into a fresh database, then times the window query of the M2.5 flare
(2011-06-07 05:46-07:29 UTC, what the event page asks) and the figure built from it.

Usage::

    python benchmarks/xray.py                 # SQLite in a temporary folder
    python benchmarks/xray.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

Prints ``RESULT ingest_s=<all files> samples=<n> window_ms=<median of 5> figure_ms=<median of 5> db=<dialect>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", help="PostgreSQL admin URL: a temporary database is made there and dropped")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lstdp-xray-bench-"))
    os.environ["DATA_DIR"] = str(tmp)
    admin_url, db_url = None, None
    if args.pg:
        from sqlalchemy import create_engine, text

        admin_url = args.pg
        name = f"lstdp_xray_bench_{uuid.uuid4().hex[:8]}"
        eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        eng.dispose()
        db_url = admin_url.rsplit("/", 1)[0] + "/" + name
        os.environ["DATABASE_URL"] = db_url
    try:
        from sqlalchemy.orm import Session

        from backend.db import make_engine
        from backend.render.event_figures import event_curves_figure
        from backend.migrate import upgrade
        from backend.models import Event
        from backend.services.event_curves import EventCurves
        from backend.services.xray import import_xray_dir, xray_window
        from backend.settings import get_settings

        s = get_settings()
        s.ensure_dirs()
        upgrade(s.sqlalchemy_url)
        engine = make_engine(s.sqlalchemy_url)
        with Session(engine) as session:
            t0 = time.perf_counter()
            out = import_xray_dir(session, ROOT / "sample-data" / "real" / "xray-timeseries", s)
            ingest_s = time.perf_counter() - t0
            n = sum(o.n_samples for o in out if o.status == "ingested")
            start = dt.datetime(2011, 6, 7, 5, 46, tzinfo=dt.UTC)
            end = dt.datetime(2011, 6, 7, 7, 29, tzinfo=dt.UTC)
            ev = Event(id=0, event_type="FL", source="goes_xrs", source_key="bench", start_time=start + dt.timedelta(minutes=30),
                       peak_time=dt.datetime(2011, 6, 7, 6, 41, tzinfo=dt.UTC), end_time=end - dt.timedelta(minutes=30))
            wins, figs = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                win = xray_window(session, start, end)
                wins.append(time.perf_counter() - t0)
                c = EventCurves(event=ev, channel="SDI", start=start, end=end, xray=win.best())
                t0 = time.perf_counter()
                event_curves_figure(c).to_json()
                figs.append(time.perf_counter() - t0)
            dialect = engine.dialect.name
        engine.dispose()
        print(f"files {len(out)}: " + ", ".join(f"{Path(o.path).name} {o.status} {o.n_samples}" for o in out))
        print(f"window samples {win.n_samples}")
        print(f"RESULT ingest_s={ingest_s:.2f} samples={n} window_ms={1000 * statistics.median(wins):.1f} "
              f"figure_ms={1000 * statistics.median(figs):.1f} db={dialect}")
        return 0
    finally:
        if db_url:
            from sqlalchemy import create_engine, text

            eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with eng.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{db_url.rsplit("/", 1)[1]}" WITH (FORCE)'))
            eng.dispose()


if __name__ == "__main__":
    sys.exit(main())
