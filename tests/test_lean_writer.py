"""pipelines.fitsio.write_fits_lean writes astropy's bytes (CHECKSUM/DATASUM valid) and hashes them."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from astropy.io import fits
from astropy.io.fits.hdu.base import _ValidHDU

from backend.services.manifests import hdu_digest
from pipelines import fitsio
from pipelines.fitsio import lean_writable, sha256_file, write_fits_atomic, write_fits_lean


@pytest.fixture
def frozen_time(monkeypatch):
    # the CHECKSUM/DATASUM comments carry the wall-clock second of the write
    monkeypatch.setattr(_ValidHDU, "_get_timestamp", lambda self: "2026-12-05T00:00:00")


def _l2_like(seed: int = 0, shape=(37, 53), big_endian: bool = False) -> fits.HDUList:
    rng = np.random.default_rng(seed)
    data = rng.normal(100.0, 30.0, shape).astype(np.float32)
    data[3, 4] = np.nan
    if big_endian:
        data = data.astype(">f4")
    sigma = np.abs(rng.normal(5.0, 1.0, shape)).astype(np.float32)
    dq = rng.integers(0, 80, shape).astype(np.uint8)  # 37 x 53 bytes: not a multiple of 4 (padded word)
    h = fits.Header()
    h["LEVEL"] = ("L2", "calibrated")
    h.add_history("made by the test")
    return fits.HDUList([fits.PrimaryHDU(data=data, header=h), fits.ImageHDU(sigma, name="UNCERT"),
                         fits.ImageHDU(dq, name="DQ"), fits.ImageHDU(data.astype(np.float64), name="F64"),
                         fits.ImageHDU(np.arange(7, dtype=np.int16), name="I16")])


@pytest.mark.parametrize("threaded", [False, True], ids=["inline-hash", "hash-thread"])
@pytest.mark.parametrize("big_endian,shape", [(False, (37, 53)), (True, (37, 53)), (False, (1031, 1100))])
def test_lean_bytes_equal_astropys_and_the_digest_is_theirs(frozen_time, monkeypatch, big_endian, shape, threaded):
    # (1031, 1100): planes of 4.5 MB float32, 9 MB float64: several chunks of the 4 MiB buffers
    # (more chunks than buffers: each is reused while the hash thread may still read another)
    monkeypatch.setattr(fitsio, "_LEAN_THREAD_BYTES", 0 if threaded else 1 << 62)
    ref = io.BytesIO()
    _l2_like(big_endian=big_endian, shape=shape).writeto(ref, checksum=True)
    hdul = _l2_like(big_endian=big_endian, shape=shape)
    before = [h.data.copy() for h in hdul]
    out = io.BytesIO()
    digest = write_fits_lean(hdul, out)
    assert out.getvalue() == ref.getvalue()
    assert digest == hashlib.sha256(out.getvalue()).hexdigest()
    assert all(np.array_equal(a, h.data, equal_nan=True) for a, h in zip(before, hdul))  # input untouched
    with fits.open(io.BytesIO(out.getvalue()), checksum=True) as h:
        assert all(x.verify_checksum() == 1 and x.verify_datasum() == 1 for x in h)
    digests: list[str] = []  # the manifest's per-HDU digests, hashed on the same thread as the file's
    assert write_fits_lean(hdul, io.BytesIO(), hdu_digests=digests) == digest
    assert digests == [hdu_digest(h.data) for h in hdul]


def test_a_failing_write_ends_the_hash_thread_and_raises_its_own_error(monkeypatch):
    import threading

    monkeypatch.setattr(fitsio, "_LEAN_THREAD_BYTES", 0)

    class Full(io.BytesIO):
        def write(self, b):
            if self.tell() > 3 << 20:
                raise OSError(28, "No space left on device")
            return super().write(b)

    def hashers() -> int:
        return sum(t.name == "fits-lean-hash" for t in threading.enumerate())

    before = hashers()
    with pytest.raises(OSError, match="No space left"):
        write_fits_lean(_l2_like(shape=(1031, 1100)), Full())
    assert hashers() == before  # joined, not left waiting on its queue


def test_write_fits_atomic_uses_the_lean_writer_and_returns_the_files_sha256(tmp_path):
    hdul = _l2_like(1)
    assert lean_writable(hdul)
    p = tmp_path / "p.fits"
    assert write_fits_atomic(hdul, p) == sha256_file(p)
    with fits.open(p, checksum=True) as h:
        assert all(x.verify_checksum() == 1 for x in h)


def test_tables_and_scaled_data_go_to_astropy(tmp_path):
    table = fits.BinTableHDU.from_columns([fits.Column(name="DQ", format="B", array=np.arange(5, dtype=np.uint8))])
    hdul = fits.HDUList([fits.PrimaryHDU(), table])
    assert not lean_writable(hdul)
    with pytest.raises(ValueError):
        write_fits_lean(hdul, io.BytesIO())
    p = tmp_path / "t.fits"
    assert write_fits_atomic(hdul, p) == sha256_file(p)
    assert not lean_writable(fits.HDUList([fits.PrimaryHDU(np.arange(4, dtype=np.uint16))]))  # BZERO


def test_a_slow_hash_thread_still_hashes_the_bytes_written(frozen_time, monkeypatch):
    """The hash thread lags the writer (each update waits 3 ms first): every buffer must be
    claimed back before it is overwritten, or the digests hash later chunks' bytes. Deterministic,
    unlike a race on a fast hash (removing the claim's wait fails this test on every run)."""
    import hashlib as real
    import time
    import types

    class SlowSha:
        def __init__(self, data: bytes = b"") -> None:
            self._h = real.sha256(data)

        def update(self, b) -> None:
            time.sleep(0.003)
            self._h.update(b)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

    monkeypatch.setattr(fitsio, "_LEAN_THREAD_BYTES", 0)
    monkeypatch.setattr(fitsio, "hashlib", types.SimpleNamespace(sha256=SlowSha))
    hdul = _l2_like(shape=(1031, 1100))
    out = io.BytesIO()
    digests: list[str] = []
    digest = write_fits_lean(hdul, out, hdu_digests=digests)
    assert digest == real.sha256(out.getvalue()).hexdigest()
    assert digests == [hdu_digest(h.data) for h in hdul]


def test_buffers_that_cannot_be_allocated_leave_no_hash_thread(monkeypatch):
    """(A reviewer's reproducer: the hash thread once started before the buffers were made, and a
    MemoryError there left it waiting on its queue for the life of the process.)"""
    import threading

    monkeypatch.setattr(fitsio, "_LEAN_THREAD_BYTES", 0)
    real = np.empty

    def empty(shape, *a, **k):
        if shape == fitsio._LEAN_CHUNK:
            raise MemoryError("no buffer")
        return real(shape, *a, **k)

    def hashers() -> int:
        return sum(t.name == "fits-lean-hash" for t in threading.enumerate())

    before = hashers()
    monkeypatch.setattr(fitsio.np, "empty", empty)
    with pytest.raises(MemoryError):
        write_fits_lean(fits.HDUList([fits.PrimaryHDU(np.zeros((64, 64), np.float32))]), io.BytesIO())
    monkeypatch.setattr(fitsio.np, "empty", real)
    assert hashers() == before
