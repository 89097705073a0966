"""Calibration science, in two rooms.

:mod:`pipelines.calibration.l2`
    The Level-2 chain, run on every raw frame: steps, flow, options, batch executor, GPU
    kernels, resampling, uncertainty, Sun centre, cosmic rays.
:mod:`pipelines.calibration.masters`
    Master derivation, run once per epoch, each result a new calibration version: flat
    field (KLL, sub-pixel), stray light, radiometry, PSF, and the image-only limb fit the
    flat uses.

The validation campaigns against simulated truth are not here but in the top-level
:mod:`validation` package. The science imports neither the simulator
(:mod:`pipelines.simulation`) nor :mod:`validation` (``tests/test_architecture.py``).

What ``backend/`` uses is re-exported here (``from pipelines.calibration import
calibrate_frame``); the modules themselves live in the two rooms.
"""

from __future__ import annotations

from pipelines.calibration.l2 import kernels, uncertainty
from pipelines.calibration.l2.batch import BatchExecutor, BatchItem
from pipelines.calibration.l2.flow import CalibrationInput, L2Result, calibrate_frame, load_calibration_master
from pipelines.calibration.l2.options import CalibrationOptions, as_options
from pipelines.calibration.l2.resample import available_cores, set_default_threads
from pipelines.calibration.l2.steps import DQ

__all__ = [
    "BatchExecutor",
    "BatchItem",
    "CalibrationInput",
    "CalibrationOptions",
    "DQ",
    "L2Result",
    "as_options",
    "available_cores",
    "calibrate_frame",
    "kernels",
    "load_calibration_master",
    "set_default_threads",
    "uncertainty",
]
