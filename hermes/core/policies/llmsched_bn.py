"""LLMSched as published (Zhu et al., 2025): a Bayesian network per app and Algorithm 1.

``llmsched-lite`` (:mod:`hermes.core.policies.llmsched`) approximates LLMSched with the PDGraph
estimator's walks; this module follows the paper's three components:

**Bayesian-network profiler (§IV-B).** One discrete BN per app, over its *stages*. A stage is
the ``k``-th invocation of a unit (node ``unit#k``, ``k < max_visits - 1``); the invocations
from ``max_visits - 1`` on are one node ``unit#tail`` holding their summed duration, which
pads loops to a fixed chain as the paper does for chain-like apps. State 0 of a node means
"not executed" (duration 0 s, the paper's convention for stages a job does not reach);
states ``1..k`` are ``k <= max_bins`` (6 in the paper) equal-frequency intervals of the
executed durations. An LLM stage's duration is its isolated engine service (cost-model
seconds); a regular (tool) stage is binary, executed or not, with its mean observed duration
(the paper: "the duration of a regular task is generally certain"). The structure is learned
by hill climbing (pgmpy ``HillClimbSearch`` on ``score``: ``"bic-d"`` by default, ``"bdeu"``
and ``"k2"`` too; at most ``max_indegree`` parents, edges only from earlier to later stages)
and the CPDs by BDeu with an equivalent sample size of 1 (``BayesianEstimator``); the paper
learns with pyAgrum and does not say how. Training
rows are completed runs: the runs this policy sees finish (``on_finish``), preceded by
``prior_runs`` runs synthesized from the app's PDGraph estimator (stage by stage with
``est.sample(progress, 1)``, so its online refinement carries the inter-stage correlations)
so that a BN exists from the first arrival; the BN is relearned every ``refit_every``
finished runs on the latest ``max_rows`` rows. Posteriors ``P(Y | E)`` given the finished
stages ``E`` come from ``VariableElimination`` and are cached per (app, evidence).

**Uncertainty quantification (§IV-C, Eq. 6).** For the ready stage ``X`` of a run,
``R(X) = I(Y_1..Y_M; X | E) · Σ_m Range(Y_m)``, with ``Y_m`` the stages not yet observed that
``X`` reaches by a directed path in the BN (Eq. 1), ``I`` in bits from the joint posterior
``P(X, Y_1..Y_M | E)`` (Eq. 5 as printed has a stray minus sign: ``I >= 0``) and ``Range(Y)`` the width (s) of the support of ``P(Y | E)``
(states with probability above ``support_p = 0.02``, so that the BDeu prior's pseudo-counts
do not widen it). The joint is capped at ``max_joint`` entries
(the nearest descendants are kept). Apps here have no *dynamic stage* (Eq. 4): which units a
run executes is carried by the nodes' "not executed" states, so structural uncertainty is
part of ``I``.

**Scheduler (§IV-D, Algorithm 1).** Lines 1-4: ``S_t`` = runs by expected remaining duration
(``E[remaining | E]``; the running stage by ``E[X - a | X > a, E]`` for attained ``a``).
Line 5: runs grouped into non-overlapping sets by the support interval of their remaining
duration; lines 6-10: ``S_u`` = the sets by lower bound, each set's runs by ``R`` (highest
first). Lines 11-20: walk both lists; at step ``i`` draw ``p``; ``p <= epsilon`` attaches a
sample of ``ceil(r · tasks)`` of ``S_u[i]``'s tasks, else all of ``S_t[i]``'s tasks; line 21:
what is left goes to the end in ``S_t`` order. Mapping onto the policy interface (a rank per
run, a key per request): a run's rank is the position of its first entry in that list, and
its requests take the position of the entry that holds them (the first ``ceil(r · tasks)``
distinct requests of a sampled stage take the sampled entry's, the others the later one's),
``tasks`` being the unit's mean parallelism in the PDGraph. The list is rebuilt (fresh draws)
at each event of any run (arrival, unit start or finish, every ``quantum_s`` of service), so
every run's rank may change: ``dynamic_keys`` with ``key_scope = "all"``. One list serves
both executor kinds (T_r and T_l of the paper): each queue orders its own requests by it.

Defaults the paper leaves open: ``epsilon = 0.1`` and ``r = 0.2`` (Fig. 9 shows an interior
optimum of both and "a suitably small task sampling ratio is preferred"), ``max_visits = 3``,
``max_nodes = 12``, ``max_indegree = 2``, ``prior_runs = 100`` (each cut at 64
invocations), ``refit_every = 25``, ``max_rows = 1000``. Batching-aware calibration (Eq. 2)
is not applied: LLM stage durations are isolated cost-model service, and a policy sees
no batch size; ``d_t = d_r`` is the case ``b_t = b_r``. Runs of an app without a BN (no
estimator and fewer than ``min_rows`` finished runs) are ranked by attained service in
``S_t`` with ``R = 0``. ``quantum_s = 1.0`` s of service between two refreshes of a running
stage's estimate. Draws come from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.state import RequestView, RunProgress, RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import EstimatorPool

TAIL = "tail"
#: a completed run as the BN sees it: stage node -> duration (s); absent: not executed
Row = dict[str, float]


# ----------------------------------------------------------------------------- stages
def stage_of(unit: str, visit: int, max_visits: int) -> str:
    """The BN node of the ``visit``-th (0-based) invocation of ``unit``."""
    return f"{unit}#{visit}" if visit < max_visits - 1 else f"{unit}#{TAIL}"


def run_row(
    finished: Iterable[UnitObservation], max_visits: int, regular: Callable[[str], bool]
) -> Row:
    """Stage durations of a run's finished invocations: engine service for LLM units, the
    observed duration for regular ones; tail invocations summed."""
    row: Row = {}
    visits: dict[str, int] = {}
    for obs in finished:
        k = visits.get(obs.unit, 0)
        visits[obs.unit] = k + 1
        node = stage_of(obs.unit, k, max_visits)
        d = obs.duration_s if regular(obs.unit) else obs.service_s
        row[node] = row.get(node, 0.0) + float(d)
    return row


@dataclass(frozen=True, slots=True)
class StageBins:
    """Discretization of one stage: state 0 = not executed, 1..k = equal-frequency intervals.

    ``edges``: the k-1 inner cut points; ``mean``/``lo``/``hi``: per state, the mean, min and
    max training duration (0 for state 0). A regular stage has k = 1 (executed or not).
    """

    edges: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def fit(cls, values: np.ndarray, max_bins: int, regular: bool) -> StageBins:
        v = np.sort(np.asarray(values, dtype=np.float64))
        if regular or v.size == 0:
            m = float(v.mean()) if v.size else 0.0
            return cls(np.empty(0), np.array([0.0, m]), np.array([0.0, m]), np.array([0.0, m]))
        k = max(1, min(max_bins, np.unique(v).size))
        edges = np.unique(np.quantile(v, np.linspace(0.0, 1.0, k + 1)[1:-1]))
        s = np.searchsorted(edges, v, side="right")
        n = edges.size + 1
        mean, lo, hi = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
        for i in range(n):
            x = v[s == i]
            if x.size:
                mean[i + 1], lo[i + 1], hi[i + 1] = x.mean(), x[0], x[-1]
            else:  # an empty interval (ties): its bounds
                left = edges[i - 1] if i > 0 else v[0]
                right = edges[i] if i < edges.size else v[-1]
                mean[i + 1], lo[i + 1], hi[i + 1] = (left + right) / 2, left, right
        return cls(edges, mean, lo, hi)

    @property
    def card(self) -> int:
        return int(self.mean.size)

    def state(self, duration: float | None) -> int:
        """The state of an observed duration (``None``: not executed)."""
        if duration is None:
            return 0
        if self.edges.size == 0:
            return 1
        return 1 + int(np.searchsorted(self.edges, duration, side="right"))


@dataclass(slots=True)
class Posterior:
    """What the BN says about the unobserved stages of a run, given evidence ``E``."""

    marginals: dict[str, np.ndarray]  # node -> P(node | E)
    reductions: dict[str, float] = field(default_factory=dict)  # ready node -> R(X)


def _entropy_bits(p: np.ndarray) -> float:
    q = p[p > 0]
    return float(-(q * np.log2(q)).sum())


def mutual_information_bits(joint: np.ndarray) -> float:
    """``I(X; Y)`` in bits from a joint table whose axis 0 is X (other axes: Y, jointly)."""
    p = np.asarray(joint, dtype=np.float64)
    p = p / p.sum()
    px = p.reshape(p.shape[0], -1).sum(axis=1)
    py = p.reshape(p.shape[0], -1).sum(axis=0)
    i = _entropy_bits(px) + _entropy_bits(py) - _entropy_bits(p.ravel())
    return max(0.0, i)


class StageBN:
    """A learned discrete BN over an app's stages, with cached posterior queries."""

    def __init__(self, model: Any, bins: Mapping[str, StageBins], order: Sequence[str],
                 *, support_p: float = 0.02, max_joint: int = 50_000) -> None:
        from pgmpy.inference import VariableElimination  # type: ignore[import-untyped]

        self.model = model
        self.bins = dict(bins)
        self.order = list(order)
        self.support_p = support_p
        self.max_joint = max_joint
        self._ve = VariableElimination(model)
        self._post: dict[tuple[tuple[str, int], ...], Posterior] = {}
        self._children: dict[str, list[str]] = {n: sorted(model.successors(n)) for n in order}

    # -- learning ---------------------------------------------------------------------------
    @classmethod
    def learn(
        cls,
        rows: Sequence[Row],
        regular: Callable[[str], bool],
        *,
        max_bins: int = 6,
        max_nodes: int = 12,
        max_indegree: int = 2,
        min_share: float = 0.02,
        score: str = "bic-d",
        edges: Sequence[tuple[str, str]] | None = None,
        support_p: float = 0.02,
        max_joint: int = 50_000,
    ) -> StageBN:
        """Learn the structure (unless ``edges`` is given) and the CPDs from completed runs.

        Nodes: the stages executed in at least ``min_share`` of the rows, the most frequent
        ``max_nodes``, in order of their mean position in the runs (the temporal order the
        structure search must respect)."""
        import pandas as pd  # type: ignore[import-untyped]
        from pgmpy.models import DiscreteBayesianNetwork  # type: ignore[import-untyped]

        if not rows:
            raise ValueError("no rows to learn from")
        count: dict[str, int] = {}
        pos: dict[str, float] = {}
        for row in rows:
            for i, node in enumerate(row):
                count[node] = count.get(node, 0) + 1
                pos[node] = pos.get(node, 0.0) + i
        keep = [n for n in count if count[n] >= min_share * len(rows)]
        keep = sorted(keep, key=lambda n: (-count[n], n))[:max_nodes]
        order = sorted(keep, key=lambda n: (pos[n] / count[n], n))
        bins = {
            n: StageBins.fit(np.array([r[n] for r in rows if n in r]), max_bins,
                             regular(n.rpartition("#")[0]))
            for n in order
        }
        data = pd.DataFrame({n: [bins[n].state(r.get(n)) for r in rows] for n in order})
        states = {n: list(range(bins[n].card)) for n in order}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if edges is None:
                edges = cls._search(data.astype("category"), order, max_indegree, score)
            model = DiscreteBayesianNetwork(list(edges))
            model.add_nodes_from(order)
            from pgmpy.estimators import BayesianEstimator  # type: ignore[import-untyped]

            est = BayesianEstimator(model, data, state_names=states)
            model.add_cpds(*[est.estimate_cpd(n, prior_type="BDeu", equivalent_sample_size=1)
                             for n in order])
        return cls(model, bins, order, support_p=support_p, max_joint=max_joint)

    @staticmethod
    def _search(data: Any, order: Sequence[str], max_indegree: int,
                score: str) -> list[tuple[str, str]]:
        """Hill climbing on ``score`` (a pgmpy discrete score), edges only forward in
        ``order``."""
        if len(order) < 2:
            return []
        from pgmpy.causal_discovery import ExpertKnowledge  # type: ignore[import-untyped]
        from pgmpy.estimators import HillClimbSearch

        later = {n: i for i, n in enumerate(order)}
        forbidden = [(b, a) for a in order for b in order if later[b] > later[a]]
        dag = HillClimbSearch(data).estimate(
            scoring_method=score, max_indegree=max_indegree,
            expert_knowledge=ExpertKnowledge(forbidden_edges=forbidden), show_progress=False,
        )
        return [(str(u), str(v)) for u, v in dag.edges()]

    # -- inference --------------------------------------------------------------------------
    def evidence(self, row: Row, done: Iterable[str]) -> tuple[tuple[str, int], ...]:
        """Evidence ``E`` from a run's finished stages ``done`` (durations in ``row``)."""
        return tuple(sorted((n, self.bins[n].state(row[n])) for n in set(done) if n in self.bins))

    def posterior(self, evidence: tuple[tuple[str, int], ...]) -> Posterior:
        """``P(Y | E)`` for every unobserved stage ``Y`` (cached per evidence)."""
        post = self._post.get(evidence)
        if post is None:
            ev = dict(evidence)
            marg: dict[str, np.ndarray] = {}
            for n in self.order:
                if n in ev:
                    continue
                q = self._ve.query([n], evidence=ev or None, show_progress=False)
                marg[n] = np.asarray(q.values, dtype=np.float64)
            post = self._post[evidence] = Posterior(marg)
        return post

    def descendants(self, node: str) -> list[str]:
        """Stages ``node`` reaches by a directed path (Eq. 1), nearest first."""
        seen: dict[str, None] = {}
        frontier = [node]
        while frontier:
            nxt: list[str] = []
            for n in frontier:
                for c in self._children.get(n, []):
                    if c not in seen and c != node:
                        seen[c] = None
                        nxt.append(c)
            frontier = nxt
        return list(seen)

    def support(self, node: str, p: np.ndarray) -> tuple[float, float]:
        """Bounds (s) of the support of a stage's distribution ``p``."""
        b = self.bins[node]
        on = np.flatnonzero(p > self.support_p)
        if on.size == 0:
            return 0.0, 0.0
        return float(b.lo[on].min()), float(b.hi[on].max())

    def reduction(self, node: str, evidence: tuple[tuple[str, int], ...]) -> float:
        """``R(X) = I(Y_1..Y_M; X | E) · Σ Range(Y_m)`` (Eq. 6) for stage ``X = node``."""
        post = self.posterior(evidence)
        hit = post.reductions.get(node)
        if hit is not None:
            return hit
        ev = dict(evidence)
        r = 0.0
        if node in self.bins and node not in ev:
            ys: list[str] = []
            size = self.bins[node].card
            for y in self.descendants(node):
                if y in ev or size * self.bins[y].card > self.max_joint:
                    continue
                ys.append(y)
                size *= self.bins[y].card
            if ys:
                q = self._ve.query([node, *ys], evidence=ev or None, joint=True,
                                   show_progress=False)
                axes = [list(q.variables).index(v) for v in [node, *ys]]
                joint = np.transpose(np.asarray(q.values, dtype=np.float64), axes)
                ranges = 0.0
                for y in ys:
                    lo, hi = self.support(y, post.marginals[y])
                    ranges += hi - lo
                r = mutual_information_bits(joint) * ranges
        post.reductions[node] = r
        return r

    def remaining(self, evidence: tuple[tuple[str, int], ...],
                  partial: Mapping[str, float]) -> tuple[float, float, float]:
        """``(mean, lo, hi)`` of the remaining duration: the unobserved stages' posterior
        means and support bounds, summed. A stage in ``partial`` (the running one, or a loop
        tail with invocations done) has run ``partial[node]`` seconds: it is conditioned on
        ``X >= a`` and counts ``X - a``."""
        post = self.posterior(evidence)
        mean = lo = hi = 0.0
        for n, p in post.marginals.items():
            b = self.bins[n]
            a = partial.get(n)
            if a is None:
                mean += float((p * b.mean).sum())
                s_lo, s_hi = self.support(n, p)
                lo, hi = lo + s_lo, hi + s_hi
                continue
            alive = p * (b.hi >= a)
            alive[0] = 0.0  # it has run: executed
            if alive.sum() <= 0.0:
                continue
            alive = alive / alive.sum()
            mean += float((alive * np.maximum(b.mean - a, 0.0)).sum())
            on = np.flatnonzero(alive > self.support_p)
            if on.size:
                lo += max(0.0, float(b.lo[on].min()) - a)
                hi += max(0.0, float(b.hi[on].max()) - a)
        return mean, lo, hi


# ----------------------------------------------------------------------------- Algorithm 1
@dataclass(frozen=True, slots=True)
class JobView:
    """A run as Algorithm 1 sees it: its remaining-duration estimate, the support interval
    of that estimate, its ready stage's uncertainty reduction and how many tasks it has."""

    job_id: str
    est_rd: float
    lo: float
    hi: float
    reduction: float = 0.0
    tasks: int = 1


@dataclass(frozen=True, slots=True)
class Placement:
    """A run's entries in the preference list: ``first`` holds ``quota`` of its ready
    stage's tasks (``None``: all of them), ``rest`` the others."""

    first: float
    quota: int | None
    rest: float


def non_overlapping_sets(jobs: Iterable[JobView]) -> list[list[JobView]]:
    """Line 5: jobs grouped so that the intervals of different groups do not overlap,
    groups by lower bound."""
    groups: list[list[JobView]] = []
    top = -math.inf
    for j in sorted(jobs, key=lambda j: (j.lo, j.hi, j.job_id)):
        if groups and j.lo <= top:
            groups[-1].append(j)
            top = max(top, j.hi)
        else:
            groups.append([j])
            top = j.hi
    return groups


def preference_lists(jobs: Sequence[JobView]) -> tuple[list[JobView], list[JobView]]:
    """``(S_t, S_u)``: lines 1-4 (by expected remaining duration) and 5-10 (non-overlapping
    sets by lower bound, each by uncertainty reduction, highest first)."""
    s_t = sorted(jobs, key=lambda j: (j.est_rd, j.job_id))
    s_u = [j for g in non_overlapping_sets(jobs)
           for j in sorted(g, key=lambda j: (-j.reduction, j.est_rd, j.job_id))]
    return s_t, s_u


def uncertainty_aware_order(
    jobs: Sequence[JobView], epsilon: float, r: float, draw: Callable[[], float]
) -> dict[str, Placement]:
    """Algorithm 1 (lines 11-22): ε-greedy walk over ``S_t`` and ``S_u``; ``draw()`` gives
    ``p`` in ``[0, 1)`` per step. Returns each job's placement in the preference list."""
    s_t, s_u = preference_lists(jobs)
    first: dict[str, float] = {}
    quota: dict[str, int | None] = {}
    rest: dict[str, float] = {}
    pos = 0
    for jt, ju in zip(s_t, s_u, strict=True):
        p = draw()
        if epsilon > 0.0 and p <= epsilon:  # explore: a sample of S_u's stage
            if ju.job_id not in first:
                q = max(1, math.ceil(r * ju.tasks))
                first[ju.job_id] = pos
                quota[ju.job_id] = None if q >= ju.tasks else q
                if q >= ju.tasks:
                    rest[ju.job_id] = pos
        elif jt.job_id not in first:  # exploit: all of S_t's stage
            first[jt.job_id] = rest[jt.job_id] = pos
            quota[jt.job_id] = None
        elif jt.job_id not in rest:
            rest[jt.job_id] = pos
        pos += 1
    for j in s_t:  # line 21: what is left, at the end
        if j.job_id not in first:
            first[j.job_id] = rest[j.job_id] = pos
            quota[j.job_id] = None
            pos += 1
        elif j.job_id not in rest:
            rest[j.job_id] = pos
            pos += 1
    return {k: Placement(float(first[k]), quota[k], float(rest[k])) for k in first}


# ----------------------------------------------------------------------------- the policy
def synthesize_rows(est: Any, n: int, max_visits: int, regular: Callable[[str], bool],
                    tool_s: Callable[[str], float], max_steps: int = 64) -> list[Row]:
    """``n`` completed runs drawn from a PDGraph estimator stage by stage (one walk per
    step, conditioned on the stages drawn so far)."""
    rows: list[Row] = []
    units = set(getattr(getattr(est, "graph", None), "units", {}) or {})
    for _ in range(n):
        prog = RunProgress()
        for _ in range(max_steps):
            s = est.sample(prog, 1)
            head = getattr(s, "head_unit", None)
            if head is None or str(head[0]) not in units:
                break
            u = str(head[0])
            svc = float(s.head_s[0])
            prog.finished.append(UnitObservation(
                unit=u, input_tokens=int(s.head_input_tokens[0]),
                output_tokens=int(s.head_output_tokens[0]),
                duration_s=tool_s(u) if regular(u) else svc, service_s=svc))
        rows.append(run_row(prog.finished, max_visits, regular))
    return rows


@register("llmsched")
class LLMSchedBNPolicy(SchedulingPolicy):
    """LLMSched with a Bayesian network per app and Algorithm 1 (see the module doc)."""

    name: ClassVar[str] = "llmsched"
    uses_estimator: ClassVar[bool] = True
    refine: ClassVar[bool] = True
    dynamic_keys: ClassVar[bool] = True
    key_scope: ClassVar[str] = "all"

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        epsilon: float = 0.1,
        r: float = 0.2,
        max_bins: int = 6,
        max_visits: int = 3,
        max_nodes: int = 12,
        max_indegree: int = 2,
        score: str = "bic-d",
        prior_runs: int = 100,
        min_rows: int = 20,
        refit_every: int = 25,
        max_rows: int = 1000,
        quantum_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0 or not 0.0 <= r <= 1.0:
            raise ValueError(f"epsilon and r must be in [0, 1], got {epsilon}, {r}")
        if max_visits < 1 or max_bins < 1:
            raise ValueError("max_visits and max_bins must be >= 1")
        if importlib.util.find_spec("pgmpy") is None:
            # an optional extra (pgmpy pulls pandas, scikit-learn and statsmodels: ~250 MB):
            # fail at construction, naming the fix, not at the first ranking
            raise ImportError("policy 'llmsched' needs pgmpy: pip install "
                              "'hermes-gateway[baselines]' (or choose 'llmsched-lite')")
        self.estimators = estimators
        self.epsilon = epsilon
        self.r = r
        self.max_bins = max_bins
        self.max_visits = max_visits
        self.max_nodes = max_nodes
        self.max_indegree = max_indegree
        self.score = score
        self.prior_runs = prior_runs
        self.min_rows = min_rows
        self.refit_every = refit_every
        self.max_rows = max_rows
        self.quantum_s = quantum_s
        self.rng = np.random.default_rng(seed)
        self._rows: dict[str, deque[Row]] = {}
        self._fresh: dict[str, int] = {}  # finished runs since the app's BN was learned
        self._bn: dict[str, StageBN | None] = {}
        self._active: dict[str, RunState] = {}
        self._views: dict[str, JobView] = {}
        self._place: dict[str, Placement] = {}

    # -- per-app knowledge ------------------------------------------------------------------
    def _graph_unit(self, app: str, unit: str) -> Any:
        est = None if self.estimators is None else self.estimators.get(app)
        graph = getattr(est, "graph", None)
        return None if graph is None else graph.units.get(unit)

    def _regular(self, app: str) -> Callable[[str], bool]:
        def regular(unit: str) -> bool:
            node = self._graph_unit(app, unit)
            return node is not None and not node.is_llm
        return regular

    def _tool_s(self, app: str) -> Callable[[str], float]:
        def tool_s(unit: str) -> float:
            node = self._graph_unit(app, unit)
            d = [] if node is None else node.consumption.duration_s
            return float(np.mean(d)) if d else 0.0
        return tool_s

    def _tasks(self, app: str, unit: str | None) -> int:
        node = None if unit is None else self._graph_unit(app, unit)
        par = [] if node is None else node.consumption.parallelism
        return max(1, round(float(np.mean(par)))) if par else 1

    def bn(self, app: str) -> StageBN | None:
        """The app's BN, learned on first use and relearned every ``refit_every`` runs."""
        if app in self._bn and self._fresh.get(app, 0) < self.refit_every:
            return self._bn[app]
        rows = self._rows.get(app)
        if rows is None:
            rows = self._rows[app] = deque(maxlen=self.max_rows)
            est = None if self.estimators is None else self.estimators.get(app)
            if est is not None and self.prior_runs > 0:
                rows.extend(synthesize_rows(est, self.prior_runs, self.max_visits,
                                            self._regular(app), self._tool_s(app)))
        self._fresh[app] = 0
        bn = None
        if len(rows) >= self.min_rows and any(rows):
            bn = StageBN.learn(list(rows), self._regular(app), max_bins=self.max_bins,
                               max_nodes=self.max_nodes, max_indegree=self.max_indegree,
                               score=self.score)
        self._bn[app] = bn
        return bn

    # -- one run's view -----------------------------------------------------------------------
    def view(self, run: RunState) -> JobView:
        """The run's remaining-duration estimate, interval and ready stage's ``R(X)``."""
        bn = self.bn(run.app)
        prog = run.progress
        tasks = self._tasks(run.app, prog.current)
        if bn is None:
            a = run.attained_s
            return JobView(run.run_id, a, a, a, 0.0, tasks)
        regular = self._regular(run.app)
        row = run_row(prog.finished, self.max_visits, regular)
        running = None
        partial = {n: d for n, d in row.items() if n.endswith(f"#{TAIL}")}
        if prog.current is not None:
            running = stage_of(prog.current, prog.visits(prog.current), self.max_visits)
            # a tail stage's earlier invocations count as attained
            partial[running] = partial.get(running, 0.0) + prog.current_attained_s
        done = [n for n in row if n not in partial]
        ev = bn.evidence(row, done)
        mean, lo, hi = bn.remaining(ev, partial)
        red = bn.reduction(running, ev) if running is not None else 0.0
        return JobView(run.run_id, mean, lo, hi, red, tasks)

    # -- hooks --------------------------------------------------------------------------------
    def rank(self, run: RunState, now: float) -> float:
        self._active[run.run_id] = run
        self._views[run.run_id] = self.view(run)
        run.next_refresh_attained_s = run.attained_s + self.quantum_s
        self._reorder()
        return self._place[run.run_id].first

    def _reorder(self) -> None:
        """Algorithm 1 over every active run; sets each run's rank."""
        self._place = uncertainty_aware_order(
            list(self._views.values()), self.epsilon, self.r, self.rng.random)
        for rid, p in self._place.items():
            self._active[rid].rank = p.first

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        run.policy_state["llmsched_granted"] = set()
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def on_finish(self, run: RunState, now: float) -> None:
        if run.app not in self._rows:
            self.bn(run.app)  # the prior rows first
        self._active.pop(run.run_id, None)
        self._views.pop(run.run_id, None)
        self._place.pop(run.run_id, None)
        row = run_row(run.progress.finished, self.max_visits, self._regular(run.app))
        self._rows.setdefault(run.app, deque(maxlen=self.max_rows)).append(row)
        self._fresh[run.app] = self._fresh.get(run.app, 0) + 1

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        p = self._place.get(run.run_id)
        if p is None:
            return (run.rank, run.submitted, req.arrival, req.seq)
        pos = p.first
        if p.quota is not None:
            granted: set[str] = run.policy_state.setdefault("llmsched_granted", set())
            if req.request_id in granted or len(granted) < p.quota:
                granted.add(req.request_id)
            else:
                pos = p.rest
        return (pos, run.submitted, req.arrival, req.seq)
