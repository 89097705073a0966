"""The detector registry (``pipelines.detect.registry``), the service entry point
``backend.services.detection.run_detector`` and the CLI's ``detect`` command built on them."""

from __future__ import annotations

import argparse
import inspect
import itertools

import pytest

from backend.services import detection
from pipelines.detect import cme, flares, prominence, whitelight
from pipelines.detect.registry import DETECTORS, FOLLOW_UPS, follow_ups, get_detector

MODULES = {"flares": flares, "cmes": cme, "prominences": prominence, "white-light": whitelight}
ALL_CHANNELS = ("SDI", "WST", "SCI-UV", "SCI-WL")


def test_registry_entries_match_their_modules():
    assert list(DETECTORS) == ["flares", "cmes", "prominences", "white-light"]
    for name, mod in MODULES.items():
        det = DETECTORS[name]
        assert det.name == name
        assert (det.frm_name, det.version) == (mod.DETECTOR_NAME, mod.DETECTOR_VERSION)
        if hasattr(mod, "FRM_NAME"):
            assert (det.frm_name, det.version) == (mod.FRM_NAME, mod.FRM_VERSION)
        assert det.default_channel in det.channels
    assert {n: d.frm_name for n, d in DETECTORS.items()} == {
        "flares": "lst-sdi-flare", "cmes": "lst-sci-cme", "prominences": "lst-prominence-eruption",
        "white-light": "lst-wst-wlf"}
    assert {n: (d.event_type, d.channels, d.default_channel) for n, d in DETECTORS.items()} == {
        "flares": ("FL", ("SDI",), "SDI"),
        "cmes": ("CE", ("SCI-UV", "SCI-WL"), "SCI-UV"),
        "prominences": ("PR", ("SDI", "SCI-UV"), "SDI"),
        "white-light": ("FL", ("WST",), "WST"),
    }
    assert DETECTORS["flares"].detect is flares.detect_flares
    assert DETECTORS["cmes"].detect is cme.detect_cmes
    assert DETECTORS["prominences"].detect is prominence.detect_prominence_eruptions
    assert DETECTORS["white-light"].detect is whitelight.detect_white_light_flares


def test_default_parameters_per_channel():
    assert DETECTORS["flares"].params() == flares.FlareDetectionParams()
    assert DETECTORS["cmes"].params("SCI-WL") == cme.CMEParams()
    assert DETECTORS["prominences"].params() == prominence.ProminenceParams.sdi()
    assert DETECTORS["prominences"].params("SCI-UV") == prominence.ProminenceParams.sci_uv()
    assert DETECTORS["white-light"].params("WST") == whitelight.WhiteLightParams()


def _old_queue_follow_ups(channels) -> list[tuple[str, str]]:
    """What ``pipelines.tasks._queue_follow_ups`` queued before the registry, in its order:
    detect_flares (SDI), detect_prominences SDI, detect_cmes per SCI channel, detect_prominences
    SCI-UV, detect_white_light_flares (WST)."""
    out = []
    if "SDI" in channels:
        out += [("flares", "SDI"), ("prominences", "SDI")]
    for ch in ("SCI-UV", "SCI-WL"):
        if ch in channels:
            out.append(("cmes", ch))
    if "SCI-UV" in channels:
        out.append(("prominences", "SCI-UV"))
    if "WST" in channels:
        out.append(("white-light", "WST"))
    return out


def test_follow_ups_are_those_queued_before():
    assert follow_ups(["SDI", "WST", "SCI-UV", "SCI-WL"]) == [
        ("flares", "SDI"), ("prominences", "SDI"), ("cmes", "SCI-UV"), ("cmes", "SCI-WL"),
        ("prominences", "SCI-UV"), ("white-light", "WST")]
    assert follow_ups(["SCI-WL", "SCI-UV"]) == [("cmes", "SCI-UV"), ("cmes", "SCI-WL"), ("prominences", "SCI-UV")]
    assert follow_ups([]) == [] and follow_ups(("WST",)) == [("white-light", "WST")]
    for n in range(len(ALL_CHANNELS) + 1):
        for chans in itertools.permutations(ALL_CHANNELS, n):
            assert follow_ups(list(chans)) == _old_queue_follow_ups(list(chans)), chans
    for name, channel in FOLLOW_UPS:
        assert channel in get_detector(name).channels


def test_unknown_detector_and_wrong_channel_are_refused():
    with pytest.raises(KeyError, match="flares, cmes, prominences, white-light"):
        get_detector("sunspots")
    with pytest.raises(KeyError, match="unknown detector 'sunspots'"):
        detection.run_detector(None, "sunspots")
    with pytest.raises(ValueError, match="CMEs are detected on SCI-UV or SCI-WL, not 'SDI'"):
        detection.run_detector(None, "cmes", channel="SDI")
    with pytest.raises(ValueError, match="flares are detected on SDI, not 'WST'"):
        detection.run_detector(None, "flares", channel="WST")
    with pytest.raises(ValueError, match="SDI or SCI-UV"):
        detection.run_detector(None, "prominences", channel="SCI-WL")
    # the service functions refuse it too, before reading anything
    with pytest.raises(ValueError, match="white-light flares are detected on WST"):
        detection.detect_wst_white_light_flares(None, channel="SDI")
    with pytest.raises(ValueError, match="flares are detected on SDI"):
        detection.detect_sdi_flares(None, channel="SCI-UV")


def test_run_detector_calls_the_named_service_on_the_default_channel(monkeypatch):
    calls = []
    assert set(detection.SERVICES) == set(DETECTORS)
    for det in DETECTORS.values():
        fn = detection.SERVICES[det.name]
        sig = inspect.signature(fn)
        assert {"channel", "start", "end", "params", "product_root"} <= set(sig.parameters), det.name
        assert sig.parameters["channel"].default == det.default_channel
        monkeypatch.setitem(detection.SERVICES, det.name,
                            lambda session, _name=det.name, **kw: calls.append((_name, kw)) or [])
    for name in DETECTORS:
        assert detection.run_detector("session", name, start=None, end=None) == []
    assert detection.run_detector("session", "prominences", channel="SCI-UV", product_root="x") == []
    assert [(n, kw["channel"]) for n, kw in calls] == [
        ("flares", "SDI"), ("cmes", "SCI-UV"), ("prominences", "SDI"), ("white-light", "WST"),
        ("prominences", "SCI-UV")]
    assert calls[-1][1] == {"channel": "SCI-UV", "start": None, "end": None, "params": None,
                            "product_root": "x", "scope": detection.PUBLIC_SCOPE}


def _detect_subparser() -> argparse.ArgumentParser:
    from backend.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["detect"]


def test_cli_detect_kinds_are_the_registry_names():
    kind = next(a for a in _detect_subparser()._actions if a.dest == "kind")
    assert list(kind.choices) == list(DETECTORS)
    assert kind.default == "flares"
    from backend.cli import build_parser

    assert build_parser().parse_args(["detect", "--kind", "white-light"]).kind == "white-light"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["detect", "--kind", "sunspots"])


def test_cli_detect_runs_the_registry_detector(sqlite_env, capsys):
    from backend.cli import main

    assert main(["detect", "--kind", "cmes", "--channel", "SCI-WL"]) == 0
    assert "0 event(s) found by the cmes detector" in capsys.readouterr().out
    assert main(["detect", "--kind", "flares", "--channel", "WST"]) == 1
    assert "flares are detected on SDI, not 'WST'" in capsys.readouterr().err
