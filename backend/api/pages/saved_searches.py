"""The ``/saved-searches`` page: the signed-in user's saved searches, the matches they were
told of and their webhook deliveries, with forms to save, rename, change and delete a search
(issue 25, point 6).

The page is read through the same services as ``GET /api/v1/saved-searches``,
``/saved-searches/{id}/notifications`` and ``/webhooks/{id}/deliveries``
(:mod:`backend.services.saved_searches`, :mod:`backend.services.notify`), for the viewer only:
their own searches (an admin sees their own here too; the API lists everyone's). Its forms
send JSON to ``POST``/``PATCH``/``DELETE /api/v1/saved-searches`` with the session cookie
(``frontend/static/saved_searches.js``). Without a session the page shows the sign-in box
and nothing else of anyone's.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.templating import templates
from backend.models import Webhook
from backend.services import notify
from backend.services import saved_searches as searches

__all__ = ["router", "SHOWN"]

router = APIRouter(include_in_schema=False)

#: Notifications and deliveries shown per search (the API pages through all).
SHOWN = 5


def _open_url(kind: str, query: dict[str, Any]) -> str:
    """The page that runs a saved query: the event list or the product search."""
    flat = {k: (",".join(v) if isinstance(v, list) else v) for k, v in query.items()}
    return f"{'/events' if kind == 'events' else '/products/search'}?{urlencode(flat)}"


@router.get("/saved-searches", response_class=HTMLResponse)
def saved_searches_page(
    request: Request,
    session: SessionDep,
    principal: OptionalPrincipal,
    kind: Annotated[str | None, Query(max_length=16)] = None,
    query: Annotated[str | None, Query(max_length=2000)] = None,
):
    """The viewer's saved searches (oldest first), each with its query, the page that runs
    it, its match count, its latest :data:`SHOWN` notifications and, when it has a webhook,
    the latest deliveries; the form to save a new one, prefilled from ``kind`` and ``query``
    (a URL query string, as the "Save this search" links of the event list and the product
    search send)."""
    items = []
    if principal is not None:
        for row in searches.list_saved_searches(session, principal.user):
            hook = session.scalar(select(Webhook).where(Webhook.saved_search_id == row.id).order_by(Webhook.id))
            notes, n_notes = searches.notifications_of(session, row.id, limit=SHOWN)
            deliveries, n_deliveries = (notify.deliveries_of(session, webhook_ids=[hook.id], limit=SHOWN)
                                        if hook is not None else ([], 0))
            flat = {k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in (row.query or {}).items()}
            items.append({
                "row": row, "query_text": urlencode(flat), "open_url": _open_url(row.kind, row.query or {}),
                "notifications": [searches.describe_notification(n) for n in notes], "n_notifications": n_notes,
                "hook": hook, "deliveries": [notify.describe_delivery(d) for d in deliveries],
                "n_deliveries": n_deliveries,
            })
    return templates.TemplateResponse(request, "saved_searches.html", {
        "nav": "saved_searches", "principal": principal, "items": items, "kinds": searches.KINDS,
        "new_kind": kind if kind in searches.KINDS else "events", "new_query": (query or "").lstrip("?"),
        "event_params": searches.EVENT_PARAMS, "product_params": searches.PRODUCT_PARAMS,
        "max_name": searches.MAX_NAME_CHARS,
    })
