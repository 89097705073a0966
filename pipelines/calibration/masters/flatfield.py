"""A new flat-field calibration *version* from a dithered (off-pointed) set: KLL as a step.

LST derives the flats of SDI and WST in flight from off-pointed images of the Sun with the
method of Kuhn, Lin & Loranz (1991) (LST.md; Li J.-W. et al. 2025, Acta Astron. Sinica
66(1):10), and the flats drift with time (radiation damage, contamination), so each
campaign makes a new version with its own validity interval. :func:`derive_flat_master`
goes from the campaign's raw images to that master: dark subtraction, the KLL solution
(:func:`pipelines.calibration.masters.kll.kll_flat`), the fill of pixels the dithers do not cover
(1, or the previous flat), and the FITS master with the project's calibration keywords
(``CALKIND='flat'``, ``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``FRMNAXIS``,
the KLL provenance), written atomically if a path is given. Ingest registers any FITS
with ``CALKIND``; the registry then selects the new version for frames in its interval
and a recalibration job makes new product versions, keeping the old ones.

``method="subpixel"`` (issue 14) takes the commanded (nominal) offsets instead of exact
whole-pixel ones: the set is registered to sub-pixel precision and the flat, the scene
and a level per image are solved together (:mod:`pipelines.calibration.masters.subpixel_flat`),
which is what an in-flight campaign needs (the spacecraft lands within a fraction of a
pixel of the commanded offsets and the level of each exposure varies). ``method="kll"``
(the default, unchanged) is KLL with exact whole-pixel shifts.

No command line here: the validation script (``benchmarks/validate_calibration.py``) and
operators call the function.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits

from pipelines.calibration.masters.kll import KLLResult, flat_calibration_hdul, kll_flat
from pipelines.calibration.masters.subpixel_flat import FLAT_PLANE_SIGMA, SubpixelFlatResult, subpixel_kll_flat
from pipelines.channels import get_channel

__all__ = ["FlatDerivation", "derive_flat_master", "compare_flats"]


@dataclass
class FlatDerivation:
    """Outcome of :func:`derive_flat_master`.

    Attributes
    ----------
    hdul : astropy.io.fits.HDUList
        The flat master (primary ``FLAT``, extension ``VALID``).
    result : KLLResult or SubpixelFlatResult
        The solution (flat, valid mask, convergence; for ``method="subpixel"`` also the
        measured shifts and levels).
    path : pathlib.Path or None
        Where the master was written (``None`` if not written).
    sha256 : str or None
        SHA-256 of the written file.
    """

    hdul: fits.HDUList
    result: KLLResult | SubpixelFlatResult
    path: Path | None = None
    sha256: str | None = None

    @property
    def flat(self) -> np.ndarray:
        """The flat as stored (float32, mean 1, filled where KLL measured nothing)."""
        return np.asarray(self.hdul[0].data)


def derive_flat_master(images: Sequence[np.ndarray], shifts: Any, channel: str, version: int, valid_from: Any,
                       valid_to: Any = None, *, dark_dn: np.ndarray | float | None = None,
                       mask: np.ndarray | None = None, previous_flat: np.ndarray | None = None,
                       fill_value: float = 1.0, threshold: float = 0.05, tol: float = 1e-7, n_iter: int = 500,
                       description: str | None = None, out_path: str | os.PathLike | None = None,
                       method: str = "kll", plane: str = "zero", plane_sigma: float = FLAT_PLANE_SIGMA,
                       outliers: bool = True) -> FlatDerivation:
    """Derive a flat-field master version from a dithered set of raw images (KLL 1991).

    Parameters
    ----------
    images : sequence of N numpy.ndarray, each shape (ny, nx) [DN]
        Raw images of the Sun at N pointings, same exposure; N >= 2 (9 or more advised).
    shifts : array-like, shape (N, 2) [pixel]
        ``method="kll"``: position ``(dy, dx)`` of the Sun in each image relative to a
        common origin, whole pixels (limb fit, rounded; see :mod:`pipelines.calibration.masters.kll`
        on the choice of dithers: the differences must generate the integer lattice).
        ``method="subpixel"``: the commanded (nominal) offsets; the true ones are measured
        and must lie within 3 px of them.
    channel : str
        ``SDI`` or ``WST`` (the KLL-calibrated imagers; SCI uses a diffuser).
    version : int
        ``CALVER`` of the new flat (higher than the channel's current one).
    valid_from, valid_to : str, datetime.datetime or astropy.time.Time
        Validity interval; ``valid_to=None`` leaves it open (close it at the next campaign).
    dark_dn : numpy.ndarray, shape (ny, nx), or float, optional
        Dark (bias + dark current at the images' exposure) [DN] subtracted from every
        image before the log; ``None`` if the images are already dark-subtracted.
    mask : numpy.ndarray of bool, shape (ny, nx) or (N, ny, nx), optional
        True at pixels not to use (known bad pixels, saturated pixels).
    previous_flat : numpy.ndarray, shape (ny, nx), optional
        Flat used where KLL measured nothing (off the dithered disk), rescaled to the new
        flat's level on the pixels both cover; default ``fill_value``.
    fill_value : float
        Flat value where nothing was measured and no previous flat is given.
    threshold, tol, n_iter : float, float, int
        Passed to :func:`pipelines.calibration.masters.kll.kll_flat`.
    description : str, optional
        ``CALDESC``.
    out_path : path-like, optional
        Write the master there (atomically, with CHECKSUM/DATASUM).
    method : {'kll', 'subpixel'}
        ``'kll'``: :func:`pipelines.calibration.masters.kll.kll_flat` with exact whole-pixel shifts
        and equal levels. ``'subpixel'``: :func:`pipelines.calibration.masters.subpixel_flat.subpixel_kll_flat`
        (registration, joint fit with per-image levels, no-gradient disk prior); needs
        N >= 3 full-disk images. The header's ``FLATMETH`` says which.
    plane : {'zero', 'disk'}
        ``'subpixel'`` only: how the gain gradient that dithers cannot measure is fixed
        (:mod:`pipelines.calibration.masters.subpixel_flat`, step 3). ``'zero'`` (default): zero
        gradient over the measured pixels by convention, the plane **stated**: ``FLATPLSR =
        'STATED'``, ``FLATPLWY`` why, ``FLATPLSG`` = ``plane_sigma``, ``FLATPLY0``/``FLATPLX0``
        its pivot; the L2 flow adds the plane's per-pixel error to ``UNCERT`` and flags the
        product (``QUALITY`` bit ``FLAT_PLANE_STATED``). ``'disk'``: the symmetric-disk prior
        (exact on a symmetric disk only; ``FLATPLSR = 'STATED'`` too, no ``FLATPLSG``).
    plane_sigma : float
        1-sigma of the gain change across the frame width per axis [1]
        (:data:`pipelines.calibration.masters.subpixel_flat.FLAT_PLANE_SIGMA`).
    outliers : bool
        ``'subpixel'`` only: drop cosmic-ray hits and hot pixels of the set and solve again
        (step 4); ``FLATNCR`` / ``FLATNHOT`` count them.

    Returns
    -------
    FlatDerivation

    Raises
    ------
    ValueError
        Fewer than two images (three for ``'subpixel'``), shapes that disagree,
        non-integer shifts (``'kll'``), a channel that is not a disk imager, an unknown
        ``method``.
    pipelines.errors.DataError
        ``'subpixel'``: an image registers more than 3 px from its commanded offset.

    Notes
    -----
    Cost: about 4 N frame passes per conjugate-gradient iteration, ~35 iterations; 90 s
    and 4.8 GB at 4608 x 4608 with 9 images on 2 cores (:func:`kll_flat`).
    """
    spec = get_channel(channel)
    if method not in ("kll", "subpixel"):
        raise ValueError(f"method must be 'kll' or 'subpixel', got {method!r}")
    if spec.is_coronagraph:
        raise ValueError(f"{spec.code} flats come from a diffuser, not from KLL dithers")
    imgs = []
    for im in images:
        a = np.asarray(im, dtype=np.float32)
        if dark_dn is not None:
            a = a - np.asarray(dark_dn, dtype=np.float32)
        imgs.append(a)
    if method == "subpixel":
        if plane not in ("zero", "disk"):
            raise ValueError(f"plane must be 'zero' or 'disk', got {plane!r}")
        result = subpixel_kll_flat(imgs, shifts, mask=mask, threshold=threshold, tol=tol,
                                   n_iter=max(n_iter, 1000), plane=plane, outliers=outliers)
        del imgs
        if description is None:
            description = f"sub-pixel KLL flat from {len(result.shifts)} registered images"
        hdul = flat_calibration_hdul(result, spec.code, version, valid_from, valid_to, fill_value=fill_value,
                                     shifts=None, description=description)
        h = hdul[0].header
        h["FLATMETH"] = ("KLL-SUBPX", "KLL 1991 + Chae 2004: sub-pixel, joint levels")
        h["KLLNIMG"] = (len(result.shifts), "images used")
        for k, (dy, dx) in enumerate(result.shifts[:99]):
            h[f"KLLSH{k:02d}"] = (f"{dy:.3f},{dx:.3f}", "[pixel] measured dy,dx of image")
        for k, lv in enumerate(result.levels[:99]):
            h[f"KLLLV{k:02d}"] = (float(lv), "relative level of image (mean 1)")
        how = "disk prior" if plane == "disk" else "zero convention"
        h["KLLPLNY"] = (float(result.plane[0]), f"[1/pixel] dlnG/dy added ({how})")
        h["KLLPLNX"] = (float(result.plane[1]), f"[1/pixel] dlnG/dx added ({how})")
        h["FLATPLSR"] = ("STATED", "flat plane (gain gradient) not measured")
        if plane == "zero":
            h["FLATPLWY"] = ("zero gradient by convention, dithers cannot measure it", "why stated")
            h["FLATPLSG"] = (float(plane_sigma), "[1] 1-sigma gain change across frame per axis")
            h["FLATPLY0"] = (result.pivot[0] + 1.0, "[pixel] plane pivot, row (1-based)")
            h["FLATPLX0"] = (result.pivot[1] + 1.0, "[pixel] plane pivot, column (1-based)")
        else:
            h["FLATPLWY"] = ("symmetric disk prior", "why stated")
        if outliers:
            h["FLATNCR"] = (int(result.n_outliers), "image pixels dropped as cosmic-ray hits")
            h["FLATNHOT"] = (int(result.replaced.sum()), "hot pixels: gain from column neighbours")
    else:
        result = kll_flat(imgs, shifts, mask=mask, threshold=threshold, tol=tol, n_iter=n_iter, method="cg")
        del imgs
        hdul = flat_calibration_hdul(result, spec.code, version, valid_from, valid_to, fill_value=fill_value,
                                     shifts=shifts, description=description)
        h = hdul[0].header
    h["FRMNAXIS"] = (int(result.flat.shape[0]), "[pix] frame size it applies to")
    if previous_flat is not None:
        prev = np.asarray(previous_flat, dtype=np.float64)
        if prev.shape != result.flat.shape:
            raise ValueError(f"previous_flat has shape {prev.shape}, the images {result.flat.shape}")
        both = result.valid_mask & np.isfinite(prev) & (prev > 0)
        level = float(np.mean(result.flat[both]) / np.mean(prev[both])) if both.any() else 1.0
        data = np.asarray(hdul[0].data, dtype=np.float32)
        fill = ~result.valid_mask
        data[fill] = (prev[fill] * level).astype(np.float32)
        hdul[0].data = data
        h["FLATFILL"] = ("previous flat", "where KLL measured nothing")
        h["FLATMEAN"] = (float(data.mean()), "mean of the flat")
    else:
        h["FLATFILL"] = (f"{fill_value:g}", "where KLL measured nothing")
    out = None
    sha = None
    if out_path is not None:
        from pipelines.fitsio import write_fits_atomic

        out = Path(out_path)
        sha = write_fits_atomic(hdul, out)
    return FlatDerivation(hdul=hdul, result=result, path=out, sha256=sha)


def compare_flats(recovered: np.ndarray, injected: np.ndarray, valid: np.ndarray | None = None) -> dict[str, float]:
    """How well a recovered flat matches the true one (both renormalised on ``valid``).

    Parameters
    ----------
    recovered, injected : numpy.ndarray, shape (ny, nx)
        Flats (dimensionless). Only their ratio matters: both are defined up to a constant.
    valid : numpy.ndarray of bool, shape (ny, nx), optional
        Pixels compared (where the recovered flat was measured); default all finite.

    Returns
    -------
    dict
        ``rms`` (RMS of ``ratio - 1``, ratio normalised to mean 1), ``p99`` (99th
        percentile of ``|ratio - 1|``), ``max``, ``injected_rms`` (RMS of the injected
        flat about its mean: what an uncorrected frame would carry), ``n`` (pixels).
    """
    rec = np.asarray(recovered, dtype=np.float64)
    inj = np.asarray(injected, dtype=np.float64)
    ok = np.isfinite(rec) & np.isfinite(inj) & (inj > 0)
    if valid is not None:
        ok &= np.asarray(valid, dtype=bool)
    ratio = rec[ok] / inj[ok]
    ratio /= ratio.mean()
    dev = np.abs(ratio - 1.0)
    inj_n = inj[ok] / inj[ok].mean()
    return {"rms": float(np.sqrt(np.mean((ratio - 1.0) ** 2))), "p99": float(np.percentile(dev, 99)),
            "max": float(dev.max()), "injected_rms": float(inj_n.std()), "n": int(ok.sum())}
