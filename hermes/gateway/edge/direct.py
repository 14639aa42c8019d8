"""The scheduler's fast path for an edge's header-less calls: ranked, routed, sent, settled.

A call without ``X-Hermes-Run`` or ``X-Hermes-App`` is a one-request run of app
``default``: nothing to resume, nothing a client can look up (its id is never shown),
nothing the PDGraph learns from (``default`` has none). Making it a full run (the registry,
its unit, its record, the finished-runs history) cost the active scheduler most of its
~0.7 ms per request, measured, and the scheduler's CPU per request bounds the whole cluster.
So :class:`DirectCalls` keeps only what the **global ordering** needs, once per call:

- the **key** from the policy, as a fresh run of its tenant's ``default`` app would get
  (``policy.request_key`` of a new :class:`~hermes.core.state.RunState` carrying the rank
  such a run gets, which the policy computes at most every :attr:`RANK_TTL_S` per tenant);
- the **engine** from the node table's router (the load it counts, as for every request);
- one ``submit`` to the node, stamped with the lease epoch and fenced like every send, with
  ``reply_to`` = the edge: tokens and the answer go there, the scheduler gets the counts;
- the **settling**: the node answers the edge alone (``reply_only``); the edge reports the
  call settled with its next call (:class:`~hermes.gateway.edge.wire.Settled`), which frees
  the engine slot (a call no node holds any more and no edge reported, its edge having died,
  is dropped by :meth:`DirectCalls.sweep`); a retryable ``failed`` is
  sent again elsewhere (as :class:`~hermes.gateway.dispatch.Dispatcher` retries), a final
  one is told to the edge; a node that dies has its calls sent again once.

Calls with run or app headers take the full path (:mod:`hermes.gateway.edge.link`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes.core.ordering import policy_key
from hermes.core.routing import RouteRequest
from hermes.core.state import RequestView, RunState
from hermes.gateway.edge import wire
from hermes.gateway.errors import NoCapacity, RequestFailed, SchedulerError
from hermes.gateway.prefixes import prompt_prefixes
from hermes.protocol import Cancel, Done, Failed, Submit, max_output_tokens

log = logging.getLogger("hermes.gateway.edge")

#: the app of a call without headers (a one-request run, as the all-in-one gateway names it)
DEFAULT_APP = "default"


@dataclass(slots=True)
class DirectCall:
    """A call sent to a node and not settled: whom to tell, where it is, what to resend."""

    edge: bytes
    msg: Submit
    node: str = ""
    engine: str = ""
    retries: int = 0
    fault_retries: int = 0
    sent_at: float = 0.0  # monotonic


class DirectCalls:
    """Header-less calls of edges, from message to settled (module doc)."""

    #: how long (scheduler seconds) a tenant's fresh-run rank is reused
    RANK_TTL_S = 0.1

    def __init__(self, sched: Any, tell: Callable[[bytes, wire.SchedulerMessage], None]) -> None:
        self.sched = sched
        self.nodes = sched.node_table
        self.ctx = sched.ctx
        self.tell = tell
        self.calls: dict[str, DirectCall] = {}
        self._ranks: dict[str, tuple[float, float]] = {}  # tenant -> (rank, computed at)
        self.stats = {"sent": 0, "done": 0, "failed": 0, "retried": 0}

    # ------------------------------------------------------------------ intake
    def take(self, edge: bytes, c: wire.Call) -> None:
        """Rank, route and send ``c`` (raises :class:`SchedulerError` when it cannot)."""
        model = self.nodes.resolve_model(c.model, strict=True, task=c.task)
        ctx = self.ctx
        now = ctx.now()
        policy = ctx.policy
        state = RunState(run_id=c.rid, app=DEFAULT_APP, submitted=now, tenant=c.tenant,
                         deadline=None if c.deadline_s is None else now + c.deadline_s,
                         k=c.k)
        # a run with its own deadline or K is ranked as itself (the all-in-one gateway makes
        # it a one-request run with them); the others share their tenant's fresh-run rank
        state.rank = (self._rank(c.tenant, policy, now) if c.deadline_s is None and c.k is None
                      else float(policy.rank(state, now)))
        view = RequestView(request_id=c.rid, run_id=c.rid, unit=c.unit or "default",
                           arrival=now, input_tokens=c.prompt_tokens,
                           max_output_tokens=(max_output_tokens(c.body) if c.body_json is None
                                              else c.max_tokens), seq=next(ctx.seq))
        key = policy_key(policy, state, view, now)
        fields: dict[str, Any] = dict(request_id=c.rid, run_id=c.rid, unit=view.unit, model=model,
                      endpoint=c.endpoint, stream=c.stream, key=list(key),
                      prompt_tokens=c.prompt_tokens, reply_to=c.reply_to, reply_only=True,
                      native=c.native)
        # a body the edge encoded is forwarded as it came (never decoded here)
        msg = (Submit(body=c.body, **fields) if c.body_json is None
               else Submit.with_json_body(c.body_json, **fields))
        call = DirectCall(edge=edge, msg=msg, sent_at=time.monotonic())
        self._send(call)
        self.calls[c.rid] = call
        self.stats["sent"] += 1

    def _rank(self, tenant: str, policy: Any, now: float) -> float:
        hit = self._ranks.get(tenant)
        if hit is not None and now - hit[1] < self.RANK_TTL_S:
            return hit[0]
        rank = float(policy.rank(RunState(run_id="", app=DEFAULT_APP, submitted=now,
                                          tenant=tenant), now))
        self._ranks[tenant] = (rank, now)
        return rank

    def _send(self, call: DirectCall, exclude: frozenset[str] = frozenset()) -> None:
        msg = call.msg
        route = RouteRequest(msg.request_id)
        prompt = None
        if self.nodes.router.name != "least-loaded":  # a router that reads prompts
            body = msg.engine_body()
            prefixes = prompt_prefixes(msg.endpoint, body)
            route = RouteRequest(msg.request_id, prefixes, prefixes[-1][1] if prefixes else 0)
            prompt = (msg.endpoint, body)
        node, engine = self.nodes.pick_engine(msg.model, exclude, route, prompt)
        call.node, call.engine = node.name, engine.name
        msg.engine = engine.name
        node.outstanding[engine.name] = node.outstanding.get(engine.name, 0) + 1
        self.nodes.send(node, msg)

    def _release(self, call: DirectCall) -> None:
        node = self.nodes.nodes.get(call.node)
        if node is not None and call.engine:
            node.outstanding[call.engine] = max(0, node.outstanding.get(call.engine, 0) - 1)

    # ------------------------------------------------------------------ settling
    def settle(self, items: list[wire.Settled]) -> None:
        """Calls the edge says their nodes answered: free their engine slots."""
        metrics = self.ctx.metrics
        for it in items:
            call = self.calls.pop(it.rid, None)
            if call is None:
                continue
            self._release(call)
            self.stats["done"] += 1
            if metrics is not None:
                metrics.on_request_done(it.node, it.engine, it.queue_s, it.service_s)

    def sweep(self, now: float, grace_s: float) -> int:
        """Drop the calls sent more than ``grace_s`` ago that no node holds any more and no
        edge reported (their edge died before it could): their slots are freed."""
        held = self.nodes.held
        stale = [rid for rid, c in self.calls.items()
                 if now - c.sent_at > grace_s and rid not in held]
        for rid in stale:
            call = self.calls.pop(rid)
            self._release(call)
        return len(stale)

    def on_node_message(self, msg: Done | Failed) -> bool:
        """A node's ``done``/``failed`` for one of these calls (False: not one of them)."""
        call = self.calls.get(msg.request_id)
        if call is None:
            return False
        if isinstance(msg, Done):
            del self.calls[msg.request_id]
            self._release(call)
            self.stats["done"] += 1
            metrics = self.ctx.metrics
            if metrics is not None:
                metrics.on_request_done(call.node, msg.engine, msg.queue_s, msg.service_s)
            return True
        if msg.retryable and call.retries < self.ctx.config.scheduler.max_retries:
            call.retries += 1
            self._release(call)
            exclude = frozenset({call.node}) if len(self.nodes.nodes) > 1 else frozenset()
            delay = min(2.0, 0.1 * 2 ** (call.retries - 1))
            asyncio.get_running_loop().call_later(delay, self._resend, msg.request_id, exclude)
            return True
        status = msg.status if msg.status is not None and 400 <= msg.status < 500 else 502
        self._fail(msg.request_id, RequestFailed(msg.error), status)
        return True

    def _resend(self, rid: str, exclude: frozenset[str] = frozenset()) -> None:
        call = self.calls.get(rid)
        if call is None:  # cancelled meanwhile
            return
        self.stats["retried"] += 1
        try:
            self._send(call, exclude)
        except SchedulerError as e:
            self._fail(rid, e)

    def _fail(self, rid: str, exc: SchedulerError, status: int | None = None) -> None:
        call = self.calls.pop(rid, None)
        if call is None:
            return
        self._release(call)
        self.stats["failed"] += 1
        self.tell(call.edge, wire.CallFailed(rid=rid, epoch=self.nodes.epoch,
                                             status=status or exc.status, code=exc.code,
                                             message=str(exc)))

    def cancel(self, rid: str) -> None:
        """The edge's client went away: drop the call at its node."""
        call = self.calls.pop(rid, None)
        if call is None:
            return
        self._release(call)
        node = self.nodes.nodes.get(call.node)
        if node is not None:
            self.nodes.send(node, Cancel(request_ids=[rid]))

    def node_gone(self, name: str) -> None:
        """A node died: its calls go elsewhere once (a second loss fails them)."""
        for rid, call in list(self.calls.items()):
            if call.node != name:
                continue
            call.node = ""
            if call.fault_retries >= 1:
                self._fail(rid, RequestFailed(f"request {rid} was on node {name!r} when it "
                                              "died, for the second time; not retried again"))
                continue
            call.fault_retries += 1
            try:
                self._send(call)
            except NoCapacity as e:
                self._fail(rid, e)
