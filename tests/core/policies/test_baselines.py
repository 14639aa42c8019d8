"""The defining examples of the baselines added by issue 18: ``sjf`` and Autellix's
``autellix-plas`` / ``autellix-atlas``, on hand-built runs."""

from __future__ import annotations

import numpy as np
import pytest
from policy_tables import pool_of

from hermes.core.policies import make_policy
from hermes.core.policies.sjf import STARTED_OFFSET
from hermes.core.state import RequestView, RunState, UnitObservation


def run(rid: str, app: str = "a", submitted: float = 0.0, **kw) -> RunState:
    return RunState(run_id=rid, app=app, submitted=submitted, **kw)


def view(r: RunState, arrival: float, seq: int, tokens: int = 100) -> RequestView:
    return RequestView(f"q-{r.run_id}", r.run_id, "u", arrival=arrival, input_tokens=tokens,
                       seq=seq)


def order(pol, runs: list[RunState], now: float, arrivals: list[float] | None = None) -> list[str]:
    arrivals = arrivals or [r.submitted for r in runs]
    keys = {r.run_id: pol.request_key(r, view(r, t, i), now)
            for i, (r, t) in enumerate(zip(runs, arrivals, strict=True))}
    return sorted(keys, key=keys.__getitem__)


# -- sjf ------------------------------------------------------------------------------------
def test_sjf_shortest_estimate_first_but_never_preempts_a_started_run() -> None:
    # long: 10 s or 30 s (mean 20); short: 2 s for sure; mid: 5 s for sure
    pool = pool_of(long=np.array([10.0, 30.0]), short=np.full(4, 2.0), mid=np.full(4, 5.0))
    pol = make_policy("sjf", estimators=pool)
    long_, mid = run("long", "long", 0.0), run("mid", "mid", 0.5)
    pol.on_arrival(long_, 0.0)
    pol.on_arrival(mid, 0.5)
    assert (long_.rank, mid.rank) == (20.0, 5.0)
    assert order(pol, [long_, mid], 1.0) == ["mid", "long"]  # shortest estimate first
    # the long run gets served first (say, alone on an idle engine): it is now in service
    long_.attained_s = 1.0
    pol.on_service(long_, 1.0, 10, 1.0)
    assert long_.rank == pytest.approx(20.0 - STARTED_OFFSET)
    short = run("short", "short", 2.0)
    pol.on_arrival(short, 2.0)
    # non-preemptive: the shorter arrivals wait for the run in service; SJF among themselves
    assert order(pol, [short, mid, long_], 2.0) == ["long", "short", "mid"]
    # the size is the estimate at arrival, never refreshed as the run progresses (not SRPT)
    long_.attained_s = 19.0
    pol.on_unit_finish(long_, UnitObservation("u", service_s=18.0), 3.0)
    assert long_.rank == pytest.approx(20.0 - STARTED_OFFSET)
    srpt = make_policy("srpt", estimators=pool)  # preemptive, on the mean remaining
    for r in (short, mid, long_):
        srpt.on_arrival(r, 2.0)
    assert order(srpt, [short, mid, long_], 2.0) == ["short", "mid", "long"]


def test_sjf_unknown_app_after_sized_runs() -> None:
    pol = make_policy("sjf", estimators=pool_of(a=np.full(3, 50.0)))
    known, unknown = run("k", "a", 5.0), run("x", "nope", 0.0)
    for r in (unknown, known):
        pol.on_arrival(r, r.submitted)
    assert order(pol, [unknown, known], 6.0) == ["k", "x"]


# -- Autellix --------------------------------------------------------------------------------
def served_call(pol, r: RunState, start: float, service: float, parallel: int = 1,
                wait: float = 0.0) -> None:
    """One LLM call (unit) of ``r``: queued at ``start``, waited ``wait``, served ``service``."""
    r.progress.current = "u"
    pol.on_unit_start(r, "u", start)
    r.attained_s += service
    pol.on_service(r, service, 10, start + wait + service)
    r.progress.current = None
    pol.on_unit_finish(r, UnitObservation("u", input_tokens=100 * parallel, output_tokens=10,
                                          parallelism=parallel, service_s=service,
                                          started=start, finished=start + wait + service),
                       start + wait + service)


@pytest.mark.parametrize("name", ["autellix-plas", "autellix-atlas"])
def test_autellix_least_attained_program_first_and_demotion(name: str) -> None:
    pol = make_policy(name)  # quanta 1, 2, 4, ... s: queue thresholds 1, 3, 7, 15, ...
    assert pol.thresholds[:4] == [1.0, 3.0, 7.0, 15.0]
    old, new = run("old", submitted=0.0), run("new", submitted=50.0)
    pol.on_arrival(old, 0.0)
    served_call(pol, old, 0.0, 4.0)  # the old program has attained 4 s: queue 2
    pol.on_arrival(new, 50.0)
    assert (old.rank, new.rank) == (2.0, 0.0)
    # the old program's next call arrived first, yet the new program's call goes first
    old.progress.current = new.progress.current = "u"
    pol.on_unit_start(old, "u", 49.0)
    pol.on_unit_start(new, "u", 50.0)
    assert order(pol, [old, new], 50.0, arrivals=[49.0, 50.0]) == ["new", "old"]
    assert order(make_policy("vllm"), [old, new], 50.0, arrivals=[49.0, 50.0]) == ["old", "new"]
    # the new call is demoted as it attains service: past 1 s queue 1, past 3 s queue 2, where
    # the old program's call (queued earlier) goes first again
    new.attained_s = 1.5
    pol.on_service(new, 1.5, 10, 51.5)
    assert new.rank == 1.0
    new.attained_s = 3.5
    pol.on_service(new, 2.0, 10, 53.5)
    assert new.rank == 2.0
    assert order(pol, [old, new], 53.5, arrivals=[49.0, 50.0]) == ["old", "new"]


def test_atlas_does_not_penalise_parallel_threads_plas_does() -> None:
    """A program that fanned out 4 threads of 2 s each against one that ran two 2 s calls in a
    row: PLAS counts 4 x 2 = 8 s against 4 s (queue 3 vs 2: the sequential program first);
    ATLAS counts the critical paths, 2 s against 4 s (queue 1 vs 2: the parallel one first)."""
    for name, first, ranks in (("autellix-plas", "seq", (3.0, 2.0)),
                               ("autellix-atlas", "par", (1.0, 2.0))):
        pol = make_policy(name)
        par, seq = run("par"), run("seq")
        for r in (par, seq):
            pol.on_arrival(r, 0.0)
        served_call(pol, par, 0.0, 2.0, parallel=4)
        served_call(pol, seq, 0.0, 2.0)
        served_call(pol, seq, 2.0, 2.0)
        assert (par.rank, seq.rank) == ranks
        for r in (par, seq):
            r.progress.current = "u"
            pol.on_unit_start(r, "u", 10.0)
        assert order(pol, [par, seq], 10.0, arrivals=[10.0, 10.0])[0] == first


def test_autellix_starving_program_promoted_to_the_top_queue() -> None:
    pol = make_policy("autellix-atlas", beta=10.0)
    hog, fresh = run("hog"), run("fresh", submitted=100.0)
    pol.on_arrival(hog, 0.0)
    served_call(pol, hog, 0.0, 8.0, wait=2.0)  # 8 s attained (queue 3), waited 2 s
    hog.progress.current = "u"
    pol.on_unit_start(hog, "u", 10.0)
    pol.on_arrival(fresh, 100.0)
    fresh.progress.current = "u"
    pol.on_unit_start(fresh, "u", 100.0)
    # at 60: waited 2 + 50 = 52 s < 10 x 8 s: not starving, the fresh program goes first
    assert order(pol, [hog, fresh], 60.0, arrivals=[10.0, 100.0]) == ["fresh", "hog"]
    assert not pol.starving(hog, 60.0)
    # at 88: waited 2 + 78 = 80 s = 10 x 8 s: promoted to the top queue, where it was queued
    # first (FCFS within a queue)
    assert pol.starving(hog, 88.0)
    assert order(pol, [hog, fresh], 100.0, arrivals=[10.0, 100.0]) == ["hog", "fresh"]
    assert hog.rank == 0.0 and hog.policy_state["autellix_promoted"]
    # after promotion it is demoted again by the quanta from the top: 1.5 s more -> queue 1
    hog.attained_s += 1.5
    pol.on_service(hog, 1.5, 10, 101.5)
    assert hog.rank == 1.0
    off = make_policy("autellix-atlas", beta=None)
    assert not off.starving(hog, 1e9)
