"""scripts/suite_profile.py reads py-spy's raw recordings of the suite the way py-spy writes them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import suite_profile  # noqa: E402

XDIST = 'process 10:"";process 11:"/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"'
RAW = "\n".join([
    # an xdist worker serving a request (its command line holds a ';')
    XDIST + ";<module> (pytest/__main__.py:9);create_app (backend/api/app.py:740);include_router (fastapi/routing.py:3415) 7",
    # the same worker importing a module
    XDIST + ";<module> (<string>:1);_find_and_load (<frozen importlib._bootstrap>:1176);<module> (sunpy/map/__init__.py:3);"
    "_find_and_load (<frozen importlib._bootstrap>:1176);<module> (sunpy/map/mapbase.py:1) 3",
    # a reconciler started by a worker (nested processes), importing from its parser
    XDIST + ';process 12:"/v/bin/python -m backend.cli reconcile --parent 11";<module> (backend/cli.py:1);'
    "build_parser (backend/cli.py:985);_find_and_load (<frozen importlib._bootstrap>:1176);<module> (backend/auth.py:57) 5",
    # waiting threads: left out; a function whose name only contains a wait's is not
    XDIST + ";run (uvicorn/server.py:60);select (selectors.py:468) 60",
    XDIST + ";worker (threading.py:1);Condition.wait (threading.py:320) 40",
    XDIST + ";handle (backend/api/static.py:9);_accepts_gzip (backend/api/static.py:40) 2",
    "garbage without a count",
])


def test_kinds_imports_and_project_functions(tmp_path):
    raw = tmp_path / "suite.spy"
    raw.write_text(RAW + "\n")
    out = suite_profile.summarise(str(raw), top=10)
    assert "active samples 17 (left out as waits: 100)" in out
    assert "| xdist worker | 12 | 70.6 % | 25.0 % |" in out
    assert "| reconciler | 5 | 29.4 % | 100.0 % |" in out
    assert "| 5 | reconciler | <module> (backend/auth.py) |" in out
    assert "| 3 | xdist worker | <module> (sunpy/map/__init__.py) |" in out  # the outermost import
    assert "| 7 | 58.3 % | create_app (backend/api/app.py) |" in out
    assert "build_parser" not in out  # a reconciler's frames are not the xdist workers'


def test_process_frames_are_split_at_the_command_line_closing_quote():
    cmd, frames = suite_profile.split_stack(XDIST + ";a (x.py:1);b (y.py:2)")
    assert cmd.endswith("exec(eval(sys.stdin.readline()))") and frames == ["a (x.py)", "b (y.py)"]
    assert suite_profile.kind_of(cmd) == "xdist worker"
    assert suite_profile.kind_of("/v/bin/python -m tests.faults.worker_main worker --queues cpu") == "celery worker"
