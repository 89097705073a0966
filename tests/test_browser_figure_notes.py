"""The event page's curves figure: its notes, legend and axis titles never overprint.

A browser audit (``tests/test_browser_pages.py``) found, once, the note "1 of 5 products not
measured yet ..." over the LST legend's second row: that note appears only while products are
still being measured, so the audit sees it by timing. Here the figure is built with 0, 1 and 2
notes and drawn by Chromium at both audited widths, and the text boxes of the notes, the legend
entries and the axis titles are compared (the two LST curves share a legendgroup, which a
horizontal legend stacks on two rows).
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from backend.render.event_figures import event_curves_figure
from backend.services.event_curves import EventCurves
from tests.test_browser import browser  # noqa: F401 - fixture

pytestmark = pytest.mark.browser

BOXES_JS = """() => [...document.querySelectorAll(
    'text.annotation-text, text.legendtext, g.xtitle text, g.x2title text, g.ytitle text, g.y2title text')]
  .map(e => {const r = e.getBoundingClientRect(); return [e.textContent, r.left, r.top, r.right, r.bottom]})"""


def _curves(notes: list[str]) -> EventCurves:
    t0 = dt.datetime(2024, 5, 14, 15, 30, tzinfo=dt.UTC)
    times = [t0 + dt.timedelta(minutes=5 * i) for i in range(19)]
    event = SimpleNamespace(event_type="FL", id=1, start_time=t0 + dt.timedelta(minutes=30),
                            peak_time=t0 + dt.timedelta(minutes=42), end_time=t0 + dt.timedelta(minutes=60))
    return EventCurves(event=event, channel="SDI", start=t0, end=t0 + dt.timedelta(minutes=90), unit="MSB",
                       lst_times=times, roi=[1.0 + 0.01 * i for i in range(19)], disk=[1.0] * 19,
                       roi_box=(-420.0, 310.0, 60.0), notes=notes)


@pytest.mark.parametrize("width", (1280, 800))
@pytest.mark.parametrize("n_notes", (0, 1, 2))
def test_notes_legend_and_axis_titles_do_not_overlap(browser, width, n_notes):  # noqa: F811
    notes = ["1 of 5 products not measured yet (first reading of their files): reload for the rest",
             "a second note of the same kind, as long as a note may be"][:n_notes]
    page = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        page.set_content(event_curves_figure(_curves(notes)).to_html(include_plotlyjs=True, full_html=True))
        page.wait_for_function("() => document.querySelectorAll('text.legendtext').length == 2", timeout=10_000)
        boxes = page.evaluate(BOXES_JS)
    finally:
        page.close()
    texts = [b[0] for b in boxes]
    assert sum(t.startswith("LST SDI") for t in texts) == 2 and sum(t in notes for t in texts) == n_notes, texts
    overlaps = [(a[0][:40], b[0][:40], round(min(a[4], b[4]) - max(a[2], b[2]), 1))
                for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if min(a[3], b[3]) - max(a[1], b[1]) > 1 and min(a[4], b[4]) - max(a[2], b[2]) > 1]
    assert not overlaps, overlaps
