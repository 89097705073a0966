"""Flat field from mutually displaced images: the method of Kuhn, Lin & Loranz (1991).

LST derives the flats of its two CMOS disk imagers (SDI and WST) in flight from
off-pointed images of the Sun (LST.md; Li J.-W. et al. 2025, Acta Astron. Sinica 66(1):10).
Each image ``k`` shows the same solar scene ``S`` displaced by a known shift ``a_k`` and
multiplied by the unknown detector gain ``G``::

    I_k(x) = G(x) * S(x - a_k)

In the log domain (``l = ln I``, ``g = ln G``, ``s = ln S``) the scene cancels between two
images ``i`` and ``j`` compared at pixels that saw the same point of the Sun::

    d_ij(x) = l_i(x) - l_j(x + delta_ij) = g(x) - g(x + delta_ij),   delta_ij = a_j - a_i

Every valid pixel pair gives one such equation. The gain is the least-squares solution of
the whole set, i.e. of the normal equations ``L g = b`` where ``L`` is a weighted graph
Laplacian (``D - W``: ``D(x)`` counts the equations that involve pixel ``x``, ``W`` links
``x`` to ``x +/- delta``) and ``b(x) = sum d_ij(x) - d_ij(x - delta_ij)``.

KLL's own fixed-point iteration, ``g <- K + (1/n) sum g(x + delta)``, is the
Jacobi iteration of this system (``method="jacobi"``). Its low spatial frequencies converge
slowly (many hundreds of iterations for a vignetting-like gradient), so the default
``method="cg"`` solves the same least-squares problem by Jacobi-preconditioned conjugate
gradients, which reaches the same answer in far fewer sweeps (about 30 instead of
hundreds to thousands). Both are vectorised: one iteration is about four array passes per
image, no loop over pixels (see :func:`kll_flat`, Notes).

Assumptions and limits (documented, not hidden):

* Shifts are whole pixels. Sub-pixel pointing would need interpolation of the images,
  which smooths the very pixel-to-pixel gain one wants; point the spacecraft in whole
  pixels or round the measured offsets (the error is then a scene residual, not a gain).
* The scene must not change between the images (exposures close in time; solar rotation
  of ~0.15 arcsec/min at disk centre is negligible for a few minutes).
* Only pixel pairs where both pixels are finite, not masked and above a threshold (on the
  disk, away from the dark sky where the log is dominated by noise) are used: the gain is
  recovered only where the dithers cover the disk twice or more (``valid_mask``).
* The shift differences must generate the whole integer lattice Z^2: if, e.g., every
  shift is a multiple of 10 px, a gain pattern periodic with 10 px is invisible to the
  method; so is a checkerboard if every difference has an even ``dy + dx`` (e.g. when
  all shifts are odd in both axes). :func:`kll_flat` checks that the differences generate
  Z^2 and warns otherwise (:class:`KLLShiftWarning`). Non-collinear shifts of mixed
  parity such as (0, 0), (7, 18), (-12, 5), (23, -10), ... avoid it.
* The solution is defined up to a constant (the mean gain); the flat is normalised to a
  mean of 1 over ``valid_mask``.

References
----------
Kuhn, J. R., Lin, H., & Loranz, D. 1991, PASP 103, 1097, "Gain calibrating nonuniform
image-array data using only the image data".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from astropy.io import fits
from scipy import ndimage

from pipelines.errors import LSTDPWarning

__all__ = ["KLLResult", "KLLShiftWarning", "kll_flat", "flat_calibration_hdul", "make_dithered_set", "striped_flat"]


class KLLShiftWarning(LSTDPWarning):
    """The dither pattern leaves some gain patterns unconstrained (see :func:`kll_flat`)."""


@dataclass
class KLLResult:
    """Outcome of :func:`kll_flat`.

    Attributes
    ----------
    flat : numpy.ndarray, shape (ny, nx), float64
        Relative gain, dimensionless, mean 1 over ``valid_mask``; ``fill_value`` elsewhere.
        Divide a raw (dark-subtracted) frame by it.
    valid_mask : numpy.ndarray, shape (ny, nx), bool
        True where the gain was recovered (pixel in at least ``min_coverage`` valid pairs,
        in the largest connected covered region).
    n_iter : int
        Iterations run.
    converged : bool
        True if the relative residual ``|b - L g| / |b|`` fell below ``tol``.
    residual : float
        Final relative residual of the normal equations.
    coverage : numpy.ndarray, shape (ny, nx), int32
        Number of pixel-pair equations each pixel takes part in (``D`` above).
    n_pairs : int
        Image pairs whose relative shift is non-zero and smaller than the frame.
    """

    flat: np.ndarray
    valid_mask: np.ndarray
    n_iter: int
    converged: bool
    residual: float
    coverage: np.ndarray
    n_pairs: int


def _as_shifts(shifts, n: int) -> np.ndarray:
    a = np.asarray(shifts, dtype=float)
    if a.shape != (n, 2):
        raise ValueError(f"shifts must have shape ({n}, 2) as (dy, dx) per image, got {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(np.abs(a - np.round(a)) > 1e-9):
        raise ValueError("shifts must be whole pixels (round measured pointing offsets first)")
    return np.round(a).astype(np.int64)


def _overlap(dy: int, dx: int, ny: int, nx: int):
    """Slices A (pixels x) and B (pixels x + delta), both inside an (ny, nx) frame."""
    a = (slice(max(0, -dy), ny - max(0, dy)), slice(max(0, -dx), nx - max(0, dx)))
    b = (slice(max(0, dy), ny - max(0, -dy)), slice(max(0, dx), nx - max(0, -dx)))
    return a, b


def _shift_image(img: np.ndarray, dy: int, dx: int, fill: float) -> np.ndarray:
    """``out(x) = img(x - (dy, dx))``; pixels with no source get ``fill``."""
    ny, nx = img.shape
    out = np.full_like(img, fill)
    if abs(dy) < ny and abs(dx) < nx:
        src, dst = _overlap(dy, dx, ny, nx)  # dst = src + delta
        out[dst] = img[src]
    return out


def striped_flat(shape: tuple[int, int], *, rng=None, stripe_amplitude: float = 0.02,
                 stripe_period_px: float = 37.0, column_rms: float = 0.01, pixel_rms: float = 0.02,
                 vignetting: float = 0.0) -> np.ndarray:
    """A synthetic CMOS flat with laser-annealing-like stripes, for tests and validation.

    Parameters
    ----------
    shape : (ny, nx)
        Frame size [pixel].
    rng : numpy.random.Generator, int or None
        Random generator or seed.
    stripe_amplitude : float
        Amplitude of a sinusoidal band pattern along x (dimensionless, 0.02 = 2%).
    stripe_period_px : float
        Period of the bands [pixel].
    column_rms : float
        RMS of an independent gain per column (column-fixed-pattern stripes).
    pixel_rms : float
        RMS of an independent gain per pixel (photo-response non-uniformity).
    vignetting : float
        Fractional drop of the gain at the frame corner (quadratic in radius).

    Returns
    -------
    numpy.ndarray, shape (ny, nx), float64
        Gain with mean 1 (the stripes of LST's CMOS flats are described in LST.md; their
        true geometry is not public, so this is a model, not a measurement).
    """
    rng = np.random.default_rng(rng)
    ny, nx = shape
    y, x = np.mgrid[0:ny, 0:nx].astype(float)
    phase = rng.uniform(0, 2 * np.pi)
    flat = 1 + stripe_amplitude * np.sin(2 * np.pi * x / stripe_period_px + phase)
    flat *= 1 + column_rms * rng.standard_normal(nx)[None, :]
    flat *= 1 + pixel_rms * rng.standard_normal((ny, nx))
    if vignetting:
        r2 = ((y - (ny - 1) / 2) ** 2 + (x - (nx - 1) / 2) ** 2) / (((ny - 1) / 2) ** 2 + ((nx - 1) / 2) ** 2)
        flat *= 1 - vignetting * r2
    return flat / flat.mean()


def make_dithered_set(scene: np.ndarray, flat: np.ndarray, shifts, *, rng=None, noise: str | None = None,
                      read_noise: float = 0.0, fill_value: float = np.nan) -> list[np.ndarray]:
    """Shift a scene over a detector with gain ``flat``: the input of :func:`kll_flat`.

    Image ``k`` is ``flat(x) * scene(x - shifts[k])``: the Sun moves by ``+shifts[k]``
    (``(dy, dx)`` whole pixels) on the detector while the gain stays put.

    Parameters
    ----------
    scene : numpy.ndarray, shape (ny, nx)
        The true sky, e.g. a real full-disk image [any intensity unit; photo-electrons if
        ``noise='poisson'``]. NaN pixels (off-disk in MDI files) stay NaN.
    flat : numpy.ndarray, shape (ny, nx)
        Detector gain (dimensionless).
    shifts : array-like, shape (N, 2), int
        ``(dy, dx)`` of the scene in each image [pixel].
    rng : numpy.random.Generator, int or None
        For the noise.
    noise : {None, 'poisson'}
        ``'poisson'`` draws each pixel from a Poisson law of mean ``flat * scene``
        (which must then be in electrons); None gives noiseless images.
    read_noise : float
        Gaussian read noise RMS [electron], added when ``noise='poisson'``.
    fill_value : float
        Value of pixels the shifted scene does not cover (NaN: no data).

    Returns
    -------
    list of numpy.ndarray, each shape (ny, nx), float64
    """
    scene = np.asarray(scene, dtype=np.float64)
    flat = np.asarray(flat, dtype=np.float64)
    if scene.ndim != 2 or scene.shape != flat.shape:
        raise ValueError(f"scene {scene.shape} and flat {flat.shape} must be 2-D of the same shape")
    if noise not in (None, "poisson"):
        raise ValueError(f"noise must be None or 'poisson', got {noise!r}")
    a = _as_shifts(shifts, len(shifts))
    rng = np.random.default_rng(rng)
    out = []
    for dy, dx in a:
        img = flat * _shift_image(scene, int(dy), int(dx), fill_value)
        if noise == "poisson":
            ok = np.isfinite(img)
            lam = np.where(ok, np.clip(img, 0, None), 0.0)
            img = np.where(ok, rng.poisson(lam).astype(np.float64), img)
            if read_noise:
                img = img + read_noise * rng.standard_normal(img.shape)
        out.append(img)
    return out


def _lattice_index(deltas: Sequence[tuple[int, int]]) -> int:
    """gcd of the 2x2 determinants of the difference vectors: 1 iff they generate Z^2."""
    g = 0
    for (y1, x1), (y2, x2) in combinations(deltas, 2):
        g = math.gcd(g, abs(y1 * x2 - x1 * y2))
        if g == 1:
            return 1
    return g


def kll_flat(images: Sequence[np.ndarray], shifts, *, mask: np.ndarray | None = None, threshold: float = 0.05,
             n_iter: int = 500, tol: float = 1e-7, method: str = "cg", min_coverage: int = 1,
             fill_value: float = np.nan) -> KLLResult:
    """Derive a flat field from mutually displaced images (Kuhn, Lin & Loranz 1991).

    Parameters
    ----------
    images : sequence of N numpy.ndarray, each shape (ny, nx)
        Dark-subtracted frames of the same scene at different pointings [DN or electrons;
        the unit cancels]. N >= 2; more images give more pairs (N (N - 1) / 2) and a
        better conditioned, less noisy solution (the tests use 9).
    shifts : array-like, shape (N, 2), int
        Position ``(dy, dx)`` of the scene on the detector in each image [pixel], relative
        to any common origin (typically the Sun centre from limb fitting, rounded). Whole
        pixels only (see the module notes).
    mask : numpy.ndarray of bool, shape (ny, nx) or (N, ny, nx), optional
        True marks pixels NOT to use (numpy.ma convention): known bad pixels (2-D,
        detector frame) or per-image exclusions such as off-disk or saturated pixels.
        Non-finite pixels are always excluded.
    threshold : float
        Pixels below ``threshold`` times the image's 99th percentile are excluded (the
        dark sky off the limb, where ``ln I`` is noise). 0.05 keeps the whole disk of a
        white-light or Lyman-alpha image and the inner corona of an EUV one.
    n_iter : int
        Maximum number of iterations.
    tol : float
        Stop when the relative residual of the normal equations falls below ``tol``.
    method : {'cg', 'jacobi'}
        ``'cg'``: preconditioned conjugate gradients (default). ``'jacobi'``: KLL's
        original fixed-point iteration (same solution, much slower convergence of the
        large-scale gain; it can oscillate when every shift difference has an odd
        ``dy + dx``).
    min_coverage : int
        A pixel is recovered if it takes part in at least this many pair equations.
    fill_value : float
        Value of ``flat`` outside ``valid_mask`` (NaN by default: not measured; fill with 1
        or a previous flat before applying).

    Returns
    -------
    KLLResult
        ``flat`` (mean 1 over ``valid_mask``), ``valid_mask``, ``n_iter``, ``converged``,
        ``residual``, ``coverage``, ``n_pairs``.

    Raises
    ------
    ValueError
        Fewer than two images, shapes that disagree, non-integer shifts, no usable pair.

    Warns
    -----
    KLLShiftWarning
        If the shift differences do not generate the integer lattice (collinear dithers,
        or all differences sharing a common factor): some gain patterns are then
        unconstrained and the answer is not unique.

    Notes
    -----
    Algorithm (module docstring): log images; for each image pair the scene cancels and
    ``g(x) - g(x + delta) = d(x)``. The sums over all N (N - 1) ordered pairs that the
    normal equations need are evaluated in O(N) array passes: each image's usable
    pixels (and, per iteration, ``u_k g``) are accumulated once on a sky frame (the
    detector frame padded by the dither span), and every image reads that sum back at its
    own shift. One CG iteration thus costs about 4 N frame passes, no loop over pixels.
    Memory: N log images (float32) and usable masks (bool), one float64 sky frame and
    about eight float64 detector frames.

    Unweighted least squares, as in KLL: with Poisson noise the bright disk centre and
    the darker limb count equally.

    Measured (2 shared CPU cores, 9 images, MDI continuum scene): 512 x 512 in about
    0.5-1.5 s (33 iterations); 4608 x 4608 (LST's full frame) in about 90 s (35
    iterations), 4.8 GB peak memory including the input images.

    References
    ----------
    Kuhn, J. R., Lin, H., & Loranz, D. 1991, PASP 103, 1097.
    """
    # Long: Kuhn, Lin & Loranz (1991) as one iteration over shared per-image buffers (log
    # images, usable masks, the lattice of shifts); its steps follow the paper's equations in order.
    n = len(images)
    if n < 2:
        raise ValueError("KLL needs at least two displaced images")
    if method not in ("cg", "jacobi"):
        raise ValueError(f"method must be 'cg' or 'jacobi', got {method!r}")
    shape = np.shape(images[0])
    if len(shape) != 2 or any(np.shape(im) != shape for im in images):
        raise ValueError("images must be 2-D arrays of one shape")
    ny, nx = shape
    a = _as_shifts(shifts, n)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape not in (shape, (n, *shape)):
            raise ValueError(f"mask must have shape {shape} or {(n, *shape)}, got {mask.shape}")

    # Log images and per-image usable pixels
    logs = np.empty((n, ny, nx), dtype=np.float32)
    use = np.empty((n, ny, nx), dtype=bool)
    for k in range(n):
        img = np.asarray(images[k], dtype=np.float64)
        ok = np.isfinite(img)
        level = np.percentile(img[ok], 99.0) if ok.any() else 0.0
        ok &= img > max(threshold * level, 0.0)
        if mask is not None:
            ok &= ~(mask if mask.ndim == 2 else mask[k])
        use[k] = ok
        logs[k] = np.log(np.where(ok, img, 1.0))

    # Shift differences: the pairs used and the lattice they generate
    deltas = set()
    n_pairs = 0
    for i, j in combinations(range(n), 2):
        dy, dx = (int(v) for v in a[j] - a[i])
        if (dy, dx) == (0, 0) or abs(dy) >= ny or abs(dx) >= nx:
            continue  # same pointing (no information on the gain) or no overlap
        n_pairs += 1
        deltas.add((dy, dx) if (dy > 0 or (dy == 0 and dx > 0)) else (-dy, -dx))
    if not deltas:
        raise ValueError("no image pair has a non-zero shift that keeps an overlap")
    if _lattice_index(sorted(deltas)) != 1:
        warnings.warn(
            "the shift differences do not generate the integer pixel lattice (collinear dithers or a "
            "common factor): gain patterns periodic on their lattice are not constrained",
            KLLShiftWarning, stacklevel=2)

    # The sum over all ordered pairs (i, j) of u_i(x) u_j(x + a_j - a_i) f_j(x + a_j - a_i) equals
    # sum_i u_i(x) F(x - a_i) - (self terms), with F(y) = sum_j u_j(y + a_j) f_j(y + a_j)
    # accumulated once on the sky: O(N) slices per pass instead of O(N^2).
    oy, ox = int(a[:, 0].max()), int(a[:, 1].max())
    sky_shape = (ny + oy - int(a[:, 0].min()), nx + ox - int(a[:, 1].min()))
    win = [(slice(oy - int(a[k, 0]), oy - int(a[k, 0]) + ny), slice(ox - int(a[k, 1]), ox - int(a[k, 1]) + nx))
           for k in range(n)]
    sky_n = np.zeros(sky_shape, dtype=np.float64)    # usable images per sky point
    sky_l = np.zeros(sky_shape, dtype=np.float64)    # sum of their log intensities
    for k in range(n):
        sky_n[win[k]] += use[k]
        sky_l[win[k]] += logs[k]                     # 0 where unusable (log 1)
    b = np.zeros(shape, dtype=np.float64)            # sum over ordered pairs of d_ij(x)
    coverage = np.zeros(shape, dtype=np.float64)     # D(x): pair equations involving x
    n_use = np.zeros(shape, dtype=np.float64)        # images usable at detector pixel x
    for k in range(n):
        u = use[k]
        b += np.where(u, logs[k] * sky_n[win[k]] - sky_l[win[k]], 0.0)
        coverage += np.where(u, sky_n[win[k]], 0.0)
        n_use += u
    coverage -= n_use
    del logs, sky_l
    coverage = np.rint(coverage).astype(np.int32)
    active = coverage > 0
    dinv = np.zeros(shape, dtype=np.float64)
    dinv[active] = 1.0 / coverage[active]
    diag = coverage + n_use                          # L g = (D + m) g - sum_i u_i(x) T(x - a_i)
    sky_t = sky_n                                    # reused as the accumulator T
    tmp = np.empty(shape, dtype=np.float64)

    def apply_laplacian(g: np.ndarray, out: np.ndarray) -> np.ndarray:
        sky_t.fill(0.0)
        for k in range(n):
            np.multiply(use[k], g, out=tmp)
            sky_t[win[k]] += tmp
        np.multiply(diag, g, out=out)
        for k in range(n):
            np.multiply(use[k], sky_t[win[k]], out=tmp)
            out -= tmp
        return out

    g = np.zeros(shape, dtype=np.float64)
    lg = np.empty_like(g)
    bnorm = float(np.linalg.norm(b)) or 1.0
    r = b.copy()  # b - L 0
    res = float(np.linalg.norm(r)) / bnorm
    it = 0
    converged = res < tol
    if method == "cg":
        z = dinv * r
        p = z.copy()
        rz = float(np.vdot(r, z))
        while not converged and it < n_iter:
            apply_laplacian(p, lg)
            pap = float(np.vdot(p, lg))
            if pap <= 0:
                break
            alpha = rz / pap
            g += alpha * p
            r -= alpha * lg
            it += 1
            res = float(np.linalg.norm(r)) / bnorm
            if res < tol:
                converged = True
                break
            np.multiply(dinv, r, out=z)
            rz_new = float(np.vdot(r, z))
            p *= rz_new / rz
            p += z
            rz = rz_new
    else:  # KLL's fixed point g <- g + D^-1 (b - L g)
        while not converged and it < n_iter:
            g += dinv * r
            it += 1
            np.subtract(b, apply_laplacian(g, lg), out=r)
            res = float(np.linalg.norm(r)) / bnorm
            converged = res < tol

    valid = coverage >= max(int(min_coverage), 1)
    labels, nlab = ndimage.label(valid, structure=np.ones((3, 3), bool))
    if nlab > 1:
        sizes = np.bincount(labels.ravel())
        sizes[0] = 0
        valid = labels == int(np.argmax(sizes))
    flat = np.full(shape, fill_value, dtype=np.float64)
    gv = g[valid]
    gain = np.exp(gv - gv.mean())
    flat[valid] = gain / gain.mean()
    return KLLResult(flat=flat, valid_mask=valid, n_iter=it, converged=converged, residual=res,
                     coverage=coverage, n_pairs=n_pairs)


def flat_calibration_hdul(result: KLLResult, channel: str, version: int, valid_from, valid_to=None, *,
                          fill_value: float = 1.0, shifts=None, description: str | None = None) -> fits.HDUList:
    """A flat-field calibration master from a KLL solution.

    Parameters
    ----------
    result : KLLResult
        From :func:`kll_flat`.
    channel : str
        LST channel (``SDI`` or ``WST``).
    version : int
        ``CALVER``.
    valid_from, valid_to : str, datetime.datetime or astropy.time.Time
        Validity interval (``VALIDFRM``, ``VALIDTO``); ``valid_to=None`` leaves it open.
        LST's flats drift (radiation damage, contamination; LST.md), so close the
        interval when the next flat campaign is made.
    fill_value : float
        Flat value outside ``valid_mask`` (1: no correction where KLL measured nothing;
        NaN would blank those pixels in the calibrated frame).
    shifts : array-like, shape (N, 2), optional
        The dither offsets used, recorded as ``KLLSHnn`` = ``'dy,dx'`` cards.
    description : str, optional
        ``CALDESC``.

    Returns
    -------
    astropy.io.fits.HDUList
        Primary HDU ``FLAT``: the flat (float32, dimensionless, mean 1 over the valid
        pixels) with the ``CAL*`` keywords, ``FRMNAXIS``, and ``KLLNIMG``/``KLLNPAIR``/``KLLNITER``/``KLLCONV``/
        ``KLLRESID``/``KLLVALID``; extension ``VALID`` (uint8): 1 where the gain was measured.
        The form :func:`pipelines.calibration.l2.flow.load_calibration_master` reads.
    """
    from pipelines.calibration.masters.psf import calibration_header

    flat = np.where(result.valid_mask, result.flat, fill_value).astype(np.float32)
    if description is None:
        description = f"KLL flat from {result.n_pairs} image pairs"
    h = calibration_header("flat", channel, version, valid_from, valid_to, description, flat.shape[0])
    h["EXTNAME"] = "FLAT"
    h["BUNIT"] = ""
    h["FLATMEAN"] = (float(flat.mean()), "mean of the flat")
    h["FLATMETH"] = ("KLL", "Kuhn, Lin & Loranz 1991, PASP 103, 1097")
    if shifts is not None:
        a = _as_shifts(shifts, len(shifts))
        h["KLLNIMG"] = (len(a), "images used")
        for k, (dy, dx) in enumerate(a[:99]):
            h[f"KLLSH{k:02d}"] = (f"{int(dy)},{int(dx)}", "[pixel] dither dy,dx of image")
    h["KLLNPAIR"] = (int(result.n_pairs), "image pairs with a non-zero shift")
    h["KLLNITER"] = (int(result.n_iter), "solver iterations")
    h["KLLCONV"] = (bool(result.converged), "solver converged")
    h["KLLRESID"] = (float(result.residual), "final relative residual")
    h["KLLVALID"] = (float(result.valid_mask.mean()), "fraction of pixels measured")
    h["KLLFILL"] = (float(fill_value), "flat value where not measured")
    valid = fits.ImageHDU(result.valid_mask.astype(np.uint8), name="VALID")
    return fits.HDUList([fits.PrimaryHDU(flat, h), valid])
