"""Hot pixels and cosmic-ray hits: pure functions for LST's CMOS frames.

* :func:`find_hot_pixels` flags pixels of a dark frame (or a stack of darks) whose dark
  signal stands far above their neighbours', robustly (median of the stack, local median
  background, MAD noise).
* :func:`remove_cosmic_rays` finds and replaces cosmic-ray hits in one frame by
  L.A.Cosmic (van Dokkum 2001): the Laplacian of the 2x sub-sampled image picks out
  edges sharper than any the optics can make; normalised by the noise model and
  compared with a fine-structure image it separates cosmic rays (sharp in every
  direction, not PSF-blurred) from solar features.

LST in orbit (~720 km Sun-synchronous, through the South Atlantic Anomaly and the polar
horns) sees many particle hits; its CMOS imagers sample their PSF well (SDI ~19 px FWHM,
WST ~6 px FWHM at full frame, LST.md), which is the regime where L.A.Cosmic is at its best.
Solar images add two hazards that stellar fields lack: the limb, a long sharp edge, and
bright, finely structured active regions at high signal. Two additions to van Dokkum's
recipe handle them (both documented in :func:`remove_cosmic_rays`, both switchable):

* an edge guard: a hit must also stand ``sigma_clip`` noise units above the median of its
  own 3 x 3 box (``sigma_frac * sigma_clip`` for grown pixels). A median filter keeps a
  straight edge, so a limb pixel has no such excess while a hit, single or in a track,
  has its full deposit. Without it, the fine-structure test alone lets the limb through
  (an edge has no fine structure), and growth crawls along it.
* a local noise floor (``noise='local'``): the Poisson/read-noise model is raised to a
  robust local estimate where the frame is noisier than the model says, as with a
  rescaled or processed frame, or fine structure in active regions.

NaN/masked areas (blanked off-disk sky) are filled with their nearest data pixel before
the filters so that a blank edge is not an edge.

Measured on real full-disk scenes at 512 x 512 with injected hits (tests/test_cosmics.py):
recall 0.95-1.0 of hit pixels, 0.013-0.023% of clean pixels flagged, 0-0.024% on the limb,
0-0.2% in the brightest active-region pixels; about 0.3 s per 512 x 512 frame on one CPU
core.

References
----------
van Dokkum, P. G. 2001, PASP 113, 1420, "Cosmic-ray rejection by Laplacian edge detection".
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import ndimage

__all__ = ["find_hot_pixels", "remove_cosmic_rays"]

_MAD_TO_SIGMA = 1.4826
_LAPLACE = np.array([[0.0, -1.0, 0.0], [-1.0, 4.0, -1.0], [0.0, -1.0, 0.0]])


def find_hot_pixels(dark_stack_or_dark: np.ndarray, *, nsigma: float = 5.0, box: int = 5,
                    cold: bool = False) -> np.ndarray:
    """Flag hot (and optionally cold) pixels in a dark frame or a stack of darks.

    Parameters
    ----------
    dark_stack_or_dark : numpy.ndarray, shape (ny, nx) or (N, ny, nx)
        Dark frame(s) of one exposure time and temperature [DN]. With a stack the per-pixel
        median is used, so a cosmic ray in one frame is not a hot pixel; with a single
        frame cosmic rays cannot be told from hot pixels (take three or more darks).
    nsigma : float
        Threshold in units of the robust noise of the dark (1.4826 x MAD of its residual
        after removing the local median background).
    box : int
        Side [pixel] of the median filter that estimates the local background (removes
        gradients such as amplifier glow; odd, >= 3).
    cold : bool
        Also flag pixels ``nsigma`` below the background (dead or low pixels).

    Returns
    -------
    numpy.ndarray of bool, shape (ny, nx)
        True at hot (or cold) pixels. Non-finite pixels are flagged too.

    Raises
    ------
    ValueError
        On an array that is not 2-D or 3-D, or a box smaller than 3.
    """
    d = np.asarray(dark_stack_or_dark, dtype=np.float64)
    if d.ndim == 3:
        d = np.median(d, axis=0) if d.shape[0] > 1 else d[0]
    if d.ndim != 2:
        raise ValueError(f"expected a dark (ny, nx) or a stack (N, ny, nx), got shape {np.shape(dark_stack_or_dark)}")
    box = int(box)
    if box < 3:
        raise ValueError(f"box must be >= 3, got {box}")
    finite = np.isfinite(d)
    filled = _fill_nearest(d, ~finite)
    background = ndimage.median_filter(filled, size=box, mode="reflect")
    resid = filled - background
    r = resid[finite]
    sigma = _MAD_TO_SIGMA * float(np.median(np.abs(r - np.median(r))))
    if sigma <= 0:  # noiseless synthetic dark: any excess is significant
        sigma = np.finfo(float).tiny
    hot = resid > nsigma * sigma
    if cold:
        hot |= resid < -nsigma * sigma
    return hot | ~finite


def _fill_nearest(img: np.ndarray, invalid: np.ndarray) -> np.ndarray:
    """Copy of ``img`` with invalid pixels set to the value of their nearest valid pixel."""
    if not invalid.any():
        return img.copy()
    if invalid.all():
        return np.zeros_like(img)
    idx = ndimage.distance_transform_edt(invalid, return_distances=False, return_indices=True)
    return img[tuple(idx)]


def _local_noise(img: np.ndarray, block: int = 8) -> np.ndarray:
    """Robust local noise [image unit]: the MAD of ``img - med3(img)`` per block, upsampled.

    For white noise ``1.4826 * median|I - med3(I)|`` is 0.87 sigma (measured), hence the
    factor 1.15. Real structure raises the estimate (conservative in active regions);
    isolated hits do not (a median).
    """
    ny, nx = img.shape
    r = np.abs(img - ndimage.median_filter(img, size=3, mode="nearest"))
    by, bx = -(-ny // block), -(-nx // block)
    pad = np.pad(r, ((0, by * block - ny), (0, bx * block - nx)), mode="reflect")
    med = np.median(pad.reshape(by, block, bx, block).transpose(0, 2, 1, 3).reshape(by, bx, -1), axis=2)
    sig = 1.15 * _MAD_TO_SIGMA * med
    yc = (np.arange(ny) + 0.5) / block - 0.5
    xc = (np.arange(nx) + 0.5) / block - 0.5
    return ndimage.map_coordinates(sig, np.meshgrid(yc, xc, indexing="ij"), order=1, mode="nearest")


def _median_at(img: np.ndarray, ys: np.ndarray, xs: np.ndarray, half: int,
               chunk: int = 1 << 18) -> np.ndarray:
    """``median_filter(img, 2 half + 1, mode='nearest')`` evaluated at the pixels (ys, xs) only."""
    out = np.empty(ys.size, dtype=np.float64)
    if ys.size == 0:
        return out
    pad = np.pad(img, half, mode="edge")
    offs = np.arange(-half, half + 1)
    dy, dx = (o.ravel()[None, :] + half for o in np.meshgrid(offs, offs, indexing="ij"))
    for i in range(0, ys.size, chunk):
        y, x = ys[i:i + chunk, None], xs[i:i + chunk, None]
        out[i:i + chunk] = np.median(pad[y + dy, x + dx], axis=1)
    return out


def _masked_median_at(img: np.ndarray, exclude: np.ndarray, ys: np.ndarray, xs: np.ndarray,
                      half: int) -> np.ndarray:
    """Median of the non-excluded pixels in the (2 half + 1)^2 box around each (y, x)."""
    pad = np.pad(np.where(exclude, np.nan, img), half, mode="constant", constant_values=np.nan)
    offs = np.arange(-half, half + 1)
    dy, dx = np.meshgrid(offs, offs, indexing="ij")
    win = pad[ys[:, None] + half + dy.ravel()[None, :], xs[:, None] + half + dx.ravel()[None, :]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN boxes: the caller handles them
        return np.nanmedian(win, axis=1)


def remove_cosmic_rays(image: np.ndarray, *, sigma_clip: float = 4.5, sigma_frac: float = 0.3,
                       obj_lim: float = 5.0, gain: float = 1.0, read_noise: float = 0.0,
                       noise: np.ndarray | str = "local", n_iter: int = 4, mask: np.ndarray | None = None,
                       saturation: float | None = None, edge_guard: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Find and replace cosmic-ray hits by L.A.Cosmic (van Dokkum 2001).

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
        One frame, dark-subtracted [DN]; NaN allowed (left untouched).
    sigma_clip : float
        Detection limit ``sigma_lim`` on the noise-normalised Laplacian ``S'``.
    sigma_frac : float
        Neighbours of a detected hit are added down to ``sigma_frac * sigma_clip``
        (tracks, charge spread).
    obj_lim : float
        Minimum contrast ``f_lim`` between the Laplacian and the fine-structure image:
        a real, PSF-blurred feature has a fine-structure signal comparable to its
        Laplacian and is kept.
    gain : float
        Detector gain [electron / DN], for the Poisson noise model.
    read_noise : float
        Read noise [electron RMS].
    noise : {'local', 'model'} or numpy.ndarray, shape (ny, nx)
        The noise ``N`` (1 sigma) [DN]. ``'model'``: Poisson and read noise,
        ``sqrt(gain * med5(image) + read_noise^2) / gain`` (van Dokkum's choice).
        ``'local'`` (default): the larger of the model and a robust local estimate (MAD
        of ``image - med3(image)`` in 8 x 8 blocks). The local estimate protects frames
        whose noise the model does not describe (a processed or rescaled frame, unknown
        gain, compression noise) and makes detection more conservative where fine solar
        structure raises it (active regions). An array gives ``N`` directly.
    n_iter : int
        Detect-and-clean passes (a hit hidden by a brighter neighbour is found on the next).
    mask : numpy.ndarray of bool, shape (ny, nx), optional
        True marks pixels that are not data (numpy.ma convention), e.g. blanked off-disk
        sky or known bad pixels: never flagged, never used to replace a hit.
    saturation : float, optional
        Pixels at or above this level [DN] and their neighbours are never flagged
        (a saturated feature's flat top has sharp edges).
    edge_guard : bool
        Require a hit to exceed the median of its 3 x 3 box (see Notes); keeps the limb
        and the edges of bright regions. False gives van Dokkum's algorithm as published.

    Returns
    -------
    cleaned : numpy.ndarray, shape (ny, nx), float64
        The frame with hit pixels replaced by the median of the good pixels in the 5 x 5
        box around them (7 x 7, then the 5 x 5 median of the frame, if a box has none).
    cr_mask : numpy.ndarray of bool, shape (ny, nx)
        True at pixels found to be cosmic-ray hits.

    Notes
    -----
    Per pass (van Dokkum 2001, sect. 2-3):

    1. ``L+``: the image sub-sampled 2x2, convolved with the Laplacian kernel, negative
       values set to 0, block-averaged back.
    2. ``S = L+ / (2 N)`` with ``N`` the noise; ``S' = S - med5(S)`` removes the smooth
       response of extended structure.
    3. Candidates: ``S' > sigma_clip``.
    4. Fine structure ``F = (med3(I) - med7(med3(I))) / N`` (floored at 0.01); keep
       candidates with ``S' / F > obj_lim``.
    5. Grow: 8-neighbours with ``S' > sigma_clip`` join, then their 8-neighbours with
       ``S' > sigma_frac * sigma_clip``.
    6. Replace and repeat on the cleaned image until no new hit appears or ``n_iter``.

    Solar additions (module docstring): with ``edge_guard`` a seed of step 4 must also
    satisfy ``I - med3(I) > sigma_clip * N`` and a grown pixel
    ``I - med3(I) > sigma_frac * sigma_clip * N``; with ``noise='local'`` ``N`` is at
    least the local robust noise. NaN and masked pixels are filled with the nearest data
    pixel before the filters so that a blank edge (MDI's off-disk NaN) does not look
    like an edge.

    Implementation: vectorised NumPy/SciPy. Full-frame work per pass is one convolution
    and one 3 x 3 median filter; ``med5(I)`` for the noise model is taken once (a median
    hardly moves when hits are replaced), and the 5 x 5 and 7 x 7 medians of steps 2 and 4
    are evaluated only at the pixels that can still pass (``S' <= S`` because ``S >= 0``),
    by fancy indexing, which gives the same flags as full-frame filters. ``astroscrappy``
    is a C implementation of the published algorithm (without the solar additions).

    References
    ----------
    van Dokkum, P. G. 2001, PASP 113, 1420.
    """
    # Long: the six numbered steps of L.A.Cosmic (van Dokkum 2001) iterate together on shared
    # arrays; split into functions they would pass a dozen buffers each way.
    img = np.asarray(image, dtype=np.float64)
    if img.ndim != 2:
        raise ValueError(f"image must be 2-D, got shape {img.shape}")
    if gain <= 0:
        raise ValueError(f"gain must be positive [e-/DN], got {gain}")
    invalid = ~np.isfinite(img)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != img.shape:
            raise ValueError(f"mask shape {mask.shape} differs from image shape {img.shape}")
        invalid |= mask
    protected = invalid.copy()
    if saturation is not None:
        protected |= ndimage.binary_dilation(np.nan_to_num(img, nan=-np.inf) >= saturation,
                                             structure=np.ones((3, 3), bool), iterations=2)
    model_noise = isinstance(noise, str)
    if model_noise and noise not in ("model", "local"):
        raise ValueError(f"noise must be 'model', 'local' or an array, got {noise!r}")
    local_noise = noise == "local" if model_noise else False
    if not model_noise:
        noise = np.asarray(noise, dtype=np.float64)
        if noise.shape != img.shape:
            raise ValueError(f"noise shape {noise.shape} differs from image shape {img.shape}")
    ny, nx = img.shape
    sigcliplow = sigma_frac * sigma_clip
    box3 = np.ones((3, 3), bool)
    work = _fill_nearest(img, invalid)
    crs = np.zeros(img.shape, dtype=bool)

    # The noise model uses med5 of the first pass: a median barely moves when the hits
    # are replaced, and this is the costliest filter.
    med5 = ndimage.median_filter(work, size=5, mode="nearest")
    if model_noise:
        nse = np.sqrt(np.clip(gain * med5, 1e-4, None) + read_noise ** 2) / gain
        if local_noise:
            np.maximum(nse, _local_noise(work), out=nse)
    else:
        nse = np.clip(noise, 1e-12, None)

    for _ in range(max(int(n_iter), 1)):
        # 1. Laplacian of the 2x sub-sampled image, positive part, block-averaged back
        sub = np.repeat(np.repeat(work, 2, axis=0), 2, axis=1)
        lap = ndimage.convolve(sub, _LAPLACE, mode="nearest")
        np.clip(lap, 0.0, None, out=lap)
        lplus = lap.reshape(ny, 2, nx, 2).mean(axis=(1, 3))
        # 2. Significance S; S' = S - med5(S) <= S (S >= 0), so S' is evaluated only
        #    where S passes the threshold at hand (the same result as full-frame filters)
        s = lplus / (2.0 * nse)
        ys, xs = np.nonzero((s > sigma_clip) & ~protected)
        if ys.size == 0:
            break
        spc = s[ys, xs] - _median_at(s, ys, xs, 2)
        keep = spc > sigma_clip
        ys, xs, spc = ys[keep], xs[keep], spc[keep]
        if ys.size == 0:
            break
        # 3-4. Candidates, fine-structure test (and the edge guard)
        m3 = ndimage.median_filter(work, size=3, mode="nearest")
        fine = (m3[ys, xs] - _median_at(m3, ys, xs, 3)) / nse[ys, xs]
        ok = spc / np.clip(fine, 0.01, None) > obj_lim
        excess = work - m3
        if edge_guard:
            # A hit stands above the median of its own 3 x 3 box; a limb or the edge of a
            # bright region does not (a median filter keeps a straight edge)
            ok &= excess[ys, xs] > sigma_clip * nse[ys, xs]
        new = np.zeros(img.shape, dtype=bool)
        new[ys[ok], xs[ok]] = True
        # 5. Growing (with the edge guard at the lower limit, so that a hit near the limb
        #    does not grow along it)
        grow_ok = ~protected
        if edge_guard:
            grow_ok &= excess > sigcliplow * nse
        for limit in (sigma_clip, sigcliplow):
            zone = ndimage.binary_dilation(new, structure=box3) & grow_ok & (s > limit)
            gy, gx = np.nonzero(zone)
            new = np.zeros(img.shape, dtype=bool)
            if gy.size:
                sel = s[gy, gx] - _median_at(s, gy, gx, 2) > limit
                new[gy[sel], gx[sel]] = True
        new &= ~crs
        if not new.any():
            break
        crs |= new
        # 6. Replace by the median of the good pixels around
        ys, xs = np.nonzero(new)
        exclude = crs | invalid
        val = _masked_median_at(work, exclude, ys, xs, 2)
        missing = ~np.isfinite(val)
        if missing.any():
            val[missing] = _masked_median_at(work, exclude, ys[missing], xs[missing], 3)
            missing = ~np.isfinite(val)
            val[missing] = med5[ys[missing], xs[missing]]
        work[ys, xs] = val

    cleaned = img.copy()
    cleaned[crs] = work[crs]
    return cleaned, crs
