"""Several LLM services on shared GPUs: a discrete-event simulator of SeaLLM's sharing groups.

SeaLLM (:mod:`hermes.core.multillm`) places several services on groups of GPUs and picks the
plan, TP size included, "by simulation": a candidate plan is scored by replaying requests on it.
This is that simulator, one copy for both drivers: ``hermes bench seallm`` (the study; it also
runs the systems over a whole workload with it) and ``hermes plan placement`` (the plan a
HermesLet serves) score plans with :func:`score_plan`.

Each group (:class:`SimGroup`) runs one iteration at a time, batching only requests of one
service and one phase (prefill or decode), as the paper does; the ordering (an
:class:`~hermes.core.multillm.ordering.Ordering`) is re-evaluated every iteration
(per-iteration preemption); the group's KV pool is shared by its services (``unified``) or split
evenly (``split``); a request that does not get KV room waits, and when a decode step has no
room the lowest-priority running request of the group is evicted (recomputed later). Requests
go to the replica group with the fewest requests; a request of a service with no group is
dropped. With ``spatial`` (MuxServe as SeaLLM describes it: each service of a group on a fixed
share of the GPUs' compute units, side by side) every service of a group runs in its own lane,
concurrently with the others, on its split of the group's KV; every iteration of a lane takes
1/share as long as on the whole GPUs (its share of the compute units and, with them, of the
memory bandwidth: busy lanes together do what the whole GPUs would), and a lane's share is not
lent to the other lane when it idles (what SeaLLM blames MuxServe's loss on). Shares are the
``spatial`` weights normalised per group, none below :data:`MIN_LANE_SHARE`. Iteration costs are the planner's (:func:`hermes.core.multillm.service.cost_model`),
batches capped by :data:`MAX_BATCHED_TOKENS` (prefill) and :data:`MAX_NUM_SEQS` (decode).

Scores (:func:`scores`): per service, the requests over the SLO (latency above
:data:`SLO_FACTOR` x the request's reference time, the request alone on one GPU, batch one;
dropped and unfinished requests count) and the sum of normalised latencies latency / L̂_s
(``mean_ref``: the service's mean reference time), the terms of SeaLLM's unsatisfaction index.
What the simulator needs of the services is :class:`SimWorkload`: the services (names, models),
each request's reference time (by :attr:`SimRequest.i`) and each service's L̂_s;
:class:`ServiceSet` is the plain one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hermes.core.multillm.ordering import Ordering
from hermes.core.multillm.placement import PlacementPlan, ServiceScore
from hermes.core.multillm.service import (
    Service,
    cost_model,
    group_kv_bytes,
    kv_bytes_per_token,
)

DEVICE = "A100-80"
#: starvation threshold, in multiples of the service's mean execution time (ours)
STARVATION_FACTOR: float | None = 10.0
SLO_FACTOR = 5.0
#: a spatial lane's smallest share of its GPUs (ours: MuxServe sets shares from the rates; a
#: service barely seen when they were set would otherwise run at a thousandth of a GPU)
MIN_LANE_SHARE = 0.1
MAX_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256


class SimWorkload(Protocol):
    """What :class:`Sim` and :func:`scores` read of the services: the services (index =
    :attr:`SimRequest.svc`), the reference time of each request (index = :attr:`SimRequest.i`)
    and L̂_s per service."""

    @property
    def services(self) -> Sequence[Service]: ...

    @property
    def ref(self) -> np.ndarray: ...

    @property
    def mean_ref(self) -> np.ndarray: ...


@dataclass
class ServiceSet:
    """A plain :class:`SimWorkload`."""

    services: list[Service]
    ref: np.ndarray  # reference execution time of each request
    mean_ref: np.ndarray  # L̂_s per service index


class SimRequest:
    """One request: its index ``i`` (into the workload's ``ref``), service index, arrival,
    input and output tokens, and its progress."""

    __slots__ = ("i", "svc", "arr", "inp", "out", "gen", "exe", "kv", "first", "done")

    def __init__(self, i: int, svc: int, arr: float, inp: int, out: int) -> None:
        self.i, self.svc, self.arr, self.inp, self.out = i, svc, arr, inp, out
        self.gen = 0
        self.exe = 0.0
        self.kv = 0  # tokens held in KV
        self.first = -1.0
        self.done = -1.0


class SimGroup:
    """One sharing group: its services' cost models and KV pool, its queue and its clock."""

    def __init__(self, services: tuple[int, ...], names: list[str], models: list[str], tp: int,
                 kv_mode: str, device: str = DEVICE, *, sharing: tuple[int, ...] | None = None,
                 speed: float = 1.0) -> None:
        self.svcs = services
        self.names = names
        self.tp = tp
        self.cms = {s: cost_model(models[s], device, tp) for s in services}
        self.kvb = {s: kv_bytes_per_token(models[s]) for s in services}
        # a spatial lane (``sharing``: all the services on the GPUs) gets its split of their pool
        on_gpus = sharing if sharing is not None else services
        pool = group_kv_bytes(tuple(models[s] for s in on_gpus), device, tp)
        if sharing is not None:
            pool //= max(1, len(on_gpus))
        #: fraction of the GPUs a lane's iterations get (a spatial lane's fixed share)
        self.speed = speed
        self.unified = kv_mode == "unified"
        self.cap = {s: pool // max(1, len(services)) for s in services}
        self.pool = pool
        self.used = {s: 0 for s in services}
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.t = 0.0
        self.turns: dict[str, int] = {}

    def n(self) -> int:
        return len(self.waiting) + len(self.running)

    def room(self, s: int, tokens: int) -> bool:
        need = tokens * self.kvb[s]
        if self.unified:
            return sum(self.used.values()) + need <= self.pool
        return self.used[s] + need <= self.cap[s]

    def take(self, r: SimRequest, tokens: int) -> None:
        r.kv += tokens
        self.used[r.svc] += tokens * self.kvb[r.svc]

    def free(self, r: SimRequest) -> None:
        self.used[r.svc] -= r.kv * self.kvb[r.svc]
        r.kv = 0


class Sim:
    """One plan's groups over a stretch of time (requests may carry over between plans)."""

    def __init__(self, wl: SimWorkload, plan: PlacementPlan, ordering: Ordering, kv_mode: str,
                 t0: float = 0.0, device: str = DEVICE, *,
                 spatial: Mapping[str, float] | None = None) -> None:
        self.wl = wl
        self.ordering = ordering
        names = [s.name for s in wl.services]
        models = [s.model for s in wl.services]
        idx = {n: k for k, n in enumerate(names)}
        self.names = names
        self.svc_index = idx
        self.groups: list[SimGroup]
        if spatial is None:
            self.groups = [SimGroup(tuple(idx[s] for s in g.services), names, models, g.tp,
                                    kv_mode, device)
                           for g in plan.groups]
        else:  # each service of a group in its own lane (module doc: MuxServe's spatial shares)
            self.groups = []
            for pg in plan.groups:
                members = tuple(idx[s] for s in pg.services)
                weight = sum(max(spatial.get(s, 0.0), 1e-9) for s in pg.services)
                shares = [max(spatial.get(names[k], 0.0), 1e-9) / weight for k in members]
                if len(members) > 1:  # no lane below MIN_LANE_SHARE (the others give it up)
                    low = [max(x, MIN_LANE_SHARE) for x in shares]
                    shares = [x / sum(low) for x in low]
                self.groups += [SimGroup((k,), names, models, pg.tp, "split", device,
                                         sharing=members, speed=x)
                                for k, x in zip(members, shares, strict=True)]
        for sg in self.groups:
            sg.t = t0
        self.replicas = {k: [gi for gi, g in enumerate(self.groups) if k in g.svcs]
                         for k in range(len(names))}
        self.finished: list[SimRequest] = []
        self.dropped: list[SimRequest] = []  # requests of services with no group

    def dispatch(self, r: SimRequest, now: float) -> None:
        reps = self.replicas[r.svc]
        if not reps:
            self.dropped.append(r)
            return
        g = self.groups[min(reps, key=lambda k: (self.groups[k].n(), k))]
        if g.n() == 0:
            g.t = max(g.t, now)
        g.waiting.append(r)

    def _key(self, r: SimRequest, now: float) -> tuple[float, float]:
        return self.ordering.key(self.wl.services[r.svc].name, r.arr, r.exe, now)

    def step(self, g: SimGroup) -> None:
        now = g.t
        everyone = g.waiting + g.running
        kc = {r: self._key(r, now) for r in everyone}  # keys once per iteration
        if self.ordering.rotate:
            have = sorted({r.svc for r in everyone})
            s = have[0] if len(have) == 1 else self.svc_index[
                self.ordering.next_turn([self.names[k] for k in have], g.turns)]
            g.turns[self.names[s]] = g.turns.get(self.names[s], 0) + 1
            best = min((r for r in everyone if r.svc == s), key=lambda r: r.arr)
        else:
            best = min(everyone, key=lambda r: kc[r])
        s = best.svc
        cm = g.cms[s]
        dur = 0.0
        if best in g.waiting:  # prefill batch of service s
            cands = sorted((r for r in g.waiting if r.svc == s), key=lambda r: kc[r])
            batch: list[SimRequest] = []
            tokens = 0
            for r in cands:
                need = r.inp + r.gen
                if batch and tokens + need > MAX_BATCHED_TOKENS:
                    break
                if not g.room(s, need + 1):
                    # per-iteration preemption: evict lower-priority running requests
                    kr = kc[r]
                    victims = sorted((v for v in g.running if kc[v] > kr),
                                     key=lambda v: kc[v], reverse=True)
                    for v in victims:
                        if g.room(s, need + 1):
                            break
                        g.free(v)
                        g.running.remove(v)
                        g.waiting.append(v)
                    if not g.room(s, need + 1):
                        break
                batch.append(r)
                tokens += need
                g.take(r, need)
            if batch:
                pairs = float(sum(0.5 * (r.inp + r.gen) ** 2 for r in batch))
                dur = cm.iteration_s(tokens, 0, 0, prefill_seqs=len(batch),
                                     prefill_pairs=pairs) / g.speed
                end = now + dur
                for r in batch:
                    g.waiting.remove(r)
                    r.exe += dur
                    r.gen += 1
                    if r.first < 0:
                        r.first = end
                    if r.gen >= r.out:
                        r.done = end
                        g.free(r)
                        self.finished.append(r)
                    else:
                        g.running.append(r)
                g.t = end
                return
            if not any(r.svc == s for r in g.running):
                # nothing of s can run; run the best decode batch instead, else wait
                if not g.running:
                    g.t = now + 0.01
                    return
                s = min(g.running, key=lambda r: kc[r]).svc
                cm = g.cms[s]
        batch = sorted((r for r in g.running if r.svc == s), key=lambda r: kc[r])
        batch = batch[:MAX_NUM_SEQS]
        while batch and not g.room(s, len(batch)):
            v = max(g.running, key=lambda r: kc[r])
            g.free(v)
            g.running.remove(v)
            g.waiting.append(v)
            if v in batch:
                batch.remove(v)
        if not batch:
            g.t = now + 0.01
            return
        ctx = sum(r.kv for r in batch)
        dur = cm.iteration_s(0, len(batch), ctx) / g.speed
        end = now + dur
        for r in batch:
            g.take(r, 1)
            r.exe += dur
            r.gen += 1
            if r.gen >= r.out:
                r.done = end
                g.free(r)
                g.running.remove(r)
                self.finished.append(r)
        g.t = end

    def run(self, arrivals: list[SimRequest], t_end: float) -> None:
        """Dispatch ``arrivals`` (by arrival time) and run groups until ``t_end``."""
        ai = 0
        heap: list[tuple[float, int]] = []
        while True:
            heap = [(g.t, k) for k, g in enumerate(self.groups) if g.n()]
            tg = min(heap)[0] if heap else np.inf
            ta = arrivals[ai].arr if ai < len(arrivals) else np.inf
            if min(ta, tg) >= t_end:
                return
            if ta <= tg:
                self.dispatch(arrivals[ai], ta)
                ai += 1
            else:
                self.step(self.groups[min(heap)[1]])

    def unfinished(self) -> list[SimRequest]:
        out = []
        for g in self.groups:
            for r in g.waiting + g.running:
                g.free(r)
                out.append(r)
        return out


def scores(wl: SimWorkload, done: list[SimRequest], dropped: list[SimRequest],
           left: list[SimRequest], t_end: float) -> dict[str, ServiceScore]:
    """Per service: requests over SLO (dropped and unfinished count), sum of L_r / L̂_s."""
    acc = {s.name: [0.0, 0.0, 0] for s in wl.services}
    for r in done:
        a = acc[wl.services[r.svc].name]
        lat = r.done - r.arr
        a[0] += lat > SLO_FACTOR * wl.ref[r.i]
        a[1] += lat / wl.mean_ref[r.svc]
        a[2] += 1
    for r in left:
        a = acc[wl.services[r.svc].name]
        lat = max(t_end - r.arr, 0.0)
        a[0] += lat > SLO_FACTOR * wl.ref[r.i]
        a[1] += lat / wl.mean_ref[r.svc]
        a[2] += 1
    for r in dropped:
        acc[wl.services[r.svc].name][0] += 1
    return {k: ServiceScore(v[0], v[1], int(v[2])) for k, v in acc.items()}


def score_plan(wl: SimWorkload, plan: PlacementPlan, ordering: Ordering, kv_mode: str,
               reqs: Sequence[SimRequest], span: float, *, drain_s: float = 10.0,
               device: str = DEVICE) -> dict[str, ServiceScore]:
    """SeaLLM's evaluation of a candidate plan: ``reqs`` (fresh copies; arrivals within
    ``[0, span)``) simulated on ``plan``'s groups from time 0 until ``span + drain_s``, then
    :func:`scores` (requests still running count with their latency so far)."""
    sim = Sim(wl, plan, ordering, kv_mode, 0.0, device)
    sim.run([SimRequest(r.i, r.svc, r.arr, r.inp, r.out) for r in reqs], span + drain_s)
    return scores(wl, sim.finished, sim.dropped, sim.unfinished(), span + drain_s)
