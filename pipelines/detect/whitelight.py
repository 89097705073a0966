"""White-light flare (WLF) detection on WST (360 nm) L2 series.

A white-light flare is a localised, impulsive brightening of the photosphere/chromosphere
in the continuum. **The criterion of Jing et al. (2024, Sol. Phys. 299, 11; arXiv:2401.07275,
Sect. 3.1)**: a pixel belongs to a WLF when the *intensity ratio*

    (I - I0) / I_background >= 8 %

where ``I`` is its 360 nm intensity during the flare, ``I0`` the mean intensity of the same
pixel in the 30 min before the GOES start, and ``I_background`` the mean pre-flare intensity
of a 20 x 20 arcsec *quiet-Sun region chosen near the flaring active region* (so that the
ratio does not depend on whether the brightening sits in a sunspot or outside it). 8 % is
"larger than three times the background fluctuation" of their quiet-Sun boxes (within
+-2 %, ~1.5 % on average). The enhancement they *report*, ``rp`` (maximum pixel
enhancement), is a different quantity, ``r = (I - I0) / I0`` (their Sect. 3.4); it is larger
in penumbrae and umbrae, where ``I0`` is low. Detector 1.1.0 thresholded ``r``; 1.2.0
thresholds the paper's ratio (``normalisation='quiet_sun'``) and still reports ``rp``.

Method: the macropixel/running-background scheme of :mod:`pipelines.detect.flares` with
WST parameters (:meth:`WhiteLightParams.flare_params`):

* macropixels of ``macropixel_arcsec`` (default 3 arcsec: the WST on-orbit resolution,
  ~3 arcsec, LST.md) so that a kernel of a few arcsec is not diluted;
* pre-flare level ``I0``: the median of the frames 10-30 min before each frame (at least 3
  frames; 10 frames at the 120-s WST cadence): the automatic version of the paper's 30 min
  before the GOES start, as no GOES time is given to the detector;
* ``I_background``: the local quiet-Sun level, the median of the long-term macropixel level
  over a ``quiet_sun_box_arcsec`` box (100 arcsec; ours: the automatic version of the
  paper's hand-picked box near the region; spots and faculae fill less than half of it);
* global threshold ``(I - I0) / I_background >= 0.08`` (Jing et al. 2024) **and** an excess of
  at least ``noise_sigma`` (default 5) times the noise of that excess (frame-to-frame
  scatter, that of the pre-flare median, and the excess's own robust scatter over the
  series: granulation, p modes, photon noise);
* at least ``min_area_macropixels`` connected macropixels (2: ~18 arcsec2) in at least
  ``min_frames`` frames (2, i.e. >= 2 min at 120 s: a cosmic-ray hit lasts one frame;
  Jing et al. list 3 of 39 flares seen in one frame only, which this rule misses);
* only pixels inside ``disk_limit_rsun`` (0.98: near the limb, limb darkening at 360 nm
  drops the intensity to ~30 % of the centre (Makarova et al. 1991 coefficients,
  LST.md) and a small pointing jitter makes large relative changes).

The peak enhancement reported is Jing et al.'s ``rp``: the largest macropixel
``I / I0 - 1`` at the peak; start and end are where the footprint light curve rises above
10 % and decays below 50 % of its peak enhancement.

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
FRM_VERSION = "1.2.0"  # 1.1.0: noise of I - B (flares 1.2.0); 1.2.0: Jing et al. ratio (I - I0) / I_QS
#: The same, under the names every detector module has (``pipelines.detect.registry``).
DETECTOR_NAME, DETECTOR_VERSION = FRM_NAME, FRM_VERSION
#: Threshold of the identification ratio (I - I0) / I_background (quiet Sun near the region)
#: that makes a WST white-light flare (Jing et al. 2024, Sol. Phys., Sect. 3.1).
JING2024_THRESHOLD = 0.08


@dataclass(frozen=True)
class WhiteLightParams:
    """Parameters of :func:`detect_white_light_flares` (defaults for 120-s WST L2 series).

    Attributes
    ----------
    threshold : float
        Identification ratio a macropixel must reach; 0.08 (Jing et al. 2024).
    normalisation : {'quiet_sun', 'pre'}
        ``'quiet_sun'``: the ratio is ``(I - I0) / I_background`` with the local quiet-Sun
        level (Jing et al. 2024, the default); ``'pre'``: ``(I - I0) / I0`` (detector 1.1.0).
    quiet_sun_box_arcsec : float
        Box of the local quiet-Sun level [arcsec] (100; ours).
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
    normalisation: str = "quiet_sun"
    quiet_sun_box_arcsec: float = 100.0
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
            reference="quiet_sun" if self.normalisation == "quiet_sun" else "pre",
            quiet_sun_box_arcsec=self.quiet_sun_box_arcsec,
            # the SDI detector 1.3.0 significance test (flares 1.4.0's red-noise test, trailing
            # scatter and co-moving background are not validated for WST yet)
            red_noise_sigma=self.noise_sigma, max_baseline_inflation=2.0, trailing_baseline=False,
            corotate="off",
            # the half-way end of flares 1.4.0 (its return-to-background end is validated on SDI only)
            end_fraction=0.5,
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
        macropixel (``I / I0 - 1``; the identification used the ratio of ``params.normalisation``).

    Raises
    ------
    pipelines.detect.flares.FlareDetectionError
        Too few frames, shapes or times that disagree, unusable WCS.
    """
    p = params or WhiteLightParams()
    flares = detect_flares(times, images, wcs_or_headers, dq=dq, params=p.flare_params())
    if p.normalisation == "quiet_sun":
        return [f for f in flares if np.isfinite(f.peak_enhancement)]  # the kernels met the paper's ratio
    return [f for f in flares if np.isfinite(f.peak_enhancement) and f.peak_enhancement >= p.threshold]
