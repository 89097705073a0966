"""GPU check: CPU vs CuPy parity of ``calibrate_frame`` at full size, and throughput.

On a machine with an NVIDIA GPU and CuPy (``pip install -e '.[gpu]'``):

1. simulates one WST frame (4608 x 4608) and one SCI-WL frame (2048 x 2048) with noise
   (:func:`pipelines.simulate.simulate`), with their masters;
2. parity: calibrates each frame with ``options={'backend': 'numpy'}`` and
   ``{'backend': 'cupy'}`` and compares the products: relative difference on the good
   pixels (median, 99.9th percentile, max) must stay at float32 rounding (median < 1e-6,
   p99.9 < 1e-4: the cubic spline and the powers are evaluated by different kernels),
   the DQ arrays must agree on all but 1e-5 of the pixels, and the CAL*/WCS keywords must
   be identical;
3. throughput: frames per second for a batch of ``--frames`` frames on the CPU (NumPy) and
   on the GPU with the masters resident on the device (copied once; the bad-pixel map
   derived once on the host), reading each raw frame from disk and returning the product
   to the host, as a GPU worker does.

Runs in well under 5 minutes on an H100/H200-class machine. Where CuPy or a GPU is absent
it prints why and exits with status 0 without doing anything (status 2 with ``--require``).
Exit status 1 if a parity check fails. The last line is::

    GPU_RESULT wst_max_rel=<..> sci_max_rel=<..> cpu_fps=<..> gpu_fps=<..> speedup=<..>

Usage::

    .venv/bin/python benchmarks/gpu_check.py [--frames 8] [--wst-size 4608] [--sci-size 2048]

Not part of the continuous tests: the development machines have no GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _gpu_or_reason() -> str | None:
    try:
        import cupy as cp
    except Exception as exc:  # noqa: BLE001 - any import failure means no usable CuPy
        return f"CuPy is not installed or does not load ({type(exc).__name__}: {exc})"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"CuPy finds no CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return "CuPy finds no CUDA device"
    return None


def _masters(out: Path, channel: str):
    from pipelines.calibration.flow import bad_pixel_map, load_calibration_master

    cals = {}
    for p in sorted((out / "calibration").glob(f"lst_{channel.lower()}_*.fits")):
        c = load_calibration_master(p)
        c.id = len(cals) + 1
        cals[c.kind] = c
    bad_pixel_map(cals["dark"])  # derived once on the host, cached on the master
    return cals


def _to_device(cals):
    import copy

    import cupy as cp

    dev = {}
    for kind, c in cals.items():
        d = copy.copy(c)
        d.data = {k: cp.asarray(v) for k, v in c.data.items()}
        dev[kind] = d
    return dev


def _parity(cpu, gpu) -> dict:
    good = (cpu.dq == 0) & np.isfinite(cpu.data) & np.isfinite(gpu.data)
    a, b = cpu.data[good].astype(np.float64), gpu.data[good].astype(np.float64)
    scale = np.maximum(np.abs(a), 1e-6 * np.max(np.abs(a)))
    rel = np.abs(b - a) / scale
    keys = [k for k in cpu.header if k.startswith(("CAL", "CRPIX", "CDELT", "CRVAL", "PC", "CTYPE", "BUNIT", "LEVEL"))]
    return {"median_rel": float(np.median(rel)), "p999_rel": float(np.percentile(rel, 99.9)),
            "max_rel": float(rel.max()), "dq_mismatch": float(np.mean(cpu.dq != gpu.dq)),
            "header_mismatch": [k for k in keys if cpu.header.get(k) != gpu.header.get(k)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=8, help="frames per throughput batch")
    ap.add_argument("--wst-size", type=int, default=4608)
    ap.add_argument("--sci-size", type=int, default=2048)
    ap.add_argument("--require", action="store_true", help="exit 2 (not 0) when no GPU is available")
    args = ap.parse_args(argv)
    why = _gpu_or_reason()
    if why:
        print(f"gpu_check: skipped, no GPU: {why}. Nothing was run. "
              "On a GPU machine: pip install -e '.[gpu]' and run this script again.")
        return 2 if args.require else 0
    import cupy as cp

    from pipelines.calibration.flow import calibrate_frame
    from pipelines.fitsio import read_image
    from pipelines.simulate import simulate

    dev = cp.cuda.runtime.getDeviceProperties(0)
    print(f"GPU: {dev['name'].decode() if isinstance(dev['name'], bytes) else dev['name']}, CuPy {cp.__version__}")
    work = Path(tempfile.mkdtemp(prefix="lst_gpu_"))
    t0 = time.perf_counter()
    sizes = {"WST": args.wst_size, "SCI-WL": args.sci_size}
    sim = simulate(work, channels=tuple(sizes), naxis=sizes, noise=True, seed=3, sdi_sequence=False)
    print(f"simulated in {time.perf_counter() - t0:.1f} s")
    failed = False
    out: dict[str, float] = {}
    for f in sim.frames:
        cals = _masters(work, f.channel)
        raw = read_image(f.raw_path, dtype=np.float32)
        cpu = calibrate_frame(raw.data, raw.header, cals, {"backend": "numpy"})
        gpu = calibrate_frame(raw.data, raw.header, _to_device(cals), {"backend": "cupy"})
        p = _parity(cpu, gpu)
        ok = (p["median_rel"] < 1e-6 and p["p999_rel"] < 1e-4 and p["dq_mismatch"] < 1e-5
              and not p["header_mismatch"] and gpu.header["BACKEND"] == "cupy")
        failed |= not ok
        out[f"{f.channel}_max_rel"] = p["max_rel"]
        print(f"parity {f.channel} {f.naxis} px: median rel {p['median_rel']:.2e}, p99.9 {p['p999_rel']:.2e}, "
              f"max {p['max_rel']:.2e}, DQ mismatch {p['dq_mismatch']:.2e}, header mismatch {p['header_mismatch']} "
              f"-> {'OK' if ok else 'FAIL'}")
    # throughput: WST, a batch of frames from disk, products back on the host
    wst = next(f for f in sim.frames if f.channel == "WST")
    cals = _masters(work, "WST")
    dcals = _to_device(cals)
    for backend, c in (("numpy", cals), ("cupy", dcals)):
        raw = read_image(wst.raw_path, dtype=np.float32)
        calibrate_frame(raw.data, raw.header, c, {"backend": backend})  # warm-up (kernels compiled, caches)
        n = args.frames if backend == "cupy" else max(2, args.frames // 4)
        t0 = time.perf_counter()
        for _ in range(n):
            raw = read_image(wst.raw_path, dtype=np.float32)
            calibrate_frame(raw.data, raw.header, c, {"backend": backend})
        if backend == "cupy":
            cp.cuda.Device().synchronize()
        fps = n / (time.perf_counter() - t0)
        out[f"{'gpu' if backend == 'cupy' else 'cpu'}_fps"] = fps
        print(f"throughput {backend}: {fps:.2f} frames/s ({n} WST frames of {wst.naxis} px, read from disk, "
              f"product returned to the host)")
    print(f"GPU_RESULT wst_max_rel={out.get('WST_max_rel', float('nan')):.2e} "
          f"sci_max_rel={out.get('SCI-WL_max_rel', float('nan')):.2e} cpu_fps={out['cpu_fps']:.2f} "
          f"gpu_fps={out['gpu_fps']:.2f} speedup={out['gpu_fps'] / out['cpu_fps']:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
