"""Arrival resampling: count, window, seed, trace resolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hermes.sim.arrivals import (
    TRACE_FILES,
    TraceNotFoundError,
    load_trace_requests,
    load_trace_timestamps,
    resample_arrivals,
    shipped_traces_dir,
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


def test_shipped_traces_resolve_from_any_directory(tmp_path, monkeypatch):
    """The named traces ship with the package (issue 15, item 11): no ../shared needed."""
    monkeypatch.delenv("HERMES_TRACES", raising=False)
    monkeypatch.chdir(tmp_path)
    for name, n in (("conversation", 12031), ("synthetic", 3993)):
        p = trace_path(name)
        assert p.parent == shipped_traces_dir() and p.suffix == ".gz"
        assert load_trace_timestamps(name).size == n
    assert (shipped_traces_dir() / "README.md").read_text().count("Apache") >= 1


def test_shipped_arrivals_are_the_full_traces_timestamps():
    full = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
    if not full.is_dir():
        pytest.skip("the full Mooncake traces (../shared/traces) are not here")
    for name in ("conversation", "synthetic"):
        shipped = load_trace_timestamps(name)
        assert np.array_equal(shipped, load_trace_timestamps(full / TRACE_FILES[name]))


def test_not_found_error_does_not_suggest_the_failing_trace(tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_TRACES", raising=False)
    with pytest.raises(TraceNotFoundError) as e:
        trace_path(tmp_path / "conversaton.jsonl")
    assert "conversation, synthetic" in str(e.value)
    monkeypatch.setattr("hermes.sim.arrivals.shipped_traces_dir", lambda: tmp_path / "gone")
    with pytest.raises(TraceNotFoundError) as e:
        trace_path("conversation")
    assert "use a shipped trace" not in str(e.value) and "reinstall" in str(e.value)


def test_shipped_requests_are_the_full_traces_lengths(tmp_path, monkeypatch):
    """``hermes bench seallm`` reads request lengths: they ship too (the full trace's
    timestamp, input_length and output_length of every request, in order), so it runs from
    any directory; ``$HERMES_TRACES`` still takes the full trace first."""
    monkeypatch.delenv("HERMES_TRACES", raising=False)
    monkeypatch.chdir(tmp_path)
    ts, inp, out = load_trace_requests("conversation")
    assert ts.size == inp.size == out.size == 12031
    assert np.array_equal(np.sort(ts), load_trace_timestamps("conversation"))
    assert inp.min() > 0 and out.min() > 0 and not inp.flags.writeable
    full = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
    if full.is_dir():
        f_ts, f_inp, f_out = load_trace_requests(full / TRACE_FILES["conversation"])
        assert np.array_equal(ts, f_ts) and np.array_equal(inp, f_inp) and np.array_equal(out, f_out)
    with pytest.raises(TraceNotFoundError, match="synthetic"):
        load_trace_requests("synthetic")  # only its arrival times ship


def test_requests_of_a_trace_file_and_bad_lines(trace, tmp_path):
    ts, inp, out = load_trace_requests(trace)
    assert ts.size == 60 and ts[0] == 0.0 and ts[-1] == 100.0 and inp.tolist() == [1] * 60
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: bad trace line.*input_length"):
        load_trace_requests(bad)
