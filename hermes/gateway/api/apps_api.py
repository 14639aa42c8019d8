"""The apps API: apps with a PDGraph and hosted apps, and PDGraph upload.

- ``GET /v1/apps``, ``GET /v1/apps/{name}`` (PDGraph summary), ``PUT /v1/apps/{name}``
  (upload a PDGraph JSON document; :func:`install_graph`, shared with the admin import).

Security (issue 15): with authentication on, apps are shared and admin-owned (``PUT
/admin/apps/NAME``), except a tenant's own ``TENANT.NAME`` apps (the part before the last dot
is the tenant): a tenant key may upload only those (403 ``app_not_owned`` otherwise), and
another tenant's are hidden (404) and cannot be run (403, :func:`foreign_app`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hermes.core.pdgraph import PDGraph, PDGraphError
from hermes.gateway.api.appstate import hosted_of, scheduler_of
from hermes.gateway.api.errors import error_response
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.tenancy import current_tenant
from hermes.kb.base import validate_app_name

router = APIRouter()


def app_owner(name: str) -> str | None:
    """The tenant a ``TENANT.NAME`` app belongs to (the part before the last dot), or None
    for a shared app (no dot)."""
    owner, dot, _ = name.rpartition(".")
    return owner if dot and owner else None


def foreign_app(name: str) -> bool:
    """Whether ``name`` is another tenant's own app (authentication on; the admin and
    unauthenticated gateways see every app)."""
    tenant = current_tenant.get()
    owner = app_owner(name)
    return tenant is not None and owner is not None and owner != tenant


def not_owned(name: str, tenant: str, doing: str) -> Response:
    return error_response(
        403, f"app {name!r} is not tenant {tenant!r}'s: {doing}. Shared apps belong to the "
        f"admin (PUT /admin/apps/NAME, `hermes apps import`); a tenant's own apps are named "
        f"'{tenant}.NAME'", param="name", code="app_not_owned")




#: apps in one page of ``GET /v1/apps`` (at most; the default)
MAX_PAGE = 1000


@router.get("/v1/apps", tags=["apps"], response_model=None)
async def list_apps(request: Request, limit: int = MAX_PAGE,
                    after: str | None = None) -> dict[str, Any] | Response:
    """Apps with a PDGraph and hosted apps that the caller may see (shared apps and, with
    authentication on, the tenant's own ``TENANT.NAME`` apps), by name, one page at a time:
    ``limit`` (1 to 1000) names after ``after``; ``has_more`` and ``last`` say how to go on."""
    if not 1 <= limit <= MAX_PAGE:
        return error_response(400, f"limit: must be between 1 and {MAX_PAGE}", param="limit",
                              code="invalid_value")
    sched = scheduler_of(request)
    reg = hosted_of(request)
    graphs = set(sched.app_names())
    names = sorted(n for n in graphs | set(reg.names())
                   if not foreign_app(n) and (after is None or n > after))
    page = names[:limit]
    return {"apps": [{"name": n, "hosted": reg.get(n) is not None, "pdgraph": n in graphs}
                     for n in page],
            "has_more": len(names) > limit, "last": page[-1] if page else None}


def _bad_app_name(name: str) -> Response | None:
    """422 naming the app when its name could not be a knowledge-base key."""
    try:
        validate_app_name(name)
    except ValueError as e:
        return error_response(422, f"name: {e}", param="name", code="invalid_value")
    return None


@router.get("/v1/apps/{name}", tags=["apps"])
async def get_app(name: str, request: Request) -> Response:
    """An app's PDGraph summary (units, branch probabilities, mean demand, masks)."""
    sched = scheduler_of(request)
    reg = hosted_of(request)
    bad = _bad_app_name(name)
    if bad is not None:
        return bad
    if foreign_app(name):  # another tenant's own app: as if it did not exist
        return error_response(404, f"app {name!r} has no PDGraph and is not hosted",
                              code="app_not_found")
    sched.refresh_graphs({name})  # what finished runs taught it, now
    graph = sched.app_graph(name)
    app = reg.get(name)
    if graph is None and app is None:
        return error_response(404, f"app {name!r} has no PDGraph and is not hosted",
                              code="app_not_found")
    return JSONResponse({
        "name": name,
        "hosted": app is not None,
        "description": getattr(app, "description", "") if app else "",
        "pdgraph": graph.summary() if graph is not None else None,
    })


#: the OpenAPI request body of a PDGraph upload (its reader validates the whole document)
PDGRAPH_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["version", "app", "entry", "units"], "properties": {
        "version": {"type": "integer"}, "app": {"type": "string"},
        "entry": {"type": "object", "additionalProperties": {"type": "number"}},
        "units": {"type": "object", "additionalProperties": {"type": "object"}},
        "edges": {"type": "object"}}}}}}}


@router.put("/v1/apps/{name}", tags=["apps"], openapi_extra=PDGRAPH_BODY)
async def put_app(name: str, request: Request) -> Response:
    """Upload an app's PDGraph (JSON); it replaces the stored one and the estimator's. With
    authentication on, a tenant key may upload only the tenant's own ``TENANT.NAME`` apps."""
    bad = _bad_app_name(name)
    if bad is not None:
        return bad
    tenant = current_tenant.get()
    if tenant is not None and app_owner(name) != tenant:
        return not_owned(name, tenant, "tenant keys cannot write shared or other tenants' "
                          "apps")
    got = install_graph(scheduler_of(request), name, await request.body(), what="upload")
    if isinstance(got, Response):
        return got
    return JSONResponse({"name": name, "pdgraph": got.summary()})


def install_graph(sched: LiveScheduler, name: str, raw: bytes, *, what: str) -> Any:
    """Validate an uploaded PDGraph for app ``name`` and install it (knowledge base,
    estimator, online profiler); the graph, or a 400 response naming what was wrong (the
    stored graph untouched: everything is checked, down to a JSON round trip, before
    anything is stored). Shared by ``PUT /v1/apps/{name}`` and the admin import."""
    bad = _bad_app_name(name)
    if bad is not None:
        return bad
    try:
        graph = PDGraph.from_upload(raw, source=f"{what} of {name!r}")
    except PDGraphError as e:
        return error_response(400, str(e), code="invalid_pdgraph")
    if graph.app != name:
        return error_response(400, f"field app: is {graph.app!r}, expected {name!r}",
                              param="app", code="invalid_pdgraph")
    try:
        sched.put_graph(graph)
    except ValueError as e:
        return error_response(400, str(e), code="invalid_pdgraph")
    note = getattr(getattr(sched, "metrics", None), "note_app", None)
    if note is not None:
        note(name)  # an uploaded app is a known app: its own metric label value
    return graph
