"""Manifests and re-runs (issue 12, item 5).

* the digests and the comparison on known arrays;
* a product's manifest holds every field with true values (hashes recomputed from the
  files, versions from importlib.metadata), also served by the API; a job's manifest;
* on a live stack (PostgreSQL, Redis db 12, a real ``lstdp worker``): a job submitted with a
  token, re-run through ``POST /jobs/{id}/rerun`` and ``lstdp rerun MANIFEST``, reproduces
  the data bit for bit (data sha256 and arrays); a master whose bytes changed under the
  same id is refused by sha256; a lost re-run message is re-sent by the reconciler; no
  token appears in any manifest or in the worker's log.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from sqlalchemy import select

from backend import __version__
from backend.models import CalibrationFile, Frame, Job, JobItem, JobState, Product, ProductState, RerunItem
from backend.services.manifests import TOLERANCE, array_digests, compare_arrays, product_digests
from pipelines.fitsio import sha256_file
from pipelines.products import read_product
from tests.conftest import make_token
from tests.live import ingest_simulated, live_stack, wait_job

REDIS_DB = 12


@pytest.fixture(scope="module")
def sim_dir(simulated_dataset):
    return simulated_dataset(naxis=128, noise=True, seed=3).out_dir  # shared, read-only


# -- pure ----------------------------------------------------------------------------------


def test_array_digests_cover_every_bit_dtype_and_shape():
    rng = np.random.default_rng(1)
    data = rng.normal(size=(8, 6)).astype(np.float32)
    dq = (rng.random((8, 6)) > 0.9).astype(np.uint8)
    d = array_digests(data, dq)
    assert d == array_digests(data.astype(">f4"), dq)  # byte order does not matter, values do
    assert d["uncertainty"] is None and len(d["data"]) == len(d["dq"]) == 64
    bumped = data.copy()
    bumped.view(np.uint32)[3, 2] ^= 1  # one ulp
    assert array_digests(bumped, dq)["data"] != d["data"]
    assert array_digests(data, dq)["dq"] != array_digests(data, dq ^ np.eye(8, 6, dtype=np.uint8))["dq"]
    assert array_digests(data.reshape(6, 8), dq)["data"] != d["data"]  # same bytes, other shape


def test_compare_arrays_verdicts():
    rng = np.random.default_rng(2)
    a = (rng.random((64, 64)) * 100 + 1).astype(np.float32)
    dq = np.zeros(a.shape, np.uint8)
    same = compare_arrays(a, dq, a.copy(), dq.copy(), same_backend=True)
    assert same["verdict"] == "identical" and same["max_abs_diff"] == 0 and same["n_differing"] == 0
    b = a.copy()
    b[10, 10] = np.nextafter(b[10, 10], np.float32(np.inf))  # one float32 rounding step
    off = compare_arrays(a, dq, b, dq, same_backend=True)
    assert off["verdict"] == "differs" and off["n_differing"] == 1  # one backend: only bit for bit passes
    assert off["max_abs_diff"] == pytest.approx(float(b[10, 10]) - float(a[10, 10]))
    gpu = compare_arrays(a, dq, b, dq, same_backend=False)
    assert gpu["verdict"] == "within_tolerance" and gpu["tolerance"] == TOLERANCE["across_backends"]
    far = a * np.float32(1.001)
    assert compare_arrays(a, dq, far, dq, same_backend=False)["verdict"] == "differs"
    nan = a.copy()
    nan[0, 0] = np.nan
    assert compare_arrays(nan, dq, nan.copy(), dq, same_backend=True)["verdict"] == "identical"
    with pytest.raises(ValueError, match="shape"):
        compare_arrays(a, dq, a[:2], dq[:2], same_backend=True)


# -- manifests in this process ---------------------------------------------------------------


def _versions(*names):
    out = {}
    for n in names:
        dist = {"opencv": next(iter(metadata.packages_distributions().get("cv2", ["opencv-python"])))}.get(n, n)
        try:
            out[n] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def recipe_digests(path) -> tuple[list[tuple[int, str, str]], str]:
    """The manifest digests of the FITS file ``path`` recomputed as README.md's recipe says
    (written out here, independently of ``backend.services.manifests``)."""
    import hashlib

    hdus = []
    with fits.open(path) as hdul:
        for i, hdu in enumerate(hdul):
            if hdu.data is None:
                hex_ = hashlib.sha256(b"").hexdigest()
            else:
                a = np.asarray(hdu.data)
                a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder(">")))
                hex_ = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()
            hdus.append((i, hdu.name, hex_))
    total = hashlib.sha256("".join(f"{i} {name} {hex_}\n" for i, name, hex_ in hdus).encode()).hexdigest()
    return hdus, total


def test_product_digests_cover_every_hdu_as_the_readme_says(tmp_path):
    """Issue 24: the digest covers data, UNCERT, DQ and any other HDU, in file order, as the
    README's recipe recomputes it from the file; a change to UNCERT alone changes it."""
    from backend.services.manifests import product_digests

    rng = np.random.default_rng(3)
    data = rng.normal(size=(6, 8)).astype(np.float32)
    data[0, 0] = np.nan
    sigma = np.abs(rng.normal(size=(6, 8))).astype(np.float32)
    dq = (rng.random((6, 8)) < 0.2).astype(np.uint8)
    hdul = fits.HDUList([fits.PrimaryHDU(data), fits.ImageHDU(sigma, name="UNCERT"), fits.ImageHDU(dq, name="DQ"),
                         fits.ImageHDU(np.arange(12, dtype=np.int16).reshape(3, 4), name="EXTRA"),
                         fits.ImageHDU(name="EMPTY")])
    path = tmp_path / "p.fits"
    hdul.writeto(path)
    mem = product_digests(hdul)
    with fits.open(path) as h:
        assert product_digests(h) == mem  # in memory (as written) and read back: the same
    hdus, total = recipe_digests(path)
    assert [(h["index"], h["name"], h["sha256"]) for h in mem["hdus"]] == hdus and mem["all"] == total
    assert [n for _, n, _ in hdus] == ["PRIMARY", "UNCERT", "DQ", "EXTRA", "EMPTY"]
    assert (mem["data"], mem["uncertainty"], mem["dq"]) == (hdus[0][2], hdus[1][2], hdus[2][2])
    old = array_digests(data, dq)  # the data/dq digests of older manifests: unchanged
    assert (mem["data"], mem["dq"]) == (old["data"], old["dq"])
    bumped = sigma.copy()
    bumped[3, 4] = np.nextafter(bumped[3, 4], np.float32(np.inf))
    other = product_digests(fits.HDUList([fits.PrimaryHDU(data), fits.ImageHDU(bumped, name="UNCERT"),
                                          fits.ImageHDU(dq, name="DQ")]))
    assert other["uncertainty"] != mem["uncertainty"] and other["data"] == mem["data"] and other["all"] != mem["all"]
    extra = fits.HDUList([*hdul[:4], fits.ImageHDU(np.ones((2, 2), np.float32), name="EMPTY")])
    assert product_digests(extra)["all"] != mem["all"]  # any other HDU counts too


def _check_product_manifest(m: dict, prod: Product, frame: Frame, cal_rows: list[CalibrationFile]) -> None:
    """Every field of a product manifest, against values recomputed from the files."""
    from pipelines.calibration.l2.options import CalibrationOptions

    assert m["schema"] == "lstdp.product-manifest/1"
    assert m["input"]["frame_id"] == frame.id and m["input"]["original_name"] == frame.original_name
    assert m["input"]["sha256"] == sha256_file(frame.path) == frame.sha256
    assert m["calibration_set"]["id"] == prod.calibration_set_id is not None
    files = {f["id"]: f for f in m["calibration_set"]["files"]}
    assert set(files) == {c.id for c in cal_rows} and len(files) >= 3
    for c in cal_rows:
        assert files[c.id]["kind"] == c.kind.value and files[c.id]["version"] == c.version
        assert files[c.id]["sha256"] == sha256_file(c.path) == c.sha256
    assert set(m["options"]) == set(CalibrationOptions.model_fields)  # every option, defaults included
    assert m["options"] == CalibrationOptions(**(prod.parameters.get("options") or {})).model_dump(mode="json")
    assert m["software"] == {"name": "lstdp", "version": __version__}
    deps = m["dependencies"]
    assert deps["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {k: deps[k] for k in ("numpy", "scipy", "astropy", "sunpy", "opencv")} == \
        _versions("numpy", "scipy", "astropy", "sunpy", "opencv")
    assert deps["numpy"] == np.__version__ and "cupy" not in deps  # CPU-made: cupy not used
    with fits.open(prod.path) as h:
        backend = h[0].header["BACKEND"]
    assert m["backend"] == {"array_backend": backend, "device": "CPU", "header_keyword": "BACKEND"}
    assert backend == "numpy"
    assert m["product"]["id"] == prod.id and m["product"]["sha256"] == sha256_file(prod.path) == prod.sha256
    data, dq, _ = read_product(prod.path)
    got = m["product"]["data_sha256"]
    assert (got["data"], got["dq"]) == (array_digests(data, dq)["data"], array_digests(data, dq)["dq"])
    hdus, total = recipe_digests(prod.path)  # the README's recipe, every HDU (issue 24)
    assert [h["name"] for h in got["hdus"]] == ["PRIMARY", "UNCERT", "DQ"]
    assert [(h["index"], h["name"], h["sha256"]) for h in got["hdus"]] == hdus and got["all"] == total
    assert got["uncertainty"] == hdus[1][2] and got["data"] == hdus[0][2] and got["dq"] == hdus[2][2]
    assert m["tolerance"] == TOLERANCE and "test_gpu_batch" in m["tolerance"]["basis"]
    assert m["tolerance"]["across_backends"]["p999_rel"] == 1e-4
    assert m["rerun"]["cli"].endswith(f"lstdp rerun product-{prod.id}.json")
    assert m["rerun"]["product_manifest"] == f"/api/v1/products/{prod.id}/manifest"


def test_product_manifest_holds_true_values(sqlite_env, sim_dir):
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.db import session_scope
    from backend.worker.processing import calibrate_product, plan_product

    ingest_simulated(sim_dir)
    with session_scope() as s:
        frame = s.scalars(select(Frame).where(Frame.channel_code == "SDI").order_by(Frame.date_obs)).first()
        prod, _ = plan_product(s, frame, pinned=None, options={"interpolation_order": 1}, job_id=None)
        s.commit()
        pid = prod.id
    with session_scope() as s:
        prod = calibrate_product(s, pid, sqlite_env)
        assert prod.state == ProductState.written, prod.error
        _check_product_manifest(prod.manifest, prod, prod.frame, list(prod.calibration_files))
        assert prod.manifest["options"]["interpolation_order"] == 1
        manifest = prod.manifest
    with session_scope() as s:  # the product's set (non-default options, no owner) is an admin's to see
        admin = make_token(s, "ops", ("admin",))
        s.commit()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        assert c.get(f"/api/v1/products/{pid}/manifest").status_code == 404  # not public
        c.headers["Authorization"] = f"Bearer {admin}"
        r = c.get(f"/api/v1/products/{pid}/manifest")
        assert r.status_code == 200 and r.json() == manifest
        assert c.get("/api/v1/products/999999/manifest").status_code == 404


# -- the live stack ----------------------------------------------------------------------------


@pytest.fixture
def stack(settings_env, tmp_path, sim_dir):
    with live_stack(settings_env, tmp_path, redis_db=REDIS_DB) as st:
        ingest_simulated(sim_dir)
        yield st


def _token(user: str) -> str:
    from backend.db import session_scope

    with session_scope() as s:
        token = make_token(s, user, ("jobs:submit", "jobs:cancel"))
        s.commit()
    return token


def _calibrate_via_api(client, token: str) -> str:
    r = client.post("/api/v1/jobs", json={"channels": ["SDI"], "start": "2004-03-01T00:00:00Z",
                                          "end": "2004-03-01T02:30:00Z"},
                    headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 202, r.text
    job = wait_job(r.json()["id"])
    assert job.state == JobState.succeeded and job.done == 3, job.error
    return job.id


def _rerun_items(job_id: str) -> list[RerunItem]:
    from backend.db import session_scope

    with session_scope() as s:
        rows = list(s.scalars(select(RerunItem).where(RerunItem.job_id == job_id).order_by(RerunItem.frame_id)))
        for r in rows:
            s.expunge(r)
    return rows


def test_rerun_on_a_worker_reproduces_bit_for_bit_and_refuses_a_changed_master(stack):
    from backend.db import session_scope

    token = _token("alice")
    with stack.client(Authorization=f"Bearer {token}") as c:  # alice's job is hers: others get 404
        job_id = _calibrate_via_api(c, token)
        assert c.get(f"/api/v1/jobs/{job_id}/manifest", headers={"Authorization": ""}).status_code == 404
        # the job's manifest: its request, its set, its products' manifests, no token anywhere
        jm = c.get(f"/api/v1/jobs/{job_id}/manifest")
        assert jm.status_code == 200, jm.text
        jm = jm.json()
        assert jm["request"]["channels"] == ["SDI"] and jm["job"]["owner"] == "alice"
        assert len(jm["products"]) == 3 and all(p["manifest"] for p in jm["products"])
        assert [s["id"] for s in jm["calibration_sets"]] == \
            sorted({p["manifest"]["calibration_set"]["id"] for p in jm["products"]})
        assert jm["rerun"]["api"]["path"] == f"/api/v1/jobs/{job_id}/rerun"
        with session_scope() as s:
            prods = {p.frame_id: p for p in s.scalars(select(Product).join(JobItem, JobItem.product_id == Product.id)
                                                      .where(JobItem.job_id == job_id))}
            for p in prods.values():
                _check_product_manifest(p.manifest, p, p.frame, list(p.calibration_files))
                s.expunge(p)

        # anonymous re-runs are refused; the owner's is accepted
        assert c.post(f"/api/v1/jobs/{job_id}/rerun", headers={"Authorization": ""}).status_code == 401
        r = c.post(f"/api/v1/jobs/{job_id}/rerun", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202, r.text
        assert r.headers["Location"] == f"/api/v1/jobs/{r.json()['id']}"
        rerun = wait_job(r.json()["id"])
        assert rerun.state == JobState.succeeded, rerun.error
        assert (rerun.kind, rerun.rerun_of, rerun.owner, rerun.total, rerun.done) == ("rerun", job_id, "alice", 3, 3)
        for item in _rerun_items(rerun.id):
            orig = prods[item.frame_id]
            assert item.verdict == "identical" and item.backend == "numpy"
            assert item.data_sha256 == orig.manifest["product"]["data_sha256"]
            assert item.comparison["max_abs_diff"] == 0.0 and item.comparison["n_differing"] == 0
            assert Path(item.path).is_file() and not Path(item.path).is_relative_to(stack.settings.products)
            a_data, a_dq, _ = read_product(orig.path)
            b_data, b_dq, _ = read_product(item.path)
            assert np.array_equal(a_data.view(np.uint32), b_data.view(np.uint32)) and np.array_equal(a_dq, b_dq)
            assert {k: v for k, v in array_digests(b_data, b_dq).items() if v} == \
                {k: item.data_sha256[k] for k in ("data", "dq")}
            with fits.open(item.path) as rerun_file:  # every HDU, UNCERT included, as the manifest's recipe
                assert product_digests(rerun_file) == item.data_sha256
            assert sha256_file(item.path) != orig.sha256  # the files differ (DATE, CHECKSUM), the data do not
        # the job JSON carries the results
        body = c.get(f"/api/v1/jobs/{rerun.id}").json()
        assert body["rerun_of"] == job_id and [x["verdict"] for x in body["rerun_results"]] == ["identical"] * 3
        rm = c.get(f"/api/v1/jobs/{rerun.id}/manifest").json()
        assert [x["verdict"] for x in rm["rerun_results"]] == ["identical"] * 3

        # lstdp rerun with a product manifest file, on the same worker
        pid = next(iter(prods.values())).id
        mfile = stack.tmp / f"product-{pid}.json"
        mfile.write_text(c.get(f"/api/v1/products/{pid}/manifest").text)
        out = subprocess.run([sys.executable, "-m", "backend.cli", "rerun", str(mfile), "--json", "--timeout", "180"],
                             env=os.environ.copy(), capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        report = json.loads(out.stdout)
        assert report["state"] == "succeeded"
        assert [(f["product_id"], f["verdict"]) for f in report["frames"]] == [(pid, "identical")]

        # a master whose bytes changed under the same id (the registry still has the old sha256)
        flat = next(f for f in prods[min(prods)].manifest["calibration_set"]["files"] if f["kind"] == "flat")
        with session_scope() as s:
            path = s.get(CalibrationFile, flat["id"]).path
        with fits.open(path) as h:
            hdus = fits.HDUList([x.copy() for x in h])
        img = next(x for x in hdus if x.data is not None and getattr(x.data, "ndim", 0) == 2)
        img.data = (img.data * np.float32(1.01)).astype(img.data.dtype)
        hdus.writeto(path, overwrite=True, checksum=True)
        r = c.post(f"/api/v1/jobs/{job_id}/rerun", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202, r.text
        refused = wait_job(r.json()["id"])
        assert refused.state == JobState.failed and (refused.done, refused.failed) == (0, 3)
        for item in _rerun_items(refused.id):
            assert item.verdict is None and item.path is None
            assert f"calibration file {flat['id']} (flat v{flat['version']}" in item.reason
            assert f"the manifest says {flat['sha256'][:16]}" in item.reason and "refusing" in item.reason
        assert "sha256" in refused.error
        # another user's (private) job and a bad id are both 404
        other = _token("bob")
        assert c.post("/api/v1/jobs/nope/rerun", headers={"Authorization": f"Bearer {other}"}).status_code == 404
        assert c.post(f"/api/v1/jobs/{job_id}/rerun", headers={"Authorization": f"Bearer {other}"}).status_code == 404

        # tokens never appear in manifests, job JSON, or the worker's log
        texts = [json.dumps(jm), json.dumps(rm), c.get(f"/api/v1/jobs/{refused.id}/manifest").text,
                 json.dumps(body), stack.worker_log(tail=10**7)]
        texts += [c.get(f"/api/v1/products/{p.id}/manifest").text for p in prods.values()]
        for t in texts:
            assert token not in t and other not in t and token[:12] not in t


def test_a_lost_rerun_message_is_sent_again_by_the_reconciler(stack):
    from backend.db import session_scope
    from backend.models import utcnow
    from backend.services.reruns import specs_from_job, submit_rerun
    from backend.worker.reconcile import reconcile_once
    from backend.worker.rerun import plan_rerun

    token = _token("carol")
    with stack.client() as c:
        job_id = _calibrate_via_api(c, token)
    with session_scope() as s:
        job = submit_rerun(s, specs_from_job(s, s.get(Job, job_id)), owner="carol", rerun_of=job_id, source="job",
                           enqueue=False)
        rerun_id = job.id
    with session_scope() as s:  # planned, but its three rerun_frame messages are "lost" (never sent)
        frames = plan_rerun(s, rerun_id)
    assert len(frames) == 3
    with session_scope() as s:
        assert s.get(Job, rerun_id).state == JobState.running
        report = reconcile_once(s, stack.settings, now=utcnow() + dt.timedelta(seconds=120))
    assert sorted(report.reruns_resent) == sorted(f"{rerun_id}:{f}" for f in frames)
    done = wait_job(rerun_id)
    assert done.state == JobState.succeeded and (done.done, done.failed) == (3, 0)
    assert [r.verdict for r in _rerun_items(rerun_id)] == ["identical"] * 3
    assert all(r.attempts == 1 for r in _rerun_items(rerun_id))  # each frame computed once
    with session_scope() as s:  # a second pass finds nothing to send
        again = reconcile_once(s, stack.settings, now=utcnow() + dt.timedelta(seconds=120))
    assert again.reruns_resent == []


def test_rerun_errors(sqlite_env, sim_dir):
    """A job with nothing written is 409, someone else's private job 404, no scope 403."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.db import session_scope

    with session_scope() as s:
        empty = Job(owner="dave", kind="calibrate", parameters={"channels": ["SDI"]}, state=JobState.succeeded)
        s.add(empty)
        s.commit()
        empty_id = empty.id
        dave = make_token(s, "dave", ("jobs:submit",))
        reader = make_token(s, "erin", ("jobs:cancel",))
        s.commit()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        r = c.post(f"/api/v1/jobs/{empty_id}/rerun", headers={"Authorization": f"Bearer {dave}"})
        assert r.status_code == 409 and "no written product" in r.json()["detail"]
        r = c.post(f"/api/v1/jobs/{empty_id}/rerun", headers={"Authorization": f"Bearer {reader}"})
        assert r.status_code == 403 and "jobs:submit" in r.json()["detail"]
        assert c.get("/api/v1/jobs/nope/manifest").status_code == 404
        assert c.get(f"/api/v1/jobs/{empty_id}/manifest").status_code == 404  # dave's: not anonymous's
        m = c.get(f"/api/v1/jobs/{empty_id}/manifest", headers={"Authorization": f"Bearer {dave}"}).json()
        assert m["products"] == [] and m["request"] == {"channels": ["SDI"]}


def test_the_gpu_batch_path_records_manifests_too(sqlite_env, sim_dir):
    """Products of a ``device: gpu`` batch (here on a worker without a GPU: NumPy) carry the
    same manifest, naming the backend that actually computed them."""
    from backend.db import session_scope
    from backend.worker.gpu_batch import calibrate_products_batch
    from backend.worker.processing import plan_product
    from pipelines.calibration.l2.batch import BatchExecutor

    ingest_simulated(sim_dir)
    with session_scope() as s:
        frames = list(s.scalars(select(Frame).where(Frame.channel_code == "SDI").order_by(Frame.date_obs)))[:2]
        ids = [plan_product(s, f, pinned=None, options={"device": "gpu"}, job_id=None)[0].id for f in frames]
        s.commit()
    with session_scope() as s:
        report = calibrate_products_batch(s, ids, sqlite_env, executor=BatchExecutor("numpy"))
        assert sorted(report.written) == sorted(ids), report.failed
        for pid in ids:
            prod = s.get(Product, pid)
            _check_product_manifest(prod.manifest, prod, prod.frame, list(prod.calibration_files))
            assert prod.manifest["options"]["device"] == "gpu"  # asked for; computed by NumPy, and it says so
            assert any("device gpu requested" in line for line in prod.header["HISTORY"])
