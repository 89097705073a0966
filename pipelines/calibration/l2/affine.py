"""Row-block threading of ``scipy.ndimage.affine_transform`` (shared by the resampling and the variance).

:func:`_affine` and :func:`_blocks` serve :mod:`pipelines.calibration.l2.resample` (its CuPy
and OpenCV paths) and :mod:`pipelines.calibration.l2.uncertainty` (``resample_variance``);
a module of their own so that neither of those imports the other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def _blocks(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(n)`` (fewer if n is small)."""
    parts = max(1, min(int(parts), n // 64 or 1))
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _affine(nd: Any, src: Any, matrix: Any, offset: np.ndarray, shape: tuple[int, int], *, order: int,
            mode: str, cval: float = 0.0, dtype: Any, threads: int = 1) -> Any:
    """``ndimage.affine_transform`` (no prefilter) of ``src`` onto ``shape``, by row blocks on threads.

    Output rows ``r0:r1`` are the transform with ``offset + matrix @ (r0, 0)`` (the same map,
    the origin moved to the block), so the blocks join into the single-call result: the DQ
    planes exactly, the data to float rounding (the shifted offsets round differently:
    differences up to ~6e-8 of the value were seen at 2048 px).
    CuPy arrays go in one call (the GPU parallelises the kernel itself).
    """
    if threads <= 1 or not isinstance(src, np.ndarray):
        return nd.affine_transform(src, matrix, offset=offset, output_shape=shape, order=order, mode=mode,
                                   cval=cval, prefilter=False, output=dtype)
    k = np.asarray(matrix, dtype=float)
    out = np.empty(shape, dtype=dtype)

    def run(rows: tuple[int, int]) -> None:
        r0, r1 = rows
        nd.affine_transform(src, k, offset=offset + k @ np.array([r0, 0.0]), output_shape=(r1 - r0, shape[1]),
                            order=order, mode=mode, cval=cval, prefilter=False, output=out[r0:r1])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, _blocks(shape[0], threads)))
    return out
