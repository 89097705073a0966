#!/usr/bin/env python
"""Compare two trees of L2 products, product by product (a refactoring must not change them).

Products are matched by their path under each tree (``<channel>/<yyyy>/<mm>/<dd>/lst_..._f<frame>_v<version>.fits``).
For each pair: the data arrays must be identical bit for bit (NaN where NaN), the DQ arrays
identical, and every header card of every HDU identical in keyword, value, comment and
order, except the file-creation time (``DATE``) and the checksums (``CHECKSUM``, ``DATASUM``).
A product present in one tree only is a difference.

Usage::

    python scripts/compare_products.py OLD_DIR NEW_DIR     # e.g. var/products of two demo runs

Prints one line per differing product and a ``RESULT`` line; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from astropy.io import fits

#: Header keywords that differ between two writes of the same product.
VOLATILE = frozenset({"DATE", "CHECKSUM", "DATASUM"})


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


def compare_trees(old: Path, new: Path) -> tuple[int, list[str]]:
    """(number of products compared, difference lines)."""
    a = {p.relative_to(old) for p in old.rglob("*.fits")}
    b = {p.relative_to(new) for p in new.rglob("*.fits")}
    lines = [f"only in {old}: {p}" for p in sorted(a - b)] + [f"only in {new}: {p}" for p in sorted(b - a)]
    for rel in sorted(a & b):
        for d in compare_files(old / rel, new / rel):
            lines.append(f"{rel}: {d}")
    return len(a & b), lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    n, lines = compare_trees(args.old, args.new)
    for line in lines:
        print(line)
    print(f"RESULT products_compared={n} differences={len(lines)}")
    return 1 if lines or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
