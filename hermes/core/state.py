"""What the scheduler knows about a run: its place in the PDGraph and the service it received.

These are plain data objects, filled by a driver (live gateway or simulator) from what a live
system can observe. Nothing here knows the future of a run; the only exception is
``RunState.true_remaining_s``, set by the simulator for the ``oracle`` baseline alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.core.costmodel import CostModel
    from hermes.core.records import UnitRecord


@dataclass(slots=True)
class UnitObservation:
    """A finished unit invocation, as observed. Token counts are totals over its requests."""

    unit: str
    input_tokens: int = 0
    output_tokens: int = 0
    parallelism: int = 1
    duration_s: float = 0.0  # tool service time (tool units) or wall time (LLM units)
    service_s: float = 0.0  # isolated engine service under the cost model (0 for tools)
    started: float = 0.0
    finished: float = 0.0

    @classmethod
    def from_requests(
        cls,
        unit: str,
        inputs: list[int],
        outputs: list[int],
        cost: CostModel,
        *,
        duration_s: float,
        started: float,
        finished: float,
    ) -> UnitObservation:
        """An LLM invocation observed through its requests' token counts. One request under
        a linear cost model is priced in plain floats (:meth:`CostModel.request_service_s`,
        bit for bit the batch formula there: every header-less request of the live gateway
        closes a one-request unit, and numpy's per-call overhead was most of its cost)."""
        if len(inputs) == 1 and not cost.token_knots:
            i1, o1 = inputs[0], outputs[0]
            return cls(unit=unit, input_tokens=int(i1), output_tokens=int(o1), parallelism=1,
                       duration_s=duration_s, service_s=cost.request_service_s(i1, o1),
                       started=started, finished=finished)
        import numpy as np

        i = np.array([inputs], dtype=float)
        o = np.array([outputs], dtype=float)
        return cls(
            unit=unit,
            input_tokens=int(i.sum()),
            output_tokens=int(o.sum()),
            parallelism=max(1, len(inputs)),
            duration_s=duration_s,
            service_s=float(cost.unit_service_s(i, o)[0]),
            started=started,
            finished=finished,
        )

    @classmethod
    def from_record(cls, u: UnitRecord, cost: CostModel) -> UnitObservation:
        """The observation a live system makes of a finished unit (one run-record entry)."""
        if u.requests:
            return cls.from_requests(
                u.unit,
                [r.input_tokens for r in u.requests],
                [r.output_tokens for r in u.requests],
                cost,
                duration_s=u.finished - u.started,
                started=u.started,
                finished=u.finished,
            )
        dur = u.duration_s if u.duration_s is not None else u.finished - u.started
        return cls(unit=u.unit, duration_s=dur, service_s=0.0, started=u.started, finished=u.finished)


@dataclass(slots=True)
class RunProgress:
    """Where a run is in its PDGraph: the estimator's input.

    ``finished``: unit invocations done, in order. ``current``: the unit running now (``None``
    before the first unit or between units). ``current_attained_s``: service the current
    invocation has received so far (seconds under the cost model).
    """

    finished: list[UnitObservation] = field(default_factory=list)
    current: str | None = None
    current_attained_s: float = 0.0
    #: what an estimator derived from ``finished`` when it last keyed this state, to bring
    #: up to date with the units finished since (``DemandEstimator.condition_key``); scratch,
    #: not part of the state
    key_memo: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def last_unit(self) -> str | None:
        return self.finished[-1].unit if self.finished else None

    def visits(self, unit: str) -> int:
        """How many times ``unit`` has finished in this run (loop iterations so far)."""
        fin = self.finished
        return sum(1 for o in fin if o.unit == unit) if fin else 0  # (a new run: no generator)


@dataclass(slots=True)
class RunState:
    """A live or simulated run as the scheduler sees it."""

    run_id: str
    app: str
    submitted: float
    tenant: str = "default"
    deadline: float | None = None  # absolute time, same clock as ``submitted``
    k: float | None = None  # prewarming knob for this run (None: app/tenant default)
    progress: RunProgress = field(default_factory=RunProgress)
    attained_s: float = 0.0  # total service received (seconds)
    attained_tokens: int = 0  # total tokens processed (prefill + decode)
    rank: float = 0.0  # current scheduling rank; lower is served first
    rank_refreshed_at: float = float("-inf")
    next_refresh_attained_s: float = float("inf")  # bucket boundary for the next refresh
    finished: float | None = None
    true_remaining_s: float | None = None  # simulator only, for the oracle baseline
    policy_state: dict[str, Any] = field(default_factory=dict)  # per-policy scratch (e.g. SeaLLM budget)

    # State transitions, shared by both drivers; each is followed by the matching policy hook.
    def begin_unit(self, unit: str) -> None:
        """A unit invocation starts (then ``policy.on_unit_start``)."""
        self.progress.current = unit
        self.progress.current_attained_s = 0.0

    def end_unit(self, obs: UnitObservation, current: str | None = None) -> None:
        """A unit invocation finished (then ``policy.on_unit_finish``). ``current``: a unit
        still running in parallel, if any."""
        self.progress.finished.append(obs)
        self.progress.current = current
        self.progress.current_attained_s = 0.0

    def credit(self, seconds: float, tokens: int = 0, *, unit_attained_s: float | None = None) -> None:
        """Service delivered (then ``policy.on_service``). ``unit_attained_s``: the current
        invocation's attained service when the driver tracks it absolutely."""
        self.attained_s += seconds
        self.attained_tokens += tokens
        if unit_attained_s is None:
            self.progress.current_attained_s += seconds
        else:
            self.progress.current_attained_s = unit_attained_s


@dataclass(slots=True)
class RequestView:
    """A queued LLM request or tool call, as the ordering sees it."""

    request_id: str
    run_id: str
    unit: str
    arrival: float  # when the request reached the queue
    input_tokens: int = 0
    max_output_tokens: int | None = None
    seq: int = 0  # tie-breaker: submission order
