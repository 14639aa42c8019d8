"""``hermes bench estimator``: walk throughput and the value of online refinement.

For each app, 1000 fresh runs (a seed unlike the one the shipped PDGraph was learned from)
are executed in isolation. When a run's first unit finishes, the remaining service is
estimated (mean of the Monte Carlo samples) with and without online refinement and compared
with the run's true remaining service under the same cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hermes.core.costmodel import CostModel
from hermes.core.estimator import DemandEstimator
from hermes.core.pdgraph import PDGraph
from hermes.core.records import RunRecord
from hermes.core.state import RunProgress, UnitObservation

REFINE_APPS = ("got_docmerge", "factool_kbqa", "langchain_mapreduce")


def walks_per_second(graph: PDGraph, cost: CostModel, n_walks: int = 1000, repeats: int = 20) -> dict:
    """Time ``repeats`` estimates of ``n_walks`` walks from the start of the app."""
    est = DemandEstimator(graph, cost, n_walks=n_walks, seed=0)
    est.sample()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        est.sample()
        times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    return {"app": graph.app, "units": len(graph.units), "walks": n_walks,
            "median_ms": round(med * 1e3, 3), "walks_per_s": round(n_walks / med)}


def true_remaining_s(rec: RunRecord, after: int, cost: CostModel) -> float:
    """Isolated service of the units after position ``after`` (same cost model as the estimator)."""
    return float(sum(UnitObservation.from_record(u, cost).service_s for u in rec.units[after + 1 :]))


def refinement_accuracy(
    graph: PDGraph,
    records: list[RunRecord],
    cost: CostModel,
    *,
    n_walks: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """MAE of the remaining-service estimate taken when the first unit finishes."""
    refined = DemandEstimator(graph, cost, n_walks=n_walks, refine=True, seed=1)
    plain = DemandEstimator(graph, cost, n_walks=n_walks, refine=False, seed=1)
    err_r, err_p, truth = [], [], []
    for rec in records:
        state = RunProgress(finished=[UnitObservation.from_record(rec.units[0], cost)])
        t = true_remaining_s(rec, 0, cost)
        truth.append(t)
        err_r.append(abs(refined.sample(state).service_s.mean() - t))
        err_p.append(abs(plain.sample(state).service_s.mean() - t))
        if progress:
            progress(1)
    mae_r, mae_p = float(np.mean(err_r)), float(np.mean(err_p))
    return {
        "app": graph.app,
        "runs": len(records),
        "mean_remaining_s": round(float(np.mean(truth)), 3),
        "mae_refined_s": round(mae_r, 3),
        "mae_plain_s": round(mae_p, 3),
        "reduction": round(1 - mae_r / mae_p, 3) if mae_p > 0 else 0.0,
    }


def rank_agreement(
    graph: PDGraph,
    records: list[RunRecord],
    cost: CostModel,
    *,
    n_walks: int = 1000,
    seed: int = 1,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict, np.ndarray]:
    """Do Gittins and SRPT-on-the-mean order an app's runs differently?

    For every run of ``records`` and every unit boundary of it (after its 1st, 2nd, ...
    finished unit, as the scheduler re-ranks), the estimator's remaining-service samples give
    the run's two ranks: ``hermes``'s Gittins rank and ``srpt``'s mean. Over all pairs of
    these states, Kendall's tau between the two ranks says how often the two policies would
    order two runs the same way (tau = 1: always; they then make the same decisions in every
    queue), and each rank's tau against the true remaining service says how well it
    predicts. Returns the row and the states as ``[[gittins, mean, truth], ...]``."""
    from scipy.stats import kendalltau

    from hermes.core.policies.gittins import gittins_rank

    est = DemandEstimator(graph, cost, n_walks=n_walks, refine=True, seed=seed)
    states = []
    for rec in records:
        obs = [UnitObservation.from_record(u, cost) for u in rec.units]
        for k in range(len(obs) - 1):  # after the last unit nothing remains to rank
            s = est.sample(RunProgress(finished=obs[: k + 1])).service_s
            states.append((gittins_rank(s), float(s.mean()), true_remaining_s(rec, k, cost)))
        if progress:
            progress(1)
    arr = np.asarray(states, dtype=float).reshape(-1, 3)
    n = arr.shape[0]

    def tau(a: np.ndarray, b: np.ndarray) -> float:
        return float(kendalltau(a, b).statistic) if n > 1 else float("nan")

    g, m, t = arr[:, 0], arr[:, 1], arr[:, 2]
    row = {
        "app": graph.app,
        "runs": len(records),
        "states": n,
        "tau_gittins_mean": round(tau(g, m), 3),
        "discordant_pairs": round((1.0 - tau(g, m)) / 2.0, 3),
        "tau_gittins_truth": round(tau(g, t), 3),
        "tau_mean_truth": round(tau(m, t), 3),
        "median_gittins_over_mean": round(float(np.median(g / np.maximum(m, 1e-9))), 3),
    }
    return row, arr
