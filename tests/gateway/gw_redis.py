"""A real redis-server on a free loopback port (module-scoped fixture ``redis_url``), started
by :func:`hermes.bench.quota.start_redis` (the one place that starts one)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from hermes.bench.quota import start_redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        if os.environ.get("HERMES_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server not on PATH (HERMES_REQUIRE_REDIS=1)")
        pytest.skip("redis-server not on PATH (apt-get install redis-server)")
    proc, url = start_redis(tmp_path_factory.mktemp("r"))
    yield url
    proc.terminate()
    proc.wait(5)
