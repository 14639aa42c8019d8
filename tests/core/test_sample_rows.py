"""SampleRows: a deque(maxlen) of float rows in one array, and what it saves a profiler."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections import deque

import numpy as np
import pytest

from hermes.core.profiler import Profiler, learn
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.core.sample_rows import SampleRows


def test_rows_are_a_fifo_cap_like_a_deque() -> None:
    rng = random.Random(1)
    for cap in (1, 3, 16, 17, 40):
        rows, ref = SampleRows(3, cap), deque(maxlen=cap)
        for i in range(200):
            row = (float(i), rng.random(), float(rng.randrange(10**6)))
            rows.append(row)
            ref.append(row)
            assert len(rows) == len(ref)
            if i % 7 == 0:  # every state: filling, growing, full and wrapping
                assert list(rows) == list(ref)
                assert np.array_equal(rows.array(), np.asarray(ref, dtype=np.float64).reshape(-1, 3))
        assert list(rows) == list(ref)


def test_rows_keep_values_exactly_and_hand_out_copies() -> None:
    x = 0.1 + 0.2  # not a short decimal: a float32 or a rounding would show
    rows = SampleRows(2, 4, [(x, 2.0**52 + 1)])
    assert list(rows) == [(x, 2.0**52 + 1)]
    arr = rows.array()
    arr[0, 0] = -1.0
    assert list(rows)[0][0] == x  # the caller's array is its own


def test_bad_rows_and_sizes_are_refused() -> None:
    rows = SampleRows(2, 4)
    with pytest.raises(ValueError, match="a row of 3 values in a table of 2"):
        rows.append((1.0, 2.0, 3.0))
    assert len(rows) == 0
    with pytest.raises(ValueError, match="width must be >= 1"):
        SampleRows(0, 4)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        SampleRows(2, 0)


def _agent_runs(n: int) -> list[RunRecord]:
    """Conversations of 1-4 turns (a first turn, follow-ups with probability 0.6), as the
    header-less agent traffic of ``hermes bench soak --agents``."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        turns = 1
        while turns < 4 and rng.random() < 0.6:
            turns += 1
        t, units = 0.0, []
        for k in range(turns):
            s = t + rng.random() * 0.01
            f = s + 0.002 + rng.random() * 0.003
            units.append(UnitRecord(unit="a.first" if k == 0 else "a.follow-up",
                                    backend="llm:m", started=s, finished=f,
                                    requests=[RequestRecord(input_tokens=rng.randrange(40, 400),
                                                            output_tokens=8)]))
            t = f
        out.append(RunRecord(app="a", run_id=f"r{i}", submitted=0.0, finished=t, units=units))
    return out


def test_a_full_profiler_and_its_graph_stay_small() -> None:
    """At its caps (1,000 rows per unit and edge) one app's profiler and its latest graph held
    2.42 MiB with rows as tuples of float objects; 1.21 MiB with the rows in arrays and the
    graph's equal values one object each (the tree before fails this)."""
    runs = _agent_runs(2500)
    # what the first profile imports and caches is not the profiler's: before the count
    Profiler("a").add_many(runs[:60])
    _ = Profiler("a", graph=learn(runs[:60])).graph
    gc.collect()  # (cycles of earlier tests' objects freed now, not while counting)
    tracemalloc.start()
    try:
        prof = Profiler("a")
        prof.add_many(runs)
        graph = prof.graph
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(graph.units["a.follow-up"].branch) == 1000
    assert all(len(e.joined) == 1000 for e in graph.edges.values())
    assert held < 1.6 * 2**20, f"{held / 2**20:.2f} MiB"
    # equal values of the graph's rows are one object (what the saving comes from)
    rows = graph.units["a.first"].branch
    assert rows[0][2] == rows[1][2] == 1.0 and rows[0][2] is rows[1][2]
