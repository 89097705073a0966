"""Benchmark: L2 calibration of one frame at full size against the I/O floor and a sunpy peer.

Measured in one run, each in its own process (so that peak memory is that of one task):

* ``floor``: read the raw frame (:func:`pipelines.fitsio.read_image`, the pipeline's reader)
  and write a product of the same size, dtype and layout (float32 image + DQ table,
  uncompressed, CHECKSUM, atomic rename), no arithmetic.
* ``pipeline``: read -> :func:`pipelines.calibration.l2.flow.calibrate_frame` ->
  :func:`pipelines.products.build_product_hdul` -> :func:`pipelines.fitsio.write_fits_atomic`,
  masters resident (loaded, and the bad-pixel map derived, once per worker, as a Celery
  worker keeps them), with per-step times.
* ``peer``: what a user would write with ``sunpy.map``: Map arithmetic for dark, flat,
  exposure and radiometric coefficient (SCI: minus the stray-light model), then
  ``Map.rotate(recenter=True, order=3)`` and ``Map.save``.

And a batch of ``--batch`` WST frames (copies of the raw file, default 8), each in its own
process:

* ``floor_batch``: the floor's read and write of each frame, one after the other: the
  floor's frames per second.
* ``batch``: :class:`pipelines.calibration.l2.batch.BatchExecutor` on NumPy, as a CPU worker
  runs a batch: frame k+1 read and product k-1 written (``build_product_hdul`` and
  ``write_fits_atomic`` in the callback) while frame k calibrates. Its frames per second
  against the floor's is ``wst_batch_over_floor`` (target <= 1.3); the peak is measured
  on a batch of 3 frames (read, compute and write all under way at once).

Each task runs once untimed (imports, caches), ``--repeat`` times timed (median reported),
once more under ``tracemalloc`` for the peak of Python/NumPy allocations above what was
resident before the frame (also ``ru_maxrss``). The last line printed is::

    RESULT wst_pipeline_over_floor=<x> wst_batch_over_floor=<b> wst_peer_over_pipeline=<y> sci_pipeline_over_floor=<z> peak_mib=<m>
        bytes_per_px_none=<n> bytes_per_px_lossless=<l> bytes_per_px_noise=<q> noise_err_over_sigma=<e>
        write_s_none=<s> write_s_lossless=<s> write_s_noise=<s>

(one line; the last seven fields: the WST product written each way of ``PRODUCT_COMPRESSION``,
:func:`compress_worker`; targets ``bytes_per_px_noise`` <= 2.0, ``noise_err_over_sigma`` <= 0.1)

``peak_mib``: the pipeline's tracemalloc peak for one WST frame [MiB] (the target is <= 6
float32 frames, 486 MiB at 4608 x 4608; the batch's peak is in the report). The report
goes to ``benchmarks/reports/calibrate_benchmark.md`` (with ``--report``).
``--resample NAME`` passes ``CalibrationOptions(resample=NAME)`` to the pipeline and the
batch where the options have that field (the north-up back end), and refuses otherwise.

Usage::

    .venv/bin/python benchmarks/calibrate.py --report          # WST 4608, SCI-WL 2048, batch of 8
    .venv/bin/python benchmarks/calibrate.py --wst-size 1024 --sci-size 512 --batch 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPORT = ROOT / "benchmarks" / "reports" / "calibrate_benchmark.md"
STEP_NAMES = ("flag_invalid_pixels", "flag_bad_pixels", "subtract_dark", "clean_cosmic_rays", "correct_flat",
              "normalize_exposure", "convert_units", "correct_detector_signal", "subtract_stray_light",
              "mask_occulter", "mask_field_of_view", "deconvolve_psf", "rotate_north_up")
#: Timed besides the steps: (module, function) as the flow calls them.
EXTRA_TIMED = (("pipelines.calibration.l2.uncertainty", "detector_variance"),
               ("pipelines.calibration.l2.uncertainty", "resample_variance"),
               ("pipelines.calibration.l2.resample", "rotate_north_up_full"),  # data, DQ and sigma (issue 29)
               ("pipelines.calibration.l2.flow", "fit_and_apply_centre"))

#: CalibrationOptions for the pipeline tasks (set from --resample in the worker).
OPTIONS: dict = {}


# ----------------------------------------------------------------------------- worker side


def _masters(data_dir: Path, channel: str):
    from pipelines.simulation import load_simulated_masters

    return load_simulated_masters(data_dir, channel)


def _raw_path(data_dir: Path, channel: str) -> Path:
    return sorted((data_dir / "raw").glob(f"lst_{channel.lower()}_*_raw.fits"))[0]


class _Timer:
    def __init__(self):
        self.t: dict[str, float] = {}

    def add(self, name: str, dt: float) -> None:
        self.t[name] = self.t.get(name, 0.0) + dt

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(name, time.perf_counter() - t0)
        return timed


def _floor_task(raw_path: Path, out: Path, timer: _Timer, cals) -> None:
    from pipelines.calibration.l2.flow import L2Result
    from pipelines.fitsio import read_image, write_fits_atomic
    from pipelines.products import build_product_hdul

    t0 = time.perf_counter()
    raw = read_image(raw_path, dtype=np.float32)  # as the workers read (16-bit DN exact)
    timer.add("read", time.perf_counter() - t0)
    t0 = time.perf_counter()
    res = L2Result(data=raw.data.astype(np.float32, copy=False), dq=np.zeros(raw.data.shape, np.uint8),
                   header=raw.header, stats={})
    hdul = build_product_hdul(res, software_version="bench")
    timer.add("build_product_hdul", time.perf_counter() - t0)
    t0 = time.perf_counter()
    write_fits_atomic(hdul, out)
    timer.add("write", time.perf_counter() - t0)


def _pipeline_task(raw_path: Path, out: Path, timer: _Timer, cals) -> None:
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.fitsio import read_image, write_fits_atomic
    from pipelines.products import build_product_hdul

    t0 = time.perf_counter()
    raw = read_image(raw_path, dtype=np.float32)  # as the workers read (16-bit DN exact)
    timer.add("read", time.perf_counter() - t0)
    t0 = time.perf_counter()
    l2 = calibrate_frame(raw.data, raw.header, cals, _options())
    timer.add("calibrate_frame", time.perf_counter() - t0)
    del raw
    t0 = time.perf_counter()
    hdul = build_product_hdul(l2, software_version="bench")
    timer.add("build_product_hdul", time.perf_counter() - t0)
    del l2
    t0 = time.perf_counter()
    write_fits_atomic(hdul, out)
    timer.add("write", time.perf_counter() - t0)


def _peer_task(raw_path: Path, out: Path, timer: _Timer, cals) -> None:
    import astropy.units as u
    import sunpy.map

    from pipelines.fitsio import read_image

    t0 = time.perf_counter()
    raw = read_image(raw_path, dtype=np.float32)  # the ASO-S header quirks (arcsecs, SSW dates) need repair for sunpy too
    m = sunpy.map.Map((raw.data, raw.header))
    timer.add("read", time.perf_counter() - t0)
    t0 = time.perf_counter()
    t = float(m.exposure_time.to_value(u.s))
    dark = cals["dark"].data
    m = m - dark["bias"] * m.unit - (dark["dark_rate"] * t) * m.unit
    m = m / cals["flat"].data["flat"]
    m = m / t * float(cals["radiometric"].parameters["RADCOEF"])
    if "stray_light" in cals:
        from pipelines.calibration.l2.flow import _stray_model

        model = _stray_model(cals["stray_light"])
        ny, nx = m.data.shape
        cx, cy = (v.to_value(u.pix) for v in m.reference_pixel)
        scale = m.scale.axis1.to_value(u.arcsec / u.pix)
        yy, xx = np.mgrid[0:ny, 0:nx]
        r = np.hypot(xx - cx, yy - cy) * scale / m.rsun_obs.to_value(u.arcsec)
        m = m - model.brightness(r) * m.unit
    timer.add("arithmetic (Map)", time.perf_counter() - t0)
    t0 = time.perf_counter()
    m = m.rotate(recenter=True, order=3)
    timer.add("Map.rotate(recenter=True)", time.perf_counter() - t0)
    t0 = time.perf_counter()
    m.save(out, overwrite=True)
    timer.add("write (Map.save)", time.perf_counter() - t0)


def _options():
    from pipelines.calibration.l2.options import CalibrationOptions

    return CalibrationOptions(**OPTIONS)


def _check_resample(name: str | None) -> None:
    """Refuse ``--resample`` where CalibrationOptions has no ``resample`` field (before merging
    the north-up back end), rather than measuring the default silently."""
    if name is None:
        return
    from pipelines.calibration.l2.options import CalibrationOptions

    if "resample" not in CalibrationOptions.model_fields:
        raise SystemExit(f"--resample {name}: this CalibrationOptions has no 'resample' field")
    CalibrationOptions(resample=name)  # a bad name is refused by the options themselves


TASKS = {"floor": _floor_task, "pipeline": _pipeline_task, "peer": _peer_task}
BATCH_TASKS = ("floor_batch", "batch")


def batch_worker(mode: str, channel: str, data_dir: Path, n: int) -> dict:
    """``n`` copies of the raw frame through the floor one by one, or through the CPU batch."""
    import warnings

    warnings.simplefilter("ignore")
    from pipelines.calibration.l2 import flow
    from pipelines.calibration.l2.batch import BatchExecutor, BatchItem
    from pipelines.fitsio import write_fits_atomic
    from pipelines.products import build_product_hdul

    raw_path = _raw_path(data_dir, channel)
    tmp = Path(tempfile.mkdtemp(prefix="lst_bench_batch_"))
    copies = []
    for i in range(n):
        copies.append(tmp / f"raw_{i:03d}.fits")
        shutil.copyfile(raw_path, copies[-1])
    cals = _masters(data_dir, channel)
    flow.bad_pixel_map(cals["dark"])
    options = _options()
    stage: dict[str, float] = {}

    def floor(paths) -> None:
        for i, p in enumerate(paths):
            _floor_task(p, tmp / f"product_{i:03d}.fits", timer, cals)
            (tmp / f"product_{i:03d}.fits").unlink()

    def batch(paths) -> None:
        ex = BatchExecutor("numpy")

        def write(o) -> None:
            if not o.ok:
                raise RuntimeError(f"frame {o.key} failed: {o.error}")
            stage["read"] = stage.get("read", 0.0) + o.read_s
            stage["calibrate_frame"] = stage.get("calibrate_frame", 0.0) + o.compute_s
            t0 = time.perf_counter()
            out = tmp / f"product_{o.key:03d}.fits"
            write_fits_atomic(build_product_hdul(o.result, software_version="bench"), out)
            out.unlink()
            stage["build + write (callback)"] = stage.get("build + write (callback)", 0.0) + time.perf_counter() - t0

        ex.run([BatchItem.from_path(i, p, cals, options) for i, p in enumerate(paths)], on_result=write,
               keep_results=False)

    timer = _Timer()
    fn = floor if mode == "floor_batch" else batch
    fn(copies[:1])  # warm-up: imports, caches, numexpr's compiled expressions
    timer.t, stage = {}, {}
    t0 = time.perf_counter()
    fn(copies)
    wall = time.perf_counter() - t0
    stages = dict(timer.t if mode == "floor_batch" else stage)
    k = min(3, n)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    fn(copies[:k])
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    npx = int(np.prod(_shape(raw_path)))
    return {"mode": mode, "channel": channel, "frames": n, "seconds": wall, "fps": n / wall, "steps": stages,
            "prep": {}, "peak_mib": peak / 2**20, "peak_frames_run": k, "frame_mib": npx * 4 / 2**20,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "all_seconds": [wall]}


def compress_worker(channel: str, data_dir: Path, repeat: int) -> dict:
    """The frame calibrated once, its product written each way of ``PRODUCT_COMPRESSION``.

    Per mode: the median over ``repeat`` runs of :func:`pipelines.compression.compress_product_hdul`
    plus :func:`pipelines.fitsio.write_fits_atomic` (``none``: the write alone), the file's
    bytes per pixel (whole file, headers included), and for ``noise`` the RMS over the finite
    pixels of ``(read back - written) / UNCERT``, read back with astropy (not taken from the
    header's ``CMPQERR``, which is checked against it)."""
    import warnings

    warnings.simplefilter("ignore")
    from astropy.io import fits

    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.compression import COMPRESSION_MODES, compress_product_hdul
    from pipelines.fitsio import read_image, write_fits_atomic
    from pipelines.products import build_product_hdul

    cals = _masters(data_dir, channel)
    raw = read_image(_raw_path(data_dir, channel), dtype=np.float32)
    l2 = calibrate_frame(raw.data, raw.header, cals, _options())
    hdul = build_product_hdul(l2, software_version="bench")
    data = np.asarray(hdul[0].data)
    sigma = np.asarray(hdul["UNCERT"].data)
    dq = np.asarray(hdul["DQ"].data)
    tmp = Path(tempfile.mkdtemp(prefix="lst_bench_cmp_"))
    out: dict = {"mode": "compress", "channel": channel, "pixels": int(data.size)}
    for mode in COMPRESSION_MODES:
        path = tmp / f"product_{mode}.fits"
        times = []
        for _ in range(repeat + 1):  # the first run untimed (imports, caches)
            t0 = time.perf_counter()
            write_fits_atomic(compress_product_hdul(hdul, mode), path)
            times.append(time.perf_counter() - t0)
        out[f"bytes_per_px_{mode}"] = path.stat().st_size / data.size
        out[f"write_s_{mode}"] = statistics.median(times[1:])
        with fits.open(path, memmap=False) as back:
            i0 = 0 if mode == "none" else 1
            d, u, q = back[i0].data, back["UNCERT"].data, back["DQ"].data
            ok = np.isfinite(data) & np.isfinite(sigma) & (sigma > 0)
            e = (d[ok].astype(np.float64) - data[ok]) / sigma[ok]
            out[f"err_over_sigma_{mode}"] = float(np.sqrt(np.mean(e * e)))
            out[f"dq_exact_{mode}"] = bool(np.array_equal(q, dq))
            out[f"header_qerr_{mode}"] = back[0].header.get("CMPQERR")
        path.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def worker(mode: str, channel: str, data_dir: Path, repeat: int, profile: bool) -> dict:
    import warnings

    import sunpy

    sunpy.log.setLevel("WARNING")
    warnings.simplefilter("ignore")
    from pipelines.calibration.l2 import flow, resample, steps

    task = TASKS[mode]
    raw_path = _raw_path(data_dir, channel)
    tmp = Path(tempfile.mkdtemp(prefix="lst_bench_"))
    out = tmp / "product.fits"
    t0 = time.perf_counter()
    cals = _masters(data_dir, channel)
    prep = {"load masters": time.perf_counter() - t0}
    if mode == "pipeline":
        t0 = time.perf_counter()
        flow.bad_pixel_map(cals["dark"])
        prep["bad-pixel map (once per master)"] = time.perf_counter() - t0
    timer = _Timer()
    if mode == "pipeline":
        import importlib

        for name in STEP_NAMES:
            module = resample if name == "rotate_north_up" else steps
            setattr(module, name, timer.wrap(name, getattr(module, name)))
        for mod_name, name in EXTRA_TIMED:
            module = importlib.import_module(mod_name)
            setattr(module, name, timer.wrap(name, getattr(module, name)))
        flow._stats = timer.wrap("statistics", flow._stats)
    task(raw_path, out, _Timer(), cals)  # warm-up: imports, caches
    totals = []
    per_step: list[dict[str, float]] = []
    for _ in range(repeat):
        timer.t = {}
        t0 = time.perf_counter()
        task(raw_path, out, timer, cals)
        totals.append(time.perf_counter() - t0)
        per_step.append(dict(timer.t))
        out.unlink(missing_ok=True)
    steps_med = {k: statistics.median(d.get(k, 0.0) for d in per_step) for k in per_step[0]}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    task(raw_path, out, _Timer(), cals)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    prof_text = None
    if profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        task(raw_path, out, _Timer(), cals)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        prof_text = s.getvalue()
    size = out.stat().st_size
    shutil.rmtree(tmp, ignore_errors=True)
    n = int(np.prod(_shape(raw_path)))
    return {"mode": mode, "channel": channel, "seconds": statistics.median(totals), "all_seconds": totals,
            "steps": steps_med, "prep": prep, "peak_mib": peak / 2**20, "frame_mib": n * 4 / 2**20,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mib": rss_before,
            "product_bytes": size, "profile": prof_text}


def _shape(path: Path) -> tuple[int, int]:
    from astropy.io import fits

    h = fits.getheader(path)
    return int(h["NAXIS2"]), int(h["NAXIS1"])


# ----------------------------------------------------------------------------- driver side


def _run_worker(mode: str, channel: str, data_dir: Path, repeat: int, profile: bool = False, *,
                batch: int = 0, resample: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--channel", channel, "--data", str(data_dir),
           "--repeat", str(repeat), "--batch", str(batch)] + (["--profile"] if profile else [])
    cmd += ["--resample", resample] if resample else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if proc.returncode != 0:
        raise RuntimeError(f"worker {mode} {channel} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _prepare(data_dir: Path, wst: int, sci: int, seed: int) -> None:
    from pipelines.simulation import simulate

    want = {"WST": wst, "SCI-WL": sci}
    ok = all(any((data_dir / "raw").glob(f"lst_{c.lower()}_*_raw.fits")) for c in want) if data_dir.is_dir() else False
    if ok:
        ok = all(_shape(_raw_path(data_dir, c))[0] == n for c, n in want.items())
    if not ok:
        t0 = time.perf_counter()
        simulate(data_dir, channels=tuple(want), naxis=want, noise=True, seed=seed, sdi_sequence=False)
        print(f"simulated WST {wst} px and SCI-WL {sci} px in {time.perf_counter() - t0:.1f} s", flush=True)


def _fmt_steps(r: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in r["steps"].items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wst-size", type=int, default=4608)
    ap.add_argument("--sci-size", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--data", type=Path, default=None, help="simulated data folder (made if missing)")
    ap.add_argument("--batch", type=int, default=8, help="WST frames in the batch measurement (default 8)")
    ap.add_argument("--resample", default=None,
                    help="CalibrationOptions(resample=NAME) for the pipeline and the batch, where that field exists")
    ap.add_argument("--report", action="store_true", help=f"write {REPORT.relative_to(ROOT)}")
    ap.add_argument("--worker", choices=sorted(TASKS) + list(BATCH_TASKS) + ["compress"], help=argparse.SUPPRESS)
    ap.add_argument("--channel", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("--batch must be at least 1")
    _check_resample(args.resample)
    if args.resample:
        OPTIONS["resample"] = args.resample
    if args.worker == "compress":
        print(json.dumps(compress_worker(args.channel, args.data, args.repeat)))
        return 0
    if args.worker in BATCH_TASKS:
        print(json.dumps(batch_worker(args.worker, args.channel, args.data, args.batch)))
        return 0
    if args.worker:
        print(json.dumps(worker(args.worker, args.channel, args.data, args.repeat, args.profile)))
        return 0
    data = args.data or Path(tempfile.gettempdir()) / f"lst_bench_{args.wst_size}_{args.sci_size}"
    _prepare(data, args.wst_size, args.sci_size, args.seed)
    results: dict[tuple[str, str], dict] = {}
    plan = [(ch, mode) for ch in ("WST", "SCI-WL") for mode in ("floor", "pipeline", "peer")]
    plan[3:3] = [("WST", "floor_batch"), ("WST", "batch")]
    for ch, mode in plan:
        r = _run_worker(mode, ch, data, args.repeat, profile=(mode == "pipeline" and ch == "WST"),
                        batch=args.batch, resample=args.resample)
        results[(ch, mode)] = r
        print(f"{ch:6s} {mode:8s} {r['seconds']:7.3f} s (runs {', '.join(f'{x:.2f}' for x in r['all_seconds'])}); "
              f"peak {r['peak_mib']:.0f} MiB = {r['peak_mib'] / r['frame_mib']:.1f} float32 frames; "
              f"maxrss {r['maxrss_mib']:.0f} MiB", flush=True)
        print(f"         steps [s]: {_fmt_steps(r)}", flush=True)
        if r["prep"]:
            print(f"         once per worker [s]: " + ", ".join(f"{k} {v:.2f}" for k, v in r["prep"].items()))
    w_floor, w_pipe, w_peer = (results[("WST", m)]["seconds"] for m in ("floor", "pipeline", "peer"))
    s_floor, s_pipe = results[("SCI-WL", "floor")]["seconds"], results[("SCI-WL", "pipeline")]["seconds"]
    peak = results[("WST", "pipeline")]["peak_mib"]
    b_floor, b_pipe = results[("WST", "floor_batch")]["seconds"], results[("WST", "batch")]["seconds"]
    print(f"WST batch of {args.batch}: {args.batch / b_pipe:.3f} frames/s, floor {args.batch / b_floor:.3f} frames/s",
          flush=True)
    line = (f"RESULT wst_pipeline_over_floor={w_pipe / w_floor:.2f} wst_batch_over_floor={b_pipe / b_floor:.2f} "
            f"wst_peer_over_pipeline={w_peer / w_pipe:.2f} sci_pipeline_over_floor={s_pipe / s_floor:.2f} "
            f"peak_mib={peak:.0f}")
    cmp = _run_worker("compress", "WST", data, args.repeat, batch=args.batch)
    print("WST product compression (same product written each way; write s = compress + write_fits_atomic, "
          "median): " + "; ".join(f"{m} {cmp[f'bytes_per_px_{m}']:.3f} B/px {cmp[f'write_s_{m}']:.3f} s "
                                  f"err/sigma {cmp[f'err_over_sigma_{m}']:.4f} DQ exact {cmp[f'dq_exact_{m}']}"
                                  for m in ("none", "lossless", "noise"))
          + f"; noise header CMPQERR {cmp['header_qerr_noise']}", flush=True)
    line += (f" bytes_per_px_none={cmp['bytes_per_px_none']:.3f} bytes_per_px_lossless={cmp['bytes_per_px_lossless']:.3f}"
             f" bytes_per_px_noise={cmp['bytes_per_px_noise']:.3f} noise_err_over_sigma={cmp['err_over_sigma_noise']:.4f}"
             f" write_s_none={cmp['write_s_none']:.3f} write_s_lossless={cmp['write_s_lossless']:.3f}"
             f" write_s_noise={cmp['write_s_noise']:.3f}")
    if args.report:
        _write_report(results, line, args)
    print(results[("WST", "pipeline")]["profile"] or "")
    print(line)
    return 0


def _write_report(results: dict, line: str, args) -> None:
    L = ["# Calibration benchmark: one frame at full size", ""]
    L.append(f"`python benchmarks/calibrate.py --report` (WST {args.wst_size} px, SCI-WL {args.sci_size} px, "
             f"median of {args.repeat} runs; batch of {args.batch} WST frames, one run"
             + (f"; --resample {args.resample}" if args.resample else "") + "; each task in its own process) on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"numpy {np.__version__}. Disk: the machine's temp folder.")
    L.append("")
    L.append("```")
    L.append(line)
    L.append("```")
    L.append("")
    L.append("| channel | task | seconds | x floor | peak (tracemalloc) | in float32 frames | maxrss |")
    L.append("|---|---|---|---|---|---|---|")
    for (ch, mode), r in results.items():
        if mode in BATCH_TASKS:
            floor = results[(ch, "floor_batch")]["seconds"]
            L.append(f"| {ch} | {mode} ({r['frames']} frames; {r['fps']:.3f} frames/s) | {r['seconds']:.3f} | "
                     f"{r['seconds'] / floor:.2f} | {r['peak_mib']:.0f} MiB ({r['peak_frames_run']}-frame run) | "
                     f"{r['peak_mib'] / r['frame_mib']:.1f} | {r['maxrss_mib']:.0f} MiB |")
            continue
        floor = results[(ch, "floor")]["seconds"]
        L.append(f"| {ch} | {mode} | {r['seconds']:.3f} | {r['seconds'] / floor:.2f} | {r['peak_mib']:.0f} MiB | "
                 f"{r['peak_mib'] / r['frame_mib']:.1f} | {r['maxrss_mib']:.0f} MiB |")
    L.append("")
    L.append("Per-step times [s] (median; batch rows: sums over the batch's frames, which overlap in time):")
    L.append("")
    for (ch, mode), r in results.items():
        L.append(f"* {ch} {mode}: {_fmt_steps(r)}" + (
            "; once per worker: " + ", ".join(f"{k} {v:.2f}" for k, v in r["prep"].items()) if r["prep"] else ""))
    L.append("")
    L.append("## Profile of the pipeline, WST (cProfile, by own time)")
    L.append("")
    L.append("```")
    L.append((results[("WST", "pipeline")]["profile"] or "").strip())
    L.append("```")
    L.append("")
    L.append("<!-- analysis -->")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    old = REPORT.read_text() if REPORT.exists() else ""
    analysis = old.split("<!-- analysis -->", 1)[1] if "<!-- analysis -->" in old else "\n"
    REPORT.write_text("\n".join(L) + analysis)


if __name__ == "__main__":
    sys.exit(main())
