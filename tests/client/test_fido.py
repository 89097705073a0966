"""The sunpy Fido client (``lstdp_client.fido.LSTClient``) against a live server of ours, as
sunpy tests its own clients (``tests/client/conftest.py``: uvicorn in a thread, products made
by a real worker). ``Fido.search`` results are checked against ``GET /api/v1/products``.

This machine has no internet: sunpy's VSO client claims every query with ``a.Time``
(``VSOClient._can_handle_query``) and would fail to reach its mirrors, so the searches run
with VSO taken out of Fido's registry (``no_vso``); what Fido would ask is checked on the
whole registry without calling anyone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import astropy.units as u
import httpx
import pytest
import sunpy.map
from sunpy.net import Fido
from sunpy.net import attrs as a
from sunpy.net.vso import VSOClient

import lstdp_client.attrs as la
from lstdp_client import ValidationError
from lstdp_client.fido import LSTClient
from tests.client.conftest import SDI_FRAMES

pytestmark = pytest.mark.slow

DAY = a.Time("2004-03-01", "2004-03-02")


@pytest.fixture
def no_vso(monkeypatch):
    monkeypatch.delitem(Fido.registry, VSOClient)


@pytest.fixture
def url_env(live, monkeypatch):
    monkeypatch.setenv("LSTDP_URL", live.url)
    return live.url


def _written(live, **params) -> list[dict]:
    r = httpx.get(f"{live.url}/api/v1/products", params={"state": "written", "limit": 500, **params}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _claimants(*query) -> list[type]:
    """The clients Fido would ask (its registry's ``_can_handle_query``), none of them called."""
    return [client for client, can in Fido.registry.items() if can(*query)]


def _ours(result):
    blocks = [b for b in result if isinstance(b.client, LSTClient)]
    assert len(blocks) == 1 and len(result) == 1, [type(b.client).__name__ for b in result]
    return blocks[0]


def test_importing_the_module_registers_the_client_and_its_attrs():
    assert LSTClient in Fido.registry
    assert a.lst.Channel is la.Channel and a.lst.CalibrationSet is la.CalibrationSet
    assert a.Instrument.lst.value == "LST" and a.Detector.sdi.value == "SDI"
    assert "LSTClient" in str(Fido)


def test_what_the_client_claims():
    assert LSTClient in _claimants(DAY, a.Instrument("LST"))
    assert LSTClient in _claimants(DAY, a.Instrument("lst"), a.Detector("SCI-UV"), a.Level(2))
    assert LSTClient in _claimants(DAY, la.CalibrationSet(1))
    # not ours: another instrument, detector, level or provider, or no LST attr at all
    assert LSTClient not in _claimants(DAY, a.Instrument("AIA"))
    assert VSOClient in _claimants(DAY, a.Instrument("AIA"))  # Fido would ask VSO, not us
    assert LSTClient not in _claimants(DAY, a.Instrument("LST"), a.Detector("C2"))
    assert LSTClient not in _claimants(DAY, a.Instrument("LST"), a.Level(1))
    assert LSTClient not in _claimants(DAY, a.Instrument("LST"), a.Provider("SDAC"))
    assert LSTClient not in _claimants(DAY)
    assert LSTClient not in _claimants(DAY, a.Instrument("LST"), a.Wavelength(121.6 * u.nm))


def test_fido_search_finds_exactly_the_products_the_api_lists(live, url_env, no_vso):
    api = _written(live, start="2004-03-01T00:00:00Z", end="2004-03-02T00:00:00Z")
    assert len(api) >= SDI_FRAMES
    res = Fido.search(DAY, a.Instrument("LST"))
    block = _ours(res)
    assert sorted(block["Product ID"]) == sorted(p["id"] for p in api)
    assert set(block["Instrument"]) == {"LST"} and set(block["Source"]) == {"ASO-S"}
    shown = str(res)  # Fido's table: the visible columns, not the hidden URL and checksum
    assert "LSTClient" in shown and "Start Time" in shown and "SDI" in shown and "/fits" not in shown
    for row in block:
        p = next(p for p in api if p["id"] == row["Product ID"])
        assert abs((row["Start Time"] - a.Time(p["date_obs"].rstrip("Z"), p["date_obs"].rstrip("Z")).start)
                   .to_value(u.s)) < 1e-3
        assert row["Detector"] == p["channel"] and row["Version"] == p["version"]
    assert sorted(_ours(Fido.search(DAY, a.Instrument("LST"), a.Detector("SDI"), a.Level(2)))["Product ID"]) == \
        sorted(p["id"] for p in api if p["channel"] == "SDI")
    assert len(_ours(Fido.search(DAY, a.Instrument("LST"), a.Detector("WST")))) == 0
    assert len(_ours(Fido.search(a.Time("2004-03-02", "2004-03-03"), a.Instrument("LST")))) == 0


def test_fido_fetch_downloads_every_product_and_map_opens_each(live, url_env, no_vso, tmp_path):
    set_id = live.job["calibration_sets"][0]
    block = _ours(Fido.search(DAY, a.Instrument("LST"), a.Detector("SDI"), la.CalibrationSet(set_id)))
    assert len(block) == SDI_FRAMES
    files = Fido.fetch(block, path=tmp_path / "{detector}" / "{file}", progress=False)
    assert not files.errors and len(files) == SDI_FRAMES
    by_sha = {row["SHA-256"]: row for row in block}
    for f in files:
        assert Path(f).parent == tmp_path / "SDI"
        row = by_sha[hashlib.sha256(Path(f).read_bytes()).hexdigest()]  # each file whole, each product once
        m = sunpy.map.Map(f, hdus=0)
        assert abs((m.date - row["Start Time"]).to_value(u.s)) < 1e-3
        assert m.detector == row["Detector"] == "SDI"
    assert len({hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files}) == SDI_FRAMES
    # fetching again skips the complete files (their checksums match)
    stamps = {f: Path(f).stat().st_mtime_ns for f in files}
    again = Fido.fetch(block, path=tmp_path / "{detector}" / "{file}", progress=False)
    assert sorted(again) == sorted(files) and {f: Path(f).stat().st_mtime_ns for f in again} == stamps


def test_our_attrs_filter(live, url_env, no_vso):
    set_id = live.job["calibration_sets"][0]
    in_set = sorted(p["id"] for p in _written(live, calibration_set=set_id))
    assert len(in_set) == SDI_FRAMES
    for q in (la.CalibrationSet(set_id), la.ProductVersion(set_id), a.lst.CalibrationSet(set_id)):
        block = _ours(Fido.search(DAY, a.Instrument("LST"), q))
        assert sorted(block["Product ID"]) == in_set and set(block["Version"]) == {set_id}
    assert sorted(_ours(Fido.search(DAY, la.Channel("sdi"), la.CalibrationSet(set_id)))["Product ID"]) == in_set
    assert len(_ours(Fido.search(DAY, la.Channel("SCI-WL")))) == 0
    assert len(_ours(Fido.search(DAY, la.CalibrationSet(set_id), la.ProductVersion(set_id + 1)))) == 0
    # an OR of two channels is two searches; only SDI has products
    res = Fido.search(DAY, a.Instrument("LST"), a.Detector("SDI") | a.Detector("WST"))
    assert [len(b) for b in res] == [len(_written(live, channel="SDI", start="2004-03-01", end="2004-03-02")), 0]


def test_client_url_parameter_info_url_and_server_errors(live):
    c = LSTClient(url=live.url)
    assert c.info_url == live.url + "/docs"
    assert len(c.search(DAY, a.Instrument("LST"))) >= SDI_FRAMES
    with pytest.raises(ValueError):
        la.CalibrationSet(0)
    # a value the server refuses is its 422, with its message
    with pytest.raises(ValidationError) as exc:
        c.search(DAY, la.CalibrationSet(3_000_000_000))
    direct = httpx.get(f"{live.url}/api/v1/products", params={"calibration_set": 3_000_000_000})
    assert exc.value.status == direct.status_code == 422 and exc.value.detail == direct.json()["detail"]


def test_products_of_a_private_set_need_the_token(live, no_vso, monkeypatch, tmp_path):
    """A job with other options makes its owner's calibration set, seen (and downloaded) with
    their token only: by the client, and by Fido with ``LSTDP_TOKEN`` and the client's downloader."""
    from lstdp_client import Client

    with Client(live.url, token=live.token) as c:
        job = c.submit_job("SDI", live.span[0], live.span[1], options={"interpolation_order": 1})
        final = c.wait_job(job["id"], timeout=300)
        assert final["state"] == "succeeded" and final["done"] == SDI_FRAMES, final
        (set_id,) = final["calibration_sets"]
        mine = c.search_products(calibration_set=set_id, state="written")
        assert len(mine) == SDI_FRAMES
        got = c.download(mine, tmp_path / "client", progress=False)
        assert not got.errors and {hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in got} == set(mine["sha256"])
    with Client(live.url) as anonymous:
        assert len(anonymous.search_products(calibration_set=set_id)) == 0
        refused = anonymous.download(mine, tmp_path / "anonymous", progress=False, retries=0)
        assert len(refused) == 0 and len(refused.errors) == SDI_FRAMES  # 404 for each: not theirs to see

    monkeypatch.setenv("LSTDP_URL", live.url)
    assert len(_ours(Fido.search(DAY, a.Instrument("LST"), la.CalibrationSet(set_id)))) == 0
    monkeypatch.setenv("LSTDP_TOKEN", live.token)
    block = _ours(Fido.search(DAY, a.Instrument("LST"), la.CalibrationSet(set_id)))
    assert sorted(block["Product ID"]) == sorted(mine["id"])
    denied = Fido.fetch(block, path=tmp_path / "fido" / "{file}", progress=False)  # Fido's downloader: no token
    assert len(denied.errors) == SDI_FRAMES
    files = Fido.fetch(block, path=tmp_path / "fido" / "{file}",
                       downloader=Client(live.url, token=live.token).downloader(progress=False))
    assert not files.errors and len(files) == SDI_FRAMES


def test_offline_fido_searches_and_fetches_without_asking_vso(live, url_env, tmp_path, monkeypatch):
    """The README's offline Fido (``lstdp_client.fido.offline_fido``): sunpy's own ``Fido`` with
    VSO in its registry would ask VSO too (this machine has no internet); the offline one asks
    no other client, and finds and fetches what the API lists."""
    from lstdp_client.fido import offline_fido

    def _no_vso(*args, **kwargs):
        raise AssertionError("the offline Fido asked VSO")

    monkeypatch.setattr(VSOClient, "search", _no_vso)
    monkeypatch.setattr(VSOClient, "__init__", _no_vso)
    fido = offline_fido()
    assert list(fido.registry) == [LSTClient] and VSOClient in Fido.registry  # sunpy's Fido untouched
    api = _written(live, channel="SDI", start="2004-03-01T00:00:00Z", end="2004-03-02T00:00:00Z")
    res = fido.search(DAY, a.Instrument("LST"), a.Detector("SDI"))
    block = _ours(res)
    assert sorted(block["Product ID"]) == sorted(p["id"] for p in api) and len(api) >= 1
    files = fido.fetch(block[:1], path=tmp_path / "{file}", progress=False)
    assert not files.errors and len(files) == 1 and Path(files[0]).stat().st_size > 0
