"""Machine-readable manifests of products and jobs: what a product was made from and how to
make it again.

A **product manifest** (:func:`product_manifest`) is recorded on ``products.manifest`` when
the L2 file is written (:func:`backend.worker.processing.write_product`, on the CPU and GPU
paths alike) and served at ``GET /api/v1/products/{id}/manifest``. It holds

* ``input``: the raw frame (id, original file name, sha256 of its bytes, channel, DATE-OBS);
* ``calibration_set``: the set's id and its files (ids, kinds, versions, sha256, names);
* ``options``: every calibration option, defaults included (``device`` too), and the pins;
* ``software`` and ``dependencies``: the platform's version; python, numpy, scipy, astropy,
  sunpy, opencv (and cupy when the GPU computed it), from :mod:`importlib.metadata`;
* ``backend``: the array backend that actually computed the values (the product header's
  ``BACKEND``: ``numpy`` = CPU, ``cupy`` = GPU);
* ``product``: the file's sha256 and the sha256 of the data of every HDU, and of them all
  together (:func:`product_digests`, :data:`DIGEST_RECIPE`: the file itself differs run to
  run by ``DATE`` and ``CHECKSUM``, the arrays do not);
* ``tolerance``: what "the same data" means on one backend (bit for bit) and across CPU and
  GPU (:data:`TOLERANCE`, with its basis);
* ``rerun``: the commands that re-run it.

A **job manifest** (:func:`job_manifest`, ``GET /api/v1/jobs/{id}/manifest``) holds the job's
request, its calibration sets, its products' manifests and the re-run command.

No manifest holds a token: re-run commands name the environment variable ``LSTDP_TOKEN``
and every string is scrubbed of anything shaped like a token on the way out (:func:`_scrub`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
import re
from functools import lru_cache
from importlib import metadata
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import CalibrationSet, Frame, Job, JobItem, Product, ProductState
from backend.services import visibility

__all__ = ["PRODUCT_SCHEMA", "JOB_SCHEMA", "TOLERANCE", "ARRAY_ENCODING", "array_digests", "dependency_versions",
           "DIGEST_RECIPE", "product_digests", "hdu_digest",
           "product_manifest", "job_manifest", "compare_arrays", "rerun_commands", "MAX_INLINE_PRODUCTS",
           "device_of", "rerun_results"]

PRODUCT_SCHEMA = "lstdp.product-manifest/1"
JOB_SCHEMA = "lstdp.job-manifest/1"

#: How :func:`array_digests` turns an array into bytes before hashing.
ARRAY_ENCODING = ("sha256 of the C-order bytes of the array as the FITS file stores it: data big-endian float32 "
                  "(ny, nx) in BUNIT (NaN where DQ has NOT_FINITE or NO_DATA), dq uint8 (ny, nx); "
                  "each digest also covers dtype and shape")

#: What :func:`product_digests` hashes, in words (README "Reproducibility" gives it as code).
DIGEST_RECIPE = ("for each HDU of the file in file order (PRIMARY = data, UNCERT, DQ, then any other), as "
                 "astropy.io.fits reads it: a = hdu.data cast to big-endian (a.astype(a.dtype.newbyteorder('>')), "
                 "C order); its sha256 is sha256(f'{a.dtype.str}{a.shape}'.encode() + a.tobytes()), or sha256(b'') "
                 "for an HDU without data; 'all' is the sha256 of the UTF-8 lines f'{index} {name} {hex}\\n' of "
                 "every HDU in order; 'data', 'uncertainty', 'dq' repeat the PRIMARY, UNCERT and DQ digests")

#: Float tolerance of a re-run. On one backend the arithmetic is deterministic, so a re-run
#: must give the same bytes. CPU (NumPy) against GPU (CuPy) the float32 operations round
#: differently; the limits are those of the CPU/GPU parity test.
TOLERANCE: dict[str, Any] = {
    "same_backend": "bit for bit: the sha256 of data and dq equal",
    "across_backends": {
        "median_rel": 1e-6,
        "p999_rel": 1e-4,
        "dq_mismatch_fraction": 1e-3,
        "rel_definition": "|b - a| / max(|a|, 1e-6 * max|a|) over pixels with DQ 0 in the reference and finite "
                          "in both",
    },
    "basis": "tests/test_gpu_batch.py::test_cupy_batch_matches_numpy (CuPy batch vs NumPy per frame: median "
             "rel < 1e-6, p99.9 rel < 1e-4, DQ mismatch < 1e-3) and benchmarks/gpu_check.py (_parity_ok: the same "
             "relative limits, DQ mismatch < 1e-5, on full-size frames)",
}

#: A job manifest inlines at most this many product manifests; later ones are links.
MAX_INLINE_PRODUCTS = 500

_DEPENDENCIES = {"numpy": "numpy", "scipy": "scipy", "astropy": "astropy", "sunpy": "sunpy", "opencv": "cv2",
                 "cupy": "cupy"}


def _digest(arr: np.ndarray, dtype: str) -> str:
    a = np.ascontiguousarray(np.asarray(arr), dtype=np.dtype(dtype))
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes(order="C"))
    return h.hexdigest()


def array_digests(data: np.ndarray, dq: np.ndarray) -> dict[str, str | None]:
    """SHA-256 of a product's data arrays (:data:`ARRAY_ENCODING`).

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx)
        The L2 image (cast to big-endian float32, as written).
    dq : numpy.ndarray, shape (ny, nx)
        DQ bits (cast to uint8).

    Returns
    -------
    dict
        ``{"data": hex, "uncertainty": None, "dq": hex}``. L2 products now carry an
        ``UNCERT`` image (:mod:`pipelines.products`), derived from the same inputs; its digest
        is not recorded yet (``None``): the manifests' comparisons cover data and DQ.
    """
    return {"data": _digest(data, ">f4"), "uncertainty": None, "dq": _digest(dq, "u1")}


def hdu_digest(data: np.ndarray | None) -> str:
    """SHA-256 (hex) of one HDU's data as :data:`DIGEST_RECIPE` says: the array in big-endian
    byte order and C order, prefixed by its dtype string and shape; ``sha256(b'')`` for None."""
    if data is None:
        return hashlib.sha256(b"").hexdigest()
    a = np.asarray(data)
    return _digest(a, a.dtype.newbyteorder(">").str)


def product_digests(hdul: Any, hdu_sha256: list[str] | None = None) -> dict[str, Any]:
    """The digests of every HDU of a product (:data:`DIGEST_RECIPE`).

    Parameters
    ----------
    hdul : astropy.io.fits.HDUList
        The product as written (:func:`pipelines.products.build_product_hdul`) or as read
        back from its file: the same values either way.
    hdu_sha256 : list of str, optional
        :func:`hdu_digest` of each HDU, already computed (by the lean writer, as it wrote
        the file: :func:`pipelines.fitsio.write_fits_atomic` ``hdu_digests``); used when it
        has one digest per HDU, else the digests are computed here.

    Returns
    -------
    dict
        ``{"data": hex, "uncertainty": hex or None, "dq": hex or None, "hdus": [{"index": i,
        "name": EXTNAME, "sha256": hex}, ...], "all": hex}``. ``data`` and ``dq`` equal
        :func:`array_digests` of the same arrays (manifests made before ``UNCERT`` was
        covered compare with them).
    """
    known = hdu_sha256 if hdu_sha256 is not None and len(hdu_sha256) == len(hdul) else None
    hdus = [{"index": i, "name": str(hdu.name or ""), "sha256": known[i] if known else hdu_digest(hdu.data)}
            for i, hdu in enumerate(hdul)]
    by_name = {h["name"]: h["sha256"] for h in reversed(hdus)}  # the first HDU of a name wins
    total = hashlib.sha256("".join(f"{h['index']} {h['name']} {h['sha256']}\n" for h in hdus).encode("utf-8"))
    return {"data": hdus[0]["sha256"] if hdus else None, "uncertainty": by_name.get("UNCERT"),
            "dq": by_name.get("DQ"), "hdus": hdus, "all": total.hexdigest()}


@lru_cache(maxsize=4)
def _versions(with_cupy: bool) -> tuple[tuple[str, str | None], ...]:
    dists = metadata.packages_distributions()
    out = [("python", platform.python_version())]
    for name, module in _DEPENDENCIES.items():
        if name == "cupy" and not with_cupy:
            continue
        version = None
        for dist in dists.get(module, []) or [name]:
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        out.append((name, version))
    return tuple(out)


def dependency_versions(backend: str | None) -> dict[str, str | None]:
    """Versions of python and the numerical libraries a product's values depend on
    (``None``: not installed); ``cupy`` only when ``backend`` is ``cupy``."""
    return dict(_versions(backend == "cupy"))


def device_of(backend: str | None) -> str | None:
    """``CPU`` for the NumPy backend, ``GPU`` for CuPy."""
    return {"numpy": "CPU", "cupy": "GPU"}.get((backend or "").lower())


def rerun_commands(*, product_id: int | None = None, job_id: str | None = None) -> dict[str, Any]:
    """The commands that re-run a product or a job (a token is named, never given)."""
    out: dict[str, Any] = {}
    if product_id is not None:
        out["product_manifest"] = f"/api/v1/products/{product_id}/manifest"
        out["cli"] = (f"curl -s $LSTDP_URL/api/v1/products/{product_id}/manifest > product-{product_id}.json && "
                      f"lstdp rerun product-{product_id}.json")
    if job_id is not None:
        out["cli_job"] = f"lstdp rerun {job_id}"
        out["api"] = {"method": "POST", "path": f"/api/v1/jobs/{job_id}/rerun",
                      "headers": {"Authorization": "Bearer $LSTDP_TOKEN"}, "scope": "jobs:submit"}
        out["curl"] = (f'curl -s -X POST -H "Authorization: Bearer $LSTDP_TOKEN" '
                       f"$LSTDP_URL/api/v1/jobs/{job_id}/rerun")
    out["checks"] = ("the re-run uses exactly these calibration files (by id, checked against their sha256) and "
                     "options, and reports per frame whether the data sha256 are identical or how far they differ")
    return out


#: An API token exactly (``backend.auth.new_token``: ``lst_`` + 43 URL-safe characters) and
#: not part of a longer word. :func:`backend.auth.redact_tokens` is broader (``lst_`` + 20 or
#: more) and would also hide the platform's file names (``lst_sdi_20040301T000010_raw.fits``).
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-])lst_[A-Za-z0-9_\-]{43}(?![A-Za-z0-9_\-])")


def _scrub(value: Any) -> Any:
    """``value`` with anything shaped exactly like an API token replaced by ``lst_***``."""
    if isinstance(value, str):
        return _TOKEN.sub("lst_***", value)
    if isinstance(value, dict):
        return {str(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def _iso(t: dt.datetime | None) -> str | None:
    if t is None:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).isoformat()


def product_manifest(prod: Product, frame: Frame, *, header: dict[str, Any] | Any, file_sha256: str,
                     digests: dict[str, str | None], software_version: str,
                     written_at: dt.datetime | None = None) -> dict[str, Any]:
    """The manifest of product ``prod`` of ``frame``, as recorded when its file is written.

    Parameters
    ----------
    prod : Product
        With its calibration set, calibration files and parameters (options, pins).
    frame : Frame
        The raw frame it was calibrated from.
    header : astropy.io.fits.Header or dict
        The written primary header (``BACKEND``, ``FILENAME``).
    file_sha256 : str
        Hex SHA-256 of the written FITS file.
    digests : dict
        :func:`product_digests` of the written HDU list (every HDU).
    software_version : str
        The platform's version (``SOFTVERS``).

    Returns
    -------
    dict
        JSON-ready (:data:`PRODUCT_SCHEMA`).
    """
    from pipelines.calibration import as_options

    backend = str(header.get("BACKEND", "") or "").strip().lower() or None
    params = prod.parameters or {}
    options = as_options(params.get("options")).model_dump(mode="json")
    cal_set = prod.calibration_set
    files = sorted(({"id": f.id, "kind": f.kind.value, "version": f.version, "sha256": f.sha256,
                     "name": f.path.rsplit("/", 1)[-1]} for f in prod.calibration_files), key=lambda f: f["kind"])
    manifest = {
        "schema": PRODUCT_SCHEMA,
        "product": {"id": prod.id, "level": prod.level, "version": prod.version, "file": header.get("FILENAME"),
                    "sha256": file_sha256, "data_sha256": digests, "array_encoding": ARRAY_ENCODING,
                    "digest_recipe": DIGEST_RECIPE,
                    "calibration_key": prod.calibration_key, "params_hash": prod.params_hash,
                    "job_id": prod.job_id, "written_at": _iso(written_at or dt.datetime.now(dt.UTC))},
        "input": {"frame_id": frame.id, "original_name": frame.original_name, "sha256": frame.sha256,
                  "channel": frame.channel_code, "date_obs": _iso(frame.date_obs), "level": frame.level},
        "calibration_set": {"id": prod.calibration_set_id, "public": bool(cal_set.public) if cal_set else None,
                            "files": files},
        "options": options,
        "pinned_calibrations": params.get("pinned") or {},
        "calibration_warnings": params.get("warnings") or [],
        "software": {"name": "lstdp", "version": software_version},
        "dependencies": dependency_versions(backend),
        "backend": {"array_backend": backend, "device": device_of(backend), "header_keyword": "BACKEND"},
        "tolerance": TOLERANCE,
        "rerun": rerun_commands(product_id=prod.id, job_id=prod.job_id),
    }
    return _scrub(manifest)


def compare_arrays(a_data: np.ndarray, a_dq: np.ndarray, b_data: np.ndarray, b_dq: np.ndarray, *,
                   same_backend: bool) -> dict[str, Any]:
    """How far re-run ``b`` is from original ``a``, against :data:`TOLERANCE`.

    Parameters
    ----------
    a_data, b_data : numpy.ndarray, shape (ny, nx)
        Original and re-run L2 images (float32, BUNIT).
    a_dq, b_dq : numpy.ndarray, shape (ny, nx)
        Their DQ bits.
    same_backend : bool
        Whether both were computed on one array backend (then only bit-for-bit equality passes).

    Returns
    -------
    dict
        ``identical`` (bool: the arrays equal bit for bit, NaN where NaN), ``max_abs_diff`` [BUNIT],
        ``max_rel_diff``, ``median_rel``, ``p999_rel`` (over the pixels good in ``a`` and finite
        in both; 0 when there are none), ``n_differing`` (pixels whose data differ),
        ``dq_mismatch_fraction``, ``within_tolerance`` (bool), ``verdict`` (``identical`` |
        ``within_tolerance`` | ``differs``) and ``tolerance``.

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    a = np.asarray(a_data, dtype=np.float32)
    b = np.asarray(b_data, dtype=np.float32)
    if a.shape != b.shape or np.shape(a_dq) != a.shape or np.shape(b_dq) != a.shape:
        raise ValueError(f"original {a.shape} and re-run {b.shape} arrays differ in shape")
    identical = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)) and np.array_equal(a_dq, b_dq))
    good = (np.asarray(a_dq) == 0) & np.isfinite(a) & np.isfinite(b)
    x, y = a[good].astype(np.float64), b[good].astype(np.float64)
    if x.size:
        diff = np.abs(y - x)
        rel = diff / np.maximum(np.abs(x), 1e-6 * np.abs(x).max())
        max_abs, max_rel = float(diff.max()), float(rel.max())
        median_rel, p999_rel = float(np.median(rel)), float(np.percentile(rel, 99.9))
    else:
        max_abs = max_rel = median_rel = p999_rel = 0.0
    differing = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    dq_mismatch = float(np.mean(np.asarray(a_dq) != np.asarray(b_dq))) if a.size else 0.0
    lim = TOLERANCE["across_backends"]
    within = (median_rel < lim["median_rel"] and p999_rel < lim["p999_rel"]
              and dq_mismatch < lim["dq_mismatch_fraction"])
    if identical:
        verdict = "identical"
    elif within and not same_backend:
        verdict = "within_tolerance"
    else:
        verdict = "differs"
    return {"identical": identical, "max_abs_diff": max_abs, "max_rel_diff": max_rel, "median_rel": median_rel,
            "p999_rel": p999_rel, "n_compared": int(x.size), "n_differing": int(differing.sum()),
            "dq_mismatch_fraction": dq_mismatch, "within_tolerance": bool(identical or within),
            "same_backend": same_backend, "verdict": verdict,
            "tolerance": TOLERANCE["same_backend"] if same_backend else lim}


def _set_summary(row: CalibrationSet) -> dict[str, Any]:
    from backend.services.calibration_sets import describe_set

    return describe_set(row)


def rerun_results(job: Job) -> list[dict[str, Any]]:
    """Per frame of a ``rerun`` job: the original product, the verdict and the comparison."""
    out = []
    for r in job.rerun_items:
        out.append({"frame_id": r.frame_id, "product_id": r.product_id, "verdict": r.verdict, "backend": r.backend,
                    "expected_data_sha256": (r.expected or {}).get("data_sha256"), "data_sha256": r.data_sha256,
                    "comparison": r.comparison, "reason": r.reason, "attempts": r.attempts,
                    "finished_at": _iso(r.finished_at)})
    return out


def job_manifest(session: Session, job: Job, principal: Any = None) -> dict[str, Any]:
    """The manifest of ``job``: its request, its calibration sets, its products' manifests
    (the first :data:`MAX_INLINE_PRODUCTS` inline, the rest as links) and the re-run command;
    for a ``rerun`` job also its per-frame results. Products ``principal`` (None: anonymous)
    may not see (:func:`backend.services.visibility.product_rule`) appear by frame and outcome
    only, and their sets not at all; the caller checks that the job itself is visible.

    Returns
    -------
    dict
        JSON-ready (:data:`JOB_SCHEMA`).
    """
    rows = session.execute(
        select(JobItem, Product).outerjoin(Product, Product.id == JobItem.product_id)
        .where(JobItem.job_id == job.id).order_by(JobItem.frame_id)).all()
    products: list[dict[str, Any]] = []
    set_ids: set[int] = set()
    seen_cond = visibility.condition(Product, principal)
    seen = None if seen_cond is None else set(session.scalars(
        select(Product.id).join(JobItem, JobItem.product_id == Product.id).where(JobItem.job_id == job.id, seen_cond)))
    for i, (item, prod) in enumerate(rows):
        entry: dict[str, Any] = {"frame_id": item.frame_id, "outcome": item.outcome.value, "reason": item.reason}
        if prod is not None and (seen is None or prod.id in seen):
            if prod.calibration_set_id is not None:
                set_ids.add(prod.calibration_set_id)
            entry.update({"product_id": prod.id, "state": prod.state.value,
                          "manifest_url": f"/api/v1/products/{prod.id}/manifest"})
            if prod.state == ProductState.written and i < MAX_INLINE_PRODUCTS:
                entry["manifest"] = prod.manifest
        products.append(entry)
    sets = [_set_summary(s) for s in session.scalars(
        select(CalibrationSet).where(CalibrationSet.id.in_(set_ids)).order_by(CalibrationSet.id))] if set_ids else []
    manifest: dict[str, Any] = {
        "schema": JOB_SCHEMA,
        "job": {"id": job.id, "kind": job.kind, "owner": job.owner, "state": job.state.value, "lane": job.lane,
                "rerun_of": job.rerun_of, "created_at": _iso(job.created_at), "finished_at": _iso(job.finished_at),
                "counts": {"total": job.total, "done": job.done, "failed": job.failed, "skipped": job.skipped}},
        "request": job.parameters or {},
        "calibration_sets": sets,
        "products": products,
        "tolerance": TOLERANCE,
        "rerun": rerun_commands(job_id=job.id),
    }
    if job.kind == "rerun":
        manifest["rerun_results"] = rerun_results(job)
    if len(rows) > MAX_INLINE_PRODUCTS:
        manifest["note"] = (f"{len(rows)} frames: the first {MAX_INLINE_PRODUCTS} product manifests are inline, "
                            "the others are at their manifest_url")
    return _scrub(manifest)
