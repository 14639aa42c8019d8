"""Slow tier: elected all-in-one gateways (``hermes serve --ha`` without ``--role``) on real
processes, a real Redis (lease, runs, the shared knowledge base) and haproxy
(``hermes.bench.ha.Cluster`` with no edges): after ``kill -9`` of the leader, the gateway
elected next lists the apps the dead one had inferred from header-less traffic before any
new conversation (the leader keeps them in the knowledge base; there are no edges to tell
the new leader), and a rename through it names the app's next run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest
from gw_procs import AGENT_SYSTEM, AGENT_TOOLS, agent_app, need_tools

from hermes.bench.ha import MODEL, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_new_all_in_one_leader_lists_the_apps_the_dead_one_inferred(tmp_path: Path) -> None:
    need_tools("redis-server", "haproxy")
    from hermes.gateway.identity import APPS_DOC
    from hermes.kb.redis_store import RedisStore

    cl = Cluster(tmp_path, time_scale=5.0, n_gateways=2, n_nodes=1, ttl_s=1.0, shared_kb=True)
    try:
        cl.start()
        app = agent_app(cl.url, MODEL)  # an agent: its second turn continues the first's run
        old = cl.wait_leader(30.0)
        listed = httpx.get(f"http://127.0.0.1:{cl.http_ports[old]}/admin/apps",
                           timeout=10).json()["apps"]
        assert app in {a["name"] for a in listed if a["inferred"]}, listed
        # the leader has stored the app (it does so within half a second of a new app)
        kb = RedisStore(cl.redis_url.rsplit("/", 1)[0] + "/4")
        deadline = time.monotonic() + 10
        while app not in {row[1] for row in json.loads(kb.get_doc(APPS_DOC) or '{"apps":[]}')
                          ["apps"]}:
            assert time.monotonic() < deadline, f"the leader never stored {app}"
            time.sleep(0.05)
        kb.close()
        cl.gateways[old].signal(signal.SIGKILL)
        new = cl.wait_leader(30.0, other_than=old)
        leader = f"http://127.0.0.1:{cl.http_ports[new]}"
        r = httpx.get(f"{leader}/admin/apps", timeout=10)  # ready: no conversation since
        assert r.status_code == 200, r.text
        row = next((a for a in r.json()["apps"] if a["name"] == app), None)
        assert row is not None, r.json()["apps"]
        assert row["inferred"] and row["app_id"] and row["inferred_runs"] == 1, row
        assert row["tools"] == ["book"] and row["instructions"].startswith("You plan"), row
        r = httpx.post(f"{leader}/admin/apps/{app}/rename", json={"to": "planner"}, timeout=10)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{cl.url}/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "tools": AGENT_TOOLS, "max_tokens": 8,
                             "messages": [AGENT_SYSTEM, {"role": "user", "content": "Paris?"}]})
        assert r.status_code == 200 and r.headers["x-hermes-app"] == "planner", r.headers
    finally:
        cl.stop()
