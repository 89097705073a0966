"""The ``/movies`` page: the frame player (``frontend/templates/movie.html``) of a channel over a
window, or of an event's window, on the API of :mod:`backend.api.routes.movies`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.templating import templates
from backend.api.presenters import movie_window
from backend.services import events as events_service
from backend.services.event_filters import MAX_ID, canonical_channel
from pipelines.channels import CHANNELS
from pipelines.movies import DIFF_MODES
from pipelines.utc import parse_utc_text

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/movies", response_class=HTMLResponse)
def movie_page(request: Request, session: SessionDep, principal: OptionalPrincipal, channel: str | None = None,
               start: str | None = None,
               end: str | None = None, diff: str = "none", event: str | None = None):
    """The frame player: a channel over a window (``channel``, ``start``, ``end``, ``diff``) or
    an event's window (``event``). Bad values are shown on the page, not as an error status."""
    errors: list[str] = []
    ctx = {"channels": CHANNELS, "diff_modes": DIFF_MODES, "diff": diff if diff in DIFF_MODES else "none",
           "channel": None, "start": None, "end": None, "event": None, "errors": errors}
    if diff not in DIFF_MODES:
        errors.append(f"diff: {diff!r} is not one of {', '.join(DIFF_MODES)}")
    try:
        ctx["channel"] = canonical_channel(channel)
    except ValueError as exc:
        errors.append(f"channel: {exc}")
    times = {}
    for name, value in (("start", start), ("end", end)):
        try:
            times[name] = parse_utc_text(value) if value else None
        except ValueError as exc:
            errors.append(f"{name}: {exc}")
    ev = None
    if event:
        if (event.isascii() and event.isdigit()) and 1 <= int(event) <= MAX_ID:
            ev = events_service.get_event(session, int(event), principal)
        if ev is None:
            errors.append(f"event: no event with id {event[:20]!r}")
    if not errors:
        if ev is None and not (ctx["channel"] and times.get("start") and times.get("end")):
            errors.append("give channel, start and end (UTC), or event=<id>")
        elif ev is None and times["end"] < times["start"]:
            errors.append("end is before start")
        else:
            code, lo, hi, _ = movie_window(session, ctx["channel"], times.get("start"), times.get("end"),
                                      ev.id if ev is not None else None, principal)
            ctx.update(channel=code, start=lo, end=hi, event=ev)
    return templates.TemplateResponse(request, "movie.html", ctx)
