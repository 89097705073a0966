"""Webhooks: registration, signed deliveries through an outbox, retries with backoff, the
delivery log.

A webhook belongs to one job (``webhook_url`` of the job request) or to one saved search
(:mod:`backend.services.saved_searches`). Its **secret** (``whsec_`` and 32 random bytes,
:func:`secrets.token_urlsafe`) is made when it is registered and shown once, in that
answer, as GitHub does; afterwards no answer, log line or delivery log holds it.

Signature
    Each delivery is a ``POST`` of a JSON body (UTF-8, keys sorted, no spaces) with

    * ``X-LST-Event``: ``job.ended`` or ``saved_search.matches``;
    * ``X-LST-Delivery``: the delivery's id (a UUID): the same on every attempt of one
      delivery, so that a receiver can de-duplicate;
    * ``X-LST-Timestamp``: Unix time of the attempt [s];
    * ``X-LST-Signature``: ``sha256=`` and the hex HMAC-SHA256 (:mod:`hmac`, key: the
      secret) of ``<timestamp>.<body>`` (the timestamp's decimal digits, a full stop, the
      body's bytes), as Stripe signs its webhooks: a receiver recomputes it over the raw
      body (:func:`verify_signature`) and refuses old timestamps to stop replays.

Outbox
    A delivery is a row (:class:`~backend.models.WebhookDelivery`) added in the transaction
    of the change it announces (a job's end: :func:`job_ended`, called by
    ``backend.worker.processing._finish``; a saved search's new matches), and sent to the
    broker only after that transaction commits (an ``after_commit`` hook of the session),
    so a receiver is never told of a change that was rolled back. A message lost on the
    way (the process died between commit and send, Redis lost it) is sent again by the
    reconciler (:func:`reconcile_deliveries`).

Attempts (:func:`attempt_delivery`, run by the Celery task ``deliver_webhook``)
    1. **claim** the row (one conditional ``UPDATE``, as ``backend.state.claim_product``):
       ``pending`` and due, or ``delivering`` under a claim older than
       :data:`CLAIM_LEASE_S`; a redelivered or duplicated task finds it ``delivered`` or
       claimed and posts nothing, so a receiver that answered 2xx gets it once;
    2. **post** it with no database session open (:func:`post_delivery`, httpx): connect at
       most 3 s, each read or write at most ``WEBHOOK_TIMEOUT_S`` (10 s), redirects not
       followed, at most 4 kB of the answer read; the Celery task's time limit bounds the
       whole attempt, so a target that hangs holds one worker process for seconds, never
       the API or a worker for ever;
    3. **record** the attempt (:class:`~backend.models.WebhookAttempt`: status, error,
       duration) and the outcome: ``delivered`` on 2xx; otherwise ``pending`` again with
       ``next_attempt_at`` after an exponential backoff (``WEBHOOK_BACKOFF_S`` x 2^(n-1),
       at most 1 h: the task is sent again with that countdown, never slept in a worker),
       or ``failed`` after ``WEBHOOK_MAX_ATTEMPTS``.

    A worker killed after the receiver answered and before the outcome was recorded makes
    the next claim post it again (at least once); receivers de-duplicate on ``X-LST-Delivery``.
"""

from __future__ import annotations

from backend.state import JOB_FINAL  # noqa: E402

import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import event, or_, select
from sqlalchemy.orm import Session

from backend import __version__
from backend.models import (DeliveryState, Job, Webhook, WebhookAttempt, WebhookDelivery, utcnow)
from backend.settings import Settings, get_settings
from backend.state import claim_delivery as _claim
from backend.state import move_delivery
from pipelines.errors import DataError

__all__ = ["WebhookError", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "DELIVERY_HEADER", "EVENT_HEADER",
           "SECRET_PREFIX", "CLAIM_LEASE_S", "MAX_URL_CHARS", "check_webhook_url", "new_secret", "body_bytes",
           "sign", "verify_signature", "register_webhook", "queue_delivery", "job_ended", "job_summary",
           "claim_delivery", "AttemptResult", "post_delivery", "record_attempt", "attempt_delivery",
           "backoff_s", "reconcile_deliveries", "deliveries_of", "describe_webhook", "describe_delivery",
           "webhook_of_job"]

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-LST-Signature"
TIMESTAMP_HEADER = "X-LST-Timestamp"
DELIVERY_HEADER = "X-LST-Delivery"
EVENT_HEADER = "X-LST-Event"
#: Every secret starts with this (secret scanners; tells it from an API token, ``lst_``).
SECRET_PREFIX = "whsec_"
#: Longest webhook URL accepted [characters].
MAX_URL_CHARS = 2000
#: A ``delivering`` claim older than this [s] is taken over: longer than the task's hard
#: time limit (:data:`TASK_TIME_LIMIT_S`), after which no worker still posts it.
CLAIM_LEASE_S = 120.0
#: The delivery task's soft and hard time limits [s]: one attempt, connect and read
#: timeouts (60 s at most) included, and the two short database sessions around it.
TASK_SOFT_TIME_LIMIT_S = 75.0
TASK_TIME_LIMIT_S = 90.0
#: Longest wait between two attempts [s].
MAX_BACKOFF_S = 3600.0
#: Connect timeout of one attempt [s] (at most ``WEBHOOK_TIMEOUT_S``).
CONNECT_TIMEOUT_S = 3.0
#: Most bytes of a receiver's answer read (its status is what counts; the start of the body
#: is kept in the error of a non-2xx answer).
MAX_ANSWER_BYTES = 4096
#: Longest error text kept per attempt [characters].
MAX_ERROR_CHARS = 500

#: ``Session.info`` key of the deliveries to send once the session commits.
_OUTBOX_KEY = "lstdp_webhook_outbox"


class WebhookError(DataError):
    """A webhook that cannot be registered (a bad URL): a 422."""


# -- URLs, secrets, signatures ----------------------------------------------------------------


def check_webhook_url(url: str) -> str:
    """``url`` if it can be a webhook target, else ValueError saying why.

    Accepted: ``https://`` or ``http://`` with a host name, at most :data:`MAX_URL_CHARS`
    characters, no user name or password (``https://user:pass@host/``: credentials would be
    stored and shown in delivery logs; a receiver checks the signature instead), no API
    token (``lst_...``) anywhere in it, no whitespace or control characters.
    """
    from backend.auth import redact_tokens

    if not isinstance(url, str) or not url.strip():
        raise ValueError("a webhook URL is needed (https://... or http://...)")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"a webhook URL is at most {MAX_URL_CHARS} characters, got {len(url)}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError("a webhook URL must not contain spaces or control characters")
    if redact_tokens(url) != url:
        raise ValueError("a webhook URL must not contain an API token (lst_...)")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("https", "http"):
        raise ValueError(f"a webhook URL must start with https:// or http://, not {parts.scheme or 'nothing'!r}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError("a webhook URL must not carry credentials (user:password@); the receiver checks the "
                         f"{SIGNATURE_HEADER} signature made with the webhook's secret instead")
    if not parts.hostname:
        raise ValueError("a webhook URL needs a host name")
    del port
    host = parts.hostname.rstrip(".")
    if _DOTTED_NUMBERS.fullmatch(host) and any(len(p) > 1 and p.startswith("0") for p in host.split(".")):
        raise ValueError(f"a webhook URL's IPv4 address must not have leading zeros ({host!r}: some resolvers read "
                         "0177 as octal 127, others as decimal 177); write each part in decimal without leading "
                         "zeros, e.g. 127.0.0.1")
    import httpx

    try:
        httpx.URL(url)  # the URL the deliveries are posted to: refused now, not at the first attempt
    except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
        raise ValueError(f"not a URL: {redact_tokens(str(exc))[:200]}") from None
    return url


#: A host made of dot-separated decimal digits only (an IPv4 address, or a mistyped one).
_DOTTED_NUMBERS = re.compile(r"[0-9]+(\.[0-9]+)*")


#: IPv6 ranges that carry an IPv4 address (RFC 6052 NAT64 well-known and local-use prefixes,
#: RFC 4291 IPv4-compatible): the IPv4 inside is what is reached, so it is checked too.
_V4_IN_V6 = ("64:ff9b::/96", "64:ff9b:1::/48", "::/96")


def _refused_address(addr) -> bool:
    """Whether ``addr`` (an :mod:`ipaddress` address) is not a global unicast address
    (loopback, RFC 1918 private, link-local, unique-local, multicast, reserved: RFC 6890, as
    :attr:`ipaddress.IPv4Address.is_global` says), looking through the IPv6 forms that embed
    an IPv4 address (IPv4-mapped, 6to4 RFC 3056, Teredo RFC 4380, NAT64 RFC 6052,
    IPv4-compatible)."""
    import ipaddress

    if not addr.is_global or addr.is_multicast:
        return True
    if addr.version == 6:
        inner = [addr.ipv4_mapped, addr.sixtofour, *(addr.teredo or ())]
        if any(addr in ipaddress.ip_network(n) for n in _V4_IN_V6):
            inner.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
        return any(v4 is not None and (not v4.is_global or v4.is_multicast) for v4 in inner)
    return False


def resolve_target(url: str) -> tuple[str, list[str]]:
    """The host name httpx connects to for ``url`` (IDNA 2008 ASCII, as :class:`httpx.URL`
    encodes it) and the addresses it resolves to now.

    Raises
    ------
    ValueError
        If the host does not resolve.
    """
    import socket

    import httpx

    try:
        u = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a URL: {exc}") from None
    host = u.raw_host.decode("ascii").strip("[]")
    try:
        infos = socket.getaddrinfo(host, u.port or (443 if u.scheme == "https" else 80), proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        raise ValueError("the webhook host does not resolve") from None
    return host, list(dict.fromkeys(info[4][0].split("%", 1)[0] for info in infos))


def _is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an address, in any form a resolver takes as one (``127.1``,
    ``2130706433``, ``0x7f000001``, IPv6 in brackets)."""
    import ipaddress
    import socket

    h = host.strip("[]")
    try:
        ipaddress.ip_address(h)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(h)  # the BSD forms: 127.1, 2130706433, 0x7f.1 ...
        return True
    except OSError:
        return False


def check_target(url: str) -> tuple[str | None, str | None]:
    """``(address, None)``: the address to connect to for ``url`` (every address its host
    resolves to is global, :func:`_refused_address`), or ``(None, reason)``.

    The attempt then connects to that very address (:func:`post_delivery` ``pin``), so a name
    re-pointed after the check (DNS rebinding) cannot reach another host. The reason does not
    say what a name resolved to (a user must not map the platform's network through it)."""
    import ipaddress

    try:
        _, addresses = resolve_target(url)
    except ValueError as exc:
        return None, str(exc)
    if not addresses or any(_refused_address(ipaddress.ip_address(a)) for a in addresses):
        return None, ("the webhook host is not a public internet address (loopback, private, link-local or "
                      "reserved targets are refused unless WEBHOOK_ALLOW_PRIVATE is set)")
    return addresses[0], None


def refuse_private_target(url: str) -> str | None:
    """Why ``url`` may not be posted to while ``WEBHOOK_ALLOW_PRIVATE`` is false, or None
    (:func:`check_target`)."""
    return check_target(url)[1]


def new_secret() -> str:
    """A new webhook secret: ``whsec_`` and 43 URL-safe characters (32 random bytes)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def body_bytes(payload: dict[str, Any]) -> bytes:
    """The body posted for ``payload``: UTF-8 JSON, keys sorted, no spaces (the bytes signed)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 with key ``secret`` of ``b"<timestamp>." + body``."""
    mac = hmac.new(secret.encode("utf-8"), str(int(timestamp)).encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: str, timestamp: str | int, body: bytes, signature: str, *,
                     tolerance_s: float | None = 300.0, now: float | None = None) -> bool:
    """What a receiver does: whether ``signature`` (the ``X-LST-Signature`` header) is the
    signature of ``body`` at ``timestamp`` (``X-LST-Timestamp``) with ``secret``
    (constant-time comparison), and the timestamp within ``tolerance_s`` of ``now`` [s]
    (None: no age check)."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if tolerance_s is not None and abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature or "")


# -- registration and the outbox ----------------------------------------------------------------


def register_webhook(session: Session, owner: str, url: str, *, job_id: str | None = None,
                     saved_search_id: int | None = None) -> Webhook:
    """Store a webhook of ``owner`` for a job or a saved search, with a new secret (read it
    from the returned row now: it is shown once); flushed, the caller commits.

    Raises
    ------
    WebhookError
        A URL that :func:`check_webhook_url` refuses, or neither/both of job and search.
    """
    if (job_id is None) == (saved_search_id is None):
        raise WebhookError("a webhook belongs to exactly one job or one saved search")
    try:
        url = check_webhook_url(url)
    except ValueError as exc:
        raise WebhookError(f"webhook_url: {exc}") from None
    if not get_settings().webhook_allow_private:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
        literal = host == "localhost" or host.endswith(".localhost") or _is_ip_literal(host)
        why = refuse_private_target(url) if literal else None  # a name is checked at each attempt (no DNS here)
        if why is not None:
            raise WebhookError(f"webhook_url: {why.replace('the webhook host', f'the webhook host {host!r}')}")
    hook = Webhook(owner=owner, url=url, secret=new_secret(), job_id=job_id, saved_search_id=saved_search_id)
    session.add(hook)
    session.flush()
    log.info("webhook %d of %s registered for %s", hook.id, owner,
             f"job {job_id}" if job_id else f"saved search {saved_search_id}")
    return hook


def queue_delivery(session: Session, hook: Webhook, event_name: str, payload: dict[str, Any]) -> WebhookDelivery:
    """Add a delivery of ``payload`` to ``hook`` in the session's transaction; it is sent to
    the broker once that transaction commits (nothing is sent if it rolls back)."""
    row = WebhookDelivery(webhook_id=hook.id, event=event_name, payload=payload, state=DeliveryState.pending,
                          next_attempt_at=utcnow())
    session.add(row)
    session.flush()
    session.info.setdefault(_OUTBOX_KEY, []).append(row.id)
    return row


@event.listens_for(Session, "after_commit")
def _send_outbox(session: Session) -> None:
    """Send the deliveries queued in the transaction just committed (best effort: a broker
    that is down leaves them to the reconciler)."""
    ids = session.info.pop(_OUTBOX_KEY, None)
    if not ids:
        return
    for delivery_id in ids:
        _send_task(delivery_id)


@event.listens_for(Session, "after_rollback")
def _forget_outbox(session: Session) -> None:
    session.info.pop(_OUTBOX_KEY, None)


def _send_task(delivery_id: str, countdown: float | None = None) -> bool:
    """Send the ``deliver_webhook`` task of ``delivery_id`` (after ``countdown`` seconds);
    False when the broker could not be reached (logged: the reconciler sends it later)."""
    from backend.broker import TaskName, ensure_configured

    try:
        ensure_configured().send_task(TaskName.deliver_webhook, args=[delivery_id], queue="cpu",
                                      countdown=countdown, ignore_result=True)
        return True
    except Exception as exc:  # noqa: BLE001 - the outbox row stays: the reconciler re-sends it
        from backend.faults import public_reason

        log.warning("webhook delivery %s not sent to the broker (%s); the reconciler will", delivery_id,
                    public_reason(exc))
        return False


def job_summary(job: Job) -> dict[str, Any]:
    """What ``job.ended`` says of a job: id, state, counts, progress fraction, error, times."""
    handled = (job.done or 0) + (job.failed or 0) + (job.skipped or 0) + (job.cancelled or 0)
    total = job.total or 0
    return {"id": job.id, "owner": job.owner, "state": job.state.value, "total": total, "done": job.done or 0,
            "failed": job.failed or 0, "skipped": job.skipped or 0, "cancelled": job.cancelled or 0,
            "progress": min(1.0, handled / total) if total else (1.0 if job.state in JOB_FINAL else 0.0), "error": job.error,
            "finished_at": _iso(job.finished_at), "url": f"/api/v1/jobs/{job.id}"}


def job_ended(session: Session, job: Job) -> list[WebhookDelivery]:
    """Queue a ``job.ended`` delivery to each webhook of ``job`` (none: nothing), in the
    transaction that ends it (``backend.worker.processing._finish``)."""
    hooks = list(session.scalars(select(Webhook).where(Webhook.job_id == job.id)))
    return [queue_delivery(session, h, "job.ended", {"event": "job.ended", "job": job_summary(job)}) for h in hooks]


def webhook_of_job(session: Session, job_id: str) -> Webhook | None:
    return session.scalar(select(Webhook).where(Webhook.job_id == job_id).order_by(Webhook.id))


# -- attempts -------------------------------------------------------------------------------------


def backoff_s(settings: Settings, attempt: int) -> float:
    """Wait after failed attempt number ``attempt`` (1, 2, ...) [s]: ``WEBHOOK_BACKOFF_S`` x
    2^(attempt-1), at most :data:`MAX_BACKOFF_S`."""
    return min(MAX_BACKOFF_S, settings.webhook_backoff_s * 2 ** max(0, attempt - 1))


def claim_delivery(session: Session, delivery_id: str, holder: str, *, now: dt.datetime | None = None) -> int | None:
    """Claim a delivery for one attempt (:func:`backend.state.claim_delivery`, lease
    :data:`CLAIM_LEASE_S`); returns the attempt's number or None. The caller commits."""
    return _claim(session, delivery_id, holder, lease_s=CLAIM_LEASE_S, now=now)


@dataclass(frozen=True)
class AttemptResult:
    """What one POST gave: the HTTP status (None: no answer), the error (None: 2xx), and
    how long it took [ms]."""

    status: int | None
    error: str | None
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def _error_text(exc: Exception, timeout_s: float, connect_s: float) -> str:
    """A short, true reason of a failed POST, without the secret or any header."""
    import httpx

    from backend.auth import redact_tokens

    if isinstance(exc, httpx.ConnectTimeout):
        return f"no connection within {connect_s:g} s (connect timeout)"
    if isinstance(exc, httpx.ReadTimeout):
        return f"no answer within {timeout_s:g} s (read timeout)"
    if isinstance(exc, httpx.WriteTimeout):
        return f"the body could not be sent within {timeout_s:g} s (write timeout)"
    if isinstance(exc, httpx.PoolTimeout):
        return "no connection available (pool timeout)"
    if isinstance(exc, httpx.ConnectError):
        text = str(exc).splitlines()[0] if str(exc) else "refused"
        return redact_tokens(f"could not connect: {text}")[:MAX_ERROR_CHARS]
    text = str(exc).splitlines()[0] if str(exc) else ""
    return redact_tokens(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:MAX_ERROR_CHARS]


def post_delivery(url: str, secret: str, delivery_id: str, event_name: str, body: bytes, *,
                  timeout_s: float = 10.0, now: float | None = None, pin: str | None = None) -> AttemptResult:
    """POST ``body`` to ``url``, signed (module docstring), with short timeouts: connect at
    most :data:`CONNECT_TIMEOUT_S` (or ``timeout_s`` if shorter), each read and write at most
    ``timeout_s`` [s]. Redirects are not followed (a 3xx is a failure). ``pin``: the address
    to connect to (checked by :func:`check_target`), with the URL's host name kept in the
    ``Host`` header and as the TLS server name (certificate checked against it). Never raises
    for what the target does; touches no database."""
    import httpx

    from backend.tls import client_context

    ts = int(time.time() if now is None else now)
    headers = {"Content-Type": "application/json", "User-Agent": f"lstdp-webhooks/{__version__}",
               EVENT_HEADER: event_name, DELIVERY_HEADER: delivery_id, TIMESTAMP_HEADER: str(ts),
               SIGNATURE_HEADER: sign(secret, ts, body)}
    connect_s = min(CONNECT_TIMEOUT_S, timeout_s)
    t0 = time.monotonic()
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=connect_s), follow_redirects=False,
                          trust_env=False, verify=client_context(trust_env=False)) as client:
            target, ext = url, {}
            if pin is not None:
                u = httpx.URL(url)
                headers["Host"] = u.netloc.decode("ascii")
                target = u.copy_with(host=pin)
                if u.scheme == "https":
                    ext = {"sni_hostname": u.raw_host.decode("ascii")}
            with client.stream("POST", target, content=body, headers=headers, extensions=ext) as resp:
                head = b""
                for chunk in resp.iter_bytes():
                    head += chunk
                    if len(head) >= MAX_ANSWER_BYTES or time.monotonic() - t0 > timeout_s:
                        break
                status = resp.status_code
    except Exception as exc:  # noqa: BLE001 - whatever the target does is an attempt's outcome
        return AttemptResult(None, _error_text(exc, timeout_s, connect_s), (time.monotonic() - t0) * 1000.0)
    ms = (time.monotonic() - t0) * 1000.0
    if 200 <= status < 300:
        return AttemptResult(status, None, ms)
    from backend.auth import redact_tokens

    said = head[:200].decode("utf-8", "replace").strip().replace("\n", " ")
    why = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
    return AttemptResult(status, redact_tokens(f"{why}: {said}" if said else why)[:MAX_ERROR_CHARS], ms)


def send_delivery(url: str, secret: str, delivery_id: str, event_name: str, body: bytes,
                  settings: Settings) -> AttemptResult:
    """The post of one attempt: refused with the reason (nothing sent) when the target is a
    non-global address and ``WEBHOOK_ALLOW_PRIVATE`` is false (:func:`refuse_private_target`),
    else :func:`post_delivery` with ``WEBHOOK_TIMEOUT_S``."""
    pin = None
    if not settings.webhook_allow_private:
        pin, refused = check_target(url)
        if refused is not None:
            return AttemptResult(None, refused[:MAX_ERROR_CHARS], 0.0)
    return post_delivery(url, secret, delivery_id, event_name, body, timeout_s=settings.webhook_timeout_s, pin=pin)


def record_attempt(session: Session, delivery_id: str, attempt: int, result: AttemptResult, settings: Settings, *,
                   started_at: dt.datetime, holder: str, now: dt.datetime | None = None) -> float | None:
    """Log attempt ``attempt`` of ``delivery_id`` and move the delivery: ``delivered`` (2xx),
    ``pending`` with its next attempt after :func:`backoff_s`, or ``failed`` after
    ``WEBHOOK_MAX_ATTEMPTS``. The caller commits. Returns the countdown of the next
    attempt [s], or None when there is none. An attempt whose claim was taken over meanwhile
    is logged and changes nothing else."""
    now = now or utcnow()
    row = session.scalar(select(WebhookDelivery).where(WebhookDelivery.id == delivery_id)
                         .with_for_update().execution_options(populate_existing=True))
    if row is None:
        return None
    ours = row.state == DeliveryState.delivering and row.claimed_by == holder[:200] and row.attempts == attempt
    retry_in = None
    if result.ok:
        outcome = "delivered"
    elif attempt >= settings.webhook_max_attempts:
        outcome = "failed"
    else:
        outcome, retry_in = "retry", backoff_s(settings, attempt)
    session.add(WebhookAttempt(delivery_id=delivery_id, attempt=attempt, started_at=started_at,
                               duration_ms=round(result.duration_ms, 1), status_code=result.status,
                               error=result.error, outcome=outcome, retry_in_s=retry_in))
    if not ours:
        log.warning("webhook delivery %s attempt %d: its claim was taken over meanwhile; outcome %s not applied",
                    delivery_id, attempt, outcome)
        return None
    row.last_status, row.last_error = result.status, result.error
    row.claimed_at = row.claimed_by = None
    if outcome == "delivered":
        move_delivery(row, DeliveryState.delivered)
        row.delivered_at = now
    elif outcome == "failed":
        move_delivery(row, DeliveryState.failed)
        log.warning("webhook delivery %s failed after %d attempts: %s", delivery_id, attempt, result.error)
    else:
        move_delivery(row, DeliveryState.pending)
        row.next_attempt_at = now + dt.timedelta(seconds=retry_in)
        row.sent_at = now
    return retry_in


def attempt_delivery(delivery_id: str, settings: Settings, holder: str) -> float | None:
    """One attempt of a delivery: claim (commit), post with no session open, record
    (commit). Returns the countdown of the next attempt [s] (the caller sends the task
    again with it), or None: delivered, given up, or not this call's to post."""
    from backend.db import session_scope

    with session_scope() as s:
        attempt = claim_delivery(s, delivery_id, holder)
        if attempt is None:
            log.info("webhook delivery %s: nothing to post (delivered, failed, not due or claimed)", delivery_id)
            return None
        row = s.get(WebhookDelivery, delivery_id)
        hook = s.get(Webhook, row.webhook_id)
        url, secret, event_name, body = hook.url, hook.secret, row.event, body_bytes(row.payload)
    started = utcnow()
    result = send_delivery(url, secret, delivery_id, event_name, body, settings)
    log.info("webhook delivery %s attempt %d to webhook %d: %s in %.0f ms", delivery_id, attempt, hook.id,
             result.status if result.ok else result.error, result.duration_ms)
    with session_scope() as s:
        return record_attempt(s, delivery_id, attempt, result, settings, started_at=started, holder=holder)


def reconcile_deliveries(session: Session, *, grace_s: float, now: dt.datetime | None = None) -> int:
    """The reconciler's step: send again the deliveries whose message is lost: ``pending``
    and due more than ``grace_s`` ago with no message sent within ``grace_s``, or
    ``delivering`` under a claim older than :data:`CLAIM_LEASE_S` (its worker died). Commits;
    returns how many were sent (a message that turns out not lost posts nothing: the claim)."""
    now = now or utcnow()
    grace = dt.timedelta(seconds=grace_s)
    D = WebhookDelivery
    rows = list(session.scalars(select(D).where(or_(
        (D.state == DeliveryState.pending) & (D.next_attempt_at < now - grace)
        & or_(D.sent_at.is_(None), D.sent_at < now - grace),
        (D.state == DeliveryState.delivering) & (D.claimed_at < now - dt.timedelta(seconds=CLAIM_LEASE_S))))
        .order_by(D.created_at).limit(1000)))
    for r in rows:
        r.sent_at = now
    session.commit()
    sent = sum(_send_task(r.id) for r in rows)
    if rows:
        log.warning("reconciler: %d webhook deliveries whose message was lost sent again", sent)
    return sent


# -- reading --------------------------------------------------------------------------------------


def _iso(t: dt.datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def describe_webhook(hook: Webhook, *, with_secret: bool = False) -> dict[str, Any]:
    """A webhook as the API shows it; the secret only when ``with_secret`` (its creation)."""
    out = {"id": hook.id, "owner": hook.owner, "url": hook.url, "job_id": hook.job_id,
           "saved_search_id": hook.saved_search_id, "created_at": _iso(hook.created_at),
           "deliveries_url": f"/api/v1/webhooks/{hook.id}/deliveries"}
    if with_secret:
        out["secret"] = hook.secret
        out["secret_note"] = ("shown once: keep it to verify the X-LST-Signature header "
                              "(HMAC-SHA256 of '<X-LST-Timestamp>.<body>')")
    return out


def describe_delivery(row: WebhookDelivery) -> dict[str, Any]:
    """A delivery and its attempts (never the secret or the signature)."""
    return {"id": row.id, "webhook_id": row.webhook_id, "event": row.event, "state": row.state.value,
            "attempts": row.attempts, "created_at": _iso(row.created_at), "delivered_at": _iso(row.delivered_at),
            "next_attempt_at": _iso(row.next_attempt_at) if row.state == DeliveryState.pending else None,
            "last_status": row.last_status, "last_error": row.last_error, "payload": row.payload,
            "attempt_log": [{"attempt": a.attempt, "started_at": _iso(a.started_at), "duration_ms": a.duration_ms,
                             "status_code": a.status_code, "error": a.error, "outcome": a.outcome,
                             "retry_in_s": a.retry_in_s} for a in row.attempt_log]}


def deliveries_of(session: Session, *, webhook_ids: list[int], limit: int = 50, offset: int = 0
                  ) -> tuple[list[WebhookDelivery], int]:
    """Deliveries of these webhooks, newest first, and their count."""
    from sqlalchemy import func

    if not webhook_ids:
        return [], 0
    q = select(WebhookDelivery).where(WebhookDelivery.webhook_id.in_(webhook_ids))
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id)
                                .limit(limit).offset(offset)))
    return rows, total
