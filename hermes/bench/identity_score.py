"""Scoring inferred runs, units and apps against the truth the load driver knows (issue 17).

Every request of ``hermes load --identity infer`` is a :class:`Placed`: its truth (the
arrival it belongs to, its unit, its app) and what the gateway said (the run and unit of the
``X-Hermes-Run`` / ``-Unit`` answer headers, the run's app from ``GET /v1/runs/{id}``).

- **run grouping**: pairwise precision (of the request pairs the gateway put in one run, the
  share that are of one arrival) and recall (of the pairs of one arrival, the share put in one
  run), and the adjusted Rand index; all from the contingency table's cell, row and column
  counts (``sum C(n, 2)``), never a loop over pairs;
- **unit accuracy**: within each true app, the best one-to-one mapping of inferred units to
  true units (:func:`scipy.optimize.linear_sum_assignment` on the contingency table), as the
  share of the app's requests whose inferred unit maps to their true unit; an inferred unit
  is named with its inferred app, so two apps' units are never one label;
- **app accuracy**: the same over apps, one mapping for all requests; per app, the share of
  its requests whose inferred app maps to it.

A split costs as much as a merge in the accuracies (one of two inferred labels of a true one
stays unmapped), and a one-to-one mapping means that lumping everything into one label scores
the largest class's share, not 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Placed:
    """One request: the truth (``arrival``, ``app``, ``unit``) and what the gateway said."""

    arrival: int
    app: str
    unit: str
    run: str
    inferred_unit: str
    inferred_app: str


def _pairs(counts: Any) -> int:
    return sum(comb(int(n), 2) for n in counts)


def grouping(true: Sequence[Hashable], pred: Sequence[Hashable]) -> dict[str, float]:
    """Pairwise precision and recall of the ``pred`` clusters against the ``true`` ones, and
    the adjusted Rand index (Hubert and Arabie), from the contingency table."""
    n = len(true)
    same_both = _pairs(Counter(zip(true, pred, strict=True)).values())
    same_true = _pairs(Counter(true).values())
    same_pred = _pairs(Counter(pred).values())
    total = comb(n, 2)
    expected = same_true * same_pred / total if total else 0.0
    top = 0.5 * (same_true + same_pred)
    ari = (same_both - expected) / (top - expected) if top != expected else 1.0
    return {"grouping_precision": same_both / same_pred if same_pred else 1.0,
            "grouping_recall": same_both / same_true if same_true else 1.0,
            "adjusted_rand": float(ari)}


def label_mapping(true: Sequence[Hashable], pred: Sequence[Hashable]) -> dict[Hashable, Hashable]:
    """The one-to-one mapping of predicted to true labels that maps the most items right
    (Hungarian on the contingency table); predicted labels left over map to nothing."""
    from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

    if not true:
        return {}
    t_ix = {t: i for i, t in enumerate(dict.fromkeys(true))}
    p_ix = {p: i for i, p in enumerate(dict.fromkeys(pred))}
    m = np.zeros((len(t_ix), len(p_ix)))
    for t, p in zip(true, pred, strict=True):
        m[t_ix[t], p_ix[p]] += 1
    rows, cols = linear_sum_assignment(m, maximize=True)
    t_of = list(t_ix)
    p_of = list(p_ix)
    return {p_of[c]: t_of[r] for r, c in zip(rows, cols, strict=True) if m[r, c] > 0}


def matched_accuracy(true: Sequence[Hashable], pred: Sequence[Hashable]) -> float:
    """The share of items whose predicted label maps to their true label under
    :func:`label_mapping` (1 for no items)."""
    if not true:
        return 1.0
    best = label_mapping(true, pred)
    return sum(best.get(p) == t for t, p in zip(true, pred, strict=True)) / len(true)


def _block(items: Sequence[Placed], app_of: dict[Hashable, Hashable]) -> dict[str, Any]:
    g: dict[str, Any] = grouping([p.arrival for p in items], [p.run for p in items])
    by_app: dict[str, list[Placed]] = {}
    for p in items:
        by_app.setdefault(p.app, []).append(p)
    hits = sum(matched_accuracy([p.unit for p in ps], [(p.inferred_app, p.inferred_unit)
                                                       for p in ps]) * len(ps)
               for ps in by_app.values())
    g["unit_accuracy"] = hits / len(items) if items else 1.0
    g["app_accuracy"] = (sum(app_of.get(p.inferred_app) == p.app for p in items) / len(items)
                         if items else 1.0)
    g["requests"] = len(items)
    g["runs"] = len({p.arrival for p in items})
    g["inferred_runs"] = len({p.run for p in items})
    g["inferred_units"] = len({(p.inferred_app, p.inferred_unit) for p in items})
    g["inferred_apps"] = len({p.inferred_app for p in items})
    return g


def score(placed: Sequence[Placed]) -> dict[str, Any]:
    """The ``identity`` object of ``hermes load --identity infer`` (module docstring): the
    figures over all requests, and ``per_app`` the same over each true app's requests (app
    accuracy under the one mapping of all requests)."""
    app_of = label_mapping([p.app for p in placed], [p.inferred_app for p in placed])
    out = _block(placed, app_of)
    apps = sorted({p.app for p in placed})
    out["per_app"] = {a: _block([p for p in placed if p.app == a], app_of) for a in apps}
    return out
