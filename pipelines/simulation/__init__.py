"""Raw LST frames simulated from real solar images (no LST file is public).

What is built, per channel, from the real files in ``sample-data/real`` (MANIFEST.md):

* **SDI** (Lyman-alpha disk imager): single frames from PROBA2/SWAP 174 A
  (``full-disk/swap_lv1_20120101_001607.fits``), or a 13-frame hourly series from SOHO/EIT
  (``full-disk/eit_sequence``, 2004-03-01 00:00-12:00) with an injected flare. The EIT
  headers' WCS is wrong by a factor 8 (rebinned 8x, native CDELT kept): the disk centre and
  radius are fitted from each image (:func:`fit_solar_limb`), the CDELT is never used.
* **WST** (360 nm): SOHO/MDI continuum (``full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits``)
  turned into a 360 nm disk: MDI's own limb darkening removed, contrasts scaled to 360 nm,
  the 360 nm limb darkening applied.
* **SCI-UV / SCI-WL** (coronagraph, 1.1-2.5 Rsun): the coronal structure of STEREO/COR1-A
  (``coronagraph/20070503_102018_s4c1a.fts``) times radial brightness models in MSB.

The scene is built on the L2 grid (north up, disk centre on the frame centre, the
channel's plate scale), smoothed to the channel's on-orbit resolution (at least 1 pixel
sigma): that band-limited image is the *truth*. The detector frame samples the truth with
a cubic spline at the pointed and rolled geometry (disk centre a few pixels off the frame
centre, roll of a fraction of a degree to 2 degrees), and the forward model gives DN::

    raw = bias + dark_rate * t + flat * t * aperture * (S_true + S_stray) / C

then Poisson noise on the photo-electrons (``gain`` e-/DN) and Gaussian read noise
(``noise=True``), rounding and clipping to uint16. ``S`` is in erg cm-2 s-1 sr-1 (SDI,
WST) or MSB (SCI); ``C`` is the radiometric coefficient [unit per DN/s]; ``S_stray`` (SCI
only) is the power law through LST.md's two on-orbit points; ``aperture`` is 1 except
behind the SCI occulter and beyond its field stop (cosine ramps just outside 1.1 and
2.5 Rsun, so the masked edge carries no step into the useful field).

Outputs of :func:`simulate` under ``out_dir``:

* ``raw/lst_<chan>_<YYYYMMDDThhmmss>_raw.fits``: uint16, ASO-S style header (two-digit-year
  DATE-OBS, ``solar_x``/``arcsecs``, CROTA, no observer keywords);
* ``calibration/lst_<chan>_<kind>_<naxis>_v01.fits``: self-describing masters (``CALKIND``,
  ``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``CALDESC``, parameters);
* ``truth/lst_<chan>_<stamp>_truth.fits``: float32 truth on the L2 grid with a
  helioprojective WCS, plus HDU ``STRAY`` (SCI: the injected stray light, MSB) and HDU
  ``FLARE`` (SDI series: the injected flare component);
* ``manifest.json``: everything above, the limb fits and the injected flare.

Files are byte-identical for one seed (checksums stamped with the observation time).

Modules
-------
:mod:`~pipelines.simulation.run`
    :func:`simulate`, the entry point, and the manifest.
:mod:`~pipelines.simulation.sources`
    The real images of ``sample-data/real``, read and cleaned.
:mod:`~pipelines.simulation.scenes`
    The scenes on the L2 grid in physical units, from those sources.
:mod:`~pipelines.simulation.models`
    Physical constants and analytic brightness models (limb darkening, coronae).
:mod:`~pipelines.calibration.masters.limb` (the science's, re-exported here)
    :func:`fit_solar_limb`.
:mod:`~pipelines.simulation.grid`
    The L2 grid and the Sun seen from Earth.
:mod:`~pipelines.simulation.series`
    The frames of each channel; the SDI series with its injected flare (:data:`FLARE`).
:mod:`~pipelines.simulation.truth`
    The band-limited truth of each frame.
:mod:`~pipelines.simulation.forward`
    The instrument forward model (:data:`INSTRUMENT`, flat, dark, stray light, noise,
    raw header).
:mod:`~pipelines.simulation.masters`
    The calibration masters written for ingest, and :func:`load_simulated_masters`.
:mod:`~pipelines.simulation.results`
    The dataclasses :func:`simulate` returns.
:mod:`~pipelines.simulation.output`
    Software stamp, ISO times, checksums stamped with the observation time.

The detectors' in-memory test scenes with injected CMEs and prominence eruptions are in
:mod:`validation.synthetic` (not part of the product).

The simulator may import the science (:mod:`pipelines.calibration`); the science never
imports the simulator.
"""


from __future__ import annotations

from pipelines.simulation.forward import INSTRUMENT, InstrumentModel, ssw_date, stray_light_model
from pipelines.calibration.masters.limb import LimbFit, fit_solar_limb
from pipelines.simulation.masters import load_simulated_masters
from pipelines.simulation.models import (baumbach_f_corona, baumbach_k_corona, limb_darkening_neckel2005,
                                         lyman_alpha_corona, sci_wl_corona)
from pipelines.simulation.results import CalibrationFileInfo, InjectedFlare, SimulatedFrame, SimulationResult
from pipelines.simulation.run import simulate
from pipelines.simulation.series import FLARE
from pipelines.simulation.sources import SAMPLE_DIR

__all__ = [
    "SAMPLE_DIR",
    "SimulationResult",
    "SimulatedFrame",
    "CalibrationFileInfo",
    "InjectedFlare",
    "LimbFit",
    "InstrumentModel",
    "INSTRUMENT",
    "FLARE",
    "simulate",
    "load_simulated_masters",
    "fit_solar_limb",
    "limb_darkening_neckel2005",
    "baumbach_k_corona",
    "baumbach_f_corona",
    "lyman_alpha_corona",
    "sci_wl_corona",
    "stray_light_model",
    "ssw_date",
]
