"""The event page's curves figure: the LST light curves above the GOES XRS curve on one UTC axis.

Built as :mod:`backend.render.figures` builds its figures (``plotly.graph_objects``, sent as JSON, drawn
by ``frontend/static/app.js``). Nothing here touches the database or HTTP.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.render.figures import AXIS_BELOW_PX, LEGEND_BELOW, MARK_ROW_PX, add_event_marks, legend_margin
from pipelines.utc import as_utc

__all__ = ["event_curves_figure", "event_curves_figure_json", "GOES_CLASS_BANDS", "with_gaps"]

#: GOES class thresholds of the 1-8 Å flux [W m-2]: A 1e-8, B 1e-7, C 1e-6, M 1e-5, X 1e-4
#: (NOAA SWPC flare classification).
GOES_CLASS_BANDS = (("A", 1e-8), ("B", 1e-7), ("C", 1e-6), ("M", 1e-5), ("X", 1e-4))


def with_gaps(times: Sequence[dt.datetime], values: Sequence[float | None], max_step_s: float,
              labels: Sequence[str] | None = None) -> tuple[list, list, list]:
    """Times and values with a None inserted wherever two samples are farther apart than
    ``max_step_s`` (a missing sample: no line is drawn across it); None values stay None.

    Returns
    -------
    (x, y, text) : lists of equal length
        ``text`` repeats ``labels`` as strings (or is empty strings) with "" at inserted breaks;
        ``y`` holds Python numbers and None (NaN becomes None, a NumPy scalar a Python number).
    """
    x, y, text = [], [], []
    prev = None
    for i, (t, v) in enumerate(zip(times, values)):
        if prev is not None and (t - prev).total_seconds() > max_step_s:
            x.append(prev + (t - prev) / 2)
            y.append(None)
            text.append("")
        x.append(t)
        # a NumPy scalar as the Python number plotly's checks make of it (np.float32(0.1) is
        # 0.10000000149011612): the figure route writes these lists without those checks
        y.append(None if v is None or v != v else (v.item() if hasattr(v, "item") else v))
        text.append(str(labels[i]) if labels is not None else "")
        prev = t
    return x, y, text


def _plotly_times(x: Sequence[dt.datetime]) -> list[str]:
    """UTC times as the ISO strings plotly.js reads (a tenth of the cost of serialising datetimes)."""
    return [as_utc(t).strftime("%Y-%m-%d %H:%M:%S.%f") for t in x]


def _median_step(times: Sequence[dt.datetime]) -> float:
    if len(times) < 2:
        return 0.0
    steps = sorted((b - a).total_seconds() for a, b in zip(times, times[1:]))
    return steps[len(steps) // 2]


def event_curves_figure(curves) -> go.Figure:
    """One figure: LST ROI and disk light curves (top) and GOES XRS 1-8 Å and 0.5-4 Å (bottom,
    log flux in W m-2 with the A/B/C/M/X bands), subplots sharing one UTC time axis.

    Parameters
    ----------
    curves : backend.services.event_curves.EventCurves

    Returns
    -------
    plotly.graph_objects.Figure
        Traces ``LST ROI``, ``LST disk`` (row 1, when products exist) and ``GOES 1-8 Å``,
        ``GOES 0.5-4 Å`` (row 2, when a series covers the window); gaps are None (missing
        samples: a None is inserted where the spacing exceeds 1.5 cadences, the XRS file's cadence or the
        median spacing of the LST products);
        the event's start, peak and end are vertical lines across both rows (``layout.shapes``
        named start/peak/end); an annotation says when there is no LST product or no XRS series,
        and which calibration set the LST curves use.
    """
    return _curves_figure(curves, None)


def event_curves_figure_json(curves) -> str:
    """``event_curves_figure(curves).to_json()``, the same bytes, for a fraction of the CPU.

    plotly checks every element of a trace's lists when they are set on a ``go.Scatter`` (and
    copies them again in ``to_dict``): with a GOES window of some 5000 samples that was 90 % of
    the event page's figure route. Here the traces are built with empty sample lists, which
    plotly checks as it always does, and the lists are put in place in the figure's dict before
    it is written, with plotly's own JSON writer (``plotly.io.to_json``, ``validate=False``, trace
    ``uid`` removed as ``Figure.to_json`` does). The lists hold only what plotly's checks leave
    as they are: Python numbers, None and strings (:func:`with_gaps` makes them so, and every
    list set here comes from it). ``tests/test_xray.py`` compares the two with every trace, with
    none, and with NumPy values.
    """
    import plotly.io as pio

    arrays: list[tuple[int, dict]] = []
    d = _curves_figure(curves, arrays).to_dict()
    for i, cols in arrays:
        d["data"][i].update(cols)  # the keys exist (empty lists): plotly's key order is kept
    return pio.to_json(d, validate=False)


def _scatter(fig: go.Figure, deferred: list | None, row: int, cols: dict, **kw) -> None:
    """``fig.add_trace(go.Scatter(**cols, **kw), row=row, col=1)``; with ``deferred`` a list,
    the trace gets empty lists for ``cols`` and ``(trace index, cols)`` is appended to it."""
    if deferred is not None:
        deferred.append((len(fig.data), cols))
        cols = {k: [] for k in cols}
    fig.add_trace(go.Scatter(**cols, **kw), row=row, col=1)


def _curves_figure(curves, deferred: list | None) -> go.Figure:
    c = curves
    e = c.event
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.45, 0.55])
    unit = c.unit.replace("%", "%%")
    if c.lst_times:
        step = max(1.5 * _median_step(c.lst_times), 1.0)  # a longer step skipped a frame
        if c.roi_box:
            x, y, _ = with_gaps(c.lst_times, c.roi, step)
            x = _plotly_times(x)
            _scatter(fig, deferred, 1, {"x": x, "y": y},
                     name=f"LST {c.channel} ROI ({c.roi_box[0]:.0f}\u2033, {c.roi_box[1]:.0f}\u2033) \u00b1{c.roi_box[2]:.0f}\u2033",
                     mode="lines+markers", connectgaps=False, line={"color": "#D55E00", "width": 1.5},
                     marker={"size": 5}, legendgroup="lst",
                     hovertemplate="%{x|%Y-%m-%d %H:%M:%S} UTC<br>ROI %{y:.4g} " + unit + "<extra></extra>")
        x, y, _ = with_gaps(c.lst_times, c.disk, step)
        x = _plotly_times(x)
        _scatter(fig, deferred, 1, {"x": x, "y": y},
                 name=f"LST {c.channel} disk", mode="lines+markers", connectgaps=False,
                 line={"color": "#333333", "width": 1.5}, marker={"size": 5}, legendgroup="lst",
                 hovertemplate="%{x|%Y-%m-%d %H:%M:%S} UTC<br>disk %{y:.4g} " + unit + "<extra></extra>")
        cal = f"calibration set: {c.calibration.label}" if c.calibration else ""
        if c.frames_other_sets:
            cal += f"; {c.frames_other_sets} frame(s) with other sets only not drawn"
        fig.add_annotation(text=cal, showarrow=False, xref="x domain", yref="y domain", x=0.0, y=1.0,
                           xanchor="left", yanchor="top", font={"size": 10, "color": "#555"}, name="calibration")
    else:
        fig.add_annotation(text=f"No written {c.channel} L2 products in this window", showarrow=False,
                           xref="x domain", yref="y domain", x=0.5, y=0.5, name="no-lst", bgcolor="rgba(255,255,255,0.9)")
    if c.xray is not None:
        s = c.xray
        times = s.times
        step = 1.5 * max(s.series.cadence_s, 1e-3)
        iso = s.times_iso
        for name, vals, colour in (("GOES 1-8 \u00c5", s.xrsb, "#CC0000"), ("GOES 0.5-4 \u00c5", s.xrsa, "#0072B2")):
            x, y, text = with_gaps(times, vals, step, iso)
            x = _plotly_times(x)
            _scatter(fig, deferred, 2, {"x": x, "y": y, "text": text},
                     name=f"{name} ({s.series.satellite})", mode="lines", connectgaps=False,
                     line={"color": colour, "width": 1.3}, legendgroup="goes",
                     hovertemplate="%{text}<br>%{y:.3e} W m\u207b\u00b2<extra>" + name + "</extra>")
        fig.add_annotation(text=f"{s.series.satellite} \u00b7 {s.series.original_name} \u00b7 cadence "
                                f"{s.series.cadence_s:.3g} s" + (f" \u00b7 also: {', '.join(c.xray_others)}" if c.xray_others else ""),
                           showarrow=False, xref="x2 domain", yref="y2 domain", x=0.0, y=1.0, xanchor="left",
                           yanchor="top", font={"size": 10, "color": "#555"}, name="xrs-source")
    else:
        # one stored span a line: a list joined on one line ran over the axes at 800 px
        spans = "<br>".join(f"{sat} {as_utc(a):%Y-%m-%d %H:%M}\u2013{as_utc(b):%Y-%m-%d %H:%M}" for sat, a, b in c.xray_coverage[:6])
        fig.add_annotation(text="No GOES XRS series stored for this window" + (f"<br>stored:<br>{spans}" if spans else ""),
                           showarrow=False, xref="x2 domain", yref="y2 domain", x=0.5, y=0.5, name="no-xrs", bgcolor="rgba(255,255,255,0.9)",
                           font={"size": 12})
    # GOES class bands: a line at each threshold, its letter at the right edge
    for letter, flux in GOES_CLASS_BANDS:
        fig.add_shape(type="line", xref="x2 domain", yref="y2", x0=0, x1=1, y0=flux, y1=flux,
                      line={"color": "#bbbbbb", "width": 1, "dash": "dot"}, name=f"class-{letter}")
        # annotations on a log axis take log10 of the value (shapes take the value itself)
        fig.add_annotation(text=letter, xref="x2 domain", yref="y2", x=1.0, y=math.log10(flux), xanchor="left", yanchor="bottom",
                           showarrow=False, font={"size": 11, "color": "#777"}, name=f"class-{letter}")
    rows = add_event_marks(fig, e, (c.start, c.end), name_prefix="mark-")
    # the window on both (matched) axes: plotly takes the range of the axis the other matches
    fig.update_xaxes(type="date", range=[as_utc(c.start), as_utc(c.end)], row=1, col=1)
    fig.update_xaxes(type="date", range=[as_utc(c.start), as_utc(c.end)], title={"text": "Time (UTC)"}, row=2, col=1)
    fig.update_yaxes(title={"text": f"LST {c.channel} mean [{c.unit}]" if c.unit else f"LST {c.channel} mean"}, row=1, col=1)
    # below 1e-9 and above 1e-4 (X10): the corner ticks stay clear of the time labels and the upper panel's
    fig.update_yaxes(type="log", range=[-9.3, -3.3], title={"text": "GOES XRS flux [W m\u207b\u00b2]"}, exponentformat="power",
                     row=2, col=1)
    # under the plot, from the top down: the time axis's labels and title, the notes (one row
    # each), the legend (rows of two entries at 800 px) at the bottom of the figure
    notes = list(getattr(c, "notes", []) or [])
    note_px = 16
    # a horizontal legend stacks the entries of one legendgroup (the LST ROI and disk curves):
    # it is at least as many rows as the largest group, however wide the page (a browser audit
    # found a note over the LST legend's second row when only the two LST curves were drawn)
    stacked = max(Counter(t.legendgroup for t in fig.data if t.legendgroup).values(), default=1)
    below = max(legend_margin(len(fig.data), per_row=2), legend_margin(stacked, per_row=1)) + note_px * len(notes)
    for i, note in enumerate(notes):  # annotations take no container reference: from the plot's bottom down
        fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.0, y=0.0,
                           yshift=-(AXIS_BELOW_PX + note_px * i), xanchor="left", yanchor="top",
                           font={"size": 10, "color": "#8a5a00"}, name="note")
    top = 80 + MARK_ROW_PX * max(rows - 1, 0)
    fig.update_layout(
        title={"text": f"{e.event_type} #{e.id}: LST {c.channel} and GOES XRS"},
        hovermode="x unified", height=480 + top + below,
        margin={"l": 80, "r": 40, "t": top, "b": below},
        legend=LEGEND_BELOW,
        template="plotly_white",
    )

    return fig
