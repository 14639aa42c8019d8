"""Dispatch: the requests the gateway has sent to nodes, from submission to result.

:class:`Dispatcher` turns an LLM request or tool call of a run into a
:class:`~hermes.gateway.state.PendingRequest` keyed by the policy
(``policy.request_key``: :func:`hermes.core.ordering.policy_key`), sends it (``submit`` /
``tool``) to the engine or tool node the node table picks, and settles it from the node's
messages (``done``, ``token``, ``tool_done``, ``failed``: retried with backoff when the node
says it may be). It re-keys queued requests when ranks change (``rekey``), cancels a stopping
run's requests at their nodes (``cancel``), and moves the work of a node that died elsewhere
(:meth:`Dispatcher.redispatch`). It is the one handler of every node message
(:meth:`Dispatcher.handle`): node bookkeeping goes to the node table, unit events to the run
registry, prewarm acks to the prewarm planner, and results for requests it does not know
(sent before a restart) to :attr:`Dispatcher.on_orphan` (recovery's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Set
from typing import Any, Literal

import msgspec

from hermes.core.ordering import policy_key
from hermes.core.pdgraph import next_llm_p
from hermes.core.routing import RouteRequest
from hermes.core.state import RequestView
from hermes.gateway.context import SchedulerContext
from hermes.gateway.errors import NoCapacity, RequestFailed, RunNotActive, SchedulerError
from hermes.gateway.nodes import NodeTable
from hermes.gateway.prefixes import prompt_prefixes
from hermes.gateway.prewarm import GatewayPrewarmer
from hermes.gateway.runs import RunObserver, RunRegistry, StopReason
from hermes.gateway.state import ACTIVE, LiveRun, PendingRequest, UnitInvocation, new_id
from hermes.gateway.waiting import wait_settled
from hermes.protocol import (
    Cancel,
    Done,
    EncodedBody,
    Failed,
    PrewarmAck,
    Rekey,
    Submit,
    Token,
    Tool,
    ToolDone,
    UnitEvent,
    estimate_tokens,
    max_output_tokens,
)

log = logging.getLogger("hermes.gateway.dispatch")


class Dispatcher(RunObserver):
    """Pending requests: submission, sending, results, re-keying, failover (module doc)."""

    def __init__(self, ctx: SchedulerContext, runs: RunRegistry, nodes: NodeTable,
                 prewarm: GatewayPrewarmer,
                 graphs: Callable[[str], Any | None] | None = None) -> None:
        self.ctx = ctx
        self.runs = runs
        self.nodes = nodes
        self.prewarm = prewarm
        #: app -> its current PDGraph (learning's), for the router's ``next_llm_p``
        self.graphs = graphs
        self.requests: dict[str, PendingRequest] = {}
        #: the same requests by tenant (policies whose keys read per-tenant state: key_scope)
        self._by_tenant: dict[str, dict[str, PendingRequest]] = {}
        #: takes a result for a request this gateway does not know (recovery sets it)
        self.on_orphan: Callable[[Done | ToolDone], object] | None = None
        #: told of every send (tracing on: :meth:`hermes.gateway.tracing.RunTracer.sent`)
        self.trace: Any | None = None
        #: split roles: takes a ``done``/``failed`` of a request sent outside this dispatcher
        #: (an edge's header-less call: :mod:`hermes.gateway.edge.direct`); True: taken
        self.external: Callable[[Done | Failed], bool] | None = None
        #: split roles: told when a node is gone (after this dispatcher moved its work)
        self.on_node_gone: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ submission
    def request_view(self, run: LiveRun, inv: UnitInvocation, rid: str, input_tokens: int,
                     max_tokens: int | None, now: float) -> RequestView:
        """What the policy keys a request by."""
        return RequestView(
            request_id=rid,
            run_id=run.run_id,
            unit=inv.unit,
            arrival=now,
            input_tokens=input_tokens,
            max_output_tokens=max_tokens,
            seq=next(self.ctx.seq),
        )

    async def submit_llm(
        self,
        run: LiveRun,
        inv: UnitInvocation,
        *,
        model: str,
        endpoint: Literal["chat", "completions", "embeddings"],
        body: dict[str, Any] | EncodedBody,
        stream: bool = False,
        native: dict[str, Any] | None = None,
        request_id: str | None = None,
        reply_to: str | None = None,
        prompt_tokens: int | None = None,
    ) -> PendingRequest:
        """Queue an LLM request of ``run`` (in ``inv``) at the least-loaded engine of ``model``
        (``native``: the request in the client's own API, :attr:`hermes.protocol.Submit.native`;
        ``request_id``: the id an edge chose, ``reply_to``: that edge's address, where the
        node sends the tokens and the answer, :attr:`hermes.protocol.Submit.reply_to`;
        ``prompt_tokens``: the edge's estimate, so the scheduler does not read the body;
        ``body`` an :class:`~hermes.protocol.EncodedBody`: an edge's, forwarded as it came)."""
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run.run_id!r} is {run.status}")
        if not self.nodes.nodes:
            await self.nodes.wait_for_nodes()
        return self.submit_llm_now(run, inv, model=model, endpoint=endpoint, body=body,
                                   stream=stream, native=native, request_id=request_id,
                                   reply_to=reply_to, prompt_tokens=prompt_tokens)

    def submit_llm_now(
        self,
        run: LiveRun,
        inv: UnitInvocation,
        *,
        model: str,
        endpoint: Literal["chat", "completions", "embeddings"],
        body: dict[str, Any] | EncodedBody,
        stream: bool = False,
        native: dict[str, Any] | None = None,
        request_id: str | None = None,
        reply_to: str | None = None,
        prompt_tokens: int | None = None,
    ) -> PendingRequest:
        """:meth:`submit_llm` without waiting for a node (none connected: the request
        fails with :class:`NoCapacity`): for a caller that runs in a loop callback rather than
        a task (an edge's call, :class:`hermes.gateway.edge.link.EdgeLink`), which costs a
        task per call less."""
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run.run_id!r} is {run.status}")
        now = self.ctx.now()
        rid = request_id or new_id("req-")
        encoded = body if isinstance(body, EncodedBody) else None
        if encoded is not None:  # an edge's: the scheduler never decodes it
            self.prewarm.note_prefix(run.app, inv.unit, encoded.prefix, run.state.tenant)
            max_tokens = encoded.max_tokens
            if prompt_tokens is None:
                prompt_tokens = estimate_tokens(endpoint, msgspec.json.decode(encoded.json))
        else:
            assert isinstance(body, dict)
            self.prewarm.note_request(run.app, inv.unit, body, run.state.tenant)
            max_tokens = max_output_tokens(body)
            if prompt_tokens is None:
                prompt_tokens = estimate_tokens(endpoint, body)
        view = self.request_view(run, inv, rid, prompt_tokens, max_tokens, now)
        key = policy_key(self.ctx.policy, run.state, view, now)
        fields: dict[str, Any] = dict(
            request_id=rid, run_id=run.run_id, unit=inv.unit, model=model, endpoint=endpoint,
            stream=stream, key=list(key), prompt_tokens=prompt_tokens, native=native,
            reply_to=reply_to,
        )
        msg = (Submit.with_json_body(body.json, **fields) if isinstance(body, EncodedBody)
               else Submit(body=body, **fields))
        req = PendingRequest(
            request_id=rid, run=run, inv=inv, kind="llm", msg=msg, view=view, key=key,
            future=asyncio.get_running_loop().create_future(), model=model,
            tokens=asyncio.Queue() if stream else None, sent_at=now,
        )
        self.register(req)
        self.send_llm(req)
        self.ctx.stats["llm_requests"] = self.ctx.stats.get("llm_requests", 0) + 1
        return req

    async def submit_tool(
        self,
        run: LiveRun,
        inv: UnitInvocation,
        *,
        backend: str,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
    ) -> PendingRequest:
        """Queue a tool call of ``run`` at a node's tool runner, ordered by the run's rank."""
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run.run_id!r} is {run.status}")
        if not self.nodes.nodes:
            await self.nodes.wait_for_nodes()
        now = self.ctx.now()
        rid = new_id("tool-")
        view = self.request_view(run, inv, rid, 0, None, now)
        key = policy_key(self.ctx.policy, run.state, view, now)
        msg = Tool(
            request_id=rid, run_id=run.run_id, unit=inv.unit, backend=backend, code=code,
            command=command, timeout_s=timeout_s, key=list(key),
        )
        req = PendingRequest(
            request_id=rid, run=run, inv=inv, kind="tool", msg=msg, view=view, key=key,
            future=asyncio.get_running_loop().create_future(), sent_at=now,
        )
        self.register(req)
        self.send_tool(req)
        return req

    def register(self, req: PendingRequest) -> None:
        """Track ``req`` as pending (by id, by tenant, in its run and invocation)."""
        self.requests[req.request_id] = req
        self._by_tenant.setdefault(req.run.state.tenant, {})[req.request_id] = req
        req.run.pending[req.request_id] = req
        req.inv.requests.append(req)
        req.run.last_activity = time.monotonic()

    def send_llm(self, req: PendingRequest, exclude: Set[str] = frozenset()) -> None:
        try:
            route = self._route(req)
            prompt = ((req.msg.endpoint, req.msg.engine_body())
                      if route.prefixes and isinstance(req.msg, Submit) else None)
            node, engine = self.nodes.pick_engine(req.model or "", exclude, route, prompt)
        except NoCapacity as e:
            self.fail_request(req, e)
            return
        req.node, req.engine = node.name, engine.name
        assert isinstance(req.msg, Submit)
        req.msg.engine = engine.name
        req.msg.key = list(req.key)
        node.outstanding[engine.name] = node.outstanding.get(engine.name, 0) + 1
        if self.trace is not None:
            self.trace.sent(req)
        self.nodes.send(node, req.msg)

    def _route(self, req: PendingRequest) -> RouteRequest:
        """What the router knows of ``req``: its run and, for a router that reads them, its
        prompt's prefixes (:mod:`hermes.gateway.prefixes`)."""
        msg = req.msg
        if self.nodes.router.name == "least-loaded" or not isinstance(msg, Submit):
            return RouteRequest(req.run.run_id)
        prefixes = prompt_prefixes(msg.endpoint, msg.engine_body())
        return RouteRequest(req.run.run_id, prefixes,
                            prefixes[-1][1] if prefixes else 0,
                            self._next_llm_p(req.run.app, req.inv.unit))

    def _next_llm_p(self, app: str, unit: str) -> float:
        """Will the run prompt an engine again after this unit? (:func:`hermes.core.pdgraph.
        next_llm_p` on the app's current PDGraph.)"""
        return next_llm_p(self.graphs(app) if self.graphs is not None else None, unit)

    def send_tool(self, req: PendingRequest, exclude: Set[str] = frozenset()) -> None:
        assert isinstance(req.msg, Tool)
        try:
            node = self.nodes.pick_tool_node(req.msg.backend, exclude)
        except NoCapacity as e:
            self.fail_request(req, e)
            return
        req.node = node.name
        req.msg.key = list(req.key)
        node.tools_outstanding += 1
        if self.trace is not None:
            self.trace.sent(req)
        self.nodes.send(node, req.msg)

    # ------------------------------------------------------------------ waiting
    async def wait(self, req: PendingRequest, timeout: float | None = None) -> Done | ToolDone:
        """Wait for a request's result; raises RequestFailed / RunCancelled / RunNotActive."""
        t = timeout if timeout is not None else self.ctx.config.scheduler.request_timeout_s
        try:
            await wait_settled(req, t)
        except TimeoutError:
            err = f"request {req.request_id} timed out after {t} s"
            self.cancel_request(req, RequestFailed(err))
            raise RequestFailed(err) from None
        return req.future.result()

    async def stream(self, req: PendingRequest, timeout: float | None = None) -> AsyncIterator[Token]:
        """The streamed chunks (the node's :class:`~hermes.protocol.Token` messages, the
        engine's chunk object in each) of a request submitted with ``stream=True``. No chunk
        for ``timeout`` s (default ``scheduler.request_timeout_s``, the limit a request that
        does not stream has in all) cancels the request at its node and raises
        :class:`RequestFailed`: an engine that stops producing must not hold the client for
        ever."""
        tokens = req.tokens
        assert tokens is not None
        t = timeout if timeout is not None else self.ctx.config.scheduler.request_timeout_s
        while True:
            # per chunk: a chunk already queued is taken at once, and only an empty queue arms
            # the timer (asyncio.wait_for made a task per chunk: ~8 us each)
            if not tokens.empty():
                item = tokens.get_nowait()
            else:
                try:
                    async with asyncio.timeout(t):
                        item = await tokens.get()
                except TimeoutError:
                    what = "its first output" if not req.streamed else "more output"
                    err = RequestFailed(f"request {req.request_id}: no {what} for {t:g} s "
                                        "(scheduler.request_timeout_s)")
                    self.cancel_request(req, err)
                    raise err from None
            if item is None:
                break
            yield item
        if req.future.done() and req.future.exception() is not None:
            raise req.future.exception()  # type: ignore[misc]

    def abandon(self, req: PendingRequest) -> bool:
        """The client went away: cancel the request at its node, unless it has ended (its
        future settled). Whether it had not: a handler calls this as it ends, answered or not
        (its task cancelled when its client goes away: :mod:`hermes.gateway.disconnect`), and
        does the rest of a client's leaving only when this says so."""
        if req.future.done():
            return False
        if req.request_id in self.requests:
            self.cancel_request(req, RunNotActive("client disconnected"))
        return True

    # ------------------------------------------------------------------ completion
    def _release_slot(self, req: PendingRequest) -> None:
        node = self.nodes.nodes.get(req.node or "")
        if node is not None:
            if req.kind == "llm" and req.engine:
                node.outstanding[req.engine] = max(0, node.outstanding.get(req.engine, 0) - 1)
            elif req.kind == "tool":
                node.tools_outstanding = max(0, node.tools_outstanding - 1)

    def _untrack(self, req: PendingRequest) -> None:
        self.requests.pop(req.request_id, None)
        same = self._by_tenant.get(req.run.state.tenant)
        if same is not None:
            same.pop(req.request_id, None)
            if not same:
                del self._by_tenant[req.run.state.tenant]
        req.run.pending.pop(req.request_id, None)
        self._release_slot(req)
        req.finished_at = self.ctx.now()
        req.run.last_activity = time.monotonic()

    def cancel_request(self, req: PendingRequest, exc: SchedulerError) -> None:
        """Cancel ``req`` at its node and fail it with ``exc``."""
        node = self.nodes.nodes.get(req.node or "")
        if node is not None and req.request_id in self.requests:
            self.nodes.send(node, Cancel(request_ids=[req.request_id]))
        self.fail_request(req, exc)

    def fail_request(self, req: PendingRequest, exc: SchedulerError) -> None:
        self._untrack(req)
        req.error = str(exc)
        req.settle(exc=exc)
        if req.tokens is not None:
            req.tokens.put_nowait(None)
        self.runs.request_done(req.run, req.inv)

    def _on_done(self, msg: Done) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        self._untrack(req)
        req.result = msg
        if not req.run.hosted:
            # the body (the whole conversation so far) is never sent again: a long-lived run
            # (an inferred agent run of many turns) keeps no prompts (hosted calls keep theirs
            # for the journal)
            req.msg = None
        if self.ctx.metrics is not None:
            self.ctx.metrics.on_request_done(req.node, msg.engine, msg.queue_s, msg.service_s)
        run, now = req.run, self.ctx.now()
        service = self.ctx.cost.request_service_s(msg.input_tokens, msg.output_tokens)
        self.runs.credit(run, max(0.0, service - req.credited_s),
                         msg.input_tokens + msg.output_tokens, now,
                         closing=self.runs.closes_with(run, req.inv))
        if req.tokens is not None:
            req.tokens.put_nowait(None)
        req.settle(msg)
        self.runs.request_done(req.run, req.inv)

    def _on_token(self, msg: Token) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        if req.tokens is not None:
            req.tokens.put_nowait(msg)
            req.streamed = True
        if msg.n_tokens:
            # decode service of these tokens alone (the rest is credited when the request is done)
            cost = self.ctx.cost
            s = msg.n_tokens * (cost.base_s + cost.decode_s_per_seq)
            req.credited_s += s
            self.runs.credit(req.run, s, msg.n_tokens, self.ctx.now())

    def _on_tool_done(self, msg: ToolDone) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        self._untrack(req)
        req.result = msg
        if self.ctx.metrics is not None and isinstance(req.msg, Tool):
            self.ctx.metrics.on_tool_done(req.msg.backend, msg.duration_s, msg.cold)
        req.inv.duration_s = (req.inv.duration_s or 0.0) + msg.duration_s
        self.runs.credit(req.run, msg.duration_s, 0, self.ctx.now(),
                         closing=self.runs.closes_with(req.run, req.inv))
        req.settle(msg)
        self.runs.request_done(req.run, req.inv)

    def _on_failed(self, msg: Failed) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        if msg.retryable and req.streamed:
            # a resend would stream the start of the answer to the client a second time
            self.fail_request(req, RequestFailed(
                f"{msg.error} (not retried: part of the answer was already streamed)"))
            return
        if msg.retryable and req.retries < self.ctx.config.scheduler.max_retries:
            req.retries += 1
            self._release_slot(req)
            exclude = {req.node} if req.node and len(self.nodes.nodes) > 1 else set()
            resend = self.send_llm if req.kind == "llm" else self.send_tool
            delay = min(2.0, 0.1 * 2 ** (req.retries - 1))  # backoff: 0.1, 0.2, 0.4 ... 2 s

            def _retry() -> None:
                if req.request_id in self.requests:  # not cancelled meanwhile
                    resend(req, exclude)

            asyncio.get_running_loop().call_later(delay, _retry)
            return
        exc = RequestFailed(msg.error)
        if msg.status is not None and 400 <= msg.status < 500:
            exc.status = msg.status
            exc.code = "invalid_request"
        self.fail_request(req, exc)

    # ------------------------------------------------------------------ node messages
    def handle(self, identity: bytes, msg: Any) -> None:
        """One node message (see the module docstring)."""
        self.nodes.observe(identity, msg)
        if (self.external is not None and isinstance(msg, Done | Failed)
                and msg.request_id not in self.requests and self.external(msg)):
            return
        if isinstance(msg, Done | ToolDone) and msg.request_id not in self.requests:
            if self.on_orphan is not None:
                self.on_orphan(msg)  # a result from before a restart (issue 7)
        if isinstance(msg, Done):
            self._on_done(msg)
        elif isinstance(msg, Token):
            self._on_token(msg)
        elif isinstance(msg, ToolDone):
            self._on_tool_done(msg)
        elif isinstance(msg, Failed):
            self._on_failed(msg)
        elif isinstance(msg, UnitEvent):
            run = self.runs.runs.get(msg.run_id)
            if run is not None and run.status in ACTIVE:
                self.runs.unit_event(run, msg.unit, msg.event)
        elif isinstance(msg, PrewarmAck):
            log.debug("prewarm ack %s", msg)
            self.prewarm.on_ack(msg)

    # ------------------------------------------------------------------ run events
    def run_stopping(self, run: LiveRun, reason: StopReason) -> None:
        """A run ends: queued requests are dropped and in-flight ones aborted at the nodes."""
        for req in list(run.pending.values()):
            self.cancel_request(req, reason())

    def ranks_changed(self, run: LiveRun, now: float) -> None:
        self._rekey_run(run, now)

    # ------------------------------------------------------------------ ranks -> keys
    def _rekey_run(self, run: LiveRun, now: float) -> None:
        """Re-key the queued requests whose keys ``run``'s new state can change: its own, or
        its tenant's when keys read per-tenant state (VTC: O(the tenant's queue), not
        O(every queued request), per completion), or all (``policy.key_scope``)."""
        scope = self.ctx.policy.key_scope
        if scope == "all":
            self.rekey_all()
            return
        reqs = run.pending if scope == "run" else self._by_tenant.get(run.state.tenant, {})
        changes: dict[str, dict[str, list[float]]] = {}
        for req in reqs.values():  # re-keying changes keys, not membership
            self._recompute(req, now, changes)
        self._send_rekeys(changes)

    def _recompute(self, req: PendingRequest, now: float,
                   changes: dict[str, dict[str, list[float]]]) -> None:
        key = policy_key(self.ctx.policy, req.run.state, req.view, now)
        if key != req.key:
            req.key = key
            if req.node:
                changes.setdefault(req.node, {})[req.request_id] = list(key)

    def _send_rekeys(self, changes: dict[str, dict[str, list[float]]]) -> None:
        for node_name, keys in changes.items():
            node = self.nodes.nodes.get(node_name)
            if node is not None and keys:
                self.nodes.send(node, Rekey(keys=keys))
                self.ctx.stats["rekeys_sent"] += len(keys)

    def rekey_all(self) -> None:
        """Recompute every queued request's key (policies whose keys depend on other runs)."""
        now = self.ctx.now()
        changes: dict[str, dict[str, list[float]]] = {}
        for req in list(self.requests.values()):
            self._recompute(req, now, changes)
        self._send_rekeys(changes)

    # ------------------------------------------------------------------ node faults
    def redispatch(self, node_name: str) -> None:
        """A node died: requests it had queued (as of its last report) are sent to other
        nodes; an LLM request that was in flight is retried once, a second loss fails it (one
        that had streamed part of its answer is not retried: the client would get it twice); a
        tool call that was (or may have been) running fails with a reason rather than run
        twice (tool code may have side effects)."""
        held = self.nodes.held
        seen: dict[str, int] = {}
        for req in list(self.requests.values()):
            if req.node != node_name:
                continue
            state = held.get(req.request_id, (node_name, "unknown"))[1]
            seen[state] = seen.get(state, 0) + 1
            req.node = None
            if state == "queued":
                (self.send_llm if req.kind == "llm" else self.send_tool)(req)
            elif req.kind == "llm" and req.streamed:
                self.fail_request(req, RequestFailed(
                    f"request {req.request_id} was streaming on node {node_name!r} when it "
                    "died; not retried (part of the answer was already streamed)"))
            elif req.kind == "llm" and req.fault_retries < 1:
                req.fault_retries = 1
                self.ctx.stats["resent"] = self.ctx.stats.get("resent", 0) + 1
                self.send_llm(req)
            elif req.kind == "llm":
                self.fail_request(req, RequestFailed(
                    f"request {req.request_id} was in flight on node {node_name!r} when it died, "
                    "for the second time; not retried again"))
            else:
                self.fail_request(req, RequestFailed(
                    f"tool call {req.request_id} was running on node {node_name!r} when it died; "
                    "tool calls are not retried (they may have side effects)"))
        for rid in [r for r, (n, _) in held.items() if n == node_name]:
            del held[rid]
        log.warning("node %s gone: its requests by last reported state %s", node_name, seen)
        if self.on_node_gone is not None:
            self.on_node_gone(node_name)

