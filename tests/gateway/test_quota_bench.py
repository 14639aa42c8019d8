"""Slow tier: a tenant limit of 100 requests a minute over 4 real gateway processes sharing a
real redis-server (``hermes bench quota``): 400 requests fired at once, at most (here:
exactly) 100 admitted; the same gateways keeping limits in memory let 4 x 100 through."""

from __future__ import annotations

import shutil

import pytest

from hermes.bench.quota import measure

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_four_gateways_admit_exactly_the_tenants_limit(tmp_path) -> None:  # noqa: ANN001
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH")
    row = measure(4, 400, 100, shared=True, workdir=tmp_path / "shared")
    assert (row["admitted"], row["refused"], row["other"]) == (100, 300, {}), row
    base = measure(4, 400, 100, shared=False, workdir=tmp_path / "memory")
    assert base["admitted"] == 400 and not base["other"], base  # 4 x the limit without it
