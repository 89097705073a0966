"""``/hek``: a HEK-compatible event search (``https://www.lmsal.com/hek/her?`` with our events).

``sunpy.net.hek.HEKClient(url="<server>/api/v1/hek?")`` works against it unchanged: the
client appends HEK's query parameters to ``url`` and pages while ``overmax`` is true.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.params import for_viewer
from backend.db import autocommit_reads
from backend.services.event_search import EventFilters
from backend.services.hek_search import HEKQueryError, hek_search, parse_hek_query

router = APIRouter(prefix="/hek", tags=["events"])


@router.get(
    "",
    summary="HEK-compatible event search (sunpy's HEKClient)",
    responses={200: {"content": {"application/json": {}},
                     "description": 'HEK JSON: {"result": [...], "overmax": bool}'},
               400: {"description": "An unknown HEK parameter (named) or a bad value (the reason)"}},
)
def read_hek(request: Request, session: SessionDep, principal: OptionalPrincipal) -> JSONResponse:
    """HEK's ``cmd=search&type=column`` query on our events (HEK field names in the rows).

    Reads ``cmd``, ``type``, ``cosec`` (2), ``event_type`` (HEK codes, comma-separated, ``**``
    all), ``event_starttime``/``event_endtime`` (required, UTC), ``event_coordsys``
    (helioprojective), ``x1``/``x2``/``y1``/``y2`` [arcsec], ``paramN``/``opN``/``valueN``
    (attributes our events have: ``FL_GOESCls``, ``FL_PeakFlux``, ``CME_RadialLinVel``,
    ``CME_AngularWidth``, ``AR_NOAANum``, ``FRM_Name``, ...), ``result_limit`` (1..500,
    default 100), ``page`` (1-based) and ``return`` (fields kept). Any other parameter is a
    400 naming it; a bad value a 400 with the reason
    (:mod:`backend.services.hek_search`). Anonymous callers see the public catalogue.
    """
    try:
        query = parse_hek_query(list(request.query_params.multi_items()),
                                base=for_viewer(EventFilters(), principal))
    except HEKQueryError as exc:
        raise HTTPException(400, detail=str(exc)) from None
    return JSONResponse(hek_search(autocommit_reads(session), query))
