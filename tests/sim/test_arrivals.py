"""Arrival resampling: count, window, seed, trace resolution."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.sim.arrivals import (
    TraceNotFoundError,
    load_trace_timestamps,
    resample_arrivals,
    trace_path,
)


@pytest.fixture
def trace(tmp_path):
    # a bursty toy trace: 50 requests in the first second, 10 spread over the next 99
    ts = [i * 20 for i in range(50)] + [1000 + i * 11000 for i in range(10)]
    p = tmp_path / "toy.jsonl"
    p.write_text("".join(f'{{"timestamp": {t}, "input_length": 1, "output_length": 1}}\n' for t in ts))
    return p


def test_count_window_order_and_seed(trace):
    a = resample_arrivals(30, 600.0, trace=trace, seed=1)
    assert a.shape == (30,) and np.all(np.diff(a) >= 0)
    assert a.min() >= 0 and a.max() <= 600.0
    assert np.array_equal(a, resample_arrivals(30, 600.0, trace=trace, seed=1))
    assert not np.array_equal(a, resample_arrivals(30, 600.0, trace=trace, seed=2))


def test_keeps_the_trace_burstiness(trace):
    a = resample_arrivals(40, 100.0, trace=trace, seed=0)
    # 5/6 of the trace is in its first 1% of time: most sampled arrivals must be too
    assert np.mean(a <= 1.0 + 1e-9) > 0.6


def test_more_apps_than_trace_requests(trace):
    a = resample_arrivals(200, 60.0, trace=trace, seed=0)
    assert a.shape == (200,) and a.max() <= 60.0


def test_named_traces_and_env(trace, monkeypatch):
    monkeypatch.setenv("HERMES_TRACES", str(trace.parent))
    assert trace_path("toy.jsonl") == trace
    assert load_trace_timestamps(trace).size == 60
    with pytest.raises(TraceNotFoundError, match="HERMES_TRACES"):
        trace_path("nope.jsonl")


def test_shipped_traces_resolve_when_present():
    try:
        p = trace_path("conversation")
    except TraceNotFoundError:
        pytest.skip("../shared/traces not present")
    assert p.name == "mooncake_conversation_trace.jsonl"
