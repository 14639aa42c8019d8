"""Which run and unit an OpenAI request belongs to, and the life of such a bound call.

Binding is the run identities service's (:mod:`hermes.gateway.identity`, the run resolver):

- ``X-Hermes-Run: RUN_ID`` (from ``POST /v1/runs``) and ``X-Hermes-Unit: UNIT`` (the unit the
  request belongs to, e.g. ``verify_claims``; default ``default``): that run, as named;
- ``X-Hermes-Run: none``: opt out, a one-request run of app ``default`` (or ``X-Hermes-App``),
  finished once its answer has left (:func:`finish_after_response`); so is every request
  without a run header when ``[identity] infer = false``;
- otherwise the run is **inferred** from the traffic (:mod:`hermes.gateway.resolve`): the
  run of the response named by ``previous_response_id``, of the session id the client sends,
  or of the conversation the request continues, else a new run; its app from the request's
  instructions, tools and model (or ``X-Hermes-App``), its unit from the prompt template (or
  ``X-Hermes-Unit``). An inferred run closes when idle past its app's usual gaps;
- for a run created by the request: ``X-Hermes-K: 0.3`` its prewarming knob K (0..1; the
  run's own, ahead of the tenant's, app's and default K) and ``X-Hermes-Deadline-S: 30`` its
  deadline in seconds from now (as ``k`` and ``deadline_s`` of ``POST /v1/runs``); a bad
  value is a 400 that names the header.

Every answer carries ``X-Hermes-Run`` and ``X-Hermes-Unit`` (and ``X-Hermes-App`` for an
inferred run): the run and unit the request was put in. Embeddings are bound by their headers
only (no inference: a vector has no conversation to continue).

Every OpenAI endpoint (chat, completions, embeddings, responses) binds its requests here, and
the life of such a bound call is here too, once for every endpoint (:class:`BoundCall`): queue
it (:func:`submit_call`), wait for its result (:func:`wait_call`) or stream it, answer with
the run headers (:func:`answer`, which also tells the resolver the reply so that the next
turn finds its run; :func:`call_answered` for a stream), and end a one-request run as its
call ends (:func:`call_ended`, :func:`call_abandoned`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from hermes.gateway.api.apps_api import foreign_app
from hermes.gateway.api.json_response import AnswerResponse
from hermes.gateway.api.run_params import parse_deadline_s, parse_knob
from hermes.gateway.auth import tenant_for
from hermes.gateway.errors import SchedulerError
from hermes.gateway.resolve import Identity
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.state import LiveRun, PendingRequest
from hermes.protocol import Done

RUN_HEADER = "X-Hermes-Run"
UNIT_HEADER = "X-Hermes-Unit"
APP_HEADER = "X-Hermes-App"
K_HEADER = "X-Hermes-K"
DEADLINE_HEADER = "X-Hermes-Deadline-S"
DEFAULT_TENANT = "default"


async def bind_run(sched: LiveScheduler, request: Request, body: Mapping[str, Any] | None = None,
                   *, messages: Sequence[Any] | None = None,
                   infer: bool = True) -> tuple[LiveRun, Identity]:
    """The run a request belongs to and its identity (unit: ``identity.unit``); see the
    module docstring. ``body``: the request as the client sent it (evidence for the
    resolver); ``messages``: its chat form when the edge has it; ``infer=False``: headers
    only (a request without ``X-Hermes-Run`` is a one-request run)."""
    h = request.headers
    k, deadline_s = run_params(h)
    tenant = tenant_for(request, h.get("X-Hermes-Tenant")) or DEFAULT_TENANT
    check_app_header(h, tenant)
    headers: Mapping[str, str] = h
    if not infer and RUN_HEADER not in h:
        headers = {**h, RUN_HEADER: "none"}
    return sched.identities.bind(tenant, body or {}, headers, messages=messages, k=k,
                                 deadline_s=deadline_s)


def run_params(h: Mapping[str, str]) -> tuple[float | None, float | None]:
    """``(k, deadline_s)`` of the run a request creates, from ``X-Hermes-K`` and
    ``X-Hermes-Deadline-S`` (None where absent); a bad value raises :class:`SchedulerError`
    (400) naming the header. (The all-in-one gateway and an edge,
    :mod:`hermes.gateway.edge.front`, check them here.)"""
    return _run_header(h, K_HEADER, parse_knob), _run_header(h, DEADLINE_HEADER, parse_deadline_s)


def check_app_header(h: Mapping[str, str], tenant: str) -> None:
    """Raise :class:`AppNotOwned` (403) when ``X-Hermes-App`` names another tenant's own app
    (authentication on: :func:`~hermes.gateway.api.apps_api.foreign_app`)."""
    named = h.get(APP_HEADER)
    if named and foreign_app(named.strip()):
        raise AppNotOwned(f"header {APP_HEADER}: app {named.strip()!r} is another tenant's "
                          f"(a tenant's own apps are named '{tenant}.NAME')")


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


class AppNotOwned(SchedulerError):
    """A request naming another tenant's own app (``X-Hermes-App``): 403, as ``POST
    /v1/runs`` answers."""

    status = 403
    code = "app_not_owned"
    param = APP_HEADER


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
    """One LLM call of the OpenAI edge: the run and unit it is bound to, its request, and the
    identity the resolver gave it (told the reply, or the failure, when the call ends)."""

    run: LiveRun
    identity: Identity
    req: PendingRequest

    @property
    def unit(self) -> str:
        return self.identity.unit

    @property
    def headers(self) -> dict[str, str]:
        """The run headers every answer carries (a run the request created is named here)."""
        out = {RUN_HEADER: self.run.run_id, UNIT_HEADER: self.identity.unit}
        if self.run.inferred:
            out[APP_HEADER] = self.run.app
        return out

    @property
    def wants_reply(self) -> bool:
        """The resolver indexes this call's reply (streams then keep the reply's text)."""
        return self.identity.conversation is not None


async def submit_call(sched: LiveScheduler, request: Request, *, model: str,
                      endpoint: Literal["chat", "completions", "embeddings"],
                      body: dict[str, Any], stream: bool = False,
                      task: str = "generate", client_body: Mapping[str, Any] | None = None,
                      messages: Sequence[Any] | None = None,
                      native: dict[str, Any] | None = None) -> BoundCall:
    """Resolve the model (for ``task``), bind the request to its run and unit, open its unit
    invocation and queue it by the run's rank. ``client_body``: the body as the client sent
    it, when ``body`` (what the engine gets) differs (the Responses API), and ``messages`` its
    chat form; ``native``: the request in the client's API for an engine that serves it
    itself (:attr:`hermes.protocol.Submit.native`). A :class:`SchedulerError` fails the
    one-request run the request created (if it got that far) and propagates."""
    run: LiveRun | None = None
    ident: Identity | None = None
    try:
        served = await sched.serving_model(model, strict=True, task=task)
        run, ident = await bind_run(sched, request, body if client_body is None else client_body,
                                    messages=messages, infer=endpoint != "embeddings")
        inv = sched.unit_for_request(run, ident.unit, f"llm:{served}")
        req = await sched.submit_llm(run, inv, model=served, endpoint=endpoint, body=body,
                                     stream=stream, native=native)
    except SchedulerError as e:
        if ident is not None:
            sched.identities.abandoned(ident)
        if run is not None and run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        raise
    return BoundCall(run, ident, req)


async def wait_call(sched: LiveScheduler, call: BoundCall) -> Done:
    """The result of a call that is not streamed. A :class:`SchedulerError` fails a
    one-request run and propagates; a client that went away (the task is cancelled:
    :mod:`hermes.gateway.disconnect`) has its request cancelled at its node and its
    one-request run failed."""
    try:
        done = await sched.wait(call.req)
    except SchedulerError as e:
        sched.identities.abandoned(call.identity)
        if call.run.auto_finish:
            sched.fail_run(call.run.run_id, str(e))
        raise
    finally:
        if sched.abandon(call.req):  # unanswered: the task was cancelled, its client went away
            sched.identities.abandoned(call.identity)
            if call.run.auto_finish:
                sched.fail_run(call.run.run_id, "client disconnected")
    assert isinstance(done, Done)
    return done


def chat_replies(content: Mapping[str, Any]) -> list[Any]:
    """The assistant message of every choice of a chat completion object."""
    choices = content.get("choices")
    return [c.get("message") for c in choices if isinstance(c, dict)] \
        if isinstance(choices, list) else []


def answer(sched: LiveScheduler, call: BoundCall, content: dict[str, Any], *,
           replies: Any = None, response_id: str | None = None) -> JSONResponse:
    """The JSON answer of a call, with its run headers. The resolver is told the reply
    (``replies``: the assistant message of each choice; ``response_id``: a Responses API id)
    before the answer leaves, so that the client's next turn finds the run; a one-request
    run is finished once the answer has left (:func:`finish_after_response`)."""
    sched.identities.answered(call.identity, replies, response_id=response_id)
    _forget_reply(call)
    response = AnswerResponse(content, headers=call.headers)
    if call.run.auto_finish:
        response.background = BackgroundTask(finish_after_response, sched, call.run)
    return response


def call_answered(sched: LiveScheduler, call: BoundCall, replies: Any = None, *,
                  response_id: str | None = None) -> None:
    """A streamed call's reply is complete: tell the resolver (before the stream's last event
    leaves, so that the client's next turn finds the run)."""
    sched.identities.answered(call.identity, replies, response_id=response_id)
    _forget_reply(call)


def _forget_reply(call: BoundCall) -> None:
    """The reply has been given: the run keeps the request's accounting, not its text (a
    long-lived inferred run would otherwise hold every answer it was given)."""
    done = call.req.result
    if isinstance(done, Done):
        done.response = None
        done.text = ""


def call_ended(sched: LiveScheduler, call: BoundCall, error: str | None = None) -> None:
    """A streamed call's last event has left: finish its one-request run (failed with
    ``error`` when the call failed; the resolver is then told the request was abandoned)."""
    if error is not None:
        sched.identities.abandoned(call.identity)
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
    sched.identities.abandoned(call.identity)
    if call.run.auto_finish:
        sched.fail_run(call.run.run_id, "client disconnected")
