"""Associations across sources and types: same flare, flare -> CME, prominence eruption -> CME."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from backend.models import Event
from backend.services.events import associate_events, associated_events
from pipelines.detect.associate import (
    cme_follows,
    disk_position_angle,
    pa_difference,
    same_flare,
)

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


def ev(session, event_type, start, end=None, *, peak=None, source="goes_xrs", **kw) -> Event:
    e = Event(event_type=event_type, source=source, source_key=uuid.uuid4().hex, start_time=start,
              peak_time=peak, end_time=end, attributes={}, **kw)
    session.add(e)
    session.flush()
    return e


def test_disk_position_angle_and_differences():
    assert disk_position_angle(0, 500) == pytest.approx(0)
    assert disk_position_angle(-500, 0) == pytest.approx(90)  # east limb
    assert disk_position_angle(0, -500) == pytest.approx(180)
    assert disk_position_angle(500, 0) == pytest.approx(270)  # west limb
    assert pa_difference(350, 10) == pytest.approx(20) and pa_difference(90, 270) == pytest.approx(180)


def test_rules_on_rows():
    class R:
        def __init__(self, **kw):
            self.__dict__.update(dict(event_type="FL", peak_time=None, end_time=None, hpc_x=None, hpc_y=None,
                                      position_angle=None, angular_width=None), **kw)

    g = R(start_time=T0, peak_time=T0 + 10 * MIN, end_time=T0 + 20 * MIN, hpc_x=-600, hpc_y=300)
    assert same_flare(R(start_time=T0 + 5 * MIN, peak_time=T0 + 9 * MIN, hpc_x=-590, hpc_y=320), g)
    assert not same_flare(R(start_time=T0 + 5 * MIN, peak_time=T0 + 9 * MIN, hpc_x=600, hpc_y=300), g)  # far
    assert not same_flare(R(start_time=T0 + 60 * MIN, peak_time=T0 + 65 * MIN), g)  # later
    pa = disk_position_angle(-600, 300)  # ~63 deg
    ok, _ = cme_follows(g, R(event_type="CE", start_time=T0 + 30 * MIN, position_angle=pa + 25, angular_width=40))
    assert ok
    assert not cme_follows(g, R(event_type="CE", start_time=T0 + 30 * MIN, position_angle=pa + 90,
                                angular_width=40))[0]
    assert not cme_follows(g, R(event_type="CE", start_time=T0 + 120 * MIN, position_angle=pa,
                                angular_width=40))[0]  # too late
    assert cme_follows(g, R(event_type="CE", start_time=T0 + 30 * MIN, position_angle=pa + 180,
                            angular_width=360))[0]  # halo


def test_associate_events_links_both_ways_and_is_idempotent(db_session):
    s = db_session
    goes = ev(s, "FL", T0, T0 + 30 * MIN, peak=T0 + 12 * MIN, goes_class="M2.0", hpc_x=-700, hpc_y=350)
    wst = ev(s, "FL", T0 + 5 * MIN, T0 + 20 * MIN, peak=T0 + 11 * MIN, source="lst_wst", goes_class="M2.0",
             hpc_x=-690, hpc_y=340, channels="WST")
    sdi = ev(s, "FL", T0 + 4 * MIN, T0 + 25 * MIN, peak=T0 + 12 * MIN, source="detected", channels="SDI",
             hpc_x=-705, hpc_y=352, frm_name="lst-sdi-flare", frm_version="1.0.0")
    other = ev(s, "FL", T0 + 6 * MIN, T0 + 16 * MIN, peak=T0 + 10 * MIN, goes_class="C1.0", hpc_x=300, hpc_y=400,
               source="hek")  # simultaneous flare elsewhere on the disk
    pa = disk_position_angle(-700, 350)
    cme = ev(s, "CE", T0 + 35 * MIN, source="cdaw", position_angle=pa + 15, angular_width=70, speed_km_s=800)
    wrong_way = ev(s, "CE", T0 + 40 * MIN, source="donki", position_angle=(pa + 150) % 360, angular_width=30)
    prom = ev(s, "PR", T0 + 200 * MIN, T0 + 260 * MIN, source="detected", channels="SCI-UV",
              position_angle=250.0, frm_name="lst-prominence-eruption", frm_version="0.1.0")
    cme2 = ev(s, "CE", T0 + 230 * MIN, source="detected", channels="SCI-UV", position_angle=245.0,
              angular_width=50, speed_km_s=400, frm_name="lst-sci-cme", frm_version="0.1.0")

    n = associate_events(s)
    # wst-goes; sdi-goes, sdi-wst; the CME with the flare's row of each source (goes, wst, sdi); prom-cme2
    assert n == 7

    def linked(e):
        return {(o.id, k) for o, k in associated_events(s, e.id)}

    assert linked(sdi) == {(goes.id, "same_flare"), (wst.id, "same_flare"), (cme.id, "flare_cme")}
    assert (sdi.id, "same_flare") in linked(wst) and (sdi.id, "same_flare") in linked(goes)
    assert linked(cme) == {(goes.id, "cme_flare"), (wst.id, "cme_flare"), (sdi.id, "cme_flare")}
    assert linked(wrong_way) == set() and linked(other) == set()
    assert linked(cme2) == {(prom.id, "cme_prominence")} and linked(prom) == {(cme2.id, "prominence_cme")}
    assert associate_events(s) == 0  # idempotent


def test_associate_around_links_found_events_where_they_are_and_nothing_elsewhere(db_session):
    """``associate_around`` (detections link their events without re-proposing the whole
    catalogue): both windows of events years apart are linked, and a partner that started
    9 h before; events of a window no found event lies in are left alone."""
    from backend.services.events import associate_around

    s = db_session
    made = []
    for day in (dt.datetime(2004, 3, 1, 4, tzinfo=dt.UTC), dt.datetime(2011, 6, 7, 6, tzinfo=dt.UTC)):
        goes = ev(s, "FL", day, day + 40 * MIN, peak=day + 20 * MIN, goes_class="M2.5", hpc_x=716, hpc_y=-340)
        sdi = ev(s, "FL", day + 2 * MIN, day + 35 * MIN, peak=day + 19 * MIN, source="detected", channels="SDI",
                 hpc_x=710, hpc_y=-345, frm_name="lst-sdi-flare", frm_version="1.0.0")
        cme = ev(s, "CE", day + 60 * MIN, source="cdaw", position_angle=disk_position_angle(716, -340),
                 angular_width=60, speed_km_s=700)
        made.append((goes, sdi, cme))
    # a 10-hour GOES flare (its start 9 h before its peak) and the SDI flare at that peak
    t = dt.datetime(2015, 3, 11, 0, tzinfo=dt.UTC)
    long_goes = ev(s, "FL", t, t + 10 * 60 * MIN, peak=t + 9 * 60 * MIN, goes_class="C3.0", hpc_x=-200, hpc_y=100)
    long_sdi = ev(s, "FL", t + 8 * 60 * MIN + 50 * MIN, t + 9 * 60 * MIN + 30 * MIN, peak=t + 9 * 60 * MIN + 2 * MIN,
                  source="detected", channels="SDI", hpc_x=-205, hpc_y=104, frm_name="lst-sdi-flare",
                  frm_version="1.0.0")
    # elsewhere (2008): a GOES and a HEK row of one flare, which a whole-catalogue pass would link
    t8 = dt.datetime(2008, 1, 1, 12, tzinfo=dt.UTC)
    g8 = ev(s, "FL", t8, t8 + 20 * MIN, peak=t8 + 10 * MIN, goes_class="C1.0", hpc_x=100, hpc_y=100, noaa_ar=10980)
    h8 = ev(s, "FL", t8, t8 + 20 * MIN, peak=t8 + 10 * MIN, source="hek", hpc_x=102, hpc_y=99, noaa_ar=10980)

    def linked(e):
        return {(o.id, k) for o, k in associated_events(s, e.id)}

    n = associate_around(s, [sdi for _g, sdi, _c in made] + [long_sdi])
    for goes, sdi, cme in made:
        assert linked(sdi) == {(goes.id, "same_flare"), (cme.id, "flare_cme")}, sdi.start_time
    assert linked(long_sdi) == {(long_goes.id, "same_flare")}
    assert linked(g8) == set() and linked(h8) == set()
    assert n >= 5 and associate_around(s, []) == 0
    assert associate_around(s, [sdi for _g, sdi, _c in made]) == 0  # idempotent


@pytest.mark.parametrize("text, hidden", [
    ('{"visible_from_earth": false}', True),
    ('{"visible\\u005ffrom_earth":false}', True),  # the key written with an escape (any JSON writer may)
    ('{"visible_from_earth": true, "note": "false"}', False),
    ('{"visible_from_earth": 0}', False),  # not JSON false
    ('{"other": {"visible_from_earth": false}}', False),  # only the top-level key counts
    ('{}', False),
])
def test_a_flare_its_catalogue_hides_from_earth_links_to_no_earth_flare_however_its_json_is_written(
        db_session, text, hidden):
    """The flag is read from the stored JSON text as the ORM would decode it
    (``_hidden_from_earth_ids``), whatever the text's spelling: a STIX flare behind the limb as
    seen from Earth is never the same flare as a GOES one, however close in time and place."""
    from sqlalchemy import text as sql

    s = db_session
    goes = ev(s, "FL", T0, T0 + 30 * MIN, peak=T0 + 12 * MIN, goes_class="M2.0", hpc_x=-700, hpc_y=350)
    stix = ev(s, "FL", T0 + 2 * MIN, T0 + 25 * MIN, peak=T0 + 11 * MIN, source="stix", hpc_x=-705, hpc_y=345)
    s.execute(sql("UPDATE events SET attributes = CAST(:a AS json) WHERE id = :i"), {"a": text, "i": stix.id})
    associate_events(s)
    linked = {o.id for o, _ in associated_events(s, goes.id)}
    assert (stix.id in linked) is (not hidden)
