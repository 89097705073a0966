"""Python client of the LST data platform (ASO-S Lyman-alpha Solar Telescope).

* :class:`Client`: events and products with the API's filters (every page), downloads with
  parfive, sunpy maps, jobs (submit, follow, cancel) with a token;
* :func:`open_l2`: one L2 product file as one sunpy map with its uncertainty and mask;
* :mod:`lstdp_client.fido`: the sunpy Fido client (``import lstdp_client.fido`` registers it);
* :mod:`lstdp_client.attrs`: the platform's own search attrs (``a.lst.*`` once registered);
* :mod:`lstdp_client.errors`: one exception per error answer, carrying the API's ``detail``.
"""

from lstdp_client.client import DEFAULT_URL, Client
from lstdp_client.l2 import open_l2
from lstdp_client.errors import (
    AuthenticationError,
    ClientError,
    ConflictError,
    LSTDPError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    StreamError,
    ValidationError,
)

__version__ = "0.1.0"
__all__ = [
    "Client", "DEFAULT_URL", "open_l2", "LSTDPError", "ClientError", "AuthenticationError", "PermissionDeniedError",
    "NotFoundError", "ConflictError", "ValidationError", "RateLimitedError", "ServerError", "StreamError",
]
