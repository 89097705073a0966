"""Progress of ``lstdp demo`` while it fills the database, for the landing page.

The demo serves the browser as soon as its database is migrated (issue 25) and then
simulates, ingests, imports, calibrates and detects. Each step it starts is written to
``<DATA_DIR>/demo-progress.json`` (replaced atomically, so a reader never sees half a file);
the landing page (``frontend/templates/_demo_progress.html``) shows it and follows it until
the demo says ``ready``. Outside the demo the file does not exist and nothing is shown.

File layout (JSON object)::

    {"state": "running" | "ready" | "failed",
     "step": 3, "of": 7, "title": "simulating LST frames ...",
     "started_at": "2026-12-05T16:00:00Z", "updated_at": "...",
     "steps": [{"step": 1, "title": "...", "started_at": "...", "ended_at": "..." | null}, ...],
     "error": null | "...", "pid": 1234, "host": "..."}

The file is shown only while the demo that wrote it runs (its ``pid`` alive on this
``host``): a demo killed with SIGKILL leaves a file that no later ``lstdp serve`` shows. The
page never shows ``error`` (it may name hosts or paths); the demo's terminal does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

FILE_NAME = "demo-progress.json"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class DemoProgress:
    """Writer of the demo's progress file in ``root`` (``Settings.root``).

    Raises nothing on a failed write (a read-only data folder, a full disk): progress is a
    courtesy to the browser, never a reason to stop the demo.
    """

    root: Path
    of: int
    steps: list[dict] = field(default_factory=list)
    started_at: str = field(default_factory=_now)

    @property
    def path(self) -> Path:
        return Path(self.root) / FILE_NAME

    def _write(self, state: str, error: str | None = None) -> None:
        current = self.steps[-1] if self.steps else {"step": 0, "title": "starting"}
        doc = {"state": state, "step": current["step"], "of": self.of, "title": current["title"],
               "started_at": self.started_at, "updated_at": _now(), "steps": self.steps, "error": error,
               "pid": os.getpid(), "host": socket.gethostname()}
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.path)
        except OSError:
            pass

    def step(self, n: int, title: str) -> None:
        """Step ``n`` (1-based, of ``of``) starts; the one before ends."""
        if self.steps and self.steps[-1]["ended_at"] is None:
            self.steps[-1]["ended_at"] = _now()
        self.steps.append({"step": n, "title": title, "started_at": _now(), "ended_at": None})
        self._write("running")

    def finish(self, error: str | None = None) -> None:
        """The demo is ready (``error`` None) or stopped before it was (``error`` says why)."""
        if self.steps and self.steps[-1]["ended_at"] is None:
            self.steps[-1]["ended_at"] = _now()
        self._write("failed" if error else "ready", error)


def read_progress(root: Path) -> dict | None:
    """The demo's progress in ``root``, or None where no running demo wrote one (none was
    written, it is unreadable, or the demo that wrote it is gone)."""
    try:
        doc = json.loads((Path(root) / FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("state") not in ("running", "ready", "failed"):
        return None
    return doc if _alive(doc.get("pid"), doc.get("host")) else None


def _alive(pid, host) -> bool:
    """Whether process ``pid`` runs on this ``host`` (the demo that wrote the file)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return False
    return True
