"""Response schemas of the REST API (Pydantic v2, read from ORM rows with ``from_attributes``).

Split as the FastAPI full-stack template: ``XPublic`` for one row, ``XDetail`` for the
single-row endpoint with the heavy fields (full header JSON, lineage), ``XsPublic`` for a
page of rows with the total count. All times are aware UTC (SQLite hands back naive
datetimes; they are stamped UTC here).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, AliasPath, BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from backend.models import CalibrationKind, JobState, ProductState
from pipelines.utc import as_utc

__all__ = [
    "CoverageSpanPublic",
    "WindowCoveragePublic",
    "CoverageGapPublic",
    "SourceCoveragePublic",
    "CoveragePublic",
    "EventHistogramPublic",
    "UTCDateTime",
    "Page",
    "ChannelPublic",
    "ChannelsPublic",
    "FramePublic",
    "FrameDetail",
    "FramesPublic",
    "CalibrationFilePublic",
    "CalibrationFilesPublic",
    "ProductPublic",
    "ProductDetail",
    "ProductsPublic",
    "CalibrationImpactPublic",
    "EventPublic",
    "EventAssociationPublic",
    "EventDetail",
    "EventsPublic",
    "LightCurvePublic",
    "JobPublic",
    "JobsPublic",
    "HealthPublic",
    "ErrorPublic",
    "XRaySeriesPublic",
    "XRaySamplesPublic",
    "XRayWindowPublic",
    "XRayCoverageSpan",
    "XRayCoveragePublic",
]


UTCDateTime = Annotated[dt.datetime, AfterValidator(as_utc)]
"""A datetime that is always aware UTC (naive values are taken as UTC)."""

T = TypeVar("T")


class _ORM(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Page(BaseModel, Generic[T]):
    """One page of a list: ``items``, the ``total`` matching the filters, ``limit``, ``offset``."""

    items: list[T]
    total: int = Field(description="Number of rows matching the filters, all pages together")
    limit: int
    offset: int


# -- channels ---------------------------------------------------------------------------------


class ChannelPublic(_ORM):
    """One of LST's channels with its passband and nominal geometry."""

    code: str = Field(examples=["SDI"])
    instrument: str
    description: str
    wavelength_nm: float = Field(description="Passband centre [nm]")
    bandwidth_nm: float = Field(description="Passband full width [nm]")
    naxis: int = Field(description="Full frame size [pixel]")
    plate_scale_arcsec: float = Field(description="Plate scale at full size [arcsec/pixel]")
    fov_rsun_min: float | None = Field(description="Inner edge of the field of view [Rsun] (SCI occulter)")
    fov_rsun_max: float = Field(description="Outer edge of the field of view [Rsun]")
    bunit: str = Field(description="Physical unit of the L2 product (BUNIT)")
    cadence_s: float = Field(description="Nominal cadence [s]")


class ChannelsPublic(BaseModel):
    items: list[ChannelPublic]
    total: int


# -- frames -----------------------------------------------------------------------------------


class FramePublic(_ORM):
    """A raw observation (L0/L1) as ingested."""

    id: int
    channel: str = Field(validation_alias="channel_code", examples=["SDI"])
    date_obs: UTCDateTime = Field(description="DATE-OBS (UTC)")
    exposure_s: float = Field(description="Exposure time [s]")
    level: str
    naxis1: int
    naxis2: int
    original_name: str
    sha256: str
    size_bytes: int
    quality_flags: int
    ingested_at: UTCDateTime


class FrameDetail(FramePublic):
    """A frame with its full (repaired) FITS header as JSON."""

    header: dict[str, Any]


FramesPublic = Page[FramePublic]


# -- calibration files ------------------------------------------------------------------------


class CalibrationFilePublic(_ORM):
    """A versioned calibration input (dark, flat, stray light, radiometric, ...)."""

    id: int
    channel: str = Field(validation_alias="channel_code")
    kind: CalibrationKind
    version: int
    valid_from: UTCDateTime
    valid_to: UTCDateTime | None
    sha256: str
    description: str
    parameters: dict[str, Any]
    created_at: UTCDateTime


CalibrationFilesPublic = Page[CalibrationFilePublic]


# -- products ---------------------------------------------------------------------------------


class ProductPublic(_ORM):
    """An L2 product: one frame calibrated with one calibration set."""

    id: int
    frame_id: int
    channel: str = Field(validation_alias=AliasPath("frame", "channel_code"))
    date_obs: UTCDateTime = Field(validation_alias=AliasPath("frame", "date_obs"), description="DATE-OBS of the frame")
    level: str
    version: int = Field(description="The product's version: the id of its calibration set")
    calibration_set_id: int | None = Field(default=None, description="GET /api/v1/calibration-sets/{id}")
    state: ProductState
    software_version: str
    calibration_key: str
    params_hash: str
    sha256: str | None
    job_id: str | None
    created_at: UTCDateTime
    updated_at: UTCDateTime
    quality_flags: Annotated[int, BeforeValidator(lambda v: 0 if v is None else v)] = Field(default=0, description=(
        "Frame-wide systematics flagged by the calibration (the product's QUALITY bits): 1 centre fit refused, "
        "2 centre fit failed, 4 stray light refused, 8 flat plane stated; 0 none"))
    quicklook_path: str | None = Field(default=None, exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def systematics(self) -> list[str]:
        """Names of the ``quality_flags`` bits set (the values of the ``systematics`` search filter)."""
        from pipelines.calibration.l2.quality import quality_names

        return quality_names(self.quality_flags or 0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fits_url(self) -> str | None:
        """Download link of the L2 FITS file (only when the product is written)."""
        return f"/api/v1/products/{self.id}/fits" if self.state == ProductState.written else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def quicklook_url(self) -> str | None:
        """Link of the quicklook PNG, when the product has one."""
        return f"/api/v1/products/{self.id}/quicklook.png" if self.quicklook_path else None


class ProductDetail(ProductPublic):
    """A product with its header, statistics, parameters, error and calibration lineage."""

    header: dict[str, Any] | None
    stats: dict[str, Any] | None
    parameters: dict[str, Any]
    error: str | None
    calibration_files: list[CalibrationFilePublic] = Field(
        description="The calibration files this product was made with"
    )


ProductsPublic = Page[ProductPublic]


class CalibrationImpactPublic(Page[ProductPublic]):
    """Products that would change if a calibration file were replaced (one page)."""

    calibration_file: CalibrationFilePublic
    rule: str = Field(description="How the affected products are chosen")


# -- events -----------------------------------------------------------------------------------


class EventPublic(_ORM):
    """A solar event, detected on LST products or imported from a catalogue.

    ``event_type`` is the HEK code (FL flare, CE CME, PR prominence, ...); ``hpc_x``/``hpc_y``
    are helioprojective coordinates [arcsec]; for CMEs ``position_angle`` [deg,
    counter-clockwise from solar north], ``angular_width`` [deg] and ``speed_km_s``.
    """

    id: int
    event_type: str = Field(examples=["FL"])
    source: str = Field(examples=["goes_xrs"])
    source_key: str
    start_time: UTCDateTime
    peak_time: UTCDateTime | None
    end_time: UTCDateTime | None
    channels: str | None
    hpc_x: float | None = Field(description="Helioprojective longitude (Solar X) [arcsec]")
    hpc_y: float | None = Field(description="Helioprojective latitude (Solar Y) [arcsec]")
    hgs_lat: float | None = Field(description="Stonyhurst heliographic latitude [deg]")
    hgs_lon: float | None = Field(description="Stonyhurst heliographic longitude [deg]")
    position_angle: float | None = Field(description="Position angle [deg], CCW from solar north")
    angular_width: float | None = Field(description="Angular width [deg]")
    speed_km_s: float | None = Field(description="Plane-of-sky speed [km/s]")
    goes_class: str | None
    goes_flux: float | None = Field(default=None, description="GOES 0.1-0.8 nm peak flux of the class [W m-2]")
    peak_value: float | None
    peak_unit: str | None
    noaa_ar: int | None
    frm_name: str | None = Field(description="Feature recognition method (HEK FRM_NAME)")
    frm_version: str | None
    owner: str | None = Field(default=None, description=(
        "None: the public catalogue; a user's name: found by that user's job on a calibration set of "
        "their own, visible to them (and admins) only"))
    calibration_set_id: int | None = Field(default=None, description=(
        "Detected events: the calibration set (GET /api/v1/calibration-sets/{id}) of the products it was found in"))


class EventAssociationPublic(BaseModel):
    """Another event linked to this one, and how."""

    kind: str = Field(examples=["same_event"])
    event: EventPublic
    reason: str | None = Field(default=None, description="Why the two are linked, with the evidence",
                               examples=["same flare in GOES and HEK: peaks 2 min apart, 40″ apart"])


class EventDetail(EventPublic):
    """An event with its description, attributes, associations and linked frames/products."""

    description: str | None
    attributes: dict[str, Any]
    associated: list[EventAssociationPublic] = Field(default_factory=list)
    frame_ids: list[int] = Field(default_factory=list)
    product_ids: list[int] = Field(default_factory=list)


class EventsPublic(Page[EventPublic]):
    """A page of an event search, with what a client needs to page on and to know it is not all.

    ``next_cursor`` (keyset pagination) continues after the last item with the same filters
    and sort; ``truncated`` is true when more events match after this page (never a silent
    cap). ``total`` is exact unless ``total_is_estimate`` (more than 10,000 matches: the
    database planner's estimate, at least 10,001).
    """

    total_is_estimate: bool = Field(default=False, description="True when total is an estimate (> 10,000 matches)")
    sort: str = Field(default="-start_time", description="Sort applied: key, - prefix for descending")
    next_cursor: str | None = Field(default=None, description="Cursor of the next page (None on the last page)")
    truncated: bool = Field(default=False, description="True when more events match after this page")
    coverage: dict[str, WindowCoveragePublic] | None = Field(default=None, description=(
        "Per event source asked (all when no source filter): whether the request window is covered. "
        "'none' means the source has no data there (not 'no events')"))


class LightCurvePublic(BaseModel):
    """Disk-integrated mean of L2 products around an event (SCI: mean over the coronal field)."""

    event_id: int
    channel: str
    unit: str
    window_start: UTCDateTime
    window_end: UTCDateTime
    region: Literal["disk", "field", "roi"] = Field(
        "disk", description="disk: disk-integrated; field: SCI coronal field; roi: box about the event")
    roi: tuple[float, float, float] | None = Field(
        None, description="ROI centre hpc_x, hpc_y and half side [arcsec]")
    times: list[UTCDateTime] = Field(description="DATE-OBS of each product (UTC)")
    values: list[float | None] = Field(
        description="Mean of each product in unit; null where every pixel of the region is masked or NaN (a gap)")
    uncertainties: list[float | None] = Field(default_factory=list, description=(
        "1-sigma uncertainty of each value in unit, from the products' UNCERT extension (independent pixels); "
        "null where unknown (a product without UNCERT) or the value is a gap"))
    product_ids: list[int]
    skipped: list[dict[str, Any]] = Field(default_factory=list, description="Products that could not be read, and why")
    calibration_sets: list[dict[str, Any]] = Field(default_factory=list, description=(
        "The calibration sets of the products read ({id, public, owner}): each frame's public set, "
        "or the one asked for with calibration_set"))


# -- jobs -------------------------------------------------------------------------------------


class FollowUpPublic(_ORM):
    """A detection the job queued when it ended (run once per job, detector and channel)."""

    detector: str = Field(description="registry detector: flares, cmes, prominences, white-light")
    channel: str
    state: str = Field(description="queued, done, failed, or refused (not run by design: e.g. a series shorter "
                                   "than the detector's background needs; error says why)")
    events: int | None = Field(description="events the detection found (done)")
    error: str | None = Field(description="why it failed or was refused")


class JobQueuePublic(BaseModel):
    """Where a queued or running job stands in its lane (``backend.services.quotas``):
    ``position`` 1 is first; ETA = (frames ahead + its pending frames) / the lane's measured
    throughput; ``eta_s``/``eta_at`` are null when nothing is measured yet (``basis`` says why)."""

    lane: str = Field(description="cpu or gpu")
    position: int = Field(description="place among the lane's unfinished jobs, first come first served (1 = first)")
    jobs_ahead: int
    frames_ahead: int = Field(description="pending frames of the lane's earlier jobs")
    frames_pending: int = Field(description="this job's frames not yet settled")
    frames_per_s: float | None = Field(description="the lane's measured throughput [frames/s]")
    eta_s: float | None = Field(description="seconds until this job's last frame is expected [s]")
    eta_at: UTCDateTime | None
    basis: str = Field(description="how the ETA was computed, or why there is none")


class RerunResultPublic(_ORM):
    """One frame of a ``rerun`` job: how the re-run compares with the original product."""

    frame_id: int
    product_id: int | None = Field(description="the product whose manifest was re-run")
    verdict: str | None = Field(description="identical (bit for bit), within_tolerance (other backend, within "
                                            "the stated CPU/GPU tolerance) or differs; null until done or if failed")
    backend: str | None = Field(description="array backend of the re-run: numpy (CPU) or cupy (GPU)")
    data_sha256: dict[str, Any] | None = Field(description="sha256 of the re-run's data and dq arrays")
    expected: dict[str, Any] = Field(description="the manifest's file and data sha256 and backend")
    comparison: dict[str, Any] | None = Field(description="max_abs_diff, max_rel_diff, n_differing, tolerance...")
    reason: str | None = Field(description="why this frame could not be re-run (e.g. a sha256 mismatch)")
    attempts: int
    finished_at: UTCDateTime | None


class JobPublic(_ORM):
    """A recalibration job and its progress."""

    id: str
    owner: str
    kind: str
    state: JobState
    parameters: dict[str, Any]
    total: int = Field(description="Frames to process")
    done: int
    failed: int
    skipped: int
    cancelled: int = Field(0, description="Frames not calibrated because the job was cancelled first")
    error: str | None
    created_at: UTCDateTime
    started_at: UTCDateTime | None
    finished_at: UTCDateTime | None
    cancel_requested_at: UTCDateTime | None = Field(None, description="When its owner or an admin asked to cancel it")
    cancelled_by: str | None = Field(None, description="The user who asked to cancel it")
    retries: int = Field(0, description="Times its failed or cancelled frames were run again")
    rerun_of: str | None = Field(None, description="The job this one re-runs")
    lane: str = Field("cpu", description="Worker pool of its calibrations: cpu or gpu")
    follow_ups: list[FollowUpPublic] = Field(default_factory=list,
                                             description="detections queued when the job ended")
    calibration_sets: list[int] = Field(default_factory=list, description=(
        "Ids of the calibration sets its products use (GET /api/v1/calibration-sets/{id})"))
    queue: JobQueuePublic | None = Field(default=None, description="position and ETA while queued or running")
    rerun_of: str | None = Field(default=None, description="the job this one re-runs (kind rerun)")
    rerun_results: list[RerunResultPublic] = Field(default_factory=list,
                                                   description="kind rerun: per frame, identical or how far it differs")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def progress(self) -> float:
        """Fraction of frames handled (done + failed + skipped + cancelled) / total; 1 once finished."""
        if self.total > 0:
            return min(1.0, (self.done + self.failed + self.skipped + self.cancelled) / self.total)
        return 1.0 if self.state in (JobState.succeeded, JobState.failed, JobState.cancelled) else 0.0


JobsPublic = Page[JobPublic]


# -- misc -------------------------------------------------------------------------------------


class HealthPublic(BaseModel):
    """Each dependency separately: ``ok`` or the one-line reason it is not."""

    status: str = Field(description="ok when every dependency answers, else error (HTTP 503)")
    database: str
    broker: str = Field(description="the Celery broker (Redis in production, a folder when embedded)")
    version: str


class ErrorPublic(BaseModel):
    """Every error response: a one-line ``detail``; validation errors add ``errors``."""

    detail: str
    errors: list[dict[str, Any]] | None = None


class XRaySeriesPublic(_ORM):
    """One ingested GOES XRS file: satellite, layout, span, cadence and how its samples were judged."""

    id: int
    satellite: str = Field(examples=["GOES-15"])
    layout: str = Field(examples=["goes13-15-irrad"])
    original_name: str = Field(description="The source file's name")
    sha256: str
    start_time: UTCDateTime
    end_time: UTCDateTime
    cadence_s: float = Field(description="Median sample spacing [s]")
    n_samples: int
    n_gaps_xrsa: int
    n_gaps_xrsb: int
    quality_rule: str
    notes: list[str]


class XRaySamplesPublic(BaseModel):
    """The samples of one series in the window: times (ISO 8601 UTC; a leap second reads
    ``23:59:60.xxx``), XRS-B (1-8 Å) and XRS-A (0.5-4 Å) flux in W m-2, ``null`` for a gap."""

    series: XRaySeriesPublic
    times: list[str]
    xrsa: list[float | None]
    xrsb: list[float | None]
    xrsa_quality: list[int | None]
    xrsb_quality: list[int | None]


class XRayWindowPublic(BaseModel):
    """The GOES XRS samples stored for a UTC window, per series (empty when none covers it)."""

    start: UTCDateTime
    end: UTCDateTime
    unit: str = "W m-2"
    n_samples: int
    series: list[XRaySamplesPublic]


class XRayCoverageSpan(BaseModel):
    satellite: str
    start: UTCDateTime
    end: UTCDateTime


class XRayCoveragePublic(BaseModel):
    """The time spans the stored GOES XRS series cover, per satellite."""

    items: list[XRayCoverageSpan]


# -- coverage and the landing timeline (issue 11 items 4, 5) ---------------------------------------


class CoverageSpanPublic(BaseModel):
    """A covered span ``[start, end)`` (UTC); ``complete`` False for a selection or a cut answer."""

    start: UTCDateTime
    end: UTCDateTime
    complete: bool = True


class WindowCoveragePublic(BaseModel):
    """Whether one event source covers a search window."""

    status: Literal["covered", "partial", "selection", "none", "unknown"] = Field(description=(
        "covered: all of the window; partial: part; selection: a list that is not complete; "
        "none: no part (no data, not 'no events'); unknown: nothing imported"))
    message: str = Field(description="One line, e.g. 'CDAW: no coverage after 2013-12-31'")
    spans: list[CoverageSpanPublic] = Field(default_factory=list, description="Covered parts of the window")


class CoverageGapPublic(BaseModel):
    """An uncovered span ``[start, end)`` (UTC) and why, where known."""

    start: UTCDateTime
    end: UTCDateTime
    reason: str


class SourceCoveragePublic(BaseModel):
    """Coverage of one event source or LST channel over the window asked."""

    name: str = Field(description="Event source (cdaw, goes_xrs, ..., detected) or LST channel code")
    kind: Literal["catalogue", "detected", "channel"] | str
    title: str
    basis: str = Field(description="Where the coverage comes from")
    spans: list[CoverageSpanPublic]
    gaps: list[CoverageGapPublic]


class CoveragePublic(BaseModel):
    """``GET /coverage``: every source and channel over [start, end] (open: each one's extent)."""

    start: UTCDateTime | None
    end: UTCDateTime | None
    sources: list[SourceCoveragePublic]


class EventHistogramPublic(BaseModel):
    """``GET /events/histogram``: counts of all matching events per HEK type and time bin."""

    start: UTCDateTime | None = Field(description="Window binned (first matching start when open)")
    end: UTCDateTime | None
    bin_s: int = Field(description="Bin width [s]")
    edges: list[UTCDateTime] = Field(description="Bin edges (one more than the counts); bin i is [edges[i], edges[i+1])")
    counts: dict[str, list[int]] = Field(description="Per HEK type, one count per bin (by start time)")
    total: int = Field(description="Sum of the counts: the exact number of matching events")


EventsPublic.model_rebuild()


class WebhookCreatedPublic(BaseModel):
    """A webhook as registered: ``secret`` is shown in this answer only."""

    id: int
    owner: str
    url: str
    job_id: str | None = None
    saved_search_id: int | None = None
    created_at: str | None = None
    deliveries_url: str
    secret: str | None = Field(None, description="whsec_...: shown once; verify X-LST-Signature with it")
    secret_note: str | None = None


# ``JobPublic`` plus the webhook registered with the job (its secret shown once). No docstring:
# the OpenAPI schema has never had a description of its own.
class JobCreatedPublic(JobPublic):
    webhook: WebhookCreatedPublic | None = Field(
        None, description="the job's webhook (webhook_url of the request), with its secret: shown once")
