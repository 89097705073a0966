"""White-light flare (WLF) detection on WST (360 nm) L2 series.

A white-light flare is a localised, impulsive brightening of the photosphere/chromosphere
in the continuum. Jing et al. (2024) identified the 39 WST white-light flares of
2022-11 to 2023-05 by the **relative enhancement of the flaring region over its pre-flare
level**, ``rp = I / I_pre - 1``, with a threshold of **8 %**; this module applies that
criterion automatically.

Method: the macropixel/running-background scheme of :mod:`pipelines.detect.flares` with
WST parameters (:meth:`WhiteLightParams.flare_params`):

* macropixels of ``macropixel_arcsec`` (default 3 arcsec: the WST on-orbit resolution,
  ~3 arcsec, LST.md) so that a kernel of a few arcsec is not diluted;
* pre-flare level: the median of the frames 10-30 min before each frame (at least 3 frames;
  10 frames at the 120-s WST cadence), so an enhancement lasting minutes is measured
  against the quiet photosphere, not against its own rise;
* global threshold ``I/B - 1 >= 0.08`` (Jing et al. 2024) **and** an excess of at least
  ``noise_sigma`` (default 5) times the noise of that excess (the macropixel's own
  frame-to-frame scatter combined with that of the pre-flare median, as in
  :mod:`pipelines.detect.flares`) (granulation, p-modes and photon noise: at 3 arcsec the photospheric intensity
  fluctuates by ~1-3 % from frame to frame, so 8 % alone would be met by noise in a
  4608-px frame);
* at least ``min_area_macropixels`` connected macropixels (2: ~18 arcsec2) in at least
  ``min_frames`` frames (2, i.e. >= 2 min at 120 s: a cosmic-ray hit lasts one frame);
* only pixels inside ``disk_limit_rsun`` (0.98: near the limb, limb darkening at 360 nm
  drops the intensity to ~30 % of the centre (Makarova et al. 1991 coefficients,
  LST.md) and a small pointing jitter makes large relative changes).

The peak enhancement reported is the largest macropixel ``I/B - 1`` at the peak, the
quantity Jing et al. (2024) threshold at 8 %; start and end are where the footprint light
curve rises above 10 % and decays below 50 % of its peak enhancement.

References
----------
Jing Z. et al. 2024, Solar Physics, "White-light flares observed by ASO-S/LST/WST"
(arXiv:2401.07275): 8 % enhancement threshold, WST at 360 nm, 120-s cadence.
Lu L. et al. 2024, Solar Physics: the macropixel/triple-threshold scheme used for SDI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.detect.flares import DetectedFlare, FlareDetectionParams, detect_flares

__all__ = [
    "FRM_NAME",
    "FRM_VERSION",
    "DETECTOR_NAME",
    "DETECTOR_VERSION",
    "JING2024_THRESHOLD",
    "WhiteLightParams",
    "detect_white_light_flares",
]

#: Detector name (HEK ``frm_name``) and version of the events it makes.
FRM_NAME = "lst-wst-wlf"
FRM_VERSION = "1.1.0"  # 1.1.0: significance against the noise of I - B (flares 1.2.0)
#: The same, under the names every detector module has (``pipelines.detect.registry``).
DETECTOR_NAME, DETECTOR_VERSION = FRM_NAME, FRM_VERSION
#: Relative enhancement over the pre-flare level that makes a WST white-light flare
#: (Jing et al. 2024, Sol. Phys.).
JING2024_THRESHOLD = 0.08


@dataclass(frozen=True)
class WhiteLightParams:
    """Parameters of :func:`detect_white_light_flares` (defaults for 120-s WST L2 series).

    Attributes
    ----------
    threshold : float
        Relative enhancement ``I / I_pre - 1`` a macropixel must reach; 0.08 (Jing et al.
        2024).
    noise_sigma : float
        ... and its excess this many times the noise of the excess (frame-to-frame robust
        noise and that of the pre-flare median; :class:`pipelines.detect.flares.FlareDetectionParams`).
    macropixel_arcsec : float
        Macropixel side [arcsec] (~ the WST resolution).
    background_lag_s, background_span_s : float
        Pre-flare level: median of the frames from lag + span to lag before [s].
    min_background_frames : int
        Fewest frames in a pre-flare level.
    min_area_macropixels, min_frames : int
        Smallest kernel [macropixels] and fewest frames with a kernel.
    disk_limit_rsun : float
        Pixels beyond this radius [Rsun] are not used.
    max_rise_s : float
        An event must gain half its peak enhancement within this time before the peak [s]
        (white-light flares are impulsive: minutes).
    """

    threshold: float = JING2024_THRESHOLD
    noise_sigma: float = 5.0
    macropixel_arcsec: float = 3.0
    background_lag_s: float = 600.0
    background_span_s: float = 1200.0
    min_background_frames: int = 3
    min_area_macropixels: int = 2
    min_frames: int = 2
    disk_limit_rsun: float = 0.98
    max_rise_s: float = 1800.0

    def flare_params(self) -> FlareDetectionParams:
        """The equivalent :class:`pipelines.detect.flares.FlareDetectionParams`."""
        return FlareDetectionParams(
            macropixel_arcsec=self.macropixel_arcsec, background_lag_s=self.background_lag_s,
            background_span_s=self.background_span_s, min_background_frames=self.min_background_frames,
            detection_threshold=self.threshold, noise_sigma=self.noise_sigma,
            min_area_macropixels=self.min_area_macropixels, min_frames=self.min_frames,
            disk_limit_rsun=self.disk_limit_rsun, max_rise_s=self.max_rise_s,
            sparse_cadence_s=None,  # the 8 % criterion of Jing et al. 2024 holds at any cadence
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def detect_white_light_flares(
    times,
    images: Sequence,
    wcs_or_headers,
    *,
    dq: Sequence | None = None,
    params: WhiteLightParams | None = None,
) -> list[DetectedFlare]:
    """Find white-light flares in a time series of WST L2 images.

    Parameters
    ----------
    times : sequence of datetime or str, or astropy.time.Time
        DATE-OBS (UTC) of the N frames, strictly increasing.
    images : sequence of array-like, shape (ny, nx)
        WST L2 frames (radiance at 360 nm, any positive linear unit), north up.
    wcs_or_headers : astropy.wcs.WCS or astropy.io.fits.Header, or a sequence of N
        Helioprojective WCS of the frames (a header also gives the solar radius).
    dq : sequence of array-like, optional
        Data-quality arrays; non-zero pixels are not used.
    params : WhiteLightParams, optional

    Returns
    -------
    list of DetectedFlare
        Sorted by peak time. ``peak_enhancement`` is Jing et al.'s ``rp`` of the brightest
        macropixel (>= ``params.threshold``).

    Raises
    ------
    pipelines.detect.flares.FlareDetectionError
        Too few frames, shapes or times that disagree, unusable WCS.
    """
    p = params or WhiteLightParams()
    flares = detect_flares(times, images, wcs_or_headers, dq=dq, params=p.flare_params())
    return [f for f in flares if np.isfinite(f.peak_enhancement) and f.peak_enhancement >= p.threshold]
