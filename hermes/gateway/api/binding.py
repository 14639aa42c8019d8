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
one place a run resolver (runs inferred from header-less traffic) takes over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request

from hermes.gateway.api.run_params import parse_deadline_s, parse_knob
from hermes.gateway.auth import tenant_for
from hermes.gateway.errors import SchedulerError
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.state import LiveRun

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
