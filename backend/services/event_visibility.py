"""Who may see which events: the public catalogue, and the detections of a user's own sets.

An event's ``owner`` is None for the public catalogue (catalogue imports, and detections on
the public calibration sets) and a user's name for a detection made by that user's job on a
calibration set of their own (:mod:`backend.services.calibration_sets`). Readers apply one
rule everywhere events are read (search, detail, exports, histogram, timeline, overlays,
movies, bulk downloads, associations shown on an event):

* anonymous requests see the public catalogue only (``owner IS NULL``);
* a principal (:class:`backend.auth.Principal`) sees the public catalogue and their own;
* an admin sees all.

A private event asked for by someone who may not see it is answered as if it did not exist
(404, never 403: its id is not revealed).
"""

from __future__ import annotations

from typing import Any

from backend.models import Event

__all__ = ["viewer_of", "owner_condition", "may_see", "visible"]


def viewer_of(principal: Any) -> tuple[str | None, bool]:
    """``(user, sees_all)`` of a :class:`backend.auth.Principal` (None: anonymous, ``(None, False)``)."""
    if principal is None:
        return None, False
    return principal.user, bool(principal.is_admin)


def owner_condition(user: str | None, sees_all: bool = False, column=None):
    """SQL condition on an event owner column (default ``events.owner``) for a viewer: None
    when the viewer sees all (an admin), ``owner IS NULL`` for anonymous, ``owner IS NULL OR
    owner = user`` for a user (:func:`backend.services.visibility.event_rule`)."""
    from backend.services.visibility import Viewer, condition

    return condition(Event, Viewer(user, sees_all), column=column)


def may_see(principal: Any, owner: str | None) -> bool:
    """Whether ``principal`` (None: anonymous) may see an event owned by ``owner``."""
    if owner is None:
        return True
    user, sees_all = viewer_of(principal)
    return sees_all or (user is not None and user == owner)


def visible(stmt, principal: Any, column=None):
    """``stmt`` (a select over events) limited to the events ``principal`` may see."""
    cond = owner_condition(*viewer_of(principal), column=column)
    return stmt if cond is None else stmt.where(cond)
