"""The measurement scripts run end to end at a tiny size (their numbers come from full-size
runs: benchmarks/reports/). ``gpu_check.py`` must exit cleanly where CuPy is absent."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="CuPy is installed here: benchmarks/gpu_check.py runs for real instead")
def test_gpu_check_exits_cleanly_without_cupy():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "skipped, no GPU" in r.stdout and "CuPy" in r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--require"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2


@pytest.mark.slow
def test_calibrate_benchmark_prints_one_result_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate.py"), "--wst-size", "96", "--sci-size",
                        "64", "--repeat", "1", "--data", str(tmp_path / "data")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"RESULT wst_pipeline_over_floor=([\d.]+) wst_peer_over_pipeline=([\d.]+) "
                     r"sci_pipeline_over_floor=([\d.]+) peak_mib=(\d+)", last)
    assert m, last
    assert all(float(x) > 0 for x in m.groups())
    assert "rotate_north_up" in r.stdout and "Map.rotate(recenter=True)" in r.stdout
