"""What every file of the simulator shares: the software stamp, ISO times, stamped checksums.

Checksums are stamped with the observation time (not the wall clock), so the files are
byte-identical for one seed.
"""

from __future__ import annotations

from pathlib import Path

from astropy.io import fits
from astropy.time import Time

from pipelines.fitsio import write_fits_atomic

#: Written into every header's HISTORY and the manifest. The string names the module the
#: simulator had before it became a package; it is kept so that the files stay
#: byte-identical across that move (change it only with a new simulator version).
SOFTWARE = "lstdp pipelines.simulate 1"


def _iso(t: Time) -> str:
    """``t`` as ISO 8601 UTC (``YYYY-MM-DDThh:mm:ss.sss``)."""
    return t.utc.isot


def _stamp_checksums(hdul: fits.HDUList, when: str) -> None:
    """CHECKSUM/DATASUM with a fixed comment, so files are byte-identical for one seed."""
    for hdu in hdul:
        hdu.add_checksum(when=when)


def _write(hdul: fits.HDUList, path: Path, when: str) -> str:
    """Stamp the checksums with ``when`` and write ``hdul`` atomically; return its sha256."""
    _stamp_checksums(hdul, when)
    return write_fits_atomic(hdul, path, checksum=False)
