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

import importlib
from typing import TYPE_CHECKING, Any

#: Each name of ``__all__`` and the module it comes from (a submodule when the name is the
#: submodule's own). Loaded on first use (PEP 562): ``from pipelines.calibration import
#: as_options`` loads the options alone, not the chain (the reconciler and the API import the
#: options; ``tests/test_architecture.py``).
_SOURCES = {
    "BatchExecutor": "pipelines.calibration.l2.batch",
    "BatchItem": "pipelines.calibration.l2.batch",
    "CalibrationInput": "pipelines.calibration.l2.flow",
    "CalibrationOptions": "pipelines.calibration.l2.options",
    "DQ": "pipelines.calibration.l2.steps",
    "L2Result": "pipelines.calibration.l2.flow",
    "as_options": "pipelines.calibration.l2.options",
    "available_cores": "pipelines.calibration.l2.resample",
    "calibrate_frame": "pipelines.calibration.l2.flow",
    "kernels": "pipelines.calibration.l2.kernels",
    "load_calibration_master": "pipelines.calibration.l2.flow",
    "set_default_threads": "pipelines.calibration.l2.resample",
    "uncertainty": "pipelines.calibration.l2.uncertainty",
}

__all__ = sorted(_SOURCES)

if TYPE_CHECKING:
    from pipelines.calibration.l2 import kernels, uncertainty
    from pipelines.calibration.l2.batch import BatchExecutor, BatchItem
    from pipelines.calibration.l2.flow import CalibrationInput, L2Result, calibrate_frame, load_calibration_master
    from pipelines.calibration.l2.options import CalibrationOptions, as_options
    from pipelines.calibration.l2.resample import available_cores, set_default_threads
    from pipelines.calibration.l2.steps import DQ


def __getattr__(name: str) -> Any:
    """The re-exported ``name``, imported from its module on first use (PEP 562) and kept in
    the package's namespace. Raises ``AttributeError`` for a name not in :data:`__all__`."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(source)
    value = module if source.rsplit(".", 1)[1] == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the ones not yet loaded included."""
    return sorted(set(globals()) | set(_SOURCES))
