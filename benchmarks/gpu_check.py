"""GPU check: CPU vs CuPy parity of the calibration at full size, and throughput.

On a machine with an NVIDIA GPU and CuPy (``pip install -e '.[gpu]'``):

1. simulates one WST frame (4608 x 4608) and one SCI-WL frame (2048 x 2048) with noise
   (:func:`pipelines.simulation.simulate`), with their masters;
2. parity: calibrates each frame with NumPy (``calibrate_frame``, ``backend="numpy"``),
   with CuPy frame by frame, and with CuPy through the GPU worker's batch executor
   (:class:`pipelines.calibration.l2.batch.BatchExecutor`: masters resident, pinned buffers,
   copy and compute streams). CPU vs GPU: the relative difference on the good pixels
   (median, 99.9th percentile, max) must stay at float32 rounding (median < 1e-6,
   p99.9 < 1e-4: the cubic spline and the powers are evaluated by different kernels),
   the DQ arrays must agree on all but 1e-5 of the pixels and the CAL*/WCS keywords must
   be identical. Batched GPU vs per-frame GPU: the same kernels on other streams, so the
   same bounds (reported; identical bits are expected);
3. throughput, WST frames read from disk with the products returned to the host, as a
   GPU worker does, masters already resident (copied once, bad-pixel map derived once on
   the host):

   * ``cpu``: NumPy, frame after frame;
   * ``gpu_frame``: CuPy, frame after frame, nothing overlapped (read, copy, compute,
     copy back, statistics, in turn);
   * ``gpu_batch1``: the batch executor with one lane: the next frame's read (reader
     thread) and host-to-device copy (pinned buffer, copy stream) overlap the compute;
   * ``gpu_batchN``: ``--lanes`` lanes (default 2): also one frame's device-to-host copy
     overlaps the next frame's kernels.

   Each batched figure also prints its phases per frame: wall time, the process's CPU time
   (all threads), the read and calibrate wall times of their threads and the CPU time spent
   in each device section (:func:`pipelines.calibration.l2.device.section`: on a GPU the host's
   cost of launching and waiting for the kernels). The batch runs as the GPU worker's: raw
   frames uploaded as stored 16-bit words and decoded on the device, statistics,
   uncertainty, the centre fit's sampling and the quicklook's block average on the device
   (issue 29). The host side alone, with the device work excluded, is
   ``benchmarks/gpu_host.py``'s.

   The same raw file is read for every frame (it stays in the page cache after the first
   read: the figures leave out cold-disk reads).

Sized to finish in under 5 minutes on an H100/H200-class machine, but not yet run on one
(written where no GPU exists). What was measured: ``--cpu-only --frames 2`` at full size
took 199 s on a shared 2-core development machine (simulation 47 s, then 15 NumPy
calibrations, 11 of them WST at 4608 px). On a GPU machine the same simulation and 5 NumPy
calibrations remain, plus 33 GPU frames whose host-side work (read, statistics, first-use
kernel compilation) is estimated, not measured, at about a second each. Where CuPy or a GPU is absent it prints why and exits with status 0 without doing
anything (status 2 with ``--require``). Exit status 1 if a
parity check fails. The last line is::

    GPU_RESULT wst_max_rel=<..> sci_max_rel=<..> batch_max_rel=<..> cpu_fps=<..> gpu_frame_fps=<..>
      gpu_batch1_fps=<..> gpu_batch<N>_fps=<..> speedup=<..> overlap_gain=<..>
      h2d_gbps=<..> pcie_peak_gbps=<..> h2d_over_peak=<..>

(one line), ``speedup`` the best batched GPU figure over the CPU's, ``overlap_gain`` the
best batched figure over the per-frame GPU figure (the copy/compute overlap), ``h2d_gbps``
one WST frame's host-to-device copy as the executor makes it against ``pcie_peak_gbps``,
a 1 GiB pinned copy on the same machine (:func:`_h2d_bandwidth`; issue 15's targets:
>= 20 WST frames/s, host-to-device >= 80 % of the peak).

``--cpu-only`` runs the same steps with NumPy in place of CuPy at whatever size is asked
(a smoke test of the script and of the executor's ordering on machines without a GPU;
batched and per-frame products must then be identical bit for bit); its last line is
``CPU_SMOKE_RESULT batch_identical=<0|1> cpu_fps=<..> batch_fps=<..>``.

Usage::

    .venv/bin/python benchmarks/gpu_check.py [--frames 8] [--lanes 2] [--wst-size 4608] [--sci-size 2048]
    .venv/bin/python benchmarks/gpu_check.py --cpu-only --wst-size 128 --sci-size 64 --frames 3

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
    from pipelines.calibration.l2.flow import bad_pixel_map
    from pipelines.simulation import load_simulated_masters

    cals = load_simulated_masters(out, channel)
    bad_pixel_map(cals["dark"])  # derived once on the host, cached on the master
    return cals


def _parity(ref, other) -> dict:
    good = (ref.dq == 0) & np.isfinite(ref.data) & np.isfinite(other.data)
    a, b = ref.data[good].astype(np.float64), other.data[good].astype(np.float64)
    scale = np.maximum(np.abs(a), 1e-6 * np.max(np.abs(a)))
    rel = np.abs(b - a) / scale
    keys = [k for k in ref.header if k.startswith(("CAL", "CRPIX", "CDELT", "CRVAL", "PC", "CTYPE", "BUNIT", "LEVEL"))]
    return {"median_rel": float(np.median(rel)), "p999_rel": float(np.percentile(rel, 99.9)),
            "max_rel": float(rel.max()), "dq_mismatch": float(np.mean(ref.dq != other.dq)),
            "header_mismatch": [k for k in keys if ref.header.get(k) != other.header.get(k)],
            "identical": bool(np.array_equal(ref.data, other.data, equal_nan=True) and np.array_equal(ref.dq, other.dq))}


def _parity_ok(p: dict) -> bool:
    return (p["median_rel"] < 1e-6 and p["p999_rel"] < 1e-4 and p["dq_mismatch"] < 1e-5
            and not p["header_mismatch"])


def _describe(p: dict) -> str:
    return (f"median rel {p['median_rel']:.2e}, p99.9 {p['p999_rel']:.2e}, max {p['max_rel']:.2e}, "
            f"DQ mismatch {p['dq_mismatch']:.2e}, header mismatch {p['header_mismatch']}, "
            f"identical {p['identical']}")


def _h2d_bandwidth(frame_shape: tuple[int, int], *, repeat: int = 5) -> dict:
    """Host-to-device copy rates [GB/s, 1e9 bytes/s], timed with CUDA events (best of ``repeat``).

    * ``pcie_peak_gbps``: one 1 GiB copy from page-locked memory on a non-blocking stream,
      the most the link gives to a single copy (the measured peak, not the PCIe
      generation's nominal figure);
    * ``h2d_gbps``: the batch executor's own transfer: one float32 frame of
      ``frame_shape`` from a pinned buffer with ``cupy.ndarray.set(pinned, stream=...)``
      (as :class:`pipelines.calibration.l2.batch._CupyTransfer` stages a frame);
    * ``stage_gbps``: the host-side ``np.copyto`` into the pinned buffer that precedes it.
    """
    import cupy as cp
    import cupyx

    stream = cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def timed(dev, pinned) -> float:
        best = float("inf")
        for _ in range(repeat):
            start.record(stream)
            dev.set(pinned, stream=stream)
            stop.record(stream)
            stop.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return pinned.nbytes / best / 1e9

    big = cupyx.empty_pinned((1 << 28,), dtype=np.float32)  # 1 GiB
    big[...] = 1.0
    with stream:
        dbig = cp.empty(big.shape, dtype=big.dtype)
    peak = timed(dbig, big)
    del dbig, big
    frame = cupyx.empty_pinned(frame_shape, dtype=np.float32)
    host = np.random.default_rng(0).random(frame_shape, dtype=np.float32)
    t0 = time.perf_counter()
    np.copyto(frame, host)
    stage = host.nbytes / (time.perf_counter() - t0) / 1e9
    with stream:
        dframe = cp.empty(frame_shape, dtype=np.float32)
    h2d = timed(dframe, frame)
    cp.cuda.Device().synchronize()
    return {"pcie_peak_gbps": peak, "h2d_gbps": h2d, "h2d_over_peak": h2d / peak, "stage_gbps": stage}


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (user + system)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _sync(backend: str) -> None:
    if backend == "cupy":
        import cupy as cp

        cp.cuda.Device().synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=8, help="WST frames per throughput figure (GPU)")
    ap.add_argument("--lanes", type=int, default=2, help="lanes of the overlapped batch figure")
    ap.add_argument("--wst-size", type=int, default=4608)
    ap.add_argument("--sci-size", type=int, default=2048)
    ap.add_argument("--require", action="store_true", help="exit 2 (not 0) when no GPU is available")
    ap.add_argument("--cpu-only", action="store_true",
                    help="NumPy in place of CuPy (smoke test of the script and the batch executor)")
    args = ap.parse_args(argv)
    if args.frames < 2 or args.lanes < 1:
        ap.error("--frames must be >= 2 and --lanes >= 1")
    if args.cpu_only:
        dev_backend = "numpy"
        print("gpu_check --cpu-only: NumPy stands in for CuPy; no GPU figure is produced")
    else:
        why = _gpu_or_reason()
        if why:
            print(f"gpu_check: skipped, no GPU: {why}. Nothing was run. "
                  "On a GPU machine: pip install -e '.[gpu]' and run this script again.")
            return 2 if args.require else 0
        import cupy as cp

        dev_backend = "cupy"
        dev = cp.cuda.runtime.getDeviceProperties(0)
        print(f"GPU: {dev['name'].decode() if isinstance(dev['name'], bytes) else dev['name']}, CuPy {cp.__version__}")

    from pipelines.calibration.l2.batch import BatchExecutor, BatchItem
    from pipelines.calibration.l2.device import DeviceMeter
    from pipelines.products import QUICKLOOK_SIZE
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate

    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="lst_gpu_"))
    sizes = {"WST": args.wst_size, "SCI-WL": args.sci_size}
    sim = simulate(work, channels=tuple(sizes), naxis=sizes, noise=True, seed=3, sdi_sequence=False)
    print(f"simulated in {time.perf_counter() - t_start:.1f} s")
    masters = {ch: _masters(work, ch) for ch in sizes}
    failed = False
    out: dict[str, float] = {}

    # -- parity ---------------------------------------------------------------------------
    executor = BatchExecutor(dev_backend, lanes=args.lanes)
    batch = executor.run([BatchItem.from_path(f.channel, f.raw_path, masters[f.channel]) for f in sim.frames])
    batch_identical = True
    for f, outcome in zip(sim.frames, batch):
        if not outcome.ok:
            print(f"parity {f.channel}: the batch executor failed: {outcome.error} -> FAIL")
            failed = True
            continue
        raw = read_image(f.raw_path, dtype=np.float32)
        cpu = calibrate_frame(raw.data, raw.header, masters[f.channel], backend="numpy")
        if dev_backend == "cupy":
            resident = executor.masters.resolve(masters[f.channel])
            gpu = calibrate_frame(raw.data, raw.header, resident, backend="cupy")
            p = _parity(cpu, gpu)
            ok = _parity_ok(p) and gpu.header["BACKEND"] == "cupy"
            failed |= not ok
            out[f"{f.channel}_max_rel"] = p["max_rel"]
            print(f"parity {f.channel} {f.naxis} px, CPU vs GPU per frame: {_describe(p)} -> {'OK' if ok else 'FAIL'}")
            pb = _parity(gpu, outcome.result)
            okb = _parity_ok(pb) and outcome.result.header["BACKEND"] == "cupy"
            failed |= not okb
            out["batch_max_rel"] = max(out.get("batch_max_rel", 0.0), pb["max_rel"])
            print(f"parity {f.channel} {f.naxis} px, GPU batch vs GPU per frame: {_describe(pb)} "
                  f"-> {'OK' if okb else 'FAIL'}")
        else:
            pb = _parity(cpu, outcome.result)
            same = pb["identical"] and not pb["header_mismatch"] and cpu.stats == outcome.result.stats
            batch_identical &= same
            failed |= not same
            print(f"parity {f.channel} {f.naxis} px, NumPy batch vs NumPy per frame: {_describe(pb)} "
                  f"-> {'OK' if same else 'FAIL'}")
    verb = "copied to the device once" if dev_backend == "cupy" else "held once (no copy on NumPy)"
    print(f"resident masters: {executor.masters.uploads} {verb}, {executor.masters.uploaded_bytes / 2**20:.1f} MiB")

    # -- throughput -----------------------------------------------------------------------
    wst = next(f for f in sim.frames if f.channel == "WST")
    cals = masters["WST"]
    n = args.frames

    def per_frame(backend: str, c, count: int) -> float:
        raw = read_image(wst.raw_path, dtype=np.float32)
        calibrate_frame(raw.data, raw.header, c, backend=backend)  # warm-up (kernels compiled, caches)
        _sync(backend)
        t0 = time.perf_counter()
        for _ in range(count):
            raw = read_image(wst.raw_path, dtype=np.float32)
            calibrate_frame(raw.data, raw.header, c, backend=backend)
        _sync(backend)
        return count / (time.perf_counter() - t0)

    def batched(lanes: int) -> float:
        # as the GPU worker runs it: stored 16-bit words uploaded, quicklook average on the device
        ex = BatchExecutor(dev_backend, lanes=lanes, quicklook_size=QUICKLOOK_SIZE)
        ex.run([BatchItem.from_path(i, wst.raw_path, cals) for i in range(min(2, n))])  # warm-up: buffers, masters
        items = [BatchItem.from_path(i, wst.raw_path, cals) for i in range(n)]
        meter = DeviceMeter()
        c0 = _cpu_s()
        t0 = time.perf_counter()
        with meter.activate():
            res = ex.run(items)
            _sync(dev_backend)
        wall = time.perf_counter() - t0
        cpu = _cpu_s() - c0
        fps = n / wall
        bad = [o.error for o in res if not o.ok]
        if bad:
            raise RuntimeError(f"batched throughput run failed: {bad[0]}")
        read = sum(o.read_s for o in res) / n
        compute = sum(o.compute_s for o in res) / n
        print(f"  phases per frame, {lanes} lane(s): wall {wall / n:.3f} s, process CPU {cpu / n:.3f} s (all threads); "
              f"read {read:.3f} s and calibrate {compute:.3f} s wall on their threads; CPU of the threads in the "
              "device sections (on a GPU: launching and waiting; on NumPy: the work): "
              + ", ".join(f"{k} {v / n:.3f}" for k, v in sorted(meter.cpu_s.items()))
              + " s. Host side without the device: benchmarks/gpu_host.py")
        return fps

    n_cpu = n if args.cpu_only else max(2, n // 4)
    out["cpu_fps"] = per_frame("numpy", cals, n_cpu)
    print(f"throughput cpu: {out['cpu_fps']:.2f} frames/s ({n_cpu} WST frames of {wst.naxis} px, NumPy, frame after "
          "frame, read from disk, product on the host)")
    label = "gpu" if dev_backend == "cupy" else "numpy"
    if dev_backend == "cupy":
        out["frame_fps"] = per_frame("cupy", executor.masters.resolve(cals), n)
        print(f"throughput gpu_frame: {out['frame_fps']:.2f} frames/s ({n} frames, frame after frame, nothing "
              "overlapped, masters resident)")
    else:
        out["frame_fps"] = out["cpu_fps"]
    lane_counts = sorted({1, args.lanes})
    for lanes in lane_counts:
        out[f"batch{lanes}_fps"] = batched(lanes)
        print(f"throughput {label}_batch{lanes}: {out[f'batch{lanes}_fps']:.2f} frames/s ({n} frames, batch "
              f"executor, {lanes} lane(s): read and host-to-device copy of the next frame overlap the compute"
              + ("; one frame's device-to-host copy overlaps the next frame's kernels)" if lanes > 1
                 else ")"))
    best = max(out[f"batch{k}_fps"] for k in lane_counts)
    if dev_backend == "cupy":
        bw = _h2d_bandwidth((wst.naxis, wst.naxis))
        out.update(bw)
        print(f"host-to-device: {bw['h2d_gbps']:.1f} GB/s per WST frame (pinned, copy stream) against a measured peak "
              f"of {bw['pcie_peak_gbps']:.1f} GB/s (1 GiB pinned copy): {100 * bw['h2d_over_peak']:.0f} % "
              f"(target >= 80 %); host staging copy into the pinned buffer {bw['stage_gbps']:.1f} GB/s")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if dev_backend == "numpy":
        print(f"CPU_SMOKE_RESULT batch_identical={int(batch_identical)} cpu_fps={out['cpu_fps']:.2f} "
              f"batch_fps={best:.2f}")
        return 1 if failed else 0
    print(f"GPU_RESULT wst_max_rel={out.get('WST_max_rel', float('nan')):.2e} "
          f"sci_max_rel={out.get('SCI-WL_max_rel', float('nan')):.2e} "
          f"batch_max_rel={out.get('batch_max_rel', float('nan')):.2e} cpu_fps={out['cpu_fps']:.2f} "
          f"gpu_frame_fps={out['frame_fps']:.2f} "
          + " ".join(f"gpu_batch{k}_fps={out[f'batch{k}_fps']:.2f}" for k in lane_counts)
          + f" speedup={best / out['cpu_fps']:.1f} overlap_gain={best / out['frame_fps']:.2f}"
          + f" h2d_gbps={out['h2d_gbps']:.1f} pcie_peak_gbps={out['pcie_peak_gbps']:.1f}"
          + f" h2d_over_peak={out['h2d_over_peak']:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
