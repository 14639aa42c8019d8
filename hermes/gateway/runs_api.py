"""The app-run API: runs, their tool calls and unit events, apps (PDGraphs), health.

- ``POST /v1/runs {"app", "deadline_s"?, "tenant"?, "k"?, "input"?}`` → 201 with the run.
  With ``input`` the app must be a hosted app: the gateway runs it and ``GET`` returns its
  ``result``. Without, the client drives the run (OpenAI endpoint with ``X-Hermes-Run``).
- ``GET /v1/runs/{id}``: state (queued|running|finished|failed|cancelled), units with their
  timings and requests, current rank, ACT (so far, while running).
- ``POST /v1/runs/{id}/finish``; ``DELETE /v1/runs/{id}`` (cancel: queued requests dropped,
  in-flight ones aborted at the engines).
- ``POST /v1/runs/{id}/tools {"unit", "backend", "code"|"command", "timeout_s"}``: a tool call
  on a node's tool runner, ordered by the run's rank; answers when it has run.
- ``POST /v1/runs/{id}/events {"unit", "event": "start"|"finish", "backend"?}``: units the
  client runs itself, so that the PDGraph still learns them.
- ``GET /v1/apps``, ``GET /v1/apps/{name}`` (PDGraph summary), ``PUT /v1/apps/{name}``
  (upload a PDGraph JSON document).
- ``GET /healthz``.

Errors use OpenAI's shape (:func:`hermes.gateway.openai_api.error_response`).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hermes.core.backend import BackendSpec
from hermes.gateway import hosted
from hermes.gateway.auth import check_run_quota, tenant_for, visible
from hermes.gateway.openai_api import error_response, scheduler_error
from hermes.gateway.run_params import DeadlineS, Knob
from hermes.gateway.scheduler import ACTIVE, LiveRun, LiveScheduler, SchedulerError
from hermes.protocol import ToolDone

router = APIRouter()


class CreateRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
    deadline_s: DeadlineS | None = None
    tenant: str | None = Field(default=None, min_length=1)
    k: Knob | None = None
    input: Any = None


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: str = Field(min_length=1)
    backend: str = Field(min_length=1)
    code: str | None = None
    command: list[str] | None = Field(default=None, min_length=1)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_of(self) -> ToolCall:
        if (self.code is None) == (self.command is None):
            raise ValueError("give exactly one of 'code' and 'command'")
        BackendSpec.parse(self.backend)
        return self


class UnitEventBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: str = Field(min_length=1)
    event: Literal["start", "finish"]
    backend: str | None = None

    @model_validator(mode="after")
    def _backend(self) -> UnitEventBody:
        if self.backend is not None:
            BackendSpec.parse(self.backend)
        return self


def _sched(request: Request) -> LiveScheduler:
    return request.app.state.scheduler


def _registry(request: Request) -> hosted.HostedRegistry:
    return request.app.state.hosted


@router.post("/v1/runs", status_code=201, tags=["runs"])
async def create_run(body: CreateRun, request: Request) -> Response:
    """Start a run. With ``input``, a hosted app runs it inside the gateway."""
    sched = _sched(request)
    app = None
    if "input" in body.model_fields_set:
        app = _registry(request).get(body.app)
        if app is None:
            return error_response(404, f"app {body.app!r} is not a hosted app; hosted: "
                                  f"{', '.join(_registry(request).names()) or 'none'}",
                                  param="app", code="app_not_hosted")
    tenant = tenant_for(request, body.tenant)
    refused = check_run_quota(request, tenant)
    if refused is not None:
        return refused
    run = sched.create_run(body.app, deadline_s=body.deadline_s, tenant=tenant, k=body.k,
                           input=body.input, hosted=app is not None)
    if app is not None:
        hosted.launch(sched, run, app, request.app.state.config)
    return JSONResponse(run.to_json(sched.now()), status_code=201,
                        headers={"Location": f"/v1/runs/{run.run_id}"})


@router.get("/v1/runs", tags=["runs"])
async def list_runs(request: Request, state: str | None = None, app: str | None = None,
                    limit: int = 100) -> dict[str, Any]:
    """Recent runs (newest first), optionally filtered by state and app."""
    sched = _sched(request)
    now = sched.now()

    def match(run: LiveRun) -> bool:
        return not ((state and run.status != state) or (app and run.app != app)
                    or not visible(run.state.tenant))

    return {"runs": [{"run_id": run.run_id, "app": run.app, "state": run.status,
                      "submitted": run.state.submitted, "act_s": run.act_s(now)}
                     for run in sched.recent_runs(match, limit)]}


@router.get("/v1/runs/{run_id}", tags=["runs"])
async def get_run(run_id: str, request: Request) -> Response:
    sched = _sched(request)
    try:
        run = sched.get_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(sched.now()))


@router.post("/v1/runs/{run_id}/finish", tags=["runs"])
async def finish_run(run_id: str, request: Request) -> Response:
    """The client's run is done: it is recorded and its app's PDGraph learns from it."""
    sched = _sched(request)
    try:
        run = sched.get_run(run_id)
        if run.hosted and run.status in ACTIVE:
            return error_response(409, f"run {run_id!r} is a hosted run; it finishes by itself",
                                  code="hosted_run")
        run = sched.finish_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(sched.now()))


@router.delete("/v1/runs/{run_id}", tags=["runs"])
async def cancel_run(run_id: str, request: Request) -> Response:
    """Cancel a run: its queued requests are dropped and in-flight ones aborted."""
    sched = _sched(request)
    try:
        run = sched.cancel_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(sched.now()))


@router.post("/v1/runs/{run_id}/tools", tags=["runs"])
async def run_tool(run_id: str, body: ToolCall, request: Request) -> Response:
    """Run a tool call of the run on a node's tool runner; answers with its output."""
    sched = _sched(request)
    try:
        run = sched.active_run(run_id)
        inv = sched.unit_for_request(run, body.unit, body.backend)
        req = await sched.submit_tool(run, inv, backend=body.backend, code=body.code,
                                      command=body.command, timeout_s=body.timeout_s)
        done = await sched.wait(req, timeout=body.timeout_s + 60.0)
    except SchedulerError as e:
        return scheduler_error(e)
    assert isinstance(done, ToolDone)
    return JSONResponse({
        "request_id": req.request_id, "run_id": run_id, "unit": body.unit,
        "exit_code": done.exit_code, "stdout": done.stdout, "stderr": done.stderr,
        "duration_s": done.duration_s, "queue_s": done.queue_s, "cold": done.cold,
        "timed_out": done.timed_out,
    })


@router.post("/v1/runs/{run_id}/events", tags=["runs"])
async def unit_event(run_id: str, body: UnitEventBody, request: Request) -> Response:
    """A unit the client runs itself started or finished."""
    sched = _sched(request)
    try:
        run = sched.active_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    inv = sched.unit_event(run, body.unit, body.event, backend=body.backend)
    if inv is None:
        return error_response(409, f"unit {body.unit!r} of run {run_id!r} is not running",
                              param="unit", code="unit_not_running")
    return JSONResponse({"run_id": run_id, "unit": inv.unit, "event": body.event,
                         "started": inv.started, "finished": inv.finished,
                         "rank": run.to_json(sched.now())["rank"]})


# ---------------------------------------------------------------------------------- apps
@router.get("/v1/apps", tags=["apps"])
async def list_apps(request: Request) -> dict[str, Any]:
    """Apps with a PDGraph and hosted apps."""
    sched = _sched(request)
    reg = _registry(request)
    graphs = set(sched.app_names())
    names = sorted(graphs | set(reg.names()))
    return {"apps": [{"name": n, "hosted": reg.get(n) is not None, "pdgraph": n in graphs}
                     for n in names]}


def _bad_app_name(name: str) -> Response | None:
    """422 naming the app when its name could not be a knowledge-base key."""
    from hermes.kb.base import validate_app_name

    try:
        validate_app_name(name)
    except ValueError as e:
        return error_response(422, f"name: {e}", param="name", code="invalid_value")
    return None


@router.get("/v1/apps/{name}", tags=["apps"])
async def get_app(name: str, request: Request) -> Response:
    """An app's PDGraph summary (units, branch probabilities, mean demand, masks)."""
    sched = _sched(request)
    reg = _registry(request)
    bad = _bad_app_name(name)
    if bad is not None:
        return bad
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


@router.put("/v1/apps/{name}", tags=["apps"])
async def put_app(name: str, request: Request) -> Response:
    """Upload an app's PDGraph (JSON); it replaces the stored one and the estimator's."""
    bad = _bad_app_name(name)
    if bad is not None:
        return bad
    got = install_graph(_sched(request), name, await request.body(), what="upload")
    if isinstance(got, Response):
        return got
    return JSONResponse({"name": name, "pdgraph": got.summary()})


def install_graph(sched: LiveScheduler, name: str, raw: bytes, *, what: str) -> Any:
    """Validate an uploaded PDGraph for app ``name`` and install it (knowledge base,
    estimator, online profiler); the graph, or a 400 response naming what was wrong (the
    stored graph untouched). Shared by ``PUT /v1/apps/{name}`` and the admin import."""
    from hermes.core.pdgraph import PDGraph, PDGraphError

    try:
        graph = PDGraph.from_json(raw, source=f"{what} of {name!r}")
    except PDGraphError as e:
        return error_response(400, str(e), code="invalid_pdgraph")
    if graph.app != name:
        return error_response(400, f"field app: is {graph.app!r}, expected {name!r}",
                              param="app", code="invalid_pdgraph")
    try:
        sched.put_graph(graph)
    except ValueError as e:
        return error_response(400, str(e), code="invalid_pdgraph")
    return graph


@router.get("/healthz", tags=["health"])
async def healthz(request: Request) -> dict[str, Any]:
    sched = _sched(request)
    return {
        "status": "ok" if sched.nodes else "degraded",
        "policy": sched.config.scheduler.policy,
        "nodes": {n.name: {"engines": {e.name: e.model for e in n.engines.values()},
                           "tools": n.tools} for n in sched.nodes.values()},
        "runs_active": sum(1 for r in sched.runs.values() if r.status in ACTIVE),
        "requests_pending": len(sched.requests),
        **sched.stats,
    }
