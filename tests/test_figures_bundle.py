"""The vendored plotly.js partial bundle (``frontend/static/vendor/plotly-basic.min.js``) draws
every trace type the platform's figures ask for.

The pages load plotly.js's "basic" bundle (scatter, bar, pie; 1.19 MB) instead of the full one
(4.8 MB, which every page with a figure parsed and compiled on each load). A figure of another
type would silently not draw in the browser: this test reads the trace types the bundle
registers (its ``moduleType:"trace",name:"..."`` entries) and the types the figures use, in
the Python figure builders (``plotly.graph_objects`` trace classes under ``backend/``) and in
the pages' scripts (``type: "..."`` of a plotly trace under ``frontend/static``).
"""

from __future__ import annotations

import re
from pathlib import Path

import plotly
import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "frontend" / "static" / "vendor" / "plotly-basic.min.js"
_REGISTERED = re.compile(r'moduleType:"trace",name:"([a-z0-9]+)"')

#: Every plotly trace class of the Python package, by class name -> its ``type``.
TRACE_CLASSES = {name: getattr(go, name)().type for name in dir(go)
                 if isinstance(getattr(go, name), type) and issubclass(getattr(go, name), BaseTraceType)}


def registered(bundle_text: str) -> set[str]:
    return set(_REGISTERED.findall(bundle_text))


def used_in_python() -> set[str]:
    used = set()
    for f in (ROOT / "backend").rglob("*.py"):
        for name in re.findall(r"\bgo\.([A-Z][A-Za-z0-9]*)\(", f.read_text()):
            if name in TRACE_CLASSES:
                used.add(TRACE_CLASSES[name])
    return used


def used_in_scripts() -> set[str]:
    used = set()
    for f in (ROOT / "frontend" / "static").glob("*.js"):
        used |= set(re.findall(r"\btype:\s*[\"']([a-z0-9]+)[\"']", f.read_text())) & set(TRACE_CLASSES.values())
    return used


def test_the_bundle_draws_every_trace_type_the_figures_use():
    have = registered(BUNDLE.read_text())
    assert {"scatter", "bar"} <= have, have
    used = used_in_python() | used_in_scripts()
    assert {"scatter", "bar"} <= used, used  # what the figures are made of today
    assert used <= have, f"trace types the figures use but {BUNDLE.name} lacks: {sorted(used - have)}"


def test_the_reading_of_the_bundle_finds_what_a_bundle_registers():
    """The full bundle of the Python plotly package registers every trace type: the regex reads
    them all, and a type outside the basic bundle (heatmap) is seen missing from it."""
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    everything = registered(full.read_text())
    assert set(TRACE_CLASSES.values()) <= everything, sorted(set(TRACE_CLASSES.values()) - everything)
    assert "heatmap" in everything and "heatmap" not in registered(BUNDLE.read_text())
