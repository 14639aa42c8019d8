"""Remaining-demand estimation: Monte Carlo walks over a PDGraph, refined online.

From a run's current state (:class:`~hermes.core.state.RunProgress`: finished units with
their observed demand, the unit running now and the service it has attained), ``N`` walks
are run at once with numpy. Each walk visits units following the next-unit probabilities
(conditioned on the visit index, so capped loops stay capped) and draws each visit's demand:

- marginally: parallelism ``P`` from the unit's samples, then ``P`` per-request input and
  output token counts (or a tool duration);
- with **online refinement**: when the PDGraph's masks say a feature of the unit depends on a
  feature of its upstream unit, and the upstream's feature is known (observed, or drawn
  earlier in the same walk), the visit is drawn from the joined historical tuples whose
  upstream features fall in the same quantile buckets (a conditional empirical distribution).
  With fewer than ``min_match`` matches it relaxes to the most correlated feature alone, then
  to the marginal.

Tokens become seconds through the engine cost model (:class:`CostModel.unit_service_s`, batch
aware). The current unit is conditioned on the service it has attained (X > a), so the
remaining demand is that of X - a.

``service_s`` is **engine service**: what the LLM engines will spend on the run, the resource
the scheduling policies order. A tool call's duration is time away from the engine, like the
client's gaps between units: it is in ``wall_s``, not in ``service_s`` (a tool at the head of
a walk has ``head_s`` 0). Counting tool time as service ranked a run that still has a
long tool call but little LLM work behind runs with more LLM work, which delays the cheap run
for nothing: its LLM requests cost the engine the same whenever they are served (measured with
``hermes bench sched``: mean ACT 47.0 → 43.7 s and 38.6 → 37.8 s at seeds 0 and 1, 15-minute
window, ``llama2-7b-a100-cal``).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hermes.core.costmodel import CostModel
from hermes.core.pdgraph import END, FEATURES, NF, Edge, PDGraph, UnitNode
from hermes.core.state import RunProgress, UnitObservation

MAX_STEPS = 512
#: tokens of the estimators (:meth:`DemandEstimator._finished_key`)
_TOKENS = itertools.count()
_F = {f: i for i, f in enumerate(FEATURES)}


@dataclass(slots=True)
class DemandSamples:
    """Remaining demand of a run, one entry per Monte Carlo walk."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    service_s: np.ndarray  # isolated engine service seconds under the cost model (no tools)
    wall_s: np.ndarray  # engine service plus tool calls plus client gaps between units
    current_s: np.ndarray | None = None  # remaining service of the running unit (None: none)
    #: each walk's first invocation: the running unit's remaining part, or (between units)
    #: the next unit the walk chose, whole; ``head_gap_s`` is the client gap before it
    #: unit names (an object array of the graph's own name strings: 8 bytes a walk, where a
    #: fixed-width str array took 4 bytes a character, ~100 bytes a walk for inferred units)
    head_unit: np.ndarray | None = None
    head_s: np.ndarray | None = None
    head_input_tokens: np.ndarray | None = None
    head_output_tokens: np.ndarray | None = None
    head_gap_s: np.ndarray | None = None

    def _subset(self, keep: np.ndarray) -> dict[str, Any]:
        """The fields of the walks in ``keep``, by name (arrays; ``None`` stays ``None``)."""
        return {
            f: None if getattr(self, f) is None else getattr(self, f)[keep]
            for f in self.__slots__
        }

    def given_attained(self, more_s: float, *, min_keep: int = 1) -> DemandSamples | None:
        """The same walks, the running unit having attained ``more_s`` more seconds.

        Rejection on walks already drawn: a walk whose running invocation would have
        finished within ``more_s`` is inconsistent with what was observed and is dropped; the
        others keep their downstream demand and lose ``more_s`` of the running invocation
        (its tokens pro rata). This is the estimator's conditional X > a at the cost of a
        filter, which makes a rank refresh at every bucket boundary cheap (Hermes §4.2).
        ``None`` when no unit is running or fewer than ``min_keep`` walks survive (the
        caller then draws afresh).
        """
        if self.current_s is None or self.head_s is None:
            return None
        if more_s <= 0:
            return self
        keep = self.head_s > more_s
        if int(keep.sum()) < min_keep:
            return None
        f = self._subset(keep)
        head = f["head_s"]
        frac = (head - more_s) / head
        cut_i = f["head_input_tokens"] * (1.0 - frac)
        cut_o = f["head_output_tokens"] * (1.0 - frac)
        f.update(
            input_tokens=f["input_tokens"] - cut_i,
            output_tokens=f["output_tokens"] - cut_o,
            service_s=f["service_s"] - more_s,
            wall_s=f["wall_s"] - more_s,
            current_s=head - more_s,
            head_s=head - more_s,
            head_input_tokens=f["head_input_tokens"] - cut_i,
            head_output_tokens=f["head_output_tokens"] - cut_o,
        )
        return DemandSamples(**f)

    def given_next(self, unit: str, *, min_keep: int = 1) -> DemandSamples | None:
        """Walks drawn between units, conditioned on ``unit`` being the one that started.

        Keeps the walks whose next invocation is ``unit`` (rejection: the estimator's draw
        conditioned on the observed branch) and makes that invocation the running one, its
        client gap elapsed. ``None`` when a unit was running when the walks were drawn, or
        fewer than ``min_keep`` walks chose ``unit``.
        """
        if self.current_s is not None or self.head_unit is None:
            return None
        keep = self.head_unit == unit
        if int(keep.sum()) < min_keep:
            return None
        f = self._subset(keep)
        f["wall_s"] = f["wall_s"] - f["head_gap_s"]
        f["head_gap_s"] = np.zeros_like(f["head_gap_s"])
        f["current_s"] = f["head_s"]
        return DemandSamples(**f)

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name in ("output_tokens", "input_tokens", "service_s", "wall_s"):
            x = getattr(self, name)
            out[name] = {
                "mean": float(x.mean()),
                "p50": float(np.percentile(x, 50)),
                "p95": float(np.percentile(x, 95)),
            }
        return out


@dataclass(slots=True)
class _Unit:
    name: str
    llm: bool
    inp: np.ndarray
    out: np.ndarray
    par: np.ndarray
    dur: np.ndarray
    gap: np.ndarray
    # next-unit tables: (targets, cumulative probs) aggregate and per visit index
    nxt: tuple[np.ndarray, np.ndarray]
    nxt_by_visit: list[tuple[np.ndarray, np.ndarray]]
    branch: _BranchTable | None = None


@dataclass(slots=True)
class _BranchTable:
    """Historical invocations of a unit with what came next, indexed by (visit, buckets)."""

    feats: list[int]  # feature columns the next-unit choice depends on
    cut: list[np.ndarray]  # bucket edges per feature in ``feats``
    nxt: np.ndarray  # (n,) next unit index, -1 = end
    index: dict[tuple[int, int], np.ndarray]  # (visit, code) -> rows


@dataclass(slots=True)
class _EdgeTable:
    up: np.ndarray  # (n, NF) upstream features
    down: np.ndarray  # (n, NF) unit features
    cut: list[np.ndarray]  # per upstream feature: quantile bucket edges
    deps: list[int]  # upstream features the unit depends on, most correlated first
    dep_feats: set[int]  # unit features that depend on some upstream feature
    index: dict[tuple[int, ...], dict[int, np.ndarray]]  # dep subset -> code -> rows


class DemandEstimator:
    """Samples a run's remaining demand from its app's PDGraph."""

    def __init__(
        self,
        graph: PDGraph,
        cost: CostModel,
        *,
        n_walks: int = 1000,
        refine: bool = True,
        min_match: int = 20,
        seed: int = 0,
    ) -> None:
        self.graph = graph
        self.cost = cost
        self.n_walks = n_walks
        self.refine = refine
        self.min_match = min_match
        self.rng = np.random.default_rng(seed)
        self._names = list(graph.units)
        self._idx = {n: i for i, n in enumerate(self._names)}
        self._units = [self._compile_unit(n) for n in self._names]
        self._entry = self._table(graph.entry)
        # per unit: its informative upstream edges, most correlated first; a walk is
        # conditioned on the first of them whose upstream it has visited
        self._edges: dict[int, list[tuple[int, _EdgeTable]]] = {}
        if refine:
            ranked: dict[int, list[tuple[float, int, _EdgeTable]]] = {}
            for key, edge in graph.edges.items():
                v, _, u = key.partition("<-")
                strength = max((edge.rho.get(k, 0.0) for k, on in edge.masks.items() if on), default=0.0)
                if edge.joined and strength > 0.0:
                    ranked.setdefault(self._idx[v], []).append((strength, self._idx[u], self._compile_edge(edge)))
            for vi, lst in ranked.items():
                lst.sort(key=lambda t: -t[0])
                self._edges[vi] = [(u, t) for _, u, t in lst]
        self._boundaries: dict[tuple[str, int], np.ndarray] = {}
        self._cond_cuts = self._conditioning_cuts()
        #: names this estimator in the condition-key memos it leaves on runs' progress
        #: (an id could be reused by a later estimator; a token is not)
        self._token = next(_TOKENS)

    # ------------------------------------------------------------------ conditioning
    def _conditioning_cuts(self) -> list[list[tuple[int, list[float]]]]:
        """Per unit: the (feature, bucket edges) pairs through which an observation of it
        can change a walk: its own branch table's (the next unit chosen after it) and, for
        every downstream unit conditioned on it, that edge table's (the joined rows a later
        visit is drawn from). Nothing else of an observation reaches :meth:`sample`."""
        out: list[dict[tuple[int, tuple[float, ...]], None]] = [{} for _ in self._units]
        for ui, unit in enumerate(self._units):
            if unit.branch is not None:
                for f, cut in zip(unit.branch.feats, unit.branch.cut, strict=True):
                    out[ui][(f, tuple(cut.tolist()))] = None
        for lst in self._edges.values():
            for up, table in lst:
                for g in table.deps:
                    out[up][(g, tuple(table.cut[g].tolist()))] = None
        return [[(f, list(cut)) for f, cut in d] for d in out]

    def condition_key(self, progress: RunProgress | None = None,
                      n: int | None = None) -> tuple[Any, ...]:
        """What :meth:`sample` reads of ``progress`` (and the walk count): two states with
        equal keys give walks of one distribution, so walks drawn for one serve the other.

        The estimator reads a finished observation only through its unit's visit count and
        the quantile bucket of each feature a branch or edge table conditions on
        (:meth:`_conditioning_cuts`); the last finished unit (where the walks go on from,
        between units); the running unit and the service it attained. Runs of one app that
        start from the same place share a key whatever their exact token counts. No numpy;
        the part of the finished units is kept on ``progress`` (:meth:`_finished_key`), so a
        run's key costs O(units finished since it was last asked)."""
        n = n or self.n_walks
        if progress is None:
            return (n,)
        seen = self._finished_key(progress)
        if progress.current is not None:
            where: tuple[Any, ...] = ("at", progress.current, float(progress.current_attained_s))
        else:
            fin = progress.finished
            last = fin[-1].unit if fin else None
            where = ("after", self._idx.get(last) if last is not None else None)
        return (n, seen, where)

    def _finished_key(self, progress: RunProgress) -> tuple[Any, ...]:
        """The finished units' part of :meth:`condition_key`: per unit of the graph that
        finished (in index order), its visit count and the buckets of its latest
        observation's conditioned features.

        Kept on ``progress`` (``key_memo``: this estimator's token, the units counted, the
        last one counted, the visit counts and the buckets so far) and brought up to date
        with the units finished since: a run's finished list only grows (``RunState.
        end_unit`` appends), and every refresh point of a run asks for its key again. Any
        other change (another estimator, a list that is not the one counted) counts afresh."""
        fin = progress.finished
        count = len(fin)
        if not count:
            return ()  # (a run's arrival: nothing to keep)
        memo = progress.key_memo
        if (memo is not None and memo[0] == self._token and memo[1] <= count
                and fin[memo[1] - 1] is memo[2]):
            _, start, _, visits, codes, seen = memo
            if start == count:
                return seen  # type: ignore[no-any-return]
        else:
            start, visits, codes = 0, {}, {}
        idx = self._idx
        for obs in fin[start:] if start else fin:
            ui = idx.get(obs.unit)
            if ui is not None:
                visits[ui] = visits.get(ui, 0) + 1
                cuts = self._cond_cuts[ui]
                if cuts:
                    f = _obs_feature_list(obs, self._units[ui].llm)
                    codes[ui] = tuple([bisect_right(cut, f[g]) for g, cut in cuts])
                else:
                    codes[ui] = ()
        seen = tuple([(ui, visits[ui], codes[ui]) for ui in sorted(visits)])
        progress.key_memo = (self._token, count, fin[-1], visits, codes, seen)
        return seen

    # ------------------------------------------------------------------ compile
    def _table(self, probs: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        targets = np.array([-1 if k == END else self._idx[k] for k in probs], dtype=np.int64)
        cum = np.cumsum(np.fromiter(probs.values(), dtype=np.float64, count=len(probs)))
        if len(cum):
            cum[-1] = 1.0
        return targets, cum

    def _compile_unit(self, name: str) -> _Unit:
        node = self.graph.units[name]
        c = node.consumption

        def arr(xs: Sequence[float], default: float) -> np.ndarray:
            return np.asarray(xs if xs else [default], dtype=np.float64)

        return _Unit(
            name=name,
            llm=node.is_llm,
            inp=arr(c.input_tokens, 0),
            out=arr(c.output_tokens, 0),
            par=arr(c.parallelism, 1),
            dur=arr(c.duration_s, 0),
            gap=arr(c.gap_s, 0),
            nxt=self._table(node.next) if node.next else (np.array([-1]), np.array([1.0])),
            nxt_by_visit=[self._table(p) if p else self._table(node.next or {END: 1.0}) for p in node.next_by_visit],
            branch=self._compile_branch(node) if self.refine and node.branch_masks else None,
        )

    def _compile_branch(self, node: UnitNode) -> _BranchTable:
        rows = np.asarray(node.branch, dtype=np.float64)
        feats = [_F[f] for f in node.branch_masks]
        qs = np.linspace(0, 1, self.graph.buckets + 1)[1:-1]
        cut = [np.unique(np.quantile(rows[:, f], qs)) for f in feats]
        nxt = np.array([-1 if t == END else self._idx[t] for t in node.branch_next], dtype=np.int64)
        code = _bucket_code(rows, feats, cut)
        visit = rows[:, NF].astype(np.int64)
        index: dict[tuple[int, int], np.ndarray] = {}
        for k, c in set(zip(visit.tolist(), code.tolist(), strict=True)):
            index[(k, c)] = np.flatnonzero((visit == k) & (code == c))
        return _BranchTable(feats, cut, nxt, index)

    def _compile_edge(self, edge: Edge) -> _EdgeTable:
        rows = np.asarray(edge.joined, dtype=np.float64)
        up, down = rows[:, :NF], rows[:, NF:]
        buckets = self.graph.buckets
        cut = [np.unique(np.quantile(up[:, g], np.linspace(0, 1, buckets + 1)[1:-1])) for g in range(NF)]
        best: dict[int, float] = {}
        dep_feats: set[int] = set()
        for name, on in edge.masks.items():
            if on:
                f, _, g = name.partition("<-")
                dep_feats.add(_F[f])
                best[_F[g]] = max(best.get(_F[g], 0.0), edge.rho.get(name, 1.0))
        deps = sorted(best, key=lambda g: -best[g])
        return _EdgeTable(up, down, cut, deps, dep_feats, {})

    # ------------------------------------------------------------------ sampling
    def sample(self, progress: RunProgress | None = None, n: int | None = None) -> DemandSamples:
        """Samples of the remaining demand of a run in state ``progress`` (default: not started)."""
        progress = progress or RunProgress()
        n = n or self.n_walks
        rng = self.rng
        U = len(self._units)
        cur = np.full(n, -1, dtype=np.int64)
        visits = np.zeros((n, U), dtype=np.int64)
        # features of the latest visit of each unit in each walk (NaN: not visited yet)
        last_feat = np.full((n, U, NF), np.nan, dtype=np.float64)
        acc = np.zeros((4, n), dtype=np.float64)  # input, output, service, wall

        for obs in progress.finished:
            if obs.unit in self._idx:
                ui = self._idx[obs.unit]
                visits[:, ui] += 1
                last_feat[:, ui] = _obs_features(obs, self._units[ui].llm)
        last = progress.finished[-1] if progress.finished else None

        attained = 0.0
        if progress.current is not None:
            if progress.current not in self._idx:
                return _zeros(n)  # a unit never profiled: no basis for an estimate
            cur[:] = self._idx[progress.current]
            attained = progress.current_attained_s
        elif last is not None and last.unit in self._idx:
            li = self._idx[last.unit]
            cur[:] = self._choose_next(li, visits[:, li], rng, last_feat[:, li])
        else:
            t, c = self._entry
            cur[:] = t[np.searchsorted(c, rng.random(n), side="right").clip(max=len(t) - 1)]

        first = progress.current is not None
        head_unit = np.empty(n, dtype=object)
        head = np.zeros((4, n), dtype=np.float64)  # service, input, output, gap
        step0 = True
        for _ in range(MAX_STEPS):
            alive = np.flatnonzero(cur >= 0)
            if alive.size == 0:
                break
            nxt = np.full(n, -1, dtype=np.int64)
            cu = cur[alive]
            here = np.unique(cu)
            for u in here:
                idx = alive if here.size == 1 else alive[cu == u]
                feats, itok, otok, svc, gap = self._visit(int(u), last_feat, rng, rows=idx)
                if first:
                    pick = _consistent_draws(svc, attained)
                    feats, itok, otok, svc = feats[pick], itok[pick], otok[pick], svc[pick]
                    itok, otok, svc = _remaining_part(svc, itok, otok, attained)
                    gap = np.zeros_like(gap)
                away: np.ndarray | float = 0.0
                if not self._units[int(u)].llm:
                    # a tool call is time away from the engine, like a client gap: in the
                    # walk's wall time, not in the engine service the policies order by
                    away, svc = svc, np.zeros_like(svc)
                if step0:
                    head_unit[idx] = self._units[int(u)].name
                    head[0, idx], head[1, idx], head[2, idx], head[3, idx] = svc, itok, otok, gap
                acc[0, idx] += itok
                acc[1, idx] += otok
                acc[2, idx] += svc
                acc[3, idx] += svc + gap + away
                visits[idx, u] += 1
                last_feat[idx, u] = feats
                nxt[idx] = self._choose_next(int(u), visits[idx, u], rng, feats)
            step0 = first = False
            cur = nxt
        running = progress.current is not None
        return DemandSamples(
            acc[0], acc[1], acc[2], acc[3],
            current_s=head[0].copy() if running else None,
            head_unit=head_unit,
            head_s=head[0], head_input_tokens=head[1], head_output_tokens=head[2],
            head_gap_s=head[3],
        )

    def _choose_next(
        self, u: int, visit: np.ndarray, rng: np.random.Generator, feats: np.ndarray | None = None
    ) -> np.ndarray:
        """Next unit per walk: from the historical invocations with the same visit index and
        feature buckets when the branch depends on features (refinement), else from the
        visit-indexed probabilities."""
        unit = self._units[u]
        out = np.empty(visit.shape[0], dtype=np.int64)
        todo = np.ones(visit.shape[0], dtype=bool)
        br = unit.branch
        if br is not None and feats is not None:
            code = _bucket_code(feats, br.feats, br.cut)
            for k, c in set(zip(visit.tolist(), code.tolist(), strict=True)):
                rows = br.index.get((k, c))
                if rows is None or rows.size < self.min_match:
                    continue
                who = np.flatnonzero((visit == k) & (code == c))
                out[who] = br.nxt[rows[rng.integers(0, rows.size, who.size)]]
                todo[who] = False
        r = rng.random(len(visit))  # (an int size: numpy's stubs then type it as an array)
        for k in np.unique(visit[todo]):
            sel = todo & (visit == k)
            t, cum = unit.nxt_by_visit[k - 1] if 1 <= k <= len(unit.nxt_by_visit) else unit.nxt
            out[sel] = t[np.searchsorted(cum, r[sel], side="right").clip(max=len(t) - 1)]
        return out

    def _visit(
        self,
        u: int,
        last_feat: np.ndarray | None,
        rng: np.random.Generator,
        m: int | None = None,
        *,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Draw one invocation of unit ``u`` for each walk ``rows`` (default: all), given the
        walks' latest features of every unit (``last_feat``, (walks, U, NF), NaN where not
        visited; ``None``: marginal, ``m`` draws). Returns features (m, NF), input and output
        tokens (m,), service seconds (m,) and the gap before the invocation (m,)."""
        unit = self._units[u]
        if last_feat is not None and rows is None:
            rows = np.arange(last_feat.shape[0])
        m = rows.size if rows is not None else int(m or 0)
        par = unit.par[rng.integers(0, unit.par.size, m)]
        dur = unit.dur[rng.integers(0, unit.dur.size, m)]
        gap = unit.gap[rng.integers(0, unit.gap.size, m)]
        edges = self._edges.get(u, []) if last_feat is not None else []
        cond_i = np.full(m, np.nan) if edges else None
        cond_o = np.full(m, np.nan) if edges else None
        todo = np.ones(m, dtype=bool)  # walks not conditioned yet
        for up, table in edges:
            up_feat = last_feat[rows, up]  # type: ignore[index]
            sel = np.flatnonzero(todo & ~np.isnan(up_feat[:, 0]))
            if sel.size == 0:
                continue
            match = self._match(table, up_feat[sel], rng)
            ok = match >= 0
            if ok.any():
                s, d = sel[ok], table.down[match[ok]]
                todo[s] = False
                if _F["P"] in table.dep_feats:
                    par[s] = d[:, _F["P"]]
                if _F["D"] in table.dep_feats:
                    dur[s] = d[:, _F["D"]]
                if _F["I"] in table.dep_feats:
                    cond_i[s] = d[:, _F["I"]]  # type: ignore[index]
                if _F["O"] in table.dep_feats:
                    cond_o[s] = d[:, _F["O"]]  # type: ignore[index]
        par = np.maximum(par, 1).astype(np.int64)
        feats = np.zeros((m, NF))
        feats[:, _F["P"]] = par
        if not unit.llm:
            feats[:, _F["D"]] = dur
            zero = np.zeros(m)
            return feats, zero, zero, dur, gap
        pmax = int(par.max())
        cols = np.arange(pmax)[None, :] < par[:, None]
        imat = unit.inp[rng.integers(0, unit.inp.size, (m, pmax))]
        omat = unit.out[rng.integers(0, unit.out.size, (m, pmax))]
        imat *= cols
        omat *= cols
        # conditioned per-request means: rescale the marginal draws of the row to that mean,
        # which keeps their spread (the slowest of P parallel requests sets the unit's time)
        for mat, cond in ((imat, cond_i), (omat, cond_o)):
            if cond is None:
                continue
            hit = np.flatnonzero(~np.isnan(cond))
            if hit.size:
                mean = mat[hit].sum(axis=1) / par[hit]
                scale = np.divide(cond[hit], mean, out=np.ones(hit.size), where=mean > 0)
                mat[hit] *= scale[:, None]
        itok, otok = imat.sum(axis=1), omat.sum(axis=1)
        svc = self.cost.unit_service_s(imat, omat)
        feats[:, _F["I"]] = itok / par
        feats[:, _F["O"]] = otok / par
        feats[:, _F["T"]] = otok
        return feats, itok, otok, svc, gap

    def _match(self, table: _EdgeTable, feats: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """For each walk, a joined row whose upstream features share its buckets (-1: none)."""
        out = np.full(feats.shape[0], -1, dtype=np.int64)
        pending = np.arange(feats.shape[0])
        subsets = dict.fromkeys(tuple(table.deps[:k]) for k in (len(table.deps), 2, 1) if k <= len(table.deps))
        for subset in subsets:
            if pending.size == 0:
                break
            index = table.index.get(subset)
            if index is None:
                index = table.index[subset] = self._build_index(table, subset)
            codes = self._codes(table, subset, feats[pending])
            still = []
            for code in np.unique(codes):
                rows = index.get(int(code))
                who = pending[codes == code]
                if rows is None or rows.size < self.min_match:
                    still.append(who)
                    continue
                out[who] = rows[rng.integers(0, rows.size, who.size)]
            pending = np.concatenate(still) if still else np.empty(0, dtype=np.int64)
        return out

    def _codes(self, table: _EdgeTable, subset: tuple[int, ...], feats: np.ndarray) -> np.ndarray:
        code = np.zeros(feats.shape[0], dtype=np.int64)
        for g in subset:
            code = code * 1000 + np.searchsorted(table.cut[g], feats[:, g], side="right")
        return code

    def _build_index(self, table: _EdgeTable, subset: tuple[int, ...]) -> dict[int, np.ndarray]:
        codes = self._codes(table, subset, table.up)
        return {int(c): np.flatnonzero(codes == c) for c in np.unique(codes)}

    # ------------------------------------------------------------------ helpers for policies
    def unit_service_boundaries(self, unit: str, buckets: int) -> np.ndarray:
        """Increasing service-time quantile boundaries (seconds) of one invocation of ``unit``."""
        key = (unit, buckets)
        if key not in self._boundaries:
            if unit not in self._idx:
                return np.empty(0)
            m = 2000
            _, _, _, svc, _ = self._visit(self._idx[unit], None, self.rng, m)
            q = np.quantile(svc, np.arange(1, buckets) / buckets)
            self._boundaries[key] = np.unique(q)
        return self._boundaries[key]

    def unit_service_samples(self, unit: str, n: int = 1000) -> np.ndarray:
        """Marginal samples of the service seconds of one invocation of ``unit``."""
        if unit not in self._idx:
            return np.empty(0)
        _, _, _, svc, _ = self._visit(self._idx[unit], None, self.rng, n)
        return svc


def _bucket_code(x: np.ndarray, feats: list[int], cut: list[np.ndarray]) -> np.ndarray:
    code = np.zeros(x.shape[0], dtype=np.int64)
    for f, edges in zip(feats, cut, strict=True):
        code = code * 1000 + np.searchsorted(edges, x[:, f], side="right")
    return code


def _obs_features(obs: UnitObservation, llm: bool) -> np.ndarray:
    p = max(1, obs.parallelism)
    if llm:
        return np.array([obs.input_tokens / p, obs.output_tokens / p, float(p), 0.0, float(obs.output_tokens)])
    return np.array([0.0, 0.0, float(p), obs.duration_s, 0.0])


def _obs_feature_list(obs: UnitObservation, llm: bool) -> list[float]:
    """An observation's features (:data:`NF` of them) as plain floats: the values of
    :func:`_obs_features`, without an array (what :meth:`DemandEstimator.condition_key`
    buckets at every refresh point of a live run)."""
    p = max(1, obs.parallelism)
    if llm:
        return [obs.input_tokens / p, obs.output_tokens / p, float(p), 0.0, float(obs.output_tokens)]
    return [0.0, 0.0, float(p), float(obs.duration_s), 0.0]


def _consistent_draws(svc: np.ndarray, attained: float) -> np.ndarray:
    """Index of the draw each walk uses once the current invocation is conditioned on X > a.

    Walks whose draw is already exceeded by the attained service take the draw (features,
    tokens, service) of a consistent walk (resampling from the conditional); if none is
    consistent every walk keeps its own and the invocation is taken as about to finish.
    """
    pick = np.arange(svc.size)
    if attained <= 0:
        return pick
    ok = svc > attained
    if ok.any() and not ok.all():
        src = np.flatnonzero(ok)
        bad = np.flatnonzero(~ok)
        pick[bad] = src[np.arange(bad.size) % src.size]
    return pick


def _remaining_part(
    svc: np.ndarray, itok: np.ndarray, otok: np.ndarray, attained: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The part of an invocation still to come after ``attained`` seconds (tokens pro rata)."""
    if attained <= 0:
        return itok, otok, svc
    rem = np.maximum(svc - attained, 0.0)
    frac = np.divide(rem, svc, out=np.zeros_like(rem), where=svc > 0)
    return itok * frac, otok * frac, rem


def _zeros(n: int) -> DemandSamples:
    z = np.zeros(n)
    return DemandSamples(z, z.copy(), z.copy(), z.copy())


class EstimatorPool:
    """One estimator per app, built lazily from PDGraphs; updated as graphs are relearned."""

    def __init__(
        self,
        graphs: Mapping[str, PDGraph],
        cost: CostModel,
        *,
        refine: bool = True,
        n_walks: int = 1000,
        min_match: int = 20,
        seed: int = 0,
    ) -> None:
        self._graphs = dict(graphs)
        self.cost = cost
        self.refine = refine
        self.n_walks = n_walks
        self.min_match = min_match
        self.seed = seed
        self._est: dict[str, DemandEstimator] = {}

    def get(self, app: str) -> DemandEstimator | None:
        est = self._est.get(app)
        if est is None:
            graph = self._graphs.get(app)
            if graph is None:
                return None
            est = self._est[app] = self.build(graph)
        return est

    def build(self, graph: PDGraph) -> DemandEstimator:
        """A new estimator of ``graph`` with this pool's settings, not installed (a driver
        may build it apart, e.g. in a worker thread, and :meth:`install` it)."""
        return DemandEstimator(
            graph,
            self.cost,
            n_walks=self.n_walks,
            refine=self.refine,
            min_match=self.min_match,
            seed=self.seed + len(self._est),
        )

    def update(self, graph: PDGraph) -> None:
        self._graphs[graph.app] = graph
        self._est.pop(graph.app, None)

    def install(self, graph: PDGraph, est: DemandEstimator) -> None:
        """Serve ``graph``'s app from ``est`` (made by :meth:`build` from that graph)."""
        self._graphs[graph.app] = graph
        self._est[graph.app] = est

    def forget(self, app: str) -> None:
        """Drop an app's graph and estimator (it ranks as an unknown app until updated)."""
        self._graphs.pop(app, None)
        self._est.pop(app, None)

    def apps(self) -> list[str]:
        return sorted(self._graphs)
