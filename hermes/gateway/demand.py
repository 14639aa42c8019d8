"""The gateway's per-model demand forecast (issue 22): what ``GET /admin/forecast`` answers and
``hermes plan placement --from-gateway`` places.

SeaLLM places services by their recent request rates. The gateway knows more: the runs in
flight, where each is in its app, and the app's PDGraph, so it forecasts each model's calls
over the next ``horizon_s`` (:func:`hermes.core.multillm.forecast.forecast_demand` over
:func:`~hermes.core.multillm.forecast.pdgraph_table` of each app's current PDGraph), plus the
runs that will start, at each app's arrival rate over the last ``window_s``. A run's current
(or, between units, last) unit is taken as just issued: the gateway does not keep when a unit
started, so the forecast is early by at most one step of it. Only LLM services are reported
(tools are not placed on GPUs); each with the mean prompt and completion tokens of the calls
the forecast expects, from the units' PDGraph samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.core.multillm.forecast import (
    AppTable,
    RunInFlight,
    forecast_demand,
    mean_or_zero,
    pdgraph_table,
    unit_service,
)

if TYPE_CHECKING:
    from hermes.gateway.scheduler import LiveScheduler


def forecast_doc(sched: LiveScheduler, horizon_s: float, window_s: float) -> dict[str, Any]:
    """The per-model forecast over ``horizon_s`` (module doc), as JSON-ready data."""
    if not horizon_s > 0 or not window_s > 0:
        raise ValueError(f"horizon_s and window_s must be > 0, got {horizon_s}, {window_s}")
    now = sched.now()
    graphs = {}
    for app in sched.app_names():
        graph = sched.learner.app_graph(app)
        if graph is not None and graph.units:
            graphs[app] = graph
    tables: dict[str, AppTable] = {a: pdgraph_table(g, sched.ctx.cost) for a, g in graphs.items()}
    runs = []
    for run in sched.registry.active():
        unit = run.state.progress.current or run.state.progress.last_unit
        if unit is not None and run.app in tables and unit in tables[run.app].units:
            runs.append(RunInFlight(run.app, unit))
    since = max(now - window_s, sched.ctx.clock.start)  # not before the gateway started
    span = max(now - since, 1.0)
    started = sched.recent_runs(lambda r: r.state.submitted >= since and r.app in tables,
                                limit=1_000_000)
    counts: dict[str, int] = {}
    for r in started:
        counts[r.app] = counts.get(r.app, 0) + 1
    rates = {a: n / span for a, n in counts.items()}
    fc = forecast_demand(tables, runs, rates, horizon_s)
    rows: dict[str, dict[str, float]] = {}
    for (app, unit), calls in fc.unit_calls.items():
        node = graphs[app].units[unit]
        if not node.is_llm or calls <= 0:
            continue
        row = rows.setdefault(unit_service(node.backend), {"calls": 0.0, "in": 0.0, "out": 0.0})
        c = node.consumption
        row["calls"] += calls
        row["in"] += calls * mean_or_zero(c.input_tokens)
        row["out"] += calls * mean_or_zero(c.output_tokens)
    services = [
        {"model": m, "calls_per_s": r["calls"] / horizon_s,
         "tokens_per_s": fc.tokens.get(m, 0.0) / horizon_s,
         "input_tokens": r["in"] / r["calls"], "output_tokens": r["out"] / r["calls"]}
        for m, r in sorted(rows.items())
    ]
    return {"horizon_s": horizon_s, "window_s": window_s, "time": now,
            "runs_in_flight": len(runs), "app_rates": rates, "services": services}
