"""Runtime settings, read from the environment (pydantic-settings).

Two modes share one settings class:

* **embedded** (the default, the demo): SQLite file, product store on local disk and a
  Celery broker that lives on local disk (kombu's ``filesystem://`` transport), so a worker
  needs no server;
* **production**: ``DATABASE_URL`` (PostgreSQL through psycopg 3), ``CELERY_BROKER_URL`` and
  ``CELERY_RESULT_BACKEND`` (Redis), products on a shared file system.

Every field is named by the environment variable that sets it (see ``Settings``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "ENV_NAMES"]


#: The shortest heartbeat timeout [s], whatever ``RECONCILE_INTERVAL_S``: on a loaded host a
#: worker's heartbeat thread may wait seconds for the CPU (measured: the fault suite at a 1 s
#: interval on a 2-core machine shared with other work had live claims taken back when the
#: timeout was 1 s), and a live claim taken back is a calibration done twice.
MIN_HEARTBEAT_TIMEOUT_S = 10.0


def _alias(name: str) -> AliasChoices:
    return AliasChoices(name, f"LSTDP_{name}")


class Settings(BaseSettings):
    """All run-time settings of the platform.

    Environment variables (each also accepted with an ``LSTDP_`` prefix):

    ``DATA_DIR``
        Root of the local store: SQLite file, raw files, products, quarantine, broker
        folders. Default ``./var``.
    ``DATABASE_URL``
        SQLAlchemy URL. Default ``sqlite:///<DATA_DIR>/lstdp.sqlite3``. PostgreSQL:
        ``postgresql+psycopg://user@host:5432/db``.
    ``CELERY_BROKER_URL``
        Default ``filesystem://`` (broker folders under ``DATA_DIR/broker``). Production:
        ``redis://host:6379/0``.
    ``CELERY_RESULT_BACKEND``
        Default ``file://<DATA_DIR>/celery-results``. Production: ``redis://host:6379/1``.
    ``PRODUCT_DIR``, ``RAW_DIR``, ``QUARANTINE_DIR``, ``CALIBRATION_DIR``
        Sub-stores; default to folders under ``DATA_DIR``.
    ``PRODUCT_STORE``
        Where the L2 products (FITS and quicklook PNG) live (:mod:`backend.store`): unset or
        ``file://`` for the local folder ``PRODUCT_DIR`` (the default, embedded mode), or
        ``s3://bucket/prefix`` for an S3-compatible object store shared by every host.
    ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``
        The object store of an ``s3://`` ``PRODUCT_STORE`` (the AWS SDKs' own variable names,
        so the same environment serves ``aws``, fsspec and obstore). The endpoint defaults to
        AWS itself; ``http://`` endpoints (a store on a private network) are allowed. Region
        default ``us-east-1`` (what SeaweedFS and MinIO accept).
    ``PRODUCT_CACHE_MB``
        With an object store: the bounded local cache [MiB] (``DATA_DIR/store-cache``) from
        which the viewer, detectors and bulk archives read products as files; least recently
        used files are dropped past it. Default 2048, a choice: ten full-size WST products.
    ``HOST``, ``PORT``
        Where ``lstdp serve`` listens. Default 127.0.0.1:8000.
    ``FORWARDED_ALLOW_IPS``
        The proxies ``lstdp serve`` trusts (uvicorn's ``forwarded_allow_ips``, with
        ``proxy_headers`` on): comma-separated addresses or CIDR networks, or ``*`` for any
        (only where nothing but the proxy can reach the server). A request from one of them
        is taken as its ``X-Forwarded-Proto`` and ``X-Forwarded-For`` say: https behind a
        TLS-terminating proxy, so redirects are ``https://`` and the session cookie is
        ``Secure``. From any other address those headers are ignored. Default
        ``127.0.0.1`` (a proxy on the same host).
    ``SESSION_LIFETIME_S``
        How long a browser session lasts after sign-in (``POST /api/v1/session``) [s];
        never past the token's own expiry. Default 604800 (7 days), a choice: a working
        week without signing in again, a short life for a cookie left on a shared machine.
        Signing out, or revoking the token, ends it at once.
    ``WORKER_QUEUES``
        Comma-separated Celery queues a worker consumes. Default ``cpu``.
    ``ARRAY_BACKEND``
        ``numpy`` or ``cupy``: the array library of the calibration kernels. Default numpy.
    ``SAMPLE_DATA_DIR``
        The real solar files shipped with the project. Default ``<repo>/sample-data/real``.
    ``GPU_BATCH_SIZE``
        Products per task on the ``gpu`` queue (one device batch: masters resident,
        copies overlapped with compute); read where a job is planned (``run_job``, on
        the ``cpu`` workers). Default 16, a choice (not a measured optimum):
        enough frames that the copies of one overlap the compute of the others after the
        first, few enough (16 x 85 MB of float32 at 4608 x 4608) that a retried batch
        redoes little.
    ``TASK_SOFT_TIME_LIMIT_S``, ``TASK_TIME_LIMIT_S``
        Celery soft and hard time limits of every task [s]. Default 840 and 900: a
        full-size frame calibrates in tens of seconds on one core (benchmarks/calibrate.py),
        a GPU batch of 16 in under a minute, so 15 min is a wide margin. At the soft limit
        the task's product fails with the reason; at the hard limit the pool child is
        killed and the reconciler takes the product back.
    ``BROKER_VISIBILITY_TIMEOUT_S``
        Redis transport: how long a delivered, unacknowledged message waits before it is
        given to another worker [s]. Default 3600. A worker refuses to start unless it is
        longer than ``TASK_TIME_LIMIT_S`` (a task still running would run twice).
    ``RECONCILE_INTERVAL_S``
        Period of the reconciler (``backend.worker.reconcile``) [s]. Default 30.
    ``STORAGE_FAULT_BOUND_S``
        How long a storage fault (the product store full, read-only or unreachable:
        ``backend.worker.storage_faults``) may last before the frames of its lane are failed
        with the fault's reason [s]. Until then the lane pauses and is tried again with
        backoff, and no frame fails. Default 1800, a choice: long enough for an operator to
        free space or remount a store, short enough that a job does not wait for hours.
    ``STORAGE_RETRY_S``
        First wait before a lane paused by a storage fault is tried again [s]; doubled after
        each failed try, at most 300 s. Default 10. The reconciler re-sends the lane's
        frames, so the tries come at its passes (every ``RECONCILE_INTERVAL_S``).
    ``MAX_DELIVERIES``
        Times a product's calibration may start without finishing (its worker killed, or
        past the hard time limit) before it is failed with the reason: a poison frame stops
        after this many. Default 3.
    ``DB_CONNECT_TIMEOUT_S``
        PostgreSQL: how long opening a connection may take, TCP connect, TLS and
        authentication together (psycopg's ``connect_timeout``) [s]; workers and the CLI.
        Default 5. Whole seconds, at least 2 (psycopg, like libpq, rounds down and raises
        anything shorter to 2). The API uses the deadline's value, rounded up, at least 2.
        A ``connect_timeout`` in ``DATABASE_URL`` wins over both.
    ``DB_STATEMENT_TIMEOUT_S``
        PostgreSQL ``statement_timeout`` of the workers' and the CLI's connections [s]; 0
        for none. Default 300, a choice: no statement of the platform is meant to take
        minutes (a calibration's queries take milliseconds; its minutes are spent in
        NumPy), so one that does is stuck on a lock or a bad plan. The API's statements get
        ``API_DEADLINE_S`` (a statement outliving the answer is wasted work); migrations get
        none (``lstdp db upgrade`` may build an index for minutes).
    ``DB_IDLE_IN_TRANSACTION_TIMEOUT_S``
        PostgreSQL ``idle_in_transaction_session_timeout`` of the workers' connections [s]:
        the server ends a session that has held a transaction open, doing nothing, for this
        long (a frozen or lost worker then releases its row locks). Default: the lease, the
        hard time limit plus 60 s (960 s), because a worker keeps its transaction open
        while it calibrates a frame or a GPU batch. The API's is 10 s
        (``backend.db.API_IDLE_IN_TRANSACTION_S``).
    ``API_DEADLINE_S``
        Longest time the API works on a request before it answers 503 [s]; 0 for no
        deadline. Default 1.8: the API answers within 2 s even when PostgreSQL or Redis is
        frozen (no answer at all: connect and statement timeouts do not help then), with
        0.2 s left for the network. The API's database statement timeout, its broker socket
        timeouts, the health checks and the light curves' product-reading budget are derived
        from it (``backend.db``, ``backend.broker``, ``backend.api.app``,
        ``backend.services.event_curves.read_budget_s``).
    ``API_STATEMENT_TIMEOUT_S``
        PostgreSQL ``statement_timeout`` of the API's connections [s] (SQLite: the API's
        statements are interrupted after it); 0 for none. Default: two thirds of
        ``API_DEADLINE_S`` (1.2 s), so that a slow query is cancelled, and answered 503 with
        ``Retry-After`` and "the database query took too long", before the request's deadline
        (whose 503 cannot tell what it waited for). Without a deadline, the workers' value.
    ``HEALTH_PROBE_TIMEOUT_S``
        How long ``/health`` waits for each probe (a ``SELECT 1`` on a connection of its own, a
        broker ping) [s]. Default: half of ``API_DEADLINE_S`` (0.9 s), 1 s without a
        deadline. A dependency is reported down only when its probe fails or passes this.
    ``IDEMPOTENCY_TTL_S``
        How long the answer to a POST made with an ``Idempotency-Key`` header is kept and
        replayed to a repeat [s]. Default 86400 (24 h, as Stripe's API).
    ``HEADER_TIMEOUT_S``
        ``lstdp serve``: a connection that has not sent a complete request header within this
        long of opening (or of the previous answer, on a kept-alive connection) is answered
        408 and closed [s]. Default 10, a choice: far above what a client on a slow link
        needs, short enough that idle half-open connections (slowloris) do not pile up.
    ``LEAN_EVENTS_THREADS``
        Event searches and event details (``GET /api/v1/events`` and ``/api/v1/events/{id}``,
        the lean path, :mod:`backend.api.lean_events`) that one API process runs against the
        database at once; the others wait first come, first served, holding no database
        connection, until their turn or their ``API_DEADLINE_S`` 503. Default: the machine's
        CPU count plus one (``os.cpu_count()``, standing for the database's cores, which are
        the machine's when the database runs beside the API, as in the default deployment),
        at most the API's 15 pooled connections (:data:`backend.db.API_POOL`). Measured on
        this project's 2-core machine with the database, the API and the load generator on it
        (``benchmarks/events_api_load.py``, 16 clients, 1M events, 2026-12-07, 20 s runs):
        3 at once answer as many requests per second as 15 (697-847 against 720-818, the
        pairs alternated) with a p99 of 28.4-39.4 ms against 51.0-58.4 ms, since more
        statements at once than cores only time-slice them (2 at once left the cores idle
        between statements: 664 requests/s, one 15 s run). With the database on its own
        host, set it by hand from that host's cores: the PostgreSQL wiki's "Number Of
        Database Connections" starts from ``(core_count * 2) + effective_spindle_count``
        connections for the whole server, all clients together. A short queue also lets a
        few slow searches (each statement up to ``API_STATEMENT_TIMEOUT_S``) delay the others.
    ``BROKER_SOCKET_TIMEOUT_S``
        Redis (broker and result backend): connect and socket timeouts of the workers [s].
        Default 10, a choice: longer than kombu's 1 s ``BRPOP`` wait (the solo pool of the
        GPU worker reads it with this timeout), short enough that a frozen Redis is noticed
        and the connection is re-made. The API uses a fifth of ``API_DEADLINE_S``
        (``backend.broker.api_broker_timeout_s``).
    ``QUOTA_CONCURRENT_JOBS``
        Jobs (recalibrations and movies) one user may have queued or running at once; 0
        for no limit. Default 4, a choice: enough to keep a lane busy while one's earlier
        jobs finish, few enough that one user cannot fill the queue. Admins are exempt
        (``backend.services.quotas``).
    ``QUOTA_FRAMES_PER_DAY``
        Frames one user's recalibration jobs may cover in any 24 h (counted at submit time
        from the frames each request covers); 0 for no limit. Default 5000, a choice: about
        three days of SDI at its 1-min cadence; a larger campaign is an admin's job.
    ``RATE_LIMIT_WRITES``, ``RATE_LIMIT_WINDOW_S``
        Writes (POST/DELETE with a token: submit, cancel, retry, re-run, saved searches,
        webhooks, movies) one user may make per fixed window of ``RATE_LIMIT_WINDOW_S``
        seconds; 0 writes for no limit. Default 30 per 60 s, a choice: far above what a
        person clicks, low enough to stop a runaway script.
    ``THROUGHPUT_WINDOW_S``
        How far back the queue's measured throughput looks (products written per lane) [s].
        Default 3600: long enough to hold several jobs' products, short enough to follow a
        change of the worker pool.
    ``WEBHOOK_MAX_ATTEMPTS``, ``WEBHOOK_BACKOFF_S``, ``WEBHOOK_TIMEOUT_S``
        Webhook deliveries (``backend.services.notify``): attempts at most (default 6), the
        wait before the second [s] (default 10; doubled after each failure, at most 1 h) and
        the longest one attempt may take, connecting included [s] (default 10; the connect
        itself at most 3).
    ``WEBHOOK_ALLOW_PRIVATE``
        Whether a webhook may target a loopback, private, link-local or other non-global
        address (RFC 6890 special-purpose ranges, ``ipaddress.ip_address(a).is_global``).
        Default false: a user's webhook cannot make the workers probe the platform's own
        network (server-side request forgery); set true only where every user is trusted
        (a laptop, the tests' local receivers).
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default=Path("var"), validation_alias=_alias("DATA_DIR"))
    database_url: str | None = Field(default=None, validation_alias=_alias("DATABASE_URL"))
    celery_broker_url: str = Field(default="filesystem://", validation_alias=_alias("CELERY_BROKER_URL"))
    celery_result_backend: str | None = Field(default=None, validation_alias=_alias("CELERY_RESULT_BACKEND"))
    product_dir: Path | None = Field(default=None, validation_alias=_alias("PRODUCT_DIR"))
    raw_dir: Path | None = Field(default=None, validation_alias=_alias("RAW_DIR"))
    quarantine_dir: Path | None = Field(default=None, validation_alias=_alias("QUARANTINE_DIR"))
    calibration_dir: Path | None = Field(default=None, validation_alias=_alias("CALIBRATION_DIR"))
    product_store: str | None = Field(default=None, validation_alias=_alias("PRODUCT_STORE"))
    aws_endpoint_url: str | None = Field(default=None, validation_alias=_alias("AWS_ENDPOINT_URL"))
    aws_access_key_id: str | None = Field(default=None, validation_alias=_alias("AWS_ACCESS_KEY_ID"))
    aws_secret_access_key: SecretStr | None = Field(default=None, validation_alias=_alias("AWS_SECRET_ACCESS_KEY"))
    aws_region: str = Field(default="us-east-1", validation_alias=_alias("AWS_REGION"))
    product_cache_mb: float = Field(default=2048.0, gt=0, validation_alias=_alias("PRODUCT_CACHE_MB"))
    host: str = Field(default="127.0.0.1", validation_alias=_alias("HOST"))
    port: int = Field(default=8000, ge=1, le=65535, validation_alias=_alias("PORT"))
    forwarded_allow_ips: str = Field(default="127.0.0.1", min_length=1,
                                     validation_alias=_alias("FORWARDED_ALLOW_IPS"))
    session_lifetime_s: int = Field(default=7 * 86400, ge=60, le=365 * 86400,
                                    validation_alias=_alias("SESSION_LIFETIME_S"))
    worker_queues: str = Field(default="cpu", validation_alias=_alias("WORKER_QUEUES"))
    array_backend: str = Field(default="numpy", validation_alias=_alias("ARRAY_BACKEND"))
    gpu_batch_size: int = Field(default=16, ge=1, le=1024, validation_alias=_alias("GPU_BATCH_SIZE"))
    #: writer threads of a GPU batch: products written at once (each holds one product on the
    #: host, 191 MB at 4608 x 4608). 8: at 20 WST frames/s the writing takes about 0.3-0.4
    #: CPU-seconds a frame (benchmarks/reports/gpu_host.md), 6-8 cores busy writing
    gpu_writers: int = Field(default=8, ge=1, le=64, validation_alias=_alias("GPU_WRITERS"))
    #: CPU jobs: 1 (default) sends one message per product; N > 1 sends batches of N to the
    #: ``cpu`` queue, calibrated by the overlapped CPU batch (read, compute and write at once)
    cpu_batch_size: int = Field(default=1, ge=1, le=1024, validation_alias=_alias("CPU_BATCH_SIZE"))
    #: L2 product files: ``none`` (default, uncompressed), ``lossless`` (tile-compressed, bit-exact)
    #: or ``noise`` (quantized from the UNCERT plane, error <= 0.1 sigma): :mod:`pipelines.compression`
    product_compression: Literal["none", "lossless", "noise"] = Field(
        default="none", validation_alias=_alias("PRODUCT_COMPRESSION"))
    task_soft_time_limit_s: float = Field(default=840.0, gt=0, validation_alias=_alias("TASK_SOFT_TIME_LIMIT_S"))
    task_time_limit_s: float = Field(default=900.0, gt=0, validation_alias=_alias("TASK_TIME_LIMIT_S"))
    broker_visibility_timeout_s: float = Field(default=3600.0, gt=0,
                                               validation_alias=_alias("BROKER_VISIBILITY_TIMEOUT_S"))
    reconcile_interval_s: float = Field(default=30.0, gt=0, validation_alias=_alias("RECONCILE_INTERVAL_S"))
    max_deliveries: int = Field(default=3, ge=1, le=100, validation_alias=_alias("MAX_DELIVERIES"))
    storage_fault_bound_s: float = Field(default=1800.0, gt=0, validation_alias=_alias("STORAGE_FAULT_BOUND_S"))
    storage_retry_s: float = Field(default=10.0, gt=0, validation_alias=_alias("STORAGE_RETRY_S"))
    db_connect_timeout_s: int = Field(default=5, ge=2, le=600, validation_alias=_alias("DB_CONNECT_TIMEOUT_S"))
    db_statement_timeout_s: float = Field(default=300.0, ge=0, validation_alias=_alias("DB_STATEMENT_TIMEOUT_S"))
    db_idle_in_transaction_timeout_s: float | None = Field(
        default=None, ge=0, validation_alias=_alias("DB_IDLE_IN_TRANSACTION_TIMEOUT_S"))
    api_deadline_s: float = Field(default=1.8, ge=0, le=3600, validation_alias=_alias("API_DEADLINE_S"))
    api_statement_timeout_s: float | None = Field(default=None, ge=0, le=3600,
                                                  validation_alias=_alias("API_STATEMENT_TIMEOUT_S"))
    health_probe_timeout_s: float | None = Field(default=None, gt=0, le=60,
                                                 validation_alias=_alias("HEALTH_PROBE_TIMEOUT_S"))
    idempotency_ttl_s: float = Field(default=86_400.0, gt=0, le=30 * 86_400,
                                     validation_alias=_alias("IDEMPOTENCY_TTL_S"))
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600, validation_alias=_alias("HEADER_TIMEOUT_S"))
    lean_events_threads: int | None = Field(default=None, ge=1, le=1000,
                                            validation_alias=_alias("LEAN_EVENTS_THREADS"))
    broker_socket_timeout_s: float = Field(default=10.0, gt=0, le=3600,
                                           validation_alias=_alias("BROKER_SOCKET_TIMEOUT_S"))
    quota_concurrent_jobs: int = Field(default=4, ge=0, le=10_000, validation_alias=_alias("QUOTA_CONCURRENT_JOBS"))
    quota_frames_per_day: int = Field(default=5000, ge=0, le=100_000_000,
                                      validation_alias=_alias("QUOTA_FRAMES_PER_DAY"))
    rate_limit_writes: int = Field(default=30, ge=0, le=1_000_000, validation_alias=_alias("RATE_LIMIT_WRITES"))
    rate_limit_window_s: float = Field(default=60.0, gt=0, le=86_400, validation_alias=_alias("RATE_LIMIT_WINDOW_S"))
    throughput_window_s: float = Field(default=3600.0, gt=0, le=30 * 86_400,
                                       validation_alias=_alias("THROUGHPUT_WINDOW_S"))
    webhook_max_attempts: int = Field(default=6, ge=1, le=50, validation_alias=_alias("WEBHOOK_MAX_ATTEMPTS"))
    webhook_backoff_s: float = Field(default=10.0, gt=0, le=3600, validation_alias=_alias("WEBHOOK_BACKOFF_S"))
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60, validation_alias=_alias("WEBHOOK_TIMEOUT_S"))
    webhook_allow_private: bool = Field(default=False, validation_alias=_alias("WEBHOOK_ALLOW_PRIVATE"))
    sample_data_dir: Path = Field(
        default=Path(__file__).resolve().parent.parent / "sample-data" / "real",
        validation_alias=_alias("SAMPLE_DATA_DIR"),
    )

    @field_validator("array_backend")
    @classmethod
    def _check_backend(cls, v: str) -> str:
        if v not in {"numpy", "cupy"}:
            raise ValueError("ARRAY_BACKEND must be 'numpy' or 'cupy'")
        return v

    @field_validator("product_store")
    @classmethod
    def _check_store(cls, v: str | None) -> str | None:
        if v in (None, "", "file://"):
            return None
        if not v.startswith("s3://") or not v[len("s3://"):].split("/")[0]:
            raise ValueError("PRODUCT_STORE must be unset, 'file://' or 's3://bucket[/prefix]'")
        return v.rstrip("/")

    @property
    def lease_s(self) -> float:
        """How long a started calibration may hold its product before the reconciler takes it
        back [s]: the hard time limit (after which no live worker still runs it) plus 60 s."""
        return self.task_time_limit_s + 60.0

    @property
    def heartbeat_timeout_s(self) -> float:
        """How old a worker's heartbeat (:mod:`backend.identity`) may be before its claims are
        dead on every host [s]: one ``RECONCILE_INTERVAL_S`` (three beats missed), at least
        :data:`MIN_HEARTBEAT_TIMEOUT_S`. The reconciler's next pass takes them back, so a dead
        worker's claims return within about two reconcile intervals (default 30 s each)."""
        return max(MIN_HEARTBEAT_TIMEOUT_S, self.reconcile_interval_s)

    @property
    def idle_in_transaction_timeout_s(self) -> float:
        """The workers' ``idle_in_transaction_session_timeout`` [s]: ``DB_IDLE_IN_TRANSACTION_TIMEOUT_S``
        or, unset, :attr:`lease_s`."""
        if self.db_idle_in_transaction_timeout_s is None:
            return self.lease_s
        return self.db_idle_in_transaction_timeout_s

    @property
    def api_statement_s(self) -> float:
        """The API's statement budget [s] (0: none): ``API_STATEMENT_TIMEOUT_S`` or, unset, two
        thirds of ``API_DEADLINE_S``; without a deadline, ``DB_STATEMENT_TIMEOUT_S``."""
        if self.api_statement_timeout_s is not None:
            return self.api_statement_timeout_s
        if self.api_deadline_s > 0:
            return self.api_deadline_s * 2 / 3
        return self.db_statement_timeout_s

    @property
    def health_probe_s(self) -> float:
        """How long ``/health`` waits for each probe [s]: ``HEALTH_PROBE_TIMEOUT_S`` or, unset,
        half of ``API_DEADLINE_S`` (1 s without a deadline)."""
        if self.health_probe_timeout_s is not None:
            return self.health_probe_timeout_s
        return self.api_deadline_s / 2 if self.api_deadline_s > 0 else 1.0

    # -- derived ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.data_dir.resolve()

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.root / 'lstdp.sqlite3'}"

    @property
    def embedded(self) -> bool:
        """True when the broker needs no server (the demo mode)."""
        return self.celery_broker_url.startswith("filesystem://") or self.celery_broker_url.startswith("memory://")

    @property
    def result_backend(self) -> str:
        return self.celery_result_backend or f"file://{self.root / 'celery-results'}"

    @property
    def products(self) -> Path:
        return (self.product_dir or self.root / "products").resolve()

    @property
    def raw(self) -> Path:
        return (self.raw_dir or self.root / "raw").resolve()

    @property
    def quarantine(self) -> Path:
        return (self.quarantine_dir or self.root / "quarantine").resolve()

    @property
    def calibration(self) -> Path:
        return (self.calibration_dir or self.root / "calibration").resolve()

    @property
    def broker_dir(self) -> Path:
        return self.root / "broker"

    def ensure_dirs(self) -> None:
        """Create every local folder the settings point at."""
        for p in (self.root, self.products, self.raw, self.quarantine, self.calibration,
                  self.broker_dir / "in", self.broker_dir / "processed"):
            p.mkdir(parents=True, exist_ok=True)
        if self.result_backend.startswith("file://"):
            Path(self.result_backend[len("file://"):]).mkdir(parents=True, exist_ok=True)


def _env_names() -> set[str]:
    names: set[str] = set()
    for f in Settings.model_fields.values():
        alias = f.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(c) for c in alias.choices)
    return names


#: Every environment variable the settings read (used by the docker-compose test).
ENV_NAMES: frozenset[str] = frozenset(_env_names())


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()``)."""
    return Settings()
