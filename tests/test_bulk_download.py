"""Bulk download (streamed tar with its manifest, curl/wget script), the job form's API
(estimate, options), the products' job filter, and the static files' caching and gzip.

On real PostgreSQL (per-test rollback) through the API, with the factories of
tests/test_api.py; the product files live in the temporary product store, one of them the
bytes of a real SWAP/PROBA2 FITS file of the sample data (2.1 MB: several chunks).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import re
import shutil
import tarfile

import pytest

from backend.models import CalibrationKind, ItemOutcome, Job, JobItem, JobState, ProductCalibrationFile, ProductState
from backend.services import bulk
from tests.conftest import SAMPLE
from tests.test_api import MIN, T0, assert_error, client, make_calibration, make_event, make_frame, make_product
from tests.test_api import settings  # noqa: F401 - fixture used by client

pytestmark = pytest.mark.postgres
__all__ = ["client"]

REAL_FITS = SAMPLE / "full-disk" / "swap_lv1_20120101_001607.fits"


@pytest.fixture
def products(db_session, settings):  # noqa: F811 - the fixture of tests/test_api.py
    """Two SDI products (one a real FITS file, calibrated with two registry files), one WST,
    one SDI product whose file was deleted, and one failed SCI-UV product."""
    store = settings.products
    dark = make_calibration(db_session, "SDI", CalibrationKind.dark, 3)
    flat = make_calibration(db_session, "SDI", CalibrationKind.flat, 2)
    out = {}
    f1 = make_frame(db_session, "SDI", T0)
    out["sdi_real"] = p = make_product(db_session, f1, store / "SDI")
    real = store / "SDI" / "lst_sdi_l2_real_v1.fits"
    shutil.copyfile(REAL_FITS, real)
    p.path, p.sha256 = str(real), hashlib.sha256(real.read_bytes()).hexdigest()
    db_session.add_all([ProductCalibrationFile(product_id=p.id, calibration_file_id=dark.id),
                        ProductCalibrationFile(product_id=p.id, calibration_file_id=flat.id)])
    out["sdi"] = make_product(db_session, make_frame(db_session, "SDI", T0 + 10 * MIN), store / "SDI", version=2)
    out["wst"] = make_product(db_session, make_frame(db_session, "WST", T0 + 5 * MIN), store / "WST")
    out["gone"] = gone = make_product(db_session, make_frame(db_session, "SDI", T0 + 20 * MIN), store / "SDI")
    from pathlib import Path

    Path(gone.path).unlink()
    out["failed"] = make_product(db_session, make_frame(db_session, "SCI-UV", T0 + 15 * MIN), None,
                                 state=ProductState.failed)
    out["failed"].error = "no flat valid at DATE-OBS"
    db_session.flush()
    out["calibrations"] = (dark, flat)
    return out


def _read_tar(content: bytes, mode: str = "r:") -> tuple[dict[str, bytes], dict]:
    with tarfile.open(fileobj=io.BytesIO(content), mode=mode) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return members, json.loads(members["MANIFEST.json"])


def test_archive_holds_every_fits_and_a_manifest_whose_sha256_match(client, products):
    r = client.get("/api/v1/products/archive", params={"start": "2024-05-14T15:00:00Z", "end": "2024-05-14T17:00Z"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    assert re.fullmatch(r'attachment; filename="lst_products_\d{8}T\d{6}Z\.tar"', r.headers["content-disposition"])
    assert "content-length" not in r.headers  # streamed, not built whole
    members, man = _read_tar(r.content)
    fits_names = sorted(n for n in members if n.endswith(".fits"))
    written = [products[k] for k in ("sdi_real", "sdi", "wst")]
    assert len(fits_names) == 3 and (man["files"], man["missing"], man["total_matching"]) == (3, 1, 4)
    rows = {row["product_id"]: row for row in man["products"]}
    for p in written:
        row = rows[p.id]
        data = members[row["name"]]
        assert row["status"] == "sent" and row["size"] == len(data)
        assert row["sha256"] == hashlib.sha256(data).hexdigest() == p.sha256
        assert row["sha256_matches_stored"] is True and row["version"] == p.version
    real = rows[products["sdi_real"].id]
    assert members[real["name"]] == REAL_FITS.read_bytes()  # 2.1 MB: three chunks, byte for byte
    assert real["channel"] == "SDI" and real["date_obs"] == "2024-05-14T16:00:00Z"
    dark, flat = products["calibrations"]
    assert real["calibrations"] == [{"id": dark.id, "kind": "dark", "version": 3},
                                    {"id": flat.id, "kind": "flat", "version": 2}]
    # the deleted file is listed, with its reason, not dropped
    gone = rows[products["gone"].id]
    assert gone["status"] == "missing" and gone["name"] not in members and gone["sha256"] is None
    assert "file missing from the product store" in gone["reason"]
    assert r.headers["x-archive-files"] == "3" and r.headers["x-archive-missing"] == "1"
    # SHA256SUMS lists exactly the files sent, in the format of sha256sum -c
    sums = dict(reversed(line.split("  ", 1)) for line in members["SHA256SUMS"].decode().splitlines())
    assert sums == {n: hashlib.sha256(members[n]).hexdigest() for n in fits_names}
    assert man["query"] == {"start": "2024-05-14T15:00:00+00:00", "end": "2024-05-14T17:00:00+00:00",
                            "state": "written"}
    assert [row["date_obs"] for row in man["products"]] == sorted(row["date_obs"] for row in man["products"])


def test_archive_filters_states_formats_and_the_failed_reason(client, products):
    r = client.get("/api/v1/products/archive", params={"channel": "sci-uv", "state": "any", "format": "tar.gz"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    members, man = _read_tar(r.content, "r:gz")
    assert sorted(members) == ["MANIFEST.json", "SHA256SUMS"] and members["SHA256SUMS"] == b""
    (row,) = man["products"]
    assert row["status"] == "missing" and row["state"] == "failed"
    assert row["reason"] == "product is failed, its file is not written (no flat valid at DATE-OBS)"
    r = client.get("/api/v1/products/archive", params={"channel": "WST"})
    members, man = _read_tar(r.content)
    assert [n for n in members if n.endswith(".fits")] == [f"WST/lst_wst_l2_{products['wst'].frame_id}_v1.fits"]
    assert_error(client.get("/api/v1/products/archive", params={"format": "zip7"}), 422, "format")
    assert_error(client.get("/api/v1/products/archive", params={"state": "lost"}), 422, "state")
    assert_error(client.get("/api/v1/products/archive", params={"start": "2024-05-15", "end": "2024-05-14"}), 422)


def test_archive_over_the_limit_is_422_with_the_count_and_the_limit(client, products, monkeypatch):
    monkeypatch.setattr(bulk, "MAX_ARCHIVE_FILES", 2)
    body = assert_error(client.get("/api/v1/products/archive"), 422, "matches 4 products", "at most 2")
    assert "limit" in body["detail"] and "offset" in body["detail"]
    assert_error(client.get("/api/v1/products/download.sh"), 422, "matches 4 products", "at most 2")
    # in parts: limit and offset page through it
    names = []
    for offset in (0, 2):
        r = client.get("/api/v1/products/archive", params={"limit": 2, "offset": offset})
        assert r.status_code == 200, r.text
        names += [n for n in _read_tar(r.content)[0] if n.endswith(".fits")]
    assert len(names) == len(set(names)) == 3
    assert_error(client.get("/api/v1/products/archive", params={"limit": 501}), 422, "limit")


def test_event_archive_has_linked_and_window_products(client, db_session, products):
    from backend.models import EventProduct

    fl = make_event(db_session, "FL", T0 + 2 * MIN, T0 + 6 * MIN, T0 + 8 * MIN, goes_class="M1.0")
    db_session.add(EventProduct(event_id=fl.id, product_id=products["gone"].id))
    db_session.flush()
    r = client.get(f"/api/v1/events/{fl.id}/products/archive", params={"margin_min": 5})
    assert r.status_code == 200, r.text
    members, man = _read_tar(r.content)
    # window [15:57, 16:13]: SDI 16:00 and 16:10, WST 16:05 (not the failed SCI-UV); the linked one is missing
    ids = {row["product_id"]: row["status"] for row in man["products"]}
    assert ids == {products["sdi_real"].id: "sent", products["sdi"].id: "sent", products["wst"].id: "sent",
                   products["gone"].id: "missing"}
    assert man["query"]["event_id"] == fl.id and man["query"]["window_start"] == "2024-05-14T15:57:00+00:00"
    r = client.get(f"/api/v1/events/{fl.id}/products/archive", params={"linked_only": "true"})
    assert [row["product_id"] for row in _read_tar(r.content)[1]["products"]] == [products["gone"].id]
    script = client.get(f"/api/v1/events/{fl.id}/products/download.sh", params={"margin_min": 5}).text
    assert len(re.findall(r"^fetch ", script, re.M)) == 3
    assert_error(client.get("/api/v1/events/999999/products/archive"), 404, "no event with id 999999")
    assert_error(client.get(f"/api/v1/events/{fl.id}/products/archive", params={"margin_min": -1}), 422)


def test_download_script_has_one_line_per_file_and_checks_sha256(client, products):
    r = client.get("/api/v1/products/download.sh", params={"state": "any"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/x-shellscript")
    text = r.text
    assert text.startswith("#!/bin/sh\n") and "curl -fsSL" in text and "wget -q" in text
    fetches = re.findall(r"^fetch (\S+) (\S+)$", text, re.M)
    written = [products[k] for k in ("sdi_real", "sdi", "wst")]
    assert sorted(url for _, url in fetches) == sorted(f"http://testserver/api/v1/products/{p.id}/fits"
                                                       for p in written)
    block = text.split("sha256sum -c <<'SHA256SUMS'\n", 1)[1].split("\nSHA256SUMS\n", 1)[0].splitlines()
    assert sorted(line.split("  ")[0] for line in block) == sorted(p.sha256 for p in written)
    assert {line.split("  ")[1] for line in block} == {name for name, _ in fetches}
    missing = re.findall(r"^# missing: product (\d+) .*$", text, re.M)
    assert sorted(map(int, missing)) == sorted([products["gone"].id, products["failed"].id])
    assert "no flat valid at DATE-OBS" in text
    # each line is a URL the API answers with the very bytes whose checksum the script checks
    for name, url in fetches:
        body = client.get(url.removeprefix("http://testserver")).content
        assert f"{hashlib.sha256(body).hexdigest()}  {name}" in block


def test_stream_tar_is_produced_piece_by_piece(products, settings):  # noqa: F811
    entries = bulk.archive_entries([products["sdi_real"], products["gone"]], settings.products)
    pieces = bulk.stream_tar(entries, {}, total=2, chunk=64 * 1024)
    first = next(pieces)  # the first member's header: nothing is read or hashed ahead
    assert len(first) % 512 == 0 and entries[0].sha256 is None and entries[0].status == "pending"
    rest = [len(b) for b in pieces]
    assert max(rest[:-3]) == 64 * 1024  # file data in chunks; then manifest, SHA256SUMS, end blocks
    assert entries[0].status == "sent" and entries[1].status == "missing"
    assert entries[0].size == REAL_FITS.stat().st_size
    assert (len(first) + sum(rest)) % tarfile.RECORDSIZE == 0


def test_products_job_filter_lists_exactly_the_jobs_products(client, db_session, products):
    # platform jobs (publishes): public, so anyone may filter by them
    job = Job(owner="system", kind="calibrate", parameters={"channels": ["SDI"]}, state=JobState.succeeded,
              publishes=True)
    other = Job(owner="system", kind="calibrate", parameters={}, state=JobState.succeeded, publishes=True)
    db_session.add_all([job, other])
    db_session.flush()
    db_session.add_all([
        JobItem(job_id=job.id, frame_id=products["sdi"].frame_id, product_id=products["sdi"].id,
                outcome=ItemOutcome.done),
        JobItem(job_id=job.id, frame_id=products["gone"].frame_id, product_id=products["gone"].id,
                outcome=ItemOutcome.skipped),
        JobItem(job_id=other.id, frame_id=products["wst"].frame_id, product_id=products["wst"].id,
                outcome=ItemOutcome.done),
    ])
    db_session.flush()
    r = client.get("/api/v1/products", params={"job_id": job.id})
    assert r.status_code == 200 and r.json()["total"] == 2
    assert sorted(i["id"] for i in r.json()["items"]) == sorted([products["sdi"].id, products["gone"].id])
    r = client.get("/api/v1/products/archive", params={"job_id": job.id})
    man = _read_tar(r.content)[1]
    assert {row["product_id"]: row["status"] for row in man["products"]} == {products["sdi"].id: "sent",
                                                                             products["gone"].id: "missing"}
    # an unknown job is 404, as another user's private one (tests/test_access_matrix.py)
    assert client.get("/api/v1/products", params={"job_id": "0" * 36}).status_code == 404
    assert client.get("/api/v1/products/archive", params={"job_id": "0" * 36}).status_code == 404
    assert_error(client.get("/api/v1/products", params={"job_id": "x;drop"}), 422, "job_id")


def test_job_estimate_counts_the_frames_a_job_would_touch(client, db_session, products):
    r = client.get("/api/v1/jobs/estimate", params={"channels": ["SDI", "sci-uv"], "start": "2024-05-14T16:00:00Z",
                                                    "end": "2024-05-14T16:15:00Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    # SDI 16:00, 16:10 (16:20 is outside); SCI-UV 16:15 (its product failed)
    assert body["channels"] == ["SCI-UV", "SDI"] and body["frames"] == 3
    assert body["per_channel"] == {"SDI": 2, "SCI-UV": 1} and body["with_products"] == 2
    assert body["first_date_obs"] == "2024-05-14T16:00:00Z" and body["last_date_obs"] == "2024-05-14T16:15:00Z"
    r = client.get("/api/v1/jobs/estimate", params={"channels": "SDI,WST", "start": "2024-05-14T16:00:00",
                                                    "end": "2024-05-14T17:00:00"})
    assert r.json()["per_channel"] == {"SDI": 3, "WST": 1}
    assert_error(client.get("/api/v1/jobs/estimate", params={"channels": "HMI", "start": "2024-05-14",
                                                             "end": "2024-05-15"}), 422, "unknown LST channel")
    assert_error(client.get("/api/v1/jobs/estimate", params={"channels": "SDI", "start": "2024-05-15",
                                                             "end": "2024-05-14"}), 422, "before")
    assert_error(client.get("/api/v1/jobs/estimate", params={"channels": "SDI", "end": "2024-05-14"}), 422, "start")
    assert_error(client.get("/api/v1/jobs/estimate", params={"start": "2024-05-14", "end": "2024-05-15"}), 422)


def test_job_options_give_defaults_limits_units_and_registry_versions(client, products):
    r = client.get("/api/v1/jobs/options")
    assert r.status_code == 200, r.text
    opts = {o["name"]: o for o in r.json()["options"]}
    from pipelines.calibration.l2.options import CalibrationOptions

    assert list(opts) == list(CalibrationOptions.model_fields)
    psf = opts["psf_iterations"]
    assert (psf["kind"], psf["default"], psf["minimum"], psf["maximum"]) == ("int", 30, 1, 500)
    assert opts["interpolation_order"]["minimum"] == 0 and opts["interpolation_order"]["maximum"] == 5
    assert opts["saturation_dn"]["unit"] == "DN" and opts["saturation_dn"]["exclusive_minimum"] == 0
    assert opts["remove_cosmic_rays"]["kind"] == "bool" and opts["remove_cosmic_rays"]["default"] is False
    assert opts["device"]["choices"] == ["cpu", "gpu"]
    cals = r.json()["calibrations"]
    assert [c["version"] for c in cals["dark"]] == [3] and cals["dark"][0]["channels"] == ["SDI"]
    assert cals["psf"] == [] and set(cals) == {k.value for k in CalibrationKind}


@pytest.fixture(scope="module")
def simulated_sdi(simulated_dataset):
    return simulated_dataset(channels=("SDI",), naxis=64, noise=False, seed=5, sdi_sequence=False)  # shared, read-only


def test_archive_of_pipeline_products_agrees_with_their_headers(client, db_session, settings, simulated_sdi):
    """Products made by the calibration chain (ingest, plan, calibrate, write): the archive's
    files are those products byte for byte, and the manifest's versions and calibration ids are
    those their own headers stamp (``PRODVER``, ``CAL*VER``/``CAL*ID``)."""
    from astropy.io import fits

    from backend.models import Frame
    from backend.services.ingest import ingest_path
    from backend.worker.processing import calibrate_product, plan_product
    from pipelines.calibration.l2.flow import CAL_KEYWORDS

    outs = [ingest_path(db_session, p, settings, move=False)
            for p in [c.path for c in simulated_sdi.calibration_files] + list(simulated_sdi.raw_files)]
    frames = [db_session.get(Frame, o.frame_id) for o in outs if o.status == "ingested"]
    assert frames
    made = []
    for frame in frames:
        prod, _ = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
        prod = calibrate_product(db_session, prod.id, settings)
        assert prod.state == ProductState.written, prod.error
        made.append(prod)
    r = client.get("/api/v1/products/archive", params={"channel": "SDI"})
    assert r.status_code == 200, r.text
    members, man = _read_tar(r.content)
    assert man["files"] == len(made) and man["missing"] == 0
    for row in man["products"]:
        data = members[row["name"]]
        assert row["sha256"] == hashlib.sha256(data).hexdigest() and row["sha256_matches_stored"] is True
        with fits.open(io.BytesIO(data), checksum=True) as hdul:
            h = hdul[0].header
            assert h["LEVEL"].strip() == "L2" and h["PRODVER"] == row["version"]
            for cal in row["calibrations"]:
                _, ver, cid, _ = CAL_KEYWORDS[cal["kind"]]
                assert (h[cid], h[ver]) == (cal["id"], cal["version"]), cal
        assert {c["kind"] for c in row["calibrations"]} >= {"dark", "flat", "radiometric"}


# -- static files ---------------------------------------------------------------------------------


def test_static_files_are_gzipped_and_cached_by_version(client):
    from backend.api.pages.templating import static_url
    from frontend import STATIC_DIR

    raw = (STATIC_DIR / "vendor" / "plotly-basic.min.js").read_bytes()
    url = static_url("vendor/plotly-basic.min.js")
    digest = url.split("?v=")[1]
    r = client.get(url, headers={"Accept-Encoding": "gzip, deflate"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert r.headers["vary"] == "Accept-Encoding" and r.headers["etag"] == f'"{digest}-gzip"'
    assert int(r.headers["content-length"]) < len(raw) / 2.5  # 1.19 MB -> about 0.4 MB
    assert r.content == raw  # httpx decodes it: the same bytes
    r = client.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in r.headers and r.content == raw and r.headers["etag"] == f'"{digest}"'
    r = client.get(url, headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in r.headers
    # unversioned (or an old version): a short max-age, revalidated by ETag
    for u in ("/static/vendor/plotly-basic.min.js", "/static/vendor/plotly-basic.min.js?v=000000000000"):
        r = client.get(u, headers={"Accept-Encoding": "gzip"})
        assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=300"
        assert r.headers["content-encoding"] == "gzip"
    r = client.get("/static/vendor/plotly-basic.min.js",
                   headers={"Accept-Encoding": "gzip", "If-None-Match": f'"{digest}-gzip"'})
    assert r.status_code == 304 and r.content == b""
    css = client.get(static_url("style.css"), headers={"Accept-Encoding": "gzip"})
    assert css.headers["content-encoding"] == "gzip" and css.headers["content-type"].startswith("text/css")
    assert client.get("/static/missing.js").status_code == 404
    assert client.get("/static/%2e%2e/backend/api/app.py").status_code == 404


def test_pages_link_static_files_by_version(client):
    html = client.get("/jobs/new").text
    assert re.search(r'<link rel="stylesheet" href="/static/style\.css\?v=[0-9a-f]{12}">', html)
    assert re.search(r'<script defer src="/static/app\.js\?v=[0-9a-f]{12}"></script>', html)
    assert "plotly" not in html.split("<footer")[0]  # no figure on the job form: no plotly.js
    html = client.get("/").text  # the events page: plotly.js deferred, so the table paints first
    assert re.search(r'<script defer src="/static/vendor/plotly-basic\.min\.js\?v=[0-9a-f]{12}"></script>', html)
    assert "<script src=" not in html


def test_job_form_times_are_whole_seconds_in_utc_and_cover_every_frame():
    """The job form's defaults: a DATE-OBS with microseconds (which left a datetime-local input
    blank) becomes whole-second UTC text, the end rounded up so the last frame is inside."""
    import datetime as dt

    from backend.api.pages.jobs import _job_form_times

    lo = dt.datetime(2024, 5, 14, 15, 50, 0, 123456, tzinfo=dt.UTC)
    hi = dt.datetime(2024, 5, 14, 18, 40, 0, 500000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert _job_form_times(lo, hi) == ("2024-05-14T15:50:00Z", "2024-05-14T16:40:01Z")
    assert _job_form_times(lo, lo.replace(microsecond=0)) == ("2024-05-14T15:50:00Z", "2024-05-14T15:50:00Z")
    start, end = _job_form_times(None, None)  # no frame yet: the last day, still a valid range
    t0, t1 = (dt.datetime.fromisoformat(t) for t in (start, end))
    assert t1 - t0 == dt.timedelta(days=1) and start.endswith("Z") and t1.microsecond == 0


def test_text_answers_are_gzipped_and_binary_downloads_are_not(client, products):
    r = client.get("/api/v1/events/timeline/figure", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip" and r.json()["data"] is not None
    r = client.get("/jobs/new", headers={"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip" and "<form" in r.text
    assert "content-encoding" not in client.get("/jobs/new", headers={"Accept-Encoding": "identity"}).headers
    fits_r = client.get(f"/api/v1/products/{products['wst'].id}/fits", headers={"Accept-Encoding": "gzip"})
    assert fits_r.status_code == 200 and "content-encoding" not in fits_r.headers
    tar_r = client.get("/api/v1/products/archive", params={"channel": "WST"}, headers={"Accept-Encoding": "gzip"})
    assert tar_r.status_code == 200 and "content-encoding" not in tar_r.headers
    png = client.get(f"/api/v1/products/{products['wst'].id}/quicklook.png", headers={"Accept-Encoding": "gzip"})
    assert png.status_code == 200 and "content-encoding" not in png.headers
    refused = client.get("/jobs/new", headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in refused.headers


def test_zip_archive_holds_the_same_files_and_manifest(client, products):
    import zipfile

    r = client.get("/api/v1/products/archive", params={"format": "zip"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"].endswith('.zip"')
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        assert z.testzip() is None  # every member's CRC-32 checks
        man = json.loads(z.read("MANIFEST.json"))
        rows = {row["product_id"]: row for row in man["products"]}
        for key in ("sdi_real", "sdi", "wst"):
            row = rows[products[key].id]
            data = z.read(row["name"])
            assert row["status"] == "sent" and hashlib.sha256(data).hexdigest() == row["sha256"] == products[key].sha256
        assert z.read(rows[products["sdi_real"].id]["name"]) == REAL_FITS.read_bytes()
        assert rows[products["gone"].id]["status"] == "missing"
        assert sorted(z.namelist()) == sorted([rows[products[k].id]["name"] for k in ("sdi_real", "sdi", "wst")]
                                              + ["MANIFEST.json", "SHA256SUMS"])
