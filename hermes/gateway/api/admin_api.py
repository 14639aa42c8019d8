"""The admin API (``/admin/...``) and ``GET /metrics``: what ``hermes apps|runs|policy|knob|top``
talk to.

Access: with ``HERMES_ADMIN_TOKEN`` set (in the gateway's environment when the app is
created, or ``app.state.admin_token``), every ``/admin`` call needs ``Authorization: Bearer
TOKEN`` (401 without, 403 with a wrong one). Without a token:

- authentication off (the laptop default): the admin API answers loopback clients only (403
  otherwise), so a laptop gateway needs no setup and an exposed one is closed;
- authentication on: every ``/admin`` call is refused (403) until a token is set, loopback
  clients too (behind a reverse proxy on the same host every client is loopback), unless the
  operator names the exception: ``security.admin_loopback = true``. A tenant's API key is
  never an admin credential.

``/metrics`` is open (Prometheus scrapes it) with authentication off unless
``security.metrics_token`` is set (``HERMES_METRICS_TOKEN``): then it needs ``Authorization:
Bearer TOKEN`` (401 without, 403 with a wrong one; Prometheus: ``authorization:
credentials_file``). With authentication on it always needs a token: the metrics token, or the
admin token; and tenant names are not label values (every tenant is ``other``) unless
``security.metrics_tenants = true``. Label values are bounded
(:class:`hermes.metrics.GatewayMetrics`).

- ``GET /admin/apps``; ``GET /admin/apps/{name}`` (summary); ``GET /admin/apps/{name}/pdgraph``
  (the full PDGraph JSON: export); ``PUT /admin/apps/{name}`` (import a PDGraph JSON).
- ``GET /admin/runs?state=&app=&tenant=&limit=``; ``GET /admin/runs/{id}``;
  ``GET /admin/runs/{id}/timeline``;
  ``POST /admin/runs/{id}/cancel``.
- ``GET /admin/policy``; ``PUT /admin/policy {"policy"}``: live switch, every active run is
  ranked afresh and queued requests re-keyed.
- ``GET /admin/knobs``; ``PUT /admin/knobs {"scope": "default"|"app"|"tenant", "name", "k"}``
  (``k: null`` removes an app or tenant override; ``name`` must be an app or tenant name).
- ``GET /admin/engines``; ``GET /admin/top?limit=`` (runs by rank, engines, totals: one frame
  of ``hermes top``).
- ``GET /admin/forecast?horizon_s=&window_s=``: each model's forecast demand
  (:mod:`hermes.gateway.demand`; ``hermes plan placement --from-gateway``);
  ``GET /admin/placement``: the gateway's own re-placement (``placement.auto``).
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import re
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hermes.core import strict_json
from hermes.core.policies.base import policy_names
from hermes.core.policies.fair_share import policy_rank
from hermes.core.state import RunState
from hermes.gateway.api.apps_api import PDGRAPH_BODY, install_graph
from hermes.gateway.api.appstate import hosted_of, scheduler_of
from hermes.gateway.api.errors import error_response, scheduler_error, validation_error
from hermes.gateway.api.run_params import Knob
from hermes.gateway.api.runs_api import TENANT_PATTERN, run_timeline_response
from hermes.gateway.demand import forecast_doc
from hermes.gateway.errors import SchedulerError
from hermes.gateway.finished import FinishedRun
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.state import ACTIVE, LiveRun
from hermes.kb.base import validate_app_name

TOKEN_ENV = "HERMES_ADMIN_TOKEN"


class AdminDenied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def admin_token(request: Request) -> str | None:
    """The configured admin token: ``app.state.admin_token``, else ``$HERMES_ADMIN_TOKEN``."""
    tok = getattr(request.app.state, "admin_token", None)
    return tok if tok else (os.environ.get(TOKEN_ENV) or None)


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _admin_loopback(request: Request) -> bool:
    config = getattr(request.app.state, "config", None)
    return bool(config is not None and config.security.admin_loopback)


async def require_admin(request: Request) -> None:
    """Token check (see the module docstring); raises :class:`AdminDenied`."""
    token = admin_token(request)
    if token is None:
        security = getattr(request.app.state, "security", None)
        if security is not None and security.auth_on and not _admin_loopback(request):
            raise AdminDenied(403, f"the admin API needs the admin token when authentication "
                                   f"is on: set {TOKEN_ENV} on the gateway (or "
                                   "security.admin_loopback = true to let loopback clients in)")
        if _is_loopback(request.client.host if request.client else None):
            return
        raise AdminDenied(403, f"the admin API answers loopback clients only; set {TOKEN_ENV} "
                               "on the gateway to use it remotely")
    auth = request.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise AdminDenied(401, "admin API: missing 'Authorization: Bearer <token>' header")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise AdminDenied(403, "admin API: invalid admin token")


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])
metrics_router = APIRouter()


def install(app: FastAPI) -> None:
    """Add the admin and metrics routes and the admin error handler to ``app``."""
    app.include_router(router)
    app.include_router(metrics_router)
    metrics = getattr(app.state, "metrics", None)
    if metrics is not None:  # hosted apps are known apps: their own ``app`` label value
        from hermes.metrics import MAX_TENANTS_NO_AUTH

        metrics.hosted = getattr(app.state, "hosted", None)
        security = getattr(app.state, "security", None)
        config = getattr(app.state, "config", None)
        if security is None or not security.auth_on:  # tenants are what clients claim
            metrics.max_tenants = min(metrics.max_tenants, MAX_TENANTS_NO_AUTH)
        elif config is None or not config.security.metrics_tenants:
            metrics.max_tenants = 0  # a scrape does not list the tenants

    @app.exception_handler(AdminDenied)
    async def _denied(request: Request, exc: AdminDenied) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, str(exc), code="admin_denied", headers=headers)


@metrics_router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus exposition of the gateway (and its embedded HermesLet); with
    ``security.metrics_token`` set, for its bearer only."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    config = getattr(request.app.state, "config", None)
    security = getattr(request.app.state, "security", None)
    auth_on = security is not None and security.auth_on
    denied = metrics_denied(config.security.metrics_token if config is not None else "",
                            admin_token(request) if auth_on else None, auth_on,
                            request.headers.get("authorization", ""))
    if denied is not None:
        return denied
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)


def metrics_denied(metrics_token: str, admin: str | None, auth_on: bool,
                   authorization: str) -> Response | None:
    """The refusal of a ``GET /metrics`` (module doc: the metrics token, or with
    authentication on the admin token too), or None: allowed. The all-in-one gateway's and
    an edge's."""
    tokens = [t for t in (metrics_token, admin) if t]
    if auth_on and not tokens:
        return error_response(403, "/metrics: authentication is on, so /metrics needs a "
                              "token: set security.metrics_token (or the admin token)",
                              code="metrics_denied")
    if tokens:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return error_response(401, "/metrics: missing 'Authorization: Bearer <token>' "
                                  "header (the metrics or admin token)",
                                  code="metrics_denied", headers={"WWW-Authenticate": "Bearer"})
        if not any(hmac.compare_digest(given.strip().encode(), t.encode()) for t in tokens):
            return error_response(403, "/metrics: invalid token", code="metrics_denied")
    return None



def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def run_row(run: LiveRun | FinishedRun, now: float) -> dict[str, Any]:
    """One line of ``hermes runs list`` / ``hermes top``."""
    st = run.state
    return {
        "run_id": st.run_id, "app": st.app, "tenant": st.tenant, "state": run.status,
        "rank": _num(policy_rank(st) if isinstance(st, RunState) else st.rank), "act_s": run.act_s(now), "attained_s": st.attained_s,
        "current_unit": st.progress.current, "units_done": len(st.progress.finished),
        "pending_requests": len(run.pending), "deadline": st.deadline,
        "submitted": st.submitted,
    }


def engine_rows(s: LiveScheduler) -> list[dict[str, Any]]:
    rows = []
    for node in s.nodes.values():
        for e in node.engines.values():
            rows.append({"node": node.name, "engine": e.name, "model": e.model, "kind": e.kind,
                         "outstanding": node.outstanding.get(e.name, 0),
                         "queued": node.queued.get(e.name, 0),
                         "max_inflight": e.max_inflight,
                         "kv_usage": getattr(node, "kv_usage", {}).get(e.name),
                         "loras": list(e.loras)})
    return rows


# ---------------------------------------------------------------------------------- apps
@router.get("/apps")
async def apps_list(request: Request) -> dict[str, Any]:
    s = scheduler_of(request)
    reg = hosted_of(request)
    graphs = set(s.app_names())
    active: dict[str, int] = {}
    for run in s.registry.active():
        active[run.app] = active.get(run.app, 0) + 1
    inferred = {a.name: a for a in s.identities.apps()}
    names = sorted(graphs | set(reg.names()) | set(inferred))
    rows = []
    for n in names:
        row: dict[str, Any] = {"name": n, "hosted": reg.get(n) is not None,
                               "pdgraph": n in graphs, "inferred": n in inferred,
                               "active_runs": active.get(n, 0),
                               "learned_runs": s.learned_runs(n)}
        info = inferred.get(n)
        if info is not None:  # found in plain traffic: what identifies it
            row.update(app_id=info.app_id, tenant=info.tenant, model=info.model,
                       tools=info.tools, instructions=info.instructions,
                       inferred_runs=info.runs)
        rows.append(row)
    return {"apps": rows}


class _Rename(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str = Field(min_length=1, max_length=128)


class _Merge(BaseModel):
    model_config = ConfigDict(extra="forbid")
    into: str = Field(min_length=1, max_length=128)


@router.post("/apps/{name}/rename")
async def apps_rename(name: str, request: Request) -> Response:
    """Rename an inferred app (``{"to": NEW}``) from its next run on; its learned PDGraph is
    copied to the new name. The mapping is stored with the knowledge base."""
    body = await _json_body(request, _Rename)
    if isinstance(body, Response):
        return body
    try:
        validate_app_name(body.to)
        return JSONResponse(scheduler_of(request).rename_app(name, body.to))
    except KeyError:
        return error_response(404, f"no inferred app named {name!r}", param="name",
                              code="app_not_found")
    except ValueError as e:
        return error_response(409 if "taken" in str(e) else 400, f"to: {e}", param="to",
                              code="invalid_value")


@router.post("/apps/{name}/merge")
async def apps_merge(name: str, request: Request) -> Response:
    """Merge an inferred app into another (``{"into": OTHER}``): its next runs are runs of
    the other, and teach the other's PDGraph. Stored with the knowledge base."""
    body = await _json_body(request, _Merge)
    if isinstance(body, Response):
        return body
    try:
        return JSONResponse(scheduler_of(request).merge_app(name, body.into))
    except KeyError as e:
        which = "name" if e.args and e.args[0] == name else "into"
        return error_response(404, f"no inferred app named {e.args[0]!r}", param=which,
                              code="app_not_found")
    except ValueError as e:
        return error_response(400, f"into: {e}", param="into", code="invalid_value")


@router.get("/apps/{name}")
async def apps_show(name: str, request: Request) -> Response:
    s = scheduler_of(request)
    s.refresh_graphs({name})  # what finished runs taught it, now
    graph = s.app_graph(name)
    hosted = hosted_of(request).get(name)
    if graph is None and hosted is None:
        return error_response(404, f"app {name!r} has no PDGraph and is not hosted",
                              param="name", code="app_not_found")
    return JSONResponse({"name": name, "hosted": hosted is not None,
                         "pdgraph": graph.summary() if graph is not None else None})


@router.get("/apps/{name}/pdgraph")
async def apps_export(name: str, request: Request) -> Response:
    scheduler_of(request).refresh_graphs({name})  # what finished runs taught it, now
    graph = scheduler_of(request).app_graph(name)
    if graph is None:
        return error_response(404, f"app {name!r} has no PDGraph", param="name",
                              code="app_not_found")
    return Response(graph.to_json(), media_type="application/json")


@router.put("/apps/{name}", openapi_extra=PDGRAPH_BODY)
async def apps_import(name: str, request: Request) -> Response:
    """Import an app's PDGraph (the admin owns shared apps); validated as an upload is."""
    got = install_graph(scheduler_of(request), name, await request.body(), what="import")
    if isinstance(got, Response):
        return got
    return JSONResponse({"name": name, "units": list(got.units)})


# ---------------------------------------------------------------------------------- runs
@router.get("/runs")
async def runs_list(request: Request, state: str | None = None, app: str | None = None,
                    tenant: str | None = None, limit: int = 100) -> Response:
    states = {"queued", "running", "finished", "failed", "cancelled", "active"}
    if state is not None and state not in states:
        return error_response(422, f"state: must be one of {', '.join(sorted(states))}",
                              param="state", code="invalid_value")
    if limit < 1:
        return error_response(422, "limit: must be >= 1", param="limit", code="invalid_value")
    s = scheduler_of(request)
    now = s.now()

    def match(run: LiveRun) -> bool:
        if state == "active" and run.status not in ACTIVE:
            return False
        if state not in (None, "active") and run.status != state:
            return False
        return not ((app and run.app != app) or (tenant and run.state.tenant != tenant))

    return JSONResponse({"runs": [run_row(run, now) for run in s.recent_runs(match, limit)]})


@router.get("/runs/{run_id}")
async def runs_show(run_id: str, request: Request) -> Response:
    s = scheduler_of(request)
    try:
        run = s.get_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(s.now()))


@router.get("/runs/{run_id}/timeline")
async def runs_timeline(run_id: str, request: Request) -> Response:
    """The run's units, requests and tool calls on a time axis (``hermes runs show --timeline``)."""
    return run_timeline_response(run_id, request)


@router.post("/runs/{run_id}/cancel")
async def runs_cancel(run_id: str, request: Request) -> Response:
    s = scheduler_of(request)
    try:
        run = s.cancel_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run_row(run, s.now()))


# ---------------------------------------------------------------------------------- policy
class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = Field(min_length=1)


@router.get("/policy")
async def policy_show(request: Request) -> dict[str, Any]:
    s = scheduler_of(request)
    return {"policy": s.config.scheduler.policy, "available": policy_names(),
            "k": s.config.scheduler.k, "knobs": s.knobs,
            "switches": request.app.state.metrics.switch_count}


@router.put("/policy", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": PolicyBody.model_json_schema()}}}})
async def policy_set(request: Request) -> Response:
    body = await _json_body(request, PolicyBody)
    if isinstance(body, Response):
        return body
    try:
        out = scheduler_of(request).switch_policy(body.policy)
    except ValueError as e:
        return error_response(422, f"policy: {e}", param="policy", code="unknown_policy")
    return JSONResponse(out)


# ---------------------------------------------------------------------------------- knobs
class KnobBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Literal["default", "app", "tenant"]
    name: str = ""
    k: Knob | None = None

    @model_validator(mode="after")
    def _check(self) -> KnobBody:
        if self.scope == "default":
            if self.k is None:
                raise ValueError("k: the default K cannot be removed, give a value in [0, 1]")
            self.name = ""
        elif not self.name:
            raise ValueError(f"name: give the {self.scope} the knob applies to")
        return self


def _bad_knob_name(scope: str, name: str) -> str | None:
    """Why ``name`` cannot name an app (``scope="app"``) or a tenant, or None."""
    if scope == "app":
        try:
            validate_app_name(name)
        except ValueError as e:
            return str(e)
    elif scope == "tenant" and (not re.fullmatch(TENANT_PATTERN.strip("^$"), name)
                                or name.startswith(".")):
        return (f"bad tenant name {name!r}: expected 1-128 characters from [A-Za-z0-9_.-], "
                "not starting with '.'")
    return None


@router.get("/knobs")
async def knobs_show(request: Request) -> dict[str, Any]:
    s = scheduler_of(request)
    return {"k": s.config.scheduler.k, "knobs": s.knobs}


@router.put("/knobs", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": KnobBody.model_json_schema()}}}})
async def knobs_set(request: Request) -> Response:
    body = await _json_body(request, KnobBody)
    if isinstance(body, Response):
        return body
    bad = _bad_knob_name(body.scope, body.name)
    if bad:
        return error_response(422, f"name: {bad}", param="name", code="invalid_value")
    s = scheduler_of(request)
    table = s.knobs.setdefault(body.scope, {})
    if body.k is None:
        table.pop(body.name, None)
    else:
        table[body.name] = float(body.k)
    return JSONResponse({"set": {"scope": body.scope, "name": body.name, "k": body.k},
                         "k": s.config.scheduler.k, "knobs": s.knobs})


# ---------------------------------------------------------------------------------- engines, top
@router.get("/engines")
async def engines(request: Request) -> dict[str, Any]:
    return {"engines": engine_rows(scheduler_of(request))}


@router.get("/forecast")
async def forecast(request: Request, horizon_s: float = 60.0, window_s: float = 300.0) -> Response:
    """Each model's expected calls and tokens over the next ``horizon_s`` from the runs in
    flight, their apps' PDGraphs and the apps' arrival rates over the last ``window_s``
    (:mod:`hermes.gateway.demand`): what ``hermes plan placement --from-gateway`` places."""
    for name, v in (("horizon_s", horizon_s), ("window_s", window_s)):
        if not (math.isfinite(v) and 0 < v <= 86_400):
            return error_response(422, f"{name}: must be a number of seconds in (0, 86400]",
                                  param=name, code="invalid_value")
    return JSONResponse(forecast_doc(scheduler_of(request), horizon_s, window_s))


@router.get("/placement")
async def placement(request: Request) -> dict[str, Any]:
    """The gateway's own re-placement (``placement.auto``): the interval now, the plans in
    force (``nodes``: node -> engine -> model; ``engines``: all of them together) and the last
    rounds, with the plans sent again to a restarted node at its hello (``hello``: the node;
    :mod:`hermes.gateway.placer`)."""
    placer = getattr(request.app.state, "placer", None)
    if placer is None:
        return {"auto": False}
    from hermes.plan.placement import plan_engines

    nodes = {node: plan_engines(plan) for node, plan in placer.plans.items()}
    return {"auto": True, "interval_s": placer.interval_s,
            "engines": {k: v for eng in nodes.values() for k, v in eng.items()} or None,
            "nodes": nodes, "rounds": list(placer.history)[-20:]}


@router.get("/top")
async def top(request: Request, limit: int = 20) -> dict[str, Any]:
    """Active runs by rank (lowest first), engines and totals: one frame of ``hermes top``."""
    s = scheduler_of(request)
    now = s.now()
    active = list(s.registry.active())
    active.sort(key=lambda r: (r.state.rank if math.isfinite(r.state.rank) else math.inf,
                               r.state.submitted))
    return {
        "policy": s.config.scheduler.policy,
        "time": now,
        "runs": [run_row(r, now) for r in active[: max(1, limit)]],
        "engines": engine_rows(s),
        "totals": {"active": len(active),
                   "queued": sum(1 for r in active if r.status == "queued"),
                   "running": sum(1 for r in active if r.status == "running"),
                   "finished": s.stats.get("runs_finished", 0),
                   "requests_pending": len(s.requests), "nodes": len(s.nodes)},
    }


async def _json_body(request: Request, model: type[BaseModel]) -> Any:
    try:
        data = strict_json.loads(await request.body() or b"null")
    except strict_json.StrictJSONError as e:
        return error_response(400, f"body is not strict JSON: {e}", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        return validation_error(e, 422)
