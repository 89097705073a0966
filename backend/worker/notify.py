"""Celery task of the webhooks: one attempt of one delivery (:mod:`backend.services.notify`).

Registered on the worker by :mod:`backend.worker.tasks` (which imports this module). A
failed attempt is retried by sending the task again with a countdown (the backoff), never
by sleeping in the worker; a database fault is retried by Celery with its own backoff. The
task's time limits bound one attempt, so a target that hangs holds one worker process for
seconds at most.
"""

from __future__ import annotations

import logging

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError

from backend.broker import TaskName, app
from backend.services.notify import TASK_SOFT_TIME_LIMIT_S, TASK_TIME_LIMIT_S, attempt_delivery
from backend.settings import get_settings
from backend.state import this_process

log = logging.getLogger(__name__)

__all__ = ["deliver_webhook"]


@app.task(name=TaskName.deliver_webhook, bind=True, autoretry_for=(OperationalError,), retry_backoff=2,
          retry_backoff_max=60, retry_jitter=False, max_retries=5, soft_time_limit=TASK_SOFT_TIME_LIMIT_S,
          time_limit=TASK_TIME_LIMIT_S)
def deliver_webhook(self, delivery_id: str) -> dict:
    """Post delivery ``delivery_id`` once (claimed first: a redelivered message of a
    delivery that is delivered, failed, not due or being posted posts nothing); after a
    failed attempt, send this task again with the backoff as countdown."""
    holder = this_process(self.request.id, self.request.retries or 0)
    try:
        retry_in = attempt_delivery(delivery_id, get_settings(), holder)
    except SoftTimeLimitExceeded:  # the claim is taken over after its lease, by the reconciler
        log.warning("webhook delivery %s: attempt past %.0f s; left to the reconciler", delivery_id,
                    TASK_SOFT_TIME_LIMIT_S)
        return {"delivery_id": delivery_id, "note": "time limit"}
    if retry_in is not None:
        deliver_webhook.apply_async(args=[delivery_id], countdown=retry_in, queue="cpu")
    return {"delivery_id": delivery_id, "retry_in_s": retry_in}


def reconcile_notifications(session, settings, now, grace_s: float) -> dict:
    """The reconciler's notification step: evaluate every saved search for new matches
    (:func:`backend.services.saved_searches.evaluate_all`), then send again the webhook
    deliveries whose message was lost (:func:`backend.services.notify.reconcile_deliveries`).
    Returns ``{"saved_search_matches": {id: n}, "webhooks_resent": n}``; a failure is
    logged and leaves the rest of the pass to run."""
    from backend.services.notify import reconcile_deliveries
    from backend.services.saved_searches import evaluate_all

    out: dict = {}
    try:
        out["saved_search_matches"] = evaluate_all(session, now=now)
        out["webhooks_resent"] = reconcile_deliveries(session, grace_s=grace_s, now=now)
    except Exception:  # noqa: BLE001 - notifications never stop the repairs of the pass
        session.rollback()
        log.exception("reconciler: notification step failed")
    return {k: v for k, v in out.items() if v}
