"""Which run and unit an OpenAI request belongs to, from its ``X-Hermes-*`` headers.

- ``X-Hermes-Run: RUN_ID`` (from ``POST /v1/runs``) and ``X-Hermes-Unit: UNIT`` (the unit the
  request belongs to, e.g. ``verify_claims``; default ``default``);
- ``X-Hermes-App: APP`` without a run: a run of ``APP`` is created and its id returned in the
  ``X-Hermes-Run`` response header (finish it with ``POST /v1/runs/{id}/finish``, or it is
  finished after ``run_idle_timeout_s`` without requests);
- no header: the request is a one-unit run of app ``default``, finished once its answer has
  left (:func:`finish_after_response`);
- for a run created by the request (``X-Hermes-App``, or none): ``X-Hermes-K: 0.3`` its
  prewarming knob K (0..1; the run's own, ahead of the tenant's, app's and default K) and
  ``X-Hermes-Deadline-S: 30`` its deadline in seconds from now (as ``k`` and ``deadline_s``
  of ``POST /v1/runs``); a bad value is a 400 that names the header.

Every OpenAI endpoint (chat, completions, embeddings, responses) binds its requests here: the
one place a run resolver (runs inferred from header-less traffic) takes over. The life of
such a bound call is here too, once for every endpoint (:class:`BoundCall`): queue it
(:func:`submit_call`), wait for its result (:func:`wait_call`) or stream it, answer with the
run headers (:func:`answer`), and end a one-request run as its call ends
(:func:`call_ended`, :func:`call_abandoned`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from hermes.gateway.api.run_params import parse_deadline_s, parse_knob
from hermes.gateway.auth import tenant_for
from hermes.gateway.errors import SchedulerError
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.state import LiveRun, PendingRequest
from hermes.protocol import Done

RUN_HEADER = "X-Hermes-Run"
UNIT_HEADER = "X-Hermes-Unit"
APP_HEADER = "X-Hermes-App"
K_HEADER = "X-Hermes-K"
DEADLINE_HEADER = "X-Hermes-Deadline-S"
DEFAULT_APP = "default"
DEFAULT_UNIT = "default"


async def bind_run(sched: LiveScheduler, request: Request) -> tuple[LiveRun, str]:
    """The run and unit a request belongs to, from its headers (see the module docstring)."""
    h = request.headers
    unit = h.get(UNIT_HEADER) or DEFAULT_UNIT
    run_id = h.get(RUN_HEADER)
    if run_id:
        return sched.active_run(run_id), unit
    app = h.get(APP_HEADER)
    k = _run_header(h, K_HEADER, parse_knob)
    deadline_s = _run_header(h, DEADLINE_HEADER, parse_deadline_s)
    tenant = tenant_for(request, h.get("X-Hermes-Tenant"))
    if app:
        return sched.create_run(app, tenant=tenant, k=k, deadline_s=deadline_s), unit
    return sched.create_run(DEFAULT_APP, tenant=tenant, k=k, deadline_s=deadline_s,
                            auto_finish=True), unit


def _run_header(h: Any, name: str, parse: Callable[[str], float]) -> float | None:
    """A header setting a parameter of the run the request creates (``None`` when absent),
    validated as the same field of ``POST /v1/runs`` is (:mod:`hermes.gateway.api.run_params`)."""
    raw = h.get(name)
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError as e:
        raise SchedulerError(f"header {name}: {e}, got {raw!r}") from None


async def finish_after_response(sched: LiveScheduler, run: LiveRun) -> None:
    """End a one-request run (no Hermes headers) once its answer has left.

    Finishing a run writes its record and durable document, learns from it and updates the
    metrics: work the client need not wait for (at concurrency 1 it was a fifth of the
    latency the gateway added). The answer is written first; the ``sleep(0)`` lets the
    coalesced write (:mod:`hermes.gateway.api.httpproto`) leave before the bookkeeping runs, which
    is still before the loop polls for the client's next request, so a ``GET /v1/runs/{id}``
    sent after the answer sees the run finished. One-request runs are stored when they end,
    so it is this write that moves after the answer (there is nothing in such a run to
    resume); a run left active by a failure here is finished by the idle sweep."""
    await asyncio.sleep(0)
    if run.status in ("queued", "running"):
        sched.finish_run(run.run_id)


@dataclass(slots=True)
class BoundCall:
    """One LLM call of the OpenAI edge: the run and unit it is bound to, and its request."""

    run: LiveRun
    unit: str
    req: PendingRequest

    @property
    def headers(self) -> dict[str, str]:
        """The run headers every answer carries (a run the request created is named here)."""
        return {RUN_HEADER: self.run.run_id, UNIT_HEADER: self.unit}


async def submit_call(sched: LiveScheduler, request: Request, *, model: str,
                      endpoint: Literal["chat", "completions", "embeddings"],
                      body: dict[str, Any], stream: bool = False,
                      task: str = "generate") -> BoundCall:
    """Resolve the model (for ``task``), bind the request to its run and unit, open its unit
    invocation and queue it by the run's rank. A :class:`SchedulerError` fails the
    one-request run the request created (if it got that far) and propagates."""
    run: LiveRun | None = None
    try:
        served = await sched.serving_model(model, strict=True, task=task)
        run, unit = await bind_run(sched, request)
        inv = sched.unit_for_request(run, unit, f"llm:{served}")
        req = await sched.submit_llm(run, inv, model=served, endpoint=endpoint, body=body,
                                     stream=stream)
    except SchedulerError as e:
        if run is not None and run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        raise
    return BoundCall(run, unit, req)


async def wait_call(sched: LiveScheduler, call: BoundCall) -> Done:
    """The result of a call that is not streamed. A :class:`SchedulerError` fails a
    one-request run and propagates; a client that went away (the task is cancelled) has its
    request abandoned at its node."""
    try:
        done = await sched.wait(call.req)
    except SchedulerError as e:
        if call.run.auto_finish:
            sched.fail_run(call.run.run_id, str(e))
        raise
    finally:
        if not call.req.future.done():
            sched.abandon(call.req)
    assert isinstance(done, Done)
    return done


def answer(sched: LiveScheduler, call: BoundCall, content: dict[str, Any]) -> JSONResponse:
    """The JSON answer of a call, with its run headers; a one-request run is finished once
    the answer has left (:func:`finish_after_response`)."""
    response = JSONResponse(content, headers=call.headers)
    if call.run.auto_finish:
        response.background = BackgroundTask(finish_after_response, sched, call.run)
    return response


def call_ended(sched: LiveScheduler, call: BoundCall, error: str | None = None) -> None:
    """A streamed call's last event has left: finish its one-request run (failed with
    ``error`` when the call failed)."""
    run = call.run
    if not run.auto_finish:
        return
    if error is not None:
        sched.fail_run(run.run_id, error)
    elif run.status in ("queued", "running"):
        sched.finish_run(run.run_id)


def call_abandoned(sched: LiveScheduler, call: BoundCall) -> None:
    """The client of a streamed call went away mid-stream: cancel the request at its node
    and fail its one-request run."""
    sched.abandon(call.req)
    if call.run.auto_finish:
        sched.fail_run(call.run.run_id, "client disconnected")
