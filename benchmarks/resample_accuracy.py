"""Accuracy of the OpenCV north-up back ends against scipy's cubic spline, on real scenes (issue 15 item 1).

Each real full-disk or coronagraph frame of ``sample-data/real`` (SOHO/MDI continuum and
SDO/HMI continuum for WST, PROBA2/SWAP 174 A for SDI, STEREO/COR1-A for SCI) is placed as an
LST frame: its own pixels (their real, unsmoothed structure), scaled so that its brightest
pixels (99.95th percentile) reach the channel's raw peak of the instrument model
(``pipelines.simulation.forward.INSTRUMENT``: ``target_peak_dn`` less bias and dark), with
a helioprojective header at a roll of ``--rolls`` degrees around its real disk centre (a
fractional offset from the frame centre). :func:`pipelines.calibration.l2.resample.rotate_north_up`
rotates it north up with each back end; the spline (``resample="spline"``, order 3) is the
reference. Reported per scene and roll, for each OpenCV back end:

* flux ratio: sum over the pixels with data in both outputs, back end / spline; and each
  output's sum over the disk (r < 1.05 Rsun) or the coronagraph field against the input's
  over the same sky (a rotation keeps the area);
* limb (SCI: occulter edge) position: :func:`pipelines.calibration.l2.centre.fit_disk_centre` on
  both outputs; differences of centre (x, y) and radius [pixel];
* median and p99 of ``|back end - spline|``, relative to the spline value and in units of
  the per-pixel noise sigma of the LST frame at that level (Poisson + read noise + ADC +
  dark: ``sigma^2 = (S + D) / gain + read_noise^2 + 1/12`` [DN^2], the model of
  ``pipelines.calibration.l2.uncertainty.raw_variance``), on the disk (r < 0.98 Rsun), in the
  limb annulus (0.98-1.02 Rsun), off the disk, and for SCI over the field;
* the time of the data resampling of one 4608^2 WST frame for each back end (MDI scene
  enlarged; noisy on a shared machine).

The rule for the default (stated in the report): a back end may replace the spline only if,
on every scene and roll, p99 |diff| < 1 sigma on the disk (SCI: field) and the limb /
occulter fit moves by < 0.01 px (centre and radius) and the flux ratio is within 1e-4 of 1.

Writes ``benchmarks/reports/resample_accuracy.md`` and prints
``RESULT opencv_p99_over_sigma=<x> flux_ratio=<y> limb_shift_px=<z> opencv_s=<a> scipy_s=<b> default=<name>``
(worst values of ``opencv-cubic`` over the scenes).

Usage: ``python benchmarks/resample_accuracy.py [--rolls 1.35 17] [--size 4608] [--no-timing]``
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from astropy.io import fits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.calibration.l2 import resample  # noqa: E402
from pipelines.calibration.l2.centre import fit_disk_centre  # noqa: E402
from pipelines.calibration.l2.uncertainty import ADC_VARIANCE_DN2  # noqa: E402
from pipelines.errors import DataError  # noqa: E402
from pipelines.simulation.forward import INSTRUMENT  # noqa: E402
from pipelines.simulation.sources import (COR1_FILE, HMI_JP2_FILE, MDI_FILE, SAMPLE_DIR, SWAP_FILE,  # noqa: E402
                                          _helioviewer_source, _sunpy_source)

REPORT = ROOT / "benchmarks" / "reports" / "resample_accuracy.md"
BACKENDS = ("opencv-cubic", "opencv-lanczos4")
#: COR1's occulter edge [Rsun] as a first guess of the fit (Thompson et al. 2003, SPIE 4853, 1: 1.4 Rsun field edge)
COR1_OCCULTER_RSUN = 1.4
#: The default rule's limits.
RULE_P99_SIGMA, RULE_LIMB_PX, RULE_FLUX = 1.0, 0.01, 1e-4


def _scenes() -> list[dict]:
    """The real frames, each with its LST channel, disk centre [0-based px] and radius [px]."""
    out = []
    for name, path, channel, reader in (("SOHO/MDI continuum 1024", MDI_FILE, "WST", _sunpy_source),
                                        ("SDO/HMI continuum (Helioviewer) 512", HMI_JP2_FILE, "WST",
                                         _helioviewer_source),
                                        ("PROBA2/SWAP 174 A 1024", SWAP_FILE, "SDI", _sunpy_source),
                                        ("STEREO/COR1-A raw 1024", COR1_FILE, "SCI-WL", _sunpy_source)):
        src = reader(SAMPLE_DIR / path)
        img = np.asarray(src.image, dtype=np.float64)
        img = np.where(np.isfinite(img), img, 0.0)  # MDI's NaN off the disk is the sky: 0
        scale = math.sqrt(abs(np.linalg.det(src.matrix)))
        out.append({"name": name, "file": path, "channel": channel, "image": img, "x0": src.x0, "y0": src.y0,
                    "scale": scale, "rsun_arcsec": src.rsun_arcsec, "rsun_px": src.rsun_arcsec / scale})
    return out


#: Resolution of the real sources [arcsec], taken as 2 of their pixels (near-Nyquist sampling; an assumption).
SOURCE_RESOLUTION_PX = 2.0


def _lst_sampled(scene: dict, n: int, offset_px: tuple[float, float] = (2.7, -2.0)) -> dict:
    """The scene on an ``n`` x ``n`` LST grid of its channel (plate scale ``plate_scale_for(n)``),
    disk centre ``offset_px`` from the frame centre, with the channel's resolution: a Gaussian
    of FWHM ``sqrt(res_LST^2 - res_source^2)`` (``pipelines.channels.CHANNELS[...].resolution``;
    the source's resolution taken as ``SOURCE_RESOLUTION_PX`` of its pixels; none when the source
    is coarser). Cubic-spline enlargement (scipy.ndimage, the source's sampling sets the detail)."""
    from scipy import ndimage

    from pipelines.channels import CHANNELS

    spec = CHANNELS[scene["channel"]]
    scale = spec.plate_scale_for(n)
    z = scene["scale"] / scale  # LST pixels per source pixel
    c = (n - 1) / 2.0
    x0, y0 = c + offset_px[0], c + offset_px[1]
    k = np.eye(2) / z
    off = np.array([scene["y0"], scene["x0"]]) - k @ np.array([y0, x0])
    img = ndimage.affine_transform(scene["image"].astype(np.float32), k, offset=off, output_shape=(n, n), order=3,
                                   mode="constant", cval=0.0, output=np.float32)
    res_src = SOURCE_RESOLUTION_PX * scene["scale"]
    add = math.sqrt(max(spec.resolution ** 2 - res_src ** 2, 0.0))
    if add > 0:
        ndimage.gaussian_filter(img, add / scale / 2.3548, output=img)
    name = f"{scene['name'].split(' ')[0]} on the {scene['channel']} grid {n} px ({scale:g}\"/px, FWHM {spec.resolution:g}\")"
    return dict(scene, name=name, image=img.astype(np.float64), x0=x0, y0=y0, scale=scale,
                rsun_px=scene["rsun_arcsec"] / scale, lst_sampled=True)


def _as_lst(scene: dict) -> tuple[np.ndarray, np.ndarray]:
    """The scene in raw LST DN above bias (float32) and its per-pixel noise sigma [DN]."""
    model = INSTRUMENT[scene["channel"]]
    img = np.clip(scene["image"], 0.0, None)
    dark = model.dark_rate_dn_s * model.exptime_s
    peak = float(np.percentile(img[img > 0], 99.95))
    s = (img * ((model.target_peak_dn - model.bias_dn - dark) / peak)).astype(np.float32)
    sigma = np.sqrt((np.clip(s, 0, None) + dark) / model.gain_e_per_dn + model.read_noise_dn ** 2 + ADC_VARIANCE_DN2)
    return s, sigma.astype(np.float32)


def _header(scene: dict, roll: float, shape: tuple[int, int]) -> fits.Header:
    h = fits.Header()
    h["NAXIS1"], h["NAXIS2"] = shape[1], shape[0]
    h["DATE-OBS"] = "2023-05-01T13:07:58.713"
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"], h["CRPIX2"] = scene["x0"] + 1.0, scene["y0"] + 1.0
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"], h["CDELT2"] = scene["scale"], scene["scale"]
    h["CROTA2"] = roll
    h["HGLN_OBS"], h["HGLT_OBS"], h["DSUN_OBS"] = 0.0, -4.0, 1.496e11
    h["RSUN_OBS"] = scene["rsun_arcsec"]
    return h


def _fit(img: np.ndarray, x0: float, y0: float, r: float, coronagraph: bool) -> tuple[float, float, float] | None:
    try:
        f = fit_disk_centre(img, x0, y0, r, method="occulter" if coronagraph else "limb")
    except DataError:
        return None
    return f.x0, f.y0, f.radius


def _stats(d: np.ndarray, ref: np.ndarray, sig: np.ndarray, mask: np.ndarray) -> dict:
    if not mask.any():
        return {}
    a = np.abs(d[mask])
    rel = a / np.maximum(np.abs(ref[mask]), 1e-3 * float(np.abs(ref[mask]).max()))
    ns = a / sig[mask]
    return {"n": int(mask.sum()), "med_rel": float(np.median(rel)), "p99_rel": float(np.percentile(rel, 99)),
            "med_sig": float(np.median(ns)), "p99_sig": float(np.percentile(ns, 99)), "max_sig": float(ns.max())}


def measure(scene: dict, roll: float) -> dict:
    """Rotate the scene north up with the spline and each OpenCV back end; compare (see module doc)."""
    data, sigma_in = _as_lst(scene)
    ny, nx = data.shape
    h = _header(scene, roll, data.shape)
    coronagraph = scene["channel"].startswith("SCI")
    outs = {}
    for method in ("spline",) + BACKENDS:
        out, dq, h2 = resample.rotate_north_up(data, None, h, method=method)
        outs[method] = (out, dq, h2)
    ref, dq_ref, h_ref = outs["spline"]
    cx, cy = (nx - 1) / 2.0, (ny - 1) / 2.0
    yy, xx = np.mgrid[0:ny, 0:nx]
    rho = np.hypot(xx - cx, yy - cy) / scene["rsun_px"]
    rho_in = np.hypot(xx - scene["x0"], yy - scene["y0"]) / scene["rsun_px"]
    model = INSTRUMENT[scene["channel"]]
    dark = model.dark_rate_dn_s * model.exptime_s
    sig_ref = np.sqrt((np.clip(ref, 0, None) + dark) / model.gain_e_per_dn + model.read_noise_dn ** 2
                      + ADC_VARIANCE_DN2)
    edge_r = COR1_OCCULTER_RSUN * scene["rsun_px"] if coronagraph else scene["rsun_px"]
    fit_ref = _fit(ref, cx, cy, edge_r, coronagraph)
    if coronagraph:  # the field: beyond the occulter edge (+3 px), inside the frame's largest inscribed circle
        r_occ = (fit_ref[2] if fit_ref else edge_r) / scene["rsun_px"]
        r_max = (min(nx, ny) / 2.0 - 4.0) / scene["rsun_px"]
        regions = {"field": (rho > r_occ + 3.0 / scene["rsun_px"]) & (rho < r_max)}
        flux_in = float(data[(rho_in > r_occ + 3.0 / scene["rsun_px"]) & (rho_in < r_max)].sum())
        flux_sky = (rho > r_occ + 3.0 / scene["rsun_px"]) & (rho < r_max)
    else:
        regions = {"disk": rho < 0.98, "limb": (rho >= 0.98) & (rho <= 1.02), "off-disk": rho > 1.02}
        flux_in = float(data[rho_in < 1.05].sum())
        flux_sky = rho < 1.05
    # round trip: rotate by the roll about the frame centre and back; the input is the truth of the pair
    sc_c = dict(scene, x0=cx, y0=cy)
    trip_region = (np.hypot(xx - cx, yy - cy) / scene["rsun_px"] < (0.98 if not coronagraph else 2.5)) & (
        rho > ((fit_ref[2] if fit_ref else edge_r) / scene["rsun_px"] + 3.0 / scene["rsun_px"] if coronagraph else -1))
    trips = {}
    for method in ("spline",) + BACKENDS:
        o1, _, _ = resample.rotate_north_up(data, None, _header(sc_c, roll, data.shape), method=method)
        o2, _, _ = resample.rotate_north_up(o1, None, _header(sc_c, -roll, data.shape), method=method)
        ok = trip_region & np.isfinite(o2)
        trips[method] = _stats(np.where(ok, o2 - data, 0.0), data, sigma_in, ok)
    rows = {"roundtrip": trips, "spline_flux_over_input": float(ref[flux_sky & np.isfinite(ref)].sum()) / flux_in,
            "fit_spline": fit_ref, "n_pix": nx * ny, "backends": {}}
    for method in BACKENDS:
        out, dq, h2 = outs[method]
        both = np.isfinite(out) & np.isfinite(ref)
        d = np.where(both, out - ref, 0.0)
        fit = _fit(out, cx, cy, edge_r, coronagraph)
        shift = None if (fit is None or fit_ref is None) else tuple(float(a - b) for a, b in zip(fit, fit_ref))
        rows["backends"][method] = {
            "flux_ratio": float(out[both].sum()) / float(ref[both].sum()),
            "flux_over_input": float(out[flux_sky & np.isfinite(out)].sum()) / flux_in,
            "fit": fit, "shift": shift,
            "regions": {k: _stats(d, ref, sig_ref, m & both) for k, m in regions.items()},
            "dq_equal": bool(np.array_equal(dq, dq_ref)),
            "history": [str(v) for v in h2.get("HISTORY", [])][-3:],
        }
    return rows


def timing(size: int, repeats: int = 2) -> dict:
    """Seconds of ``rotate_north_up`` (data and DQ) per ``size``^2 WST frame for each back end (best of ``repeats``)."""
    import cv2

    scene = _scenes()[0]
    data, _ = _as_lst(scene)
    big = cv2.resize(data, (size, size), interpolation=cv2.INTER_LINEAR)
    f = size / data.shape[0]
    sc = dict(scene, x0=(scene["x0"] + 0.5) * f - 0.5, y0=(scene["y0"] + 0.5) * f - 0.5, scale=scene["scale"] / f)
    h = _header(sc, -1.35, big.shape)
    out = {}
    for method in ("spline",) + BACKENDS:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            resample.rotate_north_up(big, None, h, method=method)
            best = min(best, time.perf_counter() - t0)
        out[method] = best
    # the data resampling alone (no DQ, no NaN marking): what the back end changes
    nd = resample.ndimage_for(np)
    finite = np.isfinite(big)
    k = np.array([[math.cos(math.radians(1.35)), -math.sin(math.radians(1.35))],
                  [math.sin(math.radians(1.35)), math.cos(math.radians(1.35))]])
    off = np.array([size / 2 - 2.7, size / 2 + 2.0]) - k @ np.array([size / 2, size / 2])
    for method in ("spline",) + BACKENDS:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            if method == "spline":
                resample._resample_data(nd, big, finite, k, off, order=3, threads=resample.default_threads())
            else:
                resample._resample_data_opencv(nd, big, finite, k, off, method=method,
                                               threads=resample.default_threads())
            best = min(best, time.perf_counter() - t0)
        out[f"{method}_data_only"] = best
    out["threads"] = resample.default_threads()
    return out


def _worst(results: list, m: str) -> dict:
    """Worst p99/sigma (disk or field), limb/occulter shift and flux deviation of back end ``m``; the rule."""
    p99 = lim = flux = 0.0
    limb_ok = bool(results)
    for sc, _roll, r in results:
        b = r["backends"][m]
        reg = "field" if sc["channel"].startswith("SCI") else "disk"
        p99 = max(p99, b["regions"][reg]["p99_sig"])
        flux = max(flux, abs(b["flux_ratio"] - 1.0))
        if b["shift"] is None:
            limb_ok = False
        else:
            lim = max(lim, max(abs(v) for v in b["shift"]))
    return {"p99_sig": p99, "limb_px": lim if limb_ok else None, "flux_dev": flux, "n": len(results),
            "qualifies": p99 < RULE_P99_SIGMA and limb_ok and lim < RULE_LIMB_PX and flux < RULE_FLUX}


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rolls", type=float, nargs="+", default=[1.35, 17.0], help="[deg] rolls of the input frames")
    ap.add_argument("--size", type=int, default=4608, help="frame size [px] of the timing")
    ap.add_argument("--lst-size", type=int, default=2304,
                    help="frame size [px] of the LST-sampled scenes (MDI on WST, SWAP on SDI; 0: none)")
    ap.add_argument("--scenes", nargs="+", default=None, help="keep only the scenes whose name holds one of these words")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--report", type=Path, default=REPORT)
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scenes = _scenes()
    if args.lst_size:
        scenes += [_lst_sampled(sc, args.lst_size) for sc in scenes if sc["file"] in (MDI_FILE, SWAP_FILE)]
    if args.scenes:
        scenes = [sc for sc in scenes if any(w in sc["name"] for w in args.scenes)]
    results = []
    for sc in scenes:
        for roll in args.rolls:
            t0 = time.perf_counter()
            r = measure(sc, roll)
            results.append((sc, roll, r))
            c = r["backends"]["opencv-cubic"]
            main_region = "field" if sc["channel"].startswith("SCI") else "disk"
            print(f"{sc['name']:38s} roll {roll:+6.2f}: cubic p99/sigma {c['regions'][main_region]['p99_sig']:.3f} "
                  f"flux {c['flux_ratio']:.7f} shift {c['shift']}; round trip p99/sigma "
                  + ", ".join(f"{m} {st['p99_sig']:.3f}" for m, st in r["roundtrip"].items())
                  + f" ({time.perf_counter() - t0:.1f} s)", flush=True)
    times = {} if args.no_timing else timing(args.size)

    # worst values per back end (all scenes; the LST-sampled ones alone) and the default decision
    worst = {m: _worst(results, m) for m in BACKENDS}
    worst_lst = {m: _worst([x for x in results if x[0].get("lst_sampled")], m) for m in BACKENDS}
    default = resample.DEFAULT_RESAMPLE
    lines = _report(results, times, worst, worst_lst, args, default)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n")
    w = worst["opencv-cubic"]
    wl = worst_lst["opencv-cubic"]
    print(f"report: {args.report}")
    print(f"RESULT opencv_p99_over_sigma={w['p99_sig']:.3f} flux_ratio={1 + w['flux_dev']:.7f} "
          f"limb_shift_px={_fmt(w['limb_px'])} opencv_s={_fmt(times.get('opencv-cubic'), '.3f')} "
          f"scipy_s={_fmt(times.get('spline'), '.3f')} lst_p99_over_sigma={wl['p99_sig']:.3f} "
          f"lst_limb_shift_px={_fmt(wl['limb_px'])} qualifies={w['qualifies']} default={default}")
    return 0


def _report(results: list, times: dict, worst: dict, worst_lst: dict, args: argparse.Namespace,
            default: str) -> list[str]:
    L = ["# North-up resampling: OpenCV back ends against scipy's cubic spline, on real scenes", "",
         f"`python benchmarks/resample_accuracy.py --rolls {' '.join(f'{r:g}' for r in args.rolls)} "
         f"--size {args.size} --lst-size {args.lst_size}{' --no-timing' if args.no_timing else ''}` (issue 15 item 1). Reference: "
         "`resample=\"spline\"` (scipy.ndimage interpolating cubic B-spline, float32 coefficients). Back ends: "
         "`opencv-cubic` (cv2.warpAffine INTER_CUBIC: Keys 1981 cubic convolution with a = -0.75) and "
         "`opencv-lanczos4` (INTER_LANCZOS4). Each real frame is placed as an LST frame at its own sampling "
         "(its real pixel-level structure, not smoothed by an enlargement), scaled to the channel's raw peak "
         "(`INSTRUMENT` of pipelines/simulation/forward.py), with a header rolled by the given angle about "
         "its real disk centre; the LST-sampled scenes ('on the WST/SDI grid') are MDI and SWAP enlarged onto an "
         f"LST grid of {args.lst_size} px (plate scale of that binning), their disk 2.7, -2.0 px off the frame "
         "centre, blurred to the channel's resolution (pipelines.channels; the source's own resolution taken as "
         "2 of its pixels): the sampling of a real LST frame (WST 3\" at 0.5\"/px is 6 px, SDI 9.5\" is 19 px). "
         "sigma: the LST per-pixel noise at the spline's level, "
         "sqrt((S + dark)/gain + read_noise^2 + 1/12) DN. Relative differences are over max(|spline|, "
         "1e-3 of the frame's peak).", ""]
    for m in BACKENDS:
        L += [f"## {m}", "",
              "| scene | channel | roll [deg] | flux ratio (both / spline) | flux / input (r<1.05 Rsun or field) "
              "| centre dx, dy, radius dr [px] | region | median rel | p99 rel | median /sigma | p99 /sigma "
              "| max /sigma |", "|" + "---|" * 12]
        for sc, roll, r in results:
            b = r["backends"][m]
            sh = "fit failed" if b["shift"] is None else ", ".join(f"{v:+.4f}" for v in b["shift"])
            first = True
            for reg, st in b["regions"].items():
                head = (f"| {sc['name']} | {sc['channel']} | {roll:+.2f} | {b['flux_ratio']:.7f} | "
                        f"{b['flux_over_input']:.6f} (spline {r['spline_flux_over_input']:.6f}) | {sh} "
                        if first else "| | | | | | ")
                L.append(head + f"| {reg} | {st['med_rel']:.2e} | {st['p99_rel']:.2e} | {st['med_sig']:.3f} | "
                         f"{st['p99_sig']:.3f} | {st['max_sig']:.2f} |")
                first = False
        L.append("")
    L += ["## Round trip (rotate by the roll about the frame centre and back): each back end against the input", "",
          "Two resamplings; the input is the truth of the pair (disk r < 0.98 Rsun; SCI: occulter edge + 3 px to "
          "2.5 Rsun). Which kernel keeps the real scene better, not only how far the two differ.", "",
          "| scene | roll | back end | median rel | p99 rel | median /sigma | p99 /sigma |", "|---|---|---|---|---|---|---|"]
    for sc, roll, r in results:
        for m, st in r["roundtrip"].items():
            L.append(f"| {sc['name']} | {roll:+.2f} | {m} | {st['med_rel']:.2e} | {st['p99_rel']:.2e} | "
                     f"{st['med_sig']:.3f} | {st['p99_sig']:.3f} |")
    L.append("")
    L += ["## Limb / occulter fits of the spline output", "",
          "| scene | roll | x0, y0, radius [px] (fit_disk_centre) |", "|---|---|---|"]
    for sc, roll, r in results:
        f = r["fit_spline"]
        L.append(f"| {sc['name']} | {roll:+.2f} | " + ("fit failed" if f is None else ", ".join(f"{v:.3f}" for v in f))
                 + " |")
    L.append("")
    if times:
        L += [f"## Time per {args.size}^2 WST frame (noisy: shared 2-core machine, {times['threads']} threads)", "",
              "| back end | rotate_north_up (data + DQ) [s], best of 2 | data resampling only [s], best of 2 |", "|---|---|---|"]
        for m in ("spline",) + BACKENDS:
            L.append(f"| {m} | {times[m]:.3f} | {times[m + '_data_only']:.3f} |")
        L.append("")
    L += ["## Rule and decision", "",
          f"A back end may become the default only if on every scene and roll: p99 |diff| < {RULE_P99_SIGMA:g} sigma "
          f"on the disk (SCI: the field), limb/occulter fit moved by < {RULE_LIMB_PX:g} px (centre and radius), "
          f"|flux ratio - 1| < {RULE_FLUX:g}.", "",
          "| back end | scenes | worst p99 /sigma | worst limb shift [px] | worst abs(flux ratio - 1) | qualifies |",
          "|---|---|---|---|---|---|"]
    for label, group in (("all (native and LST-sampled)", worst), ("LST-sampled only", worst_lst)):
        for m, w in group.items():
            if not w["n"]:
                continue
            L.append(f"| {m} | {label} | {w['p99_sig']:.3f} | {_fmt(w['limb_px'])} | {w['flux_dev']:.2e} | "
                     f"{'yes' if w['qualifies'] else 'no'} |")
    from pipelines.calibration.l2.uncertainty import _keys_cubic

    f = np.linspace(0.0, 1.0, 1001)
    ks = np.arange(-2, 4)
    keys_bias = float(np.abs((_keys_cubic(f[:, None] - ks[None, :]) * ks).sum(axis=1) - f).max())
    f_max = float(f[np.argmax(np.abs((_keys_cubic(f[:, None] - ks[None, :]) * ks).sum(axis=1) - f))])
    native_trip = [r["roundtrip"]["spline"]["p99_sig"] for sc, _, r in results if not sc.get("lst_sampled")] or [0.0]
    lst_trip = [r["roundtrip"]["spline"]["p99_sig"] for sc, _, r in results if sc.get("lst_sampled")]
    L += ["", "## Reading", "",
          f"- Why cubic convolution moves the limb: with OpenCV's a = -0.75 the Keys kernel does not reproduce a "
          f"linear ramp; it moves it by sum_k k W(f - k) - f, up to {keys_bias:.3f} px (at f = {f_max:.2f}; 0 at "
          "f = 0 and 0.5; only a = -0.5 is exact, Keys 1981). A limb or any gradient moves by that much where the "
          "output pixels' source fractions are coherent (small rolls), and by less where a larger roll mixes them. "
          "tests/test_resample.py checks the bias against the formula and the spline's exactness.",
          "- The round trip says which kernel keeps the real scene better: the spline's error is below "
          "opencv-cubic's on every scene; opencv-lanczos4's is lowest on these scenes, but OpenCV's Lanczos-4 "
          "moves a sigma 3 px Gaussian's centroid by ~0.012 px at a small roll (tests/test_resample.py) and fails the "
          "limb rule here too.",
          f"- Scale of the differences: the spline's own round-trip error (two resamplings, against the input) "
          f"has p99 {min(native_trip):.2f}-{max(native_trip):.2f} sigma on the native scenes: one resampling of a "
          "real scene sampled at its own resolution already changes it by about the noise, whatever the kernel, "
          "and the OpenCV-minus-spline differences there are of that order, not far below it; on the LST-sampled "
          f"scenes the spline's round trip is {max(lst_trip) if lst_trip else float('nan'):.3f} sigma at most.",
          "- LST sampling: " + "; ".join(
              f"{m}: p99 {w['p99_sig']:.2f} sigma, limb/occulter shift {_fmt(w['limb_px'])} px, "
              f"{'meets' if w['qualifies'] else 'fails'} the rule" for m, w in worst_lst.items() if w["n"])
          + " on the LST-sampled scenes (a 2x2-binned grid: at the full 4608 px the PSF spans twice the pixels "
          "and the differences shrink further). The SCI channels are sampled like the native frames (4.3\" at "
          "2.4\"/px, 1.8 px), where the COR1 rows above apply.",
          "- Why the spline stays the default even where an OpenCV kernel meets the rule on LST sampling: the "
          "rule is stated over all scenes (native ones included: SCI is sampled like them, SDI after its PSF "
          "deconvolution is sharper than its 9.5\" raw PSF); the GPU path is cupyx's spline, so another CPU "
          "default would break the CPU/GPU parity of the same product (tests/test_gpu_batch.py) and make a "
          "default product's params_hash mean another kernel than before; and OpenCV's Lanczos-4 is not the "
          "exact windowed sinc (module docstring of pipelines/calibration/l2/resample.py).",
          "- Scene caveats: MDI's NaN off the disk is set to 0 (the sky), so the MDI mask edge is a hard step "
          "just outside the limb (its limb and off-disk rows hold that step); MDI's on-disk max /sigma sits on a "
          "2-3 px dark feature near the disk centre (down to ~4 % of the disk level), the sharpest thing on its "
          "disk; the "
          "Helioviewer HMI frame is 8-bit display values with a hard-edged off-disk mask (its limb row is that "
          "edge, 100+ sigma for both back ends); SWAP has the EUV corona above the limb, so its limb fit is "
          "the least sharp; COR1 is raw DN with its own occulter.",
          "- Precision: all back ends run in float32 (source, coefficients, output). OpenCV 5.1's INTER_CUBIC "
          "equals the Keys kernel summed at float64 source positions to < 1e-4 of a unit random frame "
          "(tests/test_resample.py), i.e. no 1/32-px position table; the spline's float32 coefficients round at "
          "~1e-7 relative. Differences between back ends are kernel differences, not precision.",
          "- Time: measured on a shared 2-core machine with other engineers' jobs running (load average ~6): "
          "the ratios are indicative, the absolute seconds are not; the lead re-measures on a quiet machine. "
          "The DQ path (scipy nearest-neighbour and, with defects, bilinear passes on uint8) is shared by all "
          "back ends and is most of what remains of opencv-cubic's step time.",
          "", f"Default now: `{default}` (`pipelines.calibration.l2.resample.DEFAULT_RESAMPLE`; the job option "
          "`CalibrationOptions(resample=...)` selects a back end per job)."]
    return L


if __name__ == "__main__":
    raise SystemExit(main())
