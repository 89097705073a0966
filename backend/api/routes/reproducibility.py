"""Reproducibility: manifests of products and jobs, re-runs, and diffs between two product
versions of one frame (:mod:`backend.services.manifests`, :mod:`backend.services.reruns`,
:mod:`backend.services.product_diff`).

Reads are anonymous; ``POST /jobs/{id}/rerun`` needs a token with ``jobs:submit``.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Response, status

from backend.api.deps import OptionalPrincipal, SessionDep, SubmitLimited
from backend.api.params import IdPath, VersionQuery
from backend.api.presenters import product_pair
from backend.api.schemas import JobPublic
from backend.faults import public_reason
from backend.models import Job, Product
from backend.services import manifests, product_diff, reruns, visibility
from pipelines.errors import DataError

router = APIRouter(tags=["reproducibility"])
log = logging.getLogger(__name__)

_PNG = {200: {"content": {"image/png": {}}, "description": "PNG image"}}
_DIFF_ERRORS = {404: {"description": "Unknown frame or product"},
                409: {"description": "A product is not written, or its file cannot be read"},
                422: {"description": "A product is not one of this frame's"}}


def _job(session, job_id: str, principal) -> Job:
    """The job if ``principal`` may see it; else 404 (:class:`visibility.NotVisible`)."""
    return visibility.get_visible(session, Job, job_id, principal)


@router.get("/products/{product_id}/manifest", summary="The manifest of one product",
            responses={404: {"description": "No such product"},
                       409: {"description": "Not written, or written before manifests were recorded"}})
def read_product_manifest(product_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> dict:
    """What the product was made from and how to make it again: input frame (id, original
    name, sha256), calibration set and files (ids, kinds, versions, sha256), full options,
    software and dependency versions, the array backend used (``BACKEND``), the file's and
    the data arrays' sha256, the CPU/GPU float tolerance and the re-run command. Save it
    and pass it to ``lstdp rerun``."""
    prod = visibility.get_visible(session, Product, product_id, principal)  # a private set's: 404
    if prod.manifest is None:
        raise HTTPException(409, detail=f"product {product_id} is {prod.state.value} and has no manifest "
                                        "(manifests are recorded when a product is written; one written before "
                                        "release 0011 has none: re-run its job to compare it)")
    return prod.manifest


@router.get("/jobs/{job_id}/manifest", summary="The manifest of one job", responses={404: {"description": "No such job"}})
def read_job_manifest(job_id: str, session: SessionDep, principal: OptionalPrincipal) -> dict:
    """The job's request, its calibration sets, its products' manifests (the first
    ``MAX_INLINE_PRODUCTS`` inline, the others as links), the re-run command; for a
    ``rerun`` job also its per-frame results. Another user's private job is 404; products
    the caller may not see are listed by frame and outcome only."""
    return manifests.job_manifest(session, _job(session, job_id, principal), principal)


@router.post("/jobs/{job_id}/rerun", response_model=JobPublic, status_code=status.HTTP_202_ACCEPTED,
             summary="Re-run a job from its manifest and compare the data",
             responses={202: {"description": "A job of kind rerun, queued; follow it at the Location URL"},
                        401: {"description": "No API token, or an unknown, revoked or expired one"},
                        403: {"description": "The token lacks jobs:submit, or the job is another user's on a "
                                             "private calibration set"},
                        404: {"description": "No such job"},
                        409: {"description": "Nothing written to re-run, or a calibration file's registered "
                                             "sha256 no longer matches the manifest"},
                        503: {"description": "Stored, but the broker could not be reached: marked failed"}})
def rerun_job(job_id: str, session: SessionDep, response: Response, principal: SubmitLimited) -> JobPublic:
    """Recalibrate the job's written products' frames with exactly their manifests'
    calibration files (by id, checked against their sha256 on disk before use) and options,
    on the workers, into the re-run store. Each frame's result (``identical``,
    ``within_tolerance`` or ``differs``, with max abs / rel difference) is in the new job's
    ``rerun_results`` and its manifest. The new job's ``rerun_of`` is ``job_id``."""
    job = _job(session, job_id, principal)
    try:
        reruns.check_may_rerun(session, job, principal)
        specs = reruns.specs_from_job(session, job)
        new = reruns.submit_rerun(session, specs, owner=principal.user, rerun_of=job.id, source="job",
                                  enqueue=False, quota_for=principal)
    except reruns.RerunForbidden as exc:
        raise HTTPException(403, detail=str(exc)) from None
    except reruns.RerunNotFound as exc:
        raise HTTPException(404, detail=str(exc)) from None
    except reruns.RerunConflict as exc:
        raise HTTPException(409, detail=str(exc)) from None
    except DataError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    from backend.services.jobs import enqueue_job, fail_if_queued

    try:
        enqueue_job(new.id)
    except Exception as exc:  # broker down: the job must not stay queued for ever
        log.exception("could not enqueue re-run job %s", new.id)
        reason = f"broker unreachable: {public_reason(exc)}"
        fail_if_queued(session, new, f"could not enqueue the job: {reason}")
        raise HTTPException(503, detail=f"re-run job {new.id} was stored but could not be sent to the broker "
                                        f"({reason}); it is marked failed: ask again later") from None
    response.headers["Location"] = f"/api/v1/jobs/{new.id}"
    session.refresh(new)
    return JobPublic.model_validate(new)


@router.get("/frames/{frame_id}/diff", summary="Compare two product versions of one frame", responses=_DIFF_ERRORS)
def read_frame_diff(frame_id: IdPath, a: VersionQuery, b: VersionQuery, session: SessionDep,
                    principal: OptionalPrincipal) -> dict:
    """Header keyword diff (added, removed, changed; volatile keywords DATE, CHECKSUM,
    DATASUM, PRODID, PRODVER, CALSET, FILENAME marked), and the image difference ``b - a``
    and ratio ``b / a`` with statistics (mean, median, std, min, max, 1st/99th percentiles,
    count, differing pixels, max abs diff) over the pixels good in both DQ masks, in BUNIT;
    links to their PNGs."""
    return product_diff.diff_report(product_pair(session, frame_id, a, b, principal))


def _png_response(png: bytes, half: float) -> Response:
    return Response(png, media_type="image/png", headers={"X-Limits-Half-Width": f"{half:.6g}",
                                                          "Cache-Control": "public, max-age=3600"})


@router.get("/frames/{frame_id}/diff/difference.png", response_class=Response, responses={**_PNG, **_DIFF_ERRORS},
            summary="PNG of b - a (diverging colormap, symmetric limits)")
def read_difference_png(frame_id: IdPath, a: VersionQuery, b: VersionQuery, session: SessionDep,
                        principal: OptionalPrincipal) -> Response:
    """``b - a`` over the pixels good in both (grey elsewhere), colormap ``RdBu_r`` with limits
    symmetric about 0 (the 99th percentile of ``|b - a|``, in header ``X-Limits-Half-Width``)."""
    return _png_response(*product_diff.difference_png(product_pair(session, frame_id, a, b, principal)))


@router.get("/frames/{frame_id}/diff/ratio.png", response_class=Response, responses={**_PNG, **_DIFF_ERRORS},
            summary="PNG of b / a (diverging colormap, limits symmetric about 1)")
def read_ratio_png(frame_id: IdPath, a: VersionQuery, b: VersionQuery, session: SessionDep,
                   principal: OptionalPrincipal) -> Response:
    """``b / a`` over the pixels good in both with ``a != 0`` (grey elsewhere), colormap
    ``RdBu_r`` with limits symmetric about 1."""
    return _png_response(*product_diff.ratio_png(product_pair(session, frame_id, a, b, principal)))
