"""The gateway re-places its models by itself (issue 22): SeaLLM's adaptive re-placement loop,
fed by Hermes' forecast.

With ``[placement] auto = true`` the gateway, every interval, forecasts each model's demand
from its runs in flight, their PDGraphs and the apps' recent arrivals
(:func:`hermes.gateway.demand.forecast_doc`), places the models on a node's GPUs with the same
search as ``hermes plan placement`` (:func:`hermes.plan.placement.place`, candidate plans scored
on the mean over ``draws`` simulated request streams, in one worker process so that the
CPU-bound search does not hold the gateway's interpreter), and sends the plan (``hermes-placement-plan/1``, a
:class:`~hermes.protocol.Place` message) to every node that accepts plans (its ``hello`` says
``placement``: ``hermeslet run --accept-placement``, or the embedded node with this setting).
A node applies it as on ``SIGHUP``, for the models the plan names (its engines of other
models stay): engines kept, drained, started. Each node places on its own GPUs (its ``hello``
says how many and of which type: ``hermeslet run --accept-placement --gpus N --device D``; else
``[placement] gpus`` / ``device``) for its part of the forecast
(:func:`hermes.plan.nodes.split_demand`): each model goes to the kinds of node whose GPUs
can hold it, its calls split between their nodes in proportion to GPUs times achieved memory
bandwidth; nodes alike get one search and the same plan. This splits the demand, it does not
search placements across nodes jointly (the router spreads a model's requests over the nodes
serving it by load). A plan
whose engines (names and models) a node already announces is not sent to it again (a node
whose engine of the plan failed to start gets it again at the next round), and the plan in
force is kept unless the search's new plan scores ``min_gain`` better on the same simulated
requests (a re-placement pauses the groups that change and drops their KV; measured in
``hermes bench seallm`` as ``seallm-keep``).

A node that restarted says ``hello`` with none of its plan's engines: it gets its plan in
force again at that hello (:meth:`Placer.node_said_hello`), not at the next round, which may
be an interval away and by then forecast from other demand (the runs that made the plan may
have ended, or left the rate window): a restarted node must not serve without the plan its
peers serve meanwhile. Only the plan made for the GPUs it announces (another count or type
waits for the round that places it), and at most once per ``min_interval_s`` per node, so
that a plan whose engines all fail to start, or that brings the node down, is retried at the
rounds' pace rather than at every hello. ``GET /admin/placement`` lists such a send among
the rounds, with ``hello`` naming the node.

The interval adapts as SeaLLM's (:class:`hermes.core.multillm.replacement.AdaptiveInterval`,
β = ``beta``): after each interval the calls the forecast expected per second are compared
with the LLM calls the gateway dispatched per second meanwhile; a miss by more than β shortens
the next interval by (1 − β), a hit lengthens it by (1 + β), within
``[min_interval_s, max_interval_s]``. Intervals are scheduler seconds (``time_scale`` applies).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from hermes.core.multillm.replacement import AdaptiveInterval
from hermes.gateway.demand import forecast_doc

if TYPE_CHECKING:
    from hermes.gateway.config import PlacementConfig
    from hermes.gateway.scheduler import LiveScheduler
    from hermes.gateway.state import Node
    from hermes.plan.nodes import NodeKind
    from hermes.plan.placement import ServiceSpec

log = logging.getLogger("hermes.gateway.placer")
#: replan rounds kept for ``GET /admin/placement`` (a gateway runs for weeks)
HISTORY = 100


def _search_pool() -> ProcessPoolExecutor:
    """One spawned worker process for the placement search (no fork of a process with
    threads)."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


class Placer:
    """The re-placement loop of one gateway (module doc)."""

    def __init__(self, sched: LiveScheduler, cfg: PlacementConfig) -> None:
        self.sched = sched
        self.cfg = cfg
        self.rule = AdaptiveInterval(beta=cfg.beta, min_s=cfg.min_interval_s,
                                     max_s=cfg.max_interval_s)
        self.interval_s = min(max(cfg.interval_s, cfg.min_interval_s), cfg.max_interval_s)
        #: the plan in force on each node (the last one sent to it), and what the last
        #: :data:`HISTORY` replans decided (/admin)
        self.plans: dict[str, dict[str, Any]] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._expected: float | None = None  # forecast calls/s for the interval now running
        self._since: tuple[float, int] | None = None  # (time, LLM calls dispatched) then
        self._pool: ProcessPoolExecutor | None = None  # the search's process, while run() runs
        #: node -> scheduler time its plan in force was last sent again at a hello
        self._resent_at_hello: dict[str, float] = {}
        sched.node_table.hello_listeners.append(self.node_said_hello)

    async def run(self) -> None:
        """Replan now, then every interval, until cancelled. The placement search (CPU-bound
        simulation, ``draws`` x a few seconds) runs in one worker process, so that it does not
        hold the gateway's interpreter while requests are served."""
        self._pool = _search_pool()
        try:
            while True:
                try:
                    await self.replan()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a failed replan must not end the loop
                    log.exception("placement: replan failed; next try in %.0f s", self.interval_s)
                await asyncio.sleep(self.sched.ctx.clock.wall_s(self.interval_s))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _search(self, search: Callable[[], tuple[Any, float]]) -> tuple[Any, float]:
        """Run ``search`` in the worker process (a worker thread when :meth:`run` is not
        running); a worker that died (killed, out of memory) is replaced once and the search
        run again, so one lost process does not end re-placement."""
        if self._pool is None:
            return await asyncio.to_thread(search)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, search)
        except BrokenProcessPool:
            log.warning("placement: the search process died; starting another")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = _search_pool()
            return await loop.run_in_executor(self._pool, search)

    def _observed_rate(self, now: float) -> float | None:
        """LLM calls per second dispatched since the last replan (None: first replan)."""
        calls = self.sched.ctx.stats.get("llm_requests", 0)
        prev, self._since = self._since, (now, calls)
        if prev is None or now <= prev[0]:
            return None
        return (calls - prev[1]) / (now - prev[0])

    async def _place_kind(self, services: list[ServiceSpec], kind: NodeKind,
                          nodes: list[Node]) -> dict[str, Any]:
        """Place ``services`` (one node's part of the forecast) on each of ``nodes`` (alike:
        ``kind``) and send the plan to those whose plan in force has other engines. Returns
        the round's record of it: ``plan``, ``score``, ``sent`` and, unsent, ``why``."""
        from hermes.plan.placement import emit_placement, place, plan_engines, plan_of
        from hermes.protocol import Place

        gpus, device = kind.gpus, kind.device
        cfg = self.cfg
        in_force = self.plans.get(nodes[0].name)
        current = plan_of(in_force) if in_force is not None else None
        search = functools.partial(place, services, gpus, device, tps=tuple(cfg.tps),
                                   max_per_group=cfg.max_per_group, current=current,
                                   min_gain=cfg.min_gain, draws=cfg.draws)
        plan, score = await self._search(search)
        new = emit_placement(services, plan, device, gpus, score)
        row: dict[str, Any] = {"plan": plan.describe(), "score": score, "sent": False}
        # a node that does not announce every engine of the plan gets it (again): a new
        # plan, or the same one to a node that restarted with its own engines, or whose
        # engine of the plan failed to start (the node retries it)
        want = plan_engines(new)
        targets = [n for n in nodes
                   if any(n.engines.get(name) is None or n.engines[name].model != model
                          for name, model in want.items())]
        if not targets:
            row["why"] = ("same engines as the plan in force" if plan != current else
                          f"the plan in force stays: no plan found {cfg.min_gain:.1%} better")
            return row
        for node in targets:
            self.plans[node.name] = new  # before the send: the node's next hello reads it
            self.sched.node_table.send(node, Place(plan=new))
        row["sent"] = True
        log.info("placement: sent %s to %s (%d %s GPUs each; next replan in %.0f s)",
                 plan.describe(), [n.name for n in targets], gpus, device, self.interval_s)
        return row

    def node_said_hello(self, node: Node) -> None:
        """A node's ``hello``: one that accepts plans and announces none of the engines of
        its plan in force (it restarted with its own engines only) is sent that plan again
        now (module doc), recorded in ``history`` with ``hello`` = the node's name."""
        plan = self.plans.get(node.name)
        if plan is None or not node.accepts_placement:
            return
        try:
            from hermes.core.cluster.devices import get_device
            from hermes.plan.placement import plan_engines, plan_of
            from hermes.protocol import Place

            want = plan_engines(plan)
            if any(node.engines.get(name) is not None and node.engines[name].model == model
                   for name, model in want.items()):
                return  # the plan's engines (or some: the round retries the others)
            if ((node.gpus or self.cfg.gpus) != plan["gpus"]
                    or get_device(node.device or self.cfg.device).name != plan["device"]):
                return  # other GPUs than the plan's: the next round places this node
            now = self.sched.now()
            last = self._resent_at_hello.get(node.name)
            if last is not None and now - last < self.cfg.min_interval_s:
                log.warning("placement: %s said hello again without the plan in force's "
                            "engines within %.0f s: the next round retries it", node.name,
                            self.cfg.min_interval_s)
                return
            self._resent_at_hello[node.name] = now
            self.sched.node_table.send(node, Place(plan=plan))
        except Exception:  # a hello must register the node whatever the placer does
            log.exception("placement: could not send %s its plan in force", node.name)
            return
        described = plan_of(plan).describe()
        self.history.append({"time": now, "interval_s": self.interval_s, "hello": node.name,
                             "nodes": 1, "sent": True, "plan": described,
                             **({"score": plan["score"]} if "score" in plan else {})})
        log.info("placement: %s said hello without the engines of its plan in force: sent it "
                 "%s again", node.name, described)

    async def replan(self) -> dict[str, Any]:
        """One round: adapt the interval, forecast, place, send if changed. Returns what it
        decided (also appended to ``history``)."""
        sched, cfg = self.sched, self.cfg
        now = sched.now()
        observed = self._observed_rate(now)
        if observed is not None and self._expected is not None:
            self.interval_s = self.rule.next(self.interval_s, self._expected, observed)
        doc = forecast_doc(sched, cfg.horizon_s, cfg.window_s)
        nodes = [n for n in sched.nodes.values() if n.accepts_placement]
        self._expected = sum(s["calls_per_s"] for s in doc["services"])
        out: dict[str, Any] = {"time": now, "interval_s": self.interval_s,
                               "expected_calls_per_s": self._expected,
                               "observed_calls_per_s": observed, "nodes": len(nodes),
                               "sent": False}
        if not nodes or not doc["services"]:
            out["why"] = "no node accepts plans" if not nodes else "no LLM demand forecast"
            self.history.append(out)
            return out
        from hermes.plan.nodes import NodeKind, node_capacity, split_demand
        from hermes.plan.placement import services_from_forecast

        groups: dict[tuple[int, str], list[Node]] = {}
        for n in nodes:
            groups.setdefault((n.gpus or cfg.gpus, n.device or cfg.device), []).append(n)
        kinds = [NodeKind(g, d, len(ns)) for (g, d), ns in groups.items()]
        services = services_from_forecast(doc, dict(cfg.model_map), "placement")
        parts, homeless = split_demand(services, kinds, tps=cfg.tps)
        if homeless:
            out["unplaced"] = [s.served for s in homeless]
            log.error("placement: no node's GPUs can hold %s", [s.served for s in homeless])
        total = sum(node_capacity(k.gpus, k.device) * k.count for k in kinds)
        rows: list[dict[str, Any]] = []
        for k, part in zip(kinds, parts, strict=True):
            members = groups[(k.gpus, k.device)]
            row: dict[str, Any] = {"gpus": k.gpus, "device": k.device,
                                   "share": node_capacity(k.gpus, k.device) / total,
                                   "nodes": [n.name for n in members], "sent": False}
            rows.append(row)
            if not part:
                row["why"] = f"no forecast model fits {k.gpus} {k.device}"
                continue
            try:
                row.update(await self._place_kind(part, k, members))
            except ValueError as e:  # e.g. the models together fit no plan of these GPUs
                log.error("placement: nodes %s (%d %s GPUs): %s", [n.name for n in members],
                          k.gpus, k.device, e)
                row["why"] = f"cannot place on {k.gpus} {k.device}: {e}"
            row["models"] = [s.served for s in part]
        out["sent"] = any(r["sent"] for r in rows)
        if len(rows) == 1:
            out.update({k: rows[0][k] for k in ("plan", "score", "why") if k in rows[0]})
        else:
            out["kinds"] = rows
            if not out["sent"]:
                out["why"] = "; ".join(dict.fromkeys(r["why"] for r in rows))
        self.history.append(out)
        return out
