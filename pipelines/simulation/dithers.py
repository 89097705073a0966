"""A dithered flat-field set as the instrument gives it: sub-pixel pointing, level jitter, noise.

LST derives the flats of SDI and WST in flight from off-pointed images of the Sun
(LST.md; Li J.-W. et al. 2025, Acta Astron. Sinica 66(1):10). The spacecraft is commanded
to a pattern of offsets, but it lands within a fraction of a pixel of them, and the
level of each exposure varies (exposure-time jitter, solar variability, the shutter):
what reaches the ground is N raw images and the commanded offsets, nothing else.

:func:`simulate_dithered_flat_set` makes such a set. Image ``k`` is::

    I_k(x) = L_k * G(x) * S(x - a_k) + noise

* ``S`` is a continuous solar scene evaluated exactly at the true (sub-pixel) position,
  never interpolated from a pixel grid: a limb-darkened disk (Neckel 2005 at the
  channel's wavelength, :func:`pipelines.simulation.models.limb_darkening_neckel2005`),
  a band-limited log-normal texture (network / faculae stand-in, shifted by an exact
  Fourier phase ramp) and two sunspots (umbra 0.3, penumbra 0.75 of the local disk,
  Bray & Loughhead 1964, "Sunspots", ch. 4: typical umbral/penumbral continuum contrasts),
  blurred by the channel's resolution (a Gaussian of FWHM ``ChannelSpec`` resolution,
  LST.md) and integrated over each pixel (``supersample`` x ``supersample`` points).
* ``G`` is the simulator's hidden CMOS flat (:func:`pipelines.simulation.forward._flat_field`:
  laser-annealing stripes, a +-1.5 % large-scale gradient, 0.3 % PRNU).
* ``a_k`` = commanded whole-pixel offset + a uniform sub-pixel pointing error in
  [-``pointing_error_px``, +``pointing_error_px``] per axis.
* ``L_k`` = 1 + ``level_jitter`` * N(0, 1).
* Poisson photon noise on ``peak_electrons`` at disk centre plus Gaussian read noise.

The images are dark-subtracted (the dark is a separate master, derived elsewhere). The
truth (``flat``, ``true_offsets``, ``levels``) is returned for scoring only: a blind chain
reads ``images`` and ``commanded`` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from pipelines.simulation.forward import INSTRUMENT, _flat_field
from pipelines.simulation.models import limb_darkening_neckel2005

__all__ = ["DitheredFlatSet", "simulate_dithered_flat_set", "DITHERS_256", "FULL_FRAME_PX"]

#: LST's SDI/WST frame [pixel] (LST.md, "4608x4608").
FULL_FRAME_PX = 4608
#: Plate scale at full frame [arcsec/pixel] (LST.md, "~0.5 arcsec/px").
PLATE_SCALE_FULL = 0.5
#: Apparent solar radius [arcsec] (mean value at 1 au, 959.63 arcsec: Auwers 1891 as used by
#: the IAU; the exact daily value does not matter for a flat).
RSUN_ARCSEC = 959.63
#: Commanded dither pattern (dy, dx) [pixel at 256 px]: non-collinear, mixed parity
#: (the one of :data:`validation.gates.DITHERS`).
DITHERS_256 = np.array([(0, 0), (7, 18), (-12, 5), (23, -10), (-5, -17), (14, 9), (-20, -3), (3, 22), (11, -21)])
#: Wavelength [nm] and resolution [arcsec] per disk channel (LST.md table).
_BAND = {"WST": (360.0, 3.0), "SDI": (121.6, 9.5)}


@dataclass
class DitheredFlatSet:
    """A simulated dithered flat-field campaign.

    Attributes
    ----------
    images : list of numpy.ndarray, each shape (n, n), float64 [electron]
        Dark-subtracted frames: what the chain gets.
    commanded : numpy.ndarray, shape (N, 2), int [pixel]
        Commanded (nominal) ``(dy, dx)`` of the Sun on the detector: what the chain gets.
    flat : numpy.ndarray, shape (n, n), float64
        Hidden flat (mean 1). Truth: for scoring only.
    true_offsets : numpy.ndarray, shape (N, 2), float64 [pixel]
        Where the Sun really was. Truth: for scoring only.
    levels : numpy.ndarray, shape (N,)
        Per-image level factors ``L_k``. Truth: for scoring only.
    sun_center : (float, float)
        ``(y, x)`` of the disk centre at zero offset [pixel, 0-based]. Truth.
    rsun_px : float
        Disk radius [pixel]. Truth.
    """

    images: list
    commanded: np.ndarray
    flat: np.ndarray
    true_offsets: np.ndarray
    levels: np.ndarray
    sun_center: tuple[float, float]
    rsun_px: float


def _texture_spectrum(m: int, sigma_fine: float, rng: np.random.Generator) -> np.ndarray:
    """FFT of a unit-RMS Gaussian-correlated random field of period m fine pixels (band-limited)."""
    field = ndimage.gaussian_filter(rng.standard_normal((m, m)), sigma_fine, mode="wrap")
    field /= field.std()
    return np.fft.fft2(field)


def simulate_dithered_flat_set(size: int = 256, *, noise: bool = True, seed: int = 0, channel: str = "WST",
                               commanded=None, pointing_error_px: float = 0.5, level_jitter: float = 0.005,
                               peak_electrons: float = 4.0e4, read_noise_e: float = 4.0,
                               texture_rms: float = 0.03, texture_scale_arcsec: float = 20.0,
                               supersample: int | None = None, flat: np.ndarray | None = None,
                               scene=None) -> DitheredFlatSet:
    """Simulate N dithered full-disk images of the Sun through a hidden flat.

    Parameters
    ----------
    size : int
        Frame size n [pixel] (square); the plate scale is 0.5 arcsec x 4608 / n (LST.md).
    noise : bool
        Poisson photon noise and Gaussian read noise on (True) or off.
    seed : int
        Seeds the flat, the texture, the pointing errors, the levels and the noise.
    channel : {'WST', 'SDI'}
        Selects the limb-darkening wavelength (WST 360 nm; SDI uses the 360 nm law too, as
        Neckel 2005 does not cover 121.6 nm: a stand-in for its bright disk), the
        resolution (WST 3.0 arcsec, SDI 9.5 arcsec; LST.md) and the flat's stripes
        (:data:`pipelines.simulation.forward.INSTRUMENT`).
    commanded : array-like, shape (N, 2), int, optional
        Commanded offsets ``(dy, dx)`` [pixel]; default :data:`DITHERS_256` scaled by
        ``size / 256`` (rounded).
    pointing_error_px : float
        Half-width of the uniform sub-pixel pointing error per axis [pixel].
    level_jitter : float
        RMS of the per-image level factor (0.005 = 0.5 %, issue 14).
    peak_electrons : float
        Disk-centre signal [electron] (below a CMOS full well of ~5e4-1e5 e-).
    read_noise_e : float
        Read noise RMS [electron].
    texture_rms, texture_scale_arcsec : float
        RMS (in ln I) and correlation length (Gaussian sigma) [arcsec] of the disk texture.
    supersample : int, optional
        Sub-pixel samples per axis for the pixel integration (default 4 up to 512 px, 2 above).
    flat : numpy.ndarray, shape (size, size), optional
        The hidden flat to image through (e.g. the one :func:`pipelines.simulation.simulate`
        made for the channel's science frames, so that a blind chain calibrates those with
        the flat it derives here); default: a new one from ``seed``
        (:func:`pipelines.simulation.forward._flat_field`). The other random draws are the
        same either way.
    scene : callable, optional
        ``scene(y, x) -> ndarray``: the disk brightness [relative] at offsets ``y``, ``x``
        [Rsun] from the disk centre (arrays of one shape), replacing the limb-darkened disk
        with its two spots (e.g. a real solar image with plages and a limb asymmetry); the
        texture, PSF, levels, flat and noise are applied as before. ``None``: the symmetric
        disk (output unchanged).

    Returns
    -------
    DitheredFlatSet

    Raises
    ------
    ValueError
        Unknown channel, ``size`` < 64, a commanded pattern that is not (N, 2) integers, a
        ``flat`` of another shape.
    """
    if channel not in _BAND:
        raise ValueError(f"dithered flats are simulated for SDI and WST, not {channel!r}")
    if size < 64:
        raise ValueError(f"size must be at least 64 px, got {size}")
    wl, res_arcsec = _BAND[channel]
    wl = 360.0 if wl < 300 else wl
    rng = np.random.default_rng(seed)
    scene_fn = scene
    n = int(size)
    if commanded is None:
        commanded = np.rint(DITHERS_256 * (n / 256.0)).astype(int)
    commanded = np.asarray(commanded)
    if commanded.ndim != 2 or commanded.shape[1] != 2 or np.any(commanded != np.round(commanded)):
        raise ValueError("commanded offsets must be an (N, 2) array of whole pixels")
    commanded = commanded.astype(int)
    nimg = len(commanded)
    s = supersample or (4 if n <= 512 else 2)
    scale = PLATE_SCALE_FULL * FULL_FRAME_PX / n            # arcsec / px
    rsun = RSUN_ARCSEC / scale                              # px
    own_flat = _flat_field(n, FULL_FRAME_PX, INSTRUMENT[channel], rng).astype(np.float64)
    if flat is None:
        flat = own_flat
    else:
        flat = np.asarray(flat, dtype=np.float64)
        if flat.shape != (n, n):
            raise ValueError(f"flat must have shape {(n, n)}, got {flat.shape}")
    del own_flat
    true = commanded + rng.uniform(-pointing_error_px, pointing_error_px, commanded.shape)
    levels = 1.0 + level_jitter * rng.standard_normal(nimg)
    cy, cx = (n - 1) / 2 + rng.uniform(-1, 1), (n - 1) / 2 + rng.uniform(-1, 1)
    spots = [(0.25 * rsun, -0.15 * rsun, 12.0 / scale, 30.0 / scale), (-0.45 * rsun, 0.35 * rsun, 8.0 / scale, 20.0 / scale)]
    # texture on a periodic fine grid larger than the frame plus the dithers
    span = int(np.abs(true).max()) + 4
    m = s * (n + 2 * span)
    psf_sigma = res_arcsec / 2.3548 / scale                 # px
    spec = _texture_spectrum(m, texture_scale_arcsec / scale * s, rng)
    fy = np.fft.fftfreq(m)[:, None]
    fx = np.fft.fftfreq(m)[None, :]
    sub = (np.arange(n * s) + 0.5) / s - 0.5                # detector coordinate of each sub-sample
    images = []
    for k in range(nimg):
        ay, ax = true[k]
        # texture(y) at sky y = x - a: shift the periodic field by +a (exact phase ramp)
        tex = np.fft.ifft2(spec * np.exp(-2j * np.pi * (fy * ay * s + fx * ax * s))).real
        o = s * span
        tex = tex[o:o + n * s, o:o + n * s]
        yy = sub[:, None] - ay - cy
        xx = sub[None, :] - ax - cx
        r = np.sqrt(yy ** 2 + xx ** 2) / rsun
        mu = np.sqrt(np.clip(1.0 - r ** 2, 0.0, 1.0))
        if scene_fn is not None:
            scene = np.asarray(scene_fn(np.broadcast_to(yy / rsun, r.shape), np.broadcast_to(xx / rsun, r.shape)),
                               dtype=np.float64)
        else:
            scene = np.where(r < 1.0, limb_darkening_neckel2005(wl, mu), 0.0)
        for sy, sx, ru, rp in (spots if scene_fn is None else ()):
            d = np.sqrt((yy - sy) ** 2 + (xx - sx) ** 2)
            pen = 0.5 * (1 - np.tanh((d - rp) / 0.4))
            umb = 0.5 * (1 - np.tanh((d - ru) / 0.4))
            scene *= 1.0 - 0.25 * pen - 0.45 * umb           # 0.75 penumbra, 0.3 umbra
        scene *= np.exp(texture_rms * tex - 0.5 * texture_rms ** 2)
        if psf_sigma * s > 0.3:
            scene = ndimage.gaussian_filter(scene, psf_sigma * s, mode="constant")
        img = scene.reshape(n, s, n, s).mean(axis=(1, 3))
        img *= peak_electrons * levels[k] * flat
        if noise:
            img = rng.poisson(np.clip(img, 0, None)).astype(np.float64)
            img += read_noise_e * rng.standard_normal(img.shape)
        images.append(img)
    return DitheredFlatSet(images=images, commanded=commanded, flat=flat, true_offsets=true, levels=levels,
                           sun_center=(cy, cx), rsun_px=rsun)
