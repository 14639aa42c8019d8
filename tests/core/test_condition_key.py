"""The estimator's condition key: exactly what its draw reads of a run's state."""

from __future__ import annotations

import numpy as np

from hermes.bench.sched import load_graphs
from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import DemandEstimator
from hermes.core.state import RunProgress, UnitObservation

APP = "got_docmerge"  # every unit conditioned on its upstream units' tokens (refinement)


def estimator(seed: int = 0) -> DemandEstimator:
    return DemandEstimator(load_graphs()[APP], get_cost_model("llama2-7b-a100"), n_walks=100,
                           seed=seed)


def obs(unit: str, i: int, o: int) -> UnitObservation:
    return UnitObservation(unit=unit, input_tokens=i, output_tokens=o)


def test_states_with_one_key_draw_identical_walks_under_one_seed() -> None:
    """Equal keys: the draw reads nothing else, so the same seed gives the same walks,
    token for token. Different keys: the buckets the refinement reads differ."""
    est = estimator()
    rng = np.random.default_rng(7)

    def draw(progress: RunProgress) -> object:
        est.rng = np.random.default_rng(3)
        return est.sample(progress)

    same = differ = 0
    for _ in range(40):
        i, o = (int(x) for x in rng.integers(100, 4000, 2))
        j, p = i + int(rng.integers(-40, 40)), o + int(rng.integers(-40, 40))
        a = RunProgress(finished=[obs("generate1", i, o)])
        b = RunProgress(finished=[obs("generate1", j, p)])
        if est.condition_key(a) != est.condition_key(b):
            differ += 1
            continue
        same += 1
        wa, wb = draw(a), draw(b)
        for f in ("service_s", "wall_s", "input_tokens", "output_tokens"):
            assert np.array_equal(getattr(wa, f), getattr(wb, f)), f
        if same == 12:
            break
    assert same >= 10 and differ >= 1  # both cases were exercised
    far = RunProgress(finished=[obs("generate1", 50, 5)])
    near = RunProgress(finished=[obs("generate1", 60_000, 9_000)])
    assert est.condition_key(far) != est.condition_key(near)


def test_key_reads_visits_position_and_attained_service() -> None:
    est = estimator()
    one = [obs("generate1", 500, 100)]
    assert est.condition_key(RunProgress(finished=one)) != est.condition_key(
        RunProgress(finished=one + [obs("score1", 500, 100)]))
    assert est.condition_key(RunProgress(current="score1")) != est.condition_key(
        RunProgress(current="score1", current_attained_s=0.5))
    assert est.condition_key(RunProgress(), 100) != est.condition_key(RunProgress(), 200)
    # a unit the graph does not know is not read (the draw skips it too)
    assert est.condition_key(RunProgress(finished=one)) == est.condition_key(
        RunProgress(finished=[obs("no_such_unit", 1, 1), *one]))


def _reference_key(est: DemandEstimator, progress: RunProgress, n: int) -> tuple:
    """The key as first written: every finished unit walked, its features an array."""
    from bisect import bisect_right

    from hermes.core.estimator import _obs_features

    visits: dict[int, int] = {}
    latest: dict[int, UnitObservation] = {}
    for o in progress.finished:
        ui = est._idx.get(o.unit)
        if ui is not None:
            visits[ui] = visits.get(ui, 0) + 1
            latest[ui] = o
    seen = []
    for ui in sorted(latest):
        f = _obs_features(latest[ui], est._units[ui].llm)
        seen.append((ui, visits[ui], tuple(bisect_right(cut, float(f[g]))
                                           for g, cut in est._cond_cuts[ui])))
    if progress.current is not None:
        where: tuple = ("at", progress.current, float(progress.current_attained_s))
    else:
        last = progress.finished[-1].unit if progress.finished else None
        where = ("after", est._idx.get(last) if last is not None else None)
    return (n, tuple(seen), where)


def test_a_runs_key_kept_on_its_progress_is_the_key_computed_afresh() -> None:
    """The finished units' part of the key is brought up to date on the run's progress as
    units finish; at every step it equals the key of the state computed from scratch (and
    the key as first written), for LLM and tool units of two apps, and a new estimator (a
    relearned graph) does not read another's memo."""
    rng = np.random.default_rng(11)
    cost = get_cost_model("llama2-7b-a100")
    graphs = load_graphs()
    checked = 0
    for app in (APP, "factool_kbqa"):
        est = DemandEstimator(graphs[app], cost, n_walks=100, seed=0)
        other = DemandEstimator(graphs[app], cost, n_walks=100, seed=1)
        units = [*est._names, "not-in-the-graph"]
        for _ in range(30):
            run = RunProgress()
            for _ in range(int(rng.integers(1, 9))):
                u = units[int(rng.integers(len(units)))]
                run.current, run.current_attained_s = u, float(rng.random())
                assert est.condition_key(run) == _reference_key(est, run, 100)
                run.finished.append(UnitObservation(
                    unit=u, input_tokens=int(rng.integers(1, 5000)),
                    output_tokens=int(rng.integers(1, 2000)),
                    parallelism=int(rng.integers(1, 4)), duration_s=float(rng.random() * 9)))
                run.current = None
                got = est.condition_key(run)
                fresh = RunProgress(finished=list(run.finished))
                assert got == est.condition_key(fresh) == _reference_key(est, run, 100)
                assert est.condition_key(run) == got  # asked again: the memo as it is
                assert other.condition_key(run) == _reference_key(other, run, 100)
                assert est.condition_key(run) == got  # after another estimator's ask
                checked += 1
    assert checked > 100


def test_a_progress_whose_list_was_replaced_is_keyed_afresh() -> None:
    """The memo names the last unit it counted: a progress given another list (as long or
    longer) is not read through the old memo."""
    est = estimator()
    run = RunProgress(finished=[obs("generate1", 100, 10), obs("score1", 100, 10)])
    est.condition_key(run)
    run.finished = [obs("generate1", 30_000, 9_000), obs("score1", 30_000, 9_000),
                    obs("generate1", 40, 4)]
    assert est.condition_key(run) == _reference_key(est, run, est.n_walks)
