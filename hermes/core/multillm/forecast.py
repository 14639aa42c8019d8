"""Per-service demand forecast from application runs in flight (Hermes' placement input).

SeaLLM places services from the *recent* request rate of each service. Hermes knows more: the
requests come from multi-step applications, and a run in flight tells which unit it is in and,
through the app's transition table (its PDGraph), which services it will likely call next and
with how many tokens. The forecast of a service's demand over the next ``horizon_s`` is:

- for every run in flight: the expected calls it issues within the horizon, unit by unit,
  following the transition table from its current unit (``next``; ``""`` = the run ends);
- plus new runs: ``rate × horizon`` runs per app, starting uniformly over the horizon, each
  contributing the calls its entry distribution leads to before the horizon ends.

Time inside a run is a mean per unit, ``step_s`` (from one call's issue to the next call's
issue: execution plus gap). The probability mass over units is propagated step by step; a
step counts while the mass-weighted mean issue time is before the horizon (an approximation:
the mass is not split by its own path durations).

Why a minimal table and not :class:`hermes.core.pdgraph.PDGraph` itself: the forecast needs,
per unit, the service it runs on, a step time and mean tokens. A PDGraph has the transitions
and token samples but not the LLM units' execution time nor the placement's service names
(which here are model × length-cluster), so :meth:`AppTable.from_pdgraph` builds the table
from a PDGraph plus those two mappings, and the forecast itself works on the table.
No I/O, no clock: times are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hermes.core.backend import BackendSpec
from hermes.core.costmodel import CostModel
from hermes.core.pdgraph import END, PDGraph

#: propagation stops after this many steps or when less than MIN_MASS of a run is left
MAX_STEPS = 256
MIN_MASS = 1e-6
#: start instants (midpoints) over which new runs of an app are averaged
ARRIVAL_POINTS = 8


@dataclass(frozen=True)
class Unit:
    """One unit of an app: the service it calls, mean tokens per call (input + output), and
    ``step_s``, the mean time from its call's issue to the run's next call's issue."""

    service: str
    tokens: float
    step_s: float

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.step_s < 0:
            raise ValueError(f"unit on {self.service!r}: tokens and step_s must be >= 0")


@dataclass(frozen=True)
class AppTable:
    """An app's units, entry probabilities and next-unit probabilities (``""`` ends the run)."""

    name: str
    units: Mapping[str, Unit]
    entry: Mapping[str, float]
    next: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for where, probs in [("entry", self.entry), *((f"next[{u}]", p) for u, p in self.next.items())]:
            if probs and abs(sum(probs.values()) - 1.0) > 1e-6:
                raise ValueError(f"app {self.name!r}: {where} probabilities sum to {sum(probs.values())}")
            for u in probs:
                if u != END and u not in self.units:
                    raise ValueError(f"app {self.name!r}: {where} names unknown unit {u!r}")

    @classmethod
    def from_pdgraph(cls, graph: PDGraph, service_of: Mapping[str, str],
                     step_s: Mapping[str, float]) -> AppTable:
        """The table of ``graph``: ``service_of[unit]`` and ``step_s[unit]`` supply what a
        PDGraph does not hold; tokens are the mean sampled input + output tokens per request,
        times the mean parallelism (requests per invocation)."""
        units = {}
        for name, node in graph.units.items():
            c = node.consumption
            tok = (mean_or_zero(c.input_tokens) + mean_or_zero(c.output_tokens)) * (mean_or_zero(c.parallelism) or 1.0)
            units[name] = Unit(service_of[name], tok, step_s[name])
        return cls(graph.app, units, dict(graph.entry), {u: dict(n.next) for u, n in graph.units.items()})

    def visits(self, start: Mapping[str, float], horizon_s: float, delay_s: float = 0.0,
               include_start: bool = False) -> dict[str, float]:
        """Expected calls per unit issued before ``horizon_s``, for a run whose current unit is
        distributed as ``start``. The first next call is issued ``delay_s`` from now (the rest
        of the current unit's step); ``include_start`` counts ``start`` itself as calls issued
        now (a new run's entry call)."""
        out: dict[str, float] = {}
        mass = {u: p for u, p in start.items() if p > 0 and u != END}
        if include_start:
            for u, p in mass.items():
                out[u] = out.get(u, 0.0) + p
        t = delay_s
        first = True
        for _ in range(MAX_STEPS):
            total = sum(mass.values())
            if total < MIN_MASS:
                break
            if not first:
                t += sum(p * self.units[u].step_s for u, p in mass.items()) / total
            first = False
            if t >= horizon_s:
                break
            nxt: dict[str, float] = {}
            for u, p in mass.items():
                for v, q in self.next.get(u, {}).items():
                    if v != END and q > 0:
                        nxt[v] = nxt.get(v, 0.0) + p * q
            for v, p in nxt.items():
                out[v] = out.get(v, 0.0) + p
            mass = nxt
        return out

    def calls_per_run(self) -> float:
        """Expected calls of one whole run (no horizon)."""
        return sum(self.visits(self.entry, float("inf"), include_start=True).values())


@dataclass(frozen=True)
class RunInFlight:
    """A run of ``app`` whose latest call is on ``unit``, issued ``elapsed_s`` ago."""

    app: str
    unit: str
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Forecast:
    """Expected calls and tokens per service over the horizon; ``unit_calls``: the calls per
    ``(app, unit)`` they come from."""

    calls: dict[str, float]
    tokens: dict[str, float]
    unit_calls: dict[tuple[str, str], float] = field(default_factory=dict)

    def rates(self, horizon_s: float) -> dict[str, float]:
        """Calls per second per service."""
        return {s: c / horizon_s for s, c in self.calls.items()}


def forecast_demand(tables: Mapping[str, AppTable], runs: Iterable[RunInFlight],
                    arrival_rates: Mapping[str, float], horizon_s: float) -> Forecast:
    """Expected per-service calls and tokens over the next ``horizon_s`` (module doc): the sum
    over runs in flight plus the new runs of each app at ``arrival_rates[app]`` runs/s."""
    if horizon_s <= 0:
        raise ValueError(f"horizon must be > 0, got {horizon_s}")
    calls: dict[str, float] = {}
    tokens: dict[str, float] = {}
    unit_calls: dict[tuple[str, str], float] = {}

    def add(table: AppTable, visits: Mapping[str, float], weight: float) -> None:
        for u, n in visits.items():
            unit = table.units[u]
            calls[unit.service] = calls.get(unit.service, 0.0) + weight * n
            tokens[unit.service] = tokens.get(unit.service, 0.0) + weight * n * unit.tokens
            unit_calls[(table.name, u)] = unit_calls.get((table.name, u), 0.0) + weight * n

    for r in runs:
        table = tables[r.app]
        delay = max(table.units[r.unit].step_s - r.elapsed_s, 0.0)
        add(table, table.visits({r.unit: 1.0}, horizon_s, delay_s=delay), 1.0)
    for app, rate in arrival_rates.items():
        if rate <= 0:
            continue
        table = tables[app]
        runs_n = rate * horizon_s
        for k in range(ARRIVAL_POINTS):
            left = horizon_s * (1.0 - (k + 0.5) / ARRIVAL_POINTS)
            v = table.visits(table.entry, left, delay_s=_step(table, table.entry), include_start=True)
            add(table, v, runs_n / ARRIVAL_POINTS)
    return Forecast(calls, tokens, unit_calls)


def unit_service(backend: str) -> str:
    """The service a unit calls, as a placement names it: an LLM unit's model
    (``llm:MODEL[@LORA]``: the base model, which the adapter runs on), else its backend."""
    spec = BackendSpec.parse(backend)
    return spec.name if spec.kind == "llm" else backend


def pdgraph_table(graph: PDGraph, cost: CostModel) -> AppTable:
    """The forecast table of a learned PDGraph, with what the PDGraph does not hold filled
    from what it does: a unit's service is :func:`unit_service`; its ``step_s`` is its mean
    client gap plus, for an LLM unit, the isolated service of its mean request (``cost``; its
    parallel requests run side by side), for a tool unit its mean duration. The gap before the unit stands
    for the gap before the next one (both are the client's time between calls)."""
    service: dict[str, str] = {}
    step: dict[str, float] = {}
    for name, node in graph.units.items():
        c = node.consumption
        service[name] = unit_service(node.backend)
        if node.is_llm:
            run_s = cost.request_service_s(mean_or_zero(c.input_tokens), mean_or_zero(c.output_tokens))
        else:
            run_s = mean_or_zero(c.duration_s)
        step[name] = mean_or_zero(c.gap_s) + run_s
    return AppTable.from_pdgraph(graph, service, step)


@dataclass(frozen=True)
class ObservedCall:
    """One call of a run as the gateway saw it: unit, service, issue instant and tokens."""

    unit: str
    service: str
    issued_s: float
    tokens: float


def learn_table(app: str, runs: Iterable[tuple[Sequence[ObservedCall], bool]],
                default_step_s: Mapping[str, float]) -> AppTable | None:
    """The table of ``app`` estimated from observed runs (calls in issue order, and whether
    the run is over), as a PDGraph is learned: entry and next-unit frequencies (a finished run's
    last unit goes to ``""``; a run in flight says nothing yet about its current unit), mean
    tokens per unit, and per unit the mean time to the run's next call (``default_step_s`` of
    the unit's service where no next call was seen). ``None`` when no run was observed."""
    entry: dict[str, float] = {}
    nxt: dict[str, dict[str, float]] = {}
    gaps: dict[str, list[float]] = {}
    toks: dict[str, list[float]] = {}
    service: dict[str, str] = {}
    for calls, over in runs:
        if not calls:
            continue
        entry[calls[0].unit] = entry.get(calls[0].unit, 0.0) + 1.0
        for k, c in enumerate(calls):
            service[c.unit] = c.service
            toks.setdefault(c.unit, []).append(c.tokens)
            if k + 1 < len(calls):
                n = calls[k + 1]
                row = nxt.setdefault(c.unit, {})
                row[n.unit] = row.get(n.unit, 0.0) + 1.0
                gaps.setdefault(c.unit, []).append(n.issued_s - c.issued_s)
            elif over:
                row = nxt.setdefault(c.unit, {})
                row[END] = row.get(END, 0.0) + 1.0
    if not entry:
        return None
    units = {u: Unit(service[u], mean_or_zero(toks[u]),
                     mean_or_zero(gaps[u]) if gaps.get(u) else default_step_s.get(service[u], 0.0))
             for u in service}
    return AppTable(app, units, _normalise(entry), {u: _normalise(r) for u, r in nxt.items()})


def _normalise(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def _step(table: AppTable, dist: Mapping[str, float]) -> float:
    total = sum(p for u, p in dist.items() if u != END)
    return sum(p * table.units[u].step_s for u, p in dist.items() if u != END) / total if total else 0.0


def mean_or_zero(xs: Iterable[float]) -> float:
    """The mean of ``xs``; 0 when there are none (a PDGraph sample list may be empty)."""
    xs = list(xs)
    return float(sum(xs)) / len(xs) if xs else 0.0
