"""Random filters over random events: the lean event search and the route, byte for byte.

Written by a reviewer of issue 29 item 4 (migration 0024's whole-degree angle condition and the
one-read box), from the outside: events with angles at NaN, +-inf, -0, the degree edges, below 0
and above 360 or none, with and without a Solar X; queries with angle ranges (through 0 deg,
min == max, fractional), time windows, boxes, types, sources, classes, every sort, offsets and
cursor pages, under several exact-count limits. Dropping degree 360 from a range through 0 deg in
``event_search_lean._pa_degrees`` made it find more than ten mismatches (tried). The seed is fixed
(``LEAN_RANDOM_SEED`` picks another; ``LEAN_RANDOM_EVENTS``/``LEAN_RANDOM_QUERIES`` the sizes).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import random

import pytest

from backend.api import lean_events
from tests.test_lean_events import T0, MIN, _ev, _same, clients  # noqa: F401

pytestmark = pytest.mark.postgres


EDGE_PA = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-300, 0.5, 0.9999999999, 1.0, 59.999999, 60.0,
           179.5, 300.0, 358.9999, 359.0, 359.5, 359.9999999, 360.0, 360.0000001, 361.0, -1.0, -1.5, 720.0, None]


def _rand_pa(rng):
    r = rng.random()
    if r < 0.35:
        return rng.choice(EDGE_PA)
    if r < 0.5:
        return float(rng.randint(0, 360))
    return rng.uniform(-2, 362)


def _bound(rng):
    r = rng.random()
    if r < 0.4:
        return str(rng.randint(0, 360))
    if r < 0.6:
        return rng.choice(["0", "360", "0.5", "359.5", "359.9999999", "1e-9", "60.000001", "59.9999", "0.0", "360.0"])
    return repr(round(rng.uniform(0, 360), rng.choice([0, 1, 3, 7])))


def test_random_filters_same_bytes(clients, db_session, monkeypatch):  # noqa: F811
    from backend.services import event_search

    lean, route = clients
    rng = random.Random(int(os.environ.get("LEAN_RANDOM_SEED", "7")))
    n = int(os.environ.get("LEAN_RANDOM_EVENTS", "1500"))
    for i in range(n):
        t = T0 + dt.timedelta(minutes=rng.randint(0, 3 * 24 * 60))
        kind = rng.choice(["CE", "CE", "PR", "FL"])
        hx = None if rng.random() < 0.2 else rng.uniform(-1100, 1100)
        hy = None if (hx is None and rng.random() < 0.5) else rng.uniform(-1100, 1100)
        _ev(db_session, kind, t, None if rng.random() < 0.1 else t + rng.randint(1, 600) * MIN,
            peak=None if rng.random() < 0.3 else t + rng.randint(0, 60) * MIN,
            source=rng.choice(["cdaw", "detected", "hek"]), position_angle=_rand_pa(rng), hpc_x=hx, hpc_y=hy,
            speed_km_s=rng.choice([None, 300.0, 812.5, float("nan"), rng.uniform(100, 3000)]),
            goes_flux=rng.choice([None, 1e-6, 3e-5, 2e-4]), owner=rng.choice([None, None, None, "other"]))
    db_session.flush()
    sorts = ["start_time", "-start_time", "id", "-id", "peak_time", "-peak_time", "end_time", "-end_time",
             "goes_flux", "-goes_flux", "speed_km_s", "-speed_km_s"]
    mismatches = []
    before = lean_events.STATS.lean[lean_events.SEARCH_PATH]
    nq = int(os.environ.get("LEAN_RANDOM_QUERIES", "250"))
    for q in range(nq):
        p: dict = {}
        if rng.random() < 0.8:
            if rng.random() < 0.85:
                p["pa_min"] = _bound(rng)
            if rng.random() < 0.85 or "pa_min" not in p:
                p["pa_max"] = _bound(rng)
            if rng.random() < 0.1 and "pa_min" in p:
                p["pa_max"] = p["pa_min"]
        if rng.random() < 0.6:
            s = T0 + dt.timedelta(minutes=rng.randint(-600, 3 * 24 * 60))
            p["start"] = s.strftime("%Y-%m-%dT%H:%M:%SZ")
            if rng.random() < 0.8:
                p["end"] = (s + dt.timedelta(minutes=rng.randint(10, 3 * 24 * 60))).strftime("%Y-%m-%dT%H:%M:%SZ")
        if rng.random() < 0.5:
            a, b = sorted(rng.uniform(-1200, 1200) for _ in range(2))
            p["hpc_x_min"], p["hpc_x_max"] = repr(round(a, 2)), repr(round(b, 2))
            if rng.random() < 0.6:
                a, b = sorted(rng.uniform(-1200, 1200) for _ in range(2))
                p["hpc_y_min"], p["hpc_y_max"] = repr(round(a, 2)), repr(round(b, 2))
        if rng.random() < 0.5:
            p["type"] = rng.choice(["CE", "PR", ["CE", "PR"], "FL", ["FL", "CE"]])
        if rng.random() < 0.2:
            p["source"] = rng.choice(["cdaw", "detected", ["hek", "cdaw"]])
        if rng.random() < 0.2:
            p["min_goes_class"] = rng.choice(["C1", "M1"])
        if rng.random() < 0.6:
            p["sort"] = rng.choice(sorts)
        p["limit"] = str(rng.choice([1, 3, 10, 50, 500]))
        if rng.random() < 0.3:
            p["offset"] = str(rng.choice([1, 2, 7, 40]))
        limit = rng.choice([None, None, 5, 50, 300])
        if limit is not None:
            monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", limit)
        else:
            monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 10_000)
        try:
            status, body = _same(lean, route, p)
            pages = 0
            while status == 200 and pages < 2 and "offset" not in p:
                cur = json.loads(body).get("next_cursor")
                if not cur:
                    break
                p2 = dict(p, cursor=cur)
                status, body = _same(lean, route, p2)
                pages += 1
        except AssertionError as e:
            mismatches.append((limit, p, str(e)[:600]))
    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 10_000)
    print("LEAN ANSWERS", lean_events.STATS.lean[lean_events.SEARCH_PATH] - before)
    for m in mismatches[:10]:
        print("MISMATCH", m)
    assert not mismatches, f"{len(mismatches)} of {nq}"


def test_odd_bound_strings_same_bytes(clients, db_session, monkeypatch):  # noqa: F811
    from backend.services import event_search

    lean, route = clients
    rng = random.Random(3)
    for i in range(400):
        t = T0 + dt.timedelta(minutes=rng.randint(0, 2 * 24 * 60))
        _ev(db_session, rng.choice(["CE", "PR"]), t, t + 30 * MIN, source="cdaw", position_angle=_rand_pa(rng),
            hpc_x=None if rng.random() < 0.3 else rng.uniform(-1000, 1000), hpc_y=rng.uniform(-1000, 1000),
            speed_km_s=rng.choice([None, 500.0]))
    db_session.flush()
    odd = ["nan", "NaN", "inf", "-inf", "1e400", "-0", "-0.0", "0e0", "5e-324", "359.99999999999999", "360.00000000000001",
           " 5", "5 ", "+5", "0x10", "1_0", "360", "0", "1e2", "", "٣"]
    window = {"start": "2024-05-14T17:00:00Z", "end": "2024-05-15T20:00:00Z"}
    bad = []
    for lo in odd:
        for hi in ["60", "0", "nan"]:
            for extra in ({}, window, dict(window, hpc_x_min="-500", hpc_x_max="500"),
                          {"hpc_x_min": lo if lo else "1", "hpc_x_max": "inf", "start": "2024-05-14T17:00:00Z",
                           "end": "2024-05-15T20:00:00Z"},
                          {"start": "0001-01-01T00:00:00Z", "end": "9999-12-31T00:00:00Z", "hpc_x_min": "-1e308",
                           "hpc_x_max": "1e308"}):
                p = {"pa_min": lo, "pa_max": hi, **extra}
                for lim in (10_000, 3):
                    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", lim)
                    try:
                        _same(lean, route, p)
                    except AssertionError as e:
                        bad.append((lim, p, str(e)[:400]))
    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 10_000)
    for b in bad[:10]:
        print("MISMATCH", b)
    assert not bad, len(bad)
