#!/usr/bin/env python
"""Compare two trees of L2 products, product by product (a refactoring must not change them).

Products are matched by their path under each tree (``<channel>/<yyyy>/<mm>/<dd>/lst_..._f<frame>_v<version>.fits``).
For each pair: the data arrays must be identical bit for bit (NaN where NaN), the DQ arrays
identical, and every header card of every HDU identical in keyword, value, comment and
order, except the file-creation time (``DATE``) and the checksums (``CHECKSUM``, ``DATASUM``).
A product present in one tree only is a difference.

Tolerance mode (``--tolerance``), for a change that is allowed to move values by rounding
(issue 29: one exact resampling pass instead of threaded row blocks):

* data (the primary float image): where both are finite, ``|new - old| <= DATA_RTOL * s``
  with ``s = max(|old|, the largest |old| in the 5 x 5 neighbourhood)`` (a resampled value's
  rounding scales with the values it is interpolated from, not with itself: near a limb or a
  sign change a small value carries the rounding of its large neighbours);
* ``UNCERT``: ``|new - old| <= UNCERT_RTOL * |old|`` per pixel (positive weights of positive
  variances: no cancellation, so each value's own scale);
* DQ identical, except *edge fills*: pixels that were exactly ``NO_DATA`` (16) with NaN data
  and now hold data without ``NO_DATA``, each next to (8-neighbour) a pixel that still has
  ``NO_DATA`` or to the frame border (the half-pixel slivers a source still covers);
* headers as in the exact mode, except a ``HISTORY`` card ``N pixels without data`` whose
  ``N`` is each file's own count of ``NO_DATA`` pixels.

Usage::

    python scripts/compare_products.py OLD_DIR NEW_DIR     # e.g. var/products of two demo runs
    python scripts/compare_products.py --tolerance OLD_DIR NEW_DIR

Prints one line per differing product and a ``RESULT`` line; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from astropy.io import fits

#: Header keywords that differ between two writes of the same product.
VOLATILE = frozenset({"DATE", "CHECKSUM", "DATASUM"})
#: Tolerance mode: data within this fraction of the local scale (issue 29's Done-when).
DATA_RTOL = 2e-7
#: Tolerance mode: UNCERT within this fraction of the local scale (issue 29's Done-when).
UNCERT_RTOL = 1e-6
#: ``DQ.NO_DATA`` (pipelines.calibration.l2.steps.DQ), written here so the script reads products alone.
NO_DATA = 16
_NODATA_HISTORY = re.compile(r"^\s*(\d+) pixels without data\s*$")


def _cards(header: fits.Header) -> list[tuple[str, str, str]]:
    return [(c.keyword, repr(c.value), c.comment) for c in header.cards if c.keyword not in VOLATILE]


def _same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes() == b.tobytes()  # bit for bit, NaN payloads included


def _payload(hdu) -> np.ndarray | None:
    """An image HDU's array; a table's ``DQ`` column (the L2 layout) or its raw rows."""
    if isinstance(hdu, fits.BinTableHDU) and hdu.data is not None:
        return np.asarray(hdu.data["DQ"]) if "DQ" in hdu.columns.names else np.frombuffer(hdu.data.tobytes(), np.uint8)
    return hdu.data


def _within(a: np.ndarray, b: np.ndarray, rtol: float, allowed_new: np.ndarray, *,
            local: bool = True) -> tuple[bool, str]:
    """Tolerance rule of the module docstring for float planes ``a`` (old) and ``b`` (new)."""
    from scipy import ndimage

    if a.shape != b.shape:
        return False, f"shape {a.shape} vs {b.shape}"
    fa, fb = np.isfinite(a), np.isfinite(b)
    extra = fb & ~fa
    if (fa & ~fb).any() or (extra & ~allowed_new).any():
        return False, f"{int((fa & ~fb).sum())} finite only in old, {int((extra & ~allowed_new).sum())} only in new"
    both = fa & fb
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    mag = np.where(fa, np.abs(a64), 0.0)
    scale = np.maximum(mag, ndimage.maximum_filter(mag, size=5, mode="nearest")) if local else mag
    err = np.where(both, np.abs(b64 - a64), 0.0)
    ok = err <= rtol * scale
    worst = float(np.max(np.where(both & (scale > 0), err / np.where(scale > 0, scale, 1.0), 0.0), initial=0.0))
    return bool(ok.all()), f"max |diff|/scale {worst:.3g} (limit {rtol:g}), {int((~ok).sum())} beyond"


def _cards_tolerant(header: fits.Header, n_nodata: int | None) -> list[tuple[str, str, str]]:
    out = []
    for k, v, c in _cards(header):
        m = _NODATA_HISTORY.match(str(v).strip("'\" ")) if k == "HISTORY" else None
        if m and n_nodata is not None and int(m.group(1)) == n_nodata:
            v = "'<N = NO_DATA count> pixels without data'"
        out.append((k, v, c))
    return out


def compare_files_tolerant(old: Path, new: Path) -> tuple[list[str], int]:
    """Tolerance mode (module docstring): (differences, edge-filled pixels)."""
    from scipy import ndimage

    out: list[str] = []
    with fits.open(old, memmap=False) as ha, fits.open(new, memmap=False) as hb:
        if len(ha) != len(hb) or [h.name for h in ha] != [h.name for h in hb]:
            return [f"HDUs {[h.name for h in ha]} vs {[h.name for h in hb]}"], 0
        names = [h.name for h in ha]
        dq_a = _payload(ha[names.index("DQ")]) if "DQ" in names else None
        dq_b = _payload(hb[names.index("DQ")]) if "DQ" in names else None
        filled = None
        if dq_a is not None and dq_b is not None and dq_a.shape == dq_b.shape:
            still = (dq_b & NO_DATA) != 0
            near = ndimage.binary_dilation(still, structure=np.ones((3, 3), bool), border_value=1)
            filled = (dq_a == NO_DATA) & ((dq_b & NO_DATA) == 0) & near
            dq_a = np.asarray(dq_a).reshape(dq_b.shape)
        n_fill = int(filled.sum()) if filled is not None else 0
        for i, (a, b) in enumerate(zip(ha, hb)):
            na = int(np.count_nonzero(np.asarray(dq_a) & NO_DATA)) if dq_a is not None else None
            nb = int(np.count_nonzero(np.asarray(dq_b) & NO_DATA)) if dq_b is not None else None
            ca, cb = _cards_tolerant(a.header, na), _cards_tolerant(b.header, nb)
            if ca != cb:
                diff = next((f"card {k}: {x} vs {y}" for k, (x, y) in enumerate(zip(ca, cb)) if x != y),
                            f"{len(ca)} cards vs {len(cb)}")
                out.append(f"HDU {i} header: {diff}")
            da, db = _payload(a), _payload(b)
            if a.name == "DQ":
                if da is None or db is None or np.shape(da) != np.shape(db):
                    out.append(f"HDU {i} (DQ) shape differs")
                    continue
                diff = np.asarray(da) != np.asarray(db)
                if filled is not None:
                    diff &= ~filled.reshape(np.shape(da))
                if diff.any():
                    out.append(f"HDU {i} (DQ) differs on {int(diff.sum())} pixels beyond the edge fills")
            elif da is not None and db is not None and np.issubdtype(np.asarray(da).dtype, np.floating):
                rtol = UNCERT_RTOL if a.name == "UNCERT" else DATA_RTOL
                allowed = filled if filled is not None and filled.shape == np.shape(db) else np.zeros(np.shape(db), bool)
                ok, how = _within(np.asarray(da), np.asarray(db), rtol, allowed, local=a.name != "UNCERT")
                if not ok:
                    out.append(f"HDU {i} ({a.name}) beyond tolerance: {how}")
            elif not _same_array(da, db):
                out.append(f"HDU {i} ({a.name}) data differ")
    return out, n_fill


def compare_files(old: Path, new: Path) -> list[str]:
    """The differences between two product files (empty when they agree)."""
    out: list[str] = []
    with fits.open(old, memmap=False) as ha, fits.open(new, memmap=False) as hb:
        if len(ha) != len(hb):
            return [f"{len(ha)} HDUs vs {len(hb)}"]
        for i, (a, b) in enumerate(zip(ha, hb)):
            ca, cb = _cards(a.header), _cards(b.header)
            if ca != cb:
                diff = next((f"card {k}: {x} vs {y}" for k, (x, y) in enumerate(zip(ca, cb)) if x != y),
                            f"{len(ca)} cards vs {len(cb)}")
                out.append(f"HDU {i} header: {diff}")
            da, db = _payload(a), _payload(b)
            if not _same_array(da, db):
                out.append(f"HDU {i} ({a.name}) data differ")
    return out


def compare_trees(old: Path, new: Path, *, tolerance: bool = False) -> tuple[int, list[str]]:
    """(number of products compared, difference lines); ``tolerance``: the tolerance mode."""
    n, lines, _ = _compare_trees(old, new, tolerance=tolerance)
    return n, lines


def _compare_trees(old: Path, new: Path, *, tolerance: bool) -> tuple[int, list[str], int]:
    a = {p.relative_to(old) for p in old.rglob("*.fits")}
    b = {p.relative_to(new) for p in new.rglob("*.fits")}
    lines = [f"only in {old}: {p}" for p in sorted(a - b)] + [f"only in {new}: {p}" for p in sorted(b - a)]
    n_fill = 0
    for rel in sorted(a & b):
        if tolerance:
            diffs, k = compare_files_tolerant(old / rel, new / rel)
            n_fill += k
        else:
            diffs = compare_files(old / rel, new / rel)
        for d in diffs:
            lines.append(f"{rel}: {d}")
    return len(a & b), lines, n_fill


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--tolerance", action="store_true",
                    help=f"data within {DATA_RTOL:g}, UNCERT within {UNCERT_RTOL:g} of the local scale, DQ identical "
                         "but for edge fills (module docstring)")
    args = ap.parse_args(argv)
    n, lines, n_fill = _compare_trees(args.old, args.new, tolerance=args.tolerance)
    for line in lines:
        print(line)
    extra = f" edge_filled_pixels={n_fill}" if args.tolerance else ""
    print(f"RESULT products_compared={n} differences={len(lines)}{extra}")
    return 1 if lines or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
