"""The profiler: run records -> PDGraph, incrementally (one finished run at a time).

The live gateway feeds every finished run to :meth:`Profiler.add`; ``hermes profile`` feeds
a whole JSONL file. Sample lists are FIFO-capped (the newest ``max_samples`` are kept), so a
PDGraph follows an app whose behaviour drifts. Masks are recomputed lazily when the graph is
read.

A gateway keeps a profiler and its latest graph for every app it learns, each filled to its
caps once the app has ~1,000 runs: the rows of visit features (per unit, per edge) are kept in
arrays (:class:`~hermes.core.sample_rows.SampleRows`), and a graph's equal values are one float
object (:func:`_rounded_rows`): 2.4 -> 1.2 MiB per app of agent traffic at its caps, the
graphs learned unchanged (``tests/core/test_sample_rows.py``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import copysign

import numpy as np

from hermes.core.pdgraph import (
    END,
    FEATURES,
    MAX_SAMPLES,
    NF,
    SCHEMA_VERSION,
    Consumption,
    Edge,
    PDGraph,
    UnitNode,
)
from hermes.core.records import RunRecord, UnitRecord
from hermes.core.sample_rows import SampleRows

MIN_JOINED_FOR_MASKS = 20
MAX_VISIT_INDEX = 64
# a binary "went to unit X next" against bucket indices correlates less than two continuous
# demands do, so the branch threshold is lower than the masks' 0.5
BRANCH_RHO_THRESHOLD = 0.3  # visit-indexed branching is kept for the first 64 visits of a unit


def visit_features(u: UnitRecord) -> tuple[float, ...]:
    """Features of one invocation (pdgraph.FEATURES): mean input and output tokens per
    request, parallelism, tool duration (0 for LLM units) and total output tokens."""
    if u.requests:
        p = len(u.requests)
        total_out = sum(r.output_tokens for r in u.requests)
        i = sum(r.input_tokens for r in u.requests) / p
        return (i, total_out / p, float(p), float(u.duration_s or 0.0), float(total_out))
    dur = u.duration_s if u.duration_s is not None else u.finished - u.started
    return (0.0, 0.0, 1.0, float(dur), 0.0)


def bucketize(values: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantile edges of ``values`` and each value's bucket index (0..buckets-1)."""
    edges = np.unique(np.quantile(values, np.linspace(0, 1, buckets + 1)[1:-1]))
    return edges, np.searchsorted(edges, values, side="right")


def bucketed_pearson(x: np.ndarray, y: np.ndarray, buckets: int) -> float:
    """Pearson correlation of the quantile-bucket indices of x and y (0 if either is constant)."""
    _, bx = bucketize(x, buckets)
    _, by = bucketize(y, buckets)
    if bx.std() == 0 or by.std() == 0:
        return 0.0
    return float(np.corrcoef(bx, by)[0, 1])


@dataclass
class _UnitAcc:
    backend: str
    input_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    output_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    parallelism: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    loops: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    duration_s: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    gap_s: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    next_counts: Counter[str] = field(default_factory=Counter)
    next_by_visit: list[Counter[str]] = field(default_factory=list)
    #: (visit features..., visit index) of each visit, and the unit that came next
    branch: SampleRows = field(default_factory=lambda: SampleRows(NF + 1, MAX_SAMPLES))
    branch_next: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def held(self) -> int:
        """Values held (every sample list's length, a row of ``k`` features counting ``k``)."""
        return (len(self.input_tokens) + len(self.output_tokens) + len(self.parallelism)
                + len(self.loops) + len(self.duration_s) + len(self.gap_s)
                + len(self.branch) * self.branch.width + len(self.branch_next))


class Profiler:
    """Learns one app's PDGraph from its run records, one run at a time."""

    def __init__(
        self,
        app: str | None = None,
        graph: PDGraph | None = None,
        *,
        rho_threshold: float = 0.5,
        buckets: int = 10,
    ) -> None:
        self.app = app or (graph.app if graph else None)
        self.rho_threshold = graph.rho_threshold if graph else rho_threshold
        self.buckets = graph.buckets if graph else buckets
        self.branch_rho_threshold = BRANCH_RHO_THRESHOLD
        self.runs = 0
        self._units: dict[str, _UnitAcc] = {}
        self._entry: Counter[str] = Counter()
        #: "unit<-upstream" -> (upstream visit features..., visit features...) rows
        self._joined: dict[str, SampleRows] = {}
        self._cached: PDGraph | None = None
        if graph is not None:
            self._load(graph)

    # ------------------------------------------------------------------ learning
    def add(self, rec: RunRecord) -> None:
        """Learn from one completed run."""
        if self.app is None:
            self.app = rec.app
        elif rec.app != self.app:
            raise ValueError(f"run {rec.run_id} is of app {rec.app!r}, this profiler learns {self.app!r}")
        if not rec.units:
            raise ValueError(f"run {rec.run_id} of {rec.app!r} has no units")
        self._cached = None
        self.runs += 1
        self._entry[rec.units[0].unit] += 1
        visits: Counter[str] = Counter()
        last_by_unit: dict[str, int] = {}
        feats_cache: dict[int, tuple[float, ...]] = {}
        prev_end = rec.submitted
        for i, u in enumerate(rec.units):
            acc = self._units.get(u.unit)
            if acc is None:
                acc = self._units[u.unit] = _UnitAcc(backend=u.backend)
            visits[u.unit] += 1
            k = visits[u.unit]
            if u.requests:
                acc.input_tokens.extend(r.input_tokens for r in u.requests)
                acc.output_tokens.extend(r.output_tokens for r in u.requests)
                acc.parallelism.append(len(u.requests))
            else:
                acc.parallelism.append(1)
                acc.duration_s.append(visit_features(u)[3])
            acc.gap_s.append(max(0.0, u.started - prev_end))
            prev_end = max(prev_end, u.finished)
            nxt = rec.units[i + 1].unit if i + 1 < len(rec.units) else END
            acc.next_counts[nxt] += 1
            if k <= MAX_VISIT_INDEX:
                while len(acc.next_by_visit) < k:
                    acc.next_by_visit.append(Counter())
                acc.next_by_visit[k - 1][nxt] += 1
            # join this visit with the latest visit of every unit seen before it in the run
            # (the declared upstream included): the masks then say which ones matter
            feats = visit_features(u)
            acc.branch.append((*feats, float(k)))
            acc.branch_next.append(nxt)
            for up_name, up_idx in last_by_unit.items():
                key = f"{u.unit}<-{up_name}"
                rows = self._joined.get(key)
                if rows is None:
                    rows = self._joined[key] = SampleRows(2 * NF, MAX_SAMPLES)
                rows.append((*feats_cache[up_idx], *feats))
            feats_cache[i] = feats
            last_by_unit[u.unit] = i
        for name, n in visits.items():
            self._units[name].loops.append(n)

    def held_samples(self) -> int:
        """Values this profiler holds (every sample list's length, a row of ``k`` features
        counting ``k``): what grows with an app's history up to its caps (``MAX_SAMPLES``
        per list), for ``/metrics`` (``hermes_learner_size``)."""
        return (sum(acc.held() for acc in self._units.values())
                + sum(len(rows) * rows.width for rows in self._joined.values()))

    def add_many(self, records: Iterable[RunRecord]) -> int:
        n = 0
        for rec in records:
            self.add(rec)
            n += 1
        return n

    # ------------------------------------------------------------------ output
    @property
    def graph(self) -> PDGraph:
        """The PDGraph learned so far (masks recomputed if runs were added)."""
        if self._cached is None:
            self._cached = self._build()
        return self._cached

    def _build(self) -> PDGraph:
        if not self.runs or self.app is None:
            raise ValueError("no runs profiled yet")
        units = {}
        shared: dict[float, float] = {}  # one float object per distinct rounded value
        for name, acc in self._units.items():
            branch = acc.branch.array()
            units[name] = UnitNode(
                backend=acc.backend,
                visits=sum(acc.next_counts.values()),
                consumption=Consumption(
                    input_tokens=list(acc.input_tokens),
                    output_tokens=list(acc.output_tokens),
                    parallelism=list(acc.parallelism),
                    loops=list(acc.loops),
                    duration_s=[round(x, 6) for x in acc.duration_s],
                    gap_s=[round(x, 6) for x in acc.gap_s],
                ),
                next=_normalise(acc.next_counts),
                next_by_visit=[_normalise(c) for c in acc.next_by_visit],
                visits_by_index=[sum(c.values()) for c in acc.next_by_visit],
                branch=_rounded_rows(branch, shared),
                branch_next=list(acc.branch_next),
                branch_masks=self._branch_masks(acc, branch),
            )
        edges = {key: self._edge(rows, shared) for key, rows in self._joined.items()}
        return PDGraph(
            version=SCHEMA_VERSION,
            app=self.app,
            runs=self.runs,
            entry=_normalise(self._entry),
            units=units,
            edges=edges,
            rho_threshold=self.rho_threshold,
            buckets=self.buckets,
        )

    def _edge(self, rows: SampleRows, shared: dict[float, float]) -> Edge:
        arr = rows.array()
        joined = _rounded_rows(arr, shared)
        masks: dict[str, bool] = {}
        rho: dict[str, float] = {}
        if len(rows) >= MIN_JOINED_FOR_MASKS:
            for fi, f in enumerate(FEATURES):
                for gi, g in enumerate(FEATURES):
                    r = bucketed_pearson(arr[:, gi], arr[:, NF + fi], self.buckets)
                    name = f"{f}<-{g}"
                    rho[name] = round(r, 4)
                    masks[name] = r > self.rho_threshold
        return Edge(joined=joined, masks=masks, rho=rho)

    def _branch_masks(self, acc: _UnitAcc, arr: np.ndarray) -> list[str]:
        """Features whose buckets predict the next unit: for some next unit, the bucketed
        Pearson correlation between the feature and "that unit came next" exceeds
        ``branch_rho_threshold``. ``arr``: ``acc.branch`` as an array."""
        targets = set(acc.branch_next)
        if len(acc.branch) < MIN_JOINED_FOR_MASKS or len(targets) < 2:
            return []
        nxt = np.asarray(acc.branch_next)
        out = []
        for fi, f in enumerate(FEATURES):
            _, b = bucketize(arr[:, fi], self.buckets)
            if b.std() == 0:
                continue
            for t in targets:
                y = (nxt == t).astype(float)
                if y.std() > 0 and abs(np.corrcoef(b, y)[0, 1]) > self.branch_rho_threshold:
                    out.append(f)
                    break
        return out

    def _load(self, g: PDGraph) -> None:
        """Resume learning from an existing graph (counts rebuilt from probabilities x visits)."""
        self.runs = g.runs
        self._entry = Counter({k: round(p * g.runs) for k, p in g.entry.items()})
        for name, node in g.units.items():
            c = node.consumption
            acc = _UnitAcc(backend=node.backend)
            acc.input_tokens.extend(c.input_tokens)
            acc.output_tokens.extend(c.output_tokens)
            acc.parallelism.extend(c.parallelism)
            acc.loops.extend(c.loops)
            acc.duration_s.extend(c.duration_s)
            acc.gap_s.extend(c.gap_s)
            acc.next_counts = Counter({k: round(p * node.visits) for k, p in node.next.items()})
            acc.branch = SampleRows(NF + 1, MAX_SAMPLES, node.branch)
            acc.branch_next.extend(node.branch_next)
            for probs, n in zip(node.next_by_visit, node.visits_by_index, strict=False):
                acc.next_by_visit.append(Counter({k: round(p * n) for k, p in probs.items()}))
            self._units[name] = acc
        for key, edge in g.edges.items():
            self._joined[key] = SampleRows(2 * NF, MAX_SAMPLES, edge.joined)
        self._cached = g


def _rounded_rows(rows: np.ndarray, shared: dict[float, float]) -> list[tuple[float, ...]]:
    """A graph's rows: ``rows`` (a :meth:`SampleRows.array`) rounded to 2 decimals, each
    distinct value one float object (``shared``, across the graph's tables). A learned graph
    holds up to ``MAX_SAMPLES`` rows per unit and per edge, and its values repeat (token
    counts, a parallelism of 1, a visit index): a float object per value was ~24 bytes of
    each of up to 6,000 values per unit and 10,000 per edge of every app the gateway has
    learned. A value and its shared object are equal (a negative zero keeps its own, its
    sign kept)."""
    out = []
    for r in rows.tolist():
        row = []
        for x in r:
            v = round(x, 2)
            row.append(shared.setdefault(v, v) if v or copysign(1.0, v) > 0 else v)
        out.append(tuple(row))
    return out


def _normalise(counts: Counter[str]) -> dict[str, float]:
    total = sum(counts.values())
    if not total:
        return {}
    probs = {k: v / total for k, v in sorted(counts.items()) if v}
    # make the stored probabilities sum to 1 exactly despite float rounding
    last = max(probs, key=probs.__getitem__)
    probs[last] = 1.0 - sum(p for k, p in probs.items() if k != last)
    return probs


def learn(records: Iterable[RunRecord], app: str | None = None, **kw: float) -> PDGraph:
    """Learn a PDGraph from run records (all of one app)."""
    prof = Profiler(app, **kw)  # type: ignore[arg-type]
    prof.add_many(records)
    return prof.graph
