"""The live scheduler's memo of demand samples: same state, same samples; new state or a
relearned graph, fresh ones."""

from __future__ import annotations

from hermes.bench.sched import load_graphs
from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import EstimatorPool
from hermes.core.state import RunProgress, UnitObservation
from hermes.gateway.sample_cache import CachingEstimatorPool

APP, UNIT = "factool_code", "generate_queries"  # an app and its first unit


def memo_pool(n_walks: int) -> tuple[dict, EstimatorPool, CachingEstimatorPool]:
    """The shipped PDGraphs, their estimator pool and the memoizing pool around it."""
    graphs = load_graphs()
    raw = EstimatorPool(graphs, get_cost_model("llama2-7b-a100"), n_walks=n_walks)
    return graphs, raw, CachingEstimatorPool(raw)


def test_identical_states_share_samples_and_others_do_not() -> None:
    graphs, raw, pool = memo_pool(200)
    app, unit = APP, UNIT
    est = pool.get(app)
    assert est is not None and pool.get("no-such-app") is None
    fresh = est.sample(RunProgress())
    assert est.sample(RunProgress()) is fresh  # two new runs of the app: one draw
    started = est.sample(RunProgress(current=unit))
    assert started is not fresh and est.sample(RunProgress(current=unit)) is started
    later = est.sample(RunProgress(current=unit, current_attained_s=0.5))
    assert later is not started  # attained service conditions the estimate
    done = [UnitObservation(unit=unit, input_tokens=300, output_tokens=60, duration_s=9.0)]
    a = est.sample(RunProgress(finished=done))
    # the estimator reads an observation through its feature buckets only: one token more
    # is the same state, ten times the tokens another
    near = [UnitObservation(unit=unit, input_tokens=300, output_tokens=61, duration_s=9.0)]
    assert est.sample(RunProgress(finished=near)) is a
    other = [UnitObservation(unit=unit, input_tokens=3000, output_tokens=600, duration_s=9.0)]
    assert est.sample(RunProgress(finished=other)) is not a
    # an LLM unit's wall time is not an estimator input: same tokens, same samples
    same = [UnitObservation(unit=unit, input_tokens=300, output_tokens=60, duration_s=2.0)]
    assert est.sample(RunProgress(finished=same)) is a
    assert pool.stats()["sample_cache_hits"] == 4
    misses = pool.stats()["sample_cache_misses"]
    raw.update(graphs[app])  # relearned graph: a new estimator, an empty memo
    assert pool.get(app).sample(RunProgress()) is not fresh
    # counters since start (exported as Prometheus counters): the replaced memo's count on
    after = pool.stats()
    assert after["sample_cache_hits"] == 4 and after["sample_cache_misses"] == misses + 1


def test_derived_samples_and_ranks_are_memoized_and_equal_fresh_ones() -> None:
    """Conditioning and ranking shared samples give what the plain computation gives, once."""
    import numpy as np

    from hermes.core.estimator import DemandSamples
    from hermes.core.policies import make_policy
    from hermes.core.policies.gittins import gittins_rank
    from hermes.core.state import RunState
    from hermes.gateway.sample_cache import SharedSamples

    _, _, pool = memo_pool(300)
    app, unit = APP, UNIT
    est = pool.get(app)
    fresh = est.sample(RunProgress())
    assert isinstance(fresh, SharedSamples)
    plain = DemandSamples(**{f: getattr(fresh, f) for f in DemandSamples.__slots__})
    nxt = fresh.given_next(unit, min_keep=8)
    assert nxt is fresh.given_next(unit, min_keep=8)  # memoized
    want = plain.given_next(unit, min_keep=8)
    assert np.array_equal(nxt.service_s, want.service_s)
    assert fresh.given_next("no_such_unit", min_keep=8) is None
    cond = nxt.given_attained(0.25, min_keep=8)
    assert cond is nxt.given_attained(0.25, min_keep=8)
    assert np.array_equal(cond.service_s, want.given_attained(0.25, min_keep=8).service_s)
    assert nxt.given_attained(0.0) is nxt
    # a policy whose rank is a function of the samples (hermes: Gittins) ranks them once
    policy = make_policy("hermes", estimators=pool)
    st = RunState(run_id="r", app=app, submitted=0.0)
    r1 = policy._samples_rank(st, nxt, 0.0)
    assert r1 == gittins_rank(want.service_s) and nxt.rank_memo == {"hermes": r1}
    nxt.rank_memo["hermes"] = -1.0  # the memo is what is read back
    assert policy._samples_rank(st, nxt, 0.0) == -1.0
    # a clock-dependent policy (deadline) is never memoized
    ddl = make_policy("hermes-ddl", estimators=pool)
    assert not ddl.tabulate
    # the derived memo is bounded like the samples memo
    est.max_entries = 4
    for a in np.linspace(0.01, 0.2, 10):
        nxt.given_attained(float(a), min_keep=1)
    assert len(est._derived) <= 4


def test_rank_tables_of_shared_walks_are_built_once_and_equal_fresh_ones(monkeypatch) -> None:
    """Two runs starting a unit in the same state, at different service already attained,
    get the per-bucket rank table that unshared walks give; the second reads it from the
    walks' memo without conditioning them at any boundary. The planner's sorted completion
    samples are kept with the derived samples, in the byte budget."""
    import numpy as np

    from hermes.core.estimator import DemandSamples
    from hermes.core.policies import make_policy
    from hermes.core.policies.estimated import _TABLE, _WALKS
    from hermes.core.state import RunState
    from hermes.gateway.sample_cache import SharedSamples

    _, raw, pool = memo_pool(300)
    policy = make_policy("hermes", estimators=pool)
    plain_policy = make_policy("hermes", estimators=raw)

    def started(p, run_id: str, attained: float) -> RunState:
        run = RunState(run_id=run_id, app=APP, submitted=0.0)
        p.on_arrival(run, 0.0)
        run.attained_s = attained
        run.begin_unit(UNIT)
        p.on_unit_start(run, UNIT, 0.0)
        return run

    a = started(policy, "a", 0.0)
    conditioned = []
    real = SharedSamples.given_attained
    monkeypatch.setattr(SharedSamples, "given_attained",
                        lambda self, *x, **k: conditioned.append(1) or real(self, *x, **k))
    b = started(policy, "b", 2.5)
    assert conditioned == []  # the table came from the memo
    ta, tb = a.policy_state[_TABLE], b.policy_state[_TABLE]
    assert len(ta[2]) > 1 and ta[2] == tb[2]
    assert np.allclose(np.array(tb[1]) - 2.5, ta[1]) and b.rank == a.rank
    # unshared walks (no memo) give the same ranks: the memo changes no decision
    c = started(plain_policy, "c", 0.0)
    ranks_c = c.policy_state[_TABLE][2]
    assert len(ranks_c) == len(ta[2])
    assert np.allclose(ranks_c, ta[2], rtol=0.35)  # other walks, same distribution
    # with the very same walks, unshared: bit-identical ranks
    est = pool.get(APP)
    walks = a.policy_state[_WALKS][3]  # what a's table was built from
    assert isinstance(walks, SharedSamples)
    plain = DemandSamples(**{f: getattr(walks, f) for f in DemandSamples.__slots__})
    d = RunState(run_id="d", app=APP, submitted=0.0)
    d.begin_unit(UNIT)
    d.policy_state.update(a.policy_state)
    policy._build_table(d, plain, a.rank, 0.0)
    assert d.policy_state[_TABLE][2] == ta[2]
    # the planner's sorted copy: once per shared samples, counted in the byte budget
    before = est.bytes
    srt = walks.sorted_current()
    assert srt is walks.sorted_current() and np.array_equal(srt, np.sort(walks.current_s))
    assert est.bytes == before + srt.nbytes


def _one_request_runs(policy, app: str, unit: str, n: int, rng) -> None:
    """``n`` runs as header-less traffic makes them: arrival, one unit started and finished
    with its own token counts, and half of them a second turn of the same unit."""
    from hermes.core.state import RunState

    for k in range(n):
        run = RunState(run_id=f"r{k}", app=app, submitted=float(k))
        policy.on_arrival(run, float(k))
        for _ in range(1 + k % 2):
            run.begin_unit(unit)
            policy.on_unit_start(run, unit, float(k))
            o = UnitObservation(unit=unit, input_tokens=int(rng.integers(200, 400)),
                                output_tokens=int(rng.integers(40, 80)))
            run.end_unit(o)
            policy.on_unit_finish(run, o, float(k))


def test_walks_per_request_are_constant_after_warm_up(monkeypatch) -> None:
    """Once an app's states have been drawn, its runs are ranked without a walk: arrival,
    unit start, the rank table and unit finish are lookups whatever each run's tokens."""
    import numpy as np

    from hermes.core.estimator import DemandEstimator
    from hermes.core.policies import make_policy

    drawn = []
    real = DemandEstimator.sample

    def counting(self, progress=None, n=None):
        drawn.append(1)
        return real(self, progress, n)

    monkeypatch.setattr(DemandEstimator, "sample", counting)
    _, _, pool = memo_pool(100)
    policy = make_policy("hermes", estimators=pool)
    rng = np.random.default_rng(0)
    _one_request_runs(policy, APP, UNIT, 200, rng)  # warm-up: every state seen once
    warm = len(drawn)
    assert warm > 0
    _one_request_runs(policy, APP, UNIT, 200, rng)
    assert len(drawn) == warm  # 200 more runs (300 requests): no walk drawn


def test_memo_is_bounded_in_bytes_for_all_apps_together() -> None:
    from hermes.core.state import RunProgress as P

    graphs, raw, _ = memo_pool(200)
    pool = CachingEstimatorPool(raw, max_bytes=300_000)  # a few states of 200 walks
    for app in ("factool_code", "factool_kbqa", "factool_math"):
        est = pool.get(app)
        unit = next(iter(graphs[app].units))
        for a in range(12):
            est.sample(P(current=unit, current_attained_s=0.01 * a))
    assert 0 < pool.budget.used <= 300_000
    assert pool.budget.used == sum(w.bytes for w in pool._wrapped.values())
    # the most recent app's newest state is kept, the oldest app's oldest went first
    assert pool.get("factool_math").sample(P(current=next(iter(graphs["factool_math"].units)),
                                             current_attained_s=0.11)) is not None
    assert pool.get("factool_code").bytes < pool.get("factool_math").bytes


def test_a_new_graph_version_is_served_with_its_hot_states_drawn_ahead() -> None:
    """The learner builds the new estimator and draws the states its predecessor served
    (prepare, a worker thread); once adopted, those states are hits from the new walks."""
    graphs, raw, pool = memo_pool(100)
    old = pool.get(APP)
    states = [RunProgress(), RunProgress(current=UNIT),
              RunProgress(finished=[UnitObservation(unit=UNIT, input_tokens=300,
                                                    output_tokens=60)])]
    before = [old.sample(s) for s in states]
    new_est = raw.build(graphs[APP])
    prepared = pool.prepare({APP: new_est}, {APP: pool.hot_states(APP)})[APP]
    assert prepared.misses == 0 and len(prepared._cache) == len(states)
    raw.install(graphs[APP], new_est)
    pool.adopt(APP, prepared)
    w = pool.get(APP)
    assert w is prepared and w.inner is new_est
    after = [w.sample(s) for s in states]
    assert w.misses == 0 and w.hits == len(states)
    assert all(a is not b for a, b in zip(after, before, strict=True))  # the new version's
    assert pool.budget.used == w.bytes and old.bytes == 0  # the old memo gave its bytes back
