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
submitted job still runs asynchronously in the worker process (never in eager mode).
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Exchange, Queue

from backend.settings import Settings, get_settings

__all__ = ["app", "configure", "ensure_configured", "send", "broker_status", "TaskName"]


class TaskName:
    """Registered Celery task names (queued messages name them: never rename one)."""

    ingest_file = "pipelines.tasks.ingest_file"
    run_job = "pipelines.tasks.run_job"
    calibrate_product = "pipelines.tasks.calibrate_product"
    calibrate_product_gpu = "pipelines.tasks.calibrate_product_gpu"
    calibrate_products_gpu_batch = "pipelines.tasks.calibrate_products_gpu_batch"
    record_progress = "pipelines.tasks.record_progress"
    detect_flares = "pipelines.tasks.detect_flares"
    detect_cmes = "pipelines.tasks.detect_cmes"
    detect_prominences = "pipelines.tasks.detect_prominences"
    detect_white_light_flares = "pipelines.tasks.detect_white_light_flares"
    detect_events = "pipelines.tasks.detect_events"

    @classmethod
    def all(cls) -> list[str]:
        """Every registered name."""
        return [v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, str)]


#: The worker's task module: imported by a worker at start, never by the API.
WORKER_MODULE = "backend.worker.tasks"

app = Celery("lstdp", include=[WORKER_MODULE])
_configured_for: tuple[str, str, str] | None = None


def configure(settings: Settings | None = None) -> Celery:
    """(Re)configure :data:`app` from ``settings`` (default: the process settings)."""
    global _configured_for
    s = settings or get_settings()
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
        task_ignore_result=False,
        result_expires=24 * 3600,
        broker_connection_retry_on_startup=True,
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
    else:
        conf["broker_transport_options"] = {"visibility_timeout": 6 * 3600}
    app.close()
    app.conf.update(conf)
    # forget pooled connections and producers bound to the previous broker
    app._pool = None
    app.amqp._producer_pool = None
    _configured_for = (s.celery_broker_url, s.result_backend, str(s.root))
    return app


def ensure_configured() -> Celery:
    """Configure :data:`app` if the settings changed since the last call (tests, CLI)."""
    s = get_settings()
    if _configured_for != (s.celery_broker_url, s.result_backend, str(s.root)):
        configure(s)
    return app


def broker_status(timeout_s: float = 1.0) -> str:
    """``"ok"`` when the broker takes connections, else a one-line reason; within about ``timeout_s``.

    Redis (production): a connection with connect and socket timeouts and a ``PING``, so a
    frozen server is reported as down instead of hanging the caller. The embedded
    filesystem broker: its folder exists and is writable.
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
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"broker unreachable: {type(exc).__name__}: {first}"[:300]
    return "ok"


def send(name: str, args: list | tuple | None = None, kwargs: dict | None = None, *, queue: str = "cpu"):
    """Send task ``name`` (a :class:`TaskName`) to ``queue`` with JSON arguments; returns its
    ``AsyncResult`` at once. The sender needs no import of the task's code."""
    return ensure_configured().send_task(name, args=list(args or ()), kwargs=dict(kwargs or {}), queue=queue)


configure()
