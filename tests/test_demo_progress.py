"""The demo's progress on the landing page (issue 25, point 6): ``lstdp demo`` serves the
browser from its first step and writes each step to ``<DATA_DIR>/demo-progress.json``; the
landing page shows it until the demo is ready. (That the demo answers while it is still
preparing its data is checked on the real demo process in ``tests/test_demo_signals.py``.)"""

from __future__ import annotations

import json

from backend.services.demo_progress import FILE_NAME, DemoProgress, read_progress


def test_progress_file_follows_the_steps_and_the_end(tmp_path):
    p = DemoProgress(tmp_path, of=7)
    assert read_progress(tmp_path) is None
    p.step(1, "database")
    p.step(2, "worker")
    doc = read_progress(tmp_path)
    assert (doc["state"], doc["step"], doc["of"], doc["title"]) == ("running", 2, 7, "worker")
    assert doc["steps"][0]["ended_at"] is not None and doc["steps"][1]["ended_at"] is None
    p.finish()
    assert read_progress(tmp_path)["state"] == "ready"
    p.finish(error="stopped at step 2: KeyboardInterrupt")
    assert read_progress(tmp_path)["error"].startswith("stopped at step 2")
    (tmp_path / FILE_NAME).write_text("{half a fi")  # unreadable: shown as no demo, never a 500
    assert read_progress(tmp_path) is None


def test_landing_page_shows_the_demo_while_it_fills_in_and_not_after(api_client):
    from backend.settings import get_settings

    root = get_settings().root
    r = api_client.get("/")
    assert r.status_code == 200 and 'id="demo-progress"' not in r.text  # no demo: nothing shown
    p = DemoProgress(root, of=7)
    p.step(1, "database")
    p.step(4, "ingesting raw frames and calibration masters")
    r = api_client.get("/")
    assert r.status_code == 200
    assert 'id="demo-progress"' in r.text and "step 4 of 7" in r.text
    assert "ingesting raw frames" in r.text and "demo_progress.js" in r.text
    p.finish()
    r = api_client.get("/")
    assert r.status_code == 200 and 'id="demo-progress"' not in r.text
    p.finish(error="stopped at step 4: OperationalError postgresql://lst:S3cret@db.internal/lst")
    r = api_client.get("/")
    assert "stopped before it was ready" in r.text and "step 4 of 7" in r.text
    assert "S3cret" not in r.text and "db.internal" not in r.text  # the error is the terminal's, not the page's
    json.loads((root / FILE_NAME).read_text())  # the file stays valid JSON


def test_a_file_left_by_a_demo_that_is_gone_is_not_shown(api_client):
    """A demo killed with SIGKILL leaves its file "running": a later server must not show it."""
    import subprocess
    import sys

    from backend.settings import get_settings

    root = get_settings().root
    DemoProgress(root, of=7).step(3, "simulating")
    assert 'id="demo-progress"' in api_client.get("/").text
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    doc = json.loads((root / FILE_NAME).read_text())
    doc["pid"] = int(gone.stdout)
    (root / FILE_NAME).write_text(json.dumps(doc))
    assert read_progress(root) is None
    assert 'id="demo-progress"' not in api_client.get("/").text


def test_the_demo_never_prints_or_shows_a_database_password():
    from backend.cli import _shown_url

    shown = _shown_url("postgresql+psycopg://lst:S3cret@db.internal:5432/lst")
    assert "S3cret" not in shown and "db.internal" in shown
    assert _shown_url("sqlite:////tmp/x/lstdp.sqlite3") == "sqlite:////tmp/x/lstdp.sqlite3"
