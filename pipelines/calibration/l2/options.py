"""The calibration options: one typed, frozen object with its defaults, units and limits.

:class:`CalibrationOptions` is the only definition. :func:`pipelines.calibration.l2.flow.calibrate_frame`
takes it; a recalibration job's request (``backend.services.jobs.JobRequest.options``)
embeds it, so the API's schema, the job's stored parameters and the flow read the same
fields. Unknown keys and wrong types are refused (never silently ignored).

A product's identity (``params_hash``) holds only the options that differ from their
defaults and change its values (:meth:`CalibrationOptions.identity`): a job that spells out
the defaults, or that only chooses the device, makes the same products.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from pipelines.channels import SATURATION_DN
from pipelines.errors import DataError

__all__ = ["CalibrationOptions", "as_options"]


class CalibrationOptions(BaseModel):
    """Options of the L2 calibration of one frame (also those of a recalibration job).

    Attributes
    ----------
    device : {"cpu", "gpu"}
        Where a job's frames run: ``gpu`` sends them to the GPU workers (queue ``gpu``,
        CuPy). Not part of the product's identity: CPU and GPU agree to float32 rounding.
    deconvolve_psf : bool
        SDI: Richardson-Lucy deconvolution by the PSF master (needs a ``psf`` calibration).
    psf_iterations : int, 1..500
        Richardson-Lucy iterations.
    remove_cosmic_rays : bool
        L.A.Cosmic cosmic-ray removal (van Dokkum 2001, PASP 113, 1420), DQ bit 64.
    flag_bad_pixels : bool
        Flag the dark master's hot/bad pixels in DQ (bit 32).
    subtract_stray_light : bool
        SCI: subtract the stray-light model (needs a ``stray_light`` calibration).
    stray_light_source : {"auto", "profile", "map", "law"}
        SCI: which representation of the ``stray_light`` master is subtracted. ``auto``
        (default): the master's ``STRAYTYP`` decides (``PROFILE``: its measured radial
        profile, e.g. :func:`validation.blind_stray.blind_stray_master`; ``MAP``:
        its per-pixel map; no plane: the power law of its ``STRAY*`` keywords). ``profile``:
        the measured radial profile (``PROFILE`` table); ``map``: the measured per-pixel
        map on the detector grid; ``law``: the power law of the keywords. A master without
        the chosen representation is refused (``DataError``). HISTORY names what was used.
    rotate_north_up : bool
        Rotate solar north up and centre the Sun (cubic spline resampling by default).
    interpolation_order : int, 0..5
        Spline order of the north-up resampling (3: cubic B-spline); ``resample="spline"`` only.
    resample : {"spline", "opencv-cubic", "opencv-lanczos4"}
        Back end and kernel of the north-up resampling
        (``pipelines.calibration.l2.resample.RESAMPLE_METHODS``): ``spline`` (scipy/cupyx
        interpolating B-spline of ``interpolation_order``, the reference), ``opencv-cubic``
        (``cv2.warpAffine`` cubic convolution, Keys 1981 with ``a = -0.75``) or
        ``opencv-lanczos4``. The OpenCV ones run on the CPU only (``device="cpu"``) and have a
        fixed kernel (``interpolation_order`` 3). Their differences from the spline on real
        scenes: ``benchmarks/reports/resample_accuracy.md``.
    fit_centre : bool
        Fit the disk centre from the frame (limb for SDI/WST, occulter edge for SCI;
        :mod:`pipelines.calibration.l2.centre`) and use it when the header disagrees.
    centre_tolerance_px : float, [0, 10] [pixel]
        SDI/WST: the limb-fitted centre replaces the header's when they differ by more
        than this, 3 sigma of the fit or the channel's edge systematic
        (``pipelines.calibration.l2.centre.EDGE_SYSTEMATIC_ARCSEC``), whichever is largest.
        0.25 px: the disk imagers' L2 centre gate (``validation.GATES``).
    occulter_tolerance_px : float, [0, 10] [pixel]
        SCI: the same for the occulter-edge fit. 0.05 px: the fit's systematics are
        0.01-0.04 px, and 0.05 px moves the SCI-WL corona at 2.3-2.45 Rsun by ~3.5 % at
        512 px (the stray light is ~60 times the corona there).
    saturation_dn : float, (0, 65535] [DN]
        Raw pixels at or above are flagged saturated (DQ bit 1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Literal["cpu", "gpu"] = Field("cpu", description="gpu: run on the GPU workers (queue gpu, CuPy)")
    deconvolve_psf: StrictBool = Field(False, description="SDI: Richardson-Lucy PSF deconvolution")
    psf_iterations: int = Field(30, ge=1, le=500, description="Richardson-Lucy iterations")
    remove_cosmic_rays: StrictBool = Field(False, description="L.A.Cosmic cosmic-ray removal (van Dokkum 2001)")
    flag_bad_pixels: StrictBool = Field(True, description="flag hot/bad pixels of the dark master in DQ")
    subtract_stray_light: StrictBool = Field(True, description="SCI: subtract the stray-light model")
    stray_light_source: Literal["auto", "profile", "map", "law"] = Field(
        "auto", description="SCI: stray-light master representation subtracted: auto (its STRAYTYP), profile "
                            "(measured radial profile), map (measured per-pixel map) or law (power-law keywords)")
    rotate_north_up: StrictBool = Field(True, description="rotate solar north up and centre the Sun")
    interpolation_order: int = Field(3, ge=0, le=5, description="spline order of the north-up rotation")
    resample: Literal["spline", "opencv-cubic", "opencv-lanczos4"] = Field(
        "spline", description="north-up resampling back end: spline (scipy B-spline of interpolation_order, the "
                              "reference), opencv-cubic (Keys 1981 cubic convolution, a=-0.75), opencv-lanczos4")
    fit_centre: StrictBool = Field(True, description="fit the disk centre (limb / occulter edge) and use it "
                                                     "where the header disagrees")
    centre_tolerance_px: float = Field(0.25, ge=0, le=10, description="[pix] SDI/WST: header/limb-fit disagreement "
                                                                        "above which the fitted centre is used")
    occulter_tolerance_px: float = Field(0.05, ge=0, le=10, description="[pix] SCI: header/occulter-fit disagreement "
                                                                          "above which the fitted centre is used")
    saturation_dn: float = Field(SATURATION_DN, gt=0, le=SATURATION_DN,
                                 description="[DN] pixels at or above are flagged")

    @model_validator(mode="after")
    def _resample_consistent(self) -> "CalibrationOptions":
        if self.resample != "spline":
            if self.interpolation_order != 3:
                raise ValueError(f"resample={self.resample!r} has a fixed kernel; interpolation_order "
                                 f"{self.interpolation_order} applies to resample='spline' only")
            if self.device == "gpu":
                raise ValueError(f"resample={self.resample!r} runs on the CPU only; device='gpu' uses 'spline'")
        return self

    def identity(self) -> dict[str, Any]:
        """The options that change the product's values and differ from their defaults
        (``device`` does not change them). JSON-ready."""
        return self.model_dump(exclude_defaults=True, exclude={"device"})


def as_options(value: CalibrationOptions | dict[str, Any] | None) -> CalibrationOptions:
    """``value`` as :class:`CalibrationOptions` (``None``: the defaults; a dict: validated).

    Raises
    ------
    DataError
        If a dict names an unknown option or gives a value out of its limits (the message
        names each field).
    """
    if isinstance(value, CalibrationOptions):
        return value
    try:
        return CalibrationOptions.model_validate(value or {})
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise DataError(f"invalid calibration options: {reasons}") from None
