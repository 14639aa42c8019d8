"""Discrete-event simulator (virtual time) over the shared decision core."""

from hermes.sim.arrivals import load_trace_timestamps, resample_arrivals
from hermes.sim.simulator import Arrival, RunResult, SimResult, Simulator, setup_engines

__all__ = [
    "Arrival",
    "RunResult",
    "SimResult",
    "Simulator",
    "load_trace_timestamps",
    "resample_arrivals",
    "setup_engines",
]
