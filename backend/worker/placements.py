"""Write-ahead records of what a calibration attempt places in the product store, and their sweep.

A calibration writes its product's FITS and quicklook into the store first (an object store:
create-once uploads under the attempt's keys, :func:`backend.store.attempt_tag`; the local
folder: a temporary file renamed into place) and commits the row naming them after. A writer
that stops between the two (killed, past its soft time limit, its disk full, its database
gone) leaves objects no row names. So that no manual step is needed to remove them, every
attempt first commits one :class:`~backend.models.PlacedObject` per object it is about to
place (:func:`intend`: product, the claim's attempt and holder, the path or ``s3://`` URL the
row would name, the database's time) and deletes them in the transaction that commits the row
(:func:`forget`). What is left is settled by :func:`settle_attempt`:

* by the writer itself after a rollback (``mine=True``,
  :func:`backend.worker.processing.settle_placed`): what the row does not name is removed and
  the records deleted at once;
* by the reconciler every pass and by ``lstdp fsck --repair`` (:func:`sweep_placements`):
  once the attempt's claim is no longer live (the product is not ``writing`` under that
  attempt and holder any more: it was written or failed, taken back, claimed again; or its
  claim is older than ``Settings.lease_s``) what the row does not name is removed; the
  records of an attempt whose claim has moved on are deleted once they are older than the
  lease (a writer cut off from the database, still running until its hard time limit, may
  place an object later; its records keep it in reach until then).

Never removed: anything the product row names (``written``, by ``path`` or
``quicklook_path``), and anything of a claim that is still live. The product's row lock is
held while the decision is made and the objects are removed (PostgreSQL: ``FOR UPDATE SKIP
LOCKED``, a row a writer holds now is skipped this pass; SQLite: the database's write lock).
A writer holds the same lock (:func:`backend.state.confirm_claim`) from before it places its
first object until its row commits, so an object at a product's path that the row does not
name, seen under the lock, is nobody's write in progress (the local store's path is the same
for every attempt of a product: a later attempt renames its file over it under the lock).

All times are the database's (:mod:`backend.clock`).
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from backend.clock import db_now
from backend.models import PlacedObject, Product, ProductState
from backend.settings import Settings
from backend.store import is_object_ref, product_store

log = logging.getLogger(__name__)

__all__ = ["intend", "forget", "settle_attempt", "sweep_placements", "pending_placements"]


def intend(session: Session, product_id: int, attempt: int, holder: str, refs: list[str]) -> None:
    """Add the records of ``refs`` (what the row's ``path``/``quicklook_path`` would hold) that
    attempt ``attempt`` held by ``holder`` is about to place for product ``product_id``; the
    caller commits them before placing anything."""
    session.add_all(PlacedObject(product_id=product_id, attempt=attempt, holder=holder, ref=r) for r in refs)


def forget(session: Session, product_id: int, attempt: int, holder: str) -> None:
    """Delete the records of attempt ``attempt``/``holder`` of ``product_id``: in the
    transaction that commits the row naming what it placed."""
    session.execute(delete(PlacedObject).where(PlacedObject.product_id == product_id,
                                               PlacedObject.attempt == attempt, PlacedObject.holder == holder)
                    .execution_options(synchronize_session=False))


def _lock_product(session: Session, product_id: int) -> bool:
    """Take product ``product_id``'s row lock for the rest of the transaction. PostgreSQL:
    ``FOR UPDATE SKIP LOCKED`` (False when a writer holds the row now, or it is gone; the
    next pass looks again); SQLite: a write, which takes the database's write lock (waiting
    for a writer's commit, as every SQLite writer does)."""
    if session.get_bind().dialect.name == "postgresql":
        got = session.execute(select(Product.id).where(Product.id == product_id)
                              .with_for_update(skip_locked=True)).first()
        return got is not None or session.scalar(select(Product.id).where(Product.id == product_id)) is None
    session.execute(text("UPDATE placed_objects SET attempt = attempt WHERE product_id = :p"), {"p": product_id})
    return True


def _remove(settings: Settings, ref: str) -> bool:
    """Remove the file or object ``ref`` if it is there; True when something was removed.

    Raises
    ------
    backend.store.StoreError
        The object store failed, or ``ref`` is an object of another store than ``settings``'
        (left for ``lstdp fsck`` of that store).
    """
    if is_object_ref(ref):
        from backend.store import StoreError

        store = product_store(settings)
        key = store.key_of(ref)
        if key is None:
            raise StoreError(f"{ref} is not in the product store {store.url}")
        if store.head(key) is None:
            return False
        store.delete(key)
        return True
    try:
        Path(ref).unlink()
    except FileNotFoundError:
        return False
    return True


def _aware(t: dt.datetime | None) -> dt.datetime | None:
    return t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t


def settle_attempt(session: Session, settings: Settings, product_id: int, attempt: int, holder: str, *,
                   mine: bool = False, now: dt.datetime | None = None) -> list[str]:
    """Settle the records of one attempt (the module docstring); commits (or rolls back when
    there is nothing to do).

    Parameters
    ----------
    session : Session
        Not in a transaction that holds anything the caller still needs.
    settings : Settings
        The product store, ``lease_s``.
    product_id, attempt, holder
        The attempt (``Product.attempts`` and ``Product.claimed_by`` of its claim).
    mine : bool
        The writer itself, after its rollback: its claim may still be on the product, but it
        places nothing more under these records; what the row does not name is removed and
        the records deleted now.
    now : datetime, optional
        The database's time (default :func:`backend.clock.db_now`).

    Returns
    -------
    list of str
        The files or objects removed (their refs).

    Raises
    ------
    backend.store.StoreError, OSError, sqlalchemy.exc.SQLAlchemyError
        The store or the database failed; the records stay (the next pass tries again).
    """
    now = now or db_now(session)
    if not _lock_product(session, product_id):
        session.rollback()
        return []
    recs = list(session.scalars(select(PlacedObject).where(
        PlacedObject.product_id == product_id, PlacedObject.attempt == attempt, PlacedObject.holder == holder)))
    if not recs:
        session.rollback()
        return []
    row = session.execute(select(Product.state, Product.attempts, Product.claimed_by, Product.claimed_at,
                                 Product.path, Product.quicklook_path)
                          .where(Product.id == product_id).execution_options(populate_existing=True)).first()
    lease = dt.timedelta(seconds=settings.lease_s)
    held = (row is not None and row.state == ProductState.writing and (row.attempts or 0) == attempt
            and row.claimed_by == holder)
    if not mine and held and (_aware(row.claimed_at) or now) > now - lease:
        session.rollback()  # a live claim: its writer may be about to place these
        return []
    named = {row.path, row.quicklook_path} - {None} if row is not None and row.state == ProductState.written else set()
    removed = []
    for r in recs:
        if r.ref not in named and _remove(settings, r.ref):
            removed.append(r.ref)
            log.warning("removed %s: placed by attempt %d of product %s (%s), whose row never named it",
                        r.ref, attempt, product_id, holder)
    oldest = min(_aware(r.created_at) for r in recs)
    if mine or (not held and oldest < now - lease):
        session.execute(delete(PlacedObject).where(PlacedObject.id.in_([r.id for r in recs]))
                        .execution_options(synchronize_session=False))
    session.commit()
    return removed


def pending_placements(session: Session) -> list[tuple[int, int, str]]:
    """``(product id, attempt, holder)`` of every attempt that has records, oldest first."""
    return [tuple(r) for r in session.execute(
        select(PlacedObject.product_id, PlacedObject.attempt, PlacedObject.holder)
        .group_by(PlacedObject.product_id, PlacedObject.attempt, PlacedObject.holder)
        .order_by(func.min(PlacedObject.id)))]


def sweep_placements(session: Session, settings: Settings, *,
                     now: dt.datetime | None = None) -> list[tuple[int, int, str, str]]:
    """Settle every attempt that has records (:func:`settle_attempt`, not ``mine``): the
    reconciler's pass and ``lstdp fsck --repair``. An attempt whose store or database step
    fails is logged and left for the next pass. Returns ``(product id, attempt, holder, ref)``
    of each file or object removed."""
    now = now or db_now(session)
    session.commit()  # the read of the clock: no transaction held across the attempts
    removed = []
    for product_id, attempt, holder in pending_placements(session):
        try:
            removed += [(product_id, attempt, holder, ref)
                        for ref in settle_attempt(session, settings, product_id, attempt, holder, now=now)]
        except Exception:  # noqa: BLE001 - the next pass tries again
            log.warning("could not settle the placed objects of attempt %d of product %s (%s)", attempt,
                        product_id, holder, exc_info=True)
            session.rollback()
    session.rollback()
    return removed
