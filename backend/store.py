"""The product store: where L2 products (FITS and quicklook PNG) are kept, behind one interface.

Two stores, chosen by ``PRODUCT_STORE`` (:class:`backend.settings.Settings`):

* :class:`LocalStore` (default, embedded mode): the folder ``PRODUCT_DIR``
  (``DATA_DIR/products``). A row's ``path`` is the file's absolute path, as before.
* :class:`ObjectStore` (``PRODUCT_STORE=s3://bucket/prefix``): an S3-compatible object store
  through `obstore <https://developmentseed.org/obstore/>`_, with the endpoint and credentials
  of ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION``.
  A row's ``path`` is the object's URL, ``s3://bucket/prefix/key``.

The rules every write follows (:func:`backend.worker.processing.write_product`):

* **create-once**: :meth:`ProductStore.put_file` never replaces an object (S3 ``If-None-Match: *``,
  obstore's ``mode="create"``; a local ``link(2)``, which fails on an existing name) and
  raises :class:`AlreadyExists` instead;
* **object first, then the row**: the row names an object only after the object is placed and
  read back with the SHA-256 it was written with (:meth:`ProductStore.put_file` checks it);
* **attempt keys**: on an object store, a key carries the claim that wrote it
  (:func:`attempt_tag`); only the attempt whose row commits is the product. Objects of other
  attempts (a worker that lost its claim, a commit that failed after the upload) are removed
  by the writer when it can, otherwise by the reconciler from the attempt's write-ahead
  records (:mod:`backend.worker.placements`, committed before the upload), and in the last
  resort by ``lstdp fsck --repair`` (:func:`backend.services.fsck.run_fsck`);
* **checked reads**: every object carries its SHA-256 as user metadata (``sha256``);
  :meth:`ProductStore.iter_verified` and :meth:`ProductStore.local_file` check the bytes they
  serve against it (and against the row's ``sha256`` where the caller gives it) and raise
  :class:`IntegrityMismatch` otherwise.

Readers that need a file (the viewer's cut-outs, the detectors, bulk archives) get one from
:meth:`ProductStore.local_file`: the file itself for :class:`LocalStore`, a copy in a bounded
local cache (``DATA_DIR/store-cache``, ``PRODUCT_CACHE_MB``, least recently used dropped) for
:class:`ObjectStore`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

__all__ = ["ProductStore", "LocalStore", "ObjectStore", "StoredObject", "StoreError", "AlreadyExists",
           "IntegrityMismatch", "product_store", "attempt_tag", "attempt_of_key", "is_object_ref", "product_name",
           "CHUNK_BYTES", "SHA_METADATA"]

#: Bytes per chunk when streaming an object: 1 MiB, a choice (small enough to start a
#: download at once, large enough that a 191 MB WST product is ~200 reads).
CHUNK_BYTES = 1 << 20
#: Seconds to open a connection to the object store, a choice: as ``DB_CONNECT_TIMEOUT_S``'s
#: default (a store that does not answer in 5 s on a LAN is down, not slow).
CONNECT_TIMEOUT_S = 5.0
#: Seconds one request may take, a choice: a 191 MB WST product at 1 MB/s, with a margin
#: (obstore's default, 30 s, would cut such an upload off below ~6 MB/s).
REQUEST_TIMEOUT_S = 300.0
#: Retries of a failed request (connection refused or reset, 5xx; obstore's own rule) and the
#: time they may take together [s], a choice: a store restarting answers again within
#: seconds; a longer fault is the caller's (the task fails or retries; the API answers 503).
MAX_RETRIES, RETRY_TIMEOUT_S = 3, 10.0
#: The user-metadata field (``x-amz-meta-sha256``) holding an object's SHA-256 (hex).
SHA_METADATA = "sha256"

#: ``.p<product id>.a<attempt>-<holder tag>`` before the suffix of an attempt's object key
_ATTEMPT = re.compile(r"\.p(?P<product>\d+)\.a(?P<attempt>\d+)-(?P<tag>[0-9a-f]{8})\.(?P<ext>fits|png)$")


def _why(exc: BaseException) -> str:
    """``Type: first line of the message`` of a store client's error (the true reason, short)."""
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


class StoreError(RuntimeError):
    """A product store operation failed (the store's own error is the cause)."""


class AlreadyExists(StoreError):
    """A create-once write found the key taken (HTTP 412 from S3, ``EEXIST`` locally)."""


class IntegrityMismatch(StoreError):
    """The bytes read from the store do not have the SHA-256 they were written with."""


@dataclass(frozen=True)
class StoredObject:
    """One object of a store: ``key`` (relative to the store's root or prefix), ``size``
    [byte] and ``modified`` (POSIX time [s])."""

    key: str
    size: int
    modified: float


def attempt_tag(product_id: int, attempt: int, holder: str | None) -> str:
    """The part of an object key that names the claim writing it:
    ``.p<product>.a<attempt>-<first 8 hex of SHA-1(holder)>``. A retry of one task takes the
    same attempt number again under another holder string (``backend.state.claim_product``),
    so the holder is part of it."""
    h = hashlib.sha1((holder or "").encode()).hexdigest()[:8]
    return f".p{int(product_id)}.a{int(attempt)}-{h}"


def attempt_of_key(key: str) -> tuple[int, int, str] | None:
    """``(product id, attempt, holder tag)`` of an attempt's object key
    (:func:`attempt_tag`), or None for a key that carries none."""
    m = _ATTEMPT.search(key)
    return (int(m["product"]), int(m["attempt"]), m["tag"]) if m else None


def product_name(key: str) -> str:
    """The file name a user gets for an object: its key's last part without the attempt
    (:func:`attempt_tag`), i.e. the product's ``FILENAME``."""
    return _ATTEMPT.sub(lambda m: f".{m['ext']}", key.rsplit("/", 1)[-1])


def is_object_ref(ref: str | None) -> bool:
    """Whether a row's ``path`` names an object of an object store (``s3://...``)."""
    return bool(ref) and ref.startswith("s3://")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


class ProductStore:
    """The interface of a product store. Keys are ``/``-separated, relative to the store's
    root (:class:`LocalStore`) or prefix (:class:`ObjectStore`).

    Every method raises :class:`StoreError` (or a subclass) for a failure of the store;
    ``FileNotFoundError`` for a key that is not there.
    """

    #: ``file:///abs/path`` or ``s3://bucket/prefix``
    url: str
    #: True when keys are files on this host (no cache needed)
    is_local: bool = False

    def ref(self, key: str) -> str:
        """What a row's ``path`` holds for ``key``."""
        raise NotImplementedError

    def key_of(self, ref: str | None) -> str | None:
        """The key of a row's ``path``, or None when it does not name an object of this store."""
        raise NotImplementedError

    def put_file(self, key: str, src: Path, sha256: str, *, content_type: str | None = None) -> None:
        """Place the local file ``src`` (SHA-256 ``sha256``, hex) at ``key``, create-once, and
        read it back to check it. On a failed check the object is removed and
        :class:`IntegrityMismatch` raised; :class:`AlreadyExists` when ``key`` is taken."""
        raise NotImplementedError

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks, unchecked (see :meth:`iter_verified`)."""
        raise NotImplementedError

    def stored_sha256(self, key: str) -> str | None:
        """The SHA-256 the object was written with (its metadata; a local file: None)."""
        raise NotImplementedError

    def head(self, key: str) -> StoredObject | None:
        """The object at ``key``, or None."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error when it is not there)."""
        raise NotImplementedError

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """Every object under ``prefix`` (the store's temporary files excluded)."""
        raise NotImplementedError

    def incomplete_uploads(self) -> list[tuple[str, str]]:
        """``(key, upload id)`` of multipart uploads begun and never completed (local: none)."""
        return []

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort one incomplete multipart upload."""

    # -- checked reads ---------------------------------------------------------------------
    def iter_verified(self, key: str, sha256: str | None = None) -> Iterator[bytes]:
        """:meth:`iter_bytes`, hashed as it goes: after the last chunk the digest is compared
        with ``sha256`` (the row's) and the object's own metadata; a mismatch raises
        :class:`IntegrityMismatch` (a streamed HTTP response then ends short, so the client
        sees a failed transfer, never a wrong file accepted as whole)."""
        want = {s for s in (sha256, self.stored_sha256(key)) if s}
        h = hashlib.sha256()
        for chunk in self.iter_bytes(key):
            h.update(chunk)
            yield chunk
        got = h.hexdigest()
        if want and want != {got}:
            raise IntegrityMismatch(f"{self.ref(key)}: sha256 {got[:12]} read, {sorted(want)} expected")

    def read_verified(self, key: str, sha256: str | None = None) -> bytes:
        """The whole object, checked as :meth:`iter_verified`."""
        return b"".join(self.iter_verified(key, sha256))

    def local_file(self, key: str, sha256: str | None = None) -> Path:
        """A file on this host holding ``key``'s bytes (see the module's docstring)."""
        raise NotImplementedError


class LocalStore(ProductStore):
    """The product store on a local (or shared) file system under ``root``."""

    is_local = True

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if not p.is_relative_to(self.root):
            raise StoreError(f"key {key!r} is outside the store {self.root}")
        return p

    def ref(self, key: str) -> str:
        return str(self._path(key))

    def key_of(self, ref: str | None) -> str | None:
        if not ref or is_object_ref(ref):
            return None
        p = Path(ref)
        p = (p if p.is_absolute() else self.root / p).resolve()
        return p.relative_to(self.root).as_posix() if p.is_relative_to(self.root) else None

    def put_file(self, key: str, src: Path, sha256: str, *, content_type: str | None = None) -> None:
        dst = self._path(key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)  # atomic and create-once: EEXIST when the name is taken
        except FileExistsError as exc:
            raise AlreadyExists(f"{dst} exists") from exc
        if _sha256_file(dst) != sha256:
            dst.unlink(missing_ok=True)
            raise IntegrityMismatch(f"{dst}: bytes differ from the file written")

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        with open(self._path(key), "rb") as f:
            yield from iter(lambda: f.read(CHUNK_BYTES), b"")

    def stored_sha256(self, key: str) -> str | None:
        return None

    def head(self, key: str) -> StoredObject | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return StoredObject(key, st.st_size, st.st_mtime)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        base = self.root / prefix
        if not base.exists():
            return
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(self.root)
            if rel.parts and rel.parts[0].startswith(".") or not p.is_file():
                continue  # the store's .tmp/ (pipelines.fitsio.store_tmp_dir)
            st = p.stat()
            yield StoredObject(rel.as_posix(), st.st_size, st.st_mtime)

    def local_file(self, key: str, sha256: str | None = None) -> Path:
        p = self._path(key)
        if not p.is_file():
            raise FileNotFoundError(p)
        return p


def _is_not_found(exc: BaseException) -> bool:
    return type(exc).__name__ == "NotFoundError" or isinstance(exc, FileNotFoundError)


class ObjectStore(ProductStore):
    """An S3-compatible object store (``s3://bucket/prefix``) through obstore's ``S3Store``.

    Parameters
    ----------
    url : str
        ``s3://bucket`` or ``s3://bucket/prefix``.
    endpoint : str, optional
        ``http(s)://host:port`` of an S3-compatible server (SeaweedFS, MinIO, Ceph); None: AWS.
    access_key_id, secret_access_key : str, optional
        Credentials; None lets obstore find them (instance role, ``~/.aws``).
    region : str
        Signing region.
    cache_dir : Path
        Folder of the bounded local cache (:meth:`local_file`).
    cache_bytes : int
        Largest total size of the cache [byte].
    """

    def __init__(self, url: str, *, endpoint: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, region: str = "us-east-1",
                 cache_dir: Path, cache_bytes: int):
        from obstore.store import S3Store

        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket[/prefix] URL: {url!r}")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint, self.region = endpoint, region
        self._credentials = (access_key_id, secret_access_key)
        cfg = {"region": region}
        if endpoint:
            cfg["endpoint"] = endpoint
        if access_key_id:
            cfg["access_key_id"] = access_key_id
            cfg["secret_access_key"] = secret_access_key or ""
        self._store = S3Store(
            self.bucket, prefix=self.prefix or None, config=cfg, virtual_hosted_style_request=False,
            client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                            "connect_timeout": dt.timedelta(seconds=CONNECT_TIMEOUT_S),
                            "timeout": dt.timedelta(seconds=REQUEST_TIMEOUT_S)},
            retry_config={"max_retries": MAX_RETRIES, "retry_timeout": dt.timedelta(seconds=RETRY_TIMEOUT_S),
                          "backoff": {"init_backoff": dt.timedelta(seconds=0.1),
                                      "max_backoff": dt.timedelta(seconds=2), "base": 2}})
        self.cache_dir = Path(cache_dir)
        self.cache_bytes = int(cache_bytes)
        self._cache_lock = threading.Lock()

    # keys and refs
    def ref(self, key: str) -> str:
        return f"{self.url}/{key.lstrip('/')}"

    def key_of(self, ref: str | None) -> str | None:
        if not is_object_ref(ref) or not ref.startswith(self.url + "/"):
            return None
        return ref[len(self.url) + 1:]

    # writing
    def put_file(self, key: str, src: Path, sha256: str, *, content_type: str | None = None) -> None:
        import obstore as obs
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        attrs = {SHA_METADATA: sha256}
        if content_type:
            attrs["Content-Type"] = content_type
        try:
            # mode="create": If-None-Match: * on one PUT (obstore makes no multipart upload then)
            obs.put(self._store, key, Path(src), mode="create", attributes=attrs)
        except (AlreadyExistsError, PreconditionError) as exc:
            raise AlreadyExists(f"{self.ref(key)} exists") from exc
        except Exception as exc:
            raise StoreError(f"upload of {self.ref(key)} failed: {_why(exc)}") from exc
        try:  # the object as the store now serves it, read back whole
            h = hashlib.sha256()
            for chunk in self.iter_bytes(key):
                h.update(chunk)
            ok = h.hexdigest() == sha256 and self.stored_sha256(key) == sha256
        except Exception as exc:
            self._delete_quietly(key)
            raise StoreError(f"read-back of {self.ref(key)} failed: {_why(exc)}") from exc
        if not ok:
            self._delete_quietly(key)
            raise IntegrityMismatch(f"{self.ref(key)}: read back with another SHA-256 than written")

    def _delete_quietly(self, key: str) -> None:
        try:
            self.delete(key)
        except StoreError:
            log.warning("could not remove %s after a failed write: fsck --repair removes it", self.ref(key))

    # reading
    def iter_bytes(self, key: str) -> Iterator[bytes]:
        import obstore as obs

        try:
            result = obs.get(self._store, key)
        except Exception as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(self.ref(key)) from exc
            raise StoreError(f"read of {self.ref(key)} failed: {_why(exc)}") from exc
        try:
            for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                yield bytes(chunk)
        except Exception as exc:  # the connection broke mid-object
            raise StoreError(f"read of {self.ref(key)} broke off: {_why(exc)}") from exc

    def stored_sha256(self, key: str) -> str | None:
        import obstore as obs

        try:
            # a zero-length range: the attributes without the body (obstore's head has no metadata)
            result = obs.get(self._store, key, options={"head": True})
            return result.attributes.get(SHA_METADATA)
        except Exception as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(self.ref(key)) from exc
            raise StoreError(f"head of {self.ref(key)} failed: {_why(exc)}") from exc

    def head(self, key: str) -> StoredObject | None:
        import obstore as obs

        try:
            m = obs.head(self._store, key)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise StoreError(f"head of {self.ref(key)} failed: {_why(exc)}") from exc
        return StoredObject(m["path"], int(m["size"]), m["last_modified"].timestamp())

    def delete(self, key: str) -> None:
        import obstore as obs

        try:
            obs.delete(self._store, key)
        except Exception as exc:
            if _is_not_found(exc):
                return
            raise StoreError(f"delete of {self.ref(key)} failed: {_why(exc)}") from exc

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        import obstore as obs

        try:
            for batch in obs.list(self._store, prefix=prefix or None):
                for m in batch:
                    yield StoredObject(m["path"], int(m["size"]), m["last_modified"].timestamp())
        except Exception as exc:
            raise StoreError(f"listing {self.url} failed: {exc.__class__.__name__}: {exc}") from exc

    # multipart uploads (obstore lists none: ListMultipartUploads/AbortMultipartUpload signed here)
    def incomplete_uploads(self) -> list[tuple[str, str]]:
        from backend.s3sig import list_multipart_uploads

        found = list_multipart_uploads(self._sig(), self.bucket, self.prefix)
        strip = f"{self.prefix}/" if self.prefix else ""
        return [(k[len(strip):], u) for k, u in found if k.startswith(strip)]

    def abort_upload(self, key: str, upload_id: str) -> None:
        from backend.s3sig import abort_multipart_upload

        full = f"{self.prefix}/{key}" if self.prefix else key
        abort_multipart_upload(self._sig(), self.bucket, full, upload_id)

    def _sig(self):
        from backend.s3sig import Signer

        ak, sk = self._credentials
        return Signer(self.endpoint or f"https://s3.{self.region}.amazonaws.com", self.region, ak or "", sk or "")

    # the bounded local cache
    def local_file(self, key: str, sha256: str | None = None) -> Path:
        """A verified copy of ``key`` in the cache, named by its SHA-256 (the row's, else the
        object's metadata), so a cached file is checked once, when it is fetched."""
        want = sha256 or self.stored_sha256(key)
        name = (want or hashlib.sha256(key.encode()).hexdigest()) + Path(key).suffix
        dst = self.cache_dir / name
        if dst.is_file():
            os.utime(dst)  # least recently used goes first
            return dst
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".fetch.", suffix=Path(key).suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in self.iter_verified(key, sha256):
                    f.write(chunk)
            os.replace(tmp, dst)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._evict(keep=dst)
        return dst

    def _evict(self, keep: Path) -> None:
        with self._cache_lock:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.cache_dir.iterdir()
                     if p.is_file() and not p.name.startswith(".")]
            total = sum(s for _, s, _ in files)
            for _, size, p in sorted(files):
                if total <= self.cache_bytes:
                    break
                if p != keep:
                    p.unlink(missing_ok=True)
                    total -= size


_STORES: dict[tuple, ProductStore] = {}
_LOCK = threading.Lock()


def product_store(settings=None) -> ProductStore:
    """The product store of ``settings`` (default :func:`backend.settings.get_settings`), one
    per configuration and process."""
    if settings is None:
        from backend.settings import get_settings

        settings = get_settings()
    secret = settings.aws_secret_access_key.get_secret_value() if settings.aws_secret_access_key else None
    cfg = (settings.product_store, str(settings.products), settings.aws_endpoint_url, settings.aws_access_key_id,
           secret, settings.aws_region, str(settings.root), settings.product_cache_mb)
    with _LOCK:
        store = _STORES.get(cfg)
        if store is None:
            if settings.product_store:
                store = ObjectStore(settings.product_store, endpoint=settings.aws_endpoint_url,
                                    access_key_id=settings.aws_access_key_id, secret_access_key=secret,
                                    region=settings.aws_region, cache_dir=settings.root / "store-cache",
                                    cache_bytes=int(settings.product_cache_mb * 1024 * 1024))
            else:
                store = LocalStore(settings.products)
            _STORES[cfg] = store
    return store

