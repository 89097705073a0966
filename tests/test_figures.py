"""Plotly figure builders (backend.render.figures): traces, shapes, axis titles and values."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from backend.render.figures import HEK_EVENT_TYPES, events_timeline_figure, hek_label, lightcurve_figure

T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)


def ev(id, type_, start_min, peak_min=None, end_min=None, source="goes_xrs", goes_class=None):
    """An event-like row with times in minutes after T0."""
    m = dt.timedelta(minutes=1)
    return SimpleNamespace(
        id=id, event_type=type_, source=source, goes_class=goes_class,
        start_time=T0 + start_min * m,
        peak_time=None if peak_min is None else T0 + peak_min * m,
        end_time=None if end_min is None else T0 + end_min * m,
    )


def test_hek_label():
    assert hek_label("FL") == "FL (Flare)"
    assert hek_label("CE") == "CE (Coronal mass ejection)"
    assert hek_label("ZZ") == "ZZ"
    assert "PR" in HEK_EVENT_TYPES


def test_timeline_one_row_per_hek_type_with_bars_and_peaks():
    events = [
        ev(1, "FL", 0, 10, 30, goes_class="M1.2"),
        ev(2, "CE", 5, None, 125, source="cdaw"),
        ev(3, "FL", 60, 65, 80, goes_class="C3.4"),
        ev(4, "PR", 90),  # no peak, no end: marker only
    ]
    fig = events_timeline_figure(events)
    bars = [t for t in fig.data if t.type == "bar"]
    markers = [t for t in fig.data if t.type == "scatter"]
    assert sorted(t.name for t in bars) == ["CE (Coronal mass ejection)", "FL (Flare)"]
    assert len(markers) == 3  # CE, FL, PR
    fl = next(t for t in bars if t.name.startswith("FL"))
    assert fl.orientation == "h"
    assert list(fl.customdata) == [1, 3]
    # durations in milliseconds, as plotly.express.timeline
    assert list(fl.x) == [30 * 60_000.0, 20 * 60_000.0]
    assert [b.isoformat() if hasattr(b, "isoformat") else b for b in fl.base][0].startswith("2024-05-14T16:00:00")
    ce_bar = next(t for t in bars if t.name.startswith("CE"))
    assert list(ce_bar.x) == [120 * 60_000.0]
    fl_peaks = next(t for t in markers if t.legendgroup == "FL")
    # marker at the peak time
    assert [x.minute for x in fl_peaks.x] == [10, 5]
    assert fl_peaks.x[1].hour == 17
    pr = next(t for t in markers if t.legendgroup == "PR")
    assert pr.showlegend is True  # no bar trace carries its legend entry
    assert list(pr.customdata) == [4]
    assert pr.x[0] == T0 + dt.timedelta(minutes=90)  # start time stands in for the missing peak
    assert "M1.2" in fl.hovertext[0]
    assert fig.layout.xaxis.type == "date"
    assert fig.layout.xaxis.title.text == "Time (UTC)"
    assert fig.layout.yaxis.title.text == "HEK event type"
    assert fig.layout.title.text == "Event timeline: 4 events"
    assert fig.layout.barmode == "overlay"


def test_timeline_title_says_when_capped():
    events = [ev(i, "FL", i, i + 1, i + 2) for i in range(1, 4)]
    fig = events_timeline_figure(events, total=250)
    assert fig.layout.title.text == "Event timeline: newest 3 of 250 events shown (capped)"
    assert events_timeline_figure(events, total=3).layout.title.text == "Event timeline: 3 events"


def test_timeline_empty_says_so():
    fig = events_timeline_figure([])
    assert len(fig.data) == 0
    assert any("No events" in a.text for a in fig.layout.annotations)
    assert fig.layout.title.text == "Event timeline: 0 events"


def test_timeline_naive_times_are_utc_and_serialise():
    e = ev(7, "FL", 0, 5, 10)
    e.start_time = e.start_time.replace(tzinfo=None)  # as SQLite hands them back
    fig = events_timeline_figure([e])
    payload = json.loads(fig.to_json())
    bar = next(t for t in payload["data"] if t["type"] == "bar")
    assert bar["base"][0].startswith("2024-05-14T16:00:00")
    assert bar["x"] == [600000.0]


def test_lightcurve_marks_start_peak_end():
    event = ev(12, "FL", 10, 20, 40)
    times = [T0 + dt.timedelta(minutes=m) for m in range(0, 60, 5)]
    values = [100.0 + (50.0 if 10 <= i * 5 <= 40 else 0.0) for i in range(len(times))]
    fig = lightcurve_figure(times, values, "erg cm-2 s-1 sr-1", event)
    assert len(fig.data) == 1
    trace = fig.data[0]
    assert trace.mode == "lines+markers"
    assert list(trace.y) == values
    assert list(trace.x) == times
    shapes = {s.name: s for s in fig.layout.shapes}
    assert set(shapes) == {"start", "peak", "end"}
    assert shapes["peak"].x0 == T0 + dt.timedelta(minutes=20)
    assert shapes["end"].x0 == T0 + dt.timedelta(minutes=40)
    assert shapes["start"].yref == "paper" and shapes["start"].y0 == 0 and shapes["start"].y1 == 1
    assert [a.text for a in fig.layout.annotations] == ["start", "peak", "end"]
    assert fig.layout.yaxis.title.text == "Disk-integrated mean [erg cm-2 s-1 sr-1]"
    assert fig.layout.xaxis.title.text == "Time (UTC)"
    assert fig.layout.title.text == "SDI light curve around FL #12"


def test_lightcurve_without_peak_or_end_and_for_coronagraph():
    event = ev(3, "CE", 0)
    fig = lightcurve_figure([T0], [1.5e-9], "MSB", event, channel="SCI-WL")
    assert [s.name for s in fig.layout.shapes] == ["start"]
    assert fig.layout.yaxis.title.text == "Mean over coronal field [MSB]"
    assert fig.layout.title.text == "SCI-WL light curve around CE #3"


def test_lightcurve_empty_says_no_products():
    fig = lightcurve_figure([], [], "erg cm-2 s-1 sr-1", ev(1, "FL", 0, 1, 2))
    assert list(fig.data[0].x) == []
    assert any(a.text == "No written SDI L2 products in this window" for a in fig.layout.annotations)


def test_lightcurve_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        lightcurve_figure([T0], [1.0, 2.0], "DN/s", ev(1, "FL", 0))
