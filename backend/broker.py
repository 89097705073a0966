"""The Celery application as the API and the CLI see it: configuration, queues, task names.

The API sends work **by task name** (:func:`send`): no module of the API imports the worker
(:mod:`backend.worker`), which registers the tasks on this same :data:`app`. The registered
names (:class:`TaskName`) keep the first release's module path (``pipelines.tasks.*``), so
messages already queued by an earlier version are still consumed. ``detect_events`` (any
registry detector) is new: follow-up detections are sent under it, so upgrade every worker
before the first job ends on the new code (an older worker refuses a name it does not know).

Queues: ``cpu`` (default) and ``gpu`` (GPU workers, ``ARRAY_BACKEND=cupy``). Long tasks use
``acks_late`` with ``worker_prefetch_multiplier=1`` (Celery guide, "optimizing").

Embedded mode (``CELERY_BROKER_URL=filesystem://``, the default) uses kombu's filesystem
transport with its folders under ``DATA_DIR/broker``: a worker needs no server, and a
submitted job still runs asynchronously in the worker process (never in eager mode). Its
message files are written whole before they appear (:mod:`backend.broker_fs`, registered below
as the ``filesystem`` transport: kombu's own could hand a worker an empty file and stop it).

Time limits and timeouts (:func:`configure`): every task gets ``TASK_SOFT_TIME_LIMIT_S``
and ``TASK_TIME_LIMIT_S``; the Redis transport's visibility timeout is
``BROKER_VISIBILITY_TIMEOUT_S``, and a worker refuses to start unless it is longer than the
hard limit (:func:`check_time_limits`). Redis connections (broker and result backend) have
connect and socket timeouts and TCP keepalives, per role:

* ``api`` (the default: the API and the CLI): :func:`api_broker_timeout_s`, a fifth of
  ``API_DEADLINE_S``, and one publish retry, so that sending to a dead or frozen Redis
  fails within about 1.2 s (three timeouts: the pooled connection, a new connection and its
  command) and the API can still mark the job failed before its deadline;
* ``worker`` (``lstdp worker``): ``BROKER_SOCKET_TIMEOUT_S`` and Celery's default publish
  retries.

:func:`send` asks for no result (``ignore_result``): the senders follow the work in the
database, and the API does not subscribe to a result channel per job it sends.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from celery import Celery
from celery.app.defaults import DEFAULTS
from kombu import Exchange, Queue
from kombu import transport as _transport

from backend.faults import public_reason
from backend.settings import Settings, get_settings
from pipelines.errors import LSTDPError

__all__ = ["app", "configure", "ensure_configured", "send", "broker_status", "TaskName", "check_time_limits",
           "TimeLimitError", "api_broker_timeout_s", "Role", "InFlight", "in_flight", "send_calibration"]

log = logging.getLogger(__name__)

# The embedded mode's ``filesystem://`` broker is kombu's transport with whole message files
# (backend/broker_fs.py: kombu's own can hand a consumer an empty file, which stops the worker;
# celery/kombu#1551), in every process that imports this module, before any connection is made.
_transport.TRANSPORT_ALIASES["filesystem"] = "backend.broker_fs:Transport"
_transport._transport_cache.pop("filesystem", None)

#: Who uses the broker: the API (and the CLI), or a worker.
Role = Literal["api", "worker"]

#: TCP keepalive of Redis connections (``socket.TCP_KEEPIDLE``, ``TCP_KEEPINTVL``,
#: ``TCP_KEEPCNT``: idle 30 s, then every 10 s, 3 probes), as for PostgreSQL
#: (``backend.db.TCP_OPTIONS``); a choice: a dead peer is noticed within about a minute.
KEEPALIVE_OPTIONS = {getattr(socket, name): value for name, value in
                     (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)) if hasattr(socket, name)}


class TimeLimitError(LSTDPError):
    """Time limits and the visibility timeout that contradict each other (a worker refuses
    to start with them)."""


class TaskName:
    """Registered Celery task names (queued messages name them: never rename one)."""

    ingest_file = "pipelines.tasks.ingest_file"
    run_job = "pipelines.tasks.run_job"
    calibrate_product = "pipelines.tasks.calibrate_product"
    calibrate_product_gpu = "pipelines.tasks.calibrate_product_gpu"
    calibrate_products_gpu_batch = "pipelines.tasks.calibrate_products_gpu_batch"
    calibrate_products_cpu_batch = "pipelines.tasks.calibrate_products_cpu_batch"
    record_progress = "pipelines.tasks.record_progress"
    detect_flares = "pipelines.tasks.detect_flares"
    detect_cmes = "pipelines.tasks.detect_cmes"
    detect_prominences = "pipelines.tasks.detect_prominences"
    detect_white_light_flares = "pipelines.tasks.detect_white_light_flares"
    detect_events = "pipelines.tasks.detect_events"
    make_movie = "pipelines.tasks.make_movie"
    rerun_frame = "pipelines.tasks.rerun_frame"
    deliver_webhook = "pipelines.tasks.deliver_webhook"

    @classmethod
    def all(cls) -> list[str]:
        """Every registered name."""
        return [v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, str)]


#: The worker's task module: imported by a worker at start, never by the API.
WORKER_MODULE = "backend.worker.tasks"

app = Celery("lstdp", include=[WORKER_MODULE])
_configured_for: tuple | None = None
_role: Role = "api"


def api_broker_timeout_s(settings: Settings) -> float:
    """The API's Redis connect and socket timeout [s]: a fifth of ``API_DEADLINE_S`` (0.36 s by
    default; ``BROKER_SOCKET_TIMEOUT_S`` without a deadline). A publish waits at most three of
    them (a pooled connection, then one retry: connect and command) plus 0.1 s, which leaves
    the API a fifth of its deadline, and more, for its database work."""
    if settings.api_deadline_s > 0:
        return settings.api_deadline_s / 5
    return settings.broker_socket_timeout_s


def check_time_limits(settings: Settings) -> None:
    """Refuse time limits that contradict each other, in one line.

    Raises
    ------
    TimeLimitError
        If the soft time limit is not shorter than the hard one (the task would be killed
        before it could record why), or, on Redis, if the visibility timeout is not longer
        than the hard time limit (a message of a task still running would be given to a
        second worker). The filesystem broker of the embedded mode has no visibility
        timeout.
    """
    soft, hard = settings.task_soft_time_limit_s, settings.task_time_limit_s
    if soft >= hard:
        raise TimeLimitError(f"TASK_SOFT_TIME_LIMIT_S ({soft:g} s) must be shorter than TASK_TIME_LIMIT_S "
                             f"({hard:g} s)")
    if not settings.embedded and settings.broker_visibility_timeout_s <= hard:
        raise TimeLimitError(f"BROKER_VISIBILITY_TIMEOUT_S ({settings.broker_visibility_timeout_s:g} s) must be "
                             f"longer than TASK_TIME_LIMIT_S ({hard:g} s): a running task's message would be "
                             "delivered again")


def _configuration_key(s: Settings, role: Role) -> tuple:
    return (s.celery_broker_url, s.result_backend, str(s.root), role, s.api_deadline_s, s.broker_socket_timeout_s,
            s.broker_visibility_timeout_s, s.task_soft_time_limit_s, s.task_time_limit_s)


def configure(settings: Settings | None = None, role: Role | None = None) -> Celery:
    """(Re)configure :data:`app` from ``settings`` (default: the process settings) for
    ``role`` (default: the last one, first ``"api"``; ``lstdp worker`` passes ``"worker"``).
    See the module docstring for the timeouts."""
    global _configured_for, _role
    s = settings or get_settings()
    _role = role or _role
    timeout = api_broker_timeout_s(s) if _role == "api" else s.broker_socket_timeout_s
    conf: dict = dict(
        broker_url=s.celery_broker_url,
        result_backend=s.result_backend,
        task_queues=(
            Queue("cpu", Exchange("cpu"), routing_key="cpu"),
            Queue("gpu", Exchange("gpu"), routing_key="gpu"),
        ),
        task_default_queue="cpu",
        task_default_exchange="cpu",
        task_default_routing_key="cpu",
        task_routes={TaskName.calibrate_product_gpu: {"queue": "gpu", "routing_key": "gpu"}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # the platform follows its work in the database and reads no task result: a result
        # backend that fails after a task body finished must not turn written work into a
        # failure (issue 28), so none is stored (ingest_file keeps its own, for the CLI)
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        result_expires=24 * 3600,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=timeout,
        task_soft_time_limit=s.task_soft_time_limit_s,
        task_time_limit=s.task_time_limit_s,
        worker_hijack_root_logger=False,
        timezone="UTC",
        enable_utc=True,
    )
    if s.embedded:
        s.ensure_dirs()
        folder = str(s.broker_dir / "in")
        conf["broker_transport_options"] = {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "processed_folder": str(s.broker_dir / "processed"),
            "control_folder": str(s.broker_dir / "control"),
            "store_processed": False,
            "polling_interval": 0.2,
        }
        conf["worker_enable_remote_control"] = False
        conf["worker_send_task_events"] = False
        # the blocking loop's timer thread sleeps up to this long [s] between two looks at its
        # schedule, and a warm shutdown waits for it (Celery's default, 1 s, was 1 s of every stop)
        conf["worker_timer_precision"] = 0.1
    else:
        sockets = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "socket_keepalive": True,
                   "socket_keepalive_options": KEEPALIVE_OPTIONS}
        conf["broker_transport_options"] = {"visibility_timeout": s.broker_visibility_timeout_s, **sockets}
    if s.result_backend.startswith(("redis://", "rediss://")):
        conf.update(redis_socket_timeout=timeout, redis_socket_connect_timeout=timeout,
                    redis_socket_keepalive=True)
    if _role == "api":
        # one retry (a pooled connection that Redis closed is re-made), then the error
        short = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}
        conf["task_publish_retry_policy"] = short
        conf["result_backend_transport_options"] = {"retry_policy": short}
    else:
        conf["task_publish_retry_policy"] = DEFAULTS["task_publish_retry_policy"]
        conf["result_backend_transport_options"] = {}
    app.close()
    app.conf.update(conf)
    # forget pooled connections and producers bound to the previous broker, and this
    # thread's result backend (Celery caches one per thread, bound to the old URL)
    app._pool = None
    app.amqp._producer_pool = None
    vars(app._local).pop("backend", None)
    _configured_for = _configuration_key(s, _role)
    return app


def ensure_configured() -> Celery:
    """Configure :data:`app` if the settings changed since the last call (tests, CLI)."""
    s = get_settings()
    if _configured_for != _configuration_key(s, _role):
        configure(s)
    return app


def broker_status(timeout_s: float = 1.0) -> str:
    """``"ok"`` when the broker takes connections, else a one-line reason; within about
    2 x ``timeout_s`` [s] (a connection and a ``PING``, each with that timeout).

    Redis (production): a connection with connect and socket timeouts and a ``PING``, so a
    frozen server is reported as down instead of hanging the caller. The embedded
    filesystem broker: its folder exists and is writable. The reason names the kind of
    fault (:func:`backend.faults.public_reason`), never the broker's host, port or
    password; the full error is logged.
    """
    s = get_settings()
    if s.embedded:
        folder = s.broker_dir / "in"
        if folder.is_dir() and os.access(folder, os.W_OK):
            return "ok"
        return f"broker folder {folder.name} is missing or not writable"
    from kombu import Connection

    try:
        with Connection(s.celery_broker_url, connect_timeout=timeout_s,
                        transport_options={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
                                           "max_retries": 0}) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)
            client = getattr(conn.default_channel, "client", None)
            if client is not None and hasattr(client, "ping"):
                client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        log.warning("broker check failed: %s: %s", type(exc).__name__, exc)
        return f"broker unreachable: {public_reason(exc)}"
    return "ok"


def send(name: str, args: list | tuple | None = None, kwargs: dict | None = None, *, queue: str = "cpu") -> None:
    """Send task ``name`` (a :class:`TaskName`) to ``queue`` with JSON arguments; returns at
    once. The sender needs no import of the task's code; no result is kept (the task records
    its outcome in the database).

    Raises
    ------
    kombu.exceptions.OperationalError
        The broker is down or does not answer within the role's timeouts (module docstring).
    """
    ensure_configured().send_task(name, args=list(args or ()), kwargs=dict(kwargs or {}), queue=queue,
                                  ignore_result=True)


def send_calibration(product_id: int, job_id: str | None, queue: str = "cpu") -> None:
    """Send one product's calibration: calibrate then settle its job's item, in one task on
    ``queue`` (a GPU product as a batch of one). Used by the worker (plans, the reconciler) and the API (a retry).

    Raises
    ------
    kombu.exceptions.OperationalError
        The broker is down or does not answer (as :func:`send`).
    """
    if queue == "gpu":
        send(TaskName.calibrate_products_gpu_batch, [job_id, [product_id]], queue="gpu")
        return
    # one message: the task settles the job's item itself as the frame finishes (a chained
    # settling message would queue behind every calibration sent before it)
    send(TaskName.calibrate_product, [product_id, job_id] if job_id else [product_id], queue="cpu")


@dataclass
class InFlight:
    """The work the broker still holds: messages waiting in a queue, or delivered to a
    worker and not yet acknowledged (recently: see :func:`in_flight`).

    ``products``: product ids of calibration messages; ``jobs``: job ids of plan
    (``run_job``) messages; ``reruns``: ``(job_id, frame_id)`` of ``rerun_frame`` messages;
    ``follow_ups``: ``(job_id, detector, channel)`` of follow-up
    detection messages; ``movies``: movie ids of ``make_movie`` messages; ``messages``: how
    many messages were read.
    """

    products: set[int] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    follow_ups: set[tuple[str, str, str]] = field(default_factory=set)
    movies: set[str] = field(default_factory=set)
    reruns: set[tuple[str, int]] = field(default_factory=set)
    messages: int = 0

    def add_message(self, payload: bytes | str) -> None:
        """Record one kombu message (its JSON envelope, body base64 or plain JSON)."""
        try:
            msg = json.loads(payload)
            headers = msg.get("headers") or {}
            body = msg.get("body", "")
            if (msg.get("properties") or {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args, kwargs, embed = json.loads(body)
        except (ValueError, TypeError, KeyError):  # not a Celery protocol-2 message: not ours
            return
        self.messages += 1
        self._add_task(headers.get("task"), args, kwargs)
        for sig in (embed or {}).get("chain") or []:  # the rest of a chain rides in the first message
            self._add_task(sig.get("task"), sig.get("args") or [], sig.get("kwargs") or {})

    def _add_task(self, name: str | None, args: list, kwargs: dict) -> None:
        try:
            if name in (TaskName.calibrate_product, TaskName.calibrate_product_gpu):
                self.products.add(int(args[0] if args else kwargs["product_id"]))
            elif name in (TaskName.calibrate_products_gpu_batch, TaskName.calibrate_products_cpu_batch):
                self.products.update(int(p) for p in (args[1] if len(args) > 1 else kwargs["product_ids"]))
            elif name == TaskName.run_job:
                self.jobs.add(str(args[0] if args else kwargs["job_id"]))
            elif name == TaskName.make_movie:
                self.movies.add(str(args[0] if args else kwargs["movie_id"]))
            elif name == TaskName.rerun_frame:
                self.reruns.add((str(args[0]), int(args[1])) if len(args) > 1
                                else (str(kwargs["job_id"]), int(kwargs["frame_id"])))
            elif name == TaskName.detect_events and kwargs.get("job_id"):
                self.follow_ups.add((str(kwargs["job_id"]), str(kwargs.get("detector")), str(kwargs.get("channel"))))
        except (IndexError, KeyError, TypeError, ValueError):
            return


#: Queues whose messages :func:`in_flight` reads.
QUEUES = ("cpu", "gpu")


def in_flight(*, unacked_within_s: float, settings: Settings | None = None) -> InFlight | None:
    """What the broker holds now, for the reconciler; ``None`` when it cannot be read.

    Redis (kombu's layout): each queue's lists (one per priority step) and the ``unacked``
    hash of delivered, unacknowledged messages; a delivery older than ``unacked_within_s``
    [s] (its ``unacked_index`` score) is left out, as its worker is taken as dead (the
    reconciler passes ``Settings.lease_s``: no live worker runs a task that long). The
    embedded filesystem broker: the message files in its folder (a message is removed from
    the folder when a worker takes it).
    """
    s = settings or get_settings()
    out = InFlight()
    if s.embedded:
        folder = s.broker_dir / "in"
        try:
            names = os.listdir(folder)
        except OSError:
            return None
        for name in names:
            if name.endswith(".msg"):
                try:
                    out.add_message(Path(folder, name).read_bytes())
                except OSError:  # taken by a worker meanwhile
                    continue
        return out
    from kombu import Connection

    try:
        t = s.broker_socket_timeout_s  # a worker's (the reconciler runs beside one)
        with Connection(s.celery_broker_url, connect_timeout=t,
                        transport_options={"socket_timeout": t, "socket_connect_timeout": t,
                                           "max_retries": 0}) as conn:
            channel = conn.default_channel
            client = channel.client
            for queue in QUEUES:
                for pri in channel.priority_steps:
                    for payload in client.lrange(channel._q_for_pri(queue, pri), 0, -1):
                        out.add_message(payload)
            oldest = time.time() - unacked_within_s
            recent = {t if isinstance(t, str) else t.decode() for t, score in
                      client.zrange(channel.unacked_index_key, 0, -1, withscores=True) if score >= oldest}
            for tag, value in client.hgetall(channel.unacked_key).items():
                tag = tag if isinstance(tag, str) else tag.decode()
                if tag in recent:
                    try:
                        out.add_message(json.dumps(json.loads(value)[0]))
                    except (ValueError, TypeError, IndexError):
                        continue
    except Exception:  # noqa: BLE001 - broker down or frozen: the reconciler skips what needs it
        return None
    return out


configure()
