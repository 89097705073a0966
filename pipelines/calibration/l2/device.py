"""The frame-sized work of a GPU worker that runs on the device, written once for NumPy and CuPy.

A GPU worker's host must not do per-pixel work that the device can do: at 20 WST frames/s
(4608 x 4608) the host has 0.8 CPU-seconds a frame on 16 cores for reading, writing and
hashing the products (issue 29). What used to run on the host on the GPU path runs here,
on the array module of the frame (``xp``: :mod:`numpy` or :mod:`cupy`, whichever holds it),
so that the CPU stand-in of the device (``BatchExecutor("numpy")``) runs the same code:

* :func:`decode_stored` -- the raw frame is uploaded as the file stores it (16-bit words,
  2 bytes a pixel: half the bytes of float32, and no conversion on the host,
  :func:`pipelines.fitsio.read_image_stored`) and turned into float32 DN on the device;
* :func:`frame_statistics` -- the product's summary statistics, every field equal to
  :func:`pipelines.calibration.l2.flow._stats` on NumPy (``tests/test_gpu_host.py``; on CuPy
  the float64 sum of the mean is CuPy's, equal to rounding);
* :func:`quicklook_reduce` -- the quicklook's block average (a 4608 x 4608 frame to
  512 x 512 float64); the host stretches and encodes 1/81 of the pixels
  (:func:`pipelines.products.quicklook_stretch`);
* the centre fit's sampling (:func:`pipelines.calibration.l2.centre.fit_disk_centre`: the
  NaN fill and the ray profiles run on the frame's module; the circle fit on ~4000 edge
  points stays on the host) and the uncertainty plane
  (:func:`pipelines.calibration.l2.flow.calibrate_frame`: ``sqrt`` of the variance on the
  device) are in their own modules, written the same way.

Accounting
----------
:func:`section` marks device work (``with section("resample"):``). It costs nothing unless
a :class:`DeviceMeter` is active (:meth:`DeviceMeter.activate`): then the CPU time of each
outermost section is added up per name, from ``time.thread_time`` of the thread that runs it.
``benchmarks/gpu_host.py`` runs the device work on the CPU with one thread per section
(Numba, numexpr and the resampling set to one thread), so these sums are exactly the CPU
spent standing in for the device, and the host's own CPU time is the process's minus them.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from pipelines.array_backend import namespace_of, to_numpy
from pipelines.calibration.l2.steps import DQ

__all__ = ["decode_stored", "stored_datasum", "frame_statistics", "quicklook_reduce", "section", "DeviceMeter"]


#: Good pixels up to which the percentiles are exact (2**20, a 1024 x 1024 frame: one
#: ``partition`` of 4 MB); above it they come from a deterministic subsample (:func:`pipelines.calibration.l2.flow._stats`).
EXACT_PERCENTILE_PIXELS = 2**20


def stats_head(data: np.ndarray, header: fits.Header, channel: str, backend: str, n_good: int,
                counts: np.ndarray) -> dict[str, Any]:
    """The counting fields of :func:`pipelines.calibration.l2.flow._stats`: channel, ``BUNIT``, backend, pixel counts and one
    ``n_<bit>`` per DQ bit from ``counts`` (the DQ histogram, 256 bins)."""
    values = np.arange(counts.size)
    stats: dict[str, Any] = {
        "channel": channel,
        "bunit": str(header.get("BUNIT", "")),
        "backend": backend,
        "n_pixels": int(data.size),
        "n_good": n_good,
        "n_masked": int(data.size - counts[0]),
    }
    for bit in DQ:
        stats[f"n_{bit.name.lower()}"] = int(counts[(values & int(bit)) != 0].sum())
    return stats


# -- accounting ----------------------------------------------------------------------------

class DeviceMeter:
    """CPU seconds of the device sections (:func:`section`), by name, while active.

    Attributes
    ----------
    cpu_s : dict of str to float
        ``time.thread_time`` seconds [s] spent inside each outermost section, summed over
        threads and frames.
    calls : dict of str to int
        Outermost sections entered, by name.
    """

    _active: DeviceMeter | None = None

    def __init__(self) -> None:
        self.cpu_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def total_s(self) -> float:
        """All device sections together [CPU s]."""
        return float(sum(self.cpu_s.values()))

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1

    @contextmanager
    def activate(self) -> Iterator[DeviceMeter]:
        """Count the sections entered on any thread until the block ends (one meter at a time)."""
        if DeviceMeter._active is not None:
            raise RuntimeError("a DeviceMeter is already active")
        DeviceMeter._active = self
        try:
            yield self
        finally:
            DeviceMeter._active = None


_depth = threading.local()


@contextmanager
def section(name: str) -> Iterator[None]:
    """Mark device work (see the module docstring); nested sections count in the outermost."""
    meter = DeviceMeter._active
    if meter is None:
        yield
        return
    depth = getattr(_depth, "n", 0)
    _depth.n = depth + 1
    t0 = time.thread_time() if depth == 0 else 0.0
    try:
        yield
    finally:
        _depth.n = depth
        if depth == 0:
            meter.add(name, time.thread_time() - t0)


# -- the raw frame -------------------------------------------------------------------------

def decode_stored(stored: Any) -> Any:
    """Float32 DN of a raw frame from its stored 16-bit words, on the array's own module.

    Parameters
    ----------
    stored : array of uint16, shape (ny, nx)
        :attr:`pipelines.fitsio.StoredImage.stored`: big-endian two's-complement words of a
        FITS pseudo-unsigned image (``BITPIX = 16``, ``BZERO = 32768``), host or device.

    Returns
    -------
    array of float32, shape (ny, nx)
        ``float32((word byteswapped) XOR 0x8000)``: the unsigned value, i.e. stored signed
        value + 32768 (FITS 4.0, sect. 5.2.5), exact in float32 -- the data
        :func:`pipelines.fitsio.read_image` returns with ``dtype=numpy.float32``.

    Raises
    ------
    TypeError
        If ``stored`` is not uint16.
    """
    xp = namespace_of(stored)
    if stored.dtype != xp.uint16:
        raise TypeError(f"stored words must be uint16, got {stored.dtype}")
    swapped = (stored >> 8) | (stored << 8)
    swapped ^= xp.uint16(0x8000)
    return swapped.astype(xp.float32)


def stored_datasum(stored: Any) -> int:
    """The FITS data sum of stored 16-bit words, on the array's own module.

    The ones'-complement sum of the data unit's big-endian 32-bit words (FITS 4.0, sect.
    4.4.2.7; astropy's ``_compute_checksum``): word ``i`` is stored words ``2i`` (high half)
    and ``2i + 1`` (low half; a missing last one is the zero padding). Compared with the
    file's ``DATASUM`` by :meth:`pipelines.fitsio.StoredSums.check`.

    Parameters
    ----------
    stored : array of uint16
        :attr:`pipelines.fitsio.StoredImage.stored` (host or device).

    Returns
    -------
    int
        In ``[0, 2**32)``.
    """
    xp = namespace_of(stored)
    w = stored.reshape(-1)
    w = (w >> 8) | (w << 8)  # big-endian 16-bit words to their values
    hi = int(to_numpy(xp.sum(w[0::2], dtype=xp.uint64)))
    lo = int(to_numpy(xp.sum(w[1::2], dtype=xp.uint64)))
    s = (hi << 16) + lo
    while top := (s >> 32):
        s = (s & 0xFFFFFFFF) + top
    return s


# -- statistics ----------------------------------------------------------------------------

def frame_statistics(data: Any, dq: Any, header: Any, channel: str, backend: str) -> dict[str, Any]:
    """:func:`pipelines.calibration.l2.flow._stats` computed on the frame's array module.

    The same fields from the same definitions (good pixels: DQ 0 and finite; ``mean`` the
    float64 sum of the good values with 0 elsewhere, over ``n_good``; exact percentiles up to
    :data:`~pipelines.calibration.l2.flow.EXACT_PERCENTILE_PIXELS` good pixels, above it those
    of every k-th pixel in raster order with the rank error counted over all good pixels);
    only scalars and the 256-bin DQ histogram leave the device.

    Parameters
    ----------
    data : array of float32, shape (ny, nx)
        The product's data (NumPy or CuPy).
    dq : array of uint8, shape (ny, nx)
        Its DQ bits, on the same module.
    header : astropy.io.fits.Header
        The L2 header (``BUNIT``, the solar radius for ``rsun_px``).
    channel, backend : str
        Recorded in the statistics.

    Returns
    -------
    dict
        JSON-ready, as :func:`~pipelines.calibration.l2.flow._stats`.
    """
    xp = namespace_of(data)
    flat, q = data.reshape(-1), dq.reshape(-1)
    good = (q == 0) & xp.isfinite(flat)
    n_good = int(xp.count_nonzero(good))
    counts = to_numpy(xp.bincount(q, minlength=256))
    stats = stats_head(data, header, channel, backend, n_good, counts)
    if n_good:
        buf = xp.where(good, flat, xp.float32(0.0))
        mean = float(to_numpy(xp.sum(buf, dtype=xp.float64))) / n_good
        vmin = float(to_numpy(xp.min(xp.where(good, flat, xp.float32(np.inf)))))
        vmax = float(to_numpy(xp.max(xp.where(good, flat, xp.float32(-np.inf)))))
        del buf
        if n_good <= EXACT_PERCENTILE_PIXELS:
            p01, med, p99 = (float(v) for v in to_numpy(xp.percentile(flat[good], xp.asarray([1.0, 50.0, 99.0]))))
            how, rank_err = "exact", 0.0
        else:
            k = -(-data.size // EXACT_PERCENTILE_PIXELS)
            sub = flat[::k][good[::k]]
            p01, med, p99 = (float(v) for v in to_numpy(xp.percentile(sub, xp.asarray([1.0, 50.0, 99.0]))))
            del sub
            how = f"sampled: 1 pixel in {k}, raster order"
            rank_err = 0.0
            for want, got in ((1.0, p01), (50.0, med), (99.0, p99)):
                below = int(xp.count_nonzero(good & (flat < xp.float32(got))))
                rank_err = max(rank_err, abs(100.0 * below / n_good - want))
        stats.update(median=med, mean=mean, p01=p01, p99=p99, min=vmin, max=vmax,
                     percentiles=how, percentile_rank_error=round(rank_err, 4))
    del good
    return stats_tail(stats, header, n_good)


def stats_tail(stats: dict[str, Any], header: fits.Header, n_good: int) -> dict[str, Any]:
    """The end of the frame statistics (:func:`frame_statistics` and
    :func:`pipelines.calibration.l2.flow._stats`): the value fields None without good pixels,
    ``rsun_px`` from the header's geometry (None where it has none), non-finite floats as None."""
    from pipelines.errors import DataError
    from pipelines.sun import sun_geometry

    if n_good == 0:
        stats.update(median=None, mean=None, p01=None, p99=None, min=None, max=None, percentiles=None,
                     percentile_rank_error=None)
    try:
        stats["rsun_px"] = float(sun_geometry(header).rsun_px)
    except DataError:
        stats["rsun_px"] = None
    return {key: (None if isinstance(v, float) and not math.isfinite(v) else v) for key, v in stats.items()}


# -- the quicklook -------------------------------------------------------------------------

def _block_reduce(a: Any, factor: int, func) -> Any:
    if factor <= 1:
        return a
    ny, nx = (a.shape[0] // factor) * factor, (a.shape[1] // factor) * factor
    b = a[:ny, :nx].reshape(ny // factor, factor, nx // factor, factor)
    return func(b, axis=(1, 3))


def quicklook_reduce(data: Any, dq: Any, size: int = 512) -> np.ndarray:
    """The quicklook's block average, on the frame's array module; a small host array back.

    Masked pixels (DQ != 0 or not finite) are left out; the frame is averaged in blocks of
    ``ceil(max(ny, nx) / size)`` pixels a side (the good pixels of each block; NaN where
    fewer than half are good). :func:`pipelines.products.quicklook_image` is
    :func:`pipelines.products.quicklook_stretch` of this.

    Parameters
    ----------
    data : array, shape (ny, nx)
        L2 data (NumPy or CuPy).
    dq : array of uint8, shape (ny, nx)
        Its DQ bits.
    size : int
        Largest side of the result [pixel].

    Returns
    -------
    numpy.ndarray of float64, shape (ny // f, nx // f) with ``f`` the block size
    """
    xp = namespace_of(data)
    a = xp.asarray(data, dtype=xp.float64)
    bad = (xp.asarray(dq) != 0) | ~xp.isfinite(a)
    factor = max(1, int(np.ceil(max(a.shape) / size)))
    with np.errstate(invalid="ignore"):
        a = xp.where(bad, xp.nan, a)
        if factor > 1:
            good_frac = _block_reduce((~bad).astype(xp.float64), factor, xp.mean)
            a = _block_reduce(xp.nan_to_num(a, nan=0.0), factor, xp.sum) / xp.maximum(good_frac * factor * factor, 1)
            a = xp.where(good_frac < 0.5, xp.nan, a)
    return to_numpy(a)
