"""The scopes an API token may carry (:data:`SCOPES`), with no dependency.

Its own module so that what only needs the names (``lstdp``'s argument parser, built by every
CLI process: workers, their reconcilers, ``lstdp token``) does not import
:mod:`backend.auth` and with it FastAPI (about 0.7 CPU-seconds a process). :mod:`backend.auth`
re-exports it; the API and the services read it there.
"""

from __future__ import annotations

__all__ = ["SCOPES"]

#: The scopes a token may carry, and what each allows.
SCOPES: dict[str, str] = {
    "jobs:submit": "submit recalibration jobs; retry and re-run one's own; saved searches and webhooks",
    "jobs:cancel": "cancel one's own jobs",
    "admin": "everyone's jobs, promote calibration sets, manage tokens (implies every other scope)",
}
