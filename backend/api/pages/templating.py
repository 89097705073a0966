"""The pages' Jinja2 environment (templates in ``frontend/templates``): versioned static URLs,
the filters (``utc``, ``ink``, ``num``) and globals every template may use, and the form
helpers the pages share (times and numbers as a form and its links carry them)."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re

from fastapi.templating import Jinja2Templates

from backend import __version__
from backend.render.figures import EVENT_COLOURS, HEK_EVENT_TYPES, hek_label
from frontend import STATIC_DIR, TEMPLATE_DIR
from pipelines.utc import as_utc

__all__ = ["templates", "static_url", "PLOTLY_JS_VERSION", "badge_ink", "form_time", "form_num"]


def _plotly_js_version() -> str:
    try:
        with open(STATIC_DIR / "vendor" / "plotly-basic.min.js", encoding="utf-8") as f:
            head = f.read(200)
    except OSError:
        return "missing"
    m = re.search(r"plotly\.js (?:\([^)]*\) )?v(\d+\.\d+\.\d+)", head)
    return m.group(1) if m else "unknown"


@functools.lru_cache(maxsize=256)
def static_url(path: str) -> str:
    """The URL of a file under ``frontend/static``, versioned by its content.

    ``/static/<path>?v=<first 12 hex digits of its SHA-256>``: a changed file gets a new URL,
    so browsers may cache every version for ever. Raises ``FileNotFoundError`` for a path
    that is not a static file (a template naming a missing script fails when rendered,
    not silently in the browser).
    """
    f = (STATIC_DIR / path).resolve()
    if STATIC_DIR.resolve() not in f.parents or not f.is_file():
        raise FileNotFoundError(f"no static file {path!r} under {STATIC_DIR}")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:12]
    return f"/static/{path}?v={digest}"


def _templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(TEMPLATE_DIR))
    t.env.globals.update(
        static_url=static_url,
        version=__version__,
        plotly_version=PLOTLY_JS_VERSION,
        hek_label=hek_label,
        hek_types=HEK_EVENT_TYPES,
        event_colours=EVENT_COLOURS,
        goes_level=_goes_level,
    )
    t.env.filters["utc"] = _fmt_utc
    t.env.filters["ink"] = badge_ink
    t.env.filters["num"] = _fmt_num
    return t


def _goes_level(e) -> str | None:
    """The GOES XRS level a source gives for the event's time as a class (the STIX list's),
    for an event or a light list row; None when it gives none
    (:func:`backend.services.event_formats.goes_level`)."""
    from backend.services.event_formats import goes_level

    return goes_level(e)[0]


def _fmt_utc(t: dt.datetime | None, seconds: bool = True) -> str:
    t = as_utc(t)
    if t is None:
        return "—"
    return t.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _luminance(hex_colour: str) -> float:
    """Relative luminance of an sRGB ``#rrggbb`` colour, 0 (black) to 1 (white) (WCAG 2.2,
    "relative luminance")."""
    h = hex_colour.lstrip("#")
    rgb = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def badge_ink(background: str) -> str:
    """The text colour (``#000000`` or ``#ffffff``) of higher WCAG contrast on ``background``
    (``#rrggbb``): an event badge's code stays readable on every colour of
    :data:`backend.render.figures.EVENT_COLOURS` (white on the Okabe-Ito vermillion is 3.9:1, under
    the 4.5:1 that WCAG 2.2 SC 1.4.3 asks of small text; black is 5.4:1)."""
    lum = _luminance(background)
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def _fmt_num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


PLOTLY_JS_VERSION = _plotly_js_version()
templates = _templates()


def form_time(t: dt.datetime | None) -> str:
    """A time for the form and the page links, to the minute unless it has seconds (exact:
    a page link must give back the same filters, or its cursor is refused)."""
    t = as_utc(t)
    if t is None:
        return ""
    if t.microsecond:
        return t.replace(tzinfo=None).isoformat()
    return t.strftime("%Y-%m-%dT%H:%M:%S" if t.second else "%Y-%m-%dT%H:%M")


def form_num(v: float | None) -> str:
    """A number for the form and the page links: short (``-500``) when that is exact, else ``repr``."""
    if v is None:
        return ""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)

