"""Issue 15, item 10: a run of an app without a PDGraph is ranked without demand estimates;
the gateway says so, once per app, instead of silently."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from hermes.gateway.config import load_config
from hermes.gateway.scheduler import LiveScheduler


def test_a_missing_pdgraph_is_logged_once_per_app(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sched = LiveScheduler(load_config(None, environ={}, kb="shipped",
                                          state_dir=str(tmp_path / "state")))
        with caplog.at_level(logging.WARNING, logger="hermes.gateway.scheduler"):
            for app in ("my_agent", "my_agent", "factool_kbqa", "default", "other_app"):
                sched.create_run(app)
        sched.durable.close()

    asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if "no PDGraph" in r.getMessage()]
    assert len(warned) == 2, warned  # shipped factool_kbqa has one; "default": plain OpenAI
    assert "'my_agent'" in warned[0] and "'other_app'" in warned[1]
    assert "stores.kb = 'shipped'" in warned[0]
