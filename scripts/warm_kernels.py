"""Fill Numba's on-disk cache of the calibration kernels once, before a test run starts.

The kernels of :mod:`pipelines.calibration.l2._fused_numba` are compiled on first use
(``cache=True``) and kept in the checkout's ``__pycache__``. In a fresh clone none is there:
the test run's four xdist workers and the processes their tests start (the demo's worker, the
benchmarks' per-task processes) each compiled them at once, about 17 s of CPU apiece on this
2-core machine (2026-12-06). Calibrating two small simulated frames here (WST and SCI-WL,
64 px: the disk and the coronagraph paths) compiles them once; later processes load them.
Prints the seconds it took; exits 0 also where Numba is absent (nothing to compile).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def main() -> None:
    import numpy as np

    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate

    t0 = time.perf_counter()
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
    print(f"warm_kernels: calibration kernels compiled or loaded in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
