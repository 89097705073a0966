"""Speed of the image viewer's region requests on a full-size (4608²) L2 product.

Writes a synthetic SDI L2 product of ``--size``² pixels (default 4608, SDI's detector)
through the real writer (:func:`pipelines.products.build_product_hdul`,
:func:`pipelines.fitsio.write_fits_atomic`): a limb-darkened disk with noise, a
helioprojective WCS of 0.5 arcsec/pixel scaled to the size, observer keywords, DQ flags.
Then times what ``GET /api/v1/products/{id}/region.png`` does after its database lookup
(:func:`backend.render.image.open_product` + :func:`~backend.render.image.render_region`):

* ``cold``: the first request of the whole frame at ``--png`` pixels in a process that has
  served another product (opens the memory map, builds the pyramid levels it needs,
  computes the whole-image percentile limits; the imports are timed apart);
* ``full``: the whole frame again (levels and limits cached);
* ``zoom``: ``--png``² regions at full resolution (1:1) at random places;
* ``pan``: regions of twice ``--png`` a side (read from the 1:2 level) at random places;
* ``dq``: the DQ layer of the zoom regions.

Each warm kind is repeated ``--repeat`` times (default 20). The last line is::

    RESULT cold_ms=<first request> full_p50_ms=<...> zoom_p50_ms=<...> pan_p50_ms=<...> dq_p50_ms=<...> worst_p95_ms=<...> png_kib=<full-frame PNG size>

Target: every warm request (p95) under 250 ms, so a zoom or pan redraws within a frame of
the user's gesture plus the network.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def synthetic_product(path: Path, n: int, seed: int = 1) -> Path:
    """A synthetic SDI L2 product of n x n pixels written by the real writer."""
    from astropy.io import fits

    from pipelines.calibration.l2.flow import L2Result
    from pipelines.calibration.l2.steps import DQ, RADIANCE_UNIT
    from pipelines.fitsio import write_fits_atomic
    from pipelines.products import build_product_hdul

    scale = 0.5 * 4608 / n  # arcsec/pixel: SDI's 2304" field whatever the size
    rsun = 968.0
    c = (n - 1) / 2.0
    rng = np.random.default_rng(seed)
    yy, xx = np.ogrid[0:n, 0:n]
    rho = np.hypot(xx - c, yy - c) * scale / rsun
    mu = np.sqrt(np.clip(1 - rho ** 2, 0, 1))
    data = np.where(rho <= 1, 9.0e4 * (0.4 + 0.6 * mu), 2.0e3 * np.exp(-(rho - 1) * 8)).astype(np.float32)
    data *= (1 + 0.05 * rng.standard_normal((n, n))).astype(np.float32)
    dq = np.zeros((n, n), np.uint8)
    hits = rng.integers(0, n, size=(max(10, n * n // 20000), 2))
    dq[hits[:, 0], hits[:, 1]] = int(DQ.COSMIC_RAY)
    dq[rho > 1.2] |= np.uint8(DQ.OUTSIDE_FOV)
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"], h["DETECTOR"], h["CHANNEL"] = "ASO-S", "LST", "SDI", "SDI"
    h["WAVELNTH"], h["WAVEUNIT"] = 121.6, "nm"
    h["DATE-OBS"] = h["DATE-BEG"] = "2024-05-14T16:00:00.000"
    h["DATE-AVG"] = "2024-05-14T16:00:00.500"
    h["CTYPE1"], h["CTYPE2"], h["CUNIT1"], h["CUNIT2"] = "HPLN-TAN", "HPLT-TAN", "arcsec", "arcsec"
    h["CRPIX1"] = h["CRPIX2"] = c + 1.0
    h["CRVAL1"] = h["CRVAL2"] = 0.0
    h["CDELT1"] = h["CDELT2"] = scale
    h["HGLN_OBS"], h["HGLT_OBS"], h["DSUN_OBS"], h["RSUN_OBS"] = 0.0, -2.3, 1.5114e11, rsun
    h["LEVEL"], h["BUNIT"] = "L2", RADIANCE_UNIT
    result = L2Result(data=data, dq=dq, header=h, stats={})
    write_fits_atomic(build_product_hdul(result, software_version="benchmark"), path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4608, help="product side [pixel] (default 4608)")
    ap.add_argument("--png", type=int, default=1024, help="PNG side asked for [pixel] (default 1024)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)

    from backend.render import image as imaging

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = synthetic_product(Path(tmp) / "lst_sdi_l2_benchmark.fits", args.size)
        print(f"wrote {args.size}x{args.size} product ({path.stat().st_size / 2**20:.1f} MiB) in "
              f"{time.perf_counter() - t:.1f} s")

        def timed(fn) -> tuple[float, object]:
            t0 = time.perf_counter()
            out = fn()
            return (time.perf_counter() - t0) * 1e3, out

        # the libraries' imports, once per process (what a fresh API worker pays on its first region)
        small = synthetic_product(Path(tmp) / "small.fits", 64)
        ms, _ = timed(lambda: imaging.render_region(imaging.open_product(small), size=64))
        print(f"first region of the process (imports astropy.visualization, matplotlib, Pillow): {ms:.0f} ms")

        cold, r = timed(lambda: imaging.render_region(imaging.open_product(path), size=args.png))
        print(f"cold full frame: {cold:.1f} ms (1:{r.factor}, {r.width}x{r.height} PNG, {len(r.png) / 1024:.0f} KiB)")
        png_kib = len(r.png) / 1024
        side = min(args.png, args.size)
        pan_side = min(2 * args.png, args.size)

        def random_region(s: int) -> dict:
            x0, y0 = (int(v) for v in rng.integers(0, args.size - s + 1, size=2))
            return dict(x0=x0, x1=x0 + s, y0=y0, y1=y0 + s)

        kinds = {
            "full": lambda: imaging.render_region(imaging.open_product(path), size=args.png),
            "zoom": lambda: imaging.render_region(imaging.open_product(path), size=args.png, **random_region(side)),
            "pan": lambda: imaging.render_region(imaging.open_product(path), size=args.png,
                                                 **random_region(pan_side)),
            "dq": lambda: imaging.render_dq(imaging.open_product(path), size=args.png, **random_region(side)),
        }
        p50, p95 = {}, {}
        for name, fn in kinds.items():
            times = []
            for _ in range(args.repeat):
                ms, r = timed(fn)
                times.append(ms)
            times.sort()
            p50[name] = statistics.median(times)
            p95[name] = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]
            print(f"{name:5s}: p50 {p50[name]:7.1f} ms  p95 {p95[name]:7.1f} ms  (1:{r.factor}, "
                  f"{r.width}x{r.height} PNG, {len(r.png) / 1024:.0f} KiB)")
    print(f"RESULT cold_ms={cold:.1f} full_p50_ms={p50['full']:.1f} zoom_p50_ms={p50['zoom']:.1f} "
          f"pan_p50_ms={p50['pan']:.1f} dq_p50_ms={p50['dq']:.1f} worst_p95_ms={max(p95.values()):.1f} "
          f"png_kib={png_kib:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
