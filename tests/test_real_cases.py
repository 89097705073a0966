"""Real cases from public defect reports, each test named after its source thread.

* astropy/astropy#887: a header card ``P.I.    = 'Latham  '`` (an illegal keyword name)
  made astropy's verification raise an empty-looking ``VerifyError``;
* CARTAvis/carta-backend#1127 (issue #1063): a FITS file with tens of thousands of HISTORY
  cards took minutes to open; here 20,000 cards put 1.3 MB into a frame's row;
* pydantic/pydantic#7940: pydantic reads numbers (and numeric strings) as Unix seconds, so
  ``start=20110607`` was a time in 1970;
* sunpy/sunpy#1845 and astropy/astropy#14112: a DATE-OBS inside a leap second
  (``2012-06-30T23:59:60.62``) cannot be a ``datetime``; astropy's ``leap_second_strict=
  'silent'`` (astropy/astropy#14606) gives it the next second's time;
* Kludex/starlette#2955 and #3057: Starlette's ``FileResponse`` sends an ETag but never
  answers ``If-None-Match``/``If-Modified-Since`` with 304.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from astropy.io import fits

from backend.models import Frame, Movie, MovieState
from backend.services.ingest import LINES_KEPT, ingest_path
from pipelines.errors import FitsReadError
from pipelines.fitsio import HISTORY_KEEP, read_image
from tests.test_api import client, make_frame, make_product, settings  # noqa: F401 - fixtures
from tests.test_ingest import lst_raw

# -- astropy/astropy#887: illegal keyword names ---------------------------------------------


def _with_card(path: Path, card: bytes, replacing: bytes = b"WAVELNTH") -> Path:
    """``path`` with the card whose keyword is ``replacing`` overwritten by ``card`` (raw bytes:
    astropy refuses to write an illegal keyword)."""
    raw = bytearray(path.read_bytes())
    i = raw.find(replacing.ljust(8))
    assert i >= 0 and i % 80 == 0
    raw[i:i + 80] = card.ljust(80)
    path.write_bytes(bytes(raw))
    return path


def test_astropy_887_illegal_keyword_pi_is_repaired_and_noted(sqlite_env, tmp_path):
    """astropy/astropy#887: ``P.I.    = 'Latham  '`` is read (renamed ``P_I_``), the image
    used, and the repair is in the frame's row and in the header's HISTORY (so in its products)."""
    from backend.db import session_scope

    src = _with_card(lst_raw(tmp_path / "pi.fits"), b"P.I.    = 'Latham  '")
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "ingested", out.line()
    with session_scope() as s:
        f = s.get(Frame, out.frame_id)
        assert f.header["P_I_"] == "Latham" and "P.I." not in f.header
        note = [x for x in f.header["_fixes"] if "'P.I.'" in x]
        assert note and "renamed P_I_" in note[0]
        assert any("'P.I.'" in h for h in f.header["HISTORY"])
        assert (f.naxis1, f.naxis2) == (32, 32)
    raw = read_image(out.stored_path)
    assert raw.header["P_I_"] == "Latham" and raw.data.shape == (32, 32)
    fits.PrimaryHDU(raw.data, raw.header).writeto(tmp_path / "product.fits")  # a product may carry it


def test_astropy_887_unrepaired_verify_error_gives_the_real_reason(sqlite_env, tmp_path, monkeypatch):
    """astropy/astropy#887: when astropy's verification refuses a header, the reason is its
    first message, not the empty first line of ``VerifyError`` ("unexpected VerifyError:")."""
    from backend.db import session_scope

    monkeypatch.setattr("pipelines.fitsio.repair_keyword_names", lambda header: [])  # as before the repair
    src = _with_card(lst_raw(tmp_path / "pi.fits"), b"P.I.    = 'Latham  '")
    with pytest.raises(FitsReadError, match=r"does not verify: Illegal keyword name 'P\.I\.'"):
        read_image(src)
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "rejected" and "Illegal keyword name 'P.I.'" in out.reason, out.reason
    assert Path(out.stored_path + ".reason").read_text().strip() == out.reason


# -- CARTAvis/carta-backend#1127: thousands of HISTORY cards ----------------------------------


def _with_history(path: Path, n: int) -> Path:
    """``path`` (a one-HDU FITS file) with ``n`` HISTORY cards ``step i`` added before END,
    written as bytes (astropy's ``add_history`` takes seconds for 20,000)."""
    raw = path.read_bytes()
    cards = [raw[i:i + 80] for i in range(0, len(raw), 80)]
    end = next(i for i, c in enumerate(cards) if c.startswith(b"END "))
    header_len = -(-(end + 1) * 80 // 2880) * 2880
    history = [f"HISTORY step {i} of the raw frame's processing on board".encode().ljust(80) for i in range(n)]
    head = b"".join(cards[:end] + history + [cards[end]])
    head += b" " * (-len(head) % 2880)
    path.write_bytes(head + raw[header_len:])
    return path


def test_carta_1127_history_cards_bounded_in_the_frame_row(sqlite_env, tmp_path):
    """carta-backend#1127: 20,000 HISTORY cards keep a row of a few kB (not 1.3 MB): the first
    and last cards and the count are stored; the raw file keeps them all."""
    from backend.db import session_scope

    src = _with_history(lst_raw(tmp_path / "hist.fits"), 20_000)
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "ingested", out.line()
    with session_scope() as s:
        h = s.get(Frame, out.frame_id).header
    size = len(json.dumps(h))
    assert size < 16_000, size
    assert h["_raw_history_cards"] == 20_000
    history = h["HISTORY"]
    assert len(history) <= 2 * LINES_KEPT
    assert history[0] == "step 0 of the raw frame's processing on board"
    assert any(x.startswith(f"step {20_000 - 1} ") for x in history)  # the raw file's last card
    assert any("20000 HISTORY cards in the raw header" in x for x in h["_fixes"])
    with fits.open(out.stored_path) as hdul:  # the stored raw file is untouched
        assert len(hdul[0].header["HISTORY"]) == 20_000


def test_carta_1127_ingest_work_does_not_grow_with_history(sqlite_env, tmp_path, monkeypatch):
    """carta-backend#1127: the FITS cards parsed while ingesting a frame (astropy ``Card``
    objects made) are the same for 200 and 20,000 HISTORY cards: the work is bounded (counted,
    not timed; ``benchmarks/ingest_history.py`` times it)."""
    from backend.db import session_scope

    made = {"cards": 0}
    original = fits.Card.fromstring.__func__

    def counting(cls, image):
        made["cards"] += 1
        return original(cls, image)

    monkeypatch.setattr(fits.Card, "fromstring", classmethod(counting))
    counts = {}
    for n in (200, 20_000):
        src = _with_history(lst_raw(tmp_path / f"hist{n}.fits", seed=n), n)
        made["cards"] = 0
        with session_scope() as s:
            out = ingest_path(s, src, sqlite_env)
        assert out.status == "ingested", out.line()
        counts[n] = made["cards"]
    assert counts[20_000] == counts[200], counts
    assert counts[200] < 20 * (2 * HISTORY_KEEP + 40), counts  # a few bounded headers' worth


# -- pydantic/pydantic#7940: compact ISO dates are not Unix seconds ---------------------------

#: Values of the query parameters the time routes need besides the time (by name; a channel
#: is given wherever a route takes one: ``/movies/frames`` needs one without saying so).
_REQUIRED = {"channels": "SDI", "channel": "SDI"}


def _time_query_params(app) -> list[tuple[str, str, list[str]]]:
    """``(path, parameter, parameters to give)`` of every GET query parameter of the OpenAPI
    document with ``format: date-time`` (given: the required ones and those of ``_REQUIRED``)."""
    spec = app.openapi()
    found = []
    for path, ops in spec["paths"].items():
        op = ops.get("get")
        if not op or "{" in path:
            continue
        params = op.get("parameters", [])
        required = [p["name"] for p in params if p["in"] == "query" and (p.get("required") or p["name"] in _REQUIRED)]
        for p in params:
            schema = p.get("schema", {})
            formats = {schema.get("format")} | {s.get("format") for s in schema.get("anyOf", [])}
            if p["in"] == "query" and "date-time" in formats:
                found.append((path, p["name"], required))
    return found


def _get(client, path, required, name, value, other):
    """GET ``path`` with ``name=value``, the other bound of the window ``other`` and the
    required parameters."""
    params = {k: _REQUIRED.get(k, "") for k in required}
    params.update(other)
    params[name] = value
    return client.get(path, params=params)


def test_pydantic_7940_compact_iso_date_is_a_date_on_every_time_parameter(client):
    """pydantic/pydantic#7940: ``start=20110607`` is read as 2011-06-07 on every time
    parameter of the API (the list from its OpenAPI document): the same answer as
    ``2011-06-07T00:00:00Z``; a bare number (Unix seconds) is a 422 that says how to write a time."""
    found = _time_query_params(client.app)
    assert {"/api/v1/events", "/api/v1/frames", "/api/v1/products", "/api/v1/xray"} <= {p for p, _, _ in found}
    assert len(found) >= 20, found
    r = client.get("/api/v1/frames", params={"start": "20110607T120000Z", "end": "20110607T1230Z"})  # basic format
    assert r.status_code == 200 and r.json()["total"] == 0, r.text[:300]
    for path, name, required in found:
        other = {"end": "2011-06-08T00:00:00Z"} if name == "start" else {"start": "2011-06-06T00:00:00Z"}
        extended = _get(client, path, required, name, "2011-06-07T00:00:00Z", other)
        compact = _get(client, path, required, name, "20110607", other)
        assert extended.status_code != 422, (path, name, extended.text[:300])
        assert compact.status_code == extended.status_code, (path, name, compact.text[:300])
        if compact.headers.get("content-type", "").startswith("application/json"):
            assert compact.json() == extended.json(), (path, name)
        unix = _get(client, path, required, name, "1307404800", other)
        assert unix.status_code == 422, (path, name, unix.status_code)
        detail = json.dumps(unix.json())
        assert name in detail and "Unix seconds are not read" in detail and "20110607" in detail, (path, detail)


def _body_time_fields(app) -> list[tuple[str, list[str]]]:
    """``(path, date-time fields)`` of every POST route whose JSON body has date-time fields
    (from the OpenAPI document)."""
    spec = app.openapi()
    comps = spec["components"]["schemas"]
    found = []
    for path, ops in spec["paths"].items():
        body = ops.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if not body or "$ref" not in body["schema"]:
            continue
        props = comps[body["schema"]["$ref"].split("/")[-1]].get("properties", {})
        fields = [k for k, v in props.items()
                  if "date-time" in {v.get("format")} | {x.get("format") for x in v.get("anyOf", [])}]
        if fields:
            found.append((path, fields))
    return found


def _body_errors(client, path: str, body: dict) -> dict[str, str]:
    """POST ``body`` (its channel unknown, so that nothing is made): the 422's messages by field."""
    r = client.post(path, json={**body, "channels": ["NOPE"], "channel": "NOPE"})
    assert r.status_code == 422, (path, r.status_code, r.text[:300])
    return {str(e["loc"][-1]): e["msg"] for e in r.json()["errors"]}


def test_pydantic_7940_job_and_movie_requests_read_compact_dates_and_refuse_numbers(client):
    """pydantic/pydantic#7940 in request bodies (``POST /jobs``, ``POST /movies``: every body
    with a date-time field in the OpenAPI document): ``"20110607"`` is accepted as a time,
    ``20110607`` (a JSON number) is refused as Unix seconds, with how to write a time."""
    found = _body_time_fields(client.app)
    assert {"/api/v1/jobs", "/api/v1/movies"} <= {p for p, _ in found}, found
    for path, fields in found:
        base = {"start": "2011-06-06T00:00:00Z", "end": "2011-06-08T00:00:00Z"}
        for name in fields:
            assert name not in _body_errors(client, path, {**base, name: "20110607"}), (path, name)
            errors = _body_errors(client, path, {**base, name: 20110607})
            assert "Unix seconds are not read" in errors.get(name, "") and "20110607T123000Z" in errors[name], errors


# -- sunpy/sunpy#1845, astropy/astropy#14112: leap seconds ------------------------------------


def test_sunpy_1845_leap_second_query_times_are_read(client):
    """sunpy/sunpy#1845: ``2016-12-31T23:59:60.5Z`` is a valid UTC time (ISO 8601, FITS 4.0
    sect. 9.1.1) on every time parameter; second 60 of a day without a leap second is a 422
    that says so."""
    for path, name, required in _time_query_params(client.app):
        other = {"end": "2017-01-01T00:00:01Z"} if name == "start" else {"start": "2016-12-31T23:59:00Z"}
        r = _get(client, path, required, name, "2016-12-31T23:59:60.5Z", other)
        assert r.status_code != 422, (path, name, r.text[:300])
        other = {"end": "2016-01-01T00:00:01Z"} if name == "start" else {"start": "2015-12-31T23:59:00Z"}
        r = _get(client, path, required, name, "2015-12-31T23:59:60.5Z", other)
        assert r.status_code == 422 and "has no leap second" in r.text, (path, name, r.text[:300])
    for path, fields in _body_time_fields(client.app):
        base = {"start": "2016-12-31T23:59:00Z", "end": "2017-01-01T00:00:01Z"}
        for name in fields:
            assert name not in _body_errors(client, path, {**base, name: "2016-12-31T23:59:60.5Z"}), (path, name)
            errors = _body_errors(client, path, {**base, name: "2015-12-31T23:59:60.5Z"})
            assert "has no leap second" in errors.get(name, ""), (path, name, errors)
    from backend.services.jobs import JobRequest

    got = JobRequest.model_validate({"channels": ["SDI"], "start": "2016-12-31T23:59:60.5Z",
                                     "end": "2017-01-01T00:00:00.5Z"})
    assert got.start < got.end and got.start > dt.datetime(2016, 12, 31, 23, 59, 59, 999_000, dt.UTC)


def test_astropy_14112_frames_inside_a_leap_second_stay_distinct_and_ordered(client, db_session, settings, tmp_path):
    """astropy/astropy#14112: a frame taken inside the leap second is stored before the frame
    a second later (not with its time), keeps its exact DATE-OBS in the header, and a query
    for the leap second finds it alone."""
    times = {"before": "2016-12-31T23:59:59.500", "leap": "2016-12-31T23:59:60.500", "after": "2017-01-01T00:00:00.500"}
    ids = {}
    for seed, (label, date_obs) in enumerate(times.items()):
        out = ingest_path(db_session, lst_raw(tmp_path / f"{label}.fits", date_obs=date_obs, seed=seed), settings)
        assert out.status == "ingested", out.line()
        ids[label] = out.frame_id
    rows = {label: db_session.get(Frame, fid) for label, fid in ids.items()}
    stored = {label: f.date_obs.replace(tzinfo=dt.UTC) for label, f in rows.items()}
    assert stored["before"] < stored["leap"] < stored["after"], stored
    assert rows["leap"].header["DATE-OBS"] == "2016-12-31T23:59:60.500"
    r = client.get("/api/v1/frames", params={"start": "2016-12-31T23:59:60Z", "end": "2016-12-31T23:59:60.999Z"})
    assert r.status_code == 200, r.text
    assert [f["id"] for f in r.json()["items"]] == [ids["leap"]]
    r = client.get("/api/v1/frames", params={"start": "2016-12-31T23:59:59Z", "end": "2017-01-01T00:00:01Z"})
    assert sorted(f["id"] for f in r.json()["items"]) == sorted(ids.values())


# -- Kludex/starlette#2955, #3057: conditional downloads --------------------------------------


#: GET routes that answer one binary media type but render it on each request (no stored
#: file; cached through their own ``Cache-Control``): not file downloads.
_RENDERED = {"/api/v1/products/{product_id}/region.png", "/api/v1/products/{product_id}/dq.png",
             "/api/v1/movies/frames/{product_id}.png", "/api/v1/frames/{frame_id}/diff/difference.png",
             "/api/v1/frames/{frame_id}/diff/ratio.png"}


def _file_routes(app) -> set[str]:
    """GET routes of the OpenAPI document whose 200 answer is one binary media type (a
    file), less :data:`_RENDERED`. The archives (tar, gzip, zip) are made on request with their
    creation time inside and sent ``no-store``: no validator applies to them."""
    found = set()
    for path, ops in app.openapi()["paths"].items():
        content = list(ops.get("get", {}).get("responses", {}).get("200", {}).get("content", {}))
        if len(content) == 1 and content[0].startswith(("application/fits", "image/", "video/")):
            found.add(path)
    return found - _RENDERED


def test_starlette_2955_every_file_download_honours_if_none_match_and_if_modified_since(client, db_session, settings):
    """Kludex/starlette#2955: every route that sends a stored file (the list from the app's
    routes) answers ``If-None-Match`` with its ETag, and ``If-Modified-Since`` not older than
    the file, with 304 and no body; a changed or other ETag gets the file (and
    ``If-Modified-Since`` is ignored beside ``If-None-Match``, starlette#3057)."""
    frame = make_frame(db_session, "SDI", dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC))
    product = make_product(db_session, frame, settings.products / "SDI")
    movie_file = settings.root / "movies" / "m.mp4"
    movie_file.parent.mkdir(parents=True, exist_ok=True)
    movie_file.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(1000))
    movie = Movie(owner="tester", channel_code="SDI", start_time=frame.date_obs, end_time=frame.date_obs,
                  state=MovieState.succeeded, path=str(movie_file), frames_total=1, frames_done=1)
    db_session.add(movie)
    db_session.flush()
    urls = {"/api/v1/products/{product_id}/fits": f"/api/v1/products/{product.id}/fits",
            "/api/v1/products/{product_id}/quicklook.png": f"/api/v1/products/{product.id}/quicklook.png",
            "/api/v1/movies/{movie_id}/file": f"/api/v1/movies/{movie.id}/file"}
    assert _file_routes(client.app) == set(urls), "a new file route: add it here"
    for url in urls.values():
        first = client.get(url)
        assert first.status_code == 200 and first.content, url
        etag, modified = first.headers["etag"], first.headers["last-modified"]
        again = client.get(url, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag, url
        assert client.get(url, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304, url
        assert client.get(url, headers={"If-None-Match": '"other"'}).status_code == 200, url
        assert client.get(url, headers={"If-Modified-Since": modified}).status_code == 304, url
        older = client.get(url, headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
        assert older.status_code == 200 and older.content == first.content, url
        stale = client.get(url, headers={"If-None-Match": '"other"', "If-Modified-Since": modified})
        assert stale.status_code == 200 and stale.content == first.content, url
    fits_etag = client.get(urls["/api/v1/products/{product_id}/fits"]).headers["etag"]
    assert fits_etag == f'"{product.sha256}"'  # the content digest: the same on every API replica


def test_starlette_2955_a_rewritten_file_is_sent_again(client, db_session, settings):
    """Kludex/starlette#2955: after the file changes, its old ETag no longer matches: 200 with
    the new bytes."""
    frame = make_frame(db_session, "SDI", dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC))
    product = make_product(db_session, frame, settings.products / "SDI")
    url = f"/api/v1/products/{product.id}/quicklook.png"
    first = client.get(url)
    Path(product.quicklook_path).write_bytes(first.content + b"\0")  # another size: another ETag
    r = client.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert r.status_code == 200 and r.content != first.content
