"""The data model (SQLAlchemy 2, typed ``Mapped`` columns).

Tables: ``channels``, ``frames``, ``calibration_files``, ``calibration_sets`` (the calibration
file versions, options and software version a product was made with: products are versioned
by set), ``products`` (with the ``product_calibration_files`` lineage table), ``jobs`` (with
``job_items``, one row per frame of a job, and ``job_follow_ups``, the detections a job queues
when it ends), ``events`` (with ``event_frames``/``event_products`` links and
``event_associations``), ``api_tokens`` (who may submit and cancel work) and ``sessions``
(the browsers signed in with a token).

Times are stored timezone-aware (UTC). Names follow the field: DATE-OBS is
``Frame.date_obs``, HEK event codes in ``Event.event_type`` (FL flare, CE CME, PR
prominence, AR active region, CH coronal hole), helioprojective x/y in arcsec, position
angle in degrees counter-clockwise from solar north.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy import event as sa_event
from sqlalchemy import text as sa_text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import DeclarativeBase, Mapped, backref, mapped_column, relationship

from pipelines.catalogues.records import event_duration_s, goes_flux_or_none

__all__ = [
    "Base",
    "Channel",
    "Frame",
    "ApiToken",
    "BrowserSession",
    "CalibrationSet",
    "CalibrationKind",
    "CalibrationFile",
    "ProductState",
    "Product",
    "ProductCalibrationFile",
    "JobState",
    "Job",
    "ItemOutcome",
    "JobItem",
    "FollowUpState",
    "JobFollowUp",
    "Event",
    "EventFrame",
    "EventProduct",
    "EventAssociation",
    "MovieState",
    "Movie",
    "XRaySeries",
    "XRaySample",
    "CatalogueCoverage",
    "QuotaCharge",
    "WriteCount",
    "RerunItem",
    "DeliveryState",
    "Webhook",
    "WebhookDelivery",
    "WebhookAttempt",
    "SavedSearch",
    "SavedSearchNotification",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


from backend.clock import db_clock_default  # noqa: E402


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        dt.datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class ApiToken(Base):
    """An API token: opaque, shown once when made, stored as its SHA-256 only.

    ``scopes``: ``jobs:submit``, ``jobs:cancel`` (own jobs), ``admin`` (everyone's jobs,
    promote calibration sets, manage tokens); reads need none. A token is refused once
    ``revoked_at`` is set or ``expires_at`` has passed (:mod:`backend.auth`).
    """

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(100), index=True)
    #: The token's first characters (``lst_`` and 6 more): enough to tell tokens apart in a list.
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column()
    revoked_at: Mapped[dt.datetime | None] = mapped_column()
    last_used_at: Mapped[dt.datetime | None] = mapped_column()


class BrowserSession(Base):
    """A browser signed in with an API token (``POST /api/v1/session``).

    The browser's cookie holds a random session id (32 bytes, :func:`secrets.token_urlsafe`),
    never the token; only the id's SHA-256 is stored here (``session_hash``). A session is
    refused once ``revoked_at`` is set (signed out, or its token revoked), once
    ``expires_at`` has passed (``SESSION_LIFETIME_S``, never past the token's own expiry), or
    once its token (``token_id``) is revoked or expired (:mod:`backend.auth`).
    """

    __tablename__ = "sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    user: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column()
    revoked_at: Mapped[dt.datetime | None] = mapped_column()
    last_seen_at: Mapped[dt.datetime | None] = mapped_column()


class Channel(Base):
    """One of LST's four channels (SDI, WST, SCI-UV, SCI-WL) with its nominal geometry."""

    __tablename__ = "channels"

    code: Mapped[str] = mapped_column(String(16), primary_key=True)
    instrument: Mapped[str] = mapped_column(String(8))
    description: Mapped[str] = mapped_column(String(200))
    wavelength_nm: Mapped[float] = mapped_column(Float)
    bandwidth_nm: Mapped[float] = mapped_column(Float)
    naxis: Mapped[int] = mapped_column(Integer)
    plate_scale_arcsec: Mapped[float] = mapped_column(Float)
    fov_rsun_min: Mapped[float | None] = mapped_column(Float)
    fov_rsun_max: Mapped[float] = mapped_column(Float)
    bunit: Mapped[str] = mapped_column(String(40))
    cadence_s: Mapped[float] = mapped_column(Float)


class Frame(Base):
    """One raw observation (L0/L1 file) as ingested. Unique on the file's sha256."""

    __tablename__ = "frames"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel_code: Mapped[str] = mapped_column(ForeignKey("channels.code"), index=True)
    date_obs: Mapped[dt.datetime] = mapped_column(index=True)
    exposure_s: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(8), default="L1")
    naxis1: Mapped[int] = mapped_column(Integer)
    naxis2: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    original_name: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    header: Mapped[dict[str, Any]] = mapped_column(JSON)
    quality_flags: Mapped[int] = mapped_column(Integer, default=0)
    ingested_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    channel: Mapped[Channel] = relationship()
    products: Mapped[list[Product]] = relationship(back_populates="frame")

    __table_args__ = (Index("ix_frames_channel_date_obs", "channel_code", "date_obs"),)


class CalibrationKind(str, enum.Enum):
    dark = "dark"
    flat = "flat"
    stray_light = "stray_light"
    radiometric = "radiometric"
    mask_geometry = "mask_geometry"
    psf = "psf"


class CalibrationFile(Base):
    """A versioned calibration input (master dark, flat, stray-light model, ...).

    Selection rule: the newest ``version`` of a ``kind`` for a channel whose validity
    interval contains the frame's DATE-OBS, unless a job pins a version.
    """

    __tablename__ = "calibration_files"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel_code: Mapped[str] = mapped_column(ForeignKey("channels.code"))
    kind: Mapped[CalibrationKind] = mapped_column(Enum(CalibrationKind, native_enum=False, length=20))
    version: Mapped[int] = mapped_column(Integer)
    valid_from: Mapped[dt.datetime] = mapped_column()
    valid_to: Mapped[dt.datetime | None] = mapped_column()
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    description: Mapped[str] = mapped_column(String(400), default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("channel_code", "kind", "version"),
        Index("ix_calibration_files_lookup", "channel_code", "kind", "valid_from"),
    )


class CalibrationSet(Base):
    """The calibration a product was made with: one channel's calibration files (ids, versions,
    SHA-256), the calibration options and the software version, under one id.

    Products are versioned by set (``Product.version`` is the set's id), so "the products of
    set S" is one query and version S means the same calibration on every frame. Unique on
    (channel, ``calibration_key``, ``params_hash``, ``software_version``): the same files and
    options on two frames, by the same release, are the same set; a new release makes new sets. ``epoch_start``/``epoch_end``: the DATE-OBS span in which all its files
    are valid (the intersection of their validity intervals; ``epoch_end`` None: open).

    ``public``: the set feeds the public catalogue and light curves. The default set (newest
    valid files, default options, nothing pinned) is public when it is made; a set a user made
    (pins or options of their own) is ``owner``'s until an admin promotes it
    (:func:`backend.services.calibration_sets.promote`), which makes it the one public set of
    its channel over its epoch. ``owner`` None: made by the platform (CLI, demo, reconciler).
    """

    __tablename__ = "calibration_sets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel_code: Mapped[str] = mapped_column(ForeignKey("channels.code"), index=True)
    calibration_key: Mapped[str] = mapped_column(String(200))
    params_hash: Mapped[str] = mapped_column(String(64))
    #: The calibration options' identity (``CalibrationOptions.identity()``: non-default values).
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: ``{kind: version}`` pinned by the job that made it ({} for the default selection).
    pinned: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: ``[{"id", "kind", "version", "sha256"}]`` sorted by kind.
    files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    software_version: Mapped[str] = mapped_column(String(40))
    epoch_start: Mapped[dt.datetime | None] = mapped_column()
    epoch_end: Mapped[dt.datetime | None] = mapped_column()
    is_default: Mapped[bool] = mapped_column(default=False)
    public: Mapped[bool] = mapped_column(default=False, index=True)
    owner: Mapped[str | None] = mapped_column(String(100), index=True)
    promoted_at: Mapped[dt.datetime | None] = mapped_column()
    promoted_by: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    #: A new software version is a new set: its products may differ (migration 0012).
    __table_args__ = (UniqueConstraint("channel_code", "calibration_key", "params_hash", "software_version",
                                       name="uq_calibration_sets_identity"),)


class ProductState(str, enum.Enum):
    planned = "planned"
    writing = "writing"
    written = "written"
    failed = "failed"


class Product(Base):
    """An L2 product: one frame calibrated with one calibration set and parameter set.

    Unique on (frame, calibration set, parameters hash): running the same job twice adds
    nothing; a new calibration file makes a new product version and keeps the old one.
    """

    __tablename__ = "products"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    frame_id: Mapped[int] = mapped_column(ForeignKey("frames.id", ondelete="CASCADE"), index=True)
    level: Mapped[str] = mapped_column(String(8), default="L2")
    #: The product's version: the id of its calibration set (the same on every frame made with it).
    version: Mapped[int] = mapped_column(Integer, default=1)
    calibration_set_id: Mapped[int | None] = mapped_column(
        ForeignKey("calibration_sets.id", ondelete="RESTRICT"), index=True)
    calibration_key: Mapped[str] = mapped_column(String(200))
    params_hash: Mapped[str] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    software_version: Mapped[str] = mapped_column(String(40))
    state: Mapped[ProductState] = mapped_column(
        Enum(ProductState, native_enum=False, length=16), default=ProductState.planned, index=True
    )
    error: Mapped[str | None] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64))
    quicklook_path: Mapped[str | None] = mapped_column(Text)
    header: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: Frame-wide systematics the calibration flagged: the product header's ``QUALITY``, bits of
    #: ``pipelines.calibration.l2.quality.FrameQuality`` (1 centre fit refused, 2 centre fit
    #: failed, 4 stray light refused, 8 flat plane stated); 0: none (migration 0019).
    quality_flags: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The machine-readable manifest recorded when the file was written (inputs, calibration
    #: files, options, versions, backend, sha256 of file and arrays, re-run command):
    #: ``backend.services.manifests.product_manifest``.
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: The job that last planned this product (several jobs may wait on one product: see
    #: ``JobItem``).
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    #: Times a calibration of this product started (claims, ``backend.state.claim_product``):
    #: one that reaches ``MAX_DELIVERIES`` without finishing fails the product (a poison frame).
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: When the running claim was taken (the database's clock), and by whom
    #: (:func:`backend.state.this_process`: ``host:pid worker=<id of this process start>``):
    #: a claim older than ``Settings.lease_s``, or whose worker stopped beating
    #: (:class:`WorkerHeartbeat`), or whose process on this host is gone, is taken back.
    claimed_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    #: When a calibration message for it was last sent (the reconciler re-sends lost ones).
    sent_at: Mapped[dt.datetime | None] = mapped_column()
    #: Both from the database's clock (:func:`backend.clock.db_clock_default`), never a
    #: worker's own: a host with its clock off cannot write ``updated_at < created_at``.
    created_at: Mapped[dt.datetime] = mapped_column(default=db_clock_default)
    updated_at: Mapped[dt.datetime] = mapped_column(default=db_clock_default, onupdate=db_clock_default)

    frame: Mapped[Frame] = relationship(back_populates="products")
    calibration_set: Mapped[CalibrationSet | None] = relationship()
    calibration_files: Mapped[list[CalibrationFile]] = relationship(
        secondary="product_calibration_files", viewonly=True
    )

    # one product per frame and calibration set (version = set id): two jobs planning the same
    # frame with the same set at once make one product. The same files and options under
    # another software version are another set, so (frame, calibration_key, params_hash) is
    # not unique (migration 0012).
    __table_args__ = (UniqueConstraint("frame_id", "version", name="uq_products_frame_id_version"),
                      # the calibration_set search filter by key (``dark:3,flat:5``), migration 0015
                      Index("ix_products_calibration_key", "calibration_key"))


class ProductCalibrationFile(Base):
    """Lineage: which calibration files made which product."""

    __tablename__ = "product_calibration_files"

    product_id: Mapped[int] = mapped_column(ForeignKey("products.id", ondelete="CASCADE"), primary_key=True)
    calibration_file_id: Mapped[int] = mapped_column(
        ForeignKey("calibration_files.id", ondelete="RESTRICT"), primary_key=True, index=True
    )


class JobState(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class Job(Base):
    """A (re)calibration request: channels, time range, pinned calibration versions."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    #: The user of the API token that submitted it (``system`` for the CLI and the demo).
    owner: Mapped[str] = mapped_column(String(100), default="anonymous", index=True)
    kind: Mapped[str] = mapped_column(String(32), default="calibrate")
    #: Whether its detections may enter the public catalogue: submitted by an admin or by the
    #: platform itself (CLI, demo), and only for products of public calibration sets.
    publishes: Mapped[bool] = mapped_column(default=False, server_default="0")
    #: ``cpu`` or ``gpu``: the worker pool (queue) its calibrations go to.
    lane: Mapped[str] = mapped_column(String(8), default="cpu", server_default="cpu")
    #: When its owner (or an admin) asked to cancel it, and who.
    cancel_requested_at: Mapped[dt.datetime | None] = mapped_column()
    cancelled_by: Mapped[str | None] = mapped_column(String(100))
    #: Times its failed frames were run again (``POST /jobs/{id}/retry``).
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The job whose manifest this one re-runs (``POST /jobs/{id}/rerun``, ``lstdp rerun``).
    rerun_of: Mapped[str | None] = mapped_column(String(36))
    cancelled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[JobState] = mapped_column(
        Enum(JobState, native_enum=False, length=16), default=JobState.queued, index=True
    )
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    #: Times its plan message (``run_job``) was delivered: a job whose planning never finishes
    #: (its worker dies each time) fails after ``MAX_DELIVERIES``.
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column()

    #: The detections it queued when it ended (``JobFollowUp``), loaded with the job.
    follow_ups: Mapped[list[JobFollowUp]] = relationship(
        lazy="selectin", order_by="(JobFollowUp.detector, JobFollowUp.channel)", viewonly=True)

    @property
    def rerun_results(self) -> list[Any]:
        """A ``rerun`` job's per-frame results (its ``RerunItem`` rows); empty for other kinds
        and for a detached job whose items were not loaded."""
        if self.kind != "rerun":
            return []
        state = sa_inspect(self)
        if state.detached and "rerun_items" not in state.dict:
            return []
        return list(self.rerun_items)


class ItemOutcome(str, enum.Enum):
    """What became of one frame of a job."""

    pending = "pending"  #: its product is not finished yet
    done = "done"  #: its product was written
    failed = "failed"  #: its product failed, or it could not be planned (the reason says)
    skipped = "skipped"  #: an identical product was already written
    cancelled = "cancelled"  #: the job was cancelled before its product was calibrated


class JobItem(Base):
    """One frame of a job, and its outcome: the job's counts are the counts of its items.

    An item is settled once (``pending`` -> ``done``/``failed``, by one conditional UPDATE,
    ``backend.services.job_plan.count_item``): a redelivered or duplicated message settles
    nothing twice. Several jobs may wait on one product (each has its own item).
    """

    __tablename__ = "job_items"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    frame_id: Mapped[int] = mapped_column(ForeignKey("frames.id", ondelete="CASCADE"), primary_key=True)
    product_id: Mapped[int | None] = mapped_column(ForeignKey("products.id", ondelete="SET NULL"), index=True)
    outcome: Mapped[ItemOutcome] = mapped_column(
        Enum(ItemOutcome, native_enum=False, length=16), default=ItemOutcome.pending, index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    settled_at: Mapped[dt.datetime | None] = mapped_column()


class FollowUpState(str, enum.Enum):
    queued = "queued"
    done = "done"
    failed = "failed"
    #: not run, by design, with the reason (e.g. a series shorter than the detector's background
    #: needs: pipelines.detect.flares.SeriesTooShortError); a value of the same VARCHAR(16)
    #: column (non-native enum, no CHECK constraint: no migration)
    refused = "refused"


class JobFollowUp(Base):
    """A detection a calibration job queues when it ends (registry ``follow_ups``), keyed by
    (job, detector, channel): a redelivered or re-sent detection message of a ``done`` key
    runs nothing again."""

    __tablename__ = "job_follow_ups"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    detector: Mapped[str] = mapped_column(String(40), primary_key=True)
    channel: Mapped[str] = mapped_column(String(16), primary_key=True)
    state: Mapped[FollowUpState] = mapped_column(
        Enum(FollowUpState, native_enum=False, length=16), default=FollowUpState.queued, index=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    sent_at: Mapped[dt.datetime | None] = mapped_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column()
    events: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


#: Columns carried in the search indexes (PostgreSQL ``INCLUDE``): what the filters test.
SEARCH_INCLUDE = ["end_time", "peak_time", "position_angle", "hpc_x", "hpc_y", "goes_flux", "owner"]


def _goes_flux_default(context) -> float | None:
    """Column default of ``Event.goes_flux`` (Core and ORM inserts): the flux of the row's class."""
    return goes_flux_or_none(context.get_current_parameters().get("goes_class"))


def _duration_default(context) -> float:
    """Column default of ``Event.duration_s`` from the row's start, peak and end times."""
    p = context.get_current_parameters()
    return event_duration_s(p.get("start_time"), p.get("peak_time"), p.get("end_time"))


class Event(Base):
    """A solar event, detected on LST products or imported from a catalogue.

    ``event_type`` is the HEK code (FL, CE, PR, AR, CH, ...). ``source`` is ``detected``
    or the catalogue name (``goes_xrs``, ``cdaw``, ``hek``, ``donki``, ``lst_wst``,
    ``noaa_srs``); ``source_key`` identifies the row within its source, so re-importing is a
    no-op (unique on source, source_key).
    """

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_type: Mapped[str] = mapped_column(String(4))
    source: Mapped[str] = mapped_column(String(32))
    source_key: Mapped[str] = mapped_column(String(200))
    start_time: Mapped[dt.datetime] = mapped_column()
    peak_time: Mapped[dt.datetime | None] = mapped_column()
    end_time: Mapped[dt.datetime | None] = mapped_column()
    channels: Mapped[str | None] = mapped_column(String(64))
    hpc_x: Mapped[float | None] = mapped_column(Float)
    hpc_y: Mapped[float | None] = mapped_column(Float)
    hgs_lat: Mapped[float | None] = mapped_column(Float)
    hgs_lon: Mapped[float | None] = mapped_column(Float)
    position_angle: Mapped[float | None] = mapped_column(Float)
    angular_width: Mapped[float | None] = mapped_column(Float)
    speed_km_s: Mapped[float | None] = mapped_column(Float)
    goes_class: Mapped[str | None] = mapped_column(String(8))
    #: GOES 0.1-0.8 nm peak flux [W m-2] of ``goes_class`` (A1 = 1e-8 ... X1 = 1e-4), filled on
    #: insert and update from the class: the searchable, sortable form of the class.
    goes_flux: Mapped[float | None] = mapped_column(Float, default=_goes_flux_default)
    peak_value: Mapped[float | None] = mapped_column(Float)
    peak_unit: Mapped[str | None] = mapped_column(String(40))
    noaa_ar: Mapped[int | None] = mapped_column(Integer)
    frm_name: Mapped[str | None] = mapped_column(String(100))
    frm_version: Mapped[str | None] = mapped_column(String(40))
    #: Detected events: the calibration set of the products it was found in.
    calibration_set_id: Mapped[int | None] = mapped_column(ForeignKey("calibration_sets.id", ondelete="SET NULL"))
    #: None: in the public catalogue. A user's name: found by that user's job on a calibration
    #: set of their own, visible to them (and admins) only.
    owner: Mapped[str | None] = mapped_column(String(100))
    description: Mapped[str | None] = mapped_column(Text)
    attributes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: Seconds from ``start_time`` to ``end_time`` (to ``peak_time`` without an end; 0 for an
    #: instantaneous event), filled on insert and update. Bounds the time-overlap search: an
    #: event overlapping [t0, t1] started after t0 - (longest duration of its type).
    duration_s: Mapped[float] = mapped_column(Float, default=_duration_default)

    __table_args__ = (
        UniqueConstraint("source", "source_key"),
        # keyset pagination newest first, per type and over all types; the INCLUDE columns
        # let PostgreSQL test the search filters (overlap, PA, bbox, class) and count the
        # matches from the index alone (index-only scans), without visiting the table
        Index("ix_events_type_start_id", "event_type", "start_time", "id", postgresql_include=SEARCH_INCLUDE),
        Index("ix_events_start_id", "start_time", "id", postgresql_include=SEARCH_INCLUDE),
        # longest duration of a type: one index probe (time-overlap bound)
        Index("ix_events_type_duration", "event_type", "duration_s"),
        Index("ix_events_duration", "duration_s"),
        Index("ix_events_frm", "frm_name", "frm_version"),
        # one source (of several) newest first: the index gives the order, no sort of the
        # source's rows (migration 0015; it replaces the single-column ix_events_source)
        Index("ix_events_source_start_id", "source", "start_time", "id", postgresql_include=SEARCH_INCLUDE),
        Index("ix_events_noaa_ar", "noaa_ar"),
        # the nullable sort keys in their order, the id breaking ties (keyset pages: the rows
        # with a value by the index, then the NULLs by id; event_search._nullable_key_page);
        # goes_flux also serves min_goes_class. They replace ix_events_goes_flux and
        # ix_events_end_time (their prefixes), migration 0015
        Index("ix_events_goes_flux_id", "goes_flux", "id",
              postgresql_include=["owner", "event_type", "start_time", "end_time", "peak_time"]),  # 0022
        Index("ix_events_end_time_id", "end_time", "id"),
        Index("ix_events_peak_time_id", "peak_time", "id"),
        Index("ix_events_speed_id", "speed_km_s", "id"),
        # lower bounds searched alone (min_peak_value, min_angular_width): a bound above every
        # stored value walked all events newest first to find none (0.1-0.3 s at 1,000,000),
        # migration 0018
        Index("ix_events_peak_value", "peak_value"),
        Index("ix_events_angular_width", "angular_width"),
        # (start time [s since 2000-01-01 UTC], Solar X) of the events with a position, GiST: a
        # box over a time window bounds both at once (the lean search's point-in-box condition,
        # backend/services/event_search_lean.py); PostgreSQL only, migration 0022; it carries
        # what the box search tests and returns, so it is read index-only (migration 0024)
        Index("ix_events_time_hpc_x",
              sa_text("point(date_part('epoch', start_time - '2000-01-01 00:00:00+00'::timestamptz), hpc_x)"),
              postgresql_using="gist",
              postgresql_include=["hpc_y", "event_type", "owner", "end_time", "peak_time", "start_time", "hpc_x", "id"],
              postgresql_where=sa_text("hpc_x IS NOT NULL")),
        # (whole degree of the position angle, clamped: NaN and +inf 360, -inf -1; start time) of
        # the events with an angle: the exact count of an angle range, one range of start times
        # per degree, index-only (the lean search's degree condition); PostgreSQL only,
        # migration 0024
        Index("ix_events_pa_deg_start", sa_text("least(greatest(floor(position_angle), -1), 360)"), "start_time",
              postgresql_include=["event_type", "owner", "end_time", "peak_time", "position_angle", "id"],
              postgresql_where=sa_text("position_angle IS NOT NULL")),
    )


@sa_event.listens_for(Event, "before_update")
def _event_derived_columns(_mapper, _connection, target: Event) -> None:
    """Keep ``goes_flux`` and ``duration_s`` in step when an ORM update changes the class or times."""
    target.goes_flux = goes_flux_or_none(target.goes_class)
    target.duration_s = event_duration_s(target.start_time, target.peak_time, target.end_time)


class EventFrame(Base):
    __tablename__ = "event_frames"
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), primary_key=True)
    frame_id: Mapped[int] = mapped_column(ForeignKey("frames.id", ondelete="CASCADE"), primary_key=True)


class EventProduct(Base):
    __tablename__ = "event_products"
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), primary_key=True)
    product_id: Mapped[int] = mapped_column(ForeignKey("products.id", ondelete="CASCADE"), primary_key=True)

    #: the events of a product (``calibration_set``/``calibration_file`` search filters); the
    #: primary key leads with ``event_id`` (migration 0015)
    __table_args__ = (Index("ix_event_products_product", "product_id", "event_id"),)


class EventAssociation(Base):
    """A link between two events (e.g. a WST white-light flare and its GOES flare)."""

    __tablename__ = "event_associations"
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), primary_key=True)
    other_event_id: Mapped[int] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), default="same_event")
    #: Why the two are linked, in words with the evidence (peak times apart, distance, NOAA
    #: region, position angles), written by the rule that made the link; None for older links.
    reason: Mapped[str | None] = mapped_column(Text)

    #: Copies of the other event's ``event_type`` (HEK code) and ``owner`` (None: public). An
    #: event's type and owner never change once it is stored, so the copies stay true; they make
    #: "linked to an event of type X that the viewer may see" (the ``associated_type`` search
    #: filter) one range of ``ix_event_associations_other_type``, where a join of the links with
    #: the other events read every link of the type's events (0.1-0.3 s at 1,000,000 events,
    #: migration 0018). Filled on insert: :func:`_fill_other_event` for ORM rows,
    #: ``backend.services.events._add_pairs`` for bulk ones.
    other_event_type: Mapped[str] = mapped_column(String(4))
    other_owner: Mapped[str | None] = mapped_column(String(100))

    #: the links to an event (migration 0015: the primary key leads with ``event_id``, so without
    #: it SQLite read every link once per event of type X), and the links to events of a type
    #: (``associated_type``, migration 0018; ``other_owner`` in it: the visibility test is read
    #: from the index)
    __table_args__ = (Index("ix_event_associations_other", "other_event_id", "event_id"),
                      Index("ix_event_associations_other_type", "other_event_type", "event_id", "other_owner"))


@sa_event.listens_for(EventAssociation, "before_insert")
def _fill_other_event(_mapper, connection, target: EventAssociation) -> None:
    """Copy the other event's type and owner into a new link row (see its columns).

    Raises
    ------
    ValueError
        When ``other_event_id`` names no stored event (the foreign key would refuse it too).
    """
    if target.other_event_type is not None:
        return
    row = connection.execute(select(Event.event_type, Event.owner).where(Event.id == target.other_event_id)).one_or_none()
    if row is None:
        raise ValueError(f"event association to event {target.other_event_id}, which is not stored")
    target.other_event_type, target.other_owner = row


class MovieState(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class Movie(Base):
    """A movie of one channel over a DATE-OBS window (MP4, H.264), made by a worker as a job.

    ``diff``: ``none`` (the quicklook stretch), ``running`` (each frame minus the previous
    frame of the channel) or ``base`` (each frame minus the first frame of the window).
    ``frames_total`` is the frames the window held when the movie was asked for;
    ``frames_done`` counts the frames rendered so far (the progress). Its state moves only
    through :func:`backend.state.move_movie`; a delivery of its task claims it
    (``claimed_by``/``claimed_at``, ``deliveries``), and the reconciler re-sends a lost one.
    """

    __tablename__ = "movies"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    owner: Mapped[str] = mapped_column(String(100), default="anonymous")
    channel_code: Mapped[str] = mapped_column(ForeignKey("channels.code"))
    start_time: Mapped[dt.datetime] = mapped_column()
    end_time: Mapped[dt.datetime] = mapped_column()
    diff: Mapped[str] = mapped_column(String(16), default="none")
    fps: Mapped[float] = mapped_column(Float, default=10.0)
    state: Mapped[MovieState] = mapped_column(
        Enum(MovieState, native_enum=False, length=16), default=MovieState.queued, index=True)
    frames_total: Mapped[int] = mapped_column(Integer, default=0)
    frames_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    #: The MP4 in the movie store (``DATA_DIR/movies``) once ``succeeded``.
    path: Mapped[str | None] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    #: The larger side of the MP4 asked for [pixel], even, within
    #: [``pipelines.movies.MIN_MOVIE_SIDE``, ``MAX_MOVIE_SIDE``]; None: the products' own
    #: resolution (of the crop, with ``crop``).
    size: Mapped[int | None] = mapped_column(Integer)
    #: The event marked on every frame (a ring at its helioprojective position, or its
    #: same flare's, through each frame's WCS); None: no marker, or the event was deleted
    #: (``ON DELETE SET NULL``).
    event_id: Mapped[int | None] = mapped_column(ForeignKey("events.id", ondelete="SET NULL"), index=True)
    #: Cropped to the event's box (:func:`pipelines.movies.event_box`: its ``hpc_bbox``, else
    #: a square around it, plus a margin); only with ``event_id``. False: the whole image.
    crop: Mapped[bool] = mapped_column(default=False, server_default="0")
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    sent_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column()


class XRaySeries(Base):
    """One GOES XRS file as ingested (``backend.services.xray``). Unique on the file's sha256.

    ``start_time``/``end_time`` are the first and last sample (aware UTC; a last sample inside a
    leap second is stored at 23:59:59.999999, the exact time is its sample's ``t_tai``).
    """

    __tablename__ = "xray_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    satellite: Mapped[str] = mapped_column(String(16), index=True)
    layout: Mapped[str] = mapped_column(String(32))
    original_name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[dt.datetime] = mapped_column()
    end_time: Mapped[dt.datetime] = mapped_column()
    cadence_s: Mapped[float] = mapped_column(Float)
    n_samples: Mapped[int] = mapped_column(Integer)
    n_gaps_xrsa: Mapped[int] = mapped_column(Integer)
    n_gaps_xrsb: Mapped[int] = mapped_column(Integer)
    quality_rule: Mapped[str] = mapped_column(Text)
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    ingested_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_xray_series_span", "start_time", "end_time"),)


class XRaySample(Base):
    """One XRS sample: time as TAI seconds (astropy ``unix_tai``: leap seconds counted, so strictly
    increasing), XRS-A (0.5-4 Å) and XRS-B (1-8 Å) flux [W m-2] (NULL: a gap), quality words."""

    __tablename__ = "xray_samples"

    series_id: Mapped[int] = mapped_column(ForeignKey("xray_series.id", ondelete="CASCADE"), primary_key=True)
    t_tai: Mapped[float] = mapped_column(Float, primary_key=True)
    xrsa: Mapped[float | None] = mapped_column(Float)
    xrsb: Mapped[float | None] = mapped_column(Float)
    xrsa_quality: Mapped[int | None] = mapped_column(Integer)
    xrsb_quality: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index("ix_xray_samples_t_tai", "t_tai"),)


class CatalogueCoverage(Base):
    """The time span one imported catalogue file says it covers (recorded at import time).

    One row per (source, file name): a re-import of the file updates it. ``covers_start`` /
    ``covers_end`` are half-open ``[start, end)`` in UTC, NULL when the file states no span
    (:func:`pipelines.catalogues.coverage.file_coverage`); ``complete`` is False for a
    selection or a cut-short answer (HEK ``overmax``).
    """

    __tablename__ = "catalogue_coverage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(32))
    file: Mapped[str] = mapped_column(String(255))
    covers_start: Mapped[dt.datetime | None] = mapped_column()
    covers_end: Mapped[dt.datetime | None] = mapped_column()
    complete: Mapped[bool] = mapped_column(default=True)
    basis: Mapped[str] = mapped_column(String(400), default="")
    recorded_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("source", "file"),
        Index("ix_catalogue_coverage_source_start", "source", "covers_start"),
    )


# -- quotas --


class DataGeneration(Base):
    """A generation number per table whose content a process keeps derived data of
    (migration 0022): ``catalogue_coverage`` today, read by the lean event search to know when
    its copy of the catalogue spans is stale.

    On PostgreSQL a statement-level trigger on the table sets ``value`` to the next value of the
    sequence ``data_generation_seq`` on every INSERT, UPDATE, DELETE or TRUNCATE, in the
    writer's transaction: a reader sees the new number exactly when it sees the new rows, and
    a number is never given twice (a rolled-back write leaves a gap, not a reused number).
    """

    __tablename__ = "data_generations"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class QuotaCharge(Base):
    """The frames one job covered when it was submitted: the frames-per-day quota of its owner
    is the sum of ``frames`` over the charges made in the last 24 h
    (:mod:`backend.services.quotas`). Kept when the job is deleted (the frames were asked for)."""

    __tablename__ = "quota_charges"
    __table_args__ = (Index("ix_quota_charges_owner_created_at", "owner", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(100))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    #: Frames the request covered at submit time (its channels, DATE-OBS in its range).
    frames: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WriteCount(Base):
    """One row per user: the writes (POST/DELETE with a token) counted in the current
    fixed rate-limit window, which starts at ``window_start``. Bumped by one conditional
    upsert (:func:`backend.services.quotas.count_write`), so several API processes share it."""

    __tablename__ = "write_counts"

    user: Mapped[str] = mapped_column(String(100), primary_key=True)
    window_start: Mapped[dt.datetime] = mapped_column()
    writes: Mapped[int] = mapped_column(Integer)
# -- reproducibility (re-runs) --


class RerunItem(Base):
    """One frame of a ``rerun`` job: what the manifest says it was made with, and what the
    re-run gave.

    The job's counts come from its ``JobItem`` rows (``product_id`` NULL: a re-run writes no
    product); this row carries the manifest's inputs (``frame_sha256``, ``calibration_files``
    ``[{id, kind, version, sha256}]``, ``options``), the expected digests (``expected``:
    ``{product_id, file_sha256, data_sha256: {data, dq}, backend}``), the claim of the
    delivery recomputing it (``attempts``/``claimed_at``/``claimed_by``, ``sent_at`` for the
    reconciler) and the result: the re-run file (``path``, in the re-run store, never the
    product store), its ``data_sha256``, the ``backend`` used, the ``verdict``
    (``identical`` | ``within_tolerance`` | ``differs``) and ``comparison`` (max abs / rel
    difference, tolerance). ``backend.worker.rerun`` writes it.
    """

    __tablename__ = "rerun_items"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    frame_id: Mapped[int] = mapped_column(ForeignKey("frames.id", ondelete="CASCADE"), primary_key=True)
    #: The product whose manifest this re-runs (NULL once that product is deleted).
    product_id: Mapped[int | None] = mapped_column(ForeignKey("products.id", ondelete="SET NULL"), index=True)
    frame_sha256: Mapped[str] = mapped_column(String(64))
    calibration_files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    expected: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    claimed_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    sent_at: Mapped[dt.datetime | None] = mapped_column()
    path: Mapped[str | None] = mapped_column(Text)
    backend: Mapped[str | None] = mapped_column(String(16))
    data_sha256: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verdict: Mapped[str | None] = mapped_column(String(20))
    comparison: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: Why the re-run of this frame failed (e.g. a calibration file whose bytes no longer
    #: match the manifest's sha256); the same text as its ``JobItem.reason``.
    reason: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[dt.datetime | None] = mapped_column()

    #: ``Job.rerun_items`` (a backref: the re-run results of a ``rerun`` job, by frame).
    job: Mapped[Job] = relationship(backref=backref("rerun_items", order_by="RerunItem.frame_id",
                                                    cascade="all, delete-orphan", passive_deletes=True))
# -- notify --


class DeliveryState(str, enum.Enum):
    """Where one webhook delivery stands (``backend.services.notify``)."""

    pending = "pending"  #: waiting for its (next) attempt, at ``next_attempt_at``
    delivering = "delivering"  #: claimed by a worker that is posting it now
    delivered = "delivered"  #: the receiver answered 2xx: never posted again
    failed = "failed"  #: every attempt failed (``WEBHOOK_MAX_ATTEMPTS``): given up


class Webhook(Base):
    """A receiver URL of one job (``job_id``) or one saved search (``saved_search_id``),
    with the HMAC-SHA256 secret its deliveries are signed with.

    The secret is made when the webhook is registered and shown once, in that answer (as
    GitHub does); it is kept here because signing needs it, and never appears in an
    answer, a log line or a delivery log afterwards.
    """

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(100), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(100))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    saved_search_id: Mapped[int | None] = mapped_column(ForeignKey("saved_searches.id", ondelete="CASCADE"),
                                                        index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One message to a webhook (the outbox row, committed with the change it announces)
    and its state; ``id`` is sent as ``X-LST-Delivery`` (receivers de-duplicate on it).

    A delivery is claimed before each attempt (one conditional ``UPDATE``: ``pending`` and
    due, or ``delivering`` under a claim older than the lease), so a redelivered or re-sent
    task never posts a delivery that is ``delivered`` or being posted.
    """

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    #: ``job.ended`` or ``saved_search.matches`` (sent as ``X-LST-Event``).
    event: Mapped[str] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[DeliveryState] = mapped_column(
        Enum(DeliveryState, native_enum=False, length=16), default=DeliveryState.pending, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_at: Mapped[dt.datetime | None] = mapped_column()
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column()

    attempt_log: Mapped[list[WebhookAttempt]] = relationship(
        lazy="selectin", order_by="WebhookAttempt.attempt", viewonly=True)


class WebhookAttempt(Base):
    """One POST of a delivery: when, how long [ms], the HTTP status (None: no answer) and
    the error (a timeout, a refused connection, a non-2xx status)."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
                                             primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    duration_ms: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    #: ``delivered``, ``retry`` (another attempt follows, ``retry_in_s`` later) or ``failed``.
    outcome: Mapped[str] = mapped_column(String(16))
    retry_in_s: Mapped[float | None] = mapped_column(Float)


class SavedSearch(Base):
    """A user's event or product query (the parameters of ``GET /api/v1/events`` or
    ``GET /api/v1/products``), evaluated for new matches: ids above ``cursor``."""

    __tablename__ = "saved_searches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(100), index=True)
    name: Mapped[str] = mapped_column(String(100))
    #: ``events`` or ``products``.
    kind: Mapped[str] = mapped_column(String(16))
    query: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: Events: the largest event id looked at. Products: every product up to this id has
    #: been looked at in a final state (written or failed).
    cursor: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    matches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    evaluated_at: Mapped[dt.datetime | None] = mapped_column()


class SavedSearchNotification(Base):
    """One new match of a saved search (unique per search and item: told once)."""

    __tablename__ = "saved_search_notifications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    saved_search_id: Mapped[int] = mapped_column(ForeignKey("saved_searches.id", ondelete="CASCADE"), index=True)
    #: ``event`` or ``product``; ``item_id`` its id.
    item_kind: Mapped[str] = mapped_column(String(16))
    item_id: Mapped[int] = mapped_column(Integer)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("saved_search_id", "item_id"),)


# -- idempotent writes --


class IdempotencyKey(Base):
    """One ``Idempotency-Key`` of one principal (:mod:`backend.api.idempotency`): the request it
    was first used with (its fingerprint) and, once answered, the answer, replayed to a repeat.

    ``principal`` is the SHA-256 (hex) of the request's credential (bearer token or session
    cookie), ``"anonymous"`` without one; ``fingerprint`` the SHA-256 of the method, path, query
    and body. ``status`` is null while the first request is in progress (a repeat then gets
    409). Rows expire at ``expires_at`` (``IDEMPOTENCY_TTL_S`` after the first request).
    """

    __tablename__ = "idempotency_keys"

    principal: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(String(2000))
    #: HTTP status of the stored answer; null while the first request is in progress.
    status: Mapped[int | None] = mapped_column(Integer)
    #: The answer's ``content-type`` and ``location`` headers (those replayed).
    headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(index=True)


# -- workers and storage faults (issue 28, migration 0021) --


class WorkerHeartbeat(Base):
    """One process start of a worker (a Celery pool child, a solo worker, a reconciler): its
    id (:func:`backend.identity.worker_id`, a UUID made when the process starts, never
    reused), the host and pid for people to read, and its last heartbeat. Times are the
    database's (:mod:`backend.clock`). A claim whose holder's heartbeat is older than
    ``Settings.heartbeat_timeout_s`` is dead on every host (:func:`backend.state.claim_is_dead`).
    Rows whose heartbeat is a day old are removed by the reconciler."""

    __tablename__ = "worker_heartbeats"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(20), default="worker")
    started_at: Mapped[dt.datetime] = mapped_column(default=db_clock_default)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(default=db_clock_default, index=True)


class LaneFault(Base):
    """A storage fault that paused a lane (``cpu`` or ``gpu``): the store full, read-only or
    unreachable (:mod:`backend.worker.storage_faults`). ``reason`` is the true error (e.g.
    ``[Errno 28] No space left on device``); ``retry_at`` when the lane is tried again
    (backoff doubling from ``STORAGE_RETRY_S``); ``first_at`` when the fault began: frames of
    the lane fail with the reason only once it has lasted ``STORAGE_FAULT_BOUND_S``. The row
    is removed by the first write that succeeds. Times are the database's."""

    __tablename__ = "lane_faults"

    lane: Mapped[str] = mapped_column(String(8), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    first_at: Mapped[dt.datetime] = mapped_column()
    last_at: Mapped[dt.datetime] = mapped_column()
    retry_at: Mapped[dt.datetime] = mapped_column()


class PlacedObject(Base):
    """A write-ahead record of one file or object a calibration attempt is about to place in the
    product store (issue 28): committed *before* the object is uploaded or the file renamed into
    place, deleted in the transaction that commits the product row naming it
    (:func:`backend.worker.placements.intend`, :func:`backend.worker.placements.forget`).

    A record left behind says where a writer that died (killed, past its soft time limit, its
    disk full) between placing and committing may have left something: the reconciler
    (:func:`backend.worker.placements.sweep_placements`, every pass) and ``lstdp fsck --repair``
    remove what its product row does not name once the attempt's claim is no longer live.
    ``ref`` is what the row's ``path``/``quicklook_path`` would hold (a file's absolute path,
    or ``s3://bucket/prefix/key``); ``attempt`` and ``holder`` are the claim's
    (``Product.attempts``, ``Product.claimed_by``); ``created_at`` is the database's time
    (migration 0023)."""

    __tablename__ = "placed_objects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    product_id: Mapped[int] = mapped_column(Integer, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(String(200))
    ref: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=db_clock_default)
