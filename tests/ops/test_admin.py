"""The admin API and the ``hermes`` admin commands against a live gateway."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import pytest

from hermes.cli import main
from hermes.core.policy_switch import resolve_k
from hermes.core.state import RunState
from hermes.gateway.app import create_app
from hermes.gateway.config import load_config
from hermes.gateway.server import gateway_state
from tests.ops.metrics_util import scrape_value


def cli(capsys, *argv: str) -> tuple[int, str, str]:  # noqa: ANN001
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def cli_json(capsys, *argv: str):  # noqa: ANN001, ANN201
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------------- access
def test_admin_token_required_when_configured(make_ops_gateway, monkeypatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.setenv("HERMES_ADMIN_TOKEN", "s3cret")
    srv = make_ops_gateway()
    r = httpx.get(srv.url + "/admin/policy")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in r.json()["error"]["message"]
    r = httpx.get(srv.url + "/admin/policy", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_denied"
    r = httpx.get(srv.url + "/admin/policy", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.json()["policy"] == "hermes"
    # the CLI: --token works, a wrong one is a clear error, exit status 1
    assert cli_json(capsys, "policy", "show", "--url", srv.url, "--token", "s3cret")["policy"] \
        == "hermes"
    rc, _, err = cli(capsys, "policy", "show", "--url", srv.url, "--token", "wrong")
    assert rc == 1 and "HTTP 403" in err and "invalid admin token" in err
    # the public API and /metrics stay open
    assert httpx.get(srv.url + "/metrics").status_code == 200
    assert httpx.get(srv.url + "/v1/apps").status_code == 200


async def test_without_token_only_loopback_clients_get_in(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("HERMES_ADMIN_TOKEN", raising=False)
    app = create_app(load_config(None, environ={}, state_dir=str(tmp_path)))
    remote = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
    async with httpx.AsyncClient(transport=remote, base_url="http://gw") as c:
        r = await c.get("/admin/runs")
    assert r.status_code == 403 and "HERMES_ADMIN_TOKEN" in r.json()["error"]["message"]


def test_unreachable_gateway_is_a_clear_error(capsys) -> None:  # noqa: ANN001
    rc, _, err = cli(capsys, "runs", "list", "--url", "http://127.0.0.1:9")
    assert rc == 1 and "cannot reach the gateway at http://127.0.0.1:9" in err


# ---------------------------------------------------------------------------------- policy
def _wait_pending(http: httpx.Client, ids: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [http.get(f"/admin/runs/{i}").json() for i in ids]
        if all(r["state"] == "running" and r["pending_requests"] for r in runs):
            return
        time.sleep(0.05)
    raise AssertionError("runs never had pending requests")


def test_live_policy_switch_reranks_active_runs(make_ops_gateway, capsys) -> None:  # noqa: ANN001
    srv = make_ops_gateway(time_scale=10.0)
    http = httpx.Client(base_url=srv.url, timeout=30)
    sched = gateway_state(srv).scheduler
    ids = [http.post("/v1/runs", json={"app": "got_docmerge", "input": {"seed": i}}).json()
           ["run_id"] for i in range(4)]
    _wait_pending(http, ids)
    before = {i: http.get(f"/admin/runs/{i}").json()["rank"] for i in ids}
    assert all(r is not None and r > 0 for r in before.values())  # Gittins ranks (seconds)
    out = cli_json(capsys, "policy", "set", "vllm", "--url", srv.url)
    assert out["policy"] == "vllm" and out["previous"] == "hermes"
    assert out["runs_reranked"] == 4
    # vLLM's FCFS ranks a run by its submission time: every active run was ranked afresh
    for i in ids:
        run = http.get(f"/admin/runs/{i}").json()
        assert run["rank"] == pytest.approx(run["submitted"])
    # queued requests carry keys of the new policy (arrival order)
    for req in list(sched.requests.values()):
        assert req.key == (req.view.arrival, req.view.seq)
    show = cli_json(capsys, "policy", "show", "--url", srv.url)
    assert show["policy"] == "vllm" and show["switches"] == 1 and "hermes" in show["available"]
    assert scrape_value(srv.url, "hermes_policy_info", policy="vllm") == 1
    assert scrape_value(srv.url, "hermes_policy_switches_total") == 1
    # and back to Hermes: Gittins ranks again
    cli_json(capsys, "policy", "set", "hermes", "--url", srv.url)
    ranks = [http.get(f"/admin/runs/{i}").json()["rank"] for i in ids]
    assert all(r is not None and r < 1e6 for r in ranks)
    rc, _, err = cli(capsys, "policy", "set", "fastest", "--url", srv.url)
    assert rc == 1 and "unknown policy 'fastest'" in err and "hermes" in err
    assert sched.config.scheduler.policy == "hermes"
    cancelled = cli_json(capsys, "runs", "cancel", *ids, "--url", srv.url)["cancelled"]
    assert [c["state"] for c in cancelled] == ["cancelled"] * 4


# ---------------------------------------------------------------------------------- knobs
def test_knob_set_per_app_tenant_and_default(make_ops_gateway, capsys) -> None:  # noqa: ANN001
    srv = make_ops_gateway()
    sched = gateway_state(srv).scheduler
    cli_json(capsys, "knob", "set", "0.3", "--app", "got_docmerge", "--url", srv.url)
    cli_json(capsys, "knob", "set", "0.7", "--tenant", "acme", "--url", srv.url)
    out = cli_json(capsys, "knob", "set", "0.2", "--url", srv.url)
    assert out["knobs"] == {"default": {"": 0.2}, "app": {"got_docmerge": 0.3},
                            "tenant": {"acme": 0.7}}
    assert sched.knobs is not None and sched.knobs["app"]["got_docmerge"] == 0.3
    k = sched.config.scheduler.k
    assert resolve_k(sched.knobs, k, app="got_docmerge", tenant="acme") == 0.7  # tenant first
    assert resolve_k(sched.knobs, k, app="got_docmerge", tenant="x") == 0.3
    # the prewarm planner reads the same live knobs, in the same order
    planner = sched.prewarm.strategy
    assert planner.k_for(RunState("r", "got_docmerge", 0.0, tenant="acme")) == 0.7
    assert planner.k_for(RunState("r", "got_docmerge", 0.0, tenant="x")) == 0.3
    assert planner.k_for(RunState("r", "other", 0.0, tenant="x")) == 0.2
    assert resolve_k(sched.knobs, k, app="other", tenant="acme") == 0.7
    assert resolve_k(sched.knobs, k, app="other", tenant="x") == 0.2
    assert resolve_k(sched.knobs, k, app="got_docmerge", run_k=0.9) == 0.9
    assert scrape_value(srv.url, "hermes_prewarm_k", scope="app", name="got_docmerge") == 0.3
    assert scrape_value(srv.url, "hermes_prewarm_k", scope="default", name="") == 0.2
    cli_json(capsys, "knob", "set", "--clear", "--app", "got_docmerge", "--url", srv.url)
    assert "got_docmerge" not in sched.knobs["app"]
    rc, _, err = cli(capsys, "knob", "set", "1.5", "--app", "x", "--url", srv.url)
    assert rc == 1 and "HTTP 422" in err and "k" in err
    rc, _, err = cli(capsys, "knob", "set", "--app", "x", "--url", srv.url)
    assert rc == 1 and "give K" in err
    assert cli_json(capsys, "knob", "show", "--url", srv.url)["knobs"]["tenant"] == {"acme": 0.7}


# ---------------------------------------------------------------------------------- apps
def test_apps_export_import_round_trip(make_ops_gateway, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    src = make_ops_gateway()
    dst = make_ops_gateway(kb=str(tmp_path / "empty-kb"))
    apps = cli_json(capsys, "apps", "list", "--url", src.url)["apps"]
    assert {"factool_kbqa", "got_docmerge"} <= {a["name"] for a in apps if a["pdgraph"]}
    out = cli_json(capsys, "apps", "export", "--all", "--dir", str(tmp_path / "x"),
                   "--url", src.url)
    files = sorted((tmp_path / "x").glob("*.json"))
    assert len(files) == len(out["exported"]) >= 10
    one = json.loads((tmp_path / "x" / "factool_kbqa.json").read_text())
    assert one["app"] == "factool_kbqa"
    before = {a["name"]: a["pdgraph"] for a in
              cli_json(capsys, "apps", "list", "--url", dst.url)["apps"]}
    assert before.get("factool_kbqa") is False  # hosted, but no PDGraph yet
    res = cli_json(capsys, "apps", "import", *map(str, files), "--url", dst.url)
    assert len(res["imported"]) == len(files)
    shown = cli_json(capsys, "apps", "show", "factool_kbqa", "--url", dst.url)
    assert shown["pdgraph"]["units"].keys() == one["units"].keys()
    # an exported document re-imports byte-identically
    rc, text, _ = cli(capsys, "apps", "export", "factool_kbqa", "--url", dst.url)
    assert rc == 0 and json.loads(text) == one
    # bad input: a file whose app differs from --name, a non-PDGraph file
    rc, _, err = cli(capsys, "apps", "import", str(files[0]), "--name", "other", "--url", dst.url)
    assert rc == 1 and "HTTP 400" in err and "expected 'other'" in err
    (tmp_path / "bad.json").write_text('{"hello": 1}')
    rc, _, err = cli(capsys, "apps", "import", str(tmp_path / "bad.json"), "--url", dst.url)
    assert rc == 1 and "not a PDGraph" in err
    rc, _, err = cli(capsys, "apps", "show", "nope", "--url", dst.url)
    assert rc == 1 and "HTTP 404" in err


def test_apps_import_shipped_seeds_an_empty_knowledge_base(make_ops_gateway, capsys,  # noqa: ANN001
                                                            tmp_path: Path) -> None:
    """The compose stack's kb-init (`hermes apps import --shipped`) needs no path into the
    installation: the shipped PDGraphs are package data."""
    dst = make_ops_gateway(kb=str(tmp_path / "empty-kb"))
    res = cli_json(capsys, "apps", "import", "--shipped", "--url", dst.url)
    assert len(res["imported"]) == 10
    apps = cli_json(capsys, "apps", "list", "--url", dst.url)["apps"]
    assert sum(a["pdgraph"] for a in apps) == 10
    rc, _, err = cli(capsys, "apps", "import", "--url", dst.url)
    assert rc == 1 and "--shipped" in err


# ---------------------------------------------------------------------------------- runs, top
def test_runs_list_show_cancel_and_top(make_ops_gateway, capsys) -> None:  # noqa: ANN001
    srv = make_ops_gateway(time_scale=10.0)
    http = httpx.Client(base_url=srv.url, timeout=30)
    a = http.post("/v1/runs", json={"app": "got_docmerge", "input": {"seed": 1},
                                    "tenant": "acme"}).json()["run_id"]
    b = http.post("/v1/runs", json={"app": "client_app", "tenant": "zeta"}).json()["run_id"]
    rows = cli_json(capsys, "runs", "list", "--state", "active", "--url", srv.url)["runs"]
    assert {r["run_id"] for r in rows} == {a, b}
    rows = cli_json(capsys, "runs", "list", "--tenant", "zeta", "--url", srv.url)["runs"]
    assert [r["run_id"] for r in rows] == [b]
    shown = cli_json(capsys, "runs", "show", a, "--url", srv.url)
    assert shown["app"] == "got_docmerge" and shown["tenant"] == "acme"
    rc, out, _ = cli(capsys, "runs", "show", a, "--url", srv.url)
    assert rc == 0 and "got_docmerge" in out
    rc, out, _ = cli(capsys, "top", "--json", "--url", srv.url, "--iterations", "2",
                     "--interval", "0.1")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 2  # one JSON snapshot per refresh
    snap = json.loads(lines[-1])
    assert snap["totals"]["active"] == 2 and {e["engine"] for e in snap["engines"]} == {"sim0", "embed0"}
    ranks = [r["rank"] if r["rank"] is not None else math.inf for r in snap["runs"]]
    assert ranks == sorted(ranks)  # lowest rank (served first) on top
    rc, out, _ = cli(capsys, "top", "--once", "--url", srv.url)
    assert rc == 0 and "Engines" in out and "sim0" in out
    cli_json(capsys, "runs", "cancel", a, b, "--url", srv.url)
    rc, _, err = cli(capsys, "runs", "cancel", a, "--url", srv.url)
    assert rc == 1 and "HTTP 409" in err and "cancelled" in err
    rc, _, err = cli(capsys, "runs", "show", "run-nope", "--url", srv.url)
    assert rc == 1 and "HTTP 404" in err
    r = http.get("/admin/runs", params={"state": "bogus"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "state"


def test_admin_app_routes_answer_404_for_names_no_app_can_have(make_ops_gateway) -> None:  # noqa: ANN001
    """Found by the schema fuzz once the admin routes and the name rules met: a 500 before."""
    srv = make_ops_gateway()
    for path in ("/admin/apps/%F3%A7%B5%B6x", "/admin/apps/.hidden/pdgraph"):
        r = httpx.get(srv.url + path)
        assert r.status_code == 404, r.text
        assert "has no PDGraph" in r.json()["error"]["message"]
