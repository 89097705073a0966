"""Re-runs: recalibrate the frames of a manifest with exactly its calibration files and
options, and compare the data with the original's.

Products are one per (frame, calibration set) (the set: files, options, software version), so a plain new job with the
same request would only be ``skipped``. A re-run is instead a job of kind ``rerun``
(``Job.rerun_of``: the job re-run, if any) with one :class:`~backend.models.RerunItem` per
frame holding the manifest's inputs; its worker (:mod:`backend.worker.rerun`) recomputes
each frame into the re-run store (``DATA_DIR/reruns/<job id>/``, never the product store),
checks every input against the manifest's sha256 first, and records per frame whether the
data are identical (bit for bit on the same backend) or how far they differ.

Sources (:func:`specs_from_document`): a product manifest (one frame), a job manifest (its
written products), or a job id (:func:`specs_from_job`). The job's items and counts are
those of any job (``job_items``), so the reconciler ends it and re-sends its lost messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import (CalibrationFile, CalibrationSet, Frame, Job, JobItem, JobState, Product, ProductState,
                            RerunItem)
from backend.services.manifests import JOB_SCHEMA, PRODUCT_SCHEMA
from pipelines.calibration import as_options
from pipelines.errors import DataError

__all__ = ["RerunError", "RerunNotFound", "RerunConflict", "RerunForbidden", "RerunSpec", "spec_from_product",
           "spec_from_manifest", "specs_from_job", "specs_from_document", "check_registry", "submit_rerun",
           "check_may_rerun", "RERUN_KIND"]

RERUN_KIND = "rerun"


class RerunError(DataError):
    """A re-run that cannot be made from what was given (HTTP 422)."""


class RerunNotFound(RerunError):
    """The job, product or frame named does not exist (HTTP 404)."""


class RerunConflict(RerunError):
    """The state of the platform does not allow it now (HTTP 409): nothing written yet, or
    the registry no longer holds the manifest's calibration file."""


class RerunForbidden(RerunError):
    """The principal may not re-run this work (HTTP 403)."""


@dataclass
class RerunSpec:
    """What one frame is re-run with (from its product's manifest).

    ``calibration_files``: ``[{id, kind, version, sha256}]``; ``options``: the full
    calibration options; ``expected``: ``{product_id, file_sha256, data_sha256, backend}``
    of the original (``data_sha256`` ``None`` for a product written before manifests: the
    worker then hashes the original file's arrays).
    """

    frame_id: int
    product_id: int | None
    frame_sha256: str
    calibration_files: list[dict[str, Any]]
    options: dict[str, Any]
    expected: dict[str, Any] = field(default_factory=dict)


def spec_from_product(prod: Product) -> RerunSpec:
    """The spec of written product ``prod``: its manifest, or its rows when it has none."""
    if prod.state != ProductState.written:
        raise RerunConflict(f"product {prod.id} is {prod.state.value}, not written: nothing to re-run")
    m = prod.manifest
    if m:
        return RerunSpec(frame_id=prod.frame_id, product_id=prod.id, frame_sha256=m["input"]["sha256"],
                         calibration_files=[{k: f[k] for k in ("id", "kind", "version", "sha256")}
                                            for f in m["calibration_set"]["files"]],
                         options=m["options"],
                         expected={"product_id": prod.id, "file_sha256": m["product"]["sha256"],
                                   "data_sha256": m["product"]["data_sha256"],
                                   "backend": m["backend"]["array_backend"]})
    return RerunSpec(frame_id=prod.frame_id, product_id=prod.id, frame_sha256=prod.frame.sha256,
                     calibration_files=[{"id": f.id, "kind": f.kind.value, "version": f.version, "sha256": f.sha256}
                                        for f in prod.calibration_files],
                     options=as_options((prod.parameters or {}).get("options")).model_dump(mode="json"),
                     expected={"product_id": prod.id, "file_sha256": prod.sha256, "data_sha256": None,
                               "backend": str((prod.header or {}).get("BACKEND", "") or "").lower() or None})


def _need(doc: dict, *keys: str) -> Any:
    cur: Any = doc
    path = []
    for k in keys:
        path.append(k)
        if not isinstance(cur, dict) or k not in cur:
            raise RerunError(f"manifest: no {'.'.join(path)}")
        cur = cur[k]
    return cur


def spec_from_manifest(session: Session, m: dict[str, Any]) -> RerunSpec:
    """The spec of one product manifest (:data:`~backend.services.manifests.PRODUCT_SCHEMA`).

    Raises
    ------
    RerunError
        If a field is missing or malformed, or its options are not valid options.
    RerunNotFound
        If its frame is not in this platform's database.
    RerunConflict
        If the frame's registered sha256 differs from the manifest's.
    """
    if not isinstance(m, dict) or m.get("schema") != PRODUCT_SCHEMA:
        raise RerunError(f"not a product manifest (schema {PRODUCT_SCHEMA!r} expected)")
    frame_id, frame_sha = _need(m, "input", "frame_id"), _need(m, "input", "sha256")
    if not isinstance(frame_id, int) or isinstance(frame_id, bool):
        raise RerunError("manifest: input.frame_id must be an integer")
    frame = session.get(Frame, frame_id)
    if frame is None:
        raise RerunNotFound(f"manifest names frame {frame_id}, which this platform does not hold")
    if frame.sha256 != frame_sha:
        raise RerunConflict(f"frame {frame_id} is registered with sha256 {frame.sha256[:16]}..., the manifest "
                            f"says {str(frame_sha)[:16]}...: not the same raw frame")
    files = _need(m, "calibration_set", "files")
    if not isinstance(files, list) or not files:
        raise RerunError("manifest: calibration_set.files must be a non-empty list")
    cal = []
    for f in files:
        if not isinstance(f, dict) or not all(k in f for k in ("id", "kind", "version", "sha256")):
            raise RerunError("manifest: each calibration file needs id, kind, version and sha256")
        cal.append({k: f[k] for k in ("id", "kind", "version", "sha256")})
    try:
        options = as_options(_need(m, "options")).model_dump(mode="json")
    except DataError as exc:
        raise RerunError(f"manifest options: {exc}") from None
    product = m.get("product") or {}
    pid = product.get("id")
    return RerunSpec(frame_id=frame_id, product_id=pid if session.get(Product, pid or 0) is not None else None,
                     frame_sha256=frame_sha, calibration_files=cal, options=options,
                     expected={"product_id": pid, "file_sha256": product.get("sha256"),
                               "data_sha256": product.get("data_sha256"),
                               "backend": (m.get("backend") or {}).get("array_backend")})


def specs_from_job(session: Session, job: Job) -> list[RerunSpec]:
    """One spec per written product of ``job`` (done or skipped items: a skipped frame's
    product is the one the job's request stands for).

    Raises
    ------
    RerunConflict
        If ``job`` is a re-run itself, or has no written product.
    """
    if job.kind == RERUN_KIND:
        raise RerunConflict(f"job {job.id} is a re-run; re-run its source job {job.rerun_of or '(a manifest)'} "
                            "or its manifest instead")
    prods = list(session.scalars(
        select(Product).join(JobItem, JobItem.product_id == Product.id)
        .where(JobItem.job_id == job.id, Product.state == ProductState.written).order_by(Product.frame_id)))
    if not prods:
        raise RerunConflict(f"job {job.id} ({job.state.value}) has no written product to re-run")
    return [spec_from_product(p) for p in prods]


def specs_from_document(session: Session, doc: dict[str, Any]) -> tuple[list[RerunSpec], str | None, str]:
    """Specs from a product or job manifest (as served by the API).

    Returns
    -------
    (specs, rerun_of, source)
        ``rerun_of``: the job re-run (job manifests), else ``None``; ``source``: ``product
        manifest`` or ``job manifest``.
    """
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == PRODUCT_SCHEMA:
        return [spec_from_manifest(session, doc)], None, "product manifest"
    if schema == JOB_SCHEMA:
        entries = [p for p in doc.get("products") or [] if isinstance(p, dict)]
        specs = []
        for p in entries:
            if p.get("manifest"):
                specs.append(spec_from_manifest(session, p["manifest"]))
            elif p.get("product_id") is not None and p.get("state") == ProductState.written.value:
                prod = session.get(Product, p["product_id"])  # beyond the inline limit: read it here
                if prod is None:
                    raise RerunNotFound(f"job manifest names product {p['product_id']}, which does not exist")
                specs.append(spec_from_product(prod))
        if not specs:
            raise RerunConflict("the job manifest lists no written product to re-run")
        job_id = (doc.get("job") or {}).get("id")
        return specs, job_id if session.get(Job, job_id or "") is not None else None, "job manifest"
    raise RerunError(f"not a manifest: schema must be {PRODUCT_SCHEMA!r} or {JOB_SCHEMA!r}")


def check_registry(session: Session, specs: list[RerunSpec]) -> None:
    """Refuse (``RerunConflict``) a spec whose calibration file id is no longer registered
    or is registered with another sha256, and two specs of one frame. The files' bytes on
    disk are checked by the worker, just before it uses them."""
    seen: set[int] = set()
    for s in specs:
        if s.frame_id in seen:
            raise RerunError(f"frame {s.frame_id} appears twice; one manifest per frame")
        seen.add(s.frame_id)
        for f in s.calibration_files:
            row = session.get(CalibrationFile, f["id"]) if isinstance(f["id"], int) else None
            if row is None:
                raise RerunConflict(f"calibration file {f['id']} ({f['kind']} v{f['version']}) is not registered "
                                    "here: cannot re-run with exactly the manifest's calibration files")
            if row.sha256 != f["sha256"]:
                raise RerunConflict(f"calibration file {row.id} ({row.kind.value} v{row.version}) is registered with "
                                    f"sha256 {row.sha256[:16]}..., the manifest says {str(f['sha256'])[:16]}...: "
                                    "refused")


def check_may_rerun(session: Session, job: Job, principal) -> None:
    """A principal may re-run its own jobs (any as admin), and anyone's whose products are
    all on public calibration sets. Raises ``RerunForbidden`` otherwise."""
    if principal.may_act_on(job.owner):
        return
    private = session.scalars(
        select(CalibrationSet.id).join(Product, Product.calibration_set_id == CalibrationSet.id)
        .join(JobItem, JobItem.product_id == Product.id)
        .where(JobItem.job_id == job.id, CalibrationSet.public.is_(False)).limit(1)).first()
    if private is not None:
        raise RerunForbidden(f"job {job.id} belongs to {job.owner} and uses calibration set {private}, which is not "
                             "public: only its owner or an admin may re-run it")


def submit_rerun(session: Session, specs: list[RerunSpec], *, owner: str, rerun_of: str | None, source: str,
                 enqueue: bool = True, quota_for: Any = None) -> Job:
    """Store a ``queued`` job of kind ``rerun`` with one :class:`RerunItem` per spec,
    commit, and send it (``run_job`` by name, which plans a re-run with
    :func:`backend.worker.rerun.plan_rerun`). ``quota_for``: the principal
    (:class:`backend.auth.Principal`) whose quotas it counts against, one frame per product.

    Raises
    ------
    RerunError, RerunConflict
        From :func:`check_registry`.
    QuotaExceeded, QuotaError
        429 / 422 over a quota of ``quota_for`` (nothing stored).
    """
    from backend.settings import get_settings

    if not specs:
        raise RerunError("nothing to re-run")
    check_registry(session, specs)
    frames = None
    if quota_for is not None:  # a re-run is a job of its owner: the same quotas (429 stores nothing)
        from backend.services.quotas import admit_frames

        frames = admit_frames(session, quota_for, len(specs), what=f"this re-run of {len(specs)} products")
    gpu = any(as_options(s.options).device == "gpu" for s in specs) and not get_settings().embedded
    job = Job(owner=owner, kind=RERUN_KIND, state=JobState.queued, publishes=False, lane="gpu" if gpu else "cpu",
              rerun_of=rerun_of,
              parameters={"rerun": {"source": source, "of_job": rerun_of,
                                    "products": [s.product_id for s in specs],
                                    "frames": [s.frame_id for s in specs]}})
    session.add(job)
    session.flush()
    if frames is not None:
        from backend.services.quotas import charge_job

        charge_job(session, job, frames)
    for s in specs:
        session.add(RerunItem(job_id=job.id, frame_id=s.frame_id, product_id=s.product_id,
                              frame_sha256=s.frame_sha256, calibration_files=s.calibration_files,
                              options=s.options, expected=s.expected))
    session.commit()
    if enqueue:
        from backend.services.jobs import enqueue_job

        enqueue_job(job.id)
    return job

