"""Time the ingest of a raw frame with many HISTORY cards against a plain one.

A real case (CARTAvis/carta-backend#1127; issue 25): a frame with 20,000 HISTORY cards put
1.3 MB into its row and took 19 s to ingest, against 2-3 s. The reader now reads the first
and last ``pipelines.fitsio.HISTORY_KEEP`` cards only and the row keeps a bounded list and
the count, so both should take about the same time.

Each size is ingested ``--repeat`` times (different pixels, so no duplicate) into a fresh
SQLite database in a temporary folder, after one warm-up ingest (imports, ephemeris).

Usage::

    python benchmarks/ingest_history.py                  # 20,000 cards, 5 repeats
    python benchmarks/ingest_history.py --history 2000 --repeat 1

Prints ``RESULT plain_ms=<median> history_ms=<median> ratio=<history/plain> row_kb=<JSON
size of the frame's header with HISTORY> history_cards=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def raw_frame(path: Path, seed: int, history: int) -> Path:
    """A 64x64 SDI raw frame in the ASO-S header style with ``history`` HISTORY cards (added
    as bytes: astropy's ``add_history`` itself takes seconds for 20,000)."""
    from astropy.io import fits

    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"], h["DETECTOR"], h["CHANNEL"] = "ASO-S", "LST", "SDI", "SDI"
    h["DATE-OBS"], h["EXPTIME"] = "01-May-23 13:07:58.713", 2.0
    h["CTYPE1"], h["CTYPE2"], h["CUNIT1"], h["CUNIT2"] = "solar_x", "solar_y", "arcsecs", "arcsecs"
    h["CRPIX1"] = h["CRPIX2"] = 32.5
    h["CRVAL1"] = h["CRVAL2"] = 0.0
    h["CDELT1"] = h["CDELT2"] = 36.0
    data = np.random.default_rng(seed).integers(100, 4000, size=(64, 64)).astype(np.uint16)
    fits.PrimaryHDU(data, h).writeto(path, overwrite=True)
    raw = path.read_bytes()
    cards = [raw[i:i + 80] for i in range(0, len(raw), 80)]
    end = next(i for i, c in enumerate(cards) if c.startswith(b"END "))
    header_len = -(-(end + 1) * 80 // 2880) * 2880
    lines = [f"HISTORY on-board step {i}: frame processing note".encode().ljust(80) for i in range(history)]
    head = b"".join(cards[:end] + lines + [cards[end]])
    path.write_bytes(head + b" " * (-len(head) % 2880) + raw[header_len:])
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=20_000, help="HISTORY cards of the bloated frame")
    ap.add_argument("--repeat", type=int, default=5, help="ingests per size (the median is printed)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lstdp-ingest-history-"))
    os.environ["DATA_DIR"] = str(tmp / "var")
    for k in ("DATABASE_URL", "LSTDP_DATABASE_URL"):
        os.environ.pop(k, None)
    try:
        from backend.db import session_scope
        from backend.migrate import upgrade
        from backend.models import Frame
        from backend.services.ingest import ingest_path
        from backend.settings import get_settings

        settings = get_settings()
        settings.ensure_dirs()
        upgrade(settings.sqlalchemy_url)
        seed = 0

        def ingest(history: int) -> tuple[float, int]:
            nonlocal seed
            seed += 1
            src = raw_frame(tmp / f"f{seed}.fits", seed, history)
            t0 = time.perf_counter()
            with session_scope() as s:
                out = ingest_path(s, src, settings)
            took = time.perf_counter() - t0
            if out.status != "ingested":
                raise SystemExit(f"ingest failed: {out.line()}")
            with session_scope() as s:
                size = len(json.dumps(s.get(Frame, out.frame_id).header))
            return took, size

        ingest(0)  # warm-up: imports, the ephemeris
        plain = [ingest(0)[0] for _ in range(args.repeat)]
        runs = [ingest(args.history) for _ in range(args.repeat)]
        plain_ms = statistics.median(plain) * 1e3
        history_ms = statistics.median(t for t, _ in runs) * 1e3
        print(f"plain frame: {', '.join(f'{t * 1e3:.0f}' for t in plain)} ms")
        print(f"{args.history} HISTORY cards: {', '.join(f'{t * 1e3:.0f}' for t, _ in runs)} ms")
        print(f"RESULT plain_ms={plain_ms:.1f} history_ms={history_ms:.1f} ratio={history_ms / plain_ms:.2f} "
              f"row_kb={runs[-1][1] / 1024:.1f} history_cards={args.history}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
