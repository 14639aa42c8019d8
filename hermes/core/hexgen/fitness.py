"""Fitness of a HexGen plan: SLO attainment from simulating each pipeline's queue.

Requests arrive as a Poisson process at ``rate`` req/s; each goes to a pipeline chosen with
probability proportional to the pipeline's decode throughput at full batch (HexGen's
dispatcher balances by capacity). Each pipeline runs continuous batching: when requests wait
and the batch has room (``max_num_seqs`` and the replica's KV capacity), one prefill iteration
admits them; otherwise one decode iteration advances every running request by a token.
Iteration times come from :func:`hermes.core.cluster.cost.iteration_cost` (interpolated over
batch sizes with numpy). A request attains its SLO when it finishes within ``deadline_s``.
No clock and no I/O: the same code serves the planner and tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hermes.core.cluster.cost import (
    BatchShape,
    Placement,
    iteration_cost,
    kv_capacity_tokens,
)
from hermes.core.cluster.topology import Cluster

BATCH_KNOTS = (1, 2, 4, 8, 16, 32, 64)
TOKEN_KNOTS = (128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True, slots=True)
class Workload:
    """The request mix: Poisson arrivals, lengths drawn uniformly from the given ranges."""

    rate: float
    n_requests: int = 200
    prompt: tuple[int, int] = (64, 512)
    output: tuple[int, int] = (32, 128)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"request rate must be > 0, got {self.rate}")
        if self.n_requests < 1:
            raise ValueError(f"n_requests must be >= 1, got {self.n_requests}")

    def sample(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        arr = np.cumsum(rng.exponential(1.0 / self.rate, self.n_requests))
        p = rng.integers(self.prompt[0], self.prompt[1] + 1, self.n_requests)
        o = rng.integers(self.output[0], self.output[1] + 1, self.n_requests)
        return arr, p, o


class PipelineTimer:
    """Iteration times of one placement, tabulated at knots (batch or token counts)."""

    def __init__(self, cluster: Cluster, p: Placement, max_num_seqs: int = 64) -> None:
        self.placement = p
        self.max_num_seqs = max_num_seqs
        self.kv_tokens = kv_capacity_tokens(cluster, p)
        self.dec = np.array([iteration_cost(cluster, p, BatchShape(
            decode_seqs=b, decode_ctx_tokens=b * 400)).total_s for b in BATCH_KNOTS])
        self.pre = np.array([iteration_cost(cluster, p, BatchShape(prefill_tokens=t)).total_s
                             for t in TOKEN_KNOTS])

    def decode_s(self, b: int) -> float:
        return float(np.interp(b, BATCH_KNOTS, self.dec))

    def prefill_s(self, tokens: int) -> float:
        return float(np.interp(tokens, TOKEN_KNOTS, self.pre))

    @property
    def capacity(self) -> float:
        """Decode tokens/s at full batch (the dispatch weight)."""
        return self.max_num_seqs / self.decode_s(self.max_num_seqs)


def simulate_pipeline(t: PipelineTimer, arrivals: Sequence[float], prompts: Sequence[int],
                      outputs: Sequence[int]) -> list[float]:
    """Latency (s) of each request on one pipeline, in the order given (arrival order)."""
    n = len(arrivals)
    lat = [0.0] * n
    now = 0.0
    nxt = 0
    waiting: list[int] = []
    running: dict[int, int] = {}  # request -> tokens left
    used = 0
    while nxt < n or waiting or running:
        while nxt < n and arrivals[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running:
            now = arrivals[nxt]
            continue
        admit: list[int] = []
        while (waiting and len(running) + len(admit) < t.max_num_seqs
               and used + prompts[waiting[0]] + outputs[waiting[0]] <= t.kv_tokens):
            r = waiting.pop(0)
            used += prompts[r] + outputs[r]
            admit.append(r)
        if admit:
            now += t.prefill_s(sum(int(prompts[r]) for r in admit))
            for r in admit:
                running[r] = int(outputs[r]) - 1
        elif running:
            now += t.decode_s(len(running))
            for r in list(running):
                running[r] -= 1
        else:  # the head request can never fit this replica's KV cache
            r = waiting.pop(0)
            lat[r] = float("inf")
            continue
        for r in [r for r, left in running.items() if left <= 0]:
            del running[r]
            used -= prompts[r] + outputs[r]
            lat[r] = now - arrivals[r]
    return lat


def latencies(cluster: Cluster, placements: Sequence[Placement], w: Workload,
              timers: dict[Placement, PipelineTimer] | None = None) -> np.ndarray:
    """Every request's latency under ``placements`` (``inf`` with no pipeline at all)."""
    arr, p, o = w.sample()
    if not placements:
        return np.full(w.n_requests, np.inf)
    cache = timers if timers is not None else {}
    ts = []
    for pl in placements:
        if pl not in cache:
            cache[pl] = PipelineTimer(cluster, pl)
        ts.append(cache[pl])
    cap = np.array([x.capacity for x in ts])
    rng = np.random.default_rng(w.seed + 1)
    choice = rng.choice(len(ts), size=w.n_requests, p=cap / cap.sum())
    out = np.empty(w.n_requests)
    for k, timer in enumerate(ts):
        idx = np.flatnonzero(choice == k)
        if idx.size:
            out[idx] = simulate_pipeline(timer, arr[idx].tolist(), p[idx].tolist(), o[idx].tolist())
    return out


def attainment(lat: np.ndarray, deadline_s: float) -> float:
    """Fraction of requests finishing within ``deadline_s``."""
    return float(np.mean(lat <= deadline_s))


def deadline_at(lat: np.ndarray, target: float) -> float:
    """The smallest deadline (s) at which ``target`` of the requests attain it."""
    return float(np.quantile(lat, target, method="higher"))
