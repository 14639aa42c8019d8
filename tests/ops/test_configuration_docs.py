"""docs/configuration.md documents every gateway key, its environment variable and the
metrics the code exports (so that the one place stays complete)."""

from __future__ import annotations

import re

import httpx

from hermes.gateway.config import _SECTIONS, load_config
from hermes.gateway.server import start_background
from tests.ops.conftest import REPO

DOC = (REPO / "docs" / "configuration.md").read_text()


def test_every_gateway_key_and_its_environment_variable_is_documented() -> None:
    for sec, model in _SECTIONS.items():
        for key in model.model_fields:
            assert f"`{sec}.{key}`" in DOC, f"{sec}.{key} missing from docs/configuration.md"
            assert f"HERMES_{sec.upper()}__{key.upper()}" in DOC


def test_documented_environment_variables_work() -> None:
    cfg = load_config(None, environ={"HERMES_POLICY": "vllm", "HERMES_SCHEDULER__K": "0.25",
                                     "HERMES_EMBEDDED_NODE": "false", "HERMES_KB": "/x"})
    assert (cfg.scheduler.policy, cfg.scheduler.k, cfg.scheduler.embedded_node,
            cfg.stores.kb) == ("vllm", 0.25, False, "/x")


def test_every_exported_metric_is_documented(tmp_path) -> None:  # noqa: ANN001
    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "st"), log_level="warning")
    with start_background(cfg) as srv:
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    names = {n for n in re.findall(r"^# TYPE (\S+)", text, flags=re.M)
             if not n.endswith("_created")}  # prometheus_client's creation timestamps
    words = set(re.findall(r"hermes[a-z_]*", DOC))
    # documented either in full or as a suffix family (`hermes_prewarm_started_total`, `_used_total`)
    missing = {n for n in names if n not in words and not any(
        n.endswith(w.lstrip("_")) for w in re.findall(r"`(_[a-z_]+)`", DOC))}
    assert not missing, f"metrics not in docs/configuration.md: {sorted(missing)}"
