"""Benchmark: the frame player's difference image and the MP4 worker at full size.

L2-layout products (float32 image + ``DQ`` table, helioprojective WCS, CHECKSUM) of
``--size`` pixels a side are written to a temporary folder, then measured:

* ``diff_png_cold_s``: one difference PNG as the endpoint ``/api/v1/movies/frames/{id}.png``
  makes it with nothing cached: read both products, block-average each to 512 px
  (:func:`pipelines.movies.display_array`), subtract, scale symmetrically, colour, encode
  PNG (the API's deadline is 1.8 s);
* ``diff_png_warm_s``: the same with the display arrays cached (the player's next frame
  reuses the previous one as its reference: one array read per frame);
* ``mp4_fps``: movie frames rendered and encoded per second by the worker's steps
  (base difference at the products' full resolution, caption, H.264 through
  imageio-ffmpeg), files read (twice: the movie's scale, then the frames).

Median of ``--repeat`` runs. The last line printed is::

    RESULT diff_png_cold_s=<s> diff_png_warm_s=<s> mp4_fps=<f> size=<n>

Usage::

    .venv/bin/python benchmarks/movies.py                 # 4608 px, 6 frames
    .venv/bin/python benchmarks/movies.py --size 256 --frames 3
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_products(folder: Path, n: int, size: int) -> list[Path]:
    """``n`` products of ``size``² pixels: a limb-darkened disk, a brightening kernel, noise."""
    from astropy.io import fits

    from pipelines.products import dq_table_hdu

    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    r = np.hypot(xx - size / 2, yy - size / 2) / (0.4 * size)
    disk = np.where(r <= 1, 5e4 * (1 - 0.6 * (1 - np.sqrt(np.clip(1 - r * r, 0, 1)))), 100.0).astype(np.float32)
    kernel = np.exp(-((xx - 0.35 * size) ** 2 + (yy - 0.3 * size) ** 2) / (2 * (0.01 * size) ** 2)).astype(np.float32)
    paths = []
    for i in range(n):
        data = disk * (1 + 0.5 * i * kernel) + rng.normal(0, 50, (size, size)).astype(np.float32)
        h = fits.Header()
        for ax, ctype in (("1", "HPLN-TAN"), ("2", "HPLT-TAN")):
            h[f"CTYPE{ax}"], h[f"CUNIT{ax}"] = ctype, "arcsec"
            h[f"CDELT{ax}"], h[f"CRPIX{ax}"], h[f"CRVAL{ax}"] = 2400.0 / size, size / 2 + 0.5, 0.0
        h["BUNIT"], h["LEVEL"] = "erg cm-2 s-1 sr-1", "L2"
        p = folder / f"bench_{i:02d}.fits"
        fits.HDUList([fits.PrimaryHDU(data, header=h), dq_table_hdu(np.zeros((size, size), np.uint8))]).writeto(
            p, checksum=True)
        paths.append(p)
    return paths


def diff_png(a: Path, b: Path, cache: dict | None) -> bytes:
    from PIL import Image

    from pipelines.movies import difference_image, display_array, rgb_frame, signed_unit_image
    from pipelines.products import read_product

    def arr(p: Path) -> np.ndarray:
        if cache is not None and p in cache:
            return cache[p]
        data, dq, _ = read_product(p)
        out = display_array(data, dq)
        if cache is not None:
            cache[p] = out
        return out

    img = rgb_frame(signed_unit_image(difference_image(arr(a), arr(b)))[0], "SDI", difference=True)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    return buf.getvalue()


def mp4(paths: list[Path], out: Path, size: int | None = None) -> int:
    """The worker's steps (:func:`backend.worker.movies._frame_images`: base difference at
    full resolution on one scale, then :func:`pipelines.movies.movie_frame`) into H.264."""
    import imageio_ffmpeg

    from backend.services.movies import MovieSpec
    from backend.worker.movies import _frame_images
    from pipelines.movies import movie_frame, movie_shape, rgb_frame

    writer, n = None, 0
    for i, unit, mark, is_diff in _frame_images(paths, "base", "SDI", MovieSpec(size=size)):
        shape = movie_shape(unit.shape, size)
        frame = movie_frame(rgb_frame(unit, "SDI", difference=is_diff), shape,
                            ("LST SDI  base difference", f"2024-05-14T16:{i:02d}:00.000 UTC"), mark)
        if writer is None:
            writer = imageio_ffmpeg.write_frames(str(out), (frame.shape[1], frame.shape[0]), fps=10, codec="libx264",
                                                 pix_fmt_in="rgb24", pix_fmt_out="yuv420p", macro_block_size=2,
                                                 ffmpeg_log_level="error")
            writer.send(None)
        writer.send(np.ascontiguousarray(frame))
        n += 1
    writer.close()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4608)
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lstdp_movies_bench_") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        paths = write_products(folder, max(2, args.frames), args.size)
        print(f"wrote {len(paths)} products of {args.size}² px in {time.perf_counter() - t0:.1f} s")
        diff_png(paths[1], paths[0], None)  # imports, first-use costs
        cold = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            diff_png(paths[1], paths[0], None)
            cold.append(time.perf_counter() - t)
        cache: dict = {}
        diff_png(paths[1], paths[0], cache)
        warm = []
        for k in range(args.repeat):
            j = 2 + k % max(1, len(paths) - 2) if len(paths) > 2 else 1
            cache.pop(paths[j], None)  # the next frame is new, its reference is cached
            t = time.perf_counter()
            diff_png(paths[j], paths[j - 1], cache)
            warm.append(time.perf_counter() - t)
        fps = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            n = mp4(paths, folder / "bench.mp4")
            fps.append(n / (time.perf_counter() - t))
    c, w, f = statistics.median(cold), statistics.median(warm), statistics.median(fps)
    print(f"difference PNG, nothing cached: {c:.3f} s; reference cached: {w:.3f} s; MP4: {f:.2f} frames/s")
    print(f"RESULT diff_png_cold_s={c:.3f} diff_png_warm_s={w:.3f} mp4_fps={f:.2f} size={args.size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
