"""Fused frame-sized kernels of the L2 chain on the host (NumPy), with numexpr where it pays.

The arithmetic steps of :mod:`pipelines.calibration.l2.steps` are written against the Array
API and make one new frame per operation; on a 4608 x 4608 frame (85 MB as float32) each
such pass is memory bound (tens of ms) and the chain of dark, flat, exposure and units,
with the variance beside it, makes about fifteen of them. This module evaluates whole
expressions in one pass over the frame, in blocks that stay in the CPU caches, on the
threads the process is given (:func:`set_threads`; a Celery worker gives each of its
processes its share of the cores, as it does for the resampling),
with numexpr (Cooke, Hochberg et al., https://github.com/pydata/numexpr): float32 in,
float32 out, the same IEEE operations in the same order as the step-by-step chain (so
the results agree to float32 rounding; ``tests/test_calibration_steps.py`` compares them).

Only NumPy arrays are fused: on CuPy (or without numexpr) the callers keep the
step-by-step Array API path, and :func:`available` says which applies.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

import numpy as np

__all__ = ["available", "evaluate", "set_threads"]

_NE: Any = None
_LOCK = threading.Lock()
_THREADS: int | None = None


def _numexpr():
    global _NE
    if _NE is None:
        try:
            _NE = importlib.import_module("numexpr")
        except ImportError:  # an optional speed-up: the Array API path stays
            _NE = False
    return _NE or None


def available(*arrays: Any) -> bool:
    """True when numexpr is importable and every array is a NumPy array (host memory)."""
    return _numexpr() is not None and all(isinstance(a, np.ndarray) for a in arrays)


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


_WANT: int | None = None


def set_threads(n: int | None) -> None:
    """Threads of the fused kernels in this process (``None``: every core it may use)."""
    global _WANT
    _WANT = None if n is None else max(1, int(n))


def evaluate(expression: str, local_dict: dict[str, Any], out: np.ndarray | None = None) -> np.ndarray:
    """``numexpr.evaluate(expression, local_dict)`` on this process's step threads.

    Safe to call from several threads (the batch executor's lanes): the calls are serialised
    by a process-wide lock, each running on the process's step threads.

    Scalars must be given as NumPy scalars of the wanted precision (``numpy.float32``):
    a Python float would make numexpr compute in float64.

    Raises
    ------
    RuntimeError
        If numexpr is not importable (call :func:`available` first).
    """
    global _THREADS
    ne = _numexpr()
    if ne is None:
        raise RuntimeError("numexpr is not installed")
    n = _WANT if _WANT is not None else _cores()
    # one call at a time in this process: numexpr's thread pool is global, and
    # ``set_num_threads`` while another thread evaluates deadlocks (the batch executor's two
    # lanes hung in ``_stats``, 2026-12-06; numexpr issues #80 and #569 for concurrent calls).
    # Each call still runs on ``n`` threads of its own.
    with _LOCK:
        if n != _THREADS:
            ne.set_num_threads(n)
            _THREADS = n
        return ne.evaluate(expression, local_dict=local_dict, out=out, casting="same_kind")
