"""Batched calibration on one device: masters resident, frames streamed, copies overlapped.

:class:`BatchExecutor` calibrates a sequence of raw frames with
:func:`pipelines.calibration.l2.flow.calibrate_frame` and hands each result back, in input
order, to a callback, while the next frames are already being read and copied:

* **masters resident** (:class:`DeviceMasters`): the frame-shaped planes of the dark,
  flat and stray-light masters (and the dark's bad-pixel map, derived once on the host)
  are copied to the device once per master (keyed by SHA-256, registry id and version)
  and reused by every later frame and batch of this process; an LRU bounded by device
  bytes drops the least recently used masters. ``calibrate_frame`` leaves arrays that are
  already on the device where they are (:func:`pipelines.array_backend.to_device` is a
  no-op for a CuPy array asked for as CuPy).
* **frames streamed** (CuPy): each raw frame is copied into one of ``lanes + 1`` pinned
  (page-locked) host buffers and sent to a device buffer of the same slot by an
  asynchronous copy on a dedicated *copy stream*; an event recorded after the copy makes
  the *compute stream* of the lane that calibrates the frame wait for it, and an event
  recorded by that lane after the frame lets the copy stream reuse the device buffer.
  Frame k+1's host-to-device copy therefore runs while frame k computes.
* **lanes**: ``calibrate_frame`` ends with the device-to-host copy of the product (its
  statistics and quicklook average computed on the device before; flow.py, not this module,
  does that, synchronously on the current stream). With ``lanes=2`` (the CuPy default) two
  host threads each drive their own compute stream, so frame k-1's device-to-host copy
  overlaps frame k's kernels.
* **host I/O**: a reader thread reads the next raw files from disk while the device
  works, and the callback (writing the product) runs on the calling thread while the
  lanes compute the following frames.
* **CPU pipeline** (NumPy): the same three stages on the host, so that a batch's
  throughput approaches the slowest stage's rather than the sum of the three: while
  frame k computes on the lane thread, the reader thread reads frame k+1 and the calling
  thread writes product k-1 (``on_result``). A lane is given its next frame as soon as it
  is free, before the finished product is handed to the callback. Bounded: one raw frame
  read ahead (``prefetch=0``), one frame computing, one product being written, so the
  batch holds about three frames more than one ``calibrate_frame`` does
  (``benchmarks/calibrate.py --batch`` measures the peak).
* **uint16 upload** (:class:`StoredWords`): an item made by :meth:`BatchItem.from_path`
  reads the raw frame as its file stores it (:func:`pipelines.fitsio.read_image_stored`:
  16-bit words, no conversion on the host), the words are staged and copied (2 bytes a
  pixel, half of float32) and turned into float32 DN on the device by the lane
  (:func:`pipelines.calibration.l2.device.decode_stored`), equal to what
  :func:`pipelines.fitsio.read_image` gives. Frames stored otherwise are read as float32.
* **device side**: on CuPy the statistics, the uncertainty plane, the centre fit's sampling
  and (``quicklook_size``) the quicklook's block average are computed on the device
  (:mod:`pipelines.calibration.l2.device`); the host gets the product's planes, a few
  scalars and a 512 x 512 array.
* **writer threads** (``on_write``, ``writers``): each calibrated product is handed to a
  bounded pool of ``writers`` threads that write it (FITS, hashes, quicklook) while the
  next ones compute; ``on_result`` then gets the outcomes on the calling thread, in input
  order, each after its write (the database work of a worker stays on one thread).
* **error isolation**: a frame that cannot be read, staged or calibrated fails alone
  (:class:`BatchOutcome` ``error`` holds the reason, in one line); the rest of the batch
  goes on.

On NumPy the same executor runs the same ordering, slots and lanes with a null transfer
(no pinned memory, no streams, no copies), so its logic is tested on machines without a
GPU; the CuPy-specific code is :class:`_CupyTransfer` alone.

Examples
--------
>>> ex = BatchExecutor("numpy")                                    # doctest: +SKIP
>>> items = [BatchItem.from_path(i, p, masters) for i, p in enumerate(paths)]  # doctest: +SKIP
>>> for outcome in ex.run(items):                                   # doctest: +SKIP
...     print(outcome.key, outcome.ok, outcome.error)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

import numpy as np

from pipelines.array_backend import backend_name, resolve_namespace
from pipelines.calibration.l2 import device
from pipelines.calibration.l2.flow import CalibrationInput, L2Result, bad_pixel_map, calibrate_frame
from pipelines.calibration.l2.options import CalibrationOptions
from pipelines.errors import DataError, LSTDPError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["BatchItem", "BatchOutcome", "StoredWords", "BatchExecutor", "DeviceMasters",
           "DEFAULT_DEVICE_MASTER_BYTES", "HOST_MASTER_BYTES", "RESIDENT_KINDS"]

#: Kinds whose frame-shaped planes are made resident on the device (the kinds whose planes
#: ``calibrate_frame`` checks against the frame's shape). The PSF kernel, the stray-light
#: profile and the parameters stay on the host: the steps that use them run on the host.
RESIDENT_KINDS = ("dark", "flat", "stray_light")

#: Upper bound of the device bytes the resident masters may hold [bytes]: 8 GiB, or a
#: quarter of the device's memory if that is less. A full-size master set of one channel
#: (4608 x 4608: dark bias and rate and flat as float32, 3 x 85 MB, bad-pixel map as bool,
#: 21 MB) is about 0.28 GB (benchmarks/gpu_check.py reports 315 MiB resident for the WST
#: and SCI-WL sets together), so 8 GiB holds the sets of all four channels many times over
#: and stays a small part of a data-centre GPU (an H200 has 141 GB).
DEFAULT_DEVICE_MASTER_BYTES = 8 * 2**30

#: The same bound on NumPy [bytes], where "resident" masters are references to host arrays:
#: 1 GiB, about three full-size master sets (0.28 GB each), so that a GPU worker without a GPU
#: keeps no more masters alive than the host cache of a CPU worker does.
HOST_MASTER_BYTES = 2**30


def _failed(key: Hashable, exc: BaseException, backend: str, read_s: float = 0.0,
            compute_s: float = 0.0) -> BatchOutcome:
    if not isinstance(exc, LSTDPError):  # not bad data: a bug or a device fault, keep its traceback
        log.warning("frame %r failed: %s", key, failure_reason(exc), exc_info=exc)
    exc = exc.with_traceback(None)
    return BatchOutcome(key=key, error=failure_reason(exc), exception=exc, read_s=read_s, compute_s=compute_s,
                        backend=backend)


@dataclass
class StoredWords:
    """A raw frame's 16-bit words as stored (:attr:`pipelines.fitsio.StoredImage.stored`), for
    :attr:`BatchItem.load` to return in place of float DN: staged and uploaded as they are and
    decoded on the device (:func:`pipelines.calibration.l2.device.decode_stored`).

    Attributes
    ----------
    words : numpy.ndarray of uint16, shape (ny, nx)
    sums : pipelines.fitsio.StoredSums or None
        The file's ``CHECKSUM``/``DATASUM`` still to verify: the lane sums the uploaded words
        on the device (:func:`pipelines.calibration.l2.device.stored_datasum`) and the frame
        fails with :func:`pipelines.fitsio.verify_checksums`'s reason on a mismatch.
    """

    words: np.ndarray
    sums: Any = None

    @property
    def ndim(self) -> int:
        return self.words.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return self.words.shape


@dataclass
class BatchItem:
    """One frame to calibrate.

    Attributes
    ----------
    key : hashable
        Returned on its outcome (a product id, an index).
    load : callable
        Returns ``(data, header)``: the raw frame [DN], shape (ny, nx), and its repaired
        header, as :func:`pipelines.fitsio.read_image` gives them; or the frame's stored
        words (:class:`StoredWords`, decoded on the device) and that header. Called on the
        reader thread; it may raise (the item then fails with the reason).
    calibrations : dict of str to CalibrationInput
        The host masters by kind (as :func:`calibrate_frame` takes them).
    options : CalibrationOptions
        The frame's calibration options (the array backend is the executor's).
    """

    key: Hashable
    load: Callable[[], tuple[Any, Any]]
    calibrations: dict[str, CalibrationInput]
    options: CalibrationOptions = field(default_factory=CalibrationOptions)

    @classmethod
    def from_path(cls, key: Hashable, path, calibrations: dict[str, CalibrationInput],
                  options: CalibrationOptions | None = None, *, stored: bool = True) -> BatchItem:
        """An item that reads ``path``: its stored 16-bit words (``stored``, the default:
        :func:`pipelines.fitsio.read_image_stored`, decoded on the device), or, when the file
        stores the frame otherwise or ``stored`` is False, :func:`pipelines.fitsio.read_image`
        as float32 (16-bit DN exactly, half the bytes of float64)."""
        from pipelines.fitsio import read_image, read_image_stored

        def load():
            if stored:
                st = read_image_stored(path, defer_sums=True)
                if st is not None:
                    return StoredWords(st.stored, st.sums), st.header
            raw = read_image(path, dtype=np.float32)
            return raw.data, raw.header

        return cls(key=key, load=load, calibrations=calibrations, options=options or CalibrationOptions())


@dataclass
class BatchOutcome:
    """What became of one :class:`BatchItem`.

    Attributes
    ----------
    key : hashable
        The item's key.
    result : L2Result or None
        The product (host arrays); ``None`` if the item failed, or once handed to the
        callback of a :meth:`BatchExecutor.run` with ``keep_results=False``.
    error : str or None
        One-line reason (:func:`pipelines.errors.failure_reason`) if it failed.
    exception : BaseException or None
        The exception itself, for callers that tell data errors from faults (its
        traceback is logged, then dropped: it would keep the frame's arrays alive).
    read_s, compute_s : float
        Wall time [s] of reading the raw file (reader thread) and of ``calibrate_frame``
        (lane thread, including the decoding of stored words and the device-to-host copy).
    backend : str
        ``numpy`` or ``cupy``.
    written : any
        What ``on_write`` returned for this outcome (:meth:`BatchExecutor.run`), else None.
    write_error : BaseException or None
        What ``on_write`` raised for it (its traceback dropped), else None.
    write_s : float
        Wall time [s] of ``on_write`` (a writer thread).
    """

    key: Hashable
    result: L2Result | None = None
    error: str | None = None
    exception: BaseException | None = None
    read_s: float = 0.0
    compute_s: float = 0.0
    backend: str = "numpy"
    written: Any = None
    write_error: BaseException | None = None
    write_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True if the frame was calibrated."""
        return self.error is None


def _finished(entry: Any) -> bool:
    return not isinstance(entry, Future) or entry.done()


# -- transfers: how a frame reaches the device --------------------------------------------

@dataclass
class _Staged:
    array: Any
    slot: Any = None
    stored: bool = False  # ``array`` holds stored 16-bit words (decoded by the lane)
    sums: Any = None      # their file's CHECKSUM/DATASUM, checked by the lane (StoredSums)


class _HostTransfer:
    """NumPy: the "device" is the host; staging, events and streams are no-ops."""

    def __init__(self, lanes: int, nslots: int):
        self.xp = resolve_namespace("numpy")
        self.lanes, self.nslots = lanes, nslots
        self.staged_bytes = 0

    def stage(self, slot: int, host: np.ndarray) -> _Staged:
        return _Staged(array=host)

    def lane(self, lane: int):
        return contextlib.nullcontext()

    def wait_ready(self, staged: _Staged, lane: int) -> None:
        pass

    def mark_done(self, staged: _Staged, lane: int) -> None:
        pass

    def upload(self, host: np.ndarray) -> np.ndarray:
        return host

    def default_master_bytes(self) -> int:
        # the "device" copies are the host masters themselves: hold about as many sets as the
        # worker's host cache (backend.worker.processing.MASTER_CACHE_SIZE: 8 masters), not
        # 8 GiB of host memory per process
        return HOST_MASTER_BYTES

    def synchronize(self) -> None:
        pass


@dataclass
class _Slot:
    pinned: np.ndarray
    device: Any
    uploaded: Any  # cupy.cuda.Event: the host-to-device copy from ``pinned`` is done
    done: Any      # cupy.cuda.Event: the compute that read ``device`` is done


class _CupyTransfer:
    """CuPy: pinned host buffers, one copy stream, one compute stream per lane, events.

    Documented CuPy API used: ``cupy.cuda.Stream(non_blocking=True)`` (does not
    synchronise with the legacy null stream), ``Stream`` as a context manager (makes it
    the current stream of this thread), ``Stream.wait_event``, ``Event.record(stream)``,
    ``Event.synchronize``, ``cupyx.empty_pinned`` (a NumPy array in page-locked memory)
    and ``cupy.ndarray.set(arr, stream=...)`` (an asynchronous host-to-device copy when
    ``arr`` is pinned).
    """

    def __init__(self, lanes: int, nslots: int):
        self.cp = importlib.import_module("cupy")
        self.cpx = importlib.import_module("cupyx")
        self.xp = resolve_namespace("cupy")
        self.lanes, self.nslots = lanes, nslots
        self.copy_stream = self.cp.cuda.Stream(non_blocking=True)
        self.lane_streams = [self.cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]
        self._slots: dict[tuple[int, tuple[int, ...], str], _Slot] = {}
        self.staged_bytes = 0

    def _slot(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> _Slot:
        key = (slot, tuple(shape), np.dtype(dtype).str)
        s = self._slots.get(key)
        if s is None:
            with self.copy_stream:
                device = self.cp.empty(shape, dtype=dtype)
            s = _Slot(pinned=self.cpx.empty_pinned(shape, dtype=dtype), device=device,
                      uploaded=self.cp.cuda.Event(disable_timing=True), done=self.cp.cuda.Event(disable_timing=True))
            self._slots[key] = s
        return s

    def stage(self, slot: int, host: np.ndarray) -> _Staged:
        host = np.ascontiguousarray(host)
        s = self._slot(slot, host.shape, host.dtype)
        s.uploaded.synchronize()               # the last copy out of this pinned buffer is over
        np.copyto(s.pinned, host)
        self.copy_stream.wait_event(s.done)    # the last frame computed from this device buffer is over
        s.device.set(s.pinned, stream=self.copy_stream)
        s.uploaded.record(self.copy_stream)
        self.staged_bytes += host.nbytes
        return _Staged(array=s.device, slot=s)

    def lane(self, lane: int):
        return self.lane_streams[lane]  # ``with stream:``: current stream of this thread

    def wait_ready(self, staged: _Staged, lane: int) -> None:
        self.lane_streams[lane].wait_event(staged.slot.uploaded)

    def mark_done(self, staged: _Staged, lane: int) -> None:
        staged.slot.done.record(self.lane_streams[lane])

    def upload(self, host: np.ndarray):
        with self.copy_stream:
            dev = self.cp.asarray(host)
        self.copy_stream.synchronize()  # masters are copied once: simply wait for them
        return dev

    def default_master_bytes(self) -> int:
        _free, total = self.cp.cuda.Device().mem_info
        return int(min(DEFAULT_DEVICE_MASTER_BYTES, total // 4))

    def synchronize(self) -> None:
        for s in self.lane_streams:
            s.synchronize()
        self.copy_stream.synchronize()


# -- resident masters ------------------------------------------------------------------------

class DeviceMasters:
    """Calibration masters held on the device, an LRU bounded by device bytes.

    Parameters
    ----------
    upload : callable
        Copies one host array to the device and returns the device array (identity on
        NumPy).
    max_bytes : int
        Bytes the resident planes may hold together [bytes]; least recently used masters
        are dropped beyond it (a master in use by a running frame stays alive until that
        frame ends: the frame holds a reference).

    Attributes
    ----------
    uploads : int
        Masters made resident so far (one per master, unless evicted and needed again).
    uploaded_bytes : int
        Bytes copied host -> device for them (on NumPy: the bytes that would be).
    hits : int
        Requests served by a resident master.
    """

    def __init__(self, upload: Callable[[np.ndarray], Any], max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._upload = upload
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[tuple, tuple[CalibrationInput, int]] = OrderedDict()
        self.uploads = 0
        self.uploaded_bytes = 0
        self.hits = 0
        self.evictions = 0
        self._lock = threading.Lock()

    @property
    def resident_bytes(self) -> int:
        """Bytes [bytes] the resident planes hold now."""
        return sum(n for _c, n in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(cal: CalibrationInput) -> tuple | None:
        if not cal.sha256:
            return None
        return (cal.kind, cal.sha256, cal.id, cal.version)

    def _make(self, cal: CalibrationInput) -> tuple[CalibrationInput, int]:
        if cal.kind not in RESIDENT_KINDS:
            return cal, 0
        if cal.kind == "dark":
            bad_pixel_map(cal)  # derived once on the host (cached on the host master), then copied
        data: dict[str, Any] = {}
        nbytes = 0
        for name, arr in cal.data.items():
            if getattr(arr, "ndim", 0) == 2 and (not name.startswith("_") or name == "_bad_pixels"):
                data[name] = self._upload(arr)
                nbytes += int(arr.nbytes)
            else:
                data[name] = arr
        return dataclasses.replace(cal, data=data), nbytes

    def get(self, cal: CalibrationInput) -> CalibrationInput:
        """The device copy of ``cal`` (copied on first use, then reused)."""
        key = self._key(cal)
        with self._lock:
            if key is not None and key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key][0]
            dev, nbytes = self._make(cal)
            if nbytes:
                self.uploads += 1
                self.uploaded_bytes += nbytes
            if key is not None and nbytes:
                self._entries[key] = (dev, nbytes)
                while len(self._entries) > 1 and self.resident_bytes > self.max_bytes:
                    self._entries.popitem(last=False)
                    self.evictions += 1
            return dev

    def resolve(self, calibrations: dict[str, CalibrationInput]) -> dict[str, CalibrationInput]:
        """``calibrations`` with each master replaced by its device copy."""
        return {kind: self.get(cal) for kind, cal in calibrations.items()}


# -- the executor ----------------------------------------------------------------------------

class BatchExecutor:
    """Calibrate batches of frames on one device with resident masters and overlapped copies.

    Parameters
    ----------
    backend : {"numpy", "cupy"}
        The array backend (``cpu``/``gpu`` accepted as aliases).
    lanes : int, optional
        Frames computed at once, each by its own host thread and (CuPy) compute stream.
        Default 2 on CuPy (the device-to-host copy of one frame overlaps
        the kernels of the next), 1 on NumPy (a CPU worker process gets its parallelism
        from the other worker processes).
    prefetch : int, optional
        Raw files the reader thread reads ahead of the frame being staged (it holds at most
        ``prefetch + 1`` raw frames at once); default ``lanes + 1`` on CuPy, 0 on NumPy (the
        next frame is read while the current one computes: enough when reading is faster
        than calibrating, and one raw frame of memory).
    master_bytes : int, optional
        Bound of :class:`DeviceMasters`; default :data:`DEFAULT_DEVICE_MASTER_BYTES` or a
        quarter of the device's memory, whichever is less.
    quicklook_size : int, optional
        Also make each product's quicklook block average at this size on the device
        (``L2Result.quicklook``; the GPU worker gives the quicklook's 512).

    Raises
    ------
    pipelines.array_backend.BackendUnavailableError
        If CuPy is asked for where it cannot run.

    Notes
    -----
    The executor keeps its resident masters between :meth:`run` calls: make one per
    worker process and reuse it. :meth:`run` is not re-entrant. Until it has calibrated
    one frame it uses one lane (CuPy compiles its kernels on first use: that happens once,
    on one thread).
    """

    def __init__(self, backend: str = "numpy", *, lanes: int | None = None, prefetch: int | None = None,
                 master_bytes: int | None = None, quicklook_size: int | None = None):
        xp = resolve_namespace(backend)
        self.backend = backend_name(xp)
        self.lanes = int(lanes if lanes is not None else (2 if self.backend == "cupy" else 1))
        if self.lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {self.lanes}")
        self.nslots = self.lanes + 1
        self.prefetch = int(prefetch if prefetch is not None else (self.nslots if self.backend == "cupy" else 0))
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {self.prefetch}")
        transfer_cls = _CupyTransfer if self.backend == "cupy" else _HostTransfer
        self.transfer = transfer_cls(self.lanes, self.nslots)
        self.masters = DeviceMasters(self.transfer.upload, master_bytes or self.transfer.default_master_bytes())
        self.frames_done = 0
        self.frames_failed = 0
        self.quicklook_size = quicklook_size

    # one frame on one lane (runs on a lane thread)
    def _compute(self, item: BatchItem, header: Any, staged: _Staged, cals: dict, lane: int,
                 read_s: float) -> BatchOutcome:
        t0 = time.perf_counter()
        try:
            with self.transfer.lane(lane):
                self.transfer.wait_ready(staged, lane)
                try:
                    data = staged.array
                    if staged.stored:  # the uploaded 16-bit words to float32 DN, on the device
                        with device.section("decode"):
                            if staged.sums is not None:  # the raw file's DATASUM/CHECKSUM, summed on the device
                                staged.sums.check(device.stored_datasum(data))
                            data = device.decode_stored(data)
                    result = calibrate_frame(data, header, cals, item.options, backend=self.backend,
                                             quicklook_size=self.quicklook_size)
                    del data
                finally:
                    self.transfer.mark_done(staged, lane)
        except Exception as exc:  # noqa: BLE001 - the frame fails alone, with its reason
            return _failed(item.key, exc, self.backend, read_s, time.perf_counter() - t0)
        return BatchOutcome(key=item.key, result=result, read_s=read_s, compute_s=time.perf_counter() - t0,
                            backend=self.backend)

    @staticmethod
    def _read(item: BatchItem) -> tuple[Any, Any, float]:
        t0 = time.perf_counter()
        data, header = item.load()
        if isinstance(data, StoredWords) and data.words.dtype != np.uint16:
            raise DataError(f"stored words must be uint16, got {data.words.dtype}")
        if getattr(data, "ndim", None) != 2:
            raise DataError(f"a frame must be a 2-D image, got shape {getattr(data, 'shape', None)}")
        return data, header, time.perf_counter() - t0

    def run(self, items: Iterable[BatchItem], on_result: Callable[[BatchOutcome], None] | None = None, *,
            keep_results: bool = True, on_write: Callable[[BatchOutcome], Any] | None = None,
            writers: int = 1) -> list[BatchOutcome]:
        """Calibrate ``items``; outcomes in input order.

        Parameters
        ----------
        items : iterable of BatchItem
        on_result : callable, optional
            Called on the calling thread with each outcome, in input order, as soon as it
            and all before it are in (while the next frames compute). If it raises, no
            further frame is started, the frames under way (on NumPy, the one a lane took
            while the previous product was being handed over) are waited for and dropped,
            and the exception propagates.
        keep_results : bool
            False: each outcome's ``result`` is dropped once ``on_result`` has had it (a
            full-size product is about 106 MB on the host; a worker writes it and lets it go).
        on_write : callable, optional
            Called with each calibrated outcome (``ok``) on one of ``writers`` writer threads,
            as soon as it is in (several products are written at once, while the next frames
            compute); what it returns is the outcome's ``written``, what it raises its
            ``write_error`` (the batch goes on). ``on_result`` gets each outcome after its
            write. It must not use the caller's database session (not thread-safe).
        writers : int
            Writer threads (``on_write`` only). At most ``writers`` products are being
            written or waiting for the calling thread at once: the host memory of the batch
            grows by that many products (about 191 MB each at 4608 x 4608).

        Returns
        -------
        list of BatchOutcome
            One per item, in input order; failed items have ``error`` set.
        """
        # Long: the executor's one ordering loop (reader thread, compute lanes, bounded writer pool,
        # outcomes handed back in input order on the calling thread); split, its hand-offs would be
        # spread over functions that share every queue and counter
        items = list(items)
        outcomes: list[BatchOutcome] = []
        if not items:
            return outcomes
        if writers < 1:
            raise ValueError(f"writers must be at least 1, got {writers}")
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lst-batch-read")
        lanes = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix="lst-batch-lane")
        writer = (ThreadPoolExecutor(max_workers=writers, thread_name_prefix="lst-batch-write")
                  if on_write is not None else None)
        writing: deque[tuple[BatchOutcome, Future | None]] = deque()
        reads: dict[int, Future] = {}
        inflight: deque[tuple[int, Future | BatchOutcome]] = deque()
        # NumPy: staging is a no-op (no device buffers to recycle), so a lane may take the next
        # frame before the previous product has been handed over (written)
        host_pipeline = isinstance(self.transfer, _HostTransfer)

        def want(i: int) -> None:
            if i < len(items) and i not in reads:
                reads[i] = reader.submit(self._read, items[i])

        def wait_for_lane() -> None:  # without handing anything to the callback
            while True:
                busy = [e for _s, e in inflight if isinstance(e, Future) and not e.done()]
                if len(busy) < self.lanes:
                    return
                futures_wait(busy, return_when=FIRST_COMPLETED)

        def hand_over(out: BatchOutcome) -> None:  # the calling thread, in input order
            if on_result is not None:
                on_result(out)
                if not keep_results:
                    out.result = None

        def write(out: BatchOutcome) -> BatchOutcome:  # a writer thread
            t0 = time.perf_counter()
            try:
                out.written = on_write(out)
            except Exception as exc:  # noqa: BLE001 - handed to on_result with the outcome
                log.warning("writing the product of frame %r failed: %s", out.key, failure_reason(exc), exc_info=exc)
                out.write_error = exc.with_traceback(None)
            out.write_s = time.perf_counter() - t0
            return out

        def drain(everything: bool = False, room: bool = False) -> None:
            # hand over the written products in order; ``room``: first wait for the oldest until
            # fewer than ``writers`` are held, so that one more may be submitted
            while writing and (everything or (room and len(writing) >= writers) or _finished(writing[0][1])):
                out, fut = writing.popleft()
                if fut is not None:
                    fut.result()
                hand_over(out)

        def emit() -> None:
            _seq, entry = inflight.popleft()
            out = entry.result() if isinstance(entry, Future) else entry
            if out.ok:
                self.frames_done += 1
            else:
                self.frames_failed += 1
            outcomes.append(out)
            if writer is None:
                hand_over(out)
                return
            drain(room=True)
            writing.append((out, writer.submit(write, out) if out.ok else None))
            drain()

        try:
            for i in range(min(len(items), self.prefetch + 1)):
                want(i)
            for seq, item in enumerate(items):
                if host_pipeline:
                    # a free lane before this frame is taken from the reader and the next one
                    # asked for: one raw frame read ahead of the one computing, not two
                    wait_for_lane()
                want(seq)
                entry: Future | BatchOutcome
                try:
                    data, header, read_s = reads.pop(seq).result()
                except Exception as exc:  # noqa: BLE001 - unreadable frame: fails alone
                    entry = _failed(item.key, exc, self.backend)
                    data = None
                want(seq + self.prefetch + 1)
                if data is not None:
                    try:
                        cals = self.masters.resolve(item.calibrations)
                        # slot seq % nslots was last used by frame seq - nslots, already emitted:
                        # at most ``lanes`` frames (seq - lanes .. seq - 1) are in flight here
                        words = isinstance(data, StoredWords)
                        staged = self.transfer.stage(seq % self.nslots, data.words if words else data)
                        staged.stored = words
                        staged.sums = data.sums if words else None
                    except Exception as exc:  # noqa: BLE001 - e.g. device out of memory: fails alone
                        entry = _failed(item.key, exc, self.backend, read_s)
                    else:
                        entry = None  # submitted below, once a lane is free
                    del data
                if host_pipeline:
                    # CPU: give the lane (free: waited for above) this frame, then write the
                    # finished products while it computes and the reader reads the next frame
                    wait_for_lane()
                    if entry is None:
                        entry = lanes.submit(self._compute, item, header, staged, cals, seq % self.lanes, read_s)
                    inflight.append((seq, entry))
                    while inflight and _finished(inflight[0][1]):
                        emit()
                    drain()
                    continue
                # the copy of frame seq is under way; wait for a free lane, then compute it. Until
                # one frame has been calibrated by this executor, one lane only: the first frame
                # compiles the device kernels (CuPy compiles on first use), done once, alone
                while len(inflight) >= (self.lanes if self.frames_done else 1):
                    emit()
                if entry is None:
                    entry = lanes.submit(self._compute, item, header, staged, cals, seq % self.lanes, read_s)
                inflight.append((seq, entry))
                drain()
            while inflight:
                emit()
            drain(everything=True)
        finally:
            for f in reads.values():
                f.cancel()
            reader.shutdown(wait=True, cancel_futures=True)
            lanes.shutdown(wait=True, cancel_futures=True)
            if writer is not None:
                writer.shutdown(wait=True, cancel_futures=True)
            with contextlib.suppress(Exception):
                self.transfer.synchronize()
        return outcomes
