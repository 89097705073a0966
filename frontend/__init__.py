"""The event browser's templates and static files (served by ``backend.api``; no build step)."""

from pathlib import Path

__all__ = ["FRONTEND_DIR", "STATIC_DIR", "TEMPLATE_DIR"]

FRONTEND_DIR = Path(__file__).resolve().parent
STATIC_DIR = FRONTEND_DIR / "static"
TEMPLATE_DIR = FRONTEND_DIR / "templates"
