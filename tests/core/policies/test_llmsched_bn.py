"""LLMSched as published (``llmsched``): the BN, R(X), Algorithm 1 and the paper's Fig. 2."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import hermes
from hermes.core.estimator import EstimatorPool
from hermes.core.pdgraph import PDGraph
from hermes.core.policies import make_policy
from hermes.core.policies.llmsched_bn import (
    JobView,
    StageBN,
    mutual_information_bits,
    non_overlapping_sets,
    preference_lists,
    uncertainty_aware_order,
)
from hermes.core.state import RequestView, RunState, UnitObservation
from hermes.sim.simulator import setup_engines


def llm_only(unit: str) -> bool:
    return False  # every stage carries a duration (no regular stages)


# -- the BN -------------------------------------------------------------------------------
def two_stage_rows() -> list[dict[str, float]]:
    # A is 1 s or 10 s; B follows A: 2 or 3 s after a short A, 20 or 30 s after a long one
    rows = []
    for a, bs in ((1.0, (2.0, 3.0)), (10.0, (20.0, 30.0))):
        for b in bs:
            rows += [{"A#0": a, "B#0": b}] * 25
    return rows


def test_bn_infers_the_conditional_expectation_of_the_remaining_stage() -> None:
    bn = StageBN.learn(two_stage_rows(), llm_only)
    assert ("A#0", "B#0") in bn.model.edges()  # learned (hill climbing, forward edges only)
    # states: 0 (not run) + one per distinct duration: A has 3, B has 5; BDeu with an
    # equivalent sample size of 1 adds 1/(3·5) to each cell of B's CPD
    alpha = 1 / 15
    for a, bs in ((1.0, (2.0, 3.0)), (10.0, (20.0, 30.0))):
        ev = bn.evidence({"A#0": a}, ["A#0"])
        mean, lo, hi = bn.remaining(ev, {})
        expect = (25 * sum(bs) + alpha * 55.0) / (50 + 5 * alpha)  # E[B | A = a]
        assert mean == pytest.approx(expect, rel=1e-6)
        assert mean == pytest.approx(sum(bs) / 2, rel=0.03)  # the data's own E[B | A]
        assert (lo, hi) == bs  # the support: the two durations seen after A = a
    prior, _, _ = bn.remaining((), {})
    assert prior == pytest.approx(5.5 + 13.75, rel=0.01)  # E[A] + E[B]
    # B running for 2.5 s after a short A: its 3 s state is left (0.5 s to go), and the
    # pseudo-counts of 20 s and 30 s
    ev = bn.evidence({"A#0": 1.0}, ["A#0"])
    mean, lo, _ = bn.remaining(ev, {"B#0": 2.5})
    assert mean == pytest.approx(((25 + alpha) * 0.5 + alpha * 45.0) / (25 + 3 * alpha))
    assert lo == pytest.approx(0.5)


def test_uncertainty_reduction_is_zero_for_an_independent_stage() -> None:
    rng = np.random.default_rng(0)
    rows = [{**r, "C#0": float(rng.choice([1.0, 5.0]))} for r in two_stage_rows()]
    rng.shuffle(rows)  # type: ignore[arg-type]
    bn = StageBN.learn(rows, llm_only)
    assert bn.descendants("C#0") == [] and "C#0" not in {v for _, v in bn.model.edges()}
    assert bn.reduction("C#0", ()) == 0.0
    # A decides B: I(B; A) = 1 bit (two equally likely halves), Range(B) = 30 - 2 = 28 s
    assert bn.reduction("A#0", ()) == pytest.approx(1.0 * 28.0, rel=0.05)
    # once A is known there is nothing left to learn about B from A
    assert bn.reduction("B#0", bn.evidence({"A#0": 1.0}, ["A#0"])) == 0.0


def test_mutual_information_in_bits() -> None:
    assert mutual_information_bits(np.array([[0.5, 0.0], [0.0, 0.5]])) == pytest.approx(1.0)
    assert mutual_information_bits(np.full((2, 3), 1 / 6)) == pytest.approx(0.0, abs=1e-12)


# -- Algorithm 1 --------------------------------------------------------------------------
def test_non_overlapping_sets_and_the_two_lists() -> None:
    jobs = [JobView("a", 5.0, 4.0, 6.0, 0.0), JobView("b", 9.0, 5.0, 20.0, 3.0),
            JobView("c", 30.0, 25.0, 40.0, 9.0), JobView("d", 2.0, 1.0, 3.0, 1.0)]
    assert [[j.job_id for j in g] for g in non_overlapping_sets(jobs)] == [["d"], ["a", "b"], ["c"]]
    s_t, s_u = preference_lists(jobs)
    assert [j.job_id for j in s_t] == ["d", "a", "b", "c"]
    assert [j.job_id for j in s_u] == ["d", "b", "a", "c"]  # c's R is highest, its set last
    exploit = uncertainty_aware_order(jobs, 0.0, 0.2, lambda: 0.5)
    assert sorted(exploit, key=lambda k: exploit[k].first) == ["d", "a", "b", "c"]
    explore = uncertainty_aware_order(jobs, 1.0, 0.2, lambda: 0.5)
    assert sorted(explore, key=lambda k: explore[k].first) == ["d", "b", "a", "c"]


def test_exploration_samples_a_fraction_r_of_the_tasks() -> None:
    jobs = [JobView("wide", 10.0, 5.0, 15.0, 5.0, tasks=10), JobView("short", 4.0, 3.0, 6.0)]

    def run(*draws: float) -> dict[str, tuple[float, int | None, float]]:
        it = iter(draws)
        out = uncertainty_aware_order(jobs, 0.1, 0.2, lambda: next(it))
        return {k: (p.first, p.quota, p.rest) for k, p in out.items()}

    # S_t = [short, wide], S_u = [wide, short]; step i pops S_t[i] and S_u[i]
    assert run(0.9, 0.9) == {"short": (0, None, 0), "wide": (1, None, 1)}
    # explore, then explore: ceil(0.2 · 10) = 2 of wide's tasks first, short's one task
    # (a sample of one task is the task), wide's other 8 tasks at the end (line 21)
    assert run(0.05, 0.05) == {"wide": (0, 2, 2), "short": (1, None, 1)}
    # explore, then exploit S_t[1] = wide: its other tasks follow; short is left to the end
    assert run(0.05, 0.9) == {"wide": (0, 2, 1), "short": (2, None, 2)}


# -- Fig. 2: SJF 6.5 s, LLMSched 5 s ------------------------------------------------------
# Job 1 (task automation, mean 15 s): TA-1 (LLM, 2 s) plans the rest, TA-2 (regular, 1 s).
# Job 2 (code generation, mean 9 s): CG-1 (LLM, 2 s), CG-2 (LLM, 3 s), independent.
# One LLM executor and one regular executor, batch size 1, both jobs arrive at 0 s.
JOBS = {"job1": [("TA-1", "llm", 2.0), ("TA-2", "regular", 1.0)],
        "job2": [("CG-1", "llm", 2.0), ("CG-2", "llm", 3.0)]}


def fig2_bns() -> dict[str, StageBN]:
    ta = [{"TA-1#0": 2.0, "TA-2#0": 1.0}] * 20 + [{"TA-1#0": 4.0, "TA-2#0": 23.0}] * 20
    cg = [{"CG-1#0": a, "CG-2#0": b} for a in (2.0, 4.0) for b in (3.0, 9.0)] * 10
    return {"job1": StageBN.learn(ta, llm_only, edges=[("TA-1#0", "TA-2#0")]),
            "job2": StageBN.learn(cg, llm_only, edges=[])}


def schedule(pick: str, epsilon: float = 1.0) -> dict[str, float]:
    """Non-preemptive list scheduling of the two jobs; returns their completion times.

    ``pick="sjf"``: jobs by their expected total duration (fixed); ``"llmsched"``: at each
    decision, Algorithm 1 over the jobs' BN views (evidence: their finished stages)."""
    bns = fig2_bns()
    done: dict[str, list[tuple[str, float]]] = {j: [] for j in JOBS}
    free = {"llm": 0.0, "regular": 0.0}
    ready_at = dict.fromkeys(JOBS, 0.0)
    finish: dict[str, float] = {}
    sjf = {j: bns[j].remaining((), {})[0] for j in JOBS}
    while len(finish) < len(JOBS):
        now = min(max(free[JOBS[j][len(done[j])][1]], ready_at[j]) for j in JOBS if j not in finish)
        ready = [j for j in JOBS if j not in finish and ready_at[j] <= now
                 and free[JOBS[j][len(done[j])][1]] <= now]
        views = []
        for j in JOBS:
            if j in finish:
                continue
            row = {f"{s}#0": d for s, d in done[j]}
            ev = bns[j].evidence(row, row)
            mean, lo, hi = bns[j].remaining(ev, {})
            stage = f"{JOBS[j][len(done[j])][0]}#0"
            views.append(JobView(j, mean, lo, hi, bns[j].reduction(stage, ev)))
        if pick == "sjf":
            order = sorted(ready, key=sjf.__getitem__)
        else:
            place = uncertainty_aware_order(views, epsilon, 0.2, lambda: 0.0)
            order = sorted(ready, key=lambda j: place[j].first)
        j = order[0]
        name, kind, dur = JOBS[j][len(done[j])]
        end = now + dur
        free[kind] = ready_at[j] = end
        done[j].append((name, dur))
        if len(done[j]) == len(JOBS[j]):
            finish[j] = end
    return finish


def test_fig2_sjf_vs_llmsched_average_completion_time() -> None:
    bns = fig2_bns()
    assert bns["job1"].remaining((), {})[0] == pytest.approx(15.0, rel=0.02)
    assert bns["job2"].remaining((), {})[0] == pytest.approx(9.0, rel=0.02)
    sjf = schedule("sjf")
    assert sjf == {"job2": 5.0, "job1": 8.0} and np.mean(list(sjf.values())) == 6.5
    # TA-1 reduces uncertainty (it decides TA-2), CG-1 does not: S_u runs TA-1 first; then
    # Job 1's remaining time is ~1 s and SRTF finishes it while Job 2 uses the LLM
    assert bns["job1"].reduction("TA-1#0", ()) > 0.0 == bns["job2"].reduction("CG-1#0", ())
    ours = schedule("llmsched")
    assert ours == {"job1": 3.0, "job2": 7.0} and np.mean(list(ours.values())) == 5.0
    # with no exploration, LLMSched is SRTF on the BN and repeats SJF's order here
    assert schedule("llmsched", epsilon=0.0) == sjf


# -- the policy ---------------------------------------------------------------------------
def app_pool(app: str = "factool_math") -> EstimatorPool:
    path = Path(hermes.__file__).parent / "data" / "pdgraphs" / f"{app}.json"
    return EstimatorPool({"m": PDGraph.load(path)}, setup_engines("llama2-7b-a100-cal")[0])


def test_policy_ranks_every_run_and_keys_requests_by_its_placement() -> None:
    pol = make_policy("llmsched", estimators=app_pool(), prior_runs=40, refit_every=3,
                      epsilon=0.0, seed=1)
    runs = [RunState(run_id=f"r{i}", app="m", submitted=float(i)) for i in range(3)]
    for r in runs:
        pol.on_arrival(r, r.submitted)
    bn = pol.bn("m")
    assert bn is not None and len(bn.order) >= 2
    # runs[0] finished a long first stage: a longer expected remaining time than the others
    runs[0].begin_unit("extract_claims")
    pol.on_unit_start(runs[0], "extract_claims", 3.0)
    obs = UnitObservation("extract_claims", output_tokens=4000, service_s=200.0)
    runs[0].end_unit(obs)
    pol.on_unit_finish(runs[0], obs, 4.0)
    views = {r.run_id: pol.view(r) for r in runs}
    by_mean = sorted(views, key=lambda k: (views[k].est_rd, k))
    assert sorted((r.run_id for r in runs), key=lambda k: next(x.rank for x in runs
                                                             if x.run_id == k)) == by_mean
    req = RequestView("q", runs[1].run_id, "u", arrival=5.0, seq=0)
    assert pol.request_key(runs[1], req, 5.0)[0] == runs[1].rank
    # finished runs become training rows; the BN is relearned after refit_every of them
    for r in runs:
        pol.on_finish(r, 10.0)
    assert len(pol._rows["m"]) == 43 and pol.bn("m") is not bn


def test_policy_is_deterministic_by_seed_and_builds_without_estimators() -> None:
    make_policy("llmsched", estimators=None, seed=3)
    pool = app_pool("factool_kbqa")

    def ranks(seed: int) -> list[float]:
        pol = make_policy("llmsched", estimators=pool, prior_runs=100, epsilon=0.5, seed=seed)
        runs = []
        for i in range(12):
            r = RunState(run_id=str(i), app="m", submitted=float(i))
            pol.on_arrival(r, float(i))
            if i % 2:  # its first stage running: it has an R(X) > 0
                r.begin_unit("extract_claims")
                r.credit(0.1 * i)
                pol.on_unit_start(r, "extract_claims", float(i))
            runs.append(r)
        assert any(v.reduction > 0 for v in pol._views.values())
        return [r.rank for r in runs]

    assert ranks(5) == ranks(5)
    assert ranks(5) != ranks(6)


def test_an_explored_stage_puts_a_fraction_r_of_its_requests_first() -> None:
    # factool_kbqa's generate_queries has ~3.7 requests: 4 tasks, ceil(0.2 · 4) = 1 sampled
    pol = make_policy("llmsched", estimators=app_pool("factool_kbqa"), prior_runs=40,
                      epsilon=1.0, r=0.2, seed=0)
    wide, other = RunState(run_id="wide", app="m", submitted=0.0), RunState("other", "m", 0.0)
    for r in (wide, other):
        pol.on_arrival(r, 0.0)
    wide.begin_unit("generate_queries")
    pol.on_unit_start(wide, "generate_queries", 1.0)
    assert pol._views["wide"].tasks == 4
    keys = [pol.request_key(wide, RequestView(f"q{i}", "wide", "generate_queries", 1.0, seq=i),
                            1.0)[0] for i in range(4)]
    assert keys[0] == wide.rank < keys[1] == keys[2] == keys[3]
    # the sampled request keeps its place when re-keyed
    again = RequestView("q0", "wide", "generate_queries", 1.0, seq=0)
    assert pol.request_key(wide, again, 1.0)[0] == wide.rank


def test_missing_pgmpy_is_named_with_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """pgmpy is an optional extra: without it the policy and the benchmark say how to get it."""
    import importlib.util

    from hermes.bench.sched import check_extras
    from hermes.core.policies.base import make_policy
    from hermes.extras import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pgmpy" else real(name, *a))
    with pytest.raises(ImportError, match=r"hermes-gateway\[baselines\]"):
        make_policy("llmsched")
    monkeypatch.setitem(sys.modules, "pgmpy", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"hermes-gateway\[baselines\]"):
        check_extras(["hermes", "llmsched"])
    check_extras(["hermes", "llmsched-lite"])  # nothing missing


def test_bench_sched_default_runs_without_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A core install's default `hermes bench sched` swaps in llmsched-lite and says so."""
    import importlib.util

    from hermes.cli.bench import _default_policies

    assert "llmsched," in _default_policies() + ","  # pgmpy here (the dev extra)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pgmpy" else real(name, *a))
    names = _default_policies().split(",")
    assert "llmsched-lite" in names and "llmsched" not in names
    assert "hermes-gateway[baselines]" in capsys.readouterr().err
