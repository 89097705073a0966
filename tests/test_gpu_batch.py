"""The device-batch executor and the GPU worker's batch task.

On NumPy (every machine): batched products equal per-frame ``calibrate_frame`` products
bit for bit, masters are made resident once per master across batches, a bad frame in the
middle of a batch fails alone, and a ``device: gpu`` job runs end to end through the
Celery tasks (eager) on a worker without a GPU: calibrated with NumPy, the products say
so. With CuPy and a GPU: the CuPy batch agrees with NumPy to float32 rounding.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from pipelines.array_backend import cupy_available
from pipelines.calibration.l2.batch import RESIDENT_KINDS, BatchExecutor, BatchItem, DeviceMasters
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.fitsio import read_image
from pipelines.simulation import load_simulated_masters

SIZES = {"WST": 64, "SCI-WL": 48}
N_PER_CHANNEL = 3


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("gpu_batch_sim")
    res = simulate(out, channels=tuple(SIZES), naxis=SIZES, noise=True, seed=11, sdi_sequence=False,
                   frames_per_channel=N_PER_CHANNEL)
    return out, res


def _masters(out: Path, channel: str) -> dict:
    return load_simulated_masters(out, channel, first_id=100)


def _items(out: Path, frames) -> list[BatchItem]:
    masters = {ch: _masters(out, ch) for ch in SIZES}
    return [BatchItem.from_path(i, f.raw_path, masters[f.channel]) for i, f in enumerate(frames)]


def _per_frame(out: Path, frame):
    raw = read_image(frame.raw_path, dtype=np.float32)
    return calibrate_frame(raw.data, raw.header, _masters(out, frame.channel), backend="numpy")


def _same(a, b) -> None:
    assert a.data.dtype == b.data.dtype == np.float32
    np.testing.assert_array_equal(a.data, b.data)  # NaN == NaN here
    np.testing.assert_array_equal(a.dq, b.dq)
    assert a.stats == b.stats
    assert list(a.header.items()) == list(b.header.items())


@pytest.mark.parametrize("lanes", [1, 2])
def test_batched_products_equal_per_frame_products(sim, lanes):
    out, res = sim
    # the channels interleaved: two frame shapes and two master sets in one batch
    frames = [f for pair in zip(*[[f for f in res.frames if f.channel == ch] for ch in SIZES]) for f in pair]
    ex = BatchExecutor("numpy", lanes=lanes, prefetch=1)
    seen = []
    outcomes = ex.run(_items(out, frames), on_result=lambda o: seen.append(o.key))
    assert [o.key for o in outcomes] == seen == list(range(len(frames)))
    assert all(o.ok and o.error is None and o.backend == "numpy" for o in outcomes)
    for frame, o in zip(frames, outcomes):
        assert o.result.data.shape == (SIZES[frame.channel],) * 2
        _same(o.result, _per_frame(out, frame))
    assert (ex.frames_done, ex.frames_failed) == (len(frames), 0)


def _expected_uploads(cals: dict) -> tuple[int, int]:
    """(masters, planes) the device would hold: frame-shaped planes of the resident kinds."""
    n_masters = n_planes = 0
    for c in cals.values():
        if c.kind not in RESIDENT_KINDS:
            continue
        planes = [k for k, v in c.data.items() if v.ndim == 2 and not k.startswith("_")]
        planes += ["_bad_pixels"] if c.kind == "dark" else []
        n_masters += bool(planes)
        n_planes += len(planes)
    return n_masters, n_planes


def test_masters_are_copied_once_across_batches(sim):
    out, res = sim
    masters = {ch: _masters(out, ch) for ch in SIZES}
    copies = []

    def upload(a):
        copies.append(a.shape)
        return a.copy()

    dm = DeviceMasters(upload, max_bytes=2**30)
    wst = masters["WST"]
    first = dm.resolve(wst)
    again = dm.resolve(wst)
    n_masters, n_planes = _expected_uploads(wst)
    assert n_masters >= 2 and len(copies) == n_planes and dm.uploads == n_masters
    assert all(again[k] is first[k] for k in wst)
    assert dm.hits == n_masters  # the second resolve: every resident master served without a copy
    assert first["dark"].data["_bad_pixels"].dtype == bool  # derived on the host, then resident
    assert first["radiometric"] is wst["radiometric"]  # parameter-only kinds stay as they are

    # the executor: two batches of the same channels copy each master once
    ex = BatchExecutor("numpy")
    frames = list(res.frames)
    ex.run([BatchItem.from_path(i, f.raw_path, masters[f.channel]) for i, f in enumerate(frames)])
    after_one = ex.masters.uploads
    ex.run([BatchItem.from_path(i, f.raw_path, masters[f.channel]) for i, f in enumerate(frames)])
    want = sum(_expected_uploads(m)[0] for m in masters.values())
    assert after_one == ex.masters.uploads == want
    requests = 2 * sum(_expected_uploads(masters[f.channel])[0] for f in frames)
    assert ex.masters.hits == requests - want
    assert ex.masters.resident_bytes == ex.masters.uploaded_bytes > 0


def test_device_master_lru_is_bounded_by_bytes(sim):
    out, _res = sim
    masters = {ch: _masters(out, ch) for ch in SIZES}
    one_dark = DeviceMasters(lambda a: a, max_bytes=2**30)
    one_dark.get(masters["WST"]["dark"])
    budget = one_dark.resident_bytes  # room for the WST dark only
    dm = DeviceMasters(lambda a: a, max_bytes=budget)
    dm.get(masters["WST"]["dark"])
    dm.get(masters["WST"]["flat"])  # over budget: the dark (least recently used) goes
    assert len(dm) == 1 and dm.evictions == 1 and dm.resident_bytes <= budget
    dm.get(masters["WST"]["dark"])  # needed again: copied again
    assert dm.uploads == 3 and dm.evictions == 2


def test_a_bad_frame_fails_alone(sim, tmp_path):
    out, res = sim
    wst = [f for f in res.frames if f.channel == "WST"]
    masters = _masters(out, "WST")
    garbage = tmp_path / "garbage.fits"
    garbage.write_bytes(b"SIMPLE  =                    T" + b"\0" * 500)
    raw = read_image(wst[1].raw_path, dtype=np.float32)
    no_exptime = raw.header.copy()
    del no_exptime["EXPTIME"]

    def boom():
        raise OSError("disk went away")

    items = [BatchItem.from_path("a", wst[0].raw_path, masters),
             BatchItem.from_path("garbage", garbage, masters),
             BatchItem("no-exptime", lambda: (raw.data.copy(), no_exptime), masters),
             BatchItem("io", boom, masters),
             BatchItem.from_path("b", wst[2].raw_path, masters)]
    outs = BatchExecutor("numpy", lanes=2).run(items)
    assert [o.key for o in outs] == ["a", "garbage", "no-exptime", "io", "b"]
    assert [o.ok for o in outs] == [True, False, False, False, True]
    assert "\n" not in outs[1].error and outs[1].error
    assert "EXPTIME" in outs[2].error
    assert outs[3].error == "OSError: disk went away"
    _same(outs[0].result, _per_frame(out, wst[0]))
    _same(outs[4].result, _per_frame(out, wst[2]))



def test_cpu_batch_overlaps_read_compute_and_write_and_fails_bad_frames_alone(sim, tmp_path, monkeypatch):
    """The default NumPy executor (one lane): product k-1 is handed to the callback (written)
    while frame k computes and frame k+1 is already read; a frame that cannot be read or
    calibrated fails with its reason, the others are written as per frame."""
    import threading

    from pipelines.calibration.l2 import batch

    out, res = sim
    wst = [f for f in res.frames if f.channel == "WST"]
    masters = _masters(out, "WST")
    raw = read_image(wst[1].raw_path, dtype=np.float32)
    wrong_size = np.zeros((40, 40), np.float32)
    started: dict = {}
    loaded: list = []
    real = batch.calibrate_frame

    def calibrate(data, header, *a, **k):
        started.setdefault(header.get("BENCHKEY"), threading.Event()).set()
        return real(data, header, *a, **k)

    monkeypatch.setattr(batch, "calibrate_frame", calibrate)

    def loader(key, path=None, data=None):
        def load():
            loaded.append(key)
            if path is not None:
                r = read_image(path, dtype=np.float32)
                d, h = r.data, r.header
            else:
                d, h = data, raw.header.copy()
            h["BENCHKEY"] = key
            return d, h
        return load

    def gone():
        loaded.append("gone")
        raise OSError("disk went away")

    items = [BatchItem("a", loader("a", wst[0].raw_path), masters),
             BatchItem("wrong-size", loader("wrong-size", data=wrong_size), masters),
             BatchItem("gone", gone, masters),
             BatchItem("b", loader("b", wst[1].raw_path), masters),
             BatchItem("c", loader("c", wst[2].raw_path), masters)]
    order = [it.key for it in items]
    ex = BatchExecutor("numpy")
    assert ex.lanes == 1 and ex.prefetch == 0
    seen, overlapped = [], []

    def on_result(o):
        seen.append(o.key)
        i = order.index(o.key)
        nxt = next((k for k in order[i + 1:] if k != "gone"), None)
        if o.key == "a":  # while "a" is written, "wrong-size" has been read and given to the lane
            assert "wrong-size" in loaded
        if o.key in ("a", "b") and nxt is not None:
            overlapped.append(started.setdefault(nxt, threading.Event()).wait(10))

    outs = ex.run(items, on_result=on_result, keep_results=True)
    assert seen == order and [o.key for o in outs] == order
    assert [o.ok for o in outs] == [True, False, False, True, True]
    assert "40x40" in outs[1].error or "shape" in outs[1].error
    assert outs[2].error == "OSError: disk went away"
    assert overlapped == [True, True]  # the next frame was computing while this one was handed over
    for o, f in zip((outs[0], outs[3], outs[4]), wst):
        ref = _per_frame(out, f)
        np.testing.assert_array_equal(o.result.data, ref.data)
        np.testing.assert_array_equal(o.result.dq, ref.dq)
        assert o.result.stats == ref.stats
    assert ex.frames_done == 3 and ex.frames_failed == 2


@pytest.mark.parametrize("lanes", [1, 2])
def test_writer_threads_write_products_at_once_and_hand_them_over_in_order(sim, tmp_path, lanes):
    """``on_write`` runs on the writer pool (several products written at once, at most
    ``writers`` held), ``on_result`` gets every outcome on the calling thread, in input order,
    after its write, with what the write returned or raised; a failed frame is not written;
    the products read as stored 16-bit words equal the per-frame float32 ones."""
    import threading

    out, res = sim
    wst = [f for f in res.frames if f.channel == "WST"]
    masters = _masters(out, "WST")
    garbage = tmp_path / "garbage.fits"
    garbage.write_bytes(b"not FITS at all" * 300)
    items = [BatchItem.from_path(0, wst[0].raw_path, masters),
             BatchItem.from_path(1, wst[1].raw_path, masters, stored=False),
             BatchItem.from_path(2, garbage, masters),
             BatchItem.from_path(3, wst[2].raw_path, masters),
             BatchItem.from_path(4, wst[0].raw_path, masters),
             BatchItem.from_path(5, wst[1].raw_path, masters)]
    caller = threading.current_thread()
    lock = threading.Lock()
    held, peak, writing, most_at_once, written_keys = set(), [0], [0], [0], []
    both = threading.Barrier(2, timeout=60)  # the first two writes wait for each other: they overlap

    def on_write(o):
        assert threading.current_thread().name.startswith("lst-batch-write") and o.ok
        with lock:
            held.add(o.key)
            peak[0] = max(peak[0], len(held))
            writing[0] += 1
            most_at_once[0] = max(most_at_once[0], writing[0])
        if o.key in (0, 1):
            both.wait()
        with lock:
            writing[0] -= 1
            written_keys.append(o.key)
        if o.key == 3:
            raise OSError("store full")
        return f"written {o.key}"

    seen = []

    def on_result(o):
        assert threading.current_thread() is caller
        with lock:
            held.discard(o.key)
        seen.append((o.key, o.ok, o.written, type(o.write_error).__name__ if o.write_error else None))
        if o.ok and o.write_error is None:
            assert o.key in written_keys and o.write_s >= 0
            _same(o.result, _per_frame(out, wst[[0, 1, None, 2, 0, 1][o.key]]))

    ex = BatchExecutor("numpy", lanes=lanes)
    outs = ex.run(items, on_result=on_result, on_write=on_write, writers=2)
    assert [o.key for o in outs] == list(range(6))
    assert seen == [(0, True, "written 0", None), (1, True, "written 1", None), (2, False, None, None),
                    (3, True, None, "OSError"), (4, True, "written 4", None), (5, True, "written 5", None)]
    assert sorted(written_keys) == [0, 1, 3, 4, 5]
    assert peak[0] <= 2  # at most ``writers`` products written or waiting for the caller
    assert most_at_once[0] == 2  # two writes at once (the barrier), never more
    with pytest.raises(ValueError):
        ex.run(items[:1], on_write=on_write, writers=0)


def test_a_frame_whose_raw_file_fails_its_datasum_fails_with_the_hosts_reason(sim, tmp_path):
    """The raw file's DATASUM is checked from the uploaded words' sum (on the device): a
    corrupted file fails with the reason read_image gives, the other frames are calibrated."""
    from astropy.io import fits

    from pipelines.errors import FitsReadError

    out, res = sim
    wst = [f for f in res.frames if f.channel == "WST"]
    masters = _masters(out, "WST")
    good, bad = tmp_path / "good.fits", tmp_path / "bad.fits"
    with fits.open(wst[0].raw_path) as h:
        h.writeto(good, checksum=True)
    b = bytearray(good.read_bytes())
    b[-2880 + 5] ^= 0x08  # a data byte (64 x 64 x 2 bytes: the last block holds data)
    bad.write_bytes(bytes(b))
    with pytest.raises(FitsReadError) as host:
        read_image(bad)
    outs = BatchExecutor("numpy").run([BatchItem.from_path("good", good, masters),
                                       BatchItem.from_path("bad", bad, masters)])
    assert outs[0].ok and not outs[1].ok
    assert outs[1].error == f"FitsReadError: {host.value}" or str(host.value) in outs[1].error
    _same(outs[0].result, _per_frame(out, wst[0]))


def test_a_failing_callback_stops_the_batch(sim):
    out, res = sim
    wst = [f for f in res.frames if f.channel == "WST"]
    seen = []

    def on_result(o):
        seen.append(o.key)
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError, match="database gone"):
        BatchExecutor("numpy", lanes=2).run(_items(out, wst), on_result=on_result)
    assert seen == [0]


@pytest.fixture
def eager(monkeypatch):
    """The Celery app in eager mode for one test; its result backend, which eager tasks
    create from the embedded settings, is put back afterwards (``configure`` does not
    replace a backend already made, and a later test with a real worker needs its own)."""
    from backend.broker import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)
    # Celery 5 keeps the backend in _backend_cache (thread-safe backends) or _local.backend
    monkeypatch.setattr(app, "_backend_cache", None)
    monkeypatch.delattr(app._local, "backend", raising=False)
    yield app
    app._backend_cache = None
    if hasattr(app._local, "backend"):
        del app._local.backend


def _gpu_job(sim, monkeypatch, *, corrupt: int | None, device: str = "gpu"):
    """Ingest the simulated WST frames and masters into the embedded store, optionally
    corrupt one stored raw frame, and add a queued device-gpu job over them."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Frame, Job, JobState
    from backend.services.ingest import ingest_path
    from backend.services.jobs import JobRequest
    from backend.settings import get_settings

    out, res = sim
    monkeypatch.setenv("GPU_BATCH_SIZE", "2")
    monkeypatch.setenv("ARRAY_BACKEND", "numpy")  # a gpu-queue worker configured for NumPy
    get_settings.cache_clear()
    settings = get_settings()
    assert settings.gpu_batch_size == 2
    with session_scope() as s:
        for p in sorted((out / "calibration").glob("lst_wst_*.fits")):
            assert ingest_path(s, p, settings, move=False).status == "calibration"
        for f in res.frames:
            if f.channel == "WST":
                assert ingest_path(s, f.raw_path, settings, move=False).status == "ingested"
    with session_scope() as s:
        frames = list(s.scalars(select(Frame).order_by(Frame.date_obs)))
        assert len(frames) == N_PER_CHANNEL
        bad_frame_id = None
        if corrupt is not None:
            bad_frame_id = frames[corrupt].id
            Path(frames[corrupt].path).write_bytes(b"not a FITS file any more")  # corrupted in the store
        t0 = min(f.date_obs for f in frames) - dt.timedelta(minutes=1)
        t1 = max(f.date_obs for f in frames) + dt.timedelta(minutes=1)
        req = JobRequest(channels=["WST"], start=t0, end=t1, options={"device": device})
        job = Job(owner="test", kind="calibrate", parameters=req.model_dump(mode="json"),
                  state=JobState.queued)
        s.add(job)
        s.flush()
        return settings, job.id, bad_frame_id


def test_gpu_job_runs_batched_end_to_end_without_a_gpu(sim, sqlite_env, eager, monkeypatch):
    """A device-gpu job through run_job -> calibrate_products_gpu_batch (Celery, eager) on a
    worker without a usable GPU: calibrated with NumPy, said in each product; one corrupt
    frame fails its product alone and the job ends failed with the reason; follow-ups once."""
    from astropy.io import fits
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, JobState, Product, ProductState
    from backend.worker.gpu_batch import calibrate_products_batch
    from backend.worker import tasks

    settings, job_id, bad_frame_id = _gpu_job(sim, monkeypatch, corrupt=1)
    from backend.broker import TaskName
    from backend.worker import reconcile

    follow_ups = []
    monkeypatch.setattr(reconcile, "send", lambda name, args=None, kwargs=None, queue="cpu":
                        follow_ups.append(kwargs) if name == TaskName.detect_events else None)
    sent = []
    real_apply_async = tasks.calibrate_products_gpu_batch.apply_async

    def spy(*a, **k):
        sent.append((k.get("args"), k.get("queue")))
        return real_apply_async(*a, **k)

    monkeypatch.setattr(tasks.calibrate_products_gpu_batch, "apply_async", spy)
    r = tasks.run_job.apply(args=[job_id]).get()
    assert r == {"job_id": job_id, "planned": 3, "gpu_batches": 2}
    assert [q for _a, q in sent] == ["gpu", "gpu"] and [len(a[1]) for a, _q in sent] == [2, 1]

    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.failed and (job.total, job.done, job.failed, job.skipped) == (3, 2, 1, 0)
        prods = {p.frame_id: p for p in s.scalars(select(Product).where(Product.job_id == job_id))}
        bad = prods.pop(bad_frame_id)
        assert bad.state == ProductState.failed and bad.error and "\n" not in bad.error
        assert f"frame {bad_frame_id}" in job.error and bad.error in job.error
        for p in prods.values():
            assert p.state == ProductState.written and Path(p.path).is_file()
            assert p.stats["backend"] == "numpy"
            with fits.open(p.path) as hdul:
                h = hdul[0].header
                assert h["BACKEND"] == "numpy"
                assert any("device gpu requested" in str(x) and "ARRAY_BACKEND=numpy" in str(x)
                           for x in h["HISTORY"])
        assert len(follow_ups) == 1  # the WST follow-up, queued once when the job ended
        assert follow_ups[0]["detector"] == "white-light" and follow_ups[0]["channel"] == "WST"
        assert follow_ups[0]["job_id"] == job_id and [f.detector for f in job.follow_ups] == ["white-light"]

        # a retried batch redoes nothing and counts nothing twice
        again = calibrate_products_batch(s, [p.id for p in prods.values()] + [bad.id], settings, job_id=job_id)
        assert sorted(again.skipped) == sorted([p.id for p in prods.values()] + [bad.id]) and not again.written
        s.refresh(job)
        assert (job.done, job.failed) == (2, 1)


def test_gpu_batch_writes_products_on_writer_threads(sim, sqlite_env, eager, monkeypatch):
    """A GPU batch's files are written by writer threads (GPU_WRITERS), renamed and recorded by
    the task's thread: the rows' SHA-256 and manifest digests are those of the files on disk,
    nothing is left in the store's .tmp/; a writer thread's fault fails its product alone with
    the reason, and a product whose claim is lost meanwhile leaves no file."""
    import threading

    from astropy.io import fits
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Product, ProductState
    from backend.services.manifests import product_digests
    from backend.worker import gpu_batch, processing
    from pipelines.fitsio import sha256_file, store_tmp_dir

    monkeypatch.setenv("GPU_WRITERS", "2")
    settings, job_id, _ = _gpu_job(sim, monkeypatch, corrupt=None)
    assert settings.gpu_writers == 2 and not settings.product_store
    threads, real = [], processing.prepare_product_files

    def prepare(settings_, info, result, notes=()):
        threads.append(threading.current_thread().name)
        if info["stamp"]["FRAMEID"] == broken[0]:
            raise RuntimeError("writer thread fault")
        return real(settings_, info, result, notes)

    monkeypatch.setattr(gpu_batch, "prepare_product_files", prepare)
    with session_scope() as s:
        pids = processing.plan_job(s, job_id)
        s.commit()
        prods = [s.get(Product, pid) for pid in pids]
        broken = [prods[1].frame_id]
        rep = gpu_batch.calibrate_products_batch(s, pids, settings, job_id=job_id)
        assert sorted(rep.written) == sorted([pids[0], pids[2]]) and list(rep.failed) == [pids[1]]
        assert "writer thread fault" in rep.failed[pids[1]]
        assert threads and all(t.startswith("lst-batch-write") for t in threads)
        for pid in rep.written:
            p = s.get(Product, pid)
            assert p.state == ProductState.written and p.sha256 == sha256_file(p.path)
            assert Path(p.quicklook_path).is_file()
            with fits.open(p.path) as back:
                assert p.manifest["product"]["data_sha256"] == product_digests(back)
        assert list(store_tmp_dir(settings.products).iterdir()) == []

        # a lost claim: files prepared by a writer thread are discarded, nothing is renamed
        out, res = sim
        prod = s.get(Product, pids[1])
        info = processing.product_write_info(settings, prod)
        result = _per_frame(out, next(f for f in res.frames if f.channel == "WST"))
        prepared = real(settings, info, result)
        assert prepared.fits_file.tmp.is_file() and prepared.quicklook.tmp.is_file()
        monkeypatch.setattr(processing, "confirm_claim", lambda *a, **k: False)
        assert processing.write_product(s, settings, prod, result, attempt=1, prepared=prepared) is False
        assert not prepared.fits_file.tmp.exists() and not prepared.quicklook.tmp.exists()
        assert not info["out"].exists() and not info["out"].with_suffix(".png").exists()
        assert list(store_tmp_dir(settings.products).iterdir()) == []


def test_cpu_job_runs_in_overlapped_cpu_batches_when_asked(sim, sqlite_env, eager, monkeypatch):
    """CPU_BATCH_SIZE=2: a CPU job goes to the cpu queue in batches (calibrate_products_cpu_batch,
    the overlapped host executor); the corrupt frame fails its product alone, the others are
    written with no device note; the job ends failed with the reason."""
    from astropy.io import fits
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, JobState, Product, ProductState
    from backend.settings import get_settings
    from backend.worker import reconcile, tasks

    monkeypatch.setenv("CPU_BATCH_SIZE", "2")
    settings, job_id, bad_frame_id = _gpu_job(sim, monkeypatch, corrupt=0, device="cpu")
    assert settings.cpu_batch_size == 2
    monkeypatch.setattr(reconcile, "send", lambda *a, **k: None)
    sent = []
    real_apply_async = tasks.calibrate_products_cpu_batch.apply_async

    def spy(*a, **k):
        sent.append((k.get("args"), k.get("queue")))
        return real_apply_async(*a, **k)

    monkeypatch.setattr(tasks.calibrate_products_cpu_batch, "apply_async", spy)
    r = tasks.run_job.apply(args=[job_id]).get()
    assert r == {"job_id": job_id, "planned": 3, "cpu_batches": 2}
    assert [q for _a, q in sent] == ["cpu", "cpu"] and [len(a[1]) for a, _q in sent] == [2, 1]
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.failed and (job.total, job.done, job.failed) == (3, 2, 1)
        prods = {p.frame_id: p for p in s.scalars(select(Product).where(Product.job_id == job_id))}
        bad = prods.pop(bad_frame_id)
        assert bad.state == ProductState.failed and bad.error and bad.error in job.error
        for p in prods.values():
            assert p.state == ProductState.written and Path(p.path).is_file()
            with fits.open(p.path) as hdul:
                assert hdul[0].header["BACKEND"] == "numpy"
                assert not any("device gpu requested" in str(x) for x in hdul[0].header["HISTORY"])
    get_settings.cache_clear()

@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a CUDA GPU (none here)")
def test_cupy_batch_matches_numpy(sim):
    out, res = sim
    ex = BatchExecutor("cupy")
    outs = ex.run(_items(out, res.frames))
    assert all(o.ok and o.backend == "cupy" for o in outs), [o.error for o in outs]
    for frame, o in zip(res.frames, outs):
        cpu = _per_frame(out, frame)
        good = (cpu.dq == 0) & np.isfinite(cpu.data) & np.isfinite(o.result.data)
        a, b = cpu.data[good].astype(np.float64), o.result.data[good].astype(np.float64)
        rel = np.abs(b - a) / np.maximum(np.abs(a), 1e-6 * np.abs(a).max())
        assert np.median(rel) < 1e-6 and np.percentile(rel, 99.9) < 1e-4
        assert np.mean(cpu.dq != o.result.dq) < 1e-3
        assert o.result.header["BACKEND"] == "cupy"
    # the second batch finds every master resident
    uploads = ex.masters.uploads
    ex.run(_items(out, res.frames))
    assert ex.masters.uploads == uploads


class _FakeCuda:
    """A stand-in for the few CuPy calls of ``_CupyTransfer`` (NumPy arrays as "device"
    arrays, streams and events that log what is asked of them), to check the executor's
    stream/event protocol where no GPU exists. It checks the calls, not CUDA itself."""

    def __init__(self):
        import threading
        import types

        self.log: list[tuple] = []
        self.tls = threading.local()
        fake = self

        class Stream:
            def __init__(self, non_blocking=False):
                assert non_blocking, "streams must not synchronise with the legacy null stream"

            def __enter__(self):
                fake.tls.current = self
                return self

            def __exit__(self, *exc):
                fake.tls.current = None

            def wait_event(self, event):
                fake.log.append(("wait", self, event))

            def synchronize(self):
                fake.log.append(("stream-sync", self))

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                pass

            def record(self, stream=None):
                fake.log.append(("record", self, stream))

            def synchronize(self):
                fake.log.append(("event-sync", self))

        class DeviceArray(np.ndarray):
            def set(self, arr, stream=None):
                assert isinstance(arr, _Pinned), "host-to-device copies must come from pinned memory"
                assert stream is not None, "the copy must be asynchronous, on the copy stream"
                fake.log.append(("set", self, stream))
                np.copyto(self, arr)

        class _Pinned(np.ndarray):
            pass

        class Device:
            mem_info = (80 * 2**30, 96 * 2**30)

            def synchronize(self):
                pass

        self.Stream, self.Event, self.DeviceArray = Stream, Event, DeviceArray
        self.cupy = types.SimpleNamespace(
            cuda=types.SimpleNamespace(Stream=Stream, Event=Event, Device=Device),
            empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
            asarray=lambda a: np.array(a),
        )
        self.cupyx = types.SimpleNamespace(empty_pinned=lambda shape, dtype: np.empty(shape, dtype).view(_Pinned))

    def import_module(self, name):
        return {"cupy": self.cupy, "cupyx": self.cupyx}[name]


def test_stream_and_event_protocol_of_the_cupy_transfer(sim, monkeypatch):
    """With a logging stand-in for CuPy: every frame's copy waits for the last compute on its
    device buffer, goes through pinned memory on the copy stream, and every compute runs on
    its lane's stream after waiting for its frame's copy; products equal per-frame ones."""
    import types

    from pipelines.calibration.l2 import batch

    out, res = sim
    fake = _FakeCuda()
    monkeypatch.setattr(batch, "importlib", types.SimpleNamespace(import_module=fake.import_module))
    monkeypatch.setattr(batch, "resolve_namespace", lambda name: __import__("array_api_compat").numpy)
    computes = []
    real = batch.calibrate_frame
    real_decode = batch.device.decode_stored
    decoded = []

    def decode_spy(words):  # the frame's first compute: it reads the device buffer (16-bit words)
        assert words.dtype == np.uint16
        fake.log.append(("compute", getattr(fake.tls, "current", None), words))
        out = real_decode(np.asarray(words))
        decoded.append(out)
        return out

    def spy(data, header, cals, opts, *, backend, quicklook_size=None):
        assert any(data is d for d in decoded)  # the lane decoded the words it waited for
        computes.append((getattr(fake.tls, "current", None), data))
        return real(np.asarray(data), header, cals, opts, backend=backend, quicklook_size=quicklook_size)

    monkeypatch.setattr(batch, "calibrate_frame", spy)
    monkeypatch.setattr(batch.device, "decode_stored", decode_spy)
    ex = BatchExecutor("numpy", lanes=2)
    tr = batch._CupyTransfer(ex.lanes, ex.nslots)
    ex.transfer = tr
    ex.masters = DeviceMasters(tr.upload, tr.default_master_bytes())
    assert ex.masters.max_bytes == batch.DEFAULT_DEVICE_MASTER_BYTES  # min(8 GiB, 96 GiB / 4)
    frames = list(res.frames)  # two shapes
    outs = ex.run(_items(out, frames))
    assert all(o.ok for o in outs), [o.error for o in outs]
    for f, o in zip(frames, outs):
        _same(o.result, _per_frame(out, f))

    slots = list(tr._slots.values())
    assert len(slots) == ex.nslots * len(SIZES)  # lanes + 1 buffers per frame shape, reused
    for s in slots:
        ops = [op for op in fake.log if (op[0] == "set" and op[1] is s.device)
               or (op[0] in ("wait", "record", "event-sync") and id(op[-1] if op[0] == "wait" else op[1]) in
                   (id(s.uploaded), id(s.done)))
               or (op[0] == "compute" and op[2] is s.device)]
        names = []
        for op in ops:
            if op[0] == "set":
                names.append("set")
            elif op[0] == "compute":
                names.append("compute")
            elif op[0] == "event-sync":
                names.append("sync-uploaded" if op[1] is s.uploaded else "sync-done")
            elif op[0] == "wait":
                who = "copy" if op[1] is tr.copy_stream else "lane"
                names.append(f"{who}-waits-{'uploaded' if op[2] is s.uploaded else 'done'}")
            else:
                who = "copy" if op[2] is tr.copy_stream else "lane"
                names.append(f"{who}-records-{'uploaded' if op[1] is s.uploaded else 'done'}")
        uses = names.count("set")
        assert uses >= 1
        cycle = ["sync-uploaded", "copy-waits-done", "set", "copy-records-uploaded", "lane-waits-uploaded",
                 "compute", "lane-records-done"]
        assert names == cycle * uses, names
    assert all(stream in tr.lane_streams for stream, _ in computes)
    assert len({id(s) for s, _ in computes}) == 2  # both lanes used
    assert ex.masters.uploads == sum(_expected_uploads(_masters(out, ch))[0] for ch in SIZES)


def test_a_broken_gpu_batch_fails_its_products_and_ends_the_job(sim, sqlite_env, eager, monkeypatch):
    """If the batch task breaks as a whole (a bug, not bad data), its unfinished products fail
    with the reason and the job ends failed at once instead of waiting for the reaper."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, JobState, Product, ProductState
    from backend.worker import gpu_batch
    from backend.worker import tasks

    _settings, job_id, _bad = _gpu_job(sim, monkeypatch, corrupt=None)

    def broken(*_a, **_k):
        raise RuntimeError("executor exploded")

    monkeypatch.setattr(tasks, "calibrate_products_batch", broken)
    from backend.broker import TaskName
    from backend.worker import reconcile

    follow_ups = []
    monkeypatch.setattr(reconcile, "send", lambda name, args=None, kwargs=None, queue="cpu":
                        follow_ups.append(kwargs) if name == TaskName.detect_events else None)
    tasks.run_job.apply(args=[job_id]).get()
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.failed and (job.done, job.failed) == (0, N_PER_CHANNEL)
        prods = list(s.scalars(select(Product).where(Product.job_id == job_id)))
        assert len(prods) == N_PER_CHANNEL
        assert all(p.state == ProductState.failed and p.error == "GPU batch failed: RuntimeError: executor exploded"
                   for p in prods)
    assert len(follow_ups) == 1


def test_numpy_executor_keeps_host_masters_alive_within_a_small_budget():
    # on NumPy the "resident" masters are the host arrays: bounded like a CPU worker's host
    # cache (about three full-size sets), not by the 8 GiB device budget
    from pipelines.calibration.l2 import batch

    assert BatchExecutor("numpy").masters.max_bytes == batch.HOST_MASTER_BYTES < batch.DEFAULT_DEVICE_MASTER_BYTES


def _limited_batches(monkeypatch, tasks, strikes):
    """Replace the batch service the batch tasks call: a call for which ``strikes(product_ids)``
    is true claims its products as the real one does, then meets the soft time limit before
    any is finished (the first is the one under way); the others run for real. Returns the
    list of the calls' product ids."""
    from celery.exceptions import SoftTimeLimitExceeded

    from backend.state import claim_product

    real = tasks.calibrate_products_batch
    calls = []

    def limited(session, product_ids, settings, *, holder=None, **kw):
        calls.append(list(product_ids))
        if strikes(product_ids):
            for pid in product_ids:
                assert claim_product(session, pid, lease_s=settings.lease_s, max_deliveries=settings.max_deliveries,
                                     holder=holder).status == "claimed"
            raise SoftTimeLimitExceeded()
        return real(session, product_ids, settings, holder=holder, **kw)

    monkeypatch.setattr(tasks, "calibrate_products_batch", limited)
    return calls


def test_a_batch_past_its_soft_time_limit_gives_its_products_back_and_they_are_written(sim, sqlite_env, eager,
                                                                                      monkeypatch):
    """The soft time limit is the batch's, not a frame's failure: the product being made when it
    struck goes back with its start counted, the batch's other unfinished products with theirs
    not counted, and all are sent again in a new batch message and written (before: the product
    under way failed with "batch reached its soft time limit", and the job with it)."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, JobState, Product, ProductState
    from backend.settings import get_settings
    from backend.worker import reconcile, tasks

    monkeypatch.setenv("CPU_BATCH_SIZE", "8")
    _settings, job_id, _bad = _gpu_job(sim, monkeypatch, corrupt=None, device="cpu")
    monkeypatch.setattr(reconcile, "send", lambda *a, **k: None)
    calls = _limited_batches(monkeypatch, tasks, lambda ids: len(calls) == 1)
    tasks.run_job.apply(args=[job_id]).get()
    assert len(calls) == 2 and calls[1] == calls[0]  # all sent again, in their order
    with session_scope() as s:
        job = s.get(Job, job_id)
        prods = {p.id: p for p in s.scalars(select(Product).where(Product.job_id == job_id))}
        assert all(p.state == ProductState.written for p in prods.values()), [p.error for p in prods.values()]
        # the one under way: two starts counted (the limit's and the write's); the others one
        assert [prods[pid].attempts for pid in calls[0]] == [2] + [1] * (len(calls[0]) - 1)
        assert job.state == JobState.succeeded and (job.done, job.failed) == (len(prods), 0)
    get_settings.cache_clear()


def test_a_product_a_batch_passes_its_soft_time_limit_on_every_delivery_ends_failed(sim, sqlite_env, eager,
                                                                                   monkeypatch):
    """Bounded: a frame that the batch is making each time its soft limit strikes is given back
    MAX_DELIVERIES - 1 times, then fails with a reason naming both settings; the batch's other
    products (their starts not counted) are written, and the job ends."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, JobState, Product, ProductState
    from backend.settings import get_settings
    from backend.worker import reconcile, tasks

    monkeypatch.setenv("CPU_BATCH_SIZE", "8")
    settings, job_id, _bad = _gpu_job(sim, monkeypatch, corrupt=None, device="cpu")
    assert settings.max_deliveries == 3
    monkeypatch.setattr(reconcile, "send", lambda *a, **k: None)
    poison: list[int] = []

    def strikes(ids):  # every batch the first product of the job leads
        if not poison:
            poison.append(ids[0])
        return ids[0] == poison[0]

    calls = _limited_batches(monkeypatch, tasks, strikes)
    tasks.run_job.apply(args=[job_id]).get()
    assert len(calls) == 4 and calls[0] == calls[1] == calls[2] and calls[3] == calls[0][1:], calls
    with session_scope() as s:
        job = s.get(Job, job_id)
        prods = {p.id: p for p in s.scalars(select(Product).where(Product.job_id == job_id))}
        bad = prods.pop(poison[0])
        assert bad.state == ProductState.failed and bad.attempts == 3
        assert bad.error.startswith("calibration passed the soft time limit of ") and \
            "(TASK_SOFT_TIME_LIMIT_S)" in bad.error and "delivery 3 of at most 3 (MAX_DELIVERIES)" in bad.error, \
            bad.error
        assert all(p.state == ProductState.written and p.attempts == 1 for p in prods.values())
        assert job.state == JobState.failed and (job.done, job.failed) == (len(prods), 1)
    get_settings.cache_clear()
