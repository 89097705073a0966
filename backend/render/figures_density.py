"""The landing timeline's density figure (Plotly): stacked counts per HEK type per time bin.

Built in Python and sent as JSON (``GET /api/v1/events/histogram/figure``); the events page's
``frontend/static/timeline.js`` draws it and asks for the next one when the user zooms. When
the zoomed window holds few enough events the route sends the event-by-event timeline of
:func:`backend.render.figures.events_timeline_figure` instead (markers, a click opens the event).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import plotly.graph_objects as go

from backend.render.figures import EVENT_COLOURS, LEGEND_BELOW, hek_label, legend_margin

__all__ = ["BinnedCounts", "events_density_figure", "width_label"]

_DEFAULT_COLOUR = "#555555"
_DAY = 86_400


class BinnedCounts(Protocol):
    """Counts per HEK type in time bins, as
    :class:`backend.services.event_histogram.Histogram` gives them (its attributes)."""

    start: dt.datetime | None
    end: dt.datetime | None
    bin_s: int
    edges: list[dt.datetime]
    counts: dict[str, list[int]]
    total: int


def width_label(width_s: int) -> str:
    """``'1 min'``, ``'6 h'``, ``'7 days'``... for a bin width [s]."""
    if width_s < 3600:
        return f"{width_s // 60} min"
    if width_s < _DAY:
        return f"{width_s // 3600} h"
    days = width_s // _DAY
    return "1 day" if days == 1 else f"{days} days"


def _iso(t) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def events_density_figure(h: BinnedCounts, *, drill_max: int) -> go.Figure:
    """Stacked bars: per HEK type, the number of events starting in each bin of ``h``.

    Parameters
    ----------
    h : BinnedCounts
        A :class:`backend.services.event_histogram.Histogram`
        (:func:`backend.services.event_histogram.event_histogram`).
    drill_max : int
        The most events a window may hold to be drawn one by one (said in the title).

    Returns
    -------
    plotly.graph_objects.Figure
        One ``Bar`` trace per type (``x`` bin centres, ``width`` the bin [ms], ``y`` counts,
        ``customdata`` the bin's UTC edges: a click zooms into the bin); bins without events
        of a type are left out of its trace. ``layout.meta``: ``{"mode": "bins", "total",
        "bin_s", "start", "end"}``.
    """
    fig = go.Figure()
    width_ms = h.bin_s * 1000.0
    for code, counts in h.counts.items():
        idx = [i for i, c in enumerate(counts) if c]
        label = hek_label(code)
        fig.add_trace(go.Bar(
            name=f"{label} ({sum(counts):,})",
            x=[h.edges[i] + (h.edges[i + 1] - h.edges[i]) / 2 for i in idx],
            y=[counts[i] for i in idx],
            width=[width_ms] * len(idx),
            customdata=[[_iso(h.edges[i]), _iso(h.edges[i + 1])] for i in idx],
            hovertemplate=(f"<b>{label}</b>: %{{y:,}} events<br>%{{customdata[0]}} to %{{customdata[1]}}"
                           "<extra></extra>"),
            marker={"color": EVENT_COLOURS.get(code, _DEFAULT_COLOUR), "line": {"width": 0}},
        ))
    title = (f"All {h.total:,} matching events, per {width_label(h.bin_s)} "
             f"(zoom in to {drill_max:,} or fewer to see each event)")
    fig.update_layout(
        title={"text": title},
        barmode="stack",
        bargap=0,
        xaxis={"type": "date", "title": {"text": "Time (UTC)"},
               "range": [h.edges[0], h.edges[-1]] if h.edges else None},
        yaxis={"title": {"text": f"events per {width_label(h.bin_s)}"}, "rangemode": "tozero", "fixedrange": True},
        hovermode="closest",
        margin={"l": 70, "r": 20, "t": 50, "b": legend_margin(len(fig.data))},
        height=270 + legend_margin(len(fig.data)),
        legend=LEGEND_BELOW,
        template="plotly_white",
        meta={"mode": "bins", "total": h.total, "bin_s": h.bin_s,
              "start": _iso(h.start) if h.start else None, "end": _iso(h.end) if h.end else None},
    )
    if not h.total:
        fig.add_annotation(text="No events match these filters", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
    return fig
