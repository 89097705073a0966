"""The Numba kernels of :mod:`pipelines.calibration.l2.fused` (imported only when Numba is).

Module-level functions so that ``cache=True`` stores them on disk (numba's ``__pycache__``):
the first import in a fresh environment compiles them (about 10-20 s on a loaded 2-core
machine), later processes load them (well under a second). Documented in
:mod:`pipelines.calibration.l2.fused`.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import prange

jit = nb.njit(cache=True, nogil=True)
pjit = nb.njit(cache=True, nogil=True, parallel=True)


@jit
def _filter_strip(buf, n, w, z, gain):
    """SciPy's apply_filter along axis 0 of ``buf[:n, :w]`` (float64), one pole."""
    zn = z ** n
    for i in range(n):  # row by row: the buffer's memory order
        for j in range(w):
            buf[i, j] *= gain
    # causal start, half-sample rule (_init_causal_reflect), for the w columns side by side
    c0 = np.empty(w)
    acc = np.empty(w)
    for j in range(w):
        c0[j] = buf[0, j]
        acc[j] = buf[0, j] + zn * buf[n - 1, j]
    zi = z
    for i in range(1, n):
        if zi == 0.0:  # every further term is +-0: acc unchanged (no NaN: the frame is filled)
            break
        for j in range(w):
            acc[j] += zi * (buf[i, j] + zn * buf[n - 1 - i, j])
        zi *= z
    f = z / (1 - zn * zn)
    for j in range(w):
        acc[j] *= f
        acc[j] += c0[j]
        buf[0, j] = acc[j]
    for i in range(1, n):
        for j in range(w):
            buf[i, j] += z * buf[i - 1, j]
    f = z / (z - 1)
    for j in range(w):
        buf[n - 1, j] *= f
    for i in range(n - 2, -1, -1):
        for j in range(w):
            buf[i, j] = z * (buf[i + 1, j] - buf[i, j])

@pjit
def prefilter(a, z, strip):
    ny, nx = a.shape
    gain = (1.0 - z) * (1.0 - 1.0 / z)
    if ny > 1:
        nstrips = (nx + strip - 1) // strip
        for s in prange(nstrips):
            c0 = s * strip
            w = min(strip, nx - c0)
            buf = np.empty((ny, w))
            for i in range(ny):
                for j in range(w):
                    buf[i, j] = a[i, c0 + j]
            _filter_strip(buf, ny, w, z, gain)
            for i in range(ny):
                for j in range(w):
                    a[i, c0 + j] = np.float32(buf[i, j])
    if nx > 1:  # blocks of `strip` rows, transposed into the buffer: the recursion runs down its rows with SIMD
        nblocks = (ny + strip - 1) // strip
        for s in prange(nblocks):
            r0 = s * strip
            w = min(strip, ny - r0)
            buf = np.empty((nx, w))
            for j in range(nx):  # the buffer's order (measured: 2x faster than the frame's here)
                for i in range(w):
                    buf[j, i] = a[r0 + i, j]
            _filter_strip(buf, nx, w, z, gain)
            for j in range(nx):
                for i in range(w):
                    a[r0 + i, j] = np.float32(buf[j, i])

@jit
def _w3(t, w):
    """SciPy's cubic weights of the fractional position t (0 <= t < 1) into w[0:4]."""
    y = t
    zz = 1.0 - t
    w[1] = (y * y * (y - 2.0) * 3.0 + 4.0) / 6.0
    w[2] = (zz * zz * (zz - 2.0) * 3.0 + 4.0) / 6.0
    w[0] = zz * zz * zz / 6.0
    w3 = 1.0
    w3 -= w[0]
    w3 -= w[1]
    w3 -= w[2]
    w[3] = w3

@jit
def _clamp(i, n):
    return 0 if i < 0 else (n - 1 if i > n - 1 else i)

@pjit
def dq_prepass(data, dq, defect_bits, not_finite, hbuf, plane):
    """The DQ the resampling pass samples, per source pixel, in ``plane`` (uint8, may be ``dq``).

    With ``q = dq | NOT_FINITE`` where ``data`` is not finite: ``plane = (q & ~defects) |
    OR3x3(q & defects) | 128 * (q & defects != 0)`` -- the nearest neighbour's value of the 3 x 3
    grown defect bits (``_or_dilate3``) in bits 0-6, and in bit 7 (no DQ bit) whether the pixel
    itself holds a defect (the "any defect" mark of the bilinear pass; an input bit 7, which no
    DQ bit uses, is dropped so it cannot pose as the mark). ``hbuf`` (uint8, same
    shape) holds the OR along rows in between. Two passes, each parallel over rows; ``plane``
    may be ``dq`` itself (each pixel's own ``dq`` is read before it is written).
    """
    ny, nx = dq.shape
    db = np.uint8(defect_bits)
    nf = np.uint8(not_finite)
    keep = np.uint8(127 - defect_bits)  # bit 7 is the mark below: an input bit 7 (no DQ bit) is dropped
    for i in prange(ny):
        prev = np.uint8(0)
        d = dq[i, 0]
        if not np.isfinite(data[i, 0]):
            d |= nf
        cur = d & db
        for j in range(nx):
            if j + 1 < nx:
                d = dq[i, j + 1]
                if not np.isfinite(data[i, j + 1]):
                    d |= nf
                nxt = d & db
            else:
                nxt = np.uint8(0)
            hbuf[i, j] = prev | cur | nxt | (np.uint8(128) if cur != 0 else np.uint8(0))
            prev = cur
            cur = nxt
    for i in prange(ny):
        lo = max(i - 1, 0)
        hi = min(i + 1, ny - 1)
        for j in range(nx):
            d = dq[i, j]
            if not np.isfinite(data[i, j]):
                d |= nf
            g = (hbuf[lo, j] | hbuf[i, j] | hbuf[hi, j]) & db
            plane[i, j] = (d & keep) | g | (hbuf[i, j] & np.uint8(128))


@jit
def _spline_edge(coef, y, x):
    """One output value of the cubic spline at ``(y, x)``, each tap index clamped (edge pixels)."""
    ny, nx = coef.shape
    fy = np.floor(y)
    fx = np.floor(x)
    sy = np.int64(fy) - 1
    sx = np.int64(fx) - 1
    wy = np.empty(4)
    wx = np.empty(4)
    _w3(y - fy, wy)
    _w3(x - fx, wx)
    t = 0.0
    for m in range(4):
        row = _clamp(sy + m, ny)
        wym = wy[m]
        for q in range(4):
            t += (coef[row, _clamp(sx + q, nx)] * wym) * wx[q]
    return t


@jit
def _spline_run(r0, r1, r2, r3, c0, n, by, bx, k01, k11, fy, fx, bad, orow):
    """Output pixels ``c0 + i`` (``0 <= i < n``) of a run: ``floor(y)`` (= ``fy``) and ``floor(x) - c``
    (= ``fx - c0``) constant, so pixel ``c0 + i``'s taps are ``r_m[i + q]`` (``r0..r3``: the 4
    coefficient rows from the first pixel's first tap column on): contiguous loads, no index
    clamping, no gathers; the weights and the sum are :func:`_spline_edge`'s, operation for
    operation (the same float64 results); pixel ``c0 + i`` is written to ``orow[i]``, NaN where
    ``bad[i]``. ``n`` is a guess (its taps must lie inside the rows): returns the first ``i`` whose
    floors differ from the run's (``n`` if none) -- the pixels from there on hold wrong values and
    must be computed again (the test is in the vectorised loop, no scalar scan ahead of it)."""
    first = n
    for j in range(n):
        c = c0 + j
        y = by + c * k01
        x = bx + c * k11
        ty = y - fy
        flx = np.floor(x)
        tx = x - flx
        ok = (np.floor(y) == fy) & (flx == fx + j)
        first = min(first, n if ok else j)
        zy = 1.0 - ty
        wy1 = (ty * ty * (ty - 2.0) * 3.0 + 4.0) / 6.0
        wy2 = (zy * zy * (zy - 2.0) * 3.0 + 4.0) / 6.0
        wy0 = zy * zy * zy / 6.0
        wy3 = 1.0 - wy0 - wy1 - wy2
        zx = 1.0 - tx
        wx1 = (tx * tx * (tx - 2.0) * 3.0 + 4.0) / 6.0
        wx2 = (zx * zx * (zx - 2.0) * 3.0 + 4.0) / 6.0
        wx0 = zx * zx * zx / 6.0
        wx3 = 1.0 - wx0 - wx1 - wx2
        t = 0.0
        t += (r0[j] * wy0) * wx0
        t += (r0[j + 1] * wy0) * wx1
        t += (r0[j + 2] * wy0) * wx2
        t += (r0[j + 3] * wy0) * wx3
        t += (r1[j] * wy1) * wx0
        t += (r1[j + 1] * wy1) * wx1
        t += (r1[j + 2] * wy1) * wx2
        t += (r1[j + 3] * wy1) * wx3
        t += (r2[j] * wy2) * wx0
        t += (r2[j + 1] * wy2) * wx1
        t += (r2[j + 2] * wy2) * wx2
        t += (r2[j + 3] * wy2) * wx3
        t += (r3[j] * wy3) * wx0
        t += (r3[j + 1] * wy3) * wx1
        t += (r3[j + 2] * wy3) * wx2
        t += (r3[j + 3] * wy3) * wx3
        orow[j] = np.float32(np.nan) if bad[j] else np.float32(t)
    return first


@jit
def _floor32(v):
    """``floor`` of a float32 as float32, through the float64 floor (exact both ways: the same value
    as ``numpy.floor`` of the float32; LLVM vectorises the float64 one, not the float32 call)."""
    return np.float32(np.floor(np.float64(v)))


@jit
def _sigma_edge(var, y, x, cy, cx, bad, ntab, gtab, fny_hi, fnx_hi):
    """Sigma of one output pixel (edge pixels: tap indices clamped): the bilinear variance at
    ``(y, x)`` (SciPy's order-1 sum, ``mode="nearest"``), times the squared-weight factors of the
    float32 position ``(cy, cx)`` (as ``_apply_factor_numpy``), NaN where ``bad`` or outside."""
    ny, nx = var.shape
    ly = np.floor(y)
    lx = np.floor(x)
    w0y = 1.0 - (y - ly)
    w0x = 1.0 - (x - lx)
    vy1 = 1.0 - w0y
    vx1 = 1.0 - w0x
    a0 = np.int64(ly)
    b0 = np.int64(lx)
    a1 = _clamp(a0 + 1, ny)
    b1 = _clamp(b0 + 1, nx)
    a0 = _clamp(a0, ny)
    b0 = _clamp(b0, nx)
    s = 0.0
    s += (var[a0, b0] * w0y) * w0x
    s += (var[a0, b1] * w0y) * vx1
    s += (var[a1, b0] * vy1) * w0x
    s += (var[a1, b1] * vy1) * vx1
    v = np.float32(s)
    fr = cy - np.float32(np.floor(cy))
    fr = fr * np.float32(ntab)
    fr = fr + np.float32(0.5)
    v = v * gtab[np.int64(fr)]
    fr = cx - np.float32(np.floor(cx))
    fr = fr * np.float32(ntab)
    fr = fr + np.float32(0.5)
    v = v * gtab[np.int64(fr)]
    if bad or cy < np.float32(-0.5) or cy > fny_hi or cx < np.float32(-0.5) or cx > fnx_hi or not (v == v):
        return np.float32(np.nan)
    return np.sqrt(v if v > np.float32(0.0) else np.float32(0.0))


@jit
def _sigma_run(v0, v1, c0, n, by, bx, k01, k11, fy, fry, frx, f01, f11, fo0, fo1, ntab, gtab, fny_hi, fnx_hi,
               bad, srow, ti):
    """:func:`_sigma_edge` for the pixels ``c0 + i`` (``0 <= i < n``) of a run of :func:`_spline_run`
    (``v0``, ``v1``: the variance rows ``floor(y)`` and ``floor(y) + 1`` from the first pixel's
    ``floor(x)`` on; no clamping inside a run), operation for operation; into ``srow[i]``.

    Two loops: the bilinear sum and the factor-table indices (into ``srow`` and ``ti``, int64
    (2, n) scratch; no branches, so LLVM vectorises it: a table lookup in it would not, it cannot
    prove the table apart from ``srow``), then the lookups, the NaN rule and the square root."""
    for j in range(n):
        c = c0 + j
        y = by + c * k01
        x = bx + c * k11
        w0y = 1.0 - (y - fy)
        w0x = 1.0 - (x - np.floor(x))
        vy1 = 1.0 - w0y
        vx1 = 1.0 - w0x
        s = 0.0
        s += (v0[j] * w0y) * w0x
        s += (v0[j + 1] * w0y) * vx1
        s += (v1[j] * vy1) * w0x
        s += (v1[j + 1] * vy1) * vx1
        cy = fry + (np.float32(c) * f01 + fo0)
        cx = frx + (np.float32(c) * f11 + fo1)
        fr = cy - _floor32(cy)
        fr = fr * np.float32(ntab)
        fr = fr + np.float32(0.5)
        ti[0, j] = np.int64(fr)
        fr = cx - _floor32(cx)
        fr = fr * np.float32(ntab)
        fr = fr + np.float32(0.5)
        ti[1, j] = np.int64(fr)
        out = (cy < np.float32(-0.5)) | (cy > fny_hi) | (cx < np.float32(-0.5)) | (cx > fnx_hi)
        srow[j] = np.float32(np.nan) if out else np.float32(s)
    for j in range(n):
        v = srow[j]
        v = v * gtab[ti[0, j]]
        v = v * gtab[ti[1, j]]
        if bad[j] or not (v == v):  # NaN also where the position is outside (set above)
            srow[j] = np.float32(np.nan)
        else:
            srow[j] = np.sqrt(v if v > np.float32(0.0) else np.float32(0.0))


@jit
def _dq_pixel(plane, y, x, db, keep, nd_bit):
    """The output DQ at source position ``(y, x)``: ``NO_DATA`` more than half a pixel outside,
    else the nearest pixel's value of ``plane`` (:func:`dq_prepass`; index clamped), its defect bits
    kept only where the bilinear weight of "any defect" (255/0, SciPy's order-1 sum, mode nearest,
    rounded as SciPy rounds to uint8) is >= 0.5."""
    ny, nx = plane.shape
    if y < -0.5 or y > ny - 0.5 or x < -0.5 or x > nx - 0.5:
        return nd_bit
    ny0 = _clamp(np.int64(np.floor(y + 0.5)), ny)
    nx0 = _clamp(np.int64(np.floor(x + 0.5)), nx)
    q8 = plane[ny0, nx0] & np.uint8(127)
    if (q8 & db) != 0:
        ly = np.floor(y)
        lx = np.floor(x)
        ty = y - ly
        tx = x - lx
        a0 = np.int64(ly)
        b0 = np.int64(lx)
        w0y = 1.0 - ty
        w0x = 1.0 - tx
        vy0 = w0y
        vy1 = 1.0 - w0y
        vx0 = w0x
        vx1 = 1.0 - w0x
        s = 0.0
        for m in range(2):
            aa = _clamp(a0 + m, ny)
            wyy = vy0 if m == 0 else vy1
            for q in range(2):
                bb = _clamp(b0 + q, nx)
                wxx = vx0 if q == 0 else vx1
                mk = 255.0 if (plane[aa, bb] & np.uint8(128)) != 0 else 0.0
                s += (mk * wyy) * wxx
        if not (s > 0.0 and s + 0.5 >= 1.0):
            q8 = q8 & keep
    return q8


@jit
def _dq_run(prow, c0, n, by, bx, k01, k11, ry, rx, ylo, yhi, xlo, xhi, nf, dq_row, bad_row):
    """Nearest-neighbour DQ of output pixels ``c0 + i`` (``0 <= i < n``) of a run: nearest row ``ry``
    and nearest column ``rx + i``, inside the detector, so pixel ``c0 + i`` reads ``prow[i]`` (the
    plane's row ``ry`` from column ``rx`` on) -- contiguous loads. Writes ``dq_row[i]`` (the value's
    bits 0-6: the defect test of :func:`_dq_pixel` comes after, for the pixels with defect bits) and
    ``bad_row[i]`` (``NOT_FINITE`` set); ``n`` is a guess: returns the first ``i`` that leaves the
    run (``n`` if none), the pixels from there on to be done again."""
    first = n
    for j in range(n):
        c = c0 + j
        y = by + c * k01
        x = bx + c * k11
        ok = (np.floor(y + 0.5) == ry) & (np.floor(x + 0.5) == rx + j) & (y >= ylo) & (y <= yhi) & (x >= xlo) \
            & (x <= xhi)
        first = min(first, n if ok else j)
        q8 = prow[j] & np.uint8(127)
        dq_row[j] = q8
        bad_row[j] = (q8 & nf) != 0
    return first


@pjit
def resample(coef, plane, var, k, off, defect_bits, not_finite, no_data, gtab, out, dq_out, sig_out):
    """The fused pass over the output rows; ``plane`` from :func:`dq_prepass`; ``var`` of shape
    (0, 0) skips the variance/sigma. Per row: the DQ (and which pixels are NaN), then the data and
    sigma by runs of constant ``floor(y)`` and ``floor(x) - c`` (:func:`_spline_run`,
    :func:`_sigma_run`; edge pixels by :func:`_spline_edge`, :func:`_sigma_edge`)."""
    ny, nx = coef.shape
    oy, ox = out.shape
    has_var = var.shape[0] > 0
    keep = np.uint8(127 - defect_bits)  # bit 7 is the mark below: an input bit 7 (no DQ bit) is dropped
    nf = np.uint8(not_finite)
    nd_bit = np.uint8(no_data)
    db = np.uint8(defect_bits)
    ntab = gtab.shape[0] - 1
    k00, k01, k10, k11 = k[0, 0], k[0, 1], k[1, 0], k[1, 1]
    o0, o1 = off[0], off[1]
    f00, f01 = np.float32(k00), np.float32(k01)
    f10, f11 = np.float32(k10), np.float32(k11)
    fo0, fo1 = np.float32(o0), np.float32(o1)
    fny_hi, fnx_hi = np.float32(ny - 0.5), np.float32(nx - 0.5)
    for r in prange(oy):
        bad = np.empty(ox, np.bool_)
        ti = np.empty((2, ox), np.int64)
        by = o0 + r * k00
        bx = o1 + r * k10
        fry = np.float32(r) * f00
        frx = np.float32(r) * f10
        orow = out[r]
        # ---- DQ: nearest neighbour of the prepared plane by runs of constant nearest row and
        # nearest column - c (:func:`_dq_run`), single pixels at the edges (:func:`_dq_pixel`);
        # then the defects kept where the bilinear "any defect" >= 0.5 (:func:`_dq_pixel` again)
        fny_lo, fny_top = -0.5, ny - 0.5
        fnx_lo, fnx_top = -0.5, nx - 0.5
        c = 0
        while c < ox:
            y = by + c * k01
            x = bx + c * k11
            ry = np.floor(y + 0.5)
            rx = np.floor(x + 0.5)
            outside = y < fny_lo or y > fny_top or x < fnx_lo or x > fnx_top
            if outside or ry > ny - 1 or rx > nx - 1:
                q8 = _dq_pixel(plane, y, x, db, keep, nd_bit)
                dq_out[r, c] = q8
                bad[c] = outside or (q8 & nf) != 0
                c += 1
                continue
            iy = np.int64(ry)
            ix = np.int64(rx)
            m = nx - ix
            if ox - c < m:
                m = ox - c
            gy = (ry + 0.5 - y) / k01 if k01 > 0.0 else ((y - (ry - 0.5)) / -k01 if k01 < 0.0 else np.inf)
            gx = (rx + 0.5 - x) / (k11 - 1.0) if k11 > 1.0 else ((x - (rx - 0.5)) / (1.0 - k11) if k11 < 1.0
                                                                  else np.inf)
            g = min(gy, gx) + 2.0
            if g < m:
                m = np.int64(g)
            c += _dq_run(plane[iy, ix:], c, m, by, bx, k01, k11, ry, rx, fny_lo, fny_top, fnx_lo, fnx_top, nf,
                         dq_out[r, c:], bad[c:])
        for c in range(ox):
            q8 = dq_out[r, c]
            if (q8 & db) != 0:  # inside (NO_DATA pixels hold no defect bit)
                q8 = _dq_pixel(plane, by + c * k01, bx + c * k11, db, keep, nd_bit)
                dq_out[r, c] = q8
                bad[c] = (q8 & nf) != 0
        # ---- data and sigma: by runs of constant floor(y), floor(x) - c
        c = 0
        while c < ox:
            y = by + c * k01
            x = bx + c * k11
            fy = np.floor(y)
            fx = np.floor(x)
            sy = np.int64(fy) - 1
            sx = np.int64(fx) - 1
            if sy < 0 or sy + 3 > ny - 1 or sx < 0 or sx + 3 > nx - 1:
                orow[c] = np.float32(np.nan) if bad[c] else np.float32(_spline_edge(coef, y, x))
                if has_var:
                    cy = fry + (np.float32(c) * f01 + fo0)
                    cx = frx + (np.float32(c) * f11 + fo1)
                    sig_out[r, c] = _sigma_edge(var, y, x, cy, cx, bad[c], ntab, gtab, fny_hi, fnx_hi)
                c += 1
                continue
            # a guess of the run's length (from the distances to the next integer of y and of x - c),
            # within the columns whose taps stay inside; the run itself finds where it really ends
            m = nx - 3 - sx
            if ox - c < m:
                m = ox - c
            gy = (fy + 1.0 - y) / k01 if k01 > 0.0 else ((y - fy) / -k01 if k01 < 0.0 else np.inf)
            gx = (fx + 1.0 - x) / (k11 - 1.0) if k11 > 1.0 else ((x - fx) / (1.0 - k11) if k11 < 1.0 else np.inf)
            g = min(gy, gx) + 2.0  # compared as floats first: an infinite or huge guess is no integer
            if g < m:
                m = np.int64(g)
            n = _spline_run(coef[sy, sx:], coef[sy + 1, sx:], coef[sy + 2, sx:], coef[sy + 3, sx:], c, m, by, bx,
                            k01, k11, fy, fx, bad[c:], orow[c:])
            if has_var:
                _sigma_run(var[sy + 1, sx + 1:], var[sy + 2, sx + 1:], c, n, by, bx, k01, k11, fy, fry, frx, f01,
                           f11, fo0, fo1, ntab, gtab, fny_hi, fnx_hi, bad[c:], sig_out[r, c:], ti)
            c += n


@jit
def _stats_chunk3(x, xi, q, thresholds, a, b, ch, buf, part_hist, part_below, part_n, part_lo, part_hi):
    """:func:`stats_pass` on ``x[a:b]`` for at most 3 thresholds, in two loops: the DQ histogram,
    then the good pixels' count, buffer, rank counts, min and max without branches (LLVM
    vectorises it). Min and max are taken on the float32 bits mapped to integers of the same
    order (``k = i ^ ((i >> 31) & 0x7fffffff)``, an involution; finite values only), so the
    reduction is an integer one; the values are those of the branchy loop (-0.0 below +0.0: a
    tie the chunked merge did not fix either)."""
    h4 = np.zeros((4, 256), np.int64)  # 4 histograms in turn: one bin's increments need not wait on each other
    i = a
    while i + 4 <= b:
        h4[0, q[i]] += 1
        h4[1, q[i + 1]] += 1
        h4[2, q[i + 2]] += 1
        h4[3, q[i + 3]] += 1
        i += 4
    while i < b:
        h4[0, q[i]] += 1
        i += 1
    for j in range(256):
        part_hist[ch, j] += h4[0, j] + h4[1, j] + h4[2, j] + h4[3, j]
    nt = thresholds.shape[0]
    t0 = thresholds[0] if nt > 0 else np.float32(-np.inf)
    t1 = thresholds[1] if nt > 1 else np.float32(-np.inf)
    t2 = thresholds[2] if nt > 2 else np.float32(-np.inf)
    big = np.int32(2147483647)
    small = np.int32(-2147483648)
    m31 = np.int32(2147483647)
    ng = 0
    b0 = 0
    b1 = 0
    b2 = 0
    klo = big
    khi = small
    for i in range(a, b):
        v = x[i]
        good = (q[i] == 0) & np.isfinite(v)
        buf[i] = v if good else np.float32(0.0)
        ng += 1 if good else 0
        b0 += 1 if good & (v < t0) else 0
        b1 += 1 if good & (v < t1) else 0
        b2 += 1 if good & (v < t2) else 0
        bits = xi[i]
        key = bits ^ ((bits >> 31) & m31)
        klo = min(klo, key if good else big)
        khi = max(khi, key if good else small)
    part_n[ch] = ng
    if nt > 0:
        part_below[ch, 0] += b0
    if nt > 1:
        part_below[ch, 1] += b1
    if nt > 2:
        part_below[ch, 2] += b2
    if ng > 0:
        lo_bits = np.empty(2, np.int32)
        lo_bits[0] = klo ^ ((klo >> 31) & m31)
        lo_bits[1] = khi ^ ((khi >> 31) & m31)
        vals = lo_bits.view(np.float32)
        part_lo[ch] = vals[0]
        part_hi[ch] = vals[1]
    else:
        part_lo[ch] = np.float32(np.inf)
        part_hi[ch] = np.float32(-np.inf)


@pjit
def stats_pass(x, q, thresholds, nchunks, buf, hist, below, lo_hi):
    """One pass over a flat float32 frame ``x`` and its DQ ``q`` (see fused.frame_statistics).

    ``buf = where(good, x, 0)``, ``hist`` the DQ histogram (256), ``below[t]`` the good pixels
    with ``x < thresholds[t]``, ``lo_hi = (min, max)`` of the good pixels; returns n_good.
    Chunks in parallel, each with its own partial results, merged at the end (integers and
    min/max: the merge order does not change them).
    """
    n = x.shape[0]
    nt = thresholds.shape[0]
    step = (n + nchunks - 1) // nchunks
    part_hist = np.zeros((nchunks, 256), np.int64)
    part_below = np.zeros((nchunks, max(nt, 1)), np.int64)
    part_n = np.zeros(nchunks, np.int64)
    part_lo = np.full(nchunks, np.inf, np.float32)
    part_hi = np.full(nchunks, -np.inf, np.float32)
    xi = x.view(np.int32)
    for ch in prange(nchunks):
        a = ch * step
        b = min(n, a + step)
        if nt <= 3:
            _stats_chunk3(x, xi, q, thresholds, a, b, ch, buf, part_hist, part_below, part_n, part_lo, part_hi)
            continue
        ng = 0
        lo = np.float32(np.inf)
        hi = np.float32(-np.inf)
        for i in range(a, b):
            v = x[i]
            d = q[i]
            part_hist[ch, d] += 1
            if d == 0 and np.isfinite(v):
                ng += 1
                buf[i] = v
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
                for t in range(nt):
                    if v < thresholds[t]:
                        part_below[ch, t] += 1
            else:
                buf[i] = np.float32(0.0)
        part_n[ch] = ng
        part_lo[ch] = lo
        part_hi[ch] = hi
    total = 0
    lo = np.float32(np.inf)
    hi = np.float32(-np.inf)
    for ch in range(nchunks):
        total += part_n[ch]
        for j in range(256):
            hist[j] += part_hist[ch, j]
        for t in range(nt):
            below[t] += part_below[ch, t]
        lo = min(lo, part_lo[ch])
        hi = max(hi, part_hi[ch])
    lo_hi[0] = lo
    lo_hi[1] = hi
    return total


@pjit
def ray_profiles(image, x0, y0, cos_t, sin_t, radii, offsets, round32, prof):
    """Mean of bilinear samples along parallel rays (see fused.ray_profiles): for ray i, radius j,
    ``prof[i, j] = (m(t0) + m(t1) + ...) / n`` with ``m(t)`` SciPy's order-1 ``map_coordinates``
    (``mode="nearest"``: each tap clamped) at ``x = (x0 + c r) - s t``, ``y = (y0 + s r) + c t``,
    rounded to float32 first when ``round32`` (SciPy's output in the input's dtype)."""
    ny, nx = image.shape
    nr = radii.shape[0]
    nt = offsets.shape[0]
    for i in prange(cos_t.shape[0]):
        c = cos_t[i]
        s = sin_t[i]
        for j in range(nr):
            r = radii[j]
            acc = 0.0
            for k in range(nt):
                t = offsets[k]
                x = x0 + c * r - s * t
                y = y0 + s * r + c * t
                ly = np.floor(y)
                lx = np.floor(x)
                w0y = 1.0 - (y - ly)
                w0x = 1.0 - (x - lx)
                w1y = 1.0 - w0y
                w1x = 1.0 - w0x
                a0 = np.int64(ly)
                b0 = np.int64(lx)
                a1 = _clamp(a0 + 1, ny)
                b1 = _clamp(b0 + 1, nx)
                a0 = _clamp(a0, ny)
                b0 = _clamp(b0, nx)
                v = 0.0
                v += (image[a0, b0] * w0y) * w0x
                v += (image[a0, b1] * w0y) * w1x
                v += (image[a1, b0] * w1y) * w0x
                v += (image[a1, b1] * w1y) * w1x
                if round32:
                    v = np.float64(np.float32(v))
                acc += v
            prof[i, j] = acc / nt


@pjit
def radius_flag(dq, ax, ay, bx, by, radius, inside, bit, out):
    """``out = dq | bit`` where ``sqrt((ax + ay)**2 + (bx + by)**2) < radius`` (``inside``; else ``>``),
    ``dq`` elsewhere, in float32 as ``steps._radius_select`` (``ax``, ``bx``: float32 column terms,
    ``ay``, ``by``: float32 row terms); returns the number of pixels flagged. Parallel over rows."""
    ny, nx = dq.shape
    b = np.uint8(bit)
    counts = np.zeros(ny, np.int64)
    for i in prange(ny):
        yi = ay[i]
        wi = by[i]
        n = 0
        for j in range(nx):
            u = ax[j] + yi
            v = bx[j] + wi
            r = np.sqrt(u * u + v * v)
            sel = (r < radius) if inside else (r > radius)
            out[i, j] = (dq[i, j] | b) if sel else dq[i, j]
            n += 1 if sel else 0
        counts[i] = n
    return counts.sum()


@pjit
def detector_signal(d, b, r, f, s, t, c, out):
    """``out = (d - b - r * s) / f / t * c`` in float32 where the flat ``f`` is finite and > 0, NaN
    elsewhere (the operations and order of ``steps.correct_detector_signal``'s numexpr expression);
    returns the number of pixels whose flat is not. Flat float32 arrays, parallel in chunks."""
    n = d.shape[0]
    nchunks = 64
    step = (n + nchunks - 1) // nchunks
    bad = np.zeros(nchunks, np.int64)
    nan = np.float32(np.nan)
    for ch in prange(nchunks):
        nb = 0
        for i in range(ch * step, min(n, (ch + 1) * step)):
            fi = f[i]
            if np.isfinite(fi) and fi > np.float32(0.0):
                out[i] = ((d[i] - b[i] - r[i] * s) / fi) / t * c
            else:
                out[i] = nan
                nb += 1
        bad[ch] = nb
    return bad.sum()


@pjit
def detector_variance(rw, b, f, dr, be, de, fe, g, k, s, tt, cc, out):
    """``uncertainty.detector_variance``'s numexpr expression in float32, the same operations in the
    same order: ``((max(R - B, 0) / g + k [+ Be*Be] [+ (De s)(De s)]) / (F F) [+ (d (Fe / F))**2]) / tt * cc``
    with ``d = (R - B - Dr s) / F`` (0 where not finite), NaN where ``F`` is not finite or not > 0.
    ``be``, ``de``, ``fe`` of size 0: the term is absent. Flat float32 arrays, parallel in chunks."""
    n = rw.shape[0]
    has_be = be.shape[0] > 0
    has_de = de.shape[0] > 0
    has_fe = fe.shape[0] > 0
    nchunks = 64
    step = (n + nchunks - 1) // nchunks
    zero = np.float32(0.0)
    nan = np.float32(np.nan)
    for ch in prange(nchunks):
        for i in range(ch * step, min(n, (ch + 1) * step)):
            fi = f[i]
            if not (np.isfinite(fi) and fi > zero):
                out[i] = nan
                continue
            dd = rw[i] - b[i]
            v = (dd if dd > zero else zero) / g + k
            if has_be:
                v = v + be[i] * be[i]
            if has_de:
                ds = de[i] * s
                v = v + ds * ds
            v = v / (fi * fi)
            if has_fe:
                x = (rw[i] - b[i] - dr[i] * s) / fi
                x = x if np.isfinite(x) else zero
                y = x * (fe[i] / fi)
                v = v + y * y
            out[i] = v / tt * cc
