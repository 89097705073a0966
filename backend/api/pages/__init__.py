"""The browser's pages: server-rendered HTML (Jinja2 templates in ``frontend/templates``), one
module per page family, each with its ``router``; :data:`router` holds them all (the app
includes it after the API).

======================  =================================================================
module                  pages
======================  =================================================================
:mod:`.events`          ``/`` and ``/events`` (the events list), ``/events/{event_id}``
:mod:`.products`        ``/products`` (gallery), ``/products/{product_id}/view`` (viewer),
                        ``/products/search``
:mod:`.jobs`            ``/jobs/new``, ``/jobs``, ``/jobs/{job_id}``
:mod:`.movies`          ``/movies`` (the frame player)
:mod:`.coverage`        ``/coverage``
:mod:`.saved_searches`  ``/saved-searches``
:mod:`.frame_diff`      ``/frames/{frame_id}/diff``
======================  =================================================================

:mod:`.templating` holds the Jinja2 environment (``templates``, ``static_url``) and the form
helpers; :mod:`.events_search` the search parts of the events page. Pages read through the
services (:mod:`backend.services`) and share the API's presenters (:mod:`backend.api.presenters`);
they never import a route module.
"""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.pages import coverage, events, frame_diff, jobs, movies, products, saved_searches

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
for _family in (events, products, jobs, movies, coverage, saved_searches, frame_diff):
    router.include_router(_family.router)
