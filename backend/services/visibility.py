"""Who may see what: the one visibility rule of each kind of object, and the only way to
fetch an object by id for a request.

Each rule is a SQL condition builder, ``<kind>_rule(viewer) -> condition | None`` (None: the
viewer sees every row, i.e. an admin), kept in :data:`RULES` by model class and looked up
by name at call time (so a test can switch one off, tests/test_access_matrix.py does):

* calibration set: public, or the viewer's own (``owner``);
* product: no set (made before sets existed), or a set the viewer may see;
* job: public (``publishes``: the platform's or an admin's) or the viewer's own;
* event: the public catalogue (``owner IS NULL``) or the viewer's own detections;
* movie: the platform's (``owner == 'system'``) or the viewer's own;
* saved search, webhook, API token: the viewer's own (anonymous: none).

Derived objects use the rule of what they reveal: a manifest is its product's (a job's
manifest its job's, listing only the products the viewer may see), a diff needs both of its
products, an archive / download script / product list holds only visible products, a list
of jobs only visible jobs, and a webhook delivery its webhook's (deliveries are listed only
through a webhook fetched with :func:`get_visible`, a job's through its visible webhooks). Admins see all; anonymous viewers see only public rows.

Routes fetch by id only through :func:`get_visible` (or filter lists with :func:`visible`
/ :func:`condition`): an object the viewer may not see raises :class:`NotVisible`, answered
404 exactly as an unknown id (never 403, which would confirm it exists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, false, or_, select
from sqlalchemy.orm import Session

from backend.models import ApiToken, CalibrationSet, Event, Job, Movie, Product, SavedSearch, Webhook
from pipelines.errors import DataError

__all__ = ["Viewer", "viewer_of", "NotVisible", "RULES", "condition", "visible", "get_visible", "allows",
           "set_rule", "product_rule", "job_rule", "event_rule", "movie_rule", "saved_search_rule",
           "webhook_rule", "token_rule", "PLATFORM_OWNER"]

#: The owner of what the platform itself makes (CLI, demo, reconciler): public.
PLATFORM_OWNER = "system"


class NotVisible(DataError):
    """No such object, or one the viewer may not see (the API answers 404 for both)."""


@dataclass(frozen=True)
class Viewer:
    """Who asks: ``user`` (None: anonymous) and whether they see all (an admin)."""

    user: str | None
    sees_all: bool = False


def viewer_of(principal: Any) -> Viewer:
    """The :class:`Viewer` of a :class:`backend.auth.Principal` (None: anonymous), or a
    :class:`Viewer` given as is."""
    if isinstance(principal, Viewer):
        return principal
    if principal is None:
        return Viewer(None, False)
    return Viewer(principal.user, bool(principal.is_admin))


def _own(column, v: Viewer):
    return column == v.user if v.user else false()


# -- the rules (one per kind; None: everything visible) --

def set_rule(v: Viewer):
    """Calibration sets: public or the viewer's own."""
    if v.sees_all:
        return None
    return or_(CalibrationSet.public.is_(True), _own(CalibrationSet.owner, v))


def product_rule(v: Viewer):
    """Products: without a set, or of a set :func:`set_rule` lets the viewer see."""
    cond = rule_for(CalibrationSet)(v)
    if cond is None:
        return None
    return or_(Product.calibration_set_id.is_(None), Product.calibration_set_id.in_(select(CalibrationSet.id).where(cond)))


def job_rule(v: Viewer):
    """Jobs: public (``publishes``: the platform's or an admin's) or the viewer's own."""
    if v.sees_all:
        return None
    return or_(Job.publishes.is_(True), _own(Job.owner, v))


def event_rule(v: Viewer, column=None):
    """Events: the public catalogue (owner NULL) or the viewer's own; ``column``: another
    owner column of events (an aliased table), default ``events.owner``."""
    if v.sees_all:
        return None
    col = Event.__table__.c.owner if column is None else column
    return or_(col.is_(None), col == v.user) if v.user else col.is_(None)


def movie_rule(v: Viewer):
    """Movies: the platform's or the viewer's own."""
    if v.sees_all:
        return None
    return or_(Movie.owner == PLATFORM_OWNER, _own(Movie.owner, v))


def saved_search_rule(v: Viewer):
    """Saved searches: the viewer's own."""
    return None if v.sees_all else _own(SavedSearch.owner, v)


def webhook_rule(v: Viewer):
    """Webhooks: the viewer's own."""
    return None if v.sees_all else _own(Webhook.owner, v)


def token_rule(v: Viewer):
    """API tokens (their rows, never the secrets): the viewer's own."""
    return None if v.sees_all else _own(ApiToken.user, v)


#: Model class -> the name of its rule in this module (looked up at call time).
RULES: dict[type, str] = {CalibrationSet: "set_rule", Product: "product_rule", Job: "job_rule",
                          Event: "event_rule", Movie: "movie_rule", SavedSearch: "saved_search_rule",
                          Webhook: "webhook_rule", ApiToken: "token_rule"}

#: What an unknown id is called in a 404's message.
_NAMES = {CalibrationSet: "calibration set", Product: "product", Job: "job", Event: "event", Movie: "movie",
          SavedSearch: "saved search", Webhook: "webhook", ApiToken: "token"}


def rule_for(kind: type):
    """The rule function of model class ``kind`` (KeyError: a kind without a rule)."""
    return globals()[RULES[kind]]


def condition(kind: type, principal: Any, **kw):
    """SQL condition on ``kind``'s table for the rows ``principal`` (a Principal, a
    :class:`Viewer` or None for anonymous) may see; None when it sees all."""
    return rule_for(kind)(viewer_of(principal), **kw)


def visible(stmt, kind: type, principal: Any, **kw):
    """``stmt`` (a select involving ``kind``'s table) limited to the rows ``principal`` may see."""
    cond = condition(kind, principal, **kw)
    return stmt if cond is None else stmt.where(cond)


def _valid_id(kind: type, obj_id: Any) -> bool:
    col = kind.__table__.primary_key.columns.values()[0]
    if isinstance(obj_id, bool):
        return False
    if col.type.python_type is int:
        return isinstance(obj_id, int) and 1 <= obj_id <= 2**63 - 1
    return isinstance(obj_id, str) and 0 < len(obj_id) <= 64 and obj_id.replace("-", "").isalnum()


def get_visible(session: Session, kind: type, obj_id: Any, principal: Any, *, options: tuple = ()) -> Any:
    """The row of ``kind`` with primary key ``obj_id`` if ``principal`` may see it.

    Raises
    ------
    NotVisible
        No such row, a malformed id, or a row the principal may not see (the same message
        for all three: "no <kind> with id <id>").
    """
    name = _NAMES.get(kind, kind.__name__.lower())
    if _valid_id(kind, obj_id):
        col = kind.__table__.primary_key.columns.values()[0]
        row = session.scalar(visible(select(kind).where(col == obj_id).options(*options), kind, principal))
        if row is not None:
            return row
    shown = obj_id[:40] if isinstance(obj_id, str) else obj_id
    raise NotVisible(f"no {name} with id {shown!r}")


def allows(session: Session, kind: type, row: Any, principal: Any) -> bool:
    """Whether ``principal`` may see ``row`` (a loaded row of ``kind``), by the same rule."""
    cond = condition(kind, principal)
    if cond is None:
        return True
    col = kind.__table__.primary_key.columns.values()[0]
    return bool(session.scalar(select(exists().where(col == getattr(row, col.key), cond))))
