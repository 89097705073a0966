"""The Celery application: explicit queues, routes and reliability settings.

Queues: ``cpu`` (default) and ``gpu`` (GPU workers, ``ARRAY_BACKEND=cupy``). Long tasks use
``acks_late`` with ``worker_prefetch_multiplier=1`` (Celery guide, "optimizing").

Embedded mode (``CELERY_BROKER_URL=filesystem://``, the default) uses kombu's filesystem
transport with its folders under ``DATA_DIR/broker``: a worker needs no server, and a
submitted job still runs asynchronously in the worker process (never in eager mode).
"""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

from backend.settings import Settings, get_settings

__all__ = ["app", "configure", "ensure_configured"]

app = Celery("lstdp", include=["pipelines.tasks"])
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
        task_routes={"pipelines.tasks.calibrate_product_gpu": {"queue": "gpu", "routing_key": "gpu"}},
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


configure()
