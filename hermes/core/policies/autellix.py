"""Autellix's program-level least-attained-service schedulers (Luo et al., "Autellix: An
Efficient Serving Engine for LLM Agents as General Programs", 2025, arXiv 2502.13965, §4.2).

Autellix needs no demand model: it prioritises an LLM call by the service its *program* (here:
its run) has already attained, so the calls of programs that have received little go first
(least attained service at the program level, not per call, which removes program-level
head-of-line blocking). Two policies differ in the program's service scalar ``S``:

- ``autellix-plas`` (Program-Level Attained Service, single-threaded programs): ``S`` is the
  cumulative service of the program's completed calls, ``p(c_j) = Σ_{k<j} t_k``.
- ``autellix-atlas`` (Adaptive Thread-Level Attained Service, multi-threaded/DAG programs):
  ``S`` is the attained service along the program's critical path: a call arriving gets
  ``p(c) = S``, and when it completes with service ``t``, ``S = max(S, p(c) + t)`` (the
  paper's ``p(c_j) = max_{c_k ∈ P(c_j)} (p(c_k) + t_k)`` over the calls completed before it,
  the program's DAG being unknown in advance). For a single-threaded program it is PLAS.

How calls map here: a unit invocation is a call; its ``P`` parallel requests (a fan-out) are
``P`` concurrent threads. ATLAS adds the unit's service once (its requests ran side by side:
the critical path through it); PLAS adds ``P ×`` the unit's service (each thread ran for the
unit's duration, at most: the split per request is not observed). Only LLM calls count: tool
calls are not LLM service (Autellix schedules LLM calls); their queues see the program's level.

Discretised priorities (the paper's multi-level queues): ``queues = K`` queues with
geometrically growing quanta, ``first_quantum_s · growth^i`` for queue ``i``; a call enters
the queue of its program's ``S`` (not always the top one, as in a plain MLFQ) and is demoted
as its own service grows: its level is the queue of ``p(c) + t_c`` on the cumulative
thresholds ``first_quantum_s · (growth^(i+1) − 1) / (growth − 1)``, ``t_c`` the call's
service so far. FCFS by call arrival within a queue. The request key is ``(level, call
arrival, seq)``; ``run.rank`` is the level.

Anti-starvation: a call outside the top queue whose program has waited ``β`` times its service,
``(W_p + W_c) / max(first_quantum_s, S + T_c) ≥ β``, is promoted to the top queue; its call
windows (``W_c``, ``T_c``) restart at the promotion and it is demoted again by the quanta from
the top; the program's windows are kept. ``W_p``: the waits of the program's completed LLM calls
(each call's time from queued to done minus its service); ``W_c``: the current call's (time
since it was queued, or promoted, minus its service since). The check reads the clock, so the
keys are ``dynamic_keys`` (``key_scope = "all"``).

Constants (the paper leaves them to the deployment; these are ours): ``queues = 8``,
``first_quantum_s = 1.0`` s, ``growth = 2.0`` (thresholds 1, 3, 7, 15, 31, 63, 127 s of
service: the paper apps' runs attain from about a second to a few hundred), ``beta = 10.0``
(the waits here include the slowdown of batching, about 1.5-3x the service, which a smaller
``β`` would mistake for starvation); ``beta=None`` turns promotion off.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, ClassVar

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.state import RequestView, RunState, UnitObservation

_S = "autellix_program_s"  # the program's service scalar (PLAS: sum; ATLAS: critical path)
_WP = "autellix_program_wait_s"  # waits of the program's completed LLM calls
_P = "autellix_call_p_s"  # S when the current call arrived (None: no call running)
_C = "autellix_call_s"  # LLM service of the current call so far
_T0 = "autellix_window_t"  # start of the current call's windows: queued, or promoted
_C0 = "autellix_window_c"  # the call's service at that point
_PROMOTED = "autellix_promoted"  # the call was promoted: its level restarts from the top


def is_llm(obs: UnitObservation) -> bool:
    """Whether a finished invocation was an LLM call (tool calls carry no tokens)."""
    return obs.input_tokens + obs.output_tokens > 0


class ProgramAttainedServicePolicy(SchedulingPolicy):
    """Shared machinery of ``autellix-plas`` and ``autellix-atlas`` (see the module doc);
    subclasses say how a completed call adds to the program's service (:meth:`fold`)."""

    dynamic_keys: ClassVar[bool] = True  # anti-starvation reads the clock
    key_scope: ClassVar[str] = "all"

    def __init__(self, *, queues: int = 8, first_quantum_s: float = 1.0, growth: float = 2.0,
                 beta: float | None = 10.0) -> None:
        if queues < 1 or first_quantum_s <= 0 or growth < 1:
            raise ValueError("queues must be >= 1, first_quantum_s > 0 and growth >= 1, got "
                             f"{queues}, {first_quantum_s}, {growth}")
        if beta is not None and beta <= 0:
            raise ValueError(f"beta must be > 0 or None, got {beta}")
        self.queues = queues
        self.first_quantum_s = first_quantum_s
        self.beta = beta
        quanta = [first_quantum_s * growth**i for i in range(queues - 1)]
        #: cumulative service at which a call leaves queue i for queue i + 1
        self.thresholds = [sum(quanta[: i + 1]) for i in range(queues - 1)]

    # -- what subclasses define -------------------------------------------------------------
    def fold(self, st: dict[str, Any], p: float, obs: UnitObservation) -> float:
        """The program's service scalar after the LLM call ``obs`` (which arrived at ``p``)."""
        raise NotImplementedError

    # -- levels -------------------------------------------------------------------------------
    def queue_of(self, service_s: float) -> int:
        """The queue (0: the top) of a call at ``service_s`` of program plus call service."""
        return bisect_right(self.thresholds, service_s)

    def starving(self, run: RunState, now: float) -> bool:
        """Whether the program's wait-to-service ratio has reached ``beta``."""
        st = run.policy_state
        if self.beta is None or st.get(_P) is None:
            return False
        call_s = st[_C] - st[_C0]
        wait = st[_WP] + max(0.0, now - st[_T0] - call_s)
        return bool(wait >= self.beta * max(self.first_quantum_s, st[_S] + call_s))

    def level(self, run: RunState, now: float, *, check_starvation: bool = False) -> int:
        """The queue of the run's current call (or of its next call, between calls); with
        ``check_starvation``, a starving call outside the top queue is promoted first."""
        st = run.policy_state
        p = st.get(_P)
        if p is None:
            return self.queue_of(st.get(_S, 0.0))
        lvl = self.queue_of(st[_C] - st[_C0] if st[_PROMOTED] else p + st[_C])
        if lvl > 0 and check_starvation and self.starving(run, now):
            st[_PROMOTED], st[_T0], st[_C0] = True, now, st[_C]
            lvl = 0
        return lvl

    # -- hooks --------------------------------------------------------------------------------
    def on_arrival(self, run: RunState, now: float) -> None:
        run.policy_state.update({_S: 0.0, _WP: 0.0, _P: None})
        super().on_arrival(run, now)

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        st = run.policy_state
        st.setdefault(_S, 0.0)
        st.setdefault(_WP, 0.0)
        st.update({_P: st[_S], _C: 0.0, _T0: now, _C0: 0.0, _PROMOTED: False})
        self._refresh(run, now)

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        st = run.policy_state
        if tokens > 0 and st.get(_P) is not None:  # LLM service of the current call
            st[_C] += seconds
            self._refresh(run, now)

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        st = run.policy_state
        p = st.get(_P)
        if is_llm(obs):
            st[_WP] = st.get(_WP, 0.0) + max(0.0, obs.finished - obs.started - obs.service_s)
            st[_S] = self.fold(st, st.get(_S, 0.0) if p is None else p, obs)
        st[_P] = None
        self._refresh(run, now)

    def _refresh(self, run: RunState, now: float) -> None:
        run.rank = float(self.level(run, now))
        run.rank_refreshed_at = now

    def rank(self, run: RunState, now: float) -> float:
        return float(self.level(run, now))

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        """``(level, call arrival, seq)``: the queue, then FCFS; an LLM request's program is
        checked for starvation (tool calls are queued at the program's level)."""
        lvl = self.level(run, now, check_starvation=req.input_tokens > 0)
        if lvl < run.rank:  # promoted just now
            run.rank = float(lvl)
        return (float(lvl), req.arrival, req.seq)


@register("autellix-plas")
class PLASPolicy(ProgramAttainedServicePolicy):
    """PLAS: the program's service is the sum of its completed calls' service."""

    name: ClassVar[str] = "autellix-plas"

    def fold(self, st: dict[str, Any], p: float, obs: UnitObservation) -> float:
        return float(st.get(_S, 0.0)) + max(1, obs.parallelism) * obs.service_s


@register("autellix-atlas")
class ATLASPolicy(ProgramAttainedServicePolicy):
    """ATLAS: the program's service is the attained service along its critical path."""

    name: ClassVar[str] = "autellix-atlas"

    def fold(self, st: dict[str, Any], p: float, obs: UnitObservation) -> float:
        return max(float(st.get(_S, 0.0)), p + obs.service_s)
