"""Warm caches never evict what a running request uses; a planned prewarm also spares what
queued requests need (vLLM's block reference counts; what epwq/lru keep implicitly)."""

from __future__ import annotations

from hermes.core.warm_models import UNCOUNTED, PrefixCacheModel


def cache(running: set[str], queued: set[str]) -> PrefixCacheModel:
    c = PrefixCacheModel(1000, cpu_capacity_tokens=10_000)
    c.in_use = running.__contains__
    c.queued = queued.__contains__
    return c


def test_prefill_never_evicts_a_running_requests_prefix():
    running: set[str] = set()
    c = cache(running, set())
    c.on_prefilled("a", 600, 0.0)
    running.add("a")  # the oldest, but a running request references it
    c.on_prefilled("b", 600, 1.0)
    c.on_prefilled("c", 500, 1.5)  # b goes (a's blocks belong to its request; 600 + 1000)
    assert c.where("a") == "gpu" and c.where("b") == "cpu" and c.where("c") == "gpu"
    assert c.gpu_used - 600 <= c.capacity  # the unreferenced part fits
    running.clear()
    c.on_prefilled("b", 600, 2.0)  # a counts again: a, then c (least recently used) go
    assert (c.where("a"), c.where("b"), c.where("c")) == ("cpu", "gpu", "cpu")
    assert c.gpu_used <= c.capacity


def test_planned_prewarm_spares_queued_prefixes_a_request_does_not():
    queued = {"q"}
    c = cache(set(), queued)
    c.on_prefilled("q", 600, 0.0)
    c.pin("p")
    c.on_prefilled(UNCOUNTED + "p", 600, 1.0)  # a prewarm's prefill-only request
    assert c.where("q") == "gpu" and c.where("p") == "cpu"
    assert c.gpu_used <= c.capacity
    c.on_prefilled("r", 600, 2.0)  # a workload request's prefix: ordinary LRU
    assert c.where("q") == "cpu" and c.where("r") == "gpu"
