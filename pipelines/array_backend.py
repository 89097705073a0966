"""The one place that resolves the array backend: NumPy on CPU, CuPy on GPU.

The arithmetic calibration steps (dark, flat, exposure, units, stray light) are written
once against the Array API namespace returned here, through ``array_api_compat`` (the way
SciPy and scikit-learn do it: ``scipy/_lib/_array_api.py``, ``sklearn/utils/_array_api.py``).
No other module imports CuPy or checks whether it is installed.

Examples
--------
>>> xp = resolve_namespace("numpy")
>>> a = to_device(np.ones((2, 2)), xp)
>>> to_numpy(a * 2).sum()
8.0
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import array_api_compat
import numpy as np

from pipelines.errors import LSTDPError

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "resolve_namespace",
    "namespace_of",
    "backend_name",
    "to_device",
    "to_numpy",
    "cupy_available",
    "ndimage_for",
]

#: Backend names accepted by :func:`resolve_namespace` (``gpu`` is an alias of ``cupy``,
#: ``cpu`` of ``numpy``).
BACKENDS = ("numpy", "cupy")


class BackendUnavailableError(LSTDPError):
    """The requested array backend cannot be used here (CuPy not importable, no GPU)."""


def _normalise(name: str | None) -> str:
    key = (name or "numpy").strip().lower()
    aliases = {"cpu": "numpy", "np": "numpy", "gpu": "cupy", "cuda": "cupy", "cp": "cupy"}
    key = aliases.get(key, key)
    if key not in BACKENDS:
        raise ValueError(f"unknown array backend {name!r}; expected one of {', '.join(BACKENDS)} (or cpu/gpu)")
    return key


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        cupy = importlib.import_module("cupy")
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001 - any failure (no module, no driver, no device) means "no"
        return False


def resolve_namespace(backend: str | None = None) -> ModuleType:
    """The Array API namespace of ``backend``.

    Parameters
    ----------
    backend : {"numpy", "cupy", "cpu", "gpu"} or None
        ``None`` means NumPy.

    Returns
    -------
    module
        ``array_api_compat.numpy`` or ``array_api_compat.cupy`` (Array API wrappers that
        operate on plain ``numpy.ndarray``/``cupy.ndarray`` objects).

    Raises
    ------
    ValueError
        If ``backend`` names no known backend.
    BackendUnavailableError
        If CuPy is asked for and cannot be imported or sees no GPU.
    """
    key = _normalise(backend)
    if key == "numpy":
        return array_api_compat.array_namespace(np.empty(0))
    if not cupy_available():
        raise BackendUnavailableError("array backend 'cupy' asked for, but CuPy is not importable or sees no GPU")
    cupy = importlib.import_module("cupy")
    return array_api_compat.array_namespace(cupy.empty(0))


def namespace_of(*arrays: Any) -> ModuleType:
    """The Array API namespace of ``arrays`` (``array_api_compat.get_namespace``).

    Python scalars and ``None`` are ignored; with no array at all, NumPy's namespace.

    Raises
    ------
    TypeError
        If the arrays come from different libraries.
    """
    arrs = [a for a in arrays if a is not None and not isinstance(a, (int, float, bool, complex))]
    if not arrs:
        return array_api_compat.array_namespace(np.empty(0))
    return array_api_compat.get_namespace(*arrs)


def backend_name(xp: ModuleType) -> str:
    """``"numpy"`` or ``"cupy"`` for a namespace returned by this module."""
    return "cupy" if array_api_compat.is_cupy_namespace(xp) else "numpy"


def to_device(array: Any, xp: ModuleType, dtype: Any | None = None) -> Any:
    """``array`` as an array of namespace ``xp`` (copied host->device for CuPy).

    Parameters
    ----------
    array : array-like
        NumPy array, CuPy array or anything ``asarray`` accepts.
    xp : module
        Target namespace from :func:`resolve_namespace`.
    dtype : dtype, optional
        Cast on the way (e.g. ``xp.float32``).
    """
    if array_api_compat.is_cupy_namespace(xp) and array_api_compat.is_cupy_array(array):
        return array if dtype is None else array.astype(dtype, copy=False)
    if array_api_compat.is_cupy_namespace(xp):
        return xp.asarray(np.asarray(array), dtype=dtype)
    return xp.asarray(to_numpy(array), dtype=dtype)


def to_numpy(array: Any) -> np.ndarray:
    """``array`` as a NumPy array (copied device->host for CuPy; no copy for NumPy)."""
    if array_api_compat.is_cupy_array(array):
        return array.get()
    return np.asarray(array)


def ndimage_for(xp: ModuleType) -> ModuleType:
    """``scipy.ndimage`` for NumPy, ``cupyx.scipy.ndimage`` for CuPy (same API)."""
    if array_api_compat.is_cupy_namespace(xp):
        return importlib.import_module("cupyx.scipy.ndimage")
    return importlib.import_module("scipy.ndimage")
