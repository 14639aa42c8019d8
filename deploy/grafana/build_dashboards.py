"""Generate the Grafana dashboards in ``deploy/grafana/dashboards/`` (run after editing).

``python deploy/grafana/build_dashboards.py`` rewrites the JSON files; a test checks that the
committed files equal what this script produces, that every query is valid Grafana JSON, and
(against a real Prometheus scraping a real gateway and HermesLet) that every query returns
data. Every metric named here is exported by ``hermes/metrics.py`` or ``hermeslet/metrics.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

DATASOURCE = {"type": "prometheus", "uid": "hermes-prometheus"}
OUT = Path(__file__).resolve().parent / "dashboards"
RI = "$__rate_interval"
APP = 'app=~"$app"'


def _q(expr: str, legend: str = "") -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend}


def _panel(title: str, targets: list[dict], *, unit: str = "short", kind: str = "timeseries",
           desc: str = "", w: int = 12, h: int = 8, maxv: float | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if maxv is not None:
        defaults["max"] = maxv
        defaults["min"] = 0
    return {"type": kind, "title": title, "description": desc, "datasource": DATASOURCE,
            "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": []},
            "_w": w, "_h": h}


def _trace_link() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run's trace, where a trace backend is configured (docs/tracing.md): the variables
    ``traces`` (a Tempo data source, if Grafana has one) and ``run`` (a run id, as ``hermes runs
    list`` prints it), and a dashboard link that opens Explore on the trace whose root span has
    ``hermes.run_id = $run`` (TraceQL). The ``datasource`` field of these two variables is
    unused by Grafana (a data-source picker and a text box)."""
    left = {"datasource": "${traces}", "queries": [{
        "refId": "A", "queryType": "traceql", "limit": 20,
        "query": '{ span.hermes.run_id = "${run}" }'}], "range": {"from": "now-24h", "to": "now"}}
    variables = [
        {"name": "traces", "label": "trace backend", "type": "datasource", "query": "tempo",
         "datasource": DATASOURCE, "refresh": 1, "hide": 0, "current": {}},
        {"name": "run", "label": "run id", "type": "textbox", "query": "",
         "datasource": DATASOURCE, "current": {"text": "", "value": ""}, "hide": 0},
    ]
    links = [{"title": "Trace of run ${run}", "type": "link", "icon": "external link",
              "tooltip": "the run's trace in the trace backend (Explore, TraceQL on hermes.run_id)",
              "targetBlank": True, "includeVars": False, "keepTime": False,
              "url": "/explore?orgId=1&left=" + quote(json.dumps(left, separators=(",", ":")),
                                                      safe="${}")}]
    return variables, links


def _dashboard(uid: str, title: str, panels: list[dict], *, app_var: bool = False,
               trace_link: bool = False) -> dict:
    x = y = row_h = 0
    out = []
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_w"), p.pop("_h")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i
        for j, t in enumerate(p["targets"]):
            t["refId"] = chr(ord("A") + j)
            t["datasource"] = DATASOURCE
        if p["type"] == "timeseries":
            p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
        x += w
        row_h = max(row_h, h)
        out.append(p)
    templating = []
    if app_var:
        templating.append({
            "name": "app", "label": "app", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(hermes_runs_started_total, app)",
                      "refId": "app"},
            "definition": "label_values(hermes_runs_started_total, app)",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        })
    links: list[dict[str, Any]] = []
    if trace_link:
        variables, links = _trace_link()
        templating += variables
    return {"uid": uid, "title": title, "tags": ["hermes"], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
            "time": {"from": "now-30m", "to": "now"}, "templating": {"list": templating},
            "annotations": {"list": []}, "links": links, "panels": out}


def _quantile(q: float, metric: str, by: str, sel: str = "") -> str:
    sel = f"{{{sel}}}" if sel else ""
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{sel}[{RI}])))"


def overview() -> dict:
    ded = f"hermes_run_deadline_total{{{APP}}}"
    met = f'hermes_run_deadline_total{{{APP},outcome="met"}}'
    return _dashboard("hermes-overview", "Hermes / Overview", [
        _panel("ACT p50 by app", [_q(_quantile(0.5, "hermes_run_act_seconds", "app", APP),
                                     "{{app}}")], unit="s",
               desc="Application completion time of finished runs (model seconds)."),
        _panel("ACT p95 by app", [_q(_quantile(0.95, "hermes_run_act_seconds", "app", APP),
                                     "{{app}}")], unit="s"),
        _panel("Runs finished per second", [
            _q(f'sum by (app) (rate(hermes_runs_ended_total{{{APP},state="finished"}}[{RI}]))',
               "{{app}}")], unit="reqps"),
        _panel("Runs started per second", [
            _q(f"sum by (app) (rate(hermes_runs_started_total{{{APP}}}[{RI}]))", "{{app}}")],
            unit="reqps"),
        _panel("Deadline satisfaction rate (DSR) by app", [
            _q(f"(sum by (app) (rate({met}[{RI}])) or 0 * sum by (app) (rate({ded}[{RI}])))"
               f" / sum by (app) (rate({ded}[{RI}]))", "{{app}}")],
            unit="percentunit", maxv=1,
            desc="Share of runs with a deadline that met it (failed runs count as missed)."),
        _panel("Deadline met / missed per second", [
            _q(f"sum by (outcome) (rate({ded}[{RI}]))", "{{outcome}}")], unit="reqps"),
        _panel("Active runs by state", [_q("sum by (state) (hermes_runs)", "{{state}}")],
               w=8),
        _panel("Runs ended by state", [
            _q(f"sum by (state) (rate(hermes_runs_ended_total{{{APP}}}[{RI}]))", "{{state}}")],
            unit="reqps", w=8),
        _panel("Policy and nodes", [_q("hermes_policy_info", "policy {{policy}}"),
                                    _q("hermes_nodes_connected", "nodes connected")],
               kind="stat", w=8),
    ], app_var=True, trace_link=True)


def scheduler() -> dict:
    return _dashboard("hermes-scheduler", "Hermes / Scheduler", [
        _panel("Queue time per engine (p50, p95)", [
            _q(_quantile(0.5, "hermes_request_queue_seconds", "node, engine"),
               "p50 {{node}}/{{engine}}"),
            _q(_quantile(0.95, "hermes_request_queue_seconds", "node, engine"),
               "p95 {{node}}/{{engine}}")], unit="s",
            desc="Time LLM requests waited in the HermesLet queue before the engine window."),
        _panel("Engine service time per engine (p50, p95)", [
            _q(_quantile(0.5, "hermes_request_service_seconds", "node, engine"),
               "p50 {{node}}/{{engine}}"),
            _q(_quantile(0.95, "hermes_request_service_seconds", "node, engine"),
               "p95 {{node}}/{{engine}}")], unit="s"),
        _panel("Ranks of active runs (median by app)", [
            _q(f'hermes_active_run_rank{{{APP},stat="median"}}', "{{app}}")],
            desc="Lower is served first; units depend on the policy."),
        _panel("Rank spread of active runs (min, max)", [
            _q(f'min by (app) (hermes_active_run_rank{{{APP},stat="min"}})', "min {{app}}"),
            _q(f'max by (app) (hermes_active_run_rank{{{APP},stat="max"}})', "max {{app}}")]),
        _panel("Rank refresh time (p50, p99)", [
            _q(_quantile(0.5, "hermes_rank_refresh_seconds", "instance"), "p50"),
            _q(_quantile(0.99, "hermes_rank_refresh_seconds", "instance"), "p99")], unit="s",
            desc="One sweep recomputing every queued request's key."),
        _panel("Keys resent per second", [_q(f"rate(hermes_rekeys_total[{RI}])", "rekeys")],
               unit="reqps"),
        _panel("Estimator: mean |predicted - actual| service by app", [
            _q(f"sum by (app) (rate(hermes_estimator_abs_error_seconds_sum{{{APP}}}[{RI}])) / "
               f"sum by (app) (rate(hermes_estimator_abs_error_seconds_count{{{APP}}}[{RI}]))",
               "{{app}}")], unit="s",
            desc="Prediction: the estimator's mean total service before the run started."),
        _panel("Estimator: predicted / actual service by app", [
            _q(f"sum by (app) (rate(hermes_estimator_predicted_service_seconds_total{{{APP}}}"
               f"[{RI}])) / sum by (app) (rate(hermes_estimator_actual_service_seconds_total"
               f"{{{APP}}}[{RI}]))", "{{app}}")], unit="percentunit",
            desc="1 = unbiased; below 1 the estimator under-predicts."),
        _panel("Pending requests and policy switches", [
            _q("hermes_requests_pending", "pending requests"),
            _q("hermes_policy_switches_total", "policy switches")], w=24),
    ], app_var=True)


def engines() -> dict:
    by = "node, engine"
    return _dashboard("hermes-engines", "Hermes / Engines", [
        _panel("KV-cache usage", [_q(f"max by ({by}) (hermeslet_engine_kv_cache_usage_ratio)",
                                     "{{node}}/{{engine}}")], unit="percentunit", maxv=1),
        _panel("Prefix-cache hit ratio", [
            _q(f"sum by ({by}) (rate(hermeslet_engine_prefix_cache_hits_total[{RI}])) / "
               f"sum by ({by}) (rate(hermeslet_engine_prefix_cache_queries_total[{RI}]))",
               "{{node}}/{{engine}}")], unit="percentunit", maxv=1,
            desc="Prefix tokens hit / queried (vllm:prefix_cache_*)."),
        _panel("Running batch and waiting at the engine", [
            _q(f"sum by ({by}) (hermeslet_engine_running_requests)", "running {{engine}}"),
            _q(f"sum by ({by}) (hermeslet_engine_waiting_requests)", "waiting {{engine}}")]),
        _panel("In-flight window use", [
            _q(f"sum by ({by}) (hermeslet_engine_inflight_requests) / "
               f"sum by ({by}) (hermeslet_engine_max_inflight_requests)",
               "{{node}}/{{engine}}")], unit="percentunit", maxv=1,
            desc="Requests released to the engine / window size (max_inflight)."),
        _panel("Queued at the node", [
            _q(f"sum by ({by}) (hermeslet_engine_queued_requests)", "{{node}}/{{engine}}"),
            _q("sum by (node) (hermeslet_tools_queued_requests)", "tools {{node}}")]),
        _panel("Outstanding per engine (gateway view)", [
            _q(f"sum by ({by}) (hermes_engine_outstanding_requests)", "{{node}}/{{engine}}"),
            _q(f"sum by ({by}) (hermes_engine_window_size)", "window {{node}}/{{engine}}")]),
        _panel("Requests per second per engine", [
            _q(f"sum by ({by}) (rate(hermes_request_queue_seconds_count[{RI}]))",
               "{{node}}/{{engine}}")], unit="reqps", w=24),
    ])


def prewarm() -> dict:
    by = "backend_type"
    return _dashboard("hermes-prewarm", "Hermes / Prewarming", [
        _panel("Prewarms started / used / wasted per second", [
            _q(f"sum by ({by}) (rate(hermes_prewarm_started_total[{RI}]))", "started {{backend_type}}"),
            _q(f"sum by ({by}) (rate(hermes_prewarm_used_total[{RI}]))", "used {{backend_type}}"),
            _q(f"sum by ({by}) (rate(hermes_prewarm_wasted_total[{RI}]))", "wasted {{backend_type}}")],
            unit="reqps"),
        _panel("Prewarm hits (used / started)", [
            _q(f"sum by ({by}) (increase(hermes_prewarm_used_total[1h])) / "
               f"clamp_min(sum by ({by}) (increase(hermes_prewarm_started_total[1h])), 1)",
               "{{backend_type}}")], unit="percentunit", maxv=1,
            desc="Over the last hour; 0 while nothing was prewarmed."),
        _panel("Wasted backend-seconds per second", [
            _q(f"sum by ({by}) (rate(hermes_prewarm_wasted_backend_seconds_total[{RI}]))",
               "{{backend_type}}")], unit="s"),
        _panel("K (prewarming knob)", [_q("max by (scope, name) (hermes_prewarm_k)",
                                          "{{scope}} {{name}}")], maxv=1),
        _panel("Tool latency, cold vs warm (p50, p95)", [
            _q(_quantile(0.5, "hermes_tool_duration_seconds", "backend_type, start"),
               "p50 {{backend_type}} {{start}}"),
            _q(_quantile(0.95, "hermes_tool_duration_seconds", "backend_type, start"),
               "p95 {{backend_type}} {{start}}")], unit="s", w=24),
        # the HermesLets' own counters (hermeslet/metrics.py), per node
        _panel("Node prewarms: wasted backend-seconds per second", [
            _q(f"sum by (node, {by}) (rate(hermeslet_prewarm_wasted_backend_seconds_total"
               f"[{RI}]))", "{{node}} {{backend_type}}")], unit="s",
            desc="Backend seconds held warm on each node and released or reaped unused."),
        _panel("Node prewarms started / wasted per second", [
            _q(f"sum by (node, {by}) (rate(hermeslet_prewarm_started_total[{RI}]))",
               "started {{node}} {{backend_type}}"),
            _q(f"sum by (node, {by}) (rate(hermeslet_prewarm_wasted_total[{RI}]))",
               "wasted {{node}} {{backend_type}}")], unit="reqps"),
        _panel("LoRA lookahead loads / failures per second", [
            _q(f"sum by (node) (rate(hermeslet_lora_lookahead_loads_total[{RI}]))",
               "loads {{node}}"),
            _q(f"sum by (node) (rate(hermeslet_lora_lookahead_failed_total[{RI}]))",
               "failed {{node}}"),
            _q(f"sum by (node) (rate(hermeslet_lora_lookahead_no_path_total[{RI}]))",
               "no path {{node}}")], unit="reqps",
            desc="Adapters the queue lookahead loaded ahead of their requests; failed loads; "
                 "adapters skipped for want of a --lora-path. Nodes with the lookahead on."),
        _panel("LoRA adapters loaded / max per node", [
            _q("sum by (node) (hermeslet_lora_adapters_loaded)", "loaded {{node}}"),
            _q("sum by (node) (hermeslet_lora_adapters_max)", "max {{node}}")]),
        _panel("Last measured warm-up per node", [
            _q(f"max by (node, {by}) (hermeslet_prewarm_last_warmup_seconds)",
               "{{node}} {{backend_type}}")], unit="s", w=24,
            desc="Container create+start, adapter load, prefix prefill or model load."),
    ])


DASHBOARDS = {"overview": overview, "scheduler": scheduler, "engines": engines,
              "prewarm": prewarm}


def build() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"hermes-{name}.json": json.dumps(fn(), indent=2) + "\n"
            for name, fn in DASHBOARDS.items()}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in build().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
