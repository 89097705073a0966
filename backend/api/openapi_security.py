"""The OpenAPI's security: which routes need a token, and what 401 and 403 mean on them.

FastAPI lists a route's security from its dependencies: every route that depends on
:func:`backend.api.deps.current_principal` (through ``SubmitPrincipal``, ``CancelPrincipal``,
``AdminPrincipal``, ``SignedInPrincipal`` or ``OptionalPrincipal``) gets
``security: [{"APIToken": []}, {"SessionCookie": []}]`` and both schemes land in
``components.securitySchemes``. :func:`document_security` completes that after FastAPI has
built the schema:

* both schemes are always in ``components.securitySchemes`` (also in an app without a
  secured route), ``SessionCookie`` telling how the cookie is made and what CSRF checks
  its writes pass;
* an operation that needs a token (every write but the anonymous ``POST /movies`` and the
  sign-in itself; of the reads, only the caller's own tokens) lists ``401`` and ``403``
  responses (with the error body), where its route did not describe them;
* a read that takes a token optionally (to show the caller's own things as well as the
  public ones) lists the empty requirement ``{}`` first, which OpenAPI reads as "anonymous
  is fine"; reads of public data list no security at all.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from backend.auth import SESSION_COOKIE

__all__ = ["document_security", "SECURITY_SCHEMES", "WRITE_METHODS"]

WRITE_METHODS = ("post", "put", "patch", "delete")

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "APIToken": {
        "type": "http", "scheme": "bearer", "bearerFormat": "opaque (lst_...)",
        "description": "An API token, as `Authorization: Bearer lst_...`: made by `lstdp token create` or "
                       "`POST /api/v1/tokens` (admin), shown once. Scopes: `jobs:submit`, `jobs:cancel`, `admin` "
                       "(implies both). Reads need none; writes need the scope each route names: 401 without a "
                       "valid token (unknown, revoked, expired, or a malformed header), 403 without the scope.",
    },
    "SessionCookie": {
        "type": "apiKey", "in": "cookie", "name": SESSION_COOKIE,
        "description": "The browser's session: `POST /api/v1/session` with `{\"token\": \"lst_...\"}` starts a "
                       "server-side session and sets this HttpOnly, SameSite=Strict cookie (Secure over https) to its "
                       "random id, never the token; `DELETE /api/v1/session` ends it. Writes made with it must be sent as "
                       "`application/json` and, where the browser sends `Origin`, from this host: else 403 (CSRF).",
    },
}

_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}}
_DEFAULT_RESPONSES = {
    "401": "No API token, or an unknown, revoked or expired one (the message names the scope needed)",
    "403": "The token lacks the scope this needs, may not act on this owner's work, or a session-cookie write "
           "failed the CSRF checks",
}


def _needs_token(dependant) -> bool:
    """Whether a route's dependency tree holds one that refuses anonymous requests
    (:func:`backend.api.deps.require_scope`'s ``require_<scope>``, :func:`backend.api.deps.require_token`)."""
    for dep in dependant.dependencies:
        if getattr(dep.call, "__name__", "").startswith("require_") or _needs_token(dep):
            return True
    return False


def required_operations(app: FastAPI) -> set[tuple[str, str]]:
    """``(path, method)`` of every operation that answers 401 without a token (method lower case)."""
    out = set()
    for context in iter_route_contexts(app.routes):  # through included routers, with their prefixes
        route = context.original_route
        if isinstance(route, APIRoute) and _needs_token(route.dependant):
            path = context.path_format or route.path_format
            out |= {(path, m.lower()) for m in route.methods}
    return out


def _complete(schema: dict[str, Any], required: set[tuple[str, str]]) -> dict[str, Any]:
    components = schema.setdefault("components", {})
    schemes = components.setdefault("securitySchemes", {})
    for name, scheme in SECURITY_SCHEMES.items():
        schemes[name] = {**schemes.get(name, {}), **scheme}
    has_error_schema = "ErrorPublic" in components.get("schemas", {})
    for path, methods in schema.get("paths", {}).items():
        for method, op in methods.items():
            if not isinstance(op, dict) or not op.get("security"):
                continue
            if (path, method) in required:
                responses = op.setdefault("responses", {})
                for code, text in _DEFAULT_RESPONSES.items():
                    entry = responses.setdefault(code, {"description": text})
                    if has_error_schema:
                        entry.setdefault("content", _ERROR_BODY)
            elif {} not in op["security"]:  # a token is optional here: anonymous is fine
                op["security"] = [{}, *op["security"]]
    return schema


def document_security(app: FastAPI) -> FastAPI:
    """Make ``app.openapi()`` answer the schema completed as the module docstring says."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        # FastAPI caches its schema (and rebuilds it when routes change); completing is idempotent
        return _complete(build(), required_operations(app))

    app.openapi = openapi  # type: ignore[method-assign]
    return app
