"""The run registry tells its observers of runs in the order they were added; the per-unit
hooks are called on the observers that define them (no call per no-op hook per unit)."""

from __future__ import annotations

from hermes.gateway.config import load_config
from hermes.gateway.runs import RunObserver
from hermes.gateway.scheduler import LiveScheduler


class Recorder(RunObserver):
    def __init__(self, name: str, seen: list[tuple[str, str]]) -> None:
        self.name, self.seen = name, seen

    def unit_started(self, run, inv, now) -> None:  # noqa: ANN001
        self.seen.append((self.name, f"start {inv.unit}"))

    def unit_closed(self, run, inv, now) -> None:  # noqa: ANN001
        self.seen.append((self.name, f"close {inv.unit}"))

    def ranks_changed(self, run, now) -> None:  # noqa: ANN001
        self.seen.append((self.name, "ranks"))

    def run_progress(self, run) -> None:  # noqa: ANN001
        self.seen.append((self.name, "progress"))


class OnlyEnds(RunObserver):
    """Defines none of the per-unit hooks: they are not looked up per unit."""

    def __init__(self, seen: list[tuple[str, str]]) -> None:
        self.seen = seen

    def run_ended(self, run) -> None:  # noqa: ANN001
        self.seen.append(("ends", run.status))


def test_per_unit_hooks_reach_the_observers_that_define_them_in_order(tmp_path) -> None:
    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), log_level="warning")
    reg = LiveScheduler(cfg).registry
    seen: list[tuple[str, str]] = []
    first, ends = Recorder("a", seen), OnlyEnds(seen)
    late = RunObserver()  # a hook set on the instance counts as its own
    late.unit_closed = lambda run, inv, now: seen.append(("late", f"close {inv.unit}"))  # type: ignore[method-assign]
    for o in (first, ends, Recorder("b", seen), late):
        reg.add_observer(o)
    assert ends.unit_started not in reg._unit_started  # a no-op is not called per unit
    run = reg.create_run("app", tenant="t")
    inv = reg.begin_unit(run, "u1", "api:client")
    reg.end_unit(run, inv, duration_s=0.5)
    reg.finish_run(run.run_id)
    assert seen == [("a", "start u1"), ("b", "start u1"), ("a", "ranks"), ("b", "ranks"),
                    ("a", "close u1"), ("b", "close u1"), ("late", "close u1"),
                    ("a", "ranks"), ("b", "ranks"), ("a", "progress"), ("b", "progress"),
                    ("ends", "finished")]


def test_service_that_completes_an_implicit_unit_is_credited_as_closing(tmp_path) -> None:
    """The dispatcher credits a request's service with ``closing`` exactly when
    ``request_done`` is about to close its unit (``closes_with``): then the policy's
    ``on_closing_service`` runs instead of ``on_service``, and the unit's close ranks."""
    from types import SimpleNamespace

    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), log_level="warning")
    reg = LiveScheduler(cfg).registry
    calls: list[str] = []
    pol = reg.ctx.policy
    for name in ("on_service", "on_closing_service", "on_unit_finish"):
        real = getattr(pol, name)
        setattr(pol, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    run = reg.create_run("app", tenant="t", inferred=True)
    inv = reg.unit_for_request(run, "chat", "llm:m")
    busy = SimpleNamespace(finished_at=None, kind="llm", result=None)
    inv.requests.append(busy)  # type: ignore[arg-type]
    assert not reg.closes_with(run, inv)  # a request still in flight
    busy.finished_at = 1.0
    assert reg.closes_with(run, inv)
    reg.credit(run, 0.5, 100, 1.0, closing=reg.closes_with(run, inv))
    reg.request_done(run, inv)
    assert calls == ["on_closing_service", "on_unit_finish"] and inv.closed
    assert not reg.closes_with(run, inv)  # closed already
    explicit = reg.begin_unit(run, "tool", "api:client", explicit=True)
    assert not reg.closes_with(run, explicit)  # the client closes it
    one = reg.create_run("app", tenant="t", auto_finish=True)
    assert not reg.closes_with(one, reg.unit_for_request(one, "chat", "llm:m"))
