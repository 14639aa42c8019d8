"""The scheduling-policy interface: one small ABC, a registry, a factory.

A policy turns what the scheduler knows about runs (:class:`~hermes.core.state.RunState`)
into a *rank* per run (lower is served first) and, from it, a sort key per queued request.
Both drivers call the same methods:

- ``on_arrival(run, now)`` when a run is accepted;
- ``on_unit_start(run, unit, now)`` / ``on_unit_finish(run, obs, now)`` as units run;
- ``on_service(run, seconds, tokens, now)`` as service is delivered (engine iterations, tool
  time), so that attained-service policies (Gittins, VTC, SeaLLM) can update;
  ``on_closing_service`` instead for service that completes the running unit, when
  ``on_unit_finish`` follows at once (the live gateway: a request's whole service arrives
  with its answer);
- ``request_key(run, req, now)`` to order every queue (engines, tools, HermesLet windows).

Ranks are refreshed by the policy itself (at unit boundaries and when a run's attained service
crosses a bucket boundary); ``needs_refresh`` lets a driver skip work.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from hermes.core.state import RequestView, RunState, UnitObservation

RequestKey = tuple[float, ...]


class SchedulingPolicy(ABC):
    """Base class of every policy. Subclasses set ``name`` and implement ``rank``."""

    name: ClassVar[str]
    #: whether the policy needs per-app PDGraph estimators (the driver passes an EstimatorPool)
    uses_estimator: ClassVar[bool] = False
    #: whether the policy reads RunState.true_remaining_s (the oracle)
    uses_truth: ClassVar[bool] = False
    #: whether request keys change without a rank change (VTC's live tenant counters), so a
    #: driver must re-key waiting queues before each dispatch
    dynamic_keys: ClassVar[bool] = False
    #: whose queued requests' keys an event of one run can change: ``"run"`` (its own: keys
    #: read only the run's rank), ``"tenant"`` (every run of its tenant: keys read per-tenant
    #: state, e.g. VTC's counters) or ``"all"``; a live driver re-keys just those. A policy
    #: with ``dynamic_keys`` must say which (checked when the class is defined)
    key_scope: ClassVar[str] = "run"
    #: whether a queued request's key changes with the clock alone (its own waiting time, as
    #: :mod:`hermes.core.policies.starvation`'s promotion), not with any run's state: a driver
    #: re-keys waiting queues before each dispatch (the simulator) or periodically (the live
    #: gateway's sweep), while a run's events still change only ``key_scope``'s keys. An
    #: instance attribute, since a constructor option can turn the aging on or off
    aging_keys: bool = False

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.key_scope not in ("run", "tenant", "all"):
            raise TypeError(f"{cls.__name__}.key_scope must be run, tenant or all, "
                            f"not {cls.key_scope!r}")
        if cls.dynamic_keys and cls.key_scope == "run":
            raise TypeError(f"{cls.__name__} has dynamic_keys: its keys read state other runs "
                            "change, so key_scope must be 'tenant' or 'all', not 'run'")
    #: whether the driver builds the EstimatorPool with online refinement (estimator policies)
    refine: ClassVar[bool] = True

    def on_arrival(self, run: RunState, now: float) -> None:
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:  # noqa: B027
        """A unit invocation starts (default: nothing)."""

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        """Service delivered to ``run``; refresh the rank when a bucket boundary is crossed."""
        if run.attained_s >= run.next_refresh_attained_s:
            run.rank = self.rank(run, now)
            run.rank_refreshed_at = now

    def on_closing_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        """Service that completes the running unit, :meth:`on_unit_finish` following at once
        (the live gateway: a request's whole service arrives with its answer). By default
        just :meth:`on_service`; a policy whose ``on_unit_finish`` re-ranks may skip a
        refresh that nothing would read (:class:`~hermes.core.policies.estimated.
        EstimatedPolicy`)."""
        self.on_service(run, seconds, tokens, now)

    def on_finish(self, run: RunState, now: float) -> None:  # noqa: B027
        """The run has finished (default: nothing)."""

    @abstractmethod
    def rank(self, run: RunState, now: float) -> float:
        """The run's scheduling rank now; lower is served first."""

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        """Sort key of a queued request: by the run's rank, then FCFS within equal rank."""
        return (run.rank, run.submitted, req.arrival, req.seq)


#: name -> policy class. The built-in policies are in it as soon as this module can be used:
#: importing ``hermes.core.policies.base`` runs the package's ``__init__`` first, which imports
#: every policy module (each registers itself); this module does not import the package back.
_REGISTRY: dict[str, Callable[..., SchedulingPolicy]] = {}


def register(name: str) -> Callable[[type[SchedulingPolicy]], type[SchedulingPolicy]]:
    """Class decorator: make a policy available to :func:`make_policy` under ``name``."""

    def deco(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
        _REGISTRY[name] = cls
        return cls

    return deco


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


#: options a driver passes to every policy; a policy whose constructor does not take one of
#: these simply does not receive it (any other unknown option is an error, to catch typos)
DRIVER_OPTIONS: frozenset[str] = frozenset({"estimators", "seed"})


def policy_class(name: str) -> Callable[..., SchedulingPolicy]:
    """The registered class of a policy (e.g. to read ``uses_estimator`` / ``refine``)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def make_policy(name: str, **kwargs: Any) -> SchedulingPolicy:
    """Build a policy by its contract name (``hermes``, ``vllm``, ``parrot``, ...).

    Constructors take explicit keyword options only. The driver-wide options
    (:data:`DRIVER_OPTIONS`: ``estimators``, ``seed``) are dropped for policies that do not
    declare them, so a driver can call ``make_policy(name, estimators=pool, seed=s)`` for
    every policy; any other option the policy does not declare raises ``TypeError``.
    """
    factory = policy_class(name)
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params or k not in DRIVER_OPTIONS}
    return factory(**kwargs)
