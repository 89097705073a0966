"""benchmarks/pages.py runs end to end at a tiny size (its numbers come from full-size runs,
see its docstring): one RESULT line per page, then the summary line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_pages_benchmark_prints_its_result_lines():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pages.py"), "--events", "300", "--products", "3",
                        "--repeat", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    pages = [re.fullmatch(r"RESULT page=(\w+) fcp_ms=(\d+) dcl_ms=(\d+) load_ms=(\d+) figure_ms=(\d+|-) kb=(\d+)", line)
             for line in lines[:-1]]
    assert all(pages), lines
    assert [m.group(1) for m in pages] == ["events", "event", "products", "job_new"]
    by_page = {m.group(1): m for m in pages}
    assert by_page["events"].group(5) != "-" and by_page["event"].group(5) != "-"  # both figures were drawn
    assert all(int(m.group(2)) > 0 and int(m.group(4)) >= int(m.group(3)) for m in pages)
    # plotly.js goes gzip-compressed: the events page moves well under its 4.8 MB
    assert int(by_page["events"].group(6)) < 2500
    last = re.fullmatch(r"RESULT events_fcp_ms=(\d+) events_load_ms=(\d+) worst_fcp_ms=(\d+) target_ms=1000 ok=([01])",
                        lines[-1])
    assert last, lines[-1]
    assert "seeded 300 events and 3 SDI products" in r.stdout
