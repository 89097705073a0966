"""One TLS client context per process for the platform's own outgoing HTTPS calls (httpx).

``httpx.request`` and every new ``httpx.Client`` make a TLS context by default, loading the CA
bundle each time: 20-31 ms of CPU per context on the 2-core development machine (2026-12-08;
``httpx.create_ssl_context()`` timed in a loop), paid on every S3 request of ``lstdp fsck``
(:mod:`backend.s3sig`, most of its time in ``tests/test_placement_points.py`` by py-spy) and on
every webhook delivery (:mod:`backend.services.notify`). The context is made once per process
and kept per PID (a forked pool process makes its own). The CA bundle, and ``SSL_CERT_FILE`` or
``SSL_CERT_DIR`` where ``trust_env``, are therefore read once per process: a rotated private CA
takes effect when the worker or API process is restarted.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

__all__ = ["client_context"]

_CONTEXTS: dict[tuple[int, bool], ssl.SSLContext] = {}


def client_context(trust_env: bool = True) -> ssl.SSLContext:
    """httpx's default client context (``httpx.create_ssl_context``: certifi's CA bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when ``trust_env``), the same object for every call of
    this process with the same ``trust_env``. Pass it as ``verify=``."""
    import httpx

    key = (os.getpid(), trust_env)
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        ctx = _CONTEXTS[key] = httpx.create_ssl_context(trust_env=trust_env)
    return ctx
