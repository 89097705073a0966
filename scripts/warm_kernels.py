"""Fill Numba's on-disk cache of the calibration kernels once, before a test run starts.

The kernels of :mod:`pipelines.calibration.l2._fused_numba` are compiled on first use
(``cache=True``) and kept in the checkout's ``__pycache__``. In a fresh clone none is there:
the test run's four xdist workers and the processes their tests start (the demo's worker, the
benchmarks' per-task processes) each compiled them at once, about 17 s of CPU apiece on this
2-core machine (2026-12-06). Calibrating two small simulated frames here (WST and SCI-WL,
64 px: the disk and the coronagraph paths) compiles them once; later processes load them.
Prints the seconds it took; exits 0 also where Numba is absent (nothing to compile).

On the other core, meanwhile, one ``pytest --collect-only`` fills pytest's cache of rewritten
test modules (``__pycache__/*-pytest-*.pyc``, keyed by each source's hash: pytest's assertion
rewriting). Each xdist worker collects every test module; with no cache each rewrites all of
them, and collecting took 20 CPU-s a worker against 10 with the cache (2026-12-07, this 2-core
machine: ``pytest --collect-only -q`` of 1616 tests, cold 20.4 s, warm 10.0 s). The kernels take
longer than that alone in a fresh clone (27 s with the large-frame kernels, 2026-12-08), so there
the collection costs no wall time. Done only where Python may write bytecode (``make test`` clears
``PYTHONDONTWRITEBYTECODE``: otherwise pytest would write no cache) and some test module's cached
rewrite is missing or out of date (a second ``make test`` of the same tree collects nothing here:
its workers read and refresh the cache themselves).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rewrites_current() -> bool:
    """Whether every test module and conftest under tests/ has pytest's rewrite cached for its
    present source (the pyc's magic number and source hash, as pytest checks them)."""
    try:
        from _pytest.assertion.rewrite import PYC_TAIL  # pytest's cache name, its own
    except ImportError:
        return False
    for src in (ROOT / "tests").rglob("*.py"):
        if not (src.name == "conftest.py" or src.name.startswith("test_")):
            continue
        try:
            head = (src.parent / "__pycache__" / (src.name[:-3] + PYC_TAIL)).read_bytes()[:16]
        except OSError:
            return False
        if head[:4] != importlib.util.MAGIC_NUMBER or head[8:16] != importlib.util.source_hash(src.read_bytes()):
            return False
    return True


def _start_collection(log) -> subprocess.Popen | None:
    """``pytest --collect-only`` in a child process, or None where it would cache nothing."""
    if sys.dont_write_bytecode:
        print("warm_kernels: PYTHONDONTWRITEBYTECODE is set: pytest's rewritten modules are not cached")
        return None
    if _rewrites_current():
        return None
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)


def _end_collection(collection: subprocess.Popen, log, t0: float, timeout_s: float = 300.0) -> None:
    """Wait for the collection (at most ``timeout_s``, then kill it); a failure is reported with
    the end of its error output and is not fatal: the run itself reports collection errors."""
    try:
        rc = collection.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        collection.kill()
        collection.wait()
        rc = f"killed after {timeout_s:.0f} s"
    print(f"warm_kernels: pytest's rewritten test modules cached in {time.perf_counter() - t0:.1f} s"
          + (f" (collection exited {rc})" if rc else ""))
    if rc:
        log.seek(0)
        print(log.read().decode(errors="replace")[-2000:])


def main() -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        collection = _start_collection(log)
        try:
            _compile_kernels(t0)
        except BaseException:
            if collection is not None:
                collection.kill()
                collection.wait()
            raise
        if collection is not None:
            _end_collection(collection, log, t0)


def _compile_kernels(t0: float) -> None:
    """Calibrate a 64 px WST and SCI-WL frame (module docstring)."""
    import numpy as np

    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate

    with tempfile.TemporaryDirectory(prefix="lstdp-warm-") as tmp:
        sim = simulate(Path(tmp) / "sim", channels=("WST", "SCI-WL"), naxis=64, noise=True, seed=1,
                       sdi_sequence=False)
        for chan in ("WST", "SCI-WL"):
            frame = next(f for f in sim.frames if f.channel == chan)
            raw = read_image(frame.raw_path, dtype=np.float32)
            cals = {}
            for info in sim.calibration_files:
                if info.channel == chan:
                    cal = load_calibration_master(info.path)
                    cals[cal.kind] = cal
            calibrate_frame(raw.data, raw.header, cals)
    _compile_large_frame_kernels()
    print(f"warm_kernels: calibration kernels compiled or loaded in {time.perf_counter() - t0:.1f} s")


def _compile_large_frame_kernels() -> None:
    """The kernels that 64 px frames do not reach: the statistics pass (frames above
    ``EXACT_PERCENTILE_PIXELS``, 2**20 pixels: the demo's 1152 px frames) and the centre fit's
    ray sampling, for both image types it is given. Called through the same wrappers as the
    chain (they make their arguments contiguous and of fixed types), so the compiled signatures
    are the chain's. In a fresh clone these three were otherwise compiled mid-run, by whichever
    test process first needed them (2026-12-08)."""
    import numpy as np

    from pipelines.calibration.l2 import fused

    if not fused.enabled():
        return
    fused.frame_statistics(np.ones(4096, np.float32), np.zeros(4096, np.uint8),
                           np.asarray([0.5, 1.0, 1.5], np.float32))
    theta = np.linspace(0.0, 2.0 * np.pi, 8, endpoint=False)
    for dtype in (np.float32, np.float64):
        fused.ray_profiles(np.ones((64, 64), dtype), 32.0, 32.0, theta, np.arange(5.0, 20.0), (-0.5, 0.0, 0.5))


if __name__ == "__main__":
    main()
