"""The runs API: runs, their tool calls and unit events, and health.

- ``POST /v1/runs {"app", "deadline_s"?, "tenant"?, "k"?, "input"?}`` → 201 with the run.
  With ``input`` the app must be a hosted app: the gateway runs it and ``GET`` returns its
  ``result``. Without, the client drives the run (OpenAI endpoint with ``X-Hermes-Run``).
- ``GET /v1/runs/{id}/timeline``: its units, requests and tool calls on one time axis
  (queued, dispatched, first token, done; :mod:`hermes.gateway.timeline`).
- ``GET /v1/runs/{id}``: state (queued|running|finished|failed|cancelled), units with their
  timings and requests, current rank, ACT (so far, while running).
- ``POST /v1/runs/{id}/finish``; ``DELETE /v1/runs/{id}`` (cancel: queued requests dropped,
  in-flight ones aborted at the engines).
- ``POST /v1/runs/{id}/tools {"unit", "backend", "code"|"command", "timeout_s"}``: a tool call
  on a node's tool runner, ordered by the run's rank; answers when it has run.
- ``POST /v1/runs/{id}/events {"unit", "event": "start"|"finish", "backend"?}``: units the
  client runs itself, so that the PDGraph still learns them.
- ``GET /healthz``.

Errors use OpenAI's shape (:func:`hermes.gateway.api.errors.error_response`). Apps are
:mod:`hermes.gateway.api.apps_api`'s.

Security (issue 15):

- ``POST /v1/runs`` validates everything before it creates anything: its ``input`` must be
  strict JSON (:mod:`hermes.core.strict_json`: finite numbers, valid Unicode, bounded
  nesting), ``tenant`` a tenant name. ``Idempotency-Key: KEY`` (1-255 printable ASCII
  characters) makes it safe to retry: the same key with the same body answers the run the
  first request created (``Idempotent-Replayed: true``), with another body 422
  ``idempotency_key_reused``. Keys are per tenant and stored with the run (durable state), so
  they survive a restart; a key is forgotten with its run.
- a run of another tenant's own ``TENANT.NAME`` app is refused (403,
  :func:`hermes.gateway.api.apps_api.foreign_app`); a tenant at its active-run quota gets
  429 ``run_quota`` (:func:`check_run_quota`).
- ``/v1/runs/{id}/tools`` checks that the run is the caller's (404) before it reads the body,
  and refuses (503 ``tool_sandbox_unavailable``) when no connected node has a tool sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hermes.core import strict_json
from hermes.core.backend import BackendSpec
from hermes.gateway.api.apps_api import foreign_app, not_owned
from hermes.gateway.api.appstate import hosted_of, scheduler_of
from hermes.gateway.api.errors import error_response, scheduler_error, validation_error
from hermes.gateway.api.run_params import DeadlineS, Knob
from hermes.gateway.auth import Security, tenant_for
from hermes.gateway.errors import RunNotFound, SchedulerError
from hermes.gateway.nodes import NO_SANDBOX
from hermes.gateway.shared import StoreUnavailable
from hermes.gateway.state import ACTIVE, LiveRun, new_run_id
from hermes.gateway.tenancy import current_tenant, visible
from hermes.gateway.timeline import run_timeline
from hermes.protocol import ToolDone

router = APIRouter()

#: tenant names (as ``hermes keys create`` allows them, ASCII)
TENANT_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
#: unit names of runs (the PDGraph's rule: :data:`hermes.core.pdgraph.UNIT_NAME_RE`)
UNIT_PATTERN = r"^[A-Za-z0-9_.:@/+-]{1,128}$"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def _strict(data: Any) -> Any:
    """A ``mode="before"`` check: the whole body is strict JSON (no lone surrogates in any
    string: they would reach stored documents and answers)."""
    strict_json.check(data)
    return data


class CreateRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
    deadline_s: DeadlineS | None = None
    tenant: str | None = Field(default=None, pattern=TENANT_PATTERN)
    k: Knob | None = None
    input: Any = None

    @field_validator("input")
    @classmethod
    def _strict_input(cls, v: Any) -> Any:
        """It is stored with the run and sent back: strict JSON only (not NaN, 1e400, ...)."""
        strict_json.check(v)
        return v


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: str = Field(pattern=UNIT_PATTERN)
    backend: str = Field(min_length=1, max_length=512)
    code: str | None = None
    command: list[str] | None = Field(default=None, min_length=1)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)

    _strict_body = model_validator(mode="before")(_strict)

    @model_validator(mode="after")
    def _one_of(self) -> ToolCall:
        if (self.code is None) == (self.command is None):
            raise ValueError("give exactly one of 'code' and 'command'")
        BackendSpec.parse(self.backend)
        return self


class UnitEventBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: str = Field(pattern=UNIT_PATTERN)
    event: Literal["start", "finish"]
    backend: str | None = Field(default=None, max_length=512)

    _strict_body = model_validator(mode="before")(_strict)

    @model_validator(mode="after")
    def _backend(self) -> UnitEventBody:
        if self.backend is not None:
            BackendSpec.parse(self.backend)
        return self




def check_run_quota(request: Request, tenant: str | None) -> Response | None:
    """A 429 response if ``tenant`` is at its active-run quota, else None."""
    sec: Security | None = getattr(request.app.state, "security", None)
    if sec is None:
        return None
    who = tenant or "default"
    if sec.admission.limits(who).max_active_runs is None:
        return None
    ok, reason = sec.admission.runs_allowed(who, scheduler_of(request).registry.count_active(who))
    if ok:
        return None
    return error_response(429, reason, code="run_quota", headers={"Retry-After": "5"})


@router.post("/v1/runs", status_code=201, tags=["runs"])
async def create_run(body: CreateRun, request: Request) -> Response:
    """Start a run. With ``input``, a hosted app runs it inside the gateway. With an
    ``Idempotency-Key`` header, a retry answers the run the first request created."""
    sched = scheduler_of(request)
    app = None
    if "input" in body.model_fields_set:
        app = hosted_of(request).get(body.app)
        if app is None:
            return error_response(404, f"app {body.app!r} is not a hosted app; hosted: "
                                  f"{', '.join(hosted_of(request).names()) or 'none'}",
                                  param="app", code="app_not_hosted")
    tenant = tenant_for(request, body.tenant)
    if foreign_app(body.app):
        return not_owned(body.app, str(current_tenant.get()), "its runs are its owner's")
    idem = None
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None:
        if not (1 <= len(key) <= 255 and key.isascii() and key.isprintable()):
            return error_response(422, f"{IDEMPOTENCY_HEADER}: 1-255 printable ASCII characters",
                                  param=IDEMPOTENCY_HEADER, code="invalid_value")
        canon = json.dumps({**body.model_dump(mode="json"), "tenant": tenant},
                           sort_keys=True, separators=(",", ":"))
        idem = {"key": key, "body": hashlib.sha256(canon.encode()).hexdigest()}
        seen = sched.idempotent_run(tenant or "default", key)
        if seen is not None:
            run, fingerprint = seen
            if fingerprint != idem["body"]:
                return error_response(
                    422, f"{IDEMPOTENCY_HEADER} {key!r} was used for another request body (run "
                    f"{run.run_id}); use a new key for a new request", param=IDEMPOTENCY_HEADER,
                    code="idempotency_key_reused")
            return JSONResponse(run.to_json(sched.now()), status_code=201,
                                headers={"Location": f"/v1/runs/{run.run_id}",
                                         "Idempotent-Replayed": "true"})
    shared = getattr(request.app.state, "idempotency", None)
    run_id = None
    if idem is not None and shared is not None:  # several edges: claim the key in the store
        run_id = new_run_id()
        try:
            held = shared.claim(tenant or "default", idem["key"], idem["body"], run_id)
        except StoreUnavailable as e:
            return error_response(503, f"{e}; retry later", code="store_unavailable",
                                  headers={"Retry-After": "1"})
        if held is not None:
            return _replay_shared(sched, idem, *held)
    refused = check_run_quota(request, tenant)
    if refused is None:
        try:
            run = sched.create_run(body.app, deadline_s=body.deadline_s, tenant=tenant,
                                   k=body.k, input=body.input, hosted=app is not None,
                                   idempotency=idem, run_id=run_id)
        except Exception:
            _drop_claim(shared, tenant, idem, run_id)
            raise
    else:
        _drop_claim(shared, tenant, idem, run_id)
        return refused
    if app is not None:
        sched.launch_hosted(run, app)
    return JSONResponse(run.to_json(sched.now()), status_code=201,
                        headers={"Location": f"/v1/runs/{run.run_id}"})


def _replay_shared(sched: Any, idem: dict[str, str], run_id: str, fingerprint: str) -> Response:
    """The answer to a request whose ``Idempotency-Key`` another request (maybe on another
    edge) claimed in the shared store: its run, 422 for another body, or 409 while that run
    is not visible here yet (its creation is in progress)."""
    key = idem["key"]
    if fingerprint != idem["body"]:
        return error_response(
            422, f"{IDEMPOTENCY_HEADER} {key!r} was used for another request body (run "
            f"{run_id}); use a new key for a new request", param=IDEMPOTENCY_HEADER,
            code="idempotency_key_reused")
    try:
        run = sched.get_run(run_id)
    except RunNotFound:
        return error_response(
            409, f"{IDEMPOTENCY_HEADER} {key!r}: the request that holds it (run {run_id}) "
            "is still being created; retry", param=IDEMPOTENCY_HEADER,
            code="idempotency_key_in_progress", headers={"Retry-After": "1"})
    return JSONResponse(run.to_json(sched.now()), status_code=201,
                        headers={"Location": f"/v1/runs/{run.run_id}",
                                 "Idempotent-Replayed": "true"})


def _drop_claim(shared: Any, tenant: str | None, idem: dict[str, str] | None,
                run_id: str | None) -> None:
    """Give up a claim whose run was not created (a retry may then create it)."""
    if shared is None or idem is None or run_id is None:
        return
    with contextlib.suppress(StoreUnavailable):
        shared.drop(tenant or "default", idem["key"], idem["body"], run_id)


@router.get("/v1/runs", tags=["runs"])
async def list_runs(request: Request, state: str | None = None, app: str | None = None,
                    limit: int = 100) -> dict[str, Any]:
    """Recent runs (newest first), optionally filtered by state and app."""
    sched = scheduler_of(request)
    now = sched.now()

    def match(run: LiveRun) -> bool:
        return not ((state and run.status != state) or (app and run.app != app)
                    or not visible(run.state.tenant))

    return {"runs": [{"run_id": run.run_id, "app": run.app, "state": run.status,
                      "submitted": run.state.submitted, "act_s": run.act_s(now)}
                     for run in sched.recent_runs(match, limit)]}


@router.get("/v1/runs/{run_id}", tags=["runs"])
async def get_run(run_id: str, request: Request) -> Response:
    sched = scheduler_of(request)
    try:
        run = sched.get_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(sched.now()))


@router.get("/v1/runs/{run_id}/timeline", tags=["runs"])
async def get_run_timeline(run_id: str, request: Request) -> Response:
    """The run's units, requests (queued, dispatched, first token, done) and tool calls on
    one time axis (:mod:`hermes.gateway.timeline`), and its trace id when tracing is on."""
    return run_timeline_response(run_id, request)


def run_timeline_response(run_id: str, request: Request) -> Response:
    sched = scheduler_of(request)
    try:
        run = sched.get_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    tracing = getattr(request.app.state, "tracing", None)
    tracer = tracing.tracer if tracing is not None else None
    return JSONResponse(run_timeline(run.to_json(sched.now()),
                                     tracer.trace_id(run_id) if tracer is not None else None))


@router.post("/v1/runs/{run_id}/finish", tags=["runs"])
async def finish_run(run_id: str, request: Request) -> Response:
    """The client's run is done: it is recorded and its app's PDGraph learns from it."""
    sched = scheduler_of(request)
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
    sched = scheduler_of(request)
    try:
        run = sched.cancel_run(run_id)
    except SchedulerError as e:
        return scheduler_error(e)
    return JSONResponse(run.to_json(sched.now()))


@router.post("/v1/runs/{run_id}/tools", tags=["runs"], openapi_extra={"requestBody": {
    "required": True, "content": {"application/json": {"schema": ToolCall.model_json_schema()}}}})
async def run_tool(run_id: str, request: Request) -> Response:
    """Run a tool call of the run on a node's tool runner; answers with its output. A client
    that goes away before the answer has the call cancelled at its node (its process group
    or container killed); the run goes on."""
    sched = scheduler_of(request)
    try:
        run = sched.active_run(run_id)  # the caller's run (404 otherwise) before its body
    except SchedulerError as e:
        return scheduler_error(e)
    try:
        body = ToolCall.model_validate(strict_json.loads(await request.body()))
    except strict_json.StrictJSONError as e:
        return error_response(400, f"body: {e}", code="invalid_json")
    except ValidationError as e:
        return validation_error(e, 422)
    if not sched.nodes:
        await sched.wait_for_nodes()
    if sched.no_tool_sandbox():
        return error_response(503, NO_SANDBOX, code="tool_sandbox_unavailable")
    try:
        run = sched.active_run(run_id)
        inv = sched.unit_for_request(run, body.unit, body.backend)
        req = await sched.submit_tool(run, inv, backend=body.backend, code=body.code,
                                      command=body.command, timeout_s=body.timeout_s)
        try:
            done = await sched.wait(req, timeout=body.timeout_s + 60.0)
        finally:
            sched.abandon(req)  # unanswered: its client went away, the node kills the call
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
    sched = scheduler_of(request)
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


@router.get("/readyz", tags=["health"])
async def readyz(request: Request) -> JSONResponse:
    """200 where traffic should go: a lone gateway once started; among elected schedulers
    (``[ha] election``) only the leader, so that a load balancer checking this path sends
    every request to it; 503 on a standby."""
    role = getattr(request.app.state, "ha", None)
    if role is None:
        return JSONResponse({"ready": True, "role": "all"})
    ready = role.ready()
    return JSONResponse({"ready": ready, **role.describe()}, status_code=200 if ready else 503)


@router.get("/healthz", tags=["health"])
async def healthz(request: Request) -> dict[str, Any]:
    sched = scheduler_of(request)
    role = getattr(request.app.state, "ha", None)
    return {
        "status": "ok" if sched.nodes else "degraded",
        "policy": sched.config.scheduler.policy,
        "nodes": {n.name: {"engines": {e.name: e.model for e in n.engines.values()},
                           "tools": n.tools} for n in sched.nodes.values()},
        "runs_active": sum(1 for r in sched.runs.values() if r.status in ACTIVE),
        "requests_pending": len(sched.requests),
        **sched.stats,
        **({"ha": role.describe()} if role is not None else {}),
    }
