"""Job requests: strict options, bounded values, and what makes a product the same."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.models import Job
from backend.services.jobs import JobRequest
from pipelines.calibration.l2.options import CalibrationOptions
from backend.services.registry import params_hash

pytestmark = pytest.mark.postgres

BASE = {"channels": ["SDI"], "start": "2004-03-01T00:00:00", "end": "2004-03-02T00:00:00"}


@pytest.fixture
def client(api_client):
    return api_client


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"options": {"bogus": [1, 2]}}, "bogus"),
        ({"options": {"deconvolve_psf": "yes"}}, "deconvolve_psf"),
        ({"options": {"interpolation_order": 9}}, "interpolation_order"),
        ({"options": {"device": "tpu"}}, "device"),
        ({"options": {"resample": "bicubic"}}, "resample"),
        ({"options": {"resample": "opencv-cubic", "interpolation_order": 1}}, "interpolation_order"),
        ({"start": "9999-12-31T23:00:00-05:00"}, "out of range"),
        ({"start": "0001-01-01T00:00:00+05:00"}, "out of range"),
        ({"pinned_calibrations": {"flat": 99999999999999999999999}}, "between 1 and"),
        # a key misplaced or misnamed at the top level is refused, not dropped (it would run
        # another job than the one asked for)
        ({"device": "gpu"}, "device"),
        ({"pins": {"flat": 2}}, "pins"),
    ],
)
def test_bad_options_and_values_are_422(client, db_session, extra, needle):
    r = client.post("/api/v1/jobs", json={**BASE, **extra})
    assert r.status_code == 422, r.text
    assert needle in r.text
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0


def test_gpu_device_is_refused_in_the_embedded_mode(client, db_session):
    r = client.post("/api/v1/jobs", json={**BASE, "options": {"device": "gpu"}})
    assert r.status_code in (400, 422) and "GPU workers" in r.json()["detail"]
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0


def test_psf_deconvolution_needs_a_psf_master(client, db_session):
    r = client.post("/api/v1/jobs", json={**BASE, "options": {"deconvolve_psf": True}})
    assert r.status_code in (400, 422) and "psf calibration" in r.json()["detail"]


@pytest.mark.parametrize("source", ["profile", "map"])
def test_a_stray_light_representation_without_its_master_is_refused(client, db_session, source):
    body = {**BASE, "channels": ["SCI-UV"], "options": {"stray_light_source": source}}
    r = client.post("/api/v1/jobs", json=body)
    assert r.status_code in (400, 422) and f"STRAYTYP='{source.upper()}'" in r.json()["detail"], r.text
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0
    # the disk channels have no stray light to choose: the option does not stop their jobs
    r = client.post("/api/v1/jobs", json={**body, "channels": ["SDI"]})
    assert "STRAYTYP" not in r.text, r.text


def test_spelled_out_defaults_identify_the_same_product():
    explicit = CalibrationOptions(rotate_north_up=True, subtract_stray_light=True, interpolation_order=3, device="cpu")
    assert params_hash(explicit.identity()) == params_hash(CalibrationOptions().identity()) == params_hash({})
    assert params_hash(CalibrationOptions(interpolation_order=1).identity()) != params_hash({})
    req = JobRequest(**BASE, options={"remove_cosmic_rays": True})
    assert req.options.identity() == {"remove_cosmic_rays": True}


def test_masters_stay_resident_and_are_checked_against_the_registry(tmp_path):
    from types import SimpleNamespace

    from backend.models import CalibrationKind
    from backend.worker.processing import resident_master
    from pipelines.errors import DataError
    from pipelines.fitsio import sha256_file
    from tests.test_ingest import cal_master

    path = cal_master(tmp_path / "flat_v1.fits")
    row = SimpleNamespace(id=7, version=1, path=str(path), sha256=sha256_file(path), kind=CalibrationKind.flat)
    first = resident_master(row)
    assert resident_master(row) is first and (first.id, first.version) == (7, 1)
    other = cal_master(tmp_path / "flat_v2.fits", version=2)
    stale = SimpleNamespace(id=8, version=2, path=str(other), sha256="0" * 64, kind=CalibrationKind.flat)
    with pytest.raises(DataError, match="changed on disk"):
        resident_master(stale)
