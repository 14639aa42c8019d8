"""The learning budget of busy apps (:class:`hermes.core.learn_sampling.RunSampler`), built
by hand with the clock readings passed in."""

from __future__ import annotations

from hermes.core.learn_sampling import RunSampler


def kept(s: RunSampler, app: str, rate: float, seconds: float, learned: int = 10_000,
         at: float = 0.0) -> list[bool]:
    return [s.keep(app, learned, at + i / rate) for i in range(int(rate * seconds))]


def test_every_run_below_the_threshold_and_at_a_zero_budget() -> None:
    s = RunSampler(runs_per_s=50.0, sample_after=100)
    assert all(s.keep("a", learned, 0.001 * learned) for learned in range(100))
    assert len(s) == 0  # no window before the threshold
    assert all(kept(RunSampler(0.0, 0), "a", rate=1000.0, seconds=3.0))


def test_a_busy_app_keeps_about_its_budget_and_a_quiet_one_everything() -> None:
    s = RunSampler(runs_per_s=50.0, sample_after=0, seed=1)
    got = kept(s, "busy", rate=1000.0, seconds=5.0)
    assert all(got[:1000])  # the first window (1 s) measures the rate: all kept
    for second in (2, 3, 4):
        assert 30 <= sum(got[1000 * second:1000 * (second + 1)]) <= 75
    # another app's windows are its own: 40 a second is under the budget
    assert all(kept(s, "quiet", rate=40.0, seconds=5.0, at=10.0))
    s.forget("busy")
    assert len(s) == 1
    assert all(kept(s, "busy", rate=1000.0, seconds=0.9, at=20.0))  # a new first window
