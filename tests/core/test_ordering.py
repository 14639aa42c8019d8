"""KeyedQueue: lowest key first, FIFO on ties, updatable keys, per-run re-keying."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.core.ordering import KeyedQueue


def test_pops_in_key_order_and_fifo_on_ties():
    q: KeyedQueue[str] = KeyedQueue()
    q.push("a", "a", (2.0,))
    q.push("b", "b", (1.0,))
    q.push("c", "c", (2.0,))
    q.push("d", "d", (1.0,))
    assert [q.pop() for _ in range(4)] == ["b", "d", "a", "c"]
    assert not q


def test_rekey_moves_item_and_keeps_fifo_among_equals():
    q: KeyedQueue[str] = KeyedQueue()
    for i, k in enumerate([5.0, 3.0, 4.0]):
        q.push(f"r{i}", f"r{i}", (k,))
    q.rekey("r0", (1.0,))
    assert q.peek() == "r0"
    q.rekey("r0", (4.0,))  # now ties with r2, which was pushed later
    assert list(q.ordered()) == ["r1", "r0", "r2"]
    assert [q.pop() for _ in range(3)] == ["r1", "r0", "r2"]


def test_rekey_run_and_remove():
    q: KeyedQueue[str] = KeyedQueue()
    q.push("x1", "x1", (1.0,), run_id="x")
    q.push("x2", "x2", (1.5,), run_id="x")
    q.push("y1", "y1", (2.0,), run_id="y")
    assert q.rekey_run("x", lambda item: (3.0,)) == 2
    assert q.peek() == "y1"
    assert q.remove("y1") == "y1"
    assert q.remove("y1") is None
    assert len(q) == 2 and "y1" not in q
    assert sorted(i for i, _ in q.run_items("x")) == ["x1", "x2"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3)), min_size=1, max_size=60))
def test_matches_sorted_reference_under_random_operations(ops):
    rnd = random.Random(len(ops))
    q: KeyedQueue[int] = KeyedQueue()
    ref: dict[int, tuple[float, int]] = {}  # id -> (key, push order)
    order = 0
    for val, op in ops:
        if op <= 1 or not ref:
            iid = len(ref) + order * 1000
            q.push(iid, iid, (float(val),))
            ref[iid] = (float(val), order)
            order += 1
        elif op == 2:
            iid = rnd.choice(sorted(ref))
            q.rekey(iid, (float(val),))
            ref[iid] = (float(val), ref[iid][1])
        else:
            expect = min(ref, key=lambda i: ref[i])
            assert q.pop() == expect
            del ref[expect]
    assert list(q.ordered()) == sorted(ref, key=lambda i: ref[i])


def test_head_lists_the_next_items_in_release_order_without_removing_them():
    q: KeyedQueue[str] = KeyedQueue()
    for i, k in enumerate([3.0, 1.0, 2.0, 1.0, 5.0]):
        q.push(f"r{i}", f"r{i}", (k,))
    q.rekey("r4", (0.5,))
    q.remove("r2")
    assert q.head(3) == ["r4", "r1", "r3"]  # equal keys stay FIFO
    assert q.head(0) == [] and q.head(10) == ["r4", "r1", "r3", "r0"]
    assert len(q) == 4 and [q.pop() for _ in range(4)] == ["r4", "r1", "r3", "r0"]


def test_head_matches_the_release_order_after_pushes_rekeys_removes_and_pops():
    """head(n) is the first n of what pops would give, after random mixes of every operation
    (stale heap entries from rekeys and removes included): against a sort of the live items."""
    for seed in range(20):
        rng = random.Random(seed)
        q: KeyedQueue[int] = KeyedQueue()
        live: dict[int, tuple] = {}  # item -> (key, push order) as the queue should hold it
        order = 0
        for step in range(300):
            op = rng.random()
            if op < 0.5 or not live:
                i = step
                key = (float(rng.randint(0, 20)),)
                q.push(i, i, key)
                live[i] = (key, order)
                order += 1
            elif op < 0.75:
                i = rng.choice(list(live))
                key = (float(rng.randint(0, 20)),)
                q.rekey(i, key)
                live[i] = (key, live[i][1])  # a rekey keeps the FIFO place among equals
            elif op < 0.9:
                i = rng.choice(list(live))
                assert q.remove(i) == i
                del live[i]
            else:
                got = q.pop()
                want = min(live, key=lambda x: live[x])
                assert got == want
                del live[got]
            n = rng.randint(0, 12)
            assert q.head(n) == sorted(live, key=lambda x: live[x])[:n], (seed, step)
