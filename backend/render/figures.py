"""Plotly figures of the event browser, built and tested in Python, sent to the browser as JSON.

As in TOM Toolkit: the figure is composed here (``plotly.graph_objects``), serialised with
``fig.to_json()`` by the API, and drawn by one small JS function (``frontend/static/app.js``)
with ``Plotly.newPlot``. Nothing in this module touches the database or HTTP.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import plotly.graph_objects as go

from pipelines.utc import as_utc

__all__ = [
    "HEK_EVENT_TYPES",
    "hek_label",
    "events_timeline_figure",
    "lightcurve_figure",
    "EVENT_COLOURS",
]

#: HEK event codes (Hurlburt et al. 2012, Sol. Phys. 275, 67, table 2) with the project's
#: ``PR`` for prominences (eruptions) seen off the limb by SCI.
HEK_EVENT_TYPES: dict[str, str] = {
    "AR": "Active region",
    "CC": "Coronal cavity",
    "CD": "Coronal dimming",
    "CE": "Coronal mass ejection",
    "CH": "Coronal hole",
    "CJ": "Coronal jet",
    "CR": "Coronal rain",
    "CW": "Coronal wave",
    "EF": "Emerging flux",
    "ER": "Eruption",
    "FA": "Filament activation",
    "FE": "Filament eruption",
    "FI": "Filament",
    "FL": "Flare",
    "LP": "Loop",
    "OS": "Oscillation",
    "OT": "Other",
    "PG": "Plage",
    "PR": "Prominence",
    "SG": "Sigmoid",
    "SP": "Spray surge",
    "SS": "Sunspot",
}

#: Colour per HEK code (colour-blind safe Okabe-Ito palette for the common ones).
EVENT_COLOURS: dict[str, str] = {
    "FL": "#D55E00",
    "CE": "#0072B2",
    "PR": "#CC79A7",
    "AR": "#E69F00",
    "CH": "#009E73",
    "FI": "#56B4E9",
    "FE": "#56B4E9",
}
_DEFAULT_COLOUR = "#666666"


class _EventLike(Protocol):
    id: int
    event_type: str
    source: str
    start_time: dt.datetime
    peak_time: dt.datetime | None
    end_time: dt.datetime | None


def hek_label(code: str) -> str:
    """``'FL (Flare)'`` for ``'FL'``; unknown codes are returned as they are."""
    name = HEK_EVENT_TYPES.get(code)
    return f"{code} ({name})" if name else code


def _iso(t: dt.datetime | None) -> str:
    t = as_utc(t)
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _hover(e: Any) -> str:
    parts = [f"<b>{e.event_type} #{e.id}</b> ({e.source})"]
    if getattr(e, "goes_class", None):
        parts.append(f"GOES class {e.goes_class}")
    parts.append(f"start {_iso(e.start_time)}")
    parts.append(f"peak {_iso(e.peak_time)}")
    parts.append(f"end {_iso(e.end_time)}")
    return "<br>".join(parts)


def events_timeline_figure(
    events: Iterable[_EventLike],
    *,
    total: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Timeline of events: one row per HEK type, a bar from start to end, a marker at peak.

    Parameters
    ----------
    events : iterable of Event
        Rows with ``id``, ``event_type``, ``source``, ``start_time``, ``peak_time``,
        ``end_time`` (and optionally ``goes_class``), already capped by the caller.
    total : int, optional
        How many events matched before capping; when larger than the number drawn, the
        title says that only the newest N of ``total`` are shown (the caller passes them).
    title : str, optional
        Overrides the default title.

    Returns
    -------
    plotly.graph_objects.Figure
        Per HEK type: a horizontal ``Bar`` trace (``base`` = start time, ``x`` = duration in
        milliseconds, as ``plotly.express.timeline``; only events with an end time) and a
        ``Scatter`` marker trace at the peak time (start time when there is no peak). Both
        carry the event ids in ``customdata`` so a click can open the event page.
    """
    rows = list(events)
    by_type: dict[str, list[_EventLike]] = {}
    for e in sorted(rows, key=lambda e: (as_utc(e.start_time), e.id)):
        by_type.setdefault(e.event_type, []).append(e)
    fig = go.Figure()
    for code in sorted(by_type):
        evs = by_type[code]
        label = hek_label(code)
        colour = EVENT_COLOURS.get(code, _DEFAULT_COLOUR)
        with_end = [e for e in evs if e.end_time is not None]
        if with_end:
            fig.add_trace(go.Bar(
                name=label,
                legendgroup=code,
                orientation="h",
                y=[label] * len(with_end),
                base=[as_utc(e.start_time) for e in with_end],
                x=[max((as_utc(e.end_time) - as_utc(e.start_time)).total_seconds(), 0.0) * 1000.0 for e in with_end],
                customdata=[e.id for e in with_end],
                hovertext=[_hover(e) for e in with_end],
                hoverinfo="text",
                marker={"color": colour, "opacity": 0.55, "line": {"width": 0}},
            ))
        fig.add_trace(go.Scatter(
            name=f"{code} peak",
            legendgroup=code,
            showlegend=not with_end,
            mode="markers",
            y=[label] * len(evs),
            x=[as_utc(e.peak_time or e.start_time) for e in evs],
            customdata=[e.id for e in evs],
            hovertext=[_hover(e) for e in evs],
            hoverinfo="text",
            marker={"color": colour, "symbol": "diamond", "size": 8, "line": {"width": 1, "color": "#222"}},
        ))
    n = len(rows)
    if title is None:
        if total is not None and total > n:
            title = f"Event timeline: newest {n} of {total} events shown (capped)"
        else:
            title = f"Event timeline: {n} event{'s' if n != 1 else ''}"
    fig.update_layout(
        title={"text": title},
        barmode="overlay",
        xaxis={"type": "date", "title": {"text": "Time (UTC)"}},
        yaxis={"title": {"text": "HEK event type"}, "type": "category", "autorange": "reversed"},
        hovermode="closest",
        margin={"l": 150, "r": 20, "t": 50, "b": legend_margin(len(fig.data))},
        height=max(220, 90 + 55 * max(len(by_type), 1)) + legend_margin(len(fig.data)) - 50,
        legend=LEGEND_BELOW,
        template="plotly_white",
    )
    if not rows:
        fig.add_annotation(text="No events match these filters", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


#: A legend under the plot that never runs into the time axis's title or tick labels: placed
#: at the bottom of the figure's container (not a fraction of the plot area, which lands on
#: the axis title at some heights), the axes pushing the margin for their labels.
LEGEND_BELOW = {"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0, "xanchor": "left"}
#: Room [px] under the plot for the time axis: two-line date tick labels and the axis title
#: (measured ~72 px in Chromium with Plotly's default fonts).
AXIS_BELOW_PX = 76
#: Bottom margin [px] of a figure with :data:`LEGEND_BELOW`: the axis (:data:`AXIS_BELOW_PX`)
#: and one legend row with its padding (~32 px), plus :data:`LEGEND_ROW_PX` for each further
#: row (:func:`legend_margin`).
LEGEND_MARGIN_PX = AXIS_BELOW_PX + 32
LEGEND_ROW_PX = 22
#: Two event-mark labels (start, peak, end) nearer than this fraction of the time axis go on
#: separate rows: a label is ~30 px wide, and the plot area of an 800-px-wide page ~620 px,
#: so 7 % (~43 px) keeps them apart down to ~430 px of plot width.
MARK_LABEL_GAP = 0.07
#: Height of one row of mark labels [px].
MARK_ROW_PX = 15


def legend_margin(entries: int, per_row: int = 3) -> int:
    """Bottom margin [px] for :data:`LEGEND_BELOW` with ``entries`` legend items, ``per_row``
    to a row at 800 px (the narrowest page width the pages are checked at)."""
    rows = max(1, -(-entries // per_row))
    return LEGEND_MARGIN_PX + LEGEND_ROW_PX * (rows - 1)


def add_event_marks(fig, event, window=None, *, name_prefix: str | None = None) -> int:
    """Vertical lines at the event's start, peak and end (``layout.shapes`` named ``start``,
    ``peak``, ``end``) across the figure, each labelled above the plot; a label nearer than
    :data:`MARK_LABEL_GAP` of the time axis to another goes a row higher (coincident or close
    times never overprint).

    Parameters
    ----------
    fig : plotly.graph_objects.Figure
    event : Event-like
        ``start_time``, ``peak_time``, ``end_time`` (aware or naive UTC; None where unknown).
    window : (datetime, datetime), optional
        The time axis's range; default the span of the marks.
    name_prefix : str, optional
        The annotations' names are ``<prefix><mark>`` when given.

    Returns
    -------
    int
        Rows of labels used (0 without marks); the top margin needs ``MARK_ROW_PX`` more per row past the first.
    """
    marks = [(n, as_utc(t)) for n, t in (("start", event.start_time), ("peak", event.peak_time),
                                          ("end", event.end_time)) if t is not None]
    if not marks:
        return 0
    lo, hi = (as_utc(window[0]), as_utc(window[1])) if window else (marks[0][1], max(t for _, t in marks))
    span = max((hi - lo).total_seconds(), 1.0)
    placed: list[tuple[float, int]] = []
    for name, t in marks:
        f = (t - lo).total_seconds() / span
        row = 0
        while any(r == row and abs(f - g) < MARK_LABEL_GAP for g, r in placed):
            row += 1
        placed.append((f, row))
        style = _MARK_STYLE[name]
        fig.add_shape(type="line", xref="x", yref="paper", x0=t, x1=t, y0=0, y1=1,
                      line={"color": style["color"], "dash": style["dash"], "width": 1.5}, name=name)
        extra = {"name": f"{name_prefix}{name}"} if name_prefix else {}
        fig.add_annotation(x=t, xref="x", y=1.0, yref="paper", yanchor="bottom", yshift=MARK_ROW_PX * row,
                           text=name, showarrow=False, font={"color": _MARK_TEXT[name]}, **extra)
    return 1 + max(r for _, r in placed)


_MARK_STYLE = {
    "start": {"color": "#009E73", "dash": "dash"},
    "peak": {"color": "#D55E00", "dash": "solid"},
    "end": {"color": "#0072B2", "dash": "dash"},
}
#: Label colours of the marks: the line's hue, dark enough for 4.5:1 on white (WCAG 2.2 SC 1.4.3).
_MARK_TEXT = {"start": "#00704f", "peak": "#a84300", "end": "#0072B2"}


def lightcurve_figure(
    times: Sequence[dt.datetime],
    values: Sequence[float],
    unit: str,
    event: _EventLike,
    *,
    channel: str = "SDI",
    region: str | None = None,
    roi: tuple[float, float, float] | None = None,
) -> go.Figure:
    """Light curve of one channel around an event (disk, coronal field or a region).

    Parameters
    ----------
    times : sequence of datetime
        DATE-OBS of each L2 product (UTC).
    values : sequence of float or None
        Mean over the solar disk (SCI: over the unmasked coronal field) in ``unit``; None
        or NaN for a missing sample, drawn as a gap (``connectgaps=False``).
    unit : str
        Physical unit of ``values`` (``BUNIT``, e.g. ``erg cm-2 s-1 sr-1`` or ``MSB``).
    event : Event
        The event: its start, peak and end times are marked by vertical lines
        (``layout.shapes``, one per time the event has) labelled by annotations.
    channel : str
        The channel the products come from (``SDI`` by default), for the titles.
    region : str, optional
        ``disk``, ``field`` or ``roi``; default: ``field`` for SCI, else ``disk``.
    roi : (hpc_x, hpc_y, half_width), optional
        The box [arcsec] of a ``roi`` light curve, named in the axis title.

    Returns
    -------
    plotly.graph_objects.Figure
        One ``Scatter`` trace (lines+markers) of ``values`` against ``times``.
    """
    if len(times) != len(values):
        raise ValueError(f"times ({len(times)}) and values ({len(values)}) differ in length")
    region = region or ("field" if channel.upper().startswith("SCI") else "disk")
    if region == "roi" and roi is not None:
        x, y, hw = roi
        what = f"Mean over ({x:.0f}\u2033, {y:.0f}\u2033) \u00b1{hw:.0f}\u2033"
    elif region == "roi":
        what = "Mean over the event region"
    else:
        what = "Mean over coronal field" if region == "field" else "Disk-integrated mean"
    fig = go.Figure(go.Scatter(
        name=f"{channel} L2",
        x=[as_utc(t) for t in times],
        # a missing sample (None or NaN: every pixel masked) is a gap in the line, not bridged
        y=[None if v is None or v != v else v for v in values],
        mode="lines+markers",
        connectgaps=False,
        line={"color": "#333", "width": 1.5},
        marker={"size": 5},
        hovertemplate="%{x|%Y-%m-%d %H:%M:%S}<br>%{y:.4g} " + unit.replace("%", "%%") + "<extra></extra>",
    ))
    edges = [as_utc(t) for t in times] + [as_utc(t) for t in (event.start_time, event.peak_time, event.end_time) if t]
    rows = add_event_marks(fig, event, (min(edges), max(edges)))
    fig.update_layout(
        title={"text": f"{channel} light curve around {event.event_type} #{event.id}"},
        xaxis={"type": "date", "title": {"text": "Time (UTC)"}},
        yaxis={"title": {"text": f"{what} [{unit}]" if unit else what}},
        hovermode="x unified",
        showlegend=False,
        margin={"l": 80, "r": 20, "t": 60 + MARK_ROW_PX * max(rows - 1, 0), "b": 50},
        height=360,
        template="plotly_white",
    )
    if not times:
        fig.add_annotation(text=f"No written {channel} L2 products in this window", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig
