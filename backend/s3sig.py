"""The two S3 calls obstore does not offer: ListMultipartUploads and AbortMultipartUpload.

``lstdp fsck`` aborts multipart uploads begun and never completed under the product store's
prefix (their parts are stored, and billed, but no object shows them). The requests are signed
with AWS Signature Version 4 (header form, unsigned-payload-free: the payload is empty), as
documented in the AWS S3 API reference ("Authenticating Requests (AWS Signature Version 4)"),
and sent with httpx. Path-style addressing (``endpoint/bucket/key``), as the store uses.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

__all__ = ["Signer", "list_multipart_uploads", "abort_multipart_upload", "create_multipart_upload"]

_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
#: Seconds an fsck request may take, a choice (a listing of thousands of uploads is one page)
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Signer:
    """Where and as whom: ``endpoint`` (``http(s)://host[:port]``), ``region``, and the keys."""

    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str

    def request(self, method: str, path: str, query: dict[str, str]) -> bytes:
        """Send one signed request with an empty body; returns the body of a 2xx answer.

        Raises
        ------
        RuntimeError
            On any other status (with the server's answer).
        """
        import httpx

        from backend.tls import client_context

        now = dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        host = urlsplit(self.endpoint).netloc
        uri = quote(path, safe="/~")
        qs = "&".join(f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in sorted(query.items()))
        headers = {"host": host, "x-amz-content-sha256": _EMPTY_SHA, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical = "\n".join([method, uri, qs, *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed,
                               _EMPTY_SHA])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret_access_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        auth = (f"AWS4-HMAC-SHA256 Credential={self.access_key_id}/{scope}, SignedHeaders={signed}, "
                f"Signature={sig}")
        url = self.endpoint.rstrip("/") + uri + (f"?{qs}" if qs else "")
        r = httpx.request(method, url, headers={**{k: v for k, v in headers.items() if k != "host"},
                                                "Authorization": auth}, timeout=TIMEOUT_S,
                          verify=client_context())  # one TLS context per process: backend.tls
        if not 200 <= r.status_code < 300:
            raise RuntimeError(f"S3 {method} {path}?{qs}: HTTP {r.status_code}: {r.text[:300]}")
        return r.content


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def list_multipart_uploads(signer: Signer, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, upload id)`` of every incomplete multipart upload in ``bucket`` under ``prefix``
    (all pages of ListMultipartUploads)."""
    out: list[tuple[str, str]] = []
    query = {"uploads": "", **({"prefix": prefix} if prefix else {})}
    while True:
        root = ElementTree.fromstring(signer.request("GET", f"/{bucket}", query))
        for up in (e for e in root if _local(e.tag) == "Upload"):
            fields = {_local(c.tag): (c.text or "") for c in up}
            out.append((fields.get("Key", ""), fields.get("UploadId", "")))
        fields = {_local(c.tag): (c.text or "") for c in root}
        if fields.get("IsTruncated", "false").lower() != "true":
            return out
        query = {**query, "key-marker": fields.get("NextKeyMarker", ""),
                 "upload-id-marker": fields.get("NextUploadIdMarker", "")}


def abort_multipart_upload(signer: Signer, bucket: str, key: str, upload_id: str) -> None:
    """AbortMultipartUpload of ``key``'s upload ``upload_id`` (its stored parts are freed)."""
    signer.request("DELETE", f"/{bucket}/{key}", {"uploadId": upload_id})


def create_multipart_upload(signer: Signer, bucket: str, key: str) -> str:
    """CreateMultipartUpload of ``key``; returns its upload id (the tests leave one incomplete
    for fsck to find)."""
    root = ElementTree.fromstring(signer.request("POST", f"/{bucket}/{key}", {"uploads": ""}))
    return next((e.text or "") for e in root if _local(e.tag) == "UploadId")
