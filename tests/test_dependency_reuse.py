"""tests/conftest.py keeps FastAPI's request-time dependency graphs under overrides
(``_reuse_dependants_under_overrides``): the override still answers, a graph is built on the
first request only, and route definition builds as upstream FastAPI does (no sub-dependency
object shared between two routes). Written without ``from __future__ import annotations``: the
routes below are defined in the tests' own scope."""

import fastapi.dependencies.utils as fastapi_deps
from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient


def _dependants(dep, out=None):
    """Every ``Dependant`` below ``dep`` (itself included), depth first."""
    out = [] if out is None else out
    out.append(dep)
    for sub in dep.dependencies:
        _dependants(sub, out)
    return out


def test_routes_are_built_as_upstream_fastapi_builds_them():
    assert getattr(fastapi_deps.get_dependant, "_lstdp_kept", False)  # the conftest's wrapper is in place
    app = FastAPI()

    def page(limit: int = 10) -> int:
        return limit

    @app.get("/things")
    def read(n: int = Depends(page)):
        return n

    @app.post("/things")
    def write(n: int = Depends(page)):
        return n

    got, posted = (r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/things")
    # the same path, callable, name and scopes: one object for both if route definition were kept
    assert got.dependant.dependencies[0] is not posted.dependant.dependencies[0]


def test_an_override_answers_and_its_graph_is_built_on_the_first_request_only(monkeypatch):
    app = FastAPI()

    def page(limit: int = 10) -> int:
        return limit

    def session():
        yield "the real session"

    @app.get("/things")
    def things(n: int = Depends(page), s: str = Depends(session)):
        return {"n": n, "s": s}

    def test_session():
        yield "the test's session"

    app.dependency_overrides[session] = test_session
    made = []

    class Counted(fastapi_deps.Dependant):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("call"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(fastapi_deps, "Dependant", Counted)  # the route is defined: only requests build now
    per_request = []
    with TestClient(app) as client:
        for limit in (1, 2, 3):
            before = len(made)
            r = client.get("/things", params={"limit": limit})
            per_request.append(len(made) - before)
            assert r.json() == {"n": limit, "s": "the test's session"}  # the override answers
    assert test_session in made and per_request[0] >= 1, per_request  # built on the first request ...
    assert per_request[1:] == [0, 0], per_request  # ... and kept: upstream FastAPI 0.165 builds it every time
