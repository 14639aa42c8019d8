"""Prometheus metrics of the gateway (``GET /metrics``).

One :class:`GatewayMetrics` per gateway app, with its own ``CollectorRegistry``: nothing is
registered at import time, so several gateways can live in one process (tests). Two kinds of
metrics:

- *event* metrics, updated by the scheduler's hooks (``scheduler.metrics``): a run started or
  ended (ACT, deadline met/missed, estimator error), an LLM request done (queue and service
  time per engine), a tool call done (cold vs warm), a rank-refresh sweep. Each hook is a few
  dictionary lookups and one histogram/counter update (microseconds per request);
- *state* metrics, read from the scheduler when Prometheus scrapes (runs by state, ranks of
  active runs, engine windows as the gateway sees them, the current policy, the K knobs,
  prewarming counters), so they cost nothing per request.

Label values that come from clients are bounded (issue 15: every new ``X-Hermes-App`` or
tenant used to add series, 2,000 requests grew ``/metrics`` from 24 KB to 29 MB): an ``app``
label is the app's name only for apps the gateway knows, at most :data:`MAX_APPS` of them:
the knowledge base's apps when the gateway started, PDGraphs uploaded or imported since
(:meth:`GatewayMetrics.note_app`), hosted apps and ``default`` (OpenAI requests that name no
app). Every other app is ``other``, also once the gateway has learned a PDGraph from its
runs (a client could otherwise make any name known by running it). At most
:data:`MAX_TENANTS` tenants (:data:`MAX_TENANTS_NO_AUTH` when tenants are only what clients
claim, authentication off) get their own ``tenant`` value and :data:`MAX_PAIRS` (app, tenant)
pairs their own series; the rest are ``other``. A run keeps the labels it was counted under
when it started.

Names follow Prometheus conventions (``hermes_..._seconds``, ``_total`` counters). Times are in
*model seconds* of the scheduler clock for run-level metrics (ACT, estimator error: equal to
wall seconds when ``time_scale`` is 1) and in wall seconds for request and tool latencies.

Prewarming counters are read from a ``stats()`` method of the scheduler's prewarm component
(the first of the attributes :data:`PREWARM_ATTRS` that exists), which returns either flat
counters ``{"started", "used", "wasted", "wasted_s"}`` or the same per backend type
``{"docker": {...}, "lora": {...}, "kv": {...}}``; until such a component exists the counters
are exported at zero for the standard backend types.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from hermes import __version__

#: run completion times span sub-second chat calls to hour-long agent runs
ACT_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600, math.inf)
#: queue, service and tool latencies (wall seconds)
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                   math.inf)
#: a rank-refresh sweep over every queued request
REFRESH_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
                   math.inf)
ERROR_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000, math.inf)

#: tool backend types whose latency series exist from the start
TOOL_TYPES: tuple[str, ...] = ("docker", "dnn", "api")
#: where the scheduler keeps its prewarm component (planner), first match wins
PREWARM_ATTRS: tuple[str, ...] = ("prewarm", "prewarmer", "prewarm_planner", "prewarming")
#: backend types whose prewarm counters exist from the start (at zero)
PREWARM_TYPES: tuple[str, ...] = ("docker", "lora", "kv")
_WASTED_KEYS = ("wasted_s", "wasted_seconds", "wasted_backend_s", "wasted_backend_seconds")
#: how long (wall s) an app's prior demand estimate is reused for the estimator-error metric
PRIOR_TTL_S = 10.0
#: the label value standing for apps and tenants beyond the bounds below
OTHER = "other"
#: apps (known to the gateway) with their own ``app`` label value
MAX_APPS = 200
#: tenants with their own ``tenant`` label value (API keys' tenants)
MAX_TENANTS = 1000
#: the same with authentication off, where a tenant is whatever a client's header says
MAX_TENANTS_NO_AUTH = 100
#: (app, tenant) pairs with their own run series (~3 KB of exposition each)
MAX_PAIRS = 1000
#: the app of OpenAI requests that name none (``hermes.gateway.api.binding.DEFAULT_APP``)
DEFAULT_APP = "default"


def backend_type(backend: str) -> str:
    """``docker:python:3.10-slim`` -> ``docker`` (bounded label values)."""
    return backend.split(":", 1)[0] or "unknown"


def prewarm_counts(stats: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Normalize a prewarm ``stats()`` dict to ``{backend_type: {started, used, wasted,
    wasted_s}}`` (flat dicts count as backend type ``all``)."""
    out = {t: {"started": 0.0, "used": 0.0, "wasted": 0.0, "wasted_s": 0.0}
           for t in PREWARM_TYPES}
    if not stats:
        return out
    by_type = stats.get("by_type")
    nested = {k: v for k, v in stats.items() if isinstance(v, Mapping)}
    groups = by_type if isinstance(by_type, Mapping) else nested if nested else {"all": stats}
    for btype, d in groups.items():
        row = out.setdefault(str(btype), {"started": 0.0, "used": 0.0, "wasted": 0.0,
                                          "wasted_s": 0.0})
        for key in ("started", "used", "wasted"):
            v = d.get(key)
            if isinstance(v, int | float):
                row[key] += float(v)
        for key in _WASTED_KEYS:
            v = d.get(key)
            if isinstance(v, int | float):
                row["wasted_s"] += float(v)
                break
    return out


class GatewayMetrics:
    """The gateway's metrics; :meth:`attach` binds them to a running scheduler."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.runs_started = Counter("hermes_runs_started", "Runs accepted.",
                                    ["app", "tenant"], registry=r)
        self.runs_ended = Counter("hermes_runs_ended", "Runs that ended, by final state "
                                  "(finished, failed, cancelled).",
                                  ["app", "tenant", "state"], registry=r)
        self.act = Histogram("hermes_run_act_seconds", "Application completion time of "
                             "finished runs (model seconds).", ["app", "tenant"],
                             buckets=ACT_BUCKETS, registry=r)
        self.deadline = Counter("hermes_run_deadline", "Runs with a deadline that ended, by "
                                "outcome (met, missed).", ["app", "tenant", "outcome"],
                                registry=r)
        self.queue = Histogram("hermes_request_queue_seconds", "Time LLM requests waited in "
                               "a HermesLet queue before release to the engine.",
                               ["node", "engine"], buckets=LATENCY_BUCKETS, registry=r)
        self.service = Histogram("hermes_request_service_seconds", "Time LLM requests spent "
                                 "at the engine after release.", ["node", "engine"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.tool = Histogram("hermes_tool_duration_seconds", "Tool-call latency by backend "
                              "type and start (cold: a new sandbox; warm: a prewarmed or "
                              "reused one).", ["backend_type", "start"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.refresh = Histogram("hermes_rank_refresh_seconds", "Wall time of one sweep that "
                                 "recomputes every queued request's key.",
                                 buckets=REFRESH_BUCKETS, registry=r)
        self.est_abs_err = Histogram("hermes_estimator_abs_error_seconds", "|predicted - "
                                     "actual| total service of finished runs (prediction: the "
                                     "estimator's mean before the run started).", ["app"],
                                     buckets=ERROR_BUCKETS, registry=r)
        self.est_pred = Counter("hermes_estimator_predicted_service_seconds", "Sum of predicted "
                                "total service of finished runs.", ["app"], registry=r)
        self.est_actual = Counter("hermes_estimator_actual_service_seconds", "Sum of actual "
                                  "total service of the same runs.", ["app"], registry=r)
        self.policy_switches = Counter("hermes_policy_switches", "Live policy switches.",
                                       registry=r)
        for btype in TOOL_TYPES:  # exported from the start, so the first calls count in rate()
            for start in ("cold", "warm"):
                self.tool.labels(btype, start)
        self.switch_count = 0
        self.scheduler: Any = None
        #: the hosted-app registry (``names()``), set by the app: hosted apps are known apps
        self.hosted: Any = None
        self.max_apps, self.max_tenants, self.max_pairs = MAX_APPS, MAX_TENANTS, MAX_PAIRS
        self._app_labels: set[str] = set()
        self._tenant_labels: set[str] = set()
        #: apps with a PDGraph when the gateway started, or uploaded since
        self._known: set[str] = set()
        self._prior_pending: set[str] = set()
        self._seen: set[tuple[str, str]] = set()  # (app, tenant) with series created
        #: labelled children by (metric, label values): ``labels()`` validates and locks on
        #: every call, and each run touches a handful of series (hermes bench gateway)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._prior: dict[str, tuple[int, float, float]] = {}  # app -> (id(est), expiry, mean)
        r.register(_SchedulerCollector(self))

    # ------------------------------------------------------------------ wiring
    def attach(self, scheduler: Any) -> None:
        """Read state from ``scheduler`` at scrape time and receive its hooks."""
        self.scheduler = scheduler
        try:
            self._known.update(scheduler.app_names())  # the knowledge base, as it starts
        except Exception:  # a store that cannot list now: apps count as they are uploaded
            pass
        scheduler.metrics = self

    def add_collector(self, collector: Any) -> None:
        """Export another collector (the embedded HermesLet's) on this registry."""
        self.registry.register(collector)

    # ------------------------------------------------------------------ hooks (scheduler)
    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoized (series are never removed)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # ------------------------------------------------------------------ bounded labels
    def note_app(self, app: str) -> None:
        """A PDGraph of ``app`` was uploaded or imported: the app is known (its own label)."""
        self._known.add(app)

    def app_label(self, app: str, hosted: bool = False) -> str:
        """``app`` if the gateway knows it (and the bound is not reached), else ``other``."""
        if app in self._app_labels:
            return app
        known = (hosted or app == DEFAULT_APP or app in self._known
                 or (self.hosted is not None and self.hosted.get(app) is not None))
        if len(self._app_labels) >= self.max_apps or not known:
            return OTHER
        self._app_labels.add(app)
        return app

    def tenant_label(self, tenant: str) -> str:
        """``tenant`` for the first :attr:`max_tenants` tenants seen, else ``other``."""
        if tenant in self._tenant_labels:
            return tenant
        if len(self._tenant_labels) >= self.max_tenants:
            return OTHER
        self._tenant_labels.add(tenant)
        return tenant

    def run_labels(self, run: Any) -> tuple[str, str]:
        """A run's (app, tenant) label values: chosen once, when it is first counted."""
        labels = getattr(run, "metric_labels", None)
        if labels is None:
            st = run.state
            labels = (self.app_label(st.app, bool(getattr(run, "hosted", False))),
                      self.tenant_label(st.tenant or "default"))
            if labels not in self._seen and len(self._seen) >= self.max_pairs:
                labels = (OTHER, OTHER)
            try:
                run.metric_labels = labels
            except AttributeError:  # slotted test doubles: recomputed (same answer)
                pass
        return labels

    def on_run_created(self, run: Any) -> None:
        key = self.run_labels(run)
        if key not in self._seen:
            self._init_series(*key)
        self._child(self.runs_started, *key).inc()
        if key[0] != OTHER:
            self._prior_mean(run.state.app)  # refresh the prediction in the background if stale

    def _init_series(self, app: str, tenant: str) -> None:
        """Create an (app, tenant)'s run series at zero when its first run arrives, so that
        the first runs to end show up in ``rate()`` (a series born at its first increment
        has no earlier sample to compare with)."""
        self._seen.add((app, tenant))
        for state in ("finished", "failed", "cancelled"):
            self.runs_ended.labels(app, tenant, state)
        for outcome in ("met", "missed"):
            self.deadline.labels(app, tenant, outcome)
        self.act.labels(app, tenant)
        self.est_abs_err.labels(app)
        self.est_pred.labels(app)
        self.est_actual.labels(app)

    def on_run_end(self, run: Any) -> None:
        """The run is finished, failed or cancelled (called once, from ``_retire``)."""
        st = run.state
        (app, tenant), state = self.run_labels(run), run.status
        if (app, tenant) not in self._seen:  # restored after a restart: not counted started
            self._init_series(app, tenant)
        self._child(self.runs_ended, app, tenant, state).inc()
        if state == "finished" and st.finished is not None:
            self._child(self.act, app, tenant).observe(st.finished - st.submitted)
            pred = self._prior_mean(st.app) if app != OTHER else None
            if pred is not None:
                self._child(self.est_pred, app).inc(pred)
                self._child(self.est_actual, app).inc(st.attained_s)
                self._child(self.est_abs_err, app).observe(abs(pred - st.attained_s))
        if st.deadline is not None and state in ("finished", "failed"):
            met = state == "finished" and st.finished is not None and st.finished <= st.deadline
            self._child(self.deadline, app, tenant, "met" if met else "missed").inc()

    def on_node_joined(self, node: str, engines: Iterable[str]) -> None:
        """Create a joining node's per-engine request series at zero, so that the first
        requests it serves show up in ``rate()`` (as :meth:`_init_series` does for runs)."""
        for engine in engines:
            self._child(self.queue, node, engine)
            self._child(self.service, node, engine)

    def on_request_done(self, node: str | None, engine: str, queue_s: float,
                        service_s: float) -> None:
        n = node or ""
        self._child(self.queue, n, engine).observe(queue_s)
        self._child(self.service, n, engine).observe(service_s)

    def on_tool_done(self, backend: str, duration_s: float, cold: bool) -> None:
        self._child(self.tool, backend_type(backend), "cold" if cold else "warm").observe(duration_s)

    def on_rank_refresh(self, seconds: float) -> None:
        self.refresh.observe(seconds)

    def on_policy_switch(self) -> None:
        self.policy_switches.inc()
        self.switch_count += 1

    # ------------------------------------------------------------------ estimator error
    def _prior_mean(self, app: str) -> float | None:
        """Mean total service the estimator predicts for a run of ``app`` before it starts.

        Never blocks the event loop: Monte Carlo walks cost 10-100 ms, so the value is computed
        in a worker thread on a private estimator (the scheduler's estimators and their random
        streams are untouched) and cached; it is refreshed when the app's estimator changed and
        the cached value is older than :data:`PRIOR_TTL_S`. ``None`` until the first value.
        """
        pool = getattr(self.scheduler, "pool", None)
        if pool is None:
            return None
        est = pool.get(app)
        if est is None:
            return None
        hit = self._prior.get(app)
        now = time.monotonic()
        fresh = hit is not None and (hit[0] == id(est) or now < hit[1])
        if not fresh and app not in self._prior_pending:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._prior_pending.add(app)
                fut = loop.run_in_executor(None, _prior_of, est.graph, pool.cost)
                fut.add_done_callback(partial(self._prior_done, app, id(est)))
        return hit[2] if hit is not None else None

    def _prior_done(self, app: str, key: int, fut: asyncio.Future[float]) -> None:
        self._prior_pending.discard(app)
        if not fut.cancelled() and fut.exception() is None:
            self._prior[app] = (key, time.monotonic() + PRIOR_TTL_S, fut.result())


def _prior_of(graph: Any, cost: Any, n: int = 200) -> float:
    """Mean total service of a run of ``graph``'s app from its start (worker thread)."""
    from hermes.core.estimator import DemandEstimator

    return float(DemandEstimator(graph, cost, n_walks=n, seed=0).sample(None, n).service_s.mean())


class _SchedulerCollector:
    """State metrics read from the scheduler at scrape time (on the event-loop thread)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # state-dependent label sets: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("hermes_build", "Hermes version.")
        info.add_metric([], {"version": __version__})
        yield info
        s = self.m.scheduler
        if s is None:
            return
        pol = InfoMetricFamily("hermes_policy", "The scheduling policy in use.")
        pol.add_metric([], {"policy": str(s.config.scheduler.policy)})
        yield pol

        by_state = {"queued": 0, "running": 0}
        ranks: dict[str, list[float]] = {}
        for run in s.runs.values():
            if run.status in by_state:
                by_state[run.status] += 1
                r = run.state.rank
                if math.isfinite(r):
                    ranks.setdefault(self.m.run_labels(run)[0], []).append(r)
        g = GaugeMetricFamily("hermes_runs", "Active runs by state.", labels=["state"])
        for k, v in by_state.items():
            g.add_metric([k], v)
        yield g
        g = GaugeMetricFamily("hermes_active_run_rank", "Ranks of active runs (lower is served "
                              "first): min, median and max per app.", labels=["app", "stat"])
        for app, xs in ranks.items():
            xs.sort()
            g.add_metric([app, "min"], xs[0])
            g.add_metric([app, "median"], xs[len(xs) // 2])
            g.add_metric([app, "max"], xs[-1])
        yield g
        g = GaugeMetricFamily("hermes_requests_pending", "LLM requests and tool calls sent to "
                              "nodes and not finished.")
        g.add_metric([], len(s.requests))
        yield g
        g = GaugeMetricFamily("hermes_runs_closing", "Inferred runs closed idle and waiting to "
                              "be finished (a slice of the event loop at a time).")
        g.add_metric([], sum(len(q) for q in getattr(s, "closing_queues", ())))
        yield g
        stats = getattr(s, "stats", {})
        c = CounterMetricFamily("hermes_rekeys", "Request keys resent to nodes after rank "
                                "changes.")
        c.add_metric([], float(stats.get("rekeys_sent", 0)))
        yield c
        c = CounterMetricFamily("hermes_run_records_written", "Run records appended.")
        c.add_metric([], float(stats.get("records_written", 0)))
        yield c
        c = CounterMetricFamily("hermes_runs_sampled_out", "Finished runs of busy apps not "
                                "learned from (stores.learn_runs_per_s).")
        c.add_metric([], float(stats.get("runs_sampled_out", 0)))
        yield c

        yield from self._nodes(s)
        yield from self._prewarm(s)
        yield from self._sample_cache(s)
        yield from self._curve(s)

    @staticmethod
    def _curve(s: Any) -> Iterator[Metric]:
        """ZeroMQ CURVE handshakes refused (a client whose key is not authorized), by socket:
        ``nodes`` (the node socket), ``edges`` (split roles: [ha] edge_bind)."""
        table = getattr(s, "node_table", None)
        if not s.config.security.curve_dir or table is None:
            return
        refused = table.curve_refused()
        c = CounterMetricFamily("hermes_curve_refused", "ZeroMQ CURVE handshakes refused: "
                                "a client whose public key is not authorized (it gets "
                                "nothing), by socket.", labels=["socket"])
        c.add_metric(["nodes"], float(refused.get("nodes", 0)))
        if s.config.ha.role == "scheduler":
            c.add_metric(["edges"], float(refused.get("edges", 0)))
        yield c

    @staticmethod
    def _sample_cache(s: Any) -> Iterator[Metric]:
        """The memo of Monte Carlo walks (``hermes/gateway/sample_cache.py``): after warm-up
        nearly every ranking is a hit; misses that keep growing mean walks per request."""
        pool = getattr(getattr(s, "policy", None), "estimators", None)
        stats = getattr(pool, "stats", None)
        if not callable(stats):
            return
        try:
            got = stats()
        except Exception:
            return
        if "sample_cache_hits" not in got:
            return
        for name, what in (("hits", "States whose walks were served from the memo."),
                           ("misses", "States whose walks were drawn (Monte Carlo).")):
            c = CounterMetricFamily(f"hermes_sample_cache_{name}", what)
            c.add_metric([], float(got[f"sample_cache_{name}"]))
            yield c
        g = GaugeMetricFamily("hermes_sample_cache_bytes", "Bytes of memoized walks, all apps "
                              "together (bounded by stores.sample_cache_mb).")
        g.add_metric([], float(got["sample_cache_bytes"]))
        yield g

    def _nodes(self, s: Any) -> Iterator[Metric]:
        g = GaugeMetricFamily("hermes_nodes_connected", "Connected HermesLets.")
        g.add_metric([], len(s.nodes))
        yield g
        labels = ["node", "engine", "model"]
        out = GaugeMetricFamily("hermes_engine_outstanding_requests", "Requests the gateway sent "
                                "to an engine and not finished (queued at the node or in "
                                "flight).", labels=labels)
        win = GaugeMetricFamily("hermes_engine_window_size", "The engine's in-flight window "
                                "(max_inflight).", labels=labels)
        qd = GaugeMetricFamily("hermes_engine_queued_requests", "Requests in the node's queue for "
                               "the engine (last heartbeat).", labels=labels)
        for node in s.nodes.values():
            for e in node.engines.values():
                lv = [node.name, e.name, e.model]
                out.add_metric(lv, node.outstanding.get(e.name, 0))
                win.add_metric(lv, e.max_inflight)
                qd.add_metric(lv, node.queued.get(e.name, 0))
        yield out
        yield win
        yield qd

    def _prewarm(self, s: Any) -> Iterator[Metric]:
        stats = None
        for attr in PREWARM_ATTRS:
            comp = getattr(s, attr, None)
            if comp is not None and callable(getattr(comp, "stats", None)):
                try:
                    stats = comp.stats()
                except Exception:
                    stats = None
                break
        counts = prewarm_counts(stats)
        fams = {
            "started": CounterMetricFamily("hermes_prewarm_started", "Backend prewarms started.",
                                           labels=["backend_type"]),
            "used": CounterMetricFamily("hermes_prewarm_used", "Prewarmed backends a request "
                                        "used.", labels=["backend_type"]),
            "wasted": CounterMetricFamily("hermes_prewarm_wasted", "Prewarmed backends released "
                                          "unused (wrong branch or idle timeout).",
                                          labels=["backend_type"]),
            "wasted_s": CounterMetricFamily("hermes_prewarm_wasted_backend_seconds", "Backend "
                                            "seconds held warm and never used.",
                                            labels=["backend_type"]),
        }
        for btype, row in sorted(counts.items()):
            for key, fam in fams.items():
                fam.add_metric([btype], row[key])
        yield from fams.values()
        held = CounterMetricFamily("hermes_prewarm_held", "KV prefix prewarms not sent: a "
                                   "running request of the unit held the prefix.")
        held.add_metric([], float((stats or {}).get("prewarm_held", 0)))
        yield held
        g = GaugeMetricFamily("hermes_prewarm_k", "The prewarming knob K by scope (default, "
                              "app, tenant).", labels=["scope", "name"])
        g.add_metric(["default", ""], float(s.config.scheduler.k))
        knobs = getattr(s, "knobs", None) or {}
        for scope, table in knobs.items():
            for name, k in table.items():
                if scope == "default":
                    continue
                g.add_metric([scope, name], float(k))
        default = knobs.get("default", {}).get("")
        if default is not None:
            g.samples[0] = g.samples[0]._replace(value=float(default))
        yield g
        ids = getattr(s, "identities", None)
        if ids is not None:
            yield from self._identity(ids)
        learner = getattr(s, "learner", None)
        if learner is not None and callable(getattr(learner, "stats", None)):
            g = GaugeMetricFamily("hermes_learner_size", "What the PDGraph learner holds: apps "
                                  "with a profiler, the values their profilers hold (capped per "
                                  "app), records waiting for the next pass, graphs kept.",
                                  labels=["structure"])
            for name, n in sorted(learner.stats().items()):
                g.add_metric([name], float(n))
            yield g

    @staticmethod
    def _identity(ids: Any) -> Iterator[Metric]:
        """The run resolver (issue 17): what placed each request, the runs it closed, and
        the size of every bounded structure (the evidence index above all)."""
        c = CounterMetricFamily("hermes_identity_requests", "OpenAI requests by the evidence "
                                "that bound them to a run (header, opt-out, off, "
                                "previous_response_id, session, continuation, dataflow, affinity, fanout, new).",
                                labels=["evidence"])
        for kind, n in sorted(ids.evidence.items()):
            c.add_metric([kind], n)
        yield c
        c = CounterMetricFamily("hermes_identity_runs_closed", "Inferred runs the resolver "
                                "closed, by reason (idle, evicted).", labels=["reason"])
        for reason, n in sorted(ids.closed.items()):
            c.add_metric([reason], n)
        yield c
        g = GaugeMetricFamily("hermes_identity_size", "Sizes of the run resolver's bounded "
                              "structures (index_entries, passage_entries, open_runs, apps, units, ...).",
                              labels=["structure"])
        for name, n in sorted(ids.stats().items()):
            g.add_metric([name], float(n))
        yield g
