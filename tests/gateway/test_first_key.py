"""A gateway whose auth file holds no key yet creates one for ``security.first_key_tenant`` and
prints it once (the container image's first start): it serves with authentication at once,
and a restart keeps the key and prints nothing."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hermes.gateway.config import load_config
from hermes.gateway.server import start_background


def _start(tmp_path: Path):  # noqa: ANN202
    cfg = load_config(None, environ={}, port=0, state_dir=str(tmp_path / "state"),
                      auth_file=str(tmp_path / "auth.json"), bind="",
                      security={"first_key_tenant": "default"})
    return start_background(cfg)


def test_the_first_start_prints_a_key_that_works_and_a_restart_keeps_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _start(tmp_path) as gw:
        out = capsys.readouterr().out
        assert "no API key yet in" in out and "for tenant 'default'" in out, out
        key = out.strip().splitlines()[-1]
        assert httpx.get(f"{gw.url}/v1/models").status_code == 401
        r = httpx.get(f"{gw.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    stored = json.loads((tmp_path / "auth.json").read_text())
    assert [k["tenant"] for k in stored["keys"]] == ["default"]
    assert key.split(".")[-1] not in (tmp_path / "auth.json").read_text()  # only its hash
    with _start(tmp_path) as gw:
        assert "no API key yet" not in capsys.readouterr().out
        r = httpx.get(f"{gw.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
