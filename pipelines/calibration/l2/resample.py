"""The north-up resampling of the L2 chain, and the threads it runs on.

:func:`rotate_north_up` is the last step of ``pipelines.calibration.l2.flow.calibrate_frame``:
it rotates solar north up and puts the disk centre on the frame centre, one affine map of
pixel coordinates (exact for a TAN projection with the reference point at the disk
centre). The data are resampled with one of the kernels of :data:`RESAMPLE_METHODS`, the
DQ bits (:class:`DQ`) by nearest neighbour, so bits are never mixed; defect bits reach every
output pixel they touch.

Back ends (``method``, the job option ``CalibrationOptions.resample``):

``spline`` (the reference)
    Interpolating B-spline of ``order`` (3: cubic; Unser 1999, IEEE Signal Proc. Mag. 16(6),
    22). On the host: one exact pass for data, DQ, variance and sigma
    (:func:`rotate_north_up_full`), compiled with Numba for the cubic
    (:mod:`pipelines.calibration.l2.fused`, on :func:`default_threads` threads) and equal bit
    for bit to its SciPy reference (one ``scipy.ndimage.affine_transform`` call of the float32
    coefficients, ``mode="nearest"``), which runs when Numba is absent or ``LSTDP_NUMBA=0``.
    On the GPU: ``cupyx.scipy.ndimage`` (same API).
``opencv-cubic``
    Cubic convolution (Keys R. 1981, IEEE Trans. ASSP 29, 1153) with OpenCV's ``a = -0.75``
    (``INTER_CUBIC``; Keys' third-order-accurate choice is ``a = -0.5``), 4 x 4 support, no
    prefilter, by ``cv2.warpAffine``: SIMD and multi-threaded, CPU (NumPy) only.
``opencv-lanczos4``
    Lanczos window of 4 lobes (Duchon C. E. 1979, J. Appl. Meteor. 18, 1016; OpenCV's
    ``INTER_LANCZOS4``, weights normalised to a sum of 1), 8 x 8 support, by ``cv2.warpAffine``.

All run in float32 (source, coefficients, output). OpenCV 5.1's INTER_CUBIC samples the
Keys kernel at the exact source position (no 1/32-pixel table quantisation: equal to the
kernel summed at float64 positions within 1e-4 of a unit random frame,
``tests/test_resample.py``); its a = -0.75 makes it first-order accurate only (error
~0.5 f'' f(1 - f): 1.35 % at the peak of a sigma 3 px Gaussian, the spline 0.02 %).
OpenCV's INTER_LANCZOS4 does not match the exact windowed-sinc formula (up to 3e-2 of a
unit random frame) and moves a sigma 3 px Gaussian's centroid by up to ~0.012 px (small
rolls; 0.002 px at 23 deg). Their accuracy against the spline on real scenes is in
``benchmarks/reports/resample_accuracy.md`` (``benchmarks/resample_accuracy.py``): the
spline stays the default (the rule and the numbers are there).
On the host the DQ of every back end is the spline path's: nearest neighbour of the grown
defect bits, the "any defect" bilinear pass, ``NO_DATA`` only where the source lies more than
half a pixel outside the detector (the edge pixels a source still covers hold data; issue 29).
The GPU keeps ``cupyx.scipy.ndimage`` passes with ``NO_DATA`` outside ``[0, n - 1]``
(``_resample_dq``; its OpenCV variant ``_resample_dq_opencv`` equals them but for rounding ties,
``benchmarks/dq_resample.py``).
A Celery worker shares its cores among its processes with :func:`set_default_threads`.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.array_backend import namespace_of, ndimage_for
from pipelines.calibration.l2.affine import _affine, _blocks
from pipelines.calibration.l2.steps import DEFECT_BITS, DQ, _check_2d, _copy, _history, _new_dq
from pipelines.sun import RSUN_REF_M, SunGeometry, sun_geometry

__all__ = ["rotate_north_up", "rotate_north_up_full", "RESAMPLE_METHODS", "DEFAULT_RESAMPLE", "available_cores", "default_threads",
           "set_default_threads"]

#: The north-up resampling back ends: name -> the kernel and its source (HISTORY writes it).
RESAMPLE_METHODS: dict[str, str] = {
    "spline": "interpolating B-spline (Unser 1999, IEEE Signal Proc. Mag. 16, 22), scipy.ndimage",
    "opencv-cubic": "cubic convolution a=-0.75 (Keys 1981, IEEE Trans. ASSP 29, 1153), OpenCV INTER_CUBIC",
    "opencv-lanczos4": "Lanczos-4 window (Duchon 1979, J. Appl. Meteor. 18, 1016), OpenCV INTER_LANCZOS4",
}
#: The default back end (the reference; see benchmarks/reports/resample_accuracy.md for why).
DEFAULT_RESAMPLE = "spline"

#: WCS keywords of the input's rotation, replaced by the identity ``PC`` of the output.
_WCS_DROP = ("CROTA1", "CROTA2", "CROTA", "CD1_1", "CD1_2", "CD2_1", "CD2_2", "PC1_1", "PC1_2", "PC2_1",
             "PC2_2", "CROTACN1", "CROTACN2")


# --------------------------------------------------------------------------- threads

_THREADS: int | None = None  # set by set_default_threads (a Celery worker shares its cores among its processes)


def available_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Threads a step uses when not told: :func:`set_default_threads`'s value, else every core."""
    return _THREADS if _THREADS is not None else available_cores()


def set_default_threads(n: int | None) -> None:
    """Set (``None``: reset) the threads steps use by default in this process.

    A Celery worker with ``c`` processes sets ``cores // c`` before it forks them
    (``backend.worker.tasks``), so ``c`` frames resampled at once do not start ``c x cores``
    threads.
    """
    global _THREADS
    _THREADS = None if n is None else max(1, int(n))


# --------------------------------------------------------------------------- kernels


def _or_dilate3(bits: Any) -> Any:
    """Bitwise OR of each uint8 pixel's 3 x 3 neighbourhood (separable: rows, then columns)."""
    xp = namespace_of(bits)
    rows = xp.asarray(bits, copy=True)
    rows[1:, :] |= bits[:-1, :]
    rows[:-1, :] |= bits[1:, :]
    out = xp.asarray(rows, copy=True)
    out[:, 1:] |= rows[:, :-1]
    out[:, :-1] |= rows[:, 1:]
    return out


def _spline_filter_inplace(nd: Any, a: np.ndarray, order: int, threads: int) -> None:
    """Cubic (``order``) B-spline prefilter of a float32 NumPy frame, in place, on ``threads`` threads.

    The prefilter is separable (Unser 1999, IEEE Signal Proc. Mag. 16, 22): the pass along
    axis 0 treats each column alone and the pass along axis 1 each row alone, so column and
    row blocks are filtered by ``scipy.ndimage.spline_filter1d`` on separate threads (it
    releases the GIL) with results identical to ``scipy.ndimage.spline_filter``.
    """
    ny, nx = a.shape
    if threads <= 1:
        nd.spline_filter(a, order=order, output=a, mode="nearest")
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: nd.spline_filter1d(a[:, c[0]:c[1]], order=order, axis=0, output=a[:, c[0]:c[1]],
                                                    mode="nearest"), _blocks(nx, threads)))
        list(pool.map(lambda r: nd.spline_filter1d(a[r[0]:r[1]], order=order, axis=1, output=a[r[0]:r[1]],
                                                    mode="nearest"), _blocks(ny, threads)))


# --------------------------------------------------------------------------- the step


def _north_up_header(header: fits.Header, geom: SunGeometry, cx: float, cy: float) -> fits.Header:
    """Copy of ``header`` with the WCS of the north-up grid centred on the disk.

    ``CRPIX`` at the 0-based pixel ``(cx, cy)`` (written 1-based), ``CRVAL = 0`` (the disk
    centre), the input's mean plate scale, identity ``PC``, no ``CROTA``/``CD``;
    ``RSUN_OBS`` [arcsec] and, if absent, ``RSUN_REF`` [m].
    """
    scale = geom.scale
    h = _copy(header)
    for key in _WCS_DROP:
        if key in h:
            del h[key]
    h["WCSAXES"] = 2
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"] = (cx + 1.0, "[pix] disk centre (1-based)")
    h["CRPIX2"] = (cy + 1.0, "[pix] disk centre (1-based)")
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"] = (scale, "[arcsec/pix]")
    h["CDELT2"] = (scale, "[arcsec/pix]")
    h["PC1_1"], h["PC1_2"], h["PC2_1"], h["PC2_2"] = 1.0, 0.0, 0.0, 1.0
    h["RSUN_OBS"] = (geom.rsun_arcsec, "[arcsec] apparent photospheric radius")
    if "RSUN_REF" not in h:
        h["RSUN_REF"] = (RSUN_REF_M, "[m] solar radius (IAU 2015 nominal)")
    return h


def _filled(nd: Any, data: Any, finite: Any) -> Any:
    """A float32 copy of ``data`` with each non-finite pixel replaced by the mean of the finite
    pixels of its 5 x 5 neighbourhood (a NaN would spread over the kernel's support)."""
    xp = namespace_of(data)
    filled = xp.astype(data, xp.float32, copy=True)
    if int(xp.count_nonzero(~finite)):
        filled = xp.where(finite, filled, xp.zeros_like(filled))
        w = xp.astype(finite, xp.float32)
        num = nd.uniform_filter(filled, size=5, mode="nearest")
        den = nd.uniform_filter(w, size=5, mode="nearest")
        filled = xp.where(finite, filled, num / xp.where(den > 0, den, xp.ones_like(den)))
        del w, num, den
    return filled


def _resample_data_opencv(nd: Any, data: np.ndarray, finite: np.ndarray, k_yx: np.ndarray, offset: np.ndarray,
                          *, method: str, threads: int) -> np.ndarray:
    """The frame on the output grid by ``cv2.warpAffine`` (float32; non-finite pixels filled first).

    ``cv2.warpAffine`` with ``WARP_INVERSE_MAP`` samples ``dst(x, y) = src(M @ (x, y, 1))``
    with ``x`` the column, ``y`` the row and pixel centres on integers (0-based), the same
    convention as ``scipy.ndimage``; the map ``p_in = offset + k_yx @ p_out`` in (row,
    column) order becomes ``M = [[k_xx, k_xy, off_x], [k_yx, k_yy, off_y]]``. Borders
    replicate the edge pixel (``mode="nearest"`` of the spline path); the caller sets the
    pixels without data to NaN from the DQ. OpenCV's thread count is process-wide: it is set
    to ``threads`` for the call and restored after.
    """
    import cv2

    ny, nx = data.shape
    src = np.ascontiguousarray(_filled(nd, data, finite))
    m = _warp_matrix(k_yx, offset)
    interp = {"opencv-cubic": cv2.INTER_CUBIC, "opencv-lanczos4": cv2.INTER_LANCZOS4}[method]
    before = cv2.getNumThreads()
    cv2.setNumThreads(max(1, int(threads)))
    try:
        out = cv2.warpAffine(src, m, (nx, ny), flags=interp | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)
    finally:
        cv2.setNumThreads(before)
    return out.astype(np.float32, copy=False)


def _resample_data(nd: Any, data: Any, finite: Any, k_dev: Any, off_dev: Any, *, order: int,
                   threads: int) -> Any:
    """The frame on the output grid: float32, spline of ``order`` (non-finite pixels filled first)."""
    xp = namespace_of(data)
    ny, nx = data.shape
    filled = _filled(nd, data, finite)
    # spline coefficients in float32, computed in place (one frame; the relative rounding,
    # ~1e-7, is far below what the calibration resolves), then resampled without a second prefilter
    if order > 1:
        if isinstance(filled, np.ndarray):
            _spline_filter_inplace(nd, filled, order, threads)
        else:  # cupyx.scipy.ndimage: a new float32 array
            filled = nd.spline_filter(filled, order=order, output=xp.float32, mode="nearest")
    return _affine(nd, filled, k_dev, off_dev, (ny, nx), order=order, mode="nearest", dtype=xp.float32,
                   threads=threads)


#: Half-width [of the 0-255 mark scale] of the band around the 0.5 rounding threshold of the
#: bilinear "any defect" pass in which OpenCV's float32 result is re-evaluated by scipy in float64:
#: OpenCV 5.1's INTER_LINEAR on float32 was measured within 3e-5 of scipy's float64 value
#: (frames of 257 to 4608 px, rolls 0.3-30 deg), so the band is ~300 times that error.
_SPREAD_RECHECK = 0.01


def _source_coordinate(k: np.ndarray, offset: np.ndarray, axis: int, rows: Any, cols: Any) -> Any:
    """Input coordinate ``axis`` (0: row, 1: column) of output pixels ``(rows, cols)`` [pixel, float64].

    The same float64 operations, in the same order, as ``scipy.ndimage.affine_transform``'s
    own (``row * k[axis, 0] + col * k[axis, 1]``, then ``+ offset[axis]``), so a test of the
    result against the input's edges or a rounding threshold decides as scipy does.
    """
    return (rows * k[axis, 0] + cols * k[axis, 1]) + offset[axis]


def _inside_columns(k: np.ndarray, offset: np.ndarray, out_shape: tuple[int, int],
                    in_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per output row, the first and last column whose source lies in ``[0, n - 1]`` on both axes.

    ``scipy.ndimage``'s ``mode="constant"`` samples the input only there (cval outside, no
    half-pixel margin); the source of a row is a line, so the set is one interval. It is
    solved in float64, then each end is moved (at most 2 px) until :func:`_source_coordinate`,
    scipy's own evaluation, agrees. Returns int arrays ``lo``, ``hi`` of shape ``(ny,)``;
    ``lo > hi`` for a row without data.
    """
    ny, nx = out_shape
    rows = np.arange(ny, dtype=float)
    lo = np.zeros(ny)
    hi = np.full(ny, nx - 1.0)
    for axis in (0, 1):
        top = in_shape[axis] - 1.0
        base = rows * k[axis, 0] + offset[axis]
        slope = float(k[axis, 1])
        if slope == 0.0:
            out = (base < 0) | (base > top)
            lo = np.where(out, float(nx), lo)
            hi = np.where(out, -1.0, hi)
        else:
            c1, c2 = -base / slope, (top - base) / slope
            lo = np.maximum(lo, np.minimum(c1, c2))
            hi = np.minimum(hi, np.maximum(c1, c2))
    lo = np.clip(np.ceil(lo), 0, nx)
    hi = np.clip(np.floor(hi), -1, nx - 1)

    def inside(cols: np.ndarray) -> np.ndarray:
        ok = (cols >= 0) & (cols <= nx - 1)
        c = np.clip(cols, 0, nx - 1)
        for axis in (0, 1):
            v = _source_coordinate(k, offset, axis, rows, c)
            ok &= (v >= 0) & (v <= in_shape[axis] - 1.0)
        return ok

    for _ in range(2):
        lo = np.where(inside(lo - 1), lo - 1, lo)
        hi = np.where(inside(hi + 1), hi + 1, hi)
    for _ in range(2):
        lo = np.where((lo <= hi) & ~inside(lo), lo + 1, lo)
        hi = np.where((lo <= hi) & ~inside(hi), hi - 1, hi)
    return lo.astype(np.intp), hi.astype(np.intp)


#: The first OpenCV release whose warpAffine was measured to give scipy's DQ (5.1.0): it
#: evaluates source positions in float64 (INTER_NEAREST) and float32 bilinear weights at the
#: exact position; OpenCV 4.x rounds positions to 1/1024 px (nearest) and tabulates bilinear
#: weights at 1/32 px (``imgwarp.cpp``, ``AB_BITS``, ``INTER_TAB_SIZE``), which would move DQ bits.
_OPENCV_DQ_MIN = (5, 1)


def _opencv_dq_available() -> bool:
    """Whether the installed OpenCV is one whose DQ passes equal scipy's (:data:`_OPENCV_DQ_MIN`)."""
    try:
        import cv2
    except ImportError:
        return False
    parts = []
    for p in str(cv2.__version__).split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= _OPENCV_DQ_MIN


def _warp_matrix(k_yx: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The 2 x 3 ``cv2.warpAffine`` (``WARP_INVERSE_MAP``) matrix of ``p_in = offset + k_yx @ p_out``
    in (row, column) order (see :func:`_resample_data_opencv`)."""
    return np.array([[k_yx[1, 1], k_yx[1, 0], offset[1]], [k_yx[0, 1], k_yx[0, 0], offset[0]]], dtype=np.float64)


def _resample_dq_opencv(nd: Any, dq_flag: np.ndarray, defects: np.ndarray | None, k_yx: np.ndarray,
                        offset: np.ndarray, *, threads: int) -> np.ndarray:
    """The two DQ passes of :func:`_resample_dq` by ``cv2.warpAffine`` (NumPy, uint8): scipy's result.

    Nearest neighbour: ``INTER_NEAREST`` on the uint8 plane (OpenCV 5.1 evaluates the source
    position in float64 and rounds it, as scipy does; the two may choose differently only
    where a position falls exactly on a half-integer, a tie between two equally near pixels,
    ``tests/test_resample.py``); OpenCV also samples sources within half a pixel outside the
    edge pixels, which scipy's ``mode="constant"`` marks ``NO_DATA``: those pixels are set
    from :func:`_inside_columns`. "Any defect" (``defects`` not None): ``INTER_LINEAR`` on
    float32 marks (OpenCV 5.1's float64 kernel was off by up to 7 of 255, a 1/32-pixel
    weight table; its 8-bit one rounds to integers and decided 1-2 pixels per 1000^2
    otherwise than scipy; its float32 one was measured within 3e-5 of scipy's float64 on the
    0-255 scale), the output
    pixel keeps its defect bits where the value rounds to >= 1 as scipy's uint8 output does
    (>= 0.5); values within :data:`_SPREAD_RECHECK` of 0.5 are re-evaluated by
    ``scipy.ndimage.map_coordinates`` at scipy's own float64 positions.
    """
    import cv2

    ny, nx = dq_flag.shape
    m = _warp_matrix(k_yx, offset)
    no_data = int(DQ.NO_DATA)
    before = cv2.getNumThreads()
    cv2.setNumThreads(max(1, int(threads)))
    try:
        out = cv2.warpAffine(np.ascontiguousarray(dq_flag), m, (nx, ny), flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=no_data)
        marks = None
        if defects is not None:
            marks = cv2.compare(np.ascontiguousarray(defects), 0, cv2.CMP_NE).astype(np.float32)  # 255 or 0
            spread_v = cv2.warpAffine(marks, m, (nx, ny), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                      borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
            spread = cv2.compare(spread_v, 0.5, cv2.CMP_GE)  # scipy's uint8 rounding: > 0 from 0.5
            band = cv2.inRange(spread_v, 0.5 - _SPREAD_RECHECK, 0.5 + _SPREAD_RECHECK)
            recheck = cv2.findNonZero(band) if cv2.countNonZero(band) else None
            del spread_v, band
    finally:
        cv2.setNumThreads(before)
    lo, hi = _inside_columns(k_yx, offset, (ny, nx), dq_flag.shape)
    for r in range(ny):
        a, b = int(lo[r]), int(hi[r])
        if a > b:
            out[r] = no_data
        else:
            out[r, :a] = no_data
            out[r, b + 1:] = no_data
    if marks is None:
        return out
    if recheck is not None:  # (x, y) points of the values within _SPREAD_RECHECK of 0.5
        pts = np.asarray(recheck).reshape(-1, 2)
        cc, rr = pts[:, 0], pts[:, 1]
        coords = np.stack([_source_coordinate(k_yx, offset, axis, rr.astype(float), cc.astype(float))
                           for axis in (0, 1)])
        exact = nd.map_coordinates(marks, coords, order=1, mode="constant", cval=0.0, prefilter=False,
                                   output=np.uint8)  # scipy's own rounding to uint8
        spread[rr, cc] = np.where(exact > 0, 255, 0).astype(np.uint8)
    defect_bits = sum(int(b) for b in DEFECT_BITS)
    out &= spread | np.uint8(255 - defect_bits)  # defect bits kept only where the spread holds a defect
    return out


def _resample_dq(nd: Any, dq: Any, finite: Any, k_dev: Any, off_dev: Any, *, threads: int,
                 use_opencv: bool | None = None) -> Any:
    """The DQ on the output grid (uint8): region bits by nearest neighbour, defect bits spread.

    Region bits (occulter, field of view) follow the nearest neighbour; pixel-defect bits
    (saturated, not finite, bad pixel, cosmic ray) are OR-ed over each pixel's 3 x 3
    neighbourhood, so the nearest-neighbour sample carries every defect bit of the 2 x 2
    bilinear support of the output pixel; one bilinear pass of "any defect" then keeps them
    only on the output pixels a defect really touches; outside the detector: NO_DATA.
    NumPy input runs both passes on OpenCV >= 5.1 (:func:`_resample_dq_opencv`, the same DQ
    as the scipy passes, ties of the nearest neighbour aside, ~5 x faster at 4608 px;
    ``use_opencv=False`` forces scipy, as does an older OpenCV), CuPy input on
    ``cupyx.scipy.ndimage``.
    """
    xp = namespace_of(dq)
    shape = tuple(dq.shape)
    defect_bits = 0
    for bit in DEFECT_BITS:
        defect_bits |= int(bit)
    dq_flag = xp.where(finite, dq, dq | xp.asarray(int(DQ.NOT_FINITE), dtype=xp.uint8))
    defects = dq_flag & xp.asarray(defect_bits, dtype=xp.uint8)
    has_defects = bool(xp.any(defects != 0))
    if has_defects:
        grown = _or_dilate3(defects)
        dq_flag = (dq_flag & xp.asarray(255 - defect_bits, dtype=xp.uint8)) | grown
        del grown
    if use_opencv is None:
        use_opencv = isinstance(dq, np.ndarray) and _opencv_dq_available()
    if use_opencv:
        return _resample_dq_opencv(nd, dq_flag, defects if has_defects else None, np.asarray(k_dev, dtype=float),
                                   np.asarray(off_dev, dtype=float), threads=threads)
    dq_out = _affine(nd, dq_flag, k_dev, off_dev, shape, order=0, mode="constant", cval=int(DQ.NO_DATA),
                     dtype=xp.uint8, threads=threads)
    dq_out = xp.astype(dq_out, xp.uint8, copy=False)
    if has_defects:  # keep defect bits only where the bilinear support really holds a defect
        # bilinear weights of the defects in 8 bits (a quarter of a float32 frame): a defect
        # whose weight in an output pixel is below ~1/255 of it does not flag that pixel
        marks = xp.where(defects != 0, xp.asarray(255, dtype=xp.uint8), xp.asarray(0, dtype=xp.uint8))
        spread = _affine(nd, marks, k_dev, off_dev, shape, order=1, mode="constant", cval=0, dtype=xp.uint8,
                         threads=threads)
        del marks
        dq_out = xp.where(spread > 0, dq_out, dq_out & xp.asarray(255 - defect_bits, dtype=xp.uint8))
    return dq_out


def _outside_half_pixel(k: np.ndarray, offset: np.ndarray, out_shape: tuple[int, int],
                        in_shape: tuple[int, int]) -> np.ndarray:
    """Output pixels whose source lies more than half a pixel outside the input (``NO_DATA``).

    Source positions in float64 summed as SciPy 1.17's ``affine_transform`` sums them,
    ``(offset + r k[a, 0]) + c k[a, 1]``; a pixel is outside when either coordinate is below
    ``-0.5`` or above ``n - 0.5`` (the input pixels cover ``[-0.5, n - 0.5]``).
    Returns a bool array of ``out_shape``.
    """
    ny, nx = out_shape
    rows = np.arange(ny, dtype=float)[:, None]
    cols = np.arange(nx, dtype=float)[None, :]
    bad = np.zeros(out_shape, dtype=bool)
    for axis in (0, 1):
        v = (offset[axis] + rows * k[axis, 0]) + cols * k[axis, 1]
        bad |= (v < -0.5) | (v > in_shape[axis] - 0.5)
    return bad


def _resample_dq_reference(nd: Any, dq: np.ndarray, finite: np.ndarray, k: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The DQ on the output grid by ``scipy.ndimage`` (NumPy; the reference of the compiled pass).

    Region bits by nearest neighbour (``order=0``, ``mode="nearest"``) of the DQ whose defect
    bits are OR-ed over each pixel's 3 x 3 neighbourhood; the defect bits kept only where the
    bilinear pass (``order=1``, ``mode="nearest"``, uint8) of "any defect" (255/0) is > 0;
    ``NO_DATA`` where the source lies more than half a pixel outside (:func:`_outside_half_pixel`).
    """
    shape = dq.shape
    defect_bits = sum(int(b) for b in DEFECT_BITS)
    dq_flag = np.where(finite, dq, dq | np.uint8(int(DQ.NOT_FINITE))).astype(np.uint8)
    defects = dq_flag & np.uint8(defect_bits)
    has_defects = bool(defects.any())
    if has_defects:
        dq_flag = (dq_flag & np.uint8(255 - defect_bits)) | _or_dilate3(defects)
    out = nd.affine_transform(dq_flag, k, offset=offset, output_shape=shape, order=0, mode="nearest",
                              prefilter=False, output=np.uint8)
    if has_defects:
        marks = np.where(defects != 0, np.uint8(255), np.uint8(0))
        spread = nd.affine_transform(marks, k, offset=offset, output_shape=shape, order=1, mode="nearest",
                                     prefilter=False, output=np.uint8)
        out = np.where(spread > 0, out, out & np.uint8(255 - defect_bits))
    out[_outside_half_pixel(k, offset, shape, shape)] = int(DQ.NO_DATA)
    return out


def _spline_reference(nd: Any, data: np.ndarray, finite: np.ndarray, k: np.ndarray, offset: np.ndarray,
                      order: int) -> np.ndarray:
    """The data on the output grid by one call of ``scipy.ndimage.affine_transform`` (float32,
    ``mode="nearest"``) of the float32 spline coefficients of the filled frame (the reference)."""
    filled = _filled(nd, data, finite)
    if order > 1:
        filled = nd.spline_filter(filled, order=order, output=np.float32, mode="nearest")
    return nd.affine_transform(filled, k, offset=offset, output_shape=data.shape, order=order, mode="nearest",
                               prefilter=False, output=np.float32)


def _north_up_exact(data: np.ndarray, dq: np.ndarray, var: np.ndarray | None, k_yx: np.ndarray,
                    offset: np.ndarray, *, order: int, threads: int, compiled: bool | None = None,
                    overwrite: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Data, DQ and sigma on the north-up grid (NumPy, ``method="spline"``): the compiled pass
    (:mod:`pipelines.calibration.l2.fused`, cubic only) or its SciPy reference, equal results.

    ``var`` (float32 variance, or None) gives ``sigma = sqrt(max(v, 0))`` of the resampled
    variance (:func:`pipelines.calibration.l2.uncertainty.resample_variance`'s model), NaN
    where the data are NaN or the source is outside. ``compiled``: None decides by
    :func:`pipelines.calibration.l2.fused.enabled`. ``overwrite``: the compiled path may fill
    and prefilter a C-contiguous float32 ``data`` in place, set ``NOT_FINITE`` in ``dq`` first
    and overwrite ``dq`` with the plane the pass samples (one frame and one DQ plane less at
    the peak; the results are the same).
    """
    from scipy import ndimage as nd

    from pipelines.calibration.l2 import fused
    from pipelines.calibration.l2.uncertainty import _apply_factor_numpy, _factor_table

    if compiled is None:
        compiled = fused.enabled()
    compiled = bool(compiled) and order == 3
    data32 = np.ascontiguousarray(data, dtype=np.float32)
    own = overwrite and data32 is data  # no conversion copy was made: the caller's frame may be reused
    all_finite = bool(np.isfinite(data32).all())
    finite = None if (compiled and all_finite) else np.isfinite(data32)  # the kernel tests finiteness itself
    var_f = None
    if var is not None:
        var32 = np.ascontiguousarray(var, dtype=np.float32)
        vfin = np.isfinite(var32)
        var_f = var32 if bool(vfin.all()) else _filled(nd, var32, vfin)
        del vfin
    if compiled:
        import numba

        if own:  # the kernel's "not finite" test is then carried by the DQ bit set here
            if not all_finite:
                dq = np.where(finite, dq, dq | np.uint8(int(DQ.NOT_FINITE))).astype(np.uint8)
                data32[...] = _filled(nd, data32, finite)
            coef = data32
        else:
            coef = data32.copy() if all_finite else _filled(nd, data32, finite)
        del finite
        before = numba.get_num_threads()
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
        try:
            fused.spline_prefilter(coef)
            g = _factor_table(order, 1025, "spline")[1].astype(np.float32)
            out, dq_out, sigma = fused.resample_pass(
                coef, data32, dq, var_f, k_yx, offset, g, defect_bits=sum(int(b) for b in DEFECT_BITS),
                not_finite=int(DQ.NOT_FINITE), no_data=int(DQ.NO_DATA), overwrite_dq=own)
        finally:
            numba.set_num_threads(before)
        return out, dq_out, sigma
    out = _spline_reference(nd, data32, finite, k_yx, offset, order)
    dq_out = _resample_dq_reference(nd, dq, finite, k_yx, offset)
    del finite
    out[(dq_out & np.uint8(int(DQ.NO_DATA | DQ.NOT_FINITE))) != 0] = np.nan
    sigma = None
    if var_f is not None:
        v = nd.affine_transform(var_f, k_yx, offset=offset, output_shape=data.shape, order=1, mode="nearest",
                                prefilter=False, output=np.float32)
        _apply_factor_numpy(v, k_yx, offset, order, threads, "spline")
        sigma = np.sqrt(np.maximum(v, np.float32(0.0)))
        sigma[~np.isfinite(out)] = np.nan
    return out, dq_out, sigma


def rotate_north_up(data: Any, dq: Any | None, header: fits.Header, *, order: int = 3,
                    tolerance_px: float = 1e-3, threads: int | None = None,
                    method: str = DEFAULT_RESAMPLE) -> tuple[Any, Any, fits.Header]:
    """Rotate solar north up and put the disk centre on the frame centre (data and DQ).

    :func:`rotate_north_up_full` without a variance: returns ``(data, dq, header)``; see it
    for the parameters, the results and the errors raised.
    """
    out, dq_out, _, h = rotate_north_up_full(data, dq, None, header, order=order, tolerance_px=tolerance_px,
                                             threads=threads, method=method)
    return out, dq_out, h


def rotate_north_up_full(data: Any, dq: Any | None, variance: Any | None, header: fits.Header, *, order: int = 3,
                         tolerance_px: float = 1e-3, threads: int | None = None, method: str = DEFAULT_RESAMPLE,
                         overwrite_input: bool = False) -> tuple[Any, Any, Any | None, fits.Header]:
    """Rotate solar north up and put the disk centre on the frame centre.

    The output grid keeps the frame's shape and plate scale; its WCS has ``CRPIX`` at the
    frame centre (``(n + 1) / 2``, 1-based), ``CRVAL = 0`` (the disk centre), identity
    ``PC`` and no ``CROTA``. The data are resampled with the kernel of ``method``
    (default: cubic spline, ``scipy.ndimage.affine_transform``, ``order=3``, float32 spline
    coefficients; or OpenCV's cubic convolution / Lanczos-4: module docstring). Region
    bits of the DQ (OCCULTED, OUTSIDE_FOV) move with the nearest neighbour; defect bits
    (SATURATED, NOT_FINITE, BAD_PIXEL, COSMIC_RAY) flag every output pixel whose bilinear
    support holds the defect (one nearest-neighbour pass of the 3 x 3-OR-ed bits and one
    bilinear pass of "any defect"): no defect is lost between the grids. Pixels whose source falls outside the detector get ``DQ.NO_DATA``
    and NaN; pixels flagged ``NOT_FINITE`` are NaN.

    Parameters
    ----------
    data : array, shape (ny, nx)
        Calibrated frame (any unit). Non-finite values are replaced by the mean of their
        finite neighbours before the spline (a NaN would spread) and are NaN again in the
        output.
    dq : array of uint8, shape (ny, nx), or None
    variance : array, shape (ny, nx), or None
        The frame's variance [unit**2]; None: no sigma is returned.
    header : astropy.io.fits.Header
        Helioprojective WCS and observer keywords.
    order : int
        Spline order for the data (3: cubic; 1: bilinear); ``method="spline"`` only (the
        OpenCV kernels are fixed: ``order`` must be 3).
    tolerance_px : float
        Below this shift [pixel] and an equivalent roll, the step is skipped.
    threads : int or None
        CPU threads for the prefilter and the resampling (NumPy input only; row blocks,
        results equal to one call's to float rounding). ``None``: the cores this process may use.
    method : {"spline", "opencv-cubic", "opencv-lanczos4"}
        The resampling back end (:data:`RESAMPLE_METHODS`); the OpenCV ones need NumPy input.
    overwrite_input : bool
        ``data`` and ``dq`` may be overwritten (the spline coefficients are computed in the
        data's memory, the DQ plane the compiled pass samples in the DQ's: one frame and one
        DQ plane less at the peak). The calibration flow passes its own intermediate frames.

    Returns
    -------
    data : array, shape (ny, nx), float32
    dq : array of uint8, shape (ny, nx)
    sigma : array, shape (ny, nx), float32, or None
        ``sqrt(max(v, 0))`` of the variance resampled as
        :func:`pipelines.calibration.l2.uncertainty.resample_variance` does; NaN where the
        data are NaN. None if ``variance`` is None.
    header : astropy.io.fits.Header
        Updated WCS (``CTYPE HPLN-TAN/HPLT-TAN``, ``CUNIT arcsec``), ``RSUN_OBS`` [arcsec].

    Raises
    ------
    DataError
        If the header does not locate the Sun.
    ValueError
        If ``method`` is not one of :data:`RESAMPLE_METHODS`, an OpenCV method is given a
        CuPy array or an ``order`` other than 3.

    Notes
    -----
    With the reference point at the disk centre the TAN projection's intermediate
    coordinates are rotated rigidly, so an affine map of pixel coordinates is exact:
    ``p_in = s + M^-1 * scale * (p_out - c)``, with ``M = CDELT * PC`` and ``s`` the disk
    centre on the input.
    """
    _check_2d("data", data)
    if method not in RESAMPLE_METHODS:
        raise ValueError(f"unknown resampling method {method!r}; one of {', '.join(RESAMPLE_METHODS)}")
    xp = namespace_of(data)
    if method != "spline":
        if not isinstance(data, np.ndarray):
            raise ValueError(f"resampling method {method!r} runs on the CPU (NumPy) only; the GPU uses 'spline'")
        if int(order) != 3:
            raise ValueError(f"resampling method {method!r} has a fixed kernel; order={order} applies to 'spline' only")
    exact = method == "spline" and isinstance(data, np.ndarray)
    if exact and isinstance(dq, np.ndarray) and dq.dtype == np.uint8:
        _check_2d("dq", dq, data.shape)
        dq0 = dq  # no copy (one DQ plane less at the peak); with overwrite_input the fused pass writes over it
    else:
        dq0 = _new_dq(data, dq)
    geom = sun_geometry(header)
    ny, nx = data.shape
    cx, cy = (nx - 1) / 2.0, (ny - 1) / 2.0
    k_xy = np.linalg.inv(geom.matrix) * geom.scale
    h = _north_up_header(header, geom, cx, cy)
    shift = math.hypot(geom.x0 - cx, geom.y0 - cy)
    rot_err = float(np.abs(k_xy - np.eye(2)).max()) * max(nx, ny)
    if shift < tolerance_px and rot_err < tolerance_px:
        out = xp.where(xp.isfinite(data), data, xp.asarray(float("nan"), dtype=data.dtype))
        _history(h, "rotate_north_up", "skipped: already north up with the disk centred")
        out = xp.astype(out, xp.float32, copy=False)
        return out, (dq0.copy() if dq0 is dq else dq0), _sigma_of(out, variance), h
    nd = ndimage_for(xp)
    # the affine map in (row, column) order: p_in = offset + k_yx @ p_out
    k_yx = np.array([[k_xy[1, 1], k_xy[1, 0]], [k_xy[0, 1], k_xy[0, 0]]])
    s_yx = np.array([geom.y0, geom.x0])
    offset = s_yx - k_yx @ np.array([cy, cx])
    k_dev = xp.asarray(k_yx)
    off_dev = xp.asarray(offset)
    n_threads = default_threads() if threads is None else max(1, int(threads))
    sigma = None
    if exact:  # one exact pass (compiled, or its SciPy reference)
        out, dq_out, sigma = _north_up_exact(data, dq0, variance, k_yx, offset, order=int(order), threads=n_threads,
                                             overwrite=overwrite_input)
        kernel = f"spline order {int(order)}" + (f" ({RESAMPLE_METHODS['spline']})" if int(order) == 3 else "")
    else:
        finite = xp.isfinite(data)
        if method == "spline":
            out = _resample_data(nd, data, finite, k_dev, off_dev, order=int(order), threads=n_threads)
            kernel = f"spline order {int(order)}" + (f" ({RESAMPLE_METHODS['spline']})" if int(order) == 3 else "")
        else:
            out = _resample_data_opencv(nd, data, finite, k_yx, offset, method=method, threads=n_threads)
            kernel = RESAMPLE_METHODS[method]
        if isinstance(data, np.ndarray):  # OpenCV kernels: the spline path's DQ (half-pixel NO_DATA rule)
            dq_out = _resample_dq_reference(nd, np.asarray(dq0, dtype=np.uint8), finite, k_yx, offset)
        else:
            dq_out = _resample_dq(nd, dq0, finite, k_dev, off_dev, threads=n_threads)
        del finite
        bad = (dq_out & xp.asarray(int(DQ.NO_DATA | DQ.NOT_FINITE), dtype=xp.uint8)) != 0
        out[bad] = float("nan")  # in place: no second output frame
        del bad
        if variance is not None:
            from pipelines.calibration.l2.uncertainty import resample_variance

            v = resample_variance(variance, header, order=int(order), tolerance_px=tolerance_px, threads=n_threads,
                                  method=method)
            sigma = _sigma_of(out, v)
            del v
    h["RESAMPLE"] = (method if method != "spline" else f"spline{int(order)}", "north-up resampling kernel (HISTORY)")
    if isinstance(dq_out, np.ndarray):  # by blocks of rows: no frame-sized temporaries at the peak
        nd_bit = np.uint8(int(DQ.NO_DATA))
        n_nodata = sum(int(np.count_nonzero(dq_out[r:r + 256] & nd_bit)) for r in range(0, dq_out.shape[0], 256))
    else:
        n_nodata = int(xp.count_nonzero((dq_out & xp.asarray(int(DQ.NO_DATA), dtype=xp.uint8)) != 0))
    _history(h, "rotate_north_up",
             f"rotated by {-geom.roll_deg:+.4f} deg (roll was {geom.roll_deg:+.4f} deg), disk centre moved from "
             f"pixel ({geom.x0 + 1:.3f}, {geom.y0 + 1:.3f}) to ({cx + 1:.1f}, {cy + 1:.1f}) (1-based); resample="
             f"{method}: {kernel}, float32; DQ nearest neighbour; {n_nodata} pixels without data")
    return xp.astype(out, xp.float32, copy=False), dq_out, sigma, h


def _sigma_of(out: Any, var: Any | None) -> Any | None:
    """``sqrt(max(var, 0))`` as float32, NaN where ``out`` is not finite (None if ``var`` is None)."""
    if var is None:
        return None
    xp = namespace_of(var)
    sigma = xp.sqrt(xp.maximum(xp.astype(var, xp.float32, copy=False), xp.asarray(0.0, dtype=xp.float32)))
    sigma[~xp.isfinite(out)] = float("nan")
    return sigma
